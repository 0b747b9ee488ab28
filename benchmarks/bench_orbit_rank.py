"""Orbit dimension at scale: the structured rank of ``M ↦ M·θ`` against the dense baseline (a script, and
:func:`run`, which returns the figures as a dict for a JSON runner).

Models (float32 as built by torch; both methods compute in float64):

* two-layer networks ``Linear(h, h) → act → Linear(h, h)`` for ``--widths`` (default 16, 32, …, 4096;
  ``2h² + 2h`` parameters, 33.6 M at 4096). ``--activation identity`` (default) gives the site
  ``GL(h)`` (Lie algebra of dimension ``h²``), ``relu`` gives positive scaling (dimension ``h``);
* the 12-layer GPT-style transformer of ``bench_transformer.py`` (d_model 768, 12 heads, 85.6 M
  parameters; ``--no-transformer`` skips it).

Methods: ``structured`` (``ranks="auto"``: a full rank of a matrix whose sides are both at least 256 certified by
QR and a triangular inverse, no SVD), ``svd`` (the same structured method with ``ranks="svd"``: every rank from the
singular values, the path before the QR certificate) and ``dense``. For each model and method, one fresh process
warms the method up on a width-2 network (the first
``torch.func`` call of a process costs about a second), builds the model, traces and derives it
(timed apart), then times ``symalg.numeric.orbit_rank.model_orbit_dimension(analysis, method=...)`` with
``time.perf_counter``. Memory is the growth of the process's peak RSS (``ru_maxrss``) over its value
just before the call: ``tracemalloc`` does not see torch's tensor storage, which is where the memory
goes. The dense baseline (``torch.func.jacfwd`` Jacobian of the whole action, ``P × Σ dim g``, then
its SVD) is refused by the library beyond ``--dense-max-gib`` (it raises ``MemoryError`` with the size it
would need, reported as "out of memory (needs …)"), and skipped by this script when the SVD would
exceed ``--dense-max-flops`` (``4·m·n²`` for an ``m × n`` matrix, ``m ≥ n``). Where both ran, the
script checks that they agree. ``--repeat N`` repeats every measurement in N fresh processes and
reports medians. The measuring processes run torch single-threaded by default (``--threads``): on
the shared 2-core machine a 2-thread LAPACK SVD of a 257 × 256 matrix took 0.36 s against 0.009 s
single-threaded (and 15 s against 3 s at 2049 × 2048), which would make the numbers measure the
other jobs.

Usage::

    python benchmarks/bench_orbit_rank.py --repeat 3                  # the table in docs/benchmarks.md
    python benchmarks/bench_orbit_rank.py --widths 16 32 64 --no-transformer --repeat 3
    python benchmarks/bench_orbit_rank.py --activation relu --widths 64 256 1024
    python benchmarks/bench_orbit_rank.py --quick                     # widths 16 … 1024, no transformer

As a function: ``run(widths=(16, 64, 256), transformer=False)`` → ``{"machine": …, "rows": [{"kind", "width",
"structured": {...}, "svd": {...}, "dense": {...}}, …]}`` (times in seconds under ``"time"``); ``figures(quick)``
is the entry of ``run_all.py``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTHS = [16 * 2 ** k for k in range(9)]        # 16 … 4096
QUICK_WIDTHS = [16, 64, 256, 1024]
METHODS = ("structured", "svd", "dense")
GIB = 2 ** 30


def build(kind: str, width: int, activation: str):
    """The model and an example input."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "transformer":
        sys.path.insert(0, HERE)
        from bench_transformer import build_model

        return build_model(12, 768, 12), torch.randn(1, 4, 768, generator=torch.Generator().manual_seed(1))
    act = {"identity": nn.Identity, "relu": nn.ReLU}[activation]()
    return nn.Sequential(nn.Linear(width, width), act, nn.Linear(width, width)), torch.randn(2, width)


def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, width: int, activation: str, method: str, dense_max_gib: float, dense_max_flops: float,
          threads: int, certify: bool = True) -> dict:
    import torch

    import symalg
    from symalg.numeric.orbit_rank import model_orbit_dimension

    if threads:
        torch.set_num_threads(threads)

    structure, ranks = ("structured", method) if method == "svd" else (method, "auto")
    tiny, x = build("two-layer", 2, activation)      # warm-up: torch.func's first call costs about a second
    model_orbit_dimension(symalg.derive(symalg.trace(tiny, (x,))), method=structure)
    model, x = build(kind, width, activation)
    t0 = time.perf_counter()
    analysis = symalg.derive(symalg.trace(model, (x,)), certify=certify)
    derive = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    algebra = sum(int(s.group.dim) for s in analysis.symmetries)
    result = {"params": params, "algebra_dim": algebra, "derive": derive, "status": "ok"}
    if method == "dense":     # the library's own size estimate, asked with a zero budget
        try:
            model_orbit_dimension(analysis, method="dense", max_bytes=0)
        except MemoryError as error:
            needs = float(str(error).split("needs ")[1].split(" GiB")[0])
        moved = {t for s in analysis.symmetries if s.group.is_continuous for t in s.tensors}
        rows = sum(p.numel() for name, p in model.named_parameters() if name in moved)
        m, n = max(rows, algebra), min(rows, algebra)
        if needs > dense_max_gib:
            result["status"] = f"out of memory (needs {needs:,.3g} GiB)"
            return result
        if 4 * m * n * n > dense_max_flops:
            result["status"] = f"skipped (SVD ≈ {4 * m * n * n:.1e} flops)"
            return result
    before = _maxrss_mib()
    t0 = time.perf_counter()
    orbit = model_orbit_dimension(analysis, method=structure, max_bytes=dense_max_gib * GIB, ranks=ranks)
    result.update(time=time.perf_counter() - t0, rss=_maxrss_mib() - before, dimension=orbit.dimension,
                  expected=orbit.expected, gap=orbit.gap, margin=orbit.margin,
                  methods=sorted({c.method for c in orbit.components}),
                  certificates=dict(Counter(d.certificate for d in orbit.decisions)))
    return result


def run_child(args: argparse.Namespace, kind: str, width: int, method: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--_child", kind, str(width), method,
               "--activation", args.activation, "--dense-max-gib", str(args.dense_max_gib),
               "--dense-max-flops", str(args.dense_max_flops), "--threads", str(args.threads)] + \
        (["--no-certify"] if args.no_certify else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"status": f"failed (exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]})"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, kind: str, width: int, method: str) -> dict:
    runs = [run_child(args, kind, width, method)]
    if runs[0]["status"] == "ok":
        runs += [run_child(args, kind, width, method) for _ in range(args.repeat - 1)]
    first = dict(runs[0])
    for key in ("time", "rss", "derive"):
        if all(key in r for r in runs):
            first[key] = statistics.median(r[key] for r in runs)
            first[key + "_range"] = (min(r[key] for r in runs), max(r[key] for r in runs))
    first["runs"] = len(runs)
    return first


def cell_time(r: dict) -> str:
    if r["status"] != "ok":
        return r["status"]
    return f"{r['time']:.4f}" if r["time"] < 1 else f"{r['time']:.2f}"


def cell_rss(r: dict) -> str:
    return f"{r['rss']:.1f}" if "rss" in r else "–"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=WIDTHS, help="hidden widths h (default 16 … 4096)")
    parser.add_argument("--quick", action="store_true", help=f"widths {QUICK_WIDTHS}, no transformer")
    parser.add_argument("--activation", choices=("identity", "relu"), default="identity",
                        help="activation of the two-layer networks (default identity: GL(h))")
    parser.add_argument("--no-transformer", action="store_true", help="skip the 12-layer transformer")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="methods to time (default all three)")
    parser.add_argument("--repeat", type=int, default=1, help="fresh-process repeats per measurement (default 1)")
    parser.add_argument("--dense-max-gib", type=float, default=4.0,
                        help="memory the dense Jacobian may take (default 4 GiB; the machine has 23 GiB)")
    parser.add_argument("--dense-max-flops", type=float, default=2e12,
                        help="largest dense SVD to attempt, in flops (default 2e12, about a minute here)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in the measuring processes (default 1; 0 = torch's default)")
    parser.add_argument("--no-certify", action="store_true",
                        help="derive without certification (its GL(h) test elements cost minutes at h = 4096 on a "
                             "loaded machine; the orbit rank does not depend on it; the derive time then excludes it)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    return parser


def machine(threads: int) -> dict:
    """Where the figures were measured (CPU count, torch threads, load average at the start)."""
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "threads": threads or torch.get_num_threads(),
            "load_average": os.getloadavg()[0]}


def collect(args: argparse.Namespace, echo: bool = False) -> dict:
    """The rows: every case measured by every method of ``args.methods`` (fresh processes)."""
    started = time.perf_counter()
    result = {"machine": machine(args.threads), "rows": []}
    widths = QUICK_WIDTHS if args.quick else args.widths
    transformer = not (args.no_transformer or args.quick)
    for kind, width in [("two-layer", w) for w in widths] + ([("transformer", 768)] if transformer else []):
        row = {"kind": kind, "width": width, **{m: measure(args, kind, width, m) for m in args.methods}}
        result["rows"].append(row)
        if echo:
            print(f"  {kind} {width}: " + ", ".join(f"{m} {cell_time(row[m])}" for m in args.methods), flush=True)
    result["wall"] = time.perf_counter() - started
    return result


def run(**settings) -> dict:
    """The benchmark as a function: keyword arguments are the command-line options (``widths=[16, 64]``,
    ``transformer=False``, ``repeat=3``, ``quick=True``, ``methods=["structured", "svd"]``, …); returns
    ``{"machine", "rows", "wall"}`` (see the module docstring)."""
    args = parser().parse_args([])
    if "transformer" in settings:
        settings["no_transformer"] = not settings.pop("transformer")
    for key, value in settings.items():
        if not hasattr(args, key):
            raise TypeError(f"run: unknown setting {key!r}")
        setattr(args, key, value)
    return collect(args)


def figures(quick: bool = False) -> dict:
    """The figures for ``benchmarks/run_all.py``: ``quick``: widths 16 and 64 with the structured and dense methods
    (seconds), else the table of docs/benchmarks.md (widths 16 … 4096 and the transformer, 3 repeats)."""
    if quick:
        return run(widths=[16, 64], transformer=False, methods=["structured", "dense"])
    return run(repeat=3)


def report(result: dict, args: argparse.Namespace) -> None:
    """Print the tables of :func:`collect`'s result."""
    rows = result["rows"]
    act = "GL(h)" if args.activation == "identity" else "positive scaling"
    print(f"\nTwo-layer networks Linear(h, h) → {args.activation} → Linear(h, h) ({act}); 12-layer transformer "
          f"d_model 768, 12 heads. Times in seconds (median of {args.repeat} fresh process(es), min..max); memory = "
          "growth of peak RSS during the call (MiB).\n")
    empty = {"status": "not run"}
    print("| model | parameters | dim g | orbit dim | structured s | +RSS MiB | SVD ranks s | SVD / structured "
          "| dense s | +RSS MiB | dense / structured |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        s, v, d = (row.get(m, empty) for m in METHODS)
        name = f"h = {row['width']}" if row["kind"] == "two-layer" else "transformer 12 × 768"

        def ratio(other: dict) -> str:
            return f"{other['time'] / s['time']:,.{1 if other is v else 0}f}×" \
                if other["status"] == s["status"] == "ok" else "–"

        dim = f"{s['dimension']:,}" if "dimension" in s else "–"
        for other in (v, d):
            if other["status"] == s["status"] == "ok":
                dim += " ✓" if other["dimension"] == s["dimension"] else " ✗ DIFFER"
        print(f"| {name} | {s.get('params', 0):,} | {s.get('algebra_dim', 0):,} | {dim} | {cell_time(s)} "
              f"| {cell_rss(s)} | {cell_time(v)} | {ratio(v)} | {cell_time(d)} | {cell_rss(d)} | {ratio(d)} |")
    at64 = next((r for r in rows if r["kind"] == "two-layer" and r["width"] == 64), None)
    if at64 and at64.get("dense", empty)["status"] == at64["structured"]["status"] == "ok":
        ratio64 = at64["dense"]["time"] / at64["structured"]["time"]
        print(f"\nwidth 64: structured {ratio64:,.0f}× faster than dense "
              f"(target ≥ 100×: {'met' if ratio64 >= 100 else 'NOT met'})")
    at4096 = next((r for r in rows if r["kind"] == "two-layer" and r["width"] == 4096), None)
    if at4096 and at4096.get("svd", empty)["status"] == at4096["structured"]["status"] == "ok":
        ratio4096 = at4096["svd"]["time"] / at4096["structured"]["time"]
        print(f"width 4096: QR certificate {ratio4096:.1f}× faster than SVD ranks "
              f"(target ≥ 3×: {'met' if ratio4096 >= 3 else 'NOT met'})")
    print("\nstructured: method, generic (formula) value, certificate, trace + derive time")
    for r in rows:
        s = r["structured"]
        name = f"h = {r['width']}" if r["kind"] == "two-layer" else "transformer"
        print(f"  {name}: {', '.join(s.get('methods', []))}; generic {s.get('expected')}; "
              f"gap {s.get('gap', math.nan):.3g}, margin {s.get('margin', math.nan):.3g} "
              f"(SVD ranks: {r.get('svd', empty).get('margin', math.nan):.3g}); rank decisions "
              f"{s.get('certificates', {})}; trace + derive {s.get('derive', math.nan):.3f} s")
    print(f"\nwall time of the benchmark: {result['wall']:.1f} s")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args._child:
        kind, width, method = args._child
        print(json.dumps(child(kind, int(width), args.activation, method, args.dense_max_gib, args.dense_max_flops,
                               args.threads, not args.no_certify)))
        return
    info = machine(args.threads)
    print(f"python {info['python']}, torch {info['torch']}, cpus {info['cpus']}, torch threads {info['threads']}, "
          f"load average {info['load_average']:.2f}")
    result = collect(args, echo=True)
    report(result, args)
    if args.json:
        with open(args.json, "w") as f:
            settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
            json.dump({"args": settings, **result}, f, indent=2)


if __name__ == "__main__":
    main()
