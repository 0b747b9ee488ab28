"""One attention head written without a head split (``q(x) @ k(x).transpose(-2, -1)`` on ``(B, L, d)``), which
exact discovery found the catalogue missing: it folds into an ``attention`` node with one head, and the near misses
(the query or the key read again) keep no ``GL`` on the query-key space. Values through an activation
(``softmax(q kᵀ) σ(v x)``, another miss discovery found) keep the scores' ``GL`` and nothing on the value side."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import symalg
from symalg.frontend.tracing import trace


class OneHead(torch.nn.Module):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.q, self.k, self.v = (torch.nn.Linear(3, 2) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.form == "sdpa":
            return F.scaled_dot_product_attention(q, k, v)
        if self.form == "bmm":
            return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 2 ** 0.5, -1), v)
        scores = q @ k.transpose(-2, -1)
        if self.form == "key-as-value":
            return torch.softmax(scores, -1) @ k
        out = torch.softmax(scores, -1) @ v
        return out + q if self.form == "query-read" else out


def inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 4, 3, dtype=torch.float64),)


@pytest.mark.parametrize("form", ["explicit", "bmm", "sdpa"])
def test_one_head_without_split_folds_and_gets_gl_on_the_query_key_space(form):
    torch.manual_seed(0)
    model = OneHead(form).double()
    graph = trace(model, inputs()).graph
    (node,) = [n for n in graph if graph.nodes[n]["op"] == "attention"]
    assert graph.nodes[node]["settings"]["heads"] == 1 and graph.nodes[node]["inputs"][:3] == ("q", "k", "v")
    analysis = symalg.derive(trace(model, inputs()))          # certified on the model
    assert "GL(2) on q.head0.qk" in [s.label for s in analysis.symmetries]
    report = symalg.discover(analysis)
    assert report.new_tangent == 0 and report.unconfirmed_labels == ()


@pytest.mark.parametrize("form", ["query-read", "key-as-value"])
def test_near_misses_claim_no_gl_even_raw(form):
    torch.manual_seed(0)
    analysis = symalg.derive(trace(OneHead(form).double(), inputs()), certify=False)
    # (with the key as value, the unused v layer keeps its trivial GL(2): nothing reads it)
    assert [s.site for s in analysis.symmetries if s.group.name.startswith("GL")] == ["v"] * (form == "key-as-value")


class ValuesThrough(torch.nn.Module):
    """Attention whose values are not a map's output read by it alone: ``σ(v x)`` (one head, or two heads),
    ``v x`` also added to the output, or values computed from the queries."""

    def __init__(self, form: str, heads: int = 1) -> None:
        super().__init__()
        self.form, self.heads = form, heads
        self.q, self.k, self.v = (torch.nn.Linear(3, 2 * heads) for _ in range(3))
        self.out = torch.nn.Linear(2 * heads, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        value = torch.relu(v) if self.form == "relu" else v if self.form == "read" else torch.tanh(q)
        if self.heads == 1:
            o = torch.softmax(q @ k.transpose(-2, -1), -1) @ value
        else:   # (the activation before the head split: after it, the pattern is not folded at all)
            q, k, value = (z.reshape(2, 4, self.heads, 2).transpose(1, 2) for z in (q, k, value))
            o = F.scaled_dot_product_attention(q, k, value).transpose(1, 2).reshape(2, 4, 2 * self.heads)
        return self.out(o + v if self.form == "read" else o)


@pytest.mark.parametrize("form, heads", [("relu", 1), ("read", 1), ("relu", 2)])
def test_values_through_an_op_keep_the_scores_gl_and_nothing_on_the_value_side(form, heads):
    torch.manual_seed(0)
    model = ValuesThrough(form, heads).double()
    raw = symalg.derive(trace(model, inputs()), certify=False)
    claimed = {(s.site, s.group.name) for s in raw.symmetries}
    assert {(f"q.head{h}.qk", "GL(2)") for h in range(heads)} <= claimed
    assert {site for site, _ in claimed} == {f"q.head{h}.qk" for h in range(heads)}   # (and key-bias translations)
    assert any("its values are not a linear map's output" in str(note) for note in raw.blocked)
    report = symalg.verify(raw)
    assert report.passed, report.summary()
    gl = next(s for s in raw.symmetries if s.group.name == "GL(2)")
    moved = gl.apply(dict(model.named_parameters()), gl.group.sample(torch.Generator().manual_seed(1))[-1][1])
    x = inputs()[0]
    assert torch.allclose(torch.func.functional_call(model, moved, (x,)), model(x), atol=1e-10)
    assert not torch.allclose(moved["q.weight"], model.q.weight)


def test_values_computed_from_the_queries_keep_nothing():
    torch.manual_seed(0)
    raw = symalg.derive(trace(ValuesThrough("query").double(), inputs()), certify=False)
    # (the v layer, which nothing reads here, keeps its trivial symmetries)
    assert not [s for s in raw.symmetries if s.group.is_continuous and s.site != "v"]
