"""Regression tests for false claims inference once made (outputs, shared and tied tensors, shared blocks,
attention weights): each model once got a symmetry that changes one of its outputs.

Every test traces the model with example inputs, derives, and checks three things: every remaining claim
keeps every output (:func:`symalg.verification.certification.claim_errors`), the true symmetries are still claimed,
and the restriction is reported naming the node responsible.
"""
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import NamedTuple, Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import symalg
from symalg.verification.certification import assert_claims_hold


def analyse(model, *inputs, loss="mse"):
    """Derive ``model`` traced on ``inputs`` without certification (the inference rules alone); assert that
    every claim keeps every output."""
    analysis = symalg.derive(symalg.trace(model.double(), inputs), loss=loss, certify=False)
    assert_claims_hold(analysis)
    return analysis


def claims(analysis) -> set[str]:
    return {s.label for s in analysis.symmetries}


def blocked_at(analysis, node: str) -> list[str]:
    """Reasons of the blocked notes and restrictions naming ``node``."""
    return [b.reason for b in analysis.blocked + analysis.sites.restrictions if b.node == node]


# -- 1. every returned tensor is an output -------------------------------------------------------

@dataclass
class _Output:
    logits: torch.Tensor
    hidden: Optional[torch.Tensor] = None


class _DictOutput(nn.Module):
    def __init__(self, hidden_out: bool = False):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(4, 3)
        self.hidden_out = hidden_out

    def forward(self, x):
        h = torch.relu(self.a(x))
        return {"y": self.b(h), "extra": [_Output(self.c(h), h if self.hidden_out else x)]}


def test_dict_and_dataclass_outputs_pin_their_feature_axes():
    analysis = analyse(_DictOutput(), torch.randn(5, 3))
    assert claims(analysis) == {"PositiveScaling(4, alpha=1) on a", "S(4) on a"}


class _ModelOutput(OrderedDict):
    """Hugging Face's ``ModelOutput`` in miniature: a dataclass that is an ``OrderedDict`` of its set fields."""

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)


@dataclass
class _CausalLMOutput(_ModelOutput):
    logits: torch.Tensor = None
    hidden_states: Optional[torch.Tensor] = None


class _Pair(NamedTuple):
    logits: torch.Tensor
    hidden_states: torch.Tensor


@pytest.mark.parametrize("container", [_CausalLMOutput, _Pair], ids=["model_output", "named_tuple"])
@pytest.mark.parametrize("hidden_out", [False, True], ids=["input_returned", "hidden_returned"])
def test_model_output_and_named_tuple_fields_are_outputs(container, hidden_out):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return container(logits=self.b(h), hidden_states=h if hidden_out else x)

    analysis = analyse(Model(), torch.randn(5, 3))
    assert claims(analysis) == (set() if hidden_out else {"PositiveScaling(4, alpha=1) on a", "S(4) on a"})
    assert not analysis.blocked


def test_a_returned_hidden_value_is_an_output_too():
    analysis = analyse(_DictOutput(hidden_out=True), torch.randn(5, 3))
    assert claims(analysis) == set()


def test_verify_and_cli_run_on_a_dict_output(tmp_path, capsys):
    model = _DictOutput().double()
    report = symalg.verify(symalg.derive(symalg.trace(model, (torch.randn(5, 3),))))
    assert report.passed and len(report.checks) > 1
    source = tmp_path / "dict_model.py"
    source.write_text("import torch\nfrom tests.test_false_claims import _DictOutput\n"
                      "model = _DictOutput()\nexample_inputs = (torch.randn(5, 3),)\n")
    from symalg.cli import main

    assert main(["--model", str(source)]) == 0
    out = capsys.readouterr().out
    assert "PositiveScaling(4, alpha=1) on a" in out and " 0 failed" in out


def test_a_returned_parameter_cannot_move():
    class ReturnsWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))), self.b.weight

    analysis = analyse(ReturnsWeight(), torch.randn(5, 3))
    assert claims(analysis) == set()
    assert any("returns it as a model output" in r for r in blocked_at(analysis, "output"))


def test_cross_entropy_frees_only_the_first_output():
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(4, 2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return {"logits": self.b(h), "aux": self.c(h)}

    analysis = analyse(TwoHeads(), torch.randn(6, 3), loss="cross_entropy")
    assert {"Translations(5, along 1) on b"} <= claims(analysis)
    assert not any(label.endswith(" on c") for label in claims(analysis))


# -- 2, 3. a region bound to a site and also read against data is pinned ----------------------------

class _TiedThroughLinear(nn.Module):
    """``F.linear(pooled, emb.weight)``: the embedding's columns read a value nothing acts on."""

    def __init__(self):
        super().__init__()
        self.emb, self.fc1, self.fc2 = nn.Embedding(7, 4), nn.Linear(4, 5), nn.Linear(5, 4)

    def forward(self, t):
        pooled = self.fc2(torch.relu(self.fc1(self.emb(t)))).max(1)[0]
        return F.linear(pooled, self.emb.weight)


def test_tied_weight_read_against_data_is_pinned():
    analysis = analyse(_TiedThroughLinear(), torch.randint(0, 7, (5, 3)))
    assert claims(analysis) == {"PositiveScaling(5, alpha=1) on fc1", "S(5) on fc1"}
    assert any("emb.weight columns" in r and "nothing acts on" in r for r in blocked_at(analysis, "linear"))


def test_token_rows_of_a_tied_head_do_not_permute():
    class TiedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc, self.out = nn.Embedding(7, 4), nn.Linear(4, 4), nn.Linear(7, 2)

        def forward(self, t):
            vocabulary = F.linear(torch.relu(self.fc(self.emb(t))), self.emb.weight)
            return self.out(torch.relu(vocabulary))

    analysis = analyse(TiedHead(), torch.randint(0, 7, (5, 3)))
    assert claims(analysis) == {"S(4) on emb"}  # fc and the embedding columns move together
    assert any("emb.weight rows" in r for r in blocked_at(analysis, "emb"))


def test_a_module_called_on_the_raw_input_and_on_itself_is_pinned():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.fc, self.out = nn.Linear(4, 4), nn.Linear(4, 3), nn.Linear(3, 2)

        def forward(self, x):
            return self.out(torch.relu(self.fc(self.w(self.w(x)))))

    analysis = analyse(Twice(), torch.randn(5, 4))
    assert claims(analysis) == {"PositiveScaling(3, alpha=1) on fc", "S(3) on fc"}
    assert any("w.weight columns" in r for r in blocked_at(analysis, "w"))


def test_a_module_called_on_the_raw_input_and_on_a_hidden_value():
    """Fuzzer finding F2: ``m0(x) + m0(silu(m1(x)))`` claimed ``S(2)`` on ``m1``."""
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1, self.m2 = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 5)

        def forward(self, x):
            return self.m2(self.m0(x) + self.m0(F.silu(self.m1(x))))

    analysis = analyse(Model(), torch.randn(4, 2))
    assert claims(analysis) == {"GL(2) on m0"}
    assert any("m0.weight columns" in r for r in blocked_at(analysis, "m0"))


def test_a_module_called_twice_on_moving_values_keeps_its_conjugation():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.w, self.out = nn.Linear(3, 4), nn.Linear(4, 4, bias=False), nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.w(self.w(self.inp(x))))

    analysis = analyse(Twice(), torch.randn(5, 3))
    assert "GL(4) on inp" in claims(analysis)


# -- 7. a weight-shared block with a norm gain moves the gain once ----------------------------------

class _SharedBlock(nn.Module):
    """ALBERT / Universal-Transformer style: one block (linear, ReLU, norm with gain) applied three times."""

    def __init__(self, norm):
        super().__init__()
        self.inp, self.fc, self.norm, self.out = nn.Linear(3, 4), nn.Linear(4, 4), norm, nn.Linear(4, 2)

    def forward(self, x):
        h = self.inp(x)
        for _ in range(3):
            h = h + self.norm(torch.relu(self.fc(h)))
        return self.out(h)


@pytest.mark.parametrize("norm", [nn.LayerNorm(4), nn.RMSNorm(4)], ids=["layer_norm", "rms_norm"])
def test_a_shared_norm_gain_is_scaled_once_and_counted_once(norm):
    analysis = analyse(_SharedBlock(norm), torch.randn(5, 3))
    assert claims(analysis) == {"PositiveScaling(4, alpha=1) on inp", "SignFlips(4) on inp", "S(4) on inp"}
    (scaling,) = [s for s in analysis.symmetries if s.label.startswith("PositiveScaling")]
    gains = [b for b in scaling.bindings if b.tensor == "norm.weight"]
    assert len(gains) == 1 and gains[0].role == "out"
    report = symalg.verify(analysis)
    assert report.passed, [c for c in report.checks if not c.passed]


def test_a_shared_block_between_norm_calls():
    """Fuzzer finding F8: ``h = norm(h + m2(relu(m1(h))))`` three times with one RMSNorm gain."""
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1, self.m2 = nn.Linear(4, 4), nn.Linear(4, 6), nn.Linear(6, 4)
            self.norm, self.out = nn.RMSNorm(4), nn.Linear(4, 1)

        def forward(self, x):
            h = self.m0(x)
            for _ in range(3):
                h = self.norm(h + self.m2(torch.relu(self.m1(h))))
            return self.out(h)

    analysis = analyse(Model(), torch.randn(3, 4))
    assert claims(analysis) == {"PositiveScaling(6, alpha=1) on m1", "S(6) on m1", "SignFlips(4) on m0", "S(4) on m0"}


def test_a_norm_called_on_two_streams_scales_its_gain_for_both():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.norm, self.fc, self.out = nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = self.inp(x)
            for _ in range(2):
                h = self.fc(self.norm(h))
            return self.out(h)

    analysis = analyse(Shared(), torch.randn(5, 3))
    assert claims(analysis) == {"Translations(4, along 1) on inp", "PositiveScaling(4, alpha=1) on norm",
                                "SignFlips(4) on norm", "S(4) on inp"}


# -- 8. per-head attention weights pin the head permutation -----------------------------------------

class _Attention(nn.Module):
    def __init__(self, average: bool, use: str):
        super().__init__()
        self.attention, self.out = nn.MultiheadAttention(4, 2, batch_first=True), nn.Linear(4, 2)
        self.average, self.use = average, use

    def forward(self, x):
        y, weights = self.attention(x, x, x, need_weights=True, average_attn_weights=self.average)
        if self.use == "returned":
            return self.out(y), weights
        return self.out(y) + weights[:, 0].sum(-1, keepdim=True)


PER_HEAD = {"GL(2) on attention.head0.qk", "GL(2) on attention.head0.vo", "GL(2) on attention.head1.qk",
            "GL(2) on attention.head1.vo", "GL(4) on attention.out_proj",
            # the key bias: the attention weights, returned or not, ignore a per-query constant in the scores
            "Translations(2, bias) on attention.head0.qk", "Translations(2, bias) on attention.head1.qk",
            # each head's value bias into out_proj's bias, and out_proj's bias into out's (the weights are unchanged)
            "Shears(2) on attention.head0.vo", "Shears(2) on attention.head1.vo", "Shears(4) on attention.out_proj"}


@pytest.mark.parametrize("use, node", [("returned", "output"), ("consumed", "getitem_2")])
def test_per_head_attention_weights_pin_the_head_permutation(use, node):
    analysis = analyse(_Attention(average=False, use=use), torch.randn(2, 3, 4))
    assert claims(analysis) == PER_HEAD
    assert any("S removed" in r for r in blocked_at(analysis, node))


def test_averaged_attention_weights_keep_the_head_permutation():
    analysis = analyse(_Attention(average=True, use="returned"), torch.randn(2, 3, 4))
    assert claims(analysis) == PER_HEAD | {"S(2) on attention.heads"}
