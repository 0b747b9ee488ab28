"""The null-space solvers of exact discovery: the Gram solver (``eigh`` of ``RᵀR``, then the SVD of the thin ``R V``)
agrees with the dense SVD, keeps singular values that squaring alone would lose, and certifies its result."""
import math

import pytest
import torch

import symalg
from symalg.discovery.exact import _gram_null_space, _gram_rank, _svd_null_space
from symalg.errors import SpecError


def _largest_angle(N1: torch.Tensor, N2: torch.Tensor) -> float:
    """``sin`` of the largest principal angle between the row spaces (orthonormal rows)."""
    return float(torch.linalg.matrix_norm(N2.T - N1.T @ (N1 @ N2.T), ord=2))


def _rows_with_spectrum(m: int, n: int, singular: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``R = U diag(s) Vᵀ`` (``m × n``) with the given nonzero singular values, and its null space (rows)."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, singular.numel(), generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    R = U @ torch.diag(singular) @ V[:, :singular.numel()].T
    return R, V[:, singular.numel():].T


def test_gram_solver_keeps_singular_values_squaring_would_lose():
    # σ = 10⁻⁸ σ_max: λ = 10⁻¹⁶ λ_max, at the rounding of RᵀR; still above the rank rule's 10⁻⁹, so not null
    singular = torch.cat([torch.logspace(0, -3, 50, dtype=torch.float64), torch.full((4,), 1e-8, dtype=torch.float64)])
    R, null = _rows_with_spectrum(90, 60, singular)
    N, decision, certificate = _gram_null_space(R, 1e-9)
    assert N.shape[0] == 6 and decision.rank == 54
    assert _largest_angle(N, null) < 1e-6
    assert certificate.solver == "gram" and certificate.residual < 1e-12 and certificate.complete
    assert certificate.candidates == 10                  # the four 10⁻⁸ directions were searched, then kept
    assert decision.kept == pytest.approx(1e-8, rel=1e-3)
    Ns, ds, cs = _svd_null_space(R, 1e-9)
    assert ds.rank == 54 and _largest_angle(Ns, N) < 1e-6 and cs.floor == math.inf
    assert _gram_rank(R) == 50                           # the sampling loop's rank test is coarser (σ > 10⁻⁷)


def test_gram_solver_matches_svd_on_a_model_and_certifies_it():
    spec = "linear(2, 3) -> identity -> linear(3, 2)"       # gl(3) and the shears: 12 directions
    gram = symalg.discover(spec, solver="gram", compare=True)
    svd = symalg.discover(spec, solver="svd", compare=True)
    assert (gram.dimension, gram.explained, gram.new) == (svd.dimension, svd.explained, svd.new) == (12, 12, 0)
    c = gram.certificate
    assert c.solver == "gram" and c.residual < 1e-12 and c.complete and c.candidates >= 12
    assert svd.certificate.solver == "svd" and svd.certificate.residual < 1e-12
    assert gram.to_dict()["certificate"]["solver"] == "gram"
    with pytest.raises(SpecError, match="solver must be one of"):
        symalg.discover(spec, solver="lanczos")
