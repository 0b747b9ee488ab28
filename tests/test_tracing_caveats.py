"""Tracer caveats: ``x.T`` on n-D tensors, values read twice by one node, export guard nodes, and
keyword arguments. Each model's table is derived and every claimed symmetry verified in float64."""
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg

pytestmark = pytest.mark.filterwarnings("ignore:The use of `x.T` on tensors:UserWarning")

PS4, S4 = ("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)


def derived(model, x):
    """Trace, derive and verify ``model`` on ``x``; the analysis (its symmetries passed the verifier)."""
    analysis = symalg.derive(symalg.trace(model.double(), (x,)))
    report = symalg.verify(analysis)
    assert report.passed, "\n".join(str(c) for c in report.failures)
    return analysis


def ops(graph) -> dict:
    return {v: (graph.node(v)["op"], graph.node(v)["inputs"]) for v in graph.nodes}


class Lifted(nn.Module):
    """``fc1 → relu``, a layout function of the hidden value, then ``fc2``; ``branchy`` forces ``torch.export``."""

    def __init__(self, layout, width_out=4, branchy=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(width_out, 2)
        self.layout, self.branchy = layout, branchy

    def forward(self, x):
        if self.branchy and x.dim() == 3:      # fx cannot branch on a traced value; export specialises it
            x = x * 1.0
        return self.fc2(self.layout(torch.relu(self.fc1(x))))


# -- x.T ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout, shape, op, arguments", [
    (lambda h: h.T, (2, 5, 3), "permute", {"dims": (2, 1, 0)}),        # (2, 5, 4) -> (4, 5, 2)
    (lambda h: h.T, (5, 3), "transpose", {"dim0": -2, "dim1": -1}),     # (5, 4) -> (4, 5)
    (lambda h: h.mT, (2, 5, 3), "transpose", {"dim0": -2, "dim1": -1}),  # (2, 5, 4) -> (2, 4, 5)
    (lambda h: h.mH, (2, 5, 3), "transpose", {"dim0": -2, "dim1": -1}),
], ids=["T-3d", "T-2d", "mT", "mH"])
def test_T_reverses_every_axis_and_mT_swaps_the_last_two(layout, shape, op, arguments):
    width_out = layout(torch.zeros(*shape[:-1], 4)).shape[-1]
    graph = symalg.trace(Lifted(layout, width_out), (torch.randn(*shape),))
    (name,) = [v for v in graph.nodes if graph.node(v)["inputs"] == ("relu",)]
    assert (graph.node(name)["op"], graph.node(name)["arguments"]) == (op, arguments)


@pytest.mark.parametrize("branchy", [False, True], ids=["fx", "export"])
def test_T_of_a_3d_value_moves_the_feature_axis_first(branchy):
    # h: (2, 5, 4) → h.T: (4, 5, 2) → transpose(0, 2): (2, 5, 4), features last again. Read as
    # transpose(-2, -1), fc2 would see the feature axis in the middle and lose fc1's symmetries.
    model = Lifted(lambda h: h.T.transpose(0, 2), branchy=branchy)
    analysis = derived(model, torch.randn(2, 5, 3))
    assert analysis.model_graph.tracer == ("export" if branchy else "fx")
    assert sorted(analysis.table()) == [("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)]
    assert analysis.blocked == ()


def test_T_of_unknown_rank_blocks_instead_of_guessing():
    graph = symalg.trace(Lifted(lambda h: h.T.transpose(0, 2)))
    (name,) = [v for v in graph.nodes if graph.node(v)["inputs"] == ("relu",)]
    assert graph.node(name)["op"] == "T"
    analysis = symalg.derive(graph, certify=False)   # no example inputs: nothing to certify with
    assert analysis.table() == []
    assert {(b.node, b.site) for b in analysis.blocked} == {(name, "fc1")}
    assert "x.T of unknown rank" in analysis.blocked[0].reason


def test_T_of_a_parameter_takes_its_rank_from_the_tensor():
    class Params(nn.Module):
        def __init__(self):
            super().__init__()
            self.matrix, self.cube = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(2, 3, 4))

        def forward(self, x):
            return x @ self.matrix.T, self.cube.T

    graph = symalg.trace(Params())
    recorded = {graph.node(v)["inputs"][0]: (graph.node(v)["op"], graph.node(v)["arguments"])
                for v in graph.nodes if graph.node(v)["op"] in ("transpose", "permute")}
    assert recorded == {"matrix": ("transpose", {"dim0": -2, "dim1": -1}), "cube": ("permute", {"dims": (2, 1, 0)})}


# -- values read twice -------------------------------------------------------------------------

def test_a_value_read_twice_keeps_every_position_in_inputs():
    graph = symalg.trace(Lifted(lambda h: torch.cat([h, h], -1), width_out=8), (torch.randn(5, 3),))
    cat = ops(graph)["cat"]
    assert cat == ("cat", ("relu", "relu"))          # the dim is a setting, not an input
    assert graph.node("cat")["arguments"]["arg1"] == -1
    assert list(graph.graph.in_edges("cat", data="index")) == [("relu", "cat", 0)]  # one edge, first position


class Twice(nn.Module):
    def __init__(self, combine, width_out=4, activation=None):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(width_out, 2)
        self.combine, self.activation = combine, activation

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(self.combine(h if self.activation is None else self.activation(h)))


GL4 = ("fc1", "GL(4)", 16)


@pytest.mark.parametrize("combine, width_out, activation, expected", [
    (lambda h: h + h, 4, None, [GL4]),                                  # 2h: every linear action passes (not t)
    (lambda h: torch.add(h, h), 4, None, [GL4]),
    (lambda h: h - h, 4, None, []),      # 0: nothing depends on fc1, so its GL(4) is not certifiable (below)
    (lambda h: torch.cat([h, h], -1), 8, None, [GL4, ("fc1", "Shears(4)", 4)]),  # fc2 reads it in two blocks
    (lambda h: torch.cat([h, torch.relu(h)], -1), 8, None, [PS4, S4]),
    (lambda h: torch.cat((h, h), dim=-1), 8, torch.relu, [PS4, S4]),
    (lambda h: h * h, 4, None, [PS4, ("fc1", "SignFlips(4)", 0), S4]),  # a product: (d h)² = d² h², (g h)² = h²
    (lambda h: h.square(), 4, None, [S4]),
], ids=["add", "torch.add", "sub", "cat", "cat-relu", "relu-cat-dim", "mul", "square"])
def test_symmetries_of_a_value_used_twice(combine, width_out, activation, expected):
    analysis = derived(Twice(combine, width_out, activation), torch.randn(6, 3))
    assert sorted(analysis.table()) == sorted(expected)
    if expected:
        assert analysis.blocked == ()
    else:   # h − h: the rules claim GL(4) (true: the output ignores fc1), the sensitivity control does not certify it
        assert [b.reason.split(":")[0] for b in analysis.blocked] == ["GL(4) not certifiable here"]


# -- export guards -----------------------------------------------------------------------------

def test_export_fallback_drops_its_guard_node():
    model = Lifted(lambda h: h, branchy=True)
    analysis = derived(model, torch.randn(5, 3))
    graph = analysis.model_graph
    assert graph.tracer == "export"
    assert sorted(graph.node(v)["op"] for v in graph.nodes) == sorted(
        ["input", "param", "param", "param", "param", "linear", "relu", "linear", "output"])
    assert sorted(analysis.table()) == sorted([("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)])
    assert analysis.blocked == ()


def test_fx_assertions_are_dropped():
    class Checked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            torch._assert(torch.isfinite(x).all(), "finite inputs")
            return self.fc2(torch.relu(self.fc1(x)))

    analysis = derived(Checked(), torch.randn(5, 3))
    assert "_assert" not in [op for op, _ in ops(analysis.model_graph).values()]
    assert sorted(analysis.table()) == sorted([PS4, S4]) and analysis.blocked == ()


# -- keyword arguments -------------------------------------------------------------------------

class Keywords(nn.Module):
    """``F.linear`` and ``torch.add`` called with keywords out of signature order (or positionally)."""

    def __init__(self, keywords=True):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)
        self.keywords = keywords

    def forward(self, x):
        if self.keywords:
            h = F.linear(input=x, bias=self.fc1.bias, weight=self.fc1.weight)
            h = torch.add(other=torch.relu(h), input=h * 2)
        else:
            h = F.linear(x, self.fc1.weight, self.fc1.bias)
            h = torch.add(h * 2, torch.relu(h))
        return self.fc2(torch.relu(h))


def test_keyword_inputs_follow_the_callee_signature():
    graph = symalg.trace(Keywords(), (torch.randn(5, 3),))
    recorded = ops(graph)
    assert recorded["linear"] == ("linear", ("x", "fc1_weight", "fc1_bias"))
    assert recorded["add"] == ("add", ("mul", "relu"))
    assert recorded["mul"] == ("mul", ("linear", None))      # h * 2: a constant operand stays an entry


def test_keyword_calls_derive_like_positional_ones():
    by_keyword, positional = (derived(Keywords(keywords), torch.randn(5, 3)) for keywords in (True, False))
    assert sorted(by_keyword.table()) == sorted(positional.table()) == sorted(
        [("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)])
    assert by_keyword.blocked == positional.blocked == ()


def test_module_keyword_inputs_follow_forward():
    class Attend(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x):
            return self.attn(value=self.v(x), key=self.k(x), query=self.q(x), need_weights=False)[0]

    graph = symalg.trace(Attend(), (torch.randn(2, 3, 4),))
    assert graph.node("attn")["inputs"] == ("q", "k", "v")


class ShapeMade(nn.Module):
    """``fc1``, then a product with tensors made from shapes: ``arange`` over the features (data varying along the
    sites' axis) and a number from the width (``√h``); then ``fc2``."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(h * (torch.arange(h.shape[-1]) + 1.0) / math.sqrt(h.size(-1)))


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_tensor_made_from_a_shape_is_data_not_a_shape_query(tracer):
    """``torch.arange(h.shape[-1])`` varies along the features, so ``h ⊙ arange`` keeps the diagonal groups and
    loses GL(4): the fx route once dropped the ``arange`` with the shape queries and claimed GL(4) as if it were a
    number (raw claims, before certification). The number ``√h`` is still dropped."""
    graph = symalg.trace(ShapeMade().double(), (torch.randn(5, 3, dtype=torch.float64),), tracer=tracer)
    assert "sqrt" not in [graph.node(v)["op"] for v in graph.nodes]
    raw = symalg.derive(graph, certify=False)
    assert sorted(s.label for s in raw.symmetries) == ["PositiveScaling(4, alpha=1) on fc1", "SignFlips(4) on fc1"]
    assert symalg.verify(raw).passed


def test_alibi_made_from_shapes_keeps_the_heads_apart():
    """ALiBi's per-head bias is built from ``arange`` of the scores' shape: attention folding must see it (one
    bias per head), so the head permutation is not claimed (a false claim the fuzzer found in the block family's
    first ALiBi model with four heads; ``python -m symalg.verification.fuzz --show 0 INDEX block`` prints it)."""
    from symalg.verification import fuzz

    case = next(c for c in (fuzz.generate(0, i, "block") for i in range(300))
                if re.match(r"(pre|post)-\w+-hand4-(qkv-)?alibi-", c.variant) and "shared" not in c.variant)
    model, inputs = case.build()
    graph = symalg.trace(model, inputs)
    (node,) = [v for v in graph.nodes if graph.node(v)["op"] == "attention"]
    assert graph.node(node)["settings"]["heads_alike"] is False
    raw = symalg.derive(graph, certify=False)
    assert [s.label for s in raw.symmetries if s.label.startswith("GL")]   # the heads' own groups hold
    assert not [s.label for s in raw.symmetries if s.label.endswith(".heads")]
    assert symalg.verify(raw).passed


def test_a_shared_module_read_two_ways_moves_nothing_it_shares():
    """An ALBERT block called twice, whose first call returns its split queries (so its attention is not folded)
    and whose second call is folded into attention heads: the heads' GL on the shared ``m2`` rows would also move
    the first call's returned queries. Overlapping but different regions of one tensor read by two nodes block
    their sites (a false claim the fuzzer found: ``python -m symalg.verification.fuzz --show 0 105 block``)."""
    from symalg.verification import fuzz

    model, inputs = fuzz.generate(0, 105, "block").build()
    raw = symalg.derive(symalg.trace(model, inputs), certify=False)
    assert not [s.label for s in raw.symmetries if s.label.startswith("GL") and "m2" in s.label]
    assert any("overlapping but different regions" in str(b) for b in raw.blocked)
    assert symalg.verify(raw).passed
