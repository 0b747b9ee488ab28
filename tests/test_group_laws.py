"""Laws every registered group obeys, checked on the group's own test elements (jaxlie style).

The groups are every class in :func:`~symalg.catalogue.groups.group_classes` (a new subclass that sets ``kind``
registers itself and gets all of these laws), plus the parameterised variants below. Regions are random
``h × r`` tensors; "out" regions are written by the site (``g U``), "in" regions read it (``π(g)⁻ᵀ V``).
"""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
import sympy as sp
import torch

from symalg.catalogue.groups import (SIGN_FLIP_GENERATORS, ComplexScaling, GeneralLinear, PositiveScaling, Shears,
                                     SignFlips, SiteGroup, group_classes, matrix_exp, matrix_exp_pair)
from symalg.lowering.codegen import lower
from symalg.numeric.linalg import relative_error
from symalg.symbolic.inference import GRANTED, KINDS, TRANSLATIONS

DTYPE = torch.float64
WIDTH = 4
TOL = 1e-10

GROUPS = [cls.for_site(WIDTH) for cls in group_classes().values()] + [
    PositiveScaling.for_site(WIDTH, alpha=2), SignFlips.for_site(WIDTH, center=Fraction(1, 2)),
    SignFlips(SIGN_FLIP_GENERATORS + 1), Shears.for_site(WIDTH)]   # Shears: translations that conserve nothing
CONTINUOUS = [g for g in GROUPS if g.is_continuous]
WITH_CONSERVED = [g for g in GROUPS if g.conserved_kind is not None]


def _ids(groups):
    return [g.name for g in groups]


def _region(seed: int, group=None, cols: int = 3, rows: int | None = None) -> torch.Tensor:
    """A random region with one row per neuron of ``group``'s site (or ``rows`` rows)."""
    rows = int(group.width) if rows is None else rows
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)


def _elements(group, seed=0):
    elements = group.sample(torch.Generator().manual_seed(seed), DTYPE)
    assert elements, f"{group.name} has no test elements"
    return elements


def _all_subclasses(cls):
    return {c for sub in cls.__subclasses__() for c in {sub} | _all_subclasses(sub)}


# -- registry ----------------------------------------------------------------------------------------------
def test_every_group_class_that_sets_a_kind_is_registered_under_it():
    registered = group_classes()
    own_kind = {c for c in _all_subclasses(SiteGroup)
                if "kind" in vars(c) and c.__module__ == "symalg.catalogue.groups"}
    assert own_kind == set(registered.values())
    assert all(registered[c.kind] is c for c in own_kind)


@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_kinds_it_preserves_are_inference_kinds_and_include_its_own(group):
    assert group.kind in group.kinds_it_preserves <= set(KINDS)


def test_general_linear_preserves_every_kind_but_translations():
    assert GeneralLinear.kinds_it_preserves == set(KINDS) - TRANSLATIONS
    assert GRANTED <= GeneralLinear.kinds_it_preserves   # C ⊂ GL, granted by the rotary rule alone


def test_a_group_on_planes_refuses_an_odd_width():
    with pytest.raises(ValueError, match=r"ComplexScaling\(3\): the width must be a multiple of 2"):
        ComplexScaling(3)
    h = sp.Symbol("h", positive=True, integer=True)
    assert ComplexScaling(h).dim == h and ComplexScaling(h).n_symmetric == h / 2


def test_for_site_refuses_options_a_group_does_not_take():
    with pytest.raises(ValueError, match="alpha=2"):
        GeneralLinear.for_site(3, alpha=2)
    with pytest.raises(ValueError, match="center=1/2"):
        PositiveScaling.for_site(3, center=Fraction(1, 2))
    assert SignFlips.for_site(3, center=Fraction(1, 2)).center == Fraction(1, 2)


# -- elements ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_sampled_elements_are_members(group):
    for label, g in _elements(group):
        group.check_element(g)   # raises ValueError naming the group otherwise
    group.check_element(group.identity(DTYPE))


@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_samples_come_from_the_generator(group):
    first, again = _elements(group, 3), _elements(group, 3)
    assert [label for label, _ in first] == [label for label, _ in again]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(first, again))


def test_a_non_member_is_refused():
    with pytest.raises(ValueError, match="not a group element"):
        SignFlips(3).check_element(torch.diag(torch.tensor([1.0, 2.0, -1.0], dtype=DTYPE)))


@pytest.mark.parametrize("g, problem", [
    (torch.zeros(3, 3, dtype=DTYPE), r"GL\(3\): not a group element: it is singular \(a zero pivot"),
    (torch.diag(torch.tensor([1.0, 1.0, 1e-12], dtype=DTYPE)),
     r"GL\(3\): not a group element: it is numerically singular \(condition number ‖g‖₁‖g⁻¹‖₁ = 1e\+12 ≥ 1e\+09\)"),
    (torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0 + 1e-13, 0.0], [0.0, 0.0, 1.0]], dtype=DTYPE), "numerically singular"),
    (torch.full((3, 3), float("nan"), dtype=DTYPE), r"GL\(3\): the group element has non-finite entries"),
], ids=["zero", "tiny-pivot", "nearly-dependent-rows", "nan"])
def test_general_linear_refuses_singular_and_numerically_singular_elements_in_check_and_action(g, problem):
    with pytest.raises(ValueError, match=problem):
        GeneralLinear(3).check_element(g)
    with pytest.raises(ValueError, match=problem):
        GeneralLinear(3).mover(g)


def test_general_linear_accepts_a_well_conditioned_element_in_float32():
    f32 = torch.float32
    g = torch.linalg.matrix_exp(torch.randn(64, 64, generator=torch.Generator().manual_seed(0), dtype=f32) / 8)
    GeneralLinear(64).check_element(g)
    with pytest.raises(ValueError, match=r"= 1e\+05 ≥ 1e\+04"):   # κ₁ ≥ 1e4 is singular in float32
        GeneralLinear(64).check_element(torch.diag(torch.tensor([1.0] * 63 + [1e-5], dtype=f32)))


@pytest.mark.parametrize("g, problem", [
    (torch.tensor([1.0, 0.0, 2.0], dtype=DTYPE), "entries must be positive"),
    (torch.tensor([1.0, -float("inf"), 2.0], dtype=DTYPE), "non-finite"),
    (torch.tensor([1.0, float("nan"), 2.0], dtype=DTYPE), "non-finite"),
    (torch.tensor([1.0, float("inf"), 2.0], dtype=DTYPE), "non-finite"),
], ids=["zero", "-inf", "nan", "inf"])
def test_positive_scaling_refuses_what_is_not_finite_and_positive(g, problem):
    with pytest.raises(ValueError, match=rf"PositiveScaling\(3, alpha=1\): .*{problem}"):
        PositiveScaling(3).mover(g)


def test_wide_sign_flips_sample_random_patterns_not_every_generator():
    group = SignFlips(SIGN_FLIP_GENERATORS + 1)
    labels = [label for label, _ in _elements(group)]
    assert labels and all(label.startswith("random sign pattern") for label in labels)


# -- action ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_identity_acts_trivially(group):
    U = _region(1, group)
    for role in group.roles:
        assert torch.equal(group.act(group.identity(DTYPE), U, role), U)


@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_action_is_a_homomorphism(group):
    elements = [g for _, g in _elements(group)]
    U = _region(2, group)
    for role in group.roles:
        for power in ((1, 2) if "PS" == group.kind else (1,)):
            for g1, g2 in zip(elements, elements[::-1]):
                composed = group.act(group.compose(g1, g2), U, role, power)
                stepwise = group.act(g1, group.act(g2, U, role, power), role, power)
                assert relative_error(stepwise, composed) < TOL, (role, power)


@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_mover_moves_every_region_as_act_does(group):
    """``mover(g)`` checks ``g`` once and reuses its operators; each region moves exactly as under ``act``."""
    for _, g in _elements(group):
        move = group.mover(g)
        for role in group.roles:
            for power in ((1, 2, Fraction(1, 2), 0) if group.kind == "PS" else (1,)):
                for seed in (6, 7):   # the second region of a (role, power) reuses the operator of the first
                    U = _region(seed, group)
                    assert relative_error(move(U, role, power), group.act(g, U, role, power)) < TOL, (role, power)


@pytest.mark.parametrize("group", [g for g in GROUPS if "in" in g.roles],
                         ids=_ids([g for g in GROUPS if "in" in g.roles]))
def test_action_leaves_the_pairing_of_writers_and_readers_unchanged(group):
    """``(π(g)⁻ᵀ V)ᵀ (g U) = Vᵀ U``: the contraction the next layer computes is invariant (a linear identity;
    an affine one also moves the reader's bias, which is not a region)."""
    U, V = _region(3, group), _region(4, group, cols=5)
    for _, g in _elements(group):
        moved = group.act(g, V, "in").T @ group.act(g, U, "out")
        assert relative_error(moved, V.T @ U) < TOL


@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_an_unknown_role_is_refused(group):
    with pytest.raises(ValueError, match="role"):
        group.act(group.identity(DTYPE), _region(5, group), "sideways")


@pytest.mark.parametrize("group", CONTINUOUS, ids=_ids(CONTINUOUS))
def test_exp_of_the_infinitesimal_action_matches_the_action_to_first_order(group):
    """``(act(exp(tM)) − act(exp(−tM))) / 2t = M·U + O(t²)``."""
    M = group.random_algebra_element(1.0, torch.Generator().manual_seed(6), DTYPE)
    group.check_algebra_element(M)
    U, t = _region(7, group), 1e-5
    for role in group.roles:
        for power in ((1, 2) if group.kind == "PS" else (1,)):
            forward = group.act(group.exp(t * M), U, role, power)
            backward = group.act(group.exp(-t * M), U, role, power)
            tangent = group.act_infinitesimally(M, U, role, power)
            assert relative_error((forward - backward) / (2 * t), tangent) < 1e-8, (role, power)


@pytest.mark.parametrize("group", CONTINUOUS, ids=_ids(CONTINUOUS))
def test_the_infinitesimal_action_is_linear(group):
    generator = torch.Generator().manual_seed(8)
    M1, M2 = (group.random_algebra_element(1.0, generator, DTYPE) for _ in range(2))
    U = _region(9, group)
    for role in group.roles:
        combined = group.act_infinitesimally(2 * M1 - 3 * M2, U, role)
        separate = 2 * group.act_infinitesimally(M1, U, role) - 3 * group.act_infinitesimally(M2, U, role)
        assert relative_error(combined, separate) < TOL


# -- conserved term ----------------------------------------------------------------------------------------
def _conserved(group, U: torch.Tensor, V: torch.Tensor | None):
    """``Q = T(U) − T(V)`` (``V`` read by the site), lowered from the group's SymPy term."""
    Us, Vs = sp.MatrixSymbol("U", *U.shape), sp.MatrixSymbol("V", *V.shape) if V is not None else None
    expr = group.conserved_term(Us) - (group.conserved_term(Vs) if V is not None else 0 * group.conserved_term(Us))
    params = {Us: "U", **({Vs: "V"} if V is not None else {})}
    function = lower("Q", expr, params)
    return lambda u, v: function({"U": u, **({"V": v} if V is not None else {})})


def _symmetric(group, seed):
    """A random element of the algebra's symmetric part (the ``M`` whose ``Q_M`` is conserved)."""
    basis = group.symmetric_basis(DTYPE) if group.conserved_kind != "linear" else group.algebra_basis(DTYPE)
    coefficients = torch.randn(basis.shape[0], generator=torch.Generator().manual_seed(seed), dtype=DTYPE)
    return torch.tensordot(coefficients, basis, dims=1)


@pytest.mark.parametrize("group", WITH_CONSERVED, ids=_ids(WITH_CONSERVED))
def test_the_gradient_of_the_conserved_term_is_the_infinitesimal_action(group):
    """``∇_θ ⟨M, Q(θ)⟩ = c·M·θ`` (``c = 2`` for a quadratic ``Q``, 1 for a linear one): so ``Q`` is constant along
    the gradient flow of every loss invariant under the group, whose gradient is orthogonal to ``M·θ``."""
    U = _region(10, group).requires_grad_(True)
    V = _region(11, group, cols=5).requires_grad_(True) if "in" in group.roles else None
    M = _symmetric(group, 12)
    Q = _conserved(group, U, V)(U, V)
    pairing = (group.conserved_coefficients(M).reshape(Q.shape) * Q).sum()
    grads = torch.autograd.grad(pairing, [U] + ([V] if V is not None else []))
    c = 1 if group.conserved_kind == "linear" else 2
    assert relative_error(grads[0], c * group.act_infinitesimally(M, U.detach(), "out")) < TOL
    if V is not None:
        assert relative_error(grads[1], c * group.act_infinitesimally(M, V.detach(), "in")) < TOL


def _invariant_loss(group, target):
    """A loss of the regions invariant under the group: ``‖VᵀU − T‖²`` (the pairing is invariant), or for a
    group with writers only (translations ``U + t1ᵀ``) the loss of ``U`` with each row centred."""
    if "in" in group.roles:
        return lambda U, V: ((V.T @ U - target) ** 2).sum()
    return lambda U, V: ((U - U.mean(-1, keepdim=True) - target) ** 2).sum()


@pytest.mark.parametrize("group", WITH_CONSERVED, ids=_ids(WITH_CONSERVED))
def test_the_conserved_term_is_invariant_under_gradient_flow_of_an_invariant_loss(group):
    two_roles = "in" in group.roles
    U, V = _region(13, group), (_region(14, group, cols=5) if two_roles else None)
    target = _region(15, group, rows=5 if two_roles else None)
    loss = _invariant_loss(group, target)
    for _, g in _elements(group, 16):   # the loss is invariant
        moved = loss(group.act(g, U, "out"), group.act(g, V, "in") if two_roles else None)
        assert relative_error(moved, loss(U, V)) < 1e-9
    Q = _conserved(group, U, V)

    def velocity(u, v):
        u = u.detach().requires_grad_(True)
        v = v.detach().requires_grad_(True) if v is not None else None
        grads = torch.autograd.grad(loss(u, v), [u] + ([v] if v is not None else []))
        return -grads[0], (-grads[1] if v is not None else None)

    def add(state, delta, h):
        return state[0] + h * delta[0], (state[1] + h * delta[1] if state[1] is not None else None)

    state, before, step = (U, V), Q(U, V), 5e-4
    for _ in range(40):   # RK4 on θ̇ = −∇L
        k1 = velocity(*state)
        k2 = velocity(*add(state, k1, step / 2))
        k3 = velocity(*add(state, k2, step / 2))
        k4 = velocity(*add(state, k3, step))
        state = tuple(s + step / 6 * (a + 2 * b + 2 * c + d) if s is not None else None
                      for s, a, b, c, d in zip(state, k1, k2, k3, k4))
    assert relative_error(state[0], U) > 1e-3            # the flow moved
    assert relative_error(Q(*state), before) < 1e-9      # Q did not


@pytest.mark.parametrize("group", [g for g in GROUPS if g.conserved_kind is None],
                         ids=_ids([g for g in GROUPS if g.conserved_kind is None]))
def test_a_group_without_conserved_kind_has_no_conserved_term(group):
    assert group.conserved_term(sp.MatrixSymbol("U", WIDTH, 3)) is None
    assert group.n_symmetric == 0


@pytest.mark.parametrize("cls", list(group_classes().values()), ids=list(group_classes()))
def test_a_group_is_trivial_exactly_when_it_has_no_generators(cls):
    for width in range(cls.width_multiple, 4 * cls.width_multiple, cls.width_multiple):
        group = cls.for_site(width)
        assert group.is_trivial == (not group.is_continuous and not group.discrete_generators(DTYPE)), width
    assert not cls.for_site(sp.Symbol("h", positive=True, integer=True)).is_trivial


@pytest.mark.parametrize("group", [g for g in GROUPS if g.element_format == "matrix"],
                         ids=_ids([g for g in GROUPS if g.element_format == "matrix"]))
def test_a_closed_form_element_between_two_points_is_a_member_aligning_them(group):
    generator = torch.Generator().manual_seed(17)
    y1, y2 = (torch.randn(int(group.width), generator=generator, dtype=DTYPE) for _ in range(2))
    g = group.element_between(y1, y2)
    if g is None:   # no closed form: ConjugatedAction.connect searches numerically
        assert group.kind != "O"
        return
    group.check_element(g)
    assert relative_error(g @ y1 / y1.norm(), y2 / y2.norm()) < TOL


# -- Lie-algebra elements without the basis ---------------------------------------------------------------
@pytest.mark.parametrize("group", CONTINUOUS, ids=_ids(CONTINUOUS))
def test_an_algebra_element_is_the_coordinates_combination_of_the_basis(group):
    coordinates = torch.randn(2, 3, int(group.dim), generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    expected = torch.tensordot(coordinates, group.algebra_basis(DTYPE), dims=1)
    assert relative_error(group.algebra_element(coordinates), expected) < TOL
    with pytest.raises(ValueError, match=r"coordinates must have shape \(\.\.\., "):
        group.algebra_element(coordinates[..., 1:])


@pytest.mark.parametrize("kind", ["GL", "O", "O1", "PS", "T"])
def test_wide_groups_draw_algebra_elements_and_samples_without_their_basis(kind, monkeypatch):
    group = group_classes()[kind].for_site(512)
    monkeypatch.setattr(type(group), "algebra_basis", lambda *_: pytest.fail("the basis was stacked"))
    generator = torch.Generator().manual_seed(0)
    element = group.gaussian_algebra_element(generator)
    group.check_algebra_element(element)
    sample = group.algebra_sample(3, generator)
    assert sample.shape == (3, *element.shape) and relative_error(sample[0], sample[1]) > 0.5
    scaled = group.random_algebra_element(2.0, generator)
    norm = torch.linalg.matrix_norm(scaled, ord=2) if scaled.dim() == 2 else scaled.abs().max()
    assert abs(norm.item() - 2.0) < 1e-9


def test_an_algebra_sample_is_the_basis_up_to_its_limit():
    group = GeneralLinear(3)
    assert torch.equal(group.algebra_sample(9), group.algebra_basis())
    assert group.algebra_sample(8, torch.Generator().manual_seed(0)).shape == (8, 3, 3)


@pytest.mark.parametrize("group", CONTINUOUS, ids=_ids(CONTINUOUS))
def test_the_projection_to_the_algebra_is_the_orthogonal_projection_on_the_basis(group):
    basis = group.algebra_basis(DTYPE).reshape(int(group.dim), -1)
    A = torch.randn(*group.algebra_basis(DTYPE).shape[1:], generator=torch.Generator().manual_seed(3), dtype=DTYPE)
    expected = (torch.linalg.solve(basis @ basis.T, basis @ A.reshape(-1)) @ basis).reshape(A.shape)
    projected = group.project_to_algebra(A)
    assert relative_error(projected, expected) < TOL
    group.check_algebra_element(projected)
    assert relative_error(group.project_to_algebra(projected), projected) < TOL


@pytest.mark.parametrize("group", GROUPS, ids=_ids(GROUPS))
def test_a_diagonal_operator_is_offered_as_the_vector_it_multiplies_rows_by(group):
    for _, g in _elements(group):
        mover = group.mover(g)
        for role in group.roles:
            diagonal = mover.diagonal(role, Fraction(1))
            U = _region(5, group)
            assert (diagonal is not None) == (group.kind in ("PS", "SF", "EF"))
            if diagonal is not None:
                assert relative_error(diagonal[:, None] * U, group.act(g, U, role)) < TOL


@pytest.mark.parametrize("axis, start, width, block", [(0, 0, 4, 1), (1, 0, 5, 1), (1, 1, 2, 2), (2, 2, 3, 1),
                                                       (0, 1, 1, 3)])
@pytest.mark.parametrize("inplace", [False, True])
def test_scaling_a_region_where_it_lies_equals_unfold_multiply_fold(axis, start, width, block, inplace):
    from symalg.catalogue.bindings import Binding

    binding = Binding("w", axis=axis, start=start, width=width, block=block)
    tensor = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    diagonal = torch.rand(width, generator=torch.Generator().manual_seed(1), dtype=DTYPE) + 0.5
    expected = binding.fold(tensor.clone(), diagonal[:, None] * binding.unfold(tensor))
    copy = tensor.clone()
    scaled = binding.scale(copy, diagonal, inplace=inplace)
    assert torch.equal(scaled, expected)
    assert (scaled is copy) == inplace and torch.equal(copy, expected if inplace else tensor)


# ---------------------------------------------------------------------------------------------
# the exponential: Taylor with scaling and squaring without gradients, torch's batched function with them
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", [0.0, 1e-8, 1e-4, 1e-2, 0.3, 1.0, 3.0, 30.0])
def test_matrix_exp_matches_the_closed_form_of_symmetric_and_rotation_generators(norm):
    g = torch.Generator().manual_seed(int(norm * 100) % 89)
    A = torch.randn(3, 16, 16, generator=g, dtype=torch.float64)
    S = (A + A.mT) / 2
    S = S * norm / torch.linalg.matrix_norm(S, ord=2)[:, None, None]
    w, V = torch.linalg.eigh(S)
    exact = V @ torch.diag_embed(w.exp()) @ V.mT
    eps = torch.finfo(torch.float64).eps
    for batch in (S, S[0]):                                    # a batch and a lone matrix
        value, inverse = matrix_exp_pair(batch)
        expected = exact if batch.dim() == 3 else exact[0]
        assert value.shape == batch.shape
        assert (torch.linalg.matrix_norm(value - expected) / torch.linalg.matrix_norm(expected)).max() \
            < 64 * eps * (1 + norm)
        assert torch.equal(matrix_exp(batch), value)
        identity = torch.eye(16, dtype=torch.float64).expand_as(batch)
        assert (value @ inverse - identity).abs().max() < 64 * eps * math.exp(2 * norm)
    theta = torch.tensor(norm, dtype=torch.float64)
    R = torch.stack([torch.stack([0 * theta, -theta]), torch.stack([theta, 0 * theta])])
    rotation = torch.stack([torch.stack([theta.cos(), -theta.sin()]), torch.stack([theta.sin(), theta.cos()])])
    assert (matrix_exp(R) - rotation).abs().max() < 8 * eps * (1 + norm)
    single = matrix_exp(S[0].float())                           # float32: computed in float64, rounded once
    assert single.dtype == torch.float32 and (single.double() - exact[0]).abs().max() < 4e-7 * math.exp(norm)


def test_matrix_exp_with_a_gradient_is_torchs_and_agrees():
    M = (torch.randn(5, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64) / 3).requires_grad_(True)
    value = matrix_exp(M)
    assert value.grad_fn is not None and torch.allclose(value, matrix_exp(M.detach()), rtol=1e-14, atol=1e-15)
    (grad,) = torch.autograd.grad(value.sum(), M)
    assert torch.isfinite(grad).all()
    assert torch.isnan(matrix_exp(torch.full((3, 3), math.nan, dtype=torch.float64))).all()   # left to torch
