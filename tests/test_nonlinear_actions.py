"""Data-dependent nonlinear GL(h) actions ([Zhao2026] Sec. 2.4, App. A.3): frames, actions, cocycles,
batch-size limits and Lipschitz bounds, each over hundreds of seeded draws (vectorised).

The oracles are properties (R_z e₁ = z, output preserved at x, group axioms), independent constructions
(Givens products, Householder frames, least squares), never a printed formula: the printed ones appear
here only to show where they fail.
"""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.applications.nonlinear_actions import (Cocycle, DataDependentAction, FrameCocycle, check_cocycle, frame,
                                                   lipschitz_bounds, random_gl, rotation_matrix, spherical_coordinates,
                                                   spherical_frame, two_layer_action)
from symalg.errors import SpecError
from symalg.numeric.feedforward import FeedForward
from symalg.numeric.sampling import network_function

TOL = 1e-10
EPS = torch.finfo(torch.float64).eps
DRAWS = 300

# σ with σ(0) ≠ 0 (defined everywhere) and σ vanishing only at 0 (defined on the locus Vx ≠ 0)
ACTIVATIONS = {
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "tanh": torch.tanh,
    "leaky_relu": lambda z: F.leaky_relu(z, 0.1),
    "gelu": F.gelu,
    "silu": F.silu,
}


def per_draw(a, b):
    """max over draws of ‖a − b‖_F / ‖b‖_F (last two axes)."""
    return (torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b)).max().item()


def near_degenerate(z, huge=1e150):
    """Overwrite slices of the draws ``z (B, h)`` with near-degenerate vectors: exact zeros in the tail,
    in the head, in alternate entries; tiny tails; tiny and huge scales; ±e₁; ±e_h."""
    z = z.clone()
    b, h = z.shape
    step = b // 10
    z[:step, 1:] = 0
    z[step:2 * step, 1:] *= 1e-13
    z[2 * step:3 * step, :-1] = 0
    z[3 * step:4 * step] *= 1e-150
    z[4 * step:5 * step] *= huge
    z[5 * step:6 * step, ::2] = 0 if h > 1 else 1.0
    z[6 * step] = torch.eye(h)[0]
    z[6 * step + 1] = -torch.eye(h)[0]
    z[6 * step + 2] = -torch.eye(h)[-1]
    return z


# ------------------------------------------------------------------------------------------------ frames

def givens_product(beta):
    """G_n(β_n) ⋯ G_1(β_1), G_k rotating the plane (e_k, e_{k+1}): an independent construction of R(β)."""
    n = beta.shape[-1]
    r = torch.eye(n + 1).expand(*beta.shape[:-1], n + 1, n + 1)
    for k in range(n):
        g = torch.eye(n + 1).repeat(*beta.shape[:-1], 1, 1)
        c, s = beta[..., k].cos(), beta[..., k].sin()
        g[..., k, k], g[..., k, k + 1], g[..., k + 1, k], g[..., k + 1, k + 1] = c, -s, s, c
        r = g @ r
    return r


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_rotation_matrix_is_the_givens_product(n):
    beta = (torch.rand(DRAWS, n) - 0.5) * 4 * math.pi
    assert per_draw(rotation_matrix(beta), givens_product(beta)) < 1e-14


def test_rotation_matrix_matches_the_appendix_examples():
    b1, b2 = 0.3, -1.1
    c1, s1, c2, s2 = math.cos(b1), math.sin(b1), math.cos(b2), math.sin(b2)
    printed = torch.tensor([[c1, -s1, 0], [s1 * c2, c1 * c2, -s2], [s1 * s2, c1 * s2, c2]])
    assert torch.allclose(rotation_matrix(torch.tensor([b1, b2])), printed, atol=1e-15)


@pytest.mark.parametrize("h", [2, 3, 8])
def test_spherical_coordinates_reconstruct_z(h, generator):
    z = near_degenerate(torch.randn(DRAWS, h, generator=generator))
    r, a = spherical_coordinates(z)
    sines = torch.cat([torch.ones(DRAWS, 1), a.sin().cumprod(-1)], -1)  # ∏_{k<i} sin α_k
    cosines = torch.cat([a.cos(), torch.ones(DRAWS, 1)], -1)  # cos α_i, α_h = 0
    rebuilt = r[:, None] * sines * cosines
    assert ((rebuilt - z).norm(dim=-1) / z.norm(dim=-1)).max() < 1e-14
    assert (a[:, :-1] >= 0).all() and (a[:, :-1] <= math.pi).all()


@pytest.mark.parametrize("h", [1, 2, 3, 7, 16])
def test_spherical_frame_properties(h, generator):
    """R_z e₁ = z, R_zᵀ R_z = |z|² I, ‖R_z‖ = |z|, over 300 draws with near-degenerate ones."""
    z = near_degenerate(torch.randn(DRAWS, h, generator=generator))
    rz = spherical_frame(z)
    norm = z.norm(dim=-1)
    assert ((rz[..., 0] - z).norm(dim=-1) / norm).max() < TOL
    gram = rz.transpose(-1, -2) @ rz / norm[:, None, None] ** 2
    assert (gram - torch.eye(h)).abs().max() < TOL
    assert ((torch.linalg.matrix_norm(rz, ord=2) / norm - 1).abs()).max() < TOL


def test_spherical_frame_of_zero_raises_naming_the_argument():
    z = torch.randn(5, 3)
    z[3] = 0
    with pytest.raises(ValueError, match=r"my_vector = 0 \(draws \[3\]\)"):
        spherical_frame(z, name="my_vector")


def printed_main_text_frame(z):
    """[Zhao2026]'s main-text formula for R_z (Sec. 2.4), transcribed as printed."""
    h = z.shape[-1]
    r, a = spherical_coordinates(z)
    alpha = torch.cat([torch.zeros(1), a])  # α_0 = 0
    out = torch.zeros(h, h)
    for i in range(1, h + 1):
        for j in range(1, h + 1):
            head = torch.prod(alpha[1:i].sin())  # ∏_{k=1}^{i−1} sin α_k
            if j <= i and head != 0:
                out[i - 1, j - 1] = z[i - 1] * alpha[j - 1].cos() / torch.prod(alpha[1:j].sin())
            elif j == i + 1:
                out[i - 1, j - 1] = -r * alpha[i].sin()
    return out


def test_main_text_formula_agrees_generically_but_degenerates():
    z = torch.randn(4, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(printed_main_text_frame(z), spherical_frame(z), atol=1e-13)
    for z in (torch.tensor([2.0, 0.0, 0.0]), torch.tensor([1.0, -2.0, 0.0, 0.0]), torch.tensor([0.0, 3.0, 0.0])):
        assert torch.linalg.matrix_rank(printed_main_text_frame(z)) < z.numel()  # singular: no inverse
        assert torch.linalg.matrix_rank(spherical_frame(z)) == z.numel()


def test_spherical_frame_is_discontinuous_at_the_pole():
    """The appendix claims z ↦ R_z is continuous. For h = 3 no continuous frame exists (S² is not
    parallelisable); at z → e₁ the second column of R_z follows the direction of approach."""
    eps = 1e-12
    approach = [torch.tensor([1.0, eps * math.cos(p), eps * math.sin(p)]) for p in (0.0, math.pi / 2)]
    first, second = (spherical_frame(z) for z in approach)
    assert (first - second).abs().max() > 0.9


def test_qr_frame_properties(generator):
    for h, k in [(3, 2), (6, 3), (6, 6), (9, 4)]:
        a = torch.randn(DRAWS, h, k, generator=generator)
        a[:30] *= 1e-100
        f = frame(a, "a")
        assert per_draw(f[..., :k], a) < TOL
        assert torch.linalg.matrix_rank(f).min() == h


def test_frame_refuses_batches_beyond_the_width_and_dependent_columns():
    with pytest.raises(ValueError, match=r"batch_name: a batch of k = 4 points exceeds the width h = 3"):
        frame(torch.randn(3, 4), "batch_name")
    a = torch.randn(5, 2)
    with pytest.raises(ValueError, match="rank < k = 3"):
        frame(torch.cat([a, a[:, :1] * 2], -1))


# ------------------------------------------------------------------------------------ two-layer action

def draws(m, h, n, generator, k=None):
    u, v = torch.randn(DRAWS, m, h, generator=generator), torch.randn(DRAWS, h, n, generator=generator)
    x = torch.randn(DRAWS, k or 1, n, generator=generator)
    return u, v, x


def outputs(u, v, x, sigma):
    return u @ sigma(v @ x.transpose(-1, -2))  # papers' layout: columns are points


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_two_layer_action_preserves_the_output_at_x(name, generator):
    """Over 300 draws whose hidden pre-activations V x include near-degenerate vectors (x = e₁ and the first
    column of V is the chosen V x), with g far from the identity. (×10 is "huge" here: sigmoid(z < −745) and
    gelu(z < −38) underflow to 0 in float64, where the action is rightly undefined.)"""
    sigma = ACTIVATIONS[name]
    u, v, _ = draws(3, 6, 4, generator)
    v[..., 0] = near_degenerate(v[..., 0], huge=10.0)
    x = torch.eye(4)[0].expand(DRAWS, 1, 4)
    g = random_gl(6, scale=2.0, batch=(DRAWS,), generator=generator)
    u2, v2 = two_layer_action(u, v, g, x, sigma)
    assert torch.equal(v2, g @ v)
    assert per_draw(outputs(u2, v2, x, sigma), outputs(u, v, x, sigma)) < TOL


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "leaky_relu"])
def test_two_layer_action_group_axioms(name, generator):
    sigma = ACTIVATIONS[name]
    u, v, x = draws(2, 5, 3, generator)
    g1, g2 = (random_gl(5, scale=1.5, batch=(DRAWS,), generator=generator) for _ in range(2))
    u_id, v_id = two_layer_action(u, v, torch.eye(5).expand(DRAWS, 5, 5), x, sigma)
    assert per_draw(u_id, u) < TOL and torch.equal(v_id, v)
    u_12, v_12 = two_layer_action(*two_layer_action(u, v, g2, x, sigma), g1, x, sigma)
    u_p, v_p = two_layer_action(u, v, g1 @ g2, x, sigma)
    assert per_draw(u_12, u_p) < TOL and per_draw(v_12, v_p) < TOL


def test_two_layer_action_changes_the_function_away_from_x(generator):
    """Negative control: invariance holds at the chosen point only."""
    u, v, x = draws(2, 5, 3, generator)
    g = random_gl(5, scale=1.0, batch=(DRAWS,), generator=generator)
    u2, v2 = two_layer_action(u, v, g, x, torch.tanh)
    other = torch.randn(DRAWS, 1, 3, generator=generator)
    change = (torch.linalg.matrix_norm(outputs(u2, v2, other, torch.tanh) - outputs(u, v, other, torch.tanh))
              / torch.linalg.matrix_norm(outputs(u, v, other, torch.tanh)))
    assert change.median() > 1e-2


def test_action_is_differentiable_in_g():
    u, v, x = torch.randn(2, 3), torch.randn(3, 2), torch.randn(2)
    g = random_gl(3).requires_grad_()
    assert torch.autograd.gradcheck(lambda g: two_layer_action(u, v, g, x, torch.tanh)[0], (g,))


def test_sigmoid_action_is_defined_at_vx_zero_and_trivial_there():
    """σ(0) ≠ 0: the action exists on all of Param × Rⁿ; at Vx = 0, gVx = 0 so c = I."""
    u, v, g = torch.randn(2, 4), torch.randn(4, 3), random_gl(4, scale=1.0)
    u2, v2 = two_layer_action(u, v, g, torch.zeros(3), torch.sigmoid)
    assert torch.allclose(u2, u, atol=1e-14) and torch.equal(v2, g @ v)


def test_undefined_action_raises_naming_the_argument():
    u, v, g = torch.randn(2, 4), torch.randn(4, 3), random_gl(4, scale=1.0)
    with pytest.raises(ValueError, match=r"site 0 \(output of '0.weight'\): σ\(Z\) \(argument x\) = 0"):
        two_layer_action(u, v, g, torch.zeros(3), torch.tanh)  # off the non-degenerate locus V x ≠ 0
    v_pos, x_pos = torch.rand(4, 3) + 0.1, torch.rand(3) + 0.1
    with pytest.raises(ValueError, match=r"σ\(Z\) \(argument x\) = 0"):
        two_layer_action(u, v_pos, g, -x_pos, torch.relu)  # relu vanishes on V x ≤ 0
    with pytest.raises(ValueError, match=r"σ\(g Z\) \(argument g\) = 0"):
        two_layer_action(u, v_pos, -torch.eye(4), x_pos, torch.relu)  # g sends V x into relu's zero set
    with pytest.raises(ValueError, match=r"g\[0\]: shape \(3, 3\), expected \(…, 4, 4\)"):
        two_layer_action(u, v, torch.eye(3), x_pos, torch.tanh)


# ---------------------------------------------------------------------------------- multi-layer action

def mlp(generator):
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 7), nn.Sigmoid(), nn.Linear(7, 6),
                          nn.LeakyReLU(0.2), nn.Linear(6, 3), nn.Tanh())
    net = FeedForward.of(model)
    params = {name: torch.randn(DRAWS, *p.shape, generator=generator) for name, p in model.named_parameters()}
    return model, net, params


def test_the_view_of_a_sequential_reads_layers_and_activations():
    model, net, _ = mlp(None)
    assert net.weights == ("0.weight", "2.weight", "4.weight", "6.weight")
    assert net.biases == ("0.bias", "2.bias", "4.bias", "6.bias")
    z = torch.randn(6, 7, dtype=torch.float64) * 3
    for act, module in zip(net.activations + (net.output_activation,), (model[1], model[3], model[5], model[7])):
        assert torch.equal(act(z), module(z))  # the catalogue's torch function, bit for bit
    read = [(a.op, a.params) for a in net.activations]
    assert read == [("tanh", {}), ("sigmoid", {}), ("leaky_relu", {"slope": sp.Rational(1, 5)})]
    x = torch.randn(6, 4)
    params = {k: p.detach() for k, p in model.named_parameters()}
    assert torch.allclose(net.forward(params, x), model(x), atol=1e-14)
    shared = nn.Tanh()  # one module used at two sites
    assert [a.op for a in FeedForward.of(nn.Sequential(nn.Linear(2, 3), shared, nn.Linear(3, 3), shared,
                                                       nn.Linear(3, 1))).activations] == ["tanh", "tanh"]
    with pytest.raises(SpecError, match=r"layer 2 \(Tanh\): two activations in a row"):
        FeedForward.of(nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Tanh(), nn.Linear(2, 2)))


def test_the_view_keeps_modules_the_catalogue_lacks_and_puts_the_identity_between_linear_layers():
    odd = nn.Softsign()  # not a catalogue activation: the architecture stores the module, the view runs it
    net = FeedForward.of(nn.Sequential(nn.Linear(2, 3), odd, nn.Linear(3, 3), nn.Linear(3, 1)))
    assert net.activations[0] is odd and net.activations[1].op == "identity" and net.output_activation is None
    params = {"0.weight": torch.randn(3, 2), "0.bias": torch.randn(3), "2.weight": torch.randn(3, 3),
              "2.bias": torch.randn(3), "3.weight": torch.randn(1, 3), "3.bias": torch.randn(1)}
    x = torch.randn(4, 2)
    h = odd(x @ params["0.weight"].T + params["0.bias"]) @ params["2.weight"].T + params["2.bias"]
    assert torch.allclose(net.forward(params, x), h @ params["3.weight"].T + params["3.bias"])


def test_the_view_runs_an_overlay_activation():
    entry = symalg.CatalogueEntry("cube", lambda z: z ** 3, symalg.catalogue.activations.declare_odd())
    arch = symalg.parse("linear(2, 3) -> cube -> linear(3, 1)", catalogue=symalg.overlay({"cube": entry}))
    net = FeedForward.of(arch)
    z = torch.tensor([[-2.0, 0.5, 3.0]])
    assert net.activations[0].op == "cube" and torch.equal(net.activations[0](z), z ** 3)
    params, x = {"0.weight": torch.randn(3, 2), "0.bias": torch.randn(3), "2.weight": torch.randn(1, 3),
                 "2.bias": torch.randn(1)}, torch.randn(4, 2)
    expected = ((x @ params["0.weight"].T + params["0.bias"]) ** 3) @ params["2.weight"].T + params["2.bias"]
    assert torch.allclose(network_function(arch)(params, x), expected)


def test_a_shared_linear_layer_is_refused_by_name():
    shared = nn.Linear(3, 3)
    with pytest.raises(SpecError, match=r"layer 2 \(Linear\): the same module as layer 0"):
        FeedForward.of(nn.Sequential(shared, nn.Tanh(), shared))


@pytest.mark.parametrize("k", [1, 3])
def test_multilayer_action_preserves_outputs_and_scales_preactivations(k, generator):
    """Z_i' = g_i Z_i at every hidden site and the output is unchanged, for batches k ≤ every width."""
    _, net, params = mlp(generator)
    x = torch.randn(DRAWS, k, 4, generator=generator)
    gs = [random_gl(w, scale=1.0, batch=(DRAWS,), generator=generator) for w in (5, 7, 6)]
    moved = DataDependentAction(net)(params, gs, x)
    before, after = net.preactivations(params, x), net.preactivations(moved, x)
    for g, z, z2 in zip(gs + [None], before, after):
        expected = z if g is None else z @ g.transpose(-1, -2)
        assert per_draw(z2, expected) < TOL
    assert per_draw(net.forward(moved, x), net.forward(params, x)) < TOL


def test_multilayer_action_group_axioms(generator):
    _, net, params = mlp(generator)
    x = torch.randn(DRAWS, 2, 4, generator=generator)
    act = DataDependentAction(net)
    g1 = [random_gl(w, scale=1.0, batch=(DRAWS,), generator=generator) for w in (5, 7, 6)]
    g2 = {0: random_gl(5, scale=1.0, batch=(DRAWS,), generator=generator),
          2: random_gl(6, scale=1.0, batch=(DRAWS,), generator=generator)}  # identity at site 1
    g12 = [g1[0] @ g2[0], g1[1], g1[2] @ g2[2]]
    twice, once = act(act(params, g2, x), g1, x), act(params, g12, x)
    ident = act(params, [torch.eye(w).expand(DRAWS, w, w) for w in (5, 7, 6)], x)
    for name in params:
        a, b = (t if t.dim() == 3 else t.unsqueeze(-1) for t in (twice[name], once[name]))
        assert per_draw(a, b) < TOL, name
        a, b = (t if t.dim() == 3 else t.unsqueeze(-1) for t in (ident[name], params[name]))
        assert per_draw(a, b) < TOL, name


def test_site_elements_validation():
    _, net, params = mlp(None)
    with pytest.raises(ValueError, match="single matrix is ambiguous for 3 hidden sites"):
        net.site_elements(torch.eye(5))
    with pytest.raises(ValueError, match=r"sites \[3\] out of range"):
        net.site_elements({3: torch.eye(5)})
    with pytest.raises(ValueError, match="2 elements for 3 hidden sites"):
        net.site_elements([None, None])


# ----------------------------------------------------------------------------------- batch-size limits

def best_residual(u, v, g, x, sigma):
    """min over U' of ‖U' σ(gVX) − U σ(VX)‖ / ‖U σ(VX)‖ (least squares, columns are points)."""
    target = outputs(u, v, x, sigma)
    b = sigma(g @ v @ x.transpose(-1, -2))
    sol = torch.linalg.lstsq(b.transpose(-1, -2), target.transpose(-1, -2), driver="gelsd").solution.transpose(-1, -2)
    return torch.linalg.matrix_norm(sol @ b - target) / torch.linalg.matrix_norm(target)


def test_batch_limit_is_the_width(generator):
    """k ≤ h: the frame action preserves all k outputs (to ~ε·cond σ(gVX): QR frames are inverted; for
    k = 1 the spherical frame has condition number 1). k > h: no U' with V' = gV does (even the least-squares
    best misses), and the action refuses the batch naming x."""
    h = 4
    for k in (1, 2, 4):
        u, v, x = draws(3, h, 6, generator, k=k)
        g = random_gl(h, scale=1.0, batch=(DRAWS,), generator=generator)
        u2, v2 = two_layer_action(u, v, g, x, torch.tanh)
        before, after = outputs(u, v, x, torch.tanh), outputs(u2, v2, x, torch.tanh)
        error = torch.linalg.matrix_norm(after - before) / torch.linalg.matrix_norm(before)
        cond = torch.linalg.cond(torch.tanh(g @ v @ x.transpose(-1, -2)))
        assert (error <= 256 * EPS * cond).all()
        assert error[cond < 1e3].max() < TOL and (cond < 1e3).sum() > DRAWS // 2
        assert best_residual(u, v, g, x, torch.tanh).max() < 1e-9
    for k in (5, 8):
        u, v, x = draws(3, h, 6, generator, k=k)
        g = random_gl(h, scale=1.0, batch=(DRAWS,), generator=generator)
        assert best_residual(u, v, g, x, torch.tanh).min() > 1e-6
        with pytest.raises(ValueError, match=rf"argument x\): a batch of k = {k} points exceeds the width h = 4"):
            two_layer_action(u, v, g, x, torch.tanh)


def test_full_rank_counterexamples_of_example_a37():
    """Column-wise sigmoid, tanh and leaky ReLU send these full-rank Z to singular σ(Z) (Example A.3.7,
    with the leaky ReLU written correctly as max(z, 0) + s·min(z, 0)); the batched action then has no frame
    for a g reaching such a Z, and says so naming g. (g and g⁻¹Z are exact in floating point.)"""
    s = 0.25
    half, shear = 2 * torch.eye(2), torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    cases = [(torch.sigmoid, torch.logit(torch.tensor([[0.2, 0.4], [0.4, 0.8]])), half),
             (torch.tanh, torch.atanh(torch.tensor([[0.2, 0.4], [0.4, 0.8]])), half),
             (lambda z: F.leaky_relu(z, s), torch.tensor([[s, -1.0], [-1.0, s]]), shear)]
    for sigma, z, g in cases:
        assert abs(torch.linalg.det(z)) > 1e-2 and abs(torch.linalg.det(sigma(z))) < 1e-14
        x = torch.linalg.solve(g, z).T  # rows: V X = g⁻¹Z with V = I, so g V X = Z
        assert torch.equal(g @ x.T, z) and abs(torch.linalg.det(sigma(x.T))) > 1e-3
        with pytest.raises(ValueError, match=r"σ\(g Z\) \(argument g\) has rank < k = 2"):
            two_layer_action(torch.randn(3, 2), torch.eye(2), g, x, sigma)


# -------------------------------------------------------------------------------------------- cocycles

@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("name", ["sigmoid", "tanh", "leaky_relu"])
def test_frame_cocycle_satisfies_both_axioms_and_equivariance(name, k, generator):
    """(For k > 1 the errors grow like ε·cond σ(gZ); g within exp(±1) keeps these draws well conditioned.)"""
    sigma = ACTIVATIONS[name]
    g1, g2 = (random_gl(5, scale=1.0, batch=(DRAWS,), generator=generator) for _ in range(2))
    z = torch.randn(DRAWS, 5, k, generator=generator)
    result = check_cocycle(FrameCocycle(sigma), g1, g2, z, sigma)
    assert result.passed and result.draws == DRAWS, str(result)


def test_wrong_cocycles_fail_the_axiom_they_break(generator):
    sigma = torch.tanh
    g1, g2 = (random_gl(4, scale=1.0, batch=(DRAWS,), generator=generator) for _ in range(2))
    z = torch.randn(DRAWS, 4, 1, generator=generator)

    def frame_of(a):
        return spherical_frame(sigma(a)[..., 0])

    swapped = check_cocycle(lambda g, a: torch.linalg.solve(frame_of(a), frame_of(g @ a)), g1, g2, z, sigma)
    assert swapped.identity_error < TOL and swapped.composition_error > 1e-3 and not swapped.passed
    unnormalised = check_cocycle(lambda g, a: frame_of(g @ a) @ frame_of(a).transpose(-1, -2), g1, g2, z, sigma)
    assert unnormalised.identity_error > 1e-3 and not unnormalised.is_cocycle
    linear = check_cocycle(lambda g, a: g, g1, g2, z, sigma)  # π(g) = g: a cocycle, not an equivariance of tanh
    assert linear.is_cocycle and linear.equivariance_error > 1e-2 and not linear.passed
    assert "FAIL" in str(linear) and "PASS" in str(check_cocycle(FrameCocycle(sigma), g1, g2, z, sigma))


def householder_frame(a, name="a"):
    """|z| H with H the reflection sending e₁ to z/|z|: another frame (k = 1), unrelated to the spherical one."""
    z = a[..., 0]
    r = z.norm(dim=-1, keepdim=True)
    w = z / r - torch.eye(z.shape[-1])[0]
    w = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return r[..., None] * (torch.eye(z.shape[-1]) - 2 * w[..., :, None] * w[..., None, :])


def test_a_user_supplied_cocycle_drives_the_action(generator):
    """Any cocycle works: the Householder frame gives a different but valid action."""
    sigma = torch.sigmoid
    c = FrameCocycle(sigma, frame=householder_frame)
    g1, g2 = (random_gl(5, scale=1.0, batch=(DRAWS,), generator=generator) for _ in range(2))
    assert check_cocycle(c, g1, g2, torch.randn(DRAWS, 5, 1, generator=generator), sigma).passed
    u, v, x = draws(3, 5, 4, generator)
    u2, v2 = two_layer_action(u, v, g1, x, sigma, cocycle=c)
    u3, _ = two_layer_action(u, v, g1, x, sigma)
    assert per_draw(outputs(u2, v2, x, sigma), outputs(u, v, x, sigma)) < TOL
    assert per_draw(u2, u3) > 1e-3  # a different action
    plain = Cocycle(lambda g, a: c(g, a))  # a bare function: inverse by a linear solve
    assert per_draw(two_layer_action(u, v, g1, x, sigma, cocycle=plain)[0], u2) < TOL


# -------------------------------------------------------------------------------------------- Lipschitz

@pytest.mark.parametrize("name,eta", [("tanh", 1.0), ("sigmoid", 0.25), ("leaky_relu", 1.0)])
def test_lipschitz_bound_holds_and_equals_the_proposition(name, eta, generator):
    sigma = ACTIVATIONS[name]
    samples = torch.randn(64, 3, generator=generator)
    for _ in range(12):
        u, v, x = torch.randn(2, 5, generator=generator), torch.randn(5, 3, generator=generator), torch.randn(3)
        g = random_gl(5, scale=1.5, generator=generator)
        b = lipschitz_bounds(u, v, g, x, sigma, eta, samples=samples)
        assert b.holds, str(b)
        def op(a):
            return torch.linalg.matrix_norm(a, ord=2)
        printed = eta * op(u) * op(v) * sigma(v @ x).norm() * op(g) / sigma(g @ v @ x).norm()  # Prop. 2.4.2
        assert abs(b.bound / printed - 1) < 1e-12
        assert 0.05 < b.empirical / b.bound <= 1  # not vacuous


def test_lipschitz_bound_is_attained_and_the_printed_general_form_is_not_a_bound():
    """σ = id, U = Vᵀ, g = λI: the action gives back F, whose constant ‖V‖² equals the bound. The printed
    general form η‖U‖‖V‖‖c(g, Vx)⁻¹‖ (without ‖g‖) would claim ‖V‖²/λ."""
    v, lam = torch.randn(4, 3, generator=torch.Generator().manual_seed(7)), 10.0
    b = lipschitz_bounds(v.T, v, lam * torch.eye(4), torch.randn(3), lambda z: z, 1.0, samples=torch.randn(8, 3))
    norm2 = torch.linalg.matrix_norm(v, ord=2).item() ** 2
    assert b.empirical == pytest.approx(norm2, rel=1e-12) and b.bound == pytest.approx(norm2, rel=1e-12)
    printed_general = b.bound / lam
    assert b.empirical > 5 * printed_general


@pytest.mark.slow
@pytest.mark.parametrize("h", [32, 64])
def test_frames_and_actions_at_larger_widths(h, generator):
    z = near_degenerate(torch.randn(2000, h, generator=generator))
    rz = spherical_frame(z)
    norm = z.norm(dim=-1)
    assert ((rz[..., 0] - z).norm(dim=-1) / norm).max() < TOL
    assert (rz.transpose(-1, -2) @ rz / norm[:, None, None] ** 2 - torch.eye(h)).abs().max() < TOL
    u, v, x = torch.randn(500, 4, h), torch.randn(500, h, 9), torch.randn(500, 5, 9)
    g = random_gl(h, scale=2.0, batch=(500,))
    u2, v2 = two_layer_action(u, v, g, x, torch.tanh)
    assert per_draw(outputs(u2, v2, x, torch.tanh), outputs(u, v, x, torch.tanh)) < TOL


def test_float32_uses_its_own_tolerance(generator):
    u, v, x = (t.float() for t in draws(3, 6, 4, generator))
    g = random_gl(6, batch=(DRAWS,), generator=generator, dtype=torch.float32)
    u2, v2 = two_layer_action(u, v, g, x, torch.tanh)
    assert per_draw(outputs(u2, v2, x, torch.tanh), outputs(u, v, x, torch.tanh)) < 1e-4
    assert check_cocycle(FrameCocycle(torch.tanh), g, g, v @ x.mT, torch.tanh).tol == 1e-4


@pytest.mark.cuda
def test_action_on_cuda(generator):
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 5), nn.Sigmoid(), nn.Linear(5, 2)).double().cuda()
    net, params = FeedForward.of(model), dict(model.named_parameters())
    x = torch.randn(3, 4, dtype=torch.float64, device="cuda")
    gs = [random_gl(w, generator=generator, device="cuda") for w in (6, 5)]
    moved = DataDependentAction(net)(params, gs, x)
    assert moved["2.weight"].device.type == "cuda"
    assert (net.forward(moved, x) - model(x)).abs().max() < 1e-10


@pytest.mark.slow
def test_example_script_runs_and_reports_small_errors():
    script = Path(__file__).resolve().parent.parent / "examples" / "nonlinear_actions.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    values = {k: float(v) for k, v in re.findall(r"(\w+)=([-+0-9.eE]+)", result.stdout)}
    for key in ("frame_max_error", "two_layer_max_error", "multilayer_max_error"):
        assert values[key] < TOL, key
