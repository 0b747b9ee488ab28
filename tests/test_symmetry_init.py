"""Symmetry-aware initialisation: targets hit, function unchanged, unreachable targets rejected, and
the sharpness estimators against a dense Hessian."""
import pytest
import torch
from torch import nn
from torch.func import functional_call

import symalg
import symalg.numeric.sampling
from symalg.applications.flat_minima import model_loss
from symalg.catalogue.modules import Activation
from symalg.applications.symmetry_init import (UnreachableTarget, balance, hessian_trace, imbalance_element,
                                               scaling_element, set_conserved, top_hessian_eigenvalue)


def analysed(*layers, n_in):
    model = nn.Sequential(*layers).double()
    x = torch.randn(16, n_in)
    return model, x, symalg.derive(symalg.trace(model, (x,)))


def params_of(model):
    return {k: v.detach() for k, v in model.named_parameters()}


@torch.no_grad()
def function_change(model, params, x):
    reference = model(x)
    return float((functional_call(model, params, (x,)) - reference).abs().max() / reference.abs().max())


def test_balance_two_layer_linear_is_the_geometric_mean_and_keeps_the_function():
    model, x, analysis = analysed(nn.Linear(4, 5), nn.Identity(), nn.Linear(5, 5), n_in=4)
    theta = params_of(model)
    result = balance(analysis, theta)
    assert function_change(model, result.params, x) < 1e-10
    C = result.conserved["0"]
    assert float(C.abs().max()) < 1e-10
    # independently: S = gᵀg solves S P S = R, S = P^{-1/2} (P^{1/2} R P^{1/2})^{1/2} P^{-1/2}
    P = theta["0.weight"] @ theta["0.weight"].T + torch.outer(theta["0.bias"], theta["0.bias"])
    R = theta["2.weight"].T @ theta["2.weight"]

    def sqrtm(A, power=0.5):
        w, V = torch.linalg.eigh(A)
        return (V * w ** power) @ V.T

    S = sqrtm(P, -0.5) @ sqrtm(sqrtm(P) @ R @ sqrtm(P)) @ sqrtm(P, -0.5)
    g = result.elements["0"]
    assert torch.allclose(g.T @ g, S, atol=1e-10)
    assert torch.allclose(g, g.T, atol=1e-12) and bool(torch.linalg.eigvalsh(g).min() > 0)   # the SPD choice
    assert torch.allclose(S @ P @ S, R, atol=1e-10)
    norm = sum(float((p ** 2).sum()) for p in result.params.values())
    for _ in range(5):              # the balanced point is the minimum-norm point of the orbit (Kempf–Ness)
        M = torch.randn(5, 5)
        nearby = analysis.symmetries[0].apply(result.params, analysis.symmetries[0].group.exp(0.1 * (M + M.T)))
        assert sum(float((p ** 2).sum()) for p in nearby.values()) > norm


@pytest.mark.parametrize("lam", [-1.5, 0.7])
def test_scalar_imbalance_of_both_signs_on_a_deep_linear_chain(lam):
    layers = [m for _ in range(3) for m in (nn.Linear(4, 4), nn.Identity())] + [nn.Linear(4, 4)]
    model, x, analysis = analysed(*layers, n_in=4)
    theta = params_of(model)
    result = set_conserved(analysis, theta, lam)
    assert result.sweeps > 1                                        # the three sites are coupled
    assert function_change(model, result.params, x) < 1e-10
    for site, C in result.conserved.items():
        assert torch.allclose(C, lam * torch.eye(4), atol=1e-9), site
    replayed = theta                                                # one element of the product group per site
    for symmetry in analysis.symmetries:
        if not symmetry.sheared:    # the GL sites (a shear conserves nothing, so set_conserved leaves it out)
            replayed = symmetry.apply(replayed, result.elements[symmetry.site])
    for name in theta:
        assert torch.allclose(replayed[name], result.params[name], atol=1e-9)


def test_any_symmetric_target_is_reachable_when_both_parts_are_definite():
    model, x, analysis = analysed(nn.Linear(5, 3), nn.Identity(), nn.Linear(3, 4), n_in=5)
    A = torch.randn(3, 3)
    target = torch.diag(torch.tensor([-2.0, 0.0, 3.0])) + 0.3 * (A + A.T)
    result = set_conserved(analysis, params_of(model), {"0": target})
    assert torch.allclose(result.conserved["0"], target, atol=1e-10)
    assert function_change(model, result.params, x) < 1e-10


@pytest.mark.parametrize("lam", [-2.0, 0.0, 2.0])
def test_closed_form_stays_accurate_when_the_parts_are_ill_conditioned(lam, generator):
    """Condition numbers 1e6 and 1e4: the solver starts from the side where the target is positive
    (``x ≈ t`` instead of ``μ/|t|``); from the other side the error is 2e-8 (measured) at ``λ = ±2``."""
    def wishart(cond):
        Q = torch.linalg.qr(torch.randn(6, 6, generator=generator))[0]
        return (Q * torch.logspace(0, -torch.log10(torch.tensor(cond)).item(), 6)) @ Q.T

    P, R = 1e-4 * wishart(1e6), wishart(1e4)
    g = imbalance_element(P, R, lam * torch.eye(6))
    g_inv = torch.linalg.inv(g)
    C = g @ P @ g.T - g_inv.T @ R @ g_inv
    assert float((C - lam * torch.eye(6)).abs().max()) < 1e-9 * float(P.norm() + R.norm())


def test_inertia_limits_targets_when_a_part_is_singular():
    # h = 4 > m = 2: R = W2ᵀW2 has rank 2, so C keeps at least 2 positive eigenvalues
    model, x, analysis = analysed(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 2), n_in=3)
    theta = params_of(model)
    with pytest.raises(UnreachableTarget,
                       match=r"targets\['0'\].*at least 2 positive eigenvalues .* the target has 0\."):
        balance(analysis, theta)
    two_positive = torch.diag(torch.tensor([-1.0, -0.5, 0.2, 2.0]))
    assert torch.allclose(set_conserved(analysis, theta, {"0": two_positive}).conserved["0"], two_positive,
                          atol=1e-10)
    with pytest.raises(UnreachableTarget, match=r"at least 2 positive eigenvalues .* the target has 1\."):
        set_conserved(analysis, theta, {"0": torch.diag(torch.tensor([-1.0, -0.5, -0.2, 2.0]))})
    # mirror: no bias, n = 2 < h = 4 < m: P has rank 2, so C keeps at least 2 negative eigenvalues
    model, x, analysis = analysed(nn.Linear(2, 4, bias=False), nn.Identity(), nn.Linear(4, 6), n_in=2)
    with pytest.raises(UnreachableTarget, match="at least 2 negative eigenvalues"):
        set_conserved(analysis, params_of(model), 0.5)
    result = set_conserved(analysis, params_of(model), -0.5)
    assert torch.allclose(result.conserved["0"], -0.5 * torch.eye(4), atol=1e-10)
    assert function_change(model, result.params, x) < 1e-10
    # both parts singular (n, m < h): refused, with the necessary condition
    model, x, analysis = analysed(nn.Linear(2, 5, bias=False), nn.Identity(), nn.Linear(5, 2), n_in=2)
    with pytest.raises(UnreachableTarget, match="both the out part P .rank 2. and the in part R .rank 2. are singular"):
        balance(analysis, params_of(model))


def test_positive_scaling_hits_per_neuron_targets_by_the_closed_form():
    model, x, analysis = analysed(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2), n_in=3)
    theta = params_of(model)
    target = torch.tensor([-2.0, -0.1, 0.0, 0.0, 0.5, 3.0])
    result = set_conserved(analysis, theta, {"0": target})
    assert torch.allclose(result.conserved["0"], target, atol=1e-12)
    assert function_change(model, result.params, x) < 1e-12
    a = (theta["0.weight"] ** 2).sum(1) + theta["0.bias"] ** 2
    b = (theta["2.weight"] ** 2).sum(0)
    d = result.elements["0"]
    assert torch.allclose(a * d ** 2 - b / d ** 2, target, atol=1e-12)                  # a d² − b d⁻² = t
    assert torch.allclose(scaling_element(a, b, target), d, rtol=1e-12)


def test_positive_scaling_with_alpha_two_uses_the_right_equation():
    model, x, analysis = analysed(nn.Linear(3, 5), Activation("relu_pow", alpha=2), nn.Linear(5, 2), n_in=3)
    theta = params_of(model)
    target = torch.tensor([-1.0, -0.1, 0.0, 0.5, 2.0])
    result = set_conserved(analysis, theta, {"0": target})
    p = result.params
    q = (p["0.weight"] ** 2).sum(1) + p["0.bias"] ** 2 - 2 * (p["2.weight"] ** 2).sum(0)
    assert torch.allclose(q, target, atol=1e-12)
    assert function_change(model, result.params, x) < 1e-12


def test_dead_and_unread_neurons_limit_the_scaling_targets():
    model, x, analysis = analysed(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), n_in=3)
    with torch.no_grad():
        model[0].weight[1] = 0
        model[0].bias[1] = 0        # neuron 1 has no input: q_1 = −‖out‖² d⁻² < 0
        model[2].weight[:, 3] = 0   # neuron 3 is read by nobody: q_3 = ‖in‖² d² > 0
    theta = params_of(model)
    with pytest.raises(UnreachableTarget, match=r"targets\['0'\].*neuron 1.*ranges over \(−∞, 0\).*2 neuron"):
        balance(analysis, theta)
    result = set_conserved(analysis, theta, {"0": torch.tensor([0.0, -1.0, 0.0, 1.0])})
    assert torch.allclose(result.conserved["0"], torch.tensor([0.0, -1.0, 0.0, 1.0]), atol=1e-12)


def test_mixed_sites_traced_and_spec():
    layers = [nn.Linear(4, 4), nn.Identity(), nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4), nn.Identity(),
              nn.Linear(4, 4)]
    model, x, analysis = analysed(*layers, n_in=4)
    targets = {"0": 0.0, "2": torch.linspace(-1, 1, 6), "4": -0.3}
    result = set_conserved(analysis, params_of(model), targets)
    assert function_change(model, result.params, x) < 1e-10
    assert torch.allclose(result.conserved["2"], targets["2"], atol=1e-9)
    assert torch.allclose(result.conserved["4"], -0.3 * torch.eye(4), atol=1e-9)
    # A spec analysis: sites are named by the linear layer producing them; symbolic widths are read off params.
    spec = symalg.derive(symalg.parse("linear(n, h) -> identity -> linear(h, m) -> relu -> linear(m, k)"))
    concrete = spec.subs({"n": 5, "h": 4, "m": 6, "k": 3})
    theta = symalg.numeric.sampling.random_params(concrete.architecture)
    f = symalg.numeric.sampling.network_function(concrete.architecture)
    x = torch.randn(7, 5, dtype=torch.float64)
    for chain in (concrete, spec):
        result = set_conserved(chain, theta, {"0": 0.25, "2": -0.5})
        assert torch.allclose(result.conserved["0"], 0.25 * torch.eye(4, dtype=torch.float64), atol=1e-9)
        assert torch.allclose(result.conserved["2"], torch.full((6,), -0.5, dtype=torch.float64), atol=1e-9)
        assert torch.allclose(f(result.params, x), f(theta, x), atol=1e-12)
        assert not torch.allclose(result.params["0.weight"], theta["0.weight"])
    with pytest.raises(symalg.SpecError, match="'0.weight' is missing"):
        set_conserved(spec, {}, 0.0)


def test_target_arguments_are_checked():
    model, x, analysis = analysed(nn.Linear(3, 3), nn.Identity(), nn.Linear(3, 3), n_in=3)
    theta = params_of(model)
    with pytest.raises(ValueError, match=r"sites \['h9'\] have no GL or positive-scaling conserved quantity.*\['0'\]"):
        set_conserved(analysis, theta, {"h9": 0.0})
    with pytest.raises(ValueError, match=r"targets\['0'\]: expected a number or a finite tensor of shape \(3, 3\)"):
        set_conserved(analysis, theta, {"0": torch.zeros(3)})
    with pytest.raises(ValueError, match="target must be symmetric"):
        set_conserved(analysis, theta, {"0": torch.triu(torch.ones(3, 3))})
    with pytest.raises(ValueError, match="max_sweeps must be a positive integer, got 0"):
        set_conserved(analysis, theta, 0.0, max_sweeps=0)
    chain, _, chain_analysis = analysed(nn.Linear(3, 3), nn.Identity(), nn.Linear(3, 3), nn.Identity(), nn.Linear(3, 3),
                                        n_in=3)
    with pytest.raises(RuntimeError,
                       match="no convergence in max_sweeps=1 sweeps"):   # coupled: one sweep is not enough
        set_conserved(chain_analysis, params_of(chain), 0.3, max_sweeps=1)
    tanh, _, tanh_analysis = analysed(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3), n_in=3)
    with pytest.raises(ValueError, match="no GL or positive-scaling site"):
        balance(tanh_analysis, params_of(tanh))


def test_a_rescale_outside_the_symmetry_group_changes_the_function():
    """Negative controls: the balancing element of a linear net applied to the same weights under ReLU,
    and a rescale of W_in's rows that W_out does not undo."""
    linear, x, linear_analysis = analysed(nn.Linear(4, 5), nn.Identity(), nn.Linear(5, 5), n_in=4)
    relu = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 5)).double()
    relu.load_state_dict(linear.state_dict())
    theta = params_of(linear)
    moved = balance(linear_analysis, theta).params
    assert function_change(linear, moved, x) < 1e-10
    assert function_change(relu, moved, x) > 1e-2          # GL(5) is no symmetry of a ReLU site
    rows = dict(theta, **{"0.weight": theta["0.weight"] * torch.linspace(0.5, 2, 5)[:, None]})
    assert function_change(linear, rows, x) > 1e-2


def test_power_iteration_and_hutchinson_match_a_dense_hessian(generator):
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x, y = torch.randn(20, 3, generator=generator), torch.randn(20, 2, generator=generator)
    loss = model_loss(model, x, y)
    theta = params_of(model)
    sizes = [p.numel() for p in theta.values()]

    def flat_loss(vector):
        chunks = vector.split(sizes)
        return loss({k: c.reshape(p.shape) for (k, p), c in zip(theta.items(), chunks)})

    H = torch.autograd.functional.hessian(flat_loss, torch.cat([p.reshape(-1) for p in theta.values()]))
    eigenvalues = torch.linalg.eigvalsh(H)
    top = eigenvalues[eigenvalues.abs().argmax()]
    estimate = top_hessian_eigenvalue(loss, theta, max_iter=3000, rtol=1e-7, generator=generator)
    assert estimate.residual <= 1e-7
    assert abs(estimate.eigenvalue - float(top)) <= 1e-9 * abs(float(top))
    trace = hessian_trace(loss, theta, probes=400, generator=generator)
    sigma = (2 * ((H ** 2).sum() - (torch.diagonal(H) ** 2).sum()) / 400) ** 0.5
    assert abs(trace.value - float(torch.trace(H))) < 4 * float(sigma)
    assert 0.5 < trace.stderr / float(sigma) < 2
    separable = {"a": torch.randn(5, generator=generator), "b": torch.randn(2, 3, generator=generator)}
    exact = hessian_trace(lambda p: p["a"].cosh().sum() + (p["b"] ** 4).sum(), separable, probes=3)
    assert exact.value == pytest.approx(float(separable["a"].cosh().sum() + 12 * (separable["b"] ** 2).sum()),
                                        rel=1e-12)
    assert exact.stderr < 1e-12                               # a diagonal Hessian: zᵀHz = tr H for every z


def test_sharpness_at_a_scalar_minimum_is_sqrt_q2_plus_4y2():
    """``L = ½(y − u v)²``: at a minimum ``uv = y``, ``H = [[v², y], [y, u²]]``, ``λ_max = u² + v² = √(Q² + 4y²)``
    with the conserved ``Q = u² − v²`` ([Zhao2026]'s eq. 2.53 prints ``2√(Q² + 4)``: its trace is
    ``√(Q² + 4)`` and its determinant 0)."""
    model, x, analysis = analysed(nn.Linear(1, 1, bias=False), nn.Identity(), nn.Linear(1, 1, bias=False), n_in=1)
    x, y = torch.ones(1, 1), torch.full((1, 1), 2.0)
    loss = model_loss(model, x, y)
    for q in (-3.0, 0.0, 1.5):
        theta = set_conserved(analysis, params_of(model), q).params
        for _ in range(800):        # Q drifts by η² C(∇L) per step: O(η) in all over a fixed time
            gradient = torch.func.grad(loss)(theta)
            theta = {k: v - 0.01 * gradient[k] for k, v in theta.items()}
        reached = float(analysis.symmetries[0].conserved(theta)["C__0"])
        assert abs(reached - q) < 0.03
        sharpness = top_hessian_eigenvalue(loss, theta, generator=torch.Generator().manual_seed(0)).eigenvalue
        assert sharpness == pytest.approx((reached ** 2 + 16) ** 0.5, rel=1e-6)
