"""Sparse mixture-of-experts blocks (:mod:`symalg.catalogue.rules.moe`): a recognised block is one ``moe`` node (an fx
leaf, a ``symalg::moe`` call under export) whose rule claims the expert permutations, the experts' hidden-unit groups
(one element for every expert alike), and the maps reading and writing the stream; near misses are refused with a
note naming the block. Every claim is applied at generic parameters and the outputs compared on other input shapes."""
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import symalg
from symalg.catalogue.rules.moe import MoEStack, SparseMoE, recognise

EXPERTS, WIDTH = 4, 3
HIDDEN = {f"S({WIDTH}) on block.experts.hidden.gate", f"PositiveScaling({WIDTH}, alpha=1) on block.experts.hidden.up",
          f"SignFlips({WIDTH}) on block.experts.hidden.up"}
"""The experts' hidden units: permuted (gate and up rows, down columns), the up rows scaled and flipped against the
down columns."""
BLOCK = {f"S({EXPERTS}) on block.experts", "GL(4) on fc1", "GL(4) on block"} | HIDDEN
"""A recognised block between two dense layers: its experts permute, its input (``fc1``'s rows against the router's
and every expert's columns) and output (every down projection's rows against ``fc2``'s columns) carry ``GL``."""


def stack(train=False, seed=0, **options):
    torch.manual_seed(seed)
    return MoEStack(SparseMoE(4, WIDTH, experts=EXPERTS, **options)).double().train(train)


def inputs(batch=2, tokens=5):
    return (torch.randn(batch, tokens, 3, dtype=torch.float64),)


def worst_change(model, analysis, shapes=((3, 7), (1, 2))):
    """The worst relative output change of any claim, applied at the model's (generic) parameters with elements
    near and far from the identity and every discrete generator, on inputs of other shapes."""
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(1)
    worst = 0.0
    with torch.no_grad():
        for batch, tokens in shapes:
            x = inputs(batch, tokens)
            before = model(*x)
            before = before[0] if isinstance(before, tuple) else before
            for symmetry in analysis.symmetries:
                for _, g in symmetry.group.sample(generator):
                    after = torch.func.functional_call(model, symmetry.apply(params, g), x)
                    after = after[0] if isinstance(after, tuple) else after
                    worst = max(worst, float((after - before).norm() / before.norm()))
    return worst


def derived(model, tracer, certify=True):
    graph = symalg.trace(model, inputs(), tracer=tracer)
    return graph, symalg.derive(graph, certify=certify)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_top2_block_is_one_node_with_expert_permutations_and_hidden_groups(tracer):
    model = stack()
    graph, analysis = derived(model, tracer)
    assert [graph.node(v)["op"] for v in graph.nodes if graph.node(v)["op"] not in ("param",)] == \
        ["input", "linear", "moe", "linear", "output"]
    assert {s.label for s in analysis.symmetries} == BLOCK and not analysis.blocked
    assert worst_change(model, analysis) < 1e-9


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_shared_expert_keeps_its_own_groups_and_weights_need_not_be_renormalised(tracer):
    model = stack(shared=2, normalise=False, top_k=1)
    assert recognise(model.block)["normalise"] is False
    _, analysis = derived(model, tracer)
    shared = {"S(2) on block.shared_expert.gate", "PositiveScaling(2, alpha=1) on block.shared_expert.up",
              "SignFlips(2) on block.shared_expert.up"}
    assert {s.label for s in analysis.symmetries} == BLOCK | shared
    assert worst_change(model, analysis) < 1e-9


def test_router_noise_in_training_mode_refuses_the_block_with_a_note():
    model = stack(train=True, jitter=0.2)
    assert "training mode" in recognise(model.block)["refused"]
    graph, analysis = derived(model, "fx", certify=False)
    assert "moe" in [graph.node(v)["op"] for v in graph.nodes]
    assert not any("block" in s.label for s in analysis.symmetries)
    assert any("looks like a mixture of experts" in b.reason and "router noise" in b.reason for b in analysis.blocked)
    assert recognise(stack(jitter=0.2).block).get("refused") is None   # in eval mode the noise is off


@pytest.mark.parametrize("options", [{"widths": (3, 2, 3, 1)}, {"swapped": True}], ids=["widths", "swapped"])
@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_experts_of_other_layouts_are_refused(options, tracer):
    """Experts of different widths (masked columns) or the up rows before the gate rows do not match the formula."""
    _, analysis = derived(stack(**options), tracer, certify=False)
    assert not analysis.symmetries   # fc1's rows are read by the block, fc2's columns read its output: data
    assert any("does not match a top-2 softmax routing" in b.reason for b in analysis.blocked)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_router_logits_returned_as_an_output_remove_the_expert_permutation(tracer):
    model = stack(logits=True)
    assert recognise(model.block)["logits"] is True
    _, analysis = derived(model, tracer)
    assert {s.label for s in analysis.symmetries} == BLOCK - {f"S({EXPERTS}) on block.experts"}
    assert worst_change(model, analysis) < 1e-9


def test_modules_that_are_no_moe_block_are_not_recognised():
    assert recognise(nn.Linear(3, 4)) is None and recognise(nn.TransformerEncoderLayer(8, 2)) is None
    block = SparseMoE(4, 3, top_k=2)
    block.top_k = 7
    assert "top_k=7" in recognise(block)["refused"]


def _hf(model_type):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import zoo

    model, hf_inputs, _ = zoo.hf_builder(model_type)()
    return model, hf_inputs


@pytest.mark.slow
@pytest.mark.parametrize("model_type, shared", [("mixtral", False), ("qwen2_moe", True)])
def test_tiny_hugging_face_moe_models_get_expert_permutations(model_type, shared):
    """The census's tiny Mixtral and Qwen2-MoE: every layer's block is one ``moe`` node with expert permutations and
    hidden groups (Qwen2-MoE's shared expert too); the claims hold (the routers take their softmax in float32, so the
    outputs change at ``1e-8``)."""
    model, hf_inputs = _hf(model_type)
    graph = symalg.trace(model, **hf_inputs(2, 7))
    analysis = symalg.derive(graph)
    labels = {s.label for s in analysis.symmetries}
    for layer in (0, 1):
        assert f"S(4) on layers.{layer}.mlp.experts" in labels
        assert any(f"layers.{layer}.mlp.experts.hidden.up" in label for label in labels)
        assert shared == any(f"layers.{layer}.mlp.shared_expert.up" in label for label in labels)
    assert not any("mlp" in b.node or "moe" in b.reason for b in analysis.blocked)
    params = dict(model.named_parameters())
    x = hf_inputs(1, 9)
    with torch.no_grad():
        before = model(**x).last_hidden_state
        for symmetry in analysis.symmetries:
            g = symmetry.group.sample(torch.Generator().manual_seed(0))[-1][1]
            after = torch.func.functional_call(model, symmetry.apply(params, g), (), x).last_hidden_state
            assert float((after - before).norm() / before.norm()) < 1e-6, symmetry.label
