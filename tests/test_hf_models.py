"""Hugging Face transformers through the torch front end, passed exactly as a user would (no wrapper).

Each model is built from a small config with random weights (nothing is downloaded) and traced by
``symalg.from_torch(model, (ids,))`` and by ``symalg.from_torch(model, input_ids=ids, attention_mask=mask)``
(the Llama family with ``use_cache=False``: a returned cache holds the rotated keys, which the query/key group moves).
torch.fx cannot trace any of them, so ``torch.export`` runs and the graph says why; every tensor returned
(``ModelOutput`` fields, the key/value tensors of a ``DynamicCache``) is an output; every claim is certified
and ``verify`` passes on every output. What is found today is recorded here and in docs/real_models.md:
finding more is other work, and those changes update both.
"""
import dataclasses

import pytest
import torch

import symalg
from symalg.verification.certification import CERTIFICATION_TOLERANCE, claim_errors

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH = 50, 7
CACHE = ("last_hidden_state", "cache.layers.0.keys", "cache.layers.0.values")
"""The outputs of a decoder returning its key/value cache (transformers 5.24 names the field ``cache``)."""
POOLED = ("last_hidden_state", "pooler_output")
ATTENTION = ["GL(8)"] * 4 + ["S(2)", "S(32)"] + ["Translations(8, bias)"] * 2
"""Per-head GL(d_k), GL(d_v) of 2 heads, the head permutations, the FFN's permutations, and each head's key bias
(softmax ignores a per-query constant)."""
NORM_GAINS = ["PositiveScaling(16, alpha=1)"] * 2 + ["SignFlips(16)"] * 2
"""Rescalings and sign flips of the two norms' gains (absorbed by the linear layers reading them)."""
VALUE_BIASES = ["Shears(8)"] * 2
"""Each head's value bias moved into the attention output's bias (the attention weights' rows sum to 1)."""
NORM_BIASES = ["Shears(16)"] * 2
"""The two pre-LN norms' biases moved into the biases of the layers reading them (GPT-2, ViT)."""
CENTRING = {"gpt2": "Translations(148, along 1)", "bert": "Translations(68, along 1)"}
"""LayerNorm centring: every writer of a sum whose readers are all LayerNorms may move its output along ``1``
(``LN(x + a 1) = LN(x)``): GPT-2's token and position embedding rows (50 + 16) and both ``c_proj`` maps, their
weight by ``1 vᵀ`` and bias by ``c 1`` (16 + 1 and 64 + 1); BERT's word, position and token-type embedding rows (50
+ 16 + 2: the sum its embedding LayerNorm reads; the sums of a layer's residual stream are also read by the maps
reading the previous LayerNorm's output, tied to them, so no centring is found there yet)."""


def _decoder(config_class, model_class):
    def build():
        config = config_class(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
        return model_class(config)
    return build


def _bert(**options):
    return transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=32,
                                                          max_position_embeddings=16, **options))


GATED_MLP = ["PositiveScaling(32, alpha=1)", "S(32)", "SignFlips(32)"]
"""A SwiGLU MLP ``down(silu(gate x) ⊙ up x)``: rescalings of ``up`` (both signs) and one permutation of all three."""

ROTARY_GQA = ["ComplexScaling(8)", "GL(8)", "S(2)"]
"""Rotary attention with 2 query heads over 1 key/value head: the complex scalings of the query/key planes of the
group (``self_attn.group0.qk``), its ``GL(d_v)`` (``group0.vo``) and the permutation of its two query heads."""
DECODER = sorted(NORM_GAINS + GATED_MLP + ["SignFlips(16)"] + ROTARY_GQA)
"""Llama-style: the RMS norms' gains (the final norm's gain flips sign only: it is the output), the SwiGLU MLP and the
rotary grouped-query attention."""
NO_CACHE = {"use_cache": False}

MODELS = {  # name: (build, output paths, groups found today, constant keyword inputs)
    "gpt2": (lambda: transformers.GPT2Model(transformers.GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16,
                                                                    n_layer=1, n_head=2)), CACHE,
             sorted(NORM_GAINS + NORM_BIASES + ["S(64)", CENTRING["gpt2"]]), {}),
    "llama": (_decoder(transformers.LlamaConfig, transformers.LlamaModel), ("last_hidden_state",), DECODER, NO_CACHE),
    "mistral": (_decoder(transformers.MistralConfig, transformers.MistralModel), ("last_hidden_state",), DECODER,
                NO_CACHE),
    "qwen2": (_decoder(transformers.Qwen2Config, transformers.Qwen2Model), ("last_hidden_state",), DECODER,
              NO_CACHE),
    "bert": (_bert, POOLED, sorted(ATTENTION + VALUE_BIASES + [CENTRING["bert"]]), {}),
    "vit": (lambda: transformers.ViTModel(transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3,
                                                                 hidden_size=16, num_hidden_layers=1,
                                                                 num_attention_heads=2, intermediate_size=32)),
            POOLED, sorted(ATTENTION + VALUE_BIASES + NORM_GAINS + NORM_BIASES), {}),
    "t5": (lambda: transformers.T5EncoderModel(transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32,
                                                                     num_layers=1, num_heads=2)),
           ("last_hidden_state",), sorted(["GL(8)"] * 4 + NORM_GAINS + ["PositiveScaling(32, alpha=1)", "S(32)",
                                                                       "SignFlips(16)"]), {}),
}


def _inputs(name: str, form: str) -> tuple[tuple, dict]:
    """``(positional, keyword)`` example inputs as a user writes them: token ids (pixels for ViT), and for the
    keyword form an attention mask with padding in the second sequence."""
    generator = torch.Generator().manual_seed(0)
    if name == "vit":
        pixels = torch.randn(2, 3, 8, 8, generator=generator)
        return ((pixels,), {}) if form == "positional" else ((), {"pixel_values": pixels})
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=generator)
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, 5:] = 0
    return ((ids,), {}) if form == "positional" else ((), {"input_ids": ids, "attention_mask": mask})


def _traced(build, name: str, form: str, **constants: object) -> symalg.ModelGraph:
    torch.manual_seed(0)
    args, kwargs = _inputs(name, form)
    return symalg.from_torch(build().eval(), args, **kwargs, **constants)


@pytest.mark.parametrize("form", ["positional", "keywords"])
@pytest.mark.parametrize("name", list(MODELS))
def test_hugging_face_model_traces_derives_and_verifies(name, form, one_thread):
    build, paths, groups, constants = MODELS[name]
    graph = _traced(build, name, form, **constants)
    assert graph.tracer == "export" and graph.tracer_note.startswith("torch.fx failed (")
    assert graph.output_paths == paths
    analysis = symalg.derive(graph)
    assert sorted(s.group.name for s in analysis.symmetries) == groups
    assert len(analysis.certification) == len(analysis.symmetries)  # no claim failed certification
    assert all(e.holds for e in analysis.certification)
    report = symalg.verify(analysis)
    assert report.passed, report
    invariance = [c for c in report.checks if c.check == "invariance"]
    assert len(invariance) == len(groups)


def test_a_returned_key_value_cache_blocks_the_attention_groups_it_changes(one_thread):
    """A BERT decoder returns its keys and values in a ``DynamicCache``: they are outputs, so the per-head groups
    (which move keys and values) are not claimed, the report says why and what to pass; with
    ``use_cache=False`` they are found, and certified against the cached outputs they fail there."""
    torch.manual_seed(0)
    model = _bert(is_decoder=True).eval()
    (ids,), _ = _inputs("bert", "positional")
    cached = symalg.derive(symalg.from_torch(model, input_ids=ids))
    assert cached.model_graph.output_paths == ("last_hidden_state", "pooler_output", *CACHE[1:])
    assert [s.group.name for s in cached.symmetries] == [CENTRING["bert"], "S(32)"]
    assert "note: cache is an output (a key/value cache: the attention symmetries that move keys or " \
           "values change it; trace with use_cache=False" in str(cached)
    plain = symalg.derive(symalg.from_torch(model, input_ids=ids, use_cache=False))
    assert plain.model_graph.example_kwargs == {"input_ids": ids, "use_cache": False}
    assert sorted(s.group.name for s in plain.symmetries) == sorted(ATTENTION + VALUE_BIASES + [CENTRING["bert"]])
    errors = claim_errors(dataclasses.replace(plain, model_graph=cached.model_graph))
    moved = {e.symmetry.label: (e.error, e.output) for e in errors}
    for label, (error, output) in moved.items():
        if label.startswith(("S(32)", CENTRING["bert"])):   # neither moves keys or values
            assert error <= CERTIFICATION_TOLERANCE
        else:
            assert error > 1e3 * CERTIFICATION_TOLERANCE and output.startswith("cache.layers.0."), label


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2"])
def test_rotary_attention_of_the_llama_family_is_folded_with_its_sites_named_by_module(name, one_thread):
    """The rotary step (``apply_rotary_pos_emb``) and the key/value repetition (``repeat_kv``) are folded into one
    attention node; Qwen2's query/key biases move with the complex scalings, and its key bias does not translate."""
    graph = _traced(MODELS[name][0], name, "keywords", **NO_CACHE)
    attention = [d for _, d in graph.graph.nodes(data=True) if d["op"] == "attention"]
    assert len(attention) == 1 and attention[0]["settings"]["rotary"]["equal_halves"]
    analysis = symalg.derive(graph)
    qk = next(s for s in analysis.symmetries if s.group.kind == "C")
    assert qk.site == "layers.0.self_attn.group0.qk"
    moved = {b.tensor for b in qk.bindings}
    biases = {"layers.0.self_attn.q_proj.bias", "layers.0.self_attn.k_proj.bias"} if name == "qwen2" else set()
    assert moved == {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight"} | biases
    assert not any(s.group.kind == "T" for s in analysis.symmetries)


def test_a_returned_cache_of_rotated_keys_blocks_the_rotary_attention_groups(one_thread):
    """With ``use_cache`` (the default) the rotated keys and the values are outputs: nothing moving them is claimed."""
    graph = _traced(MODELS["llama"][0], "llama", "keywords")
    assert len(graph.output_paths) == 3 and graph.output_paths[0] == "last_hidden_state"   # and keys, values
    analysis = symalg.derive(graph)
    assert sorted(s.group.name for s in analysis.symmetries) == sorted(NORM_GAINS + GATED_MLP + ["SignFlips(16)"])


@pytest.mark.parametrize("name, moved", [
    ("gpt2", {"h.0.ln_1": ["h.0.ln_1.bias", "h.0.attn.c_attn.bias"],          # addmm: c_attn.bias − Wᵀ t
              "h.0.ln_2": ["h.0.ln_2.bias", "h.0.mlp.c_fc.bias"]}),
    ("vit", {"layers.0.layernorm_before": ["layers.0.layernorm_before.bias"] + [
                 f"layers.0.attention.{p}_proj.bias" for p in "qkv"],
             "layers.0.layernorm_after": ["layers.0.layernorm_after.bias", "layers.0.mlp.fc1.bias"]} | {
             f"layers.0.attention.head{h}.vo": ["layers.0.attention.v_proj.bias", "layers.0.attention.o_proj.bias"]
             for h in (0, 1)}),
    ("bert", {f"encoder.layer.0.attention.self.head{h}.vo": ["encoder.layer.0.attention.self.value.bias",
                                                             "encoder.layer.0.attention.output.dense.bias"]
              for h in (0, 1)})])
def test_biases_moved_into_the_next_layers_bias(name, moved, one_thread):
    """Pre-LN norms (GPT-2's ``ln_1``/``ln_2``, ViT's ``layernorm_before``/``after``) give their bias to the layers
    reading them; the value bias goes into the attention output's bias (BERT, ViT). BERT's norms are post-LN: their
    output is the residual stream (and an output), so their biases do not move, nor do the final norms'."""
    analysis = symalg.derive(_traced(MODELS[name][0], name, "positional"))
    shears = {s.site: list(s.tensors) for s in analysis.symmetries if s.sheared}
    assert shears == moved
    params = analysis.model_graph.parameters()
    for symmetry in (s for s in analysis.symmetries if s.sheared):
        readers = {a.weight for f in symmetry.translations for a in f.absorbers}
        assert readers == set(symmetry.reads) and readers <= set(params)   # read at θ, never moved by the shear
        assert not readers & set(symmetry.tensors)
    assert not any("LayerNorm" in site or site in ("ln_f", "layernorm") for site in shears)


def test_the_report_says_which_tracer_ran_and_why_the_other_failed():
    build = MODELS["gpt2"][0]
    summary = symalg.derive(_traced(build, "gpt2", "positional")).to_dict()
    assert summary["tracer"] == "export"
    assert summary["tracer_note"] == "torch.fx failed (TypeError: 'Proxy' object does not support item assignment)"
    assert summary["outputs"] == list(CACHE)


def test_export_is_deterministic():
    """Two traces of the same model give the same nodes, ops and edges (site names are node names)."""
    build = MODELS["llama"][0]
    first, second = (_traced(build, "llama", "keywords") for _ in range(2))
    assert [(v, first.node(v)["op"]) for v in first.nodes] == [(v, second.node(v)["op"]) for v in second.nodes]
    assert list(first.graph.edges) == list(second.graph.edges)


EAGER = {  # name: (build with eager attention, groups found with output_attentions=True)
    "bert": (lambda: _bert(attn_implementation="eager"),
             sorted([g for g in ATTENTION if g != "S(2)"] + VALUE_BIASES + [CENTRING["bert"]])),
    "vit": (lambda: transformers.ViTModel(transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3,
                                                                 hidden_size=16, num_hidden_layers=1,
                                                                 num_attention_heads=2, intermediate_size=32,
                                                                 attn_implementation="eager")),
            sorted([g for g in ATTENTION if g != "S(2)"] + VALUE_BIASES + NORM_GAINS + NORM_BIASES)),
    "t5": (lambda: transformers.T5EncoderModel(transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32,
                                                                     num_layers=1, num_heads=2,
                                                                     attn_implementation="eager")),
           MODELS["t5"][2]),
}


@pytest.mark.parametrize("name", list(EAGER))
def test_returned_attention_probabilities_keep_the_per_head_groups(name, one_thread):
    """``output_attentions=True`` (eager attention) returns every layer's probabilities ``softmax(Q_h K_hᵀ/√d + M)``:
    they are invariant under the per-head ``GL(d_k)``, the key biases, ``GL(d_v)`` and the value shears (they do not
    depend on the values), so those stay; a head
    permutation permutes their head axis, and as a model output they must not move, so it goes (T5 has none: its
    position bias differs per head). Certified and verified on every output, the probabilities included."""
    build, groups = EAGER[name]
    torch.manual_seed(0)
    args, kwargs = _inputs(name, "keywords")
    graph = symalg.from_torch(build().eval(), args, output_attentions=True, **kwargs)
    assert graph.output_paths[-1] == "attentions.0"
    analysis = symalg.derive(graph)
    assert sorted(s.group.name for s in analysis.symmetries) == groups
    assert all(e.holds for e in analysis.certification)
    assert any(b.site.endswith(".heads") and "attentions.0" in b.reason for b in analysis.sites.restrictions) \
        or name == "t5"
    # ViT's eager softmax computes in float32 (certified to float32 rounding): verified in float32
    report = symalg.verify(analysis, dtype=torch.float32 if name == "vit" else torch.float64)
    assert report.passed, report


def _gpt2(**options) -> symalg.Analysis:
    torch.manual_seed(0)
    (ids,), _ = _inputs("gpt2", "positional")
    return symalg.derive(symalg.from_torch(MODELS["gpt2"][0]().eval(), input_ids=ids, **options))


def test_gpt2_without_its_cache_has_the_attention_groups(one_thread):
    """GPT-2's packed ``c_attn`` (``addmm``, ``view``, ``split`` into ``q, k, v``) is cut into one site per piece,
    so with ``use_cache=False`` its attention folds: per-head groups, key biases, value biases moved into
    ``c_proj.bias`` and head permutations, certified and verified."""
    analysis = _gpt2(use_cache=False)
    heads = ["GL(8)"] * 4 + ["S(2)"] + ["Translations(8, bias)"] * 2 + VALUE_BIASES
    assert sorted(s.group.name for s in analysis.symmetries) == sorted(heads + NORM_GAINS + NORM_BIASES
                                                                                  + ["S(64)", CENTRING["gpt2"]])
    assert {s.label for s in analysis.symmetries} >= {f"GL(8) on h.0.attn.c_attn.head{h}.{p}"
                                                      for h in (0, 1) for p in ("qk", "vo")}
    assert symalg.verify(analysis).passed


def test_gpt2_with_its_cache_says_why_its_attention_is_not_folded(one_thread):
    """With the cache (the default), keys and values are outputs: the per-head groups would change them, so nothing
    of the attention is claimed, and the blocked notes of the head splits name the cache output that stopped the
    fold and the fix."""
    analysis = _gpt2()
    assert sorted(s.group.name for s in analysis.symmetries) == MODELS["gpt2"][2]
    notes = [str(b) for b in analysis.blocked if "c_attn" in b.site]
    assert len(notes) == 3 and all("the attention at node 'scaled_dot_product_attention' is not folded: node 'cat' "
                                   "is also read by the model output" in note and "use_cache=False" in note
                                   for note in notes), notes


MOE = {  # name: (build, claims certified today; the routing and the experts blocked)
    "mixtral": (lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=16)),
                ["ComplexScaling(8)", "GL(8)", "PositiveScaling(16, alpha=1)", "S(2)", "SignFlips(16)",
                 "Translations(16, along 1)"]),
    "qwen2_moe": (lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
        shared_expert_intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=16)),
                  ["ComplexScaling(8)", "GL(8)", "PositiveScaling(16, alpha=1)", "PositiveScaling(16, alpha=1)",
                   "S(16)", "S(2)", "SignFlips(16)", "SignFlips(16)", "Translations(16, along 1)"]),
}


@pytest.mark.parametrize("name", list(MOE))
def test_mixture_of_experts_models_derive_with_their_routing_blocked(name, one_thread):
    """Mixtral and Qwen2-MoE used to crash the transpose rule (``'tuple' object has no attribute 'segments'``):
    their experts are 3-d stacks ``(E, out, in)`` transposed for ``grouped_mm``. Such a parameter is now read as by
    an unknown op (a blocked note names it); the router's top-k blocks its permutations, naming the node. Their
    default experts run ``grouped_mm``, float32 only, so derive's float64 certification is refused with torch's
    message; the claims certify on the same weights with the float64 ``batched_mm`` experts."""
    torch.manual_seed(0)
    model = MOE[name][0]().float().eval()   # (the tests default to float64)
    (ids,), _ = _inputs(name, "positional")
    graph = symalg.from_torch(model, ids, use_cache=False)
    with pytest.raises(symalg.SpecError, match=r"certification runs .*ForCausalLM in float64 .*failed: RuntimeError"):
        symalg.derive(graph)
    analysis = symalg.derive(graph, certify=False)
    assert sorted(s.group.name for s in analysis.symmetries) == MOE[name][1]
    notes = {b.node: str(b) for b in analysis.blocked}
    assert "S removed" in notes["topk"] and "model.layers.0.mlp.gate" in notes["topk"]
    for node, expert in (("transpose_4", "gate_up_proj"), ("transpose_5", "down_proj")):
        assert notes[node].startswith(f"model.layers.0.mlp.experts.{expert} (node {node}): no symmetry moves")
    model.config._experts_implementation = "batched_mm"   # the same experts, computed in float64
    errors = claim_errors(analysis)
    assert len(errors) == len(analysis.symmetries) and all(e.holds for e in errors), errors
