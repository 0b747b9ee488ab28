"""Teleporting for generalisation ([Zhao2026] Sec. 5.3–5.4, 4.6.3): sharpness and curvature teleports in both
directions on LeakyReLU classifiers from both front ends (the examples: test_teleport_generalisation_examples)."""
from __future__ import annotations


import pytest
import torch
from torch import nn
from torch.nn import functional as F

import symalg
import symalg.numeric.sampling
from symalg.applications.teleport import Curvature, Sharpness, Teleporter, as_action
from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer, model_loss

SPEC = "linear(6, 5) -> leaky_relu(slope=0.1) -> linear(5, 4) -> leaky_relu(slope=0.1) -> linear(4, 3)"


def classifier_problem(front_end):
    """(action, params, forward(params, x)) of the same 6-5-4-3 LeakyReLU(0.1) classifier from either front end."""
    if front_end == "spec":
        analysis = symalg.derive(SPEC)
        params = {k: v.detach().double() for k, v in analysis.model_graph.model.named_parameters()}
        network = symalg.numeric.sampling.network_function(analysis.architecture)
        return as_action(analysis), params, network
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.LeakyReLU(0.1), nn.Linear(5, 4), nn.LeakyReLU(0.1),
                          nn.Linear(4, 3)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(2, 6, dtype=torch.float64),)))
    params = {k: v.detach() for k, v in model.named_parameters()}
    return as_action(analysis), params, lambda p, x: torch.func.functional_call(model, p, (x,))


OBJECTIVES = {"sharpness": (Sharpness(displacements=(0.1,), directions=4), 5), "curvature": (Curvature(), 3)}


@pytest.mark.parametrize("front_end", ["spec", "traced"])
@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("increase", [True, False], ids=["increase", "decrease"])
def test_sharpness_and_curvature_teleports_move_the_objective_the_asked_way_and_keep_the_function(
        front_end, objective, increase):
    action, params, forward = classifier_problem(front_end)
    assert action.dim == 5 + 4                                   # the positive scalings of both LeakyReLU sites
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(40, 6, dtype=torch.float64, generator=generator), torch.randint(3, (40,), generator=generator)
    held_out = torch.randn(25, 6, dtype=torch.float64, generator=generator)

    def loss(p):
        return F.cross_entropy(forward(p, x), y)
    measure, steps = OBJECTIVES[objective]
    result = Teleporter(action, measure, steps=steps, maximize=increase)(params, loss, wrt=tuple(params))
    assert result.accepted, result.reason
    assert result.relative_loss_change < 1e-12                                     # the loss is kept ...
    assert (forward(result.params, held_out) - forward(params, held_out)).abs().max() < 1e-10   # ... on any input
    ratio = result.objective_after / result.objective_before
    assert (ratio > 1.02) if increase else (ratio < 0.98), ratio                     # moved the asked way
    again = float(measure(result.params, loss, action, tuple(params)).detach())     # and that is what it reports
    assert again == pytest.approx(result.objective_after, rel=1e-9)


def test_teleport_at_an_epoch_on_several_batches_keeps_the_validation_loss():
    # the generalisation protocol: one teleport near the end of training on several batches in turn; the exact
    # action keeps every batch's loss and the validation loss right after it (the data-dependent GL of [Zhao2026]
    # keeps only the teleport batch's)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.1), nn.Linear(8, 5), nn.LeakyReLU(0.1),
                          nn.Linear(5, 3)).double()
    x, y = torch.randn(90, 6, dtype=torch.float64), torch.randint(3, (90,))
    xv, yv = torch.randn(30, 6, dtype=torch.float64), torch.randint(3, (30,))
    action = as_action(symalg.derive(symalg.trace(model, (x[:2],))))
    chunks = iter([(x[i:i + 30], y[i:i + 30]) for i in (0, 30, 60)])
    opt = TeleportingOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model,
                               Teleporter(action, Curvature(), steps=1, maximize=False),
                               model_loss(model, F.cross_entropy), lambda: next(chunks),
                               Schedule(at_epochs=(2,), batches=3))
    for epoch in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        with torch.no_grad():
            before = float(F.cross_entropy(model(xv), yv))
        opt.end_epoch()
    with torch.no_grad():
        after = float(F.cross_entropy(model(xv), yv))
    assert len(opt.results) == 3 and sum(r.accepted for r in opt.results) >= 2
    for result in opt.results:
        assert result.relative_loss_change < 1e-12
        assert result.objective_after <= result.objective_before
    assert after == pytest.approx(before, rel=1e-12)
