"""Expected distance to a randomly shifted minimum as a function of its curvature ([Zhao2026] Sec. 5.2.4, Fig. 5.5b/c).

For the parabola ``γ₁`` and the circle ``γ₂`` of eq. 5.3 with curvature ``κ`` at ``w₀``, the expected distance
``E(κ, r)`` of eq. 5.5 by quadrature (``symalg.applications.curvature_intuition.expected_shift_distance``), scaled
by ``r`` (``E/r`` depends on ``κr`` only), against the line's ``2/π`` (eq. 5.6) and the small-curvature limit
``2/π − (κr)²/(12π)`` (``small_curvature_limit``). Prints a table, the minimum of each curve, the fourth-order
remainder of the limit, and ``key=value`` tokens; saves ``curvature_intuition.png``.
Run: ``python examples/curvature_intuition.py [--quick] [--out DIR]``.
"""
from __future__ import annotations

import math

import matplotlib
import numpy as np
from scipy import optimize

from symalg.applications.curvature_intuition import CURVES, expected_shift_distance, small_curvature_limit
from teleport_common import parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    args = parse_args(__doc__)
    grid = np.geomspace(1e-2, 1e2, 13 if args.quick else 81)
    values = {curve: [expected_shift_distance(k, 1.0, curve) for k in grid] for curve in CURVES}
    print(f"{'κr':>9} " + " ".join(f"{c + ' E/r':>14}" for c in CURVES) + f" {'limit':>14}")
    for i in range(0, len(grid), max(1, len(grid) // 12)):
        print(f"{grid[i]:9.3g} " + " ".join(f"{values[c][i]:14.8f}" for c in CURVES)
              + f" {small_curvature_limit(grid[i]):14.8f}")
    found = {}
    for curve in CURVES:
        best = optimize.minimize_scalar(lambda k, c=curve: expected_shift_distance(k, 1.0, c), bounds=(0.1, 10),
                                        method="bounded", options={"xatol": 1e-6})
        remainder = (expected_shift_distance(0.05, 1.0, curve) - small_curvature_limit(0.05)) / 0.05 ** 4
        print(f"{curve}: minimum E/r = {best.fun:.6f} at κr = {best.x:.4f} (2/π = {2 / math.pi:.6f}); "
              f"κr → ∞: {values[curve][-1]:.4f}; (E − limit)/(κr)⁴ at κr = 0.05: {remainder:+.5f}")
        found.update({f"{curve}_min": float(best.fun), f"{curve}_argmin": float(best.x),
                      f"{curve}_remainder4": remainder, f"{curve}_at_100": values[curve][-1]})
    tokens(**found)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for curve in CURVES:
        ax.plot(grid, values[curve], label=f"{curve} (quadrature)")
    ax.plot(grid, [small_curvature_limit(k) for k in grid], "k:", label="2/π − (κr)²/(12π)")
    ax.axhline(2 / math.pi, color="grey", linewidth=0.5)
    ax.set_xscale("log")
    ax.set_ylim(0.5, 1.02)
    ax.set_xlabel("κ r")
    ax.set_ylabel("expected distance / r")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "curvature_intuition.png", dpi=100)


if __name__ == "__main__":
    main()
