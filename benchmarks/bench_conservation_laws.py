"""Time of counting conservation laws from the Lie algebra of the gradient fields (a script, not a test).

For every architecture of the grid, at one well-conditioned random point θ
(``symalg.applications.conservation_laws.random_point``, seed ``--seed``):

* ``symmetries``  symalg's count of functionally independent conserved quantities:
                  ``symalg.derive`` + ``Analysis.independent_conserved(θ)`` (SymPy checks are cached per
                  activation, so after the first architecture this is mostly the rank of ``M ↦ M·θ``)
* ``certified``   ``count_conservation_laws(arch, params=θ, known_laws=<symmetries>)``: the Lie-algebra
                  trace is grown until it reaches ``D − known_laws``, which proves that count (the
                  search runs on to stagnation if it is never reached)
* ``stagnation``  ``count_conservation_laws(arch, params=θ)``: no bound; the search stops at the first
                  bracket level that adds nothing (one level more than ``certified`` needs)

Both counts must equal the symmetry count ("agree"). Times are per architecture, ``time.process_time``
(CPU of this process, less sensitive to other jobs on the machine) and ``time.perf_counter`` (wall).

The grid, per activation (``linear`` = identity sites, ``relu``) and bias (none / every layer), for
depths ``q`` (number of weight matrices) in ``--depths``:

* every corner: all width tuples ``(n_0, …, n_q)`` with entries in ``{2, 9}`` (``2^{q+1}`` tuples; these
  include the extreme bottlenecks such as ``(2, 9, 9, 2)``, the slowest cases);
* ``--random N`` tuples drawn uniformly from ``{2, …, 9}^{q+1}`` (``random.Random(--seed)``), or every
  tuple with ``--exhaustive`` (``8^{q+1}``: 512, 4096 and 32768 per depth).

Usage::

    python benchmarks/bench_conservation_laws.py                      # corners + 100 random per depth
    python benchmarks/bench_conservation_laws.py --depths 2 --exhaustive --quiet
    python benchmarks/bench_conservation_laws.py --random 20 --csv out.csv

``--threads`` (default 1) sets ``torch.set_num_threads``: on a 2-core machine shared with other jobs,
MKL's second thread spin-waits for a busy core, and one 700 × 324 SVD took 2.4 s instead of 10 ms.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import os
import platform
import random
import statistics
import sys
import time


def grid(depths, n_random: int, exhaustive: bool, seed: int) -> list[tuple[int, ...]]:
    """Width tuples: every corner in {2, 9}^{q+1}, then random or all tuples of {2..9}^{q+1}, per depth."""
    rng, tuples = random.Random(seed), []
    for q in depths:
        corners = list(itertools.product((2, 9), repeat=q + 1))
        rest = (list(itertools.product(range(2, 10), repeat=q + 1)) if exhaustive else
                [tuple(rng.randint(2, 9) for _ in range(q + 1)) for _ in range(n_random)])
        tuples += corners + [w for w in rest if w not in corners]
    return tuples


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.process_time() - cpu, time.perf_counter() - wall


def run_one(widths, activation: str, bias: bool, seed: int) -> dict:
    import torch

    import symalg
    from symalg.applications.conservation_laws import _architecture, count_conservation_laws, random_point

    arch = _architecture(list(widths), activation, bias)
    params = random_point(arch, torch.Generator().manual_seed(seed))
    count, sym_cpu, _ = timed(lambda: int(symalg.derive(arch).independent_conserved(params)))
    certified, cert_cpu, cert_wall = timed(lambda: count_conservation_laws(arch, params=params, known_laws=count,
                                                                           seed=seed))
    alone, alone_cpu, alone_wall = timed(lambda: count_conservation_laws(arch, params=params, seed=seed))
    return {"widths": "-".join(map(str, widths)), "activation": activation, "bias": bias, "depth": len(widths) - 1,
            "D": certified.n_params, "laws": certified.n_laws, "symmetries": count, "laws_stagnation": alone.n_laws,
            "agree": certified.n_laws == alone.n_laws == count and certified.stabilised and alone.stabilised,
            "height": alone.height, "gap": min(certified.gap, alone.gap), "certified_ms": 1e3 * cert_cpu,
            "certified_wall_ms": 1e3 * cert_wall, "stagnation_ms": 1e3 * alone_cpu,
            "stagnation_wall_ms": 1e3 * alone_wall, "symmetries_ms": 1e3 * sym_cpu}


def summary_rows(rows: list[dict]):
    keys = sorted({(r["activation"], r["bias"], r["depth"]) for r in rows})
    for key in keys + [("all", "", "")]:
        part = rows if key[0] == "all" else [r for r in rows if (r["activation"], r["bias"], r["depth"]) == key]
        cert, alone = [r["certified_ms"] for r in part], [r["stagnation_ms"] for r in part]
        yield (*key, len(part), sum(r["agree"] for r in part), statistics.median(cert), max(cert),
               statistics.median(alone), max(alone), statistics.median(r["symmetries_ms"] for r in part),
               max(r["height"] for r in part), min(r["gap"] for r in part))


def figures(quick: bool = False) -> dict:
    """The summary rows (per activation, bias, depth) of the default grid, or with ``quick`` of depth 2 with its
    corners and 3 random tuples; CPU ms per architecture."""
    import torch

    torch.set_num_threads(1)
    depths, n_random = ([2], 3) if quick else ([2, 3, 4], 100)
    for activation in ("linear", "relu"):   # warm-up: imports, SymPy caches of the catalogue checks
        run_one((3, 4, 2), activation, True, 0)
    rows = [run_one(w, activation, bias, 0) for activation, bias in itertools.product(("linear", "relu"), (False, True))
            for w in grid(depths, n_random, False, 0)]
    keys = ("activation", "bias", "depth", "architectures", "agree", "certified_median_ms", "certified_max_ms",
            "stagnation_median_ms", "stagnation_max_ms", "symalg_count_median_ms", "max_height", "min_gap")
    return {"summary": [dict(zip(keys, row)) for row in summary_rows(rows)]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--random", type=int, default=100, help="random width tuples per depth (default 100)")
    parser.add_argument("--exhaustive", action="store_true", help="every width tuple instead of a random sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--csv", help="write one row per architecture to this file")
    parser.add_argument("--quiet", action="store_true", help="no per-architecture lines")
    args = parser.parse_args(argv)

    import torch

    import symalg

    torch.set_num_threads(args.threads)
    widths = grid(args.depths, args.random, args.exhaustive, args.seed)
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}, torch "
          f"{torch.__version__}, symalg {symalg.__version__}, threads {args.threads}, load {os.getloadavg()}")
    print(f"# {len(widths)} width tuples x 2 activations x 2 bias settings, depths {args.depths}")
    for activation in ("linear", "relu"):   # warm-up: imports, SymPy caches of the catalogue checks
        run_one((3, 4, 2), activation, True, args.seed)
    rows = []
    for activation, bias in itertools.product(("linear", "relu"), (False, True)):
        for w in widths:
            row = run_one(w, activation, bias, args.seed)
            rows.append(row)
            if not args.quiet:
                print(f"{row['activation']:6} bias={row['bias']!s:5} {row['widths']:12} D={row['D']:3} "
                      f"laws={row['laws']:3} symmetries={row['symmetries']:3} "
                      f"{'agree' if row['agree'] else 'DISAGREE'} height={row['height']} gap={row['gap']:.0e} "
                      f"certified {row['certified_ms']:6.1f} ms  stagnation {row['stagnation_ms']:6.1f} ms  "
                      f"symmetries {row['symmetries_ms']:6.1f} ms", flush=True)
    print(f"# load {os.getloadavg()}")
    print("\n| activation | bias | depth | archs | agree | certified median ms | certified max ms | "
          "stagnation median ms | stagnation max ms | symalg count median ms | max height | min gap |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in summary_rows(rows):
        print("| " + " | ".join(f"{x:.1f}" if isinstance(x, float) and x < 1e3 else
                                f"{x:.0e}" if isinstance(x, float) else str(x) for x in s) + " |")
    print("\nslowest (certified, CPU ms): " + ", ".join(
        f"{r['activation']}{'+b' if r['bias'] else ''} {r['widths']} {r['certified_ms']:.0f}"
        for r in sorted(rows, key=lambda r: -r["certified_ms"])[:8]))
    print("slowest (stagnation, CPU ms): " + ", ".join(
        f"{r['activation']}{'+b' if r['bias'] else ''} {r['widths']} {r['stagnation_ms']:.0f}"
        for r in sorted(rows, key=lambda r: -r["stagnation_ms"])[:8]))
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
