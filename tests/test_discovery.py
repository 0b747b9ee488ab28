"""Exact symmetry discovery: the null space of first-order invariance, checked against the derived symmetries."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import symalg
from symalg.discovery.exact import bracket


class SquareAbs(torch.nn.Module):
    """``W₂ (z ⊙ |z|)`` written ``z ⊙ √(z ⊙ z)``: homogeneous of degree 2 through ``sqrt``, which the catalogue knows
    as pointwise only (``|z|`` itself is an entry)."""

    def __init__(self, spelled_abs: bool = False) -> None:
        super().__init__()
        self.spelled_abs = spelled_abs
        self.a, self.b = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.a(x)
        return self.b(z * (z.abs() if self.spelled_abs else (z * z).sqrt()))


@pytest.fixture(scope="module")
def relu_report() -> symalg.discovery.Discovery:
    return symalg.discover("linear(2, 3) -> relu -> linear(3, 1)")


def test_relu_mlp_discovers_exactly_the_positive_scalings(relu_report):
    r = relu_report
    assert (r.dimension, r.derived_dimension, r.explained, r.new, r.unconfirmed_labels) == (3, 3, 3, 0, ())
    assert r.rank.rank == r.unknowns - 3 and r.rank.gap > 1e6
    assert r.confirmed and r.closure_error < 1e-10
    theta = r.layout.flatten({n: torch.randn(s, dtype=torch.float64) for n, s in r.layout.shapes.items()})
    params = r.layout.unflatten(theta)
    for g in r.generators:
        assert g.moves == ("0.weight", "0.bias", "2.weight") and g.finite_error < 1e-12
        moved = r.layout.unflatten(g.field(theta))
        i = int(moved["0.bias"].abs().argmax())          # one neuron: (W₁[i], b₁[i]) up, W₂[:, i] down
        scale = moved["0.bias"][i] / params["0.bias"][i]
        torch.testing.assert_close(moved["0.weight"][i], scale * params["0.weight"][i])
        torch.testing.assert_close(moved["2.weight"][:, i], -scale * params["2.weight"][:, i])
        assert moved["0.weight"].abs().sum() == pytest.approx(moved["0.weight"][i].abs().sum())


def test_linear_bottleneck_gl_and_shears_close_under_the_bracket():
    affine = symalg.discover("linear(2, 3) -> identity -> linear(3, 2)")
    assert (affine.dimension, affine.derived_dimension, affine.explained, affine.new) == (12, 12, 12, 0)
    assert affine.closure_error < 1e-10 and affine.confirmed
    shear_moves = [g.moves for g in affine.generators if "0.weight" not in g.moves]
    assert shear_moves == [("0.bias", "2.bias")] * 3          # b₁ += t, b₂ −= W₂ t
    linear = symalg.discover("linear(2, 3) -> identity -> linear(3, 2)", affine=False)
    assert linear.dimension == 9 and linear.explained == 9     # gl(3) only: the shear needs c
    assert any("Shears" in label and "outside" in label for label in linear.outside)


def test_bracket_of_affine_fields_is_the_vector_field_bracket():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(3, 3, generator=g, dtype=torch.float64), torch.randn(3, 3, generator=g, dtype=torch.float64)
    a, b = torch.randn(3, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)
    theta = torch.randn(3, generator=g, dtype=torch.float64)

    def X(t):
        return A @ t + a

    def Y(t):
        return B @ t + b
    C, c = bracket((A, a), (B, b))
    expected = torch.func.jvp(Y, (theta,), (X(theta),))[1] - torch.func.jvp(X, (theta,), (Y(theta),))[1]
    torch.testing.assert_close(C @ theta + c, expected)


def test_traced_tanh_mlp_has_no_continuous_symmetry():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
    r = symalg.discover(model, (torch.randn(5, 2, dtype=torch.float64),))
    assert (r.dimension, r.derived_dimension) == (0, 0) and r.rank.rank == r.unknowns


def test_unknown_op_symmetry_is_discovered_as_new_and_survives_finite_check():
    torch.manual_seed(0)
    model = SquareAbs().double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 2, dtype=torch.float64),)))
    assert not [s for s in analysis.symmetries if s.group.is_continuous]   # sqrt blocks the catalogue
    r = symalg.discover(analysis)
    assert (r.dimension, r.derived_dimension, r.new, r.new_tangent) == (3, 0, 3, 3)
    assert all(g.finite_error < 1e-10 for g in r.symmetries) and len(r.symmetries) == 3
    theta = r.layout.flatten({n: v.detach() for n, v in model.named_parameters()})
    for g in r.new_generators:       # W₁ row i, b₁ i scale by s, W₂ column i by −2s (degree 2)
        moved = r.layout.unflatten(g.field(theta))
        i = int(moved["a.bias"].abs().argmax())
        s = moved["a.bias"][i] / model.a.bias[i]
        torch.testing.assert_close(moved["b.weight"][:, i], -2 * s * model.b.weight[:, i].detach())
    d = json.loads(json.dumps(r.to_dict()))
    assert d["new"] == 3 and d["tangent"]["new"] == 3 and len(d["new_generators"]) == 3
    assert r.latex().startswith("\\begin{align*}") and "a.weight" in r.latex()
    spelled = symalg.discover(SquareAbs(spelled_abs=True).double(), (torch.randn(6, 2, dtype=torch.float64),))
    assert (spelled.dimension, spelled.derived_dimension, spelled.new) == (3, 3, 0)   # |z| is catalogued


def test_a_false_claim_is_reported_as_not_confirmed():
    tanh = symalg.derive("linear(2, 3) -> tanh -> linear(3, 1)")
    relu = symalg.derive("linear(2, 3) -> relu -> linear(3, 1)")
    forged = dataclasses.replace(tanh, symmetries=relu.symmetries)   # "positive scaling" on a tanh layer
    r = symalg.discover(forged)
    assert r.dimension == 0
    assert r.unconfirmed_labels == ("PositiveScaling(3, alpha=1) on 0",)
    assert r.unconfirmed_errors[0] == pytest.approx(1.0)
    assert r.summary().splitlines()[1].startswith("NOT CONFIRMED")


def test_layernorm_centering_fields_are_new_fields_but_no_new_direction():
    torch.manual_seed(0)

    class Normed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp, self.norm, self.out = torch.nn.Linear(2, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.norm(self.inp(x)))
    r = symalg.discover(Normed().double(), (torch.randn(6, 2, dtype=torch.float64),))
    # z ↦ z + 1 (v·θ): any linear function of θ along 1 (W₁ += 1 uᵀ(θ), b₁ += 1 s(θ)): 3 × 23 fields
    assert r.new == 3 * r.parameters and r.dimension == r.derived_dimension + r.new
    assert r.unconfirmed_labels == () and r.new_tangent == 0 and r.confirmed


def test_one_data_point_has_more_symmetry_than_the_function():
    spec = "linear(2, 1, bias=False) -> relu -> linear(1, 1, bias=False)"
    free = symalg.discover(spec)
    point = symalg.discover(spec, data=torch.tensor([[1.0, 2.0]], dtype=torch.float64))
    assert free.dimension == 1 and point.dimension > free.dimension
    assert point.unconfirmed_labels == ()


def test_bad_input_gets_clear_errors():
    with pytest.raises(symalg.SpecError, match="target"):
        symalg.discover("linear(2, 3) -> relu -> linear(3, 1)", target="outputs")
    with pytest.raises(symalg.SpecError, match="blocks"):
        symalg.discover("linear(2, 3) -> relu -> linear(3, 1)", blocks="some")
    with pytest.raises(symalg.SpecError, match="data="):
        symalg.discover(torch.nn.Linear(2, 2))


def test_local_blocks_hold_the_chain_symmetries():
    spec = "linear(2, 2) -> relu -> linear(2, 2) -> relu -> linear(2, 2) -> relu -> linear(2, 1)"
    local = symalg.discover(spec, blocks="local")
    assert local.unknowns < symalg.discover(spec, blocks="all", compare=False).unknowns
    assert (local.dimension, local.explained, local.unconfirmed_labels) == (6, 6, ())


def test_null_space_at_a_point_is_the_derived_tangent_with_enough_data_and_larger_with_one_point():
    """``null_space_at``: with more data points than parameters the per-sample loss gradients at a generic ``θ``
    leave exactly the derived tangent (the 3 positive scalings of a ReLU layer); on one data point the null space
    is ``P − 1``, of which the derived tangent explains its 3 and the rest is new (data-dependent, first order)."""
    from symalg.discovery import null_space_at
    spec = "linear(2, 3) -> relu -> linear(3, 1)"                      # P = 13
    x = torch.randn(40, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    many = null_space_at(spec, x)
    assert (many.parameters, many.constraints, many.dimension) == (13, 40, 3)
    assert (many.derived, many.explained, many.new, many.unconfirmed) == (3, 3, 0, 0)
    assert many.rank.gap > 1e6 and many.basis.shape == (3, 13)
    one = null_space_at(spec, x[:1])
    assert (one.dimension, one.explained, one.new, one.unconfirmed) == (12, 3, 9, 0)
    function = null_space_at(spec, x, target="function")               # the same tangent, from the outputs
    assert (function.dimension, function.explained) == (3, 3)
    # the basis really is annihilated by every per-sample gradient
    analysis = symalg.derive(spec)
    model = analysis.model_graph.require_model("check").double()
    names = [n for n, _ in model.named_parameters()]
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]

    def outputs(flat):
        values, start = {}, 0
        for n, shape in zip(names, shapes):
            values[n] = flat[start:start + shape.numel()].reshape(shape)
            start += shape.numel()
        return torch.func.functional_call(model, values, (x,)).reshape(-1)
    assert float((torch.func.jacrev(outputs)(theta) @ function.basis.T).abs().max()) < 1e-10


def test_null_space_at_names_bad_arguments():
    from symalg.discovery import null_space_at
    x = torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(symalg.SpecError, match="target"):
        null_space_at("linear(2, 3) -> relu -> linear(3, 1)", x, target="hessian")
    with pytest.raises(symalg.SpecError, match=r"params\['0.weight'\] has shape"):
        wrong = {"0.weight": torch.zeros(2, 2), "0.bias": torch.zeros(3), "2.weight": torch.zeros(1, 3),
                 "2.bias": torch.zeros(1)}
        null_space_at("linear(2, 3) -> relu -> linear(3, 1)", x, wrong)
