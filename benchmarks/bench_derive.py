"""Derivation time of symalg for deep MLPs with symbolic widths (a script, not a test).

For a depth ``L`` (the number of linear layers) the network is::

    linear(h0, h1) -> relu -> linear(h1, h2) -> relu -> ... -> linear(h{L-1}, hL)

with one width symbol per layer, i.e. ``L - 1`` hidden sites. ``--mixed`` adds the same chains with
the activations cycling ``relu, tanh, identity``. Each measurement runs in a fresh Python process, so
SymPy's global cache and symalg's ``_checks`` cache start cold, like a user's first call. Stages:

* ``parse``      ``symalg.parse(spec)``
* ``derive``     ``symalg.derive(arch)`` (inference, actions, generators, symbolic checks)
* ``conserved``  ``analysis.conserved_quantities()`` (building the SymPy expressions)
* ``lower``      ``q.lowered`` for every conserved quantity (printing + compiling torch code)

``total`` is their sum. ``warm`` repeats parse + derive + conserved + lower once more in the same
process (SymPy and symalg caches hot).

**Spec against traced** (``--compare``, the second table): the same ReLU chain three ways, each in one fresh process
per depth after a warm-up on a depth-3 chain of each kind (the width-independent symbolic checks are cached per
process, so all three start with them): ``symalg.derive(symalg.parse(spec))`` with symbolic widths, the same spec at
width 16 (its generated float64 module is certified), and the baseline, the traced path on the equivalent
``nn.Sequential`` of width 16 (``symalg.trace`` + ``symalg.derive``, certified alike). Times are CPU seconds of the
process (``time.process_time``) and wall seconds. Memory: ``maxrss`` is ``resource.getrusage(...).ru_maxrss``
of the child after the cold run minus the same value after the imports (an upper-bound-ish estimate
of the extra resident memory); ``py peak`` is ``tracemalloc``'s peak of Python allocations during one
cold run, measured in a separate child (tracemalloc slows the run ~5x, so its time is not reported,
and by default it is run only up to depth 100: ``--tracemalloc-max-depth 1000`` adds ~1 min).

Usage::

    python benchmarks/bench_derive.py            # depths 10, 100, 1000 (+ mixed), ~2 min
    python benchmarks/bench_derive.py --quick    # depths 10, 100, 2 repeats, no tracemalloc, ~30 s
    python benchmarks/bench_derive.py --depths 10 50 --repeats 3 --no-mixed --no-memory
    python benchmarks/bench_derive.py --compare --depths 10 100 1000   # spec against traced only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

RELU = ("relu",)
MIXED = ("relu", "tanh", "identity")


def spec_string(depth: int, activations=RELU) -> str:
    """The spec of an MLP with ``depth`` linear layers and one symbolic width per layer."""
    parts = []
    for k in range(depth):
        parts.append(f"linear(h{k}, h{k + 1})")
        if k < depth - 1:
            parts.append(activations[k % len(activations)])
    return " -> ".join(parts)


# ---------------------------------------------------------------------------------------------
# child: one measurement in a fresh interpreter
# ---------------------------------------------------------------------------------------------
def _maxrss_mib() -> float:
    import resource

    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _one_pass(symalg, spec: str) -> dict:
    t0 = time.perf_counter()
    arch = symalg.parse(spec)
    t1 = time.perf_counter()
    analysis = symalg.derive(arch)
    t2 = time.perf_counter()
    quantities = analysis.conserved_quantities()
    t3 = time.perf_counter()
    lowered = [q.lowered for q in quantities]
    t4 = time.perf_counter()
    return {"parse": t1 - t0, "derive": t2 - t1, "conserved": t3 - t2, "lower": t4 - t3, "total": t4 - t0,
            "sites": len(analysis.sites.classes), "symmetries": len(analysis.symmetries), "quantities": len(lowered)}


def child(depth: int, activations: tuple, memory: bool, warm: bool) -> dict:
    import torch

    import symalg  # noqa: F401  (imports torch and sympy; not timed)

    torch.set_num_threads(1)

    spec = spec_string(depth, activations)
    if memory:
        import tracemalloc

        tracemalloc.start()
        _one_pass(symalg, spec)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"py_peak_mib": peak / 2 ** 20}
    rss0 = _maxrss_mib()
    result = _one_pass(symalg, spec)
    result["maxrss_mib"] = _maxrss_mib()
    result["maxrss_delta_mib"] = result["maxrss_mib"] - rss0
    if warm:
        result["warm_total"] = _one_pass(symalg, spec)["total"]
    return result


def run_child(depth: int, activations: tuple, memory: bool = False, warm: bool = False) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--_child", str(depth), ",".join(activations)]
    command += ["--_memory"] if memory else []
    command += ["--_warm"] if warm else []
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def sequential(depth: int, width: int = 16):
    """The traced baseline: ``Linear(width, width)`` layers with ReLUs between them, float64."""
    import torch

    torch.manual_seed(0)
    layers: list = []
    for k in range(depth):
        layers += [torch.nn.Linear(width, width)] + ([torch.nn.ReLU()] if k < depth - 1 else [])
    return torch.nn.Sequential(*layers).double()


def compare(depth: int, width: int = 16) -> dict:
    """Spec (symbolic widths; concrete widths) against traced, in this process after a warm-up (see the docstring)."""
    import torch

    import symalg
    from benchlib import timed

    x = torch.randn(8, width, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def concrete(d: int) -> str:
        return " -> relu -> ".join([f"linear({width}, {width})"] * d)

    runs = {"spec_symbolic": lambda d: symalg.derive(symalg.parse(spec_string(d))),
            "spec_concrete": lambda d: symalg.derive(symalg.parse(concrete(d))),
            "traced": lambda d: symalg.derive(symalg.trace(sequential(d, width), (x,)))}
    for run in runs.values():
        run(3)
    row: dict = {"depth": depth, "width": width}
    for name, run in runs.items():
        wall, cpu, analysis = timed(lambda: run(depth))
        row[name] = {"s": wall, "cpu_s": cpu, "claims": len(analysis.symmetries)}
    model = sequential(depth, width)
    row["traced"]["derive_only_cpu_s"] = timed(lambda: symalg.derive(symalg.trace(model, (x,))))[1] - \
        timed(lambda: symalg.trace(model, (x,)))[1]
    for name in ("spec_symbolic", "spec_concrete"):
        row[name]["cpu_over_traced"] = row[name]["cpu_s"] / row["traced"]["cpu_s"]
    return row


def run_compare(depth: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--_compare", str(depth)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# parent: repeats, medians, tables
# ---------------------------------------------------------------------------------------------
def measure(depth: int, activations: tuple, repeats: int, memory: bool, warm: bool) -> dict:
    runs = [run_child(depth, activations, warm=(warm and i == 0)) for i in range(repeats)]
    row = {"depth": depth, "activations": "/".join(activations), "repeats": repeats,
           "sites": runs[0]["sites"], "symmetries": runs[0]["symmetries"], "quantities": runs[0]["quantities"]}
    for key in ("parse", "derive", "conserved", "lower", "total", "maxrss_mib", "maxrss_delta_mib"):
        row[key] = statistics.median(r[key] for r in runs)
    row["total_min"] = min(r["total"] for r in runs)
    row["total_max"] = max(r["total"] for r in runs)
    row["warm_total"] = runs[0].get("warm_total")
    row["py_peak_mib"] = run_child(depth, activations, memory=True)["py_peak_mib"] if memory else None
    return row


def print_tables(rows: list[dict]) -> None:
    head = (f"{'depth':>6} {'acts':>20} {'rep':>3} {'sites':>5} {'qs':>4} {'parse':>7} {'derive':>7} "
            f"{'conserv':>7} {'lower':>7} {'total':>8} {'ms/layer':>8} {'marginal':>8} {'min..max total':>16} "
            f"{'warm':>7}")
    print("\nTime (seconds; median over fresh processes; ms/layer = median total / depth; marginal = "
          "(total - total at the previous depth) / (depth - previous depth), in ms per added layer)")
    print(head)
    print("-" * len(head))
    previous = {}
    for r in rows:
        warm = f"{r['warm_total']:7.3f}" if r["warm_total"] is not None else f"{'-':>7}"
        before = previous.get(r["activations"])
        marginal = (f"{1e3 * (r['total'] - before['total']) / (r['depth'] - before['depth']):8.2f}"
                    if before and r["depth"] > before["depth"] else f"{'-':>8}")
        previous[r["activations"]] = r
        print(f"{r['depth']:>6} {r['activations']:>20} {r['repeats']:>3} {r['sites']:>5} {r['quantities']:>4} "
              f"{r['parse']:7.3f} {r['derive']:7.3f} {r['conserved']:7.3f} {r['lower']:7.3f} {r['total']:8.3f} "
              f"{1e3 * r['total'] / r['depth']:8.2f} {marginal} {r['total_min']:7.3f}..{r['total_max']:<7.3f} {warm}")
    head = (f"{'depth':>6} {'acts':>20} {'maxrss MiB':>10} {'+ over imports':>15} {'marginal KiB/layer':>18} "
            f"{'py peak MiB':>12} {'marginal KiB/layer':>18}")
    print("\nMemory (maxrss of the child process, and its growth over the value after the imports; py peak = "
          "tracemalloc peak during one cold run; marginal = growth per added layer from the previous depth)")
    print(head)
    print("-" * len(head))

    def marginal(r, before, key):
        if not before or before[key] is None or r[key] is None or r["depth"] <= before["depth"]:
            return f"{'-':>18}"
        return f"{1024 * (r[key] - before[key]) / (r['depth'] - before['depth']):18.1f}"

    previous = {}
    for r in rows:
        before = previous.get(r["activations"])
        peak = r["py_peak_mib"]
        peak_s = f"{peak:12.1f}" if peak is not None else f"{'-':>12}"
        print(f"{r['depth']:>6} {r['activations']:>20} {r['maxrss_mib']:10.1f} {r['maxrss_delta_mib']:15.1f} "
              f"{marginal(r, before, 'maxrss_delta_mib')} {peak_s} {marginal(r, before, 'py_peak_mib')}")
        previous[r["activations"]] = r


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="depths 10 and 100, 2 repeats, no tracemalloc runs (~30 s)")
    parser.add_argument("--depths", type=int, nargs="+", help="depths (number of linear layers)")
    parser.add_argument("--repeats", type=int, help="fresh-process repeats for depths <= 100 (default 5, quick 2)")
    parser.add_argument("--no-mixed", action="store_true", help="skip the relu/tanh/identity chains")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    parser.add_argument("--tracemalloc-max-depth", type=int, default=100,
                        help="tracemalloc runs only up to this depth (default 100; depth 1000 under "
                             "tracemalloc takes ~1 min on 2 cores; maxrss is reported for every depth)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--_memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compare", action="store_true", help="only the spec-against-traced table")
    parser.add_argument("--_warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_compare", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._child:
        depth, acts = int(args._child[0]), tuple(args._child[1].split(","))
        print(json.dumps(child(depth, acts, args._memory, args._warm)))
        return
    if args._compare:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(compare(args._compare)))
        return
    if args.compare:
        print_compare([run_compare(d) for d in args.depths or [10, 100, 1000]])
        return

    depths = args.depths or ([10, 100] if args.quick else [10, 100, 1000])
    small_repeats = args.repeats or (2 if args.quick else 5)
    memory = not (args.no_memory or args.quick)
    import platform

    import sympy
    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, sympy {sympy.__version__}, "
          f"cpus {os.cpu_count()}")
    started = time.perf_counter()
    rows = []
    configs = [(d, RELU) for d in depths] + ([] if args.no_mixed else [(d, MIXED) for d in depths])
    for depth, acts in configs:
        # depth 1000 takes ~10-15 s per cold run: one run, and the warm pass only at small depths.
        repeats = small_repeats if depth <= 100 else (args.repeats or 1)
        traced = memory and acts == RELU and depth <= args.tracemalloc_max_depth
        row = measure(depth, acts, repeats, memory=traced, warm=depth <= 100)
        rows.append(row)
        print(f"  depth {depth:>5} {row['activations']:>20}: total {row['total']:.3f} s "
              f"({1e3 * row['total'] / depth:.2f} ms/layer, {repeats} run(s))", flush=True)
    print_tables(rows)
    compared = [run_compare(d) for d in depths]
    print_compare(compared)
    print(f"\nwall time of the benchmark: {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"pipeline": rows, "spec_vs_traced": compared}, f, indent=2)


def print_compare(rows: list[dict]) -> None:
    print("\nSpec against traced (one fresh process per depth, after a warm-up; CPU s, wall s in brackets)")
    print("| depth L | claims | spec, symbolic widths | spec, width 16 (certified) | traced, width 16 (certified) "
          "| traced: derive alone | spec symbolic / traced | spec concrete / traced |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s, c, t = r["spec_symbolic"], r["spec_concrete"], r["traced"]
        print(f"| {r['depth']} | {t['claims']} | {s['cpu_s']:.3f} ({s['s']:.3f}) | {c['cpu_s']:.3f} ({c['s']:.3f}) | "
              f"{t['cpu_s']:.3f} ({t['s']:.3f}) | {t['derive_only_cpu_s']:.3f} | {s['cpu_over_traced']:.2f} | "
              f"{c['cpu_over_traced']:.2f} |")


def figures(quick: bool = False) -> dict:
    """The pipeline table (symbolic widths) and spec against traced; ``quick``: depths 10 and 30 in this process,
    one run each, no memory runs."""
    if not quick:
        rows = [measure(d, RELU, 5 if d <= 100 else 1, memory=False, warm=d <= 100) for d in (10, 100, 1000)]
        return {"pipeline": rows, "spec_vs_traced": [run_compare(d) for d in (10, 100, 1000)]}
    import symalg

    rows = []
    for depth in (10, 30):
        row = _one_pass(symalg, spec_string(depth))
        rows.append({"depth": depth, **row})
    return {"pipeline": rows, "spec_vs_traced": [compare(d) for d in (10, 30)]}


if __name__ == "__main__":
    main()
