"""Flat minima: ``dim ker H`` against the orbit dimension, and ``H t = 0`` for the orbit's tangents.

Expected dimensions are derived here from the structure of each model (docs/flat_minima.md), from
ranks measured at the point, never copied from the code under test.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import symalg
import symalg.numeric.sampling
from symalg.applications.flat_minima import (flat_minimum, hessian_null_space, hessian_vector_products,
                                             linear_teacher_minimum, model_loss, orbit_tangents, train_to_minimum)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: on a loaded 2-core machine, two OpenMP threads make ``eigvalsh`` of a
    750 × 750 matrix take seconds instead of 0.03 s."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def relu_net(n, h, m):
    return nn.Sequential(nn.Linear(n, h), nn.ReLU(), nn.Linear(h, m)).double()


def teacher_data(model, samples, generator):
    """Inputs and the model's own outputs: the model's parameters are a zero-loss minimum."""
    x = torch.randn(samples, model[0].in_features, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        return x, model(x)


def rank(matrix):
    return int(torch.linalg.matrix_rank(matrix))


def in_span(vectors, rows):
    """Residual of the orthogonal projection of each of ``vectors`` onto the row span of ``rows`` (through the
    pseudo-inverse: ``torch.linalg.lstsq``'s default driver returned wrong solutions for these rank-deficient
    ``rows`` in one full-suite run)."""
    projected = vectors @ torch.linalg.pinv(rows, rtol=1e-10) @ rows
    return (projected - vectors).norm(dim=1) / vectors.norm(dim=1)


def dense_hessian(model, x, y):
    params = {k: v.detach() for k, v in model.named_parameters()}
    size = sum(v.numel() for v in params.values())
    return hessian_vector_products(model_loss(model, x, y), params, torch.eye(size))


# -- the acceptance case ------------------------------------------------------------------------
def test_two_layer_linear_10_50_5_null_dimension_equals_orbit_dimension():
    n, h, m = 10, 50, 5
    model, x, y = linear_teacher_minimum(n, h, m, samples=40)
    V, U = model[0].weight.detach(), model[2].weight.detach()
    r_v, r_u = rank(V), rank(U)
    assert (r_v, r_u) == (10, 5)
    # GL(h) stabiliser at (U, V): M with M V = 0 and U M = 0, dimension (h − r_V)(h − r_U).
    expected_orbit = h * h - (h - r_v) * (h - r_u)
    # At zero loss with inputs spanning R^n, ker H = {(dU, dV): dU V + U dV = 0}; the image of that map is
    # {X V} + {U Y}: m r_V + n r_U − r_U r_V dimensions.
    params = dict(model.named_parameters())
    P = sum(v.numel() for v in params.values())
    expected_null = P - (m * r_v + n * r_u - r_u * r_v)
    assert (P, expected_orbit, expected_null) == (750, 700, 700)

    report = flat_minimum(model, x, y)
    assert report.loss < 1e-25
    assert (report.n_params, report.orbit_dimension, report.null_dimension) == (750, 700, 700)
    assert report.orbit.exact and report.null_space.method == "dense"
    assert report.null_space.gap > 1e6          # a clean spectral gap, not a threshold artefact
    assert report.null_space.most_negative > -report.null_space.rtol
    assert report.tangent_residual < 1e-12 and report.passed and report.excess == 0
    assert "exactly the orbit's tangent space" in report.explanation

    spec = symalg.derive(symalg.parse("linear(10, 50, bias=False) -> identity -> linear(50, 5, bias=False)"))
    assert spec.orbit_dimension(params).dimension == 700 and spec.orbit_dimension() == 700
    from_spec = flat_minimum(spec, x, y, params)
    assert (from_spec.orbit_dimension, from_spec.null_dimension) == (700, 700)
    assert "750" in str(report) and "700" in str(report)


def test_trained_linear_network_at_a_nonzero_loss_minimum():
    """L-BFGS from a random start on noisy targets, then Newton steps (L-BFGS's line search stalls near
    ‖∇L‖ ~ 1e-8, where loss differences reach rounding): the minimum has U V = the least-squares map, the
    residual term of H vanishes there (``∇ℓ(UV) = 0``), and ker H is again the orbit."""
    n, h, m = 6, 12, 4
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(30, n, generator=generator, dtype=torch.float64)
    y = x @ torch.randn(n, m, generator=generator, dtype=torch.float64) + 0.3 * torch.randn(30, m, generator=generator,
                                                                                            dtype=torch.float64)
    torch.manual_seed(3)
    student = nn.Sequential(nn.Linear(n, h, bias=False), nn.Identity(), nn.Linear(h, m, bias=False)).double()
    run = train_to_minimum(student, x, y, newton_steps=5)
    assert run.loss > 0.01 and run.gradient_norm < 1e-12
    report = flat_minimum(run.model, x, y)
    assert report.orbit_dimension == h * h - (h - n) * (h - m) == 96
    assert report.null_dimension == 96 and report.null_space.gap > 1e3
    assert report.tangents_in_null_space and report.passed


# -- excess null directions, explained ----------------------------------------------------------
def test_linear_bottleneck_has_flat_directions_beyond_the_orbit():
    """``min(n, m) < h < max(n, m)``: the fibre of ``(U, V) ↦ UV`` exceeds the GL(h) orbit by
    ``(h − m)(n − h)``: ``dV = K xᵀ`` with ``U K = 0`` and ``x ⊥ row(V)`` keeps ``UV`` and is no tangent."""
    n, h, m = 6, 5, 3
    model, x, y = linear_teacher_minimum(n, h, m, samples=20)
    report = flat_minimum(model, x, y)
    assert report.orbit_dimension == h * h == 25                      # V (5 × 6) has full row rank
    assert report.excess == (h - m) * (n - h) == 2
    assert report.passed and "no claimed symmetry generates" in report.explanation

    V, U = model[0].weight.detach(), model[2].weight.detach()
    K = torch.linalg.svd(U).Vh[m:].T                                   # ker U, h × (h − m)
    x_perp = torch.linalg.svd(V).Vh[h:].T                              # row(V)^⊥, n × (n − h)
    extra = torch.stack([torch.cat([(K[:, [i]] @ x_perp[:, [j]].T).reshape(-1), U.new_zeros(m * h)])
                         for i in range(h - m) for j in range(n - h)])
    H = dense_hessian(model, x, y)
    assert (extra @ H).norm() < 1e-12 * H.norm()
    assert in_span(extra, report.orbit.vectors).min() > 0.1


def test_mixed_model_excess_from_bias_translations_and_a_bottleneck():
    """``relu`` site (PositiveScaling(8)) then an identity site ``GL(6)`` between 8 relu features and 3
    outputs, with biases: the orbit has 8 + 36 + 6 dimensions, the six bias translations ``(b₂ + δ, b₃ − W₃δ)``
    included (the shear symalg claims, ``Shears(6)``), and the bottleneck 3 < 6 < 8 adds ``(6 − 3)(8 − 6) = 6``
    beyond it."""
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.Identity(), nn.Linear(6, 3)).double()
    x, y = teacher_data(model, 96, generator)
    report = flat_minimum(model, x, y)
    assert report.orbit_dimension == 8 + 36 + 6
    assert report.excess == 6 and report.passed

    params = {k: v.detach() for k, v in model.named_parameters()}
    sizes = {k: v.numel() for k, v in params.items()}
    translations = []
    for delta in torch.eye(6, dtype=torch.float64):
        parts = {k: torch.zeros(s, dtype=torch.float64) for k, s in sizes.items()}
        parts["2.bias"], parts["4.bias"] = delta, -params["4.weight"] @ delta
        translations.append(torch.cat(list(parts.values())))
    translations = torch.stack(translations)
    H = dense_hessian(model, x, y)
    assert (translations @ H).norm() < 1e-12 * H.norm()
    assert in_span(translations, report.orbit.vectors).max() < 1e-10   # now orbit tangents


def balanced_relu_net(n, h, m, x):
    """A ReLU network whose hidden biases are the negated median pre-activations: every neuron is active
    on half of ``x`` (no neuron acts linearly or is dead on the data)."""
    model = relu_net(n, h, m)
    with torch.no_grad():
        model[0].bias -= (x @ model[0].weight.T + model[0].bias).median(dim=0).values
    return model


def test_relu_network_at_a_zero_loss_minimum_with_enough_data():
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = balanced_relu_net(4, 8, 3, x)
    y = model(x).detach()
    report = flat_minimum(model, x, y)
    assert report.orbit.symmetries == ("PositiveScaling(8, alpha=1) on 0",)
    assert (report.n_params, report.orbit_dimension, report.null_dimension) == (67, 8, 8)
    assert report.tangent_residual < 1e-12 and report.passed


def test_relu_neuron_active_on_all_data_adds_a_bias_translation():
    """A neuron active on every data point acts linearly there: ``b₁ⱼ + δ, b₂ − u_j δ`` is flat, and no
    positive scaling generates it (a degenerate point: excess 1)."""
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = balanced_relu_net(4, 8, 3, x)
    with torch.no_grad():
        model[0].bias[3] += 0.5 - model[0](x)[:, 3].min()
    assert bool((model[0](x)[:, 3] > 0).all())
    report = flat_minimum(model, x, model(x).detach())
    assert report.orbit_dimension == 8 and report.excess == 1 and report.passed
    params = {k: v.detach() for k, v in model.named_parameters()}
    parts = {k: torch.zeros_like(v) for k, v in params.items()}
    parts["0.bias"][3], parts["2.bias"] = 1.0, -params["2.weight"][:, 3]
    direction = torch.cat([v.reshape(-1) for v in parts.values()])
    H = dense_hessian(model, x, model(x).detach())
    assert (H @ direction).norm() < 1e-12 * H.norm() and in_span(direction[None], report.orbit.vectors) > 0.1


def test_too_few_data_points_force_an_excess():
    """At zero loss ``H = JᵀJ/N`` has rank ``N·d_out`` (generic, here 5·3 < P − 8)."""
    model = relu_net(4, 8, 3)
    x, y = teacher_data(model, 5, torch.Generator().manual_seed(0))
    report = flat_minimum(model, x, y)
    assert report.null_dimension == 67 - 5 * 3 and report.orbit_dimension == 8
    assert report.passed and "forced by the data" in report.explanation


# -- matrix-free against dense ------------------------------------------------------------------
@pytest.mark.parametrize("case", ["linear_10_50_5", "relu_few_data", "mixed"])
def test_randomized_null_space_agrees_with_dense(case):
    generator = torch.Generator().manual_seed(0)
    if case == "linear_10_50_5":
        model, x, y = linear_teacher_minimum(10, 50, 5, samples=40)
    else:
        torch.manual_seed(2)
        model = relu_net(4, 8, 3) if case == "relu_few_data" else \
            nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 6), nn.Identity(), nn.Linear(6, 3)).double()
        x, y = teacher_data(model, 5 if case == "relu_few_data" else 12, generator)
    dense = flat_minimum(model, x, y, method="dense")
    randomized = flat_minimum(model, x, y, method="randomized")
    assert randomized.null_space.method == "randomized" and randomized.null_space.certified
    assert randomized.null_dimension == dense.null_dimension
    assert randomized.null_space.norm == pytest.approx(dense.null_space.norm, rel=1e-10)
    assert randomized.null_space.smallest_kept == pytest.approx(dense.null_space.smallest_kept, rel=1e-6)
    assert randomized.tangent_residual < 1e-12 and randomized.passed
    if case == "linear_10_50_5":
        assert randomized.null_space.hvps < 750 // 2                  # rank 50: far fewer products than P


def test_hessian_vector_products_match_torch_func_hessian():
    model = relu_net(3, 5, 2)
    x, y = teacher_data(model, 7, torch.Generator().manual_seed(0))
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = model_loss(model, x, y)

    def flat_loss(vector):
        chunks = torch.split(vector, [v.numel() for v in params.values()])
        return loss({k: c.reshape(v.shape) for (k, v), c in zip(params.items(), chunks)})

    flat = torch.cat([v.reshape(-1) for v in params.values()])
    H = torch.func.hessian(flat_loss)(flat)
    vectors = torch.randn(4, flat.numel(), dtype=torch.float64)
    assert torch.allclose(hessian_vector_products(loss, params, vectors), vectors @ H, atol=1e-12)


def test_hessian_vector_products_through_scaled_dot_product_attention_match_the_explicit_softmax():
    # forward-over-reverse through F.scaled_dot_product_attention needs the math kernel (torch's CPU flash kernel
    # has no forward-mode rule); the same weights with softmax(QKᵀ/√d) V written out give the same H v.
    from test_models import HandAttention

    x, y = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    products = []
    for explicit in (False, True):
        torch.manual_seed(1)
        model = HandAttention(8, 2, explicit).double()
        params = {k: v.detach() for k, v in model.named_parameters()}
        vectors = torch.randn(3, sum(v.numel() for v in params.values()), dtype=torch.float64,
                              generator=torch.Generator().manual_seed(2))
        products.append(hessian_vector_products(model_loss(model, x, y), params, vectors))
    assert products[0].norm() > 0
    torch.testing.assert_close(products[0], products[1], rtol=1e-10, atol=1e-12)


def test_randomized_method_refuses_an_unresolved_rank():
    model = relu_net(4, 8, 3)
    x, y = teacher_data(model, 64, torch.Generator().manual_seed(0))               # rank 59
    with pytest.raises(ValueError, match="max_rank=16"):
        flat_minimum(model, x, y, method="randomized", block=8, max_rank=16)


# -- negative controls: the checks can fail -----------------------------------------------------
def test_away_from_a_critical_point_tangents_leave_the_null_space_as_predicted():
    """``H (M·θ) = −𝔐ᵀ∇L``: nonzero at a non-critical point, and equal to the prediction."""
    model = relu_net(4, 8, 3)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(64, 3, generator=generator, dtype=torch.float64)
    report = flat_minimum(model, x, y)
    assert report.tangent_residual > 1e-3 and not report.passed
    assert "not a critical point" in report.explanation and "FAILED" in str(report)

    loss = model_loss(model, x, y)
    params = {k: v.detach() for k, v in model.named_parameters()}
    gradient = torch.func.grad(loss)(params)
    symmetry = symalg.derive(symalg.trace(model, (x,))).symmetries[0]
    for M in symmetry.group.algebra_basis():
        live = {k: v.clone().requires_grad_() for k, v in params.items()}
        pairing = sum((gradient[k] * t).sum() for k, t in symmetry.tangent(live, M).items())
        adjoint = torch.autograd.grad(pairing, list(live.values()), allow_unused=True)      # 𝔐ᵀ∇L
        adjoint = torch.cat([(a if a is not None else torch.zeros_like(v)).reshape(-1)
                             for a, v in zip(adjoint, params.values())])
        tangent = torch.cat([symmetry.tangent(params, M).get(k, torch.zeros_like(v)).reshape(-1)
                             for k, v in params.items()])
        Ht = hessian_vector_products(loss, params, tangent[None])[0]
        assert Ht.norm() > 1e-3 * tangent.norm()
        assert torch.allclose(Ht, -adjoint, atol=1e-12)


def test_a_claimed_non_symmetry_is_caught_at_a_minimum():
    """GL(8) of the identity network, claimed for the ReLU network with the same parameter names."""
    model = relu_net(4, 8, 3)
    x, y = teacher_data(model, 64, torch.Generator().manual_seed(0))
    wrong = symalg.derive(symalg.parse("linear(4, 8) -> identity -> linear(8, 3)")).symmetries
    report = flat_minimum(model, x, y, symmetries=wrong)
    assert report.loss == 0 and report.tangent_residual > 1e-3 and not report.passed
    assert "claimed symmetry that is not one" in report.explanation
    H = dense_hessian(model, x, y)
    direction = torch.randn(H.shape[0], dtype=torch.float64)
    assert (H @ direction).norm() > 1e-3 * H.norm() * direction.norm()


# -- pieces -------------------------------------------------------------------------------------
def test_orbit_tangents_basis_and_random_combinations_agree():
    analysis = symalg.derive("linear(3, 4, bias=False) -> identity -> linear(4, 2, bias=False)")
    params = symalg.numeric.sampling.random_params(analysis.architecture, torch.Generator().manual_seed(0))
    basis = orbit_tangents(analysis.symmetries, params)
    sampled = orbit_tangents(analysis.symmetries, params, max_tangents=15)                 # 15 < dim gl(4)
    assert basis.vectors.shape == (16, 20) and sampled.vectors.shape == (15, 20)
    assert basis.dimension == sampled.dimension == 16 - (4 - 3) * (4 - 2) and sampled.exact
    assert in_span(sampled.vectors, basis.vectors).max() < 1e-12
    assert orbit_tangents(analysis.symmetries, params, max_tangents=10).exact is False   # rank 14 > 10 rows


def test_hessian_null_space_of_a_hyperbola():
    loss = lambda p: ((p["u"] * p["v"] - 1.0) ** 2).sum()  # noqa: E731
    params = {"u": torch.tensor([2.0, 1.0]), "v": torch.tensor([0.5, 1.0])}
    for method in ("dense", "randomized"):
        null = hessian_null_space(loss, params, method=method)
        assert (null.dimension, null.rank) == (2, 2) and null.certified


@pytest.mark.parametrize("kwargs, message", [({"method": "lanczos"}, "method"), ({"loss": "hinge"}, "loss"),
                                             ({"rtol": 2.0}, "rtol"), ({"max_rank": 0}, "max_rank"),
                                             ({"max_tangents": 0}, "max_tangents")])
def test_bad_arguments_are_named(kwargs, message):
    model = relu_net(2, 3, 1)
    x, y = teacher_data(model, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=message):
        flat_minimum(model, x, y, **kwargs)


def test_spec_analysis_runs_its_generated_module_and_reads_symbolic_widths_off_params():
    """A spec analysis goes through the same path as a traced one: its generated module, with its seeded
    parameters by default; symbolic widths are read off ``params`` and refused without them."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    concrete = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    module = concrete.model_graph.model
    y = module(x).detach()                                   # the seeded parameters are a zero-loss minimum
    report = flat_minimum(concrete, x, y)
    assert report.label == "linear(3, 4) -> relu -> linear(4, 2)" and report.loss == 0
    assert (report.n_params, report.orbit_dimension) == (26, 4) and report.passed
    other = {k: v.detach() + 0.1 for k, v in module.named_parameters()}
    assert flat_minimum(concrete, x, y, other).loss > 1e-4          # explicit params are honoured

    symbolic = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    at_params = flat_minimum(symbolic, x, y, dict(module.named_parameters()))
    assert (at_params.n_params, at_params.orbit_dimension, at_params.null_dimension) == \
        (report.n_params, report.orbit_dimension, report.null_dimension)
    with pytest.raises(symalg.SpecError, match="symbolic"):
        flat_minimum(symbolic, x, y)
    with pytest.raises(symalg.SpecError, match="'0.weight' is missing"):
        flat_minimum(symbolic, x, y, {})
    with pytest.raises(TypeError, match="nn.Module or an Analysis"):
        flat_minimum("linear(3, 4) -> relu -> linear(4, 2)", x, y)


# -- heavier: trained nonlinear minima ----------------------------------------------------------
@pytest.mark.slow
def test_trained_radial_network_excess_is_the_derived_non_symmetric_flat_directions():
    """``linear(5, 16) -> radial -> linear(16, 3)`` trained on noisy teacher data (nonzero loss).

    With ``S = col[W₁ b₁]`` (``s = 6``), the function depends on ``W₂`` only on ``S``; rotations fixing
    ``S`` move ``W₂|S^⊥`` (3 × 10) along an ``so(10)``-orbit of dimension ``45 − so(7)``, missing
    ``30 − 24 = 6`` directions; and ``σ(z) = z/√(1 + ‖z‖²)`` with a bias has a one-parameter rescaling
    ``(W₂B, BᵀB) ↦ (λW₂B, λ²BᵀB + (λ² − 1) e eᵀ)`` (``e`` the bias coordinate): excess 7.

    Seed 0 converges (L-BFGS, then 2 Newton steps to ‖∇L‖ ~ 1e-14); in our trials seeds 1–5 stall at
    ‖∇L‖ ≈ 1e-6–1e-5 with slightly negative curvature (no certified minimum within this budget).
    """
    analysis = symalg.derive("linear(5, 16) -> radial -> linear(16, 3)")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    teacher, student = symalg.to_module(analysis.architecture), symalg.to_module(analysis.architecture)
    x = torch.randn(200, 5, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        y = teacher(x) + 0.1 * torch.randn(200, 3, generator=generator, dtype=torch.float64)
    run = train_to_minimum(student, x, y, max_iter=300, newton_steps=10)
    assert run.gradient_norm < 1e-12 and run.loss > 1e-3
    report = flat_minimum(analysis, x, y, dict(run.model.named_parameters()))
    assert report.orbit_dimension == 120 - 21                           # so(16) minus so(16 − (5 + 1 + 3))
    assert report.excess == 7 and report.null_space.gap > 1e6
    assert report.null_space.most_negative > -report.null_space.rtol and report.passed


@pytest.mark.slow
def test_large_relu_network_trained_to_zero_loss_with_hessian_vector_products_only():
    torch.manual_seed(0)
    teacher = relu_net(16, 32, 4)
    student = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4)).double()
    x, y = teacher_data(teacher, 48, torch.Generator().manual_seed(0))
    run = train_to_minimum(student, x, y, gtol=1e-13)
    report = flat_minimum(run.model, x, y)
    assert report.n_params == 19204 and report.null_space.method == "randomized" and report.null_space.certified
    assert report.null_dimension == 19204 - 48 * 4 and report.orbit_dimension == 256
    assert report.tangents_in_null_space and "forced by the data" in report.explanation
