"""One attention head written without a head split (``q(x) @ k(x).transpose(-2, -1)`` on ``(B, L, d)``), which
exact discovery found the catalogue missing: it folds into an ``attention`` node with one head, and the near misses
(the query or the key read again) keep no ``GL`` on the query-key space."""
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
