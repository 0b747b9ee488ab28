"""symalg.noether: laws of training dynamics from both front ends, their integration checks and the exact one-step
identities of the discrete schemes, with negative controls (false laws must fail)."""
from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

import symalg
from symalg import noether
from symalg.verification.checks import loss_gradients

SPEC = "linear(3, 4) -> identity -> linear(4, 2)"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The integrations are thousands of tiny ops: on a shared machine extra intra-op threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def traced() -> symalg.Analysis:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4),
                                torch.nn.Linear(4, 2)).double()
    return symalg.derive(symalg.trace(model, (torch.randn(8, 3, dtype=torch.float64),)))


def test_decay_factors_and_kinds():
    assert noether.gradient_flow().kind == "none"
    assert noether.newtonian().factor == 1 and noether.newtonian().kind == "conserved"
    assert sp.simplify(noether.heavy_ball(2).factor - sp.exp(-2 * (noether.t - noether.t_0))) == 0
    assert noether.heavy_ball(2).kind == "exponential decay"
    assert sp.simplify(noether.nesterov_flow().factor - (noether.t_0 / noether.t) ** 3) == 0
    assert noether.nesterov_flow().kind == "power law decay"
    assert noether.dynamics(noether.t, 1).kind == "decay law"
    assert math.isclose(noether.nesterov_flow(start=1.0).phi(2.0), 1 / 8)


def test_bad_dynamics_are_refused():
    with pytest.raises(symalg.SpecError, match="not finite at the start"):
        noether.dynamics(3 / noether.t, 1, start=0.0)
    with pytest.raises(symalg.SpecError, match="never evaluated"):
        noether.dynamics("3/t", 1)
    with pytest.raises(symalg.SpecError, match="both zero"):
        noether.dynamics(0, 0)
    with pytest.raises(symalg.SpecError, match="nesterov needs"):
        noether.momentum(0.1, 0.0, nesterov=True)
    with pytest.raises(symalg.SpecError, match="dynamics must be"):
        symalg.verify(symalg.derive(SPEC), dynamics="heavy ball")


@pytest.mark.parametrize("make", [lambda: symalg.derive(SPEC), traced])
def test_law_classification_both_front_ends(make):
    analysis = make()
    gl = next(s for s in analysis.symmetries if s.group.kind == "GL")
    table = {}
    for dyn in (noether.gradient_flow(), noether.newtonian(), noether.heavy_ball(1.0), noether.nesterov_flow()):
        for law in noether.laws(analysis, dyn):
            if law.symmetry is gl:
                table[(dyn.name.split(" (")[0], law.part)] = law.status
    assert table == {("gradient flow", "symmetric"): "conserved", ("gradient flow", "antisymmetric"): "restriction",
                     ("Newtonian", "symmetric"): "restriction", ("Newtonian", "antisymmetric"): "conserved",
                     ("heavy ball", "symmetric"): "restriction", ("heavy ball", "antisymmetric"): "exponential decay",
                     ("Nesterov flow", "symmetric"): "restriction",
                     ("Nesterov flow", "antisymmetric"): "power law decay"}
    gf = noether.laws(analysis, noether.gradient_flow())
    conserved = next(law for law in gf if law.symmetry is gl and law.conserved)
    lowered = conserved.lowered()
    assert lowered is not None and r"\operatorname{tr}" in conserved.latex()
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    C = next(iter(lowered(params).values()))
    assert torch.allclose(C, noether.momentum_map(gl, params, params), atol=1e-12)   # C = Γ(θ, θ)
    text = noether.laws(analysis, noether.nesterov_flow()).latex()
    assert r"\frac{t_{0}^{3}}{t^{3}}" in text and r"\frac{dE}{dt}" in text


def test_momentum_map_adjoint_and_gradient_zero():
    analysis = traced()
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    u = {k: torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in params.items()}
    x = analysis.model_graph.example_inputs[0]
    model = analysis.model_graph.model
    loss = lambda p: (torch.func.functional_call(model, p, (x,)) ** 2).mean()  # noqa: E731
    grads = loss_gradients(loss, params)
    for s in analysis.symmetries:
        if s.group.is_continuous and noether.charged(s) is None:
            forward, backward = noether.momentum_map(s, params, u), noether.momentum_map(s, u, params)
            assert torch.allclose(forward, backward.T if forward.dim() == 2 else backward, atol=1e-12)
            assert noether.momentum_map(s, params, grads).abs().max() < 1e-12 * grads["0.weight"].norm()


def test_translation_schemes():
    """Batch-norm bias and softmax translations: ℓ = ⟨B, θ⟩ follows each scheme's linear recursion exactly; Adam's
    update moves it (the breaking term is reported)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 3),
                                torch.nn.Softmax(-1)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(8, 3, dtype=torch.float64),)))
    schemes = [noether.gd(0.1, weight_decay=0.1), noether.momentum(0.1, 0.9, nesterov=True, weight_decay=0.01),
               noether.paper_newtonian(0.01), noether.paper_nesterov(0.01), noether.adam(0.01)]
    report = symalg.verify(analysis, dynamics=schemes + [noether.heavy_ball(1.0)])
    assert report.passed, [str(c) for c in report.failures]
    checks = [c for c in report.checks if c.symmetry.startswith("Translations") and c.check.startswith("noether")]
    assert {c.check for c in checks} == {"noether_scheme", "noether_translation"}
    assert all("ℓ' from ⟨B, ∇L⟩ = 0" in c.detail and "S'" not in c.detail
               for c in checks if c.check == "noether_scheme")
    softmax = [c for c in checks if "adam" in c.detail and "along 1" in c.symmetry]
    assert float(softmax[0].detail.rsplit("by up to ", 1)[1].split()[0]) > 1e-3


def test_translation_scheme_tolerance_is_the_whole_gradients_rounding():
    """``nn.MultiheadAttention`` starts ``in_proj_bias`` at zero, so the key-bias translation's ``ℓ(θ) = 0`` and its
    ``⟨B, ∇L⟩`` is the backward pass's rounding (about 1e-19) on a region whose own entries are of that size: the
    check's scale is the rounding of the whole gradient (``max|g| ℓ(1)``), so GD and momentum pass; a loss with a term
    linear in the key bias breaks the translation and fails by orders of magnitude."""
    torch.manual_seed(0)

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.out = torch.nn.MultiheadAttention(8, 2, batch_first=True), torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.out(self.attn(x, x, x, need_weights=False)[0])

    model = Attention().double()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    keys = [s for s in analysis.symmetries if s.group.kind == "T" and s.label.startswith("Translations(4, bias)")]
    assert len(keys) == 2
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert float(params["attn.in_proj_bias"].abs().max()) == 0.0
    loss = lambda p: (torch.func.functional_call(model, p, (x,)) ** 2).mean()  # noqa: E731
    for scheme in (noether.gd(0.01), noether.momentum(0.01, 0.9)):
        results = noether.check_scheme(keys, lambda k: loss, params, scheme, steps=4)
        assert results and all(r.passed for r in results), [str(r) for r in results]
    broken = lambda p: loss(p) + 0.1 * p["attn.in_proj_bias"][8:16].sum()  # noqa: E731  (the key bias)
    results = noether.check_scheme(keys, lambda k: broken, params, noether.gd(0.01), steps=4)
    assert all(r.max_error > 1e3 * r.tolerance for r in results), [str(r) for r in results]


def test_orthogonal_group_charges():
    """O(4) of a radial activation has only antisymmetric generators: a decay law, no quantity; its scheme identities
    hold although every projected C is zero (the tolerance is relative to the step's vectors, not to C)."""
    analysis = symalg.derive("linear(3, 4) -> radial -> linear(4, 2)")
    [law] = noether.laws(analysis, noether.nesterov_flow()).laws
    assert (law.part, law.status) == ("antisymmetric", "power law decay")
    report = symalg.verify(analysis, dynamics=[noether.newtonian(), noether.momentum(0.1, 0.9),
                                               noether.paper_newtonian(0.01), noether.paper_nesterov(0.01)])
    assert report.passed, [str(c) for c in report.failures]


@pytest.mark.parametrize("make", [lambda: symalg.derive(SPEC), traced])
def test_verify_dynamics_all_laws_and_schemes(make):
    dynamics = [noether.newtonian(), noether.heavy_ball(2.0), noether.nesterov_flow(), noether.dynamics(noether.t, 2),
                noether.gd(0.1, weight_decay=0.1), noether.gd(0.1, batch=3), noether.momentum(0.1, 0.9),
                noether.momentum(0.1, 0.9, nesterov=True, weight_decay=0.01),
                noether.momentum(0.05, 0.8, dampening=0.1, weight_decay=0.1, decoupled=True),
                noether.paper_newtonian(0.01), noether.paper_nesterov(0.01), noether.adam(0.01)]
    report = symalg.verify(make(), dynamics=dynamics)
    checks = [c for c in report.checks if c.check.startswith("noether")]
    assert report.passed, [str(c) for c in report.failures]
    kinds = {c.check for c in checks}
    assert kinds == {"noether_decay", "noether_restriction", "noether_energy", "noether_scheme"}
    assert all(c.tolerance <= 1e-12 for c in checks if c.check == "noether_scheme")
    adam = [c for c in checks if "adam" in c.detail]
    broken = [float(c.detail.rsplit("by up to ", 1)[1].split()[0]) for c in adam]
    assert min(broken) > 1e-3   # Adam's update is not orthogonal to the orbit: what it breaks


def _rotation_charge(run_theta, run_velocity):
    w, v = run_theta["w"], run_velocity["w"]
    return torch.linalg.cross(w, v)


def test_toy_angular_momentum_plane_and_energy():
    """The paper's toy L = (‖w‖² − 1)² (invariant under O(3)): Newtonian dynamics conserves w × ẇ and the energy,
    Nesterov's flow damps w × ẇ exactly as (t₀/t)³; both stay in the plane y = z."""
    loss = lambda p: ((p["w"] ** 2).sum() - 1) ** 2  # noqa: E731
    w0 = {"w": torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)}
    v0 = {"w": torch.tensor([-2.0, 1.0, 1.0], dtype=torch.float64)}
    start = _rotation_charge(w0, v0)
    assert torch.allclose(start, torch.tensor([0.0, -1.5, 1.5], dtype=torch.float64))
    newton = noether.integrate(noether.newtonian(), loss, w0, v0, 3.0, 2000)
    assert torch.allclose(_rotation_charge(newton.thetas[-1], newton.velocities[-1]), start, atol=1e-10)
    assert abs(newton.energy(-1) - newton.energy(0)) < 1e-8
    flow = noether.nesterov_flow(start=1.0)
    nag = noether.integrate(flow, loss, w0, v0, 3.0, 2000)
    end = _rotation_charge(nag.thetas[-1], nag.velocities[-1])
    assert torch.allclose(end, start * flow.phi(nag.times[-1]), atol=1e-10)
    assert not torch.allclose(end, start, atol=1e-2)                      # negative control: not conserved
    assert max(abs(float(th["w"][1] - th["w"][2])) for th in nag.thetas) < 1e-12
    assert abs(nag.energy(-1) + nag.dissipated[-1] - nag.energy(0)) < 1e-8


def test_discrete_invariants_exact():
    """Heavy-ball momentum: anti Γ(θ, b) decays as μ^k exactly; the paper's Newtonian scheme conserves
    anti Γ(w_k, w_{k+1}) exactly; plain GD does not conserve C (it drifts by η² Γ(g, g))."""
    analysis = symalg.derive(SPEC)
    gl = analysis.symmetries[0]
    model = analysis.model_graph.model
    x = analysis.model_graph.example_inputs[0]
    y = torch.randn(8, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    loss = lambda p: ((torch.func.functional_call(model, p, (x,)) - y) ** 2).mean()  # noqa: E731
    params = {k: v.detach() for k, v in model.named_parameters()}
    mu = 0.9
    start = {k: torch.ones_like(v) for k, v in params.items()}   # from rest the charge is 0 and stays 0
    steps, _ = noether.run_scheme(noether.momentum(0.1, mu), lambda k: loss, params, 30, velocity=start)
    anti = lambda X: (X - X.T) / 2  # noqa: E731
    first = anti(noether.momentum_map(gl, steps[1].theta, steps[1].buffer))
    last = anti(noether.momentum_map(gl, steps[-1].theta, steps[-1].buffer))
    assert first.abs().max() > 1e-4
    assert torch.allclose(last, mu ** 28 * first, rtol=1e-10, atol=1e-15)
    steps, _ = noether.run_scheme(noether.paper_newtonian(0.05), lambda k: loss, params, 40,
                                  velocity={k: torch.ones_like(v) for k, v in params.items()})
    charges = [anti(noether.momentum_map(gl, s.previous, s.theta)) for s in steps]
    assert charges[0].abs().max() > 1e-3
    assert max(float((c - charges[0]).abs().max()) for c in charges) < 1e-12 * float(charges[0].abs().max()) * 10
    steps, final = noether.run_scheme(noether.gd(0.1), lambda k: loss, params, 5)
    drift = noether.momentum_map(gl, final, final) - noether.momentum_map(gl, params, params)
    assert drift.abs().max() > 1e-8


def test_false_laws_fail():
    """Negative controls: the heavy-ball charge checked as if conserved, and the momentum identity checked with the
    wrong μ, both exceed the tolerance by orders of magnitude."""
    analysis = traced()
    gl = next(s for s in analysis.symmetries if s.group.kind == "GL")
    model = analysis.model_graph.model
    x = analysis.model_graph.example_inputs[0]
    loss = lambda p: (torch.func.functional_call(model, p, (x,)) ** 2).mean()  # noqa: E731
    params = {k: v.detach() for k, v in model.named_parameters()}
    v0 = {k: torch.ones_like(v) for k, v in params.items()}
    run = noether.integrate(noether.heavy_ball(1.0), loss, params, v0, 0.5, 200)
    anti = lambda X: (X - X.T) / 2  # noqa: E731
    j0 = anti(noether.momentum_map(gl, run.thetas[0], run.velocities[0]))
    j1 = anti(noether.momentum_map(gl, run.thetas[-1], run.velocities[-1]))
    assert (j1 - j0).abs().max() / j0.abs().max() > 0.1                       # not conserved ...
    assert (j1 - math.exp(-0.5) * j0).abs().max() / j0.abs().max() < 1e-10   # ... it decays as e^{-γt}
    wrong = noether.momentum(0.1, 0.5)
    steps, _ = noether.run_scheme(noether.momentum(0.1, 0.9), lambda k: loss, params, 5)
    from symalg.applications.noether import _one_step
    step = steps[3]
    new = {k: step.theta[k] - 0.1 * step.d[k] for k in step.theta}
    rows, _ = _one_step(wrong, lambda u, w: noether.momentum_map(gl, u, w), step, new)
    scale = max(float(a.abs().max()) for _, a, _ in rows)
    assert max(float((a - b).abs().max()) for _, a, b in rows) / scale > 1e-6


def test_repu_chain_law():
    """ReLU, RePU(2), RePU(2), ReLU: gradient flow keeps Δ‖W₂‖² = 2² Δ‖W₄‖² (the p^k law, no biases)."""
    spec = ("linear(4, 5, bias=False) -> relu -> linear(5, 5, bias=False) -> relu_pow(alpha=2) -> "
            "linear(5, 5, bias=False) -> relu_pow(alpha=2) -> linear(5, 5, bias=False) -> relu -> "
            "linear(5, 2, bias=False)")
    analysis = symalg.derive(spec)
    alphas = [s.group.homogeneity for s in analysis.symmetries if s.group.kind == "PS"]
    assert alphas == [1, 2, 2, 1]
    model = analysis.model_graph.model
    x = analysis.model_graph.example_inputs[0]
    y = torch.randn(x.shape[0], 2, generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    loss = lambda p: ((torch.func.functional_call(model, p, (x,)) - y) ** 2).mean()  # noqa: E731
    params = {k: v.detach() for k, v in model.named_parameters()}
    run = noether.integrate(noether.gradient_flow(), loss, params, None, 0.5, 400)
    sq = lambda th, k: float((th[k] ** 2).sum())  # noqa: E731
    d2 = sq(run.thetas[-1], "2.weight") - sq(run.thetas[0], "2.weight")
    d4 = sq(run.thetas[-1], "6.weight") - sq(run.thetas[0], "6.weight")
    assert abs(d2) > 1e-4 and abs(d2 - 4 * d4) < 1e-9 * max(1.0, abs(d2))


def _two_layer(d: int = 6, h: int = 4):
    g = torch.Generator().manual_seed(5)
    return {"0.weight": torch.randn(h, d, generator=g, dtype=torch.float64) / math.sqrt(d),
            "2.weight": torch.randn(1, h, generator=g, dtype=torch.float64) / math.sqrt(h)}


def _finite_loss(n: int, d: int = 6):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    y = x.norm(dim=1, keepdim=True)
    return lambda p: ((torch.relu(x @ p["0.weight"].T) @ p["2.weight"].T - y) ** 2).mean()


def _population_loss(d: int = 6, samples: int = 200):
    """E (W₂ relu(W₁x) − ‖x‖)² for x ~ N(0, I) through (W₁x, ‖x‖) ~ (S z_{1:h}, ‖z‖), S = (W₁W₁ᵀ)^{1/2}:
    a Monte-Carlo estimate that depends on W₁ only through W₁W₁ᵀ, so exactly invariant under W₁ ↦ W₁Qᵀ."""
    z = torch.randn(samples, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def loss(p):
        W1 = p["0.weight"]
        values, vectors = torch.linalg.eigh(W1 @ W1.T)
        S = vectors @ torch.diag(values.clamp_min(0).sqrt()) @ vectors.T
        h = W1.shape[0]
        return ((torch.relu(z[:, :h] @ S.T) @ p["2.weight"].T - z.norm(dim=1, keepdim=True)) ** 2).mean()
    return loss


def test_input_rotation_population_versus_finite_dataset():
    rotation = noether.InputRotation("0.weight")
    params = _two_layer()
    torques = {}
    for n in (100, 10000):
        loss = _finite_loss(n)
        torques[n] = rotation.torque(params, loss_gradients(loss, params))
    population = _population_loss()
    assert rotation.torque(params, loss_gradients(population, params)) < 1e-12
    assert torques[100] > 1e-2 and torques[10000] < torques[100] / 3        # O(1/√n): sampling breaks the law
    status, latex = rotation.law(noether.heavy_ball(1.0))
    assert status == "exponential decay" and r"\operatorname{anti}" in latex
    assert rotation.law(noether.newtonian())[0] == "conserved"
    v0 = {k: torch.ones_like(v) for k, v in params.items()}
    for loss, holds in ((population, True), (_finite_loss(100), False)):
        run = noether.integrate(noether.heavy_ball(1.0), loss, params, v0, 0.5, 100)
        j0, j1 = (rotation.charge(run.thetas[i], run.velocities[i]) for i in (0, -1))
        error = float((j1 - math.exp(-0.5) * j0).abs().max() / j0.abs().max())
        assert (error < 1e-9) if holds else (error > 1e-4), error


def test_gradient_flow_with_weight_decay_damps_the_balance_and_translations():
    """``θ̇ = −∇L − λθ``: invariance kills ``Γ(θ, ∇L)``, so ``Ċ = −2λC`` and ``ℓ̇ = −λℓ``: ``C(t) = e^{−2λt}C(0)``,
    ``ℓ(t) = e^{−λt}ℓ(0)``; the antisymmetric part stays a restriction. ``laws`` states it, ``integrate`` follows it,
    ``verify`` checks it (and the conservation law of plain gradient flow fails on the decayed run)."""
    lam = 0.3
    dyn = noether.gradient_flow(weight_decay=lam)
    assert sp.simplify(dyn.decay - sp.exp(-sp.Rational(3, 10) * (noether.t - noether.t_0))) == 0
    analysis = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)", loss="cross_entropy")
    found = {(law.part, law.status) for law in noether.laws(analysis, dyn)}
    assert ("symmetric", "exponential decay") in found and ("translation", "exponential decay") in found
    symmetric = next(law for law in noether.laws(analysis, dyn) if law.part == "symmetric")
    assert sp.simplify(symmetric.factor - dyn.decay ** 2) == 0
    report = symalg.verify(analysis, dynamics=[dyn])
    decays = [c for c in report.checks if c.check == "noether_decay"]
    assert report.passed and len(decays) >= 2, [str(c) for c in report.failures]
    # the run itself: C decays by e^{−2λT}, not conserved
    from symalg.numeric.sampling import random_params
    params = random_params(analysis.architecture, torch.Generator().manual_seed(2))
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    model = analysis.model_graph.require_model("wd").double()
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    loss = lambda p: torch.nn.functional.cross_entropy(torch.func.functional_call(model, p, (x,)), y)  # noqa: E731
    run = noether.integrate(dyn, loss, params, duration=1.0, steps=400, samples=1)
    (C,) = [q for q in analysis.conserved_quantities() if q.name.startswith("C")]
    c0, c1 = (next(iter(C(p).values())) for p in (run.thetas[0], run.thetas[-1]))
    assert float((c1 - math.exp(-2 * lam) * c0).abs().max()) < 1e-9 * float(c0.abs().max())
    assert float((c1 - c0).abs().max()) > 0.1 * float(c0.abs().max())
    assert abs(run.energy(-1) + run.dissipated[-1] - run.energy(0)) < 1e-9 * run.energy(0)
    with pytest.raises(symalg.SpecError, match="first-order"):
        noether.Dynamics("heavy ball with decay", sp.Integer(1), sp.Integer(1), 0.0, 0.1)
    with pytest.raises(symalg.SpecError, match="weight_decay"):
        noether.gradient_flow(weight_decay=-1.0)
