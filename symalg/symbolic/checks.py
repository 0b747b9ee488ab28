"""Symbolic checks (SymPy) of each declared symmetry, proved where SymPy can decide them.

Three statements per (activation, group) pair:

1. the declared identity ``σ(g z) = π(g) σ(z) + τ(g)``, decided separately for ``z > 0``, ``z < 0``
   and ``z = 0`` for pointwise activations (they are piecewise at 0); a numeric counterexample makes
   it ``False``;
2. site-level invariance given that identity, ``W_out'(π(g) s + τ(g)) + b_out' = W_out s + b_out``,
   for all widths with ``MatrixSymbol`` s where SymPy decides it, else with width-2 symbol matrices;
3. the infinitesimal identity ``dσ(z)[M z] = dπ(M) σ(z)`` (Euler's ``z σ'(z) = α σ(z)`` for
   homogeneous activations), which gives ``δF = 0`` and so ``⟨∇L, M·θ⟩ = 0``.

>>> import symalg
>>> entry, group = symalg.CATALOGUE["relu"], symalg.catalogue.groups.PositiveScaling(4)
>>> [check.proved for check in symbolic_checks(entry, group, ())]
[True, True, True]
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Mapping

import sympy as sp

from symalg.catalogue.activations import CatalogueEntry
from symalg.catalogue.groups import SiteGroup

__all__ = ["SymbolicCheck", "symbolic_checks", "disproof"]


@dataclass(frozen=True)
class SymbolicCheck:
    """Outcome of a symbolic check: ``proved`` is True, False (a counterexample), or None (undecided)."""

    statement: str
    proved: bool | None
    detail: str = ""

    def __str__(self) -> str:
        verdict = {True: "proved", False: "FALSE", None: "undecided"}[self.proved]
        return f"{self.statement}: {verdict}" + (f" ({self.detail})" if self.detail else "")


def _is_zero(expr: sp.Expr) -> bool | None:
    """True if SymPy simplifies ``expr`` to 0, False on a numeric counterexample, else None."""
    simplified = sp.simplify(sp.sympify(expr).rewrite(sp.exp))
    if simplified == 0:
        return True
    rng = random.Random(0)
    for _ in range(5):
        point = {s: sp.Float(rng.uniform(0.3, 2.0)) for s in simplified.free_symbols}
        value = sp.N(simplified.subs(point))
        if value.is_number and abs(complex(value)) > 1e-9:
            return False
    return None


def _identity_check(entry: CatalogueEntry, group: SiteGroup, params: Mapping[str, object]) -> SymbolicCheck:
    """Decide the activation's declared identity ``σ(g z) = π(g) σ(z) + τ(g)`` for ``group``.

    Pointwise identities are piecewise at 0, so they are decided separately for ``z > 0``,
    ``z < 0`` and ``z = 0``.
    """
    if entry.radial:
        ok = group.orthogonal and not group.affine
        return SymbolicCheck("σ(g z) = g σ(z), σ(z) = f(‖z‖) z, ‖g z‖ = ‖z‖", True if ok else None,
                             "radial by construction" if ok else "radial entry, non-orthogonal group")
    rule = group.pointwise_identity(lambda t: entry.expression(t, **params))
    if rule is None:
        return SymbolicCheck(f"σ equivariant under {group.name}", None, "no symbolic rule for this group")
    statement, residuals = rule
    if not residuals:
        return SymbolicCheck(statement, True, "pointwise")
    return SymbolicCheck(statement, _all_zero(residuals))


def _all_zero(residuals: Iterable[sp.Expr]) -> bool | None:
    """False if any residual has a counterexample, True if SymPy proves all zero, else None."""
    verdicts = [_is_zero(r) for r in residuals]
    return False if False in verdicts else (True if all(verdicts) else None)


def _infinitesimal_check(entry: CatalogueEntry, group: SiteGroup, params: Mapping[str, object]) -> SymbolicCheck:
    """Decide ``dσ(z)[M z] = dπ(M) σ(z)``, which makes ``⟨∇L, M·θ⟩ = 0`` (δF = 0 at every input).

    For positive scaling it is Euler's identity ``z σ'(z) = α σ(z)``; for ``GL`` linearity of σ;
    for ``O(h)`` radial σ gives ``dσ(z)[A z] = A σ(z)`` for antisymmetric ``A``.
    """
    if not group.is_continuous:
        return SymbolicCheck("no continuous part", True)
    own = None if entry.radial else group.infinitesimal_identity(lambda t: entry.expression(t, **params))
    if own is not None:
        statement, residuals = own
        return SymbolicCheck(statement, _all_zero(residuals))
    return SymbolicCheck(group.infinitesimal_statement, _identity_check(entry, group, params).proved,
                         group.infinitesimal_detail)


def symbolic_checks(entry: CatalogueEntry, group: SiteGroup,
                    params: tuple[tuple[str, object], ...]) -> tuple[SymbolicCheck, ...]:
    """The three checks of one (activation, group, hyper-parameters) triple. They do not depend on the
    width, so they run once at a symbolic width and are cached."""
    return _checks_at_generic_width(entry, dataclasses.replace(group, width=_GENERIC_WIDTH), params)


_GENERIC_WIDTH = sp.Symbol("h", integer=True, positive=True)


def disproof(op: str, group: SiteGroup, checks: tuple[SymbolicCheck, ...]) -> str | None:
    """Why a declared ``group`` of activation ``op`` may not be claimed: ``"declared G for op is disproved:
    <first check that is False>"``, or None when no check disproves it (undecided checks do not)."""
    refuted = [check for check in checks if check.proved is False]
    return f"declared {group.name} for {op} is disproved: {refuted[0]}" if refuted else None


@lru_cache(maxsize=None)
def _checks_at_generic_width(entry: CatalogueEntry, group: SiteGroup,
                             params: tuple[tuple[str, object], ...]) -> tuple[SymbolicCheck, ...]:
    settings = dict(params)
    return (_identity_check(entry, group, settings), _invariance_check(group),
            _infinitesimal_check(entry, group, settings))


def _invariance_check(group: SiteGroup) -> SymbolicCheck:
    """Prove that, given the declared identity, the site's contribution to the next layer is unchanged,
    ``W_out' (π(g) s + τ(g)) + b_out' = W_out s + b_out`` for the activation output ``s``: first for
    symbolic widths, else with width-2 matrices of symbols."""
    h, q = group.width, sp.Symbol("q", integer=True, positive=True)
    g = group.element_symbol("g")
    s, w_out, b_out = sp.MatrixSymbol("s", h, 1), sp.MatrixSymbol("U", q, h), sp.MatrixSymbol("c", q, 1)
    action = group.site_action(g, w_out=w_out, b_out=b_out)
    shift = group.shift_expr(g)
    image = group.rep_expr(g) * s + (shift if shift is not None else sp.ZeroMatrix(h, 1))
    residual = (action["W_out"] * image + action.get("b_out", b_out) - (w_out * s + b_out)).doit()
    if group.orthogonal:
        residual = sp.refine(residual.expand().doit(), sp.Q.orthogonal(g))
    statement = "W_out' (π(g) s + τ(g)) + b_out' = W_out s + b_out"
    if sp.simplify(residual.expand()) == sp.ZeroMatrix(*residual.shape) or sp.simplify(residual) == 0:
        return SymbolicCheck(statement, True, "all widths")
    explicit = _explicit_residual(residual, group, g)
    return SymbolicCheck(statement, explicit, "at width 2, symbolic entries" if explicit else "")


def _explicit_residual(residual: sp.MatrixExpr, group: SiteGroup, g: sp.MatrixSymbol) -> bool | None:
    """Decide a residual with every matrix replaced by a width-2 matrix of symbols."""
    concrete = residual.subs({w: 2 for w in residual.atoms(sp.Symbol)})
    element = group.width_two_element()
    if element is None:
        return None
    replacements = {}
    for symbol in concrete.atoms(sp.MatrixSymbol):
        rows, cols = (int(d) for d in symbol.shape)
        replacements[symbol] = element if symbol.name == g.name else sp.ImmutableMatrix(
            rows, cols, sp.symbols(f"{symbol.name}_:{rows * cols}", real=True))
    explicit = concrete.xreplace(replacements).doit()
    explicit = explicit.as_explicit() if isinstance(explicit, sp.MatrixExpr) else explicit
    verdicts = [_is_zero(entry) for entry in sp.Matrix(explicit)]
    return False if False in verdicts else (True if all(verdicts) else None)
