"""Orbit dimension at scale: the structured rank of ``M ↦ M·θ`` against the dense baseline (a script).

Models (float32 as built by torch; both methods compute in float64):

* two-layer networks ``Linear(h, h) → act → Linear(h, h)`` for ``--widths`` (default 16, 32, …, 4096;
  ``2h² + 2h`` parameters, 33.6 M at 4096). ``--activation identity`` (default) gives the site
  ``GL(h)`` (Lie algebra of dimension ``h²``), ``relu`` gives positive scaling (dimension ``h``);
* the 12-layer GPT-style transformer of ``bench_transformer.py`` (d_model 768, 12 heads, 85.6 M
  parameters; ``--no-transformer`` skips it).

For each model and method, one fresh process warms the method up on a width-2 network (the first
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

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTHS = [16 * 2 ** k for k in range(9)]        # 16 … 4096
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
          threads: int) -> dict:
    import torch

    import symalg
    from symalg.numeric.orbit_rank import model_orbit_dimension

    if threads:
        torch.set_num_threads(threads)

    tiny, x = build("two-layer", 2, activation)      # warm-up: torch.func's first call costs about a second
    model_orbit_dimension(symalg.derive(symalg.trace(tiny, (x,))), method=method)
    model, x = build(kind, width, activation)
    t0 = time.perf_counter()
    analysis = symalg.derive(symalg.trace(model, (x,)))
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
    orbit = model_orbit_dimension(analysis, method=method, max_bytes=dense_max_gib * GIB)
    result.update(time=time.perf_counter() - t0, rss=_maxrss_mib() - before, dimension=orbit.dimension,
                  expected=orbit.expected, gap=orbit.gap, margin=orbit.margin,
                  methods=sorted({c.method for c in orbit.components}))
    return result


def run_child(args, kind: str, width: int, method: str) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--_child", kind, str(width), method,
               "--activation", args.activation, "--dense-max-gib", str(args.dense_max_gib),
               "--dense-max-flops", str(args.dense_max_flops), "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"status": f"failed (exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]})"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args, kind: str, width: int, method: str) -> dict:
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


def figures(quick: bool = False) -> dict:
    """Structured and dense rank of the two-layer ``GL(h)`` networks (and, in full, the transformer), one fresh
    process per measurement; ``quick``: widths 16 and 32, in this process."""
    if quick:
        return {"rows": [{"kind": "two-layer", "width": w, **{method: child("two-layer", w, "identity", method, 4.0,
                                                                             2e12, 1) for method in ("structured",
                                                                                                     "dense")}}
                         for w in (16, 32)]}
    args = argparse.Namespace(activation="identity", dense_max_gib=4.0, dense_max_flops=2e12, threads=1, repeat=1)
    cases = [("two-layer", w) for w in WIDTHS] + [("transformer", 768)]
    return {"rows": [{"kind": kind, "width": width, "structured": measure(args, kind, width, "structured"),
                      "dense": measure(args, kind, width, "dense")} for kind, width in cases]}


def cell_time(r: dict) -> str:
    if r["status"] != "ok":
        return r["status"]
    return f"{r['time']:.4f}" if r["time"] < 1 else f"{r['time']:.2f}"


def cell_rss(r: dict) -> str:
    return f"{r['rss']:.1f}" if "rss" in r else "–"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=WIDTHS, help="hidden widths h (default 16 … 4096)")
    parser.add_argument("--activation", choices=("identity", "relu"), default="identity",
                        help="activation of the two-layer networks (default identity: GL(h))")
    parser.add_argument("--no-transformer", action="store_true", help="skip the 12-layer transformer")
    parser.add_argument("--repeat", type=int, default=1, help="fresh-process repeats per measurement (default 1)")
    parser.add_argument("--dense-max-gib", type=float, default=4.0,
                        help="memory the dense Jacobian may take (default 4 GiB; the machine has 23 GiB)")
    parser.add_argument("--dense-max-flops", type=float, default=2e12,
                        help="largest dense SVD to attempt, in flops (default 2e12, about a minute here)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in the measuring processes (default 1; 0 = torch's default)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._child:
        kind, width, method = args._child
        print(json.dumps(child(kind, int(width), args.activation, method, args.dense_max_gib, args.dense_max_flops,
                               args.threads)))
        return

    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, cpus {os.cpu_count()}, torch threads "
          f"{args.threads or torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    cases = [("two-layer", w) for w in args.widths] + ([] if args.no_transformer else [("transformer", 768)])
    rows = []
    for kind, width in cases:
        structured = measure(args, kind, width, "structured")
        dense = measure(args, kind, width, "dense")
        rows.append({"kind": kind, "width": width, "structured": structured, "dense": dense})
        print(f"  {kind} {width}: structured {cell_time(structured)}, dense {cell_time(dense)}", flush=True)

    act = "GL(h)" if args.activation == "identity" else "positive scaling"
    print(f"\nTwo-layer networks Linear(h, h) → {args.activation} → Linear(h, h) ({act}); 12-layer transformer "
          f"d_model 768, 12 heads. Times in seconds (median of {args.repeat} fresh process(es)); memory = growth of "
          "peak RSS during the call (MiB).\n")
    print("| model | parameters | dim g | orbit dim | structured s | +RSS MiB | dense s | +RSS MiB "
          "| dense / structured |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        s, d = row["structured"], row["dense"]
        name = f"h = {row['width']}" if row["kind"] == "two-layer" else "transformer 12 × 768"
        both = d["status"] == s["status"] == "ok"
        ratio = f"{d['time'] / s['time']:,.0f}×" if both else "–"
        dim = f"{s['dimension']:,}" if "dimension" in s else "–"
        if both:
            dim += " ✓" if d["dimension"] == s["dimension"] else " ✗ DIFFER"
        print(f"| {name} | {s.get('params', 0):,} | {s.get('algebra_dim', 0):,} | {dim} | {cell_time(s)} "
              f"| {cell_rss(s)} | {cell_time(d)} | {cell_rss(d)} | {ratio} |")
    at64 = next((r for r in rows if r["kind"] == "two-layer" and r["width"] == 64), None)
    if at64 and at64["dense"]["status"] == at64["structured"]["status"] == "ok":
        ratio = at64["dense"]["time"] / at64["structured"]["time"]
        print(f"\nwidth 64: structured {ratio:,.0f}× faster than dense "
              f"(target ≥ 100×: {'met' if ratio >= 100 else 'NOT met'})")
    print("\nstructured: method, generic (formula) value, certificate, trace + derive time")
    for r in rows:
        s = r["structured"]
        name = f"h = {r['width']}" if r["kind"] == "two-layer" else "transformer"
        print(f"  {name}: {', '.join(s.get('methods', []))}; generic {s.get('expected')}; "
              f"gap {s.get('gap', math.nan):.3g}, margin {s.get('margin', math.nan):.3g}; "
              f"trace + derive {s.get('derive', math.nan):.3f} s")
    print(f"\nwall time of the benchmark: {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            settings = {k: v for k, v in vars(args).items() if not k.startswith("_")}
            json.dump({"args": settings, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
