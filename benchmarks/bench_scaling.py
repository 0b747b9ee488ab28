"""Scaling curves: derive, verify, orbit rank and conservation-law counting against depth, width and parameter count.

Models: ReLU MLPs ``Linear(w, w) → ReLU → … → Linear(w, w)`` in float64 (``d`` linear layers, ``d − 1``
``PositiveScaling(w)`` sites; ``--activation identity`` gives ``GL(w)`` sites instead), traced on a batch of 8:

* **depth** sweep: width 16, ``d`` in ``DEPTHS`` (``--quick``: ``QUICK_DEPTHS``);
* **width** sweep: depth 3, ``w`` in ``WIDTHS`` (``--quick``: ``QUICK_WIDTHS``).

Stages, each timed with ``time.perf_counter`` in one process (torch single-threaded) after a warm-up on a width-2
model, median of ``--repeat``:

* ``derive``: ``symalg.derive(symalg.trace(model, (x,)))`` (with its certification);
* ``verify``: ``symalg.verify(analysis)``;
* ``orbit rank``: ``symalg.numeric.orbit_rank.model_orbit_dimension(analysis)``;
* ``conservation laws``: ``analysis.independent_conserved(params)`` (the rank of the symmetric generators' action,
  a ``P × Σ n_sym`` Jacobian), skipped where that Jacobian would exceed ``--max-entries`` entries.

The exponent of each curve is the least-squares slope of ``log t`` against ``log x`` over its points that took at
least 5 ms (below that, fixed costs dominate). The figure (``--out``, default ``docs/images/scaling.png``) has one
log-log panel per sweep (depth, width) and one against the parameter count, both sweeps drawn apart (a ReLU MLP has
``P ≈ d·w²``: a slope ``s`` against the width is ``s/2`` against ``P`` along the width sweep).

Usage::

    python benchmarks/bench_scaling.py                    # about 5 min on an idle 2-core machine; writes the PNG
    python benchmarks/bench_scaling.py --quick --out /tmp/scaling.png --json /tmp/scaling.json
    python benchmarks/bench_scaling.py --from-json /tmp/scaling.json  # redraw docs/images/scaling.png only

As a function: ``run(quick=True)`` → ``{"machine", "commit", "rows": [{"sweep", "depth", "width", "params",
"seconds": {stage: s or None}, "values": {"orbit": …, "conserved": …}}], "exponents": {"depth" | "width" |
"params (depth sweep)" | "params (width sweep)": {stage: slope}}}``;
``figures(quick)`` is ``run(quick=quick)`` for ``run_all.py``; ``plot(result, path)`` draws the figure.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import time

import torch
from torch import nn

DEPTHS = (2, 4, 8, 16, 32)
QUICK_DEPTHS = (2, 4, 8, 16)
WIDTHS = (8, 16, 32, 64, 128, 256, 512, 1024)
QUICK_WIDTHS = (8, 16, 32, 64, 128)
STAGES = ("derive", "verify", "orbit rank", "conservation laws")
FLOOR = 5e-3
"""Shortest time (s) a fitted point may have."""


def model(depth: int, width: int, activation: str = "relu") -> nn.Sequential:
    """``depth`` linear layers of width ``width`` with ``activation`` between them, float64, seed 0."""
    torch.manual_seed(0)
    act = {"relu": nn.ReLU, "identity": nn.Identity}[activation]
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(width, width)] + ([act()] if i < depth - 1 else [])
    return nn.Sequential(*layers).double()


def measure(depth: int, width: int, activation: str = "relu", repeat: int = 1, max_entries: float = 2e7) -> dict:
    """Seconds of every stage (median of ``repeat``) for one model, and the orbit dimension and conserved count."""
    import symalg
    from symalg.numeric.orbit_rank import model_orbit_dimension

    net = model(depth, width, activation)
    x = torch.randn(8, width, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    params = dict(net.named_parameters())
    count = sum(p.numel() for p in params.values())
    seconds: dict[str, list[float]] = {stage: [] for stage in STAGES}
    values: dict[str, int | None] = {"orbit": None, "conserved": None}
    for _ in range(repeat):
        start = time.perf_counter()
        analysis = symalg.derive(symalg.trace(net, (x,)))
        seconds["derive"].append(time.perf_counter() - start)
        start = time.perf_counter()
        report = symalg.verify(analysis)
        seconds["verify"].append(time.perf_counter() - start)
        if not report.passed:
            raise AssertionError(f"verify failed for depth {depth}, width {width}:\n{report}")
        start = time.perf_counter()
        values["orbit"] = int(model_orbit_dimension(analysis))
        seconds["orbit rank"].append(time.perf_counter() - start)
        generators = sum(int(s.group.n_symmetric) for s in analysis.symmetries if s.group.is_continuous)
        if count * generators <= max_entries:
            start = time.perf_counter()
            values["conserved"] = int(analysis.independent_conserved(params))
            seconds["conservation laws"].append(time.perf_counter() - start)
    return {"depth": depth, "width": width, "params": count,
            "seconds": {stage: statistics.median(t) if t else None for stage, t in seconds.items()},
            "values": values}


def exponent(xs: list[float], ys: list[float | None]) -> float | None:
    """Least-squares slope of ``log y`` against ``log x`` over the points with ``y ≥ FLOOR`` (``None`` below 2)."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y is not None and y >= FLOOR]
    if len(points) < 2:
        return None
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else None


def _commit() -> str:
    """The checkout's commit (with ``+`` when the tree has changes), or ``"unknown"``."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "symalg"], cwd=here, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(quick: bool = False, repeat: int = 1, activation: str = "relu", max_entries: float = 2e7,
        depths: tuple[int, ...] | None = None, widths: tuple[int, ...] | None = None, echo: bool = False) -> dict:
    """Both sweeps (module docstring); one torch thread."""
    import symalg

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    warm = model(2, 2, activation)
    symalg.verify(symalg.derive(symalg.trace(warm, (torch.randn(2, 2, dtype=torch.float64),))))
    depths = depths or (QUICK_DEPTHS if quick else DEPTHS)
    widths = widths or (QUICK_WIDTHS if quick else WIDTHS)
    rows = []
    for sweep, cases in (("depth", [(d, 16) for d in depths]), ("width", [(3, w) for w in widths])):
        for depth, width in cases:
            row = {"sweep": sweep, **measure(depth, width, activation, repeat, max_entries)}
            rows.append(row)
            if echo:
                times = ", ".join(f"{k} {'–' if v is None else f'{v:.4g}'}" for k, v in row["seconds"].items())
                print(f"  {sweep}: depth {depth}, width {width}, {row['params']:,} parameters: {times}", flush=True)
    exponents: dict[str, dict[str, float | None]] = {}
    for name, sweep, key in (("depth", "depth", "depth"), ("width", "width", "width"),
                             ("params (depth sweep)", "depth", "params"), ("params (width sweep)", "width", "params")):
        chosen = [r for r in rows if r["sweep"] == sweep]
        exponents[name] = {stage: exponent([r[key] for r in chosen], [r["seconds"][stage] for r in chosen])
                           for stage in STAGES}
    torch.set_num_threads(threads)
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "threads": 1,
            "load_average": os.getloadavg()[0]}
    return {"machine": info, "commit": _commit(), "activation": activation, "repeat": repeat, "rows": rows,
            "exponents": exponents, "wall": time.perf_counter() - started}


def figures(quick: bool = False) -> dict:
    """The figures for ``benchmarks/run_all.py`` (``quick``: the ``--quick`` sweeps)."""
    return run(quick=quick)


def plot(result: dict, path: str) -> None:
    """Three log-log panels (against depth, width, parameter count), one curve per stage with its exponent."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    colors = dict(zip(STAGES, ("C0", "C1", "C2", "C3")))
    panels = (("depth (width 16)", [("depth", "depth", "depth", "-")]),
              ("width (depth 3)", [("width", "width", "width", "-")]),
              ("parameters (solid: width sweep, dashed: depth sweep)",
               [("width", "params", "params (width sweep)", "-"), ("depth", "params", "params (depth sweep)", "--")]))
    for ax, (label, curves) in zip(axes, panels):
        for sweep, key, fit, style in curves:
            rows = [r for r in result["rows"] if r["sweep"] == sweep]
            for stage, marker in zip(STAGES, "osD^"):
                points = [(r[key], r["seconds"][stage]) for r in rows if r["seconds"][stage] is not None]
                if not points:
                    continue
                slope = result["exponents"][fit][stage]
                name = stage + (f", {sweep} sweep" if key == "params" else "") + \
                    (f" (slope {slope:.2f})" if slope is not None else "")
                ax.loglog([p[0] for p in points], [p[1] for p in points], style, marker=marker, color=colors[stage],
                          label=name)
        ax.axhline(FLOOR, color="0.8", linewidth=0.8)
        if curves[0][1] != "params":         # depth and width: a tick at every measured value
            ax.set_xticks(sorted({r[curves[0][1]] for r in result["rows"] if r["sweep"] == curves[0][0]}))
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(label)
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    load = result["machine"]["load_average"]
    sites = "PositiveScaling" if result["activation"] == "relu" else "GL"
    fig.suptitle(f"symalg on {result['activation']} MLPs ({sites} sites), commit {result['commit']}, one torch thread, "
                 f"load average {load:.1f} at the start; median of {result['repeat']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"depths {QUICK_DEPTHS}, widths {QUICK_WIDTHS}")
    parser.add_argument("--repeat", type=int, default=1, help="timed repeats per model (median; default 1)")
    parser.add_argument("--activation", choices=("relu", "identity"), default="relu")
    parser.add_argument("--max-entries", type=float, default=2e7,
                        help="largest action Jacobian of the conservation-law count (default 2e7 entries)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs",
                                                      "images", "scaling.png"), help="the PNG to write")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--from-json", help="measure nothing: draw the figure of a JSON file written by --json")
    args = parser.parse_args(argv)
    if args.from_json:
        import json

        with open(args.from_json) as f:
            plot(json.load(f), args.out)
        print(f"figure: {args.out}")
        return
    result = run(args.quick, args.repeat, args.activation, args.max_entries, echo=True)
    print(f"\ncommit {result['commit']}, torch threads 1, load average {result['machine']['load_average']:.2f}, "
          f"wall {result['wall']:.0f} s\n")
    print("| sweep | depth | width | parameters | " + " | ".join(f"{s} s" for s in STAGES) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(STAGES))
    for r in result["rows"]:
        cells = " | ".join("–" if r["seconds"][s] is None else f"{r['seconds'][s]:.4g}" for s in STAGES)
        print(f"| {r['sweep']} | {r['depth']} | {r['width']} | {r['params']:,} | {cells} |")
    print("\nfitted exponents (slope of log t against log x, points ≥ 5 ms):\n")
    print("| against | " + " | ".join(STAGES) + " |")
    print("|---|" + "---:|" * len(STAGES))
    for sweep, fits in result["exponents"].items():
        print(f"| {sweep} | " + " | ".join("–" if v is None else f"{v:.2f}" for v in fits.values()) + " |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    plot(result, args.out)
    print(f"\nfigure: {args.out}")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
