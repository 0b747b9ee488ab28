"""Loss symmetries and distribution symmetries: derived in SymPy, lowered to torch, verified where they hold.

Two relaxations of a parameter-space symmetry ([Zhao2026] Sec. 1.3). Torch layout ``y = W x + b``; the
SymPy side uses [Zhao2026]'s columns (``Y = W H + b 1ᵀ`` has one column per sample).

Loss symmetry: ``O(m)`` on the last layer (Example 1.3.2)
---------------------------------------------------------
If the loss reads the outputs ``Y ∈ R^{m×N}`` (all views of a batch) only through their Gram matrix,
``L = ℓ(YᵀY)``, then ``W ↦ QW, b ↦ Qb`` (``Q ∈ O(m)``) maps ``Y ↦ QY`` and ``(QY)ᵀ(QY) = Yᵀ QᵀQ Y = YᵀY``:
``L`` is unchanged on every batch while the outputs move — a symmetry of the loss, not of the network.
For ``A ∈ so(m)``, ``δ(YᵀY) = Yᵀ(Aᵀ + A)Y = 0`` gives ``⟨∇L, (AW, Ab)⟩ = 0``. ``A`` is antisymmetric, so
``Q_A = ⟨θ, A·θ⟩ ≡ 0``; what replaces it is the angular momentum ``⟨θ̇, A·θ⟩ = tr(A X)``,
``X = W Ẇᵀ + b ḃᵀ``: ``J = X − Xᵀ = 0`` along gradient flow, and ``J(t) = e^{−γt} J(0)`` under heavy-ball
``θ̈ + γθ̇ = −∇L``. Spectral-contrastive and cosine InfoNCE losses are Gram losses; Barlow Twins
standardises each output coordinate and is not (the negative control).

Distribution symmetry: ``W ↦ W A⁻¹`` on a linear first layer (Definition 1.3.6, Example 1.3.7)
-----------------------------------------------------------------------------------------------
The first layer ``z = W x + b`` sees ``A⁻¹x`` after ``W ↦ W A⁻¹``. Let ``μ = E x``, ``S = E xxᵀ``,
``C = E x yᵀ`` (targets ``y``, ``ν = E y``). What is invariant, exactly:

1. ``A μ = μ`` ([Zhao2026]'s group): ``E z = W A⁻¹μ + b = Wμ + b``, so the expected residual
   ``E[Wx + b − y]`` (Example 1.3.7) and every function of it, e.g. ``‖E[Wx + b − y]‖²``, are invariant. The
   expected squared error is **not**: it reads ``S`` and ``C`` too.
2. ``A F = F`` for ``F = [μ, C]`` and ``A S Aᵀ = S``: the expected squared error
   ``E‖Wx + b − y‖² = tr(W S Wᵀ) + 2 bᵀWμ + bᵀb − 2 tr(W C) − 2 bᵀν + E‖y‖²`` is invariant for *every*
   distribution, the empirical distribution of a batch included (use the batch's moments).
3. Gaussian ``x ~ N(μ, Σ)`` with ``Aμ = μ`` and ``AΣAᵀ = Σ`` (equivalently ``A S Aᵀ = S``): ``A⁻¹x`` has the
   same law, so ``E_x ℓ(f(W, x))`` is invariant for every network whose first layer is linear and every
   loss that reads ``x`` only through it (targets independent of ``x``). Not on a fixed finite sample.

The group :class:`MomentStabiliser` ``{A : A F = F, A S Aᵀ = S} = S^{1/2} {Q ∈ O(n) : Q G = G} S^{−1/2}``
(``G = S^{−1/2}F``) is ``≅ O(n − r)``, ``r = rank F``; without ``S`` it is ``{A ∈ GL(n) : AF = F}``. Lie algebra
``{M : MF = 0, MS + SMᵀ = 0}`` (resp. ``{M : MF = 0}``, dim ``n(n − r)``); infinitesimal action ``M·W = −WM``.
Along gradient flow of the *expected* loss, ``Q_M = ⟨W, M·W⟩ = −tr(M WᵀW)`` is conserved for symmetric
``M``. Without ``S``: symmetric ``M`` with ``MF = 0`` are ``P N P`` (``P = I − F(FᵀF)⁻¹Fᵀ``), so
``C = P Wᵀ W P`` is conserved. With ``S``: a symmetric ``M`` with ``MS = −SM`` is ``0`` (in an eigenbasis
of ``S``, ``M_ij (s_i + s_j) = 0``), so there is no ``Q_M``; the relation is ``J = P_G(Z − Zᵀ)P_G = 0`` with
``Z = S^{−1/2} Ẇᵀ W S^{1/2}`` (from ``⟨Ẇ, W R K R⁻¹⟩ = tr(Z K)``, ``R = S^{1/2}``).

API
---
:class:`GramLossSymmetry` (``derivation()``, ``apply``, ``tangent``, ``verify``); :func:`spectral_contrastive_loss`,
:func:`info_nce_loss`, :func:`barlow_twins_loss`, :func:`two_view_loss`; :class:`MomentStabiliser`,
:class:`DistributionSymmetry` (``derivation()``, ``expected_mse``, ``mean_residual_loss``, ``verify``),
:func:`moments`, :func:`gaussian_expectation`, :func:`paired_monte_carlo`.

Example
-------
>>> import torch, symalg.numeric.sampling
>>> arch = symalg.parse("linear(4, 6) -> tanh -> linear(6, 3)")
>>> sym = GramLossSymmetry("2.weight", "2.bias", 3, 6)
>>> forward = symalg.numeric.sampling.network_function(arch)
>>> x1, x2 = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
>>> loss = two_view_loss(forward, spectral_contrastive_loss, x1, x2)
>>> params = symalg.numeric.sampling.random_params(arch)
>>> sym.verify(loss, params, outputs=lambda p: forward(p, x1)).passed
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np
import sympy as sp
import torch

from symalg.applications.conjugated import TEST_SCALES, TOLERANCE, check_group_axioms
from symalg.applications.flat_minima import Forward, ParamLoss
from symalg.catalogue.groups import GeneralLinear, Orthogonal, SiteGroup, checked_inverse, matrix_exp
from symalg.frontend.grammar import check_entries
from symalg.lowering.codegen import LoweredFunction, lower
from symalg.numeric.linalg import relative_error
from symalg.verification.checks import (MAX_GENERATORS, CheckResult, VerificationReport, check_angular_momentum,
                                        check_gd_drift, check_gradient_flow, check_gradient_orthogonality,
                                        compare_to_sympy, loss_gradients)

__all__ = ["GramLossSymmetry", "MomentStabiliser", "DistributionSymmetry", "spectral_contrastive_loss", "info_nce_loss",
           "barlow_twins_loss", "two_view_loss", "moments", "gaussian_expectation", "paired_monte_carlo"]


# -- self-supervised losses (rows are samples) --------------------------------------------------------------
def spectral_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """HaoChen et al.'s ``−2 mean_i ⟨z1_i, z2_i⟩ + mean_{i≠j} ⟨z1_i, z2_j⟩²``: a function of inner products only."""
    inner = z1 @ z2.transpose(-1, -2)
    off = ~torch.eye(inner.shape[-1], dtype=torch.bool, device=inner.device)
    return -2 * torch.diagonal(inner, dim1=-2, dim2=-1).mean(-1) + inner[..., off].pow(2).mean(-1)


def info_nce_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.5) -> torch.Tensor:
    """SimCLR's InfoNCE with cosine similarity (positives on the diagonal): reads only ``⟨z_i, z_j⟩``."""
    u1 = z1 / z1.norm(dim=-1, keepdim=True)
    u2 = z2 / z2.norm(dim=-1, keepdim=True)
    logits = u1 @ u2.transpose(-1, -2) / temperature
    return -torch.diagonal(torch.log_softmax(logits, dim=-1), dim1=-2, dim2=-1).mean(-1)


def barlow_twins_loss(z1: torch.Tensor, z2: torch.Tensor, off_diagonal: float = 5e-3) -> torch.Tensor:
    """Barlow Twins: cross-correlation of per-coordinate standardised outputs. Standardising each output
    coordinate breaks ``O(m)`` (only permutations and sign flips survive): a negative control."""
    s1 = (z1 - z1.mean(-2, keepdim=True)) / z1.std(-2, keepdim=True)
    s2 = (z2 - z2.mean(-2, keepdim=True)) / z2.std(-2, keepdim=True)
    corr = s1.transpose(-1, -2) @ s2 / z1.shape[-2]
    eye = torch.eye(corr.shape[-1], dtype=corr.dtype, device=corr.device)
    return (((torch.diagonal(corr, dim1=-2, dim2=-1) - 1) ** 2).sum(-1)
            + off_diagonal * ((corr * (1 - eye)) ** 2).sum((-1, -2)))


def two_view_loss(forward: Forward, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x1: torch.Tensor,
                  x2: torch.Tensor) -> ParamLoss:
    """``params ↦ loss_fn(forward(params, x1), forward(params, x2))`` for two views of a batch."""
    return lambda params: loss_fn(forward(params, x1), forward(params, x2))


# -- shared verification helpers ----------------------------------------------------------------------------
def _params_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return max(relative_error(a[k], b[k]) for k in b)


def _check_lowering(name: str, lowered: Mapping[str, torch.Tensor], exprs: Mapping, values: Mapping, tol: float,
                    detail: str) -> CheckResult:
    """Lowered tensors against SymPy's exact values of ``exprs`` at ``values`` (``{symbol name: array}``).

    The expressions are expanded first: SymPy evaluates a product with a factor ``I − F(FᵀF)⁻¹Fᵀ`` entry by
    entry through symbolic sums (seconds), its expansion as plain matrix products (milliseconds)."""
    error = compare_to_sympy(lowered, {k: e.expand() for k, e in exprs.items()}, values)
    return CheckResult("lowering", name, error, tol, detail)


def _worst_change(loss: ParamLoss, apply: Callable[[Mapping[str, torch.Tensor], torch.Tensor], dict[str, torch.Tensor]],
                  params: Mapping[str, torch.Tensor], elements: Sequence[tuple[str, torch.Tensor]]
                  ) -> tuple[float, str]:
    """The largest relative change of ``loss`` under ``apply(params, g)`` over ``(label, g)`` elements, and where."""
    base, worst, where = loss(params), 0.0, ""
    for label, g in elements:
        error = relative_error(loss(apply(params, g)), base)
        if not error < worst:
            worst, where = error, label
    return worst, where


@dataclass(frozen=True)
class _Relation:
    """A conserved quantity or angular momentum in the form verification's dynamic checks take."""

    symmetry: object
    fn: Callable[..., torch.Tensor]

    def __call__(self, *args: Any) -> torch.Tensor:
        return self.fn(*args)


# -- loss symmetry ------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class GramLossSymmetry:
    """``O(m)`` acting on the last layer ``(W, b)`` by ``W ↦ QW``, ``b ↦ Qb``: a symmetry of every loss that
    reads the outputs only through their inner products (module docstring).

    Parameters: ``weight``, ``bias`` (or None): parameter names of the last layer; ``out_features`` ``m``,
    ``in_features`` ``h``.
    """

    weight: str
    bias: str | None
    out_features: int
    in_features: int

    @property
    def group(self) -> Orthogonal:
        return Orthogonal(self.out_features)

    @property
    def label(self) -> str:
        return f"last layer {self.weight}:{self.group.name} (loss)"

    @cached_property
    def symbols(self) -> dict[str, sp.MatrixSymbol]:
        m, h = self.out_features, self.in_features
        symbols = {self.weight: sp.MatrixSymbol("W_L", m, h)}
        if self.bias:
            symbols[self.bias] = sp.MatrixSymbol("b_L", m, 1)
        return symbols

    @cached_property
    def velocities(self) -> dict[str, sp.MatrixSymbol]:
        return {name: sp.MatrixSymbol(rf"\dot{{{s.name[0]}}}_{{L}}", *s.shape) for name, s in self.symbols.items()}

    @property
    def element(self) -> sp.MatrixSymbol:
        return sp.MatrixSymbol("Q", self.out_features, self.out_features)

    @property
    def algebra_element(self) -> sp.MatrixSymbol:
        return sp.MatrixSymbol("A", self.out_features, self.out_features)

    @property
    def action(self) -> dict[str, sp.MatrixExpr]:
        """``{name: transformed}``: ``W ↦ Q W``, ``b ↦ Q b``."""
        return {name: self.element * s for name, s in self.symbols.items()}

    @property
    def infinitesimal(self) -> dict[str, sp.MatrixExpr]:
        """``A·θ = (A W, A b)`` for ``A ∈ so(m)``."""
        return {name: self.algebra_element * s for name, s in self.symbols.items()}

    @property
    def angular_momentum_expr(self) -> sp.MatrixExpr:
        """``J = X − Xᵀ``, ``X = W Ẇᵀ + b ḃᵀ`` (``⟨θ̇, A·θ⟩ = tr(A X) = ½ tr(A J)``)."""
        X = sp.MatAdd(*(s * self.velocities[name].T for name, s in self.symbols.items()))
        return X - X.T

    def outputs_expr(self, batch: int) -> sp.MatrixExpr:
        """``Y = W H + b 1ᵀ`` (``m × batch``), ``H`` the last layer's inputs as columns."""
        H = sp.MatrixSymbol("H", self.in_features, batch)
        Y = self.symbols[self.weight] * H
        return Y + self.symbols[self.bias] * sp.OneMatrix(1, batch) if self.bias else Y

    def derivation(self, batch: int = 5) -> dict[str, sp.MatrixExpr]:
        """SymPy identities, each a zero matrix: ``(QY)ᵀ(QY) − YᵀY`` after ``QᵀQ = I`` and
        ``(AY)ᵀY + Yᵀ(AY)`` after ``Aᵀ = −A``."""
        Y, Q, A = self.outputs_expr(batch), self.element, self.algebra_element
        moved = ((Q * Y).T * (Q * Y)).expand().subs(Q.T * Q, sp.Identity(self.out_features))
        first_order = ((A * Y).T * Y + Y.T * (A * Y)).expand().subs(A.T, -A)
        return {"Gram(QY) - Gram(Y), Q^T Q = I": (moved - (Y.T * Y).expand()).doit(),
                "d/dt Gram(exp(tA) Y), A^T = -A": first_order.doit()}

    @cached_property
    def _vectors(self) -> list:
        return [self.symbols[self.bias]] if self.bias else []

    @cached_property
    def lowered_action(self) -> LoweredFunction:
        return lower("act_gram_loss", self.action, {s: n for n, s in self.symbols.items()}, args=[self.element],
                     vector_outputs=[self.bias] if self.bias else [], vector_inputs=self._vectors)

    @cached_property
    def lowered_infinitesimal(self) -> LoweredFunction:
        return lower("tangent_gram_loss", self.infinitesimal, {s: n for n, s in self.symbols.items()},
                     args=[self.algebra_element], vector_outputs=[self.bias] if self.bias else [],
                     vector_inputs=self._vectors)

    @cached_property
    def lowered_angular_momentum(self) -> LoweredFunction:
        reads_ = {**{s: n for n, s in self.symbols.items()},
                  **{v: f"__velocity__{n}" for n, v in self.velocities.items()}}
        vectors = self._vectors + ([self.velocities[self.bias]] if self.bias else [])
        return lower("angular_momentum_gram_loss", {"J": self.angular_momentum_expr}, reads_, vector_inputs=vectors)

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after ``W ↦ gW, b ↦ gb`` (``g ∈ O(m)``, checked)."""
        self.group.check_element(g)
        return {**params, **self.lowered_action(params, g)}

    def tangent(self, params: Mapping[str, torch.Tensor], A: torch.Tensor) -> dict[str, torch.Tensor]:
        """``A·θ`` on the last layer (``A ∈ so(m)``, checked)."""
        self.group.check_algebra_element(A)
        return self.lowered_infinitesimal(params, A)

    def angular_momentum(self, params: Mapping[str, torch.Tensor],
                         velocity: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``J(θ, θ̇)`` (``m × m``); ``velocity`` maps parameter names to ``θ̇``."""
        merged = {**params, **{f"__velocity__{n}": velocity[n] for n in self.symbols}}
        return self.lowered_angular_momentum(merged)["J"]

    def conserved_quantities(self) -> list[_Relation]:
        return []

    def angular_momenta(self) -> list[_Relation]:
        return [_Relation(self, self.angular_momentum)]

    def verify(self, loss: ParamLoss, params: Mapping[str, torch.Tensor], outputs: ParamLoss | None = None,
               seed: int = 0, tolerance: float = TOLERANCE) -> VerificationReport:
        """Checks on the given batch (the one ``loss`` closes over), returning a report (never asserting).

        ``invariance`` of ``loss(params)`` under elements near and far from the identity and the other
        component; ``gram_invariance`` of ``outputs(params)ᵀ``'s Gram matrix (and how far the outputs move);
        ``gradient_orthogonality`` per ``so(m)`` generator; ``angular_momentum`` (heavy ball, ``J ∝ e^{−γt}``);
        ``group_axioms`` of the lowered action; ``lowering`` vs SymPy (action, tangent, ``J``).
        """
        generator = torch.Generator().manual_seed(seed)
        reference = params[self.weight]
        dtype, device = reference.dtype, reference.device
        elements = self.group.sample(generator, dtype, device, TEST_SCALES)
        worst, where = _worst_change(loss, self.apply, params, elements)
        checks = [CheckResult("invariance", self.label, worst, tolerance, f"loss on the given batch, worst: {where}")]
        if outputs is not None:
            Y, moved = outputs(params), outputs(self.apply(params, elements[-1][1]))
            gram = relative_error(moved @ moved.transpose(-1, -2), Y @ Y.transpose(-1, -2))
            checks.append(CheckResult("gram_invariance", self.label, gram, tolerance,
                                      f"outputs themselves moved by {relative_error(moved, Y):.2f} (relative)"))
        grads = loss_gradients(loss, params)
        basis = self.group.algebra_sample(MAX_GENERATORS, generator, dtype, device)
        with torch.no_grad():
            checks.append(check_gradient_orthogonality(self.label, lambda M: self.tangent(params, M), basis, grads,
                                                       tolerance))
        checks += check_angular_momentum(self, loss, params, grads, generator, tolerance)
        with torch.no_grad():
            checks.append(check_group_axioms(self.label, self.apply, params, elements[-1][1], elements[0][1],
                                             _params_distance, tolerance))
            checks += self._check_lowering(params, elements[-1][1], generator, tolerance)
        return VerificationReport(tuple(checks), dtype, str(device))

    def _check_lowering(self, params: Mapping[str, torch.Tensor], g: torch.Tensor, generator: torch.Generator,
                        tol: float) -> list[CheckResult]:
        values = {s.name: params[n].detach().cpu().double().numpy() for n, s in self.symbols.items()}
        A = self.group.random_algebra_element(1.0, generator, g.dtype, g.device)
        velocity = {n: torch.randn(params[n].shape, generator=generator, dtype=g.dtype).to(g.device)
                    for n in self.symbols}
        velocities = {self.velocities[n].name: velocity[n].cpu().double().numpy() for n in self.symbols}
        return [_check_lowering(self.label, self.lowered_action(params, g), self.action,
                                {**values, "Q": g.cpu().double().numpy()}, tol, "action vs SymPy"),
                _check_lowering(self.label, self.lowered_infinitesimal(params, A), self.infinitesimal,
                                {**values, "A": A.cpu().double().numpy()}, tol, "infinitesimal action vs SymPy"),
                _check_lowering(self.label, {"J": self.angular_momentum(params, velocity)},
                                {"J": self.angular_momentum_expr}, {**values, **velocities}, tol, "J vs SymPy")]


# -- distribution symmetry ----------------------------------------------------------------------------------
def _complement(G: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (columns) of the orthogonal complement of ``G``'s column space."""
    n = G.shape[0]
    if G.shape[1] == 0:
        return torch.eye(n, dtype=G.dtype, device=G.device)
    U, s, _ = torch.linalg.svd(G, full_matrices=True)
    rank = int((s > s.max() * n * torch.finfo(G.dtype).eps).sum())
    return U[:, rank:]


def _sqrt_and_inverse(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, vectors = torch.linalg.eigh(S)
    return (vectors * values.sqrt()) @ vectors.T, (vectors / values.sqrt()) @ vectors.T


@dataclass(frozen=True, eq=False)
class MomentStabiliser(SiteGroup):
    """``{A ∈ GL(n) : A F = F, A S Aᵀ = S}`` (``S`` optional): matrices fixing data moments.

    ``fixed`` is ``F`` (``n × k``: the data mean, cross-moment columns), ``form`` the second moment ``S``
    (symmetric positive definite) or None. With ``S`` the group is ``S^{1/2}{Q ∈ O(n) : QG = G}S^{−1/2}``,
    ``G = S^{−1/2}F``, and its algebra basis is ``S^{1/2} P(E_ij − E_ji)Pᵀ S^{−1/2}`` (``P`` an orthonormal basis
    of ``G^⊥``); without, ``{A : AF = F}`` with basis ``e_i p_jᵀ`` (``p_j`` an orthonormal basis of ``F^⊥``).

    >>> mu = torch.tensor([[1.0], [0.0], [0.0]], dtype=torch.float64)
    >>> MomentStabiliser(3, mu).dim, MomentStabiliser(3, mu, torch.eye(3, dtype=torch.float64)).dim
    (6, 1)
    """

    fixed: torch.Tensor = None  # type: ignore[assignment]  # required; a field after width needs a default
    form: torch.Tensor | None = None
    symbol: ClassVar[str] = "Stab"

    def __post_init__(self) -> None:
        n = self._size
        if not isinstance(self.fixed, torch.Tensor) or self.fixed.dim() != 2 or self.fixed.shape[0] != n:
            raise ValueError(f"MomentStabiliser: fixed must be an n × k tensor with n = {n}, got "
                             f"{getattr(self.fixed, 'shape', type(self.fixed).__name__)}")
        if self.form is not None:
            symmetric = self.form.shape == (n, n) and relative_error(self.form, self.form.T) <= 1e-12
            if not symmetric or torch.linalg.eigvalsh(self.form).min() <= 0:
                raise ValueError(f"MomentStabiliser: form must be a symmetric positive-definite {n} × {n} matrix")

    @property
    def _size(self) -> int:
        return int(sp.sympify(self.width))

    @property
    def name(self) -> str:
        preserving = ", preserving S" if self.form is not None else ""
        return f"Stab({self.width}, fixing {self.fixed.shape[1]} vector(s){preserving})"

    def latex(self) -> str:
        form = r",\ A S A^{T} = S" if self.form is not None else ""
        return rf"\{{A \in \mathrm{{GL}}({self.width}) : A F = F{form}\}}"

    @cached_property
    def _frame(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(R, R⁻¹, P)``: ``R = S^{1/2}`` (identity without ``S``) and ``P``, an orthonormal basis of ``(R⁻¹F)^⊥``."""
        if self.form is None:
            eye = torch.eye(self._size, dtype=self.fixed.dtype, device=self.fixed.device)
            return eye, eye, _complement(self.fixed)
        root, inverse = _sqrt_and_inverse(self.form)
        return root, inverse, _complement(inverse @ self.fixed)

    @property
    def dim(self) -> sp.Expr:
        free = self._frame[2].shape[1]
        return sp.Integer(free * (free - 1) // 2 if self.form is not None else self._size * free)

    @property
    def n_symmetric(self) -> sp.Expr:
        free = self._frame[2].shape[1]
        return sp.Integer(0 if self.form is not None else free * (free + 1) // 2)

    def algebra_basis(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
        R, R_inv, P = (t.to(dtype=dtype, device=device) for t in self._frame)
        n = P.shape[0]
        check_entries(int(self.dim) * n * n, f"the Lie-algebra basis of {self.name}")
        if self.form is None:  # e_i p_jᵀ: entry [r, c] = δ_ir P[c, j]
            return torch.einsum("ir,cj->ijrc", torch.eye(n, dtype=dtype, device=device), P).reshape(-1, n, n)
        return R @ P @ Orthogonal(P.shape[1]).algebra_basis(dtype, device) @ P.T @ R_inv

    def algebra_element(self, coordinates: torch.Tensor) -> torch.Tensor:
        """``Σ c_ij e_i p_jᵀ = C Pᵀ`` (``C`` the coordinates as an ``n × (n − k)`` matrix), or ``R P A Pᵀ R⁻¹`` with
        ``A`` the element of ``so(n − k)`` with these coordinates: one ``n × n`` matrix, never the basis."""
        self._check_coordinates(coordinates)
        R, R_inv, P = (t.to(dtype=coordinates.dtype, device=coordinates.device) for t in self._frame)
        if self.form is None:
            return coordinates.reshape(*coordinates.shape[:-1], P.shape[0], P.shape[1]) @ P.T
        return R @ P @ Orthogonal(P.shape[1]).algebra_element(coordinates) @ P.T @ R_inv

    def symmetric_basis(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
        if self.form is not None:
            return self.algebra_basis(dtype, device)[:0]
        P = self._frame[2].to(dtype=dtype, device=device)
        return P @ GeneralLinear(P.shape[1]).symmetric_basis(dtype, device) @ P.T

    def discrete_generators(self, dtype: torch.dtype = torch.float64,
                            device: torch.device | str = "cpu") -> list[torch.Tensor]:
        R, R_inv, P = (t.to(dtype=dtype, device=device) for t in self._frame)
        if P.shape[1] == 0:
            return []
        p = P[:, :1]
        return [R @ (torch.eye(P.shape[0], dtype=dtype, device=device) - 2 * p @ p.T) @ R_inv]

    def _not_an_element(self, g: torch.Tensor, tol: float) -> str | None:
        singular = checked_inverse(g, tol)[1]
        if singular:
            return singular
        F = self.fixed.to(g)
        if relative_error(g @ F, F) > tol:
            return "A F ≠ F"
        if self.form is not None and relative_error(g @ self.form.to(g) @ g.transpose(-1, -2), self.form.to(g)) > tol:
            return "A S Aᵀ ≠ S"
        return None

    def _not_in_algebra(self, M: torch.Tensor, tol: float) -> str | None:
        scale = max(M.abs().max().item(), 1.0)
        F = self.fixed.to(M)
        if (M @ F).abs().max().item() > tol * scale * max(F.abs().max().item(), 1.0):
            return "M F ≠ 0"
        if self.form is not None:
            S = self.form.to(M)
            if (M @ S + S @ M.transpose(-1, -2)).abs().max().item() > tol * scale * max(S.abs().max().item(), 1.0):
                return "M S + S Mᵀ ≠ 0"
        return None


_MOMENT_KEYS = ("mean", "second", "cross", "target_mean", "target_second")


def moments(x: torch.Tensor, y: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Moments of the empirical distribution of rows ``x`` (and targets ``y``): ``mean`` ``(n, 1)``,
    ``second`` ``E xxᵀ``, ``cross`` ``E x yᵀ``, ``target_mean`` ``(m, 1)``, ``target_second`` ``E‖y‖²`` ``(1, 1)``.

    Expectations over a batch are expectations under its empirical distribution, so the distribution
    symmetries built from these moments hold *exactly* on that batch.
    """
    if x.dim() != 2:
        raise ValueError(f"moments: x must have shape (batch, n), got {tuple(x.shape)}")
    result = {"mean": x.mean(0)[:, None], "second": x.T @ x / len(x)}
    if y is not None:
        if y.dim() != 2 or len(y) != len(x):
            raise ValueError(f"moments: y must have shape ({len(x)}, m), got {tuple(y.shape)}")
        result.update(cross=x.T @ y / len(x), target_mean=y.mean(0)[:, None],
                      target_second=(y * y).sum(-1).mean().reshape(1, 1))
    return result


@dataclass(frozen=True, eq=False)
class DistributionSymmetry:
    """``W ↦ W A⁻¹`` on a linear first layer ``z = W x + b``, for ``A`` in a :class:`MomentStabiliser` of the data.

    Build it with :meth:`from_moments`; ``preserve`` names the moments the group keeps: ``"mean"`` (``Aμ = μ``),
    ``"second"`` (``A S Aᵀ = S``), ``"cross"`` (``A C = C``). Which losses are invariant: module docstring.

    >>> x = torch.randn(32, 4, dtype=torch.float64)
    >>> sym = DistributionSymmetry.from_moments("0.weight", 1, moments(x, x[:, :1] ** 2), ("mean", "second", "cross"))
    >>> params, g = {"0.weight": torch.randn(1, 4, dtype=torch.float64)}, matrix_exp(sym.group.algebra_basis()[0])
    >>> bool(torch.isclose(sym.expected_mse(sym.apply(params, g)), sym.expected_mse(params), rtol=1e-12))
    True
    """

    weight: str
    out_features: int
    group: MomentStabiliser
    preserve: tuple[str, ...]
    bias: str | None = None
    data: Mapping[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def from_moments(cls, weight: str, out_features: int, data: Mapping[str, torch.Tensor],
                     preserve: tuple[str, ...] = ("mean",), bias: str | None = None) -> "DistributionSymmetry":
        """The symmetry of the moments ``data`` (see :func:`moments`) named in ``preserve``."""
        unknown = sorted(set(preserve) - {"mean", "second", "cross"})
        if unknown or "mean" not in preserve:
            raise ValueError(f"DistributionSymmetry: preserve must contain 'mean' and only 'mean', 'second', 'cross'; "
                             f"got {preserve}")
        missing = [k for k in preserve if k not in data]
        if missing:
            raise ValueError(f"DistributionSymmetry: data has no {missing} (give them, e.g. moments(x, y))")
        fixed = torch.cat([data["mean"]] + ([data["cross"]] if "cross" in preserve else []), dim=1)
        group = MomentStabiliser(fixed.shape[0], fixed, data["second"] if "second" in preserve else None)
        return cls(weight, out_features, group, tuple(preserve), bias, dict(data))

    @property
    def n(self) -> int:
        return self.group._size

    @property
    def label(self) -> str:
        return f"first layer {self.weight}:{self.group.name}"

    @cached_property
    def symbols(self) -> dict[str, sp.MatrixSymbol]:
        symbols = {self.weight: sp.MatrixSymbol("W_1", self.out_features, self.n)}
        if self.bias:
            symbols[self.bias] = sp.MatrixSymbol("b_1", self.out_features, 1)
        return symbols

    @cached_property
    def moment_symbols(self) -> dict[str, sp.MatrixSymbol]:
        """``{key: symbol}`` for ``mean μ``, ``second S``, ``cross C``, ``target_mean ν``, ``target_second s``,
        and the constants of the lowered quantities: ``F``, ``R = S^{1/2}``, ``R⁻¹``."""
        n, m = self.n, self.out_features
        return {"mean": sp.MatrixSymbol("mu", n, 1), "second": sp.MatrixSymbol("S", n, n),
                "cross": sp.MatrixSymbol("C", n, m), "target_mean": sp.MatrixSymbol("nu", m, 1),
                "target_second": sp.MatrixSymbol("s_y", 1, 1),
                "fixed": sp.MatrixSymbol("F", n, self.group.fixed.shape[1]),
                "root": sp.MatrixSymbol("R", n, n), "root_inverse": sp.MatrixSymbol("R_inv", n, n)}

    @property
    def element(self) -> sp.MatrixSymbol:
        return sp.MatrixSymbol("A", self.n, self.n)

    @property
    def algebra_element(self) -> sp.MatrixSymbol:
        return sp.MatrixSymbol("M", self.n, self.n)

    @property
    def action(self) -> dict[str, sp.MatrixExpr]:
        return {self.weight: self.symbols[self.weight] * self.element.I}

    @property
    def infinitesimal(self) -> dict[str, sp.MatrixExpr]:
        return {self.weight: -self.symbols[self.weight] * self.algebra_element}

    # -- expected losses in SymPy ---------------------------------------------------------------------------
    def _first_layer(self) -> tuple[sp.MatrixExpr, sp.MatrixExpr]:
        W, mu = self.symbols[self.weight], self.moment_symbols["mean"]
        mean = W * mu + self.symbols[self.bias] if self.bias else W * mu
        return W, mean

    @property
    def mean_residual_expr(self) -> sp.Expr:
        """``‖E[Wx + b − y]‖² = ‖Wμ + b − ν‖²``: a loss of the first moment only (Example 1.3.7's residual)."""
        _, mean = self._first_layer()
        residual = mean - self.moment_symbols["target_mean"]
        return sp.Trace(residual.T * residual)

    @property
    def expected_mse_expr(self) -> sp.Expr:
        """``E‖Wx + b − y‖² = tr(W S Wᵀ) + 2 bᵀWμ + bᵀb − 2 tr(W C) − 2 bᵀν + E‖y‖²``."""
        W, m = self.symbols[self.weight], self.moment_symbols
        expr = sp.Trace(W * m["second"] * W.T) - 2 * sp.Trace(W * m["cross"]) + sp.Trace(m["target_second"])
        if self.bias:
            b = self.symbols[self.bias]
            expr += 2 * sp.Trace(b.T * W * m["mean"]) + sp.Trace(b.T * b) - 2 * sp.Trace(b.T * m["target_mean"])
        return expr

    def derivation(self) -> dict[str, sp.Basic]:
        """What ``W ↦ W A⁻¹`` does, reduced with the group's relations ``A⁻¹μ = μ`` (and ``A⁻¹SA⁻ᵀ = S``,
        ``A⁻¹C = C`` when preserved). Zero entries are the invariants; a nonzero one shows what is *not*
        invariant (the expected squared error under the mean-only group)."""
        W, m, A = self.symbols[self.weight], self.moment_symbols, self.element
        fixed = [m["mean"]] + ([m["cross"]] if "cross" in self.preserve else [])
        rules = {**{A.I * f: f for f in fixed}, **{f.T * A.I.T: f.T for f in fixed}}
        if "second" in self.preserve:
            rules[A.I * m["second"] * A.I.T] = m["second"]

        def change(expr: sp.MatrixExpr) -> sp.Basic:
            moved = expr.xreplace({W: W * A.I}).doit().expand().subs(rules).doit()
            return sp.simplify((moved - expr.doit().expand()).doit())

        _, mean = self._first_layer()
        return {"E[z] = W mu + b": change(mean), "E[W x xT WT] = W S WT": change(W * m["second"] * W.T),
                "E[W x yT] = W C": change(W * m["cross"]), "|E[Wx + b - y]|^2": change(self.mean_residual_expr),
                "E|Wx + b - y|^2": change(self.expected_mse_expr)}

    # -- lowering -------------------------------------------------------------------------------------------
    @cached_property
    def _reads(self) -> dict[sp.MatrixSymbol, str]:
        return {**{s: n for n, s in self.symbols.items()}, **{s: f"__{k}" for k, s in self.moment_symbols.items()}}

    @cached_property
    def _constants(self) -> dict[str, torch.Tensor]:
        R, R_inv, _ = self.group._frame
        return {"__fixed": self.group.fixed, "__root": R, "__root_inverse": R_inv,
                **{f"__{k}": v for k, v in self.data.items() if k in _MOMENT_KEYS}}

    def _call(self, lowered: LoweredFunction, params: Mapping[str, torch.Tensor], *args: torch.Tensor) -> Any:
        reference = params[self.weight]
        constants = {k: v.to(dtype=reference.dtype, device=reference.device) for k, v in self._constants.items()}
        return lowered({**params, **constants}, *args)

    @cached_property
    def _vectors(self) -> list[sp.MatrixSymbol]:
        return [self.symbols[self.bias]] if self.bias else []

    @cached_property
    def lowered_action(self) -> LoweredFunction:
        return lower("act_distribution", self.action, self._reads, args=[self.element])

    @cached_property
    def lowered_infinitesimal(self) -> LoweredFunction:
        return lower("tangent_distribution", self.infinitesimal, self._reads, args=[self.algebra_element])

    @cached_property
    def conserved_expr(self) -> sp.MatrixExpr | None:
        """``C = P Wᵀ W P``, ``P = I − F(FᵀF)⁻¹Fᵀ`` (no second-moment constraint), else None."""
        if self.group.form is not None:
            return None
        F, W = self.moment_symbols["fixed"], self.symbols[self.weight]
        P = sp.Identity(self.n) - F * (F.T * F).I * F.T
        return P * W.T * W * P

    @property
    def velocity(self) -> sp.MatrixSymbol:
        """The symbol of ``Ẇ`` in :attr:`relation_expr`."""
        return sp.MatrixSymbol(r"\dot{W}_{1}", self.out_features, self.n)

    @cached_property
    def relation_expr(self) -> sp.MatrixExpr | None:
        """``J = P_G(Z − Zᵀ)P_G``, ``Z = R⁻¹ Ẇᵀ W R``, ``G = R⁻¹F`` (with a second-moment constraint), else None."""
        if self.group.form is None:
            return None
        m, W = self.moment_symbols, self.symbols[self.weight]
        G = m["root_inverse"] * m["fixed"]
        P = sp.Identity(self.n) - G * (G.T * G).I * G.T
        Z = m["root_inverse"] * self.velocity.T * W * m["root"]
        return P * (Z - Z.T) * P

    @cached_property
    def lowered_conserved(self) -> LoweredFunction | None:
        if self.conserved_expr is None:
            return None
        return lower("conserved_distribution", {"C": self.conserved_expr}, self._reads)

    @cached_property
    def lowered_relation(self) -> LoweredFunction | None:
        if self.relation_expr is None:
            return None
        return lower("relation_distribution", {"J": self.relation_expr}, {**self._reads, self.velocity: "__velocity"})

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after ``W ↦ W g⁻¹`` (``g`` checked to be in the group)."""
        self.group.check_element(g)
        return {**params, **self._call(self.lowered_action, params, g)}

    def tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """``M·θ = −W M`` (``M`` checked to be in the algebra)."""
        self.group.check_algebra_element(M)
        return self._call(self.lowered_infinitesimal, params, M)

    @cached_property
    def lowered_expected_mse(self) -> LoweredFunction:
        return lower("expected_mse", {"value": self.expected_mse_expr}, self._reads, vector_inputs=self._vectors)

    @cached_property
    def lowered_mean_residual(self) -> LoweredFunction:
        return lower("mean_residual", {"value": self.mean_residual_expr}, self._reads, vector_inputs=self._vectors)

    def _loss(self, lowered: LoweredFunction, expr: sp.Expr, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = [k for k in _MOMENT_KEYS if self.moment_symbols[k] in expr.free_symbols and k not in self.data]
        if missing:
            raise ValueError(f"{self.label}: {lowered.name} needs the moments {missing} (see moments(x, y))")
        return self._call(lowered, params)["value"]

    def expected_mse(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``E‖Wx + b − y‖²`` from the moments this symmetry was built with (those of :func:`moments`)."""
        return self._loss(self.lowered_expected_mse, self.expected_mse_expr, params)

    def mean_residual_loss(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``‖E[Wx + b − y]‖²`` from the moments ``mean`` and ``target_mean``."""
        return self._loss(self.lowered_mean_residual, self.mean_residual_expr, params)

    def conserved(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``C = P Wᵀ W P`` (only without a second-moment constraint)."""
        if self.lowered_conserved is None:
            raise ValueError(f"{self.label}: no quadratic conserved quantity (the algebra has no symmetric element); "
                             "use relation()")
        return self._call(self.lowered_conserved, params)["C"]

    def relation(self, params: Mapping[str, torch.Tensor], velocity: torch.Tensor) -> torch.Tensor:
        """``J(W, Ẇ)``, zero along gradient flow of the expected loss (only with a second-moment constraint)."""
        if self.lowered_relation is None:
            raise ValueError(f"{self.label}: no relation J without a second-moment constraint; use conserved()")
        return self._call(self.lowered_relation, {**params, "__velocity": velocity})["J"]

    def conserved_quantities(self) -> list[_Relation]:
        return [] if self.lowered_conserved is None else [_Relation(self, self.conserved)]

    def verify(self, expected_loss: ParamLoss, params: Mapping[str, torch.Tensor], seed: int = 0,
               tolerance: float = TOLERANCE) -> VerificationReport:
        """Checks of the *expected* loss ``expected_loss(params)`` (exact: from moments, or a quadrature).

        ``invariance`` under elements near and far from the identity and the other component;
        ``gradient_orthogonality`` per algebra generator; ``gd_drift`` and ``gradient_flow`` of ``C`` (mean-only
        groups) or ``relation`` ``J(W, −∇L) = 0`` (second-moment groups); ``group_axioms``; ``lowering`` vs SymPy.
        """
        generator = torch.Generator().manual_seed(seed)
        reference = params[self.weight]
        dtype, device = reference.dtype, reference.device
        elements = self.group.sample(generator, dtype, device, TEST_SCALES)
        worst, where = _worst_change(expected_loss, self.apply, params, elements)
        checks = [CheckResult("invariance", self.label, worst, tolerance, f"expected loss, worst: {where}")]
        grads = loss_gradients(expected_loss, params)
        basis = self.group.algebra_sample(MAX_GENERATORS, generator, dtype, device)
        with torch.no_grad():
            checks.append(check_gradient_orthogonality(self.label, lambda M: self.tangent(params, M), basis, grads,
                                                       tolerance))
            for q in self.conserved_quantities():
                checks.append(check_gd_drift(q, params, grads, tolerance))
        checks += check_gradient_flow(self, expected_loss, params, grads, tolerance)
        with torch.no_grad():
            form = self.group.form
            if self.lowered_relation is not None and form is not None:   # a relation J needs the second moment S
                J = self.relation(params, -grads[self.weight])
                scale = (reference.norm() * grads[self.weight].norm() * torch.linalg.cond(form.to(reference))).item()
                checks.append(CheckResult("relation", self.label, J.abs().max().item() / max(scale, 1e-300), tolerance,
                                          "J(W, −∇L) = 0, relative to ‖W‖ ‖∇L‖ cond(S)"))
            if elements:
                checks.append(check_group_axioms(self.label, self.apply, params, elements[-1][1], elements[0][1],
                                                 _params_distance, tolerance))
            checks += self._check_lowering(params, generator, tolerance)
        return VerificationReport(tuple(checks), dtype, str(device))

    def _check_lowering(self, params: Mapping[str, torch.Tensor], generator: torch.Generator,
                        tol: float) -> list[CheckResult]:
        W = params[self.weight]
        values = {self.symbols[self.weight].name: W.detach().cpu().double().numpy()}
        values.update({self.moment_symbols[k[2:]].name: v.cpu().double().numpy() for k, v in self._constants.items()})
        checks = []
        if self.group.is_continuous:
            M = self.group.random_algebra_element(1.0, generator, W.dtype, W.device)
            g = matrix_exp(M)
            checks += [_check_lowering(self.label, self._call(self.lowered_action, params, g), self.action,
                                       {**values, "A": g.cpu().double().numpy()}, tol, "action vs SymPy"),
                       _check_lowering(self.label, self._call(self.lowered_infinitesimal, params, M),
                                       self.infinitesimal, {**values, "M": M.cpu().double().numpy()}, tol,
                                       "infinitesimal action vs SymPy")]
        if self.conserved_expr is not None:
            checks.append(_check_lowering(self.label, {"C": self.conserved(params)}, {"C": self.conserved_expr},
                                          values, tol, "C vs SymPy"))
        if self.relation_expr is not None:
            velocity = torch.randn(W.shape, generator=generator, dtype=W.dtype).to(W.device)
            checks.append(_check_lowering(self.label, {"J": self.relation(params, velocity)}, {"J": self.relation_expr},
                                          {**values, self.velocity.name: velocity.cpu().double().numpy()}, tol,
                                          "J vs SymPy"))
        return checks


# -- expectations -------------------------------------------------------------------------------------------
def gaussian_expectation(fn: Callable[[torch.Tensor], torch.Tensor], mean: torch.Tensor, covariance: torch.Tensor,
                         nodes: int = 32, max_points: int = 2_000_000) -> torch.Tensor:
    """``E_{x ~ N(mean, covariance)} fn(x)`` by tensor-product Gauss–Hermite quadrature (``nodes`` per axis).

    ``fn`` maps ``(k, n)`` points to ``(k,)`` values. Exact for polynomials of degree ``< 2·nodes`` in each
    coordinate and exponentially accurate for analytic ``fn``; ``nodes^n`` points, so for small ``n``.
    Differentiable in whatever ``fn`` closes over.

    >>> value = gaussian_expectation(lambda x: (x ** 2).sum(-1), torch.zeros(2, dtype=torch.float64),
    ...                              torch.diag(torch.tensor([1.0, 3.0], dtype=torch.float64)), nodes=4)
    >>> round(value.item(), 12)
    4.0
    """
    n = mean.shape[-1]
    if nodes ** n > max_points:
        raise ValueError(f"gaussian_expectation: {nodes}^{n} quadrature points exceed max_points={max_points}; "
                         "use fewer nodes or paired_monte_carlo")
    points, masses = np.polynomial.hermite_e.hermegauss(nodes)
    z = torch.tensor(points, dtype=mean.dtype, device=mean.device)
    w = torch.tensor(masses / masses.sum(), dtype=mean.dtype, device=mean.device)
    grid = torch.cartesian_prod(*[z] * n).reshape(-1, n)
    weights = torch.cartesian_prod(*[w] * n).reshape(-1, n).prod(-1)
    x = mean.reshape(1, n) + grid @ torch.linalg.cholesky(covariance).T
    return (weights * fn(x)).sum()


def paired_monte_carlo(fn_a: Callable[[torch.Tensor], torch.Tensor], fn_b: Callable[[torch.Tensor], torch.Tensor],
                       samples: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error of ``fn_a(x) − fn_b(x)`` over ``samples`` (common random numbers).

    For a distribution symmetry, ``E[fn_a − fn_b] = 0``; the estimate should be within a few standard errors.
    """
    difference = fn_a(samples) - fn_b(samples)
    return difference.mean().item(), (difference.std() / math.sqrt(len(difference))).item()
