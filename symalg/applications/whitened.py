"""The elementwise conserved quantity of a two-layer network on whitened inputs ([Zhao2026] eq. 2.17, [Zhao2023]
App. E.2).

For ``F = U σ(V X)`` with an elementwise activation ``σ`` and **whitened inputs** ``X = I`` (papers' layout,
``U ∈ R^{m×h}``, ``V ∈ R^{h×n}``, columns as samples), gradient flow on any loss ``ℓ(F)`` conserves

    Q(U, V) = ½ Tr[Uᵀ U] − Σ_{a,j} Φ(V_aj),     Φ(v) = ∫₀^v σ(x) / σ'(x) dx.                      (2.17)

Derivation: with ``G = ∂ℓ/∂F`` and ``X = I``, ``U̇ = −G σ(V)ᵀ`` and ``V̇ = −(UᵀG) ⊙ σ'(V)``, so
``d/dt ½Tr UᵀU = −Σ (UᵀG)_aj σ(V_aj)`` and ``d/dt Σ Φ(V_aj) = Σ σ(V_aj)/σ'(V_aj) · V̇_aj`` is the same sum. The
statement holds as printed, under two conditions the papers leave implicit: ``σ'`` must not vanish on
``[0, V_aj]`` (ReLU's ``σ/σ'`` is ``0/0`` for ``x < 0``; ``Φ`` is then undefined and :func:`potential` refuses it),
and the input must be exactly the identity: for a general ``X``, ``V̇ = −((UᵀG) ⊙ σ'(VX)) Xᵀ`` mixes the entries
and ``Q`` drifts (``tests/test_paper_items.py`` measures both). For ``σ = id``, ``Φ(v) = v²/2`` and ``Q`` is half the
trace of the linear network's imbalance; for ``tanh``, ``Φ(v) = (cosh 2v − 1)/4``; for the logistic sigmoid,
``Φ(v) = v + eᵛ − 1``.

``Φ`` is evaluated by Gauss–Legendre quadrature of ``σ/σ'`` (``σ'`` by autograd), so any elementwise torch
activation works; the error is below ``1e-12`` for the smooth activations above at ``|v| ≤ 3`` with the default 24
nodes.

>>> import torch
>>> v = torch.tensor([0.5, -1.0], dtype=torch.float64)
>>> torch.allclose(potential(torch.tanh, v), (torch.cosh(2 * v) - 1) / 4)
True
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

__all__ = ["potential", "whitened_conserved"]

Activation = Callable[[torch.Tensor], torch.Tensor]


def potential(activation: Activation, v: torch.Tensor, nodes: int = 24) -> torch.Tensor:
    """``Φ(v) = ∫₀^v σ(x)/σ'(x) dx`` elementwise, by ``nodes``-point Gauss–Legendre quadrature on ``[0, v]``.

    Raises ``ValueError`` naming the first entry of ``v`` whose interval meets a zero of ``σ'`` (there ``σ/σ'`` is
    not defined: ReLU for ``v < 0``).

    >>> import torch
    >>> float(potential(lambda x: x, torch.tensor(2.0, dtype=torch.float64)))     # ∫₀² x dx
    2.0
    """
    if nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    abscissae, weights = np.polynomial.legendre.leggauss(nodes)
    x = torch.as_tensor((abscissae + 1) / 2, dtype=v.dtype, device=v.device)
    w = torch.as_tensor(weights / 2, dtype=v.dtype, device=v.device)
    points = (v[..., None] * x).detach().requires_grad_(True)
    with torch.enable_grad():
        values = activation(points)
        slope, = torch.autograd.grad(values.sum(), points)
    bad = (slope == 0) & (v[..., None] != 0)
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.any(-1).nonzero()[0])
        raise ValueError(f"the activation's derivative vanishes on [0, v] at entry {index} of v "
                         f"(v = {float(v[index]):.6g}): σ/σ' is undefined there, so eq. 2.17 has no potential")
    return v * ((values.detach() / slope) * w).sum(-1)


def whitened_conserved(U: torch.Tensor, V: torch.Tensor, activation: Activation, nodes: int = 24) -> torch.Tensor:
    """``Q = ½ Tr[UᵀU] − Σ Φ(V_aj)`` of eq. 2.17 (papers' layout: ``U ∈ R^{m×h}``, ``V ∈ R^{h×n}``, ``F = Uσ(V)``).

    Conserved by gradient flow of any loss of ``F = U σ(V X)`` when ``X = I`` (module docstring).

    >>> import torch
    >>> U, V = torch.ones(1, 2, dtype=torch.float64), torch.full((2, 2), 2.0, dtype=torch.float64)
    >>> float(whitened_conserved(U, V, lambda x: x))                               # ½·2 − 4·(2²/2)
    -7.0
    """
    if U.ndim != 2 or V.ndim != 2 or U.shape[1] != V.shape[0]:
        raise ValueError(f"U must be m×h and V h×n with the same h; got U {tuple(U.shape)} and V {tuple(V.shape)}")
    return 0.5 * (U * U).sum() - potential(activation, V, nodes).sum()
