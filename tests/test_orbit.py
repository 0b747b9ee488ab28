"""Orbit dimension: the generic formula in the widths against the numeric rank of ``M ↦ M·θ``.

The symbolic formula is derived once per architecture family and substituted at many width
combinations; the numeric rank needs a concrete analysis, so each combination is one ``subs``.
"""
from __future__ import annotations

import functools
import itertools
import random

import pytest
import sympy as sp
import torch

import symalg
import symalg.numeric.sampling
from symalg.numeric.orbit_rank import action_matrix, model_orbit_dimension_formula

MIN_COMBINATIONS = 50

# name -> (spec, hidden width names)
FAMILIES = {
    "linear2_bias": ("linear(n, h) -> identity -> linear(h, m)", ["h"]),
    "linear2_no_bias": ("linear(n, h, bias=False) -> identity -> linear(h, m, bias=False)", ["h"]),
    "linear2_bias_in_only": ("linear(n, h) -> identity -> linear(h, m, bias=False)", ["h"]),
    "linear2_bias_out_only": ("linear(n, h, bias=False) -> identity -> linear(h, m)", ["h"]),
    "linear3_bias": ("linear(n, h1) -> identity -> linear(h1, h2) -> identity -> linear(h2, m)", ["h1", "h2"]),
    "linear4_bias": ("linear(n, h1) -> identity -> linear(h1, h2) -> identity -> linear(h2, h3) -> identity "
                     "-> linear(h3, m)", ["h1", "h2", "h3"]),
    "linear3_no_bias": ("linear(n, h1, bias=False) -> identity -> linear(h1, h2, bias=False) -> identity "
                        "-> linear(h2, m, bias=False)", ["h1", "h2"]),
    "relu": ("linear(n, h) -> relu -> linear(h, m)", ["h"]),
    "relu_no_bias": ("linear(n, h, bias=False) -> relu -> linear(h, m, bias=False)", ["h"]),
    "relu_pow_relu": ("linear(n, h1) -> relu_pow -> linear(h1, h2) -> relu -> linear(h2, m)", ["h1", "h2"]),
    "linear_relu_linear": ("linear(n, h1) -> identity -> linear(h1, h2) -> relu -> linear(h2, h3) -> identity "
                           "-> linear(h3, m)", ["h1", "h2", "h3"]),
    "tanh": ("linear(n, h) -> tanh -> linear(h, m)", ["h"]),
    "sigmoid": ("linear(n, h) -> sigmoid -> linear(h, m)", ["h"]),
    "gelu": ("linear(n, h1) -> gelu -> linear(h1, h2) -> gelu -> linear(h2, m)", ["h1", "h2"]),
    "radial": ("linear(n, h) -> radial -> linear(h, m)", ["h"]),
    "radial_no_bias": ("linear(n, h, bias=False) -> radial -> linear(h, m, bias=False)", ["h"]),
    "radial_relu_radial": ("linear(n, h1) -> radial -> linear(h1, h2) -> relu -> linear(h2, h3, bias=False) -> radial "
                           "-> linear(h3, m)", ["h1", "h2", "h3"]),
}


@functools.lru_cache(maxsize=None)
def family(name: str):
    """The symbolic analysis and its orbit-dimension formula, derived once."""
    spec, _ = FAMILIES[name]
    analysis = symalg.derive(spec)
    return analysis, analysis.orbit_dimension()


def width_combinations(name: str) -> list[dict]:
    """At least 50 deterministic width combinations, with hidden layers both narrower and (much)
    wider than input + output."""
    analysis, _ = family(name)
    names = sorted(s.name for s in analysis.architecture.widths)
    hidden = FAMILIES[name][1]
    rng = random.Random(name)
    combos = []
    # hidden widths larger than input + output width, e.g. n = 2, h = 9, m = 3
    for n, m in [(2, 3), (1, 1), (1, 2), (3, 1), (2, 2)]:
        for extra in (1, 3):
            combos.append({w: (n if w == "n" else m if w == "m" else n + m + extra + i) for i, w in
                           enumerate(w for w in names)})
    combos.append({w: (2 if w == "n" else 3 if w == "m" else 9) for w in names})
    # all-small grid corners and random draws
    for values in itertools.product((1, 2), repeat=len(names)):
        combos.append(dict(zip(names, values)))
    unique = []
    for combo in combos:
        if combo not in unique:
            unique.append(combo)
    while len(unique) < MIN_COMBINATIONS + 10:
        combo = {w: rng.randint(1, 9 if w in hidden else 5) for w in names}
        if combo not in unique:
            unique.append(combo)
    return unique


def numeric_rank(name: str, widths: dict, seed: int) -> int:
    analysis, _ = family(name)
    concrete = analysis.subs(widths)
    params = symalg.numeric.sampling.random_params(concrete.architecture, torch.Generator().manual_seed(seed))
    return concrete.orbit_dimension(params)


def _dense_rank(analysis, params) -> int:
    """The rank of the whole ``dim g × P`` matrix of ``M ↦ M·θ``: the baseline the structured rank must match."""
    return int(torch.linalg.matrix_rank(action_matrix(analysis, params)))


def formula_at(formula: sp.Expr, widths: dict) -> int:
    value = formula.subs({s: widths[s.name] for s in formula.free_symbols})
    assert value.is_Integer, f"formula {formula} at {widths} is {value}"
    return int(value)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_formula_equals_numeric_rank(name):
    _, formula = family(name)
    combos = width_combinations(name)
    assert len(combos) >= MIN_COMBINATIONS
    hidden = FAMILIES[name][1]
    assert any(all(c[h] > c["n"] + c["m"] for h in hidden) for c in combos)
    mismatches = []
    for seed, widths in enumerate(combos):
        expected, actual = formula_at(formula, widths), numeric_rank(name, widths, seed)
        if expected != actual:
            mismatches.append((widths, expected, actual))
    assert not mismatches, f"{name}: formula {formula} vs numeric rank (widths, formula, rank): {mismatches}"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_formula_agrees_with_the_structured_and_dense_ranks_on_both_routes(name):
    """The differential check at random widths: the closed form in the widths, the structured generic value
    (:func:`model_orbit_dimension_formula`), the certified structured rank and the dense ``dim g × P`` rank at
    random θ, for the spec and for the same module traced; all one number."""
    analysis, formula = family(name)
    rng = random.Random(f"differential {name}")
    closed = 0
    for seed in range(4):
        widths = {s.name: rng.randint(1, 9 if s.name in FAMILIES[name][1] else 5)
                  for s in sorted(analysis.widths, key=lambda s: s.name)}
        concrete = analysis.subs(widths)
        module = symalg.to_module(concrete.architecture, generator=torch.Generator().manual_seed(seed))
        params = dict(module.named_parameters())
        traced = symalg.derive(symalg.trace(module, (torch.randn(6, widths["n"], dtype=torch.float64),)))
        structured, traced_rank = concrete.orbit_dimension(params), traced.orbit_dimension(params)
        values = [formula_at(formula, widths), structured.dimension, structured.expected, _dense_rank(concrete, params),
                  traced_rank.dimension, _dense_rank(traced, params)]
        try:   # the structured formula: every site peeled or in closed form (not a stratum of coupled shears)
            values += [int(model_orbit_dimension_formula(concrete)), int(traced.orbit_dimension())]
            closed += 1
        except NotImplementedError as error:
            assert name == "linear_relu_linear" and "Shears" in str(error), error
        assert len(set(values)) == 1, (widths, values)
        assert not structured.strata and structured.margin > 1
    assert closed >= 2


def test_wide_hidden_layer_example():
    """n = 2, h = 9, m = 3: GL(9) acting on 9×2 + 9 + 3×9 parameters."""
    widths = {"n": 2, "h": 9, "m": 3}
    # with biases, GL(9) and the shear of the first bias into the second: 81 + 9 − (9 − 2)(9 − 3)
    assert formula_at(family("linear2_bias")[1], widths) == numeric_rank("linear2_bias", widths, 0) == 81 + 9 - 7 * 6
    assert formula_at(family("linear2_no_bias")[1], widths) == numeric_rank("linear2_no_bias", widths, 0) == 81 - 7 * 6
    assert formula_at(family("relu")[1], widths) == numeric_rank("relu", widths, 0) == 9
    assert formula_at(family("radial")[1], widths) == numeric_rank("radial", widths, 0) == 36 - 3  # so(9) minus so(3)


@pytest.mark.parametrize("name, value", [("tanh", 0), ("sigmoid", 0), ("gelu", 0)])
def test_families_without_continuous_symmetry_have_orbit_dimension_zero(name, value):
    assert family(name)[1] == value


def test_two_layer_linear_without_biases_closed_form():
    formula = family("linear2_no_bias")[1]
    n, h, m = sorted(formula.free_symbols, key=lambda s: "nhm".index(s.name))
    for a, b, c in itertools.product(range(1, 11), repeat=3):
        expected = b * b - (b - min(b, a)) * (b - min(b, c))
        assert int(formula.subs({n: a, h: b, m: c})) == expected, (a, b, c)


def test_two_layer_linear_with_biases_closed_form():
    """With both biases, ``GL(h)`` and the shear of the first bias into the second act as the affine group of the
    site: the bias no longer constrains ``M`` (``t = −M b``) and the shear adds ``h`` generators:
    ``h² + h − (h − min(h, n))(h − min(h, m))``."""
    formula = family("linear2_bias")[1]
    symbols = {s.name: s for s in formula.free_symbols}
    for a, b, c in itertools.product(range(1, 9), repeat=3):
        expected = b * b + b - (b - min(b, a)) * (b - min(b, c))
        assert int(formula.subs({symbols["n"]: a, symbols["h"]: b, symbols["m"]: c})) == expected, (a, b, c)


@pytest.mark.parametrize("op", ["relu", "leaky_relu", "relu_pow"])
@pytest.mark.parametrize("depth", [2, 3, 4, 5])
@pytest.mark.parametrize("bias", [True, False])
def test_relu_mlp_orbit_dimension_is_sum_of_hidden_widths(op, depth, bias):
    b = "" if bias else ", bias=False"
    widths = ["n"] + [f"h{i}" for i in range(1, depth)] + ["m"]
    layers = []
    for i in range(depth):
        layers.append(f"linear({widths[i]}, {widths[i + 1]}{b})")
        if i < depth - 1:
            layers.append(op)
    analysis = symalg.derive(" -> ".join(layers))
    hidden = sp.Add(*[sp.Symbol(w, integer=True, positive=True) for w in widths[1:-1]])
    assert sp.simplify(analysis.orbit_dimension() - hidden) == 0


@pytest.mark.parametrize("spec, sites", [
    ("linear(n, h1) -> radial -> linear(h1, h2) -> identity -> linear(h2, m)", ["0", "2"]),
    ("linear(n, h1) -> identity -> linear(h1, h2) -> radial -> linear(h2, m)", ["0", "2"]),
    ("linear(n, h1) -> relu -> linear(h1, h2) -> radial -> linear(h2, h3) -> identity -> linear(h3, m)", ["2", "4"]),
])
def test_adjacent_radial_and_linear_sites_have_no_closed_form(spec, sites):
    analysis = symalg.derive(spec)
    with pytest.raises(NotImplementedError) as error:
        analysis.orbit_dimension()
    message = str(error.value)
    assert all(f"'{s}'" in message for s in sites)
    assert "orbit_dimension(params)" in message
    # the numeric rank still works at concrete widths
    concrete = analysis.subs({s.name: 3 for s in analysis.architecture.widths})
    params = symalg.numeric.sampling.random_params(concrete.architecture, torch.Generator().manual_seed(0))
    rank = concrete.orbit_dimension(params)
    assert 0 < rank.dimension <= sum(int(s.group.dim) for s in concrete.continuous) == rank.algebra_dim
    assert rank == rank.expected == concrete.orbit_dimension()   # concrete widths: the structured generic value
    assert rank == _dense_rank(concrete, params)


def test_radial_separated_by_rigid_site_has_closed_form():
    analysis = symalg.derive("linear(n, h1) -> radial -> linear(h1, h2) -> tanh -> linear(h2, h3) -> radial "
                             "-> linear(h3, m)")
    formula = analysis.orbit_dimension()
    for seed, widths in enumerate([{"n": 2, "h1": 6, "h2": 1, "h3": 7, "m": 1},
                                   {"n": 3, "h1": 4, "h2": 2, "h3": 3, "m": 2},
                                   {"n": 1, "h1": 9, "h2": 2, "h3": 8, "m": 2}]):
        concrete = analysis.subs(widths)
        params = symalg.numeric.sampling.random_params(concrete.architecture, torch.Generator().manual_seed(seed))
        assert formula_at(formula, widths) == concrete.orbit_dimension(params)


def test_numeric_rank_drops_at_non_generic_parameters():
    """The formula is the generic value; at special θ (here two equal columns of ``W_in``, so it loses rank) the
    stabiliser grows and the orbit is smaller. (``b_in`` equal to a column of ``W_in`` is no special point any more:
    the shear frees the bias.)"""
    concrete = family("linear2_bias")[0].subs({"n": 2, "h": 4, "m": 3})
    params = symalg.numeric.sampling.random_params(concrete.architecture, torch.Generator().manual_seed(0))
    generic = concrete.orbit_dimension(params)
    assert generic == formula_at(family("linear2_bias")[1], {"n": 2, "h": 4, "m": 3})
    degenerate = {k: v.clone() for k, v in params.items()}
    degenerate["0.bias"] = degenerate["0.weight"][:, 0].clone()
    assert concrete.orbit_dimension(degenerate) == generic.dimension
    degenerate["0.weight"][:, 1] = degenerate["0.weight"][:, 0]
    lower = concrete.orbit_dimension(degenerate)
    assert lower == generic.dimension - 1 and lower.expected == generic.dimension
    assert len(lower.strata) == 1 and "rank 1" in " ".join(lower.strata[0].reasons)
    zero = {k: torch.zeros_like(v) for k, v in params.items()}
    assert concrete.orbit_dimension(zero) == 4    # the shear still moves b_in by t (and b_out by −W_out t = 0)


def test_numeric_rank_reads_widths_from_params():
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    wrong = symalg.numeric.sampling.random_params(symalg.parse("linear(3, 5) -> relu -> linear(5, 2)"))
    with pytest.raises(symalg.SpecError):
        analysis.orbit_dimension(wrong)


# -- functionally independent conserved quantities: formula against the rank on symmetric generators -----
INDEPENDENT_FAMILIES = ["linear2_bias", "linear2_no_bias", "linear2_bias_in_only", "relu", "relu_pow_relu",
                        "linear_relu_linear", "radial_relu_radial", "tanh"]


@pytest.mark.parametrize("name", INDEPENDENT_FAMILIES)
def test_independent_conserved_formula_equals_numeric_rank(name):
    analysis, _ = family(name)
    formula = analysis.independent_conserved()
    mismatches = []
    for seed, widths in enumerate(width_combinations(name)):
        concrete = analysis.subs(widths)
        params = symalg.numeric.sampling.random_params(concrete.architecture, torch.Generator().manual_seed(seed))
        expected, actual = formula_at(formula, widths), concrete.independent_conserved(params)
        if expected != actual:
            mismatches.append((widths, expected, actual))
    assert not mismatches, f"{name}: formula {formula} vs rank (widths, formula, rank): {mismatches}"


def test_independent_conserved_has_no_closed_form_for_adjacent_linear_sites():
    analysis, _ = family("linear3_bias")
    with pytest.raises(NotImplementedError, match="adjacent GL sites at '0'"):
        analysis.independent_conserved()
    concrete = analysis.subs({"n": 2, "h1": 3, "h2": 3, "m": 2})
    params = symalg.numeric.sampling.random_params(concrete.architecture, torch.Generator().manual_seed(0))
    symmetric = sum(int(s.group.n_symmetric) for s in concrete.symmetries)   # one Q_M per symmetric generator
    count = concrete.independent_conserved(params)
    assert count == int(torch.linalg.matrix_rank(action_matrix(concrete, params, symmetric=True)))
    assert 0 < count <= symmetric == 12


def test_independent_conserved_of_a_traced_model_is_a_numeric_rank_only():
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    traced = symalg.derive(symalg.trace(module, (torch.randn(5, 3, dtype=torch.float64),)))
    with pytest.raises(NotImplementedError, match="need a spec chain.*independent_conserved\\(params\\)"):
        traced.independent_conserved()
    params = dict(module.named_parameters())
    spec = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    assert traced.independent_conserved(params) == spec.independent_conserved(params) == formula_at(
        spec.independent_conserved(), {"n": 3, "h": 4, "m": 2}) == 4


@pytest.mark.parametrize("spec, formula", [
    ("linear(3, 4) -> relu -> linear(4, 2)", 4 + 5),
    ("linear(3, 5) -> relu -> linear(5, 4) -> sigmoid -> linear(4, 3)", 5 + 5),
    ("linear(3, 4) -> tanh -> linear(4, 2, bias=False)", 4),
    ("linear(3, 2)", 4),
])
def test_cross_entropy_adds_the_logit_translation_to_the_orbit_as_the_traced_pipeline_counts_it(spec, formula):
    analysis = symalg.derive(spec, loss="cross_entropy")
    assert analysis.orbit_dimension() == formula
    module = symalg.to_module(analysis.architecture, generator=torch.Generator().manual_seed(0))
    params = dict(module.named_parameters())
    assert analysis.orbit_dimension(params) == formula
    traced = symalg.derive(symalg.trace(module, (torch.randn(5, 3, dtype=torch.float64),)), loss="cross_entropy")
    assert traced.orbit_dimension() == formula and traced.orbit_dimension(params) == formula
    assert _dense_rank(analysis, params) == formula


def test_logit_translation_next_to_a_linear_site_has_no_formula_in_the_widths():
    symbolic = symalg.derive("linear(n, h) -> identity -> linear(h, m)", loss="cross_entropy")
    with pytest.raises(NotImplementedError, match="logit translation next to the GL\\(h\\) site '0'"):
        symbolic.orbit_dimension()
    # −W₂M = 1vᵀ has solutions when M also fixes W₁, b₁: no closed form in the widths; at concrete widths the
    # structured generic value, the numeric rank and the traced route agree
    analysis = symbolic.subs({"n": 3, "h": 4, "m": 2})
    module = symalg.to_module(analysis.architecture, generator=torch.Generator().manual_seed(0))
    params = dict(module.named_parameters())
    traced = symalg.derive(symalg.trace(module, (torch.randn(5, 3, dtype=torch.float64),)), loss="cross_entropy")
    rank = analysis.orbit_dimension(params)
    # GL(4), the shear of 0.bias into 2.bias (4) and T(5) all move 2.bias: coupled, with no structured closed form
    # even at concrete widths; the numeric ranks agree (a 3-dimensional stabiliser)
    for route in (analysis, traced):
        with pytest.raises(NotImplementedError, match="no closed form for the coupled sites"):
            route.orbit_dimension()
    assert rank.expected is None
    assert rank == traced.orbit_dimension(params).dimension == _dense_rank(analysis, params) == 16 + 4 + 5 - 3
