"""Shears: translations of a bias whose change the next biased map gives back in its own bias.

``β ↦ β + t`` moves a value by ``t`` at every position; a map ``W y + b`` reading it moves by ``W t``, which
``b ↦ b − W t`` cancels. symalg claims it for a norm's bias (a LayerNorm read by biased linears: pre-LN blocks), a
linear's bias across an identity site, and each attention head's value bias (rows of the attention weights sum to
1, so ``P(V + 1tᵀ) = PV + 1tᵀ``), and nowhere a reader cannot give the change back (no bias, a sign change or a
scale in between, the residual stream, the output, dropout on the attention weights). A biased map's output summed
with the raw input (a residual stream nothing else moves) carries its shift on to the sum's readers. Each test
derives without certification (the rules alone), checks every claim on every output, and names the node of each
refusal.
"""
import math

import pytest
import sympy as sp
import torch
import torch.nn as nn
import torch.nn.functional as F

import symalg
from symalg.catalogue.bindings import Absorber, Binding, TranslationFamily
from symalg.catalogue.groups import Shears
from symalg.numeric.orbit_rank import model_orbit_dimension, model_orbit_dimension_formula
from symalg.numeric.sampling import random_params
from symalg.verification.certification import assert_claims_hold, claim_errors
from symalg.verification.checks import integrate_gradient_flow, loss_gradients


def analyse(model, *inputs, **options):
    """Derive ``model`` traced on ``inputs`` without certification; assert that every claim keeps every output."""
    analysis = symalg.derive(symalg.trace(model.double(), inputs), certify=False, **options)
    assert_claims_hold(analysis)
    return analysis


def labels(analysis) -> set[str]:
    return {s.label for s in analysis.symmetries}


def shear(analysis, site: str):
    (found,) = [s for s in analysis.symmetries if s.label == f"{s.group.name} on {site}" and s.sheared]
    return found


def notes(analysis, node: str | None = None) -> list[str]:
    return [b.reason for b in analysis.blocked + analysis.sites.restrictions if node is None or b.node == node]


# -- a norm's bias into the next layer ------------------------------------------------------------------------

class PreNorm(nn.Module):
    """``ln → q, k, v`` read apart (ViT's ``layernorm_before``), or ``ln → up`` (an MLP), or both at once."""

    def __init__(self, d=4, readers=("q", "k"), bias=True, reader_bias=True, between=None, residual=False):
        super().__init__()
        self.inp = nn.Linear(3, d)
        self.ln = nn.LayerNorm(d, bias=bias)
        self.readers = nn.ModuleDict({name: nn.Linear(d, d, bias=reader_bias) for name in readers})
        self.between, self.residual = between, residual

    def forward(self, x):
        x = self.inp(x)
        y = self.ln(x)
        if self.between == "neg":
            y = -y
        elif self.between == "scale":
            y = 0.5 * y
        elif self.between is not None:
            y = F.dropout(y, 0.3, training=self.between == "train")
        outputs = [torch.tanh(layer(y)) for layer in self.readers.values()]
        out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, -1)
        return torch.cat([out, y], -1) if self.residual else out


def test_a_layer_norm_bias_moves_into_every_biased_reader():
    analysis = analyse(PreNorm(readers=("q", "k", "v")), torch.randn(2, 5, 3))
    symmetry = shear(analysis, "ln")
    assert isinstance(symmetry.group, Shears) and symmetry.group.name == "Shears(4)" and symmetry.group.dim == 4
    assert symmetry.tensors == ("ln.bias", "readers.q.bias", "readers.k.bias", "readers.v.bias")
    assert symmetry.reads == ("readers.q.weight", "readers.k.weight", "readers.v.weight")
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    t = torch.tensor([0.5, -1.0, 2.0, 0.25])
    moved = symmetry.apply(params, t)
    assert torch.allclose(moved["ln.bias"], params["ln.bias"] + t)
    for name in "qkv":
        weight = params[f"readers.{name}.weight"]
        assert torch.allclose(moved[f"readers.{name}.bias"], params[f"readers.{name}.bias"] - weight @ t)
        assert moved[f"readers.{name}.weight"] is weight           # read, not moved
    assert max(e.error for e in claim_errors(analysis, symmetries=[symmetry])) < 1e-12
    # two steps add up (the readers' weights do not move): an abelian group
    twice = symmetry.apply(symmetry.apply(params, t), -0.5 * t)
    assert all(torch.allclose(twice[k], symmetry.apply(params, 0.5 * t)[k]) for k in twice)


@pytest.mark.parametrize("between, reason", [
    ("neg", "reads the value scaled or negated"), ("scale", "reads the value scaled or negated"),
    ("train", "dropout in training mode")])
def test_a_norm_bias_read_through_a_sign_change_a_scale_or_dropout_is_not_sheared(between, reason):
    analysis = analyse(PreNorm(between=between), torch.randn(2, 5, 3))
    assert not any(s.sheared for s in analysis.symmetries)
    assert any(reason in note for note in notes(analysis))


def test_dropout_in_eval_mode_passes_the_shear():
    assert "Shears(4) on ln" in labels(analyse(PreNorm(between="eval"), torch.randn(2, 5, 3)))


@pytest.mark.parametrize("options, reason", [
    ({"reader_bias": False}, "has no bias"),                 # no bias to give W t back
    ({"residual": True}, "the model output"),               # the norm's output is also returned
    ({"bias": False}, None)])                                # nothing to translate
def test_near_misses_of_the_norm_bias_shear(options, reason):
    analysis = analyse(PreNorm(**options), torch.randn(2, 5, 3))
    assert not any(s.sheared for s in analysis.symmetries)
    assert reason is None or any(reason in note for note in notes(analysis))


def test_post_ln_feeds_the_residual_stream_and_keeps_only_the_gain():
    class PostLN(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.ln, self.mlp = nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 4)

        def forward(self, x):
            y = self.ln(self.inp(x))
            return y + self.mlp(y)

    analysis = analyse(PostLN(), torch.randn(2, 5, 3))
    assert not any(s.sheared for s in analysis.symmetries)


def test_a_shared_reader_bias_blocks_the_shear_and_says_so():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.ln = nn.Linear(3, 4), nn.LayerNorm(4)
            self.w, self.w2, self.b = (nn.Parameter(torch.randn(*shape)) for shape in ((2, 4), (2, 4), (2,)))

        def forward(self, x):
            h = self.inp(x)   # the bias b also serves relu(h)
            return F.linear(self.ln(h), self.w, self.b) + F.linear(torch.relu(h), self.w2, self.b)

    analysis = analyse(Shared(), torch.randn(5, 3))
    assert not any(s.sheared for s in analysis.symmetries)
    assert any("b absorbing it is also used elsewhere" in note for note in notes(analysis))


def test_a_norm_shared_by_two_calls_is_not_sheared():
    class Albert(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.ln, self.up = nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 4)

        def forward(self, x):
            x = self.inp(x)
            for _ in range(2):
                x = x + torch.relu(self.up(self.ln(x)))
            return x

    assert not any(s.sheared for s in analyse(Albert(), torch.randn(2, 3, 3)).symmetries)


def test_gpt2_style_addmm_reads_the_norm_and_gives_back_w_transposed_t():
    class Conv1DBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.ln_1 = nn.Linear(3, 4), nn.LayerNorm(4)
            self.c_attn_weight, self.c_attn_bias = nn.Parameter(torch.randn(4, 6)), nn.Parameter(torch.randn(6))

        def forward(self, x):
            y = self.ln_1(self.inp(x))
            return torch.tanh(torch.addmm(self.c_attn_bias, y.reshape(-1, 4), self.c_attn_weight))

    analysis = analyse(Conv1DBlock(), torch.randn(2, 5, 3))
    symmetry = shear(analysis, "ln_1")
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    t = torch.randn(4)
    moved = symmetry.apply(params, t)["c_attn_bias"]
    assert torch.allclose(moved, params["c_attn_bias"] - params["c_attn_weight"].T @ t)
    assert r"b_{\mathrm{ln\_1}} \mapsto b_{\mathrm{ln\_1}} + t" in symmetry.latex()
    assert r"\mathrm{c\_attn\_bias} \mapsto \mathrm{c\_attn\_bias} - \mathrm{c\_attn\_weight}\, t" in symmetry.latex()


def test_an_eval_batch_norm_bias_moves_into_an_unpadded_convolution_and_not_into_a_padded_one():
    def model(padding):
        return nn.Sequential(nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3).eval(), nn.Conv1d(3, 2, 3, padding=padding))

    analysis = analyse(model(0), torch.randn(4, 2, 8))
    symmetry = shear(analysis, "1")
    assert symmetry.tensors == ("1.bias", "2.bias")
    padded = analyse(model(1), torch.randn(4, 2, 8))
    assert not any(s.sheared for s in padded.symmetries)
    assert any("pads with zeros" in note for note in notes(padded))


def test_a_group_norms_per_group_bias_shift_is_given_back_through_that_groups_columns():
    """A conv's output read by a group norm (which ignores a shift of each group's biases along ``1``) and by an
    unpadded convolution: the group's shift moves into the reader's bias through the group's columns only."""
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.gn = nn.Conv1d(2, 4, 1), nn.GroupNorm(2, 4, affine=False)
            self.a, self.b = nn.Conv1d(4, 3, 1), nn.Conv1d(4, 3, 1)

        def forward(self, x):
            h = self.c(x)
            return self.a(self.gn(h)) + self.b(h)

    analysis = analyse(Branches(), torch.randn(3, 2, 5))
    symmetry = shear(analysis, "c")
    assert symmetry.group.name == "Shears(2)"   # one direction per group of 2 channels
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    moved = symmetry.apply(params, torch.tensor([0.0, 1.0]))
    assert torch.allclose(moved["c.bias"], params["c.bias"] + torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.allclose(moved["b.bias"], params["b.bias"] - params["b.weight"][:, 2:4].sum((1, 2)))


# -- a linear's bias across an identity site ---------------------------------------------------------------

def test_a_linear_bias_across_an_identity_site_is_sheared_and_the_spec_agrees():
    model = nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2))
    analysis = analyse(model, torch.randn(6, 3))
    assert labels(analysis) == {"GL(4) on 0", "Shears(4) on 0"}
    spec = symalg.derive("linear(n, h) -> identity -> linear(h, m)")
    assert [s.label for s in spec.symmetries] == ["GL(h) on 0", "Shears(h) on 0"]
    assert symalg.derive("linear(n, h) -> identity -> linear(h, m, bias=False)").symmetries[-1].label == \
        "GL(h) on 0"


class Stream(nn.Module):
    """``c(s)`` with ``s = x ∘ b(tanh(a x))``: a biased map's output summed with the raw input, which nothing moves
    (``form``: ``x + u``, ``u + x``, ``u − x``; near misses ``x − u``, ``torch.add(x, u, alpha=2)``), read by ``c``
    (biased or not, through ``relu`` or not)."""

    def __init__(self, form="add", reader_bias=True, act=False):
        super().__init__()
        self.form, self.act = form, act
        self.a, self.b, self.c = nn.Linear(2, 3), nn.Linear(3, 2), nn.Linear(2, 1, bias=reader_bias)

    def forward(self, x):
        u = self.b(torch.tanh(self.a(x)))
        s = {"add": lambda: x + u, "first": lambda: u + x, "sub_first": lambda: u - x, "sub": lambda: x - u,
             "alpha": lambda: torch.add(x, u, alpha=2.0)}[self.form]()
        return self.c(torch.relu(s) if self.act else s)


@pytest.mark.parametrize("form", ["add", "first", "sub_first"])
def test_a_bias_summed_with_the_raw_input_moves_into_the_readers_bias(form):
    torch.manual_seed(0)
    analysis = analyse(Stream(form), torch.randn(6, 2))
    found = shear(analysis, "b")
    assert found.tensors == ("b.bias", "c.bias")
    report = symalg.verify(analysis)
    assert report.passed, report.summary()


@pytest.mark.parametrize("options, node", [({"form": "sub"}, "sub"), ({"form": "alpha"}, "add"),
                                           ({"reader_bias": False}, "c"), ({"act": True}, "relu")])
def test_a_sum_with_the_raw_input_is_not_sheared_where_the_shift_arrives_changed_or_is_not_given_back(options, node):
    torch.manual_seed(0)
    analysis = analyse(Stream(**options), torch.randn(6, 2))
    assert not any(s.sheared for s in analysis.symmetries)
    assert notes(analysis, node)


def test_an_affine_site_orbit_formula_matches_the_numeric_and_dense_ranks():
    """``GL(h)`` with its shear acts as the affine group of the site: the bias no longer constrains ``M`` (kernel
    elements have ``t = −M b``), so the orbit dimension is ``h² + h − (h − min(h, n))(h − min(h, m))``: the whole
    fibre of ``(W₁, b₁, W₂, b₂) ↦ (W₂W₁, W₂b₁ + b₂)`` when it is onto."""
    formula = symalg.derive("linear(n, h) -> identity -> linear(h, m)").orbit_dimension()
    h, n, m = sp.symbols("h n m", positive=True, integer=True)
    assert sp.simplify(formula - (h ** 2 + h - (h - sp.Min(h, m)) * (h - sp.Min(h, n)))) == 0
    for widths in ({"n": 2, "h": 5, "m": 3}, {"n": 4, "h": 3, "m": 5}, {"n": 1, "h": 4, "m": 1}):
        concrete = symalg.derive("linear(n, h) -> identity -> linear(h, m)").subs(widths)
        params = random_params(concrete.architecture, torch.Generator().manual_seed(0))
        numeric = model_orbit_dimension(concrete, params)
        assert numeric.dimension == model_orbit_dimension(concrete, params, method="dense").dimension == \
            formula.subs({h: widths["h"], n: widths["n"], m: widths["m"]})
        if widths["h"] > widths["n"] + 1:   # GL(h) not fixed by its own weights: the affine closed form
            assert numeric.components[0].steps == (f"GL({widths['h']}) on 0 with its translations: ({widths['h']} − "
                                                   f"{widths['n']})({widths['h']} − {widths['m']}) = "
                                                   f"{(widths['h'] - widths['n']) * (widths['h'] - widths['m'])}",)


@pytest.mark.parametrize("spec", [
    "linear(n, h) -> identity -> linear(h, k) -> identity -> linear(k, m)",
    "linear(n, h) -> identity -> linear(h, k) -> identity -> linear(k, m, bias=False)",   # ends at a kept bias
    "linear(n, h) -> identity -> linear(h, k) -> relu -> linear(k, m)"])
def test_chains_with_shears_have_a_formula_that_the_ranks_confirm(spec):
    analysis = symalg.derive(spec)
    formula = analysis.orbit_dimension()
    for widths in ({"n": 2, "h": 5, "k": 3, "m": 2}, {"n": 1, "h": 4, "k": 6, "m": 1},
                   {"n": 4, "h": 3, "k": 3, "m": 5}):
        concrete = analysis.subs(widths)
        params = random_params(concrete.architecture, torch.Generator().manual_seed(1))
        dense = model_orbit_dimension(concrete, params, method="dense").dimension
        assert model_orbit_dimension(concrete, params).dimension == dense == \
            formula.subs({s: widths[str(s)] for s in formula.free_symbols})


def test_a_traced_deep_linear_chain_with_every_bias_sheared_keeps_the_chain_rank():
    model = nn.Sequential(nn.Linear(2, 5), nn.Linear(5, 6), nn.Linear(6, 4), nn.Linear(4, 3)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 2),)))
    result = model_orbit_dimension(analysis)
    assert [c.method for c in result.components] == ["chain"]
    assert result.dimension == model_orbit_dimension(analysis, method="dense").dimension == \
        model_orbit_dimension_formula(analysis)


# -- the value bias into the output projection --------------------------------------------------------------

class Attention(nn.Module):
    """Self-attention with ``heads`` query heads and ``groups`` key/value heads, written out or by ``sdpa``."""

    def __init__(self, d=4, heads=2, groups=2, o_bias=True, form="explicit", dropout=None, returned=False):
        super().__init__()
        self.h, self.g, self.dk = heads, groups, d // heads
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, groups * self.dk)
        self.v, self.o = nn.Linear(d, groups * self.dk), nn.Linear(d, d, bias=o_bias)
        self.form, self.dropout, self.returned = form, dropout, returned
        self.register_buffer("future", torch.ones(3, 3, dtype=torch.bool).triu(1))

    def forward(self, x):
        B, T, d = x.shape
        q = self.q(x).view(B, T, self.h, self.dk).transpose(1, 2)
        k, v = (z.view(B, T, self.g, self.dk).transpose(1, 2) for z in (self.k(x), self.v(x)))
        if self.g != self.h:
            k, v = k.repeat_interleave(self.h // self.g, 1), v.repeat_interleave(self.h // self.g, 1)
        if self.form == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout or 0.0)
        else:
            s = (q @ k.transpose(-2, -1) / math.sqrt(self.dk)).masked_fill(self.future, float("-inf"))
            p = s.softmax(-1)
            a = F.dropout(p, 0.25, training=self.dropout == "train") if self.dropout else p
            a = a @ v
        merged = a.transpose(1, 2).reshape(B, T, d)
        return (self.o(merged), merged) if self.returned else self.o(merged)


@pytest.mark.parametrize("form", ["explicit", "sdpa"])
def test_each_head_value_bias_moves_into_the_output_bias(form):
    analysis = analyse(Attention(form=form), torch.randn(2, 3, 4))
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    for head, rows in ((0, slice(0, 2)), (1, slice(2, 4))):
        symmetry = shear(analysis, f"q.head{head}.vo")
        t = torch.tensor([1.5, -0.5])
        moved = symmetry.apply(params, t)
        assert torch.allclose(moved["v.bias"][rows], params["v.bias"][rows] + t)
        assert torch.allclose(moved["o.bias"], params["o.bias"] - params["o.weight"][:, rows] @ t)
        assert rf"b_{{v}}[{rows.start}:{rows.stop}] \mapsto b_{{v}}[{rows.start}:{rows.stop}] + t" in symmetry.latex()


def test_grouped_query_value_bias_is_read_by_every_query_head_of_its_group():
    analysis = analyse(Attention(heads=2, groups=1), torch.randn(2, 3, 4))
    symmetry = shear(analysis, "q.group0.vo")
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    t = torch.tensor([1.0, 2.0])
    W = params["o.weight"]
    assert torch.allclose(symmetry.apply(params, t)["o.bias"], params["o.bias"] - (W[:, 0:2] + W[:, 2:4]) @ t)
    assert r"\left(W_{o}[:, 0:2] + W_{o}[:, 2:4]\right)\, t" in symmetry.latex()


@pytest.mark.parametrize("options, reason", [
    ({"o_bias": False}, "has no bias"),
    ({"returned": True}, "the model output"),
    ({"dropout": "train"}, None), ({"form": "sdpa", "dropout": 0.3}, None)])   # rows of dropped weights do not sum to 1
def test_near_misses_of_the_value_bias_shear(options, reason):
    analysis = analyse(Attention(**options), torch.randn(2, 3, 4))
    assert not any(s.sheared for s in analysis.symmetries)
    assert reason is None or any(reason in note for note in notes(analysis))


def test_dropout_on_the_attention_weights_in_training_keeps_the_heads_apart_and_in_eval_does_not():
    trained = analyse(Attention(dropout="train"), torch.randn(2, 3, 4))
    assert "S(2) on q.heads" not in labels(trained)
    assert any("dropout differs between heads" in note for note in notes(trained))
    evaluated = analyse(Attention(dropout="eval"), torch.randn(2, 3, 4))
    assert {"S(2) on q.heads", "Shears(2) on q.head0.vo", "Shears(2) on q.head1.vo"} <= labels(evaluated)


def test_multihead_attention_moves_its_value_bias_into_out_proj_and_its_input_shift_into_in_proj():
    class Block(nn.Module):
        def __init__(self, train=False):
            super().__init__()
            self.inp, self.ln = nn.Linear(3, 4), nn.LayerNorm(4)
            self.attn = nn.MultiheadAttention(4, 2, batch_first=True, dropout=0.25)
            self.attn.train(train)

        def forward(self, x):
            y = self.ln(self.inp(x))
            return self.attn(y, y, y, need_weights=False)[0]

    analysis = analyse(Block(), torch.randn(2, 3, 3))
    assert shear(analysis, "ln").tensors == ("ln.bias", "attn.in_proj_bias")
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    head1 = shear(analysis, "attn.head1.vo")
    moved = head1.apply(params, torch.ones(2))
    assert torch.allclose(moved["attn.in_proj_bias"][10:12], params["attn.in_proj_bias"][10:12] + 1)
    assert torch.allclose(moved["attn.out_proj.bias"],
                          params["attn.out_proj.bias"] - params["attn.out_proj.weight"][:, 2:4].sum(1))
    trained = analyse(Block(train=True), torch.randn(2, 3, 3))
    assert {s.label for s in trained.symmetries if s.sheared} == {"Shears(4) on ln"}
    assert "S(2) on attn.heads" not in labels(trained)


# -- conserved quantities, verification, reports -------------------------------------------------------------

def test_a_shear_conserves_nothing_its_field_is_no_gradient_and_its_naive_linear_quantity_drifts():
    """``∇L ⊥ B_i(θ)`` at every θ, but no ``Q`` has ``∇Q`` in the span of the ``B_i(θ)``: the field ``θ ↦ B_i(θ)``
    has a non-symmetric Jacobian (``∂B_b/∂W ≠ 0 = ∂B_W/∂b``), so it is no gradient, and the linear quantity
    ``⟨B_i(θ₀), θ⟩`` a constant-direction translation would conserve drifts at first order along gradient flow."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)).double()
    x, y = torch.randn(8, 3), torch.randn(8, 2)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    symmetry = shear(analysis, "1")
    assert symmetry.conserved is None and symmetry.group.conserved_kind is None and symmetry.group.n_symmetric == 0
    assert symmetry not in [q for q in analysis.conserved_quantities()]
    names = [k for k, _ in model.named_parameters()]
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p):
        return ((torch.func.functional_call(model, p, (x,)) - y) ** 2).mean()

    grads = loss_gradients(loss, params)
    basis = [symmetry.tangent(params, e) for e in torch.eye(4)]
    for direction in basis:   # the gradient is orthogonal to every direction at θ
        assert abs(sum((grads[k] * v).sum() for k, v in direction.items())) < 1e-12 * float(
            sum(g.norm() ** 2 for g in grads.values()).sqrt())

    def field(flat):   # θ ↦ B_0(θ), flattened in the order of ``names``
        p = dict(zip(names, torch.split(flat, [params[k].numel() for k in names])))
        p = {k: v.reshape(params[k].shape) for k, v in p.items()}
        change = symmetry.tangent(p, torch.eye(4)[0])
        return torch.cat([change.get(k, torch.zeros_like(p[k])).reshape(-1) for k in names])

    flat = torch.cat([params[k].reshape(-1) for k in names])
    J = torch.func.jacfwd(field)(flat)                # J[a, b] = ∂B_0[a]/∂θ[b]
    offsets = dict(zip(names, torch.cumsum(torch.tensor([0] + [params[k].numel() for k in names]), 0).tolist()))
    weight = slice(offsets["2.weight"], offsets["2.weight"] + params["2.weight"].numel())
    bias = slice(offsets["2.bias"], offsets["2.bias"] + params["2.bias"].numel())
    assert J[bias, weight].abs().max() == 1           # ∂B_b/∂W: b moves by −W e_0
    assert J[weight, bias].abs().max() == 0           # ∂B_W/∂b: W does not move
    assert (J - J.T).abs().max() == 1                 # not symmetric: no potential Q with ∇Q = B_0
    flowed, _ = integrate_gradient_flow(loss, params, grads, 40, max_move=1e-3)
    moved = {**params, **flowed}
    B0 = basis[0]
    before = sum((B0[k] * params[k]).sum() for k in B0)
    after = sum((B0[k] * moved[k]).sum() for k in B0)
    assert abs(after - before) > 1e-6                  # the naive linear quantity is not conserved
    assert symalg.verify(analysis).passed


def test_reports_and_dict_describe_the_readers():
    analysis = symalg.derive(symalg.trace(PreNorm(readers=("q",)).double(), (torch.randn(2, 5, 3),)))
    entry = next(e for e in analysis.to_dict()["symmetries"] if e["group"] == "Shears(4)")
    assert entry["tensors"] == ["ln.bias", "readers.q.bias"] and entry["conserved"] is None
    assert "Shears(4) on ln  [continuous, dim 4]" in str(analysis)
    assert "readers.q.bias absorbs −readers.q.weight columns[0:4] (in) t" in str(analysis)
    assert r"W_{\mathrm{readers.q}}\, t" in analysis.latex()


def test_the_absorber_reads_dense_transposed_blocked_and_convolution_weights():
    W = torch.arange(12.).reshape(3, 4)
    dense = Absorber("b", Binding("W", 1, 1, 2, role="in"))
    assert torch.equal(dense.absorbed({"W": W}, torch.tensor([1., 0.])), W[:, 1])
    transposed = Absorber("b", Binding("W", 0, 0, 3, role="in"), out_axis=1)
    assert torch.equal(transposed.absorbed({"W": W}, torch.ones(3)), W.sum(0))
    blocks = Absorber("b", Binding("W", 1, 0, 2, block=2, role="in"))
    assert torch.equal(blocks.absorbed({"W": W}, torch.tensor([0., 1.])), W[:, 2] + W[:, 3])
    kernel = torch.arange(24.).reshape(2, 3, 4)
    conv = Absorber("b", Binding("K", 1, 0, 3, role="in"))
    assert torch.equal(conv.absorbed({"K": kernel}, torch.tensor([1., 0., 0.])), kernel[:, 0].sum(-1))
    family = TranslationFamily("ones", (Binding("c", 0, 0, 2),), (dense,))
    (direction,) = family.directions({"c": torch.zeros(2), "b": torch.zeros(3), "W": W})
    assert torch.equal(direction["b"], -(W[:, 1] + W[:, 2]))
