"""The approximate action of [Zhao2026] §3.4.1 and the barrier propositions of §3.3 (``mode_connectivity``).

(a) Prop. 3.4.1 on random trained sigmoid networks ``U σ(VX)``, ``m, h, n, k`` drawn from ``2…max_width``:
    ``‖F − F'‖ ≤ ‖F‖`` for ``(U', V') = g·(U, V)`` (eq. 3.6) with a random ``g``; exact (rank ``σ(gVX) = k``) cases.
(b) Loss along ``γ(t) = exp(tC)·(U, V)`` against the chord between ``γ(0)`` and ``γ(1)``, on the batch and on held-out
    data, in the printed setting made consistent (``X ∈ R^{16×8}``, ``V = W₁ ∈ R^{32×16}``, ``U = W₂ ∈ R^{64×32}``,
    LeakyReLU(0.1), data from a random teacher): there ``k = 8 ≤ h = 32`` and the action is exact on the batch; and
    with ``k = 64 > h`` where it is not. Two magnitudes of ``C`` (Fig. 3.3(b) and (c)).
(c) Prop. 3.3.4: ``min_P L(½) / m^{2k}`` against its limit ``2^{−2(k+1)} min_P ‖W_l P⁻¹ σ(Z)‖²``;
    Prop. 3.3.5: distance of the midpoint to ``{W₁W₂ = A}`` (numerical minimum, lower bound) against ``β``;
    Prop. 3.3.6: barriers of random orbit points with norms ``< c`` against the bound ``b(c)``.

Usage::

    python3 examples/mode_connectivity.py [--quick] [--out DIR]

Prints ``key=value`` tokens; writes ``mode_connectivity.png`` into ``--out`` (default ``examples/output/``).
"""
from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from symalg.applications import mode_connectivity as mc  # noqa: E402
from symalg.applications.minima_geometry import homogeneous_segment_loss  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "output"
F64 = torch.float64


def fit(u: torch.Tensor, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, sigma, steps: int, lr: float):
    """Adam on ``½ mean ‖U σ(VX) − Y‖²`` from ``(U, V)``."""
    u, v = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
    opt = torch.optim.Adam([u, v], lr=lr)
    for _ in range(steps):
        loss = mc.two_layer_loss(u, v, x, y, sigma)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return u.detach(), v.detach()


def bound_experiment(count: int, max_width: int, steps: int, gen: torch.Generator) -> dict:
    ratios, exact_errors, exact, violations, pts = [], [], 0, 0, []
    for _ in range(count):
        m, h, n, k = (int(torch.randint(2, max_width + 1, (1,), generator=gen)) for _ in range(4))
        x, y = (torch.randn(*s, generator=gen, dtype=F64) for s in ((n, k), (m, k)))
        u = torch.randn(m, h, generator=gen, dtype=F64) / math.sqrt(h)
        v = torch.randn(h, n, generator=gen, dtype=F64) / math.sqrt(n)
        u, v = fit(u, v, x, y, torch.sigmoid, steps, 1e-2)
        g = torch.randn(h, h, generator=gen, dtype=F64) / math.sqrt(h)      # a random invertible matrix
        e = mc.action_error(u, v, g, x, torch.sigmoid)
        ratios.append(e.error / e.bound)
        violations += e.error > e.bound * (1 + 1e-12)
        if e.exact:
            exact += 1
            exact_errors.append(e.error / e.bound)
        pts.append((e.bound, e.error))
    return {"ratios": ratios, "violations": violations, "exact": exact,
            "exact_max": max(exact_errors, default=0.0), "points": pts}


def curve_experiment(k: int, scale: float, curves: int, steps: int, gen: torch.Generator, ts: torch.Tensor) -> dict:
    n, h, m, held = 16, 32, 64, 512
    sigma = lambda z: torch.nn.functional.leaky_relu(z, 0.1)  # noqa: E731
    t1, t2 = torch.randn(h, n, generator=gen, dtype=F64) / 4, torch.randn(m, h, generator=gen, dtype=F64) / 6
    x, x_te = torch.randn(n, k, generator=gen, dtype=F64), torch.randn(n, held, generator=gen, dtype=F64)
    y, y_te = t2 @ sigma(t1 @ x), t2 @ sigma(t1 @ x_te)
    u0, v0 = fit(torch.randn(m, h, generator=gen, dtype=F64) / 6, torch.randn(h, n, generator=gen, dtype=F64) / 4,
                 x, y, sigma, steps, 1e-2)
    rows = {key: torch.zeros(len(ts)) for key in ("curve", "chord", "curve_test", "chord_test")}
    start_shift = 0.0
    for _ in range(curves):
        C = scale * torch.randn(h, h, generator=gen, dtype=F64) / math.sqrt(h)
        points = [mc.approximate_curve(u0, v0, C, x, sigma, float(t)) for t in ts]
        (ua, va), (ub, vb) = points[0], points[-1]
        start_shift = max(start_shift, float(torch.linalg.matrix_norm(ua - u0) / torch.linalg.matrix_norm(u0)))
        for i, t in enumerate(ts):
            uc, vc = (1 - t) * ua + t * ub, (1 - t) * va + t * vb
            rows["curve"][i] += float(mc.two_layer_loss(*points[i], x, y, sigma)) / curves
            rows["chord"][i] += float(mc.two_layer_loss(uc, vc, x, y, sigma)) / curves
            rows["curve_test"][i] += float(mc.two_layer_loss(*points[i], x_te, y_te, sigma)) / curves
            rows["chord_test"][i] += float(mc.two_layer_loss(uc, vc, x_te, y_te, sigma)) / curves
    rows["start_loss"] = torch.tensor(float(mc.two_layer_loss(u0, v0, x, y, sigma)))
    rows["start_loss_test"] = torch.tensor(float(mc.two_layer_loss(u0, v0, x_te, y_te, sigma)))
    rows["start_shift"] = torch.tensor(start_shift)
    return rows


def prop_3_3_4(gen: torch.Generator, ms: list[float]) -> tuple[list[float], float]:
    sigma = lambda z: torch.nn.functional.leaky_relu(z, 0.1)  # noqa: E731   degree k = 1
    w1, w2, f = (torch.randn(*s, generator=gen, dtype=F64) for s in ((4, 3), (2, 4), (3, 6)))
    y = w2 @ sigma(w1 @ f)                                 # a zero-loss minimum
    eye = torch.eye(4, dtype=F64)
    limit = min(float(((w2 @ eye[list(o)].T @ sigma(w1 @ f)) ** 2).sum())
                for o in itertools.permutations(range(4))) / 16
    return [float(mc.permuted_midpoint_losses(w1, w2, f, y, m, sigma).min()) / m ** 2 for m in ms], limit


def prop_3_3_6(gen: torch.Generator, cs: list[float], draws: int) -> list[tuple[float, float, float]]:
    w_prev, w_last = torch.randn(5, 3, generator=gen, dtype=F64), torch.randn(2, 5, generator=gen, dtype=F64)
    u = torch.randn(20, 3, generator=gen, dtype=F64)
    features = torch.relu(u @ w_prev.mT)                    # torch layout: rows are samples
    y = features @ w_last.mT                                # zero loss
    n_prev, n_last = float(torch.linalg.matrix_norm(w_prev, 2)), float(torch.linalg.matrix_norm(w_last, 2))
    out = []
    for c in cs:
        bound = mc.bounded_orbit_barrier(features, w_prev, w_last, y, c, 1.0)
        lo, hi = math.log(n_last / c), math.log(c / n_prev)
        worst = 0.0
        for _ in range(draws):
            m = math.exp(lo + (hi - lo) * float(torch.rand((), generator=gen, dtype=F64)))
            worst = max(worst, max(float(homogeneous_segment_loss(features, w_last, None, y, m, 1.0, a))
                                   for a in torch.linspace(0, 1, 41).tolist()))
        out.append((c, worst, bound))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="12 networks of widths 2…24 (default: 100 of 2…100)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    count, width, steps = (12, 24, 150) if args.quick else (100, 100, 500)

    bound = bound_experiment(count, width, steps, gen)
    print(f"bound_networks={count} bound_max_width={width} bound_violations={bound['violations']} "
          f"bound_max_ratio={max(bound['ratios']):.4f} bound_exact_cases={bound['exact']} "
          f"bound_exact_max_ratio={bound['exact_max']:.3e}")

    ts = torch.linspace(0, 1, 6 if args.quick else 11, dtype=F64)
    curves = {}
    for k in (8, 64):
        for scale in (0.5, 2.0):
            r = curve_experiment(k, scale, 2 if args.quick else 5, 400 if args.quick else 3000, gen, ts)
            curves[(k, scale)] = r
            tag = f"k{k}_c{str(scale).replace('.', '_')}"
            fields = {"curve_batch_max": float(r["curve"].max()), "curve_batch_start": float(r["curve"][0]),
                      "chord_batch_max": float(r["chord"].max()), "curve_test_max": float(r["curve_test"].max()),
                      "chord_test_max": float(r["chord_test"].max()), "sgd_batch": float(r["start_loss"]),
                      "sgd_test": float(r["start_loss_test"]), "gamma0_relative_shift": float(r["start_shift"]),
                      "curve_batch_drift": float((r["curve"] - r["start_loss"]).abs().max()),
                      "curve_test_mean": float(r["curve_test"].mean()),
                      "chord_test_mean": float(r["chord_test"].mean()),
                      "chord_batch_mean": float(r["chord"].mean())}
            print(" ".join(f"{key.split('_', 1)[0]}_{tag}_{key.split('_', 1)[1]}={value:.3e}"
                           for key, value in fields.items()))

    ms = [10.0, 100.0, 1000.0, 10000.0]
    ratios, limit = prop_3_3_4(gen, ms)
    print(" ".join(f"p334_m{int(m)}_ratio={r:.5f}" for m, r in zip(ms, ratios)) + f" p334_limit={limit:.5f}")

    a, b = torch.randn(3, 3, generator=gen, dtype=F64), torch.randn(3, 3, generator=gen, dtype=F64)
    betas = [1.0, 2.0, 5.0, 20.0, 100.0]
    exits = [(beta, mc.orbit_exit_lower_bound(a, b, beta), mc.orbit_exit_distance(a, b, beta)) for beta in betas]
    print(" ".join(f"p335_beta{int(beta)}_lower={lo:.4f} p335_beta{int(beta)}_numeric={d:.4f}"
                   for beta, lo, d in exits))
    eye = torch.eye(3, dtype=F64)
    print(f"p335_identity_beta5_lower={mc.orbit_exit_lower_bound(eye, eye, 5.0):.6f} "
          f"p335_identity_beta5_numeric={mc.orbit_exit_distance(eye, eye, 5.0):.6f}")

    p336 = prop_3_3_6(gen, [4.0, 8.0, 16.0, 64.0], 10 if args.quick else 50)
    print(" ".join(f"p336_c{int(c)}_worst={w:.4e} p336_c{int(c)}_bound={bd:.4e}" for c, w, bd in p336))
    print(f"p336_violations={sum(w > bd * (1 + 1e-9) for _, w, bd in p336)}")

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    pts = torch.tensor(bound["points"])
    axes[0, 0].scatter(pts[:, 0], pts[:, 1], s=8)
    top = float(pts[:, 0].max())
    axes[0, 0].plot([0, top], [0, top], "k--", lw=1)
    axes[0, 0].set(title="Prop. 3.4.1: ‖F − F'‖ ≤ ‖F‖ (sigmoid)", xlabel="‖Uσ(VX)‖", ylabel="‖Uσ(VX) − U'σ(V'X)‖")
    for (k, scale), r in curves.items():
        if scale == 2.0:
            axes[0, 1].plot(ts, r["curve_test"], label=f"γ held-out, k={k}")
            axes[0, 1].plot(ts, r["chord_test"], "--", label=f"chord held-out, k={k}")
            axes[0, 1].plot(ts, r["curve"], ":", label=f"γ batch, k={k}")
            axes[0, 1].plot(ts, r["chord"], "-.", label=f"chord batch, k={k}")
    axes[0, 1].set(title="loss along γ and the chord (|C| scale 2)", xlabel="t", yscale="log")
    axes[0, 1].legend(fontsize=7)
    axes[1, 0].loglog(ms, ratios, "o-", label="min_P L(½)/m²")
    axes[1, 0].axhline(limit, color="k", ls="--", label="limit")
    axes[1, 0].set(title="Prop. 3.3.4 (LeakyReLU, k = 1)", xlabel="m")
    axes[1, 0].legend()
    axes[1, 1].loglog(betas[1:], [d for _, _, d in exits[1:]], "o-", label="numerical distance")
    axes[1, 1].loglog(betas[1:], [lo for _, lo, _ in exits[1:]], "s--", label="lower bound")
    axes[1, 1].set(title="Prop. 3.3.5: midpoint's distance to {W₁W₂ = A}", xlabel="β")
    axes[1, 1].legend()
    fig.tight_layout()
    fig.savefig(args.out / "mode_connectivity.png", dpi=110)


if __name__ == "__main__":
    main()
