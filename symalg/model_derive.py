"""Symmetries of a traced model: groups from :func:`~symalg.model_inference.infer_model`, actions on
every bound tensor, conserved quantities in SymPy, lowered to torch.

Each :class:`ModelSymmetry` is one group acting on one site class (or one permutation class): its
action moves every bound region ``U`` (see :mod:`symalg.bindings`), and its conserved quantity is

* ``C = Σ_out p·U Uᵀ − Σ_in p·U Uᵀ`` for ``GL`` (``Q_M = tr(M C)``, ``M`` symmetric): query/key
  imbalance per head, value/output imbalance per head, adapter imbalance ``A Aᵀ − Bᵀ B``, ...;
* its diagonal ``q = Σ_out p·(U∘U)1 − Σ_in p·(U∘U)1`` for positive scaling (row norms feeding a
  batch norm, ``p = 0`` on its readers);
* linear quantities ``⟨B_i, θ⟩`` for translations: the biases feeding a batch norm, the column sums
  ``1ᵀ W`` and ``1ᵀ b`` of a layer under softmax;
* none for ``O`` (angular momentum instead), discrete groups, and actions that move buffers (eval-mode
  batch norm: the loss is invariant only when the running statistics move too).

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2))
>>> analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3),)))
>>> [s.group.name for s in analysis.symmetries]
['GL(4)']
>>> analysis.certified, [e.holds for e in analysis.certification]
(True, [True])
>>> symalg.derive(symalg.trace(model))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
symalg.graph.SpecError: derive: the model was traced without example_inputs, so its claims cannot be certified ...
>>> print(analysis.symmetries[0].conserved)
C__0 = 0.bias*0.bias.T + 0.weight*0.weight.T - 2.weight.T*2.weight
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property
from typing import Mapping

import sympy as sp
import torch

from .bindings import Binding, TranslationFamily
from .catalogue import CATALOGUE
from .certification import CERTIFICATION_TOLERANCE, ClaimError, claim_errors
from .graph import SpecError
from .groups import (GeneralLinear, Orthogonal, OrthogonalFixingOnes, Permutations, PositiveScaling, SignFlips,
                     SiteGroup, Translations)
from .inference import Blocked
from .lowering import LoweredFunction, lower
from .model_inference import ModelSites, infer_model
from .printing import latex, sstr
from .tracing import ModelGraph

__all__ = ["ModelSymmetry", "ModelAnalysis", "ModelConserved", "derive_model"]


def _number(value: Fraction):
    """A fraction as the group constructors print it (``1``, ``1/2``)."""
    return int(value) if value.denominator == 1 else sp.Rational(value.numerator, value.denominator)


def _group(kind: str, width: int, alpha) -> SiteGroup:
    return {"GL": lambda: GeneralLinear(width), "O": lambda: Orthogonal(width),
            "O1": lambda: OrthogonalFixingOnes(width),
            "PS": lambda: PositiveScaling(width, alpha=_number(alpha)),
            "SF": lambda: SignFlips(width), "S": lambda: Permutations(width)}[kind]()


@dataclass(frozen=True, eq=False)
class ModelConserved:
    """A conserved quantity: ``{name: SymPy expression}``, its meaning, and a lowered callable.

    ``kind`` is ``"matrix"`` (``Q_M = tr(M C)``), ``"diagonal"`` (``Q_M = ⟨M, q⟩``) or ``"linear"``.
    """

    name: str
    kind: str
    exprs: Mapping[str, sp.MatrixExpr]
    reads: Mapping[sp.MatrixSymbol, str] = field(repr=False)
    suffixes: Mapping[sp.MatrixSymbol, str] = field(repr=False)
    vectors: tuple = field(default=(), repr=False)

    @cached_property
    def lowered(self) -> LoweredFunction:
        return lower(_python_name(self.name), dict(self.exprs), self.reads, vector_inputs=self.vectors,
                     read_suffixes=self.suffixes)

    def __call__(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The quantity's value at ``params`` (``{name: tensor}``; parameters by name)."""
        return self.lowered(params)

    def latex(self) -> str:
        return r",\quad ".join(f"{_latex_name(key)} = {latex(expr)}" for key, expr in self.exprs.items())

    def __str__(self):
        return "; ".join(f"{key} = {sstr(expr)}" for key, expr in self.exprs.items())

    def _repr_latex_(self):
        return f"${self.latex()}$"


def _python_name(name: str) -> str:
    from .lowering import identifier

    return identifier(name)


def _latex_name(key: str) -> str:
    head, _, rest = key.partition("_")
    return f"{head}_{{\\mathrm{{{rest}}}}}" if rest else key


class _Symbols:
    """MatrixSymbols for bound regions: whole 2-D tensors keep their name (columns are ``Wᵀ``), other
    regions (slices, conv kernels, blocks) get a symbol read through an unfolding suffix."""

    def __init__(self, shapes: Mapping[str, tuple]):
        self.shapes = shapes
        self.reads: dict[sp.MatrixSymbol, str] = {}
        self.suffixes: dict[sp.MatrixSymbol, str] = {}
        self.vectors: list[sp.MatrixSymbol] = []

    def region(self, b: Binding) -> sp.MatrixExpr:
        shape = self.shapes[b.tensor]
        whole = b.start == 0 and b.width * b.block == shape[b.axis]
        full = whole and b.block == 1
        if full and len(shape) == 2:
            symbol = sp.MatrixSymbol(b.tensor, *shape)
            self.reads[symbol] = b.tensor
            return symbol if b.axis == 0 else symbol.T
        if full and len(shape) == 1:
            symbol = sp.MatrixSymbol(b.tensor, shape[0], 1)
            self.reads[symbol] = b.tensor
            self.vectors.append(symbol)
            return symbol
        rest = 1
        for axis, size in enumerate(shape):
            rest *= size if axis != b.axis else 1
        tag = f"[{b.start}:{b.start + b.width * b.block}]" if not whole else ""
        name = f"{b.tensor}{tag}_({b.axis})" + (f"/{b.block}" if b.block != 1 else "")
        symbol = sp.MatrixSymbol(name, b.width, rest * b.block)
        self.reads[symbol] = b.tensor
        self.suffixes[symbol] = b.read_source(shape)
        return symbol


@dataclass(frozen=True, eq=False)
class ModelSymmetry:
    """One group acting on one site class of a traced model.

    Attributes
    ----------
    site : the site class name (its first member's node); ``members`` all tied sites.
    group : the group (:mod:`symalg.groups`); ``bindings`` the tensor regions it moves.
    translations : for a translation group, the translation families (:class:`~symalg.bindings.TranslationFamily`) whose
        directions ``B_i`` form its basis, in order.
    shifts : for affine sign flips (``σ(−z) = 2c − σ(z)``), the ``(bias, column binding, c, node)`` of
        each reader: its bias absorbs ``−W' τ(g)`` with ``τ(g) = c(1 − g1)`` and ``W'`` the moved weight.
    acts_on_buffers : the action moves buffers (running statistics) as well as parameters.
    """

    site: str
    members: tuple[str, ...]
    group: SiteGroup
    bindings: tuple[Binding, ...]
    shapes: Mapping[str, tuple] = field(repr=False)
    translations: tuple[TranslationFamily, ...] = field(default=(), repr=False)
    shifts: tuple = field(default=(), repr=False)

    @property
    def label(self) -> str:
        return f"{self.group.name} on {self.site}"

    @property
    def acts_on_buffers(self) -> bool:
        return any(b.buffer and (b.power != 0 or isinstance(self.group, Permutations)) for b in self.bindings) or \
            any(f.moves_buffers for f in self.translations)

    @property
    def tensors(self) -> tuple[str, ...]:
        """Names of the tensors the action moves."""
        names = [b.tensor for b in self.bindings] + [r.tensor for f in self.translations for r in f.regions]
        return tuple(dict.fromkeys(names))

    # -- numeric action -------------------------------------------------------------------------
    def _operator(self, b: Binding, g: torch.Tensor) -> torch.Tensor:
        """The matrix (or diagonal) by which ``g`` multiplies the unfolded region of ``b``."""
        if isinstance(self.group, PositiveScaling):
            return g ** (float(b.power) if b.role == "out" else -float(b.power))
        if isinstance(self.group, SignFlips):  # diag(±1) is its own inverse transpose: multiply by its diagonal
            return torch.diagonal(g)
        if b.role == "out" or isinstance(self.group, (Orthogonal, Permutations)):
            return g
        return torch.linalg.inv(g).transpose(-1, -2)

    def moving_bindings(self) -> list[Binding]:
        """The bindings the action moves: a permutation moves a diagonal map's region once; positive scaling
        leaves regions of power 0 (the readers of a normalised value) where they are."""
        if isinstance(self.group, Permutations):
            seen, moves = set(), []
            for b in self.bindings:
                if b.region not in seen:
                    seen.add(b.region)
                    moves.append(b)
            return moves
        return [b for b in self.bindings if not (isinstance(self.group, PositiveScaling) and b.power == 0)]

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor,
              inplace: bool = False, checked: bool = True) -> dict[str, torch.Tensor]:
        """Parameters (and buffers) moved by the group element ``g``; untouched tensors are shared.

        ``g`` is checked to be an element of the group (:meth:`~symalg.groups.SiteGroup.check_element`:
        shape, finiteness, membership); anything else raises ``ValueError`` naming the group.
        ``checked=False`` skips that check for elements the group made itself
        (:func:`~symalg.certification.sample_elements`: for a 3072-wide permutation the check costs more than
        the move). With ``inplace`` the moved regions are written into the tensors of ``params`` (the
        caller's own copies) instead of into fresh copies: composing many claims on a large model
        (certification) then copies each tensor once, not once per claim.
        """
        if checked:
            self.group.check_element(g)
        moved = dict(params)
        if isinstance(self.group, Translations):
            for index, direction in enumerate(self._basis(params)):
                for tensor, change in direction.items():
                    moved[tensor] = moved[tensor] + g[index] * change
            return moved
        for b in self.moving_bindings():
            U = b.unfold(moved[b.tensor])
            if isinstance(self.group, Permutations):  # g U for a permutation matrix g, by indexing (no h² matmul)
                moved[b.tensor] = b.fold(moved[b.tensor], U[g.argmax(-1)], inplace)
                continue
            A = self._operator(b, g)
            moved[b.tensor] = b.fold(moved[b.tensor], A[:, None] * U if A.dim() == 1 else A @ U, inplace)
        for bias, column, center, _ in self.shifts:
            tau = float(center) * (1 - torch.diagonal(g))
            weight = moved[column.tensor]
            spread = column.fold(torch.zeros_like(weight), tau[:, None].expand_as(column.unfold(weight)))
            moved[bias] = moved[bias] - (weight * spread).sum(tuple(range(1, weight.dim())))
        return moved

    def apply_algebra(self, params, M: torch.Tensor) -> dict[str, torch.Tensor]:
        """``exp(M)·θ`` for ``M`` in the Lie algebra (checked)."""
        self.group.check_algebra_element(M)
        return self.apply(params, self.group.exp(M))

    def tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """The infinitesimal action ``M·θ`` on the tensors it moves: linear in ``M``, defined for any ``M`` of the
        algebra's shape (unchecked, so that :mod:`symalg.orbit_rank` can differentiate it under ``vmap``)."""
        if isinstance(self.group, Translations):
            out: dict[str, torch.Tensor] = {}
            for index, direction in enumerate(self._basis(params)):
                for tensor, change in direction.items():
                    out[tensor] = out.get(tensor, 0) + M[index] * change
            return out
        out = {}
        for b in self.moving_bindings():
            if isinstance(self.group, PositiveScaling):
                dA = float(b.power) * (M if b.role == "out" else -M)
            else:
                dA = M if b.role == "out" else -M.transpose(-1, -2)
            U = b.unfold(params[b.tensor])
            dU = dA[:, None] * U if dA.dim() == 1 else dA @ U
            base = out.get(b.tensor, torch.zeros_like(params[b.tensor]))
            out[b.tensor] = base + b.fold(torch.zeros_like(params[b.tensor]), dU)
        return out

    def _basis(self, params) -> list[dict[str, torch.Tensor]]:
        """Translation directions ``B_i`` (``{tensor: change}``) at the dtype/device of ``params``."""
        return [direction for family in self.translations for direction in family.directions(params)]

    # -- symbolic -------------------------------------------------------------------------------
    @cached_property
    def conserved(self) -> ModelConserved | None:
        """The conserved quantity of gradient flow (module docstring), or ``None``."""
        if self.acts_on_buffers or isinstance(self.group, (Orthogonal, SignFlips, Permutations)):
            return None
        symbols = _Symbols(self.shapes)
        name = _python_name(self.site)
        if isinstance(self.group, Translations):
            exprs = {}
            for family in self.translations:
                region = family.regions[0]
                U = symbols.region(region)
                whole = region.start == 0 and region.width * region.block == self.shapes[region.tensor][0]
                key = f"ell_{name}_{_python_name(region.tensor)}" + ("" if whole else f"_{region.start}")
                exprs[key] = U if family.pattern == "entries" else sp.OneMatrix(1, U.shape[0]) * U
            return ModelConserved(f"ell_{name}", "linear", exprs, symbols.reads, symbols.suffixes,
                                  tuple(symbols.vectors))
        diagonal = isinstance(self.group, PositiveScaling)
        terms = []
        for b in self.moving_bindings():
            if b.power == 0:
                continue
            U = symbols.region(b)
            sign = 1 if b.role == "out" else -1
            power = sp.Rational(b.power.numerator, b.power.denominator)
            if diagonal:
                term = sp.HadamardPower(U, 2)
                if U.shape[1] != 1:
                    term = term * sp.OneMatrix(U.shape[1], 1)
            else:
                term = U * U.T
            terms.append(sign * power * term)
        if not terms:
            return None
        key = f"{'q' if diagonal else 'C'}_{name}"
        return ModelConserved(key, "diagonal" if diagonal else "matrix", {key: sp.MatAdd(*terms)},
                              symbols.reads, symbols.suffixes, tuple(symbols.vectors))

    def latex(self) -> str:
        moved = ", ".join(rf"\mathrm{{{t}}}" for t in self.tensors)
        return rf"{self.group.latex()} \text{{ on {self.site}, moving }} {moved}"

    def __str__(self):
        moved = [b.describe() for b in self.bindings] or [f"{r.tensor} ({f.pattern})" for f in self.translations
                                                           for r in f.regions]
        lines = [f"{self.label}: moves " + "; ".join(dict.fromkeys(moved))]
        if self.conserved is not None:
            lines.append(f"  conserved: {self.conserved}")
        return "\n".join(lines)

    def _repr_latex_(self):
        return f"${self.latex()}$"


@dataclass(frozen=True, eq=False)
class ModelAnalysis:
    """Everything derived for a traced model: symmetries, blocked notes, and the inference result.

    ``certification``: the measured error of every inferred claim, kept or removed
    (:class:`~symalg.certification.ClaimError`), or ``None`` when derived with ``certify=False``.
    """

    model_graph: ModelGraph
    symmetries: tuple[ModelSymmetry, ...]
    blocked: tuple[Blocked, ...]
    sites: ModelSites = field(repr=False)
    loss: str = "mse"
    certification: tuple[ClaimError, ...] | None = field(default=None, repr=False)

    @property
    def certified(self) -> bool:
        """True when every reported symmetry passed numerical certification."""
        return self.certification is not None

    @property
    def conserved_quantities(self) -> list[ModelConserved]:
        return [s.conserved for s in self.symmetries if s.conserved is not None]

    def table(self) -> list[tuple[str, str, int]]:
        """``(site, group name, Lie-algebra dimension)`` for every symmetry: the summary tests compare."""
        return [(s.site, s.group.name, int(s.group.dim)) for s in self.symmetries]

    def latex(self) -> str:
        rows = [s.latex() for s in self.symmetries]
        rows += [q.latex() for q in self.conserved_quantities]
        return "\\begin{align*}\n" + " \\\\\n".join(f"& {r}" for r in rows) + "\n\\end{align*}"

    def __str__(self):
        lines = [str(s) for s in self.symmetries]
        lines += [f"blocked: {b}" for b in self.blocked]
        lines.append(self.certification_summary())
        return "\n".join(lines)

    def certification_summary(self) -> str:
        """One line: how many claims were certified, the worst kept error, how many failed."""
        if self.certification is None:
            return "certification: none (certify=False): the symmetries above are inferred, not checked numerically"
        kept = [e.error for e in self.certification if e.holds]
        failed = len(self.certification) - len(kept)
        return (f"certification: {len(kept)} of {len(self.certification)} claims hold numerically (worst relative "
                f"error {max(kept, default=0.0):.1e}, tolerance {CERTIFICATION_TOLERANCE:.0e})"
                + (f"; {failed} failed (blocked)" if failed else ""))


def derive_model(model_graph: ModelGraph, catalogue: Mapping = CATALOGUE, loss: str = "mse",
                 strict: bool = True, certify: bool = True) -> ModelAnalysis:
    """Infer the sites of a traced model and build its symmetries (see the module docstring); ``strict`` as
    in :func:`symalg.derive` (a group that a symbolic check disproves is blocked, not claimed).

    With ``certify`` (the default) every inferred claim is first checked numerically on the model
    (:func:`~symalg.certification.claim_errors`: ``max_x,g |F(g·θ, x) − F(θ, x)| / |F(θ, x)|`` over every
    output, group elements near and far from the identity, discrete generators, fresh inputs, buffers
    included, float64); a claim above :data:`~symalg.certification.CERTIFICATION_TOLERANCE` is removed
    from ``symmetries`` and from ``sites`` and becomes a :class:`~symalg.inference.Blocked` note saying
    "failed numerical certification" with the measured error. Certification needs the example inputs
    the model was traced with; ``certify=False`` gives the raw inferred claims (``certification`` is
    then ``None``).
    """
    if not isinstance(certify, bool):
        raise SpecError(f"derive: certify must be True or False, got {certify!r}")
    if certify and model_graph.example_inputs is None:
        raise SpecError("derive: the model was traced without example_inputs, so its claims cannot be certified "
                        "numerically; trace it with symalg.trace(model, example_inputs) or pass certify=False for "
                        "uncertified claims")
    sites = infer_model(model_graph, catalogue, loss, strict)
    shapes = {**{k: tuple(v.shape) for k, v in model_graph.model.named_parameters()},
              **{k: tuple(v.shape) for k, v in model_graph.model.named_buffers()}}
    origins = {}  # symmetry -> ("class", class name, kind) or ("permutation", class name): what certification removes
    for cls in sites.classes:
        for kind in cls.kinds:
            if kind in ("T", "T1"):
                families = tuple(t[2] for t in cls.translations if t[0] == kind)
                group = Translations(sum(f.count(shapes) for f in families), "bias" if kind == "T" else "along 1")
                origins[ModelSymmetry(cls.name, cls.members, group, (), shapes, families)] = ("class", cls.name, kind)
                continue
            group = _group(kind, cls.width, cls.alpha)
            shifts = cls.shifts if kind == "SF" else ()
            if shifts:
                group = SignFlips(cls.width, center=_number(shifts[0][2]))
            if group.is_continuous or not isinstance(group, Permutations) or cls.width > 1:  # S(1) is trivial
                symmetry = ModelSymmetry(cls.name, cls.members, group, cls.bindings, shapes, shifts=shifts)
                origins[symmetry] = ("class", cls.name, kind)
    for perm in sites.permutations:
        origins[ModelSymmetry(perm.name, perm.members, Permutations(perm.width), perm.bindings, shapes)] = \
            ("permutation", perm.name)
    analysis = ModelAnalysis(model_graph, tuple(origins), sites.blocked, sites, loss)
    return _certified(analysis, origins) if certify else analysis


def _certified(analysis: ModelAnalysis, origins: Mapping) -> ModelAnalysis:
    """``analysis`` without the claims that fail :func:`~symalg.certification.claim_errors`: they leave
    ``symmetries`` and ``sites`` (their kind, translations, shifts or permutation class), hence every
    conserved quantity, orbit dimension and table, and become blocked notes with their measured error."""
    errors = tuple(claim_errors(analysis))
    failed = [e for e in errors if not e.holds]
    if not failed:
        return replace(analysis, certification=errors)
    notes = tuple(Blocked(e.symmetry.site, e.symmetry.site,
                          f"{e.symmetry.group.name} failed numerical certification: relative error {e.error:.1e} on "
                          f"output {e.output!r} under {e.element}") for e in failed)
    gone = {origins[e.symmetry] for e in failed}
    sites = analysis.sites
    classes = tuple(replace(c, kinds=tuple(k for k in c.kinds if ("class", c.name, k) not in gone),
                            translations=tuple(t for t in c.translations if ("class", c.name, t[0]) not in gone),
                            shifts=() if ("class", c.name, "SF") in gone else c.shifts) for c in sites.classes)
    permutations = tuple(p for p in sites.permutations if ("permutation", p.name) not in gone)
    removed = {e.symmetry for e in failed}
    return replace(analysis, symmetries=tuple(s for s in analysis.symmetries if s not in removed),
                   blocked=analysis.blocked + notes, certification=errors,
                   sites=replace(sites, classes=classes, permutations=permutations, blocked=sites.blocked + notes))
