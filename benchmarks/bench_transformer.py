"""Trace and derive time of symalg for a GPT-style transformer (a script, not a test).

The model is a pre-norm decoder stack without embeddings, ``--layers`` blocks of::

    x = x + MultiheadAttention(LayerNorm(x))           # nn.MultiheadAttention(batch_first=True)
    x = x + Linear(4d, d)(GELU(Linear(d, 4d)(LayerNorm(x))))

then a final ``LayerNorm`` and an ``nn.Linear(d, d)`` head; default 12 layers, ``d_model`` 768,
12 heads (``d_k`` = 64), GPT-2-small sized (85 M parameters). The example input is data of shape
``(batch, seq, d_model)`` = ``(1, 4, 768)``. Every repeat runs in a fresh Python process (SymPy's cache
and symalg's caches cold, as for a user's first call; imports and model construction are not timed).
Stages, each timed on its own with ``time.perf_counter``:

* ``forward``    the baseline: one forward pass of the model on the example input (``torch.no_grad``;
                 median of 20 passes after 3 warm-up passes; ``first`` = the very first pass)
* ``trace``      ``symalg.trace(model, (x,))`` (torch.fx + shape propagation)
* ``derive``     ``symalg.derive(graph, certify=False)`` (site inference, groups, bindings)
* ``certify``    ``symalg.verification.certification.claim_errors(analysis)``: the numerical certification that
                 ``symalg.derive(graph)`` adds by default (float64, the model's parameters and a generic point,
                 inputs of the example's and of other shapes, every claim's test elements, the sensitivity
                 control); reported as a ratio against ``trace + derive``
* ``conserved``  ``[s.conserved for s in analysis.symmetries]`` (building the SymPy expressions)
* ``lower``      ``q.lowered`` for every conserved quantity that is not ``None`` (torch code)
* ``evaluate``   calling every lowered quantity once on the model's parameters (a sanity check that
                 the generated code runs on the real tensors; not one of the targets)

Ratios are against ``forward`` measured in the same process. The target is ``trace + derive`` under
30 s at the default size. Memory: ``py peak`` is ``tracemalloc``'s peak of Python allocations during
``trace + derive``, measured in a separate fresh process (so that tracemalloc does not slow the timed
run; torch's own tensor allocations are not seen by tracemalloc); ``maxrss`` is
``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the timed process at the end, and ``+ over model``
its growth over the value right after the model was built (the model itself is ~325 MiB of float32
at the default size). ``--profile N`` adds a cProfile of ``derive`` (top ``N`` functions by
cumulative and by own time) from one more process. ``--verify`` also times ``symalg.verify`` (slow at
large widths: use it with a small ``--d-model``).

Usage::

    python benchmarks/bench_transformer.py                       # 12 x 768, 12 heads, 1 repeat
    python benchmarks/bench_transformer.py --d-model 64 --heads 4 --repeat 5 --verify
    python benchmarks/bench_transformer.py --layers 2 --profile 25 --no-memory
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

STAGES = ("trace", "derive", "conserved", "lower")
"""Stages of ``total``; ``certify`` is timed apart, as a ratio against ``trace + derive``."""
GROUP_PREFIXES = ("GL", "O", "PositiveScaling", "SignFlips", "S", "Translations")


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------
def build_model(layers: int, d_model: int, heads: int, seed: int = 0):
    """A GPT-style pre-norm transformer on ``(batch, seq, d_model)`` inputs (no embeddings)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc1 = nn.Linear(d_model, 4 * d_model)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            y = self.ln1(x)
            x = x + self.attn(y, y, y, need_weights=False)[0]
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, d_model)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    torch.manual_seed(seed)
    return GPT()


def group_prefix(name: str) -> str:
    """``'PositiveScaling(768, alpha=1)'`` → ``'PositiveScaling'``, ``'S(12)'`` → ``'S'``."""
    return name.split("(", 1)[0]


# ---------------------------------------------------------------------------------------------
# child: one measurement in a fresh interpreter
# ---------------------------------------------------------------------------------------------
def _maxrss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _forward_times(model, x, passes: int = 20, warmup: int = 3) -> tuple[float, float]:
    import torch

    with torch.no_grad():
        t0 = time.perf_counter()
        model(x)
        first = time.perf_counter() - t0
        for _ in range(warmup - 1):
            model(x)
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def child(layers: int, d_model: int, heads: int, batch: int, seq: int, mode: str, verify: bool,
          profile_top: int, threads: int = 1) -> dict:
    import torch

    import symalg
    from symalg.verification.certification import claim_errors

    if threads > 0:
        torch.set_num_threads(threads)

    model = build_model(layers, d_model, heads)
    x = torch.randn(batch, seq, d_model, generator=torch.Generator().manual_seed(1))
    n_params = sum(p.numel() for p in model.parameters())
    if mode == "memory":
        import tracemalloc

        tracemalloc.start()
        symalg.derive(symalg.trace(model, (x,)))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"py_peak_mib": peak / 2 ** 20}
    if mode == "profile":
        import cProfile
        import pstats

        graph = symalg.trace(model, (x,))
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        symalg.derive(graph)
        profiler.disable()
        print(f"cProfile of symalg.derive ({time.perf_counter() - t0:.2f} s under the profiler)")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(profile_top)
        stats.sort_stats("tottime").print_stats(profile_top)
        return {}

    rss_model = _maxrss_mib()
    first, forward = _forward_times(model, x)
    t0 = time.perf_counter()
    graph = symalg.trace(model, (x,))
    t1 = time.perf_counter()
    analysis = symalg.derive(graph, certify=False)
    t2 = time.perf_counter()
    derive = t2 - t1
    errors = claim_errors(analysis)
    certify = time.perf_counter() - t2
    t2 = time.perf_counter()
    conserved = [s.conserved for s in analysis.symmetries]
    t3 = time.perf_counter()
    quantities = [q for q in conserved if q is not None]
    lowered = [q.lowered for q in quantities]
    t4 = time.perf_counter()
    params = {k: v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        for f in lowered:
            f(params)
    t5 = time.perf_counter()
    result = {"params": n_params, "forward_first": first, "forward": forward, "trace": t1 - t0, "derive": derive,
              "conserved": t3 - t2, "lower": t4 - t3, "evaluate": t5 - t4,
              "certify": certify, "certify_failed": sum(not e.holds for e in errors),
              "certify_worst": max(e.error for e in errors),
              "symmetries": len(analysis.symmetries), "quantities": len(quantities),
              "blocked": len(analysis.blocked), "nodes": graph.graph.number_of_nodes(),
              "groups": {}, "dims": {}, "lie_dim": 0}
    for s in analysis.symmetries:
        prefix = group_prefix(s.group.name)
        result["groups"][prefix] = result["groups"].get(prefix, 0) + 1
        result["dims"][prefix] = result["dims"].get(prefix, 0) + int(s.group.dim)
        result["lie_dim"] += int(s.group.dim)
    result["maxrss_mib"] = _maxrss_mib()
    result["maxrss_model_mib"] = rss_model
    if verify:
        t0 = time.perf_counter()
        report = symalg.verify(analysis)
        result["verify"] = time.perf_counter() - t0
        result["verify_passed"] = bool(report.passed)
    return result


def run_child(args, mode: str = "time") -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--layers", str(args.layers), "--d-model",
               str(args.d_model), "--heads", str(args.heads), "--batch", str(args.batch), "--seq", str(args.seq),
               "--profile", str(args.profile), "--threads", str(args.threads), "--_child", mode] + \
        (["--verify"] if args.verify else [])
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    lines = out.strip().splitlines()
    if mode == "profile":
        print("\n".join(lines[:-1]))
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------
# parent: repeats, medians, tables
# ---------------------------------------------------------------------------------------------
def print_tables(args, runs: list[dict], py_peak) -> dict:
    first = runs[0]
    med = {key: statistics.median(r[key] for r in runs)
           for key in ("forward_first", "forward", *STAGES, "evaluate", "certify", "maxrss_mib", "maxrss_model_mib")}
    med["trace+derive"] = statistics.median(r["trace"] + r["derive"] for r in runs)
    med["total"] = statistics.median(sum(r[k] for k in STAGES) for r in runs)
    spread = {key: (min(f(r) for r in runs), max(f(r) for r in runs))
              for key, f in (*((k, lambda r, k=k: r[k]) for k in ("forward", *STAGES, "evaluate", "certify")),
                             ("trace+derive", lambda r: r["trace"] + r["derive"]),
                             ("total", lambda r: sum(r[k] for k in STAGES)))}
    d_k = args.d_model // args.heads
    print(f"\nModel: {args.layers} layers, d_model {args.d_model}, {args.heads} heads (d_k {d_k}), MLP "
          f"{4 * args.d_model}, input ({args.batch}, {args.seq}, {args.d_model}); {first['params']:,} parameters, "
          f"{first['nodes']} graph nodes; {len(runs)} fresh process(es), median shown")
    print("\nTime (ms; / forward = stage / one forward pass, median, in the same process)\n")
    print("| stage | median ms | min..max ms | / forward |")
    print("|---|---:|---|---:|")
    rows = [("forward (baseline, median of 20)", "forward"), ("forward, first call", "forward_first"),
            ("`symalg.trace`", "trace"), ("`symalg.derive`", "derive"),
            ("conserved (SymPy)", "conserved"), ("lower (torch code)", "lower"),
            ("**trace + derive**", "trace+derive"), ("total (trace..lower)", "total"),
            ("evaluate lowered q (not in total)", "evaluate"), ("certify (`claim_errors`, not in total)", "certify")]
    if "verify" in first:
        med["verify"] = statistics.median(r["verify"] for r in runs)
        spread["verify"] = (min(r["verify"] for r in runs), max(r["verify"] for r in runs))
        rows.append(("`symalg.verify` (not in total)", "verify"))
    for label, key in rows:
        lo, hi = spread.get(key, (med[key], med[key]))
        rng = f"{1e3 * lo:,.2f}..{1e3 * hi:,.2f}" if len(runs) > 1 and key in spread else "–"
        ratio = med[key] / med["forward"]
        print(f"| {label} | {1e3 * med[key]:,.2f} | {rng} | {ratio:,.0f} |" if ratio >= 100 else
              f"| {label} | {1e3 * med[key]:,.2f} | {rng} | {ratio:.2f} |")
    target = med["trace+derive"] < 30
    per_run = ", ".join(f"{r['certify'] / (r['trace'] + r['derive']):.2f}" for r in runs)
    print(f"\ncertification: {med['certify']:.2f} s = {med['certify'] / med['trace+derive']:.2f} x trace + derive "
          f"(median; per run {per_run}) = {med['certify'] / med['forward']:.0f} forward passes; failed claims "
          f"{first['certify_failed']}, worst relative error "
          f"{first['certify_worst']:.1e}")
    print(f"\ntarget trace + derive < 30 s: {'met' if target else 'NOT met'} ({med['trace+derive']:.1f} s)")
    if "verify" in first:
        print(f"verify passed: {all(r['verify_passed'] for r in runs)}")

    print("\nMemory (MiB)\n")
    print("| maxrss after model | maxrss at end | + over model | py peak (tracemalloc, trace + derive) |")
    print("|---:|---:|---:|---:|")
    peak = f"{py_peak:.1f}" if py_peak is not None else "–"
    print(f"| {med['maxrss_model_mib']:.1f} | {med['maxrss_mib']:.1f} | "
          f"{med['maxrss_mib'] - med['maxrss_model_mib']:.1f} | {peak} |")

    print("\nSymmetries found (same in every run)\n")
    print("| group | count | Lie-algebra dim |")
    print("|---|---:|---:|")
    for prefix in sorted(first["groups"], key=lambda p: (GROUP_PREFIXES + (p,)).index(p)):
        print(f"| {prefix} | {first['groups'][prefix]} | {first['dims'][prefix]:,} |")
    print(f"| **all** | **{first['symmetries']}** | **{first['lie_dim']:,}** |")
    print(f"\nconserved quantities (non-None): {first['quantities']}; blocked: {first['blocked']}")
    mismatched = [i for i, r in enumerate(runs) if (r["groups"], r["lie_dim"]) != (first["groups"], first["lie_dim"])]
    if mismatched:
        print(f"WARNING: runs {mismatched} found different symmetries")
    return {"median": med, "spread": spread, "py_peak_mib": py_peak, "runs": runs}


def figures(quick: bool = False) -> dict:
    """One run of :func:`child` (timings, certification, symmetries found; ``verify`` at the small size): the full
    12 × 768 model in a fresh process, or with ``quick`` 2 layers of width 64 (4 heads) in this one, verify timed."""
    import torch

    torch.set_num_threads(1)
    if quick:
        return child(2, 64, 4, 1, 4, "time", True, 0)
    args = argparse.Namespace(layers=12, d_model=768, heads=12, batch=1, seq=4, profile=0, verify=False, threads=1)
    return run_child(args)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks (default 12)")
    parser.add_argument("--d-model", type=int, default=768, help="model width (default 768)")
    parser.add_argument("--heads", type=int, default=12, help="attention heads (default 12; d_k = d_model / heads)")
    parser.add_argument("--batch", type=int, default=1, help="batch of the example input (default 1)")
    parser.add_argument("--seq", type=int, default=4, help="sequence length of the example input (default 4)")
    parser.add_argument("--repeat", type=int, default=1, help="fresh-process repeats (default 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc process")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also cProfile symalg.derive in one more process and print the top N functions")
    parser.add_argument("--verify", action="store_true",
                        help="also time symalg.verify (slow at large widths; meant for a small --d-model)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads in the measuring processes (default 1; 0 keeps torch's default: "
                             "on a shared 2-core machine a second thread made one forward pass 30× slower)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.d_model % args.heads:
        parser.error("--d-model must be a multiple of --heads")

    if args._child:
        print(json.dumps(child(args.layers, args.d_model, args.heads, args.batch, args.seq, args._child,
                               args.verify, args.profile, args.threads)))
        return

    import sympy
    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, sympy {sympy.__version__}, "
          f"cpus {os.cpu_count()}, torch threads {args.threads or torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    started = time.perf_counter()
    runs = []
    for i in range(args.repeat):
        r = run_child(args)
        runs.append(r)
        print(f"  run {i + 1}/{args.repeat}: forward {1e3 * r['forward']:.2f} ms, trace {r['trace']:.3f} s, "
              f"derive {r['derive']:.3f} s, conserved {r['conserved']:.3f} s, lower {r['lower']:.3f} s", flush=True)
    py_peak = None if args.no_memory else run_child(args, "memory")["py_peak_mib"]
    results = print_tables(args, runs, py_peak)
    if args.profile:
        print()
        run_child(args, "profile")
    print(f"\nwall time of the benchmark: {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, **results}, f,
                      indent=2)


if __name__ == "__main__":
    main()
