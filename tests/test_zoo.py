"""The zoo census's machinery (``benchmarks/zoo.py``) on tiny models in-process: its row of a GPT-2 and of torch's
``nn.MultiheadAttention`` (every claim verified by the census's own checker, every attention module covered), and
its checker flagging a claim made false by hand, and a vacuous one."""
import dataclasses
import os
import sys

import pytest
import torch

import symalg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import zoo  # noqa: E402  (benchmarks/ is not a package)

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def _gpt2():
    """One GPT-2 layer of width 16, two heads, checked on ids (2, 5) and (1, 8)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, n_inner=32,
                                     use_cache=False)
    model = transformers.GPT2Model(config).double().eval()
    return model, lambda batch, size: zoo.hf_inputs(model, batch, size), [(2, 5), (1, 8)]


def test_gpt2_row_all_claims_verified_and_attention_covered():
    row = zoo.census_one("gpt2-tiny", _gpt2)
    assert row["status"] == "ok", row.get("error")
    assert row["claims"]["GL"] == 4       # per head: GL(8) on Q Kᵀ and on V O
    assert [a["covered"] for a in row["attention"]] == [True]
    verdicts = {c["claim"]: c["verdict"] for c in row["checks"]}
    assert len(verdicts) == sum(row["claims"].values())
    assert set(verdicts.values()) == {"verified"}
    assert max(c["error"] for c in row["checks"]) < zoo.TOLERANCE
    assert min(c["sensitivity"] for c in row["checks"]) > zoo.SENSITIVITY
    t = zoo.totals([row, {"model": "x", "status": "not built"}])
    assert (t["tried"], t["built"], t["traced"], t["crashes"], t["false_claims"]) == (2, 1, 1, 0, 0)
    assert (t["attention_covered"], t["attention_total"]) == (1, 1)


def test_multihead_attention_row():
    row = zoo.census_one("torch-mha", zoo.TORCH_LAYERS["torch-mha"])
    assert row["status"] == "ok", row.get("error")
    assert [(a["class"], a["covered"]) for a in row["attention"]] == [("MultiheadAttention", True)] * 2
    assert {c["verdict"] for c in row["checks"]} == {"verified"}
    assert row["families"] == {"found": 24, "expected": 24, "extra": {}}   # the hand derivation in docs/zoo.md


def _analysis(model, inputs):
    return symalg.derive(symalg.trace(model, (), **inputs), certify=False)


def test_checker_flags_a_false_claim():
    """GL on a head's queries alone (the key binding dropped): the scores change, the checker must say so."""
    model, make_inputs, variants = _gpt2()
    analysis = _analysis(model, make_inputs(*variants[0]))
    qk = next(s for s in analysis.symmetries if s.group.kind == "GL" and s.site.endswith("qk"))
    queries_only = dataclasses.replace(qk, bindings=tuple(b for b in qk.bindings if b.role == "out"))
    points, refused = zoo.check_points(model, make_inputs, variants)
    assert refused == [] and len(points) == 2
    generator = torch.Generator().manual_seed(0)
    assert zoo.check_claim(model, qk, points, generator)["verdict"] == "verified"
    verdict = zoo.check_claim(model, queries_only, points, generator)
    assert verdict["verdict"] == "false" and verdict["error"] > 1e-4


class _Ignored(torch.nn.Module):
    """A ReLU MLP whose output is multiplied by zero: its claims hold, and say nothing."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return self.net(x) * 0.0


def test_checker_calls_a_claim_on_ignored_tensors_vacuous():
    model = _Ignored().double().eval()

    def make_inputs(batch, size):
        return {"x": torch.randn(batch, 3, dtype=torch.float64)}
    analysis = _analysis(model, make_inputs(2, None))
    points, _ = zoo.check_points(model, make_inputs, [(2, None), (3, None)])
    generator = torch.Generator().manual_seed(0)
    verdicts = {zoo.check_claim(model, s, points, generator)["verdict"] for s in analysis.symmetries}
    assert analysis.symmetries and verdicts == {"vacuous"}


def test_not_built_is_not_a_crash():
    def broken():
        raise ValueError("this config cannot build")
    row = zoo.census_one("broken", broken)
    assert row["status"] == "not built" and "ValueError" in row["error"]
    assert zoo.totals([row])["crashes"] == 0


def test_generic_state_moves_tied_tensors_together():
    """A tensor under two names (tied weights) gets one noise: untying it would break true claims."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model[1].weight = model[0].weight
    state = zoo.generic_state(model)
    assert state["0.weight"] is state["1.weight"]
    assert not torch.equal(state["0.weight"], model[0].weight)
    assert not torch.equal(state["0.bias"], model[0].bias)


def test_a_stopped_process_is_charged_to_its_stage():
    """Building is transformers' time, tracing symalg's (a crash), checking the census's own (claims kept)."""
    rows = [zoo._stopped(stage, {"model": stage, "claims": {"GL": 1}}, "timeout") for stage in
            ("build", "trace", "check")]
    assert [r["status"] for r in rows] == ["not built", "crash", "unchecked"]
    assert rows[2]["claims"] == {"GL": 1} and rows[1]["error"] == "trace: timeout"
    t = zoo.totals(rows)
    assert (t["built"], t["crashes"], t["unchecked"], t["derived"]) == (2, 1, 1, 1)


def test_findings_list_false_claims_gaps_and_pinned_modules():
    rows = [{"model": "m", "status": "ok", "claims": {"GL": 1}, "blocked": 0,
             "checks": [{"claim": "GL(2) on x", "kind": "GL", "verdict": "false", "error": 0.5, "where": "g at p",
                         "sensitivity": 1.0}],
             "attention": [{"module": "a", "class": "Gemma3Attention", "covered": False, "reason": zoo.PINNED[
                 "Gemma3Attention"]}, {"module": "b", "class": "FalconAttention", "covered": False, "reason": ""}]}]
    text = zoo.findings(rows)
    assert "- m: GL(2) on x: error 0.5 (g at p)" in text
    gaps, pinned = text.split("gaps")[1].split("pins")
    assert "FalconAttention: m (1 modules)" in gaps and "Gemma3Attention" not in gaps
    assert "Gemma3Attention: m (1 modules): QK-norm" in pinned
    assert "**0 / 2** (1 pinned with a reason)" in zoo.table(rows)



# -- the hand derivations of docs/zoo.md ------------------------------------------------------------------------------
def _documented_families() -> dict[str, dict[str, int]]:
    """Each bullet of docs/zoo.md § "Completeness against hand derivations": its architectures (the bold names before
    the first parenthesis) and its bold totals (the last ``**`KIND n, ...`**`` of the bullet)."""
    import re
    text = open(os.path.join(ROOT, "docs", "zoo.md"), encoding="utf-8").read()
    section = re.split(r"\n##+ ", text.split("## Completeness against hand derivations", 1)[1], maxsplit=1)[0]
    documented = {}
    for bullet in re.split(r"\n- ", section)[1:]:
        names = re.findall(r"\*\*([\w.-]+)\*\*", bullet.split("(", 1)[0])
        totals = re.findall(r"\*\*`([A-Z]+ \d+(?:, [A-Z]+ \d+)*)`\*\*", bullet)
        assert names and totals, bullet[:80]
        counts = {kind: int(n) for kind, n in (part.split() for part in totals[-1].split(", "))}
        documented.update({name: counts for name in names})
    return documented


def test_every_expected_family_count_is_derived_in_the_docs():
    """``EXPECTED`` and the docs' bullets agree, architecture by architecture and kind by kind."""
    documented = _documented_families()
    assert documented == zoo.EXPECTED
    assert len(documented) >= 40


def _hf(name):
    model, make_inputs, variants = zoo.hf_builder(name)()
    model.load_state_dict(zoo.generic_state(model), strict=False)
    return model, make_inputs(*variants[0])


def _gain(norm, reader):
    """A non-zero diagonal ``D`` on a norm's gain and bias, ``D⁻¹`` on its reader's columns."""
    def move(state, generator):
        d = (torch.rand(state[norm + ".weight"].shape, generator=generator, dtype=torch.float64) + 0.5) * (
            torch.randint(0, 2, state[norm + ".weight"].shape, generator=generator) * 2 - 1)
        state[norm + ".weight"] *= d
        state[norm + ".bias"] *= d
        state[reader + ".weight"] /= d
    return move


def _layer_scale(linear, scale):
    """``linear``'s rows and bias by a non-zero diagonal ``D``, the layer scale by ``D⁻¹``."""
    def move(state, generator):
        d = torch.rand(state[scale].shape, generator=generator, dtype=torch.float64) + 0.5
        state[linear + ".weight"] *= d[:, None]
        state[linear + ".bias"] *= d
        state[scale] /= d
    return move


def _norm_shear(norm, compensated):
    """The norm's bias ``β ↦ β + t``, each compensated reader's bias ``b ↦ b - W t``."""
    def move(state, generator):
        t = torch.randn(state[norm + ".bias"].shape, generator=generator, dtype=torch.float64)
        state[norm + ".bias"] += t
        for reader in compensated:
            state[reader + ".bias"] -= state[reader + ".weight"] @ t
    return move


def _rows_along_one(key):
    """A writer of a LayerNorm-read sum moved along ``1``: ``W ↦ W + 1 vᵀ`` (an embedding: ``E ↦ E + a 1ᵀ``)."""
    def move(state, generator):
        rows, columns = state[key].shape
        if key.endswith("embeddings.weight"):
            state[key] += torch.randn(rows, 1, generator=generator, dtype=torch.float64)
        else:
            state[key] += torch.randn(1, columns, generator=generator, dtype=torch.float64).expand(rows, columns)
    return move


def _translate(key, start, stop):
    def move(state, generator):
        state[key][start:stop] += torch.randn(stop - start, generator=generator, dtype=torch.float64)
    return move


def _opt_embedding(state, generator):
    """OPT's 768-wide embedding bottleneck: ``E ↦ E g``, ``project_in ↦ project_in g⁻ᵀ``."""
    g = torch.randn(768, 768, generator=generator, dtype=torch.float64)
    state["decoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"] @ g
    state["decoder.project_in.weight"] = state["decoder.project_in.weight"] @ torch.linalg.inv(g).T


def _opt_residual_permutation(state, generator):
    """OPT's residual stream permuted: writers' rows, every LayerNorm's gain and bias, readers' columns."""
    p = torch.randperm(32, generator=generator)
    for key in list(state):
        tensor = state[key]
        if key.endswith(("project_in.weight", "out_proj.weight", "fc2.weight", "out_proj.bias", "fc2.bias",
                         "layer_norm.weight", "layer_norm.bias")):
            state[key] = tensor[p]
        elif key.endswith("embed_positions.weight"):
            state[key] = tensor[:, p]
        elif key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight", "project_out.weight")):
            state[key] = tensor[:, p]


def _qwen3_quarter_turn(keys=True, swap_gains=True):
    """Qwen3's rotary planes 0, 3, 5 (coordinates ``i``, ``i + 8``) turned by ``J`` on every head's query rows and
    the key rows, each QK-norm gain's two entries on the plane swapped."""
    def move(state, generator):
        prefix = "layers.0.self_attn."
        for projection, norm, heads in (("q_proj", "q_norm", 2), ("k_proj", "k_norm", 1))[:2 if keys else 1]:
            weight, gain = state[prefix + projection + ".weight"], state[prefix + norm + ".weight"]
            for i in (0, 3, 5):
                for h in range(heads):
                    a, b = h * 16 + i, h * 16 + i + 8
                    weight[[a, b]] = torch.stack([-weight[b], weight[a]])
                if swap_gains:
                    gain[[i, i + 8]] = gain[[i + 8, i]]
    return move


def _qk_gain_trade(prefix, planes, with_bias, per_plane=True):
    """The query norm's gain (and bias) by ``a``, the key norm's by ``a⁻¹``; ``a`` equal on the two coordinates
    ``i``, ``i + planes`` of each rotary plane (``per_plane``), free on the unrotated coordinates."""
    def move(state, generator):
        def draw(n):
            return torch.rand(n, generator=generator, dtype=torch.float64) + 0.5
        a = torch.cat([draw(planes).repeat(2), draw(16 - 2 * planes)]) if per_plane else draw(16)
        for norm, factor in (("q", a), ("k", 1 / a)):
            for part in (".weight", ".bias") if with_bias else (".weight",):
                state[prefix.format(norm) + part] *= factor
    return move


def _persimmon_rows(head, block):
    """Persimmon's packed rows of ``head``'s query (``block`` 0), key (1) or value (2) moved along ``1``."""
    def move(state, generator):
        rows = slice(head * 48 + block * 16, head * 48 + block * 16 + 16)
        state["layers.0.self_attn.query_key_value.weight"][rows] += torch.randn(
            1, 32, generator=generator, dtype=torch.float64)
        state["layers.0.self_attn.query_key_value.bias"][rows] += 0.7
    return move


def _persimmon_permutation(coordinates, keys=True):
    """Persimmon's head ``coordinates`` permuted on the query (and key) rows of every head and their norms."""
    def move(state, generator):
        prefix = "layers.0.self_attn."
        weight, bias = state[prefix + "query_key_value.weight"], state[prefix + "query_key_value.bias"]
        order = torch.arange(16)
        order[coordinates] = torch.tensor(coordinates)[torch.randperm(len(coordinates), generator=generator)]
        for block, norm in ((0, "q_layernorm"), (1, "k_layernorm"))[:2 if keys else 1]:
            for head in range(2):
                rows = slice(head * 48 + block * 16, head * 48 + block * 16 + 16)
                weight[rows], bias[rows] = weight[rows][order], bias[rows][order]
            for part in (".weight", ".bias"):
                state[prefix + norm + part] = state[prefix + norm + part][order]
    return move


def _squared_relu(state, generator):
    """Persimmon's squared ReLU: ``h ↦ D h`` (``D > 0``), ``dense_4h_to_h``'s columns by ``D⁻²``."""
    d = torch.rand(64, generator=generator, dtype=torch.float64) + 0.5
    prefix = "layers.0.mlp."
    state[prefix + "dense_h_to_4h.weight"] *= d[:, None]
    state[prefix + "dense_h_to_4h.bias"] *= d
    state[prefix + "dense_4h_to_h.weight"] /= d ** 2


def _flips(pairs):
    """Sign flips ``D`` on a projection's rows (every head) and its norm's gain together."""
    def move(state, generator):
        d = torch.randint(0, 2, (16,), generator=generator).double() * 2 - 1
        for key, heads in pairs:
            state[key] *= d.repeat(heads)[:, None] if heads else d
    return move


HAND_CHECKS = [  # (architecture, transformation, whether the outputs keep: a family, or its near miss)
    ("dinov2", _layer_scale("encoder.layer.0.attention.o_proj", "encoder.layer.0.layer_scale1.lambda1"), True),
    ("dinov2", _layer_scale("encoder.layer.1.mlp.fc2", "encoder.layer.1.layer_scale2.lambda1"), True),
    ("beit", _layer_scale("layers.0.attention.o_proj", "layers.0.lambda_1"), True),
    ("beit", _norm_shear("layers.0.layernorm_before", ["layers.0.attention.q_proj", "layers.0.attention.v_proj"]),
     True),
    ("beit", _norm_shear("layers.0.layernorm_before", ["layers.0.attention.v_proj"]), False),
    ("beit", _translate("embeddings.patch_embeddings.projection.bias", 0, 32), False),   # no centring: an output
    ("data2vec-vision", _translate("embeddings.patch_embeddings.projection.bias", 0, 32), False),
    ("opt", _opt_embedding, True),
    ("opt", _gain("decoder.final_layer_norm", "decoder.project_out"), True),
    ("opt", _translate("decoder.final_layer_norm.bias", 0, 32), False),   # project_out has no bias to absorb it
    ("opt", _rows_along_one("decoder.project_in.weight"), True),
    ("opt", _opt_residual_permutation, True),
    ("bloom", _rows_along_one("word_embeddings.weight"), True),
    ("bloom", _translate("word_embeddings_layernorm.bias", 0, 32), False),   # a different vector per entry: not `1`
    ("codegen", _rows_along_one("h.0.attn.out_proj.weight"), True),
    ("phi", _translate("layers.0.self_attn.k_proj.bias", 8, 16), True),    # the unrotated half of the key head
    ("phi", _translate("layers.0.self_attn.k_proj.bias", 0, 8), False),    # the rotated half
    ("phi", _norm_shear("layers.0.input_layernorm", ["layers.0.self_attn.q_proj", "layers.0.self_attn.k_proj",
                                                     "layers.0.self_attn.v_proj", "layers.0.mlp.fc1"]), True),
    ("gpt_neo", _norm_shear("h.0.ln_1", []), False),   # the queries have no bias to absorb the shear
    ("qwen3", _flips([("layers.0.self_attn.q_proj.weight", 2), ("layers.0.self_attn.q_norm.weight", 0)]), True),
    ("qwen3", _flips([("layers.0.self_attn.k_proj.weight", 1), ("layers.0.self_attn.k_norm.weight", 0)]), True),
    ("qwen3", _qk_gain_trade("layers.0.self_attn.{}_norm", 8, False), True),
    ("qwen3", _qk_gain_trade("layers.0.self_attn.{}_norm", 8, False, per_plane=False), False),
    ("qwen3", _qwen3_quarter_turn(), True),
    ("qwen3", _qwen3_quarter_turn(keys=False), False),
    ("qwen3", _qwen3_quarter_turn(swap_gains=False), False),
    ("persimmon", _persimmon_rows(1, 0), True),
    ("persimmon", _persimmon_rows(0, 1), True),
    ("persimmon", _persimmon_rows(0, 2), False),   # values are not normalised
    ("persimmon", _persimmon_permutation(list(range(8, 16))), True),   # the unrotated coordinates
    ("persimmon", _persimmon_permutation(list(range(16))), False),     # the rotated ones too
    ("persimmon", _persimmon_permutation(list(range(8, 16)), keys=False), False),
    ("persimmon", _qk_gain_trade("layers.0.self_attn.{}_layernorm", 4, True), True),
    ("persimmon", _qk_gain_trade("layers.0.self_attn.{}_layernorm", 4, True, per_plane=False), False),
    ("persimmon", _translate("layers.0.self_attn.k_layernorm.bias", 8, 16), True),
    ("persimmon", _translate("layers.0.self_attn.k_layernorm.bias", 0, 8), False),
    ("persimmon", _squared_relu, True),
]


@pytest.mark.parametrize("name, move, keeps", HAND_CHECKS,
                         ids=[f"{name}-{i}-{'family' if keeps else 'near-miss'}" for i, (name, _, keeps) in
                              enumerate(HAND_CHECKS)])
def test_hand_derived_family(name, move, keeps):
    """A family of the hand derivations (or its near miss) applied by hand at generic parameters: the outputs keep
    to rounding (or change by more than ``10⁻³``)."""
    model, inputs = _hf(name)
    with torch.no_grad():
        before = zoo.flat_outputs(model(**inputs))
        state = {key: value.clone() for key, value in model.state_dict().items()}
        move(state, torch.Generator().manual_seed(0))
        model.load_state_dict(state)
        change = zoo.relative_change(before, zoo.flat_outputs(model(**inputs)))
    assert change < 1e-12 if keeps else change > 1e-3, change
