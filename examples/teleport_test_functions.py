"""Gradient descent with and without symmetry teleportation on quadratic forms, Booth and Rosenbrock.

[Zhao2026] Sec. 4.6.1 (Fig. 4.3/4.4): each test function ``f = ‖h(x)‖²`` has the conjugated ``O(n)`` action
``g·x = h⁻¹(g h(x))`` (``symalg.applications.conjugated``), transitive on level sets. Every ``--every`` GD steps
the point is teleported to maximise ``‖∇f‖²`` on its level set (``symalg.applications.teleport.teleport``, ``GradNorm``,
default step).

Closed form of the objective on the level set (parametrisation ``f(x) = (x − c)ᵀA(x − c)`` of
``symalg.applications.conjugated.quadratic_form``; Booth is ``A = BᵀB``, ``B = [[1, 2], [2, 1]]``, eigenvalues 9 and 1):
``‖∇f‖² = 4‖A(x − c)‖²`` ranges over ``[4λ_min ℓ, 4λ_max ℓ]`` on ``{f = ℓ}`` (Lagrange: ``A²u = μAu`` gives
eigenvectors, value ``4μℓ``). Every teleport's result is divided by ``4λ_max ℓ`` at its own level ``ℓ``.
Rosenbrock has no closed form: the reference is the maximum of a dense scan of the whole orbit
(``h⁻¹`` of a circle, 20001 angles in ``[−π, π]``), so the ratio says whether a global maximum was reached.

Prints a table and ``key=value`` tokens; saves ``teleport_test_functions.png`` (loss vs step and vs time).
Run: ``python examples/teleport_test_functions.py [--quick] [--out DIR]``.
"""
from __future__ import annotations

import math
import time

import matplotlib
import torch

from symalg.applications.conjugated import booth, quadratic_form, rosenbrock
from symalg.applications.teleport import as_action, teleport
from teleport_common import parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


MAXIMISING = dict(steps=200)
"""Teleport settings that converge to the maximum: up to 200 ascent steps of the default scale-free step (normalised,
with a line search; the objective's scale, which grows with the level, does not matter)."""

DISSERTATION_ROSENBROCK = dict(steps=10, lr=0.1)
"""Sec. 4.6.1's Rosenbrock teleport: 10 ascent steps on the angle with learning rate 0.1 (every step taken, each
clipped to ‖Δ‖ ≤ 1); the teleport returns the best of the 10 iterates."""


def problems(quick: bool):
    """(name, test function, start, GD lr, GD steps, teleport steps, teleport settings, closed-form ``ℓ ↦ max``).

    Booth and Rosenbrock follow Sec. 4.6.1: Booth from (5, −5), 10 steps of lr 0.08, one teleport before step 5;
    Rosenbrock from (−1, −1), lr 1e-3, 1000 steps, a teleport every 100 steps."""
    A = torch.tensor([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]])
    lam_max = float(torch.linalg.eigvalsh(A)[-1])
    rosenbrock_steps = 300 if quick else 1000
    return [
        ("quadratic3", quadratic_form(A.tolist(), center=[1.0, -1.0, 0.5]), torch.tensor([0.3, 0.2, -1.0]), 0.1,
         60, range(0, 30, 10), MAXIMISING, lambda level: 4 * lam_max * level),
        ("quadratic5", quadratic_form(torch.diag(torch.tensor([10.0, 4.0, 2.0, 1.0, 0.5])).tolist()),
         torch.ones(5), 0.04, 60, (0,), MAXIMISING, lambda level: 4 * 10.0 * level),
        ("booth", booth(), torch.tensor([5.0, -5.0]), 0.08, 10, (5,), MAXIMISING, lambda level: 4 * 9.0 * level),
        ("rosenbrock", rosenbrock(), torch.tensor([-1.0, -1.0]), 1e-3, rosenbrock_steps,
         range(0, rosenbrock_steps, 100), DISSERTATION_ROSENBROCK, None),
    ]


def orbit_scan_max(fn, x: torch.Tensor, points: int = 20001) -> float:
    """Largest ``‖∇f‖²`` over the orbit of ``x`` under the one-parameter ``SO(2)`` (2-D functions only)."""
    angles = torch.linspace(-math.pi, math.pi, points)[:, None]
    moved = fn.action.act(x.expand(points, 2), angles)
    return float((torch.func.vmap(torch.func.grad(fn.loss))(moved) ** 2).sum(-1).max())


def descend(fn, x0, lr, steps, at, settings, closed_form):
    """GD for ``steps`` steps, teleporting before the steps in ``at``; returns the loss after each step, cumulative
    wall-clock seconds (the reference scans excluded), and per teleport ``(ratio to the optimum after, relative ΔL,
    ratio before)``."""
    action, grad = as_action(fn), torch.func.grad(fn.loss)
    x, losses, times, teleports = x0.clone(), [float(fn.loss(x0))], [0.0], []
    grad(x0), action({"x": x0}, torch.zeros(action.dim))  # warm-up: the first calls lower SymPy to torch
    start, reference_seconds = time.perf_counter(), 0.0
    for step in range(steps):
        if step in at and losses[-1] > 1e-12:
            r = teleport(action, {"x": x}, lambda p: fn.loss(p["x"]), **settings)
            scan_start = time.perf_counter()
            best = closed_form(r.loss_before) if closed_form else orbit_scan_max(fn, x)
            reference_seconds += time.perf_counter() - scan_start
            teleports.append((r.objective_after / best, r.relative_loss_change, r.objective_before / best))
            x = r.params["x"].detach()
        x = x - lr * grad(x)
        losses.append(float(fn.loss(x)))
        times.append(time.perf_counter() - start - reference_seconds)
    return losses, times, teleports


def plottable(losses):
    """Losses for a log axis: floored at 1e-300, and a gap (NaN) where GD diverged (above 1e100, inf or NaN)."""
    return [max(v, 1e-300) if v < 1e100 else math.nan for v in losses]


def first_below(losses, threshold):
    return next((i for i, v in enumerate(losses) if v < threshold), None)


def main() -> None:
    args = parse_args(__doc__)
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    print("GD ± teleport (GradNorm). ratio = ‖∇f‖² after a teleport / its maximum on the level set (closed form; "
          "Rosenbrock: orbit scan)")
    print(f"{'function':11} {'lr':>6} {'steps':>5} {'L0':>9} {'L_gd':>10} {'L_tel':>10} {'steps gd':>8} "
          f"{'steps tel':>9} "
          f"{'t_gd s':>7} {'t_tel s':>7} {'ratio 1st':>10} {'min ratio':>10} {'max |dL|/L':>10}")
    for col, (name, fn, x0, lr, steps, at, settings, closed_form) in enumerate(problems(args.quick)):
        plain, t_plain, _ = descend(fn, x0, lr, steps, (), settings, closed_form)
        tele, t_tele, teleports = descend(fn, x0, lr, steps, set(at), settings, closed_form)
        threshold = 1e-6 * plain[0]
        n_plain, n_tele = first_below(plain, threshold), first_below(tele, threshold)
        ratios = [r for r, _, _ in teleports]
        worst_change = max(c for _, c, _ in teleports)
        print(f"{name:11} {lr:6.0e} {steps:5d} {plain[0]:9.3g} {plain[-1]:10.3e} {tele[-1]:10.3e} {str(n_plain):>8} "
              f"{str(n_tele):>9} {t_plain[-1]:7.3f} {t_tele[-1]:7.3f} {ratios[0]:10.6f} {min(ratios):10.6f} "
              f"{worst_change:10.1e}")
        tokens(**{f"{name}_first_ratio": ratios[0], f"{name}_min_ratio": min(ratios),
                  f"{name}_start_ratio": teleports[0][2], f"{name}_max_rel_loss_change": worst_change,
                  f"{name}_teleports": len(teleports), f"{name}_final_loss_gd": plain[-1],
                  f"{name}_final_loss_teleport": tele[-1], f"{name}_steps_gd": n_plain if n_plain is not None else -1,
                  f"{name}_steps_teleport": n_tele if n_tele is not None else -1,
                  f"{name}_time_gd": t_plain[-1], f"{name}_time_teleport": t_tele[-1]})
        for ax, xs_plain, xs_tele, label in ((axes[0, col], range(len(plain)), range(len(tele)), "GD step"),
                                             (axes[1, col], t_plain, t_tele, "wall-clock s")):
            ax.semilogy(list(xs_plain), plottable(plain), label="GD")
            ax.semilogy(list(xs_tele), plottable(tele), label="GD + teleport")
            ax.set_xlabel(label)
            ax.set_title(name)
        axes[0, col].legend()
    # Rosenbrock's orbit has several local maxima of ‖∇f‖²: a converged ascent from (−1, −1) vs the global one.
    fn, x0 = rosenbrock(), torch.tensor([-1.0, -1.0])
    r = teleport(as_action(fn), {"x": x0}, lambda p: fn.loss(p["x"]), **MAXIMISING)
    print(f"rosenbrock, converged ascent from (−1, −1): ‖∇f‖² {r.objective_before:.4g} → {r.objective_after:.4g}, "
          f"orbit maximum {orbit_scan_max(fn, x0):.4g}")
    tokens(rosenbrock_converged_ratio=r.objective_after / orbit_scan_max(fn, x0),
           rosenbrock_converged_rel_loss_change=r.relative_loss_change)
    axes[0, 0].set_ylabel("loss")
    axes[1, 0].set_ylabel("loss")
    fig.tight_layout()
    fig.savefig(args.out / "teleport_test_functions.png", dpi=100)


if __name__ == "__main__":
    main()
