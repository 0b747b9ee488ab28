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

