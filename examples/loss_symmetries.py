"""Loss and distribution symmetries, each checked exactly where it holds (``symalg.applications.loss_symmetries``).

Part 1, loss symmetry: ``linear(4, 6) -> tanh -> linear(6, 3)`` trained by a two-view self-supervised loss.
``O(3)`` acts on the last layer (``W ↦ QW, b ↦ Qb``); on the given batch the spectral-contrastive and cosine
InfoNCE losses are invariant (they read only inner products of outputs), while the outputs themselves move
and Barlow Twins (per-coordinate standardisation) is not invariant. Columns: worst relative loss change,
Gram-matrix change, ``⟨∇L, A·θ⟩`` per generator, heavy-ball angular momentum ``J(t) = e^{−γt} J(0)``, and how
far the outputs move.

Part 2, distribution symmetries ``W ↦ W A⁻¹`` on a first layer, with the expectation computed exactly: from
moments (a linear layer; the empirical distribution of a batch), by Gauss–Hermite quadrature (Gaussian data,
``linear(3, 5) -> gelu -> linear(5, 2)``) and by paired Monte Carlo with its standard error.

Run: ``python examples/loss_symmetries.py [--quick]`` (well under a minute). Every number is also printed
as a ``key=value`` token.
"""
from __future__ import annotations

import argparse

import torch

import symalg
import symalg.numeric.sampling
from symalg.applications.conjugated import matrix_exp
from symalg.applications.loss_symmetries import (DistributionSymmetry, GramLossSymmetry, barlow_twins_loss,
                                                 gaussian_expectation, info_nce_loss, moments, paired_monte_carlo,
                                                 spectral_contrastive_loss, two_view_loss)


def _row(label, key, values, formats):
    print(f"{label:44} " + " ".join(f"{v:>{w}}" if isinstance(v, str) else f"{v:>{w}.2e}"
                                    for v, w in zip(values, formats)))
    return key


def loss_symmetry_table(generator) -> None:
    arch = symalg.parse("linear(4, 6) -> tanh -> linear(6, 3)")
    forward = symalg.numeric.sampling.network_function(arch)
    params = symalg.numeric.sampling.random_params(arch, generator)
    x1 = torch.randn(12, 4, generator=generator)
    x2 = x1 + 0.1 * torch.randn(12, 4, generator=generator)
    symmetry = GramLossSymmetry("2.weight", "2.bias", 3, 6)
    print("Part 1. Loss symmetry O(3) on the last layer; two views of 12 samples; tolerance 1e-10")
    print(f"{'loss':44} {'invariance':>10} {'Gram':>9} {'grad ⊥':>9} {'J decay':>9} {'outputs':>8}  verdict")
    for name, loss_fn in (("spectral contrastive", spectral_contrastive_loss), ("InfoNCE (cosine)", info_nce_loss),
                          ("Barlow Twins (control)", barlow_twins_loss)):
        report = symmetry.verify(two_view_loss(forward, loss_fn, x1, x2), params, outputs=lambda p: forward(p, x1))
        c = {r.check: r for r in report.checks}
        moved = c["gram_invariance"].detail.split("by ")[1].split(" ")[0]
        print(f"{name:44} {c['invariance'].max_error:10.1e} {c['gram_invariance'].max_error:9.1e} "
              f"{c['gradient_orthogonality'].max_error:9.1e} {c['angular_momentum'].max_error:9.1e} {moved:>8}  "
              f"{'symmetry' if report.passed else 'NOT a symmetry'}")
        key = name.split(" ")[0].lower()
        print(f"  {key}_invariance={c['invariance'].max_error:.3e}"
              f" {key}_gradient={c['gradient_orthogonality'].max_error:.3e}"
              f" {key}_momentum={c['angular_momentum'].max_error:.3e} {key}_passed={int(report.passed)}")


def distribution_table(generator, samples: int) -> None:
    print("\nPart 2. Distribution symmetries W ↦ W A⁻¹ on the first layer; tolerance 1e-10")
    print(f"{'case':44} {'dim G':>5} {'invariance':>10} {'grad ⊥':>9} {'C / J':>9}  verdict")
    n, batch = 6, 64
    x = torch.randn(batch, n, generator=generator) + torch.tensor([1.0, 0, 0, 0, 0, 2.0])
    y = x @ torch.randn(1, n, generator=generator).T + 0.1 * torch.randn(batch, 1, generator=generator)
    params = {"0.weight": torch.randn(1, n, generator=generator), "0.bias": torch.randn(1, generator=generator)}
    data = moments(x, y)
    mean_only = DistributionSymmetry.from_moments("0.weight", 1, data, ("mean",), bias="0.bias")
    two = DistributionSymmetry.from_moments("0.weight", 1, data, ("mean", "second", "cross"), bias="0.bias")
    batch_mse = lambda p: ((x @ p["0.weight"].T + p["0.bias"] - y) ** 2).sum(-1).mean()  # noqa: E731
    cases = [("Aμ = μ: |E[Wx + b − y]|² (Ex. 1.3.7)", "mean_residual", mean_only, mean_only.mean_residual_loss),
             ("Aμ = μ: E|Wx + b − y|² (not invariant)", "mean_mse", mean_only, mean_only.expected_mse),
             ("+ ASAᵀ = S, AC = C: E|Wx+b−y|² (moments)", "moments_mse", two, two.expected_mse),
             ("+ ASAᵀ = S, AC = C: the batch's own MSE", "batch_mse", two, batch_mse)]
    for label, key, symmetry, loss in cases:
        report = symmetry.verify(loss, params)
        c = {r.check: r for r in report.checks}
        dynamic = c.get("gradient_flow", c.get("relation"))
        print(f"{label:44} {int(symmetry.group.dim):5d} {c['invariance'].max_error:10.1e} "
              f"{c['gradient_orthogonality'].max_error:9.1e} {dynamic.max_error:9.1e}  "
              f"{'symmetry' if report.passed else 'NOT a symmetry'}")
        print(f"  {key}_invariance={c['invariance'].max_error:.3e} {key}_passed={int(report.passed)}")
    fresh_x = torch.randn(batch, n, generator=generator) + x.mean(0)
    fresh_y = fresh_x @ torch.linalg.lstsq(x, y, driver="gelsd").solution
    fresh = lambda p: ((fresh_x @ p["0.weight"].T + p["0.bias"] - fresh_y) ** 2).sum(-1).mean()  # noqa: E731
    moved = two.apply(params, matrix_exp(two.group.random_algebra_element(2.0, generator)))
    change = ((fresh(moved) - fresh(params)).abs() / fresh(params)).item()
    print(f"{'  same A, a fresh batch of the distribution':44} {'':5} {change:10.1e}  (in expectation only)")
    print(f"  fresh_batch_change={change:.3e}")

    arch = symalg.parse("linear(3, 5) -> gelu -> linear(5, 2)")
    forward = symalg.numeric.sampling.network_function(arch)
    net = symalg.numeric.sampling.random_params(arch, generator)
    mean = torch.tensor([0.5, -1.0, 0.3])
    B = torch.randn(3, 3, generator=generator)
    covariance = B @ B.T / 3 + 0.5 * torch.eye(3)
    target = torch.tensor([0.2, -0.4])
    per_sample = lambda p: (lambda v: ((forward(p, v) - target) ** 2).sum(-1))  # noqa: E731
    gaussian = DistributionSymmetry.from_moments(
        "0.weight", 5, {"mean": mean[:, None], "second": covariance + mean[:, None] * mean[None]}, ("mean", "second"))
    expected = lambda p: gaussian_expectation(per_sample(p), mean, covariance, nodes=48)  # noqa: E731
    report = gaussian.verify(expected, net)
    c = {r.check: r for r in report.checks}
    print(f"{'x ~ N(μ, Σ), GELU net, Gauss–Hermite 48³':44} {int(gaussian.group.dim):5d} "
          f"{c['invariance'].max_error:10.1e} "
          f"{c['gradient_orthogonality'].max_error:9.1e} {c['relation'].max_error:9.1e}  "
          f"{'symmetry' if report.passed else 'NOT a symmetry'}")
    print(f"  gaussian_invariance={c['invariance'].max_error:.3e} gaussian_passed={int(report.passed)}")
    draws = mean + torch.randn(samples, 3, generator=generator) @ torch.linalg.cholesky(covariance).T
    moved = gaussian.apply(net, matrix_exp(gaussian.group.random_algebra_element(2.0, generator)))
    difference, error = paired_monte_carlo(per_sample(moved), per_sample(net), draws)
    pointwise = (per_sample(moved)(draws) - per_sample(net)(draws)).abs().max().item()
    print(f"{f'  same, paired Monte Carlo, N = {samples}':44} {'':5} {difference:10.1e} ± {error:.1e} (|Δ|/se = "
          f"{abs(difference) / error:.1f}); per sample up to {pointwise:.2f}")
    print(f"  mc_difference={difference:.3e} mc_standard_error={error:.3e}")
    mean_only = DistributionSymmetry.from_moments("0.weight", 5, {"mean": mean[:, None]})
    wrong = mean_only.apply(net, matrix_exp(mean_only.group.random_algebra_element(1.0, generator)))
    exact_change = (expected(wrong) - expected(net)).abs().item() / expected(net).item()
    difference, error = paired_monte_carlo(per_sample(wrong), per_sample(net), draws)
    print(f"{'  A with Aμ = μ only (control)':44} {'':5} {exact_change:10.1e}  MC {difference:.2e} ± {error:.1e} "
          "NOT a symmetry")
    print(f"  control_change={exact_change:.3e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer Monte-Carlo samples")
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    generator = torch.Generator().manual_seed(0)
    loss_symmetry_table(generator)
    distribution_table(generator, 20_000 if args.quick else 200_000)


if __name__ == "__main__":
    main()
