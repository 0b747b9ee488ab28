"""Elementwise multiplication by a parameter (a learnable layer scale ``x ⊙ γ``: ConvNeXt, CaiT), issue 30.

``γ`` with one entry per coordinate of the sites' axis is a diagonal map: it absorbs the scalings and sign flips
of the sites it reads (``γ ↦ D⁻¹γ``), carries a site of its own (read by the next map) and moves with their
permutations. Every case derives raw claims (no certification) through fx and torch.export, which must agree, and
checks each claim on the model itself.
"""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import assert_claims_hold


class Scaled(nn.Module):
    """``out(relu(inp(x)) ⊙ γ)``, ``γ`` of ``shape`` (written ``γ * h`` when ``left``)."""

    def __init__(self, shape=(4,), left=False):
        super().__init__()
        self.inp, self.out, self.left = nn.Linear(3, 4), nn.Linear(4, 2), left
        self.gamma = nn.Parameter(torch.linspace(0.5, 2.0, shape[-1]).expand(shape).clone())

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(self.gamma * h if self.left else h * self.gamma)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise conv, channels last, LayerNorm, MLP, layer scale ``γ``, residual."""

    def __init__(self, c=4):
        super().__init__()
        self.stem = nn.Conv2d(2, c, 1)
        self.dwconv = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.norm, self.up, self.down = nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.Linear(2 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        x = self.stem(x)
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = self.gamma * self.down(torch.nn.functional.gelu(self.up(self.norm(h))))
        x = x + h.permute(0, 3, 1, 2)
        return self.head(x.mean((-2, -1)))


class CaiTBlock(nn.Module):
    """CaiT's residual branch: ``x + γ ⊙ mlp(x)`` on ``(B, T, d)``."""

    def __init__(self, d=4):
        super().__init__()
        self.inp, self.fc1, self.fc2, self.out = nn.Linear(3, d), nn.Linear(d, 6), nn.Linear(6, d), nn.Linear(d, 2)
        self.gamma = nn.Parameter(torch.linspace(0.1, 0.4, d))

    def forward(self, x):
        x = self.inp(x)
        return self.out(x + self.gamma * self.fc2(torch.tanh(self.fc1(x))))


def derive(model, x, tracer):
    torch.manual_seed(0)
    return symalg.derive(symalg.trace(model, (x,), tracer=tracer), certify=False)


def labels(analysis):
    return sorted(s.label for s in analysis.symmetries)


@pytest.mark.parametrize("shape, left", [((4,), False), ((4,), True), ((1, 4), False)])
def test_layer_scale_absorbs_the_scalings_and_carries_a_site(shape, left):
    """Before the rule: no claim at all (the product with a parameter was an unknown op)."""
    torch.manual_seed(0)
    model, x = Scaled(shape, left), torch.randn(5, 3)
    fx, exported = derive(model, x, "fx"), derive(model, x, "export")
    # the ReLU site's scalings (absorbed by γ), γ's own site (scalings, sign flips), their joint permutations
    assert labels(fx) == labels(exported) == ["PositiveScaling(4, alpha=1) on gamma",
                                              "PositiveScaling(4, alpha=1) on inp", "S(4) on inp",
                                              "SignFlips(4) on gamma"]
    assert_claims_hold(fx, draws=2)
    assert_claims_hold(exported, draws=2)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_convnext_block_keeps_the_mlp_scalings_through_its_layer_scale(tracer):
    """``down``'s neurons scale against ``γ``; ``γ``'s site joins the residual stream (the stem's channels)."""
    analysis = derive(ConvNeXtBlock(), torch.randn(2, 2, 5, 5), tracer)
    assert labels(analysis) == [
        "PositiveScaling(4, alpha=1) on down", "PositiveScaling(4, alpha=1) on norm",
        "PositiveScaling(4, alpha=1) on stem", "S(4) on stem", "S(8) on up", "Shears(4) on norm",
        "SignFlips(4) on down", "SignFlips(4) on norm", "SignFlips(4) on stem"]
    assert_claims_hold(analysis, draws=2)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_cait_residual_branch_scale_is_tied_to_the_stream(tracer):
    """``x + γ ⊙ mlp(x)``: the stream keeps the diagonal groups ``γ`` commutes with (not ``GL``, as without ``γ``),
    ``fc2``'s neurons scale against ``γ``. The translation of the stream found while the branch was an unknown op
    goes, as for any residual branch with sites (a sum of two sites does not keep translations)."""
    analysis = derive(CaiTBlock(), torch.randn(2, 3, 3), tracer)
    assert labels(analysis) == ["PositiveScaling(4, alpha=1) on fc2", "PositiveScaling(4, alpha=1) on inp",
                                "S(4) on inp", "S(6) on fc1", "SignFlips(4) on fc2", "SignFlips(4) on inp",
                                "SignFlips(6) on fc1"]
    assert_claims_hold(analysis, draws=2)


@pytest.mark.parametrize("shape", [(1,), (5, 4)])
def test_a_scale_not_one_per_feature_is_refused_with_a_note(shape):
    """One ``γ`` for every feature, or one per position and feature: not a per-feature diagonal map."""
    analysis = derive(Scaled(shape), torch.randn(5, 3), "fx")
    assert analysis.symmetries == ()
    assert any("parameter gamma" in b.reason and "one entry per coordinate" in b.reason for b in analysis.blocked), \
        analysis.blocked
