"""Engineering constraints with mirrors, and removing the mirrors that impose unwanted ones.

**Differentiable constraint by symmetry.** To favour ``Oᵀθ = 0`` for an orthonormal ``O`` (``d × k``, ``P = OOᵀ``),
write ``θ = T(v, a, b)`` with the mirror ``(a, b) ↦ (−a, −b)`` built in and train with weight decay on ``a, b``.
The faithful form, in any basis, is

    T(v, a, b) = (I − P) v + O (a ⊙ b),        v ∈ ℝ^d, a, b ∈ ℝ^k:

``OᵀT = a ⊙ b`` covers ``ℝ^k`` and ``(I − P)T = (I − P)v`` covers ``ker Oᵀ``, so ``T`` is onto and
``min L(T) = min_θ L(θ)``; and ``(a_i, b_i) ↦ (−a_i, −b_i)`` is an orthogonal involution leaving ``T`` fixed, whose
fixed set ``a_i = b_i = 0`` is ``(Oᵀθ)_i = 0``. The printed form ``T' = (I − P)v + (Pw) ⊙ (Pu)`` (``w, u ∈ ℝ^d``) has
``OᵀT' = B(Oᵀw, Oᵀu)`` with the bilinear map ``B(a, b)_i = Σ_{jl} c_{ijl} a_j b_l``,
``c_{ijl} = Σ_x O_{xi} O_{xj} O_{xl}``:
onto when ``O`` is a set of coordinate axes (``c_{ijl} = δ_{ijl}``: then ``T' = T``), but not in a rotated basis;
for ``O = (e_1 − e_2)/√2``, ``c = Σ_x O_x³ = 0`` and ``OᵀT' ≡ 0``: the constrained coordinate can never be learnt.

**Removing mirrors.** A fixed random bias ``θ ↦ θ + β`` moves the mirror's fixed set off the small-norm solutions
(:class:`FixedRandomBias`); additive gradient noise removes the absorbing state (:func:`add_gradient_noise`).

**L1 equivalence.** For ``v = u ⊙ w`` (the mirror of each pair is the sign of ``ℝ^×``),
``min_{u ⊙ w = v} γ(‖u‖² + ‖w‖²) = 2γ‖v‖₁`` (at ``|u_i| = |w_i| = √|v_i|``): weight decay on ``(u, w)`` is the lasso
with
penalty ``2γ`` (:func:`soft_threshold` for an orthonormal design).

>>> import torch
>>> n = torch.tensor([[1.0], [-1.0]], dtype=torch.float64) / 2 ** 0.5
>>> dcs = MirrorConstraint(n)
>>> theta = torch.tensor([3.0, 1.0], dtype=torch.float64)
>>> torch.allclose(dcs(*dcs.right_inverse(theta)), theta)
True
>>> w, u = torch.randn(2, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
>>> float((n.T @ printed_dcs(theta, w, u, n)).abs().max()) < 1e-15   # the printed form never reaches Oᵀθ ≠ 0
True
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

__all__ = ["MirrorConstraint", "printed_dcs", "FixedRandomBias", "add_gradient_noise", "soft_threshold",
           "hadamard_lasso"]


def _orthonormal(frame: torch.Tensor) -> torch.Tensor:
    if frame.dim() != 2 or frame.shape[1] > frame.shape[0]:
        raise ValueError(f"MirrorConstraint: O must be d × k with k ≤ d, got shape {tuple(frame.shape)}")
    gram = frame.T @ frame
    if not torch.allclose(gram, torch.eye(frame.shape[1], dtype=frame.dtype, device=frame.device), atol=1e-10):
        raise ValueError("MirrorConstraint: the columns of O must be orthonormal (OᵀO = I)")
    return frame


class MirrorConstraint(nn.Module):
    """``T(v, a, b) = (I − OOᵀ)v + O(a ⊙ b)`` (``O = frame``) for a flattened tensor (module docstring): a
    parametrisation for :func:`torch.nn.utils.parametrize.register_parametrization`, whose
    :meth:`MirrorConstraint.right_inverse` gives the balanced ``a = sign(c)√|c|``, ``b = √|c|`` (``c = Oᵀθ``).
    Weight decay on ``a, b`` then favours ``Oᵀθ = 0``.

    >>> import torch
    >>> from torch.nn.utils import parametrize
    >>> layer = torch.nn.Linear(3, 2).double()
    >>> first_row = torch.eye(6, dtype=torch.float64)[:, :2]          # constrain two entries of the first row
    >>> _ = parametrize.register_parametrization(layer, "weight", MirrorConstraint(first_row, shape=(2, 3)))
    >>> [tuple(p.shape) for name, p in layer.parametrizations.weight.named_parameters()]
    [(2, 3), (2,), (2,)]
    """

    frame: torch.Tensor

    def __init__(self, frame: torch.Tensor, shape: tuple[int, ...] | None = None):
        super().__init__()
        self.register_buffer("frame", _orthonormal(frame))
        self.shape = tuple(shape) if shape is not None else (frame.shape[0],)

    def forward(self, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        flat = v.reshape(-1)
        return (flat - self.frame @ (self.frame.T @ flat) + self.frame @ (a * b)).reshape(self.shape)

    def right_inverse(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.frame.T @ theta.reshape(-1)
        root = c.abs().sqrt()
        return theta, torch.sign(c) * root, root


def printed_dcs(v: torch.Tensor, w: torch.Tensor, u: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """The printed form ``(I − P)v + (Pw) ⊙ (Pu)``, ``P = OOᵀ`` for ``O = frame`` (module docstring: onto only in a
    coordinate basis)."""
    P = frame @ frame.T
    return v - P @ v + (P @ w) * (P @ u)


class FixedRandomBias(nn.Module):
    """``θ ↦ θ + β`` with a fixed ``β ~ N(0, σ²)`` (a buffer): a parametrisation that removes mirrors through
    the origin.

    >>> import torch
    >>> bias = FixedRandomBias((3,), std=0.01, generator=torch.Generator().manual_seed(0))
    >>> torch.equal(bias(torch.zeros(3)), bias.beta)
    True
    """

    beta: torch.Tensor

    def __init__(self, shape: tuple[int, ...], std: float, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.register_buffer("beta", std * torch.randn(shape, generator=generator, dtype=dtype))

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        return theta + self.beta.to(theta.dtype)

    def right_inverse(self, theta: torch.Tensor) -> torch.Tensor:
        return theta - self.beta.to(theta.dtype)


def add_gradient_noise(parameters: Iterable[nn.Parameter], std: float,
                       generator: torch.Generator | None = None) -> list[torch.utils.hooks.RemovableHandle]:
    """Add ``N(0, std²)`` to every gradient of ``parameters`` (hooks; ``handle.remove()`` undoes them): no fixed set
    of a mirror is absorbing any more."""
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad + std * torch.randn(grad.shape, generator=generator, dtype=grad.dtype).to(grad.device)
    return [p.register_hook(hook) for p in parameters]


def soft_threshold(a: torch.Tensor, t: float) -> torch.Tensor:
    """``sign(a) max(|a| − t, 0)``: the minimiser of ``½(v − a)² + t|v|``."""
    return torch.sign(a) * (a.abs() - t).clamp_min(0)


def hadamard_lasso(a: torch.Tensor, gamma: float, steps: int = 4000, lr: float = 0.2,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GD on ``½‖u ⊙ w − a‖² + γ(‖u‖² + ‖w‖²)`` from a random start: ``(u, w)``. Its product equals
    ``soft_threshold(a, 2γ)`` (module docstring).

    >>> a = torch.tensor([1.0, -0.5, 0.1], dtype=torch.float64)
    >>> u, w = hadamard_lasso(a, gamma=0.1)
    >>> torch.allclose(u * w, soft_threshold(a, 0.2), atol=1e-10)
    True
    """
    u = 0.5 + 0.1 * torch.randn(a.shape, generator=generator, dtype=a.dtype)
    w = torch.sign(a) * (0.5 + 0.1 * torch.randn(a.shape, generator=generator, dtype=a.dtype))
    for _ in range(steps):
        r = u * w - a
        u, w = u - lr * (r * w + 2 * gamma * u), w - lr * (r * u + 2 * gamma * w)
    return u, w
