"""Curvature of a minimum and the distance to it after a random shift ([Zhao2026] Sec. 5.2.4, eq. 5.3–5.6).

A two-parameter problem whose minimum is a curve ``γ ⊂ R²`` through ``w₀ = 0`` with tangent ``(1, 0)``; a
distribution shift moves ``γ`` by a distance ``r`` in a uniformly random direction, which (seen from the curve) moves
``w₀`` to a uniform point of the circle ``S_r``. The generalisation proxy is the expected distance to the curve

    E(κ, r) = (1/2π) ∫₀^{2π} dist((r cos θ, r sin θ), γ) dθ,     dist(w, γ) = min_{w'∈γ} ‖w' − w‖     (5.4, 5.5)

for the two curves of eq. 5.3 with curvature ``κ`` at ``w₀``: the parabola ``γ₁(t) = (t, (κ/2) t²)`` and the circle
``γ₂`` of radius ``1/κ`` centred at ``(0, 1/κ)`` (both reflected for ``κ < 0``, so ``E`` is even in ``κ``; ``κ = 0``
is the line ``γ(t) = (t, 0)``, eq. 5.6: ``E = 2r/π``).

Small-curvature limit (derived here, not in [Zhao2026]). With ``a = κr`` the signed distance to the circle expands
as ``dist/r = |−sin θ + (a/2) cos²θ + (a²/2) sin θ cos²θ + O(a³)|``. The first-order term averages to zero against
``sign(sin θ)``; the second order has two parts: the smooth one, ``−(a²/2)·E|sin θ| cos²θ = −a²/(3π)``, and the kink
of ``|·|`` at the two zeros ``θ = 0, π`` (``∫(|x − c| − |x| + c·sign x) dx = c²`` per zero, ``c = a/2``), ``+a²/(4π)``:

    E(κ, r) = 2r/π − κ² r³ / (12π) + O(κ⁴ r⁵).

The parabola's curvature ``2k/(1 + 4k²t²)^{3/2}`` differs from ``κ`` by ``O(κ³t²)`` within ``|t| ≤ r``, so the same
expansion holds for it; the two curves part only at fourth order (measured: ``(E − limit)/κ⁴r⁵ ≈ −0.0063`` for the
circle, ``+0.0175`` for the parabola at ``κr ≤ 0.2``) and at ``κr ≳ 1``. At ``κ = 0`` the expected distance is
stationary, so to second order more curvature means a *smaller* expected distance for every curve of this kind.

Example
-------
>>> import math
>>> round(expected_shift_distance(0.0) / (2 / math.pi), 12)                   # eq. 5.6: the straight line
1.0
>>> abs(expected_shift_distance(0.1, curve="circle") - small_curvature_limit(0.1)) < 1e-6   # error ~ 6e-7
True
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["CURVES", "curve_distance", "expected_shift_distance", "small_curvature_limit"]

CURVES = ("parabola", "circle")
"""The curves of eq. 5.3: ``γ₁(t) = (t, (κ/2) t²)`` and the circle of radius ``1/κ`` tangent to the x-axis at 0."""

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(48)


def _check(curvature: float, r: float, curve: str) -> None:
    if curve not in CURVES:
        raise ValueError(f"curve must be one of {CURVES}, got {curve!r}")
    if not (math.isfinite(curvature) and math.isfinite(r) and r > 0):
        raise ValueError(f"curvature must be finite and r a finite positive number, got κ={curvature!r}, r={r!r}")


def _distances(x: np.ndarray, y: np.ndarray, curvature: float, curve: str) -> np.ndarray:
    """Vectorised :func:`curve_distance`. The parabola's cubic is solved through the eigenvalues of its companion
    matrices; the real part of every root is a candidate (any ``t`` bounds the distance from above and the nearest
    point is a real root, so the minimum over the candidates is the distance)."""
    if curvature == 0:
        return np.abs(y)
    if curve == "circle":
        radius = 1 / curvature
        return np.abs(np.hypot(x, y - radius) - abs(radius))
    k = curvature / 2
    companion = np.zeros((x.size, 3, 3))
    companion[:, 1, 0] = companion[:, 2, 1] = 1.0
    companion[:, 0, 2] = x / (2 * k * k)                       # t³ + p t + q = 0, q = −x/(2k²), p = (1 − 2ky)/(2k²)
    companion[:, 1, 2] = -(1 - 2 * k * y) / (2 * k * k)
    t = np.linalg.eigvals(companion).real
    return np.min(np.hypot(t - x[:, None], k * t * t - y[:, None]), axis=1)


def curve_distance(x: float, y: float, curvature: float, curve: str = "parabola") -> float:
    """``dist((x, y), γ)`` (eq. 5.4) to the curve ``curve`` of curvature ``curvature`` at the origin.

    Circle: ``| ‖w − c‖ − 1/|κ| |``, ``c = (0, 1/κ)``. Parabola ``y = k t²`` (``k = κ/2``): the nearest point solves
    ``d/dt [(t − x)² + (kt² − y)²] = 0``, i.e. the cubic ``2k² t³ + (1 − 2ky) t − x = 0``; the minimum over its
    roots.

    >>> curve_distance(0.0, 4.0, 1.0, "circle"), curve_distance(0.0, -1.0, 0.5, "parabola")
    (2.0, 1.0)
    """
    _check(curvature, 1.0, curve)
    return float(_distances(np.array([float(x)]), np.array([float(y)]), curvature, curve)[0])


def _breaks(curvature: float, r: float, curve: str) -> list[float]:
    """Angles in ``[0, 2π]`` where the integrand is not smooth, for ``κ ≥ 0``: where ``S_r`` crosses the curve (the
    kinks of ``|·|``) and ``θ = π/2`` (the parabola's nearest point jumps across its axis there; the circle's
    distance is not smooth at its centre), plus the ends."""
    cuts = {0.0, math.pi / 2, math.pi, 2 * math.pi}
    if curvature > 0 and not (curve == "circle" and curvature * r > 2):      # a circle inside S_r: no crossing
        a = curvature * r / 2
        s = a if curve == "circle" else (math.sqrt(1 + 4 * a * a) - 1) / (2 * a)   # sin θ at the crossing
        first = math.asin(min(s, 1.0))
        cuts |= {first, math.pi - first}
    return sorted(cuts)


def expected_shift_distance(curvature: float, r: float = 1.0, curve: str = "parabola", panels: int = 16) -> float:
    """``E_{w∈S_r}[dist(w, γ)]`` of eq. 5.5 by composite 48-point Gauss–Legendre quadrature, ``panels`` panels on
    each arc between the angles where the integrand is not smooth (so every panel integrates an analytic function:
    error ≲ 1e-12·r for ``κr ≤ 1e4``, against 4× the panels). Even in ``curvature``.

    >>> [round(expected_shift_distance(k, curve=c), 4) for c in CURVES for k in (0.5, 2.0)]
    [0.631, 0.614, 0.6296, 0.5635]
    """
    _check(curvature, r, curve)
    kappa = abs(curvature)
    cuts = np.array(_breaks(kappa, r, curve))
    edges = np.concatenate([np.linspace(a, b, panels + 1)[:-1] for a, b in zip(cuts[:-1], cuts[1:])] + [cuts[-1:]])
    middle, half = (edges[1:] + edges[:-1]) / 2, (edges[1:] - edges[:-1]) / 2
    theta = (middle[:, None] + half[:, None] * _NODES).ravel()
    weights = (half[:, None] * _WEIGHTS).ravel()
    return float(weights @ _distances(r * np.cos(theta), r * np.sin(theta), kappa, curve)) / (2 * math.pi)


def small_curvature_limit(curvature: float, r: float = 1.0) -> float:
    """``2r/π − κ²r³/(12π)``: the expected distance to the second order in ``κr`` (the same for both curves;
    derivation in the module docstring).

    >>> round(small_curvature_limit(0.0, r=2.0), 6) == round(4 / math.pi, 6)
    True
    """
    return 2 * r / math.pi - curvature ** 2 * r ** 3 / (12 * math.pi)
