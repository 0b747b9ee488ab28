"""Progress of a default teleport at objective scales 1e3, 1 and 1e-6 (a script, not a test).

Two problems, each with its loss scaled so that ``‖∇L‖`` at the start is the scale shown:

* ``quadratic``  ``f = 9x₁² + x₂²`` from ``(0.1, 1)`` with its conjugated ``O(2)`` action; on the level set
  ``‖∇f‖² ∈ [4ℓ, 36ℓ]`` (closed form), so ``ratio`` is the objective over ``36ℓ`` (start 0.185);
* ``mlp``        ``Linear(3, 5) → ReLU → Linear(5, 4) → Identity → Linear(4, 2)`` (seed 0, 16 samples) with every
  derived symmetry (``PositiveScaling(5)``, ``S(5)``, ``GL(4)``); ``gain`` is the objective's factor.

For each, ``teleport(action, params, loss)`` with the defaults (scale-free step, line search, best iterate) and
with the fixed rate ``lr=0.1`` (the former default; ``last`` is its last iterate, which is what it returned before
the best iterate was). Objective ``GradNorm`` (``‖∇L‖²``), float64, one thread.
Run: ``python benchmarks/bench_teleport_defaults.py``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.applications.conjugated import quadratic_form
from symalg.applications.teleport import as_action, teleport

SCALES = (1e3, 1.0, 1e-6)


def quadratic(gradient_norm):
    """``(action, params, loss, reference)``: ``k f`` with ``‖∇(k f)(x₀)‖ = gradient_norm``, reference ``36ℓk²``."""
    fn = quadratic_form([[9, 0], [0, 1]])
    x0 = torch.tensor([0.1, 1.0])
    k = gradient_norm / math.sqrt(4 * (0.9 ** 2 + 1.0))
    return as_action(fn), {"x": x0}, (lambda p: k * fn.loss(p["x"])), 36 * 1.09 * k * k


def mlp(gradient_norm):
    """``(action, params, loss, reference)``: the MLP with its loss scaled to ``‖∇L‖ = gradient_norm``; reference
    the starting objective."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.Identity(), nn.Linear(4, 2))
    x, y = torch.randn(16, 3), torch.randn(16, 2)
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(F.mse_loss(model(x), y), list(params.values()))
    k = gradient_norm / float(torch.cat([g.reshape(-1) for g in grads]).norm())

    def loss(p):
        return k * F.mse_loss(torch.func.functional_call(model, p, (x,)), y)

    return as_action(symalg.derive(symalg.trace(model, (x,)))), params, loss, gradient_norm ** 2


def figures(quick: bool = False) -> dict:
    """Objective before and after a default teleport and one at ``lr=0.1``, per problem and scale (``quick``: scale 1
    only)."""
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    rows = []
    for name, problem in (("quadratic", quadratic), ("mlp", mlp)):
        for scale in (1.0,) if quick else SCALES:
            action, params, loss, reference = problem(scale)
            fixed, default = teleport(action, params, loss, lr=0.1), teleport(action, params, loss)
            rows.append({"problem": name, "gradient_norm": scale, "objective_before": default.objective_before,
                         "fixed_last_ratio": fixed.history[-1] / reference,
                         "fixed_best_ratio": max(fixed.history) / reference,
                         "default_ratio": default.objective_after / reference, "accepted": bool(default.accepted)})
    torch.set_default_dtype(torch.float32)
    return {"rows": rows}


def main() -> None:
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    print(f"{'problem':9} {'|grad|':>6} {'F start':>9} | {'lr=0.1: last':>12} {'best':>9} {'ratio last':>10} "
          f"{'ratio best':>10} | {'default':>9} {'ratio':>9} {'accepted':>8} {'max |dL|/L':>10}")
    for name, problem in (("quadratic", quadratic), ("mlp", mlp)):
        for scale in SCALES:
            action, params, loss, reference = problem(scale)
            fixed = teleport(action, params, loss, lr=0.1)
            default = teleport(action, params, loss)
            change = max(abs(v / r.loss_before - 1) for r in (fixed, default) for v in r.losses)
            last, best = fixed.history[-1], max(fixed.history)
            print(f"{name:9} {scale:6.0e} {default.objective_before:9.3g} | {last:12.3g} {best:9.3g} "
                  f"{last / reference:10.3g} {best / reference:10.3g} | {default.objective_after:9.3g} "
                  f"{default.objective_after / reference:9.3g} {str(default.accepted):>8} {change:10.1e}")


if __name__ == "__main__":
    main()
