"""Loss symmetries (O(m) on the last layer of a Gram loss) and distribution symmetries (W ↦ W A⁻¹ on a first
layer), each checked exactly where it holds: on the batch, in exact expectation, and not elsewhere."""
from __future__ import annotations

import pytest
import sympy as sp
import torch

import symalg
import symalg.numeric.sampling
from symalg.applications.conjugated import TOLERANCE, matrix_exp
from symalg.applications.loss_symmetries import (DistributionSymmetry, GramLossSymmetry, MomentStabiliser,
                                                 barlow_twins_loss, gaussian_expectation, info_nce_loss, moments,
                                                 paired_monte_carlo, spectral_contrastive_loss, two_view_loss)


# -- loss symmetry ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ssl_setup():
    generator = torch.Generator().manual_seed(3)
    arch = symalg.parse("linear(4, 6) -> tanh -> linear(6, 3)")
    forward = symalg.numeric.sampling.network_function(arch)
    params = symalg.numeric.sampling.random_params(arch, generator)
    x1 = torch.randn(12, 4, generator=generator, dtype=torch.float64)
    x2 = x1 + 0.1 * torch.randn(12, 4, generator=generator, dtype=torch.float64)  # a second "view"
    return forward, params, x1, x2


def test_gram_derivation_is_zero():
    for value in GramLossSymmetry("2.weight", "2.bias", 3, 6).derivation().values():
        assert value == sp.ZeroMatrix(*value.shape) or value == 0


@pytest.mark.parametrize("loss_fn", [spectral_contrastive_loss, info_nce_loss])
def test_gram_losses_are_invariant_on_the_batch(ssl_setup, loss_fn):
    forward, params, x1, x2 = ssl_setup
    symmetry = GramLossSymmetry("2.weight", "2.bias", 3, 6)
    loss = two_view_loss(forward, loss_fn, x1, x2)
    report = symmetry.verify(loss, params, outputs=lambda p: forward(p, x1))
    assert report.passed, report
    checks = {c.check for c in report.checks}
    assert {"invariance", "gram_invariance", "gradient_orthogonality", "angular_momentum", "group_axioms",
            "lowering"} <= checks
    assert all(c.tolerance == TOLERANCE for c in report.checks)


def test_loss_symmetry_is_not_a_network_symmetry(ssl_setup):
    """The outputs move (a plain MSE on them changes) while the Gram loss does not."""
    forward, params, x1, x2 = ssl_setup
    symmetry = GramLossSymmetry("2.weight", "2.bias", 3, 6)
    g = matrix_exp(symmetry.group.random_algebra_element(1.0, torch.Generator().manual_seed(0)))
    moved = symmetry.apply(params, g)
    assert (forward(moved, x1) - forward(params, x1)).abs().max() > 1e-2
    target = torch.zeros(12, 3, dtype=torch.float64)
    target[:, 0] = 1
    mse = lambda p: ((forward(p, x1) - target) ** 2).mean()  # noqa: E731
    report = {c.check: c for c in symmetry.verify(mse, params).checks}
    assert report["invariance"].failed and report["gradient_orthogonality"].failed


def test_barlow_twins_is_not_rotation_invariant(ssl_setup):
    """Per-coordinate standardisation breaks O(m): the verifier must fail, not pass vacuously."""
    forward, params, x1, x2 = ssl_setup
    symmetry = GramLossSymmetry("2.weight", "2.bias", 3, 6)
    report = {c.check: c for c in symmetry.verify(two_view_loss(forward, barlow_twins_loss, x1, x2), params).checks}
    assert report["invariance"].failed and report["invariance"].max_error > 1e-3
    assert report["gradient_orthogonality"].failed and report["angular_momentum"].failed
    assert report["group_axioms"].passed and all(c.passed for c in symmetry.verify(
        two_view_loss(forward, barlow_twins_loss, x1, x2), params).checks if c.check == "lowering")


def test_bias_free_last_layer_and_angular_momentum_formula():
    arch = symalg.parse("linear(3, 5) -> relu -> linear(5, 4, bias=False)")
    forward = symalg.numeric.sampling.network_function(arch)
    generator = torch.Generator().manual_seed(1)
    params = symalg.numeric.sampling.random_params(arch, generator)
    x = torch.randn(10, 3, generator=generator, dtype=torch.float64)
    symmetry = GramLossSymmetry("2.weight", None, 4, 5)
    assert symmetry.verify(two_view_loss(forward, spectral_contrastive_loss, x, x.flip(0)), params).passed
    W, V = params["2.weight"], torch.randn(4, 5, generator=generator, dtype=torch.float64)
    assert torch.allclose(symmetry.angular_momentum(params, {"2.weight": V}), W @ V.T - V @ W.T)
    assert "torch.matmul(Q, W_L)" in symmetry.lowered_action.source


# -- the moment stabiliser --------------------------------------------------------------------------------
def _spd(n, generator):
    B = torch.randn(n, n, generator=generator, dtype=torch.float64)
    return B @ B.T / n + 0.5 * torch.eye(n, dtype=torch.float64)


def test_moment_stabiliser_algebra_and_elements(generator):
    n = 5
    F = torch.randn(n, 2, generator=generator, dtype=torch.float64)
    S = _spd(n, generator)
    with_form, without = MomentStabiliser(n, F, S), MomentStabiliser(n, F)
    assert with_form.dim == 3 and without.dim == 15  # (n − 2)(n − 3)/2 and n(n − 2)
    assert without.n_symmetric == 6 and with_form.n_symmetric == 0
    for group in (with_form, without):
        basis = group.algebra_basis()
        assert int(torch.linalg.matrix_rank(basis.reshape(len(basis), -1))) == group.dim
        group.check_algebra_element(basis)
        g = matrix_exp(group.random_algebra_element(2.0, generator))
        group.check_element(g)
        for generator_ in group.discrete_generators():
            group.check_element(generator_)
            assert torch.linalg.det(generator_) < 0
    assert torch.allclose(without.symmetric_basis(), without.symmetric_basis().transpose(-1, -2))
    with pytest.raises(ValueError, match="A S Aᵀ ≠ S"):
        with_form.check_element(matrix_exp(without.random_algebra_element(1.0, generator)))


def test_no_symmetric_generator_preserves_a_positive_definite_form(generator):
    """Symmetric M with MS + SMᵀ = 0 is 0: the linear map M ↦ (MS + SM, M − Mᵀ) is injective."""
    n = 4
    S = _spd(n, generator)
    E = torch.eye(n * n, dtype=torch.float64).reshape(-1, n, n)
    images = torch.cat([(E @ S + S @ E.transpose(-1, -2)).reshape(n * n, -1),
                        (E - E.transpose(-1, -2)).reshape(n * n, -1)], 1)
    assert torch.linalg.matrix_rank(images) == n * n


def test_moment_stabiliser_rejects_bad_arguments():
    with pytest.raises(ValueError, match="fixed must be an n × k tensor"):
        MomentStabiliser(3, torch.zeros(2, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="symmetric positive-definite"):
        MomentStabiliser(2, torch.ones(2, 1, dtype=torch.float64), -torch.eye(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="preserve must contain 'mean'"):
        DistributionSymmetry.from_moments("0.weight", 1, {"mean": torch.ones(2, 1)}, ("second",))
    with pytest.raises(ValueError, match=r"data has no \['second'\]"):
        DistributionSymmetry.from_moments("0.weight", 1, {"mean": torch.ones(2, 1)}, ("mean", "second"))


# -- distribution symmetry: linear layer, moments -------------------------------------------------------------
@pytest.fixture(scope="module")
def regression():
    generator = torch.Generator().manual_seed(5)
    n, m, batch = 6, 1, 64
    x = torch.randn(batch, n, generator=generator, dtype=torch.float64) + torch.tensor([1.0, 0, 0, 0, 0, 2.0],
                                                                                       dtype=torch.float64)
    y = (x @ torch.randn(m, n, generator=generator, dtype=torch.float64).T
         + 0.1 * torch.randn(batch, m, generator=generator, dtype=torch.float64))
    params = {"0.weight": torch.randn(m, n, generator=generator, dtype=torch.float64),
              "0.bias": torch.randn(m, generator=generator, dtype=torch.float64)}
    return x, y, params


def test_mean_fixing_group_leaves_the_mean_residual_invariant_and_conserves_c(regression):
    x, y, params = regression
    symmetry = DistributionSymmetry.from_moments("0.weight", 1, moments(x, y), ("mean",), bias="0.bias")
    derivation = symmetry.derivation()
    assert derivation["E[z] = W mu + b"] == sp.ZeroMatrix(1, 1) and derivation["|E[Wx + b - y]|^2"] == 0
    report = {c.check: c for c in symmetry.verify(symmetry.mean_residual_loss, params).checks}
    assert all(c.passed for c in report.values()), report
    assert {"gd_drift", "gradient_flow", "group_axioms", "lowering"} <= set(report)
    assert symmetry.group.dim == 30


def test_mean_fixing_group_does_not_leave_the_expected_squared_error_invariant(regression):
    """Example 1.3.7 proves invariance of E[Wx − y] (a vector), not of E‖Wx − y‖², which reads S and C."""
    x, y, params = regression
    symmetry = DistributionSymmetry.from_moments("0.weight", 1, moments(x, y), ("mean",), bias="0.bias")
    assert symmetry.derivation()["E|Wx + b - y|^2"] != 0
    report = {c.check: c for c in symmetry.verify(symmetry.expected_mse, params).checks}
    assert report["invariance"].failed and report["invariance"].max_error > 1e-2
    assert report["gradient_orthogonality"].failed and report["gradient_flow"].failed


def test_two_moment_group_is_exact_on_the_batch_and_only_in_expectation_elsewhere(regression):
    x, y, params = regression
    symmetry = DistributionSymmetry.from_moments("0.weight", 1, moments(x, y), ("mean", "second", "cross"),
                                                 bias="0.bias")
    assert all(v == 0 or v == sp.ZeroMatrix(*v.shape) for v in symmetry.derivation().values())
    assert symmetry.group.dim == 6  # O(6 − 2)
    batch_mse = lambda p: ((x @ p["0.weight"].T + p["0.bias"] - y) ** 2).sum(-1).mean()  # noqa: E731
    assert torch.allclose(symmetry.expected_mse(params), batch_mse(params), rtol=1e-13)
    for loss in (symmetry.expected_mse, batch_mse):
        report = symmetry.verify(loss, params)
        assert report.passed, report
        assert "relation" in {c.check for c in report.checks}
    generator = torch.Generator().manual_seed(9)
    fresh_x = torch.randn(64, 6, generator=generator, dtype=torch.float64) + x.mean(0)
    fresh_y = fresh_x @ torch.linalg.lstsq(x, y, driver="gelsd").solution
    fresh = lambda p: ((fresh_x @ p["0.weight"].T + p["0.bias"] - fresh_y) ** 2).sum(-1).mean()  # noqa: E731
    moved = symmetry.apply(params, matrix_exp(symmetry.group.random_algebra_element(2.0, generator)))
    assert abs(fresh(moved) - fresh(params)) > 1e-3 * fresh(params)  # another sample of the distribution moves


def test_lowered_distribution_code_uses_a_solve():
    symmetry = DistributionSymmetry.from_moments("0.weight", 2, {"mean": torch.ones(3, 1, dtype=torch.float64)})
    assert "torch.linalg.solve(A, W_1, left=False)" in symmetry.lowered_action.source
    with pytest.raises(ValueError, match="no relation J"):
        symmetry.relation({"0.weight": torch.zeros(2, 3, dtype=torch.float64)}, torch.zeros(2, 3, dtype=torch.float64))


# -- distribution symmetry: Gaussian data, any network with a linear first layer -------------------------------
@pytest.fixture(scope="module")
def gaussian_setup():
    generator = torch.Generator().manual_seed(2)
    arch = symalg.parse("linear(3, 5) -> gelu -> linear(5, 2)")  # GELU is entire: Gauss–Hermite converges fast
    forward = symalg.numeric.sampling.network_function(arch)
    params = symalg.numeric.sampling.random_params(arch, generator)
    mean = torch.tensor([0.5, -1.0, 0.3], dtype=torch.float64)
    covariance = _spd(3, generator)
    target = torch.tensor([0.2, -0.4], dtype=torch.float64)
    per_sample = lambda p: (lambda x: ((forward(p, x) - target) ** 2).sum(-1))  # noqa: E731
    symmetry = DistributionSymmetry.from_moments(
        "0.weight", 5, {"mean": mean[:, None], "second": covariance + mean[:, None] * mean[None]}, ("mean", "second"))
    return params, mean, covariance, per_sample, symmetry


def test_gaussian_expected_loss_is_invariant_by_quadrature(gaussian_setup):
    params, mean, covariance, per_sample, symmetry = gaussian_setup
    expected = lambda p: gaussian_expectation(per_sample(p), mean, covariance, nodes=40)  # noqa: E731
    report = symmetry.verify(expected, params)
    assert report.passed, report
    assert symmetry.group.dim == 1  # O(2): the directions orthogonal to Σ^{-1/2}μ in whitened coordinates


def test_gaussian_symmetry_by_paired_monte_carlo_and_a_non_symmetry(gaussian_setup):
    params, mean, covariance, per_sample, symmetry = gaussian_setup
    generator = torch.Generator().manual_seed(4)
    noise = torch.randn(50_000, 3, generator=generator, dtype=torch.float64)
    samples = mean + noise @ torch.linalg.cholesky(covariance).T
    moved = symmetry.apply(params, matrix_exp(symmetry.group.random_algebra_element(2.0, generator)))
    difference, error = paired_monte_carlo(per_sample(moved), per_sample(params), samples)
    assert abs(difference) < 5 * error  # unbiased: the law of A⁻¹x is the law of x
    assert (per_sample(moved)(samples) - per_sample(params)(samples)).abs().max() > 1e-2  # but not pointwise
    mean_only = DistributionSymmetry.from_moments("0.weight", 5, {"mean": mean[:, None]})
    wrong = mean_only.apply(params, matrix_exp(mean_only.group.random_algebra_element(1.0, generator)))
    difference, error = paired_monte_carlo(per_sample(wrong), per_sample(params), samples)
    assert abs(difference) > 20 * error
    exact = [gaussian_expectation(per_sample(p), mean, covariance, nodes=40) for p in (wrong, params)]
    assert abs(exact[0] - exact[1]) > 1e-3
