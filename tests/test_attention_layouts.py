"""Attention whose heads read other columns than the ``h``-th block of a projection (issue 30): the fold reads a
column map per head off the replayed layout chain (:mod:`symalg.frontend.attention_folding`), and the per-head
groups move those columns (:func:`symalg.catalogue.rules.attention.attention_sites`).

Every model below is checked claim by claim at generic parameters on other batch and sequence sizes, through fx and
``torch.export`` (same claims), and the near misses (heads reading overlapping columns, a query head paired with
another head's keys) must not get per-head groups."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg

B, T, H, d = 2, 5, 2, 3
D = H * d


def _heads(u: torch.Tensor, heads: int = H) -> torch.Tensor:
    """``(B, T, heads·d) -> (B, heads, T, d)``, the standard split."""
    b, t, _ = u.shape
    return u.reshape(b, t, heads, d).transpose(1, 2)


def _merged(o: torch.Tensor) -> torch.Tensor:
    b, _, t, _ = o.shape
    return o.transpose(1, 2).reshape(b, t, -1)


class NeoX(nn.Module):
    """GPT-NeoX: the packed projection viewed as ``(B, T, H, 3d)`` and cut by ``chunk(3, -1)``: head ``h`` reads the
    query columns ``3hd + [0, d)``, key columns ``3hd + d + [0, d)``, value columns ``3hd + 2d + [0, d)``."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, H, 3 * d).transpose(1, 2).chunk(3, dim=-1)
        return self.o(_merged(F.scaled_dot_product_attention(q, k, v)))


class Bloom(nn.Module):
    """BLOOM: ``(B, T, H, 3, d)`` selected per role, batch and heads merged, ``baddbmm`` with a bias per head
    (ALiBi: the heads are not alike, so they do not permute) and the scores viewed as ``(B, H, T, T)`` and back."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.register_buffer("slopes", torch.tensor([0.5, 0.25]).reshape(H, 1, 1))

    def forward(self, x):
        b, t, _ = x.shape
        fused = self.qkv(x).view(b, t, H, 3, d)
        q, k, v = (fused[..., i, :].transpose(1, 2).reshape(b * H, t, d) for i in range(3))
        alibi = (self.slopes * torch.arange(t, dtype=x.dtype)).reshape(1, H, 1, t).expand(b, H, 1, t)
        scores = torch.baddbmm(alibi.reshape(b * H, 1, t), q, k.transpose(-1, -2), beta=1.0, alpha=d ** -0.5)
        weights = scores.view(b, H, t, t).softmax(-1).view(b * H, t, t)
        return self.o(torch.bmm(weights, v).view(b, H, t, d).permute(0, 2, 1, 3).reshape(b, t, D))


class Sliced(nn.Module):
    """Phi-3: the packed projection ``[Q | K | V]`` cut by slices, grouped-query (one key/value head)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(D, D + 2 * d), nn.Linear(D, D)

    def forward(self, x):
        packed = self.qkv(x)
        q, k, v = packed[..., :D], packed[..., D:D + d], packed[..., D + d:]
        k, v = (_heads(u, 1).repeat_interleave(H, 1) for u in (k, v))
        return self.o(_merged(F.scaled_dot_product_attention(_heads(q), k, v)))


class MultiQuery(nn.Module):
    """GPTBigCode: ``split((D, d, d), -1)``, one key/value head read by every query head (``expand``)."""

    def __init__(self):
        super().__init__()
        self.c_attn, self.o = nn.Linear(D, D + 2 * d), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split((D, d, d), dim=-1)
        k, v = (u.unsqueeze(1).expand(b, H, t, d) for u in (k, v))
        return self.o(_merged(F.scaled_dot_product_attention(_heads(q), k, v)))


class Transposed(nn.Module):
    """Falcon's spelling: ``x @ W.T`` with a fused weight viewed as ``(B, T, H + 2, d)``, the queries its first ``H``
    slots, the key and value the last two (multi-query), explicit attention."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn((H + 2) * d, D) / D ** 0.5)
        self.dense = nn.Parameter(torch.randn(D, D) / D ** 0.5)

    def forward(self, x):
        b, t, _ = x.shape
        fused = (x @ self.weight.T).view(b, t, H + 2, d)
        q, k, v = (u.transpose(1, 2) for u in (fused[:, :, :-2], fused[:, :, -2:-1], fused[:, :, -1:]))
        scores = q @ k.transpose(-1, -2) * d ** -0.5
        return _merged(scores.softmax(-1) @ v) @ self.dense.T


LAYOUTS = {
    # model: (per-head qk and vo sites, whether the heads permute)
    NeoX: ({"qkv.head0.qk", "qkv.head1.qk", "qkv.head0.vo", "qkv.head1.vo"}, "qkv.heads"),
    Bloom: ({"qkv.head0.qk", "qkv.head1.qk", "qkv.head0.vo", "qkv.head1.vo"}, None),
    Sliced: ({"qkv.group0.qk", "qkv.group0.vo"}, "qkv.group0.heads"),
    MultiQuery: ({"c_attn.group0.qk", "c_attn.group0.vo"}, "c_attn.group0.heads"),
}


def _x(b: int = B, t: int = T) -> torch.Tensor:
    return torch.randn(b, t, D, dtype=torch.float64)


def _analysis(model: nn.Module, tracer: str):
    return symalg.derive(symalg.trace(model, (_x(),), tracer=tracer), certify=False)


def _worst_change(model: nn.Module, symmetries, width: int = D) -> float:
    """The largest relative output change of any claim applied at generic parameters (the trained ones plus noise)
    on inputs of other batch and sequence sizes than the trace's, over near and far group elements."""
    generator = torch.Generator().manual_seed(3)
    state = {n: p.detach() + 0.3 * torch.randn(p.shape, generator=generator, dtype=p.dtype)
             for n, p in model.named_parameters()}
    state |= {n: b for n, b in model.named_buffers()}
    worst = 0.0
    for b, t in ((1, 7), (3, 4)):
        x = torch.randn(b, t, width, dtype=torch.float64)
        reference = torch.func.functional_call(model, state, (x,))
        for symmetry in symmetries:
            for _, g in symmetry.group.sample(generator, torch.float64, "cpu", (1e-3, 1.0)):
                moved = torch.func.functional_call(model, dict(state) | symmetry.apply(state, g), (x,))
                worst = max(worst, ((moved - reference).norm() / reference.norm()).item())
    return worst


def _sites(analysis, kind: str) -> set[str]:
    return {s.label.split(" on ")[1].split(":")[0] for s in analysis.symmetries if s.group.kind == kind}


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=lambda m: m.__name__)
def test_per_head_groups_in_other_layouts_hold_through_fx_and_export(layout):
    torch.manual_seed(0)
    model = layout().double()
    per_head, permuted = LAYOUTS[layout]
    claims = {}
    for tracer in ("fx", "export"):
        analysis = _analysis(model, tracer)
        assert _sites(analysis, "GL") == per_head, tracer
        assert (permuted in _sites(analysis, "S")) == (permuted is not None), tracer
        claims[tracer] = sorted(s.label for s in analysis.symmetries)
        assert _worst_change(model, analysis.symmetries) < 1e-9
    assert claims["fx"] == claims["export"]


def test_neox_columns_are_recorded_and_each_head_moves_its_own_rows():
    """The fold records the column map; a head's ``qk`` group moves its query rows ``3hd + [0, d)`` by ``g`` and its
    key rows ``3hd + d + [0, d)`` by ``g⁻ᵀ``, the head permutation moves blocks of ``3d`` rows."""
    torch.manual_seed(0)
    model = NeoX().double()
    graph = symalg.trace(model, (_x(),), tracer="fx").graph
    (settings,) = [data["settings"] for _, data in graph.nodes(data=True) if data["op"] == "attention"]
    assert settings["columns"] == ((0, 3 * d), (d, 4 * d), (2 * d, 5 * d))
    analysis = symalg.derive(symalg.trace(model, (_x(),), tracer="fx"), certify=False)
    (head1,) = [s for s in analysis.symmetries if s.group.kind == "GL" and "head1.qk" in s.label]
    g = torch.linalg.matrix_exp(0.3 * torch.randn(d, d, dtype=torch.float64))
    params = {n: p.detach() for n, p in model.named_parameters()}
    moved = head1.apply(params, g)["qkv.weight"]
    rows = torch.arange(3 * D)
    untouched = (rows < 3 * d) | ((rows >= 5 * d))
    assert torch.equal(moved[untouched], params["qkv.weight"][untouched])
    assert torch.allclose(moved[3 * d:4 * d], g @ params["qkv.weight"][3 * d:4 * d])
    (heads,) = [s for s in analysis.symmetries if s.label.startswith("S") and "qkv.heads" in s.label]
    swapped = heads.apply(params, torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64))["qkv.weight"]
    assert torch.equal(swapped[:3 * d], params["qkv.weight"][3 * d:])


def test_transposed_weights_are_read_as_maps():
    """``x @ W.T`` projections (Falcon): the fused weight's rows are the heads' columns; one key/value head."""
    torch.manual_seed(0)
    model = Transposed().double()
    for tracer in ("fx", "export"):
        analysis = _analysis(model, tracer)
        assert {"GL"} <= {s.group.kind for s in analysis.symmetries}, tracer
        assert _worst_change(model, analysis.symmetries) < 1e-9


# -- near misses: no per-head group may be claimed ---------------------------------------------------------------

class SharedColumns(NeoX):
    """Queries and keys read the same columns (shared-QK attention): ``Q_h K_hᵀ`` does not stay under ``(g, g⁻ᵀ)``
    on one set of rows."""

    def forward(self, x):
        b, t, _ = x.shape
        q, _, v = self.qkv(x).view(b, t, H, 3 * d).transpose(1, 2).chunk(3, dim=-1)
        return self.o(_merged(F.scaled_dot_product_attention(q, q, v)))


class OverlappingValues(Sliced):
    """The values read columns the keys read too (a slice shifted by ``1``)."""

    def forward(self, x):
        packed = self.qkv(x)
        q, k, v = packed[..., :D], packed[..., D:D + d], packed[..., D + 1:D + 1 + d]
        k, v = (_heads(u, 1).repeat_interleave(H, 1) for u in (k, v))
        return self.o(_merged(F.scaled_dot_product_attention(_heads(q), k, v)))


class CrossedHeads(nn.Module):
    """Four heads; the keys' heads reordered by layout ops alone (``(0, 2, 1, 3)``): query head 1 meets key head 2."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(4 * d, 4 * d) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        q, v = (f(x).view(b, t, 4, d).transpose(1, 2) for f in (self.q, self.v))
        k = self.k(x).view(b, t, 2, 2, d).transpose(2, 3).reshape(b, t, 4, d).transpose(1, 2)
        return self.o(_merged(F.scaled_dot_product_attention(q, k, v)))


@pytest.mark.parametrize("near_miss", [SharedColumns, OverlappingValues, CrossedHeads], ids=lambda m: m.__name__)
def test_heads_reading_overlapping_or_mismatched_columns_get_no_per_head_group(near_miss):
    torch.manual_seed(0)
    model = near_miss().double()
    x = torch.randn(B, T, model.o.in_features, dtype=torch.float64)
    for tracer in ("fx", "export"):
        analysis = symalg.derive(symalg.trace(model, (x,), tracer=tracer), certify=False)
        assert not _sites(analysis, "GL"), tracer
        assert _worst_change(model, analysis.symmetries, model.o.in_features) < 1e-9

