"""The meta-device route: models built under ``torch.device("meta")`` (shapes, no values) are traced and derived
with ``certify=False``; the claims and the generic orbit dimension must be those of the same model with real
weights, certified. What needs values (certification, verification, a rank at given parameters) is refused by
name."""
import pytest
import torch

import symalg
from symalg.numeric.orbit_rank import model_orbit_dimension

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def _hf(name):
    """A small Hugging Face model of each family the census runs at full size: (class, config, inputs)."""
    # distinct tokens: with one token repeated, T5's keys (no absolute positions) are all equal and its query/key
    # groups are not certifiable (the outputs ignore q and k), which certification's sensitivity control reports
    ids = (torch.arange(1, 9).reshape(1, 8),)
    width = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48, vocab_size=64)
    if name == "bert":
        return transformers.BertModel, transformers.BertConfig(**width), ids
    if name == "t5":
        config = transformers.T5Config(d_model=32, d_ff=48, d_kv=8, num_layers=1, num_heads=4, vocab_size=64,
                                       use_cache=False)
        return transformers.T5Model, config, (ids[0], None, ids[0])
    if name == "gpt2":
        return transformers.GPT2Model, transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64,
                                                               use_cache=False), ids
    config = transformers.LlamaConfig(**width, num_key_value_heads=2, use_cache=False)
    return transformers.LlamaModel, config, ids


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 2)), (torch.randn(5, 3),)


def _build(device, make):
    with torch.device(device):
        torch.manual_seed(0)
        model, inputs = make()
    return model.eval(), tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)


def _hf_make(name):
    def make():
        cls, config, inputs = _hf(name)
        return cls(config), inputs
    return make


def _labels(analysis):
    return sorted(s.label for s in analysis.symmetries)


@pytest.mark.parametrize("make", [_mlp] + [_hf_make(n) for n in ("bert", "t5", "gpt2", "llama")],
                         ids=["mlp", "bert", "t5", "gpt2", "llama"])
def test_meta_route_matches_certified_real_weights(make):
    real_model, real_inputs = _build("cpu", make)
    meta_model, meta_inputs = _build("meta", make)
    assert all(p.is_meta for p in meta_model.parameters())
    real = symalg.derive(symalg.trace(real_model, real_inputs, tracer="export"))
    meta = symalg.derive(symalg.trace(meta_model, meta_inputs, tracer="export"), certify=False)
    assert meta.certification is None and real.certified
    assert all(e.holds for e in real.certification)   # nothing the rules claim failed on real weights
    assert _labels(meta) == _labels(real)
    try:
        expected = real.orbit_dimension()
    except NotImplementedError:  # a head's GL coupled with its key-bias translations has no closed form yet
        with pytest.raises(NotImplementedError, match="no closed form for the coupled sites"):
            meta.orbit_dimension()
    else:
        assert meta.orbit_dimension() == expected
    assert meta.model_graph.on_meta and not real.model_graph.on_meta


def test_meta_census_finds_the_attention_groups_of_bert():
    model, inputs = _build("meta", _hf_make("bert"))
    analysis = symalg.derive(symalg.trace(model, inputs), certify=False)
    kinds = [type(s.group).__name__ for s in analysis.symmetries]
    assert kinds.count("GeneralLinear") == 2 * 4           # per head: GL(d_k) on Q·Kᵀ, GL(d_v) on V·O, 4 heads
    assert kinds.count("Translations") == 4 + 1            # each head's key bias (softmax ignores it); the rows
    # of the three embedding tables along 1 (their sum is read by the embedding LayerNorm alone: 578 directions)
    assert kinds.count("Shears") == 4                      # each head's value bias into the output bias
    # each head's key-bias translation and value-bias shear move their own slice of the bias: once the GLs are
    # fixed by their weights, each is fixed by its slice. The generic value needs no values: no stabiliser,
    # 8 · 64 + 4 · 8 + 4 · 8 + 578 = 1154, as on real weights
    real_model, real_inputs = _build("cpu", _hf_make("bert"))
    assert analysis.orbit_dimension() == symalg.derive(symalg.trace(real_model, real_inputs)).orbit_dimension() == 1154


def test_meta_census_finds_the_rotary_attention_groups_of_llama():
    """Rotary tables proven equal on the halves from shapes alone: one complex scaling per key/value group."""
    model, inputs = _build("meta", _hf_make("llama"))
    analysis = symalg.derive(symalg.trace(model, inputs), certify=False)
    labels = _labels(analysis)
    assert [label for label in labels if label.startswith("ComplexScaling")] == [
        "ComplexScaling(8) on layers.0.self_attn.group0.qk", "ComplexScaling(8) on layers.0.self_attn.group1.qk"]
    assert sum(label.startswith("GL(8) on layers.0.self_attn.group") for label in labels) == 2
    # 2·8 (C) + 2·64 (GL(d_v)) + 2·32 (norm gains) + 48 (SwiGLU's up): every generator moves θ generically
    assert analysis.orbit_dimension() == 2 * 8 + 2 * 64 + 2 * 32 + 48


def test_generic_orbit_dimension_reads_translation_directions_without_values():
    # cross-entropy frees the logits along 1: a translation, whose constant directions are ranked at random values
    model, inputs = _build("meta", _mlp)
    real_model, real_inputs = _build("cpu", _mlp)
    meta = symalg.derive(symalg.trace(model, inputs), loss="cross_entropy", certify=False)
    real = symalg.derive(symalg.trace(real_model, real_inputs), loss="cross_entropy")
    assert "Translations" in {type(s.group).__name__ for s in meta.symmetries}
    assert meta.orbit_dimension() == real.orbit_dimension() == real.orbit_dimension(real.model_graph.parameters())


def test_what_needs_values_is_refused_on_meta():
    model, inputs = _build("meta", _mlp)
    graph = symalg.trace(model, inputs)
    with pytest.raises(symalg.SpecError, match="meta device.*certify=False"):
        symalg.derive(graph)
    analysis = symalg.derive(graph, certify=False)
    with pytest.raises(symalg.SpecError, match=r"verify without params\['0.weight'\] runs the model, whose weights "
                       "are on the meta device"):
        symalg.verify(analysis)
    real_model, real_inputs = _build("cpu", _mlp)
    partial = {k: v for k, v in real_model.named_parameters() if k != "4.bias"}
    with pytest.raises(symalg.SpecError, match=r"verify without params\['4.bias'\]"):
        symalg.verify(analysis, params=partial, data=real_inputs)
    with pytest.raises(symalg.SpecError, match="example inputs are on the meta device.*pass data="):
        symalg.verify(analysis, params=dict(real_model.named_parameters()))
    with pytest.raises(symalg.SpecError, match="parameter '0.weight' is on the meta device"):
        analysis.orbit_dimension(dict(model.named_parameters()))
    with pytest.raises(symalg.SpecError, match="parameter '0.weight' is on the meta device"):
        model_orbit_dimension(analysis)


def test_meta_analysis_verifies_with_every_value_given():
    # the weights of a model analysed on meta come from params (e.g. gathered from shards): the report is the real one
    model, inputs = _build("meta", _hf_make("bert"))
    real_model, real_inputs = _build("cpu", _hf_make("bert"))
    analysis = symalg.derive(symalg.trace(model, inputs), certify=False)
    values = {**dict(real_model.named_parameters()), **dict(real_model.named_buffers())}
    report = symalg.verify(analysis, params=values, data=real_inputs, flow_steps=1)
    assert report.passed, report
    reference = symalg.verify(symalg.derive(symalg.trace(real_model, real_inputs)), flow_steps=1)
    # the same checks with the same errors as the model with those weights: the values came from params
    assert [(c.check, c.symmetry) for c in report.checks] == [(c.check, c.symmetry) for c in reference.checks]
    # (a check skipped alike in both, such as the exact SymPy lowering of the embeddings' 578 centring directions
    # reading more entries than symbolic_limit, has no error: nan in both)
    assert [c.max_error for c in report.checks] == pytest.approx([c.max_error for c in reference.checks],
                                                                 rel=1e-6, abs=1e-15, nan_ok=True)
    assert [c.skipped for c in report.checks] == [c.skipped for c in reference.checks]
