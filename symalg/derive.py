"""Symbolic derivation (SymPy): group actions, generators, infinitesimal actions, conserved quantities.

Parameters are ``MatrixSymbol``\\ s in the column convention of [Zhao2023] and [Zhao2026]: layer ``k`` is
``W_k ∈ R^{h_k × h_{k-1}}`` with bias column ``b_k ∈ R^{h_k × 1}`` (torch's ``nn.Linear`` layout,
samples as columns). Widths stay symbolic unless the architecture is concrete.

>>> import symalg
>>> analysis = symalg.derive(symalg.parse("linear(n, h) -> relu -> linear(h, m)"))
>>> [(s.group.name, s.group.is_continuous) for s in analysis.symmetries]
[('PositiveScaling(h, alpha=1)', True), ('S(h)', False)]
>>> print(analysis.conserved_quantities()[0])
q_1 = W_1∘^2*1 + b_1∘^2 - W_2.T∘^2*1   (h quantities, Q_M = <M, q_1>)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Mapping, overload

import sympy as sp
import torch

from .catalogue import CATALOGUE, CatalogueEntry
from .checks import SymbolicCheck, disproof, symbolic_checks
from .conserved import AngularMomentum, ConservedQuantity
from .graph import Architecture, SpecError
from .groups import Orthogonal, SiteGroup, Translations
from .inference import Blocked, Site, infer_sites
from .lowering import LoweredFunction, lower, reads
from .printing import latex, sstr

if TYPE_CHECKING:
    import networkx as nx

    from .frontend import Spec
    from .model_derive import ModelAnalysis, ModelConserved
    from .tracing import ModelGraph

__all__ = ["derive", "Analysis", "Symmetry", "LogitTranslation", "parameter_symbols"]


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
        syms, roles = self.symbols, self.roles
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
        return ConservedQuantity(self, expr, self.algebra_element, syms)

    # -- lowering -------------------------------------------------------------------------------
    @cached_property
    def lowered_action(self) -> LoweredFunction:
        """``(params, g) ↦ {name: transformed tensor}`` for the touched parameters."""
        return lower(f"act_{self.site.name}_{self.group.symbol}", self.action, reads(self.symbols),
                     args=[self.element], vector_outputs=self.bias_names, vector_inputs=self._vector_inputs)

    @cached_property
    def lowered_infinitesimal(self) -> LoweredFunction:
        """``(params, M) ↦ {name: M·θ}``; ``M`` may carry leading batch dimensions."""
        if not self.infinitesimal:
            raise ValueError(f"{self.label} is discrete: it has no infinitesimal action")
        return lower(f"tangent_{self.site.name}_{self.group.symbol}", self.infinitesimal, reads(self.symbols),
                     args=[self.algebra_element], vector_outputs=self.bias_names, vector_inputs=self._vector_inputs)

    @property
    def _vector_inputs(self) -> list:
        """Symbols passed as torch vectors: the biases and diagonal group/algebra elements."""
        vectors = [self.symbols[n] for n in self.bias_names]
        if self.group.element_format == "diagonal":
            vectors += [self.element] + ([self.algebra_element] if self.algebra_element is not None else [])
        return vectors

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after acting with group element ``g`` (untouched ones passed through).

        ``g`` is checked to be a group element (an ``h × h`` matrix, or the positive diagonal vector for
        positive scaling); anything else raises ``ValueError``.
        """
        self.group.check_element(g)
        return {**params, **self.lowered_action(params, g)}

    def apply_algebra(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after acting with ``exp(M)`` for ``M`` in the Lie algebra (checked)."""
        self.group.check_algebra_element(M)
        return self.apply(params, self.group.exp(M))

    def tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """The infinitesimal action ``M·θ`` on the touched parameters (``M`` checked, may be batched)."""
        self.group.check_algebra_element(M)
        return self.lowered_infinitesimal(params, M)

    # -- printing -------------------------------------------------------------------------------
    def latex(self) -> str:
        op = self.site.op.replace("_", r"\_")
        lines = [rf"\text{{site {self.site.name} ({op}):}}\ {self.group.latex()}"]
        for name, expr in self.action.items():
            lines.append(rf"{latex(self.symbols[name])} \mapsto {latex(expr)}")
        for name, expr in self.infinitesimal.items():
            lines.append(rf"\delta {latex(self.symbols[name])} = {latex(expr)}")
        return r" \\ ".join(lines)

    def __str__(self) -> str:
        action = "; ".join(f"{self.symbols[n]} -> {sstr(e)}" for n, e in self.action.items())
        return f"{self.label} (dim {self.group.dim}): {action}"

    def _repr_latex_(self) -> str:
        return f"$\\begin{{gathered}}{self.latex()}\\end{{gathered}}$"


@dataclass(frozen=True, eq=False)
class LogitTranslation:
    """Translations of the logits along ``1``, a symmetry of softmax cross-entropy.

    For the last layer ``y = W x + b`` (``W ∈ R^{m×n}``, torch layout), ``W ↦ W + 1 vᵀ`` and ``b ↦ b + t₀ 1``
    add ``vᵀx + t₀`` to every logit of a sample, which softmax ignores. The group is ``R^k``, ``k = n + 1``
    (``n`` without a bias), with element ``t = (v, t₀)``; the action is a translation, so ``M·θ`` is the same
    shift. Each row of ``∂L/∂y`` sums to zero, so ``1ᵀ ∇_W L = 0`` and ``1ᵀ ∇_b L = 0``: the linear quantities
    ``1ᵀ W`` and ``1ᵀ b`` are conserved by gradient flow and, being linear, exactly by gradient descent.
    """

    weight: str
    bias: str | None
    symbols: dict = field(repr=False)
    group: Translations

    @property
    def label(self) -> str:
        return f"y:{self.group.name}"

    def _shift(self, params: Mapping[str, torch.Tensor], t: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{W: 1 vᵀ, b: t₀ 1}`` for ``t`` of shape ``(..., k)``."""
        W = params[self.weight]
        n = W.shape[1]
        shift = {self.weight: t[..., None, :n].expand(*t.shape[:-1], *W.shape)}
        if self.bias:
            shift[self.bias] = t[..., n:].expand(*t.shape[:-1], W.shape[0])
        return shift

    def apply(self, params: Mapping[str, torch.Tensor], t: torch.Tensor) -> dict[str, torch.Tensor]:
        """All parameters after the translation by ``t`` (checked: a finite vector of length ``k``)."""
        self.group.check_element(t)
        return {**params, **{name: params[name] + change for name, change in self._shift(params, t).items()}}

    def tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """``M·θ`` for ``M`` of shape ``(..., k)`` (a batch of Lie-algebra elements)."""
        return self._shift(params, M)

    @cached_property
    def conserved(self) -> ModelConserved:
        """The linear quantities ``1ᵀ W`` and ``1ᵀ b`` (a :class:`~symalg.model_derive.ModelConserved`)."""
        from .model_derive import ModelConserved

        W = self.symbols[self.weight]
        ones = sp.OneMatrix(1, W.shape[0])
        exprs = {"ell_W": ones * W}
        reads = {W: self.weight}
        if self.bias:
            exprs["ell_b"] = ones * self.symbols[self.bias]
            reads[self.symbols[self.bias]] = self.bias
        vectors = (self.symbols[self.bias],) if self.bias else ()
        return ModelConserved("ell_y", "linear", exprs, reads, {}, vectors)

    def latex(self) -> str:
        W = self.symbols[self.weight]
        parts = [rf"\text{{logits (softmax cross-entropy)}}:\ {self.group.latex()}",
                 rf"{latex(W)} \mapsto {latex(W)} + \mathbf{{1}} v^T"]
        if self.bias:
            b = latex(self.symbols[self.bias])
            parts.append(rf"{b} \mapsto {b} + t_0 \mathbf{{1}}")
        return r" \\ ".join(parts)

    def __str__(self) -> str:
        W = self.symbols[self.weight]
        moved = [f"{W} -> {W} + 1*v.T"] + ([f"{self.symbols[self.bias]} -> {self.symbols[self.bias]} + t0*1"]
                                          if self.bias else [])
        return f"{self.label} (dim {self.group.dim}): {'; '.join(moved)}; conserved: {self.conserved}"


def _logit_translation(arch: Architecture, symbols: dict) -> LogitTranslation:
    last = arch.node(arch.linear_layers[-1])
    width = sp.sympify(last["in_features"]) + (1 if last["bias"] else 0)
    return LogitTranslation(last["weight"], last["bias"], symbols, Translations(width, "logits along 1"))


def _dotted(name: str) -> str:
    """The velocity's symbol name: ``W_1`` → ``\\dot{W}_{1}``."""
    base, _, index = name.partition("_")
    return rf"\dot{{{base}}}_{{{index}}}"


def _symmetry(arch: Architecture, site: Site, group: SiteGroup, symbols: dict, entry: CatalogueEntry) -> Symmetry:
    producer, consumer = arch.node(site.producer), arch.node(site.consumer)
    roles = {"W_in": producer["weight"], "b_in": producer["bias"],
             "W_out": consumer["weight"], "b_out": consumer["bias"]}
    touched = {name: symbols[name] for name in roles.values() if name}
    role_symbol = {role: symbols[name] if name else None for role, name in roles.items()}
    g = group.element_symbol(f"g_{site.index}" if group.element_format == "matrix" else f"d_{site.index}")
    action = {roles[role]: expr
              for role, expr in group.site_action(g, **{k.lower(): v for k, v in role_symbol.items()}).items()}
    infinitesimal, M = {}, None
    if group.is_continuous:
        M = group.element_symbol(f"M_{site.index}" if group.element_format == "matrix" else f"m_{site.index}")
        M_op = group.as_operator(M)
        infinitesimal = {roles["W_in"]: M_op * role_symbol["W_in"],
                         roles["W_out"]: -sp.sympify(group.alpha) * role_symbol["W_out"] * M_op}
        if roles["b_in"]:
            infinitesimal[roles["b_in"]] = M_op * role_symbol["b_in"]
    params = tuple(sorted(site.params.items()))
    checks = symbolic_checks(entry, group, params)
    return Symmetry(site, group, touched, g, action, M, infinitesimal, checks, roles)



@dataclass(frozen=True, eq=False)
class Analysis:
    """Everything derived for one architecture; every stage's output is kept.

    Attributes
    ----------
    architecture, catalogue : the inputs.
    sites : the hidden sites with their groups; ``blocked`` : what could not be claimed and why.
    symmetries : one :class:`Symmetry` per (site, group).
    symbols : ``{parameter name: MatrixSymbol}`` for every parameter.
    loss : ``"mse"`` or ``"cross_entropy"``; ``translations`` the :class:`LogitTranslation` of the latter.
    """

    architecture: Architecture
    catalogue: Mapping
    sites: tuple[Site, ...]
    blocked: tuple[Blocked, ...]
    symmetries: tuple[Symmetry, ...]
    symbols: dict
    loss: str = "mse"
    translations: tuple[LogitTranslation, ...] = ()

    def conserved_quantities(self) -> list[ConservedQuantity]:
        """Quadratic conserved quantities of gradient flow, one family per continuous symmetry."""
        return [s.conserved for s in self.symmetries if isinstance(s.conserved, ConservedQuantity)]

    def angular_momenta(self) -> list[AngularMomentum]:
        """The angular-momentum relations of antisymmetric (orthogonal) symmetries."""
        return [s.conserved for s in self.symmetries if isinstance(s.conserved, AngularMomentum)]

    def conserved_count(self) -> sp.Expr:
        """Number of symmetric generators over the whole network: one quadratic quantity each."""
        return sp.Add(*[q.count for q in self.conserved_quantities()])

    def independent_conserved(self, params: Mapping[str, torch.Tensor] | None = None) -> sp.Expr | int:
        """Number of *functionally independent* conserved quantities: a formula at generic θ
        (``params=None``) or the numeric rank at ``params``. Below :meth:`conserved_count` when a
        linear site is wider than its neighbours together (the entries of ``C`` are then related)."""
        from .orbit import independent_conserved_formula, independent_conserved_rank

        if params is None:
            return independent_conserved_formula(self)
        return independent_conserved_rank(self._at_widths_of(params), params)

    def _at_widths_of(self, params: Mapping[str, torch.Tensor]) -> "Analysis":
        """This analysis at the widths of ``params`` (checked: names, shapes, finiteness)."""
        widths = self.architecture.widths_from_params(params)
        return self.subs({str(k): v for k, v in widths.items()}) if widths else self

    @property
    def continuous(self) -> list[Symmetry]:
        return [s for s in self.symmetries if s.group.is_continuous]

    @overload
    def orbit_dimension(self, params: None = None) -> sp.Expr: ...
    @overload
    def orbit_dimension(self, params: Mapping[str, torch.Tensor]) -> int: ...

    def orbit_dimension(self, params: Mapping[str, torch.Tensor] | None = None) -> sp.Expr | int:
        """Dimension of the group orbit through θ.

        ``params=None``: the formula in the widths at generic parameters (a SymPy expression);
        otherwise the numeric rank of the infinitesimal action ``M ↦ M·θ`` at ``params`` (an int).
        """
        from .orbit import orbit_dimension_formula, orbit_rank

        if params is None:
            return orbit_dimension_formula(self)
        return orbit_rank(self._at_widths_of(params), params)

    def lower(self) -> "LoweredAnalysis":
        """Torch callables for every action, infinitesimal action, conserved quantity and relation."""
        return LoweredAnalysis(self)

    def subs(self, widths: Mapping) -> "Analysis":
        """The same analysis at concrete widths."""
        return derive(self.architecture.subs(widths), self.catalogue, loss=self.loss)

    def latex(self) -> str:
        parts = [s.latex() for s in self.symmetries] + [t.latex() for t in self.translations]
        parts += [q.latex() for q in self.conserved_quantities()] + [j.latex() for j in self.angular_momenta()]
        return r" \\ ".join(parts)

    def _repr_latex_(self) -> str:
        return f"$\\begin{{gathered}}{self.latex()}\\end{{gathered}}$"

    def __str__(self) -> str:
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
    def conserved_quantities(self) -> dict[str, ConservedQuantity]:
        """``{name: q}`` with ``q(params)`` the tensor of quantities (source in ``q.lowered.source``)."""
        return {q.name: q for q in self.analysis.conserved_quantities()}

    @property
    def angular_momenta(self) -> dict[str, AngularMomentum]:
        """``{name: J}`` with ``J(params, velocity)`` the antisymmetric matrix (``J.lowered.source``)."""
        return {j.name: j for j in self.analysis.angular_momenta()}

    def source(self) -> str:
        """All generated torch source, for inspection."""
        functions = [*self.actions.values(), *self.infinitesimal_actions.values(),
                     *(q.lowered for q in self.conserved_quantities.values()),
                     *(j.lowered for j in self.angular_momenta.values())]
        return "\n\n".join(f.source for f in functions)


@overload
def derive(arch: ModelGraph, catalogue: Mapping | None = None, strict: bool = True, loss: str = "mse",
           certify: bool = True) -> ModelAnalysis: ...
@overload
def derive(arch: Architecture | str | Spec | torch.nn.Module | nx.DiGraph, catalogue: Mapping | None = None,
           strict: bool = True, loss: str = "mse", certify: bool = True) -> Analysis: ...


def derive(arch: Architecture | ModelGraph | str | Spec | torch.nn.Module | nx.DiGraph,
           catalogue: Mapping | None = None, strict: bool = True, loss: str = "mse",
           certify: bool = True) -> Analysis | ModelAnalysis:
    """Run inference and the symbolic derivation for an architecture (or anything :func:`parse` takes).

    A traced model (:class:`~symalg.tracing.ModelGraph`) goes to :func:`~symalg.model_derive.derive_model`
    with ``loss`` (``"mse"`` or ``"cross_entropy"``) and ``certify`` and returns a
    :class:`~symalg.model_derive.ModelAnalysis`: with ``certify`` (the default) every claim is checked
    numerically on the model first and one that fails is blocked ("failed numerical certification");
    ``certify=False`` keeps the raw inferred claims. Spec architectures have no weights to run: their
    claims are checked symbolically (``strict``) and ``certify`` does not apply to them. For a chain,
    ``loss="cross_entropy"`` adds the :class:`LogitTranslation` of the last layer (``analysis.translations``).

    ``catalogue`` defaults to the one the architecture was parsed with (the built-in one for strings).
    With ``strict`` (the default) a declared symmetry that a symbolic check *disproves* is not claimed
    but listed in ``analysis.blocked``; ``strict=False`` keeps it (e.g. to watch the verifier fail).
    Both pipelines run the same cached checks (:mod:`symalg.checks`).

    Arguments of the wrong type (``strict="yes"``, a catalogue that is not a mapping, an unknown loss)
    raise ``SpecError`` naming the argument.
    """
    from .frontend import parse
    from .model_derive import derive_model
    from .model_inference import check_loss
    from .tracing import ModelGraph

    if not isinstance(strict, bool):
        raise SpecError(f"derive: strict must be True or False, got {strict!r}")
    if catalogue is not None and not isinstance(catalogue, Mapping):
        raise SpecError(f"derive: catalogue must be a mapping of activation names to CatalogueEntry (e.g. "
                        f"symalg.overlay({{...}})), got {type(catalogue).__name__}")
    if not isinstance(certify, bool):
        raise SpecError(f"derive: certify must be True or False, got {certify!r}")
    check_loss(loss, "derive")
    if catalogue is not None:
        wrong = [key for key, entry in catalogue.items() if not isinstance(entry, CatalogueEntry)]
        if wrong:
            raise SpecError(f"derive: catalogue entry {wrong[0]!r} is a {type(catalogue[wrong[0]]).__name__}, "
                            "not a CatalogueEntry")
    if isinstance(arch, ModelGraph):
        return derive_model(arch, CATALOGUE if catalogue is None else catalogue, loss, strict, certify)
    if isinstance(arch, Architecture):
        catalogue = catalogue if catalogue is not None else (arch.catalogue or CATALOGUE)
    else:
        catalogue = CATALOGUE if catalogue is None else catalogue
        arch = parse(arch, catalogue=catalogue)
    sites, blocked = infer_sites(arch, catalogue)
    symbols = parameter_symbols(arch)
    symmetries, disproved = [], []
    for site in sites:
        for group in site.groups:
            symmetry = _symmetry(arch, site, group, symbols, catalogue[site.op])
            reason = disproof(site.op, group, symmetry.checks)
            if strict and reason:
                disproved.append(Blocked(site.activation_node or site.producer, site.name, reason))
            else:
                symmetries.append(symmetry)
    translations = (_logit_translation(arch, symbols),) if loss == "cross_entropy" else ()
    return Analysis(arch, catalogue, sites, blocked + tuple(disproved), tuple(symmetries), symbols, loss, translations)
