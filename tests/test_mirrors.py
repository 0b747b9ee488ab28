"""Mirror symmetries: enumeration from derived groups (both front ends), the orthogonality and projection laws,
certification of their consequences, thresholds against closed forms, and the negative controls."""
from __future__ import annotations

import math

import pytest
import torch

import symalg
from symalg.applications.mirrors import (certify, gd_stability, lyapunov, per_sample_loss,
                                         weight_decay_threshold)
from symalg.catalogue.groups import ComplexScaling, GeneralLinear, Orthogonal, PositiveScaling, Translations


@pytest.fixture(scope="module", autouse=True)
def _float64_models():
    """float64 for this module's module-scoped models too (conftest's per-test default comes after them); restored
    afterwards, so that no other module sees it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.named_parameters()}


def _data(n: int, d_in: int, d_out: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randn(n, d_out, generator=g)


def _dense(mirror, params):
    """The linear maps ``R`` and ``θ ↦ Oᵀθ`` on the moved tensors as dense matrices (small models only)."""
    names = list(mirror.tensors)
    sizes = [params[t].numel() for t in names]
    columns_r, columns_o = [], []
    for i in range(sum(sizes)):
        e = torch.zeros(sum(sizes))
        e[i] = 1
        point = dict(params)
        for t, chunk in zip(names, e.split(sizes)):
            point[t] = chunk.reshape(params[t].shape)
        columns_r.append(torch.cat([mirror.reflect(point)[t].reshape(-1) for t in names]))
        columns_o.append(torch.cat([c.reshape(-1) for c in mirror.coordinates(point).values()]))
    return torch.stack(columns_r, 1), torch.stack(columns_o, 1)


@pytest.fixture(scope="module")
def tanh_traced():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    x, y = _data(6, 3, 2)
    return model, (x, y), symalg.mirrors(symalg.derive(symalg.trace(model, (x,))))


# -- enumeration ----------------------------------------------------------------------------------------------
def test_spec_and_traced_front_ends_give_the_same_mirrors(tanh_traced):
    _, _, traced = tanh_traced
    spec = symalg.mirrors(symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)"))
    assert [m.label for m in spec] == [m.label for m in traced]
    assert [m.constraint for m in spec] == [m.constraint for m in traced]
    kinds = [m.constraint.split(":")[0] for m in traced]
    assert kinds[:4] == [f"dead unit {i}" for i in range(4)]
    assert kinds[4] == "identical neurons 0 and 1 (homogeneity)"


def test_every_mirror_is_an_orthogonal_involution_with_p_equal_oot(tanh_traced):
    model, _, found = tanh_traced
    params = _params(model)
    for mirror in found:
        R, C = _dense(mirror, params)
        eye = torch.eye(len(R))
        assert torch.allclose(R @ R, eye, atol=1e-12) and torch.allclose(R.T @ R, eye, atol=1e-12)
        assert torch.allclose(C @ C.T, torch.eye(len(C)), atol=1e-12)          # O has orthonormal columns
        assert torch.allclose(C.T @ C, (eye - R) / 2, atol=1e-12)              # P = O Oᵀ = (I − R)/2
        assert len(C) == mirror.rank() == int(torch.linalg.matrix_rank((eye - R) / 2))


def test_dead_unit_and_identical_neurons_read_off_the_fixed_point(tanh_traced):
    model, _, found = tanh_traced
    params = _params(model)
    dead, swap = found.mirrors[2], found.mirrors[4]
    fixed = dead.fixed_point(params)
    assert float(fixed["0.weight"][2].abs().max()) == 0 and float(fixed["0.bias"][2]) == 0
    assert float(fixed["2.weight"][:, 2].abs().max()) == 0
    assert torch.equal(fixed["0.weight"][0], params["0.weight"][0])
    fixed = swap.fixed_point(params)
    assert torch.equal(fixed["0.weight"][0], fixed["0.weight"][1])
    assert torch.equal(fixed["2.weight"][:, 0], fixed["2.weight"][:, 1])
    assert float(swap.residual(fixed)) < 1e-15
    expected = math.sqrt(sum(float(((u[0] - u[1]) ** 2).sum()) / 2 for u in
                             (params["0.weight"], params["0.bias"].unsqueeze(-1), params["2.weight"].T)))
    assert abs(float(swap.residual(params)) - expected) < 1e-12


def test_relu_site_has_no_mirror_and_says_why():
    found = symalg.mirrors(symalg.derive("linear(2, 3) -> relu -> linear(3, 1)"))
    assert [label for label, _ in found.without] == ["PositiveScaling(3, alpha=1) on 0"]
    assert "no element of order two" in found.without[0][1]
    assert {m.constraint.split(" (")[0] for m in found} == {"identical neurons 0 and 1", "identical neurons 0 and 2",
                                                            "identical neurons 1 and 2"}
    assert PositiveScaling(3).mirrors() == [] and Translations(3).mirrors() == []


def test_linear_site_mirrors_sign_householder_half_turn_and_oblique():
    found = symalg.mirrors(symalg.derive("linear(3, 4) -> linear(4, 2)"))
    by_name = {m.name.split(" (")[0].split(",")[0]: m for m in found}
    householder = by_name["Householder reflection I − 2nnᵀ"]
    assert householder.basis.shape == (4, 1) and householder.constraint.startswith("low rank")
    half = by_name["half-turn exp(πM/ϑ)"]
    assert half.basis.shape == (4, 2) and "rank 2" in half.constraint
    oblique = by_name["oblique involution I − 2uvᵀ"]
    assert not oblique.gives_constraint and oblique.reason.startswith("not orthogonal")
    assert oblique not in found.constraints
    width_one = symalg.mirrors(symalg.derive("linear(5, 1, bias=False) -> linear(1, 1, bias=False)"))
    assert width_one.mirrors[0].constraint.startswith("sparsity")
    assert "Shears(4) on 0" in [label for label, _ in found.without]


def test_half_turns_of_compact_generators():
    M = Orthogonal(4).algebra_basis()[1] * 2.5 + 0 * torch.eye(4)
    g = Orthogonal(4).half_turn(M)
    assert torch.allclose(g @ g, torch.eye(4), atol=1e-14) and torch.allclose(g.T @ g, torch.eye(4), atol=1e-14)
    assert abs(float(torch.trace(g)) - 0) < 1e-14                                  # −I on one plane of R⁴
    with pytest.raises(ValueError, match="same modulus"):
        Orthogonal(4).half_turn(Orthogonal(4).algebra_basis()[0] + 2 * Orthogonal(4).algebra_basis()[5])
    plane = dict(ComplexScaling(4).mirrors())["half-turn of plane 1"]
    assert torch.equal(plane.diagonal(), torch.tensor([1.0, -1.0, 1.0, -1.0]))
    assert GeneralLinear(3).mirrors()[-1][0].startswith("oblique")


def test_attention_and_lora_mirrors_certify():
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(4, 2, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    class Lora(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base, self.A, self.B = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2, bias=False), \
                torch.nn.Linear(2, 4, bias=False)

        def forward(self, x):
            return self.base(x) + self.B(self.A(x))

    torch.manual_seed(1)
    for model, x in ((Attention().double(), torch.randn(3, 3, 4)), (Lora().double(), torch.randn(5, 4))):
        found = symalg.mirrors(symalg.derive(symalg.trace(model, (x,))))
        assert found.constraints, type(model).__name__
        y = torch.randn_like(model(x))
        loss, params = per_sample_loss(model), _params(model)
        for mirror in found.constraints[:6]:
            cert = certify(mirror, loss, params, (x, y), steps=2)
            assert cert.holds(1e-9), (mirror.label, cert)
    sites = {m.symmetry.site for m in found.constraints}
    assert "A" in sites


def test_symbolic_widths_refused():
    with pytest.raises(symalg.SpecError, match="symbolic"):
        symalg.mirrors(symalg.derive("linear(n, h) -> tanh -> linear(h, m)"))


# -- LaTeX and lowering --------------------------------------------------------------------------------------
def test_lowered_callables_match_the_numeric_maps(tanh_traced):
    model, _, found = tanh_traced
    params = _params(model)
    for mirror in (found.mirrors[1], found.mirrors[5]):
        coords = mirror.lowered_call("coordinates", params)
        for key, value in mirror.coordinates(params).items():
            assert torch.allclose(coords[key], value, atol=1e-15)
        r2 = mirror.lowered_call("residual", params)["r2"]
        assert abs(float(r2) - float(mirror.residual(params)) ** 2) < 1e-12
        P = mirror.lowered_call("P", params)
        projected = mirror.project(params)
        assert torch.allclose(P["0.weight"], projected["0.weight"], atol=1e-15)
        assert torch.allclose(P["2.weight"], projected["2.weight"].T, atol=1e-15)   # the unfolded (h × r) layout
    source = found.mirrors[0].lowered["coordinates"].source
    assert "torch.matmul(V.transpose(-1, -2), _0_weight)" in source
    assert found.mirrors[0].latex().endswith(r"V^{T} W_{0} = 0, \; V^{T} b_{0} = 0, \; V^{T} W_{2}^{T} = 0")


# -- certification -------------------------------------------------------------------------------------------
def test_certify_tanh_mirrors_and_adam_compatibility(tanh_traced):
    model, batch, found = tanh_traced
    loss, params = per_sample_loss(model), _params(model)
    for mirror in found:
        cert = certify(mirror, loss, params, batch)
        assert cert.holds(1e-10), cert
        assert cert.coordinate_compatible and cert.adam < 1e-12
        assert cert.symbolic is True            # tanh(−z) = −tanh(z), tanh(Pz) = P tanh(z), proved by SymPy


def test_adam_leaves_the_fixed_set_of_a_householder_mirror_but_gd_does_not():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).double()
    x, y = _data(6, 3, 2)
    found = symalg.mirrors(symalg.derive(symalg.trace(model, (x,))))
    householder = next(m for m in found if m.name.startswith("Householder"))
    cert = certify(householder, per_sample_loss(model), _params(model), (x, y))
    assert not cert.coordinate_compatible
    assert max(cert.gd, cert.sgd, cert.stationarity, cert.fisher, cert.commutation) < 1e-12
    assert cert.adam > 1e-4 and cert.holds(1e-10)


def test_negative_control_a_connected_group_alone_gives_no_constraint():
    """The Householder mirror of a linear site, used on a ReLU site of the same shapes (whose only continuous
    group is PositiveScaling and whose only mirrors are transpositions): the loss is not invariant and its fixed
    set is not stationary."""
    shapes = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2)).double()
    linear = symalg.mirrors(symalg.derive(symalg.trace(shapes, (torch.randn(2, 3),))))
    householder = next(m for m in linear if m.name.startswith("Householder"))
    dead = linear.mirrors[0]
    torch.manual_seed(3)
    relu = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    x, y = _data(8, 3, 2)
    loss, params = per_sample_loss(relu), _params(relu)
    cert = certify(householder, loss, params, (x, y))
    assert cert.invariance > 1e-3 and cert.stationarity > 1e-3 and cert.gd > 1e-6 and not cert.holds()
    assert certify(dead, loss, params, (x, y)).stationarity < 1e-15   # relu(0) = 0: a dead unit stays dead


# -- thresholds ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scalar_product():
    """``f(x) = u w x`` (spec ``linear(1, 1) -> linear(1, 1)`` without biases): its mirror is the sign of ℝ^×."""
    model = symalg.to_module(symalg.parse("linear(1, 1, bias=False) -> linear(1, 1, bias=False)")).double()
    x = torch.tensor([[0.5], [1.5], [-1.0], [2.0]])
    y = torch.tensor([[0.3], [1.0], [0.2], [1.1]])
    mirror = symalg.mirrors(symalg.derive(symalg.trace(model, (x,)))).mirrors[0]
    return model, (x, y), mirror


def test_weight_decay_threshold_closed_form(scalar_product):
    model, (x, y), mirror = scalar_product
    params = {"0.weight": torch.tensor([[0.8]]), "1.weight": torch.tensor([[0.6]])}
    loss = per_sample_loss(model)
    gamma0 = weight_decay_threshold(mirror, loss, params, (x, y))
    l0 = float(((0.48 * x - y) ** 2).mean())
    closed = (float((y ** 2).mean()) - l0) / (0.8 ** 2 + 0.6 ** 2)           # (L0(0) − L0(θ)) / ‖Pθ‖², L_γ = L0 + γ‖θ‖²
    assert abs(gamma0 - closed) < 1e-12 and gamma0 > 0

    def total(point, gamma):
        return float(loss(point, (x, y)).mean()) + gamma * sum(float((p ** 2).sum()) for p in point.values())
    zero = mirror.fixed_point(params)
    assert total(zero, gamma0 * (1 + 1e-6)) < total(params, gamma0 * (1 + 1e-6))
    assert total(zero, gamma0 * (1 - 1e-6)) > total(params, gamma0 * (1 - 1e-6))


def test_gd_stability_uses_2_gamma_and_the_most_negative_eigenvalue(scalar_product):
    model, (x, y), mirror = scalar_product
    params = {"0.weight": torch.tensor([[0.0]]), "1.weight": torch.tensor([[0.0]])}
    loss = per_sample_loss(model)
    c = float((x * y).mean())
    stability = gd_stability(mirror, loss, params, (x, y), lr=0.1)
    assert torch.allclose(stability.eigenvalues, torch.tensor([-2 * c, 2 * c]), atol=1e-12)   # ∂u∂w ℓ = −2xy at 0
    assert abs(stability.critical_weight_decay - c) < 1e-12                                    # −min ξ / 2
    gamma = 1.5 * c     # attracting here; the paper's rule "ξ* + γ > 0" (γ not 2γ) would need γ > 2c
    point = {"0.weight": torch.tensor([[1e-3]]), "1.weight": torch.tensor([[2e-3]])}
    for _ in range(300):
        leaves = {k: v.clone().requires_grad_(True) for k, v in point.items()}
        grads = torch.autograd.grad(loss(leaves, (x, y)).mean(), list(leaves.values()))
        point = {k: v - 0.1 * (g + 2 * gamma * v) for (k, v), g in zip(point.items(), grads)}
    assert float(mirror.residual(point)) < 1e-6
    assert gd_stability(mirror, loss, params, (x, y), lr=0.1, weight_decay=gamma).attracting
    assert not gd_stability(mirror, loss, params, (x, y), lr=0.1, weight_decay=0.9 * c).attracting


def test_lyapunov_exponent_matches_the_commuting_closed_form_and_monte_carlo(scalar_product):
    model, (x, y), mirror = scalar_product
    params = {"0.weight": torch.tensor([[0.0]]), "1.weight": torch.tensor([[0.0]])}
    loss = per_sample_loss(model)
    a = 2 * (x * y).flatten()                 # per-sample H_x = [[0, −a], [−a, 0]]: they commute
    for lr in (0.3, 1.0, 2.5):
        result = lyapunov(mirror, loss, params, (x, y), lr=lr, steps=40000)
        exact = max(float(torch.log((1 - lr * a).abs()).mean()), float(torch.log((1 + lr * a).abs()).mean()))
        assert abs(float(result.commuting.max()) - exact) < 1e-12
        assert abs(result.exponent - exact) < 0.05


def test_sgd_collapse_pure_noise_closed_form_and_nonlinear_monte_carlo(scalar_product):
    """Samples with ``E[xy] = 0`` (``a = 2xy = ±2``): ``Λ = ½ log|1 − 4η²|``, so SGD collapses onto ``u = w = 0`` iff
    ``η < 1/√2``; the second-order rule ``η > −2E[a]/E[a²] = 0`` predicts collapse at every ``η`` and is wrong above
    ``1/√2``. Nonlinear SGD from a tiny perturbation grows at the rate ``Λ``."""
    model, _, mirror = scalar_product
    x = torch.tensor([[1.0], [-1.0], [2.0], [-2.0]])
    y = torch.tensor([[1.0], [1.0], [0.5], [0.5]])
    zero = {"0.weight": torch.tensor([[0.0]]), "1.weight": torch.tensor([[0.0]])}
    loss = per_sample_loss(model)
    g = torch.Generator().manual_seed(11)
    for lr in (0.3, 1.0):
        exact = 0.5 * math.log(abs(1 - 4 * lr ** 2))
        result = lyapunov(mirror, loss, zero, (x, y), lr=lr, steps=20000)
        assert abs(float(result.commuting.max()) - exact) < 1e-12 and abs(result.exponent - exact) < 0.05
        assert result.second_order == 0.0
        rates = []
        for _ in range(200):
            u, w = 1e-8, 0.5e-8
            for i in torch.randint(0, 4, (20,), generator=g).tolist():
                r = u * w * float(x[i]) - float(y[i])
                u, w = u - lr * 2 * r * float(x[i]) * w, w - lr * 2 * r * float(x[i]) * u
            rates.append(math.log(math.hypot(u, w) / math.hypot(1e-8, 0.5e-8)) / 20)
        assert abs(sum(rates) / len(rates) - exact) < 0.1, (lr, sum(rates) / len(rates), exact)


# -- engineering, lasso, conservation --------------------------------------------------------------------------
def test_hadamard_weight_decay_is_the_lasso():
    from symalg.applications.constraint_engineering import hadamard_lasso, soft_threshold
    a = torch.randn(12, generator=torch.Generator().manual_seed(4))
    for gamma in (0.05, 0.3):
        u, w = hadamard_lasso(a, gamma, steps=6000, generator=torch.Generator().manual_seed(5))
        assert torch.allclose(u * w, soft_threshold(a, 2 * gamma), atol=1e-10)
        assert torch.allclose(u.abs(), w.abs(), atol=1e-8)                 # balanced: |u_i| = |w_i| = √|v_i|


def test_dcs_faithful_in_any_basis_printed_only_in_coordinates():
    from symalg.applications.constraint_engineering import MirrorConstraint, printed_dcs
    g = torch.Generator().manual_seed(6)
    frame, _ = torch.linalg.qr(torch.randn(5, 2, generator=g))
    dcs = MirrorConstraint(frame)
    theta = torch.randn(5, generator=g)
    assert torch.allclose(dcs(*dcs.right_inverse(theta)), theta, atol=1e-14)
    v, a, b = dcs.right_inverse(theta)
    assert torch.allclose(dcs(v, -a, -b), theta, atol=1e-14)               # the built-in mirror
    assert torch.allclose(frame.T @ dcs(v, 0 * a, 0 * b), torch.zeros(2), atol=1e-14)
    n = torch.tensor([[1.0], [-1.0], [0.0]]) / math.sqrt(2)                 # rotated basis: Σ n³ = 0
    reach = max(float((n.T @ printed_dcs(torch.randn(3, generator=g), torch.randn(3, generator=g),
                                         torch.randn(3, generator=g), n)).abs()) for _ in range(50))
    assert reach < 1e-15                                                   # nᵀθ ≠ 0 is never reached
    E = torch.eye(4)[:, [1, 3]]                                            # coordinate basis: both forms agree
    v, w, u = (torch.randn(4, generator=g) for _ in range(3))
    assert torch.allclose(printed_dcs(v, w, u, E), MirrorConstraint(E)(v, E.T @ w, E.T @ u), atol=1e-15)


def test_dcs_with_weight_decay_finds_the_constraint_in_a_rotated_basis():
    from torch.nn.utils import parametrize
    from symalg.applications.constraint_engineering import MirrorConstraint
    g = torch.Generator().manual_seed(7)
    frame, _ = torch.linalg.qr(torch.randn(6, 3, generator=g))
    x = torch.randn(64, 6, generator=g)
    target = torch.randn(6, generator=g)
    y = x @ (target - frame @ (frame.T @ target)) + 0.01 * (x @ frame[:, 0])          # tiny signal inside im frame
    layer = torch.nn.Linear(6, 1, bias=False).double()
    parametrize.register_parametrization(layer, "weight", MirrorConstraint(frame, shape=(1, 6)))
    v, a, b = layer.parametrizations.weight.original0, layer.parametrizations.weight.original1, \
        layer.parametrizations.weight.original2
    opt = torch.optim.SGD([{"params": [v]}, {"params": [a, b], "weight_decay": 0.1}], lr=0.05)
    for _ in range(3000):
        opt.zero_grad()
        ((layer(x).squeeze(-1) - y) ** 2).mean().backward()
        opt.step()
    weight = layer.weight.detach().reshape(-1)
    assert float((frame.T @ weight).abs().max()) < 1e-6
    assert float(((weight - (target - frame @ (frame.T @ target))) ** 2).sum()) < 1e-3


def test_random_bias_and_gradient_noise_remove_the_absorbing_state():
    from symalg.applications.constraint_engineering import FixedRandomBias, add_gradient_noise
    g = torch.Generator().manual_seed(8)
    x = torch.randn(32, 4, generator=g)
    y = x.sum(-1)

    def run(noise: float, bias: float) -> float:
        u = torch.nn.Parameter(torch.tensor([0.0, 1.0, 1.0, 1.0]))
        w = torch.nn.Parameter(torch.tensor([0.0, 1.0, 1.0, 1.0]))
        shift = FixedRandomBias((4,), bias, torch.Generator().manual_seed(9), torch.float64)
        handles = add_gradient_noise([u, w], noise, torch.Generator().manual_seed(10)) if noise else []
        opt = torch.optim.SGD([u, w], lr=0.01)
        for _ in range(1500):
            opt.zero_grad()
            ((x @ (shift(u) * shift(w)) - y) ** 2).mean().backward()
            opt.step()
        for h in handles:
            h.remove()
        return float(abs(u[0] * w[0]).detach())
    assert run(0.0, 0.0) == 0.0                       # u_0 = w_0 = 0 is absorbing
    assert run(1e-2, 0.0) > 0.5 and run(0.0, 1e-2) > 0.5   # v_0 = u_0 w_0 learns its target 1


def test_conserved_quantity_drifts_by_one_minus_lr2_g2_per_step(scalar_product):
    """Cross-check with the conservation law symalg derives for ``u w x``: ``C = w² − u²`` (GL(1)); gradient flow keeps
    it, so a pair with ``C ≠ 0`` never reaches the mirror's fixed set ``u = w = 0``; a GD step multiplies it by exactly
    ``1 − η² g²`` (``g = ∂L/∂(uw)``), the discretisation drift that lets SGD collapse."""
    model, (x, y), _ = scalar_product
    analysis = symalg.derive(symalg.trace(model, (x,)))
    conserved = next(s.conserved for s in analysis.symmetries if s.conserved is not None)
    params = {"0.weight": torch.tensor([[0.9]]), "1.weight": torch.tensor([[0.4]])}
    loss = per_sample_loss(model)
    lr = 0.3
    for _ in range(5):
        q = float(next(iter(conserved(params).values())))
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        grads = torch.autograd.grad(loss(leaves, (x, y)).mean(), list(leaves.values()))
        g = float(2 * ((params["0.weight"] * params["1.weight"] * x - y) * x).mean())
        params = {k: v - lr * gr for (k, v), gr in zip(params.items(), grads)}
        q_next = float(next(iter(conserved(params).values())))
        assert abs(q_next - q * (1 - lr ** 2 * g ** 2)) < 1e-12
    assert abs(q) > 0.1
