"""The input shapes a traced graph holds for (issue 29, item 1).

``torch.export`` runs the model's Python once, so a branch on a size is traced one way: the graph records which
input shapes it holds for (``ModelGraph.shape_note``, ``specialised_axes``, ``dynamic_axes``), and the analysis,
its dictionary and the report say so. fx records ops, not sizes: its graphs hold for every shape and say nothing.
"""
import pytest
import torch
from torch import nn

import symalg


class Branchy(nn.Module):
    """ReLU on batches of two or more, ``tanh(z) + 0.1 z²`` on a single example: fx cannot trace the branch."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 5), nn.Linear(5, 2)

    def forward(self, x):
        z = self.fc1(x)
        h = torch.relu(z) if x.shape[0] > 1 else torch.tanh(z) + 0.1 * z.pow(2)
        return self.fc2(h)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 5), nn.Linear(5, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class EvenBatches(Mlp):
    """A branch on the batch's parity: a guard no range states."""

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.relu(h) if x.shape[0] % 2 == 0 else torch.tanh(h))


class KnownBatches(Mlp):
    """Hashes a size (``in {…}``), which a symbolic size cannot be: only the static export runs."""

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(torch.relu(h) if x.shape[0] in {3, 4} else torch.tanh(h))


BRANCHY_NOTE = "the graph holds for x of shape (s0, 3) with s0 ≥ 2"


def test_a_size_branch_traced_by_export_names_the_input_axis_and_its_range():
    graph = symalg.trace(Branchy(), (torch.randn(4, 3),))
    assert graph.tracer == "export"
    assert graph.shape_note == BRANCHY_NOTE
    assert graph.specialised_axes == (("x", 1, 3),)
    assert graph.dynamic_axes == (("x", 0, "s0", 2, None),)
    assert "PositiveScaling(5, alpha=1)" in [s.group.name for s in symalg.derive(graph, certify=False).symmetries]
    analysis = symalg.derive(graph)   # certification tries a batch of one, where the scaling is false
    assert [s.group.name for s in analysis.symmetries] == ["S(5)"]
    assert f"shapes: {BRANCHY_NOTE}\n" in str(analysis)
    assert f"traced graph: {BRANCHY_NOTE} (the claims are checked beyond it)" in analysis.certification_summary()
    assert analysis.to_dict()["shape_note"] == BRANCHY_NOTE


def test_the_range_excludes_the_shape_where_the_certified_claim_fails():
    """The scaling the rules claim at batch 4 is false at batch 1, which the note leaves out (``s0 ≥ 2``)."""
    model = Branchy()
    scaled = Branchy()
    scaled.load_state_dict(model.state_dict())
    d = torch.rand(5) + 0.5
    with torch.no_grad():
        scaled.fc1.weight.mul_(d[:, None]), scaled.fc1.bias.mul_(d), scaled.fc2.weight.div_(d)
    for batch, changed in ((4, False), (2, False), (1, True)):
        x = torch.randn(batch, 3)
        assert (not torch.allclose(model(x), scaled(x), atol=1e-6)) == changed, batch
    low = symalg.trace(model, (torch.randn(1, 3),))
    assert low.shape_note == "the graph holds for x of shape (s0, 3) with s0 ≤ 1"
    assert "tanh" in [low.node(v)["op"] for v in low.nodes]


def test_a_shape_generic_export_states_only_the_axis_the_weights_fix():
    graph = symalg.trace(Mlp(), (torch.randn(4, 3),), tracer="export")
    assert graph.dynamic_axes == (("x", 0, "s0", 0, None),)
    assert graph.specialised_axes == (("x", 1, 3),)
    assert graph.shape_note == "the graph holds for x of shape (s0, 3)"


def test_a_guard_beyond_a_range_is_stated():
    graph = symalg.trace(EvenBatches(), (torch.randn(4, 3),))
    assert graph.shape_note == "the graph holds for x of shape (s0, 3) with Mod(s0, 2) = 0"


def test_where_the_dynamic_export_fails_the_static_graph_says_every_axis_is_fixed():
    graph = symalg.trace(KnownBatches(), (torch.randn(4, 3),), tracer="export")
    assert graph.tracer == "export" and graph.dynamic_axes == ()
    assert graph.specialised_axes == (("x", 0, 4), ("x", 1, 3))
    assert graph.shape_note.startswith("the graph holds for x of shape (4, 3) only (torch.export at dynamic shapes "
                                       "failed (TypeError: unhashable type")
    assert f"shapes: {graph.shape_note}" in str(symalg.derive(graph))


@pytest.mark.parametrize("build", [Mlp, lambda: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))])
def test_fx_graphs_hold_for_every_shape_and_say_nothing(build):
    graph = symalg.trace(build(), (torch.randn(4, 3),))
    assert graph.tracer == "fx"
    assert (graph.shape_note, graph.specialised_axes, graph.dynamic_axes) == ("", (), ())
    analysis = symalg.derive(graph)
    assert "shapes:" not in str(analysis) and analysis.to_dict()["shape_note"] == ""


@pytest.mark.parametrize("name, note", [
    ("bert", "the graph holds for input_ids of shape (s0, s1) with 2 ≤ s1 ≤ 16"),   # 16 positions
    ("llama", "the graph holds for input_ids of shape (s0, s1) with s1 ≥ 2, s0 ≠ 1")])
def test_hugging_face_models_state_the_sequence_lengths_and_batches_their_graph_holds_for(name, note, one_thread):
    """BERT's 16 position embeddings bound the sequence; one token takes other mask code; Llama's batch of one
    takes another path."""
    pytest.importorskip("transformers")
    from test_hf_models import MODELS, _traced
    build, _, _, constants = MODELS[name]
    graph = _traced(build, name, "positional", **constants)
    assert graph.tracer == "export" and graph.shape_note == note
    assert ("input_ids", 1, "s1", 2, 16 if name == "bert" else None) in graph.dynamic_axes
