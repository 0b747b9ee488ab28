"""Linear-algebra helpers shared by every check: the one relative error.

>>> import torch
>>> relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))
0.2
"""
from __future__ import annotations

from typing import overload

import torch

__all__ = ["relative_error"]


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
