"""Connected components of the minimum of deep linear networks ([Zhao2026] §3.2–3.3, App. B.1–B.2).

Network ``f(x) = W_l ⋯ W_1 x`` with square ``h × h`` weights (torch layout, no biases), loss
``L = ½ mean ‖f(x_i) − y_i‖²`` on random data with an invertible least-squares product ``A``. Derivations in
``docs/minima_geometry.md``; everything below is computed with :mod:`symalg.applications.minima_geometry`.

(a) Component count. ``2^{l−1}`` (sign patterns of ``det W_k`` whose product is ``sign det A``) against a
    label-free numerical evaluation: sample points of the minimum, join two when the chart path between
    them provably stays in the minimum (exact root test on every chart layer), count the clusters by
    union–find, and check that each cluster carries one sign pattern.
(b) Mountain pass between components. Any path between components crosses a singular layer, where the
    loss excess is at least ``½ σ_min(A Σ^{1/2})²``; the three-segment crossing path attains it. Straight
    segments between different components are measured at their exact crossing points.
(c) Paths inside a component from the group action: ``t ↦ g(t)·θ`` with ``g(t) = ∏ exp(t A_i)`` (a product
    of exponentials, since ``exp(t log g)`` does not exist for every ``g ∈ GL⁺``).
(d) Prop. 3.3.2 (connected up to permutation), with the action written for ``W_l ⋯ W_1``, and the action as
    printed, which does not preserve the loss in that convention.
(e) Prop. 3.2.3: the 1-d residual network ``w_3 (w_2 w_1 + ε) x`` has 4 components for ``ε = 0`` and 3 for
    ``ε ≠ 0``, by the same certified union–find in the chart ``(w_1, w_2)``.

Usage::

    python3 examples/minima_components.py [--quick] [--out DIR]

Prints tables and ``key=value`` tokens; writes ``components_barrier.png`` into ``--out``
(default ``examples/output/``).
"""
from __future__ import annotations

import argparse
import itertools
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from symalg.applications import minima_geometry as mg  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "output"


def data(h: int, generator: torch.Generator, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Random regression data ``x, y ∈ R^{n×h}``."""
    return (torch.randn(n, h, generator=generator, dtype=torch.float64),
            torch.randn(n, h, generator=generator, dtype=torch.float64))


def component_counts(cases, generator: torch.Generator) -> None:
    """Part (a): formula against certified union–find, for each ``(depth, width, samples per component)``."""
    print("# (a) components of the minimum: formula 2^(l-1) vs label-free union-find over certified chart paths")
    print(f"{'depth':>5} {'width':>5} {'samples':>7} {'formula':>7} {'numeric':>7} {'labels':>6} {'pure':>5} "
          f"{'time_s':>7}")
    mismatches = 0
    for depth, h, per_component in cases:
        start = time.perf_counter()
        x, y = data(h, generator)
        points = mg.sample_minimum(x, y, depth, per_component * mg.component_count(depth), generator)
        clusters = mg.count_components(mg.chart_adjacency(points))
        labels = [mg.component_label(p) for p in points]
        pure = all(len({labels[i] for i, c in enumerate(clusters) if c == root}) == 1 for root in set(clusters))
        numeric, formula = len(set(clusters)), mg.component_count(depth)
        mismatches += numeric != formula or len(set(labels)) != formula or not pure
        print(f"{depth:>5} {h:>5} {len(points):>7} {formula:>7} {numeric:>7} {len(set(labels)):>6} {pure!s:>5} "
              f"{time.perf_counter() - start:>7.2f}")
    print(f"component_count_mismatches={mismatches}")


def barriers(cases, generator: torch.Generator, out: Path) -> None:
    """Part (b): crossing paths attain ``½ σ_min(AΣ^{1/2})²``; straight segments between components exceed it."""
    print("# (b) loss barrier between components: 1/2 sigma_min(A Sigma^1/2)^2 vs crossing paths and straight segments")
    print(f"{'depth':>5} {'width':>5} {'barrier':>12} {'crossing_max':>12} {'rel_error':>9} {'pairs':>5} "
          f"{'min_straight/barrier':>20}")
    worst_error, worst_ratio = 0.0, math.inf
    s = torch.linspace(0, 1, 201, dtype=torch.float64)
    for depth, h in cases:
        x, y = data(h, generator)
        _, best = mg.least_squares(x, y)
        barrier = mg.component_barrier(x, y).item()
        theta = mg.sample_minimum(x, y, depth, 1, generator)[0]
        crossing_max = max(
            max((mg.segment_losses(a, b, x, y, s) - best).max().item() for a, b in zip(w, w[1:]))
            for w in (mg.crossing_waypoints(theta, i, j, x, y) for i, j in itertools.permutations(range(depth), 2)))
        points = mg.sample_minimum(x, y, depth, 16, generator)
        labels = [mg.component_label(p) for p in points]
        ratios = []
        for a, b in itertools.combinations(range(len(points)), 2):
            if labels[a] != labels[b]:
                crossings = torch.cat([mg.singular_points(u, v) for u, v in zip(points[a], points[b])])
                excess = mg.segment_losses(points[a], points[b], x, y, crossings) - best
                ratios.append(excess.max().item() / barrier)
        error = abs(crossing_max - barrier) / barrier
        worst_error, worst_ratio = max(worst_error, error), min(worst_ratio, min(ratios))
        print(f"{depth:>5} {h:>5} {barrier:>12.6e} {crossing_max:>12.6e} {error:>9.1e} {len(ratios):>5} "
              f"{min(ratios):>20.4f}")
    print(f"crossing_barrier_max_relative_error={worst_error:.3e}")
    print(f"straight_segment_min_excess_over_barrier={worst_ratio:.4f}")
    plot_crossing(generator, out)


def plot_crossing(generator: torch.Generator, out: Path) -> None:
    """Loss excess along a crossing path and along a straight segment between the same two components."""
    x, y = data(2, generator)
    _, best = mg.least_squares(x, y)
    barrier = mg.component_barrier(x, y).item()
    theta = mg.sample_minimum(x, y, 3, 1, generator)[0]
    waypoints = mg.crossing_waypoints(theta, 0, 2, x, y)
    s = torch.linspace(0, 1, 201, dtype=torch.float64)
    along = torch.cat([mg.segment_losses(a, b, x, y, s) - best for a, b in zip(waypoints, waypoints[1:])])
    straight = mg.segment_losses(waypoints[0], waypoints[-1], x, y, s) - best
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(torch.linspace(0, 1, along.numel()), along, label="crossing path (3 segments)")
    ax.plot(s, straight, label="straight segment, same endpoints")
    ax.axhline(barrier, color="k", ls="--", label=r"$\frac{1}{2}\sigma_{\min}(A\Sigma^{1/2})^2$")
    ax.set(xlabel="path parameter", ylabel=r"$L - L^*$", yscale="symlog", title="leaving a component: 3-layer, width 2")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "components_barrier.png", dpi=120)
    plt.close(fig)


def group_paths(generator: torch.Generator) -> None:
    """Part (c): the group-action path inside one component, and a ``GL⁺`` element without a real logarithm."""
    x, y = data(3, generator)
    _, best = mg.least_squares(x, y)
    points = mg.sample_minimum(x, y, 3, 12, generator)
    labels = [mg.component_label(p) for p in points]
    b = next(p for p, label in zip(points[1:], labels[1:]) if label == labels[0])
    path = mg.group_path(points[0], b)
    along = [path(t) for t in torch.linspace(0, 1, 101).tolist()]
    drift = max(abs(mg.deep_linear_loss(w, x, y) - best).item() for w in along)
    end_error = max(((u - v).norm() / v.norm()).item() for u, v in zip(along[-1], b))
    g = torch.diag(torch.tensor([-1.0, -2.0], dtype=torch.float64))
    product = torch.eye(2, dtype=torch.float64)
    for M in mg.exp_factors(g):
        product = product @ torch.linalg.matrix_exp(M)
    print("# (c) group-action path inside a component (depth 3, width 3)")
    print(f"group_path_loss_drift={drift:.3e} group_path_end_relative_error={end_error:.3e}")
    print(f"exp_factors_diag_minus1_minus2_error={(product - g).abs().max().item():.3e}")


def permutations_connect(generator: torch.Generator) -> None:
    """Part (d): Prop. 3.3.2 with the action for ``W_l ⋯ W_1``, and the printed action."""
    depth, h = 3, 2
    x, y = data(h, generator)
    _, best = mg.least_squares(x, y)
    points = mg.sample_minimum(x, y, depth, 24, generator)
    swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    eye = torch.eye(h, dtype=torch.float64)
    pairs, failures = 0, 0
    for a, b in itertools.combinations(points, 2):
        # P_k = swap exactly where det of the partial products W_k ⋯ W_1 of a and b differ in sign.
        perms = [eye if torch.linalg.det(mg.end_to_end(a[:k + 1]) @ torch.linalg.inv(mg.end_to_end(b[:k + 1]))) > 0
                 else swap for k in range(depth - 1)]
        moved = [perms[k] @ w if k < depth - 1 else w for k, w in enumerate(a)]  # W_k ↦ P_k W_k P_{k−1}⁻¹
        moved = [w @ perms[k - 1].mT if k > 0 else w for k, w in enumerate(moved)]
        pairs += 1
        try:
            mg.group_path(moved, b)  # raises ValueError if still in another component
        except ValueError:
            failures += 1
    w1, w2, w3 = points[0]
    printed = [w1 @ swap, swap.mT @ w2 @ swap, swap @ w3]  # (W_1 P_1, P_1⁻¹ W_2 P_2, P_2 W_3) as printed
    print("# (d) Prop. 3.3.2: every pair connected after permuting hidden neurons (depth 3, width 2)")
    print(f"permutation_pairs={pairs} permutation_pairs_not_connected={failures}")
    print(f"printed_permutation_action_loss_excess={(mg.deep_linear_loss(printed, x, y) - best).item():.4f}")


def residual_components(epsilon: float, generator: torch.Generator, n: int = 400) -> int:
    """Part (e): components of ``{w_3 (w_2 w_1 + ε) = c}`` by union–find in the chart ``(w_1, w_2)``
    (``w_3 = c/(w_1 w_2 + ε)``): a segment is certified when ``q(s) = w_1(s) w_2(s) + ε`` has no root on
    ``[0, 1]`` (a quadratic in ``s``, root test exact up to rounding)."""
    w = 4 * torch.rand(n, 2, generator=generator, dtype=torch.float64) - 2
    a, b = w[:, None, :], w[None, :, :]
    d = b - a
    # q(s) = (a1 + s d1)(a2 + s d2) + ε = c2 s² + c1 s + c0
    c2, c1, c0 = d[..., 0] * d[..., 1], a[..., 0] * d[..., 1] + a[..., 1] * d[..., 0], a[..., 0] * a[..., 1] + epsilon
    c0, c1, c2 = torch.broadcast_tensors(c0, c1, c2)
    q1 = c2 + c1 + c0
    vertex = (-c1 / (2 * c2)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).clamp(0, 1)
    q_vertex = c2 * vertex ** 2 + c1 * vertex + c0
    # no root on [0, 1] ⇔ q(0), q(1) and q at the vertex (if inside) share one strict sign
    adjacency = ((c0 > 0) & (q1 > 0) & (q_vertex > 0)) | ((c0 < 0) & (q1 < 0) & (q_vertex < 0))
    return len(set(mg.count_components(adjacency)))


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run all parts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller cases (a few seconds)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the PNG plot")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    counts = [(1, 3, 8), (2, 1, 16), (2, 4, 32), (3, 2, 32), (3, 3, 32), (4, 2, 32)]
    if not args.quick:
        counts += [(3, 5, 96), (4, 3, 64), (5, 2, 32)]
    component_counts(counts, generator)
    barriers([(2, 1), (2, 3), (3, 2), (4, 3)] + ([] if args.quick else [(5, 4), (3, 6)]), generator, args.out)
    group_paths(generator)
    permutations_connect(generator)
    print("# (e) Prop. 3.2.3: residual 1-d network w3 (w2 w1 + eps) x")
    print(f"residual_components_eps_0={residual_components(0.0, generator)} "
          f"residual_components_eps_0_5={residual_components(0.5, generator)}")


if __name__ == "__main__":
    main()
