"""``nn.MultiheadAttention`` through ``torch.export`` (which decomposes it), and attention whose probabilities are
read outside it (returned, averaged, picked): :mod:`symalg.frontend.attention_folding` and the attention rules.

Every case derives raw claims (no certification) and checks each one on the model itself; fx and export must agree
where both see the same pattern."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.verification.certification import claim_errors

B, L, S, E, H = 3, 4, 5, 8, 2
PER_HEAD = {f"GL(4) on attention.head{h}.{p}" for h in range(H) for p in ("qk", "vo")}
KEY_BIASES = {f"Translations(4, bias) on attention.head{h}.qk" for h in range(H)}
HEADS = "S(2) on attention.heads"


class MHA(nn.Module):
    """``out(attention(inp(x), ink(y), ink(y)))`` (``y`` is ``x`` without ``cross``), returning the attention
    weights too when ``need``; ``masks`` names the masks passed: ``causal`` (a boolean upper triangle), ``float``
    (one additive ``(L, L)`` mask), ``per-head`` (``(B·H, L, L)``), ``padding`` (a key padding mask)."""

    def __init__(self, masks=(), need=False, average=True, cross=False, batch_first=True, **options):
        super().__init__()
        self.inp, self.ink, self.out = nn.Linear(3, E), nn.Linear(3, options.get("kdim", E)), nn.Linear(E, 2)
        self.attention = nn.MultiheadAttention(E, H, batch_first=batch_first, **options)
        self.masks, self.need, self.average, self.cross = masks, need, average, cross
        self.register_buffer("per_head", torch.randn(B * H, L, L))

    def forward(self, x, y):
        h = self.inp(x)
        k = self.ink(y) if self.cross else h
        options = {}
        if "causal" in self.masks:
            options.update(attn_mask=torch.ones(L, L, dtype=torch.bool).triu(1), is_causal=not self.need)
        if "float" in self.masks:
            options.update(attn_mask=torch.linspace(-1.0, 1.0, L * L).reshape(L, L))
        if "per-head" in self.masks:
            options.update(attn_mask=self.per_head)
        if "padding" in self.masks:
            options.update(key_padding_mask=(torch.arange(B)[:, None] == 0) & (torch.arange(L) == L - 1))
        o, w = self.attention(h, k, k, need_weights=self.need, average_attn_weights=self.average, **options)
        return (self.out(o), w) if self.need else self.out(o)


def inputs(batch_first=True):
    torch.manual_seed(1)
    shape = (B, L) if batch_first else (L, B)
    return torch.randn(*shape, 3), torch.randn(*shape, 3)


def raw(model, example, tracer):
    """Raw claims (labels) and the worst relative output change any of them makes."""
    torch.manual_seed(0)
    analysis = symalg.derive(symalg.trace(model, example, tracer=tracer), certify=False)
    return {s.label for s in analysis.symmetries}, max(e.error for e in claim_errors(analysis, draws=1))


@pytest.mark.parametrize("batch_first, bias, need, average, masks", [
    (True, True, False, True, ()), (False, True, False, True, ()), (True, False, True, True, ()),
    (True, True, True, False, ()), (False, True, True, True, ("causal",)), (True, True, False, True, ("causal",)),
    (True, True, True, True, ("padding",)), (True, True, False, True, ("padding", "causal")),
    (False, False, True, True, ("float",)), (True, True, False, True, ("per-head",)),
    (True, True, True, False, ("padding",)),
], ids=["plain", "seq-first", "no-bias-weights", "per-head-weights", "seq-first-causal-weights", "causal",
        "padding-weights", "padding-causal", "seq-first-no-bias-float-mask-weights", "per-head-mask",
        "padding-per-head-weights"])
def test_export_claims_what_fx_claims_for_multihead_attention(batch_first, bias, need, average, masks):
    """Per-head ``GL(d_k)``, ``GL(d_v)`` on both routes; the key biases translate; the heads permute unless the
    weights are returned per head or a 3-d mask differs per head."""
    torch.manual_seed(0)
    model = MHA(masks, need, average, batch_first=batch_first, bias=bias).eval()
    example = inputs(batch_first)
    fx, fx_error = raw(model, example, "fx")
    exported, export_error = raw(model, example, "export")
    assert exported == fx and max(fx_error, export_error) < 1e-10
    permuted = not (need and not average) and "per-head" not in masks
    assert {c for c in exported if c.startswith(("GL(4) on attention.head", "Translations(4, bias)", "S(2)"))} == \
        PER_HEAD | (KEY_BIASES if bias else set()) | ({HEADS} if permuted else set())


def test_a_per_head_attn_mask_removes_the_head_permutation_that_would_change_the_output():
    """fx's one ``multihead_attention`` node too: a ``(B·H, L, L)`` mask differs per head, and swapping the heads
    (in-projection rows, out-projection columns) changes the output."""
    torch.manual_seed(0)
    model = MHA(("per-head",)).eval()
    example = inputs()
    assert HEADS not in raw(model, example, "fx")[0]
    before = model(*example)
    swap = torch.cat([torch.arange(E // H, E), torch.arange(0, E // H)])
    rows = torch.cat([swap, swap + E, swap + 2 * E])
    with torch.no_grad():
        model.attention.in_proj_weight.copy_(model.attention.in_proj_weight[rows])
        model.attention.in_proj_bias.copy_(model.attention.in_proj_bias[rows])
        model.attention.out_proj.weight.copy_(model.attention.out_proj.weight[:, swap])
    assert ((model(*example) - before).norm() / before.norm()).item() > 1e-3


@pytest.mark.parametrize("need, average", [(False, True), (True, True), (True, False)])
def test_export_folds_multihead_attention_into_one_attention_node(need, average):
    """The packed projection read three times (offsets ``0, E, 2E``), batch and heads merged by ``bmm`` or split for
    ``sdpa``; with weights the probabilities are the node's second result, viewed as ``(B, H, L, L)``."""
    graph = symalg.trace(MHA(need=need, average=average).eval(), inputs(), tracer="export").graph
    (name,) = [v for v in graph if graph.nodes[v]["op"] == "attention"]
    data = graph.nodes[name]
    (projection,) = set(data["inputs"])
    assert graph.nodes[projection]["op"] == "linear" and list(graph.successors(projection)) == [name]
    assert len(data["inputs"]) == 3 and graph.nodes[projection]["inputs"][1] == "attention_in_proj_weight"
    assert data["settings"] == {"heads": H, "head_dim": E // H, "value_head_dim": E // H,
                                "form": "explicit" if need else "sdpa", "heads_alike": True, "key_shifts": True,
                                "value_shifts": True,
                                "offsets": (0, E, 2 * E)} | ({"probabilities": "heads"} if need else {})
    ops = {graph.nodes[v]["op"] for v in graph}
    assert ops.isdisjoint({"matmul", "softmax", "select", "squeeze", "unsqueeze", "sdpa"})
    if need:
        assert data["shape"] == ((L * B, E), (B, H, L, L))
        assert [graph.nodes[v]["op"] for v in graph.successors(f"{name}_probabilities")] == \
            ["mean" if average else "output"]


def test_export_verifies_multihead_attention_with_its_weights_returned_per_head():
    torch.manual_seed(0)
    model = MHA(("padding",), need=True, average=False).eval()
    analysis = symalg.derive(symalg.trace(model, inputs(), tracer="export"))
    labels = {s.label for s in analysis.symmetries}
    assert labels >= PER_HEAD | KEY_BIASES and HEADS not in labels
    assert all(e.holds for e in analysis.certification)
    assert symalg.verify(analysis).passed


@pytest.mark.parametrize("case", ["cross", "kdim", "unbatched"])
def test_export_cuts_the_in_projection_into_pieces(case):
    """Distinct query and key inputs, ``kdim``/``vdim`` and unbatched inputs: export cuts ``in_proj_weight`` (or
    ``in_proj_bias``) by ``split``/``chunk``; each piece is the weight or bias of one linear, so the heads' groups
    hold. The input maps reading the packed weight's columns are tied into one ``GL`` (fx pins them instead), and the
    key biases, pieces read by other nodes too, do not translate."""
    torch.manual_seed(0)
    options = {"kdim": 5, "vdim": 5} if case == "kdim" else {}
    model = MHA(cross=case != "unbatched", **options).eval()
    x, y = inputs()
    example = (x[0], y[0]) if case == "unbatched" else (x, y)
    claims, error = raw(model, example, "export")
    assert error < 1e-10
    assert claims >= PER_HEAD | {HEADS} and not claims & KEY_BIASES


class Returning(nn.Module):
    """Attention written out (``q, k, v, o`` linears), returning ``read(probabilities)`` too; ``dropout`` sits
    between the probabilities and ``@ v``; ``merged`` spells it with ``bmm`` on ``(B·H, L, d)``."""

    def __init__(self, read, dropout=None, merged=False):
        super().__init__()
        self.read, self.merged = read, merged
        self.q, self.k, self.v, self.o = (nn.Linear(E, E) for _ in range(4))
        self.drop = dropout or nn.Identity()
        self.per_head = nn.Parameter(torch.rand(H, 1, 1) + 0.5)

    def forward(self, x):
        q, k, v = (f(x).view(B, L, H, E // H).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.merged:
            q, k, v = (z.reshape(B * H, L, E // H) for z in (q, k, v))
            probabilities = self.drop(torch.bmm(q, k.transpose(1, 2)).softmax(-1))
            out = torch.bmm(probabilities, v).reshape(B, H, L, E // H)
        else:
            probabilities = self.drop((q @ k.transpose(-2, -1) / 2).softmax(-1))
            out = probabilities @ v
        return self.o(out.transpose(1, 2).reshape(B, L, E)), self.read(self, probabilities)


RETURNED = {f"GL(4) on q.head{h}.{p}" for h in range(H) for p in ("qk", "vo")} | \
    {f"Translations(4, bias) on q.head{h}.qk" for h in range(H)} | {f"Shears(4) on q.head{h}.vo" for h in range(H)}
"""Per head: GL(d_k), GL(d_v), the key bias and the value bias moved into the output bias (the probabilities do not
depend on the values)."""


@pytest.mark.parametrize("read, permuted", [
    (lambda net, p: p, False),                         # Hugging Face's output_attentions
    (lambda net, p: p.mean(1), True),                  # averaged over heads: a head permutation leaves it
    (lambda net, p: p.sum(-1), False),                 # summed over keys: still one map per head
    (lambda net, p: p[:, 0], False),                   # head 0 only
    (lambda net, p: p * net.per_head, False),          # scaled per head
    (lambda net, p: torch.cumsum(p, 1), False),        # an op no rule knows
], ids=["returned", "mean-heads", "sum-keys", "head0", "per-head-scale", "unknown"])
@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_returned_probabilities_keep_the_per_head_groups(read, permuted, tracer):
    """The probabilities ``softmax(Q_h K_hᵀ/2)`` are invariant under the per-head ``GL(d_k)``, the key biases,
    ``GL(d_v)`` and the value shears; their head axis moves under a head permutation, which only their readers may
    allow."""
    torch.manual_seed(0)
    model = Returning(read).eval()
    claims, error = raw(model, (torch.randn(B, L, E),), tracer)
    assert claims == RETURNED | ({"S(2) on q.heads"} if permuted else set()) and error < 1e-10


def test_a_head_permutation_changes_a_returned_map():
    """The negative control: swapping the two heads leaves the attention output alone but not the map."""
    torch.manual_seed(0)
    model = Returning(lambda net, p: p).eval()
    x = torch.randn(B, L, E)
    output, probabilities = model(x)
    swap = torch.cat([torch.arange(E // H, E), torch.arange(0, E // H)])
    with torch.no_grad():
        for layer in (model.q, model.k, model.v):
            layer.weight.copy_(layer.weight[swap])
            layer.bias.copy_(layer.bias[swap])
        model.o.weight.copy_(model.o.weight[:, swap])
    swapped, moved = model(x)
    assert torch.allclose(swapped, output, atol=1e-12) and not torch.allclose(moved, probabilities, atol=1e-3)


@pytest.mark.parametrize("view, layout", [(False, "merged"), (True, "heads")])
def test_probabilities_with_batch_and_heads_merged(view, layout):
    """``bmm`` on ``(B·H, L, d)``: the returned map keeps the heads merged into axis 0, where a head permutation is
    not modelled (a blocked note), unless it is viewed back as ``(B, H, L, L)``, which folds with it."""
    read = (lambda net, p: p.view(B, H, L, L).mean(1)) if view else (lambda net, p: p.sum(-1))
    torch.manual_seed(0)
    model = Returning(read, merged=True).eval()
    graph = symalg.trace(model, (torch.randn(B, L, E),))
    (name,) = [v for v in graph.nodes if graph.node(v)["op"] == "attention"]
    assert graph.node(name)["settings"]["probabilities"] == layout
    analysis = symalg.derive(graph, certify=False)
    labels = {s.label.replace("(4, bias)", "").replace("(4)", "") for s in analysis.symmetries}
    assert ("S(2) on q.heads" in {s.label for s in analysis.symmetries}) is view
    assert {"GL on q.head0.qk", "GL on q.head1.vo"} <= labels
    assert max(e.error for e in claim_errors(analysis, draws=1)) < 1e-10
    assert view or any("with the heads merged into another axis" in str(b) for b in analysis.blocked)


def test_dropout_on_the_probabilities_folds_in_eval_mode_only():
    """Eval-mode dropout (the identity) between the probabilities and ``@ v`` folds with a returned map; in training
    mode the returned map is random and nothing is folded."""
    torch.manual_seed(0)
    x = (torch.randn(B, L, E),)
    model = Returning(lambda net, p: p, dropout=nn.Dropout(0.5)).eval()
    assert raw(model, x, "fx")[0] == RETURNED
    trained = symalg.trace(model.train(), x, tracer="fx")
    assert "attention" not in [trained.node(v)["op"] for v in trained.nodes]


def test_a_head_split_left_unfolded_says_which_reader_stopped_the_fold():
    """Keys returned through an empty cache (``cat([past, k], -2)``, Hugging Face's ``DynamicCache``) are read
    outside the attention: nothing is folded, and the head split's blocked note names the output."""

    class Cached(Returning):
        def __init__(self):
            super().__init__(None)
            self.register_buffer("past", torch.zeros(0))

        def forward(self, x):
            q, k, v = (f(x).view(B, L, H, E // H).transpose(1, 2) for f in (self.q, self.k, self.v))
            k = torch.cat([self.past, k], -2)
            out = F.scaled_dot_product_attention(q, k, v)
            return self.o(out.transpose(1, 2).reshape(B, L, E)), k

    torch.manual_seed(0)
    analysis = symalg.derive(symalg.trace(Cached().eval(), (torch.randn(B, L, E),), tracer="export"), certify=False)
    assert not [s for s in analysis.symmetries if "head" in s.label]
    notes = [str(b) for b in analysis.blocked if b.site == "q"]
    assert any("the attention at node 'scaled_dot_product_attention' is not folded: node 'cat' is also read by the "
               "model output '1'" in note for note in notes), notes
