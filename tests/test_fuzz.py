"""The false-claim fuzzer (symalg.verification.fuzz): its generator, its checker, and its quick and slow tiers."""
import runpy

import pytest
import sympy as sp
import torch

import symalg
from symalg.verification import fuzz
from symalg.catalogue.activations import declare_linear
from symalg.verification.fuzz import Case, Layer, Step


def _reproduced_patterns(case: Case) -> set[str]:
    """The known false-claim patterns (docs/soundness.md) a case reproduces."""
    layers = {name: layer for name, layer in case.layers}
    ops = [s.op for s in case.steps]
    found = set()
    if case.output[0] == "dict":
        found.add("dict output")
    if case.family == "embedding" and "max" in ops and "linear_w" in ops:
        found.add("F.linear(fc(emb(t)).max(1)[0], emb.weight)")
    if "w(w(x))" in case.variant:
        found.add("out(w(w(x)))")
    if {"T=d", "batchnorm", "axis1"} <= set(case.variant.split("-")):
        found.add("BatchNorm1d(d) on (B, T=d, d)")
    if any(layer.cls == "GroupNorm" for layer in layers.values()) and "conv1d" in case.variant:
        found.add("GroupNorm on (B, C, L)")
    if "layernorm_axis" in case.variant and len(case.input_shape) == 3:
        found.add("LayerNorm over the time axis after a transpose")
    if "gn-bn" in case.variant and any(layer.cls.startswith("BatchNorm") and not layer.train
                                       for layer in layers.values()):
        found.add("conv -> GroupNorm(affine=False) -> BatchNorm(eval)")
    if case.family == "concat" and "layernorm" in case.variant.split("-"):
        found.add("LayerNorm after torch.cat")
    if case.family == "albert":
        found.add("ALBERT-style shared blocks with a norm gain")
    if "needTrue-avgFalse" in case.variant:
        found.add("nn.MultiheadAttention(average_attn_weights=False) with weights returned")
    if {"hand", "dropout", "train"} <= set(case.variant.split("-")):
        found.add("dropout on the attention weights in training mode (a mask per head)")
    return found


def test_generator_covers_every_family_and_every_known_false_claim_pattern():
    """The families in turn, and the known patterns within the first 50 models of each family (drawn family by family,
    so that a new family changes none of these draws)."""
    assert {fuzz.generate(0, i).family for i in range(len(fuzz.FAMILIES))} == set(fuzz.FAMILIES)
    cases = [fuzz.generate(0, i, family) for family in fuzz.FAMILIES for i in range(50)]
    found = set().union(*(_reproduced_patterns(c) for c in cases))
    assert len(found) == 11, found


def test_gated_family_draws_every_gate_spelling_and_variant_and_its_raw_claims_hold():
    """The product rule's fuzz family: every product spelling, the ReGLU/SwiGLU/tanh gates and every variant
    (squares, third factors, data factors, broadcasts, ops after the product, stacks, a shared ``down``) are
    drawn, and on 60 of them the raw claims (scalings and joint permutations included) all hold."""
    tokens = set().union(*(fuzz.generate(0, i, "gated").variant.split("-") for i in range(300)))
    assert {"mul", "mul_fn", "mul_method", "reglu", "swiglu", "geglu", "tanh", "plain", "square", "triple", "input",
            "broadcast", "after", "residual", "shared"} <= tokens
    report = fuzz.run(60, seed=0, families=["gated"], certify=False, draws=1)
    assert report.models == 60 and not report.crashes and not report.hangs
    assert report.claims > 100 and not report.false_claims, report.summary()


def test_generator_writes_layers_as_real_models_do():
    """The ``layers`` family draws GPT-2's addmm layer, F.layer_norm, RMS norm written out (gain, none, over the
    tokens) and the selections; tracing folds a written-out norm over the features into one ``rms_norm`` node."""
    cases = [fuzz.generate(0, i, "layers") for i in range(60)]
    variants = set().union(*(c.variant.split("-") for c in cases))
    assert {"addmm", "layer_norm_fn", "rms", "rms_gain", "rms_tokens", "cls", "token0", "feature0", "all"} <= variants
    case = next(c for c in cases if "rms_gain" in c.variant.split("-"))
    graph = symalg.trace(*case.build())
    ops = [graph.node(v)["op"] for v in graph.nodes]
    assert "rms_norm" in ops and "rsqrt" not in ops


def test_generator_is_reproducible_and_its_source_builds_the_same_model(tmp_path):
    case = fuzz.generate(3, 17, "norm")
    assert fuzz.generate(3, 17, "norm") == case and fuzz.generate(4, 17, "norm") != case
    (model, (x,)), (again, (y,)) = case.build(), case.build()
    assert torch.equal(x, y)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    path = tmp_path / "reproduction.py"
    path.write_text(case.source())
    script = runpy.run_path(str(path))  # builds the model, then derives and checks it
    assert torch.equal(script["x"], x)
    assert torch.allclose(script["model"](x), model(x), rtol=0, atol=0)


def test_generated_models_trace_with_fx_including_tuple_results():
    """``o, w = self.m1(x, x, x, ...)`` must not iterate an fx proxy (which sent every MultiheadAttention model
    to torch.export, where its heads are not seen)."""
    case = fuzz.generate(0, 1, "mha")
    assert "needTrue" in case.variant
    graph = symalg.trace(*case.build())
    assert graph.tracer == "fx"
    assert any(graph.graph.nodes[v]["op"] == "multihead_attention" for v in graph.graph)


def test_checker_catches_a_false_claim_from_a_wrong_overlay():
    """relu declared linear: GL(h) is claimed on the hidden layer of every relu MLP, and it is false."""
    relu_as_linear = symalg.overlay({"relu": symalg.CatalogueEntry("relu", lambda z: sp.Max(z, 0),
                                                                   declare_linear())})
    case = Case(0, 0, "mlp", "relu", (("m0", Layer("Linear", (3, 4))), ("m1", Layer("Linear", (4, 2)))),
                (Step("h0", "layer", ("x",), (("layer", "m0"),)), Step("h1", "act", ("h0",), (("name", "relu"),)),
                 Step("h2", "layer", ("h1",), (("layer", "m1"),))), ("tensor", ("h2",)), (5, 3), torch_seed=1)
    honest = fuzz.check_case(case, certify=False)
    assert honest.claims == 2 and honest.false_claims == []
    wrong = fuzz.check_case(case, certify=False, catalogue=relu_as_linear)
    assert [c.claim for c in wrong.false_claims] == ["GL(4) on m0"]
    assert wrong.false_claims[0].error > 1e-2


def test_certification_blocks_the_false_claim_of_a_wrong_overlay():
    relu_as_linear = symalg.overlay({"relu": symalg.CatalogueEntry("relu", lambda z: sp.Max(z, 0),
                                                                   declare_linear())})
    case = fuzz.generate(0, 0, "mlp")
    assert fuzz.check_case(case, certify=True, catalogue=relu_as_linear).false_claims == []


def test_derive_claims_gives_raw_or_certified_claims():
    model, inputs = fuzz.generate(0, 0, "mlp").build()
    graph = symalg.trace(model, inputs)
    assert fuzz.derive_claims(graph, certify=False).certification is None
    assert fuzz.derive_claims(graph, certify=True).certification is not None


def test_refusals_crashes_and_hangs_are_outcomes_not_exceptions(monkeypatch):
    linear = (("m0", Layer("Linear", (3, 4))),)
    step = (Step("h0", "layer", ("x",), (("layer", "m0"),)),)
    wrong_input = Case(0, 0, "mlp", "bad input", linear, step, ("tensor", ("h0",)), (2, 5))
    refused = fuzz.check_case(wrong_input)
    assert refused.refused and refused.crash is None and refused.claims == 0
    missing_argument = Case(0, 1, "mlp", "bad layer", (("m0", Layer("Linear", (3,))),), step, ("tensor", ("h0",)),
                            (2, 3))
    crashed = fuzz.check_case(missing_argument)
    assert crashed.crash is not None and crashed.crash.error.startswith("TypeError") and not crashed.refused
    def spin(*args, **kwargs):  # a Python loop: the time limit's signal always reaches it (no C code to finish)
        while True:
            pass

    monkeypatch.setattr(fuzz, "trace", spin)
    hung = fuzz.check_case(fuzz.generate(0, 0, "mlp"), time_limit=0.05)
    assert hung.hang is not None and hung.crash is None


def test_run_rejects_unknown_families():
    with pytest.raises(symalg.SpecError, match="'nope'"):
        fuzz.run(1, families=["nope"])


def test_command_line_prints_figures_and_sources(capsys):
    status = fuzz.main(["--models", "2", "--families", "mlp", "--raw", "--start", "5"])
    out = capsys.readouterr().out
    assert status == int(any(line.startswith(("FALSE", "CRASH", "HANG")) for line in out.splitlines()))
    assert out.startswith("seed 0: 2 models") and "raw: derive did not certify" in out and "\nmlp " in out
    assert fuzz.main(["--show", "0", "152", "concat"]) == 0
    assert capsys.readouterr().out == fuzz.generate(0, 152, "concat").source() + "\n"
    with pytest.raises(SystemExit):
        fuzz.main(["--show", "0", "1", "nope"])
    assert "unknown family 'nope'" in capsys.readouterr().err


def _assert_sound(report: fuzz.FuzzReport) -> None:
    assert report.crashes == [], report.summary()
    assert report.hangs == [], report.summary()
    assert report.false_claims == [], report.summary()


def test_quick_tier_no_crashes_or_hangs():
    """8 models per family on raw claims (the inference rules alone, no certification): no model may crash
    or hang, and no raw claim may be false."""
    report = fuzz.run(8 * len(fuzz.FAMILIES), seed=0, certify=False, draws=1)
    assert report.models == 8 * len(fuzz.FAMILIES) and set(report.families) == set(fuzz.FAMILIES)
    assert report.claims > 100
    assert report.crashes == [] and report.hangs == [], report.summary()
    assert report.false_claims == [], report.summary()


def test_quick_tier_certified_claims_hold():
    _assert_sound(fuzz.run(8 * len(fuzz.FAMILIES), seed=1, certify=True))


# -- the transformer-block family ------------------------------------------------------------------------------------

BLOCK_PATTERNS = {
    # attention
    "nn.MultiheadAttention": "mha", "F.scaled_dot_product_attention": "sdpa", "written out": "hand",
    "causal masked_fill": "causal", "additive bias": "bias", "ALiBi": "alibi", "learnable temperature": "temperature",
    "packed QKV": "qkv", "grouped-query attention": "gqa", "RoPE": "rope-hf", "q/k norms": "qknorm",
    "RoPE, operands swapped": "rope-swapped", "RoPE tables per head": "rope-per-head",
    "learned rotary tables": "rope-learned", "RoPE on the queries only": "rope-q-only",
    "partial RoPE (GPT-NeoX)": "rope-partial", "interleaved RoPE (GPT-J)": "rope-interleaved",
    "rotate_half without its sign": "rope-unsigned",
    "sdpa attn_mask": "mask", "causal nn.MultiheadAttention": "causal-need",
    # norms and placement
    "pre-norm": "pre", "post-norm": "post", "parallel": "parallel", "no norm": "none", "LayerNorm": "layernorm",
    "RMSNorm": "rmsnorm", "RMSNorm written out": "rms_hf", "F.layer_norm": "layer_norm_f",
    "LayerNorm((T, d))": "two_axes", "norm over time": "layernorm_axis", "batch norm": "batchnorm",
    "group norm": "groupnorm",
    # MLPs, sharing, inputs and outputs
    "plain MLP": "mlp", "SwiGLU": "gated-silu", "GeGLU": "gated-gelu", "packed gate-up": "packed-silu",
    "shared blocks": "shared", "absolute positions": "abs-pos", "tied head": "tied", "attention maps": "maps",
    "dict output": "dict", "tuple output": "tuple",
    # returned maps and how they are read, the bmm layout, eval dropout on the probabilities, the export route
    "bmm on (B·H, T, d)": "bmm", "dropout on the probabilities": "dropout", "map returned": "map-returned",
    "map averaged over heads": "map-mean-heads", "map of head 0": "map-head0", "map scaled per head": "map-head-scale",
    "map summed over keys": "map-sum-keys", "map left merged": "merged", "traced by export": "export",
}


def test_block_family_draws_every_transformer_pattern():
    variants = ["-" + fuzz.generate(0, i, "block").variant + "-" for i in range(300)]
    missing = {name for name, tag in BLOCK_PATTERNS.items()
               if not any(f"-{tag}" in v for v in variants)}
    assert missing == set()


def test_attention_families_force_some_models_through_torch_export(tmp_path):
    """A share of the attention families' models (:data:`fuzz.EXPORTED`) is traced by ``torch.export`` alone (fx
    traces every generated model, and would hide export's decomposition); the choice leaves the model as it was, the
    printed reproduction traces the same way, and ``--tracer`` overrides it for a run."""
    cases = [fuzz.generate(0, i, "mha") for i in range(40)]
    exported = [c for c in cases if c.tracer == "export"]
    assert 5 < len(exported) < 25 and all(c.variant.endswith("-export") for c in exported)
    assert all(c.tracer == "auto" for c in (fuzz.generate(0, i, "mlp") for i in range(40)))
    case = exported[0]
    assert "symalg.trace(model, (x,), tracer='export')" in case.source()
    graph = symalg.trace(*case.build(), tracer=case.tracer)
    assert graph.tracer == "export" and "multihead_attention" not in [graph.node(v)["op"] for v in graph.nodes]
    tokens = set().union(*(c.variant.split("-") for c in (fuzz.generate(0, i, "mha") for i in range(120))))
    assert {"seq", "first", "cross", "padding", "mask"} <= tokens
    report = fuzz.run(6, seed=0, families=["mha"], certify=False, draws=1, tracer="export")
    assert report.models == 6 and report.claims > 10
    _assert_sound(report)


def test_block_family_ops_run_as_printed(tmp_path):
    """Every op of every drawn block runs, and the printed script builds the same model: same outputs."""
    used = set()
    variants = ["-" + fuzz.generate(0, i, "block").variant + "-" for i in range(300)]
    rotary = {next(i for i, v in enumerate(variants) if f"-rope-{kind}-" in v) for kind in set(fuzz.ROPE_KINDS)}
    for i in sorted(set(range(0, 300, 7)) | rotary):   # and the first model of each rotary embedding
        case = fuzz.generate(0, i, "block")
        used |= {s.op for s in case.steps}
        path = tmp_path / f"block{i}.py"
        path.write_text(case.source().split("\nimport symalg")[0])  # the model and input, not the check
        script = runpy.run_path(str(path))
        model, (x,) = case.build()
        assert torch.equal(script["x"], x)
        mine, theirs = model(x), script["model"](x)
        mine, theirs = (mine, theirs) if isinstance(mine, (tuple, dict)) else ((mine,), (theirs,))
        for a, b in zip(mine.values() if isinstance(mine, dict) else mine,
                        theirs.values() if isinstance(theirs, dict) else theirs):
            assert torch.equal(a.nan_to_num(), b.nan_to_num())
    assert {"rope", "rope_tables", "repeat_kv", "repeat_interleave", "split", "chunk", "unflatten", "view",
            "alibi", "sdpa_gqa", "sdpa_mask", "mha_causal", "rms_hf", "layer_norm_f", "bmm", "bmm_t", "sum",
            "mean"} <= used
    assert {op for op in fuzz.OPS if op.startswith("rope")} <= used


def test_every_rotary_block_runs_grouped_query_attention_with_tables_per_head_included():
    """Tables per head are drawn for the query heads and the key heads apart: every drawn model runs (model 13 is the
    first with tables per head and grouped keys)."""
    cases = [fuzz.generate(0, i, "block") for i in range(300)]
    rotary = [c for c in cases if "-rope-" in c.variant]
    assert len(rotary) > 50 and "gqa" in cases[13].variant and "rope-per-head" in cases[13].variant
    for case in rotary:
        model, (x,) = case.build()
        model(x)


def test_a_shared_block_calls_the_same_modules_twice():
    case = next(c for c in (fuzz.generate(0, i, "block") for i in range(100)) if "shared" in c.variant)
    calls = [dict(s.constants).get("layer") for s in case.steps if s.op in ("layer", "mha", "mha_causal", "rms_hf")]
    shared = {name for name, _ in case.layers} - {"m0", case.layers[-1][0]}
    assert any(calls.count(name) == 2 for name in shared)
    assert not any(calls.count(name) > 2 for name in calls)


def test_rope_tables_and_rotate_half_are_hugging_faces():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    q = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config)(q, torch.arange(5)[None])
    mine = fuzz.rope_tables(q, 4)
    assert torch.allclose(mine[0], cos[0], atol=1e-6) and torch.allclose(mine[1], sin[0], atol=1e-6)
    assert torch.equal(fuzz.rotate_half(q), modeling_llama.rotate_half(q))
    from transformers.models.gptj import modeling_gptj   # interleaved pairs
    assert torch.equal(fuzz.rotate_every_two(q), modeling_gptj.rotate_every_two(q))
    sincos = modeling_gptj.create_sinusoidal_positions(5, 4)
    sin, cos = (torch.repeat_interleave(t, 2, -1) for t in torch.split(sincos, 2, dim=-1))
    mine = fuzz.rope_tables(q, 4, interleaved=True)
    assert torch.allclose(mine[0], cos.double(), atol=1e-6) and torch.allclose(mine[1], sin.double(), atol=1e-6)
    kv = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    assert torch.equal(fuzz.OPS["repeat_kv"].fn(None, kv, shape=(2, 2, 3, 5, 4), merged=(2, 6, 5, 4)),
                       modeling_llama.repeat_kv(kv, 3))


def test_block_quick_tier():
    """30 transformer-block models, raw claims (the inference rules alone): none false, no crash, no hang."""
    report = fuzz.run(30, seed=0, families=["block"], certify=False, draws=1)
    assert report.models == 30 and report.claims > 50
    _assert_sound(report)


# -- the shear family ------------------------------------------------------------------------------------------------

SHEAR_PATTERNS = {
    # what moves: a norm's bias, a linear's bias, a value bias
    "LayerNorm": "layernorm", "F.layer_norm": "layer_norm_f", "batch norm": "batchnorm", "a linear's bias": "linear",
    "written-out attention": "hand", "sdpa": "sdpa", "nn.MultiheadAttention": "mha", "grouped-query": "groups1",
    # between it and the readers
    "nothing": "none", "nn.Identity": "identity", "dropout on": "dropout-train", "dropout off": "dropout-eval",
    "reshape": "reshape", "transpose and back": "transpose", "cat with itself": "cat", "negated": "neg",
    "scaled": "scale", "an activation": "act",
    # the readers
    "a biased linear": "linear", "two linears": "two", "an unbiased linear": "unbiased", "addmm": "addmm",
    "the residual sum": "residual", "returned": "returned", "a shared linear": "shared",
    "a linear and a norm": "normed", "x + u, u the biased reader's output": "stream-add", "u + x": "stream-first",
    "u − x": "stream-sub_first", "x − u": "stream-sub", "torch.add(x, u, alpha=c)": "stream-alpha",
    "an activation reading x + u": "stream-act", "an unbiased map reading x + u": "stream-unbiased",
    "no value bias": "vbiasFalse", "no output bias": "obiasFalse", "merged heads returned": "returned",
    "causal -inf": "causal_fill", "finfo.min": "causal_fill_min", "finite fill": "finite", "sdpa dropout": "p0.3",
    "attention in training": "train", "pre-norm": "pre-ln",
}


def test_shear_family_draws_every_pattern_and_its_raw_claims_hold():
    variants = ["-" + fuzz.generate(0, i, "shear").variant + "-" for i in range(400)]
    missing = {name for name, tag in SHEAR_PATTERNS.items() if not any(f"-{tag}" in v for v in variants)}
    assert missing == set()
    report = fuzz.run(40, seed=0, families=["shear"], certify=False, draws=1)
    assert report.models == 40 and report.claims > 100
    _assert_sound(report)


def test_the_shear_family_finds_the_mistakes_the_rules_guard_against(monkeypatch):
    """Switch one refusal off and the family reports false claims: a reader's bias giving back ``W t`` for a value
    that moved by ``−t`` or ``c t`` (after ``-y``, ``y * c``)."""
    from symalg.symbolic.inference import Inference

    absorb = Inference.absorb

    def absorb_anything(self, label, absorber):
        return absorb(self, label.map_segments(translates=True), absorber)

    monkeypatch.setattr(Inference, "absorb", absorb_anything)
    cases = [c for c in (fuzz.generate(0, i, "shear") for i in range(200))
             if {"neg", "scale"} & set(c.variant.split("-"))]
    false = [c for case in cases[:12] for c in fuzz.check_case(case, certify=False, draws=1).false_claims]
    assert any(c.claim.startswith("Shears") for c in false)


def test_block_quick_tier_through_torch_export():
    """The first 8 transformer blocks traced by ``torch.export`` alone, raw claims: none false."""
    report = fuzz.run(8, seed=0, families=["block"], certify=False, draws=1, tracer="export")
    assert report.models == 8 and report.claims > 20
    _assert_sound(report)


@pytest.mark.slow
def test_slow_tier_two_thousand_transformer_blocks():
    report = fuzz.run(2000, seed=0, families=["block"], certify=False, workers=2)
    assert report.models == 2000
    _assert_sound(report)


@pytest.mark.slow
def test_slow_tier_ten_thousand_models():
    report = fuzz.run(10_000, seed=0, certify=True, workers=2)
    assert report.models == 10_000
    _assert_sound(report)


def test_hostile_model_families_draw_their_patterns_and_end_in_checked_claims_or_refusals():
    """``weight_norm`` (hook-based weight norm and eval spectral norm, every dim), ``scripted`` (one module scripted:
    always refused) and ``complex`` (a complex parameter: refused; FFTs inside or at the output: checked), no crash."""
    tokens = {family: set().union(*(fuzz.generate(0, i, family).variant.split("-") for i in range(40)))
              for family in ("weight_norm", "scripted", "complex")}
    assert {"weight_norm", "weight_norm_all", "weight_norm_in", "spectral_norm", "plain"} <= tokens["weight_norm"]
    assert {"first", "activation", "norm", "last"} <= tokens["scripted"]
    assert {"param", "fft_abs", "rfft", "fft_out"} <= tokens["complex"]
    report = fuzz.run(30, seed=0, families=["weight_norm", "scripted", "complex"], certify=False, draws=1)
    assert not report.crashes and not report.hangs and not report.false_claims, report.summary()
    figures = report.families
    assert figures["scripted"].refusals == 10 and figures["weight_norm"].refusals == 0
    assert figures["weight_norm"].claims > 0 and figures["complex"].claims > 0 and figures["complex"].refusals > 0
