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
from symalg.applications.teleport import ARMIJO, FunctionAction, GradNorm, NextStep, Teleporter, as_action, teleport
from symalg.applications.teleport_optim import TRAINING_RADIUS, TeleportingOptimizer, model_loss

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


# ---------------------------------------------------------------------------------------------
# safeguards of teleports during training: the trust region and the next-step test
# ---------------------------------------------------------------------------------------------
def test_next_step_test_on_a_quadratic_is_its_closed_form():
    # L = ½ xᵀAx: g = Ax, H = A, and the model is exact: predicted = actual = lr gᵀg − lr²/2 gᵀAg
    A = torch.diag(torch.tensor([1.0, 30.0]))

    def loss(p):
        return 0.5 * p["x"] @ A @ p["x"]

    for x, lr, passed in (((1.0, 0.0), 0.1, True), ((0.0, 1.0), 0.1, False), ((0.0, 1.0), 1 / 30, True),
                          ((0.0, 1.0), 1.5 / 30, False), ((1.0, 1.0), 0.01, True)):
        x = torch.tensor(x)
        g = A @ x
        test = NextStep(lr).test({"x": x}, loss, ["x"])
        predicted = lr * float(g @ g) - lr ** 2 / 2 * float(g @ A @ g)
        assert test.slope == pytest.approx(float(g @ g)) and test.predicted == pytest.approx(predicted, rel=1e-12)
        assert test.actual == pytest.approx(predicted, rel=1e-9)
        assert test.sharpness == pytest.approx(lr * float(g @ A @ g) / float(g @ g), rel=1e-12)
        assert test.passed == passed, (x, lr)           # lr·κ = 0.1, 3, 1, 1.5, ≈ 0.3
    with pytest.raises(ValueError, match="lr must be a finite positive number"):
        NextStep(0.0)
    with pytest.raises(ValueError, match="agreement must be in"):
        NextStep(0.1, agreement=2.0)


def test_next_step_test_fails_where_the_quadratic_model_does_not_hold():
    # L = x²/2 + (x − 1)⁴ at x = 1: g = 1, κ = 1 (the quartic's first three derivatives vanish there). At lr 0.9 the
    # curvature test passes (lr·κ = 0.9), the model predicts a decrease of 0.9 − 0.405 = 0.495, but the quartic adds
    # 0.9⁴ = 0.656 over the step: the loss rises, and the ratio test rejects it; at lr 0.3 the model holds
    def loss(p):
        return (p["x"] ** 2 / 2 + (p["x"] - 1) ** 4).sum()

    params = {"x": torch.tensor([1.0])}
    long, short = NextStep(0.9).test(params, loss, ["x"]), NextStep(0.3).test(params, loss, ["x"])
    assert long.sharpness == pytest.approx(0.9) and long.predicted == pytest.approx(0.495)
    assert long.actual == pytest.approx(0.5 - (0.1 ** 2 / 2 + 0.9 ** 4)) and not long.passed
    assert short.actual == pytest.approx(0.5 - (0.7 ** 2 / 2 + 0.3 ** 4)) and short.passed


def test_the_trust_region_bounds_the_path_of_the_teleport():
    action, params, loss = mlp_problem(1.0)
    free = teleport(action, params, loss)
    bounded = teleport(action, params, loss, radius=1.5)
    path = sum(float(m.coords.norm()) for m in bounded.moves)
    assert sum(float(m.coords.norm()) for m in free.moves) > 5 and path <= 1.5 + 1e-12
    assert bounded.accepted and "trust region (radius 1.5)" in bounded.reason
    assert free.objective_after > bounded.objective_after > bounded.objective_before
    with pytest.raises(ValueError, match="radius must be a finite positive number"):
        Teleporter(action, radius=0.0)


def test_a_teleport_with_a_next_step_returns_the_best_iterate_where_that_step_is_stable():
    action, params, loss = mlp_problem(1.0)
    step = NextStep(lr=0.1)                 # stable at the start and after the first step only
    free = teleport(action, params, loss)
    checked = teleport(action, params, loss, next_step=step)
    assert checked.accepted and checked.next_step.passed and checked.best < free.best
    assert "failed the next-step check" in checked.reason
    assert not step.test(free.params, loss, list(free.params)).passed              # the unchecked result is not
    assert step.test(checked.params, loss, list(params)).passed
    # every iterate better than the chosen one fails the test (replayed from the moves of the free ascent)
    for count in range(len(checked.moves) + 1, len(free.moves) + 1):
        point = action.replay(params, free.moves[:count])
        assert not step.test(point, loss, list(params)).passed
    strict = teleport(action, params, loss, next_step=NextStep(lr=50.0))      # no iterate, not even the start
    assert not strict.accepted and "no improving iterate passed the next-step check" in strict.reason


def train_digits(seed, mode, epochs=12):
    """Validation accuracy and loss after SGD (lr 0.05) on digits, with one default GradNorm teleport after epoch 1:
    ``mode`` "none", "guarded" (the defaults) or "unguarded" (``radius=None, check=False``)."""
    import sys
    sys.path.insert(0, "benchmarks")
    from bench_teleport import train
    return train(seed, mode, epochs=epochs)


def test_default_teleports_during_training_keep_it_stable_over_seeds():
    # Unguarded, the default GradNorm teleport raises ‖∇L‖ by three orders of magnitude and SGD diverges; with the
    # trust region and the next-step test the teleport is accepted, ‖∇L‖ grows by at most e², and every seed ends in
    # the accuracy band of training without teleports
    unguarded = train_digits(0, "unguarded")
    assert unguarded["accepted"] and unguarded["grad_after"] > 100 * unguarded["grad_before"]
    assert not math.isfinite(unguarded["loss"]) and unguarded["accuracy"] < 0.2
    plain, guarded = [], []
    for seed in range(4):
        none, safe = train_digits(seed, "none"), train_digits(seed, "guarded")
        assert safe["accepted"] and safe["grad_before"] < safe["grad_after"] <= math.e ** 2 * safe["grad_before"]
        assert math.isfinite(safe["loss"]) and safe["accuracy"] > none["accuracy"] - 0.1
        plain.append(none["accuracy"])
        guarded.append(safe["accuracy"])
    assert abs(sum(guarded) / 4 - sum(plain) / 4) < 0.03 and min(plain) > 0.8


def test_teleporting_optimizer_guards_the_teleporter_unless_told_not_to():
    model = nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2))
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    action = as_action(symalg.derive(symalg.trace(model, (x,))))
    sgd = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1}, {"params": model[2].parameters(), "lr": 0.4}])

    def make(**guard):
        return TeleportingOptimizer(sgd, model, Teleporter(action), model_loss(model, F.mse_loss), lambda: (x, y),
                                    **guard)

    guarded = make().guarded(Teleporter(action))
    assert guarded.radius == TRAINING_RADIUS and guarded.next_step.lr == 0.4
    grads = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    assert float(guarded.next_step.metric(grads)["0.weight"][0, 0]) == pytest.approx(0.25)   # group rate / 0.4
    assert make().guarded(Teleporter(action, radius=0.3)).radius == 0.3                        # a smaller one is kept
    own = NextStep(lr=1e-3)
    assert make().guarded(Teleporter(action, next_step=own)).next_step is own
    bare = Teleporter(action)
    assert make(radius=None, check=False).guarded(bare) is bare
    with pytest.raises(ValueError, match="radius must be a finite positive number or None"):
        make(radius=-1.0)
