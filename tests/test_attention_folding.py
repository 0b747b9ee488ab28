"""Folding hand-written multi-head attention (:mod:`symalg.attention_folding`) into one ``attention`` node."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from symalg.frontend.tracing import trace

B, L, D, H = 3, 5, 8, 2


def split_heads(t, heads):
    """The standard split ``(B, L, d) → (B, H, L, d/H)``."""
    b, length = t.shape[:2]
    return t.view(b, length, heads, t.shape[-1] // heads).transpose(1, 2)


class SelfAttention(nn.Module):
    """Separate ``q, k, v, o`` maps; ``form``, ``merge`` and ``split`` pick how the pattern is spelled."""

    def __init__(self, form="sdpa", merge="view", split=split_heads):
        super().__init__()
        self.form, self.merge, self.split = form, merge, split
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        b, length = x.shape[:2]
        q, k, v = (self.split(f(x), H) for f in (self.q, self.k, self.v))
        if self.form == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v
        if self.merge == "view":
            out = out.transpose(1, 2).contiguous().view(b, length, -1)
        elif self.merge == "reshape":
            out = out.transpose(1, 2).reshape(b, length, -1)
        else:
            out = out.reshape(b, length, -1)
        return self.o(out)


def x():
    return torch.randn(B, L, D, dtype=torch.float64)


def ops(graph):
    return [graph.nodes[v]["op"] for v in graph]


def attention_nodes(graph):
    return [v for v in graph if graph.nodes[v]["op"] == "attention"]


def assert_unchanged(model, example=True):
    inputs = (x(),) if example else None
    folded, plain = trace(model, inputs).graph, trace(model, inputs, fold_attention=False).graph
    assert list(folded.nodes(data="inputs")) == list(plain.nodes(data="inputs"))
    assert ops(folded) == ops(plain)
    assert not attention_nodes(folded)


@pytest.mark.parametrize("form", ["sdpa", "explicit"])
@pytest.mark.parametrize("merge", ["view", "reshape"])
def test_self_attention_folds_to_one_node(form, merge):
    graph = trace(SelfAttention(form, merge), (x(),)).graph
    (name,) = attention_nodes(graph)
    data = graph.nodes[name]
    assert data["inputs"] == ("q", "k", "v")
    assert data["settings"] == {"heads": H, "head_dim": D // H, "value_head_dim": D // H, "form": form,
                                "heads_alike": True, "key_shifts": True, "value_shifts": True}
    assert data["shape"] == (B, L, D) and data["kind"] == "function" and data["arguments"] == {}
    assert [graph.edges[root, name]["index"] for root in ("q", "k", "v")] == [0, 1, 2]
    assert list(graph.successors(name)) == ["o"] and graph.nodes["o"]["inputs"] == (name,)
    assert graph.edges[name, "o"]["index"] == 0
    assert ops(graph) == ["input", "linear", "linear", "linear", "attention", "linear", "output"]


def test_permutes_scale_dropout_flatten_and_value_width():
    """``K`` split straight into ``Kᵀ`` by one permute, ``c · scores``, dropout, merge by ``flatten``,
    and a value width differing from the key width."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, 12), nn.Linear(12, D)
            self.drop = nn.Dropout(0.1)

        def forward(self, x):
            b, length, _ = x.shape
            q = self.q(x).reshape(b, length, H, -1).permute(0, 2, 1, 3)
            k = self.k(x).reshape(b, length, H, -1).permute(0, 2, 3, 1)
            v = self.v(x).reshape(b, length, H, -1).permute(0, 2, 1, 3)
            weights = self.drop(((D // H) ** -0.5 * (q @ k)).softmax(-1))
            return self.o(torch.flatten((weights @ v).permute(0, 2, 1, 3), 2))

    graph = trace(Net().eval(), (x(),)).graph
    (name,) = attention_nodes(graph)
    assert graph.nodes[name]["inputs"] == ("q", "k", "v")
    assert graph.nodes[name]["settings"] == {"heads": H, "head_dim": 4, "value_head_dim": 6, "form": "explicit",
                                             "heads_alike": True, "key_shifts": True, "value_shifts": True}
    assert ops(graph) == ["input", "linear", "linear", "linear", "attention", "linear", "output"]


def test_two_blocks_and_a_root_read_elsewhere():
    """Each block folds; a ``q`` root read by a residual too is still a root."""

    class Residual(SelfAttention):
        def forward(self, x):
            query = self.q(x)
            q, k, v = split_heads(query, H), split_heads(self.k(x), H), split_heads(self.v(x), H)
            return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D)) + query

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Residual(), SelfAttention("explicit")

        def forward(self, x):
            return self.b(self.a(x))

    graph = trace(Net(), (x(),)).graph
    first, second = attention_nodes(graph)
    assert graph.nodes[first]["inputs"] == ("a_q", "a_k", "a_v")
    assert graph.nodes[second]["inputs"] == ("b_q", "b_k", "b_v")
    assert {"matmul", "softmax", "sdpa", "transpose", "reshape", "identity"}.isdisjoint(ops(graph))


@pytest.mark.parametrize("learned", [False, True])
def test_sdpa_mask_is_an_input_of_the_attention_node(learned):
    class Masked(SelfAttention):
        def __init__(self):
            super().__init__()
            mask = torch.zeros(H if learned else 1, L, L)
            if learned:
                self.mask = nn.Parameter(mask)
            else:
                self.register_buffer("mask", mask)

        def forward(self, x):
            q, k, v = (split_heads(f(x), H) for f in (self.q, self.k, self.v))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=0.0)
            return self.o(out.transpose(1, 2).reshape(B, L, D))

    graph = trace(Masked(), (x(),)).graph
    (name,) = attention_nodes(graph)
    assert graph.nodes[name]["inputs"] == ("q", "k", "v", "mask")
    assert graph.nodes[name]["settings"]["heads_alike"] is (not learned)   # a per-head mask: (H, L, L)
    assert graph.nodes[name]["settings"]["key_shifts"] is True


class Scored(SelfAttention):
    """Explicit attention with ``scores(net, S)`` applied to ``S = Q Kᵀ`` before the softmax."""

    def __init__(self, scores):
        super().__init__("explicit")
        self.scores = scores
        self.temperature = nn.Parameter(torch.tensor(2.0))
        self.per_key = nn.Parameter(torch.ones(1, L))
        self.bias = nn.Parameter(torch.zeros(H, L, L))
        self.register_buffer("causal", torch.ones(L, L, dtype=torch.bool).triu(1))

    def forward(self, x):
        q, k, v = (split_heads(f(x), H) for f in (self.q, self.k, self.v))
        scores = self.scores(self, q @ k.transpose(-2, -1))
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D))


@pytest.mark.parametrize("scores, extras, heads_alike, key_shifts", [
    (lambda net, s: s / net.temperature, ("temperature",), True, True),
    (lambda net, s: (s * 0.5).masked_fill(net.causal, float("-inf")), ("causal",), True, True),
    (lambda net, s: s.masked_fill(net.causal, -1e4), ("causal",), True, False),   # a finite fill is no shift
    (lambda net, s: net.bias + s - net.temperature, ("temperature", "bias"), False, True),   # last op first
    (lambda net, s: s * net.per_key, ("per_key",), True, False),   # a factor varying along the keys
    (lambda net, s: net.temperature / s, ("temperature",), True, False),
])
def test_score_modifiers_fold_with_their_tensors_as_inputs(scores, extras, heads_alike, key_shifts):
    graph = trace(Scored(scores), (x(),)).graph
    (name,) = attention_nodes(graph)
    data = graph.nodes[name]
    assert data["inputs"] == ("q", "k", "v") + extras
    assert (data["settings"]["heads_alike"], data["settings"]["key_shifts"]) == (heads_alike, key_shifts)
    assert ops(graph).count("softmax") == 0


def test_a_modifier_computed_from_the_scores_is_not_folded():
    assert_unchanged(Scored(lambda net, s: s * s.detach().mean()))


@pytest.mark.parametrize("split", [
    lambda t, heads: t.view(t.shape[0], t.shape[1], -1, heads).permute(0, 3, 1, 2),  # heads interleaved
    lambda t, heads: t.view(t.shape[0], t.shape[1], -1, heads).transpose(1, 3),  # (B, H, d_k, L)
    lambda t, heads: t.view(t.shape[0], heads, t.shape[1], -1),  # rows mixed across positions
])
@pytest.mark.parametrize("form", ["sdpa", "explicit"])
def test_wrong_split_is_not_folded(split, form):
    assert_unchanged(SelfAttention(form, split=split))


def test_wrong_merge_is_not_folded():
    assert_unchanged(SelfAttention("sdpa", merge="no transpose"))


@pytest.mark.parametrize("scores", [
    lambda net, q, k: (q @ k.transpose(-2, -1)).softmax(-2),  # normalised over queries
    lambda net, q, k: (q @ k.transpose(-2, -1)).sigmoid(),  # no softmax
])
def test_other_explicit_scores_are_not_folded(scores):
    class Net(SelfAttention):
        def __init__(self):
            super().__init__()
            self.temperature = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            q, k, v = (split_heads(f(x), H) for f in (self.q, self.k, self.v))
            return self.o((scores(self, q, k) @ v).transpose(1, 2).reshape(B, L, D))

    assert_unchanged(Net())


def test_without_example_inputs_nothing_is_folded():
    assert_unchanged(SelfAttention("sdpa"), example=False)
    assert_unchanged(SelfAttention("explicit"), example=False)


@pytest.mark.parametrize("form", ["sdpa", "explicit"])
def test_head_split_or_scores_read_elsewhere_is_not_folded(form):
    class Leaky(SelfAttention):
        def forward(self, x):
            q, k, v = (split_heads(f(x), H) for f in (self.q, self.k, self.v))
            if form == "sdpa":
                out = F.scaled_dot_product_attention(q, k, v)
                extra = q
            else:
                extra = q @ k.transpose(-2, -1)
                out = extra.softmax(-1) @ v
            return self.o(out.transpose(1, 2).reshape(B, L, D)), extra

    assert_unchanged(Leaky())


class Grouped(nn.Module):
    """4 query heads of width 2, 2 key/value heads repeated to 4 by ``repeat``."""

    def __init__(self, repeat):
        super().__init__()
        self.repeat = repeat
        self.q, self.k, self.v, self.o = nn.Linear(D, 8), nn.Linear(D, 4), nn.Linear(D, 4), nn.Linear(8, D)

    def forward(self, x):
        q = self.q(x).view(B, L, 4, 2).transpose(1, 2)
        k, v = (self.repeat(f(x).view(B, L, 2, 2).transpose(1, 2)) for f in (self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, 8))


@pytest.mark.parametrize("repeat", [lambda t: t.repeat_interleave(2, dim=1),
                                    lambda t: t[:, :, None].expand(B, 2, 2, L, 2).reshape(B, 4, L, 2),
                                    # picks a copy (an integer index, replayed exactly), then repeats
                                    lambda t: t[:, :, None].expand(B, 2, 2, L, 2)[:, :, 0].repeat_interleave(2, dim=1)])
def test_grouped_query_attention_folds_with_its_key_value_heads(repeat):
    graph = trace(Grouped(repeat), (x(),)).graph
    (name,) = attention_nodes(graph)
    assert graph.nodes[name]["inputs"] == ("q", "k", "v")
    assert graph.nodes[name]["settings"]["kv_heads"] == 2 and graph.nodes[name]["settings"]["heads"] == 4


@pytest.mark.parametrize("repeat", [
    lambda t: t[:, None].expand(B, 2, 2, L, 2).reshape(B, 4, L, 2),   # tiled: head h reads key/value head h % 2
    lambda t: t.repeat(1, 2, 1, 1),                                    # tiled too
])
def test_other_repeats_of_key_value_heads_are_not_folded(repeat):
    assert_unchanged(Grouped(repeat))


def test_sdpa_enable_gqa_folds_with_its_key_value_heads():
    class Native(Grouped):
        def forward(self, x):
            q = self.q(x).view(B, L, 4, 2).transpose(1, 2)
            k, v = (f(x).view(B, L, 2, 2).transpose(1, 2) for f in (self.k, self.v))
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return self.o(out.transpose(1, 2).reshape(B, L, 8))

    graph = trace(Native(None), (x(),)).graph
    (name,) = attention_nodes(graph)
    assert graph.nodes[name]["settings"]["kv_heads"] == 2


class Merged(nn.Module):
    """Attention on batch and heads merged, ``(B·H, L, d)`` by ``reshape``, ``torch.bmm`` (BART's layout); ``keys``
    lays out the keys' instances (``"batch-major"`` as the queries, or ``"head-major"``)."""

    def __init__(self, keys="batch-major"):
        super().__init__()
        self.keys = keys
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        q, k, v = (split_heads(f(x), H).reshape(B * H, L, D // H) for f in (self.q, self.k, self.v))
        if self.keys == "head-major":   # instance n reads head n // B of batch n % B: not the queries' pairing
            k = self.k(x).view(B, L, H, D // H).permute(2, 0, 1, 3).reshape(H * B, L, D // H)
        out = torch.bmm(torch.bmm(q, k.transpose(1, 2)).softmax(-1), v)
        return self.o(out.view(B, H, L, D // H).transpose(1, 2).reshape(B, L, D))


def test_batch_and_heads_merged_fold_when_every_instance_pairs_its_query_and_key_heads():
    graph = trace(Merged(), (x(),)).graph
    (name,) = attention_nodes(graph)
    assert graph.nodes[name]["inputs"] == ("q", "k", "v") and graph.nodes[name]["settings"]["form"] == "explicit"
    assert ops(graph) == ["input", "linear", "linear", "linear", "attention", "linear", "output"]
    assert_unchanged(Merged("head-major"))
