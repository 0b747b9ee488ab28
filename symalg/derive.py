"""Symbolic derivation (SymPy): group actions, generators, infinitesimal actions, conserved quantities.

Parameters are ``MatrixSymbol``\\ s in the papers' column convention: layer ``k`` is
``W_k ∈ R^{h_k × h_{k-1}}`` with bias column ``b_k ∈ R^{h_k × 1}`` (torch's ``nn.Linear`` layout,
samples as columns). Widths stay symbolic unless the architecture is concrete.

>>> import symalg
>>> analysis = symalg.derive(symalg.parse("linear(n, h) -> relu -> linear(h, m)"))
>>> [(s.group.name, s.group.is_continuous) for s in analysis.symmetries]
[('PositiveScaling(h, alpha=1)', True), ('S(h)', False)]
>>> print(analysis.conserved_quantities()[0])
q_1 = W_1∘^2*1 + b_1∘^2 - W_2.T∘^2*1   (h independent; Q_M = <M, q_1>)
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Mapping

import sympy as sp
import torch

from .catalogue import CATALOGUE, CatalogueEntry
from .conserved import AngularMomentum, ConservedQuantity
from .graph import Architecture
from .groups import GeneralLinear, Orthogonal, Permutations, PositiveScaling, SignFlips, SiteGroup
from .inference import Blocked, Site, infer_sites
from .printing import latex, sstr
from .lowering import LoweredFunction, lower

__all__ = ["derive", "Analysis", "Symmetry", "SymbolicCheck", "parameter_symbols"]


@dataclass(frozen=True)
class SymbolicCheck:
    """Outcome of a symbolic check: ``proved`` is True, False (a counterexample), or None (undecided)."""

    statement: str
    proved: bool | None
    detail: str = ""

    def __str__(self):
        verdict = {True: "proved", False: "FALSE", None: "undecided"}[self.proved]
        return f"{self.statement}: {verdict}" + (f" ({self.detail})" if self.detail else "")


def parameter_symbols(arch: Architecture) -> dict[str, sp.MatrixSymbol]:
    """``{parameter name: MatrixSymbol}``: ``W_k`` (out × in) and ``b_k`` (out × 1) for layer k."""
    symbols = {}
    for k, name in enumerate(arch.linear_layers, start=1):
        node = arch.node(name)
        n_out, n_in = sp.sympify(node["out_features"]), sp.sympify(node["in_features"])
        symbols[node["weight"]] = sp.MatrixSymbol(f"W_{k}", n_out, n_in)
        if node["bias"]:
            symbols[node["bias"]] = sp.MatrixSymbol(f"b_{k}", n_out, 1)
    return symbols


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


def _identity_check(entry: CatalogueEntry, group: SiteGroup, params: Mapping) -> SymbolicCheck:
    """Decide the activation's declared identity ``σ(g z) = π(g) σ(z) + τ(g)`` for ``group``.

    Pointwise identities are piecewise at 0, so they are decided separately for ``z > 0``,
    ``z < 0`` and ``z = 0``.
    """
    if entry.radial:
        ok = isinstance(group, (Orthogonal, Permutations, SignFlips)) and getattr(group, "center", 0) == 0
        return SymbolicCheck("σ(g z) = g σ(z), σ(z) = f(‖z‖) z, ‖g z‖ = ‖z‖", True if ok else None,
                             "radial by construction" if ok else "radial entry, non-orthogonal group")
    p = sp.Symbol("p", positive=True)
    signs = (p, -p, sp.Integer(0))
    sigma = lambda t: entry.expression(t, **params)  # noqa: E731
    if isinstance(group, Permutations):
        return SymbolicCheck("σ(P z) = P σ(z)", True, "pointwise")
    if isinstance(group, PositiveScaling):
        c = sp.Symbol("c", positive=True)
        residuals = [sigma(c * z) - c ** group.alpha * sigma(z) for z in signs]
        statement = f"σ(c z) = c^{group.alpha} σ(z), c > 0"
    elif isinstance(group, SignFlips):
        residuals = [sigma(-z) + sigma(z) - 2 * group.center for z in signs]
        statement = f"σ(−z) = {2 * group.center} − σ(z)"
    elif isinstance(group, GeneralLinear):
        a, b = sp.symbols("a b", real=True)
        z, w = sp.symbols("z w", real=True)
        residuals = [sigma(a * z + b * w) - a * sigma(z) - b * sigma(w)]
        statement = "σ linear: σ(a z + b w) = a σ(z) + b σ(w)"
    else:
        return SymbolicCheck(f"σ equivariant under {group.name}", None, "no symbolic rule for this group")
    verdicts = [_is_zero(r) for r in residuals]
    proved = False if False in verdicts else (True if all(verdicts) else None)
    return SymbolicCheck(statement, proved)


def _infinitesimal_check(entry: CatalogueEntry, group: SiteGroup, params: Mapping) -> SymbolicCheck:
    """Decide ``dσ(z)[M z] = dπ(M) σ(z)``, which makes ``⟨∇L, M·θ⟩ = 0`` (δF = 0 at every input).

    For positive scaling it is Euler's identity ``z σ'(z) = α σ(z)``; for ``GL`` linearity of σ;
    for ``O(h)`` radial σ gives ``dσ(z)[A z] = A σ(z)`` for antisymmetric ``A``.
    """
    if isinstance(group, PositiveScaling) and not entry.radial:
        p = sp.Symbol("p", positive=True)
        z = sp.Symbol("z", real=True)
        derivative = sp.diff(entry.expression(z, **params), z)
        verdicts = [_is_zero((t * derivative.subs(z, t) - group.alpha * entry.expression(t, **params)))
                    for t in (p, -p)]
        proved = False if False in verdicts else (True if all(verdicts) else None)
        return SymbolicCheck(f"Euler: z σ'(z) = {group.alpha} σ(z) (z ≠ 0)", proved)
    if isinstance(group, GeneralLinear):
        identity = _identity_check(entry, group, params)
        return SymbolicCheck("dσ(z)[M z] = M σ(z) (σ linear)", identity.proved)
    if isinstance(group, Orthogonal):
        return SymbolicCheck("dσ(z)[A z] = A σ(z), A antisymmetric", _identity_check(entry, group, params).proved,
                             "d‖z‖[A z] = zᵀA z / ‖z‖ = 0")
    return SymbolicCheck("no continuous part", True)


@dataclass(frozen=True, eq=False)
class Symmetry:
    """One group acting on one site, with its symbolic action and everything derived from it.

    Attributes
    ----------
    site, group : where it acts and what acts.
    symbols : ``{parameter name: MatrixSymbol}`` for the parameters the action touches.
    element : the group element's symbol (``g_k``, or the diagonal ``d_k`` for positive scaling).
    action : ``{parameter name: transformed expression}``.
    algebra_element, infinitesimal : ``M_k`` and ``{name: M·θ}`` (continuous groups only).
    checks : symbolic checks (declared identity, invariance, infinitesimal invariance).
    """

    site: Site
    group: SiteGroup
    symbols: dict
    element: sp.MatrixSymbol
    action: dict
    algebra_element: sp.MatrixSymbol | None
    infinitesimal: dict
    checks: tuple[SymbolicCheck, ...]
    roles: Mapping = field(default_factory=dict)

    @property
    def bias_names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.roles["b_in"], self.roles["b_out"]) if n)

    @property
    def label(self) -> str:
        return f"{self.site.name}:{self.group.name}"

    def generators(self) -> list[sp.ImmutableMatrix]:
        """Explicit Lie-algebra basis (concrete widths)."""
        return self.group.generators()

    def discrete_generators(self) -> list[sp.ImmutableMatrix]:
        return [sp.ImmutableMatrix(g.to(torch.int64).tolist()) for g in self.group.discrete_generators()]

    @cached_property
    def conserved(self) -> ConservedQuantity | AngularMomentum | None:
        """The symmetry's conserved quantities (symmetric generators) or angular momentum (antisymmetric)."""
        if not self.group.is_continuous:
            return None
        site, syms, roles = self.site, self.symbols, self.roles
        w_in, w_out = syms[roles["W_in"]], syms[roles["W_out"]]
        b_in = syms[roles["b_in"]] if roles["b_in"] else None
        alpha = sp.sympify(self.group.alpha)
        if isinstance(self.group, Orthogonal):
            velocities = {name: sp.MatrixSymbol(_dotted(s.name), *s.shape) for name, s in syms.items()}
            x = w_in * velocities[roles["W_in"]].T - velocities[roles["W_out"]].T * w_out
            if b_in is not None:
                x = x + b_in * velocities[roles["b_in"]].T
            return AngularMomentum(self, x - x.T, syms, velocities)
        if self.group.element_format == "diagonal":
            ones_in, ones_out = sp.OneMatrix(w_in.shape[1], 1), sp.OneMatrix(w_out.shape[0], 1)
            expr = sp.HadamardProduct(w_in, w_in) * ones_in - alpha * sp.HadamardProduct(w_out, w_out).T * ones_out
            if b_in is not None:
                expr = expr + sp.HadamardProduct(b_in, b_in)
        else:
            expr = w_in * w_in.T - alpha * w_out.T * w_out
            if b_in is not None:
                expr = expr + b_in * b_in.T
        generator = sp.MatrixSymbol(f"M_{site.index}", *(self.element.shape))
        return ConservedQuantity(self, expr, generator, syms)

    # -- lowering -------------------------------------------------------------------------------
    @cached_property
    def lowered_action(self) -> LoweredFunction:
        """``(params, g) ↦ {name: transformed tensor}`` for the touched parameters."""
        return lower(f"act_{self.site.name}_{self.group.symbol}", self.action, _reads(self.symbols),
                     args=[self.element], vector_outputs=self.bias_names, vector_inputs=self._vector_inputs)

    @cached_property
    def lowered_infinitesimal(self) -> LoweredFunction:
        """``(params, M) ↦ {name: M·θ}``; ``M`` may carry leading batch dimensions."""
        if not self.infinitesimal:
            raise ValueError(f"{self.label} is discrete: it has no infinitesimal action")
        return lower(f"tangent_{self.site.name}_{self.group.symbol}", self.infinitesimal, _reads(self.symbols),
                     args=[self.algebra_element], vector_outputs=self.bias_names, vector_inputs=self._vector_inputs)

    @property
    def _vector_inputs(self) -> list:
        """Symbols passed as torch vectors: the biases and diagonal group/algebra elements."""
        vectors = [self.symbols[n] for n in self.bias_names]
        if self.group.element_format == "diagonal":
            vectors += [self.element] + ([self.algebra_element] if self.algebra_element is not None else [])
        return vectors

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after acting with group element ``g`` (untouched ones passed through)."""
        return {**params, **self.lowered_action(params, g)}

    def apply_algebra(self, params, M: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after acting with ``exp(M)``."""
        return self.apply(params, self.group.exp(M))

    def tangent(self, params, M: torch.Tensor) -> dict[str, torch.Tensor]:
        """The infinitesimal action ``M·θ`` on the touched parameters."""
        return self.lowered_infinitesimal(params, M)

    # -- printing -------------------------------------------------------------------------------
    def latex(self) -> str:
        lines = [rf"\text{{site }} {self.site.name}\ ({self.site.op}):\ {self.group.latex()}"]
        for name, expr in self.action.items():
            lines.append(rf"{latex(self.symbols[name])} \mapsto {latex(expr)}")
        for name, expr in self.infinitesimal.items():
            lines.append(rf"\delta {latex(self.symbols[name])} = {latex(expr)}")
        return r" \\ ".join(lines)

    def __str__(self):
        action = "; ".join(f"{self.symbols[n]} -> {sstr(e)}" for n, e in self.action.items())
        return f"{self.label} (dim {self.group.dim}): {action}"

    def _repr_latex_(self):
        return f"$\\begin{{gathered}}{self.latex()}\\end{{gathered}}$"


def _dotted(name: str) -> str:
    """The velocity's symbol name: ``W_1`` → ``\\dot{W}_{1}``."""
    base, _, index = name.partition("_")
    return rf"\dot{{{base}}}_{{{index}}}"


def _reads(symbols: Mapping[str, sp.MatrixSymbol]) -> dict:
    """``{symbol: parameter name}``, the form :func:`~symalg.lowering.lower` reads parameters in."""
    return {symbol: name for name, symbol in symbols.items()}


def _site_action(group: SiteGroup, g, w_in, b_in, w_out, b_out) -> dict[str, sp.MatrixExpr]:
    """The action by role: ``W_in ↦ g W_in``, ``b_in ↦ g b_in``, ``W_out ↦ W_out π(g)⁻¹`` and, for an
    affine identity, ``b_out ↦ b_out − W_out π(g)⁻¹ τ(g)``; roles given as None are left out."""
    G, inverse, shift = group.as_operator(g), group.rep_inverse_expr(g), group.shift_expr(g)
    action = {"W_out": w_out * inverse}
    if w_in is not None:
        action["W_in"] = G * w_in
    if b_in is not None:
        action["b_in"] = G * b_in
    if shift is not None:
        action["b_out"] = b_out - w_out * inverse * shift
    return action


def _symmetry(arch: Architecture, site: Site, group: SiteGroup, symbols: dict, entry: CatalogueEntry) -> Symmetry:
    producer, consumer = arch.node(site.producer), arch.node(site.consumer)
    roles = {"W_in": producer["weight"], "b_in": producer["bias"], "W_out": consumer["weight"], "b_out": consumer["bias"]}
    touched = {name: symbols[name] for name in roles.values() if name}
    role_symbol = {role: symbols[name] if name else None for role, name in roles.items()}
    g = group.element_symbol(f"g_{site.index}" if group.element_format == "matrix" else f"d_{site.index}")
    action = {roles[role]: expr for role, expr in _site_action(group, g, **{k.lower(): v for k, v in role_symbol.items()}).items()}
    infinitesimal, M = {}, None
    if group.is_continuous:
        M = group.element_symbol(f"M_{site.index}" if group.element_format == "matrix" else f"m_{site.index}")
        M_op = group.as_operator(M)
        infinitesimal = {roles["W_in"]: M_op * role_symbol["W_in"],
                         roles["W_out"]: -sp.sympify(group.alpha) * role_symbol["W_out"] * M_op}
        if roles["b_in"]:
            infinitesimal[roles["b_in"]] = M_op * role_symbol["b_in"]
    params = tuple(sorted(site.params.items()))
    checks = _checks(entry, dataclasses.replace(group, width=_GENERIC_WIDTH), params)
    return Symmetry(site, group, touched, g, action, M, infinitesimal, checks, roles)


_GENERIC_WIDTH = sp.Symbol("h", integer=True, positive=True)


@lru_cache(maxsize=None)
def _checks(entry: CatalogueEntry, group: SiteGroup, params: tuple) -> tuple[SymbolicCheck, ...]:
    """The symbolic checks of one (activation, group) pair, at a symbolic width (cached: they do not
    depend on the width)."""
    params = dict(params)
    return (_identity_check(entry, group, params), _invariance_check(group),
            _infinitesimal_check(entry, group, params))


def _invariance_check(group: SiteGroup) -> SymbolicCheck:
    """Prove that, given the declared identity, the site's contribution to the next layer is unchanged,
    ``W_out' (π(g) s + τ(g)) + b_out' = W_out s + b_out`` for the activation output ``s``: first for
    symbolic widths, else with width-2 matrices of symbols."""
    h, q = group.width, sp.Symbol("q", integer=True, positive=True)
    g = group.element_symbol("g")
    s, w_out, b_out = sp.MatrixSymbol("s", h, 1), sp.MatrixSymbol("U", q, h), sp.MatrixSymbol("c", q, 1)
    action = _site_action(group, g, None, None, w_out, b_out)
    shift = group.shift_expr(g)
    image = group.rep_expr(g) * s + (shift if shift is not None else sp.ZeroMatrix(h, 1))
    residual = (action["W_out"] * image + action.get("b_out", b_out) - (w_out * s + b_out)).doit()
    if isinstance(group, (Orthogonal, Permutations)):
        residual = sp.refine(residual.expand().doit(), sp.Q.orthogonal(g))
    statement = "W_out' (π(g) s + τ(g)) + b_out' = W_out s + b_out"
    if sp.simplify(residual.expand()) == sp.ZeroMatrix(*residual.shape) or sp.simplify(residual) == 0:
        return SymbolicCheck(statement, True, "all widths")
    explicit = _explicit_residual(residual, group, g)
    return SymbolicCheck(statement, explicit, "at width 2, symbolic entries" if explicit else "")


def _explicit_residual(residual, group, g) -> bool | None:
    """Decide a residual with every matrix replaced by a width-2 matrix of symbols."""
    concrete = residual.subs({w: 2 for w in residual.atoms(sp.Symbol)})
    t = sp.Symbol("t", real=True)
    element = {
        GeneralLinear: lambda: sp.ImmutableMatrix(2, 2, sp.symbols("a:4", real=True)),
        Orthogonal: lambda: sp.ImmutableMatrix([[sp.cos(t), -sp.sin(t)], [sp.sin(t), sp.cos(t)]]),
        PositiveScaling: lambda: sp.ImmutableMatrix(sp.symbols("d:2", positive=True)),
        SignFlips: lambda: sp.ImmutableMatrix([[-1, 0], [0, 1]]),
        Permutations: lambda: sp.ImmutableMatrix([[0, 1], [1, 0]]),
    }[type(group)]()
    replacements = {}
    for symbol in concrete.atoms(sp.MatrixSymbol):
        rows, cols = (int(d) for d in symbol.shape)
        replacements[symbol] = element if symbol.name == g.name else sp.ImmutableMatrix(
            rows, cols, sp.symbols(f"{symbol.name}_:{rows * cols}", real=True))
    explicit = concrete.xreplace(replacements).doit()
    explicit = explicit.as_explicit() if isinstance(explicit, sp.MatrixExpr) else explicit
    verdicts = [_is_zero(entry) for entry in sp.Matrix(explicit)]
    return False if False in verdicts else (True if all(verdicts) else None)


@dataclass(frozen=True, eq=False)
class Analysis:
    """Everything derived for one architecture; every stage's output is kept.

    Attributes
    ----------
    architecture, catalogue : the inputs.
    sites : the hidden sites with their groups; ``blocked`` : what could not be claimed and why.
    symmetries : one :class:`Symmetry` per (site, group).
    symbols : ``{parameter name: MatrixSymbol}`` for every parameter.
    """

    architecture: Architecture
    catalogue: Mapping
    sites: tuple[Site, ...]
    blocked: tuple[Blocked, ...]
    symmetries: tuple[Symmetry, ...]
    symbols: dict

    def conserved_quantities(self) -> list[ConservedQuantity]:
        """Quadratic conserved quantities of gradient flow, one family per continuous symmetry."""
        return [s.conserved for s in self.symmetries if isinstance(s.conserved, ConservedQuantity)]

    def angular_momenta(self) -> list[AngularMomentum]:
        """The angular-momentum relations of antisymmetric (orthogonal) symmetries."""
        return [s.conserved for s in self.symmetries if isinstance(s.conserved, AngularMomentum)]

    def conserved_count(self) -> sp.Expr:
        """Number of symmetric generators over the whole network: one quadratic quantity each."""
        return sp.Add(*[q.count for q in self.conserved_quantities()])

    def independent_conserved(self, params: Mapping[str, torch.Tensor] | None = None):
        """Number of *functionally independent* conserved quantities: a formula at generic θ
        (``params=None``) or the numeric rank at ``params``. Below :meth:`conserved_count` when a
        linear site is wider than its neighbours together (the entries of ``C`` are then related)."""
        from .orbit import independent_conserved_formula, independent_conserved_rank

        if params is None:
            return independent_conserved_formula(self)
        return independent_conserved_rank(self, params)

    @property
    def continuous(self) -> list[Symmetry]:
        return [s for s in self.symmetries if s.group.is_continuous]

    def orbit_dimension(self, params: Mapping[str, torch.Tensor] | None = None):
        """Dimension of the group orbit through θ.

        ``params=None``: the formula in the widths at generic parameters (a SymPy expression);
        otherwise the numeric rank of the infinitesimal action ``M ↦ M·θ`` at ``params`` (an int).
        """
        from .orbit import orbit_dimension_formula, orbit_rank

        if params is None:
            return orbit_dimension_formula(self)
        return orbit_rank(self, params)

    def lower(self) -> "LoweredAnalysis":
        """Torch callables for every action, infinitesimal action, conserved quantity and relation."""
        return LoweredAnalysis(self)

    def subs(self, widths: Mapping) -> "Analysis":
        """The same analysis at concrete widths."""
        return derive(self.architecture.subs(widths), self.catalogue)

    def latex(self) -> str:
        parts = [s.latex() for s in self.symmetries]
        parts += [q.latex() for q in self.conserved_quantities()] + [j.latex() for j in self.angular_momenta()]
        return r" \\ ".join(parts)

    def _repr_latex_(self):
        return f"$\\begin{{gathered}}{self.latex()}\\end{{gathered}}$"

    def __str__(self):
        from .report import describe

        return describe(self)


@dataclass(frozen=True, eq=False)
class LoweredAnalysis:
    """The torch side of an :class:`Analysis` (each callable keeps its ``.source``)."""

    analysis: Analysis

    @property
    def actions(self) -> dict[str, LoweredFunction]:
        return {s.label: s.lowered_action for s in self.analysis.symmetries}

    @property
    def infinitesimal_actions(self) -> dict[str, LoweredFunction]:
        return {s.label: s.lowered_infinitesimal for s in self.analysis.continuous}

    @property
    def conserved_quantities(self) -> dict[str, LoweredFunction]:
        return {q.name: q.lowered for q in self.analysis.conserved_quantities()}

    @property
    def angular_momenta(self) -> dict[str, LoweredFunction]:
        return {j.name: j.lowered for j in self.analysis.angular_momenta()}

    def source(self) -> str:
        """All generated torch source, for inspection."""
        functions = [*self.actions.values(), *self.infinitesimal_actions.values(),
                     *self.conserved_quantities.values(), *self.angular_momenta.values()]
        return "\n\n".join(f.source for f in functions)


def derive(arch, catalogue: Mapping | None = None) -> Analysis:
    """Run inference and the symbolic derivation for an architecture (or anything :func:`parse` takes).

    ``catalogue`` defaults to the built-in one; pass the same overlay used to parse the architecture,
    otherwise its extra ops count as unknown (no symmetry, listed in ``analysis.blocked``).
    """
    from .frontend import parse

    catalogue = CATALOGUE if catalogue is None else catalogue
    arch = parse(arch, catalogue=catalogue) if not isinstance(arch, Architecture) else arch
    sites, blocked = infer_sites(arch, catalogue)
    symbols = parameter_symbols(arch)
    symmetries = tuple(_symmetry(arch, site, group, symbols, catalogue[site.op])
                       for site in sites for group in site.groups)
    return Analysis(arch, catalogue, sites, blocked, symmetries, symbols)
