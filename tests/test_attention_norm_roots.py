"""Attention whose queries and keys pass a norm over the whole projection before the head split (OLMoE's and
OLMo2's ``q_norm``/``k_norm``): the roots of the fold are the norm's output, whose site a per-feature gain has
already restricted to diagonal maps and permutations. Before the fix the attention rule dissolved that site into
per-head query/key sites that did not inherit the restriction, and claimed a per-head ``ComplexScaling`` (rotary) or
``GL`` moving the gains (8 false raw claims on the tiny OLMoE). Now no per-head group is claimed on such roots; the
claims that are made hold at generic parameters on other input shapes, through fx and export alike.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.verification.certification import assert_claims_hold


class NormedRoots(nn.Module):
    """``sdpa(split(q_norm(q_proj x)), split(k_norm(k_proj x)), split(v_proj x))`` then ``o_proj``, two heads."""

    def __init__(self, d=8, heads=2, norm=nn.RMSNorm):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d) for _ in range(4))
        self.q_norm, self.k_norm = norm(d), norm(d)

    def split(self, x):
        b, t, _ = x.shape
        return x.view(b, t, self.heads, -1).transpose(1, 2)

    def forward(self, x):
        q, k = self.split(self.q_norm(self.q_proj(x))), self.split(self.k_norm(self.k_proj(x)))
        y = F.scaled_dot_product_attention(q, k, self.split(self.v_proj(x)))
        return self.o_proj(y.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("norm", [nn.RMSNorm, nn.LayerNorm])
@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_norm_over_the_whole_projection_keeps_no_per_head_query_key_group(tracer, norm):
    torch.manual_seed(0)
    model = NormedRoots(norm=norm)
    analysis = symalg.derive(symalg.trace(model, (torch.randn(2, 5, 8),), tracer=tracer), certify=False)
    labels = [s.label for s in analysis.symmetries]
    assert not any(".qk" in label or label.startswith(("GL(4)", "ComplexScaling")) for label in labels), labels
    assert_claims_hold(analysis, draws=2)
