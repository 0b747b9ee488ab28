"""Linear-algebra helpers shared by every check: the one relative error, and certified bounds on singular values.

>>> import torch
>>> relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
0.2
"""
from __future__ import annotations

from typing import overload

import math

import torch

__all__ = ["relative_error", "smallest_singular_value_bound", "spectral_norm_bound", "triangular_inverse"]


@overload
def relative_error(a: torch.Tensor, b: torch.Tensor, dim: None = None, floor: float = 0.0) -> float: ...


@overload
def relative_error(a: torch.Tensor, b: torch.Tensor, dim: int | tuple[int, ...],
                   floor: float = 0.0) -> torch.Tensor: ...


def relative_error(a: torch.Tensor, b: torch.Tensor, dim: int | tuple[int, ...] | None = None,
                   floor: float = 0.0) -> float | torch.Tensor:
    """The relative difference of ``a`` and ``b``: ``‖a − b‖ / max(‖a‖, ‖b‖, floor)``.

    With ``dim=None`` the norm is the largest absolute entry over the whole tensors and the result is a
    float; with ``dim`` (an axis or a tuple of axes) it is the Euclidean (Frobenius) norm over those axes
    and the result is a tensor holding one error per remaining index (per row, per draw). ``floor`` makes
    the error absolute below that scale (``floor=1``: an error of entries of order one or smaller is
    measured absolutely); when every scale is zero, the dtype's smallest positive number stands in, so
    equal zero tensors give 0 (and any change of a zero tensor gives 1).

    Symmetric in ``a`` and ``b``, so never smaller than half the one-sided ``‖a − b‖ / ‖b‖`` when that is
    below 1.

    >>> rows = relative_error(torch.tensor([[3.0, 4.0], [0.0, 0.0]]), torch.zeros(2, 2), dim=-1, floor=1.0)
    >>> rows.tolist()
    [1.0, 0.0]
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"relative_error: a and b must be tensors, got {type(a).__name__} and {type(b).__name__}")
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise ValueError(f"relative_error: a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)} do not "
                         "broadcast") from None
    tiny = torch.finfo(b.dtype).tiny if b.is_floating_point() else torch.finfo(torch.float64).tiny
    floor = max(float(floor), tiny)
    if dim is None:
        scale = max(a.abs().max().item() if a.numel() else 0.0, b.abs().max().item() if b.numel() else 0.0, floor)
        return (a - b).abs().max().item() / scale if b.numel() else 0.0
    axes = dim

    def norm(x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, dim=axes)

    return norm(a - b) / torch.maximum(norm(a), norm(b)).clamp_min(floor)


def triangular_inverse(R: torch.Tensor, leaf: int = 256) -> torch.Tensor:
    """``R⁻¹`` of an upper-triangular ``n × n`` matrix by recursive 2 × 2 blocks.

    ``R = [[R₁₁, R₁₂], [0, R₂₂]]`` gives ``R⁻¹ = [[X₁₁, −R₁₁⁻¹ R₁₂ X₂₂], [0, X₂₂]]`` with ``Xᵢᵢ = Rᵢᵢ⁻¹``: one
    product and one triangular solve per level, about ``n³/2`` flops in all, against ``n³`` for
    ``torch.linalg.solve_triangular(R, I)`` (which does not know that ``I`` is triangular); blocks of at most
    ``leaf`` rows are solved directly. A zero on the diagonal gives non-finite entries, as the solve would.

    >>> R = torch.tensor([[2.0, 1.0, 0.0], [0.0, 4.0, 2.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    >>> bool(torch.allclose(triangular_inverse(R, leaf=1) @ R, torch.eye(3, dtype=torch.float64)))
    True
    """
    n = R.shape[-1]
    if R.dim() != 2 or R.shape[0] != n:
        raise ValueError(f"triangular_inverse: R must be a square matrix, got shape {tuple(R.shape)}")
    if n <= max(leaf, 1):
        return torch.linalg.solve_triangular(R, torch.eye(n, dtype=R.dtype, device=R.device), upper=True)
    k = n // 2
    X = R.new_zeros(n, n)
    X[k:, k:] = triangular_inverse(R[k:, k:], leaf)
    X[:k, :k] = triangular_inverse(R[:k, :k], leaf)
    X[:k, k:] = -torch.linalg.solve_triangular(R[:k, :k], R[:k, k:] @ X[k:, k:], upper=True)
    return X


def spectral_norm_bound(A: torch.Tensor) -> float:
    """An upper bound on ``‖A‖₂ = σ_max(A)``: ``min(‖A‖_F, √(‖A‖₁ ‖A‖_∞))`` (both are bounds; ``O(mn)``).

    >>> spectral_norm_bound(torch.tensor([[3.0, 0.0], [0.0, 4.0]]))
    4.0
    """
    frobenius = float(torch.linalg.matrix_norm(A))
    mixed = math.sqrt(float(torch.linalg.matrix_norm(A, ord=1)) * float(torch.linalg.matrix_norm(A, ord=math.inf)))
    return min(frobenius, mixed)


def smallest_singular_value_bound(R: torch.Tensor, floor: float = 0.0, leaf: int = 256) -> float:
    """A certified lower bound on ``σ_min(R)`` of a square upper-triangular ``R`` (``0.0``: none above ``floor``).

    With ``X`` the computed :func:`triangular_inverse`, ``RX = I + E`` gives ``R⁻¹ = X(I + E)⁻¹``, so
    ``σ_min(R) = 1/‖R⁻¹‖₂ ≥ (1 − ‖E‖₂)/‖X‖_F``. The residual is bounded a priori, without forming ``RX``:
    block triangular inversion satisfies ``‖E‖ ≤ c_n u ‖R‖ ‖X‖`` (Higham, *Accuracy and Stability of Numerical
    Algorithms*, §14.2; ``u = eps/2``), taken here with the generous ``c_n = 2n⌈log₂ n⌉`` and Frobenius norms:
    ``ρ = c_n u ‖R‖_F ‖X‖_F``, and the bound is ``(1 − ρ)/‖X‖_F`` when ``ρ ≤ 1/2``. ``‖X‖_F`` overestimates
    ``‖R⁻¹‖₂`` by at most ``√n`` (and by about 1.3 for random matrices, whose smallest singular values are few).

    Returns ``0.0`` without inverting when some ``|r_jj| ≤ floor`` (every eigenvalue of a triangular matrix is a
    diagonal entry, and ``σ_min ≤ |λ|``), and when the inverse is not finite or ``ρ > 1/2``. The inverse is computed
    in float64 whatever the dtype of ``R`` (a float32 ``R`` is exact in float64; in float32 ``ρ`` would exceed 1/2
    from a condition number of about 10³ on).

    >>> R = torch.tensor([[1.0, 1e3], [0.0, 1.0]], dtype=torch.float64)
    >>> bound, exact = smallest_singular_value_bound(R), torch.linalg.svdvals(R)[-1].item()
    >>> 0.7 * exact < bound <= exact
    True
    """
    n = R.shape[-1]
    if n == 0 or float(R.diagonal().abs().min()) <= floor:
        return 0.0
    R = R.to(torch.float64)
    X = triangular_inverse(R, leaf)
    x_norm = float(torch.linalg.matrix_norm(X))
    if not math.isfinite(x_norm) or x_norm == 0:
        return 0.0
    u = torch.finfo(torch.float64).eps / 2
    rho = 2 * n * max(1, math.ceil(math.log2(n))) * u * float(torch.linalg.matrix_norm(R)) * x_norm
    return (1 - rho) / x_norm if rho <= 0.5 else 0.0
