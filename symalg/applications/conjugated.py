"""Conjugated actions ``g·x = h⁻¹(ρ(g) h(x))``: symmetries of a loss that is linear-invariant in new coordinates.

Math
----
Let ``h: R^n → R^n`` be a bijection with inverse ``h⁻¹`` and ``ρ`` a linear representation of a group ``G``
with ``F(ρ(g) y) = F(y)``. Then ``f = F∘h`` is invariant under ``g·x = h⁻¹(ρ(g) h(x))``:

    f(g·x) = F(h(h⁻¹(ρ(g) h(x)))) = F(ρ(g) h(x)) = f(x),

and it is a group action because ``h∘h⁻¹ = id``: ``e·x = h⁻¹(h(x)) = x`` and
``g₁·(g₂·x) = h⁻¹(ρ(g₁) h(h⁻¹(ρ(g₂) h(x)))) = (g₁g₂)·x``. Where ``h`` is not onto, ``ρ(g) h(x)`` can leave
its image and ``g·x`` is undefined (:meth:`ConjugatedAction.apply` raises). The Lie algebra acts by the
vector field ``X_M(x) = d/dt|₀ exp(tM)·x = Dh⁻¹(h(x)) M h(x)``, and since ``∇f(x) = Dh(x)ᵀ ∇F(h(x))``,
``⟨∇f(x), X_M(x)⟩ = ⟨∇F(y), M y⟩ = 0``. Orbits are images of linear orbits: ``G·x = h⁻¹(ρ(G) h(x))``.
For ``F(y) = φ(‖y‖²)`` with ``φ`` injective and ``ρ = O(n)``, the level set ``{f = c}`` is
``h⁻¹(sphere of radius φ⁻¹(c)^{1/2})``, one orbit: **transitive** (already for ``SO(n)`` when ``n ≥ 2``;
``O(1) = {±1}`` for ``n = 1``). Not transitive: a subgroup with an extra invariant (``O(n)_1`` keeps
``1ᵀh(x)``), a non-injective ``φ`` (``(‖y‖² − 1)²``: a level set is two spheres, two orbits), and an ``h``
that is not onto (no group action at all).

The test functions, all ``f = ‖h(x)‖²`` with ``ρ = O(n)``:

=====================  ==================================  =========================================
function               h(x)                                h⁻¹(y)
=====================  ==================================  =========================================
quadratic form         ``Lᵀ(x − c)``, ``A = L Lᵀ ≻ 0``     ``c + L⁻ᵀ y``
ellipse (a > 0)        ``(x₁, √a x₂)``                     ``(y₁, y₂/√a)``
Rosenbrock             ``(1 − x₁, 10(x₂ − x₁²))``          ``(1 − y₁, (1 − y₁)² + y₂/10)``
Booth                  ``(x₁ + 2x₂ − 7, 2x₁ + x₂ − 5)``    ``((2y₂ − y₁)/3 + 1, (2y₁ − y₂)/3 + 3)``
=====================  ==================================  =========================================

(``(x − c)ᵀA(x − c) = ‖Lᵀ(x − c)‖²``; the symmetric root ``A^{1/2} = O Lᵀ`` with ``O`` orthogonal gives the
same set of maps.) For a diagonal quadratic form, gradient flow also conserves ``λ_j log (x_i − c_i)² −
λ_i log (x_j − c_j)²`` (``ẋ_i = −2λ_i(x_i − c_i)``); for the ellipse this is ``log(x₁^{2a}/x₂²)``, the
logarithm of [Zhao2026]'s eq. (2.21).

API (also what teleportation uses)
----------------------------------
``ConjugatedAction(h, h_inverse, group, loss=None, name=...)``
    ``apply(x, g)`` (``x`` of shape ``(..., n)``, ``g`` a group element), ``exp(coords)`` (the element
    ``exp(Σ cᵢ Bᵢ)`` for coordinates on ``group.algebra_basis()``, by :func:`matrix_exp`, exact to rounding),
    ``act(x, coords) = apply(x, exp(coords))`` (differentiable in ``coords``), ``vector_field(x, M)``,
    ``connect(x1, x2)`` (an element with ``g·x1 = x2`` where one exists), ``verify(points, center=...)``.
``TestFunction`` (SymPy definitions; ``.loss`` and ``.action`` are torch callables lowered from them):
    :func:`quadratic_form`, :func:`ellipse`, :func:`rosenbrock`, :func:`booth`; ``.derivation()`` (SymPy
    identities, each 0), ``.verify()``.

:func:`sample_level_set`, :func:`check_transitivity`.

Example
-------
>>> import torch
>>> fn = rosenbrock()
>>> x = torch.tensor([[-1.0, 2.0]], dtype=torch.float64)
>>> moved = fn.action.act(x, torch.tensor([0.7], dtype=torch.float64))   # exp(0.7 (E₁₂ − E₂₁)) · x
>>> bool(torch.allclose(fn.loss(moved), fn.loss(x), rtol=1e-12))
True
>>> fn.verify().passed
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Sequence

import sympy as sp
import torch

from symalg.frontend.grammar import refuse_text
from symalg.catalogue.groups import Orthogonal, SiteGroup, matrix_exp
from symalg.lowering.codegen import compile_function, identifier, torch_source
from symalg.numeric.linalg import relative_error
from symalg.verification.checks import MAX_GENERATORS, CheckResult, VerificationReport, rk4

__all__ = ["ConjugatedAction", "TestFunction", "ComponentFunction", "lower_components",
           "check_group_axioms", "quadratic_form", "ellipse", "rosenbrock", "booth", "sample_level_set",
           "check_transitivity", "TOLERANCE"]

TOLERANCE = 1e-10
"""Relative tolerance of every check here (float64)."""

TEST_SCALES = (1e-3, 2.0)
"""``‖M‖`` of the elements ``exp(M)`` the checks move points by: near and far from the identity."""


# -- lowering of component-wise SymPy functions -------------------------------------------------------------
@dataclass(frozen=True)
class ComponentFunction:
    """A torch function ``x (..., n) ↦ (..., k)`` (or ``(...)`` for one scalar) compiled from SymPy scalars.

    ``source`` is the printed code (symalg's torch printer, :func:`symalg.lowering.codegen.torch_source`).
    """

    name: str
    source: str
    fn: Callable[[torch.Tensor], torch.Tensor] = field(repr=False)
    n_inputs: int = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.n_inputs:
            raise ValueError(f"{self.name}: x must be a tensor of shape (..., {self.n_inputs}), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        return self.fn(x)


def lower_components(name: str, exprs: Sequence[sp.Expr] | sp.Expr, symbols: Sequence[sp.Symbol]) -> ComponentFunction:
    """Compile scalar SymPy expressions in ``symbols`` to a batched torch function of ``x = (..., n)``.

    ``lower`` (:mod:`symalg.lowering`) compiles matrix expressions of parameter tensors; this compiles
    coordinate formulas ``x ↦ (e₁(x), …, e_k(x))`` with the same printer. A single expression gives a
    function returning ``(...)``.

    >>> x1, x2 = sp.symbols("x1 x2")
    >>> f = lower_components("h", [1 - x1, 10 * (x2 - x1**2)], [x1, x2])
    >>> print(f.source.splitlines()[-1])
        return torch.stack(torch.broadcast_tensors(1 - x1, -10*torch.pow(x1, 2) + 10*x2), dim=-1)
    >>> f(torch.tensor([[2.0, 1.0]], dtype=torch.float64)).tolist()
    [[-1.0, -30.0]]
    """
    scalar = isinstance(exprs, sp.Expr)
    exprs = [exprs] if scalar else list(exprs)
    stray = sorted(str(s) for e in exprs for s in sp.sympify(e).free_symbols - set(symbols))
    if stray:
        raise ValueError(f"lower_components({name}): expressions use {stray}, which are not among the inputs "
                         f"{[str(s) for s in symbols]}")
    lines = [f"def {identifier(name)}(x):"]
    lines += [f"    {identifier(s.name)} = x[..., {i}]" for i, s in enumerate(symbols)]
    # constants (a component without x) broadcast against the inputs' batch shape, dtype and device
    printed = [torch_source(e) if sp.sympify(e).free_symbols else f"torch.full_like(x[..., 0], {float(e)!r})"
               for e in exprs]
    lines.append(f"    return {printed[0]}" if scalar else
                 f"    return torch.stack(torch.broadcast_tensors({', '.join(printed)}), dim=-1)")
    source = "\n".join(lines)
    return ComponentFunction(name, source, compile_function(identifier(name), source), len(symbols))


# -- the action ---------------------------------------------------------------------------------------------
def _matvec(matrix: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
    return (matrix @ vectors.unsqueeze(-1)).squeeze(-1)


def _relative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise relative error, absolute below norm 1."""
    return relative_error(a, b, dim=-1, floor=1.0)


@dataclass(frozen=True, eq=False)
class ConjugatedAction:
    """The action ``g·x = h⁻¹(ρ(g) h(x))`` of a matrix group on ``R^n`` (see the module docstring).

    Parameters
    ----------
    h, h_inverse : torch callables ``(..., n) → (..., n)``, row-wise, with ``h_inverse∘h = id``.
    group : a matrix group from :mod:`symalg.catalogue.groups` acting by its defining representation
        (``ρ(g) = g``, e.g. :class:`~symalg.catalogue.groups.Orthogonal`).
    loss : the invariant function ``f(x)`` (``(..., n) → (...)``), used by the checks.
    name : shown in errors and reports.

    Examples
    --------
    >>> act = ConjugatedAction(lambda x: 2 * x, lambda y: y / 2, Orthogonal(2), name="scaled")
    >>> g = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    >>> act.apply(torch.tensor([1.0, 0.0], dtype=torch.float64), g).tolist()
    [0.0, 1.0]
    """

    h: Callable[[torch.Tensor], torch.Tensor]
    h_inverse: Callable[[torch.Tensor], torch.Tensor]
    group: SiteGroup
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None
    name: str = "conjugated action"

    def __post_init__(self) -> None:
        if not isinstance(self.group, SiteGroup) or self.group.element_format != "matrix":
            raise ValueError(f"{self.name}: group must be a matrix group from symalg.catalogue.groups, "
                             f"got {self.group!r}")
        if type(self.group).rep is not SiteGroup.rep or self.group.shift(torch.eye(self.dim)) is not None:
            raise ValueError(f"{self.name}: group {self.group.name} does not act by its defining representation "
                             "ρ(g) = g; conjugated actions need a linear ρ")

    @property
    def dim(self) -> int:
        return int(sp.sympify(self.group.width))

    def _check_points(self, x: torch.Tensor, what: str = "x") -> None:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(f"{self.name}: {what} must be a tensor of shape (..., {self.dim}), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")

    def _move(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``h⁻¹(g h(x))`` without any check (the verification measures what the checks would refuse)."""
        return self.h_inverse(_matvec(g, self.h(x)))

    def apply(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``g·x = h⁻¹(ρ(g) h(x))`` for points ``x`` of shape ``(..., n)`` and a group element ``g``.

        Raises ``ValueError`` when ``g`` is not in the group, or when ``ρ(g) h(x)`` is outside the image of
        ``h`` (``h⁻¹`` gives a non-finite point or ``h(h⁻¹(y)) ≠ y``): there ``g·x`` is undefined.
        """
        self._check_points(x)
        self.group.check_element(g)
        y = _matvec(g, self.h(x))
        moved = self.h_inverse(y)
        with torch.no_grad():
            bad = ~torch.isfinite(moved).all(-1) | (_relative(self.h(moved), y) > 1e3 * TOLERANCE)
        if bad.any():
            index = tuple(bad.nonzero()[0].tolist())
            raise ValueError(f"{self.name}: ρ(g) h(x) = {y[index].tolist()} (for x = {x[index].tolist()}) is outside "
                             f"the image of h; h⁻¹ gives {moved[index].tolist()}, so g·x is undefined there (h must be "
                             "a bijection onto a ρ-invariant set)")
        return moved

    def exp(self, coords: torch.Tensor) -> torch.Tensor:
        """The group element ``exp(Σ cᵢ Bᵢ)``, ``Bᵢ = group.algebra_basis()`` (batched over leading dims of
        ``coords``)."""
        if coords.shape[-1:] != (int(self.group.dim),):
            raise ValueError(f"{self.name}: coords must have shape (..., {int(self.group.dim)}) (one per generator of "
                             f"{self.group.name}), got {tuple(coords.shape)}")
        return matrix_exp(self.group.algebra_element(coords))

    def act(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """``exp(Σ cᵢ Bᵢ)·x``: the move teleportation optimises over (differentiable in ``coords``)."""
        return self.apply(x, self.exp(coords))

    def vector_field(self, x: torch.Tensor, M: torch.Tensor) -> torch.Tensor:
        """``X_M(x) = Dh⁻¹(h(x)) M h(x)`` (directional derivative of ``h⁻¹``); ``M`` in the Lie algebra."""
        self._check_points(x)
        self.group.check_algebra_element(M)
        y = self.h(x)
        # reverse-mode double-backward jvp: torch's forward-mode AD loads jit-scripted decompositions (warnings)
        return torch.autograd.functional.jvp(self.h_inverse, y, _matvec(M, y))[1]

    def connect(self, x1: torch.Tensor, x2: torch.Tensor, restarts: int = 4, steps: int = 100,
                generator: torch.Generator | None = None) -> torch.Tensor:
        """A group element ``g`` with ``g·x1 = x2`` for single points, when the orbit of ``x1`` contains ``x2``.

        For ``O(n)``: the rotation in the plane of ``y₁ = h(x1)``, ``y₂ = h(x2)`` (exactly ``exp(φK)``, ``K`` the
        unit generator of that plane; the reflection for ``n = 1``). Other groups: Levenberg–Marquardt on
        ``‖g y₁ − y₂‖`` over the identity component, from the identity and random starts. When no element
        exists the result is the best found; :func:`check_transitivity` measures the miss.
        """
        self._check_points(x1, "x1")
        self._check_points(x2, "x2")
        if x1.dim() != 1 or x2.dim() != 1:
            raise ValueError(f"{self.name}: connect takes single points of shape ({self.dim},)")
        y1, y2 = self.h(x1), self.h(x2)
        closed_form = self.group.element_between(y1, y2)
        return closed_form if closed_form is not None else self._solve(y1, y2, restarts, steps, generator)

    def _solve(self, y1: torch.Tensor, y2: torch.Tensor, restarts: int, steps: int,
               generator: torch.Generator | None) -> torch.Tensor:
        """Levenberg–Marquardt on the group: ``g ← exp(Σ δᵢ Bᵢ) g`` with the exact Jacobian ``[Bᵢ g y₁]`` at
        ``δ = 0``."""
        basis = self.group.algebra_basis(y1.dtype, y1.device)
        eye = torch.eye(self.dim, dtype=y1.dtype, device=y1.device)
        if basis.shape[0] == 0:
            return eye
        done = 1e-15 * max(y2.norm().item(), 1.0)
        best, best_norm = eye, (y1 - y2).norm().item()
        for start in range(restarts):
            g = eye if start == 0 else matrix_exp(
                self.group.random_algebra_element(math.pi, generator, y1.dtype, y1.device))
            damping = 1e-3
            for _ in range(steps):
                z = g @ y1
                r = z - y2
                if r.norm() <= done:
                    break
                J = (basis @ z).T  # column i: Bᵢ g y₁
                eye_d = torch.eye(len(basis), dtype=z.dtype, device=z.device)
                delta = torch.linalg.solve(J.T @ J + damping * eye_d, J.T @ r)
                trial = matrix_exp(torch.tensordot(-delta, basis, dims=1)) @ g
                improvement = r.norm() - (trial @ y1 - y2).norm()
                if improvement > 0:
                    g, damping = trial, damping / 3
                else:
                    damping *= 10
                if damping > 1e8 or 0 < improvement <= 1e-13 * r.norm():
                    break  # stalled at a local minimum of the distance
            if (g @ y1 - y2).norm().item() < best_norm:
                best, best_norm = g, (g @ y1 - y2).norm().item()
            if best_norm <= done:
                break
        return best

    def verify(self, points: torch.Tensor, center: torch.Tensor | None = None, pairs: int = 20, seed: int = 0,
               tolerance: float = TOLERANCE) -> VerificationReport:
        """Check the action at ``points`` (``(batch, n)``) and return a report (never asserting).

        ``group_axioms``: ``e·x = x``, ``g₁·(g₂·x) = (g₁g₂)·x``, ``g⁻¹·(g·x) = x``; ``invariance``:
        ``|f(g·x) − f(x)| / max(|f(x)|, 1)`` for the test elements of the group
        (:meth:`~symalg.catalogue.groups.SiteGroup.sample` with ``‖M‖`` = :data:`TEST_SCALES`);
        ``gradient_orthogonality``: ``⟨∇f, X_M⟩ / (‖∇f‖ ‖X_M‖)`` per algebra basis element;
        ``transitivity`` (when ``center``, a point below every level, is given): :func:`check_transitivity`.
        """
        self._check_points(points, "points")
        generator = torch.Generator().manual_seed(seed)
        dtype, device = points.dtype, points.device
        elements = self.group.sample(generator, dtype, device, TEST_SCALES) or \
            [("identity", self.group.identity(dtype, device))]
        checks = [check_group_axioms(self.name, self._move, points, elements[-1][1], elements[0][1],
                                     lambda a, b: _relative(a, b).max().item(), tolerance)]
        if self.loss is not None:
            checks.append(self._check_invariance(self.loss, points, elements, tolerance))
            if self.group.is_continuous:
                checks.append(self._check_gradient_orthogonality(self.loss, points, tolerance, generator))
            if center is not None:
                checks.append(check_transitivity(self, center, pairs=pairs, generator=generator, tolerance=tolerance))
        return VerificationReport(tuple(checks), dtype, str(device))

    def _check_invariance(self, loss: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                          elements: Sequence[tuple[str, torch.Tensor]], tol: float) -> CheckResult:
        reference = loss(x)
        worst, where = 0.0, ""
        for label, g in elements:
            error = ((loss(self._move(x, g)) - reference).abs() / reference.abs().clamp_min(1.0)).max().item()
            if not error < worst:
                worst, where = error, label
        return CheckResult("invariance", self.name, worst, tol,
                           f"|Δf| / max(|f|, 1) on {len(x)} points, worst: {where}")

    def _check_gradient_orthogonality(self, loss: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                                      tol: float, generator: torch.Generator) -> CheckResult:
        leaf = x.detach().clone().requires_grad_(True)
        grad = torch.autograd.grad(loss(leaf).sum(), leaf)[0]
        basis = self.group.algebra_sample(MAX_GENERATORS, generator, x.dtype, x.device)
        worst = 0.0
        for M in basis:
            field_ = self.vector_field(x, M)
            cosine = (grad * field_).sum(-1).abs() / (grad.norm(dim=-1) * field_.norm(dim=-1)).clamp_min(1e-300)
            worst = max(worst, cosine.max().item())
        return CheckResult("gradient_orthogonality", self.name, worst, tol,
                           f"|⟨∇f, X_M⟩| / (‖∇f‖ ‖X_M‖), {len(basis)} generators, {len(x)} points")


def check_group_axioms(name: str, move: Callable[[Any, torch.Tensor], Any], x: Any, g1: torch.Tensor,
                       g2: torch.Tensor, distance: Callable[[Any, Any], float],
                       tolerance: float = TOLERANCE) -> CheckResult:
    """``e·x = x``, ``g₁·(g₂·x) = (g₁g₂)·x`` and ``g₁⁻¹·(g₁·x) = x`` for an action ``move(x, g)``, each measured by
    ``distance(a, b)`` (a float, relative to ``b``); the result is the worst of the three."""
    eye = torch.eye(g1.shape[-1], dtype=g1.dtype, device=g1.device)
    errors = {"identity": distance(move(x, eye), x),
              "composition": distance(move(move(x, g2), g1), move(x, g1 @ g2)),
              "inverse": distance(move(move(x, g1), torch.linalg.inv(g1)), x)}
    worst = max(errors, key=errors.__getitem__)
    return CheckResult("group_axioms", name, errors[worst], tolerance,
                       ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))


# -- level sets and transitivity ----------------------------------------------------------------------------
def sample_level_set(loss: Callable[[torch.Tensor], torch.Tensor], origin: torch.Tensor, level: torch.Tensor,
                     directions: torch.Tensor, iterations: int = 200) -> torch.Tensor:
    """Points ``origin + t·d`` with ``loss = level``, one per row of ``directions``, by bisection in ``t > 0``.

    Independent of any coordinate map: ``t`` is bracketed by doubling until ``loss − level`` changes sign
    (``loss(origin)`` must lie on the other side of ``level``), then bisected to rounding. ``level`` is a
    scalar or one value per direction.

    >>> f = lambda x: (x ** 2).sum(-1)
    >>> p = sample_level_set(f, torch.zeros(2, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64),
    ...                      torch.tensor([[3.0, 4.0]], dtype=torch.float64))
    >>> [round(v, 12) for v in p[0].tolist()]
    [1.2, 1.6]
    """
    if directions.dim() != 2 or directions.shape[-1] != origin.shape[-1]:
        raise ValueError(f"sample_level_set: directions must have shape (k, {origin.shape[-1]}), "
                         f"got {tuple(directions.shape)}")
    level = torch.as_tensor(level, dtype=directions.dtype, device=directions.device).expand(len(directions))
    start = torch.sign(loss(origin) - level)
    if (start == 0).any():
        raise ValueError("sample_level_set: the origin lies on the level set; pick an origin off it")
    low = torch.zeros(len(directions), dtype=directions.dtype, device=directions.device)
    high = torch.ones_like(low)
    for _ in range(100):
        unbracketed = torch.sign(loss(origin + high[:, None] * directions) - level) == start
        if not unbracketed.any():
            break
        low = torch.where(unbracketed, high, low)
        high = torch.where(unbracketed, 2 * high, high)
    else:
        raise ValueError("sample_level_set: no crossing of the level within t < 2^100 along some direction")
    for _ in range(iterations):
        middle = (low + high) / 2
        same = torch.sign(loss(origin + middle[:, None] * directions) - level) == start
        low, high = torch.where(same, middle, low), torch.where(same, high, middle)
    return origin + ((low + high) / 2)[:, None] * directions


def check_transitivity(action: ConjugatedAction, center: torch.Tensor, pairs: int = 20, scale: float = 1.0,
                       generator: torch.Generator | None = None, tolerance: float = TOLERANCE) -> CheckResult:
    """For random ``x₁ = center + scale·N(0, I)`` and ``x₂`` on the level set of ``x₁`` (found by
    :func:`sample_level_set` along a random ray from ``center``, without using ``h``), find ``g`` with
    ``g·x₁ = x₂`` (:meth:`ConjugatedAction.connect`) and report ``max ‖g·x₁ − x₂‖ / max(‖x₂‖, 1)``.

    ``center`` must be below every sampled level (a minimiser). The check passes exactly when the group
    is transitive on those level sets; a failure means some ``x₂`` lies on another orbit.
    """
    if action.loss is None:
        raise ValueError(f"{action.name}: check_transitivity needs the action's loss")
    dtype, device = center.dtype, center.device
    x1 = center + scale * torch.randn(pairs, action.dim, generator=generator, dtype=dtype).to(device)
    directions = torch.randn(pairs, action.dim, generator=generator, dtype=dtype).to(device)
    x2 = sample_level_set(action.loss, center, action.loss(x1), directions)
    errors = torch.stack([_relative(action._move(a, action.connect(a, b, generator=generator)), b)
                          for a, b in zip(x1, x2)])
    return CheckResult("transitivity", action.name, errors.max().item(), tolerance,
                       f"{pairs} pairs on common level sets (x₂ by bisection along rays), max ‖g·x₁ − x₂‖")


# -- test functions -----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class TestFunction:
    """A loss ``f(x) = F(h(x))`` with ``F(y) = ‖y‖²``, defined in SymPy, and its conjugated ``O(n)`` action.

    ``h`` (in ``x``) and ``h_inverse`` (in ``y``) are ``sp.Matrix`` columns; ``loss_expr`` is ``f`` as
    usually written. ``center`` is the minimiser (``h(center) = 0``). ``flow_invariants`` are optional
    SymPy functions conserved by gradient flow ``ẋ = −∇f``.
    """

    __test__ = False  # not a pytest class despite its name

    name: str
    x: tuple[sp.Symbol, ...]
    y: tuple[sp.Symbol, ...]
    h: sp.Matrix
    h_inverse: sp.Matrix
    loss_expr: sp.Expr
    center: tuple
    flow_invariants: tuple[sp.Expr, ...] = ()

    @property
    def n(self) -> int:
        return len(self.x)

    @property
    def group(self) -> Orthogonal:
        return Orthogonal(self.n)

    @cached_property
    def loss(self) -> ComponentFunction:
        """``f`` as a torch callable ``(..., n) → (...)`` lowered from :attr:`loss_expr`."""
        return lower_components(f"{self.name}_loss", self.loss_expr, self.x)

    @cached_property
    def action(self) -> ConjugatedAction:
        """The conjugated action with lowered ``h``, ``h⁻¹`` and :attr:`loss`."""
        return ConjugatedAction(lower_components(f"{self.name}_h", list(self.h), self.x),
                                lower_components(f"{self.name}_h_inverse", list(self.h_inverse), self.y),
                                self.group, self.loss, self.name)

    def center_tensor(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor([float(c) for c in self.center], dtype=dtype, device=device)

    def vector_field_expr(self, M: sp.Matrix) -> sp.Matrix:
        """``X_M(x) = Dh(x)⁻¹ M h(x)`` in SymPy."""
        return sp.simplify(self.h.jacobian(self.x).inv() * sp.Matrix(M) * self.h)

    def derivation(self) -> dict[str, sp.Expr]:
        """SymPy identities that make this a symmetry, each simplified to ``0`` (or a zero matrix):

        ``h⁻¹∘h − id``, ``h∘h⁻¹ − id``, ``f − ‖h‖²``, ``f(g·x) − f(x)`` for a general rotation ``g`` (Cayley
        parametrisation ``(I − K)(I + K)⁻¹``, ``K`` antisymmetric with free entries) and for the reflection
        ``diag(−1, 1, …)``, ``⟨∇f, X_M⟩`` for the generator ``M = E₁₂ − E₂₁`` (``n ≥ 2``), and
        ``⟨∇q, ∇f⟩`` for each flow invariant ``q``.
        """
        x, y, n = sp.Matrix(self.x), sp.Matrix(self.y), self.n
        results = {"h^-1(h(x)) - x": sp.simplify(self.h_inverse.xreplace(dict(zip(self.y, self.h))) - x),
                   "h(h^-1(y)) - y": sp.simplify(self.h.xreplace(dict(zip(self.x, self.h_inverse))) - y),
                   "f - |h|^2": sp.expand(self.loss_expr - (self.h.T * self.h)[0, 0])}
        k = sp.symbols(f"k1:{n * (n - 1) // 2 + 1}")
        K = sp.zeros(n, n)
        for (i, j), kij in zip(((i, j) for i in range(n) for j in range(i + 1, n)), k):
            K[i, j], K[j, i] = kij, -kij
        rotation = (sp.eye(n) - K) * (sp.eye(n) + K).inv()
        reflection = sp.diag(-1, *([1] * (n - 1)))
        for label, g in (("rotation", rotation), ("reflection", reflection)):
            moved = self.h_inverse.xreplace(dict(zip(self.y, g * self.h)))
            results[f"f(g.x) - f(x), g = {label}"] = sp.cancel(sp.together(
                self.loss_expr.xreplace(dict(zip(self.x, moved))) - self.loss_expr))
        gradient = sp.Matrix([sp.diff(self.loss_expr, v) for v in self.x])
        if n >= 2:
            M = sp.zeros(n, n)
            M[0, 1], M[1, 0] = 1, -1
            results["<grad f, X_M>"] = sp.simplify((gradient.T * self.vector_field_expr(M))[0, 0])
        for i, q in enumerate(self.flow_invariants):
            results[f"<grad q{i}, grad f>"] = sp.simplify(sum(sp.diff(q, v) * g for v, g in zip(self.x, gradient)))
        return results

    def verify(self, points: int = 64, scale: float = 1.0, seed: int = 0, dtype: torch.dtype = torch.float64,
               device: torch.device | str = "cpu",
               symbolic: bool = True, tolerance: float = TOLERANCE) -> VerificationReport:
        """:meth:`ConjugatedAction.verify` at ``center + scale·N(0, I)`` points, plus ``symbolic`` (every
        :meth:`derivation` identity is 0), ``lowering`` (lowered ``h``, ``h⁻¹``, ``f`` and ``X_M`` against
        SymPy's values) and ``flow_invariants`` (constant along RK4 gradient flow)."""
        generator = torch.Generator().manual_seed(seed)
        center = self.center_tensor(dtype, device)
        x = center + scale * torch.randn(points, self.n, generator=generator, dtype=dtype).to(device)
        report = self.action.verify(x, center=center, seed=seed, tolerance=tolerance)
        checks = list(report.checks)
        if symbolic:
            nonzero = [k for k, v in self.derivation().items() if not _is_zero(v)]
            detail = f"nonzero identities: {nonzero}" if nonzero else "all derivation identities are 0"
            checks.append(CheckResult("symbolic", self.name, float(len(nonzero)), 0.0, detail))
        checks.append(self._check_lowering(x[:4], tolerance))
        if self.flow_invariants:
            checks.append(self._check_flow_invariants(x, tolerance))
        return VerificationReport(tuple(checks), dtype, str(device))

    def _check_lowering(self, x: torch.Tensor, tol: float) -> CheckResult:
        M = sp.zeros(self.n, self.n)
        if self.n >= 2:
            M[0, 1], M[1, 0] = -1, 1
        field_ = self.vector_field_expr(M) if self.n >= 2 else None
        worst = 0.0
        for point in x:
            values = dict(zip(self.x, point.tolist()))
            y = self.action.h(point)
            exact = {"h": self.h.evalf(subs=values), "f": sp.Matrix([self.loss_expr.evalf(subs=values)]),
                     "h_inverse": self.h_inverse.evalf(subs=dict(zip(self.y, y.tolist())))}
            lowered = {"h": y, "f": self.loss(point).reshape(1), "h_inverse": self.action.h_inverse(y)}
            if field_ is not None:
                exact["X_M"] = field_.evalf(subs=values)
                lowered["X_M"] = self.action.vector_field(point,
                                                          torch.tensor(M.tolist(), dtype=x.dtype, device=x.device))
            for key, value in exact.items():
                reference = torch.tensor([float(v) for v in value], dtype=x.dtype)
                worst = max(worst, _relative(lowered[key].detach().cpu(), reference).item())
        return CheckResult("lowering", self.name, worst, tol, "h, h⁻¹, f, X_M (torch) vs SymPy at 4 points")

    def _check_flow_invariants(self, x: torch.Tensor, tol: float, steps: int = 400, dt: float = 2.5e-4) -> CheckResult:
        invariants = lower_components(f"{self.name}_invariants", list(self.flow_invariants), self.x)

        def field_(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            leaf = state["x"].detach().clone().requires_grad_(True)
            return {"x": -torch.autograd.grad(self.loss(leaf).sum(), leaf)[0]}

        end = rk4(field_, {"x": x}, dt, steps)["x"]
        before, after = invariants(x), invariants(end)
        error = ((after - before).abs() / before.abs().clamp_min(1.0)).max().item()
        moved = _relative(end, x).max().item()
        return CheckResult("flow_invariants", self.name, error, tol,
                           f"{len(self.flow_invariants)} invariants along RK4 gradient flow, dt={dt}, {steps} steps, "
                           f"x moved up to {moved:.1e}")


def _is_zero(expr: sp.Basic) -> bool:
    if isinstance(expr, sp.MatrixBase):
        return all(sp.simplify(e) == 0 for e in expr)
    return sp.simplify(expr) == 0


def _rational_matrix(values: Any) -> sp.Matrix:
    refuse_text(values, "matrix entries")
    matrix = sp.Matrix(values)
    return matrix.applyfunc(lambda v: sp.nsimplify(v, rational=True) if v.is_Float else v)


def quadratic_form(A: Any, center: Sequence[Any] | None = None, name: str = "quadratic_form") -> TestFunction:
    """``f(x) = (x − c)ᵀ A (x − c)`` for symmetric positive-definite ``A``: ``h(x) = Lᵀ(x − c)`` with the
    Cholesky factor ``A = L Lᵀ`` (exact SymPy arithmetic; floats are made rational).

    For diagonal ``A = diag(λ)`` the flow invariants ``λ_j log (x_i − c_i)² − λ_i log (x_j − c_j)²`` are attached.

    >>> quadratic_form([[2, 1], [1, 2]]).h.T
    Matrix([[sqrt(2)*x1 + sqrt(2)*x2/2, sqrt(6)*x2/2]])
    """
    A = _rational_matrix(A)
    n = A.rows
    if A.shape != (n, n) or A != A.T:
        raise ValueError(f"quadratic_form: A must be a symmetric square matrix, got {A.tolist()}")
    if not all(minor > 0 for minor in (A[:k, :k].det() for k in range(1, n + 1))):
        raise ValueError(f"quadratic_form: A must be positive definite (h = Lᵀ(x − c) needs a Cholesky factor), "
                         f"got {A.tolist()}")
    c = _rational_matrix(center if center is not None else [0] * n)
    if c.shape != (n, 1):
        raise ValueError(f"quadratic_form: center must have {n} entries, got {c.tolist()}")
    x, y = sp.symbols(f"x1:{n + 1}"), sp.symbols(f"y1:{n + 1}")
    L = A.cholesky(hermitian=False)
    shifted = sp.Matrix(x) - c
    invariants = ()
    if A.is_diagonal():
        lam = [A[i, i] for i in range(n)]
        invariants = tuple(lam[j] * sp.log(shifted[i] ** 2) - lam[i] * sp.log(shifted[j] ** 2)
                           for i in range(n) for j in range(i + 1, n))
    return TestFunction(name, x, y, sp.expand(L.T * shifted), sp.expand(c + L.T.inv() * sp.Matrix(y)),
                        sp.expand((shifted.T * A * shifted)[0, 0]), tuple(c), invariants)


def ellipse(a: float | sp.Expr = 4) -> TestFunction:
    """The ellipse ``f(x) = x₁² + a x₂²``, ``a > 0``: ``h(x) = (x₁, √a x₂)`` (dissertation eq. C.2) and the flow
    invariant ``a log x₁² − log x₂² = log(x₁^{2a}/x₂²)`` (eq. 2.21). ``a = 0`` (two lines) has no such ``h``.

    >>> ellipse(4).h.T
    Matrix([[x1, 2*x2]])
    """
    refuse_text(a, "ellipse: a")
    if not sp.sympify(a).is_positive:
        raise ValueError(f"ellipse: a must be positive (a = {a} makes h = (x₁, √a x₂) non-invertible)")
    return quadratic_form(sp.diag(1, a), name="ellipse")


def rosenbrock(pairs: int = 1) -> TestFunction:
    """Rosenbrock's ``f = Σᵢ (1 − x_{2i−1})² + 100(x_{2i} − x_{2i−1}²)²`` over ``pairs`` independent pairs:
    ``h = (1 − x₁, 10(x₂ − x₁²), …)``, ``h⁻¹(y) = (1 − y₁, (1 − y₁)² + y₂/10, …)``, ``ρ = O(2·pairs)``.

    (The chained ``n``-variable Rosenbrock ``Σᵢ (1 − xᵢ)² + 100(x_{i+1} − xᵢ²)²`` is a sum of ``2(n − 1) > n``
    squares for ``n ≥ 3``: its map to ``R^{2(n−1)}`` is not onto, so this construction does not apply.)
    """
    if not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"rosenbrock: pairs must be a positive integer, got {pairs!r}")
    x, y = sp.symbols(f"x1:{2 * pairs + 1}"), sp.symbols(f"y1:{2 * pairs + 1}")
    h, inverse, loss = [], [], 0
    for i in range(pairs):
        a, b, u, v = x[2 * i], x[2 * i + 1], y[2 * i], y[2 * i + 1]
        h += [1 - a, 10 * (b - a ** 2)]
        inverse += [1 - u, (1 - u) ** 2 + v / 10]
        loss += (1 - a) ** 2 + 100 * (b - a ** 2) ** 2
    return TestFunction("rosenbrock" if pairs == 1 else f"rosenbrock{2 * pairs}", x, y, sp.Matrix(h),
                        sp.Matrix(inverse), loss, (1,) * (2 * pairs))


def booth() -> TestFunction:
    """Booth's ``f = (x₁ + 2x₂ − 7)² + (2x₁ + x₂ − 5)²``: affine ``h``, minimum ``0`` at ``(1, 3)``."""
    x1, x2 = x = sp.symbols("x1 x2")
    y1, y2 = y = sp.symbols("y1 y2")
    h = sp.Matrix([x1 + 2 * x2 - 7, 2 * x1 + x2 - 5])
    inverse = sp.Matrix([(2 * y2 - y1) / 3 + 1, (2 * y1 - y2) / 3 + 3])
    return TestFunction("booth", x, y, h, inverse, (x1 + 2 * x2 - 7) ** 2 + (2 * x1 + x2 - 5) ** 2, (1, 3))
