"""Rotary variants and score functions: partial rotary embeddings (GPT-NeoX's ``rotary_ndims``) give each head
``C(r/2)`` on the rotated planes and ``GL(d − r)`` on the rest, the key bias translating on the rest only; a soft cap
``c·tanh(S/c)`` (Gemma 2) keeps the per-head ``GL`` but no key-bias translation. Every claim is applied at generic
parameters and checked on inputs of other shapes; near misses claim nothing they should not."""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.fuzz import rope_partial, rope_tables, rotate_half

D, H = 12, 2
DK = D // H


def _rope(x, r, learned=None, trailing=False):
    """``cat((rope(x[…, :r]), x[…, r:]))`` with Hugging Face's tables (or the ``learned`` ones); ``r = DK``: whole."""
    width = DK - r if trailing else r   # trailing: x[…, :r] passed, the other coordinates rotated
    cos, sin = rope_tables(x, width) if learned is None else (learned[0][: x.shape[-2], :width],
                                                             learned[1][: x.shape[-2], :width])
    if r == DK:
        return x * cos + rotate_half(x) * sin
    return rope_partial(x, cos, sin, r, trailing=trailing)


class Attention(nn.Module):
    """``o(softmax(scores(Q Kᵀ/√d_k)) V)`` with ``H`` heads of width ``DK``, queries rotated on their first ``rq``
    coordinates and keys on their first ``rk`` (0: not rotated), any batch and sequence length."""

    def __init__(self, rq=0, rk=0, scores=lambda s: s, form="explicit", learned=False, trailing=False, q_fn=None):
        super().__init__()
        self.rq, self.rk, self.scores, self.form, self.trailing, self.q_fn = rq, rk, scores, form, trailing, q_fn
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.tables = nn.Parameter(torch.randn(2, 16, max(rq, rk, 2))) if learned else None

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = (f(x).view(batch, length, H, DK).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.rq:
            q = _rope(q, self.rq, self.tables, self.trailing)
        if self.rk:
            k = _rope(k, self.rk, self.tables, self.trailing)
        if self.q_fn is not None:
            q = self.q_fn(q)
        if self.form == "sdpa":
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = self.scores(q @ k.transpose(-2, -1) * DK ** -0.5).softmax(-1) @ v
        return self.o(a.transpose(1, 2).reshape(batch, length, D))


def _x(batch=2, length=5, seed=3):
    return torch.randn(batch, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _analysis(model, tracer):
    torch.manual_seed(0)
    return symalg.derive(symalg.trace(model.double().eval(), (_x(),), tracer=tracer), certify=False)


def _claims(analysis):
    return {s.label.split("(")[0] + " on " + s.label.split(" on ")[1] for s in analysis.symmetries}


def _relative_change(model, params, moved, x):
    before = torch.func.functional_call(model, params, (x,))
    after = torch.func.functional_call(model, moved, (x,))
    return ((after - before).norm() / before.norm()).item()


def _worst_error(model, analysis):
    """The largest relative output change over every claim, each applied by its sampled elements at generic
    parameters, on inputs of the traced shape and of two others."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    errors = [_relative_change(model, params, s.apply(params, g), x)
              for s in analysis.symmetries for _, g in s.group.sample(generator)
              for x in (_x(), _x(3, 7, 4), _x(1, 2, 5))]
    return max(errors)


def _key_bias_change(model, coordinates):
    """Relative output change when the key bias moves by 0.8 on ``coordinates`` of every head."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    moved = dict(params)
    shift = torch.zeros(D, dtype=torch.float64)
    for h in range(H):
        shift[[h * DK + c for c in coordinates]] = 0.8
    moved["k.bias"] = params["k.bias"] + shift
    return _relative_change(model, params, moved, _x(3, 7, 4))


def _notes(analysis, site):
    """The reasons given for what ``site`` lost: restrictions and blocked notes."""
    return [b.reason for b in analysis.sites.restrictions if b.site == site] + [
        str(b) for b in analysis.blocked if str(b).startswith(f"{site} ")]


PARTIAL = {"ComplexScaling on q.head0.qk.rotated", "ComplexScaling on q.head1.qk.rotated",
           "GL on q.head0.qk.passed", "GL on q.head1.qk.passed", "GL on q.head0.vo", "GL on q.head1.vo",
           "S on q.heads"}
VALUE_BIASES = {"Shears on q.head0.vo", "Shears on q.head1.vo"}
KEY_BIASES = {"Translations on q.head0.qk.passed", "Translations on q.head1.qk.passed"}


@pytest.mark.parametrize("r, form, tracer", [(2, "explicit", "fx"), (2, "explicit", "export"), (4, "sdpa", "fx"),
                                             (4, "sdpa", "export")])
def test_partial_rotary_gives_complex_scalings_on_the_rotated_planes_and_gl_on_the_rest(r, form, tracer):
    torch.manual_seed(0)
    model = Attention(r, r, form=form).double()
    analysis = _analysis(model, tracer)
    claims = {s.label: s for s in analysis.symmetries}
    assert _claims(analysis) == PARTIAL | VALUE_BIASES | KEY_BIASES
    assert claims["ComplexScaling(%d) on q.head0.qk.rotated" % r].group.width == r
    assert claims["GL(%d) on q.head0.qk.passed" % (DK - r)].group.width == DK - r
    settings = next(d for _, d in analysis.model_graph.graph.nodes(data=True) if d["op"] == "attention")["settings"]
    assert settings["rotary"] == {"queries": True, "keys": True, "pairing": "halves", "equal_halves": True, "dims": r}
    assert settings["key_shifts"]
    assert any(f"(j, j + {r}/2) of the first {r} coordinates" in n for n in _notes(analysis, "q.head0.qk.rotated"))
    assert _worst_error(model, analysis) < 1e-9
    # the key bias translates on the passed coordinates only: on a rotated one it changes the output
    assert _key_bias_change(model, range(r, DK)) < 1e-12
    assert _key_bias_change(model, [0]) > 1e-3


def test_a_general_linear_map_on_the_rotated_planes_changes_the_output():
    """The rotated part keeps complex scalings only: ``GL(r)`` there (with the passed part fixed) is refused rightly."""
    torch.manual_seed(0)
    model = Attention(4, 4).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.linalg.matrix_exp(0.5 * torch.randn(4, 4, dtype=torch.float64))
    moved = dict(params)
    for name, matrix in (("q", g), ("k", torch.linalg.inv(g).T)):
        for tensor in ("weight", "bias"):
            value = params[f"{name}.{tensor}"].clone()
            block = value[:4] if value.dim() == 1 else value[:4, :]
            value[:4] = matrix @ block
            moved[f"{name}.{tensor}"] = value
    assert _relative_change(model, params, moved, _x()) > 1e-3


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_keys_rotated_on_other_coordinates_than_the_queries_keep_no_query_key_group(tracer):
    torch.manual_seed(0)
    model = Attention(2, 4).double()
    analysis = _analysis(model, tracer)
    assert not any(".qk" in claim for claim in _claims(analysis))
    assert {"GL on q.head0.vo", "GL on q.head1.vo", "S on q.heads"} <= _claims(analysis)
    assert any("rotate the queries and keys on different coordinates" in n for n in _notes(analysis, "q.head0.qk"))
    assert _worst_error(model, analysis) < 1e-9


@pytest.mark.parametrize("variant", ["learned", "trailing", "queries"])
def test_partial_rotary_near_misses_claim_no_query_key_group(variant):
    """Learned tables (not proven equal on the halves), the trailing coordinates rotated (not matched: the heads are
    not folded), the queries alone rotated."""
    torch.manual_seed(0)
    model = {"learned": lambda: Attention(4, 4, learned=True), "trailing": lambda: Attention(2, 2, trailing=True),
             "queries": lambda: Attention(4, 0)}[variant]().double()
    analysis = _analysis(model, "fx")
    assert not any(".qk" in claim for claim in _claims(analysis))
    assert _worst_error(model, analysis) < 1e-9 if analysis.symmetries else True


SOFT_CAP = {"GL on q.head0.qk", "GL on q.head1.qk", "GL on q.head0.vo", "GL on q.head1.vo", "S on q.heads"}


def _soft_cap(s):
    return torch.tanh(s / 5.0) * 5.0


@pytest.mark.parametrize("cap, tracer", [(_soft_cap, "fx"), (_soft_cap, "export"), (lambda s: (s / 2.0).tanh() * 2.0,
                                                                                     "fx"),
                                         (torch.sigmoid, "fx")], ids=["tanh-fx", "tanh-export", "method", "sigmoid"])
def test_a_soft_capped_score_keeps_the_per_head_groups_but_no_key_bias_translation(cap, tracer):
    torch.manual_seed(0)
    model = Attention(scores=cap).double()
    analysis = _analysis(model, tracer)
    assert _claims(analysis) == SOFT_CAP | VALUE_BIASES
    settings = next(d for _, d in analysis.model_graph.graph.nodes(data=True) if d["op"] == "attention")["settings"]
    assert not settings["key_shifts"] and settings["heads_alike"]
    assert _worst_error(model, analysis) < 1e-9
    assert _key_bias_change(model, range(DK)) > 1e-3   # the translation that is (rightly) not claimed


def test_tanh_on_the_queries_before_the_product_is_no_attention_to_fold():
    torch.manual_seed(0)
    model = Attention(q_fn=torch.tanh).double()
    analysis = _analysis(model, "fx")
    assert not any(d["op"] == "attention" for _, d in analysis.model_graph.graph.nodes(data=True))
    assert not any(".qk" in claim or ".vo" in claim for claim in _claims(analysis))
    assert _worst_error(model, analysis) < 1e-9 if analysis.symmetries else True
