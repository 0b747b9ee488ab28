"""Conserved quantities of gradient flow, ``Q_M(θ) = ⟨θ, M·θ⟩``, and angular-momentum relations.

For a site with producer ``(W_in, b_in)`` and consumer ``W_out`` and Lie-algebra element ``M``
(``dπ(M) = α M``), the infinitesimal action ``M·θ = (M W_in, M b_in, −α W_out M)`` is a
self-adjoint linear map of θ when ``M`` is symmetric, and ``⟨∇L, M·θ⟩ = 0`` by invariance. Hence

    d/dt Q_M = 2 ⟨θ̇, M·θ⟩ = −2 ⟨∇L, M·θ⟩ = 0,     Q_M = tr(M C),
    C = W_in W_inᵀ + b_in b_inᵀ − α W_outᵀ W_out                     (layer imbalance)

(only the diagonal of ``C`` for positive scaling: ``q_j = ‖W_in[j]‖² + b_in[j]² − α‖W_out[:, j]‖²``).
Under gradient descent ``θ' = θ − η g`` the same algebra gives the exact drift
``Q_M(θ') − Q_M(θ) = η² Q_M(g)`` (``C`` evaluated at the gradient).

For antisymmetric ``M`` (``O(h)``), ``Q_M ≡ 0``; the invariance gives instead the angular-momentum
relation ``J(θ, θ̇) = X − Xᵀ = 0`` along gradient flow, ``X = W_in Ẇ_inᵀ + b_in ḃ_inᵀ − Ẇ_outᵀ W_out``
(``⟨θ̇, A·θ⟩ = tr(A X)`` for every antisymmetric ``A``). Under heavy-ball dynamics
``θ̈ + γ θ̇ = −∇L`` the same ``⟨θ̇, A·θ⟩`` decays as ``e^{−γt}`` and is conserved when ``γ = 0``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import sympy as sp

from symalg.lowering.codegen import LoweredFunction, lower, reads
from symalg.symbolic.printing import latex, sstr

if TYPE_CHECKING:
    from .derive import Symmetry

__all__ = ["ConservedQuantity", "AngularMomentum"]


@dataclass(frozen=True, eq=False)
class ConservedQuantity:
    """The conserved quantities of one symmetry, all at once.

    ``expr`` is the matrix ``C`` (``h × h``, for ``GL``) or the vector ``q`` (``h × 1``, for positive
    scaling) whose entries are conserved; ``q_expr`` is ``Q_M = tr(M C)`` (resp. ``mᵀ q``) for a
    symmetric algebra element ``M``; ``count`` is the number of quantities, one per basis element of the
    symmetric part of the algebra (they can be functionally dependent: see
    :meth:`~symalg.symbolic.derive.Analysis.independent_conserved`). ``symbols`` maps parameter names to symbols.
    """

    symmetry: Symmetry
    expr: sp.MatrixExpr
    generator: sp.MatrixSymbol
    symbols: dict

    @property
    def diagonal(self) -> bool:
        """True for positive scaling, whose quantities are the vector ``q``; else the matrix ``C``."""
        return self.symmetry.group.element_format == "diagonal"

    @property
    def name(self) -> str:
        return ("q" if self.diagonal else "C") + f"_{self.symmetry.site.index}"

    @property
    def q_expr(self) -> sp.Expr:
        if self.diagonal:
            return (self.generator.T * self.expr)[0, 0]
        return sp.Trace(self.generator * self.expr)

    @property
    def count(self) -> sp.Expr:
        return self.symmetry.group.n_symmetric

    def latex(self) -> str:
        k, m = self.symmetry.site.index, latex(self.generator)
        if self.diagonal:
            head = rf"Q_{{{m}}} = {m}^{{T}} q_{{{k}}}"
        else:
            head = rf"Q_{{{m}}} = \operatorname{{tr}}\left({m} C_{{{k}}}\right)"
        return rf"{head},\quad {latex(sp.Symbol(self.name))} = {latex(self.expr)}"

    def __str__(self):
        return f"{self.name} = {sstr(self.expr)}   ({self.count} quantities, Q_M = <M, {self.name}>)"

    def _repr_latex_(self):
        return f"${self.latex()}$"

    @cached_property
    def lowered(self) -> LoweredFunction:
        """``params ↦ C`` (or ``q`` as a vector) as a torch callable."""
        biases = [self.symbols[n] for n in self.symmetry.bias_names]
        return lower(self.name, {"value": self.expr}, reads(self.symbols),
                     vector_outputs=("value",) if self.diagonal else (), vector_inputs=biases)

    def __call__(self, params):
        return self.lowered(params)["value"]


@dataclass(frozen=True, eq=False)
class AngularMomentum:
    """The relation ``J(θ, θ̇) = X − Xᵀ = 0`` replacing the vacuous ``Q`` of antisymmetric generators.

    ``velocities`` maps each parameter name to the symbol of its velocity ``θ̇``.
    """

    symmetry: Symmetry
    expr: sp.MatrixExpr
    symbols: dict
    velocities: dict

    @property
    def name(self) -> str:
        return f"J_{self.symmetry.site.index}"

    def latex(self) -> str:
        return rf"{latex(sp.Symbol(self.name))} = {latex(self.expr)} = 0 \ \text{{along gradient flow}}"

    def __str__(self):
        return f"{self.name} = {sstr(self.expr)} = 0 along gradient flow (angular momentum)"

    def _repr_latex_(self):
        return f"${self.latex()}$"

    @cached_property
    def lowered(self) -> LoweredFunction:
        """``(params, velocity) ↦ J``: ``velocity`` is a dict name → tensor like ``params``."""
        inputs = {**reads(self.symbols), **{v: f"__velocity__{k}" for k, v in self.velocities.items()}}
        vectors = [table[n] for n in self.symmetry.bias_names for table in (self.symbols, self.velocities)]
        return lower(self.name, {"value": self.expr}, inputs, vector_inputs=vectors)

    def __call__(self, params, velocity):
        merged = dict(params)
        merged.update({f"__velocity__{k}": v for k, v in velocity.items()})
        return self.lowered(merged)["value"]
