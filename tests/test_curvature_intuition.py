"""The curvature-intuition example of [Zhao2026] Sec. 5.2.4: expected distance of a randomly shifted point to a
curve of curvature κ, against the closed forms (eq. 5.6, the small-curvature limit, the large-curvature limits)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from symalg.applications.curvature_intuition import (CURVES, curve_distance, expected_shift_distance,
                                                     small_curvature_limit)


@pytest.mark.parametrize("curve", CURVES)
@pytest.mark.parametrize("r", [0.5, 1.0, 3.0])
def test_quadrature_meets_the_small_curvature_limit_to_fourth_order(curve, r):
    # E = 2r/π − κ²r³/(12π) + O(κ⁴r⁵): the remainder over κ⁴r⁵ stays bounded as κ → 0 (measured ≈ −0.0063 for the
    # circle, +0.0175 for the parabola), while the κ² term itself is resolved to < 1 % at κr = 1e-2
    for kappa in (0.01 / r, 0.03 / r, 0.1 / r):
        e, limit = expected_shift_distance(kappa, r, curve), small_curvature_limit(kappa, r)
        assert abs(e - limit) <= 0.03 * kappa ** 4 * r ** 5 + 1e-13 * r
        second = (e - 2 * r / math.pi) / (-kappa ** 2 * r ** 3 / (12 * math.pi))
        assert abs(second - 1) < 0.01 + 1.5 * (kappa * r) ** 2


@pytest.mark.parametrize("curve", CURVES)
def test_straight_line_and_symmetries(curve):
    assert expected_shift_distance(0.0, 2.0, curve) == pytest.approx(4 / math.pi, rel=1e-12)      # eq. 5.6
    e = expected_shift_distance(0.7, 1.3, curve)
    assert expected_shift_distance(-0.7, 1.3, curve) == e                                            # even in κ
    assert expected_shift_distance(0.7 * 1.3, 1.0, curve) * 1.3 == pytest.approx(e, rel=1e-10)      # scale r


def test_the_two_curves_part_at_large_curvature():
    # κ → ∞: the circle shrinks to the point w₀ (distance r everywhere); the parabola to the ray {x = 0, y ≥ 0}
    # (distance r below the x-axis, r|cos θ| above): E = r/2 + r/π
    assert expected_shift_distance(1e4, 1.0, "circle") == pytest.approx(1.0, abs=1e-3)
    assert expected_shift_distance(1e4, 1.0, "parabola") == pytest.approx(0.5 + 1 / math.pi, abs=1e-2)
    # in between both dip below the line's 2/π, at different curvatures and depths
    circle = [expected_shift_distance(k, 1.0, "circle") for k in (1.0, 2.0, 5.0)]
    parabola = [expected_shift_distance(k, 1.0, "parabola") for k in (1.0, 2.0, 5.0)]
    assert circle[1] < circle[0] < 2 / math.pi < circle[2]
    assert parabola[1] < parabola[0] < 2 / math.pi < parabola[2]
    assert circle[1] < parabola[1] - 0.04


@pytest.mark.parametrize("curve", CURVES)
def test_distance_is_the_minimum_over_a_dense_sampling_of_the_curve(curve):
    kappa = 1.7
    if curve == "parabola":
        t = np.linspace(-6, 6, 400001)
        points = np.stack([t, kappa / 2 * t * t], 1)
    else:
        s = np.linspace(0, 2 * math.pi, 400001)
        points = np.stack([np.cos(s) / kappa, np.sin(s) / kappa + 1 / kappa], 1)
    rng = np.random.default_rng(0)
    for x, y in rng.uniform(-2, 2, size=(20, 2)):
        brute = float(np.min(np.hypot(points[:, 0] - x, points[:, 1] - y)))
        assert curve_distance(x, y, kappa, curve) == pytest.approx(brute, abs=1e-6)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="curve must be one of"):
        expected_shift_distance(1.0, 1.0, "ellipse")
    with pytest.raises(ValueError, match="finite positive"):
        expected_shift_distance(1.0, -1.0)
