"""The symbolic derivation: groups per site, actions, generators, conserved quantities, API names."""
import dataclasses

import pytest
import sympy as sp
import torch

import symalg
import symalg.numeric.sampling
from symalg.catalogue.groups import (GeneralLinear, Orthogonal, Permutations, PositiveScaling, Shears, SignFlips,
                                     Translations)
from symalg.symbolic.checks import symbolic_checks

n, h, m = sp.symbols("n h m", integer=True, positive=True)


def _groups(spec):
    return [(s.site, type(s.group)) for s in symalg.derive(spec).symmetries]


@pytest.mark.parametrize("activation, expected", [
    ("identity", [GeneralLinear, Shears]),   # and the first bias moved into the second (test_shears.py)
    ("relu", [PositiveScaling, Permutations]),
    ("leaky_relu(slope=0.2)", [PositiveScaling, Permutations]),
    ("relu_pow(alpha=3)", [PositiveScaling, Permutations]),
    ("tanh", [SignFlips, Permutations]),
    ("sigmoid", [SignFlips, Permutations]),
    ("gelu", [Permutations]),
    ("silu", [Permutations]),
    ("softplus", [Permutations]),
    ("radial", [Orthogonal]),
])
def test_each_activation_gets_its_declared_groups(activation, expected):
    groups = _groups(f"linear(n, h) -> {activation} -> linear(h, m)")
    assert [g for _, g in groups] == expected
    assert {site for site, _ in groups} == {"0"}  # the site is named by the linear layer that produces it


def test_group_dimensions_are_formulas_in_the_width():
    dims = {type(s.group): s.group.dim for s in symalg.derive("linear(n, h) -> identity -> linear(h, m)").symmetries}
    assert dims[GeneralLinear] == h ** 2
    radial = symalg.derive("linear(n, h) -> radial -> linear(h, m)").symmetries[0].group
    assert radial.dim == h * (h - 1) / 2 and radial.is_continuous
    relu = symalg.derive("linear(n, h) -> relu -> linear(h, m)").symmetries
    assert relu[0].group.dim == h and relu[0].group.is_continuous
    assert relu[1].group.dim == 0 and not relu[1].group.is_continuous


def test_every_hidden_layer_of_a_deep_network_is_a_site():
    analysis = symalg.derive("linear(4, 5) -> relu -> linear(5, 6) -> tanh -> linear(6, 3) -> identity -> linear(3, 2)")
    assert [c.name for c in analysis.sites.classes] == ["0", "2", "4"]
    # each site sits between the layer producing it and the one reading it
    assert [tuple(dict.fromkeys(b.node for b in c.bindings)) for c in analysis.sites.classes] == \
        [("0", "2"), ("2", "4"), ("4", "6")]
    assert [s.label for s in analysis.continuous] == ["PositiveScaling(5, alpha=1) on 0", "GL(3) on 4",
                                                      "Shears(3) on 4"]


def test_action_on_every_parameter_including_biases(generator):
    analysis = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)")
    symmetry, _ = analysis.symmetries    # GL(4), and the shear of 0.bias into 2.bias
    assert symmetry.tensors == ("0.weight", "0.bias", "2.weight")
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    W1, b1, W2, b2 = (params[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias"))
    g = torch.randn(4, 4, generator=generator, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
    moved = symmetry.apply(params, g)
    torch.testing.assert_close(moved["0.weight"], g @ W1)
    torch.testing.assert_close(moved["0.bias"], g @ b1)
    torch.testing.assert_close(moved["2.weight"], W2 @ torch.linalg.inv(g))
    assert moved["2.bias"] is b2
    M = torch.randn(4, 4, generator=generator, dtype=torch.float64)
    tangent = symmetry.tangent(params, M)
    assert set(tangent) == {"0.weight", "0.bias", "2.weight"}
    torch.testing.assert_close(tangent["0.weight"], M @ W1)
    torch.testing.assert_close(tangent["0.bias"], M @ b1)
    torch.testing.assert_close(tangent["2.weight"], -W2 @ M)
    forward = symalg.numeric.sampling.network_function(analysis.architecture)
    x = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(forward(moved, x), forward(params, x))


def test_sigmoid_sign_flip_shifts_the_next_bias(generator):
    assert symalg.derive("linear(n, h) -> sigmoid -> linear(h, m)").symmetries[0].group.name.startswith("SignFlips(h")
    analysis = symalg.derive("linear(3, 4) -> sigmoid -> linear(4, 2)")
    flips = analysis.symmetries[0]
    assert isinstance(flips.group, SignFlips)
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    g = torch.diag(torch.tensor([-1.0, 1.0, 1.0, -1.0], dtype=torch.float64))
    moved = flips.apply(params, g)
    # σ(−z) = 1 − σ(z): each flipped unit hands its outgoing weights to the next bias
    torch.testing.assert_close(moved["2.bias"], params["2.bias"] + params["2.weight"] @ torch.tensor(
        [1.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    forward = symalg.numeric.sampling.network_function(analysis.architecture)
    x = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(forward(moved, x), forward(params, x))


def test_symbolic_invariance_is_proved_for_the_linear_case_at_all_widths():
    analysis = symalg.derive("linear(n, h) -> identity -> linear(h, m)")
    symmetry, shear = analysis.symmetries
    assert shear.checks == ()   # the shear rests on no identity of σ: on the bias the next layer gives back
    checks = symbolic_checks(analysis.catalogue["identity"], symmetry.group, ())
    assert all(c.proved is True for c in checks)
    assert "all widths" in checks[1].detail
    assert analysis.blocked == () and analysis.certification is None  # symbolic widths: the checks are the proof


def test_wrong_declaration_is_refuted_symbolically():
    wrong = symalg.overlay({"tanh": symalg.CatalogueEntry("tanh", lambda z: sp.tanh(z),
                                                          symalg.catalogue.activations.declare_homogeneous())})
    arch = symalg.parse("linear(2, 3) -> tanh -> linear(3, 1)", catalogue=wrong)
    kept = symalg.derive(arch, wrong, strict=False, certify=False).symmetries[0]  # not strict: kept, unchecked
    assert isinstance(kept.group, PositiveScaling)
    assert symbolic_checks(wrong["tanh"], kept.group, ())[0].proved is False
    strict = symalg.derive(arch, wrong)
    assert "disproved" in strict.blocked[0].reason and strict.blocked[0].node == "1"
    assert not any(isinstance(s.group, PositiveScaling) for s in strict.symmetries)
    # not strict but certified: the numerical safety net removes it
    certified = symalg.derive(arch, wrong, strict=False)
    assert not any(isinstance(s.group, PositiveScaling) for s in certified.symmetries)
    assert "failed numerical certification" in certified.blocked[0].reason


def test_a_disproved_declaration_names_its_activation_node_and_a_site_without_one_is_linear():
    """A wrong overlay of ``identity`` is disproved at the node that uses it; two linear layers read back to back
    (no activation node at all) are a GL site whatever the catalogue says about ``identity``."""
    wrong = symalg.overlay({"identity": symalg.CatalogueEntry("identity", symalg.CATALOGUE["identity"].function,
                                                              symalg.catalogue.activations.declare_homogeneous(degree=2))})
    analysis = symalg.derive(symalg.parse("linear(2, 3) -> identity -> linear(3, 1)", catalogue=wrong))
    (note,) = analysis.blocked
    assert (note.node, note.site) == ("1", "0") and "c^2 σ(z), c > 0: FALSE" in note.reason
    assert [s.label for s in analysis.symmetries] == ["S(3) on 0"]
    direct = symalg.derive(symalg.parse("linear(2, 3) -> linear(3, 1)", catalogue=wrong))
    assert [s.label for s in direct.symmetries] == ["GL(3) on 0", "Shears(3) on 0"]
    assert direct.certified and not direct.blocked


def test_generators_are_an_explicit_basis_at_concrete_widths():
    gl = symalg.derive("linear(2, 3) -> identity -> linear(3, 1)").symmetries[0]
    basis = gl.group.generators()
    assert len(basis) == 9 and sp.Matrix.hstack(*[b.reshape(9, 1) for b in basis]).rank() == 9
    o = symalg.derive("linear(2, 3) -> radial -> linear(3, 1)").symmetries[0]
    assert all(b.T == -b for b in o.group.generators()) and len(o.group.generators()) == 3
    perms = symalg.derive("linear(2, 5) -> gelu -> linear(5, 1)").symmetries[0]
    assert len(perms.group.discrete_generators()) == 2  # a transposition and a 5-cycle, never 5! elements


def test_conserved_quantity_closed_forms():
    gl, shear = symalg.derive("linear(n, h) -> identity -> linear(h, m)").symmetries
    assert shear.conserved is None   # a shear conserves nothing (Shears)
    W1, b1, W2 = sp.MatrixSymbol("0.weight", h, n), sp.MatrixSymbol("0.bias", h, 1), sp.MatrixSymbol("2.weight", m, h)
    assert list(gl.conserved.exprs) == ["C__0"]
    assert (gl.conserved.exprs["C__0"] - (W1 * W1.T + b1 * b1.T - W2.T * W2)).doit() == sp.ZeroMatrix(h, h)
    assert gl.group.n_symmetric == h * (h + 1) / 2  # one quantity tr(M C) per symmetric generator
    scaling = symalg.derive("linear(n, h) -> relu_pow(alpha=3) -> linear(h, m, bias=False)").symmetries[0]
    assert scaling.group.n_symmetric == h
    degree = scaling.conserved
    params = {"0.weight": torch.randn(4, 2), "0.bias": torch.randn(4), "2.weight": torch.randn(3, 4)}
    expected = (params["0.weight"] ** 2).sum(1) + params["0.bias"] ** 2 - 3 * (params["2.weight"] ** 2).sum(0)
    # the imbalance is weighted by the degree α = 3
    torch.testing.assert_close(degree(params)["q__0"], expected)


def test_conserved_quantity_values_match_a_hand_computation(generator):
    analysis = symalg.derive("linear(3, 4) -> leaky_relu(slope=0.1) -> linear(4, 2) -> identity -> linear(2, 2)")
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    q1, C2 = analysis.conserved_quantities()
    W1, b1, W2, b2, W3 = (params[k] for k in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight"))
    torch.testing.assert_close(q1(params)["q__0"], (W1 ** 2).sum(1) + b1 ** 2 - (W2 ** 2).sum(0))
    torch.testing.assert_close(C2(params)["C__2"], W2 @ W2.T + torch.outer(b2, b2) - W3.T @ W3)


def test_radial_networks_get_an_angular_momentum_relation_not_a_vacuous_q(generator):
    analysis = symalg.derive("linear(n, h) -> radial -> linear(h, m)")
    assert analysis.conserved_quantities() == []
    (momentum,) = analysis.angular_momenta()
    assert momentum.symmetry is analysis.symmetries[0] and momentum.name == "J__0"
    assert r"\dot U" in momentum.latex()
    # J(θ, θ̇) pairs with the algebra: ⟨θ̇, A·θ⟩ = ½ ⟨A, J⟩ (Frobenius) for every antisymmetric A
    concrete = analysis.subs({"n": 3, "h": 4, "m": 2})
    params = symalg.numeric.sampling.random_params(concrete.architecture, generator)
    velocity = {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in params.items()}
    J = concrete.angular_momenta()[0](params, velocity)
    torch.testing.assert_close(J, -J.T)
    A = torch.randn(4, 4, generator=generator, dtype=torch.float64)
    A = A - A.T
    moved = concrete.symmetries[0].tangent(params, A)
    torch.testing.assert_close(sum((velocity[k] * moved[k]).sum() for k in moved), 0.5 * (A * J).sum())


def test_an_angular_momentum_of_a_symmetry_moving_nothing_is_refused_by_name(generator):
    analysis = symalg.derive("linear(3, 4) -> radial -> linear(4, 2)")
    (momentum,) = analysis.angular_momenta()
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    empty = type(momentum)(dataclasses.replace(momentum.symmetry, bindings=()))
    with pytest.raises(ValueError, match="J__0: the symmetry moves no parameter"):
        empty(params, params)


def test_counts_of_conserved_quantities():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, k) -> identity -> linear(k, m)")
    k = sp.Symbol("k", integer=True, positive=True)
    count = sum(s.group.n_symmetric for s in analysis.symmetries if s.conserved is not None)
    assert sp.simplify(count - (h + k * (k + 1) / 2)) == 0
    wide = symalg.derive("linear(2, 9) -> identity -> linear(9, 3, bias=False)")
    assert wide.symmetries[0].group.n_symmetric == 45
    # C = W1 W1^T + b b^T - W2^T W2 has rank <= 2 + 1 + 3 = 6 here, so only 45 - (9-6)(9-6+1)/2 = 39 are independent
    assert wide.independent_conserved() == 39
    assert wide.independent_conserved(symalg.numeric.sampling.random_params(wide.architecture)) == 39


def test_latex_str_and_notebook_repr_for_every_object():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    radial = symalg.derive("linear(n, h) -> radial -> linear(h, m)")
    for obj in [analysis, *analysis.symmetries, *analysis.conserved_quantities(), *radial.angular_momenta()]:
        assert obj._repr_latex_().startswith("$") and obj._repr_latex_().endswith("$")
        assert obj.latex() and str(obj)


def test_analysis_subs_makes_widths_concrete():
    concrete = symalg.derive("linear(n, h) -> relu -> linear(h, m)").subs({"n": 2, "h": 3, "m": 1})
    assert concrete.symmetries[0].group.dim == 3
    assert concrete.orbit_dimension() == 3


def test_lowered_analysis_exposes_every_callable_with_source(generator):
    analysis = symalg.derive("linear(2, 3) -> relu -> linear(3, 2) -> radial -> linear(2, 1)")
    assert [s.label for s in analysis.symmetries] == ["PositiveScaling(3, alpha=1) on 0", "O(2) on 2", "S(3) on 0"]
    lowered = analysis.lower()
    assert set(lowered) == {"q__0"}
    assert "def q_0(params):" in lowered["q__0"].source
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    W1, b1, W2 = params["0.weight"], params["0.bias"], params["2.weight"]
    torch.testing.assert_close(lowered["q__0"](params)["q__0"],
                               (W1 ** 2).sum(1) + b1 ** 2 - (W2 ** 2).sum(0))
    assert [j.symmetry.label for j in analysis.angular_momenta()] == ["O(2) on 2"]


def test_actions_reject_inputs_outside_the_group_or_algebra(generator):
    relu = symalg.derive("linear(3, 5) -> relu -> linear(5, 2)")
    params = symalg.numeric.sampling.random_params(relu.architecture, generator)
    scaling, perms = relu.symmetries
    with pytest.raises(ValueError,
                       match=r"PositiveScaling\(5, alpha=1\): a group element has shape \(\.\.\., h\) with h = 5"):
        scaling.apply(params, torch.ones(4))
    with pytest.raises(ValueError, match="entries must be positive"):
        scaling.apply(params, torch.eye(5))  # read as a batch of 5 diagonals, which contain zeros
    with pytest.raises(ValueError, match="entries must be positive"):
        scaling.apply(params, -torch.ones(5))
    with pytest.raises(ValueError, match=r"S\(5\) is discrete: it has no Lie algebra"):
        perms.apply_algebra(params, 0.1 * torch.randn(5, 5))
    with pytest.raises(ValueError, match="permutation matrix"):
        perms.apply(params, torch.eye(5) + 0.1)
    radial = symalg.derive("linear(3, 4) -> radial -> linear(4, 2)").symmetries[0]
    random_params = symalg.numeric.sampling.random_params
    radial_params = random_params(symalg.parse("linear(3, 4) -> radial -> linear(4, 2)"), generator)
    with pytest.raises(ValueError, match="gᵀg ≠ I"):
        radial.apply(radial_params, 2 * torch.eye(4))
    with pytest.raises(ValueError, match="not antisymmetric"):
        radial.apply_algebra(radial_params, torch.eye(4))
    gl = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)").symmetries[0]
    with pytest.raises(ValueError, match="singular"):
        gl.apply(random_params(symalg.parse("linear(3, 4) -> identity -> linear(4, 2)"), generator),
                 torch.zeros(4, 4))
    # genuine elements, batched algebra elements, pass
    assert scaling.apply(params, torch.rand(5) + 0.5)["0.weight"].shape == (5, 3)
    M1, M2 = (torch.randn(5, generator=generator, dtype=torch.float64),
              torch.randn(5, generator=generator, dtype=torch.float64))
    torch.testing.assert_close(scaling.tangent(params, M1 + M2)["0.weight"],                 # linear in M
                               scaling.tangent(params, M1)["0.weight"] + scaling.tangent(params, M2)["0.weight"])


def test_a_width_one_linear_site_is_still_a_gl_matrix_quantity(generator):
    analysis = symalg.derive("linear(3, 1) -> identity -> linear(1, 2)")
    (quantity,) = analysis.conserved_quantities()
    assert quantity.name == "C__0" and quantity.kind == "matrix"
    assert r"\operatorname{tr}\left(M C_{0}\right)" in quantity.latex()
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    assert quantity(params)["C__0"].shape == (1, 1)
    symbolic = symalg.derive("linear(n, h) -> identity -> linear(h, m)").conserved_quantities()[0]
    torch.testing.assert_close(symbolic(params)["C__0"], quantity(params)["C__0"])


def test_numeric_ranks_read_widths_off_params_of_a_symbolic_analysis(generator):
    symbolic = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    params = symalg.numeric.sampling.random_params(symalg.parse("linear(3, 5) -> relu -> linear(5, 2)"), generator)
    assert symbolic.orbit_dimension(params).dimension == 5 and symbolic.independent_conserved(params) == 5


def test_lowered_callables_name_missing_parameters(generator):
    quantity = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)").conserved_quantities()[0]
    params = symalg.numeric.sampling.random_params(symalg.parse("linear(3, 4) -> relu -> linear(4, 2)"), generator)
    del params["0.bias"]
    with pytest.raises(KeyError, match=r"q_0: parameter\(s\) \['0.bias'\] missing"):
        quantity(params)


def test_an_architecture_remembers_the_catalogue_it_was_parsed_with():
    mine = symalg.overlay({"sin": symalg.CatalogueEntry("sin", lambda z: sp.sin(z),
                                                        symalg.catalogue.activations.declare_odd())})
    arch = symalg.parse("linear(2, 3) -> sin -> linear(3, 1)", catalogue=mine)
    assert [s.group.name for s in symalg.derive(arch).symmetries] == ["SignFlips(3)", "S(3)"]
    assert symalg.derive(arch.subs({})).blocked == () and arch.subs({}).catalogue is mine
    assert symalg.derive(symalg.parse("linear(2, 3) -> relu -> linear(3, 1)")).catalogue is symalg.CATALOGUE
    # a spec string reaches the overlay through derive's own argument, and its module runs the overlay's function
    analysis = symalg.derive("linear(2, 3) -> sin -> linear(3, 1)", catalogue=mine)
    assert [s.group.name for s in analysis.symmetries] == ["SignFlips(3)", "S(3)"] and analysis.certified
    assert analysis.catalogue is mine and analysis.model_graph.model[1].op == "sin"
    with pytest.raises(symalg.SpecError, match="unknown layer 'sin'"):
        symalg.derive("linear(2, 3) -> sin -> linear(3, 1)")


# ---------------------------------------------------------------------------------------------
# arguments are honoured or refused, on both pipelines
# ---------------------------------------------------------------------------------------------
def _traced(middle=None):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), middle or torch.nn.Softplus(), torch.nn.Linear(4, 2)).double()
    return symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),))


@pytest.mark.parametrize("kwargs, message", [
    ({"strict": "yes"}, r"derive: strict must be True or False, got 'yes'"),
    ({"strict": 1}, r"derive: strict must be True or False, got 1"),
    ({"catalogue": ["relu"]}, r"derive: catalogue must be a mapping .* got list"),
    ({"catalogue": {"relu": "max(z, 0)"}}, r"derive: catalogue entry 'relu' is a str, not a CatalogueEntry"),
    ({"loss": "nonsense"}, r"derive: loss must be 'mse' or 'cross_entropy', got 'nonsense'"),
    ({"loss": None}, r"derive: loss must be 'mse' or 'cross_entropy', got None"),
], ids=["strict-str", "strict-int", "catalogue-list", "catalogue-values", "loss-unknown", "loss-none"])
@pytest.mark.parametrize("pipeline", ["spec", "traced"])
def test_derive_refuses_arguments_of_the_wrong_type_naming_them(pipeline, kwargs, message):
    arch = "linear(3, 4) -> softplus -> linear(4, 2)" if pipeline == "spec" else _traced()
    with pytest.raises(symalg.SpecError, match=message):
        symalg.derive(arch, **kwargs)


def _translations(analysis):
    return [s for s in analysis.symmetries if isinstance(s.group, Translations)]


def test_spec_pipeline_claims_the_logit_translation_of_cross_entropy_as_the_traced_pipeline_does():
    arch = symalg.parse("linear(3, 4) -> tanh -> linear(4, 2)")
    assert _translations(symalg.derive(arch)) == []                                  # mse: outputs are fixed
    (translation,) = _translations(symalg.derive(arch, loss="cross_entropy"))
    assert translation.group.name == "Translations(5, along 1)" and translation.site == "2"
    assert str(translation.conserved) == "ell__2__2_weight = 1*2.weight; ell__2__2_bias = 1*2.bias"
    symbolic = _translations(symalg.derive("linear(n, h) -> relu -> linear(h, m)", loss="cross_entropy"))[0]
    assert symbolic.group.dim == h + 1
    assert _translations(symalg.derive("linear(3, 2, bias=False)", loss="cross_entropy"))[0].group.dim == 3
    # the traced pipeline claims the same group with the same linear quantities 1ᵀW, 1ᵀb
    module = symalg.to_module(arch)
    traced = symalg.derive(symalg.trace(module, (torch.randn(6, 3, dtype=torch.float64),)), loss="cross_entropy")
    (twin,) = _translations(traced)
    assert twin.group.dim == translation.group.dim
    params = dict(module.named_parameters())
    assert [v.flatten().tolist() for v in translation.conserved(params).values()] == \
        [v.flatten().tolist() for v in twin.conserved(params).values()]
    torch.testing.assert_close(translation.conserved(params)["ell__2__2_weight"].flatten(), params["2.weight"].sum(0))
    t = torch.arange(5, dtype=torch.float64)
    moved = translation.apply(params, t)
    torch.testing.assert_close(moved["2.weight"] - params["2.weight"], t[:4].expand(2, 4))
    torch.testing.assert_close(moved["2.bias"] - params["2.bias"], torch.full((2,), 4.0, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"Translations\(5, along 1\): a group element"):
        translation.apply(params, t[:4])
    # the logits move along 1, so softmax cross-entropy is unchanged and mse is not
    x = torch.randn(6, 3, dtype=torch.float64)
    logits, shifted = (torch.func.functional_call(module, p, (x,)) for p in (params, moved))
    shift = shifted - logits
    assert shift.abs().min() > 1e-3                             # the logits moved ...
    torch.testing.assert_close(shift[:, 0], shift[:, 1])        # ... along 1
    targets = torch.tensor([0, 1, 1, 0, 1, 0])
    torch.testing.assert_close(torch.nn.functional.cross_entropy(shifted, targets),
                               torch.nn.functional.cross_entropy(logits, targets))


def _softplus_declared_odd():
    return symalg.overlay({"softplus": symalg.CatalogueEntry(
        "softplus", symalg.CATALOGUE["softplus"].function, symalg.catalogue.activations.declare_odd(),
        defaults=symalg.CATALOGUE["softplus"].defaults)})


def test_traced_pipeline_runs_the_symbolic_checks_and_blocks_a_disproved_declaration():
    wrong = _softplus_declared_odd()
    spec = symalg.derive(symalg.parse("linear(3, 4) -> softplus -> linear(4, 2)", catalogue=wrong), wrong)
    traced = symalg.derive(_traced(), wrong)
    for analysis, node in ((spec, "1"), (traced, "_1")):
        assert not any(s.group.name.startswith("SignFlips") for s in analysis.symmetries)
        (note,) = [b for b in analysis.blocked if "disproved" in b.reason]
        assert note.node == node
        assert "declared SignFlips(4) for softplus is disproved: σ(−z) = −σ(z): FALSE" in note.reason
    assert [s.group.name for s in traced.symmetries] == ["S(4)"]          # pointwise: permutations stay


def test_traced_pipeline_keeps_a_disproved_declaration_when_not_strict_and_the_verifier_catches_it():
    traced = symalg.derive(_traced(), _softplus_declared_odd(), strict=False, certify=False)
    flips = next(s for s in traced.symmetries if s.group.name == "SignFlips(4)")
    assert not any("disproved" in b.reason for b in traced.blocked)
    report = symalg.verify(traced)
    assert any(c.failed and c.symmetry == flips.label and c.check == "invariance" for c in report.checks)
    certified = symalg.derive(_traced(), _softplus_declared_odd(), strict=False)  # the numerical safety net
    assert not any(s.group.name == "SignFlips(4)" for s in certified.symmetries)
    assert any("SignFlips(4)" in b.reason and "failed numerical certification" in b.reason for b in certified.blocked)
