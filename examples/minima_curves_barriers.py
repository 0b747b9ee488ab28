"""Curves on the minimum from the group action, their curvature, and loss barriers ([Zhao2026] §3.3.3–3.4).

Deep linear chains ``f(x) = W_l ⋯ W_1 x`` (torch layout, no biases) with the hidden-site action
``W_k ↦ g_k W_k g_{k−1}⁻¹`` and homogeneous two- and three-layer networks built by :mod:`symalg`.
Derivations in ``docs/minima_geometry.md``; every formula is compared with a direct numerical evaluation.

(a) Curvature of ``γ(t) = exp(tM)·θ``: closed form ``‖γ''_⊥‖/‖γ'‖²`` (``γ' = M·γ``, ``γ'' = M·M·γ``) against
    central finite differences of the curve, and against the independent closed form
    ``2√(ab)/(a e^{2ct} + b e^{−2ct})^{3/2}`` of the scaling curve ``M = cI``.
(b) Barrier bound on random cases: ``B(s) = ‖∂L/∂P‖ D + ½‖Σ‖₂ D²`` (``D`` from the chord deviation
    ``½ s(1−s) Δt² sup‖γ''‖``) against the measured loss on the chord between ``γ(t_a)`` and ``γ(t_b)``;
    alongside, [Zhao2026]'s sagitta ``(1 − √(1 − (κ_max D_chord/2)²))/κ_max`` against the measured
    distance from the chord to the curve.
(c) Tightness: measured/bound → 1 as ``Δt → 0`` on a width-1 chain at a zero-loss minimum.
(d) The helix ``(cos t, sin t, ct)``, orbit of a screw motion: [Zhao2026] Theorem 3.4.2 fails.
(e) Homogeneous last layers: closed-form barrier of ``(1−α)θ + α g·θ`` against the numerical maximum of
    the network's loss (``symalg.numeric.sampling.network_function``, ``Symmetry.apply``); growth with the
    scaling ``m``;
    the choice of ``m`` in the proof of Prop. 3.3.3 for degree ``k = ½``.

Usage::

    python3 examples/minima_curves_barriers.py [--quick] [--out DIR]

Prints tables and ``key=value`` tokens; writes ``curves_barriers.png`` into ``--out``
(default ``examples/output/``).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import symalg  # noqa: E402
from symalg.applications import minima_geometry as mg  # noqa: E402
from symalg.numeric.sampling import mse_loss  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "output"
F64 = torch.float64


def randn(*shape, generator):
    return torch.randn(*shape, generator=generator, dtype=F64)


def normal_generator(h: int, generator: torch.Generator, kind: str) -> torch.Tensor:
    """A random normal matrix: ``symmetric``, ``skew``, or ``normal`` (``Q`` (rotation-scaling blocks) ``Qᵀ``)."""
    m = randn(h, h, generator=generator)
    if kind == "symmetric":
        return (m + m.mT) / 2
    if kind == "skew":
        return (m - m.mT) / 2
    q, _ = torch.linalg.qr(m)
    blocks = torch.diag(randn(h, generator=generator))
    for i in range(0, h - 1, 2):
        blocks[i + 1, i + 1] = blocks[i, i]
        blocks[i, i + 1], blocks[i + 1, i] = 1.3, -1.3
    return q @ blocks @ q.mT


def flat(weights) -> torch.Tensor:
    return torch.cat([w.reshape(*w.shape[:-2], -1) for w in weights], dim=-1)


def curvature_checks(generator: torch.Generator) -> None:
    """Part (a)."""
    print("# (a) curvature of exp(tM).theta: closed form vs finite differences (widths 3-4-5-2, generic M)")
    print(f"{'case':>4} {'t':>5} {'closed_form':>14} {'finite_diff':>14} {'rel_error':>9}")
    worst, step = 0.0, 1e-4
    for case in range(3):
        weights = [randn(b, a, generator=generator) for a, b in zip([3, 4, 5], [4, 5, 2])]
        M = [0.5 * randn(w, w, generator=generator) for w in (4, 5)]
        for t in (-0.5, 0.0, 0.5):
            before, at, after = flat(mg.orbit_curve(weights, M, torch.tensor([t - step, t, t + step], dtype=F64)))
            v, a = (after - before) / (2 * step), (after - 2 * at + before) / step ** 2
            fd = (((v @ v) * (a @ a) - (v @ a) ** 2).sqrt() / (v @ v) ** 1.5).item()
            closed = mg.curvature(weights, M, t).item()
            worst = max(worst, abs(closed - fd) / fd)
            print(f"{case:>4} {t:>5.1f} {closed:>14.10f} {fd:>14.10f} {abs(closed - fd) / fd:>9.1e}")
    weights = [randn(4, 3, generator=generator), randn(2, 4, generator=generator)]
    a, b = (w.norm() ** 2 for w in weights)
    scaling = max(abs(mg.curvature(weights, [c * torch.eye(4, dtype=F64)], t)
                      / (2 * (a * b).sqrt() / (a * math.exp(2 * c * t) + b * math.exp(-2 * c * t)) ** 1.5) - 1).item()
                  for c in (0.5, -2.0) for t in (-1.0, 0.0, 1.0))
    print(f"curvature_fd_max_relative_error={worst:.3e} curvature_scaling_closed_form_max_relative_error={scaling:.3e}")


def chord_to_curve_distance(weights, M, t_a: float, t_b: float, s: torch.Tensor) -> torch.Tensor:
    """``max_s min_t ‖w(s) − γ(t)‖`` over ``t ∈ [t_a, t_b]`` (1001-point grid: an upper estimate)."""
    curve = flat(mg.orbit_curve(weights, M, torch.linspace(t_a, t_b, 1001, dtype=F64)))
    chord = (1 - s)[:, None] * curve[0] + s[:, None] * curve[-1]
    return torch.cdist(chord, curve).min(dim=1).values.max()


def barrier_bounds(n_cases: int, generator: torch.Generator, out_axes) -> None:
    """Part (b): the bound against the measured barrier, and the sagitta against the chord-to-curve distance."""
    print(f"# (b) barrier bound on {n_cases} random cases (square chains on the minimum, normal generators)")
    print(f"{'case':>4} {'l':>2} {'h':>2} {'kind':>9} {'dt':>4} {'measured':>11} {'bound':>11} {'bound/meas':>10} "
          f"{'sagitta':>9} {'chord-curve':>11}")
    s = torch.linspace(0, 1, 41, dtype=F64)
    violations, ratios, sagitta_undefined, sagitta_violated = 0, [], 0, 0
    for case in range(n_cases):
        depth, h = 2 + case % 3, 2 + (case // 3) % 2
        kind, dt = ("symmetric", "skew", "normal")[case % 3], (0.1, 0.3, 1.0)[(case // 2) % 3]
        x, y = randn(12, h, generator=generator), randn(12, h, generator=generator)
        _, best = mg.least_squares(x, y)
        theta = mg.sample_minimum(x, y, depth, 1, generator)[0]
        M = [normal_generator(h, generator, kind) for _ in range(depth - 1)]
        a, b = mg.orbit_curve(theta, M, 0.0), mg.orbit_curve(theta, M, dt)
        excess = mg.segment_losses(a, b, x, y, s) - best
        bound = mg.interpolation_barrier_bound(theta, M, 0.0, dt, x, y, s)
        violations += int((excess > bound + 1e-12).sum())
        _, measured = mg.maximize_on_interval(
            lambda u: (mg.segment_losses(a, b, x, y, torch.tensor([u], dtype=F64)) - best).item())
        ratios.append(bound.max().item() / measured)
        kappa = max(mg.curvature(theta, M, t).item() for t in torch.linspace(0, dt, 101).tolist())
        chord = (flat(b) - flat(a)).norm().item()
        half = kappa * chord / 2
        sagitta = (1 - math.sqrt(1 - half ** 2)) / kappa if half <= 1 else math.nan
        distance = chord_to_curve_distance(theta, M, 0.0, dt, s).item()
        sagitta_undefined += half > 1
        sagitta_violated += half <= 1 and distance > sagitta
        print(f"{case:>4} {depth:>2} {h:>2} {kind:>9} {dt:>4} {measured:>11.4e} {bound.max().item():>11.4e} "
              f"{ratios[-1]:>10.2f} {sagitta:>9.2e} {distance:>11.2e}")
        if case == 0:
            out_axes.plot(s, excess, label="measured $L(w(s)) - L^*$")
            out_axes.plot(s, bound, label="bound $B(s)$")
            out_axes.set(xlabel="s", ylabel="loss excess", yscale="log",
                         title=f"chord between $\\gamma(0)$ and $\\gamma({dt})$, depth {depth}, width {h}")
            out_axes.legend(fontsize=8)
    ratios.sort()
    print(f"bound_cases={n_cases} bound_pointwise_violations={violations} "
          f"bound_over_measured_min={ratios[0]:.3f} bound_over_measured_median={ratios[len(ratios) // 2]:.2f}")
    print(f"sagitta_undefined_cases={sagitta_undefined} sagitta_below_chord_curve_distance_cases={sagitta_violated}")


def tightness(generator: torch.Generator) -> None:
    """Part (c): width-1 chain at a zero-loss minimum."""
    x = randn(10, 1, generator=generator)
    y = 1.3 * x
    theta = mg.sample_minimum(x, y, 3, 1, generator)[0]
    M = [torch.tensor([[0.7]], dtype=F64), torch.tensor([[-0.4]], dtype=F64)]
    print("# (c) tightness on a width-1 chain (depth 3, zero-loss minimum): measured / bound -> 1")
    print(f"{'dt':>6} {'measured':>12} {'bound':>12} {'ratio':>8}")
    for dt in (1.0, 0.3, 0.1, 0.03, 0.01):
        a, b = mg.orbit_curve(theta, M, 0.0), mg.orbit_curve(theta, M, dt)
        s_max, measured = mg.maximize_on_interval(
            lambda u: mg.segment_losses(a, b, x, y, torch.tensor([u], dtype=F64)).item())
        bound = mg.interpolation_barrier_bound(theta, M, 0.0, dt, x, y, torch.tensor([s_max], dtype=F64)).item()
        print(f"{dt:>6} {measured:>12.4e} {bound:>12.4e} {measured / bound:>8.4f}")
    print(f"tightness_ratio_smallest_dt={measured / bound:.4f}")


def helix() -> None:
    """Part (d): [Zhao2026]'s sagitta bound against the helix."""
    c = 0.1
    kappa, chord = 1 / (1 + c ** 2), 2 * math.pi * c
    sagitta = (1 - math.sqrt(1 - (kappa * chord / 2) ** 2)) / kappa
    t = torch.linspace(-10, 20, 300001, dtype=F64)
    curve = torch.stack([t.cos(), t.sin(), c * t], dim=1)
    distance = (curve - torch.tensor([0.0, 0.0, c * math.pi], dtype=F64)).norm(dim=1).min().item()
    print("# (d) helix (cos t, sin t, 0.1 t), t in [0, 2 pi]: distance of the chord midpoint to the level set")
    print(f"helix_distance={distance:.6f} helix_dissertation_sagitta={sagitta:.6f} "
          f"helix_parametric_bound={(2 * math.pi) ** 2 / 8:.6f}")


HOMOGENEOUS = {  # spec activation -> (degree, σ by hand)
    "relu": (1, torch.relu),
    "leaky_relu(slope=0.1)": (1, lambda z: torch.nn.functional.leaky_relu(z, 0.1)),
    "relu_pow(alpha=2)": (2, lambda z: torch.relu(z) ** 2),
    "relu_pow(alpha=0.5)": (0.5, lambda z: torch.relu(z) ** 0.5),
    "identity": (1, lambda z: z),
}


def group_element(symmetry, g) -> torch.Tensor:
    """``g`` (scalar, positive diagonal or matrix) in the format ``Symmetry.apply`` expects (width 4)."""
    g = torch.as_tensor(g, dtype=F64)
    if symmetry.group.element_format == "matrix":
        return g if g.ndim == 2 else torch.diag(g.expand(4))
    return g.expand(4)


def homogeneous(generator: torch.Generator, out_axes) -> None:
    """Part (e)."""
    print("# (e) homogeneous last layer: closed-form barrier vs numerical maximum of the network's loss")
    print(f"{'activation':>22} {'point':>6} {'g':>8} {'closed':>13} {'numerical':>13} {'abs_error':>9} "
          f"{'alpha*':>8} {'alpha_num':>9}")
    worst = 0.0
    for activation, (degree, sigma) in HOMOGENEOUS.items():
        analysis = symalg.derive(symalg.parse(f"linear(3, 4) -> {activation} -> linear(4, 2)"))
        symmetry = next(s for s in analysis.symmetries if s.group.is_continuous)
        forward = symalg.numeric.sampling.network_function(analysis.architecture)
        elements = {"3.0": 3.0, "0.25": 0.25}
        if degree == 1:
            elements["diag"] = 0.2 + 4 * torch.rand(4, generator=generator, dtype=F64)
        if activation == "identity":
            elements["matrix"] = randn(4, 4, generator=generator)
        for point in ("zero", "random"):
            params = symalg.numeric.sampling.random_params(analysis.architecture, generator=generator)
            x = randn(16, 3, generator=generator)
            y = forward(params, x) if point == "zero" else randn(16, 2, generator=generator)
            loss = mse_loss(forward, x, y)
            H = sigma(x @ params["0.weight"].mT + params["0.bias"])
            for name, g in elements.items():
                moved = symmetry.apply(params, group_element(symmetry, g))

                def segment(alpha, moved=moved):
                    return loss({n: (1 - alpha) * params[n] + alpha * moved[n] for n in params}).item()

                level = segment(0.0)
                alpha_num, measured = mg.maximize_on_interval(segment)
                barrier, alpha = mg.homogeneous_orbit_barrier(H, params["2.weight"], params["2.bias"], y, g, degree)
                error = abs(barrier.item() - (measured - level))
                worst = max(worst, error)
                print(f"{activation:>22} {point:>6} {name:>8} {barrier.item():>13.8e} {measured - level:>13.8e} "
                      f"{error:>9.1e} {alpha:>8.5f} {alpha_num:>9.5f}")
                if activation == "relu" and point == "zero" and name == "diag":
                    grid = torch.linspace(0, 1, 101, dtype=F64)
                    out_axes.plot(grid, [segment(a) - level for a in grid.tolist()], label="network (symalg)")
                    closed = [mg.homogeneous_segment_loss(H, params["2.weight"], params["2.bias"], y, g, 1, a).item()
                              - level for a in grid.tolist()]
                    out_axes.plot(grid, closed, ls="--", label="closed form")
                    out_axes.axhline(barrier.item(), color="k", ls=":", label="closed-form barrier")
                    out_axes.set(xlabel=r"$\alpha$", ylabel=r"$L - L(\theta)$",
                                 title=r"ReLU: $(1-\alpha)\theta + \alpha\, d\cdot\theta$")
                    out_axes.legend(fontsize=8)
    print(f"homogeneous_max_abs_error={worst:.3e}")
    one = torch.ones(1, 1, dtype=F64)
    growth = [mg.homogeneous_orbit_barrier(one, one, None, one, m, 1)[0].item() for m in (10.0, 100.0, 1000.0)]
    print("barrier of the scalar toy H = W = y = 1 (k = 1) at m = 10, 100, 1000: "
          + ", ".join(f"{b:.4g}" for b in growth) + "  ((m-1)^4 / (32 m^2))")
    b, k = 1.0, 0.5
    m_printed = (2 ** (k + 1) * (math.sqrt(b) + 1) - 1) ** k
    m_corrected = 1.01 * (2 ** (k + 1) * (1 + math.sqrt(b))) ** (1 / k)
    at_half = [2 * mg.homogeneous_segment_loss(one, one, None, one, m, k, 0.5).item() for m in (m_printed, m_corrected)]
    print(f"prop_3_3_3_k_0_5_b_1_printed_m={m_printed:.4f} prop_3_3_3_loss_at_printed_m={at_half[0]:.4e} "
          f"prop_3_3_3_corrected_m={m_corrected:.4f} prop_3_3_3_loss_at_corrected_m={at_half[1]:.4f}")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run all parts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer random cases (a few seconds)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the PNG plot")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    fig, (ax_bound, ax_homogeneous) = plt.subplots(1, 2, figsize=(12, 4.5))
    curvature_checks(generator)
    barrier_bounds(12 if args.quick else 60, generator, ax_bound)
    tightness(generator)
    helix()
    homogeneous(generator, ax_homogeneous)
    fig.tight_layout()
    fig.savefig(args.out / "curves_barriers.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
