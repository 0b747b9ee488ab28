"""Conjugated actions g·x = h⁻¹(ρ(g) h(x)): invariance, group axioms, transitivity on level sets, failures."""
from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from symalg.applications.conjugated import (TOLERANCE, ConjugatedAction, booth, check_transitivity, ellipse,
                                            lower_components, matrix_exp, quadratic_form, rosenbrock, sample_level_set)
from symalg.catalogue.groups import GeneralLinear, Orthogonal, OrthogonalFixingOnes, PositiveScaling

FUNCTIONS = {"booth": booth, "rosenbrock": rosenbrock, "ellipse": lambda: ellipse(4),
             "quadratic_form": lambda: quadratic_form([[2, 1, 0], [1, 3, 1], [0, 1, 2]], [1, -1, 2])}


@pytest.fixture(scope="module", params=sorted(FUNCTIONS))
def function(request):
    return FUNCTIONS[request.param]()


@pytest.fixture(scope="module")
def report(function):
    return {c.check: c for c in function.verify(symbolic=False).checks}


def _points(fn, generator, count=64, scale=1.0):
    return fn.center_tensor() + scale * torch.randn(count, fn.n, generator=generator, dtype=torch.float64)


# -- the acceptance criteria, per test function ----------------------------------------------------------------
def test_invariance_to_1e10(function, generator):
    x = _points(function, generator, scale=2.0)
    for _ in range(5):
        g = matrix_exp(function.group.random_algebra_element(3.0, generator))
        for element in (g, function.group.discrete_generators()[0] @ g):
            moved = function.action.apply(x, element)
            assert (moved - x).abs().max() > 1e-2  # the points really move
            error = (function.loss(moved) - function.loss(x)).abs() / function.loss(x).abs().clamp_min(1)
            assert error.max() < 1e-10


def test_transitive_on_level_sets(function, generator):
    result = check_transitivity(function.action, function.center_tensor(), pairs=25, scale=1.5, generator=generator)
    assert result.passed, result


def test_report_checks_pass(report):
    assert set(report) == {"group_axioms", "invariance", "gradient_orthogonality", "transitivity", "lowering"} | \
        ({"flow_invariants"} if "flow_invariants" in report else set())
    for check in report.values():
        assert check.passed and check.tolerance == TOLERANCE, check


def test_gradient_orthogonal_to_vector_field_and_field_matches_finite_difference(function, generator):
    x = _points(function, generator, count=8)
    M = function.group.algebra_basis()[0]
    field = function.action.vector_field(x, M)
    step = 1e-5  # central difference of t ↦ exp(tM)·x: error O(step²)
    difference = (function.action.apply(x, matrix_exp(step * M))
                  - function.action.apply(x, matrix_exp(-step * M))) / (2 * step)
    assert torch.allclose(field, difference, rtol=1e-7, atol=1e-7)
    leaf = x.clone().requires_grad_(True)
    grad = torch.autograd.grad(function.loss(leaf).sum(), leaf)[0]
    assert ((grad * field).sum(-1).abs() <= 1e-10 * grad.norm(dim=-1) * field.norm(dim=-1)).all()


def test_derivation_identities_are_zero(function):
    for name, value in function.derivation().items():
        assert value == sp.zeros(*value.shape) if isinstance(value, sp.MatrixBase) else value == 0, name


@pytest.mark.slow
def test_rosenbrock_in_four_variables_has_o4():
    fn = rosenbrock(pairs=2)
    assert fn.group.name == "O(4)"
    assert fn.verify().passed


# -- closed forms and paper formulas, checked independently ---------------------------------------------------------
def test_paper_maps_are_the_ones_derived():
    """[Zhao2026] eqs. C.2, C.5, C.8, reproduced from the printed formulas (they are correct)."""
    a = sp.Symbol("a", positive=True)
    x1, x2, u, v = sp.symbols("x1 x2 u v")
    h_paper = sp.Matrix([10 * (x1 ** 2 - x2), x1 - 1])  # Rosenbrock, eq. C.5
    inverse_paper = sp.Matrix([v + 1, (v + 1) ** 2 - u / 10])
    assert sp.simplify(inverse_paper.subs({u: h_paper[0], v: h_paper[1]}) - sp.Matrix([x1, x2])) == sp.zeros(2, 1)
    assert sp.expand((h_paper.T * h_paper)[0] - rosenbrock().loss_expr) == 0
    booth_inverse = sp.Matrix([-u / 3 + 2 * v / 3 + 1, 2 * u / 3 - v / 3 + 3])  # eq. C.8
    fn = booth()
    roundtrip = booth_inverse.subs({u: fn.h[0], v: fn.h[1]}, simultaneous=True)
    assert sp.simplify(roundtrip - sp.Matrix([x1, x2])) == sp.zeros(2, 1)
    t = sp.Symbol("t")
    R = sp.Matrix([[sp.cos(t), -sp.sin(t)], [sp.sin(t), sp.cos(t)]])
    ellipse_action = sp.diag(1, 1 / sp.sqrt(a)) * R * sp.diag(1, sp.sqrt(a)) * sp.Matrix([x1, x2])  # eq. C.2
    assert sp.simplify(ellipse_action[0] ** 2 + a * ellipse_action[1] ** 2 - x1 ** 2 - a * x2 ** 2) == 0


def test_ellipse_conserved_quantity_of_the_paper_on_the_exact_flow(generator):
    """Eq. (2.21): Q = x₁^{2a}/x₂² along the exact solution x(t) = (x₁₀ e^{−2t}, x₂₀ e^{−2at}); and the RK4
    flow of the lowered loss keeps the attached invariant log Q."""
    a = 3.0
    x0 = torch.tensor([0.8, -1.3], dtype=torch.float64)
    t = torch.linspace(0, 1, 5, dtype=torch.float64)
    path = torch.stack([x0[0] * torch.exp(-2 * t), x0[1] * torch.exp(-2 * a * t)], -1)
    q = path[:, 0] ** (2 * a) / path[:, 1] ** 2
    assert torch.allclose(q, q[0].expand(5), rtol=1e-12)
    fn = ellipse(3)
    report = {c.check: c for c in fn.verify(points=16, symbolic=False).checks}
    assert report["flow_invariants"].passed, report["flow_invariants"]


def test_quadratic_form_coordinates_are_cholesky():
    fn = quadratic_form([[4, 2], [2, 5]], [1, 0])
    L = sp.Matrix([[4, 2], [2, 5]]).cholesky()
    assert fn.h == sp.expand(L.T * (sp.Matrix(fn.x) - sp.Matrix([1, 0])))
    one_dimensional = quadratic_form([[3]])  # O(1) = {±1} is transitive on the two-point level sets
    assert one_dimensional.verify(points=8).passed


def test_sample_level_set_lands_on_the_level(generator):
    fn = rosenbrock()
    x1 = _points(fn, generator, count=32)
    points = sample_level_set(fn.loss, fn.center_tensor(), fn.loss(x1), torch.randn(32, 2, generator=generator,
                                                                                  dtype=torch.float64))
    assert torch.allclose(fn.loss(points), fn.loss(x1), rtol=1e-12)


def test_lower_components_prints_and_evaluates():
    x1, x2 = sp.symbols("x1 x2")
    f = lower_components("f", [x1 * x2, sp.Integer(7)], [x1, x2])
    assert "torch.full_like" in f.source and "x1*x2" in f.source
    assert f(torch.tensor([[2.0, 3.0]], dtype=torch.float64)).tolist() == [[6.0, 7.0]]
    with pytest.raises(ValueError, match=r"\['y'\]"):
        lower_components("g", [sp.Symbol("y")], [x1])
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 2\)"):
        f(torch.zeros(3))


# -- the API teleportation uses -------------------------------------------------------------------------------
def test_teleport_api_exp_and_act_are_exact_and_differentiable(generator):
    fn = rosenbrock()
    angle = torch.tensor([0.045], dtype=torch.float64)  # inside the range where torch's own matrix_exp is off by ~1e-10
    # the generator is E₁₂ − E₂₁, so exp(θB) = [[cos θ, sin θ], [−sin θ, cos θ]]
    exact = torch.tensor([[math.cos(0.045), math.sin(0.045)], [-math.sin(0.045), math.cos(0.045)]], dtype=torch.float64)
    assert (fn.action.exp(angle) - exact).abs().max() < 1e-15
    coords = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([[-1.0, 2.0]], dtype=torch.float64)
    moved = fn.action.act(x, coords)
    assert torch.allclose(fn.loss(moved), fn.loss(x), rtol=1e-12)
    gradient = torch.autograd.grad(moved.sum(), coords)[0]
    field = fn.action.vector_field(moved.detach(), Orthogonal(2).algebra_basis()[0])
    assert torch.allclose(gradient, field.sum().reshape(1), rtol=1e-10)  # d/dc exp(cB)·x = X_B(exp(cB)·x)
    with pytest.raises(ValueError, match=r"coords must have shape \(\.\.\., 1\)"):
        fn.action.exp(torch.zeros(2, dtype=torch.float64))


def test_connect_finds_the_element(generator):
    fn = quadratic_form([[2, 1, 0], [1, 3, 1], [0, 1, 2]])
    x1 = _points(fn, generator, count=1)[0]
    x2 = sample_level_set(fn.loss, fn.center_tensor(), fn.loss(x1), torch.randn(1, 3, generator=generator,
                                                                              dtype=torch.float64))[0]
    g = fn.action.connect(x1, x2)
    Orthogonal(3).check_element(g)
    assert torch.linalg.det(g) > 0  # a rotation: SO(3) is already transitive
    assert (fn.action.apply(x1, g) - x2).abs().max() < 1e-12


# -- where it fails, and why ----------------------------------------------------------------------------------------
def test_a_non_symmetry_fails_invariance():
    """Booth's h with unequal weights, f = u² + 2v²: f is not a function of ‖h‖, so O(2) is no symmetry."""
    fn = booth()
    weighted = lower_components("weighted_booth", fn.h[0] ** 2 + 2 * fn.h[1] ** 2, fn.x)
    action = ConjugatedAction(fn.action.h, fn.action.h_inverse, Orthogonal(2), weighted, "weighted booth")
    x = _points(fn, torch.Generator().manual_seed(0))
    report = {c.check: c for c in action.verify(x).checks}
    assert report["invariance"].failed and report["invariance"].max_error > 1e-2
    assert report["gradient_orthogonality"].failed
    assert report["group_axioms"].passed  # still an action, just not a symmetry of this f


def test_a_wrong_inverse_fails_the_axioms_and_invariance():
    """Rosenbrock with a factor-10 error in h⁻¹ (x₂ = (1 − y₁)² + y₂/100): not an inverse of h. (A sign error,
    ``− y₂/10``, would still leave f invariant: it is h⁻¹ composed with a reflection, and only the axioms fail.)"""
    fn = rosenbrock()
    y1, y2 = fn.y
    wrong = lower_components("wrong_inverse", [1 - y1, (1 - y1) ** 2 + y2 / 100], fn.y)
    action = ConjugatedAction(fn.action.h, wrong, Orthogonal(2), fn.loss, "rosenbrock, wrong h⁻¹")
    x = _points(fn, torch.Generator().manual_seed(0))
    report = {c.check: c for c in action.verify(x).checks}
    assert report["group_axioms"].failed and report["invariance"].failed
    with pytest.raises(ValueError, match="outside the image of h"):
        action.apply(x, torch.eye(2, dtype=torch.float64))


def test_a_subgroup_with_an_extra_invariant_is_not_transitive(generator):
    """O(3)_1 keeps 1ᵀh(x) as well as ‖h(x)‖: still a symmetry, but its orbits are circles inside the
    level spheres, so pairs with different 1ᵀh(x) cannot be connected."""
    fn = quadratic_form([[2, 1, 0], [1, 3, 1], [0, 1, 2]])
    action = ConjugatedAction(fn.action.h, fn.action.h_inverse, OrthogonalFixingOnes(3), fn.loss, "O(3)_1")
    x = _points(fn, generator, count=16)
    report = {c.check: c for c in action.verify(x, center=fn.center_tensor(), pairs=6).checks}
    assert report["invariance"].passed and report["gradient_orthogonality"].passed
    assert report["transitivity"].failed and report["transitivity"].max_error > 1e-3
    # the best element misses by exactly the distance between the orbits: with a = 1ᵀy/√3 and r = ‖y − a1/√3‖,
    # the orbit of y₁ is the circle {a = a₁, r = r₁}, at distance √((a₁ − a₂)² + (r₁ − r₂)²) from y₂
    x1 = x[1]
    x2 = sample_level_set(fn.loss, fn.center_tensor(), fn.loss(x1), torch.randn(1, 3, generator=generator,
                                                                              dtype=torch.float64))[0]
    y1, y2 = fn.action.h(x1), fn.action.h(x2)
    unit = torch.ones(3, dtype=torch.float64) / math.sqrt(3)
    a1, a2 = y1 @ unit, y2 @ unit
    r1, r2 = (y1 - a1 * unit).norm(), (y2 - a2 * unit).norm()
    miss = (action.connect(x1, x2, generator=generator) @ y1 - y2).norm()
    assert abs(miss - torch.sqrt((a1 - a2) ** 2 + (r1 - r2) ** 2)) < 1e-8
    # where the extra invariant agrees, the same solver connects the points
    x1 = x[0]
    g = OrthogonalFixingOnes(3).exp(OrthogonalFixingOnes(3).random_algebra_element(1.0, generator))
    x2 = action.apply(x1, g)
    assert (action.apply(x1, action.connect(x1, x2, generator=generator)) - x2).abs().max() < 1e-10


def test_a_level_set_with_two_components_is_two_orbits():
    """f = (‖h‖² − 1)² with Booth's h: the level f = c < 1 is two circles ‖h‖² = 1 ± √c; O(2) keeps ‖h‖."""
    fn = booth()
    ring = lower_components("ring", ((fn.h.T * fn.h)[0] - 1) ** 2, fn.x)
    action = ConjugatedAction(fn.action.h, fn.action.h_inverse, Orthogonal(2), ring, "ring")
    c = 0.25
    inner = action.h_inverse(math.sqrt(1 - math.sqrt(c)) * torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))
    outer = action.h_inverse(math.sqrt(1 + math.sqrt(c)) * torch.tensor([[0.6, 0.8]], dtype=torch.float64))
    assert torch.allclose(ring(torch.cat([inner, outer])), torch.full((3,), c, dtype=torch.float64))
    same = action.apply(inner[0], action.connect(inner[0], inner[1]))
    assert (same - inner[1]).abs().max() < 1e-12
    across = action.apply(inner[0], action.connect(inner[0], outer[0]))
    assert (across - outer[0]).norm() > 0.1


def test_a_map_that_is_not_onto_gives_no_action():
    """h(x) = (eˣ¹, x₂) maps onto a half-plane; rotating leaves it, so g·x is undefined (apply raises)."""
    x1, x2 = sp.symbols("x1 x2")
    y1, y2 = sp.symbols("y1 y2")
    action = ConjugatedAction(lower_components("h", [sp.exp(x1), x2], [x1, x2]),
                              lower_components("h_inv", [sp.log(y1), y2], [y1, y2]), Orthogonal(2), name="exp map")
    x = torch.tensor([[0.0, 0.5]], dtype=torch.float64)
    small = matrix_exp(torch.tensor([[0.0, -0.1], [0.1, 0.0]], dtype=torch.float64))
    assert torch.isfinite(action.apply(x, small)).all()  # near the identity it acts locally
    with pytest.raises(ValueError, match="outside the image of h"):
        action.apply(x, -torch.eye(2, dtype=torch.float64))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="a must be positive"):
        ellipse(0)
    with pytest.raises(ValueError, match="positive definite"):
        quadratic_form([[1, 2], [2, 1]])
    with pytest.raises(ValueError, match="symmetric square"):
        quadratic_form([[1, 2], [0, 1]])
    with pytest.raises(ValueError, match="pairs must be a positive integer"):
        rosenbrock(0)
    with pytest.raises(ValueError, match="matrix group"):
        ConjugatedAction(lambda x: x, lambda y: y, PositiveScaling(2))
    fn = booth()
    with pytest.raises(ValueError, match=r"x must be a tensor of shape \(\.\.\., 2\)"):
        fn.action.apply(torch.zeros(3, dtype=torch.float64), torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="not a group element"):
        fn.action.apply(torch.zeros(2, dtype=torch.float64), 2 * torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="not in the Lie algebra"):
        fn.action.vector_field(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64))
    general = ConjugatedAction(fn.action.h, fn.action.h_inverse, GeneralLinear(2), name="GL(2)")
    with pytest.raises(ValueError, match="needs the action's loss"):
        check_transitivity(general, fn.center_tensor())
