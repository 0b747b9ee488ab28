"""Laws every catalogue entry must satisfy, parametrised over the whole registered catalogue.

Every entry of ``symalg.CATALOGUE`` (so a newly registered one gets these tests for free) is
checked against the mathematics stated in ``symalg.catalogue.groups`` and ``symalg.derive``:

* the declared identity ``σ(g z) = π(g) σ(z) + τ(g)`` numerically, for group elements near and far
  from the identity, in the other component, and for every discrete generator;
* the representation laws behind it (``π`` a homomorphism, ``τ`` a cocycle, ``dπ(M) = α M``);
* the symbolic checks of the entry's symmetries are proved, through the spec and the traced front ends
  (``Symmetry.checks``), and a wrong declaration shows a disproved check;
* the Lie-algebra bases (dimension, independence, closure under the bracket, symmetric part);
* a two-layer network with the entry passes :func:`symalg.verify`;
* ``Symmetry.apply`` is a left group action: ``g2 · (g1 · θ) = (g2 g1) · θ``, ``e · θ = θ``,
  ``g⁻¹ · (g · θ) = θ``; it matches the action formula and ``Symmetry.action_expressions``, keeps the network
  function (the analysis' own module, through ``functional_call``), and its derivative is ``Symmetry.tangent``.
"""
from __future__ import annotations

import dataclasses

import pytest
import sympy as sp
import torch

import symalg
from symalg.catalogue.groups import Orthogonal
from symalg.catalogue.modules import activation_function
from symalg.lowering.codegen import evaluate_symbolic

ENTRIES = sorted(symalg.CATALOGUE)
DTYPE = torch.float64
IDENTITY_RTOL = 1e-12
WIDTHS = (1, 2, 5)


# -- helpers ---------------------------------------------------------------------------------------
def declared_symmetries(analysis) -> list:
    """The symmetries of the activation's declared groups: not the shear that moves the first layer's bias into
    the second's across an identity site (it comes from the biases, not from an identity of ``σ``;
    tests/test_shears.py)."""
    return [s for s in analysis.symmetries if not s.sheared]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max-abs difference relative to the larger of the two magnitudes."""
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-300)
    return (a - b).abs().max().item() / scale


def params_err(p: dict, q: dict) -> float:
    assert p.keys() == q.keys()
    return max(rel_err(p[k], q[k]) for k in p)


def is_diagonal(group) -> bool:
    return group.element_format == "diagonal"


def as_matrix(group, g: torch.Tensor) -> torch.Tensor:
    return torch.diag_embed(g) if is_diagonal(group) else g


def compose(group, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The group product ``a b`` (apply ``b`` first)."""
    return a * b if is_diagonal(group) else a @ b


def identity_element(group, h: int) -> torch.Tensor:
    return torch.ones(h, dtype=DTYPE) if is_diagonal(group) else torch.eye(h, dtype=DTYPE)


def inverse_element(group, g: torch.Tensor) -> torch.Tensor:
    return 1 / g if is_diagonal(group) else torch.linalg.inv(g)


def act_rows(group, g: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``g z`` for every row ``z`` of a batch."""
    return z * g if is_diagonal(group) else z @ g.T


def shift_row(group, g: torch.Tensor, h: int) -> torch.Tensor:
    tau = group.shift(g)
    return torch.zeros(h, dtype=DTYPE) if tau is None else tau.reshape(h)


def group_elements(group, h: int, generator: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """Elements near and far from the identity, in other components, and every discrete generator."""
    elements = [(f"discrete generator {i}", g) for i, g in enumerate(group.discrete_generators(DTYPE))]
    if group.is_continuous:
        for scale in (1e-3, 1.0, 2.5):
            M = group.random_algebra_element(scale, generator, DTYPE)
            elements.append((f"exp(M), |M| = {scale}", group.exp(M)))
        for i, d in enumerate(group.discrete_generators(DTYPE)):
            far = group.exp(group.random_algebra_element(1.0, generator, DTYPE))
            elements.append((f"generator {i} times far element", compose(group, d, far)))
    discrete = group.discrete_generators(DTYPE)
    if len(discrete) > 1:
        product = discrete[0]
        for d in discrete[1:]:
            product = product @ d
        elements.append(("product of all discrete generators", product))
    return elements


def site_groups(op: str, h: int):
    return symalg.CATALOGUE[op].site_groups(h)


def all_groups():
    """(op, width, group) for every entry, every test width and every declared group."""
    return [pytest.param(op, h, i, id=f"{op}-h{h}-{type(group).__name__}")
            for op in ENTRIES for h in WIDTHS for i, group in enumerate(site_groups(op, h))]


def continuous_groups():
    return [p for p in all_groups() if site_groups(p.values[0], p.values[1])[p.values[2]].is_continuous]


def random_z(h: int, generator: torch.Generator) -> torch.Tensor:
    """A batch of pre-activations of mixed signs and scales, including exact zeros and a zero row."""
    z = torch.randn(64, h, generator=generator, dtype=DTYPE) * 2.0
    z[:8] *= 1e-3
    z[8, :] = 0.0
    z[9:12, 0] = 0.0
    return z


# -- (1) the declared identity σ(g z) = π(g) σ(z) + τ(g) ----------------------------------------
@pytest.mark.parametrize("op, h, index", all_groups())
def test_declared_identity_holds_numerically(op, h, index):
    group = site_groups(op, h)[index]
    sigma, _ = activation_function(op)
    generator = torch.Generator().manual_seed(1000 + 7 * h + index)
    z = random_z(h, generator)
    elements = group_elements(group, h, generator)
    if h >= 2:  # only S(1) = {e} has nothing to test
        assert elements, f"{group.name} yielded no elements to test"
    for label, g in elements:
        lhs = sigma(act_rows(group, g, z))
        rhs = act_rows(group, group.rep(g), sigma(z)) + shift_row(group, g, h)
        assert rel_err(lhs, rhs) <= IDENTITY_RTOL, f"{op}, {group.name}, {label}: σ(g z) ≠ π(g) σ(z) + τ(g)"


HYPER_PARAMETER_VARIANTS = [("leaky_relu", {"slope": -0.5}), ("leaky_relu", {"slope": 0.7071067811865476}),
                            ("leaky_relu", {"slope": 3}), ("leaky_relu", {"slope": 1}), ("relu_pow", {"alpha": 3}),
                            ("relu_pow", {"alpha": 0.5}),
                            ("elu", {"alpha": 0.5}), ("elu", {"alpha": 2})]


@pytest.mark.parametrize("op, params", HYPER_PARAMETER_VARIANTS, ids=lambda v: str(v))
def test_declared_identity_holds_at_non_default_hyper_parameters(op, params):
    sigma, _ = activation_function(op, params)
    generator = torch.Generator().manual_seed(7)
    z = random_z(4, generator)
    for group in symalg.CATALOGUE[op].site_groups(4, **params):
        for label, g in group_elements(group, 4, generator):
            lhs = sigma(act_rows(group, g, z))
            rhs = act_rows(group, group.rep(g), sigma(z)) + shift_row(group, g, 4)
            assert rel_err(lhs, rhs) <= IDENTITY_RTOL, f"{op}{params}, {group.name}, {label}"
    spec = f"linear(3, 4) -> {op}({', '.join(f'{k}={v}' for k, v in params.items())}) -> linear(4, 2)"
    analysis = symalg.derive(spec)
    assert all(check.proved is True for s in analysis.symmetries for check in s.checks)
    assert symalg.verify(analysis).passed


@pytest.mark.parametrize("slope, expected", [(1.0, [("fc1", "GL(4)", 16)]),
                                             (0.5, [("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)])])
def test_traced_leaky_relu_is_linear_exactly_at_slope_one(slope, expected):
    """``nn.LeakyReLU(1.0)`` is the identity, so the traced model has ``GL(4)`` at the site (verified); any other
    slope keeps scalings and permutations, and there a general ``g ∈ GL(4)`` changes the output."""
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("fc1", torch.nn.Linear(3, 4))
    model.add_module("act", torch.nn.LeakyReLU(slope))
    model.add_module("fc2", torch.nn.Linear(4, 2))
    model = model.double()
    x = torch.randn(9, 3, dtype=DTYPE)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    assert sorted(analysis.table()) == expected
    assert symalg.verify(analysis).passed
    g = torch.eye(4, dtype=DTYPE) + 0.3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    params = dict(model.named_parameters())
    moved = {**params, "fc1.weight": g @ params["fc1.weight"], "fc1.bias": g @ params["fc1.bias"],
             "fc2.weight": params["fc2.weight"] @ torch.linalg.inv(g)}
    change = rel_err(torch.func.functional_call(model, moved, (x,)), model(x))
    assert change < 1e-12 if slope == 1 else change > 1e-3


@pytest.mark.parametrize("op, h, index", all_groups())
def test_elements_belong_to_the_group(op, h, index):
    """exp of the algebra lands in the group; generators are group elements."""
    group = site_groups(op, h)[index]
    generator = torch.Generator().manual_seed(3)
    eye = torch.eye(h, dtype=DTYPE)
    for label, g in group_elements(group, h, generator):
        G = as_matrix(group, g)
        name = type(group).__name__
        if name == "PositiveScaling":
            assert (g > 0).all(), label
        elif name == "Orthogonal":
            assert rel_err(G.T @ G, eye) < 1e-12, label
        elif name == "SignFlips":
            assert torch.equal(G, torch.diag(torch.diagonal(G))), label
            assert set(torch.diagonal(G).tolist()) <= {-1.0, 1.0}, label
        elif name == "Permutations":
            assert set(G.flatten().tolist()) <= {0.0, 1.0} and torch.equal(G.sum(0), torch.ones(h, dtype=DTYPE)) \
                and torch.equal(G.sum(1), torch.ones(h, dtype=DTYPE)), label
        elif name == "GeneralLinear":
            assert abs(torch.linalg.det(G).item()) > 1e-8, label


@pytest.mark.parametrize("op, h, index", all_groups())
def test_representation_is_a_homomorphism_and_shift_a_cocycle(op, h, index):
    """``π(g2 g1) = π(g2) π(g1)``, ``π(g)⁻¹ = rep_inverse(g)``, ``τ(g2 g1) = π(g2) τ(g1) + τ(g2)``
    (the condition for the declared identity to be consistent under composition)."""
    group = site_groups(op, h)[index]
    generator = torch.Generator().manual_seed(11)
    elements = [g for _, g in group_elements(group, h, generator)]
    for g in elements:
        inverse = as_matrix(group, group.rep_inverse(g))
        assert rel_err(inverse @ as_matrix(group, group.rep(g)), torch.eye(h, dtype=DTYPE)) < 1e-12
    for g1 in elements:
        for g2 in elements:
            g21 = compose(group, g2, g1)
            assert rel_err(as_matrix(group, group.rep(g21)),
                           as_matrix(group, group.rep(g2)) @ as_matrix(group, group.rep(g1))) < 1e-12
            lhs = shift_row(group, g21, h)
            rhs = as_matrix(group, group.rep(g2)) @ shift_row(group, g1, h) + shift_row(group, g2, h)
            assert (lhs - rhs).abs().max().item() < 1e-12


@pytest.mark.parametrize("op, h, index", continuous_groups())
def test_rep_differential_is_alpha_times_M(op, h, index):
    """Every group here has ``dπ(M) = α M`` (central difference of ``π(exp(tM))``)."""
    group = site_groups(op, h)[index]
    generator = torch.Generator().manual_seed(5)
    M = group.random_algebra_element(1.0, generator, DTYPE)
    t = 1e-5
    derivative = (as_matrix(group, group.rep(group.exp(t * M)))
                  - as_matrix(group, group.rep(group.exp(-t * M)))) / (2 * t)
    assert rel_err(derivative, float(group.alpha) * as_matrix(group, M)) < 1e-8


# -- (2) symbolic checks are proved ------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("op", ENTRIES)
def test_symbolic_checks_are_proved(op, bias):
    b = "" if bias else ", bias=False"
    analysis = symalg.derive(f"linear(n, h{b}) -> {op} -> linear(h, m{b})")
    assert analysis.symmetries, f"{op}: no symmetry at all (permutations or a Lie group expected)"
    for symmetry in declared_symmetries(analysis):
        assert len(symmetry.checks) == 3
        for check in symmetry.checks:
            assert check.proved is True, f"{op} {symmetry.label}: {check}"


@pytest.mark.parametrize("op", ENTRIES)
def test_symbolic_checks_are_proved_on_traced_models(op):
    """The traced front end runs the same checks: trace the module the spec generates (fx) and derive."""
    spec = symalg.derive(f"linear(3, 5) -> {op} -> linear(5, 2)")
    traced = symalg.derive(symalg.trace(spec.model_graph.model, spec.model_graph.example_inputs))
    assert [s.group.name for s in traced.symmetries] == [s.group.name for s in spec.symmetries]
    for symmetry, reference in zip(declared_symmetries(traced), declared_symmetries(spec)):
        assert symmetry.checks == reference.checks and len(symmetry.checks) == 3, symmetry.label
        assert all(check.proved is True for check in symmetry.checks), symmetry.label


def _softplus_declared_odd():
    return symalg.overlay({"softplus": symalg.CatalogueEntry(
        "softplus", symalg.CATALOGUE["softplus"].function, symalg.catalogue.activations.declare_odd(),
        defaults=symalg.CATALOGUE["softplus"].defaults)})


def test_a_wrong_declaration_shows_its_disproved_check_on_both_front_ends():
    """Kept with ``strict=False`` (uncertified), the claim carries the check that refutes it; strict derivation
    blocks it instead."""
    wrong = _softplus_declared_odd()
    spec = symalg.parse("linear(n, h) -> softplus -> linear(h, m)", catalogue=wrong)
    module = symalg.derive("linear(3, 4) -> softplus -> linear(4, 2)")
    traced = symalg.trace(module.model_graph.model, module.model_graph.example_inputs)
    for graph in (spec, traced):
        flips = next(s for s in symalg.derive(graph, wrong, strict=False, certify=False).symmetries
                     if s.group.name.startswith("SignFlips"))
        assert flips.checks[0].proved is False and "σ(−z) = −σ(z)" in flips.checks[0].statement
        assert not any(s.group.name.startswith("SignFlips") for s in symalg.derive(graph, wrong).symmetries)


def test_an_overlay_entry_decides_a_pointwise_op_on_both_front_ends():
    """``torch.sin`` is only permuted by the generic pointwise rule; an overlay entry declaring it odd is what
    decides the op, whether the spec names it or a traced model calls it, and its checks come along."""
    mine = symalg.overlay({"sin": symalg.CatalogueEntry("sin", lambda z: sp.sin(z),
                                                        symalg.catalogue.activations.declare_odd())})

    class Sine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)

        def forward(self, x):
            return self.b(torch.sin(self.a(x)))

    traced = symalg.trace(Sine().double(), (torch.randn(6, 2, dtype=DTYPE),))
    assert [s.group.name for s in symalg.derive(traced).symmetries] == ["S(3)"]
    for analysis in (symalg.derive(symalg.parse("linear(2, 3) -> sin -> linear(3, 1)", catalogue=mine)),
                     symalg.derive(traced, mine)):
        assert [s.group.name for s in analysis.symmetries] == ["SignFlips(3)", "S(3)"]
        assert analysis.certified and all(c.proved is True for s in analysis.symmetries for c in s.checks)
        assert [len(s.checks) for s in analysis.symmetries] == [3, 3]


@pytest.mark.parametrize("op", ENTRIES)
def test_derived_groups_are_the_declared_groups(op):
    analysis = symalg.derive(f"linear(n, h) -> {op} -> linear(h, m)")
    h = sp.Symbol("h", integer=True, positive=True)
    declared = [g.name for g in symalg.CATALOGUE[op].site_groups(h)]
    assert [s.group.name for s in declared_symmetries(analysis)] == declared
    assert [s.group.name for s in analysis.symmetries if s.sheared] == (["Shears(h)"] if op == "identity" else [])
    assert analysis.blocked == ()


# -- (3) Lie-algebra bases ---------------------------------------------------------------------------
def _flat_basis(group) -> torch.Tensor:
    basis = group.algebra_basis(DTYPE)
    if is_diagonal(group):
        basis = torch.diag_embed(basis)
    return basis


def _in_span(flat_basis: torch.Tensor, vectors: torch.Tensor) -> float:
    """Largest least-squares residual of ``vectors`` (rows) against the row span of ``flat_basis``."""
    if flat_basis.shape[0] == 0:
        return vectors.abs().max().item() if vectors.numel() else 0.0
    solution = torch.linalg.lstsq(flat_basis.T, vectors.T, driver="gelsd").solution
    return (flat_basis.T @ solution - vectors.T).abs().max().item() if vectors.numel() else 0.0


@pytest.mark.parametrize("op, h, index", all_groups())
def test_algebra_basis_has_the_declared_dimension(op, h, index):
    group = site_groups(op, h)[index]
    basis = _flat_basis(group)
    assert basis.shape[1:] == (h, h)
    assert basis.shape[0] == int(group.dim)
    if basis.shape[0]:
        assert torch.linalg.matrix_rank(basis.reshape(basis.shape[0], h * h)).item() == basis.shape[0]
    width = sp.Symbol("h", integer=True, positive=True)
    symbolic = dataclasses.replace(group, width=width)
    assert sp.sympify(symbolic.dim).subs(width, h) == basis.shape[0]
    assert sp.sympify(symbolic.n_symmetric).subs(width, h) == int(group.n_symmetric)
    assert group.is_continuous == (basis.shape[0] > 0)


@pytest.mark.parametrize("op, h, index", all_groups())
def test_algebra_basis_closed_under_commutator(op, h, index):
    group = site_groups(op, h)[index]
    basis = _flat_basis(group)
    flat = basis.reshape(basis.shape[0], h * h)
    brackets = [(a @ b - b @ a).reshape(-1) for a in basis for b in basis]
    if brackets:
        assert _in_span(flat, torch.stack(brackets)) < 1e-12


@pytest.mark.parametrize("op, h, index", all_groups())
def test_symmetric_basis_spans_symmetric_elements(op, h, index):
    group = site_groups(op, h)[index]
    basis = _flat_basis(group)
    symmetric = group.symmetric_basis(DTYPE)
    if is_diagonal(group):
        symmetric = torch.diag_embed(symmetric)
    k = symmetric.shape[0]
    assert k == int(group.n_symmetric)
    if k:
        assert symmetric.shape[1:] == (h, h)
        assert (symmetric - symmetric.transpose(1, 2)).abs().max().item() == 0
        assert torch.linalg.matrix_rank(symmetric.reshape(k, h * h)).item() == k
        assert _in_span(basis.reshape(basis.shape[0], h * h), symmetric.reshape(k, h * h)) < 1e-12
    # dimension of (algebra ∩ symmetric matrices) = dim − rank of the antisymmetric-part map
    d = basis.shape[0]
    if d:
        antisymmetric_parts = (basis - basis.transpose(1, 2)).reshape(d, h * h)
        rank = torch.linalg.matrix_rank(antisymmetric_parts).item() if antisymmetric_parts.abs().max() > 0 else 0
        assert k == d - rank
    else:
        assert k == 0


# -- (4) every entry verifies in a two-layer network ---------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("op", ENTRIES)
def test_two_layer_network_verifies(op, bias):
    b = "" if bias else ", bias=False"
    analysis = symalg.derive(f"linear(3, 5{b}) -> {op} -> linear(5, 2{b})")
    report = symalg.verify(analysis, dtype=torch.float64)
    assert report.passed, str(report)
    labels = {c.symmetry for c in report.checks if c.check == "invariance"}
    assert labels == {s.label for s in analysis.symmetries}
    for symmetry in analysis.continuous:
        assert any(c.check == "gradient_orthogonality" and c.symmetry == symmetry.label for c in report.checks)
        if symmetry.sheared:   # no conserved quantity (Shears): nothing flows
            assert not any(c.symmetry == symmetry.label for c in report.checks if c.check == "gradient_flow")
            continue
        dynamical = "angular_momentum" if isinstance(symmetry.group, Orthogonal) else "gradient_flow"
        assert any(c.check == dynamical and c.symmetry == symmetry.label for c in report.checks)


# -- (5) the action is a left group action -----------------------------------------------------------
ROLES = {"W_in": "0.weight", "b_in": "0.bias", "W_out": "2.weight", "b_out": "2.bias"}
"""The tensors around the site of ``linear -> op -> linear`` (the generated module names its layers 0, 1, 2)."""


def _two_layer(op, h, bias):
    b = "" if bias else ", bias=False"
    analysis = symalg.derive(f"linear(3, {h}{b}) -> {op} -> linear({h}, 2{b})")
    generator = torch.Generator().manual_seed(42)
    params = {name: torch.randn(p.shape, generator=generator, dtype=DTYPE)
              for name, p in analysis.model_graph.model.named_parameters()}
    return analysis, params


def _symmetry_cases(keep=lambda group: True):
    """(op, bias, index of the symmetry) for every entry's two-layer network, groups filtered by ``keep``."""
    cases = []
    for op in ENTRIES:
        for bias in (True, False):
            for i, symmetry in enumerate(_two_layer(op, 4, bias)[0].symmetries):
                if keep(symmetry.group) and not symmetry.sheared:   # the activation's groups
                    case_id = f"{op}-{'bias' if bias else 'no_bias'}-{symmetry.group.name}"
                    cases.append(pytest.param(op, bias, i, id=case_id))
    return cases


def _nonabelian(group) -> bool:
    return not is_diagonal(group) and type(group).__name__ not in ("SignFlips", "EvenFlips")


@pytest.mark.parametrize("op, bias, index", _symmetry_cases())
def test_action_composition_is_left_action(op, bias, index):
    """``W_in ↦ g W_in`` makes ``g2 · (g1 · θ) = (g2 g1) · θ`` (apply ``g1`` first)."""
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    group = symmetry.group
    elements = [g for _, g in group_elements(group, 4, torch.Generator().manual_seed(9))]
    for g1 in elements:
        for g2 in elements:
            twice = symmetry.apply(symmetry.apply(params, g1), g2)
            once = symmetry.apply(params, compose(group, g2, g1))
            assert params_err(twice, once) < 1e-11, f"{symmetry.label}: g2·(g1·θ) ≠ (g2 g1)·θ"


@pytest.mark.parametrize("op, bias, index", _symmetry_cases(_nonabelian))
def test_action_composition_order_matters_for_nonabelian_groups(op, bias, index):
    """The opposite order ``(g1 g2) · θ`` differs when ``g1, g2`` do not commute (so the test above
    really pins the order down)."""
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    group = symmetry.group
    elements = [g for _, g in group_elements(group, 4, torch.Generator().manual_seed(9))]
    found = False
    for g1 in elements:
        for g2 in elements:
            if rel_err(g1 @ g2, g2 @ g1) < 1e-6:
                continue
            twice = symmetry.apply(symmetry.apply(params, g1), g2)
            assert params_err(twice, symmetry.apply(params, g1 @ g2)) > 1e-6
            found = True
    assert found, "no non-commuting pair among the test elements"


@pytest.mark.parametrize("op, bias, index", _symmetry_cases())
def test_identity_acts_trivially(op, bias, index):
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    moved = symmetry.apply(params, identity_element(symmetry.group, 4))
    assert params_err(moved, params) < 1e-15


@pytest.mark.parametrize("op, bias, index", _symmetry_cases())
def test_inverse_undoes_action(op, bias, index):
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    group = symmetry.group
    for label, g in group_elements(group, 4, torch.Generator().manual_seed(13)):
        back = symmetry.apply(symmetry.apply(params, g), inverse_element(group, g))
        assert params_err(back, params) < 1e-11, label
        back = symmetry.apply(symmetry.apply(params, inverse_element(group, g)), g)
        assert params_err(back, params) < 1e-11, label


@pytest.mark.parametrize("op, bias, index", _symmetry_cases())
def test_action_matches_action_formula(op, bias, index):
    """``W_in ↦ g W_in, b_in ↦ g b_in, W_out ↦ W_out π(g)⁻¹, b_out ↦ b_out − W_out π(g)⁻¹ τ(g)``."""
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    group = symmetry.group
    roles = {role: name if name in params else None for role, name in ROLES.items()}
    shifted = {roles["b_out"]} if roles["b_out"] and symmetry.shifts else set()   # the reader bias absorbs τ(g)
    reader = set() if group.output_invariant else {roles["W_out"]}   # the readers of an even σ's output stay
    assert set(symmetry.tensors) == {roles["W_in"]} | reader | ({roles["b_in"]} if bias else set()) | shifted
    for label, g in group_elements(group, 4, torch.Generator().manual_seed(17)):
        G, inverse = as_matrix(group, g), torch.linalg.inv(as_matrix(group, group.rep(g)))
        expected = dict(params)
        expected[roles["W_in"]] = G @ params[roles["W_in"]]
        expected[roles["W_out"]] = params[roles["W_out"]] @ inverse
        if roles["b_in"]:
            expected[roles["b_in"]] = G @ params[roles["b_in"]]
        if roles["b_out"]:
            expected[roles["b_out"]] = (params[roles["b_out"]]
                                        - params[roles["W_out"]] @ inverse @ shift_row(group, g, 4))
        assert params_err(symmetry.apply(params, g), expected) < 1e-12, label


@pytest.mark.parametrize("op, bias, index", _symmetry_cases())
def test_action_expressions_match_apply(op, bias, index):
    """The SymPy action (``Symmetry.action_expressions``), evaluated exactly at the parameters and a group
    element, is what ``apply`` computes; every tensor it leaves out is left unchanged by ``apply``."""
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    expressions = symmetry.action_expressions()
    assert {symbol.name for symbol in expressions} >= set(symmetry.tensors)
    for label, g in group_elements(symmetry.group, 4, torch.Generator().manual_seed(29))[:3]:
        moved = symmetry.apply(params, g)
        values = {**{name: p.numpy() for name, p in params.items()}, symmetry.element_symbol.name: g.numpy()}
        for symbol, expression in expressions.items():
            value = torch.from_numpy(evaluate_symbolic(expression, values)).reshape(moved[symbol.name].shape)
            assert rel_err(value, moved[symbol.name]) < 1e-12, f"{symmetry.label}, {label}, {symbol.name}"
        for name in set(params) - {symbol.name for symbol in expressions}:
            assert torch.equal(moved[name], params[name]), f"{symmetry.label} moved {name}"


@pytest.mark.parametrize("op, bias, index", _symmetry_cases())
def test_action_preserves_network_function(op, bias, index):
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    model = analysis.model_graph.model
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(19), dtype=DTYPE)
    reference = torch.func.functional_call(model, params, (x,))
    for label, g in group_elements(symmetry.group, 4, torch.Generator().manual_seed(23)):
        moved = torch.func.functional_call(model, symmetry.apply(params, g), (x,))
        assert rel_err(moved, reference) < 1e-12, label


@pytest.mark.parametrize("op, bias, index", _symmetry_cases(lambda group: group.is_continuous))
def test_tangent_is_derivative_of_action(op, bias, index):
    """``M·θ = d/dt (exp(tM)·θ)`` at ``t = 0`` (central difference), for every basis generator."""
    analysis, params = _two_layer(op, 4, bias)
    symmetry = analysis.symmetries[index]
    group = symmetry.group
    basis = group.algebra_basis(DTYPE)
    t = 1e-5
    assert basis.shape[0] == int(group.dim)
    for i in range(basis.shape[0]):
        tangent = symmetry.tangent(params, basis[i])
        assert set(tangent) <= set(params)
        plus = symmetry.apply(params, group.exp(t * basis[i]))
        minus = symmetry.apply(params, group.exp(-t * basis[i]))
        for name in params:
            numeric = (plus[name] - minus[name]) / (2 * t)
            analytic = tangent[name] if name in tangent else torch.zeros_like(numeric)
            assert (numeric - analytic).abs().max().item() <= 1e-8 * max(1.0, params[name].abs().max().item()), \
                f"{symmetry.label}, generator {i}, {name}"


@pytest.mark.parametrize("group", [symalg.catalogue.groups.GeneralLinear(4), Orthogonal(5),
                                   symalg.catalogue.groups.OrthogonalFixingOnes(5),
                                   symalg.catalogue.groups.PositiveScaling(3)], ids=lambda g: g.name)
def test_random_algebra_element_is_the_gaussian_combination_of_the_basis(group):
    # Matrix groups draw it without stacking their dim·h²-entry basis (GL(768) needs 3·10¹¹ entries); the draw
    # is the same combination Σ c_k B_k, c_k ~ N(0, 1), as over the basis.
    direct = group.random_algebra_element(1.0, torch.Generator().manual_seed(7))
    basis = group.algebra_basis()
    coefficients = torch.randn(basis.shape[0], generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    combination = torch.tensordot(coefficients, basis, dims=1)
    norm = torch.linalg.matrix_norm(combination, ord=2) if combination.dim() == 2 else combination.abs().max()
    assert torch.allclose(direct, combination / norm, atol=1e-14)
    group.check_algebra_element(direct)


def test_random_algebra_element_of_a_wide_group_needs_no_basis():
    M = symalg.catalogue.groups.GeneralLinear(768).random_algebra_element(1.0, torch.Generator().manual_seed(0))
    assert M.shape == (768, 768) and abs(torch.linalg.matrix_norm(M, ord=2).item() - 1.0) < 1e-12
