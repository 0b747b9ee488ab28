"""Laws every op rule must satisfy, parametrised over every registered rule (as jaxlie runs its
axioms over every registered group).

Each op in ``OP_RULES`` registers a small example model (``register_rule(..., examples=...)``). For
each: tracing the example yields a graph in which the op appears; deriving it without certification
(the raw claims of the inference rules) gives claims that all hold numerically on the model; and so
they do through the ``torch.export`` route, which must agree with fx on the claims.
"""
from __future__ import annotations

import pytest
import sympy as sp
import torch

import symalg
from symalg.catalogue.activations import declare_homogeneous, declare_linear, declare_odd
from symalg.errors import SpecError
from symalg.catalogue.rules import OP_RULES, RULE_EXAMPLES, register_rule
from symalg.verification.certification import assert_claims_hold

OPS = sorted(OP_RULES)
def example_graph(op: str, tracer: str = "fx"):
    torch.manual_seed(0)
    model, inputs = RULE_EXAMPLES[op]()
    return symalg.trace(model, inputs, tracer=tracer)


def ops_of(graph) -> list[str]:
    return [graph.node(v)["op"] for v in graph.nodes]


def test_every_rule_has_an_example():
    missing = sorted(set(OP_RULES) - set(RULE_EXAMPLES))
    assert set(RULE_EXAMPLES) == set(OP_RULES), f"rules without an example: {missing}"


def test_registering_a_rule_without_its_examples_is_refused():
    with pytest.raises(ValueError, match=r"examples must be given for exactly these ops, got \['cos_like'\]"):
        register_rule("sin_like", "cos_like", capabilities=(), examples={"cos_like": RULE_EXAMPLES["cos"]})
    assert "sin_like" not in OP_RULES and "cos_like" not in OP_RULES


@pytest.mark.parametrize("op", OPS)
def test_example_uses_its_op(op):
    assert op in ops_of(example_graph(op))


@pytest.mark.parametrize("op", OPS)
def test_raw_claims_of_the_example_hold(op):
    analysis = symalg.derive(example_graph(op), certify=False)
    assert analysis.symmetries, f"{op}: the example has no claim to check (a model around a dense layer always has one)"
    assert_claims_hold(analysis, draws=2)


@pytest.mark.parametrize("op", OPS)
def test_raw_claims_hold_through_torch_export(op):
    """Whatever torch.export makes of the example, the raw claims derived from its graph hold."""
    assert_claims_hold(symalg.derive(example_graph(op, tracer="export"), certify=False), draws=2)


EXPORT_ERASES = {"identity": "torch.export drops x.contiguous()",
                 "pack": "torch.export flattens the returned named tuple",
                 "multihead_attention": "torch.export decomposes nn.MultiheadAttention (folded: one attention node)"}
"""Ops that torch.export removes from the graph: the routes must still agree on the claims."""

def _groups(analysis) -> list[str]:
    return sorted(s.group.name for s in analysis.symmetries)


@pytest.mark.parametrize("op", OPS)
def test_fx_and_export_routes_agree_on_the_example(op):
    exported = example_graph(op, tracer="export")
    if op not in EXPORT_ERASES:
        assert op in ops_of(exported)
    assert _groups(symalg.derive(exported, certify=False)) == _groups(symalg.derive(example_graph(op), certify=False))


# -- overlays and op rules ---------------------------------------------------------------------------
def _sin_overlay(declaration):
    return symalg.overlay({"sin": symalg.CatalogueEntry("sin", lambda z: sp.sin(z), declaration)})


def test_overlay_entry_for_a_pointwise_op_replaces_its_rule():
    """``torch.sin`` is served by the pointwise rule (permutations only); an overlay declaring sin odd
    wins over that rule, so sign flips are claimed, and they hold."""
    graph = example_graph("sin")
    assert _groups(symalg.derive(graph, certify=False)) == ["S(4)"]
    analysis = symalg.derive(graph, catalogue=_sin_overlay(declare_odd()), certify=False)
    assert _groups(analysis) == ["S(4)", "SignFlips(4)"]
    assert_claims_hold(analysis, draws=2)


def test_overlay_entry_for_a_pointwise_op_is_checked_like_any_entry():
    """A false overlay declaration (sin positively homogeneous) is disproved by the symbolic checks, not
    silently replaced by the op rule's permutations."""
    analysis = symalg.derive(example_graph("sin"), catalogue=_sin_overlay(declare_homogeneous()), certify=False)
    assert "PositiveScaling" not in " ".join(_groups(analysis))
    assert any("disproved" in b.reason for b in analysis.blocked), analysis.blocked


@pytest.mark.parametrize("op", ["add", "linear", "layer_norm", "pow"])
def test_overlay_entry_named_like_a_structural_op_is_refused(op):
    overlay = symalg.overlay({op: symalg.CatalogueEntry(op, lambda z: z, declare_linear())})
    with pytest.raises(SpecError, match=f"entry '{op}' names the structural op '{op}'"):
        symalg.derive(example_graph("sin"), catalogue=overlay)


@pytest.mark.parametrize("pool, dims", [(torch.nn.MaxPool2d(2), 2), (torch.nn.AvgPool2d(2), 2),
                                        (torch.nn.AdaptiveAvgPool1d(3), 1)])
def test_export_reads_pooling_with_its_pooled_axes(pool, dims):
    """ATen pooling ops carry ``pooled_dims`` like the modules, so a pool over positions keeps the channel
    sites' claims and a pool over the sites' axis would remove them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3) if dims == 2 else torch.nn.Conv1d(2, 3, 3), torch.nn.ReLU(),
                                pool, torch.nn.Flatten(), torch.nn.LazyLinear(2))
    x = torch.randn(4, 2, 8, 8) if dims == 2 else torch.randn(4, 2, 8)
    model(x)
    graph = symalg.trace(model, (x,), tracer="export")
    (node,) = [v for v in graph.nodes if graph.node(v)["op"] in ("max_pool", "avg_pool")]
    assert graph.node(node)["settings"] == {"pooled_dims": dims}
    assert_claims_hold(symalg.derive(graph, certify=False), draws=2)
