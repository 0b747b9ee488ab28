"""Mode connectivity ([Zhao2026] §3.3.2–3.4.1, App. B.2–B.3): the approximate action, and barriers near orbits.

Derivations and measured figures in ``docs/minima_geometry.md`` (section "Mode connectivity"). Paper layout for the
two-layer network of §3.4.1: ``U ∈ R^{m×h}``, ``V ∈ R^{h×n}``, data columns ``X ∈ R^{n×k}``, ``Y ∈ R^{m×k}``,
output ``F = U σ(VX)``. (The printed setting of Fig. 3.3(b–c) gives ``W₂ ∈ R^{32}``; with ``Y ∈ R^{64×8}`` and
``W₁ ∈ R^{32×16}`` the only consistent shape is ``W₂ = U ∈ R^{64×32}``.)

1. **Approximate action** (eq. 3.6): ``g·(U, V) = (U σ(VX) σ(gVX)⁺, gV)`` for ``g ∈ GL(h)``; it is
   :class:`~symalg.applications.teleport_actions.ApproximateTeleport` at site 0. The new output is
   ``F' = F Π`` with ``Π = σ(gVX)⁺σ(gVX)``, the *orthogonal* projector onto the row space of ``σ(gVX)`` (Moore–Penrose:
   ``Π = Πᵀ = Π²``; idempotence alone, all App. B.3 shows, would not bound a norm). Hence
   ``‖F − F'‖ = ‖F(I − Π)‖ ≤ ‖F‖`` (Frobenius and spectral; Prop. 3.4.1), with equality to 0 iff
   ``row F ⊆ row σ(gVX)``, guaranteed when ``rank σ(gVX) = k`` (batch ``k ≤ h``): the action is *exact on the batch*
   there, and only there in general. For ``k < h`` the unit axiom fails (``I·(U, V) = (U σ(VX)σ(VX)⁺, V)``, ``U``
   projected on the column space of ``σ(VX)``): a curve ``γ(t) = exp(tC)·(U, V)`` starts at that projection, not at
   ``(U, V)``; both compute the same outputs on the batch, not off it.
2. **Prop. 3.3.4** (barrier unbounded even after permuting): with ``Z = W_{l−1} f``, ``σ`` positively homogeneous of
   degree ``k``, ``W' = (m W_{l−1}, m^{−k} W_l)`` permuted by ``P``, the midpoint output is
   ``2^{−(k+1)} W_l (I + m^{−k}P) σ((I + mP^{−1})Z)`` (the printed ``¼`` is ``2^{−(k+1)}`` for ``k = 1``), so
   ``min_P L(½) / m^{2k} → 2^{−2(k+1)} min_P ‖W_l P^{−1} σ(Z)‖²`` (:func:`permuted_midpoint_losses`).
3. **Prop. 3.3.5** (interpolation leaves the orbit): on ``S = {W₁W₂ = A}`` the points ``(W₁/β, βW₂)``, ``(βW₁, W₂/β)``
   have midpoint ``c(W₁, W₂)``, ``c = (β + β⁻¹)/2``, at distance
   ``≥ √(h · min_{s>0} [σ_min(W₁)²(c − 1/s)² + σ_min(W₂)²(c − s)²])`` from ``S`` (von Neumann's trace inequality),
   which grows like ``c`` (:func:`orbit_exit_lower_bound`, :func:`orbit_exit_distance`).
4. **Prop. 3.3.6** (bounded orbits, bounded barriers): on the scaling orbit with every layer's norm ``< c``,
   ``m ∈ ((‖W_l‖/c)^{1/k}, c/‖W_{l−1}‖)``; the barrier of ``(1−α)θ + α m·θ`` grows with ``|log m|``, so the bound is
   the closed-form barrier at the two ends (:func:`bounded_orbit_barrier`, from
   :func:`~symalg.applications.minima_geometry.homogeneous_orbit_barrier`).

>>> import torch
>>> _ = torch.manual_seed(0)
>>> u, v, x = (torch.randn(*s, dtype=torch.float64) for s in ((3, 6), (6, 4), (4, 5)))
>>> g = torch.eye(6, dtype=torch.float64) + 0.3 * torch.randn(6, 6, dtype=torch.float64)
>>> e = action_error(u, v, g, x, torch.sigmoid)     # k = 5 ≤ h = 6: exact on the batch
>>> e.rank, e.error < 1e-10 * e.bound
(5, True)
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from symalg.applications.minima_geometry import homogeneous_orbit_barrier
from symalg.applications.teleport_actions import ApproximateTeleport
from symalg.catalogue.groups import matrix_exp
from symalg.numeric.feedforward import FeedForward

__all__ = ["ActionError", "action_error", "approximate_action", "approximate_curve", "bounded_orbit_barrier",
           "orbit_exit_distance", "orbit_exit_lower_bound", "permuted_midpoint_losses", "two_layer_loss"]

Activation = Callable[[torch.Tensor], torch.Tensor]


def _network(sigma: Activation) -> FeedForward:
    return FeedForward(("0.weight", "1.weight"), (None, None), (sigma,))


def approximate_action(u: torch.Tensor, v: torch.Tensor, g: torch.Tensor, x: torch.Tensor,
                       sigma: Activation) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3.6, ``(U σ(VX) σ(gVX)⁺, gV)`` (paper layout; ``x`` is ``X ∈ R^{n×k}``, columns are samples)."""
    if g.shape != (v.shape[0], v.shape[0]):
        raise ValueError(f"g: shape {tuple(g.shape)}, expected ({v.shape[0]}, {v.shape[0]}) (the hidden width)")
    moved = ApproximateTeleport(_network(sigma), 0)({"0.weight": v, "1.weight": u}, g, x.mT)
    return moved["1.weight"], moved["0.weight"]


def two_layer_loss(u: torch.Tensor, v: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                   sigma: Activation) -> torch.Tensor:
    """``½ mean_j ‖U σ(V x_j) − y_j‖²`` over the columns of ``X``, ``Y``."""
    return 0.5 * ((u @ sigma(v @ x) - y) ** 2).sum(0).mean()


@dataclass(frozen=True)
class ActionError:
    """Prop. 3.4.1 at one ``(U, V, g, X)``: ``error = ‖F − F'‖_F``, ``bound = ‖F‖_F``, ``rank = rank σ(gVX)`` of ``k``
    samples; ``exact`` when ``rank = k`` (then ``error`` is rounding)."""

    error: float
    bound: float
    rank: int
    k: int

    @property
    def exact(self) -> bool:
        return self.rank == self.k


def action_error(u: torch.Tensor, v: torch.Tensor, g: torch.Tensor, x: torch.Tensor,
                 sigma: Activation) -> ActionError:
    """:class:`ActionError` of eq. 3.6 (the output change on the batch against its bound ``‖U σ(VX)‖``)."""
    u2, v2 = approximate_action(u, v, g, x, sigma)
    before, after = u @ sigma(v @ x), u2 @ sigma(v2 @ x)
    return ActionError(float(torch.linalg.matrix_norm(before - after)), float(torch.linalg.matrix_norm(before)),
                       int(torch.linalg.matrix_rank(sigma(g @ v @ x))), x.shape[1])


def approximate_curve(u: torch.Tensor, v: torch.Tensor, C: torch.Tensor, x: torch.Tensor, sigma: Activation,
                      t: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``γ(t) = exp(tC)·(U, V)`` with eq. 3.6 (eq. 3.5 with ``log g = C``); ``γ(0) = I·(U, V)``, which is ``(U, V)``
    only when ``rank σ(VX) = h`` (batch ``k ≥ h``)."""
    return approximate_action(u, v, matrix_exp(t * C), x, sigma)


def permuted_midpoint_losses(w_prev: torch.Tensor, w_last: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                             m: float, sigma: Activation) -> torch.Tensor:
    """``‖Y − W̄_l σ(W̄_{l−1} f)‖²`` at the midpoint of ``(W_{l−1}, W_l)`` and ``(P⁻¹ mW_{l−1}, m^{−k}W_l P)``, for
    every permutation ``P`` of the hidden units (``n!``, in ``itertools.permutations`` order). ``m^{−k}`` is read off
    ``σ`` as ``σ(1)/σ(m)`` (``σ`` positively homogeneous of degree ``k``). Paper layout: ``features`` is
    ``f ∈ R^{d×k}``, ``Y ∈ R^{o×k}``; the loss is the proposition's squared Frobenius norm.
    """
    n = w_prev.shape[0]
    one = torch.ones((), dtype=w_prev.dtype)
    inverse_scale = float(sigma(one) / sigma(m * one))           # m^{−k} for a degree-k homogeneous σ
    eye, out = torch.eye(n, dtype=w_prev.dtype), []
    for order in itertools.permutations(range(n)):
        P = eye[list(order)]
        mid_prev = 0.5 * (w_prev + m * P.T @ w_prev)
        mid_last = 0.5 * (w_last + inverse_scale * w_last @ P)
        out.append(((y - mid_last @ sigma(mid_prev @ features)) ** 2).sum())
    return torch.stack(out)


def _phi_minimum(a: float, b: float, c: float) -> float:
    """``min_{s>0} a²(c − 1/s)² + b²(c − s)²``: at a positive root of ``φ'(s) s³/2 = b²s⁴ − b²cs³ + a²cs − a² = 0``
    (or at ``s → 0`` or ``∞`` when ``a`` or ``b`` vanishes)."""
    import numpy as np
    if a == 0 or b == 0:
        return 0.0
    roots = np.roots([b * b, -b * b * c, 0.0, a * a * c, -a * a])
    s = [float(r.real) for r in roots if abs(r.imag) <= 1e-9 * (1 + abs(r)) and r.real > 0]
    return min(a * a * (c - 1 / t) ** 2 + b * b * (c - t) ** 2 for t in s)


def orbit_exit_lower_bound(w1: torch.Tensor, w2: torch.Tensor, beta: float) -> float:
    """Lower bound on the Frobenius distance from ``c(W₁, W₂)``, ``c = (β + β⁻¹)/2``, to ``S = {Ŵ: Ŵ₁Ŵ₂ = W₁W₂}``.

    ``S = {(W₁g⁻¹, gW₂)}`` (``W₁`` invertible), so ``dist² = min_g ‖W₁(cI − g⁻¹)‖² + ‖(cI − g)W₂‖²``
    ``≥ a²‖cI − g⁻¹‖² + b²‖cI − g‖²`` (``a, b`` the smallest singular values) ``≥ Σ_i a²(c − 1/s_i)² + b²(c − s_i)²``
    (``tr g ≤ Σ s_i``, ``s_i`` the singular values of ``g``) ``≥ h min_s φ(s)``. Equality when ``W₁ = W₂ = I``.

    >>> eye = torch.eye(2, dtype=torch.float64)
    >>> round(orbit_exit_lower_bound(eye, eye, 1.0), 12)      # β = 1: the midpoint is on S
    0.0
    """
    c = (beta + 1 / beta) / 2
    a, b = float(torch.linalg.svdvals(w1).min()), float(torch.linalg.svdvals(w2).min())
    return math.sqrt(max(w1.shape[0] * _phi_minimum(a, b, c), 0.0))


def orbit_exit_distance(w1: torch.Tensor, w2: torch.Tensor, beta: float, starts: int = 4, steps: int = 200,
                        seed: int = 0) -> float:
    """The distance of :func:`orbit_exit_lower_bound` minimised numerically over ``g`` (L-BFGS from ``I``, ``cI`` and
    random starts): an upper estimate of the true distance, to compare with the lower bound."""
    c = (beta + 1 / beta) / 2
    n, gen = w1.shape[0], torch.Generator().manual_seed(seed)
    eye = torch.eye(n, dtype=w1.dtype)
    best = math.inf
    inits = [eye, c * eye] + [eye + 0.3 * torch.randn(n, n, generator=gen, dtype=w1.dtype) for _ in range(starts)]
    for init in inits:
        g = init.clone().requires_grad_(True)
        opt = torch.optim.LBFGS([g], max_iter=steps, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            value = ((c * w1 - w1 @ torch.linalg.inv(g)) ** 2).sum() + ((c * w2 - g @ w2) ** 2).sum()
            value.backward()
            return value
        try:
            opt.step(closure)
        except torch.linalg.LinAlgError:
            continue
        with torch.no_grad():
            value = ((c * w1 - w1 @ torch.linalg.inv(g)) ** 2).sum() + ((c * w2 - g @ w2) ** 2).sum()
        if torch.isfinite(value):
            best = min(best, float(value))
    return math.sqrt(best)


def bounded_orbit_barrier(features: torch.Tensor, w_prev: torch.Tensor, w_last: torch.Tensor, y: torch.Tensor,
                          c: float, degree: float) -> float:
    """Prop. 3.3.6's ``b``: the largest barrier of ``(1−α)θ + α m·θ`` over the scalings ``m·θ = (mW_{l−1}, m^{−k}W_l)``
    with ``‖mW_{l−1}‖₂, ‖m^{−k}W_l‖₂ < c`` (spectral norms), in the loss ``½ mean ‖·‖²`` of
    :func:`~symalg.applications.minima_geometry.homogeneous_orbit_barrier` (torch layout: ``features`` ``H`` rows of
    the last layer's input at ``θ``, ``w_last`` ``W_l``). Needs ``‖W_{l−1}‖, ‖W_l‖ < c``.

    At fixed ``α`` the factor ``(1−α+αm^{−k})(1−α+αm)^k`` has derivative
    ``kα(1−α)(1−α+αm)^{k−1}(1 − m^{−k−1})``: it grows with ``|log m|``, so the supremum is at the ends of the range.
    """
    norm_prev, norm_last = float(torch.linalg.matrix_norm(w_prev, 2)), float(torch.linalg.matrix_norm(w_last, 2))
    if not (norm_prev < c and norm_last < c):
        raise ValueError(f"c = {c} must exceed ‖W_l−1‖ = {norm_prev:.4g} and ‖W_l‖ = {norm_last:.4g}")
    ends = ((norm_last / c) ** (1 / degree), c / norm_prev)
    return max(float(homogeneous_orbit_barrier(features, w_last, None, y, m, degree)[0]) for m in ends)
