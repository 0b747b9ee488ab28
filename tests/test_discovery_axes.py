"""The axes ansatz of exact discovery (``blocks="axes"``): structured rows and fields against the dense ones, the null
space against the dense ``"all"`` null space, and the symmetries of wider networks than the dense ansatz reaches."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import symalg
from symalg.discovery.axes import AxesLayout
from symalg.discovery.exact import ParameterLayout

SHAPES = {"w": (3, 2), "b": (3,), "k": (2, 3, 2), "s": (), "v": (2,)}


def _random(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_structured_rows_and_fields_equal_the_dense_ones_through_the_ansatz():
    layout = AxesLayout.build(tuple(SHAPES), SHAPES, affine=True)
    P = layout.P
    theta, u = _random(P, 0), _random(layout.unknowns, 1)
    J = _random(5 * P, 2).reshape(5, P)
    A, c = layout.dense(u)
    torch.testing.assert_close(layout.field(u, theta), A @ theta + c)
    torch.testing.assert_close(layout.rows(J, theta) @ u, J @ (A @ theta + c))
    batch = torch.stack([theta, 2 * theta, -theta])                 # fields at a batch of points
    torch.testing.assert_close(layout.field(u, batch), batch @ A.T + c)
    # injective: the unknowns → (A, c) map has full column rank (the scalar ties between axes are removed)
    images = torch.stack([torch.cat([M.reshape(-1) for M in layout.dense(e)]) for e in torch.eye(layout.unknowns,
                                                                                                  dtype=torch.float64)])
    assert int(torch.linalg.matrix_rank(images)) == layout.unknowns
    # the flow by Taylor series equals matrix_exp of the dense matrix
    M = torch.zeros(P + 1, P + 1, dtype=torch.float64)
    unit = layout.normalised(u)
    Au, cu = layout.dense(unit)
    M[:P, :P], M[:P, P] = Au, cu
    expected = (torch.linalg.matrix_exp(-M) @ torch.cat([theta, theta.new_ones(1)]))[:P]
    torch.testing.assert_close(layout.flow(unit, theta, -1.0), expected)
    assert float(torch.linalg.matrix_norm(M, ord=2)) <= 1.0 + 1e-12  # normalised bounds the operator norm


def test_cross_terms_read_the_contracted_tensor():
    layout = AxesLayout.build(("w", "b"), {"w": (3, 2), "b": (3,)}, affine=False)
    cross = [p for p in layout.pieces if p.kind == "cross"]
    assert [(p.tensor, p.source, p.axis, p.size) for p in cross] == [("b", "w", 1, 2)]   # b += W v
    u = torch.zeros(layout.unknowns, dtype=torch.float64)
    u[cross[0].start + 1] = 1.0
    theta = _random(layout.P, 3)
    field = layout.unflatten(layout.field(u, theta))
    torch.testing.assert_close(field["b"], theta[:6].reshape(3, 2)[:, 1])
    assert list(layout.terms(u, 0.0)) == [("b", "b[:]", 1.0, "w[:, 1]")]


@pytest.mark.parametrize("spec", ["linear(2, 2) -> identity -> linear(2, 2)", "linear(2, 3) -> relu -> linear(3, 1)"])
def test_axes_null_space_is_the_dense_null_space_inside_the_ansatz(spec):
    analysis = symalg.derive(spec)
    dense = symalg.discover(analysis, blocks="all", compare=False)
    axes = symalg.discover(analysis, blocks="axes", compare=False)
    assert axes.unknowns < dense.unknowns and axes.blocks_mode == "axes"
    full: ParameterLayout = dense.layout                                            # type: ignore[assignment]
    N = torch.stack([g.vector for g in dense.generators])
    image = torch.stack([full.vector(*axes.layout.dense(e))[0]                      # the ansatz in dense unknowns
                         for e in torch.eye(axes.unknowns, dtype=torch.float64)])
    rank = lambda M: int(torch.linalg.matrix_rank(M, rtol=1e-9))                    # noqa: E731
    intersection = rank(N) + rank(image) - rank(torch.cat([N, image]))
    assert axes.dimension == intersection
    found = torch.stack([full.vector(*g.layout.dense(g.vector))[0] for g in axes.generators])
    assert rank(torch.cat([N, found])) == rank(N)                                   # every axes field is in "all"


def test_relu_width_16_has_exactly_its_positive_scalings():
    r = symalg.discover("linear(2, 16) -> relu -> linear(16, 2)")                  # "auto" takes the axes ansatz
    assert r.blocks_mode == "axes" and r.unknowns < 1000 and r.parameters == 82
    assert (r.dimension, r.derived_dimension, r.explained, r.new) == (16, 16, 16, 0)
    assert r.confirmed and r.unconfirmed_labels == () and r.outside == ()
    assert len(r.symmetries) == 16 and r.certificate is not None and r.certificate.complete
    for g in r.generators:                   # one neuron each: W₁ row i, b₁ i by +1, W₂ column i by −1
        sign = next(v for m, v, _ in g.terms if m.startswith("0.bias"))
        coefficients = {(m.split("[")[0], round(v / sign, 9)) for m, v, _ in g.terms}
        assert coefficients == {("0.weight", 1.0), ("0.bias", 1.0), ("2.weight", -1.0)}
    d = json.loads(json.dumps(r.to_dict()))
    assert d["blocks"] == "axes" and d["dimension"] == 16


def test_linear_width_8_has_gl_and_the_shears():
    r = symalg.discover("linear(2, 8) -> identity -> linear(8, 2)", blocks="axes")
    assert (r.dimension, r.derived_dimension, r.explained, r.new) == (72, 72, 72, 0)   # gl(8): 64, shears: 8
    assert r.outside == () and r.unconfirmed_labels == () and r.confirmed
    shears = [g for g in r.generators if g.moves == ("0.bias", "2.bias")]
    assert len(shears) == 8 and all(any(read == "2.weight[:, %d]" % i for _, _, read in g.terms)
                                    for i, g in enumerate(sorted(shears, key=lambda g: g.terms[0][0])))
    linear = symalg.discover("linear(2, 4) -> identity -> linear(4, 2)", blocks="axes", affine=False)
    assert linear.dimension == 16 and any("Shears" in label for label in linear.outside)   # gl(4): c is needed


def test_traced_tanh_network_has_none():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    r = symalg.discover(model, (torch.randn(5, 2, dtype=torch.float64),), blocks="axes")
    assert (r.dimension, r.derived_dimension) == (0, 0) and r.rank.rank == r.unknowns


def test_a_false_claim_is_still_not_confirmed():
    tanh = symalg.derive("linear(2, 3) -> tanh -> linear(3, 1)")
    relu = symalg.derive("linear(2, 3) -> relu -> linear(3, 1)")
    r = symalg.discover(dataclasses.replace(tanh, symmetries=relu.symmetries), blocks="axes")
    assert r.dimension == 0 and r.unconfirmed_labels == ("PositiveScaling(3, alpha=1) on 0",)
    assert r.summary().splitlines()[1].startswith("NOT CONFIRMED")


def test_the_structured_path_builds_no_dense_matrix(monkeypatch):
    def refuse(self, vector):
        raise AssertionError("dense P × P matrix built")
    monkeypatch.setattr(AxesLayout, "dense", refuse)
    r = symalg.discover("linear(2, 4) -> relu -> linear(4, 2)", blocks="axes")
    assert (r.dimension, r.explained) == (4, 4) and r.latex().startswith("\\begin{align*}")


def test_bad_blocks_value_is_named():
    with pytest.raises(symalg.SpecError, match="'axes'.*'cols'|blocks must be one of"):
        symalg.discover("linear(2, 3) -> relu -> linear(3, 1)", blocks="cols")
