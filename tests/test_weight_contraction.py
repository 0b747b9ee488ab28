"""A value contracted with a weight matrix, either way round, is the dense map it is (issue 30): ``x @ W.T``
(Falcon's ``FalconLinear``), ``torch.matmul(x, W.t())``, ``x @ W`` (a weight stored ``(in, out)``), ``W @ x``.

Before this rule the product was an unknown op (no claim on the sites it touched). Every case derives raw claims
through fx and torch.export, which must agree, and checks each claim on the model itself.
"""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import assert_claims_hold


class FalconLinear(nn.Linear):
    """Falcon's linear layer: ``input @ self.weight.T`` plus the bias (traced inside: not a torch layer)."""

    def forward(self, x):
        hidden = x @ self.weight.T
        return hidden if self.bias is None else hidden + self.bias


class MLP(nn.Module):
    """``fc2(gelu(fc1(x)))`` with the two layers of class ``layer``."""

    def __init__(self, layer=nn.Linear, bias=True):
        super().__init__()
        self.fc1, self.fc2 = layer(3, 4, bias=bias), layer(4, 2, bias=bias)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Written(nn.Module):
    """``relu`` between two weight products written ``form``: ``matmul_t`` (``torch.matmul(x, W.t())``), ``stored``
    (``x @ W``, ``W`` of shape ``(in, out)``), ``left`` (``(W @ xᵀ)ᵀ``), ``tokens`` (``W @ x`` over the tokens: the
    near miss)."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.inp = nn.Linear(3, 4)
        shape = {"matmul_t": (5, 4), "stored": (4, 5), "left": (5, 4), "tokens": (6, 6)}[form]
        self.w = nn.Parameter(torch.randn(shape))
        self.out = nn.Linear(4 if form == "tokens" else 5, 2)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        if self.form == "matmul_t":
            h = torch.matmul(h, self.w.t())
        elif self.form == "stored":
            h = h @ self.w
        elif self.form == "left":
            h = (self.w @ h.transpose(-2, -1)).transpose(-2, -1)
        else:
            h = self.w @ h
        return self.out(torch.tanh(h))


def derive(model, x, tracer):
    return symalg.derive(symalg.trace(model, (x,), tracer=tracer), certify=False)


def groups(analysis):
    return sorted(s.group.name for s in analysis.symmetries)


@pytest.mark.parametrize("tracer", ["fx", "export"])
@pytest.mark.parametrize("bias", [True, False])
def test_falcon_linear_gets_the_claims_of_nn_linear(tracer, bias):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3)
    reference = derive(MLP(nn.Linear, bias), x, tracer)
    analysis = derive(MLP(FalconLinear, bias), x, tracer)
    assert groups(analysis) == groups(reference) == ["PositiveScaling(4, alpha=1)", "S(4)"]
    assert "fc1" in analysis.symmetries[0].label
    assert_claims_hold(analysis, draws=2)


@pytest.mark.parametrize("form", ["matmul_t", "stored", "left"])
def test_weight_products_either_way_round_are_dense_maps(form):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 3)
    fx, exported = derive(Written(form), x, "fx"), derive(Written(form), x, "export")
    assert groups(fx) == groups(exported) == ["PositiveScaling(4, alpha=1)", "S(4)", "S(5)", "SignFlips(5)"]
    assert any(s.label.endswith("on w") for s in fx.symmetries), [s.label for s in fx.symmetries]
    assert_claims_hold(fx, draws=2)
    assert_claims_hold(exported, draws=2)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_product_over_the_tokens_does_not_move_the_feature_sites(tracer):
    """``W @ h`` with ``h`` of shape ``(B, T, d)`` mixes the tokens: the sites of ``h`` run along the features,
    which the map does not read, so they keep nothing (a blocked note names the node)."""
    torch.manual_seed(0)
    analysis = derive(Written("tokens"), torch.randn(2, 6, 3), tracer)
    assert groups(analysis) == []
    assert any("reads axis -2 of a value whose sites run along axis -1" in b.reason for b in analysis.blocked)
