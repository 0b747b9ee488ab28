"""Geometry of minima ([Zhao2026] Ch. 3): every formula of ``symalg.minima_geometry`` against a direct
numerical evaluation that does not use it.

* component count ``2^{l−1}`` against union–find over certified chart paths (no labels used), and the
  labels against the clusters it finds; the mountain-pass barrier against losses on crossing paths;
* curvature of ``exp(tM)·θ`` against finite differences of the curve and an independent closed form;
* the chord-deviation and loss-barrier bounds against measured deviations and losses;
* the closed-form barrier of homogeneous last layers against a numerical maximisation of the loss of the
  network built by ``symalg`` (``network_function`` and the derived group action ``Symmetry.apply``).
"""
from __future__ import annotations

import functools
import math

import pytest
import torch

import symalg
from symalg.applications import minima_geometry as mg
from symalg.numeric.sampling import mse_loss


def _data(h: int, generator: torch.Generator, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, h, generator=generator), torch.randn(n, h, generator=generator)


def _clusters(points) -> dict[int, list[int]]:
    clusters: dict[int, list[int]] = {}
    for i, c in enumerate(mg.count_components(mg.chart_adjacency(points))):
        clusters.setdefault(c, []).append(i)
    return clusters


# -- components of the minimum ------------------------------------------------------------------

@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("sign", [-1, 1])
def test_reachable_labels_are_the_sign_patterns_with_the_right_product(depth, sign):
    labels = mg.reachable_labels(depth, sign)
    assert len(set(labels)) == len(labels) == mg.component_count(depth) == 2 ** (depth - 1)
    assert all(len(label) == depth and math.prod(label) == sign for label in labels)


def _check_count(depth: int, h: int, per_component: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x, y = _data(h, generator)
    A, _ = mg.least_squares(x, y)
    points = mg.sample_minimum(x, y, depth, per_component * mg.component_count(depth), generator)
    clusters = _clusters(points)
    labels = [mg.component_label(p) for p in points]
    # The numerical evaluation (label-free) finds exactly the predicted number of components ...
    assert len(clusters) == mg.component_count(depth)
    # ... each is one sign pattern, distinct clusters carry distinct patterns, all of them reachable.
    cluster_labels = [{labels[i] for i in members} for members in clusters.values()]
    assert all(len(ls) == 1 for ls in cluster_labels)
    assert len(set().union(*cluster_labels)) == len(clusters)
    sign = int(torch.linalg.det(A).sign())
    assert set(labels) == set(mg.reachable_labels(depth, sign))


@pytest.mark.parametrize("depth,h", [(1, 2), (2, 1), (2, 3), (3, 1), (3, 2), (3, 3), (4, 1), (4, 2)])
def test_component_count_matches_numerical_connectivity(depth, h):
    # Width 1: same-sign scalars are always joined, so few samples suffice.
    _check_count(depth, h, per_component=32 if h > 1 else 8, seed=10 * depth + h)


@pytest.mark.slow
@pytest.mark.parametrize("depth,h,per_component", [(3, 4, 48), (4, 3, 64), (5, 2, 32), (5, 1, 32)])
def test_component_count_matches_numerical_connectivity_deeper(depth, h, per_component):
    _check_count(depth, h, per_component, seed=10 * depth + h)


def test_certified_chart_paths_stay_in_the_minimum():
    """The certificate is sound: along every certified chart path the loss stays at its minimum."""
    generator = torch.Generator().manual_seed(2)
    x, y = _data(3, generator)
    _, best = mg.least_squares(x, y)
    points = mg.sample_minimum(x, y, 3, 16, generator)
    adjacency = mg.chart_adjacency(points)
    certified = [(a, b) for a, b in adjacency.nonzero().tolist() if a < b]
    assert len(certified) > 5
    for a, b in certified:
        along = [mg.chart_path(points[a], points[b], s) for s in torch.linspace(0, 1, 21).tolist()]
        assert max(abs(mg.deep_linear_loss(w, x, y) - best).item() for w in along) < 1e-10
        assert all(torch.allclose(u, v) for u, v in zip(along[-1], points[b]))


def test_wrong_labellings_are_detected_by_the_connectivity_evaluation():
    generator = torch.Generator().manual_seed(3)
    x, y = _data(2, generator)
    points = mg.sample_minimum(x, y, 3, 96, generator)
    clusters = list(_clusters(points).values())
    # Labelling by the first layer only undercounts: one label spans several clusters.
    first_only = [{int(torch.linalg.det(points[i][0]).sign())} for i in range(len(points))]
    assert len({next(iter(s)) for s in first_only}) < len(clusters)
    # Labelling by the signs of matrix entries is not constant on components.
    entry_signs = [{tuple(int(w[0, 0].sign()) for w in points[i]) for i in members} for members in clusters]
    assert any(len(s) > 1 for s in entry_signs)
    # Counting all 2^l sign patterns overcounts.
    assert 2 ** 3 != len(clusters) == mg.component_count(3)


def test_paths_between_different_labels_cross_the_barrier():
    """Straight segments between points with different labels make a layer singular; the loss there
    exceeds the minimum by at least ``component_barrier``; chart paths never join them."""
    generator = torch.Generator().manual_seed(4)
    x, y = _data(3, generator)
    _, best = mg.least_squares(x, y)
    barrier = mg.component_barrier(x, y)
    points = mg.sample_minimum(x, y, 3, 24, generator)
    adjacency = mg.chart_adjacency(points)
    labels = [mg.component_label(p) for p in points]
    pairs = 0
    for a in range(len(points)):
        for b in range(a + 1, len(points)):
            if labels[a] == labels[b]:
                continue
            pairs += 1
            assert not adjacency[a, b]
            crossings = torch.cat([mg.singular_points(wa, wb) for wa, wb in zip(points[a], points[b])])
            assert crossings.numel() > 0
            excess = mg.segment_losses(points[a], points[b], x, y, crossings) - best
            assert excess.max() >= barrier * (1 - 1e-9)
    assert pairs > 100


@pytest.mark.parametrize("depth,h", [(2, 1), (2, 3), (3, 2), (4, 3)])
def test_crossing_path_attains_the_barrier(depth, h):
    generator = torch.Generator().manual_seed(depth + h)
    x, y = _data(h, generator)
    _, best = mg.least_squares(x, y)
    barrier = mg.component_barrier(x, y)
    theta = mg.sample_minimum(x, y, depth, 1, generator)[0]
    s = torch.linspace(0, 1, 101)
    for i in range(depth):
        for j in range(depth):
            if i == j:
                continue
            waypoints = mg.crossing_waypoints(theta, i, j, x, y)
            excess = torch.stack([mg.segment_losses(a, b, x, y, s) - best for a, b in zip(waypoints, waypoints[1:])])
            # ½ s² s_h², then ½ s_h², then ½ (1 − s)² s_h²: the maximum is exactly the barrier.
            expected = torch.stack([s ** 2, torch.ones_like(s), (1 - s) ** 2]) * barrier
            assert torch.allclose(excess, expected, rtol=1e-8, atol=1e-12 * (1 + best))
            start, end = mg.component_label(waypoints[0]), mg.component_label(waypoints[-1])
            assert [k for k in range(depth) if start[k] != end[k]] == sorted((i, j))


def test_group_path_stays_in_the_minimum_and_refuses_other_components():
    generator = torch.Generator().manual_seed(5)
    x, y = _data(3, generator)
    _, best = mg.least_squares(x, y)
    points = mg.sample_minimum(x, y, 3, 12, generator)
    labels = [mg.component_label(p) for p in points]
    a = points[0]
    b = next(p for p, label in zip(points[1:], labels[1:]) if label == labels[0])
    path = mg.group_path(a, b)

    def steps(n):
        ws = [path(t) for t in torch.linspace(0, 1, n + 1).tolist()]
        losses = torch.stack([mg.deep_linear_loss(w, x, y) for w in ws])
        jump = max(max((u - v).norm().item() for u, v in zip(w1, w2)) for w1, w2 in zip(ws, ws[1:]))
        return ws, losses, jump

    ws, losses, jump = steps(64)
    assert (losses - best).abs().max() < 1e-10
    assert all(torch.allclose(u, v, atol=1e-12) for u, v in zip(ws[0], a))
    assert all(torch.allclose(u, v, rtol=1e-8, atol=1e-8) for u, v in zip(ws[-1], b))
    assert steps(128)[2] < 0.6 * jump  # continuous: steps shrink with the mesh
    c = next(p for p, label in zip(points[1:], labels[1:]) if label != labels[0])
    with pytest.raises(ValueError, match="another component"):
        mg.group_path(a, c)


@pytest.mark.parametrize("g", [[[-1, 0], [0, -2]], [[-1, 5, 0], [0, -3, 1], [0, 0, 2]],
                               [[-1, 0, 0, 0], [0, -1, 0, 0], [0, 0, -1, 0], [0, 0, 0, -1]]])
def test_exp_factors_reach_elements_without_a_real_logarithm(g):
    """Simple negative eigenvalues (no real logarithm exists, so no ``exp(t log g)``), and ``−I``."""
    g = torch.tensor(g, dtype=torch.float64)
    product = torch.eye(g.shape[0])
    for M in mg.exp_factors(g):
        product = product @ torch.linalg.matrix_exp(M)
    assert torch.allclose(product, g, atol=1e-12)


def test_exp_factors_random_and_errors(generator):
    for _ in range(20):
        g = torch.randn(4, 4, generator=generator)
        if torch.linalg.det(g) < 0:
            g[0] = -g[0]
        product = torch.eye(4)
        for M in mg.exp_factors(g):
            product = product @ torch.linalg.matrix_exp(M)
        assert torch.allclose(product, g, atol=1e-10)
    with pytest.raises(ValueError, match="det g < 0"):
        mg.exp_factors(torch.diag(torch.tensor([-1.0, 1.0])))
    with pytest.raises(ValueError, match="g is singular"):
        mg.exp_factors(torch.zeros(2, 2))


def test_argument_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"weights\[1\] is singular"):
        mg.component_label([torch.eye(2), torch.zeros(2, 2)])
    with pytest.raises(ValueError, match=r"weights\[1\] has shape"):
        mg.component_label([torch.eye(2), torch.ones(3, 2)])
    generator = torch.Generator().manual_seed(6)
    x, y = _data(2, generator)
    theta = mg.sample_minimum(x, y, 2, 1, generator)[0]
    with pytest.raises(ValueError, match="not on the minimum"):
        mg.crossing_waypoints([2 * theta[0], theta[1]], 0, 1, x, y)
    with pytest.raises(ValueError, match="distinct layer indices"):
        mg.crossing_waypoints(theta, 1, 1, x, y)
    with pytest.raises(ValueError, match="same fiber"):
        mg.group_path(theta, [theta[0], 2 * theta[1]])
    with pytest.raises(ValueError, match="x: rank"):
        mg.least_squares(torch.ones(5, 2), torch.ones(5, 2))


# -- orbit curves and curvature ------------------------------------------------------------------

def _flat_curve(weights, M, t):
    return torch.cat([w.reshape(-1) for w in mg.orbit_curve(weights, M, t)])


@pytest.mark.parametrize("seed", range(5))
def test_curvature_matches_finite_differences(seed):
    generator = torch.Generator().manual_seed(seed)
    widths = [3, 4, 5, 2]
    weights = [torch.randn(widths[k + 1], widths[k], generator=generator) for k in range(3)]
    M = [0.5 * torch.randn(w, w, generator=generator) for w in widths[1:-1]]  # generic, not normal
    step = 1e-4
    for t in (-0.6, 0.0, 0.4):
        before, at, after = (_flat_curve(weights, M, t + d) for d in (-step, 0.0, step))
        v, a = (after - before) / (2 * step), (after - 2 * at + before) / step ** 2
        finite_difference = ((v @ v) * (a @ a) - (v @ a) ** 2).sqrt() / (v @ v) ** 1.5
        assert torch.isclose(mg.curvature(weights, M, t), finite_difference, rtol=1e-6)


def test_curvature_of_the_scaling_curve_has_the_independent_closed_form(generator):
    """``M = cI`` on ``(W_1, W_2)``: ``γ = (e^{ct}W_1, e^{−ct}W_2)``, ``κ = 2√(ab)/(ae^{2ct} + be^{−2ct})^{3/2}``."""
    weights = [torch.randn(4, 3, generator=generator), torch.randn(2, 4, generator=generator)]
    a, b = (w.norm() ** 2 for w in weights)
    for c in (0.3, -1.7):
        for t in (-1.0, 0.0, 0.5):
            expected = 2 * (a * b).sqrt() / (a * math.exp(2 * c * t) + b * math.exp(-2 * c * t)) ** 1.5
            assert torch.isclose(mg.curvature(weights, [c * torch.eye(4)], t), expected, rtol=1e-12)
    # Largest at the balanced point a e^{2ct} = b e^{−2ct}, where it is (2√(ab))^{−1/2}.
    balanced = math.log(b / a) / 4
    assert torch.isclose(mg.curvature(weights, [torch.eye(4)], balanced), (2 * (a * b).sqrt()) ** -0.5, rtol=1e-12)


def test_curvature_of_a_constant_curve_raises():
    with pytest.raises(ValueError, match="acts trivially"):
        mg.curvature([torch.zeros(2, 2), torch.zeros(2, 2)], [torch.eye(2)])


def _normal_generator(h: int, generator: torch.Generator, kind: str) -> torch.Tensor:
    """A random normal matrix: symmetric, skew, or ``Q (rotation-scaling blocks) Qᵀ`` (complex spectrum)."""
    m = torch.randn(h, h, generator=generator)
    if kind == "symmetric":
        return (m + m.mT) / 2
    if kind == "skew":
        return (m - m.mT) / 2
    q, _ = torch.linalg.qr(m)
    blocks = torch.diag(torch.randn(h, generator=generator))
    for i in range(0, h - 1, 2):
        blocks[i + 1, i + 1] = blocks[i, i]
        blocks[i, i + 1], blocks[i + 1, i] = 1.3, -1.3
    return q @ blocks @ q.mT


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("kind", ["symmetric", "skew", "normal"])
def test_chord_deviation_bound_holds_and_is_tight_for_short_chords(seed, kind):
    generator = torch.Generator().manual_seed(seed)
    widths = [2, 3, 3, 2]
    weights = [torch.randn(widths[k + 1], widths[k], generator=generator) for k in range(3)]
    M = [_normal_generator(w, generator, kind) for w in widths[1:-1]]
    s = torch.linspace(0, 1, 41)
    for t_a, t_b in ((0.0, 1.0), (-0.5, 0.25)):
        bound = mg.chord_deviation_bound(weights, M, t_a, t_b, s)
        ends = mg.orbit_curve(weights, M, t_a), mg.orbit_curve(weights, M, t_b)
        for idx, si in enumerate(s.tolist()):
            on_curve = mg.orbit_curve(weights, M, (1 - si) * t_a + si * t_b)
            for k in range(3):
                deviation = ((1 - si) * ends[0][k] + si * ends[1][k] - on_curve[k]).norm()
                assert deviation <= bound[k, idx] * (1 + 1e-9) + 1e-14
    # Short chord: the interpolation error tends to ½ s(1−s) Δt² ‖γ''‖, the bound itself.
    dt = 1e-3
    bound = mg.chord_deviation_bound(weights, M, 0.0, dt, torch.tensor([0.5]))[:, 0]
    a, b, mid = (mg.orbit_curve(weights, M, t) for t in (0.0, dt, dt / 2))
    deviation = torch.stack([((u + v) / 2 - w).norm() for u, v, w in zip(a, b, mid)])
    assert torch.all(deviation / bound > 0.99)


def test_chord_deviation_bound_requires_normal_generators():
    weights = [torch.ones(2, 2), torch.ones(2, 2)]
    with pytest.raises(ValueError, match=r"M\[0\] is not normal"):
        mg.chord_deviation_bound(weights, [torch.tensor([[0.0, 1.0], [0.0, 0.0]])], 0.0, 1.0, torch.tensor([0.5]))


def _segment_excess(theta_a, theta_b, x, y, reference):
    return lambda s: (mg.segment_losses(theta_a, theta_b, x, y, torch.tensor([s])) - reference).item()


@pytest.mark.parametrize("seed", range(12))
def test_barrier_bound_dominates_the_measured_barrier_on_the_minimum(seed):
    generator = torch.Generator().manual_seed(100 + seed)
    depth, h = 2 + seed % 3, 2 + seed % 2
    x, y = _data(h, generator)
    _, best = mg.least_squares(x, y)
    theta = mg.sample_minimum(x, y, depth, 1, generator)[0]
    M = [_normal_generator(h, generator, ("symmetric", "skew", "normal")[seed % 3]) for _ in range(depth - 1)]
    t_a, t_b = 0.0, 0.2 + 0.1 * (seed % 4)
    a, b = mg.orbit_curve(theta, M, t_a), mg.orbit_curve(theta, M, t_b)
    s = torch.linspace(0, 1, 41)
    excess = mg.segment_losses(a, b, x, y, s) - best
    bound = mg.interpolation_barrier_bound(theta, M, t_a, t_b, x, y, s)
    assert torch.all(excess <= bound + 1e-12)
    s_max, measured = mg.maximize_on_interval(_segment_excess(a, b, x, y, best))
    assert measured <= mg.interpolation_barrier_bound(theta, M, t_a, t_b, x, y, torch.tensor([s_max])).item() + 1e-12
    assert measured > 0  # a genuine barrier, not a vacuous comparison


@pytest.mark.parametrize("seed", range(6))
def test_barrier_bound_holds_off_the_minimum_for_rectangular_widths(seed):
    """Away from the minimum the first-order term ``‖∂L/∂P‖ D`` carries the bound."""
    generator = torch.Generator().manual_seed(200 + seed)
    widths = [3, 5, 4, 2]
    weights = [torch.randn(widths[k + 1], widths[k], generator=generator) / widths[k] ** 0.5 for k in range(3)]
    x, y = torch.randn(20, 3, generator=generator), torch.randn(20, 2, generator=generator)
    M = [_normal_generator(w, generator, "symmetric") for w in widths[1:-1]]
    a, b = mg.orbit_curve(weights, M, 0.0), mg.orbit_curve(weights, M, 0.5)
    level = mg.deep_linear_loss(weights, x, y)
    s = torch.linspace(0, 1, 41)
    assert torch.allclose(mg.deep_linear_loss(b, x, y), level)
    excess = mg.segment_losses(a, b, x, y, s) - level
    assert torch.all(excess <= mg.interpolation_barrier_bound(weights, M, 0.0, 0.5, x, y, s) + 1e-12)


@pytest.mark.parametrize("dt,ratio", [(1e-1, 0.85), (1e-2, 0.98)])
def test_barrier_bound_is_tight_for_scalar_chains(dt, ratio):
    """Width 1, zero-loss minimum: every term of the product bound has the same sign, so the bound is
    attained to leading order as the chord shrinks."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(10, 1, generator=generator)
    y = 1.3 * x
    theta = mg.sample_minimum(x, y, 3, 1, generator)[0]
    M = [torch.tensor([[0.7]]), torch.tensor([[-0.4]])]
    a, b = mg.orbit_curve(theta, M, 0.0), mg.orbit_curve(theta, M, dt)
    s_max, measured = mg.maximize_on_interval(_segment_excess(a, b, x, y, 0.0))
    bound = mg.interpolation_barrier_bound(theta, M, 0.0, dt, x, y, torch.tensor([s_max])).item()
    assert ratio < measured / bound <= 1


def test_dissertation_sagitta_bound_fails_for_a_helix():
    """Theorem 3.4.2 bounds the distance from the chord to the level set by the sagitta of a circle of
    curvature ``κ_max``. The helix ``(cos t, sin t, ct)`` is the orbit of a screw motion (a one-parameter
    group of isometries) and the zero set of the 1-Lipschitz, screw-invariant ``L(w) = dist(w, helix)``.
    Between ``t = 0`` and ``t = 2π`` the chord midpoint is at distance 1 from it, far above the sagitta;
    the parametric bound ``(Δt)²/8 · sup‖γ''‖`` holds."""
    c = 0.1
    kappa, chord = 1 / (1 + c ** 2), 2 * math.pi * c
    sagitta = (1 - math.sqrt(1 - (kappa * chord / 2) ** 2)) / kappa
    t = torch.linspace(-10, 20, 300001)
    helix = torch.stack([t.cos(), t.sin(), c * t], dim=1)
    midpoint = torch.tensor([0.0, 0.0, c * math.pi])
    distance = (helix - midpoint).norm(dim=1).min().item()
    assert distance == pytest.approx(1.0, abs=1e-9)
    assert distance > 15 * sagitta
    assert distance <= (2 * math.pi) ** 2 / 8 * 1.0  # sup‖γ''‖ = 1


# -- homogeneous last layers ---------------------------------------------------------------------

ACTIVATIONS = {  # spec name -> (degree, torch function computed by hand for the closed form)
    "relu": (1, torch.relu),
    "leaky_relu(slope=0.1)": (1, lambda z: torch.nn.functional.leaky_relu(z, 0.1)),
    "relu_pow(alpha=2)": (2, lambda z: torch.relu(z) ** 2),
    "relu_pow(alpha=0.5)": (0.5, lambda z: torch.relu(z) ** 0.5),
    "identity": (1, lambda z: z),
}


@functools.lru_cache(maxsize=None)
def _analysis(spec: str):
    return symalg.derive(symalg.parse(spec))


def _network(activation: str, deep: bool):
    spec = (f"linear(3, 5) -> tanh -> linear(5, 4) -> {activation} -> linear(4, 2)" if deep
            else f"linear(3, 4) -> {activation} -> linear(4, 2)")
    analysis = _analysis(spec)
    last_site = analysis.architecture.linear_layers[-2]       # a site is named by the linear layer producing it
    return analysis, [s for s in analysis.symmetries if s.site == last_site and s.group.is_continuous][0]


def _features(activation: str, params, x, deep: bool):
    """The last layer's input, computed by hand (not through symalg)."""
    sigma = ACTIVATIONS[activation][1]
    if deep:
        x = torch.tanh(x @ params["0.weight"].mT + params["0.bias"])
        return sigma(x @ params["2.weight"].mT + params["2.bias"])
    return sigma(x @ params["0.weight"].mT + params["0.bias"])


def _group_elements(activation: str, generator: torch.Generator):
    elements = [3.0, 0.25]
    if ACTIVATIONS[activation][0] == 1:
        elements.append(0.2 + 4 * torch.rand(4, generator=generator))
    if activation == "identity":
        elements.append(torch.randn(4, 4, generator=generator))
    return elements


def _as_element(symmetry, g) -> torch.Tensor:
    g = torch.as_tensor(g, dtype=torch.float64)
    if symmetry.group.element_format == "matrix":
        return g if g.ndim == 2 else torch.diag(g.expand(4))
    return g.expand(4)


@pytest.mark.parametrize("deep", [False, True])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_closed_form_barrier_matches_numerical_maximum(activation, deep):
    generator = torch.Generator().manual_seed(len(activation) + deep)
    analysis, symmetry = _network(activation, deep)
    arch = analysis.architecture
    forward = symalg.numeric.sampling.network_function(arch)
    last = arch.node(arch.linear_layers[-1])
    degree = ACTIVATIONS[activation][0]
    for zero_loss in (True, False):
        params = symalg.numeric.sampling.random_params(arch, generator=generator)
        x = torch.randn(16, 3, generator=generator)
        y = forward(params, x) if zero_loss else torch.randn(16, 2, generator=generator)
        loss = mse_loss(forward, x, y)
        H = _features(activation, params, x, deep)
        for g in _group_elements(activation, generator):
            moved = symmetry.apply(params, _as_element(symmetry, g))

            def segment(alpha):
                return loss({n: (1 - alpha) * params[n] + alpha * moved[n] for n in params}).item()

            level = segment(0.0)
            assert segment(1.0) == pytest.approx(level, abs=1e-12)
            alpha_max, measured = mg.maximize_on_interval(segment, grid=101)
            barrier, alpha_star = mg.homogeneous_orbit_barrier(H, params[last["weight"]], params[last["bias"]], y,
                                                               g, degree)
            assert barrier.item() == pytest.approx(measured - level, abs=1e-8)
            if barrier > 1e-6:
                assert alpha_star == pytest.approx(alpha_max, abs=1e-6)
            for alpha in (0.1, 0.37, 0.8):
                closed = mg.homogeneous_segment_loss(H, params[last["weight"]], params[last["bias"]], y, g, degree,
                                                     alpha)
                assert closed.item() == pytest.approx(segment(alpha), rel=1e-12, abs=1e-12)


def test_closed_form_barrier_is_zero_when_the_loss_first_decreases(generator):
    """``R = −ρ W_l K H`` with ``ρ > 1/8`` makes ``β/4 + φ/32 < 0``: the maximum is at the endpoints."""
    analysis, symmetry = _network("relu", deep=False)
    arch = analysis.architecture
    forward = symalg.numeric.sampling.network_function(arch)
    params = symalg.numeric.sampling.random_params(arch, generator=generator)
    x = torch.randn(16, 3, generator=generator)
    d = torch.tensor([3.0, 0.5, 2.0, 1.5])
    H = torch.relu(x @ params["0.weight"].mT + params["0.bias"])
    y = forward(params, x) + 0.5 * H @ torch.diag(d + 1 / d - 2) @ params["2.weight"].mT
    moved = symmetry.apply(params, d)
    loss = mse_loss(forward, x, y)
    level = loss(params).item()
    _, measured = mg.maximize_on_interval(
        lambda a: loss({n: (1 - a) * params[n] + a * moved[n] for n in params}).item())
    barrier, alpha = mg.homogeneous_orbit_barrier(H, params["2.weight"], params["2.bias"], y, d, 1)
    assert barrier.item() == 0.0 and alpha == 0.0
    assert measured - level == pytest.approx(0.0, abs=1e-12)
    # The loss dips inside the segment: the closed form at α = ½ is below the level.
    assert mg.homogeneous_segment_loss(H, params["2.weight"], params["2.bias"], y, d, 1, 0.5) < level


def test_barrier_grows_without_bound_and_the_dissertation_choice_of_m_fails_for_k_below_1():
    """Scalar toy ``H = W = y = 1`` (zero loss): our loss is ``½(c − 1)²``, [Zhao2026]'s ``(c − 1)²‖Y‖²``."""
    one = torch.ones(1, 1)
    for m in (2.0, 10.0, 100.0):
        barrier, _ = mg.homogeneous_orbit_barrier(one, one, None, one, m, 1)
        assert barrier.item() == pytest.approx((m - 1) ** 4 / (32 * m ** 2), rel=1e-12)
    b, k = 1.0, 0.5
    dissertation_m = (2 ** (k + 1) * (math.sqrt(b) + 1) - 1) ** k  # (B.6)-(B.8) with ‖Y‖ = 1
    corrected_m = 1.01 * (2 ** (k + 1) * (1 + math.sqrt(b))) ** (1 / k)
    at_half = [2 * mg.homogeneous_segment_loss(one, one, None, one, m, k, 0.5).item() for m in (dissertation_m,
                                                                                              corrected_m)]
    assert at_half[0] < b < at_half[1]


def test_homogeneous_barrier_argument_errors():
    H, W, y = torch.ones(4, 3), torch.ones(2, 3), torch.ones(4, 2)
    with pytest.raises(ValueError, match="no closed-form maximum"):
        mg.homogeneous_orbit_barrier(H, W, None, y, torch.tensor([1.0, 2.0, 3.0]), 2)
    with pytest.raises(ValueError, match="degree: a general matrix"):
        mg.homogeneous_orbit_barrier(H, W, None, y, torch.eye(3), 2)
    with pytest.raises(ValueError, match="g: a positive scaling"):
        mg.homogeneous_orbit_barrier(H, W, None, y, -1.0, 1)
    with pytest.raises(ValueError, match="degree must be positive"):
        mg.homogeneous_segment_loss(H, W, None, y, 2.0, 0, 0.5)
