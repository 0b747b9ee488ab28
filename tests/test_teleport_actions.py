"""Teleportation actions for bijective activations ([Zhao2026] eqs. 4.13, 4.16) and measure_action.

Derived conditions (module docstring of symalg.teleport_actions), checked here by measurement:
eq. 4.16 keeps the loss iff σ(gA) has rank k (batch ≤ width d_s) and has the unit axiom iff σ(A) has
rank d_s; eq. 4.13 keeps the loss iff its input h has rank k (batch ≤ input width d) and has the unit
axiom iff h has rank d. The widths below differ (d = 8 + 1 with the bias, d_s = 7) so that the two
conditions can be told apart; the data are 10-dimensional so that every rank is the largest possible.
"""
import itertools
import math

import pytest
import torch
from torch import nn

from symalg.applications.nonlinear_actions import DataDependentAction, random_gl
from symalg.numeric.feedforward import FeedForward
from symalg.applications.teleport_actions import (ApproximateTeleport, BijectiveActivation, ExactTeleport, as_bijective,
                                     extended_tanh, leaky_relu, measure_action)

TOL = 1e-10
WIDTHS = (10, 8, 7, 2)
D_IN, D_SITE = 9, 7  # site 1: input width 8 (+1 for the bias), output width 7
SEEDS = range(12)


def network(seed, activation=None, widths=WIDTHS):
    torch.manual_seed(seed)
    act = activation or leaky_relu(0.1)
    n0, n1, n2, n3 = widths
    model = nn.Sequential(nn.Linear(n0, n1), act, nn.Linear(n1, n2), act, nn.Linear(n2, n3))  # act reused on purpose
    net = FeedForward.of(model)
    return net, {k: p.detach() for k, p in model.named_parameters()}


def measure(action, net, params, k, seed, scale=0.5):
    gen = torch.Generator().manual_seed(1000 + seed)
    n, width = params[net.weights[0]].shape[1], params[net.weights[action.site]].shape[0]
    x, y = torch.randn(k, n, generator=gen), torch.randn(k, 2, generator=gen)
    g1, g2 = (random_gl(width, scale=scale, generator=gen) for _ in range(2))

    def loss(p):
        return ((net.forward(p, x) - y) ** 2).mean()

    return measure_action(action, params, x, g1, g2, loss=loss, forward=net.forward), action.conditions(params, x, g1)


# ------------------------------------------------------------------------------------------- activations

def test_bijective_activations_invert():
    t = torch.linspace(-6, 6, 241)
    for act in (leaky_relu(0.1), leaky_relu(2.0), extended_tanh(5.0), extended_tanh(10.0), as_bijective(nn.Identity())):
        assert (act.inverse(act(t)) - t).abs().max() < 1e-11, act.name
        assert (act(act.inverse(t)) - t).abs().max() < 1e-11, act.name
        assert (act(t).diff() > 0).all(), act.name  # strictly increasing


def test_extended_tanh_is_close_to_tanh_and_the_printed_formula_is_not():
    """[Zhao2026]'s tanh(x) + e^{x−N} − e^{−x+N} equals tanh(x) − 2 sinh(N − x): −e^N-sized at x = 0."""
    n, t = 10.0, torch.linspace(-3, 3, 61)
    assert (extended_tanh(n)(t) - torch.tanh(t)).abs().max() < 2 * math.exp(-n) * math.sinh(3) * 1.0001
    printed = torch.tanh(t) + torch.exp(t - n) - torch.exp(-t + n)
    assert (printed - torch.tanh(t)).abs().min() > 1e2


def test_as_bijective_and_slope_errors():
    assert as_bijective(nn.LeakyReLU(0.2)).name == "leaky_relu(0.2)"
    view = FeedForward.of("linear(2, 3) -> leaky_relu(slope=0.2) -> linear(3, 3) -> linear(3, 1)")
    sigma, identity = (as_bijective(a) for a in view.activations)  # read off the catalogue op and its slope
    y = torch.tensor([-1.0, 0.5])
    assert sigma.name == "leaky_relu(0.2)" and torch.allclose(sigma.inverse(y), torch.tensor([-5.0, 0.5]))
    assert identity.name == "identity" and torch.equal(identity.inverse(y), y)
    with pytest.raises(TypeError, match="has no known inverse"):
        as_bijective(nn.Tanh())
    with pytest.raises(ValueError, match="slope 0 must be > 0"):
        leaky_relu(0)


# ------------------------------------------------------------------------------------- eq. 4.16 (approx.)

@pytest.mark.parametrize("k", [1, 3, 5, D_SITE])
def test_approximate_action_is_exact_when_batch_at_most_width(k):
    for seed in SEEDS:
        net, params = network(seed)
        m, cond = measure(ApproximateTeleport(net, 1), net, params, k, seed)
        assert cond.loss_preserving and cond.composition_axiom and cond.width == D_SITE
        assert m.relative_loss_change < TOL and m.output_change < TOL and m.composition_error < TOL, str(m)


@pytest.mark.parametrize("k", [D_SITE + 1, 2 * D_SITE])
def test_approximate_action_error_is_measured_above_the_width(k):
    """Above the width the loss moves; the new last layer is still the least-squares best possible U'."""
    changes = []
    for seed in SEEDS:
        net, params = network(seed)
        action = ApproximateTeleport(net, 1)
        m, cond = measure(action, net, params, k, seed)
        assert not cond.loss_preserving and not cond.composition_axiom and "here rank σ(gA) = 7" in cond.reason
        assert m.output_change > 1e-6 and m.composition_error > 1e-6, str(m)
        changes.append(m.relative_loss_change)
        gen = torch.Generator().manual_seed(1000 + seed)
        x = torch.randn(k, WIDTHS[0], generator=gen)
        g = random_gl(D_SITE, scale=0.5, generator=gen)
        moved = action(params, g, x)
        hidden = net.activations[1](net.preactivations(moved, x)[1])  # σ(gA)
        target = net.preactivations(params, x)[2] - params["4.bias"]
        best = torch.linalg.lstsq(hidden, target, driver="gelsd").solution.T
        assert torch.allclose(moved["4.weight"], best, atol=1e-10)
    assert max(changes) > 1e-4


@pytest.mark.parametrize("k,unit", [(3, False), (D_SITE - 1, False), (D_SITE, True), (D_SITE + 3, True)])
def test_approximate_action_unit_axiom_needs_batch_at_least_width(k, unit):
    """With pseudo-inverses, e·W = W σ(A) σ(A)⁺ ≠ W unless σ(A) has rank d_s (k ≥ d_s)."""
    for seed in SEEDS[:6]:
        net, params = network(seed)
        m, cond = measure(ApproximateTeleport(net, 1), net, params, k, seed)
        assert cond.identity_axiom is unit and cond.group_action is (k == D_SITE)
        assert (m.identity_error < TOL) is unit, str(m)


# ---------------------------------------------------------------------------------------- eq. 4.13 (exact)

@pytest.mark.parametrize("k", [1, D_SITE + 1, D_IN])
def test_exact_action_keeps_the_loss_but_fails_the_unit_axiom_under_pseudo_inverses(k):
    """Prop. 4.4.2 assumes h invertible; with h⁺ and k < d (= 5 here) the loss is kept, the multiplication
    axiom holds, and the unit axiom fails: e·W̃ = W̃ h h⁺, the projection of W̃'s rows onto the data's span.
    The failure is reported by conditions() and by the measured identity error. (k = 8: eq. 4.13 is still
    exact where eq. 4.16, width 7, is not.)"""
    for seed in SEEDS:
        net, params = network(seed)
        m, cond = measure(ExactTeleport(net, 1), net, params, k, seed)
        assert cond.loss_preserving and cond.composition_axiom and cond.width == D_IN
        assert m.relative_loss_change < TOL and m.output_change < TOL and m.composition_error < TOL, str(m)
        if k < D_IN:
            assert not cond.identity_axiom and not cond.group_action and m.identity_error > 1e-3, str(m)
            assert "unit axiom no" in str(cond) and "identity error" in str(m)
        else:
            assert cond.group_action and m.identity_error < TOL


@pytest.mark.parametrize("k", [D_IN + 1, 2 * D_IN])
def test_exact_action_changes_the_loss_above_its_input_width(k):
    for seed in SEEDS[:6]:
        net, params = network(seed)
        m, cond = measure(ExactTeleport(net, 1), net, params, k, seed)
        assert not cond.loss_preserving and cond.identity_axiom
        assert m.output_change > 1e-6 and m.identity_error < TOL, str(m)


@pytest.mark.parametrize("k", [1, 5, D_IN])
def test_completed_exact_action_is_a_group_action(k):
    """Adding W̃(I − h h⁺) back restores the unit axiom for every k ≤ d, keeping the rest."""
    for seed in SEEDS:
        net, params = network(seed)
        m, cond = measure(ExactTeleport(net, 1, complete=True), net, params, k, seed)
        assert cond.group_action
        assert max(m.relative_loss_change, m.identity_error, m.composition_error) < TOL, str(m)


def test_exact_action_with_extended_tanh_and_at_the_first_site():
    act = extended_tanh(6.0)
    for seed in SEEDS[:4]:
        net, params = network(seed, activation=act)
        m, _ = measure(ExactTeleport(net, 1, complete=True), net, params, 4, seed, scale=0.3)
        assert m.output_change < 1e-9 and m.identity_error < TOL, str(m)
    net, params = network(0)
    gen = torch.Generator().manual_seed(5)
    x, g = torch.randn(6, 10, generator=gen), random_gl(8, generator=gen)
    moved = ExactTeleport(net, 0)(params, g, x)  # site 0: the input is the data itself, d = 10 + 1
    assert (net.forward(moved, x) - net.forward(params, x)).abs().max() < 1e-12


@pytest.mark.parametrize("widths", [WIDTHS, (3, 4, 7, 2)])
def test_conditions_agree_with_measurement_across_batch_sizes(widths):
    """(3, 4, 7, 2): site 1 is wider than its input (4 + 1), so A = W̃h has rank ≤ 5 and leaky ReLU, piecewise
    linear, can keep σ(A) below rank 7 (few sign patterns): batch ≤ width is necessary, not sufficient; the
    reported rank decides."""
    ranks = set()
    for action_type in (ExactTeleport, ApproximateTeleport):
        for seed, k in itertools.product(SEEDS[:3], range(1, 2 * D_IN + 1)):
            net, params = network(seed, widths=widths)
            m, cond = measure(action_type(net, 1), net, params, k, seed)
            assert cond.batch == k
            assert cond.loss_preserving is (m.output_change < TOL), (k, str(m), str(cond))
            assert cond.identity_axiom is (m.identity_error < TOL), (k, str(m), str(cond))
            assert not cond.composition_axiom or m.composition_error < TOL, (k, str(m), str(cond))
            if widths == WIDTHS:  # generic ranks: the guarantee is also necessary
                assert cond.composition_axiom is (m.composition_error < TOL), (k, str(m), str(cond))
            if action_type is ApproximateTeleport and k >= 7:
                ranks.add(cond.rank)
    assert (min(ranks) == 7) is (widths == WIDTHS)


# ---------------------------------------------------------------------------------------- measure_action

def test_measure_action_on_the_frame_action_with_site_mappings():
    """The data-dependent frame action (nonlinear_actions) is an exact group action for every k ≤ width,
    where eq. 4.16 with pseudo-inverses fails the unit axiom."""
    net, params = network(3)
    gen = torch.Generator().manual_seed(9)
    x, y = torch.randn(4, 10, generator=gen), torch.randn(4, 2, generator=gen)
    g1, g2 = {1: random_gl(7, generator=gen)}, {1: random_gl(7, generator=gen)}

    def loss(p):
        return ((net.forward(p, x) - y) ** 2).mean()

    m = measure_action(DataDependentAction(net), params, x, g1, g2, loss=loss)
    assert m.label == "DataDependentAction" and m.output_change is None
    assert max(m.relative_loss_change, m.identity_error, m.composition_error) < TOL, str(m)
    seq = measure_action(DataDependentAction(net), params, x, [None, g1[1]], loss=loss, label="frame")
    assert seq.label == "frame" and seq.composition_error is None and seq.relative_loss_change < TOL


def test_teleport_argument_errors():
    net, params = network(0)
    with pytest.raises(ValueError, match=r"site 2 out of range: the network has hidden sites 0…1"):
        ApproximateTeleport(net, 2)
    with pytest.raises(ValueError, match=r"g: shape \(4, 4\), expected \(…, 7, 7\) for site 1"):
        ExactTeleport(net, 1)(params, torch.eye(4), torch.randn(2, 10))
    tanh_net = FeedForward.of(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    params = {k: p.detach() for k, p in nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).named_parameters()}
    with pytest.raises(TypeError, match=r"Activation\('tanh'\) has no known inverse"):
        ExactTeleport(tanh_net, 0)(params, torch.eye(4), torch.randn(2, 3))
    assert isinstance(as_bijective(leaky_relu()), BijectiveActivation)


# --------------------------------------------------------------------------------- reuse inside a teleport

def test_exact_action_reuses_its_input_and_pre_activation_only_for_the_same_unmodified_tensors():
    # h⁺ and W̃'h = T are kept between calls; every answer equals that of a fresh action (no reuse) to rounding
    net, params = network(0)
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(5))
    g1, g2 = (random_gl(7, scale=0.5, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    action = ExactTeleport(net, 1)

    def fresh(p, g, data=x):
        return ExactTeleport(net, 1)(p, g, data)

    def close(a, b):
        return all(torch.allclose(a[k], b[k], rtol=1e-12, atol=1e-12) for k in a)

    once = action(params, g1, x)
    assert action._inputs_seen and action._outputs_seen           # h, h⁺ and the moved weights' T are kept
    twice = action(once, g2, x)                                    # reuses h⁺ and T = W̃'h
    assert close(twice, fresh(fresh(params, g1), g2))
    other = x + 1.0                                                # other data: h recomputed
    assert close(action(once, g2, other), fresh(once, g2, other))
    lower = dict(params)
    lower["0.weight"] = params["0.weight"].clone()
    action(lower, g1, x)
    lower["0.weight"].mul_(2.0)                                    # modified in place: _version changes
    assert close(action(lower, g1, x), fresh(lower, g1))
    moved = action(params, g1, x)
    moved["2.weight"].add_(1.0)                                    # the moved weight itself modified: T is stale
    assert close(action(moved, g2, x), fresh(moved, g2))
    grad = {k: v.clone().requires_grad_(True) for k, v in params.items()}   # differentiated: nothing kept
    action._inputs_seen.clear()
    action(grad, g1, x)
    assert not action._inputs_seen


def test_exact_action_does_not_reuse_the_pre_activation_above_the_input_width():
    # batch 12 > input width 9: h⁺h ≠ I, so W̃'h ≠ T and nothing may be kept; the action (not loss-preserving
    # there) still equals a fresh one
    net, params = network(1)
    x = torch.randn(12, 10, generator=torch.Generator().manual_seed(6))
    g1, g2 = (random_gl(7, scale=0.5, generator=torch.Generator().manual_seed(s)) for s in (3, 4))
    action = ExactTeleport(net, 1)
    once = action(params, g1, x)
    assert not action._outputs_seen and action._inputs_seen[0][1][2] is False
    expected = ExactTeleport(net, 1)(ExactTeleport(net, 1)(params, g1, x), g2, x)
    assert all(torch.allclose(action(once, g2, x)[k], expected[k], rtol=1e-12, atol=1e-12) for k in expected)
