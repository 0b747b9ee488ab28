r"""Noether's theorem for learning dynamics: what each training dynamics conserves, what it only restricts, and how
fast a quantity decays, derived from the symmetries of any :class:`~symalg.Analysis` (both front ends).

**Continuous dynamics** ``κ₂(t) θ̈ + κ₁(t) θ̇ + ∇L(θ) = 0`` (:class:`Dynamics`): gradient flow (``κ₂ = 0, κ₁ = 1``),
Newtonian (``κ₂ = 1, κ₁ = 0``), heavy ball (``κ₂ = 1, κ₁ = γ``), Nesterov's flow (``κ₂ = 1, κ₁ = 3/t``, from
``t₀ > 0``: the friction is infinite at ``t = 0``) and any user ``κ₁(t), κ₂(t)`` (SymPy expressions in :data:`t`).

For a symmetry acting linearly, ``θ ↦ exp(εM)·θ``, invariance gives ``⟨∇L(θ), M·θ⟩ = 0`` for every ``M`` of the Lie
algebra. Collect the pairings in the *momentum map* ``Γ(θ, v)``, the matrix (vector for diagonal groups) with
``⟨Γ(θ, v), M⟩ = ⟨v, M·θ⟩`` (:func:`momentum_map`; for ``GL`` it is ``Σ_out V Uᵀ − Σ_in Uᵀ V``, the balance matrix
``C`` of the conserved quantities being ``Γ(θ, θ)``). The action of ``Mᵀ`` is the adjoint of that of ``M``, so
``Γ(u, w) = Γ(w, u)ᵀ``. Then along the dynamics, with ``p = Γ(θ, θ̇)``,

* **symmetric part**: ``d/dt Γ(θ, θ) = 2 sym p`` and ``κ₂ (sym ṗ − Γ(θ̇, θ̇)) + κ₁ sym p = 0``. Gradient flow
  (``κ₂ = 0``) conserves ``C = Γ(θ, θ)`` (symalg's ``Q_M = tr(M C)``); any ``κ₂ ≠ 0`` only *restricts* it: the
  paper's ``⟨θ, M·(κ₂θ̈ + κ₁θ̇)⟩ = 0``, i.e. ``sym Γ(θ, κ₂θ̈ + κ₁θ̇) = 0``;
* **antisymmetric part** (``GL``, ``O``, the plane rotations of complex scaling): ``Γ(θ̇, θ̇)`` has none, so
  ``J = anti p`` obeys ``κ₂ J̇ + κ₁ J = 0``: ``J(t) = φ(t) J(t₀)`` with ``φ = exp(−∫_{t₀}^t κ₁/κ₂)``: conserved for
  Newtonian dynamics, ``e^{−γ(t−t₀)}`` for heavy ball, ``(t₀/t)³`` for Nesterov's flow; gradient flow only
  restricts it (``J(θ, −∇L) = 0``: ``Γ(θ, θ̇)`` is symmetric);
* **translations** (directions ``B_i`` independent of θ): ``ℓ = ⟨B, θ⟩`` has ``κ₂ ℓ̈ + κ₁ ℓ̇ = 0``: conserved by
  gradient flow; otherwise the momentum ``ℓ̇`` decays as ``φ`` and ``ℓ(t) = ℓ(t₀) + ℓ̇(t₀) ∫_{t₀}^t φ``;
* **energy** ``E = ½κ₂‖θ̇‖² + L``: ``Ė = −(κ₁ − ½κ̇₂)‖θ̇‖²`` (gradient flow: ``L̇ = −‖∇L‖²/κ₁``).

Shears (directions depending on θ), affine actions (a shift ``τ(g)``) and actions moving buffers give only the
restriction ``⟨κ₂θ̈ + κ₁θ̇, ξ(θ)⟩ = 0`` and are listed as such.

**Discrete schemes** (:class:`Scheme`): every step is ``θ' = aθ − η d``, so ``Γ(θ', θ') = a²Γ(θ,θ) −
aη(Γ(θ,d) + Γ(θ,d)ᵀ) + η²Γ(d, d)`` exactly, and the symmetry fixes ``Γ(θ, ∇L(θ)) = 0``. Each scheme's exact one-step
identity (:func:`run_scheme`, see :class:`Scheme`) follows; e.g. torch's heavy-ball momentum keeps
``P = Γ(θ, buf)`` with ``anti P' = μ anti P`` exactly (``μ^k`` decay), the paper's discrete Newtonian scheme keeps
``anti Γ(θ_{k+1}, θ_k)`` exactly, and Adam's update ``u`` has ``Γ(θ, u) ≠ 0``: its per-coordinate preconditioner
does not commute with the action, which is what Adam breaks.

>>> import symalg
>>> from symalg.applications import noether
>>> analysis = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)")
>>> [(law.part, law.status) for law in noether.laws(analysis, noether.heavy_ball(2)).laws]
[('symmetric', 'restriction'), ('antisymmetric', 'exponential decay'), ('other', 'restriction')]
>>> noether.nesterov_flow().factor
t_0**3/t**3
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterator, Mapping, Sequence

import sympy as sp
import torch

from symalg.errors import SpecError
from symalg.symbolic.derive import Analysis
from symalg.symbolic.printing import escape_latex
from symalg.symbolic.symmetry import Symmetry
from symalg.verification.checks import TOLERANCES, CheckResult, loss_gradients, rk4

__all__ = ["t", "t_0", "Dynamics", "gradient_flow", "newtonian", "heavy_ball", "nesterov_flow", "dynamics", "Law",
           "NoetherLaws", "laws", "momentum_map", "charged", "Trajectory", "integrate", "Scheme", "gd", "momentum",
           "paper_newtonian", "paper_nesterov", "adam", "run_scheme", "check_dynamics", "check_scheme",
           "InputRotation"]

Params = Mapping[str, torch.Tensor]
Loss = Callable[[Params], torch.Tensor]

t = sp.Symbol("t", positive=True)
"""The time of the dynamics: ``κ₁``, ``κ₂`` are SymPy expressions in it."""
t_0 = sp.Symbol("t_0", positive=True)
"""The start time (a symbol in the laws; :attr:`Dynamics.start` is its value)."""


# ---------------------------------------------------------------------------------------------
# dynamics
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dynamics:
    """``κ₂(t) θ̈ + κ₁(t) θ̇ + ∇L = 0`` from ``t = start``; ``kappa1``, ``kappa2`` SymPy expressions in :data:`t`.

    ``factor`` is ``φ(t) = exp(−∫_{t₀}^t κ₁/κ₂)`` (the decay of every antisymmetric charge and translation momentum);
    ``kind`` says which law it is.

    >>> heavy_ball(0.5).factor
    exp(-0.5*t + 0.5*t_0)
    >>> dynamics(kappa1=2 / t, kappa2=1, start=1).kind
    'power law decay'
    """

    name: str
    kappa1: sp.Expr
    kappa2: sp.Expr
    start: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        for label, value in (("kappa1", self.kappa1), ("kappa2", self.kappa2)):
            if not isinstance(value, sp.Expr) or value.free_symbols - {t}:
                raise SpecError(f"noether.dynamics: {label} must be a SymPy expression in noether.t (or a number), "
                                f"got {value!r}")
        if self.first_order and self.kappa1 == 0:
            raise SpecError("noether.dynamics: kappa1 and kappa2 are both zero: no dynamics")
        if not math.isfinite(self.start) or self.start < 0:
            raise SpecError(f"noether.dynamics: start must be a finite non-negative time, got {self.start!r}")
        if isinstance(self.weight_decay, bool) or not isinstance(self.weight_decay, (int, float)) or \
                not 0 <= self.weight_decay < math.inf:
            raise SpecError(f"noether.dynamics: weight_decay must be a finite number ≥ 0, got {self.weight_decay!r}")
        if self.weight_decay and not self.first_order:
            raise SpecError("noether.dynamics: weight_decay is implemented for first-order dynamics (gradient flow) "
                            "only; for momentum dynamics use the discrete noether.Scheme(weight_decay=...)")
        for label, value in (("kappa1", self.kappa1), ("kappa2", self.kappa2)):
            at_start = value.subs(t, self.start) if value.has(t) else value
            if not at_start.is_finite:
                raise SpecError(f"noether.dynamics: {label} = {value} is not finite at the start time "
                                f"{self.start}; start later (e.g. Nesterov's flow from t_0 = 1)")

    @property
    def first_order(self) -> bool:
        """``κ₂ ≡ 0``: gradient flow (in the time ``∫ 1/κ₁``)."""
        return bool(self.kappa2 == 0)

    @cached_property
    def factor(self) -> sp.Expr:
        """``φ(t) = exp(−∫_{t₀}^t κ₁(τ)/κ₂(τ) dτ)`` (``0`` for gradient flow: no momentum)."""
        if self.first_order:
            return sp.Integer(0)
        tau = sp.Dummy("tau", positive=True)
        rate = sp.simplify((self.kappa1 / self.kappa2).subs(t, tau))
        return sp.simplify(sp.exp(-sp.integrate(rate, (tau, t_0, t))))

    @cached_property
    def kind(self) -> str:
        """``'conserved'`` (``φ ≡ 1``), ``'exponential decay'``, ``'power law decay'`` (``φ = (t₀/t)^c``),
        ``'decay law'`` (another ``φ``) or ``'none'`` (gradient flow)."""
        if self.first_order:
            return "none"
        phi = self.factor
        if phi == 1:
            return "conserved"
        rate = sp.simplify(self.kappa1 / self.kappa2)
        if not rate.has(t):
            return "exponential decay"
        exponent = sp.simplify(t * sp.diff(phi, t) / phi)
        return "power law decay" if not exponent.has(t) else "decay law"

    @cached_property
    def displacement(self) -> sp.Expr:
        """``∫_{t₀}^t φ``: how far a translation moves per unit of initial momentum."""
        s = sp.Symbol("s", positive=True)
        return sp.simplify(sp.integrate(self.factor.subs(t, s), (s, t_0, t)))

    def kappa(self) -> tuple[Callable[[float], float], Callable[[float], float], Callable[[float], float]]:
        """``(κ₁, κ₂, κ̇₂)`` as Python functions of the time (SymPy's printer on the expressions, never a user
        string)."""
        return tuple(sp.lambdify(t, e, modules="math") for e in
                     (self.kappa1, self.kappa2, sp.diff(self.kappa2, t)))

    @cached_property
    def decay(self) -> sp.Expr:
        """Gradient flow with weight decay ``λ``: ``exp(−λ∫_{t₀}^t 1/κ₁)``, the factor of every translation; the
        balance matrices ``C = Γ(θ, θ)`` decay by its square (``1`` without decay or for second-order dynamics)."""
        if not self.first_order or not self.weight_decay:
            return sp.Integer(1)
        tau = sp.Dummy("tau", positive=True)
        rate = sp.simplify((1 / self.kappa1).subs(t, tau))
        return sp.simplify(sp.exp(-sp.nsimplify(self.weight_decay) * sp.integrate(rate, (tau, t_0, t))))

    def decay_at(self, time: float) -> float:
        """:attr:`decay` at ``time`` from the actual start."""
        return float(self.decay.subs({t_0: self.start, t: time}))

    def phi(self, time: float) -> float:
        """``φ(time)`` at the actual start."""
        return float(self.factor.subs({t_0: self.start, t: time}))

    def latex(self) -> str:
        lhs = sp.latex(self.kappa2 * sp.Symbol(r"\ddot{\theta}") + self.kappa1 * sp.Symbol(r"\dot{\theta}"))
        decay = rf" + {sp.latex(sp.nsimplify(self.weight_decay))}\,\theta" if self.weight_decay else ""
        return rf"{lhs} + \nabla L(\theta){decay} = 0"

    def energy_latex(self) -> str:
        """The energy law: ``Ė = −(κ₁ − ½κ̇₂)‖θ̇‖²``, or ``L̇ = −‖∇L‖²/κ₁`` for gradient flow."""
        if self.first_order:
            return rf"\frac{{d L}}{{dt}} = -\frac{{\|\nabla L\|^2}}{{{sp.latex(self.kappa1)}}}"
        rate = sp.simplify(self.kappa1 - sp.diff(self.kappa2, t) / 2)
        return (rf"E = \frac{{{sp.latex(self.kappa2)}}}{{2}}\|\dot\theta\|^2 + L,\quad \frac{{dE}}{{dt}} = "
                rf"-{sp.latex(rate) if rate != 1 else ''}\|\dot\theta\|^2" if rate != 0 else
                rf"E = \frac{{{sp.latex(self.kappa2)}}}{{2}}\|\dot\theta\|^2 + L = \text{{const}}")

    def __str__(self) -> str:
        decay = f" + {self.weight_decay}·θ" if self.weight_decay else ""
        return (f"{self.name}: {sp.sstr(self.kappa2)}·θ'' + {sp.sstr(self.kappa1)}·θ' + ∇L{decay} = 0 from "
                f"t = {self.start}")


def _expr(value: object, label: str) -> sp.Expr:
    if isinstance(value, str) or isinstance(value, bool):
        raise SpecError(f"noether.dynamics: {label} must be a number or a SymPy expression in noether.t, not "
                        f"{type(value).__name__} {value!r} (strings are never evaluated)")
    try:
        return sp.nsimplify(sp.sympify(value, strict=True), rational=False) if isinstance(value, float) \
            else sp.sympify(value, strict=True)
    except sp.SympifyError as error:
        raise SpecError(f"noether.dynamics: {label}={value!r} is not a number or a SymPy expression") from error


def dynamics(kappa1: object, kappa2: object, start: float = 0.0, name: str = "general") -> Dynamics:
    """General dynamics ``κ₂(t) θ̈ + κ₁(t) θ̇ + ∇L = 0`` (numbers or SymPy expressions in :data:`t`)."""
    return Dynamics(name, _expr(kappa1, "kappa1"), _expr(kappa2, "kappa2"), float(start))


def gradient_flow(weight_decay: float = 0.0) -> Dynamics:
    """``θ̇ = −∇L − λθ`` (``λ = weight_decay``, default none).

    >>> gradient_flow(0.1).decay
    exp(-t/10 + t_0/10)
    """
    if weight_decay:
        return Dynamics(f"gradient flow (weight decay {weight_decay})", sp.Integer(1), sp.Integer(0), 0.0,
                        weight_decay)
    return dynamics(1, 0, name="gradient flow")


def newtonian() -> Dynamics:
    """``θ̈ = −∇L`` (no friction)."""
    return dynamics(0, 1, name="Newtonian")


def heavy_ball(gamma: float = 1.0) -> Dynamics:
    """``θ̈ + γθ̇ = −∇L`` (constant friction ``γ > 0``)."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 < gamma < math.inf:
        raise SpecError(f"noether.heavy_ball: gamma must be a positive number, got {gamma!r}")
    return dynamics(sp.Float(gamma) if isinstance(gamma, float) else gamma, 1, name=f"heavy ball (γ={gamma})")


def nesterov_flow(start: float = 1.0) -> Dynamics:
    """``θ̈ + (3/t)θ̇ = −∇L`` (Su, Boyd and Candès), from ``start > 0``."""
    return dynamics(3 / t, 1, start=start, name="Nesterov flow")


# ---------------------------------------------------------------------------------------------
# momentum map and laws
# ---------------------------------------------------------------------------------------------
def _zero_element(symmetry: Symmetry, like: torch.Tensor) -> torch.Tensor:
    group = symmetry.group
    return group.algebra_element(torch.zeros(int(group.dim), dtype=like.dtype, device=like.device))


def momentum_map(symmetry: Symmetry, params: Params, velocity: Params) -> torch.Tensor:
    """``Γ(θ, v)``: the element with ``⟨Γ, M⟩ = ⟨v, M·θ⟩`` for every ``M`` in the algebra's element format
    (``h × h`` for matrix groups, ``h`` for diagonal ones, ``k`` for translations), by one backward pass through
    :meth:`~symalg.Symmetry.tangent` (linear in ``M``).

    >>> import torch, symalg
    >>> analysis = symalg.derive("linear(2, 3, bias=False) -> identity -> linear(3, 2, bias=False)")
    >>> s = analysis.symmetries[0]
    >>> W1, W2 = torch.randn(3, 2, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    >>> p = {"0.weight": W1, "2.weight": W2}
    >>> torch.allclose(momentum_map(s, p, p), W1 @ W1.T - W2.T @ W2)   # the balance matrix C
    True
    """
    return momentum_maps([symmetry], params, velocity)[0]


def momentum_maps(symmetries: Sequence[Symmetry], params: Params, velocity: Params) -> list[torch.Tensor]:
    """:func:`momentum_map` of every symmetry in ``symmetries`` with one backward pass for all of them."""
    like = next(iter(params.values()))
    elements = [_zero_element(s, like).requires_grad_(True) for s in symmetries]
    with torch.enable_grad():
        total: torch.Tensor | None = None
        for symmetry, M in zip(symmetries, elements):
            for k, v in symmetry.tangent(params, M).items():
                term = (velocity[k].detach() * v).sum()
                total = term if total is None else total + term
        if total is None or not total.requires_grad:
            return [torch.zeros_like(M) for M in elements]
        gammas = torch.autograd.grad(total, elements, allow_unused=True)
    return [torch.zeros_like(M) if g is None else g for M, g in zip(elements, gammas)]


def momentum_maps_batched(symmetries: Sequence[Symmetry], params: Params,
                          velocities: Sequence[Params]) -> list[list[torch.Tensor]]:
    """``[momentum_maps(symmetries, params, w) for w in velocities]`` with one tangent and one batched backward pass
    (``Γ(θ, w)`` is linear in ``w``: the vector-Jacobian products of the tangent ``M ↦ M·θ`` with every ``w``).

    >>> import torch, symalg
    >>> s = symalg.derive("linear(2, 3) -> relu -> linear(3, 2)").symmetries[0]
    >>> p = {k: torch.randn(v, dtype=torch.float64) for k, v in [("0.weight", (3, 2)), ("0.bias", (3,)),
    ...      ("2.weight", (2, 3)), ("2.bias", (2,))]}
    >>> w = {k: torch.randn_like(v) for k, v in p.items()}
    >>> batched = momentum_maps_batched([s], p, [p, w])
    >>> all(torch.allclose(batched[j][0], momentum_map(s, p, v)) for j, v in enumerate([p, w]))
    True
    """
    like = next(iter(params.values()))
    elements = [_zero_element(s, like).requires_grad_(True) for s in symmetries]
    with torch.enable_grad():
        outputs, products = [], []
        for symmetry, M in zip(symmetries, elements):
            for k, v in symmetry.tangent(params, M).items():
                if v.requires_grad:
                    outputs.append(v)
                    products.append(torch.stack([w[k].detach().to(v).expand_as(v) for w in velocities]))
        grads = torch.autograd.grad(outputs, elements, products, is_grads_batched=True, allow_unused=True) \
            if outputs else (None,) * len(elements)
    return [[torch.zeros_like(M) if g is None else g[j] for M, g in zip(elements, grads)]
            for j in range(len(velocities))]


def _adjoint(x: torch.Tensor) -> torch.Tensor:
    """``Γ(w, u)`` from ``Γ(u, w)``: the transpose for matrix groups, itself for diagonal ones."""
    return x.transpose(-1, -2) if x.dim() >= 2 else x


def _antisymmetric(symmetry: Symmetry, x: torch.Tensor) -> torch.Tensor:
    """The part of ``x`` pairing with the antisymmetric elements of the algebra."""
    return symmetry.group.project_to_algebra((x - x.T) / 2)


def _has_antisymmetric(symmetry: Symmetry) -> bool:
    """The algebra has antisymmetric elements: ``GL`` and ``O`` (width at least 2), the plane rotations of complex
    scaling."""
    group = symmetry.group
    if group.element_format != "matrix" or sp.sympify(group.width) == 1:
        return False
    return bool(group.standard_basis or group.has_angular_momentum or group.n_symmetric != group.dim)


def charged(symmetry: Symmetry) -> str | None:
    """Why ``symmetry`` gives only a restriction (``None`` when its momentum map is exact): it moves buffers, is a
    shear (directions depending on θ), is affine, or is discrete."""
    group = symmetry.group
    if not group.is_continuous:
        return "discrete group: no generator"
    if symmetry.acts_on_buffers:
        return "the action moves buffers (the loss is invariant only when the running statistics move too)"
    if symmetry.sheared:
        return "a shear: its directions depend on θ, so ⟨θ̇, ξ(θ)⟩ has no closed derivative"
    if group.affine:
        return "an affine action (a shift τ(g)): the tangent is not linear in θ"
    return None


@dataclass(frozen=True)
class Law:
    """One Noether law of one symmetry under one dynamics.

    ``part``: ``'symmetric'`` (the generators with a quadratic ``Q_M``), ``'antisymmetric'`` (rotations: the charge
    ``J = anti Γ(θ, θ̇)``), ``'translation'`` (``ℓ = ⟨B, θ⟩``) or ``'other'``; ``status``: ``'conserved'``,
    ``'exponential decay'``, ``'power law decay'``, ``'decay law'`` or ``'restriction'``; ``factor`` the decay
    ``φ(t)`` (``1`` when conserved, ``None`` for a restriction); ``quantity`` what is conserved or decays, in words.
    """

    symmetry: Symmetry
    dynamics: Dynamics
    part: str
    status: str
    quantity: str
    relation: str
    factor: sp.Expr | None = None
    reason: str = ""

    @property
    def label(self) -> str:
        return self.symmetry.label

    @property
    def conserved(self) -> bool:
        return self.status == "conserved"

    def latex(self) -> str:
        """The relation, followed by the quantity it is about (the symmetric and translation parts; SymPy's
        printer runs here, not when the laws are generated)."""
        quantity = self.symmetry.conserved
        if self.part in ("symmetric", "translation") and quantity is not None:
            return self.relation + (r",\quad " if self.relation else "") + quantity.latex()
        return self.relation

    def lowered(self) -> Callable[[Params], dict[str, torch.Tensor]] | None:
        """The lowered torch callable of a conserved quadratic or linear quantity (``None`` otherwise)."""
        quantity = self.symmetry.conserved
        if self.conserved and self.part in ("symmetric", "translation") and self.dynamics.first_order \
                and quantity is not None:
            return quantity.lowered
        return None

    def __str__(self) -> str:
        law = "" if self.factor is None or self.factor == 1 else f" × {sp.sstr(self.factor)}"
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.label} [{self.part}] {self.status}: {self.quantity}{law}{reason}"


def _symmetric_law(symmetry: Symmetry, dyn: Dynamics) -> Law:
    quantity = symmetry.conserved
    assert quantity is not None
    if dyn.first_order and dyn.weight_decay:
        factor = dyn.decay ** 2
        return Law(symmetry, dyn, "symmetric", "exponential decay", f"{quantity.name} = Γ(θ, θ)",
                   rf"C(t) = {sp.latex(factor)}\, C(t_0)", factor)
    if dyn.first_order:
        return Law(symmetry, dyn, "symmetric", "conserved", f"{quantity.name} = Γ(θ, θ)", "", sp.Integer(1))
    k1, k2 = sp.latex(dyn.kappa1), sp.latex(dyn.kappa2)
    site = escape_latex(symmetry.site)
    relation = (rf"\operatorname{{sym}}\Gamma_{{\mathrm{{{site}}}}}\left(\theta,\ {k2}\,\ddot\theta + {k1}\,\dot\theta"
                rf"\right) = 0\ \Leftrightarrow\ {k2}\left(\tfrac12 \ddot C - \operatorname{{sym}}\Gamma(\dot\theta,"
                rf"\dot\theta)\right) + \tfrac{{{k1}}}{{2}} \dot C = 0")
    return Law(symmetry, dyn, "symmetric", "restriction", f"{quantity.name}: κ₂(½C̈ − Γ(θ̇,θ̇)) + ½κ₁Ċ = 0", relation)


def _antisymmetric_law(symmetry: Symmetry, dyn: Dynamics) -> Law:
    site = escape_latex(symmetry.site)
    J = rf"J_{{\mathrm{{{site}}}}}"
    definition = rf"{J}(\theta, \dot\theta) = \operatorname{{anti}}\Gamma(\theta, \dot\theta)"
    if dyn.first_order:
        return Law(symmetry, dyn, "antisymmetric", "restriction", "J(θ, ∇L) = 0: Γ(θ, θ̇) is symmetric",
                   rf"{definition} = 0 \text{{ along gradient flow}}")
    phi = dyn.factor
    status = "conserved" if phi == 1 else dyn.kind
    relation = rf"{definition},\quad {J}(t) = {sp.latex(phi)}\, {J}(t_0)" if phi != 1 else \
        rf"{definition} = \text{{const}}"
    return Law(symmetry, dyn, "antisymmetric", status, "J = anti Γ(θ, θ̇) (angular momentum)", relation, phi)


def _translation_law(symmetry: Symmetry, dyn: Dynamics) -> Law:
    quantity = symmetry.conserved
    name = quantity.name if quantity is not None else "ℓ"
    if dyn.first_order and dyn.weight_decay:
        return Law(symmetry, dyn, "translation", "exponential decay", f"{name} = ⟨B, θ⟩",
                   rf"\ell(t) = {sp.latex(dyn.decay)}\,\ell(t_0)", dyn.decay)
    if dyn.first_order:
        return Law(symmetry, dyn, "translation", "conserved", f"{name} = ⟨B, θ⟩",
                   "" if quantity is not None else r"\ell = \langle B, \theta\rangle", sp.Integer(1))
    phi, integral = dyn.factor, dyn.displacement
    relation = (rf"\dot\ell(t) = {sp.latex(phi)}\,\dot\ell(t_0),\quad \ell(t) = \ell(t_0) + \dot\ell(t_0)\,"
                rf"{sp.latex(integral)}")
    return Law(symmetry, dyn, "translation", "conserved" if phi == 1 else dyn.kind,
               f"momentum ℓ̇ = ⟨B, θ̇⟩ of {name}", relation, phi)


@dataclass(frozen=True)
class NoetherLaws:
    """Every law of an analysis under one dynamics (:func:`laws`), with the energy law."""

    analysis: Analysis
    dynamics: Dynamics
    laws: tuple[Law, ...]

    def by_status(self) -> dict[str, list[Law]]:
        out: dict[str, list[Law]] = {}
        for law in self.laws:
            out.setdefault(law.status, []).append(law)
        return out

    def energy_latex(self) -> str:
        return self.dynamics.energy_latex()

    def latex(self) -> str:
        rows = [rf"\text{{{escape_latex(law.label)} ({law.part}, {law.status})}}:\ {law.latex()}" for law in self.laws]
        return r" \\ ".join([self.dynamics.latex()] + rows + [self.energy_latex()])

    def __iter__(self) -> Iterator[Law]:
        return iter(self.laws)

    def __str__(self) -> str:
        return "\n".join([str(self.dynamics)] + [f"  {law}" for law in self.laws])


def laws(analysis: Analysis, dyn: Dynamics) -> NoetherLaws:
    """The Noether law of every continuous symmetry of ``analysis`` under ``dyn`` (module docstring): for each, its
    symmetric part (if it has a quadratic ``Q_M``), its antisymmetric part (if its algebra has rotations), its
    translations, or a restriction with the reason."""
    if not isinstance(analysis, Analysis):
        raise SpecError(f"noether.laws: analysis must be the result of symalg.derive, got {type(analysis).__name__}")
    if not isinstance(dyn, Dynamics):
        raise SpecError(f"noether.laws: dynamics must be a noether.Dynamics, got {type(dyn).__name__}")
    out: list[Law] = []
    for symmetry in analysis.symmetries:
        if not symmetry.group.is_continuous:
            continue
        reason = charged(symmetry)
        if reason is not None:
            out.append(Law(symmetry, dyn, "other", "restriction", "⟨κ₂θ̈ + κ₁θ̇, ξ(θ)⟩ = 0",
                           r"\langle \kappa_2\ddot\theta + \kappa_1\dot\theta,\ \xi(\theta)\rangle = 0", reason=reason))
            continue
        if symmetry.group.kind == "T":
            out.append(_translation_law(symmetry, dyn))
            continue
        if symmetry.conserved is not None:
            out.append(_symmetric_law(symmetry, dyn))
        if _has_antisymmetric(symmetry):
            out.append(_antisymmetric_law(symmetry, dyn))
    return NoetherLaws(analysis, dyn, tuple(out))


# ---------------------------------------------------------------------------------------------
# integration
# ---------------------------------------------------------------------------------------------
Integrand = Callable[[Params, Params, torch.Tensor], torch.Tensor]
"""``f(θ, θ̇, t)``: a tensor integrated along the trajectory (:func:`integrate`'s ``integrals``)."""


@dataclass(frozen=True)
class Trajectory:
    """Samples of a trajectory: ``times``, ``thetas``, ``velocities`` (``θ̇``; ``−∇L/κ₁`` for gradient flow),
    ``losses``, ``dissipated`` (``∫(κ₁ − ½κ̇₂)‖θ̇‖²``, gradient flow ``∫‖∇L‖²/κ₁``: the energy lost) and the
    requested ``integrals`` at each sample."""

    dynamics: Dynamics
    times: list[float]
    thetas: list[dict[str, torch.Tensor]]
    velocities: list[dict[str, torch.Tensor]]
    losses: list[float]
    dissipated: list[float]
    integrals: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def energy(self, index: int) -> float:
        """``½κ₂‖θ̇‖² + L`` at sample ``index`` (``L`` for gradient flow; ``+ ½λ‖θ‖²`` with weight decay ``λ``)."""
        _, kappa2, _ = self.dynamics.kappa()
        kinetic = sum(float((v ** 2).sum()) for v in self.velocities[index].values())
        decay = 0.5 * self.dynamics.weight_decay * sum(float((p ** 2).sum()) for p in self.thetas[index].values())
        return 0.5 * float(kappa2(self.times[index])) * kinetic + self.losses[index] + decay


def integrate(dyn: Dynamics, loss: Loss, params: Params, velocity: Params | None = None, duration: float = 1.0,
              steps: int = 1000, samples: int = 100, integrals: Mapping[str, Integrand] | None = None) -> Trajectory:
    """RK4 on ``κ₂θ̈ + κ₁θ̇ + ∇L (+ λθ) = 0`` from ``(params, velocity)`` at ``dyn.start`` for ``duration``
    (``steps`` steps, ``samples + 1`` samples), with the energy dissipated and any ``integrals`` (``f(θ, θ̇, t)``)
    carried as extra state, so they are integrated to the same order.

    >>> import torch
    >>> loss = lambda p: ((p["w"] ** 2).sum() - 1) ** 2
    >>> w = {"w": torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)}
    >>> run = integrate(newtonian(), loss, w, {"w": torch.tensor([-2.0, 1.0, 1.0], dtype=torch.float64)}, 2.0, 2000)
    >>> abs(run.energy(-1) - run.energy(0)) < 1e-10
    True
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or samples < 1:
        raise SpecError(f"noether.integrate: steps and samples must be positive integers, got {steps}, {samples}")
    if not math.isfinite(duration) or duration <= 0:
        raise SpecError(f"noether.integrate: duration must be positive, got {duration!r}")
    kappa1, kappa2, kappa2_dot = dyn.kappa()
    names = list(params)
    like = next(iter(params.values()))
    extra = dict(integrals or {})
    second = not dyn.first_order
    if second and velocity is None:
        velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    if not second and velocity is not None:
        raise SpecError("noether.integrate: gradient flow takes no velocity")

    def velocity_of(theta: Params, time: torch.Tensor, v: Params | None) -> dict[str, torch.Tensor]:
        if v is not None:
            return dict(v)
        grads = loss_gradients(loss, theta)
        return {k: -(g + dyn.weight_decay * theta[k]) / kappa1(float(time)) for k, g in grads.items()}

    def field_(state: dict[tuple[str, str], torch.Tensor]) -> dict[tuple[str, str], torch.Tensor]:
        time = state[("t", "")]
        theta = {k: state[("θ", k)] for k in names}
        v = {k: state[("v", k)] for k in names} if second else None
        out: dict[tuple[str, str], torch.Tensor] = {("t", ""): torch.ones_like(time)}
        now = float(time)
        if second:
            assert v is not None
            grads = loss_gradients(loss, theta)
            k1, k2 = kappa1(now), kappa2(now)
            out.update({("θ", k): v[k] for k in names})
            out.update({("v", k): -(k1 * v[k] + grads[k]) / k2 for k in names})
            rate = k1 - 0.5 * kappa2_dot(now)
            speed = velocity_of(theta, time, v)
        else:
            speed = velocity_of(theta, time, None)
            out.update({("θ", k): speed[k] for k in names})
            rate = kappa1(now)
        kinetic = sum(((s ** 2).sum() for s in speed.values()), torch.zeros((), dtype=like.dtype))
        out[("D", "")] = rate * kinetic
        for key, f in extra.items():
            out[("I", key)] = f(theta, speed, time)
        return out

    state: dict[tuple[str, str], torch.Tensor] = {("t", ""): torch.tensor(dyn.start, dtype=like.dtype),
                                                  ("D", ""): torch.zeros((), dtype=like.dtype)}
    state.update({("θ", k): v.detach().clone() for k, v in params.items()})
    if second:
        assert velocity is not None
        state.update({("v", k): velocity[k].detach().clone().to(like) for k in names})
    probe = field_(state) if extra else {}
    state.update({("I", key): torch.zeros_like(probe[("I", key)]) for key in extra})
    dt = duration / steps
    per = max(1, steps // samples)
    record = Trajectory(dyn, [], [], [], [], [], [])

    def sample(s: dict[tuple[str, str], torch.Tensor]) -> None:
        time = s[("t", "")]
        theta = {k: s[("θ", k)] for k in names}
        record.times.append(float(time))
        record.thetas.append(theta)
        record.velocities.append(velocity_of(theta, time, {k: s[("v", k)] for k in names} if second else None))
        with torch.no_grad():
            record.losses.append(float(loss(theta)))
        record.dissipated.append(float(s[("D", "")]))
        record.integrals.append({key: s[("I", key)] for key in extra})

    sample(state)
    done = 0
    while done < steps:
        n = min(per, steps - done)
        state = rk4(field_, state, dt, n)
        done += n
        sample(state)
    return record


def _relative(residual: torch.Tensor, scale: float) -> float:
    return float(residual.abs().max()) / max(scale, torch.finfo(residual.dtype).tiny)


def check_dynamics(symmetries: Sequence[Symmetry], loss: Loss, params: Params, grads: Params, dyn: Dynamics,
                   generator: torch.Generator, steps: int = 8, max_move: float = 1e-4) -> list[CheckResult]:
    """Every law of ``dyn`` checked by integration from ``params`` (velocity random, of the gradient's norm): the
    antisymmetric charges against ``φ(t)J(t₀)``, the translation momenta and positions, the symmetric restriction
    (``sym p(T) − sym p(t₀) = ∫ Γ_sym(θ̇, θ̇) − (κ₁/κ₂) sym p``) and the energy balance ``E(T) + D(T) = E(t₀)``.

    Tolerances come from the step: the run is repeated at half the step, and a law must hold to
    ``max(16·|X_dt − X_{dt/2}|, 4096 ε)`` (16 covers RK4's ``1/15`` and the order-2 error of steps across kinks,
    ``1/3``); a false law is off by the law's own change (``~γT``), not by integrator error.
    """
    like = next(iter(params.values()))
    eps = torch.finfo(like.dtype).eps
    norm = lambda ts: math.sqrt(sum(float((x ** 2).sum()) for x in ts))  # noqa: E731
    grad_norm, theta_norm = norm(grads.values()), norm(params.values())
    dt = min(2.5e-4, max_move * theta_norm / max(grad_norm, 1e-300))
    velocity = None
    if not dyn.first_order:
        velocity = {k: torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for k, p in params.items()}
        scale = grad_norm / max(norm(velocity.values()), 1e-300)
        velocity = {k: v * scale for k, v in velocity.items()}
    exact = [s for s in symmetries if s.group.is_continuous and charged(s) is None]
    sym = [s for s in exact if s.group.kind != "T" and s.conserved is not None and not dyn.first_order]
    kappa1, kappa2, _ = dyn.kappa()

    def restriction(theta: Params, v: Params, time: torch.Tensor) -> torch.Tensor:
        """``Γ_sym(θ̇, θ̇) − (κ₁/κ₂) sym Γ(θ, θ̇)`` of every symmetric law, flattened and concatenated: one momentum
        map, ``sym Γ(θ̇ − (κ₁/κ₂)θ, θ̇)``, since ``Γ`` is bilinear for these symmetries (``M·θ`` linear in ``θ``)."""
        ratio = kappa1(float(time)) / kappa2(float(time))
        at = {k: v[k] - ratio * theta[k] for k in theta}
        return torch.cat([_sym(s, p).reshape(-1) for s, p in zip(sym, momentum_maps(sym, at, v))])

    integrands = {"restriction": restriction} if sym else {}
    offsets = [0]
    for s in sym:
        offsets.append(offsets[-1] + _zero_element(s, next(iter(params.values()))).numel())
    runs = [integrate(dyn, loss, params, velocity, dt * steps, n, 1, integrands) for n in (steps, 2 * steps)]
    floor = 4096 * eps
    results: list[CheckResult] = []

    def report(check: str, label: str, errors: list[float], detail: str, floor: float = floor) -> None:
        tol = max(16 * abs(errors[0] - errors[1]), floor)
        results.append(CheckResult(check, label, errors[1], tol, f"{dyn.name}: {detail}; RK4 dt={dt / 2:.1e}, "
                                   f"{2 * steps} steps (tolerance from the dt run: {errors[0]:.1e})"))

    end = runs[0].times[-1]
    phi = dyn.phi(end) if not dyn.first_order else 0.0
    moved = float(dyn.displacement.subs({t: end, t_0: dyn.start})) if not dyn.first_order else 0.0
    for s in exact:
        if dyn.first_order:
            if dyn.weight_decay and (s.group.kind == "T" or s.conserved is not None):
                power = 1 if s.group.kind == "T" else 2       # ℓ(T) = φℓ(t₀); C(T) = φ²C(t₀)
                factor = dyn.decay_at(end) ** power
                errors = []
                for run in runs:
                    c0, c1 = (momentum_map(s, th, th) for th in (run.thetas[0], run.thetas[-1]))
                    errors.append(_relative(c1 - factor * c0, float(c0.abs().max())))
                report("noether_decay", s.label, errors, f"weight decay {dyn.weight_decay}: value(T) = "
                       f"{factor:.6f} · value(t₀)")
            continue
        if s.group.kind == "T":
            errors, moves = [], []
            for run in runs:
                m0 = momentum_map(s, run.thetas[0], run.velocities[0])
                m1 = momentum_map(s, run.thetas[-1], run.velocities[-1])
                l0 = momentum_map(s, run.thetas[0], run.thetas[0])
                l1 = momentum_map(s, run.thetas[-1], run.thetas[-1])
                size = {k: v.abs() for k, v in run.thetas[0].items()}   # ℓ sums entries: rounding scales with |θ|
                scale = float(m0.abs().max()) * (end - dyn.start) + float(momentum_map(s, size, size).abs().max())
                errors.append(max(_relative(m1 - phi * m0, float(m0.abs().max())),
                                  _relative(l1 - l0 - moved * m0, scale)))
                moves.append(float((l1 - l0).abs().max()))
            report("noether_translation", s.label, errors, f"ℓ̇(T) = φ(T)ℓ̇(t₀), φ(T) = {phi:.6f}; ℓ moved "
                   f"{moves[1]:.2e}")
            continue
        if _has_antisymmetric(s):
            errors = []
            for run in runs:
                j0 = _antisymmetric(s, momentum_map(s, run.thetas[0], run.velocities[0]))
                j1 = _antisymmetric(s, momentum_map(s, run.thetas[-1], run.velocities[-1]))
                errors.append(_relative(j1 - phi * j0, float(j0.abs().max())))
            report("noether_decay", s.label, errors, f"J(T) = φ(T) J(t₀), φ = {sp.sstr(dyn.factor)}, "
                   f"φ(T) = {phi:.6f}")
    for s in sym:
        errors, changes = [], []
        for run in runs:
            p0 = _sym(s, momentum_map(s, run.thetas[0], run.velocities[0]))
            p1 = _sym(s, momentum_map(s, run.thetas[-1], run.velocities[-1]))
            index = sym.index(s)
            integral = run.integrals[-1]["restriction"][offsets[index]:offsets[index + 1]].reshape(p0.shape)
            scale = float(p0.abs().max()) + float(integral.abs().max())
            errors.append(_relative(p1 - p0 - integral, scale))
            c0, c1 = (momentum_map(s, th, th) for th in (run.thetas[0], run.thetas[-1]))
            changes.append(_relative(c1 - c0, float(c0.abs().max())))
        report("noether_restriction", s.label, errors, f"sym Γ(θ,θ̇) changes by ∫Γ_sym(θ̇,θ̇) − (κ₁/κ₂) sym Γ(θ,θ̇); "
               f"C itself changed {changes[1]:.1e} (relative)")
    errors = [abs(run.energy(-1) + run.dissipated[-1] - run.energy(0)) /
              max(abs(run.energy(0)), run.dissipated[-1], 1e-300) for run in runs]
    # the energy reads the loss's value, which a model computing parts in lower precision (Hugging Face's RMSNorm
    # casts to float32) gives only to its own accuracy: the floor is the dtype's tolerance, not rounding
    report("noether_energy", "*", errors, f"E(T) + ∫(κ₁ − κ̇₂/2)‖θ̇‖² = E(t₀); dissipated {runs[1].dissipated[-1]:.3e}",
           TOLERANCES.get(like.dtype, floor))
    return results


def _sym(symmetry: Symmetry, x: torch.Tensor) -> torch.Tensor:
    """The part of ``x`` pairing with the symmetric elements of the algebra: ``(x + xᵀ)/2`` projected on it for
    matrices, ``x`` for diagonals."""
    if x.dim() < 2:
        return x
    return symmetry.group.project_to_algebra((x + x.T) / 2)


def _project(symmetry: Symmetry, x: torch.Tensor) -> torch.Tensor:
    """``x`` projected on the Lie algebra (the part the symmetry controls)."""
    return symmetry.group.project_to_algebra(x) if x.dim() >= 2 else x


# ---------------------------------------------------------------------------------------------
# discrete schemes
# ---------------------------------------------------------------------------------------------
SCHEMES = ("gd", "momentum", "paper_newtonian", "paper_nesterov", "adam")


@dataclass(frozen=True)
class Scheme:
    """A discrete training scheme, run as users run it (``torch.optim.SGD`` / ``Adam`` / ``AdamW`` for ``gd``,
    ``momentum`` and ``adam``; the paper's eqs. (20) and (21) for the other two). Every step is
    ``θ' = aθ − η d`` (``a = 1 − ηλ_dec`` for decoupled weight decay ``λ_dec``, else 1) and the exact one-step
    identities, with ``Γ`` the momentum map and ``S = Γ(θ, θ)``, are (projected on the algebra):

    * ``gd`` (``θ' = aθ − η(∇L_B + λθ)``, ``L_B`` a minibatch loss, also invariant):
      ``S' = (a − ηλ)² S + η² Γ(∇L_B, ∇L_B)``;
    * ``momentum`` (torch: ``g = ∇L_B + λθ``, ``b' = μb + (1−τ)g``, ``d = b'`` or ``g + μb'`` with Nesterov), with
      ``P = Γ(θ, b)``: ``Γ(θ, b') = μP + (1−τ)λS``, ``S' = a²S − aη(X + Xᵀ) + η²Γ(d, d)`` with ``X = Γ(θ, d)`` from
      those, ``P' = aΓ(θ, b') − ηΓ(d, b')``. For heavy ball ``anti P' = aμ anti P`` exactly;
    * ``paper_newtonian`` (eq. 21, ``w_{k+2} = 2w_{k+1} − w_k − η∇L(w_{k+1})``), ``I_k = Γ(w_k, w_{k+1})``:
      ``I_{k+1} = 2S_{k+1} − I_kᵀ``: ``anti I`` is an exact discrete invariant;
    * ``paper_nesterov`` (eq. 20, ``β_k = (k−1)/(k+2)``), ``I_k = Γ(w_{k−1}, w_k)``:
      ``I_{k+1} = (1+β_k)S_k − β_k I_kᵀ − η β_k/(1+β_k) Γ(w_{k−1}, ∇L(y_k))``;
    * ``adam``: ``S' = a²S − aη(X + Xᵀ) + η²Γ(u, u)`` holds for any update, but ``X = Γ(θ, u)`` is not fixed by the
      symmetry: the per-coordinate scaling ``1/(√v̂ + ε)`` does not commute with the action. The check reports
      ``‖X‖`` (what Adam breaks).
    """

    kind: str
    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    decoupled: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCHEMES:
            raise SpecError(f"noether.Scheme: kind must be one of {SCHEMES}, got {self.kind!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise SpecError(f"noether.Scheme: lr must be a positive number, got {self.lr!r}")
        if not 0 <= self.momentum < 1 or not 0 <= self.dampening <= 1 or self.weight_decay < 0:
            raise SpecError(f"noether.Scheme: need 0 ≤ momentum < 1, 0 ≤ dampening ≤ 1, weight_decay ≥ 0; got "
                            f"{self.momentum}, {self.dampening}, {self.weight_decay}")
        if self.nesterov and (self.kind != "momentum" or self.momentum == 0 or self.dampening != 0):
            raise SpecError("noether.Scheme: nesterov needs kind='momentum', momentum > 0 and dampening 0 (as torch)")
        if self.batch is not None and (isinstance(self.batch, bool) or not isinstance(self.batch, int)
                                       or self.batch < 1):
            raise SpecError(f"noether.Scheme: batch must be a positive int (rows per minibatch), got {self.batch!r}")

    @property
    def name(self) -> str:
        extras = [f"{k}={getattr(self, k)}" for k in ("momentum", "dampening", "weight_decay", "batch")
                  if getattr(self, k) not in (0, 0.0, None)]
        extras += ["nesterov"] * self.nesterov + ["decoupled"] * self.decoupled
        return f"{self.kind}(lr={self.lr}{''.join(', ' + e for e in extras)})"

    def optimizer(self, leaves: list[torch.Tensor]) -> torch.optim.Optimizer | None:
        """The torch optimizer users run (``None`` for the paper's schemes); decoupled decay is applied outside it."""
        coupled = 0.0 if self.decoupled else self.weight_decay
        if self.kind in ("gd", "momentum"):
            return torch.optim.SGD(leaves, lr=self.lr, momentum=self.momentum, dampening=self.dampening,
                                   nesterov=self.nesterov, weight_decay=coupled)
        if self.kind == "adam":
            return torch.optim.Adam(leaves, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=coupled)
        return None


def gd(lr: float, weight_decay: float = 0.0, decoupled: bool = False, batch: int | None = None) -> Scheme:
    """Gradient descent (``torch.optim.SGD``); ``batch`` rows per step make it minibatch SGD."""
    return Scheme("gd", lr, weight_decay=weight_decay, decoupled=decoupled, batch=batch)


def momentum(lr: float, momentum: float = 0.9, nesterov: bool = False, dampening: float = 0.0,
             weight_decay: float = 0.0, decoupled: bool = False, batch: int | None = None) -> Scheme:
    """``torch.optim.SGD`` with momentum (heavy ball) or Nesterov momentum, as users run it."""
    return Scheme("momentum", lr, momentum, dampening, nesterov, weight_decay, decoupled, batch=batch)


def paper_newtonian(lr: float) -> Scheme:
    """The paper's discrete Newtonian scheme, eq. (21): ``w_{k+2} = 2w_{k+1} − w_k − η∇L(w_{k+1})``."""
    return Scheme("paper_newtonian", lr)


def paper_nesterov(lr: float) -> Scheme:
    """The paper's Nesterov scheme, eq. (20): ``w_k = y_{k−1} − η∇L(y_{k−1})``,
    ``y_k = w_k + (k−1)/(k+2)(w_k − w_{k−1})``."""
    return Scheme("paper_nesterov", lr)


def adam(lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
         decoupled: bool = False, batch: int | None = None) -> Scheme:
    """``torch.optim.Adam`` (``decoupled=True``: AdamW's decay ``θ ← (1 − ηλ)θ`` before the step)."""
    return Scheme("adam", lr, weight_decay=weight_decay, decoupled=decoupled, betas=betas, eps=eps, batch=batch)


@dataclass(frozen=True)
class Step:
    """One step of a scheme: the point ``θ`` the step started from, the factor ``a``, the update ``d``
    (``θ' = aθ − ηd``), the minibatch gradient ``g`` and, for momentum, the buffer ``b`` before and after it;
    for the paper's schemes ``previous`` (``w_{k−1}``) and ``y`` (the point the gradient was taken at)."""

    theta: dict[str, torch.Tensor]
    a: float
    d: dict[str, torch.Tensor]
    g: dict[str, torch.Tensor]
    buffer: dict[str, torch.Tensor] | None = None
    new_buffer: dict[str, torch.Tensor] | None = None
    previous: dict[str, torch.Tensor] | None = None
    y: dict[str, torch.Tensor] | None = None
    beta: float = 0.0


def run_scheme(scheme: Scheme, losses: Callable[[int], Loss], params: Params, steps: int,
               velocity: Params | None = None) -> tuple[list[Step], dict[str, torch.Tensor]]:
    """Run ``steps`` steps of ``scheme`` on ``losses(k)`` (the loss of step ``k``: a minibatch loss for SGD) from
    ``params``; ``(steps taken, final θ)``. ``velocity`` is the starting momentum buffer of ``momentum``; the paper's
    Newtonian scheme starts from ``w_1 = w_0 + √η v₀ − (η/2)∇L(w_0)`` (``t ≈ k√η``)."""
    names = list(params)
    theta = {k: v.detach().clone() for k, v in params.items()}
    taken: list[Step] = []
    eta = scheme.lr
    if scheme.kind in ("paper_newtonian", "paper_nesterov"):
        previous = dict(theta)
        if scheme.kind == "paper_newtonian":
            g0 = loss_gradients(losses(0), theta)
            v0 = velocity or {k: torch.zeros_like(v) for k, v in theta.items()}
            theta = {k: theta[k] + math.sqrt(eta) * v0[k] - 0.5 * eta * g0[k] for k in names}
        y = dict(theta)
        for k in range(steps):
            if scheme.kind == "paper_newtonian":
                g = loss_gradients(losses(k), theta)
                new = {n: 2 * theta[n] - previous[n] - eta * g[n] for n in names}
                taken.append(Step(theta, 1.0, {n: (theta[n] - new[n]) / eta for n in names}, g, previous=previous,
                                  y=theta))
                previous, theta = theta, new
            else:
                g = loss_gradients(losses(k), y)
                new = {n: y[n] - eta * g[n] for n in names}
                beta = (k - 1) / (k + 2)   # y_k = w_k + β_k (w_k − w_{k−1})
                taken.append(Step(theta, 1.0, {n: (theta[n] - new[n]) / eta for n in names}, g, previous=previous,
                                  y=y, beta=beta))
                previous, theta = theta, new
                beta_next = (k + 1 - 1) / (k + 1 + 2)
                y = {n: theta[n] + beta_next * (theta[n] - previous[n]) for n in names}
        return taken, theta
    leaves = [theta[k].clone().requires_grad_(True) for k in names]
    optimizer = scheme.optimizer(leaves)
    assert optimizer is not None
    if velocity is not None:
        if scheme.kind != "momentum":
            raise SpecError(f"noether.run_scheme: a starting velocity needs a momentum scheme, not {scheme.kind}")
        for name, leaf in zip(names, leaves):
            optimizer.state[leaf]["momentum_buffer"] = velocity[name].detach().clone().to(leaf)
    a = 1 - eta * scheme.weight_decay if scheme.decoupled else 1.0
    for k in range(steps):
        optimizer.zero_grad()
        current = dict(zip(names, leaves))
        value = losses(k)(current)
        value.backward()
        # a parameter the loss does not read has gradient 0 (torch would skip it and keep no momentum buffer)
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in leaves]
        for p, grad in zip(leaves, grads):
            p.grad = grad
        before = {n: p.detach().clone() for n, p in current.items()}
        g = {n: grad.detach().clone() for n, grad in zip(names, grads)}
        buffer = {n: optimizer.state[p]["momentum_buffer"].clone() if "momentum_buffer" in optimizer.state[p]
                  else None for n, p in current.items()} if scheme.kind == "momentum" else None
        with torch.no_grad():
            if a != 1.0:
                for p in leaves:
                    p.mul_(a)
        optimizer.step()
        after = {n: p.detach().clone() for n, p in current.items()}
        new_buffer = {n: optimizer.state[p]["momentum_buffer"].clone() for n, p in current.items()} \
            if scheme.kind == "momentum" else None
        d = {n: (a * before[n] - after[n]) / eta for n in names}
        start = None if buffer is None or any(b is None for b in buffer.values()) else \
            {n: b for n, b in buffer.items() if b is not None}
        taken.append(Step(before, a, d, g, start, new_buffer))
    return taken, {n: p.detach().clone() for n, p in zip(names, leaves)}


def _exact_symmetries(symmetries: Sequence[Symmetry]) -> list[Symmetry]:
    """The continuous symmetries with an exact momentum map: bilinear, or a translation's ``⟨B, v⟩`` (no shears,
    affine actions or buffers)."""
    return [s for s in symmetries if s.group.is_continuous and charged(s) is None]


def _translation_step(scheme: Scheme, ell: Callable[[Params], torch.Tensor], step: Step,
                      new: Params) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], float]:
    """:func:`_one_step` for a translation, ``ℓ(v) = ⟨B, v⟩`` with ``⟨B, ∇L⟩ = 0``: ``ℓ' = (a − ηλ)ℓ`` (GD),
    ``⟨B, b'⟩ = μ⟨B, b⟩ + (1−τ)λℓ`` and ``ℓ' = aℓ − η⟨B, d⟩`` (momentum), ``ℓ_{k+2} = 2ℓ_{k+1} − ℓ_k`` (eq. 21),
    ``ℓ(w_{k+1}) = (1+β_k)ℓ(w_k) − β_kℓ(w_{k−1})`` (eq. 20); Adam's ``⟨B, u⟩`` is not fixed (returned as the
    breaking term relative to ``ℓ(|θ|)``-scale)."""
    eta, a = scheme.lr, step.a
    coupled = 0.0 if scheme.decoupled else scheme.weight_decay
    value, after = ell(step.theta), ell(new)
    name = "ℓ' from ⟨B, ∇L⟩ = 0"
    if scheme.kind == "gd":
        return [(name, after, (a - eta * coupled) * value)], 0.0
    if scheme.kind == "momentum":
        assert step.new_buffer is not None
        pushed = coupled * value if step.buffer is None else \
            scheme.momentum * ell(step.buffer) + (1 - scheme.dampening) * coupled * value
        moved = coupled * value + scheme.momentum * pushed if scheme.nesterov else pushed
        return [(name, after, a * value - eta * moved), ("⟨B, b'⟩", ell(step.new_buffer), pushed)], 0.0
    if scheme.kind == "adam":
        update = ell(step.d)
        return [(name, after, a * value - eta * update)], float(update.abs().max())
    assert step.previous is not None
    if scheme.kind == "paper_newtonian":
        return [(name, after, 2 * value - ell(step.previous))], 0.0
    return [(name, after, (1 + step.beta) * value - step.beta * ell(step.previous))], 0.0


Pairing = Callable[[Params, Params], torch.Tensor]
"""``G(u, w)``: one symmetry's momentum map ``Γ(u, w)``, projected on its algebra."""


def _norm(values: Params) -> float:
    return math.sqrt(sum(float((x ** 2).sum()) for x in values.values()))


def _one_step(scheme: Scheme, G: Pairing, step: Step,
              new: Params) -> tuple[list[tuple[str, torch.Tensor, torch.Tensor]], float]:
    """``[(name, actual, predicted)]`` for one step of ``scheme`` (from ``step.theta`` to ``new``), and for Adam the
    breaking term ``‖Γ(θ, u)‖/(‖θ‖‖u‖)`` (0 for the other schemes)."""
    eta, a = scheme.lr, step.a
    theta, d = step.theta, step.d
    S, Sn, D = G(theta, theta), G(new, new), G(d, d)
    coupled = 0.0 if scheme.decoupled else scheme.weight_decay
    out: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    broken = 0.0
    if scheme.kind in ("gd", "momentum", "adam"):
        if scheme.kind == "gd":
            X = coupled * S
        elif scheme.kind == "adam":
            X = G(theta, d)
            broken = float(X.abs().max()) / max(_norm(theta) * _norm(d), 1e-300)
        else:
            assert step.new_buffer is not None
            if step.buffer is None:   # torch's first step: b' = g
                Pb = coupled * S
            else:
                Pb = scheme.momentum * G(theta, step.buffer) + (1 - scheme.dampening) * coupled * S
            X = coupled * S + scheme.momentum * Pb if scheme.nesterov else Pb
            Pn, B = G(new, step.new_buffer), G(d, step.new_buffer)
            out.append(("P' = aΓ(θ,b') − ηΓ(d,b')", Pn, a * Pb - eta * B))
        out.insert(0, ("S' = a²S − aη(X + Xᵀ) + η²Γ(d,d)", Sn, a * a * S - a * eta * (X + _adjoint(X)) + eta ** 2 * D))
        return out, broken
    assert step.previous is not None and step.y is not None
    if scheme.kind == "paper_newtonian":
        In, Ip = G(theta, new), G(step.previous, theta)
        out.append(("I_{k+1} = 2S_{k+1} − I_kᵀ", In, 2 * S - _adjoint(Ip)))
        return out, 0.0
    beta = step.beta
    In, Ip, R = G(theta, new), G(step.previous, theta), G(step.previous, step.g)
    predicted = (1 + beta) * S - beta * _adjoint(Ip) - eta * beta / (1 + beta) * R
    out.append(("I_{k+1} = (1+β)S − βI_kᵀ − ηβ/(1+β)Γ(w_{k−1}, g)", In, predicted))
    return out, 0.0


def check_scheme(symmetries: Sequence[Symmetry], losses: Callable[[int], Loss], params: Params, scheme: Scheme,
                 steps: int = 10, velocity: Params | None = None) -> list[CheckResult]:
    """Run ``scheme`` for ``steps`` steps and check its exact one-step identities (:class:`Scheme`) for every
    symmetry with an exact momentum map, at every step. The identities are exact, so the tolerance is rounding:
    ``4096 ε`` relative to the largest term (``9.1·10⁻¹³`` in float64). For Adam the detail gives the largest
    breaking term ``‖Γ(θ, u)‖/(‖θ‖‖u‖)``."""
    taken, _ = run_scheme(scheme, losses, params, steps, velocity)
    like = next(iter(params.values()))
    floor = 4096 * torch.finfo(like.dtype).eps
    exact = _exact_symmetries(symmetries)
    worst, broken, defect = [0.0] * len(exact), [0.0] * len(exact), [0.0] * len(exact)
    names: list[list[str]] = [[] for _ in exact]
    for step in taken:
        new = {k: step.a * step.theta[k] - scheme.lr * step.d[k] for k in step.theta}
        memo: dict[tuple[int, int], list[torch.Tensor]] = {}

        vectors = [step.theta, new, {k: scheme.lr * v for k, v in step.d.items()}, step.buffer, step.new_buffer,
                   step.previous]
        absolute = [{k: v.abs() for k, v in x.items()} for x in vectors if x is not None]   # ℓ(|x|) bounds ℓ(x)
        # ⟨B, ∇L⟩ = 0 holds up to the rounding of the whole backward pass, which scales with the largest gradient
        # entry of the model, not with the (possibly zero) gradient of the translated region: max|g| ℓ(1) bounds it
        largest = max(float(v.abs().max()) for v in step.g.values())
        absolute.append({k: torch.full_like(v, largest) for k, v in step.g.items()})
        paired = [x for x in (step.theta, new, step.d, step.g, step.buffer, step.new_buffer, step.previous) + (
            tuple(absolute) if any(s.group.kind == "T" for s in exact) else ()) if x is not None]

        def pairs(u: Params, w: Params) -> list[torch.Tensor]:
            """``Γ(u, w)`` projected, for every exact symmetry; the first request at ``u`` computes it with every
            vector of the step at once (one batched backward pass)."""
            if (id(u), id(w)) not in memo:
                batch = [x for x in paired if (id(u), id(x)) not in memo] + ([] if any(x is w for x in paired) else [w])
                for x, maps in zip(batch, momentum_maps_batched(exact, u, batch)):
                    memo[(id(u), id(x))] = [_project(s, m) for s, m in zip(exact, maps)]
            return memo[(id(u), id(w))]

        base = max(_norm(v) for v in vectors if v is not None) ** 2
        at = step.y if step.y is not None else step.theta
        size = _norm(at) * _norm(step.g)
        for i in range(len(exact)):
            defect[i] = max(defect[i], float(pairs(at, step.g)[i].abs().max()) / max(size, 1e-300))
            if exact[i].group.kind == "T":
                rows, breaking = _translation_step(scheme, lambda w: pairs(step.theta, w)[i], step, new)
                magnitudes = [pairs(step.theta, x)[i] for x in absolute]
                breaking /= max(float(m.abs().max()) for m in magnitudes) if breaking else 1.0
                broken[i] = max(broken[i], breaking)
                for name, actual, predicted in rows:
                    names[i].append(name)
                    scale = max(float(actual.abs().max()), float(predicted.abs().max()),
                                *(float(m.abs().max()) for m in magnitudes))
                    worst[i] = max(worst[i], _relative(actual - predicted, scale))
                continue
            rows, breaking = _one_step(scheme, lambda u, w: pairs(u, w)[i], step, new)
            broken[i] = max(broken[i], breaking)
            for name, actual, predicted in rows:
                names[i].append(name)
                scale = max(base, float(actual.abs().max()), float(predicted.abs().max()))
                worst[i] = max(worst[i], _relative(actual - predicted, scale))
    results = []
    for i, s in enumerate(exact):
        detail = f"{scheme.name}, {steps} steps: " + "; ".join(dict.fromkeys(names[i]))
        if scheme.kind == "adam":
            relative = "ℓ(|x|)" if s.group.kind == "T" else "‖θ‖‖u‖"
            detail += f"; Adam breaks Γ(θ, u) = 0 by up to {broken[i]:.2e} (relative to {relative})"
        tol = floor + 4 * min(defect[i], TOLERANCES.get(like.dtype, 1e-9))
        detail += f"; symmetry defect of the computed gradient δ = {defect[i]:.1e}"
        results.append(CheckResult("noether_scheme", s.label, worst[i], tol, detail))
    return results


# ---------------------------------------------------------------------------------------------
# data symmetries
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputRotation:
    """Rotations of the input, ``x ↦ Qx`` (``Q ∈ O(d)``), seen by a model that reads its input only through the
    first layer's weight ``W`` (``d_out × d``): ``W ↦ WQᵀ``, generators ``W ↦ WP`` with ``P`` antisymmetric, momentum
    map ``Γ(θ, v) = Wᵀ V`` (``d × d``).

    **Population loss.** If the joint law of ``(x, y)`` is invariant (``x ~ N(0, I)``, ``y`` a function of ``‖x‖``,
    ...), ``L(WQᵀ) = L(W)`` and the first-layer charge ``J = anti(Wᵀ Ẇ)`` obeys ``κ₂J̇ + κ₁J = 0``: conserved by
    Newtonian dynamics, ``e^{−γt}`` under heavy ball, ``(t₀/t)³`` along Nesterov's flow, and ``WᵀẆ`` symmetric along
    gradient flow (the paper's Table 5). **Finite dataset.** A sample is invariant under no rotation but the few that
    permute it (a finite group: no generator, no law); the relation becomes ``κ₂J̇ + κ₁J = −τ`` with the *torque*
    ``τ = anti(Wᵀ ∇_W L)`` (:meth:`torque`), of the order of the sampling error of the loss, ``O(1/√n)`` relative.
    """

    weight: str

    def momentum_map(self, params: Params, velocity: Params) -> torch.Tensor:
        W, V = params[self.weight], velocity[self.weight]
        if W.dim() != 2:
            raise SpecError(f"noether.InputRotation: {self.weight!r} must be a matrix (d_out × d), got shape "
                            f"{tuple(W.shape)}")
        return W.T @ V

    def charge(self, params: Params, velocity: Params) -> torch.Tensor:
        """``J = anti(Wᵀ V)``."""
        gamma = self.momentum_map(params, velocity)
        return (gamma - gamma.T) / 2

    def torque(self, params: Params, grads: Params) -> float:
        """``‖anti(Wᵀ∇_W L)‖ / (‖W‖ ‖∇_W L‖)``: 0 (to rounding) when the loss is invariant under input rotations."""
        tau = self.charge(params, grads)
        scale = float(params[self.weight].norm() * grads[self.weight].norm())
        return float(tau.norm()) / max(scale, 1e-300)

    def law(self, dyn: Dynamics) -> tuple[str, str]:
        """``(status, LaTeX)`` of the first-layer law under ``dyn`` for an invariant population."""
        if dyn.first_order:
            return "restriction", r"W^{T}\dot W = \dot W^{T} W"
        phi = dyn.factor
        status = "conserved" if phi == 1 else dyn.kind
        charge = r"\operatorname{anti}(W^{T}\dot W)"
        return status, rf"{charge}(t) = {sp.latex(phi)}\,{charge}(t_0)"
