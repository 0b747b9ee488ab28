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
from scipy import integrate

__all__ = ["CURVES", "curve_distance", "expected_shift_distance", "small_curvature_limit"]

CURVES = ("parabola", "circle")
"""The curves of eq. 5.3: ``γ₁(t) = (t, (κ/2) t²)`` and the circle of radius ``1/κ`` tangent to the x-axis at 0."""


def _check(curvature: float, r: float, curve: str) -> None:
    if curve not in CURVES:
        raise ValueError(f"curve must be one of {CURVES}, got {curve!r}")
    if not (math.isfinite(curvature) and math.isfinite(r) and r > 0):
        raise ValueError(f"curvature must be finite and r a finite positive number, got κ={curvature!r}, r={r!r}")


def curve_distance(x: float, y: float, curvature: float, curve: str = "parabola") -> float:
    """``dist((x, y), γ)`` (eq. 5.4) to the curve ``curve`` of curvature ``curvature`` at the origin.

    Circle: ``| ‖w − c‖ − 1/|κ| |``, ``c = (0, 1/κ)``. Parabola ``y = k t²`` (``k = κ/2``): the nearest point solves
    ``d/dt [(t − x)² + (kt² − y)²] = 0``, i.e. the cubic ``2k² t³ + (1 − 2ky) t − x = 0``; the minimum over its
    real roots.

    >>> curve_distance(0.0, 4.0, 1.0, "circle"), curve_distance(0.0, -1.0, 0.5, "parabola")
    (2.0, 1.0)
    """
    _check(curvature, 1.0, curve)
    if curvature == 0:
        return abs(y)
    if curve == "circle":
        radius = 1 / curvature
        return abs(math.hypot(x, y - radius) - abs(radius))
    k = curvature / 2
    roots = np.roots([2 * k * k, 0.0, 1 - 2 * k * y, -x])
    real = roots.real[np.abs(roots.imag) <= 1e-9 * (1 + np.abs(roots))]
    t = real if real.size else roots.real[np.argmin(np.abs(roots.imag))][None]
    return float(np.min(np.hypot(t - x, k * t * t - y)))


def _crossings(curvature: float, r: float, curve: str) -> list[float]:
    """Angles in ``(0, 2π)`` where ``S_r`` meets the curve (the kinks of the integrand), for ``κ ≥ 0``."""
    if curvature == 0:
        return [math.pi]
    if curve == "circle":
        if curvature * r > 2:                       # the circle lies inside S_r
            return []
        s = curvature * r / 2                       # r² − 2rR sin θ = 0
    else:
        a = curvature * r / 2                       # sin θ = a cos²θ  →  a s² + s − a = 0
        s = (math.sqrt(1 + 4 * a * a) - 1) / (2 * a)
    first = math.asin(min(s, 1.0))
    return sorted({first, math.pi - first} - {0.0})


def expected_shift_distance(curvature: float, r: float = 1.0, curve: str = "parabola") -> float:
    """``E_{w∈S_r}[dist(w, γ)]`` of eq. 5.5 by adaptive quadrature (scipy ``quad``, split at the angles where ``S_r``
    crosses the curve, where the integrand has kinks; absolute error ≲ 1e-12·r). Even in ``curvature``.

    >>> [round(expected_shift_distance(k, curve=c), 4) for c in CURVES for k in (0.5, 2.0)]
    [0.631, 0.614, 0.6296, 0.5635]
    """
    _check(curvature, r, curve)
    kappa = abs(curvature)
    cuts = [0.0, *_crossings(kappa, r, curve), 2 * math.pi]

    def integrand(theta: float) -> float:
        return curve_distance(r * math.cos(theta), r * math.sin(theta), kappa, curve)

    total = sum(integrate.quad(integrand, a, b, limit=200, epsabs=1e-13 * r, epsrel=1e-12)[0]
                for a, b in zip(cuts[:-1], cuts[1:]))
    return total / (2 * math.pi)


def small_curvature_limit(curvature: float, r: float = 1.0) -> float:
    """``2r/π − κ²r³/(12π)``: the expected distance to the second order in ``κr`` (the same for both curves;
    derivation in the module docstring).

    >>> round(small_curvature_limit(0.0, r=2.0), 6) == round(4 / math.pi, 6)
    True
    """
    return 2 * r / math.pi - curvature ** 2 * r ** 3 / (12 * math.pi)
