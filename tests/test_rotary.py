"""Rotary position embeddings (RoPE): recognised between the head split and attention, exactly; the query/key group
of each head is the complex scaling of the planes ``(j, j + d_k/2)``, claimed only where it holds."""
import dataclasses

import pytest
import torch
from torch import nn

import symalg
from symalg.frontend.attention_folding import fold_attention
from symalg.numeric.orbit_rank import model_orbit_dimension, model_orbit_dimension_formula
from symalg.verification.certification import CERTIFICATION_TOLERANCE, claim_errors
from symalg.verification.fuzz import rope_tables, rotate_half

B, L, D = 2, 5, 8


def rotate_half_written(x):
    """Hugging Face's ``rotate_half`` as written in ``modeling_llama``: slices with a bound from the shape."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_hf(x, cos, sin):
    return x * cos + rotate_half_written(x) * sin


def rope_swapped(x, cos, sin):
    return rotate_half(x) * sin + cos * x


def rope_literal(x, cos, sin):
    """``x·cos + cat((−x₂, x₁))·sin`` with literal slice bounds (head width 4)."""
    return x * cos + torch.cat((-x[..., 2:], x[..., :2]), dim=-1) * sin


def rope_unsigned(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


class Rotary(nn.Module):
    """Attention of ``heads`` query heads over ``kv_heads`` key/value heads (repeated after the rotation, as Hugging
    Face's ``repeat_kv`` does), ``rope(q)`` and ``rope(k)`` with ``tables(self, q)``; ``form`` ``"sdpa"`` or
    ``"explicit"`` (``softmax(q kᵀ / √d_k) v`` written out)."""

    def __init__(self, rope_q=rope_hf, rope_k=rope_hf, tables=lambda net, q: rope_tables(q, q.shape[-1]),
                 heads=2, kv_heads=2, bias=False, form="sdpa"):
        super().__init__()
        self.heads, self.kv_heads, self.form = heads, kv_heads, form
        self.dk = D // heads
        self.q = nn.Linear(D, D, bias=bias)
        self.k, self.v = (nn.Linear(D, kv_heads * self.dk, bias=bias) for _ in range(2))
        self.o = nn.Linear(D, D)
        self.rope_q, self.rope_k, self.tables = rope_q, rope_k, tables
        self.learned = nn.Parameter(torch.randn(L, self.dk))

    def forward(self, x):
        q = self.q(x).view(B, L, self.heads, self.dk).transpose(1, 2)
        k, v = (f(x).view(B, L, self.kv_heads, self.dk).transpose(1, 2) for f in (self.k, self.v))
        cos, sin = self.tables(self, q)
        q, k = self.rope_q(q, cos, sin), self.rope_k(k, cos, sin)
        r = self.heads // self.kv_heads
        if r > 1:
            k, v = (z[:, :, None].expand(B, self.kv_heads, r, L, self.dk).reshape(B, self.heads, L, self.dk)
                    for z in (k, v))
        if self.form == "sdpa":
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            o = (q @ k.transpose(-2, -1) * self.dk ** -0.5).softmax(-1) @ v
        return self.o(o.transpose(1, 2).reshape(B, L, D))


def _x():
    return torch.randn(B, L, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


def _analysis(model, tracer="auto"):
    torch.manual_seed(0)
    return symalg.derive(symalg.trace(model.double(), (_x(),), tracer=tracer), certify=False)


def _labels(analysis):
    return sorted(s.label for s in analysis.symmetries)


def _attention(analysis):
    graph = analysis.model_graph.graph
    return next(graph.nodes[n] for n in graph if graph.nodes[n]["op"] == "attention")


ROPE = {"ComplexScaling(4) on q.head0.qk", "ComplexScaling(4) on q.head1.qk", "GL(4) on q.head0.vo",
        "GL(4) on q.head1.vo", "S(2) on q.heads"}
"""Per head the complex scalings of the query/key planes and GL(d_v), and the head permutation."""
VALUE_BIASES = {"Shears(4) on q.head0.vo", "Shears(4) on q.head1.vo"}
"""With biases: each head's value bias moved into the output bias (rotary embeddings leave the values alone)."""


@pytest.mark.parametrize("tracer", ["fx", "export"])
@pytest.mark.parametrize("rope", [rope_hf, rope_swapped, rope_literal], ids=["hf", "swapped", "literal"])
@pytest.mark.parametrize("form", ["sdpa", "explicit"])
def test_rotary_attention_folds_and_claims_complex_scalings_per_head(form, rope, tracer):
    torch.manual_seed(0)
    model = Rotary(rope, rope, form=form, bias=True)
    analysis = _analysis(model, tracer)
    assert set(_labels(analysis)) == ROPE | VALUE_BIASES    # no key-bias translation under RoPE
    settings = _attention(analysis)["settings"]
    assert settings["rotary"] == {"queries": True, "keys": True, "pairing": "halves", "equal_halves": True}
    assert not settings["key_shifts"]
    assert max(e.error for e in claim_errors(analysis)) < 1e-12
    restriction = next(b for b in analysis.sites.restrictions if b.site == "q.head0.qk")
    assert "only complex scalings of the planes commute with every rotation" in restriction.reason


def test_the_complex_scaling_is_the_whole_query_key_group_where_gl_fails():
    """Under RoPE a generic ``GL(d_k)`` element changes the output; the complex scalings do not."""
    torch.manual_seed(0)
    model = Rotary().double()
    analysis = _analysis(model)
    symmetry = next(s for s in analysis.symmetries if s.label == "ComplexScaling(4) on q.head0.qk")
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = _x()
    before = model(x)

    def change(g):
        moved = dict(params)
        for b in symmetry.bindings:   # the same regions, moved by an element of GL(4)
            moved[b.tensor] = b.fold(moved[b.tensor], (g if b.role == "out" else torch.linalg.inv(g).T) @
                                     b.unfold(moved[b.tensor]))
        return ((torch.func.functional_call(model, moved, (x,)) - before).norm() / before.norm()).item()

    generic = torch.linalg.matrix_exp(0.5 * torch.randn(4, 4, dtype=torch.float64))
    complex_scaling = symmetry.group.exp(symmetry.group.random_algebra_element(1.0, torch.Generator().manual_seed(1)))
    assert change(generic) > 1e-3
    assert change(complex_scaling) < 1e-13


def test_grouped_query_attention_with_rotary_embeddings_gets_one_complex_scaling_per_group():
    torch.manual_seed(0)
    analysis = _analysis(Rotary(heads=4, kv_heads=2))
    assert _labels(analysis) == ["ComplexScaling(2) on q.group0.qk", "ComplexScaling(2) on q.group1.qk",
                                 "GL(2) on q.group0.vo", "GL(2) on q.group1.vo", "S(2) on q.group0.heads",
                                 "S(2) on q.group1.heads", "S(2) on q.groups"]
    assert max(e.error for e in claim_errors(analysis)) < 1e-12


def test_a_key_bias_does_not_translate_under_rotary_embeddings():
    """``softmax_j(q_iᵀ R_{j−i}(k_j + b + t))``: the shift adds ``q_iᵀ R_{j−i} t``, which depends on the key ``j``."""
    torch.manual_seed(0)
    for rotated in (False, True):
        model = Rotary(*((rope_hf, rope_hf) if rotated else (lambda x, c, s: x,) * 2), bias=True).double()
        labels = _labels(_analysis(model))
        x = _x()
        before = model(x)
        with torch.no_grad():
            model.k.bias += 0.8
        shift = ((model(x) - before).norm() / before.norm()).item()
        translations = [label for label in labels if label.startswith("Translations")]
        if rotated:
            assert translations == [] and shift > 1e-3
        else:
            assert len(translations) == 2 and shift < 1e-12


@pytest.mark.parametrize("tables, proven", [
    (lambda net, q: rope_tables(q, net.dk), True),
    (lambda net, q: tuple(t.to(torch.float32).to(q.dtype) * 0.5 for t in rope_tables(q, net.dk)), True),  # casts
    (lambda net, q: tuple(t[None, None].expand(B, net.heads, L, net.dk) for t in rope_tables(q, net.dk)), True),
    (lambda net, q: tuple(t.reshape(1, L, net.dk).unsqueeze(1) for t in rope_tables(q, net.dk)), True),
    (lambda net, q: (rope_tables(q, net.dk)[0] * rope_tables(q, net.dk)[1], rope_tables(q, net.dk)[1]), True),
    (lambda net, q: _unequal(q), False),                                                       # cos ⊙ (1, 2, 3, 4)
    (lambda net, q: tuple(torch.cat((f, 2 * f), -1).cos() for f in [torch.outer(torch.arange(L, dtype=q.dtype),
                                                                                   torch.ones(2, dtype=q.dtype))] * 2),
     False),                                                                                   # cat((f, 2f))
    (lambda net, q: tuple(t.transpose(-2, -1).reshape(L, net.dk) for t in rope_tables(q, net.dk)), False),  # mixed
], ids=["hf", "cast-scaled", "expand", "reshape-unsqueeze", "product", "scaled-axis", "cat-unequal", "transposed"])
def test_equal_halves_are_proven_through_pointwise_ops_numbers_products_and_layouts(tables, proven):
    """The proof replays the tables' computation on value ids (equal ids: provably equal values); what it cannot see
    through is not proven, and the claims stay true either way."""
    torch.manual_seed(0)
    analysis = _analysis(Rotary(tables=tables))
    assert _attention(analysis)["settings"]["rotary"]["equal_halves"] is proven
    assert ("ComplexScaling(4) on q.head0.qk" in _labels(analysis)) is proven
    assert max(e.error for e in claim_errors(analysis)) < 1e-12


def test_tables_that_differ_per_head_remove_the_head_permutation():
    def per_head(net, q):
        cos, sin = rope_tables(q, q.shape[-1])
        factor = torch.arange(1, net.heads + 1, dtype=q.dtype)[:, None, None]   # (H, 1, 1)
        return cos * factor, sin * factor   # still equal on the halves

    torch.manual_seed(0)
    analysis = _analysis(Rotary(tables=per_head))
    assert set(_labels(analysis)) == ROPE - {"S(2) on q.heads"}
    assert any("differs between heads" in b.reason for b in analysis.sites.restrictions)
    assert max(e.error for e in claim_errors(analysis)) < 1e-12


def _unequal(q):
    """Hugging Face's tables with ``cos`` scaled by ``1, 2, …, d_k`` along the head axis: unequal halves."""
    cos, sin = rope_tables(q, q.shape[-1])
    return cos * torch.arange(1, q.shape[-1] + 1, dtype=q.dtype), sin


@pytest.mark.parametrize("tables, why", [
    (lambda net, q: (net.learned, net.learned.flip(-1)), "not proven equal on the two halves"),
    (lambda net, q: _unequal(q), "not proven equal on the two halves"),
    (lambda net, q: (torch.ones(L, net.dk, dtype=q.dtype), torch.linspace(0, 1, L * net.dk, dtype=q.dtype).view(
        L, net.dk)), "not proven equal on the two halves"),
], ids=["learned", "scaled", "unequal"])
def test_tables_not_proven_equal_on_the_halves_block_the_query_key_group(tables, why):
    """Each plane's map is then a general 2×2 matrix: a complex scaling would be false (certified below)."""
    torch.manual_seed(0)
    model = Rotary(tables=tables)
    analysis = _analysis(model)
    assert set(_labels(analysis)) == ROPE - {"ComplexScaling(4) on q.head0.qk", "ComplexScaling(4) on q.head1.qk"}
    assert any(why in b.reason and b.site == "q.head0.qk" for b in analysis.blocked)


def test_a_complex_scaling_with_unequal_tables_would_be_false():
    """The negative control behind the halves check: the same claim on a model whose tables differ on the halves."""
    torch.manual_seed(0)
    good = Rotary().double()
    analysis = _analysis(good)
    bad = Rotary(tables=lambda net, q: _unequal(q)).double()
    bad.load_state_dict(good.state_dict())
    moved = dataclasses.replace(analysis, model_graph=symalg.trace(bad, (_x(),)))
    errors = {e.symmetry.label: e.error for e in claim_errors(moved)}
    assert errors["ComplexScaling(4) on q.head0.qk"] > 1e3 * CERTIFICATION_TOLERANCE
    assert errors["GL(4) on q.head0.vo"] < CERTIFICATION_TOLERANCE


@pytest.mark.parametrize("rope_q, rope_k, side", [(rope_hf, lambda x, c, s: x, "queries"),
                                                  (lambda x, c, s: x, rope_hf, "keys")], ids=["q-only", "k-only"])
def test_a_rotation_of_one_side_blocks_the_query_key_group(rope_q, rope_k, side):
    torch.manual_seed(0)
    analysis = _analysis(Rotary(rope_q, rope_k))
    assert set(_labels(analysis)) == ROPE - {"ComplexScaling(4) on q.head0.qk", "ComplexScaling(4) on q.head1.qk"}
    assert any(f"rotates the {side} only" in b.reason for b in analysis.blocked)
    assert max(e.error for e in claim_errors(analysis)) < 1e-12


def test_rotate_half_without_its_sign_is_not_rotary_and_blocks_the_heads():
    torch.manual_seed(0)
    analysis = _analysis(Rotary(rope_unsigned, rope_unsigned))
    assert not any(s.label.endswith(".qk") or s.label.endswith(".vo") for s in analysis.symmetries)
    assert not any(d["op"] == "attention" for _, d in analysis.model_graph.graph.nodes(data=True))


def test_the_rotary_tables_are_inputs_of_the_attention_node_and_the_step_is_folded():
    torch.manual_seed(0)
    graph = symalg.trace(Rotary().double(), (_x(),), fold_attention=False)
    folded = fold_attention(graph.graph)
    ops = [d["op"] for _, d in folded.nodes(data=True)]
    assert ops.count("attention") == 1 and "neg" not in ops and "getitem" not in ops and "cat" in ops  # tables' cat
    attention = next(d for _, d in folded.nodes(data=True) if d["op"] == "attention")
    assert [folded.nodes[i]["op"] for i in attention["inputs"]] == ["linear", "linear", "linear", "cos", "sin"]


def test_orbit_dimension_of_complex_scalings_and_a_stratum_where_a_plane_is_cut_off():
    torch.manual_seed(0)
    model = Rotary().double()
    analysis = _analysis(model)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    generic = model_orbit_dimension(analysis, params)
    assert generic.dimension == model_orbit_dimension_formula(analysis) == \
        model_orbit_dimension(analysis, params, method="dense").dimension
    # plane 1 of head 0 is (1, 3): zero its query and key rows, and that plane's scaling and rotation move nothing
    for name in ("q.weight", "k.weight"):
        params[name][[1, 3]] = 0
    cut = model_orbit_dimension(analysis, params)
    assert cut.dimension == generic.dimension - 2 == model_orbit_dimension(analysis, params, method="dense").dimension
    assert [s.measured for s in cut.strata] == [s.expected - 2 for s in cut.strata]


def test_verify_passes_on_rotary_attention_with_its_conserved_plane_imbalance():
    torch.manual_seed(0)
    model = Rotary(bias=True)
    analysis = symalg.derive(symalg.trace(model.double(), (_x(),)))
    assert set(_labels(analysis)) == ROPE | VALUE_BIASES and analysis.certified
    report = symalg.verify(analysis)
    assert report.passed, report
    checks = {(c.check, c.symmetry) for c in report.checks}
    assert ("gradient_flow", "ComplexScaling(4) on q.head0.qk") in checks
    assert ("lowering", "ComplexScaling(4) on q.head0.qk") in checks
    quantity = next(s for s in analysis.symmetries if s.label == "ComplexScaling(4) on q.head0.qk").conserved
    W_q, b_q, W_k, b_k = model.q.weight[:4], model.q.bias[:4], model.k.weight[:4], model.k.bias[:4]
    rows = (W_q ** 2).sum(1) + b_q ** 2 - (W_k ** 2).sum(1) - b_k ** 2   # q_i = C_ii + C_{i+2,i+2}
    expected = rows[:2] + rows[2:]
    value = quantity({k: v.detach() for k, v in model.named_parameters()})[quantity.name]
    assert torch.allclose(value.flatten(), expected.detach(), atol=1e-12)
    assert quantity.latex().startswith(r"Q_{M} = \sum_i a_i \left(q_{\mathrm{q.head0.qk}}\right)_i,\ M = ")
    assert "[..., 0:2, 0:1]" in quantity.lowered.source   # the plane sums slice the last two axes (batches)
