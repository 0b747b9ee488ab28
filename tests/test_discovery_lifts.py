"""Lifting discovered symmetries (subnetwork → network, width, depth, batch) and the controls where a lift fails."""
from __future__ import annotations

import pytest
import torch

import symalg
from symalg.discovery.lifts import lift


@pytest.fixture(scope="module")
def block() -> symalg.discovery.Discovery:
    return symalg.discover("linear(2, 3) -> relu -> linear(3, 2)", compare=False)


class Skip(torch.nn.Module):
    """The block's hidden layer is read twice: ``b(h) + s(h)``, ``h = relu(a x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.s = torch.nn.Linear(2, 3), torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(h) + self.s(h)


def test_subnetwork_to_network_holds(block):
    lifted = lift(block, "linear(2, 3) -> relu -> linear(3, 2) -> tanh -> linear(2, 1)")
    assert len(lifted) == 3 and all(lf.holds and lf.finite_error < 1e-12 for lf in lifted)


def test_layer_to_deep_network_by_renaming(block):
    names = {"0.weight": "2.weight", "0.bias": "2.bias", "2.weight": "4.weight", "2.bias": "4.bias"}
    lifted = lift(block, "linear(2, 2) -> tanh -> linear(2, 3) -> relu -> linear(3, 2)", names=names)
    assert all(lf.holds for lf in lifted) and {lf.moves for lf in lifted} == {("2.weight", "2.bias", "4.weight")}
    unrenamed = lift(block, "linear(2, 3) -> tanh -> linear(3, 3) -> relu -> linear(3, 2)")
    assert not any(lf.holds for lf in unrenamed)          # the same field on the tanh layer: no symmetry there


def test_width_h_to_wider(block):
    lifted = lift(block, "linear(2, 7) -> relu -> linear(7, 2)")
    assert len(lifted) == 3 and all(lf.holds for lf in lifted)
    with pytest.raises(symalg.SpecError, match="does not fit"):
        lift(block, "linear(2, 2) -> relu -> linear(2, 2)")


def test_negative_control_another_path_reads_the_lifted_parameters(block):
    torch.manual_seed(0)
    names = {"0.weight": "a.weight", "0.bias": "a.bias", "2.weight": "b.weight", "2.bias": "b.bias"}
    model = Skip().double()
    lifted = lift(block, model, data=(torch.randn(5, 2, dtype=torch.float64),), names=names)
    assert len(lifted) == 3 and not any(lf.holds for lf in lifted)
    assert min(lf.finite_error for lf in lifted) > 1e-3


def test_batch_size_to_smaller_batches_and_not_back():
    spec = "linear(3, 2, bias=False) -> tanh -> linear(2, 1, bias=False)"
    x = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 1.0], [2.0, 0.3, -1.0]], dtype=torch.float64)
    two = symalg.discover(spec, data=x[:2], compare=False)
    # W₁'s rows move along the normal x⊥ of the two points, by any affine function of θ (8 + 1 coefficients)
    assert two.dimension == 2 * 9 and two.confirmed
    assert all(lf.holds for lf in lift(two, spec, data=x[:1]))  # d → d' < d
    assert not all(lf.holds for lf in lift(two, spec, data=x))  # d → d + 1 fails
