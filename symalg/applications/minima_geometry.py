"""Geometry of minima ([Zhao2026] Ch. 3, App. B): components, orbit curves, curvature, barriers.

Three results, each derived in ``docs/minima_geometry.md`` and checked numerically in
``tests/test_minima_geometry.py`` and the scripts ``examples/minima_components.py`` and
``examples/minima_curves_barriers.py``.

Conventions (torch layout throughout): a dense layer is ``y = W x + b`` with ``W ∈ R^{out×in}``; data
are rows, ``x ∈ R^{N×n}``, ``y ∈ R^{N×m}``; the loss is ``L = ½ mean_i ‖f(x_i) − y_i‖²``. A deep linear
network (no biases) is a list ``weights = [W_1, …, W_l]`` with ``f(x) = W_l ⋯ W_1 x``; its end-to-end
matrix is ``P = W_l ⋯ W_1``. The group ``∏_k GL(h_k)`` of its hidden sites acts by
``W_k ↦ g_k W_k g_{k−1}⁻¹`` (``g_0 = g_l = I``), with infinitesimal action ``(M·θ)_k = M_k W_k − W_k M_{k−1}``.

1. **Components of the minimum** (square invertible weights, ``h × h``). With ``Σ = xᵀx/N`` and the
   least-squares product ``A = yᵀx (xᵀx)⁻¹`` invertible, the minimum is ``{θ : P(θ) = A}``; ``det W_k``
   never vanishes on it, so ``label(θ) = (sign det W_1, …, sign det W_l)`` is constant on components.
   Labels satisfy ``∏_k sign det W_k = sign det A``; the ``2^{l−1}`` such patterns are the components
   (:func:`component_count`). Any path between different components crosses a singular layer, where
   ``P`` is singular, so its loss exceeds the minimum by at least ``½ σ_min(A Σ^{1/2})²``; the
   piecewise-linear path of :func:`crossing_waypoints` attains exactly that (:func:`component_barrier`).
2. **Orbit curves** ``γ(t) = exp(tM)·θ``: ``γ' = M·γ``, ``γ'' = M·(M·γ)``, curvature
   ``κ = ‖γ''_⊥‖/‖γ'‖²`` (:func:`curvature`). The chord between ``γ(t_a)`` and ``γ(t_b)`` deviates from the
   curve point ``γ(t_s)`` by at most ``½ s(1−s)(t_b−t_a)² sup‖γ''‖`` per layer, which bounds the loss on the
   chord (:func:`interpolation_barrier_bound`).
3. **Homogeneous last layers**: interpolating between ``θ`` and ``g·θ`` for ``g`` acting on the last
   hidden site of ``W_l σ(W_{l−1} u + b_{l−1}) + b_l`` (``σ`` positively homogeneous of degree ``k``) gives a
   loss that is a closed-form function of ``α`` with a closed-form maximum (:func:`homogeneous_orbit_barrier`).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from symalg.catalogue.groups import matrix_exp

__all__ = [
    "end_to_end", "deep_linear_loss", "least_squares", "component_label", "component_count",
    "reachable_labels", "sample_minimum", "singular_points", "chart_path", "chart_adjacency",
    "count_components", "component_barrier", "crossing_waypoints", "exp_factors", "group_path",
    "chain_tangent", "orbit_curve", "curvature", "chord_deviation_bound", "interpolation_barrier_bound",
    "segment_losses", "maximize_on_interval", "homogeneous_segment_loss", "homogeneous_orbit_barrier",
]

Weights = Sequence[torch.Tensor]
Element = torch.Tensor | float | Sequence[float]
"""A last-site group element: a positive scalar, ``h`` positive scalings, or an invertible ``h × h`` matrix."""


# -- deep linear networks: loss and the minimum ---------------------------------------------------

def end_to_end(weights: Weights) -> torch.Tensor:
    """``P = W_l ⋯ W_1`` (leading batch dimensions broadcast).

    >>> end_to_end([torch.eye(2) * 2, torch.eye(2) * 3])[0, 0].item()
    6.0
    """
    product = weights[0]
    for w in weights[1:]:
        product = w @ product
    return product


def deep_linear_loss(weights: Weights, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``½ mean_i ‖W_l ⋯ W_1 x_i − y_i‖²`` with rows ``x_i``; batched weights give a batch of losses.

    >>> x = torch.eye(2, dtype=torch.float64)
    >>> deep_linear_loss([torch.eye(2, dtype=torch.float64)], x, 2 * x).item()
    0.5
    """
    out = x
    for w in weights:
        out = out @ w.transpose(-1, -2)
    return 0.5 * ((out - y) ** 2).sum(-1).mean(-1)


def _covariance(x: torch.Tensor) -> torch.Tensor:
    return x.mT @ x / x.shape[0]


def least_squares(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal end-to-end matrix ``A = yᵀx (xᵀx)⁻¹`` (``out × in``) and the minimum loss ``L*``.

    ``L(P) = L* + ½ tr((P − A) Σ (P − A)ᵀ)`` with ``Σ = xᵀx/N``. Raises ``ValueError`` if ``x`` has rank
    below its width.

    >>> x = torch.eye(3, dtype=torch.float64)
    >>> A, best = least_squares(x, x @ torch.diag(torch.tensor([1., 2., 3.], dtype=torch.float64)))
    >>> A.diagonal().tolist(), best.item()
    ([1.0, 2.0, 3.0], 0.0)
    """
    sigma = _covariance(x)
    if torch.linalg.matrix_rank(sigma) < sigma.shape[0]:
        raise ValueError(f"x: rank {int(torch.linalg.matrix_rank(sigma))} < width {sigma.shape[0]}; "
                         "the least-squares product is not unique")
    A = torch.linalg.solve(sigma, x.mT @ y / x.shape[0]).mT
    return A, deep_linear_loss([A], x, y)


def _check_square_chain(weights: Weights, name: str = "weights") -> int:
    if len(weights) == 0:
        raise ValueError(f"{name}: empty list of layers")
    h = weights[0].shape[-1]
    for k, w in enumerate(weights):
        if w.shape[-2:] != (h, h):
            raise ValueError(f"{name}[{k}] has shape {tuple(w.shape)}; components are labelled for square "
                             f"{h} × {h} layers")
    return h


def _check_invertible(w: torch.Tensor, name: str) -> None:
    s = torch.linalg.svdvals(w)
    if s[-1] <= 100 * w.shape[-1] * torch.finfo(w.dtype).eps * s[0]:
        raise ValueError(f"{name} is singular (σ_min/σ_max = {(s[-1] / s[0]).item():.3g}); "
                         "invertible weights are required")


def component_label(weights: Weights) -> tuple[int, ...]:
    """``(sign det W_1, …, sign det W_l)``: constant on each component of ``{P = A}`` (``A`` invertible).

    Raises ``ValueError`` naming the layer if a weight is singular.

    >>> component_label([torch.diag(torch.tensor([-1., 1.])), torch.eye(2)])
    (-1, 1)
    """
    _check_square_chain(weights)
    for k, w in enumerate(weights):
        _check_invertible(w, f"weights[{k}]")
    return tuple(int(torch.linalg.slogdet(w).sign.item()) for w in weights)


def component_count(depth: int) -> int:
    """``2^{l−1}``: components of the minimum of an ``l``-layer square linear network with invertible ``A``.

    >>> [component_count(l) for l in (1, 2, 3, 4)]
    [1, 2, 4, 8]
    """
    if depth < 1:
        raise ValueError(f"depth must be ≥ 1, got {depth}")
    return 2 ** (depth - 1)


def reachable_labels(depth: int, sign: int) -> list[tuple[int, ...]]:
    """The sign patterns ``ε ∈ {±1}^l`` with ``∏ ε_k = sign`` (``sign = sign det A``): one per component.

    >>> reachable_labels(2, -1)
    [(-1, 1), (1, -1)]
    """
    if sign not in (-1, 1):
        raise ValueError(f"sign must be ±1, got {sign}")
    patterns = [tuple(1 - 2 * ((n >> k) & 1) for k in range(depth)) for n in range(2 ** depth)]
    return sorted(p for p in patterns if math.prod(p) == sign)


def sample_minimum(x: torch.Tensor, y: torch.Tensor, depth: int, n: int,
                   generator: torch.Generator | None = None) -> list[list[torch.Tensor]]:
    """``n`` random points of the minimum ``{W_l ⋯ W_1 = A}``: Gaussian ``W_1 … W_{l−1}``
    (entries ``N(0, 1/h)``), then ``W_l = A (W_{l−1} ⋯ W_1)⁻¹``.

    >>> x = torch.randn(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    >>> points = sample_minimum(x, x, depth=3, n=2, generator=torch.Generator().manual_seed(1))
    >>> torch.allclose(end_to_end(points[0]), torch.eye(2, dtype=torch.float64))
    True
    """
    A, _ = least_squares(x, y)
    h = _check_square_chain([A], "least-squares product of (x, y)")
    _check_invertible(A, "the least-squares product of (x, y)")
    points = []
    for _ in range(n):
        chart = [torch.randn(h, h, generator=generator, dtype=x.dtype) / h ** 0.5 for _ in range(depth - 1)]
        last = torch.linalg.solve(end_to_end(chart).mT, A.mT).mT if chart else A
        points.append(chart + [last])
    return points


def _real_nonpositive(mu: torch.Tensor, imag_tol: float) -> torch.Tensor:
    """Eigenvalues counted as real and ``≤ 0`` (``|Im μ| ≤ imag_tol·max(1, |μ|)``: errs towards a crossing)."""
    return (mu.imag.abs() <= imag_tol * mu.abs().clamp(min=1)) & (mu.real <= 0)


def singular_points(w_a: torch.Tensor, w_b: torch.Tensor, imag_tol: float = 1e-6) -> torch.Tensor:
    """The ``s ∈ (0, 1]`` where ``(1 − s) W_a + s W_b`` is singular (``W_a`` invertible, square).

    ``det((1−s)W_a + s W_b) = det W_a ∏_j (1 − s + s μ_j)`` with ``μ_j`` the eigenvalues of ``W_a⁻¹W_b``, so
    the roots are ``s = 1/(1 − μ)`` for real ``μ ≤ 0``. Eigenvalues within ``imag_tol`` of the real axis
    count as real: the test may report a crossing that rounding created, never miss one.

    >>> singular_points(torch.eye(2), -torch.eye(2)).tolist()
    [0.5, 0.5]
    """
    _check_invertible(w_a, "w_a")
    mu = torch.linalg.eigvals(torch.linalg.solve(w_a, w_b))
    return torch.sort(1 / (1 - mu.real[_real_nonpositive(mu, imag_tol)])).values


def chart_path(theta_a: Weights, theta_b: Weights, s: float) -> list[torch.Tensor]:
    """The chart path through the fiber ``{P = P(θ_a)}``: ``W_k(s) = (1−s)W_k^a + s W_k^b`` for ``k < l`` and
    ``W_l(s) = P(θ_a) (W_{l−1}(s) ⋯ W_1(s))⁻¹``; defined, hence inside the fiber, while no chart layer is
    singular (see :func:`chart_adjacency`)."""
    _check_same_product(theta_a, theta_b)
    chart = [(1 - s) * a + s * b for a, b in zip(theta_a[:-1], theta_b[:-1])]
    A = end_to_end(theta_a)
    return chart + [torch.linalg.solve(end_to_end(chart).mT, A.mT).mT if chart else A]


def chart_adjacency(points: Sequence[Weights], imag_tol: float = 1e-6) -> torch.Tensor:
    """``adjacency[a, b]``: certified that :func:`chart_path` joins points ``a`` and ``b`` (all on one
    fiber) without leaving it, i.e. no chart layer ``W_k(s)``, ``k < l``, is singular on ``[0, 1]``
    (the exact root test of :func:`singular_points`, batched over all pairs). Uses no component labels.

    >>> I = torch.eye(2)
    >>> chart_adjacency([[I, I], [2 * I, I / 2], [-I, -I]]).int().tolist()
    [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    for theta in points[1:]:
        _check_same_product(points[0], theta)
    n = len(points)
    adjacency = torch.ones(n, n, dtype=torch.bool)
    for k in range(len(points[0]) - 1):
        W = torch.stack([theta[k] for theta in points])
        mu = torch.linalg.eigvals(torch.linalg.solve(W[:, None], W[None, :]))
        adjacency &= ~_real_nonpositive(mu, imag_tol).any(-1)
    return adjacency


def _check_same_product(theta_a: Weights, theta_b: Weights) -> None:
    pa, pb = end_to_end(theta_a), end_to_end(theta_b)
    if len(theta_a) != len(theta_b) or (pa - pb).norm() > 1e-8 * pa.norm():
        raise ValueError("theta_b: not on the same fiber as theta_a (depths or end-to-end products differ)")


def count_components(adjacency: torch.Tensor) -> list[int]:
    """Connected components of a graph by union–find: ``cluster[i]`` is the smallest vertex joined to
    ``i`` by a chain of edges. With certified edges (paths inside a set), the number of clusters is an
    upper bound on the number of components of the set that the vertices meet.

    >>> count_components(torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool))
    [0, 0, 2]
    """
    parent = list(range(adjacency.shape[0]))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in adjacency.nonzero().tolist():
        ri, rj = root(i), root(j)
        parent[max(ri, rj)] = min(ri, rj)
    return [root(i) for i in range(len(parent))]


def _whitened_target(x: torch.Tensor, y: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """``A``, ``L*``, ``Σ^{1/2}``, ``Σ^{−1/2}`` and the SVD of ``B = A Σ^{1/2}``."""
    A, best = least_squares(x, y)
    _check_square_chain([A], "least-squares product of (x, y)")
    _check_invertible(A, "the least-squares product of (x, y)")
    evals, evecs = torch.linalg.eigh(_covariance(x))
    root = evecs @ torch.diag(evals.sqrt()) @ evecs.mT
    inv_root = evecs @ torch.diag(evals.rsqrt()) @ evecs.mT
    return A, best, root, inv_root, torch.linalg.svd(A @ root)


def component_barrier(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``½ σ_min(A Σ^{1/2})²``: the least loss excess over ``L*`` on any path between two different
    components (the mountain-pass height), for square deep linear networks of any depth ``≥ 2``.

    Lower bound: on such a path some ``W_k`` becomes singular, so ``P`` does, and
    ``min_{rank P < h} ½ ‖(P − A) Σ^{1/2}‖_F² = ½ σ_min(A Σ^{1/2})²`` (Eckart–Young). Attained by
    :func:`crossing_waypoints`.

    >>> x = torch.eye(2, dtype=torch.float64)
    >>> round(component_barrier(x, x @ torch.diag(torch.tensor([3., 0.5], dtype=torch.float64))).item(), 12)
    0.0625
    """
    *_, (_, s, _) = _whitened_target(x, y)
    return 0.5 * s[-1] ** 2


def crossing_waypoints(weights: Weights, i: int, j: int, x: torch.Tensor,
                       y: torch.Tensor) -> list[list[torch.Tensor]]:
    """Four points ``θ_0 = θ, θ_1, θ_2, θ_3`` whose polyline leaves the component of ``θ`` for the one
    with ``sign det W_i`` and ``sign det W_j`` flipped, with loss excess at most ``component_barrier``.

    With ``A Σ^{1/2} = U S Vᵀ``, ``u = U e_h``, ``z = Σ^{−1/2} V e_h``, ``L_i = W_l⋯W_{i+1}`` and
    ``R_i = W_{i−1}⋯W_1`` (layers 0-based in the code):

    1. ``W_i ← W_i − s_h L_i⁻¹ u zᵀ R_i⁻¹``: ``P = A − s_h u zᵀ``, singular (loss excess ``½ s_h²``);
    2. ``W_j ← W_j (I − 2 n nᵀ)`` with ``n`` a unit null direction of the rest of the (singular) product,
       so ``P`` is unchanged and ``det W_j`` flips sign;
    3. ``W_i ← W_i + s_h L_i'⁻¹ u zᵀ R_i'⁻¹`` (with the new ``W_j``): ``P = A`` again.

    Along the polyline the excess is ``½ s² s_h²``, then ``½ s_h²``, then ``½ (1−s)² s_h²``.
    ``θ`` must lie on the minimum (``ValueError`` otherwise).
    """
    h = _check_square_chain(weights)
    depth = len(weights)
    if not (0 <= i < depth and 0 <= j < depth and i != j):
        raise ValueError(f"i, j: need two distinct layer indices in [0, {depth}), got {i}, {j}")
    A, best, _, inv_root, (U, S, Vh) = _whitened_target(x, y)
    excess = deep_linear_loss(weights, x, y) - best
    if excess > 1e-10 * (1 + best):
        raise ValueError(f"weights: not on the minimum (loss exceeds the least-squares minimum by {excess.item():.3g})")
    u, z, s_h = U[:, -1:], inv_root @ Vh[-1:, :].mT, S[-1]
    eye = torch.eye(h, dtype=A.dtype)

    def rank_one(ws: list[torch.Tensor], sign: float) -> list[torch.Tensor]:
        left, right = end_to_end(ws[i + 1:]) if i + 1 < depth else eye, end_to_end(ws[:i]) if i else eye
        step = torch.linalg.solve(left, u) @ torch.linalg.solve(right.mT, z).mT
        return ws[:i] + [ws[i] + sign * s_h * step] + ws[i + 1:]

    theta_0 = list(weights)
    theta_1 = rank_one(theta_0, -1)
    if j > i:  # n ⟂ range of W_{j−1}⋯W_1 (rank h − 1): a left singular vector of the smallest singular value
        n = torch.linalg.svd(end_to_end(theta_1[:j]))[0][:, -1:]
    else:  # W_j n spans the kernel of W_l⋯W_{j+1} (rank h − 1)
        n = torch.linalg.solve(theta_1[j], torch.linalg.svd(end_to_end(theta_1[j + 1:]))[2][-1:, :].mT)
        n = n / n.norm()
    theta_2 = theta_1[:j] + [theta_1[j] @ (eye - 2 * n @ n.mT)] + theta_1[j + 1:]
    return [theta_0, theta_1, theta_2, rank_one(theta_2, +1)]


# -- paths in GL⁺ from the group action -------------------------------------------------------------

def _plane_generator(h: int, p: int, q: int, dtype: torch.dtype) -> torch.Tensor:
    J = torch.zeros(h, h, dtype=dtype)
    J[p, q], J[q, p] = 1.0, -1.0
    return J


def exp_factors(g: torch.Tensor) -> list[torch.Tensor]:
    """Lie-algebra elements ``A_1, …, A_r`` with ``g = exp(A_1) ⋯ exp(A_r)`` for ``g ∈ GL⁺(h)``.

    ``exp(t log g)`` ([Zhao2026] eq. 3.5) needs a real logarithm, which ``g = diag(−1, −2)`` lacks
    although ``det g > 0``; a product of exponentials always exists. Polar decomposition ``g = Q P``:
    ``P = exp(log P)`` (symmetric ``log P``), and ``Q ∈ SO(h)`` is reduced to ``I`` by Givens rotations
    ``exp(θ J_pq)``, ``J_pq = E_pq − E_qp``, each making one diagonal entry non-negative (the last one is
    then ``det Q = 1``). The path ``t ↦ ∏ exp(t A_i)`` runs from ``I`` to ``g`` inside ``GL⁺``.

    >>> g = torch.diag(torch.tensor([-1., -2.], dtype=torch.float64))
    >>> product = torch.eye(2, dtype=torch.float64)
    >>> for M in exp_factors(g):
    ...     product = product @ matrix_exp(M)
    >>> torch.allclose(product, g)
    True
    """
    h = g.shape[-1]
    if g.shape != (h, h):
        raise ValueError(f"g: need a square matrix, got shape {tuple(g.shape)}")
    _check_invertible(g, "g")
    if torch.linalg.det(g) < 0:
        raise ValueError("g: det g < 0, so g is not in the identity component GL⁺ and no path from I reaches it")
    U, S, Vh = torch.linalg.svd(g)
    r = U @ Vh  # Q, orthogonal with det +1
    rotations = []
    for col in range(h - 1):  # Givens: zero r[row, col] against r[row − 1, col], bottom up
        for row in range(h - 1, col, -1):
            angle = torch.atan2(r[row, col], r[row - 1, col])
            J = _plane_generator(h, row - 1, row, g.dtype)
            r = matrix_exp(angle * J) @ r
            rotations.append(-angle * J)
    # r is now orthogonal upper triangular with r[c, c] ≥ 0 for c < h − 1 and det r = 1: r = I, Q = ∏ exp(−θ J).
    return rotations + [Vh.mT @ torch.diag(S.log()) @ Vh]


def _path_element(factors: Sequence[torch.Tensor], t: float) -> torch.Tensor:
    element = torch.eye(factors[-1].shape[-1], dtype=factors[-1].dtype)
    for M in factors:
        element = element @ matrix_exp(t * M)
    return element


def group_path(theta_a: Weights, theta_b: Weights) -> Callable[[float], list[torch.Tensor]]:
    """``t ↦ g(t)·θ_a`` for ``t ∈ [0, 1]``, a path in the orbit from ``θ_a`` to ``θ_b`` (same end-to-end
    matrix, same component): ``g_k = Π_k^b (Π_k^a)⁻¹`` with ``Π_k = W_k ⋯ W_1`` maps ``θ_a`` to ``θ_b``, and
    each ``g_k ∈ GL⁺`` is reached by ``∏ exp(t A_i)`` (:func:`exp_factors`). The loss is constant on it.

    Raises ``ValueError`` naming the layers whose determinant signs differ (different components).
    """
    _check_square_chain(theta_a, "theta_a")
    _check_same_product(theta_a, theta_b)
    differ = [k for k, (a, b) in enumerate(zip(component_label(theta_a), component_label(theta_b))) if a != b]
    if differ:
        raise ValueError(f"theta_b: in another component than theta_a (sign det differs at layers {differ})")
    depth = len(theta_a)
    factors = [exp_factors(end_to_end(theta_b[:k + 1]) @ torch.linalg.inv(end_to_end(theta_a[:k + 1])))
               for k in range(depth - 1)]

    def path(t: float) -> list[torch.Tensor]:
        g = [_path_element(f, t) for f in factors]
        return _act(theta_a, g, [torch.linalg.inv(gk) for gk in g])

    return path


# -- orbit curves, curvature and the barrier bound ------------------------------------------------------

def _act(weights: Weights, g: Sequence[torch.Tensor], g_inv: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``W_k ↦ g_k W_k g_{k−1}⁻¹`` for a chain (``g`` over the ``l − 1`` hidden sites)."""
    out = []
    for k, w in enumerate(weights):
        if k < len(g):
            w = g[k] @ w
        if k > 0:
            w = w @ g_inv[k - 1]
        out.append(w)
    return out


def _check_generators(weights: Weights, M: Sequence[torch.Tensor]) -> None:
    if len(M) != len(weights) - 1:
        raise ValueError(f"M: need {len(weights) - 1} generators (one per hidden site), got {len(M)}")
    for k, m in enumerate(M):
        h = weights[k].shape[-2]
        if m.shape != (h, h) or weights[k + 1].shape[-1] != h:
            raise ValueError(f"M[{k}] has shape {tuple(m.shape)}; hidden site {k + 1} has width {h}")


def chain_tangent(weights: Weights, M: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The infinitesimal action ``(M·θ)_k = M_k W_k − W_k M_{k−1}`` (``M_0 = M_l = 0``).

    >>> chain_tangent([torch.ones(2, 1), torch.ones(1, 2)], [torch.eye(2)])[1].tolist()
    [[-1.0, -1.0]]
    """
    _check_generators(weights, M)
    out = []
    for k, w in enumerate(weights):
        v = torch.zeros_like(w)
        if k < len(M):
            v = v + M[k] @ w
        if k > 0:
            v = v - w @ M[k - 1]
        out.append(v)
    return out


def orbit_curve(weights: Weights, M: Sequence[torch.Tensor], t: float | torch.Tensor) -> list[torch.Tensor]:
    """``γ(t) = exp(tM)·θ``: ``W_k ↦ exp(tM_k) W_k exp(−tM_{k−1})``; a 1-D tensor ``t`` gives a leading batch
    dimension.

    >>> w = orbit_curve([torch.ones(1, 1), torch.ones(1, 1)], [torch.ones(1, 1)], 1.0)
    >>> round(w[0].item(), 6), round(w[1].item(), 6)
    (2.718282, 0.367879)
    """
    _check_generators(weights, M)
    t = torch.as_tensor(t, dtype=weights[0].dtype)
    t = t.reshape(-1, 1, 1) if t.ndim else t
    return _act(weights, [matrix_exp(t * m) for m in M], [matrix_exp(-t * m) for m in M])


def _flat(tensors: Weights) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def curvature(weights: Weights, M: Sequence[torch.Tensor], t: float = 0.0) -> torch.Tensor:
    """Curvature of ``γ(t) = exp(tM)·θ`` at ``t``: ``κ = ‖γ'' − (⟨γ'', γ'⟩/‖γ'‖²) γ'‖ / ‖γ'‖²``,
    with ``γ' = M·γ`` and ``γ'' = M·(M·γ)`` (``M·`` the linear infinitesimal action, which commutes with
    ``exp(tM)``). Raises ``ValueError`` if ``M·γ = 0`` (a constant curve).

    For ``M = c I`` on a two-layer chain, ``κ(t) = 2 √(ab) / (a e^{2ct} + b e^{−2ct})^{3/2}`` with
    ``a = ‖W_1‖²``, ``b = ‖W_2‖²`` (independent of the speed ``c``):

    >>> w = [torch.ones(1, 1), 2 * torch.ones(1, 1)]
    >>> round(curvature(w, [torch.ones(1, 1)]).item(), 6), round(2 * 2 / 5 ** 1.5, 6)
    (0.357771, 0.357771)
    """
    gamma = orbit_curve(weights, M, t)
    velocity = chain_tangent(gamma, M)
    v, a = _flat(velocity), _flat(chain_tangent(velocity, M))
    speed2 = v @ v
    if speed2 <= torch.finfo(v.dtype).tiny:
        raise ValueError("M: acts trivially on weights (M·θ = 0), the curve is a point")
    return (a - (a @ v) / speed2 * v).norm() / speed2


def chord_deviation_bound(weights: Weights, M: Sequence[torch.Tensor], t_a: float, t_b: float,
                          s: torch.Tensor) -> torch.Tensor:
    """``e_k(s) ≥ ‖(1−s) γ_k(t_a) + s γ_k(t_b) − γ_k(t_s)‖_F`` with ``t_s = (1−s) t_a + s t_b``, per layer.

    Linear interpolation error of a ``C²`` curve: ``e_k(s) = ½ s(1−s)(t_b−t_a)² sup_{[t_a,t_b]} ‖γ_k''‖``.
    For normal ``M_k`` the layer operator ``W ↦ M_k W − W M_{k−1}`` is normal, so
    ``‖γ_k''(t)‖² = Σ_j |λ_j|⁴ e^{2t Re λ_j} ‖Π_j W_k‖²`` is convex in ``t`` and the sup is at an endpoint.
    Non-normal generators raise ``ValueError``. Returns shape ``(l, len(s))``.
    """
    for k, m in enumerate(M):
        if (m @ m.mT - m.mT @ m).norm() > 1e-10 * (m.norm() ** 2 + 1e-300):
            raise ValueError(f"M[{k}] is not normal; the endpoint sup of ‖γ''‖ needs normal generators")
    acc = [torch.stack([w.norm() for w in chain_tangent(chain_tangent(orbit_curve(weights, M, t), M), M)])
           for t in (t_a, t_b)]
    sup = torch.maximum(*acc)
    s = torch.as_tensor(s, dtype=sup.dtype)
    return 0.5 * (t_b - t_a) ** 2 * sup[:, None] * (s * (1 - s))[None, :]


def interpolation_barrier_bound(weights: Weights, M: Sequence[torch.Tensor], t_a: float, t_b: float,
                                x: torch.Tensor, y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Upper bound ``B(s) ≥ L((1−s) γ(t_a) + s γ(t_b)) − L(θ)`` for the deep linear loss (any widths).

    With ``Δ = w(s) − γ(t_s)`` (``‖Δ_k‖_F ≤ e_k(s)``, :func:`chord_deviation_bound`), expanding the product
    gives ``‖ΔP‖_F ≤ D(s) = ∏_k (‖W_k(t_s)‖₂ + e_k(s)) − ∏_k ‖W_k(t_s)‖₂``, and since
    ``L(P + ΔP) − L(P) = ⟨G, ΔP⟩ + ½ tr(ΔP Σ ΔPᵀ)`` with ``G = ∂L/∂P``,

        ``B(s) = ‖G‖_F D(s) + ½ ‖Σ‖₂ D(s)²``        (``G = 0`` on the minimum: second order in ``e``).

    ``L`` and ``G`` are the same at every ``γ(t)`` (``P`` is invariant).
    """
    s = torch.as_tensor(s, dtype=weights[0].dtype)
    e = chord_deviation_bound(weights, M, t_a, t_b, s)
    P = end_to_end(weights)
    G = (x @ P.mT - y).mT @ x / x.shape[0]
    sigma_norm = torch.linalg.matrix_norm(_covariance(x), ord=2)
    norms = torch.stack([torch.linalg.matrix_norm(w, ord=2) for w in orbit_curve(weights, M, (1 - s) * t_a + s * t_b)])
    D = torch.prod(norms + e, 0) - torch.prod(norms, 0)
    return G.norm() * D + 0.5 * sigma_norm * D ** 2


def segment_losses(theta_a: Weights, theta_b: Weights, x: torch.Tensor, y: torch.Tensor,
                   s: torch.Tensor) -> torch.Tensor:
    """``L((1−s) θ_a + s θ_b)`` of the deep linear network for each ``s`` (batched)."""
    s = torch.as_tensor(s, dtype=theta_a[0].dtype)[:, None, None]
    return deep_linear_loss([(1 - s) * a + s * b for a, b in zip(theta_a, theta_b)], x, y)


def maximize_on_interval(f: Callable[[float], float], a: float = 0.0, b: float = 1.0, grid: int = 401,
                         tol: float = 1e-13) -> tuple[float, float]:
    """``(argmax, max)`` of a scalar function on ``[a, b]``: the best of ``grid`` equally spaced points,
    refined by golden-section search on the neighbouring grid cells. A direct numerical maximiser,
    independent of any closed form.

    >>> s, value = maximize_on_interval(lambda s: -(s - 1 / 3) ** 2)
    >>> round(s, 10), abs(value) < 1e-20
    (0.3333333333, True)
    """
    points = [a + (b - a) * i / (grid - 1) for i in range(grid)]
    values = [f(p) for p in points]
    best = max(range(grid), key=values.__getitem__)
    lo, hi = points[max(best - 1, 0)], points[min(best + 1, grid - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > tol:
        if fc >= fd:
            hi, d, fd = d, c, fc
            c = hi - ratio * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + ratio * (hi - lo)
            fd = f(d)
    return max([(values[best], points[best]), (fc, c), (fd, d)])[::-1]


# -- homogeneous last layers: closed-form barrier along an orbit ----------------------------------------

def _last_layer_terms(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
                      g: Element, degree: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual ``R = H Wᵀ + b − y`` and the ingredients of the interpolated output."""
    residual = features @ weight.mT - y
    if bias is not None:
        residual = residual + bias
    g = torch.as_tensor(g, dtype=features.dtype)
    h = features.shape[-1]
    if g.ndim == 2:
        if g.shape != (h, h):
            raise ValueError(f"g: a matrix element must be {h} × {h}, got {tuple(g.shape)}")
        if degree != 1:
            raise ValueError(f"degree: a general matrix g acts only through a linear activation (degree 1), "
                             f"got {degree}")
        _check_invertible(g, "g")
    elif g.ndim <= 1:
        g = g.expand(h) if g.ndim == 0 else g
        if g.shape != (h,) or (g <= 0).any():
            raise ValueError(f"g: a positive scaling must be a positive scalar or {h} positive entries")
    else:
        raise ValueError(f"g: expected a scalar, vector or matrix, got shape {tuple(g.shape)}")
    if degree <= 0:
        raise ValueError(f"degree must be positive, got {degree}")
    return residual, g


def homogeneous_segment_loss(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                             y: torch.Tensor, g: Element, degree: float, alpha: float) -> torch.Tensor:
    """Loss at ``(1−α) θ + α g·θ`` in closed form, from the last layer's input ``H = σ(W_{l−1} u + b_{l−1})``.

    ``g`` acts on the last hidden site: ``W_{l−1} ↦ g W_{l−1}``, ``b_{l−1} ↦ g b_{l−1}``, ``W_l ↦ W_l g^{−k}``,
    earlier layers fixed. For a positive scaling ``g = diag(d)`` (scalar ``d`` = all entries equal),
    ``σ(c z) = c^k σ(z)`` for ``c > 0`` turns the interpolated output into ``W_l C(α) H + b_l`` with
    ``C(α) = diag(c_i(α))``, ``c_i = (1 − α + α d_i^{−k})(1 − α + α d_i)^k``; for a matrix ``g`` with
    ``σ`` the identity (``k = 1``), ``C(α) = ((1−α)I + αg⁻¹)((1−α)I + αg) = I + α(1−α)(g + g⁻¹ − 2I)``.
    Then ``L(α) = ½ mean ‖R + W_l (C(α) − I) H‖²`` with ``R`` the residual at ``θ``.
    """
    residual, g = _last_layer_terms(features, weight, bias, y, g, degree)
    if g.ndim == 2:
        change = alpha * (1 - alpha) * (g + torch.linalg.inv(g) - 2 * torch.eye(g.shape[0], dtype=g.dtype))
        shift = features @ change.mT @ weight.mT
    else:
        c = (1 - alpha + alpha * g ** -degree) * (1 - alpha + alpha * g) ** degree
        shift = (features * (c - 1)) @ weight.mT
    return 0.5 * ((residual + shift) ** 2).sum(-1).mean()


def homogeneous_orbit_barrier(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              y: torch.Tensor, g: Element, degree: float) -> tuple[torch.Tensor, float]:
    """``(max_α L((1−α)θ + α g·θ) − L(θ), argmax α)`` in closed form (same arguments as
    :func:`homogeneous_segment_loss`, without ``α``).

    * ``k = 1`` (any positive diagonal, or any invertible ``g`` with linear ``σ``): ``C(α) − I = τK``,
      ``τ = α(1−α) ∈ [0, ¼]``, ``K = g + g⁻¹ − 2I``; with ``F = W_l K H`` the excess is ``τβ + ½τ²φ``,
      ``β = mean⟨R, F⟩``, ``φ = mean‖F‖²``, convex in ``τ``: the barrier is ``max(0, β/4 + φ/32)`` at ``α = ½``.
    * scalar ``g = m`` and any ``k > 0``: ``C = c(α) I`` with ``c ≥ 1`` (weighted AM–GM) and ``log c``
      concave, maximal at ``α* = (kp − q)/((k+1)pq)``, ``p = m − 1``, ``q = 1 − m^{−k}``, where
      ``c* = u^k v``, ``u = k(p+q)/((k+1)q)``, ``v = (p+q)/((k+1)p)``; with ``F = W_l H`` the barrier is
      ``max(0, (c*−1)β + ½(c*−1)²φ)``.

    At a minimum ``β = 0`` (it is the derivative of ``L`` along ``W_l ↦ W_l + τ W_l K``). A non-constant
    diagonal with ``k ≠ 1`` has no closed-form maximum and raises ``ValueError``.

    >>> H, W = torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64)
    >>> barrier, alpha = homogeneous_orbit_barrier(H, W, None, H, 4.0, 1)
    >>> barrier.item(), alpha, (4 - 1) ** 4 / (32 * 4 ** 2)
    (0.158203125, 0.5, 0.158203125)
    """
    residual, g = _last_layer_terms(features, weight, bias, y, g, degree)
    if degree == 1:
        K = g + torch.linalg.inv(g) - 2 * torch.eye(g.shape[0], dtype=g.dtype) if g.ndim == 2 \
            else torch.diag(g + 1 / g - 2)
        scale_max, mixed = 0.25, features @ K.mT @ weight.mT
    elif torch.all(g == g[0]):
        m = g[0].item()
        if m == 1:
            return torch.zeros((), dtype=features.dtype), 0.0
        p, q = m - 1, 1 - m ** -degree
        u, v = degree * (p + q) / ((degree + 1) * q), (p + q) / ((degree + 1) * p)
        scale_max, mixed = u ** degree * v - 1, features @ weight.mT
    else:
        raise ValueError(f"g: a non-constant scaling with degree {degree} ≠ 1 has no closed-form maximum")
    beta = (residual * mixed).sum(-1).mean()
    phi = (mixed ** 2).sum(-1).mean()
    barrier = scale_max * beta + 0.5 * scale_max ** 2 * phi
    if barrier <= 0:
        return torch.zeros((), dtype=features.dtype), 0.0
    alpha = 0.5 if degree == 1 else (degree * p - q) / ((degree + 1) * p * q)
    return barrier, alpha
