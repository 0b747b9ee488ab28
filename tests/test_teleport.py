"""Symmetry teleportation: exactness, the theory of Ch. 4-5 as checks, objectives, and optimizer state.

Each test derives its expected value from theory in a comment and compares numerically in float64.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg
import symalg.numeric.sampling
from symalg.applications.conjugated import booth, ellipse, quadratic_form, rosenbrock
from symalg.catalogue.groups import Permutations, PositiveScaling
from symalg.applications.nonlinear_actions import DataDependentAction
from symalg.numeric.feedforward import FeedForward
from symalg.applications.teleport import (Curvature, FunctionAction, GradNorm, MetricGradNorm, Move, Sharpness,
                                          SymmetryAction, Teleporter, as_action, gradients, optimizer_metric, teleport,
                                          transform_cotangent)
from symalg.applications.teleport_actions import ApproximateTeleport
from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer, handle_state, model_loss
from test_models import HandAttention, PreNormBlock, SmallCNN  # GPT block (GL(4) heads, LayerNorm scalings)


pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------ models

class RMSStream(nn.Module):
    """A residual stream read only by gain-free RMSNorms: O(6) acting on it (orthogonal, linear)."""

    def __init__(self, n=3, d=6, m=2):
        super().__init__()
        self.embed, self.up, self.down, self.head = nn.Linear(n, d), nn.Linear(d, 8), nn.Linear(8, d), nn.Linear(d, m)
        self.norm1, self.norm2 = nn.RMSNorm(d, elementwise_affine=False), nn.RMSNorm(d, elementwise_affine=False)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.down(torch.tanh(self.up(self.norm1(x))))
        return self.head(self.norm2(x))


def mlp():
    """Linear(3,5) → ReLU (PositiveScaling(5), S(5)) → Linear(5,4) → identity (GL(4)) → Linear(4,2)."""
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4), nn.Identity(), nn.Linear(4, 2))


def setup(model, x, y):
    model = model.double()
    analysis = symalg.derive(symalg.trace(model, (x,)))
    params = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    wrt = tuple(n for n, _ in model.named_parameters())

    def loss(p):
        return F.mse_loss(torch.func.functional_call(model, p, (x,)), y)

    return model, analysis, params, wrt, loss


def flat(params, names):
    return torch.cat([params[n].reshape(-1) for n in names])


def unflat(vector, params, names):
    out, start = dict(params), 0
    for n in names:
        size = params[n].numel()
        out[n] = vector[start:start + size].reshape(params[n].shape)
        start += size
    return out


def jacobian(action, params, names, move):
    """Dense ``J = ∂(g·θ)/∂θ`` over ``names`` by ``torch.func.jacrev`` of the action."""
    def replayed(v):
        return flat(action.replay(unflat(v, params, names), [move]), names)

    return torch.func.jacrev(replayed)(flat(params, names))


def relative(a, b):
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------------------------------------ exactness

MODELS = {
    "mlp_gl_and_scaling": lambda: (mlp(), torch.randn(16, 3), torch.randn(16, 2)),
    "attention_block": lambda: (PreNormBlock(), torch.randn(3, 5, 8), torch.randn(3, 5, 8)),
    "conv_net": lambda: (SmallCNN(), torch.randn(6, 3, 8, 8), torch.randn(6, 5)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_exact_symmetries_keep_the_loss_for_teleports_of_any_size(name):
    # Theory: every derived symmetry is an exact invariance of the loss, so L(g·θ) = L(θ) for every g,
    # however far from the identity; only rounding remains (acceptance: 1e-9 relative in float64).
    model, analysis, params, wrt, loss = setup(*MODELS[name]())
    action = as_action(analysis)
    with torch.no_grad():
        base, size = float(loss(params)), flat(params, wrt).norm()
    for scale in (0.1, 1.0, 3.0):
        coords = torch.randn(action.dim)
        with torch.no_grad():
            moved = action(params, coords * (scale / coords.norm()))
            assert abs(float(loss(moved)) - base) <= 1e-9 * base
    result = teleport(action, params, loss, wrt=wrt, steps=10, lr=1.0, max_step=0.5, tolerance=1e-9)
    assert result.accepted and result.steps > 0
    assert result.relative_loss_change <= 1e-9
    assert result.objective_after > result.objective_before
    distance = (flat(result.params, wrt) - flat(params, wrt)).norm() / size
    assert distance > 0.1, f"the teleport barely moved ({distance:.1e}): the exactness check would be vacuous"


def test_teleport_through_scaled_dot_product_attention_matches_the_explicit_softmax():
    # torch's CPU flash kernel for F.scaled_dot_product_attention has no double backward, which the gradient of
    # the default objective ‖∇L‖² needs: teleport runs the model with the math kernel. The same weights with
    # softmax(QKᵀ/√d) V written out give the same teleport to rounding; the user's kernel choice comes back.
    x, y = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    results = []
    for explicit in (False, True):
        torch.manual_seed(1)
        model, analysis, params, wrt, loss = setup(HandAttention(8, 2, explicit), x, y)
        results.append(teleport(as_action(analysis), params, loss, wrt=wrt, steps=5))
    fused, explicit = results
    assert fused.accepted and fused.relative_loss_change <= 1e-9
    assert fused.objective_after > 2 * fused.objective_before
    assert fused.objective_after == pytest.approx(explicit.objective_after, rel=1e-9)
    assert torch.backends.cuda.flash_sdp_enabled()


def test_elements_reproduce_the_composed_teleport():
    # g = exp(Δ_K)⋯exp(Δ_1) per symmetry; applying the composed elements once must equal replaying the steps,
    # and compose=False (one element exp(Σcᵢ Bᵢ)) returns a single move.
    model, analysis, params, wrt, loss = setup(*MODELS["mlp_gl_and_scaling"]())
    action = as_action(analysis)
    result = teleport(action, params, loss, wrt=wrt, steps=4, lr=0.2)
    moved = dict(params)
    for symmetry in action.symmetries:
        moved = symmetry.apply(moved, action.elements(result.moves)[symmetry.label])
    for n in wrt:
        torch.testing.assert_close(moved[n], result.params[n], rtol=1e-12, atol=1e-12)
    # coordinates are on each group's algebra_basis(), concatenated in order
    coords = torch.randn(action.dim)
    expected, start = dict(params), 0
    for symmetry in action.continuous:
        basis = symmetry.group.algebra_basis()
        step = torch.tensordot(coords[start:start + len(basis)], basis, 1)
        expected = symmetry.apply(expected, symmetry.group.exp(step))
        start += len(basis)
    for n in wrt:
        torch.testing.assert_close(action(params, coords)[n], expected[n], rtol=1e-13, atol=1e-13)
    single = teleport(action, params, loss, wrt=wrt, steps=4, lr=0.2, compose=False)
    assert len(single.moves) == 1 and single.accepted and single.objective_after > single.objective_before


# ------------------------------------------------------------------------------------------------ theory

def test_gradient_transforms_by_the_inverse_transpose_jacobian_of_a_linear_action():
    # Theory (eq. 4.19): L(g·θ) = L(θ) ⇒ Jᵀ ∇L(g·θ) = ∇L(θ), J = ∂(g·θ)/∂θ (here constant: the action is linear).
    model, analysis, params, wrt, loss = setup(*MODELS["mlp_gl_and_scaling"]())
    action = as_action(analysis)
    move = Move(coords=torch.randn(action.dim) * 0.4)
    moved = action.replay(params, [move])
    J = jacobian(action, params, wrt, move)
    g0 = flat(gradients(loss, params, wrt, create_graph=False)[1], wrt)
    g1 = flat(gradients(loss, moved, wrt, create_graph=False)[1], wrt)
    assert relative(J.T @ g1, g0) < 1e-10
    assert relative(g1, torch.linalg.solve(J.T, g0)) < 1e-9
    assert relative(g1, g0) > 1e-2                        # not orthogonal: the gradient does change
    pulled = transform_cotangent(action, [move], moved, gradients(loss, params, wrt, create_graph=False)[1])
    assert relative(flat(pulled, wrt), g1) < 1e-10


def test_gradient_transforms_by_the_inverse_transpose_jacobian_of_a_nonlinear_action():
    # Same law for the conjugated (nonlinear) action on Rosenbrock: ∇f(g·x) = J(x)⁻ᵀ ∇f(x).
    fn = rosenbrock()
    x = torch.tensor([-0.7, 1.9])
    c = torch.tensor([0.8])
    J = torch.func.jacrev(lambda v: fn.action.act(v, c))(x)
    grad = torch.func.grad(fn.loss)
    assert relative(grad(fn.action.act(x, c)), torch.linalg.solve(J.T, grad(x))) < 1e-10
    action = as_action(fn)
    pulled = transform_cotangent(action, [Move(coords=c)], {"x": fn.action.act(x, c)}, {"x": grad(x)})
    assert relative(pulled["x"], grad(fn.action.act(x, c))) < 1e-10


def test_orthogonal_linear_symmetry_leaves_the_gradient_norm_unchanged():
    # Theory (Cor. 4.5.2): a linear action with orthogonal J gives ‖∇L(g·θ)‖ = ‖J⁻ᵀ∇L‖ = ‖∇L‖, so the gradient-norm
    # objective is constant on the orbit: its coordinate gradient vanishes and the teleport does not move.
    model, analysis, params, wrt, loss = setup(RMSStream(), torch.randn(10, 3), torch.randn(10, 2))
    stream = [s for s in analysis.symmetries if s.group.name == "O(6)"]
    assert len(stream) == 1
    action = SymmetryAction(tuple(stream))
    base = float(GradNorm()(params, loss, action, wrt).detach())
    for scale in (0.5, 2.0, 6.0):
        moved = action(params, torch.randn(action.dim) * scale)
        assert abs(float(loss(moved).detach()) / float(loss(params).detach()) - 1) < 1e-12
        assert abs(float(GradNorm()(moved, loss, action, wrt).detach()) / base - 1) < 1e-10
    z = torch.zeros(action.dim, requires_grad=True)
    (slope,) = torch.autograd.grad(GradNorm()(action(params, z), loss, action, wrt), z)
    assert float(slope.abs().max()) < 1e-10 * base
    result = teleport(action, params, loss, wrt=wrt, steps=3, lr=10.0)
    assert abs(result.objective_after / result.objective_before - 1) < 1e-10


def _quadratic_setup():
    A = torch.tensor([[3.0, 1.0, 0.0], [1.0, 2.0, 0.5], [0.0, 0.5, 1.0]])
    center = torch.tensor([1.0, -1.0, 0.5])
    fn = quadratic_form(A.tolist(), center=center.tolist())
    return A, center, fn


@pytest.mark.parametrize("maximize", [True, False], ids=["max", "min"])
def test_converged_teleport_aligns_the_gradient_with_the_newton_direction(maximize):
    # Theory (Lemma 4.5.10, Prop. 4.5.11): at a critical point of ‖∇L‖² on a level set, ∇L is an eigenvector of H,
    # so ∇L ∥ H⁻¹∇L. Strictly convex f = q + q²/4 with q = (x−c)ᵀA(x−c): invariant under the conjugated O(3)
    # action of q (transitive on level sets), non-quadratic (H = (1 + q/2)·2A + 2(∇q)(∇q)ᵀ/4). Any critical point
    # qualifies, so the minimum of the gradient norm aligns as well as the maximum.
    A, center, fn = _quadratic_setup()

    def f(x):
        q = fn.loss(x)
        return q + q ** 2 / 4

    def cosine(x):
        g = torch.func.grad(f)(x)
        newton = torch.linalg.solve(torch.autograd.functional.hessian(f, x), g)
        return float(g @ newton / (g.norm() * newton.norm()))

    x0 = torch.tensor([0.3, 0.2, -1.0])
    assert cosine(x0) < 0.99                                     # not aligned before the teleport
    result = teleport(as_action(fn), {"x": x0}, lambda p: f(p["x"]), steps=200, lr=0.01, backtrack=30,
                      maximize=maximize)
    assert result.accepted and result.relative_loss_change < 1e-12
    assert cosine(result.params["x"]) > 1 - 1e-8


@pytest.mark.parametrize("maximize", [True, False], ids=["max", "min"])
def test_quadratic_teleport_reaches_the_closed_form_gradient_norm(maximize):
    # Closed form (Lemma 4.5.6): on {(x−c)ᵀA(x−c) = ℓ}, ‖∇f‖² = 4‖A(x−c)‖² has max 4λ_max ℓ and min 4λ_min ℓ,
    # at eigenvectors of A; the conjugated O(3) action is transitive on the level set, so the teleport reaches them.
    A, center, fn = _quadratic_setup()
    x0 = torch.tensor([0.3, 0.2, -1.0])
    level = float(fn.loss(x0))
    eigenvalues = torch.linalg.eigvalsh(A)
    optimum = 4 * float(eigenvalues[-1] if maximize else eigenvalues[0]) * level
    result = teleport(as_action(fn), {"x": x0}, lambda p: fn.loss(p["x"]), steps=200, lr=0.01, backtrack=30,
                      maximize=maximize)
    assert result.accepted
    assert abs(result.objective_after / optimum - 1) < 0.01
    assert abs(result.objective_before / optimum - 1) > 0.1


@pytest.mark.parametrize("maximize", [True, False], ids=["max", "min"])
def test_booth_teleport_reaches_the_closed_form_gradient_norm(maximize):
    # Booth f = ‖B(x − (1, 3))‖², B = [[1, 2], [2, 1]]: a quadratic with A = BᵀB = [[5, 4], [4, 5]], eigenvalues 9, 1,
    # so max ‖∇f‖² = 36ℓ and min = 4ℓ on the level ℓ. From [Zhao2026]'s start (5, −5): ℓ = 144.
    fn = booth()
    x0 = torch.tensor([5.0, -5.0])
    level = float(fn.loss(x0))
    assert level == 144.0
    optimum = (36 if maximize else 4) * level
    result = teleport(as_action(fn), {"x": x0}, lambda p: fn.loss(p["x"]), steps=100, lr=1e-3, backtrack=30,
                      maximize=maximize)
    assert result.accepted and abs(result.objective_after / optimum - 1) < 0.01


def test_rosenbrock_teleport_reaches_a_local_maximum_of_its_orbit():
    # No closed form: the orbit of x is h⁻¹ of a circle, parametrised by the SO(2) angle (coordinates add up). The
    # gradient norm has several local maxima on it; gradient ascent must end at one: compare with a dense scan of
    # the angle within ±0.5 rad of where it ends.
    fn = rosenbrock()
    x0 = torch.tensor([-1.0, -1.0])
    result = teleport(as_action(fn), {"x": x0}, lambda p: fn.loss(p["x"]), steps=100, lr=1e-4, backtrack=30)
    end = float(sum(m.coords for m in result.moves))
    angles = end + torch.linspace(-0.5, 0.5, 2001)[:, None]
    scan = (torch.func.vmap(torch.func.grad(fn.loss))(fn.action.act(x0.expand(len(angles), 2), angles)) ** 2).sum(-1)
    assert result.accepted and result.relative_loss_change < 1e-10
    assert result.objective_after >= float(scan.max()) * (1 - 1e-9)
    assert result.objective_after > 10 * result.objective_before


# ------------------------------------------------------------------------------------------------ objectives

def test_curvature_of_eq_5_2_is_the_curvature_of_the_orbit_curve():
    # The conjugated action of the ellipse f = x₁² + a x₂² moves x along the ellipse with semi-axes (r, r/√a);
    # at (r cos s, (r/√a) sin s) its curvature is AB/(A² sin²s + B² cos²s)^{3/2} (A = r, B = r/√a), whatever the
    # parametrisation, so ψ with one curve (k = 1) must equal it.
    a = 4.0
    fn = ellipse(int(a))
    action = as_action(fn)
    r, s = 2.0, 0.7
    x = torch.tensor([r * math.cos(s), r / math.sqrt(a) * math.sin(s)])
    A_, B_ = r, r / math.sqrt(a)
    expected = A_ * B_ / (A_ ** 2 * math.sin(s) ** 2 + B_ ** 2 * math.cos(s) ** 2) ** 1.5
    assert abs(float(Curvature()({"x": x}, None, action, ["x"]).detach()) / expected - 1) < 1e-10


@pytest.mark.parametrize("maximize", [True, False], ids=["max", "min"])
def test_curvature_teleport_reaches_the_extreme_curvature_of_the_ellipse(maximize):
    # On the ellipse with semi-axes A > B the curvature ranges over [B/A², A/B²] (ends of the major/minor axis).
    fn = ellipse(4)
    x0 = torch.tensor([1.0, 0.5])
    A_ = math.sqrt(float(fn.loss(x0)))
    B_ = A_ / 2
    optimum = A_ / B_ ** 2 if maximize else B_ / A_ ** 2
    result = teleport(as_action(fn), {"x": x0}, lambda p: fn.loss(p["x"]), Curvature(), steps=100, lr=0.1,
                      backtrack=30, maximize=maximize)
    assert result.accepted and abs(result.objective_after / optimum - 1) < 0.01


def test_sharpness_of_eq_5_1_on_a_quadratic():
    # For L = ½θᵀHθ + bᵀθ, L(θ + td) + L(θ − td) − 2L(θ) = t² dᵀHd exactly, so the antithetic estimate is
    # mean_{t,d} t²dᵀHd/2, and for unit d uniformly on the sphere E[dᵀHd] = tr(H)/n.
    n = 6
    Q = torch.linalg.qr(torch.randn(n, n))[0]
    H = Q @ torch.diag(torch.linspace(0.5, 5.0, n)) @ Q.T
    b = torch.randn(n)

    def loss(p):
        return 0.5 * p["w"] @ H @ p["w"] + b @ p["w"]

    w = {"w": torch.randn(n)}
    sharp = Sharpness(displacements=(0.1, 0.2), directions=2000, seed=3)
    value = float(sharp(w, loss, None, ["w"]))
    expected = (0.1 ** 2 + 0.2 ** 2) / 2 / 2 * float(torch.trace(H)) / n
    assert abs(value / expected - 1) < 0.05


def test_sharpness_teleport_flattens_a_linear_network_at_a_global_minimum():
    # At a global minimum of least squares, W₂W₁ = W* (W₁ of full column rank, W₂ = W* W₁⁺), the Hessian is PSD and
    # sharpness ≈ t² tr(H)/(2n) > 0. An imbalanced factorisation (W₁ large, W₂ small) is sharp; GL(4) moves along the
    # minimum (loss fixed to rounding) towards flatter, more balanced factorisations.
    x, y = torch.randn(30, 3), torch.randn(30, 2)
    model, analysis, params, wrt, loss = setup(nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2)), x, y)
    solution = torch.linalg.lstsq(torch.cat([x, torch.ones(30, 1)], 1), y, driver="gelsd").solution.T      # [W* b*]
    w1 = 3 * torch.randn(4, 3)
    params = {"0.weight": w1, "0.bias": torch.zeros(4), "2.weight": solution[:, :3] @ torch.linalg.pinv(w1),
              "2.bias": solution[:, 3]}
    _, grads = gradients(loss, params, wrt, create_graph=False)
    assert float(flat(grads, wrt).norm()) < 1e-12                                       # a critical point
    sharp = Sharpness(displacements=(0.01,), directions=16)
    result = teleport(as_action(analysis), params, loss, sharp, wrt=wrt, steps=20, lr=1e3, backtrack=30)
    assert result.accepted and result.relative_loss_change < 1e-9
    assert 0 < result.objective_after < 0.5 * result.objective_before


def test_adagrad_metric_is_the_first_order_decrease_of_the_next_adagrad_step():
    # torch's Adagrad: G ← G + g², θ ← θ − lr g/(√G + ε); so ⟨g, θ − θ_next⟩/lr = Σ g²/(√(G + g²) + ε), which is
    # MetricGradNorm with optimizer_metric ([Zhao2026]'s ‖∇L‖_A of eq. 5.7, squared, with torch's ε).
    model, analysis, params, wrt, loss = setup(*MODELS["mlp_gl_and_scaling"]())
    named = dict(model.named_parameters())
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss(named).backward()
        opt.step()
    objective = MetricGradNorm(optimizer_metric(opt, named))
    value = float(objective(params, loss, None, wrt).detach())
    before = flat(named, wrt).detach().clone()
    _, grads = gradients(loss, params, wrt, create_graph=False)
    opt.zero_grad()
    loss(named).backward()
    opt.step()
    decrease = float(flat(grads, wrt) @ (before - flat(named, wrt).detach())) / 0.1
    assert abs(value / decrease - 1) < 1e-10
    assert abs(value / float(GradNorm()(params, loss, None, wrt).detach()) - 1) > 0.1     # a different metric


def test_discrete_search_finds_the_best_permutation_for_a_non_isotropic_metric():
    # Permutations act orthogonally, so ‖∇L‖² is the same on every permuted network; a diagonal metric P that
    # is not permutation-invariant makes them differ. S₃ has 6 elements: compare with all of them.
    model, analysis, params, wrt, loss = setup(nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 2)),
                                               torch.randn(12, 2), torch.randn(12, 2))
    perm = next(s for s in analysis.symmetries if isinstance(s.group, Permutations))
    action = SymmetryAction((perm,))
    metric = {n: torch.rand(params[n].shape) + 0.1 for n in wrt}
    objective = MetricGradNorm(metric)
    eye = torch.eye(3)
    elements = [eye[list(p)] for p in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))]
    values = [float(objective(perm.apply(params, g), loss, action, wrt).detach()) for g in elements]
    plain = [float(GradNorm()(perm.apply(params, g), loss, action, wrt).detach()) for g in elements]
    assert max(plain) - min(plain) < 1e-12 * max(plain)
    assert max(values) > 1.01 * min(values)
    found = teleport(action, params, loss, objective, wrt=wrt, steps=0, discrete="random", samples=64,
                     discrete_steps=3)
    assert found.accepted and abs(found.objective_after - max(values)) < 1e-12 * max(values)
    greedy = teleport(action, params, loss, objective, wrt=wrt, steps=0, discrete="greedy")
    assert greedy.objective_after >= greedy.objective_before


def test_data_dependent_action_teleports_a_sigmoid_network():
    # The data-dependent GL(6) action keeps the output at the batch exactly (batch k = width 6: QR frames of square
    # matrices, which torch can differentiate); the gradient norm grows along the non-compact group.
    model = nn.Sequential(nn.Linear(4, 6), nn.Sigmoid(), nn.Linear(6, 3)).double()
    net, params = FeedForward.of(model), dict(model.named_parameters())
    x, y = torch.randn(6, 4), torch.randn(6, 3)
    action = as_action(DataDependentAction(net), x=x, params=params)
    assert action.dim == 36 and action.is_group_action
    result = teleport(action, params, lambda p: F.mse_loss(net.forward(p, x), y), steps=10, lr=0.1, backtrack=20)
    assert result.accepted and result.relative_loss_change < 1e-9
    assert result.objective_after > 2 * result.objective_before


# ------------------------------------------------------------------------------------------------ rejection

def test_a_non_symmetry_is_rejected_and_the_original_parameters_come_back():
    model, analysis, params, wrt, loss = setup(*MODELS["mlp_gl_and_scaling"]())
    scale_all = FunctionAction(lambda p, c: {n: v * torch.exp(c[0]) for n, v in p.items()}, 1)
    result = teleport(scale_all, params, loss, wrt=wrt, steps=5, lr=0.1)
    assert not result.accepted and "tolerance" in result.reason
    assert all(result.params[n] is params[n] for n in params)
    assert result.best == 0 and result.moves == () and result.loss_after == result.loss_before
    assert result.steps == 5 and min(abs(v / result.loss_before - 1) for v in result.losses[1:]) > 1e-3


def test_iterates_of_the_approximate_action_that_break_the_loss_are_never_returned():
    # Eq. 4.16 keeps the loss only when σ(gA) has rank k; with batch k = 12 > width 6 each step changes the loss,
    # by more the larger the step. The fixed rate takes every step; the result is the best iterate within the
    # tolerance, and a teleport none of whose iterates kept the loss is rejected.
    model = nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 3)).double()
    net, params = FeedForward.of(model), dict(model.named_parameters())
    x, y = torch.randn(12, 4), torch.randn(12, 3)
    action = as_action(ApproximateTeleport(net, 0), x=x, params=params)
    assert not action.is_group_action

    def loss(p):
        return F.mse_loss(net.forward(p, x), y)

    small = teleport(action, params, loss, steps=3, lr=0.01, tolerance=1e-3)
    assert small.accepted and 0 < small.relative_loss_change < 1e-3
    large = teleport(action, params, loss, steps=5, lr=1.0, tolerance=1e-3)
    changes = [abs(v / large.loss_before - 1) for v in large.losses]
    assert large.steps == 5 and max(changes) > 1e-3                 # every step taken, some broke the tolerance
    assert large.accepted and large.relative_loss_change == pytest.approx(changes[large.best], rel=1e-9)
    assert large.relative_loss_change <= 1e-3
    assert large.objective_after == max(h for h, c in zip(large.history, changes) if c <= 1e-3)
    assert large.objective_after < max(large.history)                # the larger objective only off the level set
    strict = teleport(action, params, loss, steps=5, lr=1.0, tolerance=1e-5)
    assert not strict.accepted and "tolerance" in strict.reason and strict.params["0.weight"] is params["0.weight"]
    assert min(abs(v / strict.loss_before - 1) for v in strict.losses[1:]) > 1e-5


# ------------------------------------------------------------------------------------------------ optimizer

def _linear_net_optimizer(make_optimizer, action_filter=None, activation=nn.Identity):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), activation(), nn.Linear(4, 2)).double()
    x, y = torch.randn(20, 3), torch.randn(20, 2)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    symmetries = tuple(s for s in analysis.symmetries if s.group.is_continuous and
                       (action_filter is None or action_filter(s)))
    teleporter = Teleporter(SymmetryAction(symmetries), steps=3, lr=0.05, max_step=0.2)
    opt = TeleportingOptimizer(make_optimizer(model.parameters()), model, teleporter, model_loss(model, F.mse_loss),
                               lambda: (x, y), Schedule(at_steps=(1000,)), state="transform")
    return model, x, y, opt


def _train(model, x, y, opt, steps):
    trajectory = []
    for _ in range(steps):
        trajectory.append({n: p.detach().clone() for n, p in model.named_parameters()})
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return trajectory


def test_transformed_momentum_is_the_momentum_of_the_teleported_trajectory():
    # SGD momentum b = Σ_s μ^{T−1−s} ∇L(θ_s) is a cotangent: under a linear symmetry ∇L(g·θ_s) = J⁻ᵀ∇L(θ_s), so
    # "transform" must give exactly the buffer accumulated along the teleported trajectory g·θ_s.
    mu = 0.9
    model, x, y, opt = _linear_net_optimizer(lambda p: torch.optim.SGD(p, lr=0.01, momentum=mu))
    trajectory = _train(model, x, y, opt, 5)
    before = {n: opt.state[p]["momentum_buffer"].clone() for n, p in model.named_parameters()}
    [result] = opt.teleport()
    assert result.accepted and result.moves
    loss = model_loss(model, F.mse_loss)
    expected = {n: torch.zeros_like(v) for n, v in before.items()}
    for theta in trajectory:
        moved = opt.teleporter.action.replay(theta, result.moves)
        _, grads = gradients(lambda p: loss(p, (x, y)), moved, tuple(moved), create_graph=False)
        expected = {n: mu * expected[n] + grads[n] for n in expected}
    for n, p in model.named_parameters():
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], expected[n], rtol=1e-10, atol=1e-12)
    assert max(relative(opt.state[p]["momentum_buffer"], before[n]) for n, p in model.named_parameters()) > 1e-3


def test_adam_second_moments_transform_exactly_under_positive_scaling_and_are_kept_under_gl():
    # Positive scaling has a diagonal J: v ↦ (J⁻ᵀ)∘² v exactly (checked against the dense Jacobian); first moments
    # move by J⁻ᵀ. GL(4) mixes coordinates: a diagonal second moment has no covariant transform and is kept.
    model, x, y, opt = _linear_net_optimizer(lambda p: torch.optim.Adam(p, lr=0.01), activation=nn.ReLU,
                                             action_filter=lambda s: isinstance(s.group, PositiveScaling))
    _train(model, x, y, opt, 4)
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = {n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}
    v = {n: opt.state[p]["exp_avg_sq"].clone() for n, p in model.named_parameters()}
    [result] = opt.teleport()
    assert result.accepted and opt.teleporter.action.monomial_jacobian
    J = torch.func.jacrev(lambda w: flat(opt.teleporter.action.replay(unflat(w, params, names), result.moves), names))(
        flat(params, names))
    inverse_t = torch.linalg.inv(J).T
    state = {n: opt.state[p] for n, p in model.named_parameters()}
    assert relative(flat({n: s["exp_avg"] for n, s in state.items()}, names), inverse_t @ flat(m, names)) < 1e-10
    second_moments = flat({n: s["exp_avg_sq"] for n, s in state.items()}, names)
    assert relative(second_moments, inverse_t ** 2 @ flat(v, names)) < 1e-10
    assert relative(flat({n: s["exp_avg_sq"] for n, s in state.items()}, names), flat(v, names)) > 1e-3

    model, x, y, opt = _linear_net_optimizer(lambda p: torch.optim.Adam(p, lr=0.01))
    _train(model, x, y, opt, 4)
    v = {n: opt.state[p]["exp_avg_sq"].clone() for n, p in model.named_parameters()}
    m = {n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}
    [result] = opt.teleport()
    assert result.accepted and not opt.teleporter.action.monomial_jacobian
    for n, p in model.named_parameters():
        assert torch.equal(opt.state[p]["exp_avg_sq"], v[n])
    assert max(relative(opt.state[p]["exp_avg"], m[n]) for n, p in model.named_parameters()) > 1e-3


def test_keep_leaves_the_state_and_reset_makes_it_fresh():
    for make in (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), lambda p: torch.optim.Adam(p, lr=0.01),
                 lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.2)):
        # keep: every state tensor is unchanged while the parameters moved
        model, x, y, opt = _linear_net_optimizer(make)
        opt.state_mode = "keep"
        _train(model, x, y, opt, 3)
        saved = {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in model.named_parameters()}
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        [result] = opt.teleport()
        assert result.accepted
        assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
        for n, p in model.named_parameters():
            assert all(torch.equal(opt.state[p][k], v) for k, v in saved[n].items())
        # reset: for the moved tensors the next step equals that of a fresh optimizer at the teleported parameters;
        # tensors the teleport did not move (the output bias under GL(4) alone: the shear would move it) keep their
        # state
        model, x, y, opt = _linear_net_optimizer(make, action_filter=lambda s: not s.sheared)
        opt.state_mode = "reset"
        _train(model, x, y, opt, 3)
        [result] = opt.teleport()
        assert result.accepted and opt.teleporter.action.symmetries[0].tensors == ("0.weight", "0.bias", "2.weight")
        twin = nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2)).double()
        twin.load_state_dict(model.state_dict())
        fresh = make(twin.parameters())
        for net, optimizer in ((model, opt), (twin, fresh)):
            optimizer.zero_grad()
            F.mse_loss(net(x), y).backward()
            optimizer.step()
        for (n, p), q in zip(model.named_parameters(), twin.parameters()):
            if n == "2.bias":
                assert not torch.equal(p, q)                   # its momentum/moments were kept
            else:
                torch.testing.assert_close(p, q, rtol=1e-13, atol=1e-14)


def test_schedule_teleports_after_the_due_steps_and_epochs_on_several_batches():
    model, x, y, opt = _linear_net_optimizer(lambda p: torch.optim.SGD(p, lr=0.01))
    opt.schedule = Schedule(every=3, at_steps=(2,), at_epochs=(1,), batches=2)
    _train(model, x, y, opt, 7)                        # after steps 2, 3 and 6
    assert len(opt.results) == 3 * 2 and sum(r.accepted for r in opt.results) >= 4
    # six teleports in seven steps raise ‖∇L‖ until the next SGD step would overshoot: the guard rejects those
    assert all(r.accepted or "next-step check" in r.reason for r in opt.results)
    assert len(opt.end_epoch()) == 2 and opt.end_epoch() == []
    with pytest.raises(ValueError, match="count from 1"):
        Schedule(at_steps=(0,))


def test_state_dict_keeps_the_schedule_counters():
    model, x, y, opt = _linear_net_optimizer(lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
    opt.schedule = Schedule(every=4, batches=1)
    _train(model, x, y, opt, 3)
    opt.end_epoch()
    saved = opt.state_dict()
    assert saved["teleport"] == {"steps": 3, "epochs": 1} and "param_groups" in saved
    twin, _, _, resumed = _linear_net_optimizer(lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
    twin.load_state_dict(model.state_dict())
    resumed.schedule = Schedule(every=4, batches=1)
    resumed.load_state_dict(saved)
    assert (resumed.steps, resumed.epochs) == (3, 1)
    _train(twin, x, y, resumed, 1)                  # step 4 of the resumed run is due
    assert len(resumed.results) == 1 and resumed.results[0].accepted
    resumed.load_state_dict(torch.optim.SGD(twin.parameters(), lr=0.01).state_dict())   # a plain state dict
    assert (resumed.steps, resumed.epochs) == (4, 1)


def test_transform_refuses_state_it_does_not_know():
    model, x, y, opt = _linear_net_optimizer(lambda p: torch.optim.SGD(p, lr=0.01))
    p = next(model.parameters())
    opt.state[p]["mystery"] = torch.zeros_like(p)
    with pytest.raises(ValueError, match="mystery"):
        handle_state(opt.optimizer, opt.named, opt.teleporter.action, [], {n: q for n, q in model.named_parameters()})


def test_clear_errors_name_the_offending_argument():
    model, analysis, params, wrt, loss = setup(*MODELS["mlp_gl_and_scaling"]())
    with pytest.raises(ValueError, match="wrt"):
        teleport(as_action(analysis), params, loss, wrt=("nope",))
    with pytest.raises(ValueError, match="discrete"):
        Teleporter(as_action(analysis), discrete="exhaustive")
    with pytest.raises(ValueError, match="coords"):
        as_action(analysis)(params, torch.zeros(3))
    with pytest.raises(ValueError, match="batch x"):
        as_action(DataDependentAction(FeedForward.two_layer(torch.tanh)))
    with pytest.raises(TypeError, match="as_action"):
        as_action(42)
    with pytest.raises(ValueError, match="state must be"):
        TeleportingOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, Teleporter(as_action(analysis)),
                             model_loss(model, F.mse_loss), lambda: None, state="transport")


def test_adagrad_with_teleports_in_its_own_metric_on_the_leaky_relu_regression():
    # Sec. 5.4.1's setting (3-layer LeakyReLU(0.1) regression, 5×4 data, widths 6 and 7, AdaGrad): teleporting to
    # maximise ∇Lᵀ P ∇L with AdaGrad's actual preconditioner P. Each accepted teleport raises that objective and keeps
    # the loss (the scalings are exact); the Adagrad sums move as squared gradients, (J⁻ᵀ)∘² G (J diagonal).
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 6, bias=False), nn.LeakyReLU(0.1), nn.Linear(6, 7, bias=False),
                          nn.LeakyReLU(0.1), nn.Linear(7, 8, bias=False)).double()
    for p in model.parameters():
        nn.init.uniform_(p, 0, 1)
    x, y = torch.rand(4, 5), torch.rand(4, 8)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    opt = torch.optim.Adagrad(model.parameters(), lr=1e-2)
    metric = MetricGradNorm(optimizer_metric(opt, dict(model.named_parameters())))
    teleporter = Teleporter(as_action(analysis), metric, steps=5, lr=1e-2, max_step=0.1)
    wrapped = TeleportingOptimizer(opt, model, teleporter, model_loss(model, F.mse_loss), lambda: (x, y),
                                   Schedule(at_steps=(5, 10)), state="transform")
    _train(model, x, y, wrapped, 12)
    assert len(wrapped.results) == 2
    for result in wrapped.results:
        assert result.accepted and result.relative_loss_change < 1e-12
        assert result.objective_after > result.objective_before


def test_a_spec_analysis_with_symbolic_widths_acts_at_the_widths_of_params():
    symbolic = symalg.derive("linear(n, h) -> identity -> linear(h, m)")
    concrete = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)")
    params = {k: v.detach() for k, v in concrete.model_graph.model.named_parameters()}
    with pytest.raises(symalg.SpecError, match=r"symbolic widths.*params=params"):
        as_action(symbolic)
    action = as_action(symbolic, params=params)
    assert action.dim == as_action(concrete).dim == 16 + 4   # GL(4) and the shear of 0.bias into 2.bias
    moved = action(params, 0.3 * torch.randn(action.dim, dtype=torch.float64,
                                             generator=torch.Generator().manual_seed(0)))
    x = torch.randn(5, 3, dtype=torch.float64)
    forward = symalg.numeric.sampling.network_function(concrete.architecture)
    assert (moved["0.weight"] - params["0.weight"]).abs().max() > 0.1
    assert torch.allclose(forward(moved, x), forward(params, x), atol=1e-12)


# ------------------------------------------------------------------------------------------------ eq. 4.13 speed

def eq_4_13_problem(batch=6, seed=0):
    from symalg.applications.teleport_actions import ExactTeleport, leaky_relu
    from symalg.numeric.feedforward import FeedForward
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 8), leaky_relu(0.1), nn.Linear(8, 7), leaky_relu(0.1), nn.Linear(7, 3))
    net, params = FeedForward.of(model), {k: p.detach() for k, p in model.named_parameters()}
    x, y = torch.randn(batch, 10), torch.randint(3, (batch,))

    def loss(p):
        return F.cross_entropy(net.forward(p, x), y)

    return as_action(ExactTeleport(net, 0), x=x, params=params), params, loss


def test_first_order_has_the_value_and_gradient_of_the_exact_action_at_zero():
    action, params, loss = eq_4_13_problem()
    wrt = list(params)
    grads = []
    for moved in (action, action.first_order):
        z = torch.zeros(action.dim, requires_grad=True)
        objective = GradNorm()(moved(params, z), loss, action, wrt)
        grads.append((float(objective.detach()), torch.autograd.grad(objective, z)[0]))
    (exact_value, exact), (value, first) = grads
    assert value == pytest.approx(exact_value, rel=1e-13) and torch.allclose(first, exact, rtol=1e-10, atol=1e-12)
    c = torch.randn(action.dim) * 0.1                                # away from 0 it is the action itself
    assert all(torch.equal(a, b) for a, b in zip(action.first_order(params, c).values(), action(params, c).values()))


def test_exact_exponential_at_zero_keeps_higher_derivatives_for_curvature():
    # Curvature differentiates the action twice along a curve through 0: the polynomial stand-in for exp at 0
    # must give exp's second derivative (M²), which I + C would not
    action, params, _ = eq_4_13_problem()
    value = Curvature(curves=2, seed=3)(params, None, action, list(params))

    def through_torch(p, c):          # the same action through torch's differentiable matrix_exp
        return action._act(p, c, lambda C: (torch.linalg.matrix_exp(C), torch.linalg.matrix_exp(-C)))

    reference = Curvature(curves=2, seed=3)(params, None, FunctionAction(through_torch, action.dim), list(params))
    assert float(value) == pytest.approx(float(reference), rel=1e-9) and float(value) > 0


@pytest.mark.parametrize("settings", [dict(lr=1.0), {}], ids=["fixed rate", "default"])
def test_eq_4_13_teleport_keeps_the_loss_to_rounding(settings):
    action, params, loss = eq_4_13_problem()
    result = teleport(action, params, loss, GradNorm(), steps=10, **settings)
    assert result.accepted and result.steps == 10 and result.objective_after > result.objective_before
    assert max(abs(v / result.loss_before - 1) for v in result.losses) < 1e-12
    assert float(loss(result.params)) == pytest.approx(result.loss_before, rel=1e-12)
    replayed = action.replay(params, result.moves)
    assert all(torch.allclose(replayed[k], result.params[k], rtol=1e-12, atol=1e-13) for k in params)
    for k in range(1, len(result.moves) + 1):      # each recorded loss is the loss at that iterate
        with torch.no_grad():
            assert float(loss(action.replay(params, result.moves[:k]))) == pytest.approx(result.losses[k], rel=1e-13)
