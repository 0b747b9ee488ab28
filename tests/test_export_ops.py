"""The ATen ops real models use, through ``torch.export`` (and fx where it traces): GPT-2's ``addmm`` dense layer,
eval-mode dropout, written-out RMS norm (a graph pass), ViT's ``flatten(2)`` of patches, CLS-token selection,
tanh-approximate GELU; each claim checked by ``verify`` on the model, with negative controls that must block.
Hugging Face modules are built from small configs with random weights (nothing is downloaded)."""
from __future__ import annotations

import networkx as nx
import pytest
import torch
from torch import nn

import symalg
from symalg.frontend.rms_norm_folding import fold_rms_norm
from symalg.verification.certification import assert_claims_hold

ROUTES = ["fx", "export"]


def groups(analysis) -> list[tuple[str, str]]:
    return sorted((s.site, s.group.name) for s in analysis.symmetries)


def invariance_errors(report) -> dict[str, float]:
    return {c.symmetry: c.max_error for c in report.checks if c.check == "invariance"}


def verified(model: nn.Module, *inputs, tracer: str = "export"):
    """``derive`` (certified) of ``model`` in float64 and its verification report, which must pass with an
    invariance check per claim."""
    torch.manual_seed(0)
    model = model.double().eval()
    analysis = symalg.derive(symalg.trace(model, tuple(i.double() if i.is_floating_point() else i for i in inputs),
                                          tracer=tracer))
    report = symalg.verify(analysis)
    assert report.passed, report.failures
    assert set(invariance_errors(report)) == {s.label for s in analysis.symmetries}
    assert max(invariance_errors(report).values(), default=0.0) < 1e-9
    return analysis


class Around(nn.Module):
    """``head(body(stem(x)))``: a model with a dense layer on each side of ``body``."""

    def __init__(self, body, n: int = 3, d: int = 8, m: int = 2):
        super().__init__()
        self.stem, self.body, self.head = nn.Linear(n, d), body, nn.Linear(d, m)

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


class Lambda(nn.Module):
    def __init__(self, function, **members):
        super().__init__()
        self.function = function
        for name, member in members.items():
            setattr(self, name, member)

    def forward(self, x):
        return self.function(self, x)


# -- RMS norm written out: the pass alone, then through derive and verify ------------------------------------------

def written_rms_norm(graph: nx.DiGraph, x: str, weight: str | None, mean_dim=-1, eps=1e-6, shared_variance=False):
    """Add ``[weight *] (x * rsqrt(x.pow(2).mean(mean_dim, keepdim=True) + eps))`` to ``graph`` (canonical nodes)."""
    shape = graph.nodes[x]["shape"]
    reduced = tuple(1 if i == mean_dim % len(shape) else s for i, s in enumerate(shape))

    def add(name, op, inputs, arguments, out_shape=shape, kind="function"):
        graph.add_node(name, op=op, kind=kind, module=None, params={}, buffers={}, settings={}, inputs=inputs,
                       arguments=arguments, shape=out_shape, where=f"node {name!r}")
        for index, source in enumerate(inputs):
            if source is not None and not graph.has_edge(source, name):
                graph.add_edge(source, name, index=index)

    add("pow", "pow", (x, None), {"arg0": None, "arg1": 2})
    add("mean", "mean", ("pow",), {"arg0": None, "arg1": [mean_dim], "arg2": True}, reduced)
    add("add", "add", ("mean", None), {"arg0": None, "arg1": eps}, reduced)
    add("rsqrt", "rsqrt", ("add",), {"arg0": None}, reduced)
    add("mul", "mul", (x, "rsqrt"), {"arg0": None, "arg1": None})
    if shared_variance:
        add("log", "log", ("mean",), {"arg0": None}, reduced)
    if weight:
        add("mul_1", "mul", (weight, "mul"), {"arg0": None, "arg1": None})


def base_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    common = dict(module=None, buffers={}, settings={}, arguments={}, where="")
    graph.add_node("x", op="input", kind="input", params={}, inputs=(), shape=(5, 4), **common)
    graph.add_node("w", op="param", kind="param", params={"value": "norm.weight"}, inputs=(), shape=(4,), **common)
    return graph


def test_rms_norm_pass_folds_the_written_out_norm_into_one_node():
    graph = base_graph()
    written_rms_norm(graph, "x", "w", eps=1e-5)
    folded = fold_rms_norm(graph)
    assert sorted(folded.nodes) == ["mul_1", "w", "x"]
    node = folded.nodes["mul_1"]
    assert (node["op"], node["inputs"], node["params"]) == ("rms_norm", ("x", "w"), {"weight": "norm.weight"})
    assert node["settings"] == {"normalized_shape": (4,), "eps": 1e-5}
    assert node["where"] == "node 'mul_1' (RMS norm written out: pow, mean, add, rsqrt, mul, weight)"
    assert sorted(folded.predecessors("mul_1")) == ["w", "x"] and "mul_1" in graph  # the input graph is unchanged
    assert graph.nodes["mul_1"]["op"] == "mul"


def test_rms_norm_pass_without_a_gain_ends_at_the_product():
    graph = base_graph()
    written_rms_norm(graph, "x", None)
    folded = fold_rms_norm(graph)
    assert [(v, folded.nodes[v]["op"], folded.nodes[v]["inputs"]) for v in folded if v not in ("x", "w")] == \
        [("mul", "rms_norm", ("x",))]


@pytest.mark.parametrize("change", ["mean over the first axis", "variance read elsewhere", "negative eps"])
def test_rms_norm_pass_folds_nothing_else(change):
    graph = base_graph()
    written_rms_norm(graph, "x", "w", mean_dim=0 if change == "mean over the first axis" else -1,
                     shared_variance=change == "variance read elsewhere",
                     eps=-1.0 if change == "negative eps" else 1e-6)
    folded = fold_rms_norm(graph)
    assert "rms_norm" not in [folded.nodes[v]["op"] for v in folded]
    assert sorted(folded.nodes) == sorted(graph.nodes)


def gain_free_rms(self, h):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.mark.parametrize("tracer", ROUTES)
def test_written_out_rms_norm_without_gain_keeps_the_orthogonal_group(tracer):
    """``h · rsqrt(mean(h²) + ε)`` is ``nn.RMSNorm`` without a gain: ``O(8)`` on the site before it, verified."""
    analysis = verified(Around(Lambda(gain_free_rms)), torch.randn(5, 3), tracer=tracer)
    assert ("stem", "O(8)") in groups(analysis)
    graph = analysis.model_graph
    assert [n for n in graph.nodes if graph.node(n)["op"] == "rms_norm"]


@pytest.mark.parametrize("tracer", ROUTES)
def test_written_out_rms_norm_over_a_non_feature_axis_blocks_the_orthogonal_group(tracer):
    """Negative control: the same norm over the batch axis (after a transpose) normalises each feature alike, so
    only permutations and sign flips of the features pass; the note names the folded node."""
    body = Lambda(lambda self, h: gain_free_rms(self, h.transpose(0, 1)).transpose(0, 1))
    analysis = verified(Around(body), torch.randn(5, 3), tracer=tracer)
    assert {g for _, g in groups(analysis)} == {"S(8)", "SignFlips(8)"}
    assert any("RMS norm works along axes [-1], but the sites run along axis -2" in b.reason
               for b in analysis.blocked), analysis.blocked


@pytest.mark.parametrize("norm", ["LlamaRMSNorm", "T5LayerNorm"])
def test_hugging_face_rms_norms_are_recognised(norm):
    """Llama's and T5's own RMSNorm classes (which compute in float32) become ``rms_norm``: their gain's scalings
    and sign flips, and the permutations, hold; they are checked at float32's tolerance, since the model rounds to
    float32 inside whatever dtype it runs in."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.t5.modeling_t5 import T5LayerNorm
    torch.manual_seed(0)
    model = Around({"LlamaRMSNorm": LlamaRMSNorm, "T5LayerNorm": T5LayerNorm}[norm](8)).eval()
    with torch.no_grad():
        model.body.weight.uniform_(0.5, 1.5)
    graph = symalg.trace(model, (torch.randn(5, 3),), tracer="export")
    assert "rms_norm" in [graph.node(v)["op"] for v in graph.nodes]
    analysis = symalg.derive(graph, certify=False)
    assert groups(analysis) == [("body", "PositiveScaling(8, alpha=1)"), ("body", "SignFlips(8)"),
                                ("stem", "S(8)"), ("stem", "SignFlips(8)")]
    report = symalg.verify(analysis, dtype=torch.float32)
    assert report.passed, report.failures
    assert max(invariance_errors(report).values()) < 1e-4


# -- GPT-2's Conv1D (addmm), tanh GELU and eval dropout ------------------------------------------------------------

def test_gpt2_mlp_claims_its_hidden_permutations():
    """``GPT2MLP``: ``addmm`` dense layers with ``(in, out)`` weights around tanh-approximate GELU, then eval dropout:
    the 16 hidden units permute (moving ``c_fc``'s columns and bias and ``c_proj``'s rows)."""
    pytest.importorskip("transformers")
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    config = GPT2Config(n_embd=8, n_head=2, n_layer=1, n_positions=16, vocab_size=20, bos_token_id=0, eos_token_id=0,
                        activation_function="gelu_pytorch_tanh")
    torch.manual_seed(0)
    model = GPT2MLP(16, config)
    graph = symalg.trace(model.double().eval(), (torch.randn(2, 3, 8, dtype=torch.float64),))
    assert graph.tracer == "fx"
    assert {"addmm", "gelu_tanh", "dropout"} <= {graph.node(v)["op"] for v in graph.nodes}
    analysis = verified(Around(model, n=3, d=8), torch.randn(2, 3, 3))
    assert ("body.c_fc", "S(16)") in groups(analysis)
    (claim,) = [s for s in analysis.symmetries if s.site == "body.c_fc"]
    assert {(b.tensor, b.axis) for b in claim.bindings} >= {("body.c_fc.weight", 1), ("body.c_fc.bias", 0),
                                                            ("body.c_proj.weight", 0)}


@pytest.mark.parametrize("tracer", ROUTES)
def test_addmm_with_a_plain_bias_only(tracer):
    """Negative control: ``addmm`` whose added term is a value (not a bias parameter) is no dense layer; the site
    it reads gets nothing, and the note names the node."""
    body = Lambda(lambda self, h: torch.addmm(h, torch.relu(h), self.weight), weight=nn.Parameter(torch.randn(8, 8)))
    analysis = symalg.derive(symalg.trace(Around(body).double(), (torch.randn(5, 3, dtype=torch.float64),),
                                          tracer=tracer), certify=False)
    assert_claims_hold(analysis, draws=2)
    assert not [s for s in analysis.symmetries if s.site == "stem"]
    assert any(b.node.startswith("addmm") and "not in the equivariance catalogue" in b.reason
               for b in analysis.blocked), analysis.blocked


# -- selections and reshapes on the token axis ---------------------------------------------------------------------

@pytest.mark.parametrize("tracer", ROUTES)
def test_cls_token_selection_passes_every_action(tracer):
    """``x[:, 0]`` picks the first token: the feature sites pass untouched (ReLU's scalings and permutations)."""
    body = Lambda(lambda self, h: torch.relu(h)[:, 0])
    analysis = verified(Around(body), torch.randn(2, 5, 3), tracer=tracer)
    assert groups(analysis) == [("stem", "PositiveScaling(8, alpha=1)"), ("stem", "S(8)")]


@pytest.mark.parametrize("tracer", ROUTES)
def test_selecting_a_feature_blocks_its_site(tracer):
    """Negative control: ``h[:, 0]`` on ``(B, d)`` picks feature 0, which no action of the site may move."""
    body = Lambda(lambda self, h: torch.relu(h)[:, 0].unsqueeze(-1) * self.scale, scale=nn.Parameter(torch.ones(8)))
    analysis = symalg.derive(symalg.trace(Around(body).double(), (torch.randn(5, 3, dtype=torch.float64),),
                                          tracer=tracer), certify=False)
    assert not [s for s in analysis.symmetries if s.site == "stem"]
    assert any("picks one coordinate of the axis -1 the sites run along" in b.reason for b in analysis.blocked)


class Patches(nn.Module):
    """ViT's patch embedding: ``conv(x).flatten(2).transpose(1, 2)``, then a dense head per token."""

    def __init__(self):
        super().__init__()
        self.projection, self.head = nn.Conv2d(3, 8, 4, stride=4), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.projection(x).flatten(2).transpose(1, 2)))


@pytest.mark.parametrize("tracer", ROUTES)
def test_patch_flattening_keeps_the_channel_sites(tracer):
    """``flatten(2)`` merges the positions after the channel axis, keeping it whole; the channels scale and permute."""
    analysis = verified(Patches(), torch.randn(2, 3, 8, 8), tracer=tracer)
    assert groups(analysis) == [("projection", "PositiveScaling(8, alpha=1)"), ("projection", "S(8)")]


@pytest.mark.parametrize("tracer", ROUTES)
def test_splitting_the_feature_axis_into_heads_outside_attention_blocks(tracer):
    """Negative control: ``h.view(B, 2, 4)`` splits the sites' axis; outside folded attention nothing passes, and
    the note says so."""
    body = Lambda(lambda self, h: torch.relu(h).view(5, 2, 4).softmax(-1).reshape(5, 8))
    analysis = symalg.derive(symalg.trace(Around(body).double(), (torch.randn(5, 3, dtype=torch.float64),),
                                          tracer=tracer), certify=False)
    assert not [s for s in analysis.symmetries if s.site == "stem"]
    assert any("splitting the sites' axis -1" in b.reason for b in analysis.blocked), analysis.blocked


class Head(nn.Module):
    """A Hugging Face embedding module read by a dense head (on the first token, or on every token)."""

    def __init__(self, body: nn.Module, first_token: bool):
        super().__init__()
        self.body, self.head, self.first_token = body, nn.Linear(8, 2), first_token

    def forward(self, x):
        h = self.body(x)
        return self.head(h[:, 0] if self.first_token else h)


def test_vit_embeddings_move_patches_cls_token_and_positions_together():
    """``ViTEmbeddings``: the patch conv's channels, the CLS token (``expand``, then ``cat`` along the tokens) and
    the position embeddings all index the stream; with the head reading ``x[:, 0]``, ``GL(8)`` moves them
    together (only torch.export traces the module)."""
    pytest.importorskip("transformers")
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings
    config = ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, image_size=8,
                       patch_size=4, num_channels=3)
    torch.manual_seed(0)
    analysis = verified(Head(ViTEmbeddings(config), first_token=True), torch.randn(2, 3, 8, 8), tracer="auto")
    assert analysis.model_graph.tracer == "export"
    (claim,) = analysis.symmetries
    assert claim.group.name == "GL(8)"
    assert {b.tensor for b in claim.bindings} == {"body.cls_token", "body.position_embeddings", "head.weight",
                                                  "body.patch_embeddings.projection.weight",
                                                  "body.patch_embeddings.projection.bias"}


def test_bert_embeddings_permute_the_tables_through_the_layer_norm():
    """``BertEmbeddings``: ``aten.embedding`` takes the table first; the three tables' columns are tied by the sum,
    permute through the layer norm, whose gain scales and flips; every row of the three tables moves along ``1``
    (the layer norm's centring: 20 + 16 + 2 rows)."""
    pytest.importorskip("transformers")
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertEmbeddings
    config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                        vocab_size=20, max_position_embeddings=16, type_vocab_size=2)
    torch.manual_seed(0)
    analysis = verified(Head(BertEmbeddings(config), first_token=False), torch.randint(0, 20, (2, 5)), tracer="auto")
    assert [s.label for s in analysis.symmetries] == [
        "Translations(38, along 1) on body.word_embeddings", "PositiveScaling(8, alpha=1) on body.LayerNorm",
        "SignFlips(8) on body.LayerNorm",
        "Shears(8) on body.LayerNorm", "S(8) on body.word_embeddings"]   # the norm's bias into the head's
    (permutation,) = [s for s in analysis.symmetries if s.group.name == "S(8)"]
    assert {b.tensor for b in permutation.bindings} >= {"body.word_embeddings.weight",
                                                       "body.position_embeddings.weight",
                                                       "body.token_type_embeddings.weight"}


@pytest.mark.parametrize("tracer", ROUTES)
def test_an_embedding_renormalising_its_rows_claims_nothing(tracer):
    """Negative control: ``nn.Embedding(max_norm=1)`` rescales the rows it reads to norm 1, which no ``GL`` of the
    columns commutes with (the same table without ``max_norm`` has ``GL(4)``)."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 2)).double()
    renormed = nn.Sequential(nn.Embedding(6, 4, max_norm=1.0), nn.Linear(4, 2)).double()
    tokens = torch.arange(6)
    assert groups(symalg.derive(symalg.trace(plain, (tokens,), tracer=tracer))) == [("0", "GL(4)")]
    assert groups(symalg.derive(symalg.trace(renormed, (tokens,), tracer=tracer), certify=False)) == []


@pytest.mark.parametrize("form", ["addmm", "F.linear(h, W.t())"])
@pytest.mark.parametrize("tracer", ROUTES)
def test_a_dense_layer_with_a_transposed_weight_and_shifts_along_one(tracer, form):
    """``h @ W`` written as GPT-2's ``addmm`` or ``F.linear(h, W.t())`` before a softmax: the layer's outputs permute,
    and its weight (and ``addmm``'s bias) shift along ``1`` (``W ↦ W + v 1ᵀ``, ``b ↦ b + t 1``: softmax ignores
    them; the transposed weight is read as the one parameter it is), all verified."""
    from symalg.catalogue.rule_examples import Conv1D
    dense = (Lambda(lambda self, h: self.gpt(h), gpt=Conv1D(8, 8)) if form == "addmm" else
             Lambda(lambda self, h: nn.functional.linear(h, self.w.t()), w=nn.Parameter(torch.randn(8, 8))))
    body = Lambda(lambda self, h: torch.softmax(self.dense(h), -1), dense=dense)
    analysis = verified(Around(body), torch.randn(2, 4, 3), tracer=tracer)
    site = "body.dense.gpt" if form == "addmm" else "body.dense.w"
    expected = [("stem", "GL(8)"), (site, "S(8)"), (site, f"Translations({9 if form == 'addmm' else 8}, along 1)")]
    expected += [("stem", "Shears(8)")] if form == "addmm" else []   # stem's bias into the addmm's (a biased reader)
    assert groups(analysis) == sorted(expected)
