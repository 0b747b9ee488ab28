"""Printed results of the five papers that had no verdict: each derived (docs/fidelity.md), then checked here.

Every test states the printed claim, the corrected one where it differs, and measures both, so a wrong correction
fails as surely as a wrong claim. All quick (closed forms, RK4 or leapfrog on a handful of parameters).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import symalg
from symalg.applications.whitened import potential, whitened_conserved

DT = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")   # tiny tensors: a second thread only adds contention


def _rk4(field, state, dt: float, steps: int):
    """Classical RK4 for ``ẏ = field(y)`` on a tuple of tensors; returns the trajectory's states."""
    path = [state]
    for _ in range(steps):
        k1 = field(state)
        k2 = field(tuple(s + dt / 2 * k for s, k in zip(state, k1)))
        k3 = field(tuple(s + dt / 2 * k for s, k in zip(state, k2)))
        k4 = field(tuple(s + dt * k for s, k in zip(state, k3)))
        state = tuple(s + dt / 6 * (a + 2 * b + 2 * c + d) for s, a, b, c, d in zip(state, k1, k2, k3, k4))
        path.append(state)
    return path


# ---------------------------------------------------------------- [Zhao2026] Sec. 2.5: Q_M under the group


def test_q_m_of_a_moved_point_is_q_of_gt_m_g_only_for_orthogonal_elements():
    """Printed: ``Q_M(g·θ) = Q_{gᵀMg}(θ)``. For ``U σ(V x)`` with ``V ↦ gV``, ``U ↦ Ug⁻¹`` the two layers conjugate
    ``M`` differently: ``Q_M(g·θ) = Tr(gᵀMg VVᵀ) − Tr(g⁻¹Mg⁻ᵀ UᵀU)``; the printed form holds iff
    ``g⁻¹Mg⁻ᵀ = gᵀMg`` on the data, e.g. for orthogonal ``g``, and fails for a generic element of ``GL``."""
    analysis = symalg.derive("linear(3, 4, bias=False) -> identity -> linear(4, 2, bias=False)")
    (quantity,) = analysis.conserved_quantities()
    symmetry = analysis.symmetries[0]
    gen = torch.Generator().manual_seed(0)
    params = {"0.weight": torch.randn(4, 3, generator=gen, dtype=DT), "2.weight": torch.randn(2, 4, generator=gen,
                                                                                              dtype=DT)}
    V, U = params["0.weight"], params["2.weight"]

    def q(M, p):
        (C,) = quantity(p).values()
        return float((M * C).sum())
    M = torch.randn(4, 4, generator=gen, dtype=DT)
    M = M + M.T
    g = torch.eye(4, dtype=DT) + 0.5 * torch.randn(4, 4, generator=gen, dtype=DT)
    moved = symmetry.apply(params, g)
    torch.testing.assert_close(moved["0.weight"], g @ V)          # the action the formulas assume
    exact = q(M, moved)
    gi = torch.linalg.inv(g)
    corrected = float((g.T @ M @ g * (V @ V.T)).sum() - (gi @ M @ gi.T * (U.T @ U)).sum())
    printed = q(g.T @ M @ g, params)
    assert abs(exact - corrected) < 1e-10 * abs(exact)
    assert abs(exact - printed) > 0.1 * abs(exact)
    o = torch.linalg.qr(g).Q                                       # an orthogonal element: the printed form holds
    assert abs(q(M, symmetry.apply(params, o)) - q(o.T @ M @ o, params)) < 1e-12 * abs(exact)


# ---------------------------------------------------------------- [Zhao2026] eq. 2.16: E[Q] at Xavier initialisation


def test_xavier_mean_of_q_is_half_of_m_minus_h():
    """``Q = ½Tr[UᵀU − VVᵀ]`` (eq. 2.14) with ``U_ij ~ N(0, 1/h)``, ``V_ij ~ N(0, 1/n)`` (eq. 2.15) has mean
    ``½(m − h)``; eq. 2.16 prints ``m − h`` (its middle step also adds the two terms)."""
    m, h, n, draws = 20, 5, 10, 4000
    gen = torch.Generator().manual_seed(1)
    U = torch.randn(draws, m, h, generator=gen, dtype=DT) / math.sqrt(h)
    V = torch.randn(draws, h, n, generator=gen, dtype=DT) / math.sqrt(n)
    Q = 0.5 * ((U ** 2).sum((1, 2)) - (V ** 2).sum((1, 2)))
    standard_error = float(Q.std()) / math.sqrt(draws)
    assert abs(float(Q.mean()) - 0.5 * (m - h)) < 5 * standard_error
    assert abs(float(Q.mean()) - (m - h)) > 50 * standard_error


# ---------------------------------------------------------------- [Zhao2026] eq. 2.17: whitened inputs


def _two_layer_flow(activation, X, Y):
    def loss(U, V):
        return 0.5 * ((U @ activation(V @ X) - Y) ** 2).sum()
    grad = torch.func.grad(loss, argnums=(0, 1))
    return lambda state: tuple(-d for d in grad(*state))


@pytest.mark.parametrize("activation", [torch.tanh, torch.sigmoid, torch.nn.functional.softplus],
                         ids=["tanh", "sigmoid", "softplus"])
def test_whitened_elementwise_quantity_is_conserved_only_for_whitened_inputs(activation):
    """Eq. 2.17 holds as printed when ``X = I``: RK4 keeps ``Q`` to its truncation error; with a generic ``X`` the
    same ``Q`` drifts by orders of magnitude more (the whitening is what makes the gradient elementwise)."""
    gen = torch.Generator().manual_seed(2)
    m, h, n = 2, 3, 3
    U, V = (0.7 * torch.randn(s, generator=gen, dtype=DT) for s in ((m, h), (h, n)))
    Y = torch.randn(m, n, generator=gen, dtype=DT)
    drifts = {}
    for name, X in (("whitened", torch.eye(n, dtype=DT)), ("generic", torch.randn(n, n, generator=gen, dtype=DT))):
        path = _rk4(_two_layer_flow(activation, X, Y), (U, V), 1e-2, 100)
        values = torch.stack([whitened_conserved(u, v, activation) for u, v in path])
        drifts[name] = float((values - values[0]).abs().max())
    assert drifts["whitened"] < 1e-9
    assert drifts["generic"] > 1e-3


def test_whitened_potential_closed_forms_and_relu_refusal():
    v = torch.linspace(-3, 3, 25, dtype=DT)
    torch.testing.assert_close(potential(torch.tanh, v), (torch.cosh(2 * v) - 1) / 4, rtol=0, atol=1e-12)
    torch.testing.assert_close(potential(torch.sigmoid, v), v + torch.exp(v) - 1, rtol=0, atol=1e-12)
    torch.testing.assert_close(potential(lambda x: x, v), v ** 2 / 2, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"entry \(0,\) of v"):
        potential(torch.relu, v)
    with pytest.raises(ValueError, match="U must be"):
        whitened_conserved(torch.ones(2, 3), torch.ones(2, 3), torch.tanh)


# ---------------------------------------------------------------- [Zhao2026] Fig. 2.3: eq. 2.17's Q at Xavier init


def _xavier_q_moments(activation_name: str, m: int, h: int, n: int) -> tuple[float, float]:
    """Exact mean and variance of eq. 2.17's ``Q`` at Xavier init (``U_ij ~ N(0, 1/h)``, ``V_aj ~ N(0, s²)``,
    ``s² = 1/n``), from ``E e^{tv} = e^{t²s²/2}`` and ``E[v e^v] = s² e^{s²/2}``:
    ``½Tr UᵀU``: mean ``m/2``, variance ``m/(2h)``; per entry ``Φ(v)``: identity ``v²/2`` (mean ``s²/2``, variance
    ``s⁴/2``); tanh ``(cosh 2v − 1)/4`` (mean ``(e^{2s²} − 1)/4``, variance ``(e^{4s²} − 1)²/32``); sigmoid
    ``v + eᵛ − 1`` (mean ``e^{s²/2} − 1``, variance ``s² + e^{s²}(e^{s²} − 1) + 2s²e^{s²/2}``)."""
    s2 = 1 / n
    phi = {"identity": (s2 / 2, s2 ** 2 / 2),
           "tanh": ((math.exp(2 * s2) - 1) / 4, (math.exp(4 * s2) - 1) ** 2 / 32),
           "sigmoid": (math.exp(s2 / 2) - 1, s2 + math.exp(s2) * (math.exp(s2) - 1) + 2 * s2 * math.exp(s2 / 2))}
    mean, var = phi[activation_name]
    return m / 2 - h * n * mean, m / (2 * h) + h * n * var


def test_fig_2_3_xavier_distribution_of_the_whitened_quantity():
    """Fig. 2.3's setting: ``m = h = n = 100``, 1000 Xavier draws, ``Q`` of eq. 2.17 (``potential`` with 4 nodes:
    ``Φ`` to ``1e-7`` at ``|v| ≤ 1``, far below the sampling error). The sample mean and standard deviation match
    the derived moments (``_xavier_q_moments``). The caption's "similar to linear networks" holds for tanh
    (standard deviation ≈ 1.0, the linear network's 1.0) but not for the sigmoid: ``σ(0)/σ'(0) = 2`` gives
    ``Φ(v) ≈ 2v``, a linear term whose spread is ``√(4h) = 20``; ReLU has no ``Q`` at Xavier init (``σ' = 0`` on
    the negative entries)."""
    m = h = n = 100
    draws = 1000
    gen = torch.Generator().manual_seed(23)
    stds = {}
    for name, activation in (("identity", lambda x: x), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid)):
        Q = torch.cat([0.5 * (torch.randn(100, m, h, generator=gen, dtype=DT) ** 2).sum((1, 2)) / h
                       - potential(activation, torch.randn(100, h, n, generator=gen, dtype=DT) / math.sqrt(n),
                                   nodes=4).sum((1, 2))
                       for _ in range(draws // 100)])                     # eq. 2.17, 100 draws at a time
        mean, var = _xavier_q_moments(name, m, h, n)
        assert abs(float(Q.mean()) - mean) < 4 * math.sqrt(var / draws), name
        assert abs(float(Q.std()) / math.sqrt(var) - 1) < 0.1, name          # χ² spread of 1000 draws: ≈ 0.022
        stds[name] = float(Q.std())
    assert 0.9 < stds["tanh"] / stds["identity"] < 1.1
    assert stds["sigmoid"] > 15 * stds["identity"]
    with pytest.raises(ValueError, match="derivative vanishes"):
        whitened_conserved(torch.ones(m, h, dtype=DT), -torch.ones(h, n, dtype=DT) / n, torch.relu)


# ---------------------------------------------------------------- [Zhao2026] Fig. 2.6: Q selects the minimum reached


def test_one_dimensional_gradient_flow_reaches_the_minimum_its_q_selects():
    """``L = ½(Y − UVX)²``, ``Y = 2``, ``X = 1``: ``Q = U² − V²`` is conserved, so the flow ends on ``UV = 2`` at
    ``U² = (Q + √(Q² + 16))/2``: distinct ``Q`` give distinct minima (Fig. 2.6), and the Hessian there has the
    nonzero eigenvalue ``U² + V² = √(Q² + 16)`` (eq. 2.53's ``X = Y = 1`` analogue is ``√(Q² + 4)``, not the printed
    ``2√(Q² + 4)``), smallest at ``Q = 0``."""
    def field(state):
        U, V = state
        r = 2 - U * V
        return r * V, r * U
    ends = []
    for U0, V0 in ((0.3, 0.1), (0.1, 0.3), (1.5, 0.2), (0.2, 1.5), (0.5, 0.5)):
        path = _rk4(field, (torch.tensor(U0, dtype=DT), torch.tensor(V0, dtype=DT)), 1e-2, 3000)
        Q = U0 ** 2 - V0 ** 2
        U, V = (float(t) for t in path[-1])
        assert abs(U * V - 2) < 1e-10
        assert abs(U * U - (Q + math.sqrt(Q * Q + 16)) / 2) < 1e-8
        hessian = torch.tensor([[V * V, 2 * U * V - 2], [2 * U * V - 2, U * U]], dtype=DT)
        eigenvalues = torch.linalg.eigvalsh(hessian)
        assert abs(float(eigenvalues[0])) < 1e-8 and abs(float(eigenvalues[1]) - math.sqrt(Q * Q + 16)) < 1e-8
        ends.append((round(U, 6), float(eigenvalues[1])))
    assert len({u for u, _ in ends}) == len(ends)
    assert min(ends, key=lambda e: e[1]) == ends[-1]                 # the balanced start (Q = 0) is the flattest


# ---------------------------------------------------------------- [Gluch2021] eq. 43 and Sec. 7


def _deep(widths=(3, 4, 4, 2), seed=3):
    gen = torch.Generator().manual_seed(seed)
    Ws = [torch.randn(o, i, generator=gen, dtype=DT) / math.sqrt(i) for i, o in zip(widths, widths[1:])]
    X = torch.randn(widths[0], 7, generator=gen, dtype=DT)
    Y = torch.randn(widths[-1], 7, generator=gen, dtype=DT)

    def loss(W1, W2, W3):                                             # W2 W1 is linear; tanh between W2 and W3
        return 0.5 * ((W3 @ torch.tanh(W2 @ W1 @ X) - Y) ** 2).sum()
    return Ws, loss, gen


def test_noether_eq_43_second_derivative_of_the_imbalance_under_newtonian_dynamics():
    """Along ``Ẅ = −∇L`` (ND), ``d²/dt²[½W_hW_hᵀ − ½W_{h+1}ᵀW_{h+1}] = Ẇ_hẆ_hᵀ − Ẇ_{h+1}ᵀẆ_{h+1}`` when the site
    between ``W_h`` and ``W_{h+1}`` is linear (eq. 43 holds as printed); across the tanh site it does not."""
    Ws, loss, gen = _deep()
    velocities = [torch.randn(W.shape, generator=gen, dtype=DT) for W in Ws]
    accelerations = [-g for g in torch.func.grad(loss, argnums=(0, 1, 2))(*Ws)]

    def imbalance(h, t):
        W = [w + t * v + t * t / 2 * a for w, v, a in zip(Ws, velocities, accelerations)]   # the flow's 2-jet
        return 0.5 * (W[h] @ W[h].T - W[h + 1].T @ W[h + 1])
    for h, holds in ((0, True), (1, False)):
        second = torch.func.jacfwd(torch.func.jacfwd(lambda t: imbalance(h, t)))(torch.tensor(0.0, dtype=DT))
        predicted = velocities[h] @ velocities[h].T - velocities[h + 1].T @ velocities[h + 1]
        error = float((second - predicted).abs().max())
        assert (error < 1e-12) if holds else (error > 1e-2)


def _newtonian(loss, w0, dt, steps, friction=None, t0=1.0):
    """Leapfrog for ``ẅ + κ(t) ẇ = −∇L`` from rest (``κ = 0``: ND; ``κ = 3/t``: Nesterov's flow, from ``t0``)."""
    grad = torch.func.grad(loss)
    w, v, t, path = w0.clone(), torch.zeros_like(w0), t0, []
    for _ in range(steps):
        damp = 0.0 if friction is None else friction(t)
        v = (v - dt / 2 * grad(w)) / (1 + dt / 2 * damp)
        w = w + dt * v
        t += dt
        v = (v * (1 - dt / 2 * damp) - dt / 2 * grad(w)) if friction is not None else v - dt / 2 * grad(w)
        path.append((w, v))
    return path


def _wide_relu(m: int, seed: int = 4, bias: bool = False):
    """A two-layer tanh regression with ``m`` hidden units (LeCun init, ``1/√m`` readout): ``L(w(0))`` is O(1).
    Eq. 49 assumes nothing about the architecture; a smooth activation keeps the leapfrog's energy error at
    ``O(dt²)`` (ReLU's kinks make it ``O(dt)``). ``bias=True`` appends a readout bias ``b`` (started at 0) as the
    last parameter: ``f = aᵀtanh(Wx)/√m + b``."""
    gen = torch.Generator().manual_seed(seed)
    X, y = torch.randn(5, 3, generator=gen, dtype=DT), torch.randn(5, generator=gen, dtype=DT)
    w0 = torch.cat([torch.randn(m * 3, generator=gen, dtype=DT) / math.sqrt(3),
                    torch.randn(m, generator=gen, dtype=DT), torch.zeros(int(bias), dtype=DT)])

    def loss(w):
        W, a = w[:m * 3].reshape(m, 3), w[m * 3:m * 4]
        return 0.5 * ((torch.tanh(X @ W.T) @ a / math.sqrt(m) + w[m * 4:].sum() - y) ** 2).sum()
    return loss, w0


@pytest.mark.parametrize("m", [4, 64])
def test_noether_eq_49_and_remark_1_the_energy_bounds_the_mean_speed(m):
    """ND from rest conserves ``½‖ẇ‖² + L``, so ``(1/P) Σ|ẇ_i| ≤ √(2L(w(0))/P)`` (eq. 49, ``P`` parameters);
    Nesterov's flow dissipates it, so the bound holds there too (Remark 1). Measured on every step."""
    loss, w0 = _wide_relu(m)
    L0, P = float(loss(w0)), w0.numel()
    bound = math.sqrt(2 * L0 / P)
    for friction in (None, lambda t: 3 / t):
        path = _newtonian(loss, w0, 1e-2, 400, friction)
        energies = torch.tensor([0.5 * float(v @ v) + float(loss(w)) for w, v in path])
        speeds = torch.tensor([float(v.abs().mean()) for _, v in path])
        assert float(energies.max()) <= L0 * (1 + 1e-4)              # conserved (ND) or dissipated (NAGF)
        assert float(speeds.max()) <= bound * (1 + 1e-4)
        assert float(speeds.max()) > 0.05 * bound                    # the bound is not vacuous here


def test_noether_gradient_flow_bound_on_the_mean_displacement():
    """Remark 1's GF bound, derived: ``‖w(T) − w(0)‖ ≤ ∫‖ẇ‖ ≤ √(T ∫‖ẇ‖²) = √(T(L(0) − L(T)))``, so
    ``(1/P) Σ|w_i(T) − w_i(0)| ≤ √(T L(0)/P)``; checked along RK4 gradient flow at two widths."""
    for m in (4, 64):
        loss, w0 = _wide_relu(m)
        grad = torch.func.grad(loss)
        T, steps = 4.0, 400
        (w,) = _rk4(lambda s: (-grad(s[0]),), (w0,), T / steps, steps)[-1]
        mean_move, L0, LT = float((w - w0).abs().mean()), float(loss(w0)), float(loss(w))
        assert math.sqrt(T * (L0 - LT)) >= float((w - w0).norm())
        assert mean_move <= math.sqrt(T * L0 / w0.numel())


def test_noether_eqs_50_51_the_energy_controls_the_mean_speed_but_not_the_max():
    """Eqs. 50–51 claim ``max_i|ẇ_i|`` and ``max_i|Δw_i|`` are ``O(1/√m)``. The energy gives only
    ``‖ẇ‖ ≤ √(2L(0))``: the mean bound ``(1/P)Σ|ẇ_i| ≤ √(2L(0)/P)`` follows, the max bound does not. Construction:
    the same width-``m`` tanh regression with a readout bias ``b`` (``f = aᵀtanh(Wx)/√m + b``): ``∂L/∂b = Σ(f − y)``
    does not shrink with ``m``, so under ND ``max_i|ẇ_i| ≥ |ḃ|`` and ``max_i|Δw_i| ≥ |Δb|`` stay of order one while
    the mean bound falls like ``1/√P``. Measured at ``m = 4, 64, 1024`` along leapfrog ND from rest."""
    rows = []
    for m in (4, 64, 1024):
        loss, w0 = _wide_relu(m, bias=True)
        L0, P = float(loss(w0)), w0.numel()
        path = _newtonian(loss, w0, 1e-2, 200)
        mean_speed = max(float(v.abs().mean()) for _, v in path)
        max_speed = max(float(v.abs().max()) for _, v in path)
        max_move = max(float((w - w0).abs().max()) for w, _ in path)
        assert mean_speed <= math.sqrt(2 * L0 / P) * (1 + 1e-4)            # eq. 49: holds at every width
        assert max_speed <= math.sqrt(2 * L0) * (1 + 1e-4)                 # all the energy allows
        rows.append((P, max_speed, max_move, math.sqrt(2 * L0)))
    for P, max_speed, max_move, energy_bound in rows:
        assert max_speed > 0.1 * energy_bound and max_move > 0.05          # not decaying with the width
    (P_small, speed_small, move_small, _), (P_large, speed_large, move_large, _) = rows[0], rows[-1]
    assert speed_large > 0.5 * speed_small and move_large > 0.5 * move_small
    assert speed_large * math.sqrt(P_large) > 10 * speed_small * math.sqrt(P_small)   # not O(1/√P)


def test_noether_ntk_sketch_has_the_wrong_sign_and_a_nonzero_relu_curvature():
    """Eqs. 52–53. (a) ``ẅ = −∇L = +Σ(y − f)∂f/∂w``, so for a model linear in its weights ``ü = +H(y − u)``
    exactly; the printed ``−H(y − u)`` drives ``u`` away from ``y``. (b) ``∂²f/∂w² = 0`` is false for a two-layer
    ReLU network: each layer's block vanishes but the cross block ``∂²f/∂a∂W = relu'(Wx) xᵀ`` does not, so the
    dropped term ``⟨∂²f/∂w², ẇẇ⟩`` is ``O(‖ẇ‖²)``, not zero."""
    gen = torch.Generator().manual_seed(5)
    Phi, y = torch.randn(4, 6, generator=gen, dtype=DT), torch.randn(4, generator=gen, dtype=DT)
    alpha = torch.randn(6, generator=gen, dtype=DT)
    accel = -torch.func.grad(lambda a: 0.5 * ((y - Phi @ a) ** 2).sum())(alpha)   # ND: ẅ = −∇L
    H, u = Phi @ Phi.T, Phi @ alpha
    torch.testing.assert_close(Phi @ accel, H @ (y - u))                          # ü = +H(y − u)
    assert float((Phi @ accel + H @ (y - u)).norm()) > 1.0                        # printed −H(y − u) is not it

    x = torch.randn(3, generator=gen, dtype=DT)
    W, a = torch.randn(5, 3, generator=gen, dtype=DT), torch.randn(5, generator=gen, dtype=DT)
    hessian = torch.func.hessian(lambda W, a: a @ torch.relu(W @ x), argnums=(0, 1))(W, a)
    assert float(hessian[0][0].abs().max()) == 0.0 and float(hessian[1][1].abs().max()) == 0.0
    cross = hessian[0][1]                                                          # ∂²f/∂W∂a, shape (5, 3, 5)
    expected = torch.einsum("ik,j->ijk", torch.diag((W @ x > 0).to(DT)), x)
    torch.testing.assert_close(cross, expected)
    assert float(cross.abs().max()) > 0.1


# ---------------------------------------------------------------- [Ziyin2024] Thm. 4 part 4 and footnote 3


def test_mirror_theorem_4_part_4_threshold_is_minus_lambda_min_over_two():
    """With ``ℓ_γ = ℓ_0 + γ‖w‖²`` and Hessian ``≥ λ_min``, ``ℓ_γ`` is strictly convex for ``γ > −λ_min/2`` and every
    minimum then satisfies ``Oᵀw = 0``; the proof's ``γ > λ_min`` is vacuous for negative ``λ_min``. Tight example:
    ``ℓ_0 = cos w`` (mirror ``w ↦ −w``, ``λ_min = −1``): minima leave ``w = 0`` exactly below ``γ = ½``, and at
    ``γ = ¼ > λ_min`` they are at ``w ≠ 0``."""
    w = torch.linspace(-8, 8, 160001, dtype=DT)
    for gamma, at_origin in ((0.25, False), (0.49, False), (0.51, True), (2.0, True)):
        values = torch.cos(w) + gamma * w ** 2
        assert (abs(float(w[values.argmin()])) < 1e-3) == at_origin


def test_mirror_theorem_4_assumption_fails_for_a_polynomial_loss_whose_threshold_is_one():
    """``ℓ_0 = (uw − 1)²`` has the mirrors of the rescaling symmetry but a Hessian unbounded below (along ``u = −w = t``
    its least eigenvalue is ``−2t² − 2``), so Assumption 1 fails; part 4's conclusion still holds with ``γ_1 = 1``
    (``u² + w² ≥ 2|uw|`` gives ``ℓ_γ ≥ (p − 1)² + 2γ|p|``, minimised at ``p = 0`` iff ``γ ≥ 1``)."""
    for t in (0.0, 1.0, 10.0):
        point = torch.tensor([t, -t], dtype=DT)
        hessian = torch.func.hessian(lambda p: (p[0] * p[1] - 1) ** 2)(point)
        assert abs(float(torch.linalg.eigvalsh(hessian)[0]) - (-2 * t * t - 2)) < 1e-9
    grid = torch.linspace(-2, 2, 801, dtype=DT)
    u, w = torch.meshgrid(grid, grid, indexing="ij")
    for gamma, at_origin in ((0.9, False), (1.1, True)):
        values = (u * w - 1) ** 2 + gamma * (u ** 2 + w ** 2)
        index = values.argmin()
        assert (float(u.flatten()[index] ** 2 + w.flatten()[index] ** 2) < 1e-12) == at_origin


def test_mirror_footnote_3_weight_decay_selects_the_mirror_plane_but_not_the_origin():
    """``L_γ = ((w₁ + w₂)x − y)² + γ(w₁² + w₂²)``: for ``γ > 0`` the unique minimum is ``w₁ = w₂ = xy/(2x² + γ)``, on
    the permutation mirror's plane and away from the origin whenever ``xy ≠ 0`` (footnote 3 holds as printed)."""
    x, y = 1.3, -0.7
    for gamma in (0.01, 1.0, 100.0):
        A = torch.tensor([[2 * x * x + 2 * gamma, 2 * x * x], [2 * x * x, 2 * x * x + 2 * gamma]], dtype=DT)
        w = torch.linalg.solve(A, torch.tensor([2 * x * y, 2 * x * y], dtype=DT))  # ∇L_γ = 0, L_γ strictly convex
        assert abs(float(w[0] - w[1])) < 1e-15
        assert abs(float(w[0]) - x * y / (2 * x * x + gamma)) < 1e-14 and abs(float(w[0])) > 1e-4


# ---------------------------------------------------------------- [Zhao2026] Props. 4.5.7–4.5.8 (L_A = wᵀAw)


def test_teleported_gradient_flow_stays_optimal_and_the_teleport_target_is_the_closest_point_to_the_minimum():
    """``L_A = wᵀAw``, ``A ≻ 0``, the conjugated ``O(n)`` transitive on level sets (Lemma 4.5.5). On ``{L_A = c}``,
    ``‖∇L_A‖² = 4‖Aw‖² ≤ 4λ_max c``, attained at the top eigenvector (Lemma 4.5.6). Prop. 4.5.7: gradient flow
    ``w(t) = e^{−2At}w₀`` from that point stays at the maximum of every level set it crosses (ratio 1), while from a
    generic point the ratio falls towards ``λ_min/λ_max``. Prop. 4.5.8: the maximiser is also the point of the level
    set closest to ``w* = 0`` (``‖w‖² = c/λ_max``)."""
    gen = torch.Generator().manual_seed(6)
    Q = torch.linalg.qr(torch.randn(4, 4, generator=gen, dtype=DT)).Q
    eigenvalues = torch.tensor([0.5, 1.0, 2.0, 5.0], dtype=DT)
    A = Q @ torch.diag(eigenvalues) @ Q.T
    top, c = Q[:, -1], 3.0

    def ratio(w):                                    # ‖∇L_A(w)‖² / its maximum on w's level set
        return float((2 * A @ w).pow(2).sum() / (4 * eigenvalues[-1] * (w @ A @ w)))
    teleported = top * math.sqrt(c / float(top @ A @ top))
    generic = torch.randn(4, generator=gen, dtype=DT)
    generic = generic * math.sqrt(c / float(generic @ A @ generic))
    for time in (0.0, 0.1, 0.5, 1.0, 2.0):
        flow = torch.linalg.matrix_exp(-2 * time * A)
        assert abs(ratio(flow @ teleported) - 1) < 1e-12
    assert ratio(generic) < 0.9 and ratio(torch.linalg.matrix_exp(-4 * A) @ generic) < 0.2   # → λ_min/λ_max = 0.1
    # Prop. 4.5.8 over a dense sample of the level set: largest gradient norm ⇔ smallest distance to w* = 0
    u = torch.randn(20000, 4, generator=gen, dtype=DT)
    u = u / u.norm(dim=1, keepdim=True)
    inv_sqrt = Q @ torch.diag(eigenvalues.rsqrt()) @ Q.T
    points = math.sqrt(c) * u @ inv_sqrt                              # every point has wᵀAw = c
    grad_norms, distances = (2 * points @ A).pow(2).sum(1), points.pow(2).sum(1)
    for best in (points[grad_norms.argmax()], points[distances.argmin()]):     # both are near ±(top eigenvector)
        assert abs(float(best @ top)) / float(best.norm()) > 0.99
    assert float(grad_norms.max()) <= 4 * float(eigenvalues[-1]) * c * (1 + 1e-12)
    assert float(distances.min()) >= c / float(eigenvalues[-1]) - 1e-12
    assert abs(float(teleported @ teleported) - c / float(eigenvalues[-1])) < 1e-12


def test_prop_4_5_4_teleport_keeps_the_larger_gradient_for_the_steps_the_bound_promises():
    """Prop. 4.5.4 (holds): with a ``β``-Lipschitz gradient and ``ηβ < 1`` every GD step keeps
    ``(1 − ηβ)‖g_t‖ ≤ ‖g_{t+1}‖ ≤ (1 + ηβ)‖g_t‖`` (eq. 4.28), so an initial ratio ``r ≥ ((1 + ηβ)/(1 − ηβ))^T``
    keeps the teleported gradient the larger one for ``T`` steps. Measured on ``L = wᵀAw`` (``β = 2λ_max``) from the
    level set's point of least gradient and its teleport to the point of largest; the bound is sufficient, not
    tight (the teleported gradient stays larger beyond ``T``)."""
    gen = torch.Generator().manual_seed(8)
    Q = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=DT)).Q
    eigenvalues = torch.tensor([0.2, 0.5, 1.0, 3.0, 8.0], dtype=DT)
    A = Q @ torch.diag(eigenvalues) @ Q.T
    beta, eta = 2 * float(eigenvalues[-1]), 0.004
    c = 3.0                                                            # one level set: its worst and best points
    w, teleported = (Q[:, k] * math.sqrt(c / float(eigenvalues[k])) for k in (0, -1))

    def run(x, steps):
        grads = []
        for _ in range(steps):
            g = 2 * A @ x
            grads.append(float(g.norm()))
            x = x - eta * g
        return grads
    plain, tele = run(w, 60), run(teleported, 60)
    for grads in (plain, tele):
        for now, after in zip(grads, grads[1:]):
            assert (1 - eta * beta) * now - 1e-12 <= after <= (1 + eta * beta) * now + 1e-12
    r = tele[0] / plain[0]
    T = math.floor(math.log(r) / math.log((1 + eta * beta) / (1 - eta * beta)))
    assert T >= 5
    assert all(tele[k] >= plain[k] for k in range(T + 1))
    assert tele[T + 10] >= plain[T + 10]                               # sufficient, not tight


def test_mirror_theorem_4_part_2_hessian_splits_on_the_fixed_set():
    """Thm. 4 part 2 (holds): at a point with ``Oᵀw = 0`` the mirror ``R = I − 2OOᵀ`` fixes ``w`` and ``ℓ_0∘R = ℓ_0``,
    so ``RHR = H``: ``H`` commutes with ``R`` and its eigenvectors split into ``ker Oᵀ`` and ``im O``. Off the fixed
    set they do not. ``ℓ_0 = Σ(u w x − y)²`` has the mirror ``(u, w) ↦ (−w, −u)``, ``O = (1, 1)/√2``."""
    gen = torch.Generator().manual_seed(9)
    x, y = torch.randn(6, generator=gen, dtype=DT), torch.randn(6, generator=gen, dtype=DT)
    n = torch.tensor([1.0, 1.0], dtype=DT) / math.sqrt(2)
    R = torch.eye(2, dtype=DT) - 2 * torch.outer(n, n)

    def hessian(point):
        return torch.func.hessian(lambda p: ((p[0] * p[1] * x - y) ** 2).sum())(point)
    on = hessian(torch.tensor([0.7, -0.7], dtype=DT))                     # Oᵀθ = 0
    torch.testing.assert_close(R @ on @ R, on)
    vectors = torch.linalg.eigh(on).eigenvectors
    assert sorted(float(abs(v @ n)) for v in vectors.T) == pytest.approx([0.0, 1.0], abs=1e-12)
    off = hessian(torch.tensor([0.7, -0.2], dtype=DT))
    assert float((R @ off @ R - off).abs().max()) > 1e-2


# ---------------------------------------------------------------- [Zhao2026] Thm. 4.5.9, Prop. 4.5.12, 4.5.14–4.5.16


def test_thm_4_5_9_argmax_is_infinite_on_a_scaling_orbit_and_the_bound_holds_for_a_compact_group():
    """Thm. 4.5.9 assumes ``argmax_g ‖∇L(g·w)‖²`` exists. (a) On the scaling orbit of ``L = ½(uv − y)²``,
    ``‖∇L(gu, v/g)‖² = (uv − y)²(v²/g² + g²u²)`` grows like ``g²``: no maximiser, the left side of eq. 4.46 is
    infinite off the minima. (b) With a compact group the maximiser exists and the proof goes through (the descent
    lemma at ``g^t·w^t``, using only ``L(g·w) = L(w)`` and each ``L(·, ξ)`` β-smooth): ``G = {1, g}``,
    ``g = [[1, 1], [0, −1]]`` (``g² = 1``, not orthogonal), ``L(w, ξ) = ½‖w − c_ξ‖² + ½‖gw − c_ξ‖²``; SGD with a
    teleport to the larger gradient before every step, ``η = 1/(β√(T − 1))``, 400 runs for the expectation:
    eq. 4.46 holds, and the teleport does change the gradient (the max over ``G`` exceeds ``‖∇L(w)‖``)."""
    def product_loss(w):
        return 0.5 * (w[0] * w[1] - 2.0) ** 2
    w = torch.tensor([0.7, -1.3], dtype=DT)
    norms = [float((torch.func.grad(product_loss)(w * torch.tensor([s, 1 / s], dtype=DT)) ** 2).sum())
             for s in (10.0, 100.0, 1000.0)]
    assert norms[1] / norms[0] > 90 and norms[2] / norms[1] > 99          # unbounded: no argmax on the orbit

    gen = torch.Generator().manual_seed(9)
    g = torch.tensor([[1.0, 1.0], [0.0, -1.0]], dtype=DT)
    torch.testing.assert_close(g @ g, torch.eye(2, dtype=DT))
    centres = torch.randn(8, 2, generator=gen, dtype=DT)                 # ξ uniform over 8 data points
    A = torch.eye(2, dtype=DT) + g.T @ g                                 # every L(·, ξ) has Hessian A
    beta = float(torch.linalg.eigvalsh(A).max())

    def grads(w, c):                                                     # ∇_w L(w, ξ) for rows w, c
        return (w - c) + ((w @ g.T) - c) @ g

    def losses(w, c):
        return 0.5 * (((w - c) ** 2).sum(-1) + (((w @ g.T) - c) ** 2).sum(-1))
    full_minimiser = torch.linalg.solve(A, (centres + centres @ g).mean(0))
    point_minima = torch.linalg.solve(A, (centres + centres @ g).T).T
    L_star = float(losses(full_minimiser, centres).mean())
    sigma2 = L_star - float(losses(point_minima, centres).mean())
    runs, T = 400, 101
    eta = 1 / (beta * math.sqrt(T - 1))
    w = torch.full((runs, 2), 3.0, dtype=DT)
    w[:, 1] = -2.0
    L0 = float(losses(w[:1], centres).mean())

    def full_grad(w):
        return torch.stack([grads(w, c) for c in centres]).mean(0)
    orbit_max, plain = [], []
    for _ in range(T):
        candidates = torch.stack([w, w @ g.T])                           # the orbit {w, g·w}
        sq = (torch.stack([full_grad(c) for c in candidates]) ** 2).sum(-1)
        orbit_max.append(float(sq.max(0).values.mean()))
        plain.append(float(sq[0].mean()))
        w = torch.where((sq[1] > sq[0])[:, None], candidates[1], candidates[0])   # g^t ∈ argmax
        xi = torch.randint(len(centres), (runs,), generator=gen)
        w = w - eta * grads(w, centres[xi])
    bound = 2 * beta / math.sqrt(T - 1) * (L0 - L_star) + beta * sigma2 / math.sqrt(T - 1)
    assert min(orbit_max) <= bound
    assert max(a / b for a, b in zip(orbit_max, plain)) > 1.5            # the teleport is not the identity


def test_prop_4_5_12_eigenvalue_bound_and_linear_factor_are_misprinted():
    """Prop. 4.5.12. At ``w' = argmax_{L(w) = L(w₀)} ‖∇L‖²`` the Lagrange condition is ``∇²L(w')∇L(w') = λ₀∇L(w')``,
    so ``w₁ = w' − γ∇L(w')`` is the damped Newton step ``w' − γλ₀∇²L(w')⁻¹∇L(w')`` (eq. 4.51, holds). Two errata:
    (a) ``λ₀`` is an eigenvalue of ``∇²L(w')``, bounded by ``λ_max(∇²L(w'))``, not ``λ_max(∇²L(w₀))``: on
    ``L = ½x² + ¼y⁴``, level 1, ``w₀ = (√2, 0)``: ``λ_max(∇²L(w₀)) = 1``, ``w' = (0, √2)``, ``λ₀ = 6``. (b) The linear
    factor is ``L/μ``, not ``L/(2μ)`` (Lemma C.3.1 integrates ``∫s ds`` on a term that has no ``s``): on
    ``L = ½wᵀHw``, ``H = diag(1, 1.5)``, ``w₁ = (1 − γλ₀)w'`` exactly, above the printed ``0.75|1 − γλ₀|‖w'‖``."""
    def quartic(w):
        return 0.5 * w[0] ** 2 + 0.25 * w[1] ** 4
    angle = torch.linspace(0, 2 * math.pi, 20001, dtype=DT)[:-1]         # level 1: x = √2 cos a, y² = 2|sin a|
    level = torch.stack([math.sqrt(2) * torch.cos(angle), torch.sign(torch.sin(angle))
                         * (2 * torch.sin(angle).abs()).sqrt()], 1)
    torch.testing.assert_close(torch.vmap(quartic)(level), torch.ones(len(level), dtype=DT))
    sq = (torch.vmap(torch.func.grad(quartic))(level) ** 2).sum(1)
    w_prime = level[int(sq.argmax())]
    torch.testing.assert_close(w_prime.abs(), torch.tensor([0.0, math.sqrt(2)], dtype=DT), rtol=0, atol=1e-9)
    H_prime, gradient = torch.func.hessian(quartic)(w_prime), torch.func.grad(quartic)(w_prime)
    lam0 = float(gradient @ H_prime @ gradient / (gradient @ gradient))
    torch.testing.assert_close(H_prime @ gradient, lam0 * gradient)      # the Lagrange condition (C.42)
    w0 = torch.tensor([math.sqrt(2), 0.0], dtype=DT)
    assert abs(lam0 - 6) < 1e-9
    assert lam0 > 5 * float(torch.linalg.eigvalsh(torch.func.hessian(quartic)(w0)).max())   # printed bound fails
    assert lam0 <= float(torch.linalg.eigvalsh(H_prime).max()) + 1e-12                     # corrected bound

    H = torch.diag(torch.tensor([1.0, 1.5], dtype=DT))                   # μ = 1, L = 1.5, G = 0, w* = 0
    w_prime = torch.tensor([0.0, 0.8], dtype=DT)                         # the top eigenvector: the argmax
    for gamma in (0.1, 0.4, 0.6):
        lam0 = 1.5
        w1 = w_prime - gamma * H @ w_prime
        torch.testing.assert_close(w1, w_prime - gamma * lam0 * torch.linalg.solve(H, H @ w_prime))  # eq. 4.51
        distance = float(w1.norm())
        assert distance > abs(1 - gamma * lam0) * (1.5 / 2) * float(w_prime.norm()) * 1.3     # printed fails
        assert distance <= abs(1 - gamma * lam0) * 1.5 * float(w_prime.norm()) + 1e-15         # L/μ holds


def _cubic_with_an_optimal_point(T_scale: float, n: int = 3, seed: int = 12):
    """``L(w) = gᵀd + ½dᵀH₀d + ⅙T(d, d, d)``, ``d = w − w₀``, with ``H₀ ≻ 0`` and ``g`` an eigenvector of ``H₀``:
    ``w₀`` is optimal (``∇²L∇L ∥ ∇L``); ``T`` a random symmetric 3-tensor times ``T_scale``."""
    gen = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=DT)).Q
    H0 = Q @ torch.diag(torch.tensor([1.0, 2.0, 3.5], dtype=DT)) @ Q.T
    g = 0.8 * Q[:, 1]
    raw = torch.randn(n, n, n, generator=gen, dtype=DT)
    T = T_scale * sum(raw.permute(p) for p in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))) / 6
    w0 = torch.randn(n, generator=gen, dtype=DT)

    def loss(w):
        d = w - w0
        return g @ d + 0.5 * d @ H0 @ d + torch.einsum("ijk,i,j,k->", T, d, d, d) / 6
    return loss, w0, T


def _bracket_terms(loss, M):
    """``[A, R]L`` for ``A = M∇L``, ``R = −∇L``, from the bracket of vector fields ``[A, R] = DR·A − DA·R``."""
    grad = torch.func.grad(loss)

    def A(w):
        return M @ grad(w)

    def R(w):
        return -grad(w)

    def bracket_L(w):
        field = torch.func.jacfwd(R)(w) @ A(w) - torch.func.jacfwd(A)(w) @ R(w)
        return grad(w) @ field
    return bracket_L, A, R


def test_props_4_5_14_to_4_5_16_one_teleport_is_enough_for_quadratics_not_in_general():
    """Prop. 4.5.14: ``[A, R]L = −Af`` with ``f = ‖∇L‖²`` (``A ⊥ ∇L``), checked at a generic point from the bracket
    of the vector fields. Prop. 4.5.16: at an optimal point (``∇²L∇L = λ∇L``), ``R[A, R]L = −2 M_ij ∂_iL ∂³_{jlk}L
    ∂_lL ∂_kL`` for ``A = M∇L``: the printed condition up to the factor ``−2``; its other terms are
    ``−2(∇Lᵀ∇²LM∇²L∇L − ∇Lᵀ(∇²L)²M∇L)``, zero there. Prop. 4.5.15 (with ``d/dt [A, R]L(γ(t)) = +R[A, R]L``; the
    proof's eq. 4.53 has a minus) on a cubic: ``T = 0`` (a quadratic) keeps the flow from an optimal point optimal
    to ``1e-10`` (one teleport is enough); a generic ``T`` makes ``R[A, R]L ≠ 0`` and the flow leaves optimality at
    the predicted first-order rate."""
    basis = [torch.zeros(3, 3, dtype=DT) for _ in range(3)]
    for M, (i, j) in zip(basis, ((0, 1), (0, 2), (1, 2))):
        M[i, j], M[j, i] = 1.0, -1.0
    loss, w0, T = _cubic_with_an_optimal_point(1.0)
    grad = torch.func.grad(loss)

    def f(w):
        return (grad(w) ** 2).sum()
    generic = w0 + torch.tensor([0.3, -0.2, 0.5], dtype=DT)
    for M in basis:
        bracket_L, A, R = _bracket_terms(loss, M)
        torch.testing.assert_close(bracket_L(generic), -(A(generic) @ torch.func.grad(f)(generic)))  # 4.5.14
        assert abs(float(bracket_L(generic))) > 1e-2                      # not optimal there
        assert abs(float(bracket_L(w0))) < 1e-12                          # w₀ is optimal
        rate = R(w0) @ torch.func.grad(bracket_L)(w0)                     # R[A, R]L at w₀
        g0 = grad(w0)
        printed = torch.einsum("ij,i,jlk,l,k->", M, g0, T, g0, g0)      # T = ∂³L at w₀
        torch.testing.assert_close(rate, -2 * printed)                    # 4.5.16
    rates = [abs(float(R(w0) @ torch.func.grad(_bracket_terms(loss, M)[0])(w0))) for M in basis]
    assert max(rates) > 1e-2                                              # the condition fails for this cubic
    t = 0.01
    for T_scale in (0.0, 1.0):
        loss, w0, _ = _cubic_with_an_optimal_point(T_scale)
        (w_t,) = _rk4(lambda s, grad=torch.func.grad(loss): (-grad(s[0]),), (w0,), t / 10, 10)[-1]
        for M in basis:
            bracket_L, _, R = _bracket_terms(loss, M)
            drift = float(bracket_L(w_t))
            if T_scale == 0:
                assert abs(drift) < 1e-10                                 # Prop. 4.5.15: stays optimal
            else:                                                         # leaves at the rate R[A, R]L
                predicted = t * float(R(w0) @ torch.func.grad(bracket_L)(w0))
                assert abs(drift - predicted) < 0.05 * t * max(rates)

# ---------------------------------------------------------------- [Zhao2026] Props. 2.7.1–2.7.3, Fig. 2.5


def test_radial_spectral_flow_conserves_lambda_and_converges_at_the_printed_rate_and_bound():
    """``L = ½‖Y − U g(Vᵀ)‖²``, ``g(W)_i = W_i/|W_i|²`` (``h(r) = r⁻²``), spectral start ``U = ΦŪ``, ``V = ΨV̄``.
    Prop. 2.7.1: the flow stays spectral and each ``λ_i = ū_i² + v̄_i²`` is conserved (eq. 2.27 with
    ``∫g/g' = −v²/2``). Prop. 2.7.2: ``σ̇_i = (σ_i^Y − σ_i)(σ_i² + 1)²/λ_i`` (eq. 2.35, checked against the flow's own
    field). Prop. 2.7.3: ``|σ_i − σ_i^Y| ≤ |σ_i(0) − σ_i^Y| e^{−t/λ_i}`` holds for starts on both sides of ``σ^Y``,
    although the proof's eq. 2.46 (``… ≥ (σ^Y − σ)/λ``) holds only below it. Fig. 2.5: smaller ``λ``, faster."""
    gen = torch.Generator().manual_seed(10)
    Phi, sigma_y, PsiT = torch.linalg.svd(torch.randn(3, 3, generator=gen, dtype=DT))
    Psi = PsiT.T

    def g(W):
        return W / (W ** 2).sum(1, keepdim=True)

    def loss(U, V):
        return 0.5 * ((Phi @ torch.diag(sigma_y) @ PsiT - U @ g(V.T)) ** 2).sum()
    grad = torch.func.grad(loss, argnums=(0, 1))

    def field(state):
        return tuple(-d for d in grad(*state))

    def diagonals(U, V):
        return torch.diagonal(Phi.T @ U), torch.diagonal(Psi.T @ V)
    v0 = torch.tensor([1.0, 0.6, 1.5], dtype=DT)
    x0 = torch.stack([0.2 * sigma_y[0], 1.5 * sigma_y[1], 0.5 * sigma_y[2]])       # component 1 starts above σ^Y
    start = (Phi @ torch.diag(x0 * v0), Psi @ torch.diag(v0))
    path = _rk4(field, start, 1e-3, 2000)
    lam0 = sum(d ** 2 for d in diagonals(*start))
    for k, (U, V) in enumerate(path[::200]):
        u, v = diagonals(U, V)
        assert float((Phi.T @ U - torch.diag(u)).abs().max()) < 1e-12        # stays spectral
        torch.testing.assert_close(u ** 2 + v ** 2, lam0, rtol=1e-9, atol=0)  # Prop. 2.7.1
        x, time = u / v, 200 * k * 1e-3
        bound = (x0 - sigma_y).abs() * torch.exp(-time / lam0)
        assert bool(((x - sigma_y).abs() <= bound + 1e-12).all())            # Prop. 2.7.3
        du, dv = diagonals(*field((U, V)))
        torch.testing.assert_close(du / v - u * dv / v ** 2,                  # Prop. 2.7.2
                                   (sigma_y - x) * (x ** 2 + 1) ** 2 / lam0, rtol=1e-9, atol=1e-12)
    # Fig. 2.5: the same σ(0), half the λ (ū, v̄ scaled by 1/√2): closer to Y after the same time
    small = (start[0] / math.sqrt(2), start[1] / math.sqrt(2))
    ends = [_rk4(field, s, 1e-3, 500)[-1] for s in (start, small)]
    assert float(loss(*ends[1])) < 0.7 * float(loss(*ends[0]))                 # measured: 0.0091 against 0.0156


# ---------------------------------------------------------------- [Zhao2023] App. C.8.1: the polar radius


def test_zhao2023_app_c_polar_radius_is_the_root_of_the_sum_of_squares():
    """App. C.8.1: on a gradient flow of a loss invariant under ``exp(tM)``, ``M`` antisymmetric,
    ``γ̇ᵀMγ = Σ_{i<j} m_ij(γ̇_iγ_j − γ_iγ̇_j) = 0``, written as ``Σ m_ij r_ij² θ̇_ij`` with ``θ_ij`` the polar angle of
    ``(γ_i, γ_j)``. The printed ``r_ij = √(γ_i² − γ_j²)`` is wrong (imaginary when ``|γ_j| > |γ_i|``); the polar radius
    is ``√(γ_i² + γ_j²)``, and ``γ_i²(γ_j/γ_i)' = γ_iγ̇_j − γ_jγ̇_i`` is ``−(γ̇_iγ_j − γ_iγ̇_j)`` (a sign the proof
    drops; the sum is zero either way). Measured along RK4 gradient flow in ``R³``, ``θ̇`` by central differences of
    the unwrapped angle: the corrected sum vanishes to the difference error, the printed one does not."""
    gen = torch.Generator().manual_seed(7)
    A = torch.randn(3, 3, generator=gen, dtype=DT)
    M = A - A.T
    axis = torch.stack([M[1, 2], -M[0, 2], M[0, 1]])                    # M @ axis = 0: the rotation's axis
    axis = axis / axis.norm()

    def loss(w):                                                       # invariant under exp(tM)
        return (w @ w - 1) ** 2 + (axis @ w - 0.3) ** 2 + (w @ w) * (axis @ w)
    grad = torch.func.grad(loss)
    w0 = torch.randn(3, generator=gen, dtype=DT)
    torch.testing.assert_close(loss(torch.linalg.matrix_exp(0.7 * M) @ w0), loss(w0), rtol=1e-12, atol=0)
    dt = 1e-3
    path = torch.stack([s[0] for s in _rk4(lambda s: (-grad(s[0]),), (w0,), dt, 400)])
    pairs = [(0, 1), (0, 2), (1, 2)]
    theta = torch.stack([torch.atan2(path[:, j], path[:, i]) for i, j in pairs], 1)
    theta_dot = torch.diff(torch.from_numpy(np.unwrap(theta.numpy(), axis=0)), dim=0)
    theta_dot = (theta_dot[1:] + theta_dot[:-1]) / (2 * dt)             # central differences at path[1:-1]
    inner = path[1:-1]
    weights = torch.stack([M[i, j] for i, j in pairs])
    corrected = torch.stack([inner[:, i] ** 2 + inner[:, j] ** 2 for i, j in pairs], 1)
    printed = torch.stack([inner[:, i] ** 2 - inner[:, j] ** 2 for i, j in pairs], 1)
    scale = float((weights * corrected * theta_dot.abs()).sum(1).max())
    assert scale > 0.1                                                 # the flow really rotates
    residual = float((corrected * theta_dot @ weights).abs().max())
    assert residual < 1e-5 * scale
    assert float((printed * theta_dot @ weights).abs().max()) > max(0.01 * scale, 1e3 * residual)
    for column, (i, j) in enumerate(pairs):                            # (r cos θ, r sin θ) = (γ_i, γ_j)
        def deviation(r2, angle=theta[1:-1, column], point=inner[:, [i, j]]):
            r = r2.abs().sqrt()
            return float((torch.stack([r * torch.cos(angle), r * torch.sin(angle)], 1) - point).abs().max())
        assert deviation(corrected[:, column]) < 1e-12
        assert deviation(printed[:, column]) > 1e-2
