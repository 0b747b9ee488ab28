"""Teleport defaults: the scale-free step, the line search, the best iterate and the acceptance rule.

The reference problem has a closed form: on the level set ``ℓ`` of ``f(x) = xᵀAx``, ``A = diag(9, 1)``, the gradient
norm ``‖∇f‖² = 4‖Ax‖²`` ranges over ``[4ℓ, 36ℓ]`` and the conjugated ``O(2)`` action is transitive on the level set,
so the orbit of ``x₀ = (0.1, 1)`` (``ℓ = 1.09``) contains a point with ``‖∇f‖² = 36ℓ``, 5.4 times its start.
Multiplying ``f`` by ``k`` multiplies ``‖∇f‖²`` by ``k²`` and keeps the orbit.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.applications.conjugated import quadratic_form
from symalg.applications.teleport import ARMIJO, FunctionAction, GradNorm, Teleporter, as_action, teleport

FN = quadratic_form([[9, 0], [0, 1]])
X0 = torch.tensor([0.1, 1.0], dtype=torch.float64)
LEVEL = 0.01 * 9 + 1.0
GRAD_NORM = math.sqrt(4 * (0.9 ** 2 + 1.0))          # ‖∇f(x₀)‖ = ‖2Ax₀‖


pytestmark = pytest.mark.usefixtures("one_thread")


def quadratic(gradient_norm):
    """``(action, params, loss, orbit maximum)`` for ``k f`` with ``‖∇(k f)(x₀)‖ = gradient_norm``."""
    k = gradient_norm / GRAD_NORM
    return as_action(FN), {"x": X0}, (lambda p: k * FN.loss(p["x"])), 36 * LEVEL * k * k


def mlp_problem(gradient_norm):
    """A ReLU MLP with a linear hidden site (``PositiveScaling(5)``, ``S(5)``, ``GL(4)``), its loss scaled so that
    ``‖∇L‖ = gradient_norm`` at the start."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.Identity(), nn.Linear(4, 2)).double()
    x, y = torch.randn(16, 3), torch.randn(16, 2)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(F.mse_loss(model(x), y), list(params.values()))
    k = gradient_norm / float(torch.cat([g.reshape(-1) for g in grads]).norm())

    def loss(p):
        return k * F.mse_loss(torch.func.functional_call(model, p, (x,)), y)

    return as_action(analysis), params, loss


def coordinate_gradient(action, params, loss):
    """``∇_c F`` of the gradient-norm objective ``F`` at ``params`` (the ascent direction of a step)."""
    z = torch.zeros(action.dim, requires_grad=True)
    (grad,) = torch.autograd.grad(GradNorm()(action(params, z), loss, action, ["x"]), z)
    return grad


SCALES = [1e3, 1.0, 1e-6]


@pytest.mark.parametrize("gradient_norm", SCALES)
def test_default_teleport_reaches_the_orbit_maximum_at_every_scale(gradient_norm):
    action, params, loss, maximum = quadratic(gradient_norm)
    result = teleport(action, params, loss)
    assert result.objective_before / maximum == pytest.approx(4 * (0.81 + 1) / (36 * LEVEL), rel=1e-12)   # 0.185
    assert result.accepted and result.reason == ""
    assert result.objective_after / maximum > 1 - 1e-6                # a 5.4-fold gain, to the closed form
    assert result.relative_loss_change <= 1e-8                         # the float64 default tolerance
    assert float(loss(result.params)) == pytest.approx(result.loss_before, rel=1e-12)


def test_default_iterates_do_not_depend_on_the_scale_of_the_objective():
    # The normalised step Δ = max_step ∇_c F/‖∇_c F‖ and the Armijo test are invariant under F ↦ k²F: the same
    # group element at gradient norms 1e3, 1 and 1e-6, on a non-compact orbit (GL(4) × scalings).
    results = []
    for gradient_norm in SCALES:
        action, params, loss = mlp_problem(gradient_norm)
        result = teleport(action, params, loss)
        assert result.accepted and result.steps == 10 and result.relative_loss_change <= 1e-8
        assert result.objective_before == pytest.approx(gradient_norm ** 2, rel=1e-12)
        results.append(result)
    reference = torch.cat(results[1].coordinates)
    for result in results:
        assert result.objective_after / result.objective_before > 1e3
        assert result.objective_after / result.objective_before == pytest.approx(
            results[1].objective_after / results[1].objective_before, rel=1e-6)
        assert torch.allclose(torch.cat(result.coordinates), reference, rtol=1e-8, atol=1e-10)


def test_the_old_fixed_rate_oscillates_and_returns_its_best_iterate():
    # The former default, lr = 0.1 with ‖Δ‖ ≤ 1, at ‖∇f‖ = 1e3: lr ∇_c F is ~1e5, so every step is the clipped
    # ‖Δ‖ = 1 and the angle jumps between two points of the orbit; the last iterate is the worse one.
    action, params, loss, maximum = quadratic(1e3)
    result = teleport(action, params, loss, lr=0.1)
    ratios = [h / maximum for h in result.history]
    assert result.steps == 10 and all(float(m.coords.norm()) == pytest.approx(1.0) for m in result.moves)
    assert ratios[1::2] == pytest.approx([ratios[1]] * 5, rel=1e-9)
    assert ratios[2::2] == pytest.approx([ratios[2]] * 5, rel=1e-9)
    assert ratios[-1] < ratios[1] - 0.3                                # oscillating, ending on the worse point
    assert result.accepted and result.best == 1 and result.objective_after == max(result.history)
    assert len(result.moves) == 1 and torch.equal(action.replay(params, result.moves)["x"], result.params["x"])


def test_the_old_fixed_rate_does_not_move_a_small_objective_and_is_rejected():
    # At ‖∇f‖ = 1e-6 the same lr gives steps of ~1e-13 rad: the objective does not change, which is now a rejection.
    action, params, loss, _ = quadratic(1e-6)
    result = teleport(action, params, loss, lr=0.1)
    assert result.steps == 10 and max(result.history) / result.objective_before - 1 < 1e-9
    assert not result.accepted and "min_gain" in result.reason and result.params["x"] is params["x"]
    assert result.objective_after == result.objective_before and result.moves == ()


@pytest.mark.parametrize("maximize", [True, False], ids=["max", "min"])
def test_line_search_iterates_improve_monotonically_and_the_best_is_returned(maximize):
    action, params, loss, _ = quadratic(1.0)
    sign = 1 if maximize else -1
    result = teleport(action, params, loss, steps=40, maximize=maximize)
    gains = [sign * (b - a) for a, b in zip(result.history, result.history[1:])]
    for k, (gain, move) in enumerate(zip(gains, result.moves)):       # the Armijo condition at every step
        at = action.replay(params, result.moves[:k])
        assert gain >= ARMIJO * float(move.coords.norm()) * float(coordinate_gradient(action, at, loss).norm())
    assert result.best == len(result.history) - 1 and result.objective_after == result.history[-1]
    assert result.steps < 40 and result.reason.startswith("converged after")       # stopped by the line search
    closed_form = (36 if maximize else 4) * LEVEL * (1 / GRAD_NORM) ** 2
    assert result.accepted and result.objective_after / closed_form == pytest.approx(1, abs=1e-9)


def test_best_iterate_among_those_that_kept_the_loss_never_worse_than_the_start():
    # Whatever the trajectory, the result is the best iterate, and the moves replay to it exactly. Minimising with
    # the fixed rate oscillates between the start and a worse point (gains of 1e-15 from rounding): rejected.
    action, params, loss, _ = quadratic(1e3)
    for settings, accepted in ((dict(lr=0.1), True), (dict(lr=0.1, maximize=False), False),
                               (dict(lr=10.0, steps=7, max_step=0.3), True), ({}, True), (dict(maximize=False), True)):
        result = teleport(action, params, loss, **settings)
        sign = -1 if settings.get("maximize") is False else 1
        best = (max if sign > 0 else min)(result.history)
        assert result.accepted == accepted
        assert result.objective_after == (best if accepted else result.objective_before)
        assert (sign * (best - result.objective_before) >= 1e-6 * result.objective_before) == accepted   # min_gain
        assert result.history[result.best] == result.objective_after
        assert torch.allclose(action.replay(params, result.moves)["x"], result.params["x"], rtol=1e-12, atol=0)


def test_explicit_step_settings_are_honoured_exactly():
    action, params, loss, _ = quadratic(1.0)
    gradient = coordinate_gradient(action, params, loss)
    # a fixed rate: Δ₁ = lr ∇_c F (unclipped with max_step=None), every step taken, no line search
    fixed = Teleporter(action, lr=0.3, max_step=None, steps=4)
    assert fixed.halvings == 0
    result = fixed(params, loss)
    assert result.steps == 4 and len(result.history) == 5 and len(result.losses) == 5
    first = teleport(action, params, loss, lr=0.3, max_step=None, steps=1)
    assert torch.allclose(first.moves[0].coords, 0.3 * gradient, rtol=1e-12, atol=0)
    clipped = teleport(action, params, loss, lr=0.3, max_step=0.05, steps=1)
    assert float(clipped.moves[0].coords.norm()) == pytest.approx(0.05, rel=1e-12)
    # the normalised step without a line search: every step has length max_step exactly
    normalised = teleport(action, params, loss, backtrack=0, max_step=0.25, steps=3)
    assert normalised.steps == 3 and [float(v) for v in normalised.history] == sorted(normalised.history)
    assert all(float(m.coords.norm()) == pytest.approx(0.25, rel=1e-12) for m in normalised.moves)
    assert Teleporter(action).halvings == 30 and Teleporter(action, backtrack=3).halvings == 3
    # min_gain: a 5.4-fold gain is rejected when a 10-fold one is asked for
    strict = teleport(action, params, loss, min_gain=9.0)
    assert not strict.accepted and "min_gain 9.0e+00" in strict.reason and strict.params["x"] is params["x"]
    assert teleport(action, params, loss, min_gain=4.0).accepted


@pytest.mark.parametrize("setting, value, message", [
    ("lr", -0.1, "lr must be None"), ("lr", math.nan, "lr must be None"), ("lr", "0.1", "lr must be None"),
    ("max_step", 0.0, "max_step must be"), ("max_step", math.inf, "max_step must be"), ("steps", 2.5, "steps must be"),
    ("backtrack", -1, "backtrack must be"),
    ("min_gain", -1e-3, "min_gain must be"), ("min_gain", math.inf, "min_gain must be"),
])
def test_bad_step_settings_name_the_argument(setting, value, message):
    with pytest.raises(ValueError, match=message):
        Teleporter(as_action(FN), **{setting: value})


def test_a_normalised_step_needs_its_length():
    with pytest.raises(ValueError, match="lr=None takes the step length from max_step"):
        Teleporter(as_action(FN), max_step=None)
    assert Teleporter(as_action(FN), lr=0.1, max_step=None).max_step is None      # a fixed rate needs none


def test_the_line_search_takes_no_step_that_breaks_the_loss():
    # x ↦ eᶜx is no symmetry of f: the line search halves every step until its loss change is within the tolerance
    # (1e-8), so the iterates creep along the level set's normal and gain ~1e-8 of the objective: below min_gain,
    # rejected. The fixed rate takes its steps and finds none of them kept the loss.
    action, params, loss, _ = quadratic(1.0)
    scale = FunctionAction(lambda p, c: {"x": p["x"] * torch.exp(c[0])}, 1)
    searched = teleport(scale, params, loss)
    changes = [abs(v / searched.loss_before - 1) for v in searched.losses]
    assert searched.steps == 10 and 0 < max(changes) <= 1e-8
    assert not searched.accepted and "< min_gain 1.0e-06" in searched.reason and searched.params["x"] is params["x"]
    fixed = teleport(scale, params, loss, lr=0.1, steps=3)
    assert not fixed.accepted and fixed.steps == 3 and "> tolerance 1.0e-08" in fixed.reason
