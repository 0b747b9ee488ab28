"""The cost of certification against the uncertified derive, on deep MLPs (a script, not a test).

For a depth ``L`` the model is ``nn.Sequential`` of ``L`` linear layers of width ``--width`` with ReLU between them
(``2 (L − 1)`` claims: positive scaling and permutations of every hidden layer), float64, example input ``(8, w)``.
Each depth runs in one fresh Python process after a warm-up on a depth-3 chain (SymPy's and symalg's per-process
caches hot for both paths alike); every figure is the median of ``--repeat`` runs in that process:

* ``derive``     ``symalg.derive(graph, certify=False)``: the baseline
* ``certified``  ``symalg.derive(graph)``: the same plus :func:`symalg.verification.certification.certify` (the model's
                 parameters and a generic point, a batch of one and of ``B + 1``, the sensitivity control)
* ``passes``     forward passes of the model during one certification (a forward hook)
* ``cpu``        the same two timed by ``time.process_time`` (this process's CPU time: steadier than the wall clock
                 on a shared machine)

``ratio`` is ``certified / derive``; the target of issue 29 is at most 3 at 1000 layers. The GPT-style transformer
(12 × 768) is measured by ``bench_transformer.py`` (its ``certify`` row, against ``trace + derive``).

Usage::

    python benchmarks/bench_certify.py                     # depths 100, 300, 1000, width 16, 3 repeats
    python benchmarks/bench_certify.py --quick             # depths 10, 30, 1 repeat
    python benchmarks/bench_certify.py --depths 300 --width 64 --repeat 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import benchlib


def chain(depth: int, width: int) -> tuple:
    """The ReLU MLP of ``depth`` linear layers and its example input."""
    import torch

    torch.manual_seed(0)
    layers: list = []
    for k in range(depth):
        layers += [torch.nn.Linear(width, width)] + ([torch.nn.ReLU()] if k < depth - 1 else [])
    return torch.nn.Sequential(*layers).double(), torch.randn(8, width, dtype=torch.float64)


def child(depth: int, width: int, repeat: int, threads: int = 1) -> dict:
    """One depth in this process: medians of ``derive`` and of the certified derive, and the passes of one run
    (``threads`` torch threads; 0 leaves torch's default)."""
    import torch

    import symalg

    if threads > 0:
        torch.set_num_threads(threads)

    warm, x = chain(3, width)
    symalg.derive(symalg.trace(warm, (x,)))
    model, x = chain(depth, width)
    graph = symalg.trace(model, (x,))
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    times: dict[str, list[float]] = {"derive": [], "certified": [], "derive_cpu": [], "certified_cpu": []}
    for _ in range(repeat):
        for name, certify in (("derive", False), ("certified", True)):
            calls.clear()
            start, start_cpu = time.perf_counter(), time.process_time()
            analysis = symalg.derive(graph, certify=certify)
            times[name].append(time.perf_counter() - start)
            times[f"{name}_cpu"].append(time.process_time() - start_cpu)
    kept = sum(e.holds for e in analysis.certification or ())
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"depth": depth, "width": width, "claims": len(analysis.certification or ()), "certified_claims": kept,
            "passes": len(calls), **medians, "ratio": medians["certified"] / medians["derive"],
            "ratio_cpu": medians["certified_cpu"] / medians["derive_cpu"]}


def run(depths: list[int], width: int, repeat: int, threads: int = 1) -> list[dict]:
    """Each depth in a fresh process (:func:`child`)."""
    rows = []
    for depth in depths:
        done = subprocess.run([sys.executable, __file__, "--_child", str(depth), str(width), str(repeat),
                               str(threads)],
                              capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def figures(quick: bool = False) -> dict:
    """The rows of :func:`run` (depths 10 and 30, one repeat when ``quick``; else 100, 300, 1000, three)."""
    depths, repeat = ([10, 30], 1) if quick else ([100, 300, 1000], 3)
    return {"width": 16, "rows": run(depths, 16, repeat)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1, as bench_transformer.py; 0: torch's default)")
    parser.add_argument("--_child", nargs=4, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        print(json.dumps(child(*args._child)))
        return
    rows = figures(True)["rows"] if args.quick else run(args.depths, args.width, args.repeat, args.threads)
    print(f"machine: {benchlib.machine()}")
    print(f"{'depth':>6} {'width':>5} {'claims':>6} {'kept':>5} {'passes':>6} {'derive s':>9} {'certified s':>12} "
          f"{'ratio':>6} {'derive cpu s':>12} {'certified cpu s':>15} {'cpu ratio':>9}")
    for r in rows:
        print(f"{r['depth']:>6} {r['width']:>5} {r['claims']:>6} {r['certified_claims']:>5} {r['passes']:>6} "
              f"{r['derive']:>9.3f} {r['certified']:>12.3f} {r['ratio']:>6.2f} {r['derive_cpu']:>12.3f} "
              f"{r['certified_cpu']:>15.3f} {r['ratio_cpu']:>9.2f}")
    benchlib.write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
