"""Symmetry teleportation: move parameters along a loss level set to where an objective is best.

API
---
``as_action(obj, x=None, params=None)``
    an :class:`Action` for a symalg analysis (an ``Analysis`` of any front end, one or several symmetries; for
    symbolic widths give ``params``, whose shapes fix them), a conjugated action (``ConjugatedAction``/``TestFunction``,
    parameters ``{"x": point}``), or a data-dependent action (``DataDependentAction``, ``ExactTeleport``,
    ``ApproximateTeleport``; give the batch ``x`` and ``params`` for the widths). Your own: subclass :class:`Action`
    or wrap ``fn(params, coords)`` in :class:`FunctionAction`.
``teleport(action, params, loss, objective=GradNorm(), steps=10, ...)`` → :class:`TeleportResult`
    (or ``Teleporter(action, ...)(params, loss)``: the same settings kept for reuse).
Objectives: :class:`GradNorm`, :class:`MetricGradNorm` (with :func:`optimizer_metric`), :class:`Sharpness`
    (eq. 5.1), :class:`Curvature` (eq. 5.2), or any callable ``params → scalar``.

``transform_cotangent(action, moves, params_after, vectors)``: ``J⁻ᵀ v`` for the Jacobian ``J`` of the teleport.
Optimizer integration: :mod:`symalg.applications.teleport_optim`.

Math
----
An action maps Lie-algebra coordinates ``c ∈ R^d`` to parameters, ``θ ↦ exp(Σ cᵢ Bᵢ)·θ`` (``Bᵢ`` the algebra
basis, ``exp`` exact: :meth:`SiteGroup.exp <symalg.catalogue.groups.SiteGroup.exp>`). A teleport maximises
(or minimises) an objective ``F`` over the orbit by gradient steps on the coordinates, differentiating through the
action:

    Δ = ±s ∇_c F(exp(Σ cᵢ Bᵢ)·θ_k)|_{c=0},     θ_{k+1} = exp(Σ Δᵢ Bᵢ)·θ_k        (compose=True)

so the group element is the product ``g = exp(Δ_K)⋯exp(Δ_1)``, each factor exact (``compose=False`` keeps one
element ``exp(Σ cᵢ Bᵢ)`` and steps ``c``). Every factor keeps the loss, so only the step length ``s`` is chosen:
by default the normalised step ``‖Δ‖ = max_step`` halved until the objective rises by the Armijo amount
``ARMIJO·‖Δ‖‖∇_c F‖`` (scale-free: ``F ↦ kF`` changes no iterate), or a fixed rate ``s = lr`` when ``lr`` is
given. Discrete generators (permutations, sign flips, reflections) are searched greedily or at random
(``discrete=``). Since ``L(g·θ) = L(θ)``, the chain rule gives
``∇L(g·θ) = J⁻ᵀ ∇L(θ)`` with ``J = ∂(g·θ)/∂θ``: for a linear action ``J = g`` and an orthogonal ``g`` leaves
``‖∇L‖`` unchanged (Cor. 4.5.2), so only the non-orthogonal part of a group can speed up gradient descent.
The loss is measured at every iterate; the result is the iterate with the best objective among those that
changed the loss by at most ``tolerance`` (relative), so never worse than the start. It is accepted when it
improved the objective by at least ``min_gain`` (relative); otherwise the original parameters come back with
``accepted=False`` and the reason.

Objectives (``maximize`` is each one's default direction; pass ``maximize=`` to :func:`teleport` to flip it):

* ``GradNorm``: ``‖∇L‖²``, the rate ``−dL/dt`` of gradient flow (eq. 4.17).
* ``MetricGradNorm(P)``: ``∇Lᵀ diag(P) ∇L``, the decay rate of a diagonally preconditioned method (eq. 4.17
  with ``η = diag(P)``; for AdaGrad ``P = (√G + ε)⁻¹``); :func:`optimizer_metric` reads ``P`` from a torch
  optimizer's state (the preconditioner of its next step).
* ``Sharpness``: eq. 5.1 less the loss, ``φ(θ) − L(θ) = (1/|T||D|) Σ_{t∈T} Σ_{d∈D} [L(θ + t d) − L(θ)]`` over unit
  directions ``D`` (antithetic pairs ``±d``, so the odd Taylor terms cancel: ``≈ t² tr(H)/(2n)``, ``n`` the
  number of parameters); on an exact orbit it differs from eq. 5.1 by the constant ``L``.
* ``Curvature``: eq. 5.2, ``ψ(θ) = (1/k) Σᵢ κ(γ_{Mᵢ}, 0)`` with ``γ_M(t) = exp(tM)·θ`` and
  ``κ = (‖γ'‖²‖γ''‖² − (γ'·γ'')²)^{1/2} / ‖γ'‖³`` (``Mᵢ`` random unit coordinate vectors, fixed by ``seed``).

Example
-------
>>> import torch, symalg
>>> from symalg.applications.teleport import as_action, teleport
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2)).double()
>>> x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
>>> action = as_action(symalg.derive(symalg.trace(model, (x,))))          # GL(4) on the hidden site
>>> loss = lambda p: ((torch.func.functional_call(model, p, (x,)) - y) ** 2).mean()
>>> result = teleport(action, dict(model.named_parameters()), loss, steps=5)
>>> result.accepted, result.objective_after > result.objective_before, result.relative_loss_change < 1e-12
(True, True, True)
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, NamedTuple, Sequence, cast

import sympy as sp
import torch

from symalg.errors import SpecError
from symalg.progress import Progress, report
from symalg.catalogue.groups import matrix_exp_pair
from symalg.numeric.autodiff import differentiable_kernels
from symalg.applications.conjugated import ConjugatedAction, TestFunction
from symalg.applications.flat_minima import ParamLoss
from symalg.applications.nonlinear_actions import DataDependentAction
from symalg.applications.teleport_actions import ApproximateTeleport, ExactTeleport

if TYPE_CHECKING:   # read for their types only: symmetries come from a derivation, never built here
    from symalg.symbolic.symmetry import Symmetry

__all__ = ["ARMIJO", "Action", "BACKTRACK", "ConjugatedCoordinates", "Curvature", "DataCoordinates", "FunctionAction",
           "GradNorm", "MetricGradNorm", "Move", "NextStep", "Objective", "Sharpness", "StepTest", "SymmetryAction",
           "TOLERANCES", "TeleportResult", "Teleporter", "as_action", "gradients", "optimizer_metric", "teleport",
           "transform_cotangent"]

Params = Mapping[str, torch.Tensor]
Metric = Mapping[str, torch.Tensor] | Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
"""A diagonal preconditioner ``P``: ``{name: P}`` (broadcast to each parameter) or a callable ``grads → {name: P}``."""

TOLERANCES = {torch.float64: 1e-8, torch.float32: 1e-4}
"""Default bound on the relative loss change of an accepted teleport, keyed by dtype."""


# ------------------------------------------------------------------------------------------------ actions

def _float_like(params: Params) -> torch.Tensor:
    """The first floating-point tensor of ``params`` (for dtype and device)."""
    for p in params.values():
        if p.is_floating_point():
            return p
    raise ValueError("params: no floating-point tensor")


@dataclass(frozen=True)
class Move:
    """One factor of a teleport's group element: ``exp(Σ cᵢ Bᵢ)`` (``coords``) or a discrete generator
    (``generator`` index, its inverse when ``inverse``)."""

    coords: torch.Tensor | None = None
    generator: int | None = None
    inverse: bool = False

    def __post_init__(self) -> None:
        if self.coords is None and self.generator is None:
            raise ValueError("Move: give coords or a generator index")


class Action:
    """An action of a group on parameter dicts through Lie-algebra coordinates (subclass and implement).

    ``dim``: number of coordinates; ``self(params, coords)`` = ``exp(Σ cᵢ Bᵢ)·params`` as a new dict (untouched
    entries shared), differentiable in ``coords``. Optional: discrete generators (``discrete_generators``,
    ``apply_discrete``), ``inverse_step`` (default ``self(params, −coords)``), and two flags:
    ``is_group_action`` (``g⁻¹·(g·θ) = θ``, needed for an exact :func:`transform_cotangent`) and
    ``monomial_jacobian`` (every ``J`` is a permutation times a diagonal: scalings, permutations, sign flips,
    translations; diagonal second moments then transform exactly).
    """

    if TYPE_CHECKING:   # read-only to callers: a subclass gives them as dataclass fields or as properties
        @property
        def dim(self) -> int: ...

        @property
        def is_group_action(self) -> bool: ...

        @property
        def monomial_jacobian(self) -> bool: ...
    else:
        dim = 0
        is_group_action = True
        monomial_jacobian = False

    def __call__(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def discrete_generators(self) -> tuple[str, ...]:
        """Names of the discrete generators (empty: none)."""
        return ()

    def apply_discrete(self, params: Params, index: int, inverse: bool = False) -> dict[str, torch.Tensor]:
        raise ValueError(f"{type(self).__name__} has no discrete generators (index {index})")

    def inverse_step(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        """``exp(Σ cᵢ Bᵢ)⁻¹·params``."""
        return self(params, -coords)

    def first_order(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        """A map with the value and the first derivative of ``self(params, ·)`` at ``coords = 0``: what an ascent
        step differentiates (once) at the current point. Default: the action itself; an action whose exponential
        is costly to differentiate gives its linearisation (``exp(C) ↦ I + C``, exact at 0 to first order)."""
        return self(params, coords)

    def replay(self, params: Params, moves: Sequence[Move]) -> dict[str, torch.Tensor]:
        """Apply the moves in order (the teleport's group element)."""
        out = dict(params)
        for move in moves:
            if move.coords is not None:
                out = self(out, move.coords)
            elif move.generator is not None:
                out = self.apply_discrete(out, move.generator, move.inverse)
        return out

    def undo(self, params: Params, moves: Sequence[Move]) -> dict[str, torch.Tensor]:
        """Apply the inverse of the moves' group element (exact for group actions)."""
        out = dict(params)
        for move in reversed(moves):
            if move.coords is not None:
                out = self.inverse_step(out, move.coords)
            elif move.generator is not None:
                out = self.apply_discrete(out, move.generator, not move.inverse)
        return out

    def _check_coords(self, coords: torch.Tensor) -> None:
        if not isinstance(coords, torch.Tensor) or coords.shape != (self.dim,):
            raise ValueError(f"{type(self).__name__}: coords must have shape ({self.dim},), got "
                             f"{tuple(coords.shape) if isinstance(coords, torch.Tensor) else type(coords).__name__}")


@dataclass(frozen=True, eq=False)
class FunctionAction(Action):
    """Your own action ``fn(params, coords) → params`` with ``dim`` coordinates.

    >>> from symalg.catalogue.groups import matrix_exp
    >>> rotate = FunctionAction(lambda p, c: {"x": matrix_exp(c[0] * torch.tensor([[0., -1.], [1., 0.]])) @ p["x"]}, 1)
    >>> rotate({"x": torch.tensor([1.0, 0.0])}, torch.tensor([math.pi / 2]))["x"].round(decimals=6).abs().tolist()
    [0.0, 1.0]
    """

    fn: Callable[[Params, torch.Tensor], Mapping[str, torch.Tensor]]
    dim: int
    is_group_action: bool = True
    monomial_jacobian: bool = False

    def __call__(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        self._check_coords(coords)
        return dict(self.fn(params, coords))


@dataclass(frozen=True, eq=False)
class SymmetryAction(Action):
    """The product of symmetries derived by symalg (:class:`~symalg.symbolic.symmetry.Symmetry`), acting by their
    ``apply``. Coordinates are concatenated over the continuous symmetries' ``group.algebra_basis()``, in order;
    the discrete generators of every group (``group.discrete_generators()``) are offered for search.
    """

    symmetries: tuple[Symmetry, ...]

    def __post_init__(self) -> None:
        bad = [s for s in self.symmetries if not (hasattr(s, "group") and hasattr(s, "apply"))]
        if bad:
            raise TypeError("SymmetryAction: symmetries must be symalg symmetries (with .group and .apply), "
                            f"got {bad[0]!r}")
        symbolic = [s.label for s in self.symmetries if not sp.sympify(s.group.width).is_Integer]
        if symbolic:
            raise SpecError(f"SymmetryAction: symmetries {symbolic} have symbolic widths; substitute concrete ones "
                            "(analysis.subs, or as_action(analysis, params=params))")

    @property
    def continuous(self) -> tuple[Symmetry, ...]:
        return tuple(s for s in self.symmetries if s.group.is_continuous)

    @property
    def dim(self) -> int:
        return sum(int(s.group.dim) for s in self.continuous)

    @property
    def monomial_jacobian(self) -> bool:
        return all(s.group.acts_monomially for s in self.symmetries)

    def _algebra_element(self, symmetry: Symmetry, coords: torch.Tensor) -> torch.Tensor:
        return symmetry.group.algebra_element(coords)   # one h × h matrix, not the group's basis

    def _chunks(self, coords: torch.Tensor) -> Iterator[tuple[Symmetry, torch.Tensor]]:
        self._check_coords(coords)
        start = 0
        for s in self.continuous:
            size = int(s.group.dim)
            yield s, coords[start:start + size]
            start += size

    def __call__(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        out = dict(params)
        for s, c in self._chunks(coords):
            out = s.apply(out, s.group.exp(self._algebra_element(s, c)))
        return out

    def inverse_step(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        out = dict(params)
        for s, c in reversed(list(self._chunks(coords))):
            out = s.apply(out, s.group.exp(-self._algebra_element(s, c)))
        return out

    def _generators(self) -> list[tuple[Symmetry, int, torch.Tensor]]:
        return [(s, j, g) for s in self.symmetries for j, g in enumerate(s.group.discrete_generators())]

    def discrete_generators(self) -> tuple[str, ...]:
        return tuple(f"{s.label}: generator {j}" for s, j, _ in self._generators())

    def apply_discrete(self, params: Params, index: int, inverse: bool = False) -> dict[str, torch.Tensor]:
        s, _, g = self._generators()[index]
        g = g.to(dtype=_float_like(params).dtype)
        return s.apply(params, g.transpose(-1, -2) if inverse else g)  # all discrete generators are orthogonal

    def elements(self, moves: Sequence[Move], dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """The composed group element of every symmetry, ``{label: g}`` (matrix, diagonal or translation vector),
        such that applying each ``s.apply(θ, g)`` in the order of :attr:`symmetries` reproduces :meth:`replay`.

        A translation ``T`` (a key bias, a shear) does not commute with a group moving its region: ``G(g) S(T) =
        S(g·T) G(g)``. So a move's element of a symmetry listed before the translation carries the accumulated ``T``
        (``T ↦ g·T``), and the move's own ``t`` is carried back through the accumulated elements of the symmetries
        listed after it (``t ↦ G⁻¹·t``) before it adds up; symmetries of different sites commute."""
        current: dict[str, torch.Tensor] = {}
        for s in self.symmetries:
            fmt = s.group.element_format
            h = int(sp.sympify(s.group.width))
            current[s.label] = torch.zeros(h, dtype=dtype) if fmt == "vector" else \
                torch.ones(h, dtype=dtype) if fmt == "diagonal" else torch.eye(h, dtype=dtype)
        generators = self._generators()
        for move in moves:
            if move.coords is not None:
                step = {s.label: s.group.exp(self._algebra_element(s, c))
                        for s, c in self._chunks(move.coords.to(dtype))}
            elif move.generator is not None:
                s, _, g = generators[move.generator]
                step = {s.label: g.to(dtype).T if move.inverse else g.to(dtype)}
            else:
                continue
            before = dict(current)
            for j, s in enumerate(self.symmetries):
                if s.group.element_format == "vector":
                    T = current[s.label]
                    for m in self.symmetries[:j]:
                        if m.label in step and m.group.element_format != "vector":
                            T = _carried(s, m, step[m.label], T)
                    if s.label in step:
                        t = step[s.label]
                        for m in reversed(self.symmetries[j + 1:]):
                            if m.group.element_format != "vector":
                                t = _carried(s, m, _inverse(m.group.element_format, before[m.label]), t)
                        T = T + t
                    current[s.label] = T
                elif s.label in step:
                    e = step[s.label]
                    current[s.label] = e * current[s.label] if s.group.element_format == "diagonal" else \
                        e @ current[s.label]
        return current


def _inverse(element_format: str, g: torch.Tensor) -> torch.Tensor:
    return 1 / g if element_format == "diagonal" else torch.linalg.inv(g)


def _carried(translation: Symmetry, other: Symmetry, g: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """The coordinates ``T'`` of ``translation`` with ``other(g)·S(T) = S(T')·other(g)``: ``other``'s element moves
    the translated regions' change ``Σ T_i B_i`` (its constant part, on zero parameters elsewhere), read back on the
    directions. Raises where the moved change is no translation of the family (no symmetry here does that)."""
    if not set(other.tensors) & {r.tensor for f in translation.translations for r in f.regions}:
        return T
    shapes = {**other.shapes, **translation.shapes}
    names = sorted({r.tensor for f in translation.translations for r in f.regions} | set(other.tensors))
    zeros = {n: torch.zeros(shapes[n], dtype=T.dtype, device=T.device) for n in names}
    constant = [d for f in translation.translations for d in replace(f, absorbers=()).directions(zeros)]
    regions = sorted({r.tensor for f in translation.translations for r in f.regions})
    basis = torch.stack([torch.cat([d.get(n, zeros[n]).reshape(-1) for n in regions]) for d in constant], 1)
    change = {**zeros, **{n: sum(((c * d[n]) for c, d in zip(T, constant) if n in d), zeros[n]) for n in regions}}
    moved = other.apply(change, g)
    target = torch.cat([moved[n].reshape(-1) for n in regions])
    coordinates = torch.linalg.pinv(basis) @ target
    if (basis @ coordinates - target).norm() > 1e-9 * max(1.0, float(target.norm())):
        raise NotImplementedError(f"elements: {other.label} does not map the directions of {translation.label} "
                                  "to themselves")
    return coordinates


@dataclass(frozen=True, eq=False)
class ConjugatedCoordinates(Action):
    """A :class:`~symalg.applications.conjugated.ConjugatedAction` on the point ``params[key]``:
    ``x ↦ action.act(x, c)``."""

    action: ConjugatedAction
    key: str = "x"

    @property
    def dim(self) -> int:
        return int(self.action.group.dim)

    def __call__(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        self._check_coords(coords)
        return {**params, self.key: self.action.act(params[self.key], coords)}

    def discrete_generators(self) -> tuple[str, ...]:
        count = len(self.action.group.discrete_generators())
        return tuple(f"{self.action.group.name}: generator {j}" for j in range(count))

    def apply_discrete(self, params: Params, index: int, inverse: bool = False) -> dict[str, torch.Tensor]:
        x = params[self.key]
        g = self.action.group.discrete_generators(x.dtype, x.device)[index]
        return {**params, self.key: self.action.apply(x, g.transpose(-1, -2) if inverse else g)}


def _exp_at_zero(C: torch.Tensor) -> torch.Tensor:
    """``exp(C)`` at ``C = 0`` for differentiation: ``I + C + C²/2 + C³/6``, whose value is ``I = exp(0)`` exactly
    and whose derivatives in ``C`` up to the third equal those of ``exp`` at 0 (the most an objective here takes:
    :class:`Curvature` differentiates twice along a curve, the ascent once more). Back-propagating through
    ``matrix_exp`` instead costs the exponential of a ``2n × 2n`` block matrix per derivative.

    >>> C = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    >>> M = torch.randn(3, 3, dtype=torch.float64)
    >>> (exact,) = torch.autograd.grad((torch.linalg.matrix_exp(C) * M).sum(), C)
    >>> (fast,) = torch.autograd.grad((_exp_at_zero(C) * M).sum(), C)
    >>> bool(torch.equal(_exp_at_zero(C).detach(), torch.eye(3, dtype=torch.float64)))
    True
    >>> bool(torch.allclose(fast, exact))
    True
    """
    C2 = C @ C
    return torch.eye(C.shape[-1], dtype=C.dtype, device=C.device) + C + C2 / 2 + C2 @ C / 6


@dataclass(frozen=True, eq=False)
class DataCoordinates(Action):
    """A data-dependent action ``action(params, g, x)``
    (:class:`~symalg.applications.nonlinear_actions.DataDependentAction`,
    :class:`~symalg.applications.teleport_actions.ExactTeleport`,
    :class:`~symalg.applications.teleport_actions.ApproximateTeleport`) at the batch ``x``, with ``g = exp(Cᵢ)``
    per site, ``Cᵢ`` the coordinates reshaped to ``widths[i] × widths[i]``.

    ``is_group_action`` is ``False`` for ``ApproximateTeleport`` and an uncompleted ``ExactTeleport`` (their
    unit axiom fails below full rank; see :mod:`symalg.applications.teleport_actions`).
    """

    action: DataDependentAction | ExactTeleport | ApproximateTeleport
    x: torch.Tensor
    widths: tuple[int, ...]

    @property
    def dim(self) -> int:
        return sum(w * w for w in self.widths)

    @property
    def is_group_action(self) -> bool:
        return isinstance(self.action, DataDependentAction) or bool(getattr(self.action, "complete", False))

    def __call__(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        self._check_coords(coords)
        at_zero = coords.requires_grad and not bool(coords.detach().any())
        return self._act(params, coords, (lambda C: (_exp_at_zero(C), _exp_at_zero(-C))) if at_zero else
                         lambda C: matrix_exp_pair(C, isinstance(self.action, ExactTeleport)))

    def first_order(self, params: Params, coords: torch.Tensor) -> dict[str, torch.Tensor]:
        """The action with ``exp(C)`` replaced by ``I + C`` (and ``exp(C)⁻¹`` by ``I − C``): at ``C = 0`` the same
        value and first derivative, at the cost of additions ([Zhao2026]'s ``g = I + T`` is this, used as a group
        element; here only its derivative at 0 is, and every step applies the exact ``exp(Δ)``)."""
        self._check_coords(coords)
        if bool(coords.detach().any()):
            return self(params, coords)
        if isinstance(self.action, ExactTeleport):     # its linearisation skips the derivative's zero value too
            return self.action.first_order(params, coords.reshape(self.widths[0], self.widths[0]), self.x)

        def linear(C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            eye = torch.eye(C.shape[-1], dtype=C.dtype, device=C.device)
            return eye + C, eye - C

        return self._act(params, coords, linear)

    def _act(self, params: Params, coords: torch.Tensor,
             exp: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]) -> dict[str, torch.Tensor]:
        """The action with ``(g, g⁻¹) = exp(C)`` per site (``C`` the coordinates reshaped to ``w × w``)."""
        blocks, start = [], 0
        for w in self.widths:
            blocks.append(coords[start:start + w * w].reshape(w, w))
            start += w * w
        if isinstance(self.action, DataDependentAction):
            return self.action(params, [exp(C)[0] for C in blocks], self.x)
        g, g_inv = exp(blocks[0])
        if isinstance(self.action, ExactTeleport):     # g⁻¹ = exp(−C) exactly: no solve, nor its backward
            return self.action(params, g, self.x, g_inv=g_inv)
        return self.action(params, g, self.x)


def as_action(obj: Any, x: torch.Tensor | None = None, params: Params | None = None, key: str = "x") -> Action:
    """An :class:`Action` for ``obj`` (see the module docstring); ``x`` only for data-dependent actions, ``params``
    for them and for an analysis with symbolic widths (read off the shapes of ``params``).

    >>> from symalg.applications.conjugated import booth
    >>> as_action(booth()).dim
    1
    """
    if isinstance(obj, Action):
        return obj
    if hasattr(obj, "symmetries"):
        if params is not None and getattr(obj, "widths", None):
            obj = obj.at_widths_of(params)
        return SymmetryAction(tuple(obj.symmetries))
    if hasattr(obj, "group") and hasattr(obj, "apply") and hasattr(obj, "label"):
        return SymmetryAction((obj,))
    if isinstance(obj, (list, tuple)):
        return SymmetryAction(tuple(obj))
    if isinstance(obj, TestFunction):
        return ConjugatedCoordinates(obj.action, key)
    if isinstance(obj, ConjugatedAction):
        return ConjugatedCoordinates(obj, key)
    if isinstance(obj, (DataDependentAction, ExactTeleport, ApproximateTeleport)):
        if x is None or params is None:
            raise ValueError(f"as_action: a data-dependent action ({type(obj).__name__}) needs the batch x and params "
                             "(for the site widths)")
        net = obj.net
        sites = range(net.sites) if isinstance(obj, DataDependentAction) else [obj.site]
        return DataCoordinates(obj, x, tuple(int(params[net.weights[i]].shape[-2]) for i in sites))
    raise TypeError(f"as_action: cannot make an action from {type(obj).__name__}; pass a symalg analysis or symmetry, "
                    "a ConjugatedAction/TestFunction, a data-dependent action, or an Action")


# ------------------------------------------------------------------------------------------------ objectives

def gradients(loss: Callable[[Params], torch.Tensor], params: Params, wrt: Sequence[str],
              create_graph: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(L(θ), {name: ∂L/∂θ_name})`` for the entries ``wrt``, differentiable when ``create_graph``.

    Each entry is differentiated through its own alias: at teleported parameters one moved tensor may be computed
    from another (a shear's ``b' = b − W' t`` reads the moved ``W'``), and the gradient with respect to ``W'``
    itself would then add the path through ``b'``; the partial derivative is the gradient."""
    leaves = {n: params[n].view_as(params[n]) if params[n].requires_grad else params[n].detach().requires_grad_(True)
              for n in wrt}
    value = loss({**params, **leaves})
    grads = torch.autograd.grad(value, list(leaves.values()), create_graph=create_graph, allow_unused=True)
    return value, {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(wrt, grads)}


class Objective:
    """Base of the built-in objectives: ``objective(params, loss, action, wrt)`` → scalar tensor, differentiable
    in ``params``; ``maximize`` is the default direction. Any other callable is called as ``f(params)``."""

    maximize: bool = True

    def __call__(self, params: Params, loss: ParamLoss, action: Action, wrt: Sequence[str]) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class GradNorm(Objective):
    """``‖∇L‖²`` (maximised by default: the fastest initial descent, Alg. 1 line 3)."""

    maximize: bool = True

    def __call__(self, params: Params, loss: ParamLoss, action: Action, wrt: Sequence[str]) -> torch.Tensor:
        _, grads = gradients(loss, params, wrt)
        return cast(torch.Tensor, sum((g * g).sum() for g in grads.values()))   # wrt is never empty


@dataclass(frozen=True)
class MetricGradNorm(Objective):
    """``∇Lᵀ diag(P) ∇L``: ``metric`` is ``{name: P}`` (broadcast to each parameter) or a callable
    ``grads → {name: P}`` (e.g. :func:`optimizer_metric`); names missing from it count with ``P = 1``."""

    metric: Metric
    maximize: bool = True

    def __call__(self, params: Params, loss: ParamLoss, action: Action, wrt: Sequence[str]) -> torch.Tensor:
        _, grads = gradients(loss, params, wrt)
        metric = self.metric(grads) if callable(self.metric) else self.metric
        return cast(torch.Tensor, sum((metric.get(n, 1.0) * g * g).sum() for n, g in grads.items()))


def _unit_directions(shapes: Mapping[str, torch.Size], count: int, seed: int,
                     like: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        d = {n: torch.randn(s, generator=generator, dtype=like.dtype).to(like.device) for n, s in shapes.items()}
        norm = math.sqrt(sum(float((v * v).sum()) for v in d.values()))
        out.append({n: v / norm for n, v in d.items()})
    return out


@dataclass(frozen=True)
class Sharpness(Objective):
    """Eq. 5.1 less the loss: ``(1/|T||D|) Σ_{t,d} L(θ + t d) − L(θ)``, ``D`` = ``directions`` random unit vectors and
    their negatives (fixed by ``seed``), ``T`` = ``displacements``. Minimised by default (flatter).

    For a quadratic ``L = ½ θᵀHθ`` it is exactly ``(1/|T||D|) Σ t²/2 · dᵀHd``, whose mean over directions is
    ``t² tr(H)/(2n)``. [Zhao2026] used ``T = 0.001, 0.011, …, 0.191`` and ``|D| = 200``.
    """

    displacements: tuple[float, ...] = (0.05, 0.1)
    directions: int = 8
    seed: int = 0
    maximize: bool = False

    def __call__(self, params: Params, loss: ParamLoss, action: Action, wrt: Sequence[str]) -> torch.Tensor:
        base = loss(params)
        shapes = {n: params[n].shape for n in wrt}
        total, count = base.new_zeros(()), 0
        for d in _unit_directions(shapes, self.directions, self.seed, base):
            for t in self.displacements:
                for sign in (1.0, -1.0):
                    total = total + loss({**params, **{n: params[n] + sign * t * d[n] for n in wrt}})
                    count += 1
        return total / count - base


def _derivative(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``dy/dt`` for a vector ``y`` of a scalar ``t``, itself differentiable (double-vjp trick)."""
    u = torch.zeros_like(y, requires_grad=True)
    (dt,) = torch.autograd.grad(y, t, grad_outputs=u, create_graph=True, allow_unused=True)
    if dt is None:
        return torch.zeros_like(y)
    (dy,) = torch.autograd.grad(dt, u, create_graph=True, allow_unused=True)
    return torch.zeros_like(y) if dy is None else dy


@dataclass(frozen=True)
class Curvature(Objective):
    """Eq. 5.2: the mean curvature ``κ`` at ``t = 0`` of ``curves`` orbit curves ``γ(t) = exp(t Σ mᵢ Bᵢ)·θ``,
    ``m`` random unit coordinate vectors (fixed by ``seed``), ``κ = (‖γ'‖²‖γ''‖² − (γ'·γ'')²)^{1/2}/‖γ'‖³`` over the
    entries ``wrt``. Maximised by default (Sec. 5.3: larger curvature generalised better).

    >>> from symalg.catalogue.groups import matrix_exp
    >>> circle = FunctionAction(lambda p, c: {"x": matrix_exp(c[0] * torch.tensor([[0., -1.], [1., 0.]])) @ p["x"]}, 1)
    >>> round(Curvature()({"x": torch.tensor([2.0, 0.0])}, None, circle, ["x"]).item(), 6)   # radius 2
    0.5
    """

    curves: int = 1
    seed: int = 0
    maximize: bool = True

    def __call__(self, params: Params, loss: ParamLoss | None, action: Action, wrt: Sequence[str]) -> torch.Tensor:
        if action.dim == 0:
            raise ValueError("Curvature: the action has no continuous part (dim 0)")
        like = _float_like(params)
        generator = torch.Generator().manual_seed(self.seed)
        total = like.new_zeros(())
        for _ in range(self.curves):
            m = torch.randn(action.dim, generator=generator, dtype=like.dtype).to(like.device)
            t = torch.zeros((), dtype=like.dtype, device=like.device, requires_grad=True)
            moved = action(params, t * (m / m.norm()))
            gamma = torch.cat([moved[n].reshape(-1) for n in wrt])
            d1 = _derivative(gamma, t)
            d2 = _derivative(d1, t)
            speed2 = (d1 * d1).sum()
            if float(speed2.detach()) == 0:
                raise ValueError("Curvature: γ'(0) = 0 (the random generator fixes θ); use another seed")
            cross = (speed2 * (d2 * d2).sum() - (d1 * d2).sum() ** 2).clamp_min(torch.finfo(like.dtype).tiny)
            total = total + cross.sqrt() / speed2 ** 1.5
        return total / self.curves


def optimizer_metric(optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.Tensor]
                     ) -> Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The diagonal preconditioner ``P`` of ``optimizer``'s next step at gradient ``g``, for :class:`MetricGradNorm`.

    ``named_params`` maps names to the optimizer's parameter tensors (``dict(model.named_parameters())``).
    Adagrad: ``P = 1/(√(G + g²) + ε)`` (``G`` = state ``sum``: torch adds ``g²`` before dividing; [Zhao2026]'s
    ``(εI + diag G_{t+1})^{−1/2}``, eq. 5.7, places ``ε`` inside the root). RMSprop: ``v' = αv + (1 − α)g²``,
    ``P = 1/(√v' + ε)``. Adam/AdamW: ``v' = β₂v + (1 − β₂)g²``, ``P = 1/(√(v'/(1 − β₂^{t+1})) + ε)``. SGD: ``P = 1``.
    Learning rates and momentum are left out (a constant factor, or the old direction). State is read as stored.
    """
    groups = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    kind = type(optimizer).__name__
    if kind not in ("Adagrad", "RMSprop", "Adam", "AdamW", "SGD"):
        raise ValueError(f"optimizer_metric: no preconditioner known for {kind} (Adagrad, RMSprop, Adam, AdamW, SGD)")
    missing = [n for n, p in named_params.items() if id(p) not in groups]
    if missing:
        raise ValueError(f"optimizer_metric: named_params {missing} are not in the optimizer's parameter groups")

    def root(v: torch.Tensor) -> torch.Tensor:
        """``√v`` with a finite derivative where ``v = 0`` (a unit that has had no gradient yet)."""
        return v.clamp_min(torch.finfo(v.dtype).tiny).sqrt()

    def metric(grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, g in grads.items():
            if name not in named_params:
                continue
            p = named_params[name]
            group, state = groups[id(p)], optimizer.state.get(p, {})
            if kind == "Adagrad":
                out[name] = 1 / (root(state["sum"] + g * g) + group["eps"])
            elif kind == "RMSprop":
                if group["centered"]:
                    raise ValueError("optimizer_metric: centered RMSprop is not supported (its P depends on the mean)")
                v = group["alpha"] * state.get("square_avg", torch.zeros_like(g)) + (1 - group["alpha"]) * g * g
                out[name] = 1 / (root(v) + group["eps"])
            elif kind in ("Adam", "AdamW"):
                if group["amsgrad"]:
                    raise ValueError("optimizer_metric: amsgrad is not supported")
                beta2 = group["betas"][1]
                step = float(state.get("step", 0)) + 1
                v = beta2 * state.get("exp_avg_sq", torch.zeros_like(g)) + (1 - beta2) * g * g
                out[name] = 1 / (root(v / (1 - beta2 ** step)) + group["eps"])
            else:
                out[name] = torch.ones_like(g)
        return out

    return metric


# ------------------------------------------------------------------------------------------------ next step

@dataclass(frozen=True)
class StepTest:
    """What :meth:`NextStep.test` measured at one point: ``slope = gᵀd`` (the first-order decrease per unit of
    ``lr``), ``sharpness = lr · dᵀHd / gᵀd`` (2 is the stability limit of the step), ``predicted`` and ``actual``
    the model's and the loss's decrease over the step ``θ ↦ θ − lr·d``, and whether it ``passed``."""

    lr: float
    slope: float
    sharpness: float
    predicted: float
    actual: float
    passed: bool

    def __str__(self) -> str:
        verdict = "stable" if self.passed else "UNSTABLE"
        return (f"next step (lr {self.lr:.3g}): {verdict}, lr·dᵀHd/gᵀd = {self.sharpness:.3g}, decrease "
                f"{self.actual:.3g} of a predicted {self.predicted:.3g}")


@dataclass(frozen=True)
class NextStep:
    """The descent step that follows a teleport, ``θ ↦ θ − lr·d`` with ``d = P ∇L`` (``metric`` ``P`` as in
    :class:`MetricGradNorm`; ``None``: ``P = 1``, gradient descent), and the test that it is stable at a point.

    With ``g = ∇L(θ)`` and ``H`` the Hessian, the second-order model of the step is
    ``L(θ − lr·d) ≈ L(θ) − lr·gᵀd + (lr²/2)·dᵀHd``: it predicts a decrease only while ``lr·dᵀHd < 2·gᵀd`` (the
    stability limit; for ``d = g`` that is ``lr·κ < 2``, ``κ`` the curvature along the gradient), and the prediction
    holds only while the step is short enough for the third-order term: with ``M`` a Lipschitz constant of ``H``
    along the step, descent needs ``‖g‖ ≤ 3(2 − lr·κ)/(M·lr²)`` (``d = g``): the admissible gradient norm falls with
    the curvature and with ``M``. Teleporting to a large ``‖∇L‖`` on a non-compact orbit raises ``κ`` and ``M`` with
    it (``H' = J⁻ᵀHJ⁻¹``), which is how a teleport can make the next step diverge. :meth:`test` checks both at the
    point itself, without estimating ``M``:

    * **curvature**: ``lr·dᵀHd ≤ curvature·gᵀd`` (default 1, half the stability limit: the model then predicts at
      least half the first-order decrease), from one Hessian–vector product;
    * **agreement**: the loss decreases over the step by at least ``agreement`` (default ½) of the predicted amount
      (the trust-region ratio test: the model that promised the decrease holds over the step's length), from one
      more loss evaluation.

    >>> step = NextStep(lr=0.1)
    >>> quadratic = lambda p: 0.5 * (p["x"] ** 2 * torch.tensor([1.0, 30.0])).sum()   # curvatures 1 and 30
    >>> step.test({"x": torch.tensor([1.0, 0.0])}, quadratic, ["x"]).passed     # lr·κ = 0.1
    True
    >>> step.test({"x": torch.tensor([0.0, 1.0])}, quadratic, ["x"]).passed     # lr·κ = 3: the step overshoots
    False
    """

    lr: float
    metric: Metric | None = None
    curvature: float = 1.0
    agreement: float = 0.5

    def __post_init__(self) -> None:
        for name in ("lr", "curvature"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and 0 < float(value) < math.inf):
                raise ValueError(f"NextStep: {name} must be a finite positive number, got {value!r}")
        if not (isinstance(self.agreement, numbers.Real) and 0 <= float(self.agreement) <= 1):
            raise ValueError(f"NextStep: agreement must be in [0, 1], got {self.agreement!r}")

    def test(self, params: Params, loss: ParamLoss, wrt: Sequence[str]) -> StepTest:
        """:class:`StepTest` of the step at ``params`` (the entries ``wrt`` move)."""
        leaves = {n: params[n].detach().requires_grad_(True) for n in wrt}
        with torch.enable_grad():
            value = loss({**params, **leaves})
            found = torch.autograd.grad(value, list(leaves.values()), create_graph=True, allow_unused=True)
            grads = {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(wrt, found)}
            metric = (self.metric({n: g.detach() for n, g in grads.items()}) if callable(self.metric)
                      else self.metric or {})
            d = {n: (metric.get(n, 1.0) * g).detach() for n, g in grads.items()}
            slope = cast(torch.Tensor, sum((g * d[n]).sum() for n, g in grads.items()))
            hd = torch.autograd.grad(slope, list(leaves.values()), allow_unused=True) if slope.requires_grad else ()
        curvature = sum(float((h * d[n]).sum()) for n, h in zip(wrt, hd) if h is not None)
        slope_value = float(slope.detach())
        with torch.no_grad():
            stepped = float(loss({**params, **{n: params[n].detach() - self.lr * d[n] for n in wrt}}))
        predicted = self.lr * slope_value - self.lr ** 2 / 2 * curvature
        actual = float(value.detach()) - stepped
        sharpness = self.lr * curvature / slope_value if slope_value > 0 else 0.0
        passed = math.isfinite(actual) and self.lr * curvature <= self.curvature * slope_value and \
            actual >= self.agreement * predicted
        return StepTest(self.lr, slope_value, sharpness, predicted, actual, passed)


# ------------------------------------------------------------------------------------------------ teleport

ARMIJO = 1e-4
"""Sufficient-increase constant of the line search: a step ``Δ = ±s ∇_c F`` passes when it improves the objective by at
least ``ARMIJO · ‖Δ‖ ‖∇_c F‖`` (the Armijo condition; ``‖Δ‖ ‖∇_c F‖`` is the first-order gain)."""

BACKTRACK = 30
"""Halvings of the line search when ``Teleporter.backtrack`` is not given and the step is normalised (``lr=None``)."""


class _Iterate(NamedTuple):
    """An iterate of the ascent: its index in the history, its parameters, how many of the moves lead to it, its
    coordinates (``compose=False``) and the gradient steps taken."""

    position: int
    params: dict[str, torch.Tensor]
    moves: int
    total: torch.Tensor
    steps: int


@dataclass(frozen=True)
class TeleportResult:
    """What a teleport did.

    ``params``: the best iterate of the ascent (the best objective among the iterates that kept the loss within the
    tolerance), or the original parameters (the same tensors) when that is the start or improved the objective by less
    than ``min_gain`` (``accepted=False``, ``reason`` says why). ``moves``: the group element taking the input to
    ``params`` as factors (:class:`Move`); ``coordinates`` their Lie-algebra parts. ``objective_after`` and
    ``loss_after`` are at ``params``. ``history`` and ``losses``: the objective and the loss at every iterate (index 0
    the start, then the discrete search's result if it moved, then one per gradient step); ``best``: the index of
    ``params`` in them; ``steps``: the gradient steps taken; ``seconds``: the wall-clock time; ``next_step``: the
    :class:`StepTest` of the teleporter's :class:`NextStep` at the chosen iterate, or at the best iterate when none
    passed and the teleport was rejected (``None`` without a ``NextStep``, or when no iterate improved).
    """

    params: dict[str, torch.Tensor]
    accepted: bool
    reason: str
    moves: tuple[Move, ...]
    objective_before: float
    objective_after: float
    loss_before: float
    loss_after: float
    steps: int
    seconds: float
    history: tuple[float, ...] = ()
    losses: tuple[float, ...] = ()
    best: int = 0
    next_step: StepTest | None = None

    @property
    def relative_loss_change(self) -> float:
        return abs(self.loss_after - self.loss_before) / max(abs(self.loss_before), 1e-300)

    @property
    def coordinates(self) -> tuple[torch.Tensor, ...]:
        return tuple(m.coords for m in self.moves if m.coords is not None)

    def __str__(self) -> str:
        verdict = "accepted" if self.accepted else f"rejected ({self.reason})"
        return (f"teleport {verdict}: objective {self.objective_before:.6g} → {self.objective_after:.6g}, loss "
                f"{self.loss_before:.6g} → {self.loss_after:.6g} (relative change {self.relative_loss_change:.1e}), "
                f"{self.steps} steps, {len(self.moves)} moves, {self.seconds * 1e3:.1f} ms")


@dataclass(frozen=True)
class Teleporter:
    """Settings of a teleport (see :func:`teleport`); ``teleporter(params, loss, wrt=None)`` runs one.

    Every step moves along the objective's gradient in the coordinates, ``Δ = ±s ∇_c F``; each group element keeps
    the loss, so only the step length ``s`` is chosen:

    * ``lr=None`` (default), scale-free: the normalised step ``s = max_step / ‖∇_c F‖`` (``‖Δ‖ = max_step``) under
      the line search. Multiplying the objective by any constant leaves every iterate unchanged.
    * ``lr`` a number: ``s = lr`` (with ``‖Δ‖`` clipped to ``max_step``), [Zhao2026]'s fixed rate, every step
      taken unless ``backtrack`` asks for the line search.

    The line search halves ``Δ``, up to ``backtrack`` times, until the objective improves by at least
    ``ARMIJO · ‖Δ‖ ‖∇_c F‖`` (Armijo), the loss stays within ``tolerance`` and everything is finite; the next step
    starts from twice the last scale (at most the full step); when no halving passes, the ascent has converged and
    stops. The result is the best iterate that kept the loss (never worse than the start), accepted when it improved
    the objective by at least ``min_gain · |F(θ)|``.

    Parameters
    ----------
    action : an :class:`Action` (or anything :func:`as_action` takes without data).
    objective : an :class:`Objective`, or a callable ``params → scalar``.
    steps : the most gradient steps on the coordinates.
    lr : ``None``: the normalised step; a number ``≥ 0``: the fixed rate ``Δ = ±lr ∇_c F``.
    maximize : direction; ``None`` takes the objective's default (``True`` for a plain callable).
    compose : ``g ← exp(Δ) g`` at every step (``True``) or one element ``exp(Σ cᵢ Bᵢ)`` with ``c ← c + Δ``.
    max_step : the trust radius ``‖Δ‖ ≤ max_step`` (each factor ``exp(Δ)`` then has condition number at most
        ``e^{2 max_step}``), and the length of the normalised step. ``None`` (only with a number ``lr``): no clipping.
        Gradient-norm objectives are unbounded on non-compact orbits (``GL``, scalings): without a bound, fixed-rate
        steps grow with the objective and the parameters explode.
    backtrack : halvings of the line search; ``None``: ``BACKTRACK`` (30) with ``lr=None``, 0 with a number ``lr``.
    tolerance : largest relative loss change of an iterate (default :data:`TOLERANCES` by dtype).
    min_gain : least relative improvement ``±(F(g·θ) − F(θ)) / |F(θ)|`` of an accepted teleport; 0 accepts any.
    discrete : ``None``, ``"greedy"`` (repeatedly take the best discrete generator or inverse while it improves)
        or ``"random"`` (best of random words in the generators), tried before the gradient steps.
    discrete_steps : rounds of the greedy search, or random words of up to this length.
    samples, seed : number of random words and their seed.
    radius : the trust region of the whole teleport: the steps' lengths add up to at most ``radius``
        (``Σ‖Δ_k‖ ≤ radius``; the last step is shortened to fit, and the ascent stops there). On a coordinate basis
        orthonormal in the Frobenius norm (``GL``'s, scalings') each site's composed ``g_s`` then has
        ``‖g_s‖, ‖g_s⁻¹‖ ≤ e^{radius}``; a linear action moves a weight between two sites by ``W ↦ g W g'⁻¹`` and its
        gradient by ``g⁻ᵀ ∇W g'ᵀ``, so ``‖∇L‖`` changes by at most a factor ``e^{2·radius}``. ``None``: no bound.
    next_step : a :class:`NextStep`: the result is the best improving iterate at which that descent step is stable
        (:meth:`NextStep.test`); when none is, the teleport is rejected. ``None``: not checked.
        :class:`~symalg.applications.teleport_optim.TeleportingOptimizer` sets both for teleports during training.
    progress : ``progress(step, steps, "teleport")`` after each accepted gradient step (:mod:`symalg.progress`).

    Examples
    --------
    On the level set ``ℓ = 1.09`` of ``f = 9x₁² + x₂²`` the gradient norm ``‖∇f‖² = 4‖Ax‖²`` ranges over
    ``[4ℓ, 36ℓ]``; the default settings reach the maximum whatever the scale of ``f``:

    >>> from symalg.applications.conjugated import quadratic_form
    >>> fn = quadratic_form([[9, 0], [0, 1]])
    >>> x0 = torch.tensor([0.1, 1.0], dtype=torch.float64)
    >>> [round(Teleporter(fn)({"x": x0}, lambda p: k * fn.loss(p["x"])).objective_after / (36 * 1.09 * k * k), 6)
    ...  for k in (1e3, 1.0, 1e-6)]
    [1.0, 1.0, 1.0]
    """

    action: Action
    objective: Objective | Callable[[Params], torch.Tensor] = GradNorm()
    steps: int = 10
    lr: float | None = None
    maximize: bool | None = None
    compose: bool = True
    max_step: float | None = 1.0
    backtrack: int | None = None
    tolerance: float | None = None
    min_gain: float = 1e-6
    discrete: str | None = None
    discrete_steps: int = 4
    samples: int = 16
    seed: int = 0
    radius: float | None = None
    next_step: NextStep | None = None
    progress: Progress | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", as_action(self.action))
        if self.discrete not in (None, "greedy", "random"):
            raise ValueError(f"Teleporter: discrete must be None, 'greedy' or 'random', got {self.discrete!r}")
        if not (isinstance(self.steps, numbers.Integral) and self.steps >= 0):
            raise ValueError(f"Teleporter: steps must be a non-negative integer, got {self.steps!r}")
        if self.lr is not None and not (isinstance(self.lr, numbers.Real) and 0 <= self.lr < math.inf):
            raise ValueError(f"Teleporter: lr must be None (the normalised step) or a finite number ≥ 0, "
                             f"got {self.lr!r}")
        if self.max_step is not None and not (isinstance(self.max_step, numbers.Real) and 0 < self.max_step < math.inf):
            raise ValueError(f"Teleporter: max_step must be a finite positive number or None, got {self.max_step!r}")
        if self.radius is not None and not (isinstance(self.radius, numbers.Real) and 0 < self.radius < math.inf):
            raise ValueError(f"Teleporter: radius must be a finite positive number or None, got {self.radius!r}")
        if self.next_step is not None and not isinstance(self.next_step, NextStep):
            raise TypeError(f"Teleporter: next_step must be a NextStep or None, got {type(self.next_step).__name__}")
        if self.lr is None and self.max_step is None:
            raise ValueError("Teleporter: lr=None takes the step length from max_step; "
                             "give max_step > 0 or a number lr")
        if self.backtrack is not None and not (isinstance(self.backtrack, numbers.Integral) and self.backtrack >= 0):
            raise ValueError(f"Teleporter: backtrack must be a non-negative integer or None, got {self.backtrack!r}")
        if not (isinstance(self.min_gain, numbers.Real) and 0 <= self.min_gain < math.inf):
            raise ValueError(f"Teleporter: min_gain must be a finite number ≥ 0, got {self.min_gain!r}")
        if self.discrete and not self.action.discrete_generators():
            raise ValueError(f"Teleporter: discrete={self.discrete!r} but the action has no discrete generators")
        if self.steps and self.action.dim == 0 and not self.discrete:
            raise ValueError("Teleporter: the action has no continuous part (dim 0); use discrete='greedy' or 'random'")

    @property
    def sign(self) -> float:
        maximize = self.maximize if self.maximize is not None else getattr(self.objective, "maximize", True)
        return 1.0 if maximize else -1.0

    @property
    def halvings(self) -> int:
        """Halvings of the line search (``backtrack``, or its default for the step rule)."""
        if self.backtrack is not None:
            return self.backtrack
        return BACKTRACK if self.lr is None else 0

    def evaluate(self, params: Params, loss: ParamLoss, wrt: Sequence[str]) -> torch.Tensor:
        """The objective at ``params``."""
        if isinstance(self.objective, Objective):
            return self.objective(params, loss, self.action, wrt)
        return self.objective(params)

    @differentiable_kernels()  # the objective's gradient differentiates the model twice
    def __call__(self, params: Params, loss: Callable[[Params], torch.Tensor],
                 wrt: Sequence[str] | None = None) -> TeleportResult:
        start = time.perf_counter()
        theta0 = {n: p.detach() for n, p in params.items()}
        if wrt is None:
            trainable = [n for n, p in params.items() if isinstance(p, torch.nn.Parameter)]
            wrt = trainable or [n for n, p in theta0.items() if p.is_floating_point()]
        wrt = tuple(wrt)
        unknown = [n for n in wrt if n not in theta0]
        if unknown or not wrt:
            raise ValueError(f"teleport: wrt names {unknown or '(none)'} are not in params")
        like = theta0[wrt[0]]
        tolerance = self.tolerance if self.tolerance is not None else TOLERANCES.get(like.dtype, 1e-4)
        with torch.no_grad():
            loss0 = float(loss(theta0))

        seen: list[tuple[Params, torch.Tensor]] = []    # the losses the last evaluation of the objective computed

        def recording(p: Params) -> torch.Tensor:
            out = loss(p)
            seen.append((p, out))
            return out

        def value(p: Params) -> float:
            seen.clear()
            with torch.enable_grad():
                return float(self.evaluate(p, recording, wrt).detach())

        def loss_at(p: Params) -> float:
            """The loss at ``p`` (NaN where a parameter is not finite: a sum of the entries is then NaN or ±∞)."""
            if not math.isfinite(float(sum(p[n].sum() for n in wrt))):
                return math.nan
            with torch.no_grad():
                return float(loss(p))

        def loss_seen(p: Params) -> float:
            """The loss at ``p``: the value the last evaluation of the objective computed at parameters equal to ``p``
            entry for entry (an objective evaluates the loss where it is evaluated), else :func:`loss_at`."""
            for q, out in seen:
                if all(n in q and torch.equal(q[n].detach(), p[n]) for n in wrt):
                    return float(out.detach())
            return loss_at(p)

        def change(lp: float) -> float:
            """The relative loss change of the loss value ``lp`` (``inf`` when not finite)."""
            relative = abs(lp - loss0) / max(abs(loss0), 1e-300)
            return relative if math.isfinite(relative) else math.inf

        def kept(lp: float) -> bool:
            return change(lp) <= tolerance

        theta, steps = theta0, 0
        moves: list[Move] = []
        base, total = theta0, torch.zeros(self.action.dim, dtype=like.dtype, device=like.device)
        history: list[float | None] = [None]   # None: filled by the next evaluation
        losses = [loss0]
        if self.discrete:
            history[0] = start_value = value(theta0)
            theta, found, searched = self._search(theta, value, lambda p: kept(loss_at(p)), start_value)
            if found:
                moves, history, losses = found, history + [searched], losses + [loss_at(theta)]
            base = theta
        improvements = [_Iterate(0, theta0, 0, total, 0)]    # the start, then every iterate that became the best

        def consider() -> None:
            """Make the current iterate the best when it kept the loss and has a better, finite objective."""
            k = len(history) - 1
            here, record = history[k], history[improvements[-1].position]
            if k and here is not None and record is not None and kept(losses[k]) and math.isfinite(here) \
                    and self.sign * (here - record) > 0:
                improvements.append(_Iterate(k, theta, len(moves), total, steps))

        def assess(point: Params, coords: torch.Tensor) -> tuple[float, torch.Tensor | None]:
            """The objective at an iterate and its gradient in the coordinates of the next factor."""
            z = torch.zeros_like(total, requires_grad=True)
            seen.clear()
            with torch.enable_grad():
                moved = self.action.first_order(point, z) if self.compose else self.action(base, coords + z)
                objective = self.evaluate(moved, recording, wrt)
                (grad,) = torch.autograd.grad(objective, z, allow_unused=True)
            return float(objective.detach()), grad

        consider()
        scale, note, travelled = 1.0, "", 0.0
        known: tuple[float, torch.Tensor | None] | None = None     # (objective, gradient) at theta, when computed
        for _ in range(self.steps if self.action.dim else 0):
            here, grad = known if known is not None else assess(theta, total)
            known = None
            if history[-1] is None:
                history[-1] = here
                losses[-1] = loss_seen(theta) if math.isnan(losses[-1]) else losses[-1]
                consider()
            if grad is None:
                break
            if not torch.isfinite(grad).all():
                note = f"stopped after {steps} steps: the objective's gradient in the coordinates is not finite"
                break
            slope = float(grad.norm())
            if slope == 0:
                break
            delta = self.sign * self._rate(slope) * scale * grad
            length = float(delta.norm())
            bound = min(self.max_step if self.max_step is not None else math.inf,
                        self.radius - travelled if self.radius is not None else math.inf)
            if length > bound:
                delta, length = delta * (bound / length), bound
            if length <= 0:
                if self.radius is not None and travelled >= self.radius:
                    note = f"stopped after {steps} steps: the trust region (radius {self.radius:g}) is reached"
                break
            current: float | None = None
            (candidate, failure), lp = self._advance(base, theta, total, delta), math.nan
            if self.halvings:
                for _ in range(self.halvings):
                    if candidate is not None:
                        lp = loss_at(candidate)
                        current, ascent = assess(candidate, total + delta) if kept(lp) else (None, None)
                        if current is not None and self.sign * (current - here) >= ARMIJO * length * slope:
                            known = (current, ascent)
                            break
                    delta, length, scale = delta / 2, length / 2, scale / 2
                    candidate, failure = self._advance(base, theta, total, delta)
                else:
                    note = f"converged after {steps} steps: no step along the gradient passes the line search"
                    break
                scale = min(1.0, 2 * scale)
            elif candidate is None:
                note = f"stopped after {steps} steps: the action is undefined at the next step ({failure})"
                break          # a fixed rate: the loss comes with the next evaluation of the objective (loss_seen)
            assert candidate is not None, "the line search breaks out with a candidate"
            theta, steps, travelled = candidate, steps + 1, travelled + length
            if self.compose:
                moves.append(Move(coords=delta.detach()))
            else:
                total = total + delta.detach()
            history.append(current)
            losses.append(lp)
            report(self.progress, steps, self.steps, "teleport")
            if current is not None:
                consider()
        if history[-1] is None:
            history[-1] = value(theta)
            losses[-1] = loss_seen(theta) if math.isnan(losses[-1]) else losses[-1]
            consider()
        best, stability = improvements[-1], None
        if self.next_step is not None and best.position:
            best, stability, note = self._stable(improvements, moves, theta0, loss, wrt, note)
        index, theta, count, total, taken = best
        moves = moves[:count] + ([Move(coords=total)] if not self.compose and taken else [])
        scores = [math.nan if h is None else h for h in history]   # every entry is evaluated by now
        accepted, reason = self._verdict(scores, index, max(map(change, losses[1:]), default=0.0), tolerance, note)
        if not accepted:
            index, theta, moves = 0, theta0, []
        moved = {n: params[n] if theta[n] is theta0[n] else theta[n] for n in params}
        return TeleportResult(moved if accepted else dict(params), accepted, reason, tuple(moves), scores[0],
                              scores[index], loss0, losses[index], steps, time.perf_counter() - start,
                              tuple(scores), tuple(losses), index, stability)

    def _stable(self, improvements: Sequence[_Iterate], moves: Sequence[Move], theta0: Params, loss: ParamLoss,
                wrt: Sequence[str], note: str) -> tuple[_Iterate, StepTest | None, str]:
        """The best iterate at which :attr:`next_step` is stable (``(start, None, why)`` when none is), its test, and
        the note: the improving iterates are tried from the best down (earlier ones are replayed from ``theta0``)."""
        assert self.next_step is not None, "called only with a next step"
        first: StepTest | None = None
        for rank, iterate in enumerate(reversed(improvements[1:])):
            point = iterate.params if rank == 0 else self.action.replay(
                theta0, list(moves[:iterate.moves]) + ([Move(coords=iterate.total)] if not self.compose else []))
            test = self.next_step.test(point, loss, wrt)
            first = first or test
            if test.passed:
                return iterate, test, note if rank == 0 else (
                    f"{rank} better iterate(s) failed the next-step check ({first})" + (f"; {note}" if note else ""))
        return improvements[0], first, f"no improving iterate passed the next-step check ({first})"

    def _rate(self, slope: float) -> float:
        """``s``: the fixed rate ``lr``, or the normalised ``max_step / ‖∇_c F‖``."""
        if self.lr is not None:
            return self.lr
        assert self.max_step is not None, "__post_init__ refuses lr=None without max_step"
        return self.max_step / slope

    def _verdict(self, history: Sequence[float], index: int, worst: float, tolerance: float,
                 note: str) -> tuple[bool, str]:
        """``(accepted, reason)`` for the best iterate ``history[index]``: accepted when it improved the objective by at
        least ``min_gain`` relative to the start; ``worst`` is the largest relative loss change of any iterate."""
        gain = self.sign * (history[index] - history[0])
        if index and gain >= self.min_gain * abs(history[0]):
            return True, note
        if index:
            return False, (f"the objective improved by {gain / abs(history[0]):.1e} (relative) < min_gain "
                           f"{self.min_gain:.1e}")
        if worst > tolerance:
            return False, (f"no iterate improved the objective and kept the loss: relative loss change up to "
                           f"{worst:.2e} > tolerance {tolerance:.1e}")
        return False, "the objective did not improve" + (f" ({note})" if note else "")

    def _advance(self, base: Params, theta: Params, total: torch.Tensor, delta: torch.Tensor
                 ) -> tuple[dict[str, torch.Tensor] | None, str]:
        """``(next iterate, "")``, or ``(None, why)`` where the action is undefined (singular frames, points off the
        image of a conjugating map)."""
        try:
            with torch.no_grad():
                return (self.action(theta, delta) if self.compose else self.action(base, total + delta)), ""
        except (ValueError, torch.linalg.LinAlgError) as error:
            return None, str(error).splitlines()[0]

    def _search(self, theta: dict[str, torch.Tensor], value: Callable[[Params], float],
                admissible: Callable[[Params], bool], current: float
                ) -> tuple[dict[str, torch.Tensor], list[Move], float]:
        """Discrete search over the generators (and inverses); returns ``(θ, moves, objective)``."""
        count = len(self.action.discrete_generators())
        options = [Move(generator=i, inverse=inv) for i in range(count) for inv in (False, True)]

        def score(v: float) -> float:
            return self.sign * v

        moves: list[Move] = []
        if self.discrete == "greedy":
            for _ in range(self.discrete_steps):
                best: tuple[float, Move, dict[str, torch.Tensor]] | None = None
                for move in options:
                    with torch.no_grad():
                        candidate = self.action.replay(theta, [move])
                    if not admissible(candidate):
                        continue
                    v = value(candidate)
                    if score(v) > score(current) and (best is None or score(v) > score(best[0])):
                        best = (v, move, candidate)
                if best is None:
                    break
                current, move, theta = best[0], best[1], best[2]
                moves.append(move)
            return theta, moves, current
        generator = torch.Generator().manual_seed(self.seed)
        found: tuple[float, list[Move], dict[str, torch.Tensor]] = (current, [], theta)
        for _ in range(self.samples):
            length = int(torch.randint(1, self.discrete_steps + 1, (1,), generator=generator))
            word = [options[int(i)] for i in torch.randint(len(options), (length,), generator=generator)]
            with torch.no_grad():
                candidate = self.action.replay(theta, word)
            if admissible(candidate):
                v = value(candidate)
                if score(v) > score(found[0]):
                    found = (v, word, candidate)
        return found[2], list(found[1]), found[0]


def teleport(action: Any, params: Params, loss: ParamLoss,
             objective: Objective | Callable[[Params], torch.Tensor] = GradNorm(), *, wrt: Sequence[str] | None = None,
             **settings: Any) -> TeleportResult:
    """Teleport ``params`` along ``action`` to optimise ``objective`` at the loss ``loss(params)`` (one batch).

    ``wrt``: the entries that are trainable parameters (gradients, directions and curves are taken over them;
    default: the ``nn.Parameter`` entries, or every floating-point entry when there are none). ``settings``: see
    :class:`Teleporter`. Returns a :class:`TeleportResult`; the input is not modified.
    """
    return Teleporter(as_action(action), objective, **settings)(params, loss, wrt)


def transform_cotangent(action: Action, moves: Sequence[Move], params_after: Params,
                        vectors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``J⁻ᵀ v`` for the Jacobian ``J = ∂(g·θ)/∂θ`` of the teleport ``g`` (``moves``), at ``θ' = g·θ = params_after``.

    This is how gradients move (``∇L(g·θ) = J⁻ᵀ ∇L(θ)`` for an invariant ``L``), and hence gradient-like state such
    as momentum. Computed as the vector–Jacobian product of ``θ' ↦ g⁻¹·θ'`` (``J⁻¹`` by the inverse function
    theorem), exact for group actions (``action.is_group_action``); otherwise ``g⁻¹`` is the inverse moves'
    action, an approximation. ``vectors``: ``{name: v}`` over some entries of ``params_after``.
    """
    leaves = {n: params_after[n].detach().requires_grad_(True) for n in vectors}
    with torch.enable_grad():
        back = action.undo({**params_after, **leaves}, moves)
        grads = torch.autograd.grad([back[n] for n in vectors], list(leaves.values()),
                                    grad_outputs=[vectors[n] for n in vectors], allow_unused=True)
    return {n: (torch.zeros_like(vectors[n]) if g is None else g.detach()) for n, g in zip(vectors, grads)}
