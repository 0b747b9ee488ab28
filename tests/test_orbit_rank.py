"""Orbit dimension of traced models (``symalg.orbit_rank``): the structured rank of ``M ↦ M·θ`` equals
the dense ``torch.func`` baseline exactly, and the generic formula at random parameters; strata
(cut-off neurons, rank-deficient layers) lower it, are found by both methods and are reported."""
from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.catalogue.groups import GeneralLinear
from symalg.numeric.orbit_rank import (QR_FROM, RANK_METHODS, certified_rank, model_orbit_dimension,
                                      model_orbit_dimension_formula)

ACTIVATIONS = {
    "identity": nn.Identity, "relu": nn.ReLU, "tanh": nn.Tanh, "leaky_relu": lambda: nn.LeakyReLU(0.2),
    "radial": lambda: symalg.catalogue.modules.Activation("radial"),
    "relu_pow": lambda: symalg.catalogue.modules.Activation("relu_pow"),
}


def activation(rng, names=tuple(ACTIVATIONS)):
    return ACTIVATIONS[rng.choice(names)]()


# ---------------------------------------------------------------------------------------------
# random small models, one builder per family: (model, example inputs, params or None)
# ---------------------------------------------------------------------------------------------
def mlp(rng):
    depth = rng.randint(1, 4)
    widths = [rng.randint(1, 6) for _ in range(depth + 2)]
    layers = []
    for k in range(depth + 1):
        layers.append(nn.Linear(widths[k], widths[k + 1], bias=rng.random() < 0.7))
        if k < depth:     # a gain-free LayerNorm now and then: O(h) fixing the all-ones vector
            layers.append(activation(rng) if rng.random() < 0.85
                          else nn.LayerNorm(widths[k + 1], elementwise_affine=False))
    return nn.Sequential(*layers), (torch.randn(3, widths[0]),), None


class ConvNet(nn.Module):
    def __init__(self, rng):
        super().__init__()
        c1, c2 = rng.randint(1, 4), rng.randint(1, 4)
        self.conv1 = nn.Conv2d(2, c1, rng.choice([1, 3]), padding=1, bias=rng.random() < 0.7)
        self.norm = nn.BatchNorm2d(c1) if rng.random() < 0.5 else nn.Identity()
        self.act1 = activation(rng, ("identity", "relu", "tanh", "leaky_relu"))
        self.pool = rng.choice([nn.MaxPool2d(2), nn.AvgPool2d(2), nn.Identity()])
        self.conv2 = nn.Conv2d(c1, c2, rng.choice([1, 3]), bias=rng.random() < 0.7)
        self.act2 = activation(rng, ("identity", "relu", "leaky_relu"))
        self.fc = nn.Linear(c2 * 4, 3)

    def forward(self, x):
        x = self.pool(self.act1(self.norm(self.conv1(x))))
        x = F.adaptive_avg_pool2d(self.act2(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def cnn(rng):
    return ConvNet(rng), (torch.randn(3, 2, 6, 6),), None


class MHABlock(nn.Module):
    def __init__(self, rng):
        super().__init__()
        heads = rng.choice([1, 2])
        d, n = heads * rng.randint(1, 3), rng.randint(1, 6)
        self.inp, self.act = nn.Linear(n, d), activation(rng, ("identity", "relu", "tanh"))
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=rng.random() < 0.7)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        h = self.act(self.inp(x))
        return self.out(self.attn(h, h, h, need_weights=False)[0])


def mha(rng):
    block = MHABlock(rng)
    return block, (torch.randn(2, 3, block.inp.in_features),), None


class HandAttention(nn.Module):
    def __init__(self, rng):
        super().__init__()
        self.heads = rng.choice([1, 2])
        d, n = self.heads * rng.randint(1, 3), rng.randint(1, 6)
        self.explicit = rng.random() < 0.5
        self.inp, self.act = nn.Linear(n, d), activation(rng, ("identity", "relu", "leaky_relu"))
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        x = self.act(self.inp(x))
        B, L, d = x.shape
        q, k, v = (f(x).view(B, L, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.explicit:
            out = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(B, L, d))


def hand_attention(rng):
    block = HandAttention(rng)
    return block, (torch.randn(2, 3, block.inp.in_features),), None


class Residual(nn.Module):
    def __init__(self, rng):
        super().__init__()
        n, d, h, m = (rng.randint(1, 6) for _ in range(4))
        bias = rng.random() < 0.6
        if rng.random() < 0.3:      # a stream wider than its input, no biases: sites no private region decouples
            n, d, bias = 1, rng.randint(3, 5), False
        self.inp = nn.Linear(n, d, bias=bias)
        self.blocks = nn.ModuleList(
            nn.ModuleList([nn.Linear(d, h, bias=bias), activation(rng), nn.Linear(h, d, bias=bias)])
            for _ in range(rng.randint(1, 2)))
        self.out = nn.Linear(d, m)

    def forward(self, x):
        x = self.inp(x)
        for up, act, down in self.blocks:
            x = x + down(act(up(x)))
        return self.out(x)


def residual(rng):
    block = Residual(rng)
    return block, (torch.randn(4, block.inp.in_features),), None


def deep_linear(rng):
    """Linear layers with nothing between (a chain of GL sites), half of them at a rank-deficient point."""
    widths = [rng.randint(1, 3)] + [rng.randint(2, 6) for _ in range(rng.randint(2, 4))] + [rng.randint(1, 3)]
    model = nn.Sequential(*(nn.Linear(a, b, bias=rng.random() < 0.5) for a, b in zip(widths, widths[1:])))
    params = None
    if rng.random() < 0.5:
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        name = f"{rng.randrange(1, len(widths) - 2)}.weight"
        out, inp = params[name].shape
        rank = rng.randint(0, min(out, inp) - 1)
        params[name] = torch.randn(out, rank) @ torch.randn(rank, inp)
    return model, (torch.randn(3, widths[0]),), params


FAMILIES = {"mlp": (mlp, 30), "cnn": (cnn, 20), "mha": (mha, 15), "hand_attention": (hand_attention, 10),
            "residual": (residual, 20), "deep_linear": (deep_linear, 15)}
CASES = [(name, seed) for name, (_, count) in FAMILIES.items() for seed in range(count)]


@functools.lru_cache(maxsize=None)
def build(name: str, seed: int):
    torch.manual_seed(seed)
    model, inputs, params = FAMILIES[name][0](random.Random(f"{name}{seed}"))
    model = model.double()
    analysis = symalg.derive(symalg.trace(model, tuple(x.double() for x in inputs)))
    return analysis, params


def test_at_least_100_random_models():
    assert len(CASES) >= 100


@pytest.mark.parametrize("name, seed", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_structured_rank_equals_dense_baseline_and_generic_formula(name, seed):
    analysis, params = build(name, seed)
    structured = model_orbit_dimension(analysis, params)
    dense = model_orbit_dimension(analysis, params, method="dense")
    certified = model_orbit_dimension(analysis, params, ranks="qr")      # the QR certificate at every size
    assert structured.algebra_dim == dense.algebra_dim == sum(int(s.group.dim) for s in analysis.symmetries)
    assert structured.dimension == dense.dimension == certified.dimension
    if structured.expected is None:
        with pytest.raises(NotImplementedError, match="no closed form"):
            model_orbit_dimension_formula(analysis)
        return
    assert model_orbit_dimension_formula(analysis) == structured.expected
    if params is None:          # random parameters are generic
        assert structured.dimension == structured.expected and structured.strata == ()
    else:                       # a rank-deficient layer can only lower it, and then it is a stratum
        assert structured.dimension <= structured.expected
        assert bool(structured.strata) == (structured.dimension < structured.expected)
        assert sum(s.expected - s.measured for s in structured.strata) == structured.expected - structured.dimension


def test_random_models_exercise_every_structured_method_and_mostly_have_a_formula():
    methods, with_formula = Counter(), 0
    for name, seed in CASES:
        analysis, params = build(name, seed)
        result = model_orbit_dimension(analysis, params)
        methods.update(c.method for c in result.components)
        with_formula += result.expected is not None
    assert {"closed form", "chain", "joint"} <= set(methods)
    assert with_formula >= 0.8 * len(CASES)


# ---------------------------------------------------------------------------------------------
# closed forms, certificate, baseline
# ---------------------------------------------------------------------------------------------
def two_layer(n, h, m, act=nn.Identity, bias=True, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(n, h, bias=bias), act(), nn.Linear(h, m, bias=bias)).double()
    return model, symalg.derive(symalg.trace(model, (torch.randn(2, n, dtype=torch.float64),)))


@pytest.mark.parametrize("n, h, m, bias", [(3, 6, 2, True), (2, 7, 3, False), (6, 4, 5, False), (1, 9, 1, True)])
def test_gl_site_kernel_is_product_of_coranks_and_matches_the_chain_formula_of_the_symbolic_pipeline(n, h, m, bias):
    _, analysis = two_layer(n, h, m, bias=bias)
    result = model_orbit_dimension(analysis)
    # with biases GL(h) and the shear of 0.bias into 2.bias act as the affine group of the site: the bias no
    # longer constrains M (t = −M b), and the shear adds its h generators
    expected = h * h + bias * h - (h - min(h, n)) * (h - min(h, m))
    assert result.dimension == model_orbit_dimension_formula(analysis) == expected
    assert model_orbit_dimension(analysis, method="dense").dimension == expected
    spec = f"linear({n}, {h}, bias={bias}) -> identity -> linear({h}, {m}, bias={bias})"
    assert symalg.derive(spec).orbit_dimension() == expected


def test_deep_linear_formula_agrees_with_the_symbolic_chain_pipeline():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 5), nn.Linear(5, 6), nn.Linear(6, 4), nn.Linear(4, 3, bias=False),
                          nn.Linear(3, 5), nn.Linear(5, 2)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 2, dtype=torch.float64),)))
    spec = ("linear(2, 5) -> identity -> linear(5, 6) -> identity -> linear(6, 4) -> identity -> "
            "linear(4, 3, bias=False) -> identity -> linear(3, 5) -> identity -> linear(5, 2)")
    result = model_orbit_dimension(analysis)
    # the shears of sites 0 and 1 end at site 2's bias, which is no shear's (its reader has no bias): the frozen
    # source there is b₂ + W₂(b₁ + W₁ b₀), one column like b₂ but another vector, so the numeric rank is the joint
    # one; the generic chain formula still holds (tests/test_shears.py has a chain whose every bias is sheared)
    assert [c.method for c in result.components] == ["joint"]
    assert result.dimension == model_orbit_dimension_formula(analysis) == symalg.derive(spec).orbit_dimension() == 115
    assert model_orbit_dimension(analysis, method="dense").dimension == 115


def test_rank_decisions_follow_the_stated_threshold_and_report_their_gap():
    model, analysis = two_layer(5, 4, 3, bias=False)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["0.weight"] = torch.randn(4, 2, dtype=torch.float64) @ torch.randn(2, 5, dtype=torch.float64)
    result = model_orbit_dimension(analysis, params)
    (decision,) = [d for d in result.decisions if "out-regions" in d.what]
    values = torch.linalg.svdvals(params["0.weight"])
    assert decision.threshold == pytest.approx(values[0].item() * 5 * torch.finfo(torch.float64).eps)
    assert decision.rank == 2 and decision.kept == pytest.approx(values[1].item())
    assert decision.dropped == pytest.approx(values[2].item(), abs=1e-15)
    assert decision.gap == decision.kept / decision.dropped > 1e12 and decision.margin > 1
    assert result.gap == min(d.gap for d in result.decisions) and result.tightest.gap == result.gap
    assert "gap" in str(result) and "margin" in str(result)


def test_dense_rank_rule_is_that_of_torch_matrix_rank():
    _, analysis = two_layer(3, 5, 2)
    result = model_orbit_dimension(analysis, method="dense")
    (decision,) = result.decisions
    params = dict(analysis.model_graph.model.named_parameters())
    columns = []
    for symmetry in analysis.symmetries:   # GL(5) and the shear of 0.bias into 2.bias
        for M in symmetry.group.algebra_basis():
            tangent = symmetry.tangent(params, M)
            columns.append(torch.cat([tangent.get(k, torch.zeros_like(v)).detach().reshape(-1)
                                      for k, v in params.items()]))
    assert decision.shape == (3 * 5 + 5 + 5 * 2 + 2, 30)     # rows: the entries the actions move
    expected = 30 - (5 - 3) * (5 - 2)
    assert decision.rank == result.dimension == torch.linalg.matrix_rank(torch.stack(columns, 1)).item() == expected


def test_dense_baseline_refuses_beyond_its_memory_budget_while_the_structured_rank_answers():
    _, analysis = two_layer(128, 128, 128)
    with pytest.raises(MemoryError, match=r"needs \d.* GiB"):
        model_orbit_dimension(analysis, method="dense", max_bytes=2 ** 30)
    assert model_orbit_dimension(analysis).dimension == 128 ** 2 + 128


# ---------------------------------------------------------------------------------------------
# strata
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act", [nn.ReLU, lambda: nn.LeakyReLU(0.1)], ids=["relu", "leaky_relu"])
def test_a_cut_off_neuron_lowers_the_scaling_orbit_and_is_reported(act):
    model, analysis = two_layer(3, 5, 2, act=act)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["0.weight"][3], params["0.bias"][3] = 0, 0          # dead: no input reaches neuron 3
    dead = model_orbit_dimension(analysis, params)
    # its outgoing column still moves under the scaling (W₂ ↦ W₂ diag(d)⁻¹): no stratum yet
    assert dead.dimension == model_orbit_dimension(analysis, params, method="dense").dimension == 5
    assert dead.strata == ()
    params["2.weight"][:, 3] = 0                               # ... and nothing reads it
    cut = model_orbit_dimension(analysis, params)
    assert cut.dimension == model_orbit_dimension(analysis, params, method="dense").dimension == 4
    (stratum,) = cut.strata
    assert (stratum.expected, stratum.measured) == (5, 4)
    assert "PositiveScaling(5" in stratum.symmetries[0] and "zero: [3]" in stratum.reasons[0]


def test_rank_deficient_layers_lower_the_gl_orbit_and_name_the_weight():
    model, analysis = two_layer(4, 3, 2, bias=False)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    assert model_orbit_dimension(analysis, params).dimension == 9          # (3 − 3)(3 − 2) = 0
    params["0.weight"] = torch.randn(3, 2, dtype=torch.float64) @ torch.randn(2, 4, dtype=torch.float64)
    result = model_orbit_dimension(analysis, params)
    assert result.dimension == model_orbit_dimension(analysis, params, method="dense").dimension == 8
    (stratum,) = result.strata
    assert (stratum.expected, stratum.measured) == (9, 8)
    assert any("0.weight" in reason and "rank 2" in reason and "generically 3" in reason for reason in stratum.reasons)


def test_rank_deficient_middle_layer_of_a_deep_linear_chain():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(2, 5), nn.Linear(5, 6), nn.Linear(6, 4), nn.Linear(4, 2)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 2, dtype=torch.float64),)))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["1.weight"] = torch.randn(6, 1, dtype=torch.float64) @ torch.randn(1, 5, dtype=torch.float64)
    result = model_orbit_dimension(analysis, params)
    assert [c.method for c in result.components] == ["chain"]
    assert result.dimension == model_orbit_dimension(analysis, params, method="dense").dimension
    (stratum,) = result.strata
    assert stratum.measured == result.dimension < stratum.expected == model_orbit_dimension_formula(analysis)
    assert any(reason.startswith("1.weight") for reason in stratum.reasons)


# ---------------------------------------------------------------------------------------------
# couplings that need more than a closed form
# ---------------------------------------------------------------------------------------------
class SideReadout(nn.Module):
    """A linear chain whose first site is also read by a second output map: a chain with a middle sink."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3, self.l4 = nn.Linear(1, 4), nn.Linear(4, 4), nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        h1 = self.l1(x)
        return self.l3(self.l2(h1)) + self.l4(h1)


def test_chain_with_a_middle_sink_has_a_numeric_rank_but_no_closed_form():
    model = SideReadout().double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 1, dtype=torch.float64),)))
    result = model_orbit_dimension(analysis)
    assert [c.method for c in result.components] == ["chain"] and result.expected is None
    assert result.dimension == model_orbit_dimension(analysis, method="dense").dimension
    with pytest.raises(NotImplementedError, match="GL\\(4\\) on l1"):
        model_orbit_dimension_formula(analysis)


def test_a_map_reading_and_writing_one_site_is_solved_jointly():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.shared, self.out = nn.Linear(2, 4, bias=False), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.out(F.relu(self.shared(F.relu(self.shared(F.relu(self.inp(x)))))))

    model = Twice().double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 2, dtype=torch.float64),)))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["shared.weight"][0, 1:] = 0                 # sparsity pattern: δW_ij = (m_i − m_j) W_ij
    result = model_orbit_dimension(analysis, params)
    assert [c.method for c in result.components] == ["joint"]
    assert result.dimension == model_orbit_dimension(analysis, params, method="dense").dimension


def test_softmax_translation_coupled_with_a_linear_site():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 5), nn.Identity(), nn.Linear(5, 3)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(4, 2, dtype=torch.float64),)), loss="cross_entropy")
    result = model_orbit_dimension(analysis)
    assert {s.group.name for s in analysis.symmetries} == {"GL(5)", "Shears(5)", "Translations(6, along 1)"}
    assert result.dimension == model_orbit_dimension(analysis, method="dense").dimension == 27


def test_eval_mode_batch_norm_translations_move_the_running_mean():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 4 * 4, 2)).double()
    model(torch.randn(4, 2, 6, 6, dtype=torch.float64))
    model.eval()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(4, 2, 6, 6, dtype=torch.float64),)))
    assert any(s.acts_on_buffers for s in analysis.symmetries)
    result = model_orbit_dimension(analysis)
    # 3 translations (the conv bias with the running mean), 3 ReLU scalings, and 3 scalings of the conv's channels
    # that the eval norm gives back (running mean by d, gain by 1/d)
    assert result.dimension == model_orbit_dimension(analysis, method="dense").dimension == 9


class GainFreeStream(nn.Module):
    """A residual stream read only through LayerNorms without gain: O(d) fixing the all-ones vector. With
    ``readers="linear"`` the maps reading the norms are ``nn.Linear``, so their rows may also move along ``1ᵀ``
    (the norm's output sums to zero); ``"addmm"`` reads them by ``torch.addmm(b, x, Wᵀ)``, which keeps ``O(d)_1``
    alone."""

    def __init__(self, n, d, h, bias, readers="addmm"):
        super().__init__()
        self.embed, self.head = nn.Linear(n, d, bias=bias), nn.Linear(d, 2, bias=bias)
        self.ln1, self.ln2 = (nn.LayerNorm(d, elementwise_affine=False) for _ in range(2))
        self.up, self.down = nn.Linear(d, h), nn.Linear(h, d, bias=bias)
        self.readers = readers

    def read(self, layer, x):
        if self.readers == "linear":
            return layer(x)
        return torch.addmm(layer.bias, x, layer.weight.T) if layer.bias is not None else torch.mm(x, layer.weight.T)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.down(F.relu(self.read(self.up, self.ln1(x))))
        return self.read(self.head, self.ln2(x))


# (1, 9, 1): dim O(9)_1 = 28, f = 9 − rank[embed rows, up columns, down rows, head columns | 1] = 9 − 6 = 3,
# kernel so(3): 28 − 3 + 1 (the ReLU scaling) = 26
def centring(n, h, bias):
    """The stream's writers ``embed`` (``n`` columns) and ``down`` (``h``) move along ``1``, their biases too: every
    reader of the stream is a LayerNorm (LayerNorm centring, ``Translations(·, along 1)``)."""
    return n + h + (2 if bias else 0)


ORTHOGONAL_STREAMS = [(3, 6, 4, True, 14), (1, 9, 1, False, 26), (2, 9, 2, False, 30), (8, 5, 3, True, 9)]


@pytest.mark.parametrize("n, d, h, bias, expected", [case for case in ORTHOGONAL_STREAMS if case[3]])
def test_orthogonal_group_fixing_ones_has_a_closed_form(n, d, h, bias, expected):
    """``O(d)_1`` alone (the norms read by ``torch.addmm``, which gets no row shift): the closed form. The bias-free
    streams are in the next test: a bias-free ``torch.mm`` reader of a norm blocks the site, and ``nn.Linear``
    readers bring their row shifts."""
    torch.manual_seed(n + d)
    model = GainFreeStream(n, d, h, bias).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(4, n, dtype=torch.float64),)))
    assert f"O({d})_1" in {s.group.name for s in analysis.symmetries}
    result = model_orbit_dimension(analysis)
    assert {c.method for c in result.components} == {"closed form"}
    assert result.dimension == model_orbit_dimension(analysis, method="dense").dimension
    assert result.dimension == model_orbit_dimension_formula(analysis) == result.expected == \
        expected + centring(n, h, bias)


@pytest.mark.parametrize("n, d, h, bias, expected", ORTHOGONAL_STREAMS)
def test_linear_readers_of_a_gain_free_norm_add_their_row_shifts_to_the_orbit(n, d, h, bias, expected):
    """``nn.Linear`` readers of the two norms: each may add ``c 1ᵀ`` to its weight (``h`` and 2 directions), which no
    other symmetry's tangent reaches (``W Aᵀ = c1ᵀ`` with ``A`` antisymmetric, ``A1 = 0`` forces ``c = 0``; a ReLU
    scaling moves rows along themselves), so the orbit grows by ``h + 2``; no closed form covers the two together,
    and the structured rank equals the dense one."""
    torch.manual_seed(n + d)
    model = GainFreeStream(n, d, h, bias, readers="linear").double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(4, n, dtype=torch.float64),)))
    assert {"up.columns", "head.columns"} <= {s.site for s in analysis.symmetries if s.group.kind == "T"}
    result = model_orbit_dimension(analysis)
    assert result.dimension == model_orbit_dimension(analysis, method="dense").dimension == \
        expected + h + 2 + centring(n, h, bias)


def test_a_group_kind_it_does_not_know_falls_back_to_a_dense_rank_over_its_component():
    @dataclasses.dataclass(frozen=True)
    class Renamed(GeneralLinear):
        """GL acting the same way, but not a type the structured code knows."""

    _, analysis = two_layer(2, 4, 3, bias=False)
    (symmetry,) = analysis.symmetries
    unknown = dataclasses.replace(analysis, symmetries=(dataclasses.replace(symmetry, group=Renamed(4)),))
    result = model_orbit_dimension(unknown)
    assert [c.method for c in result.components] == ["dense fallback"]
    assert "not handled structurally" in result.components[0].detail and result.notes
    assert result.dimension == model_orbit_dimension(analysis).dimension == 16 - (4 - 2) * (4 - 3)


# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------
def test_params_default_to_the_model_and_bad_arguments_are_named():
    model, analysis = two_layer(3, 4, 2)
    params = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    assert model_orbit_dimension(analysis).dimension == 18     # GL(4) and its shear: 16 + 4 − (4 − 3)(4 − 2)
    assert model_orbit_dimension(analysis, params).dimension == 4   # at θ = 0 the shear still moves 0.bias
    with pytest.raises(KeyError, match="no tensor '2.weight'"):
        model_orbit_dimension(analysis, {"0.weight": params["0.weight"], "0.bias": params["0.bias"]})
    with pytest.raises(ValueError, match=r"params\['0.bias'\] has shape \(3,\), expected \(4,\)"):
        model_orbit_dimension(analysis, {**params, "0.bias": torch.zeros(3)})
    with pytest.raises(ValueError, match="method must be"):
        model_orbit_dimension(analysis, method="svd")
    with pytest.raises(TypeError, match="analysis must be the result of symalg.derive"):
        model_orbit_dimension(model)
    # one Analysis for both front ends: a spec at concrete widths runs on its generated module's parameters ...
    spec = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)")
    assert model_orbit_dimension(spec).dimension == 18 == model_orbit_dimension_formula(spec)
    # ... but symbolic widths have no module: refused, naming them and the way out
    for function in (model_orbit_dimension, model_orbit_dimension_formula):
        with pytest.raises(symalg.SpecError,
                           match=r"analysis has symbolic widths \(h, m, n\).*orbit_dimension\(params\)"):
            function(symalg.derive("linear(n, h) -> identity -> linear(h, m)"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_parameters_are_refused_naming_the_parameter(bad):
    model, analysis = two_layer(3, 4, 2)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["2.weight"][0, 1] = bad
    for method in ("structured", "dense"):
        with pytest.raises(symalg.SpecError, match=r"model_orbit_dimension: parameter '2.weight' has non-finite"):
            model_orbit_dimension(analysis, params, method=method)


@pytest.mark.slow
def test_two_layer_width_2048_structured_rank_while_dense_would_need_terabytes():
    _, analysis = two_layer(2048, 2048, 2048)
    result = model_orbit_dimension(analysis)
    # GL(2048) and the shear of 0.bias into 2.bias act as the affine group of the site: 2048² + 2048
    assert result.dimension == result.expected == 2048 ** 2 + 2048 and result.margin > 10
    with pytest.raises(MemoryError, match="TiB|GiB"):
        model_orbit_dimension(analysis, method="dense")


# ---------------------------------------------------------------------------------------------
# the QR certificate: a full rank without an SVD, the same decisions as the SVD
# ---------------------------------------------------------------------------------------------
def spectrum_matrix(m, n, values, seed=0):
    """``U diag(values) Vᵀ`` (``m × n``) with random orthonormal ``U``, ``V``: singular values known exactly."""
    g = torch.Generator().manual_seed(seed)
    k = len(values)
    U = torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64)).Q
    return U @ torch.diag(torch.as_tensor(values, dtype=torch.float64)) @ V.T


def assert_sound(decision, exact):
    """A ``"qr"`` decision's bounds hold against the SVD's ``exact`` decision of the same matrix."""
    assert decision.rank == exact.rank and decision.shape == exact.shape
    if decision.certificate == "qr":
        assert decision.dropped is None and decision.kept <= exact.kept * (1 + 1e-9)
        assert decision.threshold >= exact.threshold * (1 - 1e-9) and decision.margin <= exact.margin * (1 + 1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", [(300, 300), (301, 300), (900, 300), (300, 700)])
def test_qr_certifies_full_ranks_of_random_matrices_without_an_svd(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    A = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    decision, exact = certified_rank(A, "A"), certified_rank(A, "A", ranks="svd")
    assert decision.certificate == "qr" and exact.certificate == "svd" and decision.rank == min(shape)
    assert_sound(decision, exact)
    assert decision.margin > (1e3 if dtype == torch.float64 else 1) and "qr certificate" in str(decision)
    small = certified_rank(A[:QR_FROM - 1, :QR_FROM - 1])     # below QR_FROM "auto" takes the singular values
    assert small.certificate == "svd" and certified_rank(A[:50, :50], ranks="qr").certificate == "qr"


@pytest.mark.parametrize("rank", [0, 1, 150, 299])
def test_deficient_ranks_known_in_closed_form_fall_back_to_the_singular_values(rank):
    g = torch.Generator().manual_seed(rank)
    A = torch.randn(400, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, 300, generator=g,
                                                                               dtype=torch.float64)
    for ranks in RANK_METHODS:
        decision = certified_rank(A, "A", ranks=ranks)
        assert decision.rank == rank and decision.certificate == "svd"
        if rank:
            assert decision.gap > 1e8


def test_a_zero_row_lowers_the_rank_by_one():
    A = torch.randn(300, 301, dtype=torch.float64)
    A[17] = 0
    assert certified_rank(A).rank == 299 and certified_rank(A).certificate == "svd"


@pytest.mark.parametrize("factor", [1e6, 1e3, 30.0, 3.0, 0.1, 1e-3])
def test_near_degenerate_spectra_get_the_svd_decision(factor):
    # singular values in [0.5, 1] and one = factor × the rule's threshold σ_max · m · eps; the certificate answers
    # only where its bounds separate (large factors), the singular values of R otherwise: always the SVD's decision
    m, n = 320, 300
    threshold = m * torch.finfo(torch.float64).eps
    values = torch.cat([torch.linspace(1, 0.5, n - 1, dtype=torch.float64),
                        torch.tensor([factor * threshold], dtype=torch.float64)])
    A = spectrum_matrix(m, n, values, seed=int(factor * 7) % 97)
    decision, exact = certified_rank(A, "A"), certified_rank(A, "A", ranks="svd")
    assert_sound(decision, exact)
    assert decision.rank == (n if factor > 1 else n - 1)
    assert (decision.certificate == "qr") == (factor >= 1e3)


def test_a_singular_matrix_with_a_harmless_diagonal_is_not_certified_full():
    # Q T, T unit upper triangular with -1 above the diagonal: σ_min ≈ 2^(2-n) although R's diagonal is all ±1
    n = 300
    T = torch.eye(n, dtype=torch.float64) - torch.ones(n, n, dtype=torch.float64).triu(1)
    Q = torch.linalg.qr(torch.randn(n + 5, n, dtype=torch.float64)).Q
    R = torch.linalg.qr(Q @ T, mode="r").R
    assert R.diagonal().abs().min() > 0.99
    decision = certified_rank(Q @ T, "Q T")
    assert decision.certificate == "svd" and decision.rank == n - 1 == certified_rank(Q @ T, ranks="svd").rank


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_gl_site_is_certified_by_qr_and_agrees_with_the_svd(dtype):
    # ranks="qr" takes the certificate at every size ("auto" only from QR_FROM = 256 on: the matrix tests above)
    h = 40
    model, analysis = two_layer(h, h, h, bias=False)   # GL(h) alone (with biases, also the shear of 0.bias)
    auto, svd = (model_orbit_dimension(analysis, dtype=dtype, ranks=r) for r in ("qr", "svd"))
    assert auto.dimension == svd.dimension == auto.expected == h ** 2
    (decision,) = auto.decisions
    assert decision.certificate == "qr" and "out-regions" in decision.what and decision.shape == (h, h)
    assert_sound(decision, svd.decisions[0])
    assert auto.margin > (1e6 if dtype == torch.float64 else 1)
    # a stratum: neuron 4 cut off (its row of W₁, its column of W₂): (h − (h − 1))(h − (h − 1)) = 1
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    params["0.weight"][4], params["2.weight"][:, 4] = 0, 0
    cut = model_orbit_dimension(analysis, params, ranks="qr")
    assert cut.dimension == model_orbit_dimension(analysis, params, ranks="svd").dimension == h ** 2 - 1
    assert [d.rank for d in cut.decisions] == [h - 1, h - 1] and {d.certificate for d in cut.decisions} == {"svd"}
    assert len(cut.strata) == 1


def test_a_rank_below_full_in_float32_is_decided_again_in_float64():
    # W₁, W₂ full rank with condition number 1e6: float32's threshold h · eps · σ_max ≈ 5e-6 σ_max hides the smallest
    # singular values, so float32 alone finds a stratum that is not there (at width 4096 a random weight suffices)
    h = 64
    model, analysis = two_layer(h, h, h, bias=False)
    values = torch.logspace(0, -6, h, dtype=torch.float64)
    params = {"0.weight": spectrum_matrix(h, h, values, seed=1), "2.weight": spectrum_matrix(h, h, values, seed=2)}
    low = model_orbit_dimension(analysis, {k: v.float() for k, v in params.items()}, dtype=torch.float32)
    assert low.dimension == low.expected == h ** 2 and not low.strata
    assert low == model_orbit_dimension(analysis, params).dimension
    assert any("decided again in float64" in note for note in low.notes)
    # a true stratum stays one (a cut-off neuron), and a full rank in float32 is not recomputed
    params["0.weight"][4], params["2.weight"][:, 4] = 0, 0
    cut = model_orbit_dimension(analysis, {k: v.float() for k, v in params.items()}, dtype=torch.float32)
    assert cut.dimension == h ** 2 - 1 and len(cut.strata) == 1
    random = model_orbit_dimension(analysis, dtype=torch.float32)
    assert random.dimension == h ** 2 and not random.notes


def test_bad_rank_method_is_named():
    _, analysis = two_layer(2, 3, 2)
    with pytest.raises(ValueError, match=r"ranks must be one of \('auto', 'qr', 'svd'\), got 'lu'"):
        model_orbit_dimension(analysis, ranks="lu")


def test_translation_directions_holding_an_identity_are_full_rank_without_a_factorisation():
    """A shear of ``0.bias`` (``e_i`` there, ``−W₂ e_i`` on ``2.bias``): restricted to regions that include the bias
    its directions contain the identity, so their rank is ``h`` at any parameters (certificate ``"identity"``);
    the structured result still equals the dense rank, at a generic point and with ``W₂`` zero."""
    model, analysis = two_layer(6, 5, 2)   # GL(5) forced to 0 by [W₁ b₁] of rank 5; the shear alone remains
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    for W2 in (params["2.weight"], torch.zeros_like(params["2.weight"])):
        params["2.weight"] = W2
        result = model_orbit_dimension(analysis, params)
        assert any(d.certificate == "identity" and d.rank == 5 for d in result.decisions)
        assert result.dimension == model_orbit_dimension(analysis, params, method="dense").dimension == 25 + 5
