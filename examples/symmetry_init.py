"""Symmetry-aware initialisation: the same initial function, different conserved quantities, and what
that does to gradient descent and to the minimum it reaches.

Task: scikit-learn's digits as a regression (standardised 8×8 images → one-hot labels, loss
``½ mean ‖f(x) − y‖²``), 1200 training and 597 test images. Models (float64, torch's default
initialisation, then moved along the orbit by :func:`symalg.applications.symmetry_init.set_conserved`):

* ``linear``: 64 → 10 → 10 → 10 with identity activations (two ``GL(10)`` sites; ``C_k = λI``);
* ``relu``:   64 → 32 → 32 → 10 with ReLU (two positive-scaling sites of 32 neurons; ``q_k = λ·1``).

For every imbalance ``λ`` (and ``init``: the initialisation left as drawn) the script checks that the
network function is unchanged (``max |Δf|``) and trains by full-batch gradient descent under two
step-size protocols: ``fixed`` (one ``η`` per model) and ``scaled`` (``η = 1/λ_max(∇²L(θ₀))``, each run
at the same fraction of its own stability limit). It records: steps and seconds until the training
loss falls below ``L* + 0.05 (L₀ − L*)`` (``L₀`` the common initial loss, ``L*`` the least-squares loss
of the best affine map: the infimum for ``linear``, a level ``relu`` passes on its way down); the final
training and test loss; the sharpness ``λ_max(∇²L)`` at initialisation and at the end (power iteration
on Hessian-vector products) and ``tr ∇²L`` at the end (Hutchinson); the drift of the conserved
quantities over training (gradient descent keeps them only up to ``η² C(∇L)`` per step).

Prints a table, ``key=value`` tokens (``<protocol>_<model>_lam<λ>_<key>=…``, medians over seeds) and
saves ``symmetry_init.png`` (loss curves; steps and sharpness against ``λ``) to ``--out``.

Run: ``python examples/symmetry_init.py --out examples/output/symmetry_init`` (full: 3 seeds,
``λ ∈ {init, −2, −1, 0, 1, 2}``, 2000 steps; 5 min on a loaded 2-core machine); ``--quick``: 1 seed,
``λ ∈ {−1, 0, 1}``, 300 steps (about 20 s). One intra-op thread (``--threads``): two OpenMP threads on a
loaded 2-core machine make these small products several times slower. Results: docs/symmetry_init.md.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

import symalg
from symalg.applications.flat_minima import model_loss
from symalg.applications.symmetry_init import hessian_trace, set_conserved, top_hessian_eigenvalue

LEARNING_RATE = {"linear": 0.05, "relu": 0.05}
"""Step size of the ``fixed`` protocol (``2/η = 40``; the balanced initialisations have ``λ_max ≈ 2.5–3``)."""
SCALED = 1.0
"""The ``scaled`` protocol's step size is ``SCALED / λ_max(∇²L(θ₀))``: each run at the same fraction of
the stability limit ``2/λ_max`` of its own initialisation."""
THRESHOLD_FRACTION = 0.05
POWER = dict(max_iter=100, rtol=1e-3, change_tol=1e-4)
"""Power iteration: stop at residual ``1e-3`` or at a relative change ``1e-4`` of the estimate."""


def digits(seed: int):
    """Standardised digits (train, test) split by ``seed``; one-hot targets."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float64)
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-12)
    y = nn.functional.one_hot(torch.tensor(labels), 10).to(torch.float64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1200], order[1200:]
    return x[train], y[train], x[test], y[test]


def build(kind: str, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    if kind == "linear":
        layers = [nn.Linear(64, 10), nn.Identity(), nn.Linear(10, 10), nn.Identity(), nn.Linear(10, 10)]
    else:
        layers = [nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)]
    return nn.Sequential(*layers).double()


def least_squares_loss(x, y) -> float:
    """``min ½ mean ‖A x + c − y‖²`` over affine maps: the infimum of the deep linear network's loss."""
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    solution = torch.linalg.lstsq(design, y, driver="gelsd").solution  # rank 62 < 65 (constant pixels): the
    # default driver (gelsy) returned a loss of 0.5 here, gelsd the minimum 0.1499 (as pinv)
    return float(0.5 * ((design @ solution - y) ** 2).sum(1).mean())


def descend(loss, params, lr: float, steps: int):
    """Full-batch gradient descent; the loss before every step (stops early when it blows up)."""
    params = {k: v.clone().requires_grad_() for k, v in params.items()}
    curve, start = [], time.perf_counter()
    for _ in range(steps):
        value = loss(params)
        gradient = torch.autograd.grad(value, list(params.values()))
        curve.append(float(value.detach()))
        if not curve[-1] < 1e3 * curve[0]:      # nan, inf or divergence
            break
        with torch.no_grad():
            for tensor, change in zip(params.values(), gradient):
                tensor.sub_(lr * change)
    return {k: v.detach() for k, v in params.items()}, curve, time.perf_counter() - start


def run_model(kind: str, seed: int, lambdas, steps: int, generator: torch.Generator) -> list[dict]:
    """Every ``λ`` under both step-size protocols (module docstring) for one model and seed."""
    x, y, x_test, y_test = digits(seed)
    model = build(kind, seed)
    analysis = symalg.derive(symalg.trace(model, (x[:4],)))
    base = {k: v.detach() for k, v in model.named_parameters()}
    loss, test_loss = model_loss(model, x, y), model_loss(model, x_test, y_test)
    quantities = [s.conserved for s in analysis.symmetries if s.conserved is not None]
    floor = least_squares_loss(x, y)

    def conserved(params):
        return torch.cat([value.reshape(-1) for q in quantities for value in q(params).values()])

    rows = []
    for lam in lambdas:
        start = time.perf_counter()
        params = base if lam is None else set_conserved(analysis, base, float(lam)).params
        init_seconds = time.perf_counter() - start
        with torch.no_grad():
            change = float((functional_call(model, params, (x,)) - model(x)).abs().max())
        sharp0 = top_hessian_eigenvalue(loss, params, **POWER, generator=generator)
        for protocol, lr in (("fixed", LEARNING_RATE[kind]), ("scaled", SCALED / sharp0.eigenvalue)):
            final, curve, seconds = descend(loss, params, lr, steps)
            diverged = len(curve) < steps
            sharp = top_hessian_eigenvalue(loss, final, **POWER, generator=generator)
            trace = hessian_trace(loss, final, probes=32, generator=generator)
            threshold = floor + THRESHOLD_FRACTION * (curve[0] - floor)
            hit = next((i for i, value in enumerate(curve) if value <= threshold), None)
            rows.append(dict(protocol=protocol, model=kind, seed=seed, lam=lam, lr=lr, change=change,
                             init_seconds=init_seconds, curve=curve, diverged=diverged, steps=hit,
                             time_to_threshold=None if hit is None else seconds * hit / len(curve),
                             train=curve[-1], test=float(test_loss(final)), sharp0=sharp0.eigenvalue,
                             sharp=sharp.eigenvalue, trace=trace.value,
                             drift=float((conserved(final) - conserved(params)).abs().max()),
                             norm=float(sum((p ** 2).sum() for p in params.values()) ** 0.5)))
    return rows


def label(lam) -> str:
    return "init" if lam is None else f"{lam:+g}"


def summarise(rows):
    """Median over seeds per (protocol, model, λ); ``steps`` is ``None`` unless every seed reached the threshold."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["protocol"], row["model"], label(row["lam"])), []).append(row)
    summary = []
    for (protocol, kind, lam), runs in groups.items():
        def median(key):
            values = [r[key] for r in runs if r[key] is not None]
            return statistics.median(values) if len(values) == len(runs) else None
        summary.append(dict(protocol=protocol, model=kind, lam=lam, lam_value=runs[0]["lam"], runs=len(runs),
                            reached=sum(r["steps"] is not None for r in runs),
                            diverged=sum(r["diverged"] for r in runs),
                            **{k: median(k) for k in ("lr", "change", "steps", "time_to_threshold", "train", "test",
                                                      "sharp0", "sharp", "trace", "drift", "norm", "init_seconds")}))
    return summary


def fmt(value, spec):
    """``format(value, spec)``, or a dash padded to the spec's width for ``None``."""
    width = spec.split(".")[0].rstrip("dfge")
    return format(value, spec) if value is not None else "—".rjust(int(width) if width.isdigit() else 1)


def print_table(summary, steps, seeds):
    print(f"median over {seeds} seed(s); full-batch gradient descent, {steps} steps; threshold L* + "
          f"{THRESHOLD_FRACTION}(L0 − L*); fixed: η = {LEARNING_RATE}; scaled: η = {SCALED}/λmax(H at init)")
    header = (f"{'protocol':8} {'model':6} {'λ':>5} {'max|Δf|':>8} {'‖θ₀‖':>6} {'η':>6} {'steps→thr':>9} "
              f"{'reached':>7} {'s→thr':>6} {'train':>7} {'test':>7} {'λmax@0':>7} {'λmax@end':>8} {'trH@end':>8} "
              f"{'drift Q':>8} {'div':>3}")
    print(header)
    print("-" * len(header))
    for s in summary:
        print(f"{s['protocol']:8} {s['model']:6} {s['lam']:>5} {fmt(s['change'], '8.1e')} {fmt(s['norm'], '6.2f')} "
              f"{fmt(s['lr'], '6.3f')} {fmt(s['steps'], '9.0f')} {s['reached']:>3}/{s['runs']:<3} "
              f"{fmt(s['time_to_threshold'], '6.2f')} {fmt(s['train'], '7.4f')} {fmt(s['test'], '7.4f')} "
              f"{fmt(s['sharp0'], '7.2f')} {fmt(s['sharp'], '8.2f')} {fmt(s['trace'], '8.1f')} "
              f"{fmt(s['drift'], '8.1e')} "
              f"{s['diverged']:>3}")


def print_tokens(summary, seconds):
    for s in summary:
        stem = f"{s['protocol']}_{s['model']}_lam{s['lam']}"
        for key in ("steps", "train", "test", "sharp0", "sharp", "trace", "drift"):
            print(f"{stem}_{key}={fmt(s[key], '.6g')}")
        print(f"{stem}_diverged={s['diverged']}")
    print(f"max_function_change={max(s['change'] for s in summary):.3g}")
    print(f"max_set_conserved_seconds={max(s['init_seconds'] for s in summary):.3g}")
    print(f"seconds={seconds:.1f}")


def plot(rows, summary, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(r["model"] for r in rows))
    figure, axes = plt.subplots(len(kinds), 3, figsize=(15, 4.2 * len(kinds)), squeeze=False)
    for row_axes, kind in zip(axes, kinds):
        seed = min(r["seed"] for r in rows if r["model"] == kind)
        runs = [r for r in rows if r["model"] == kind and r["seed"] == seed and r["protocol"] == "fixed"]
        colours = plt.cm.coolwarm(torch.linspace(0, 1, len(runs)).tolist())
        for colour, run in zip(colours, runs):
            style = dict(color="black", ls="--") if run["lam"] is None else dict(color=colour)
            row_axes[0].semilogy(run["curve"], label=f"λ = {label(run['lam'])}", **style)
        row_axes[0].set(title=f"{kind}: training loss (fixed η, seed {seed})", xlabel="step", ylabel="loss")
        row_axes[0].legend(fontsize=7)
        for protocol, marker in (("fixed", "o-"), ("scaled", "s--")):
            points = [s for s in summary
                      if s["model"] == kind and s["protocol"] == protocol and s["lam_value"] is not None]
            lams = [s["lam_value"] for s in points]
            row_axes[1].plot(lams, [float("nan") if s["steps"] is None else s["steps"] for s in points], marker,
                             label=f"{protocol} η")
            row_axes[2].plot(lams, [s["sharp"] for s in points], marker, label=f"at end, {protocol} η")
        row_axes[2].plot(lams, [s["sharp0"] for s in points], "k:", label="at initialisation")
        row_axes[1].set(title=f"{kind}: steps to threshold (median; gaps: not reached)", xlabel="λ", ylabel="steps",
                        yscale="log")
        row_axes[2].set(title=f"{kind}: top Hessian eigenvalue (median)", xlabel="λ", ylabel="λmax(H)", yscale="log")
        row_axes[1].legend(fontsize=7)
        row_axes[2].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for symmetry_init.png")
    parser.add_argument("--quick", action="store_true", help="1 seed, λ in {-1, 0, 1}, 300 steps")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    seeds, steps = ((0,), 300) if args.quick else ((0, 1, 2), 2000)
    lambdas = [-1.0, 0.0, 1.0] if args.quick else [None, -2.0, -1.0, 0.0, 1.0, 2.0]
    generator = torch.Generator().manual_seed(0)
    rows = [row for kind in ("linear", "relu") for seed in seeds
            for row in run_model(kind, seed, lambdas, steps, generator)]
    rows.sort(key=lambda r: (r["protocol"], r["model"], -math.inf if r["lam"] is None else r["lam"], r["seed"]))
    summary = summarise(rows)
    print_table(summary, steps, len(seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, summary, args.out / "symmetry_init.png")
    print_tokens(summary, time.perf_counter() - start)
    print(f"plot={args.out / 'symmetry_init.png'}")


if __name__ == "__main__":
    main()
