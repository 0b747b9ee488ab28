"""Symmetries of a traced model: groups from :func:`~symalg.symbolic.engine.infer_model`, actions on
every bound tensor, conserved quantities in SymPy, lowered to torch.

Each :class:`Symmetry` is one group acting on one site class (or one permutation class): its
action moves every bound region ``U`` (see :mod:`symalg.catalogue.bindings`), and its conserved quantity is

* ``C = Σ_out p·U Uᵀ − Σ_in p·U Uᵀ`` for ``GL`` (``Q_M = tr(M C)``, ``M`` symmetric): query/key
  imbalance per head, value/output imbalance per head, adapter imbalance ``A Aᵀ − Bᵀ B``, ...;
* its diagonal ``q = Σ_out p·(U∘U)1 − Σ_in p·(U∘U)1`` for positive scaling (row norms feeding a
  batch norm, ``p = 0`` on its readers);
* its plane sums ``q_i = C_ii + C_{i+m,i+m}`` for complex scaling (a head's queries and keys under rotary
  embeddings: the query-key imbalance per plane);
* linear quantities ``⟨B_i, θ⟩`` for translations: the biases feeding a batch norm, the column sums
  ``1ᵀ W`` and ``1ᵀ b`` of a layer under softmax;
* none for ``O`` (angular momentum instead), discrete groups, shears (translations whose directions depend on
  ``θ``: a bias moved into the readers' biases, :class:`~symalg.catalogue.groups.Shears` says why none exists)
  and actions that move buffers (eval-mode batch norm: the loss is invariant only when the running statistics
  move too).

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2))
>>> analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3),)))
>>> [s.group.name for s in analysis.symmetries]     # and the first bias moved into the second (a shear)
['GL(4)', 'Shears(4)']
>>> analysis.certified, [e.holds for e in analysis.certification]
(True, [True, True])
>>> symalg.derive(symalg.trace(model))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
symalg.errors.SpecError: derive: the model was traced without example_inputs, so its claims cannot be certified ...
>>> print(analysis.symmetries[0].conserved)
C__0 = 0.bias*0.bias.T + 0.weight*0.weight.T - 2.weight.T*2.weight
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Mapping

import sympy as sp
import torch

from symalg.catalogue.bindings import Absorber, Binding, TranslationFamily
from symalg.catalogue.groups import SiteGroup, group_classes
from symalg.lowering.codegen import LoweredFunction, lower
from symalg.symbolic.printing import escape_latex, latex, name_latex, sstr, tensor_latex
from symalg.lowering.codegen import identifier

__all__ = ["Symmetry", "ConservedQuantity", "AngularMomentum"]


def _number(value: Fraction) -> int | sp.Rational:
    """A fraction as the group constructors print it (``1``, ``1/2``)."""
    return int(value) if value.denominator == 1 else sp.Rational(value.numerator, value.denominator)


def _group(kind: str, width: int, alpha: Fraction) -> SiteGroup:
    """The group of ``kind`` on a site of ``width`` whose activations have degree ``alpha``."""
    cls = group_classes()[kind]
    return cls.for_site(width, alpha=_number(alpha)) if "alpha" in cls.site_options else cls.for_site(width)


@dataclass(frozen=True, eq=False)
class ConservedQuantity:
    """A conserved quantity: ``{name: SymPy expression}``, its meaning, and a lowered callable.

    ``kind`` is ``"matrix"`` (``Q_M = tr(M C)``), ``"diagonal"`` (``Q_M = ⟨M, q⟩``), ``"planes"`` (``Q_M = ⟨a, q⟩``,
    ``q_i = C_ii + C_{i+m,i+m}``, ``a`` the plane scalings of ``M``) or ``"linear"``; ``site`` the
    site it belongs to, whose Python identifier is in ``name`` (``C_enc_0``) and whose name is in the LaTeX
    (``C_{\\mathrm{enc.0}}``).
    """

    name: str
    kind: str
    exprs: Mapping[str, sp.MatrixExpr]
    reads: Mapping[sp.MatrixSymbol, str] = field(repr=False)
    suffixes: Mapping[sp.MatrixSymbol, str] = field(repr=False)
    vectors: tuple = field(default=(), repr=False)
    site: str = ""

    @cached_property
    def lowered(self) -> LoweredFunction:
        # per-unit values (a positive scaling's q, a translation's bias) as torch vectors (..., h); a matrix C stays
        # h × h, also at h = 1
        columns = [key for key, expr in self.exprs.items() if self.kind != "matrix" and expr.shape[1] == 1]
        return lower(_python_name(self.name), dict(self.exprs), self.reads, vector_inputs=self.vectors,
                     vector_outputs=columns, read_suffixes=self.suffixes)

    def __call__(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The quantity's value at ``params`` (``{name: tensor}``; parameters by name)."""
        return self.lowered.fn(params)   # the compiled function itself checks the parameters' shapes

    def latex(self) -> str:
        """``Q_M = tr(M C), C = ...`` (matrix), ``Q_m = mᵀ q, q = ...`` (diagonal), ``Q_M = Σ a_i q_i, q = ...``
        (planes) or the linear quantities."""
        body = r",\quad ".join(f"{self._latex_name(key)} = {latex(expr)}" for key, expr in self.exprs.items())
        name = self._latex_name(self.name)
        head = {"matrix": rf"Q_{{M}} = \operatorname{{tr}}\left(M {name}\right),\quad ",
                "diagonal": rf"Q_{{m}} = m^{{T}} {name},\quad ",
                "planes": rf"Q_{{M}} = \sum_i a_i \left({name}\right)_i,\ M = \sum_i a_i S_i + b_i J_i,\quad "
                }.get(self.kind, "")
        return head + body

    def _latex_name(self, key: str) -> str:
        r"""``C__0`` → ``C_{0}``, ``q_enc_0`` → ``q_{\mathrm{enc.0}}`` (the site as named), ``ell__2__2_weight`` →
        ``\ell_{2,\,\mathrm{2\_weight}}`` (the site, then the rest of the key)."""
        head, _, rest = key.partition("_")
        head = r"\ell" if head == "ell" else head
        site = _python_name(self.site) if self.site else None
        parts = [name_latex(self.site)] if site and rest.startswith(site) else []
        rest = re.sub("_+", "_", rest[len(site):] if site and parts else rest).strip("_")
        parts += [name_latex(rest)] if rest else []
        return head + "_{" + r",\,".join(parts) + "}" if parts else head

    def __str__(self) -> str:
        return "; ".join(f"{key} = {sstr(expr)}" for key, expr in self.exprs.items())

    def _repr_latex_(self) -> str:
        return f"${self.latex()}$"


@dataclass(frozen=True, eq=False)
class AngularMomentum:
    """The angular-momentum relation of a group with antisymmetric generators (``O``), built from its bindings.

    For ``A`` antisymmetric in the Lie algebra, ``⟨θ̇, A·θ⟩ = ½ ⟨A, J⟩`` with

        ``J(θ, θ̇) = G − Gᵀ``,   ``G = Σ_out U̇ Uᵀ − Σ_in U U̇ᵀ``

    over the unfolded regions ``U`` the group moves (rows it multiplies, ``out``; columns it multiplies by the
    inverse, ``in``), projected on the algebra when it is smaller than all of ``so(h)``. Invariance gives
    ``J(θ, −∇L) = 0``; under heavy-ball dynamics ``θ̈ + γ θ̇ = −∇L`` every entry of ``J`` decays as ``e^{−γt}``
    (``⟨θ̇, A·θ̇⟩ = 0`` for antisymmetric ``A``), and is conserved when ``γ = 0``.
    """

    symmetry: "Symmetry"

    @property
    def name(self) -> str:
        return f"J_{_python_name(self.symmetry.site)}"

    def __call__(self, params: Mapping[str, torch.Tensor], velocity: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``J`` (``h × h``, antisymmetric) at ``params`` with velocity ``velocity`` (both ``{name: tensor}``)."""
        terms = []
        for b in self.symmetry.moving_bindings():
            if b.tensor not in params or b.tensor not in velocity:
                raise KeyError(f"{self.name}: parameter {b.tensor!r} missing from params or velocity")
            U, V = b.unfold(params[b.tensor]), b.unfold(velocity[b.tensor])
            terms.append(V @ U.T if b.role == "out" else -U @ V.T)
        if not terms:
            raise ValueError(f"{self.name}: the symmetry moves no parameter")
        G = sum(terms[1:], terms[0])
        return self.symmetry.group.project_to_algebra(G - G.T)   # a subalgebra of so(h): the part it pairs with

    def latex(self) -> str:
        return (rf"J_{{{name_latex(self.symmetry.site)}}} = G - G^{{T}},\ G = \sum_{{\mathrm{{out}}}} \dot U U^{{T}} "
                rf"- \sum_{{\mathrm{{in}}}} U \dot U^{{T}} \ \text{{(decays as }} e^{{-\gamma t}} "
                r"\text{ under heavy ball; } 0 \text{ along gradient flow)}")

    def __str__(self) -> str:
        moved = ", ".join(dict.fromkeys(b.tensor for b in self.symmetry.moving_bindings()))
        return f"{self.name} = G - G.T, G = sum_out U' U.T - sum_in U U'.T over {moved} (angular momentum)"

    def _repr_latex_(self) -> str:
        return f"${self.latex()}$"


def _python_name(name: str) -> str:
    return identifier(name)


def _region_latex(region: Binding, shapes: Mapping[str, tuple]) -> str:
    """A tensor region in LaTeX: the tensor (:func:`~symalg.symbolic.printing.tensor_latex`), with the slice it
    covers when it is not all of it (``b_{v}[8:16]``, ``W_{o}[:, 0:8]``)."""
    name = tensor_latex(region.tensor)
    shape = shapes[region.tensor]
    if region.start == 0 and region.width * region.block == shape[region.axis]:
        return name
    index = [":"] * region.axis + [f"{region.start}:{region.start + region.width * region.block}"]
    return rf"{name}[{', '.join(index)}]"


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
class Symmetry:
    """One group acting on one site class of a traced model.

    Attributes
    ----------
    site : the site class name, its first member's (the module path of the layer producing it, see
        :mod:`symalg.symbolic.inference`); ``members`` all tied sites, in data-flow order.
    group : the group (:mod:`symalg.catalogue.groups`); ``bindings`` the tensor regions it moves.
    translations : for a translation group, the translation families
        (:class:`~symalg.catalogue.bindings.TranslationFamily`) whose directions ``B_i`` form its basis, in order;
        with absorbers (a shear) ``B_i`` depends on the readers' weights at the parameters it is applied to.
    shifts : for affine sign flips (``σ(−z) = 2c − σ(z)``), the ``(reader, c)`` pairs
        (:class:`~symalg.catalogue.bindings.Absorber`): each reader's bias absorbs ``−W' τ(g)`` with
        ``τ(g) = c(1 − g1)`` and ``W'`` the moved weight.
    acts_on_buffers : the action moves buffers (running statistics) as well as parameters.
    checks : the symbolic checks (:class:`~symalg.symbolic.checks.SymbolicCheck`: declared identity, site
        invariance, infinitesimal identity) of every activation acting on the site, for the declared group the
        claim rests on; three per activation, whatever the front end; empty where no activation acts (a linear
        bottleneck, a translation).
    """

    site: str
    members: tuple[str, ...]
    group: SiteGroup
    bindings: tuple[Binding, ...]
    shapes: Mapping[str, tuple] = field(repr=False)
    translations: tuple[TranslationFamily, ...] = field(default=(), repr=False)
    shifts: tuple = field(default=(), repr=False)
    checks: tuple = field(default=(), repr=False)

    @property
    def label(self) -> str:
        return f"{self.group.name} on {self.site}"

    @property
    def acts_on_buffers(self) -> bool:
        return any(b.buffer for b in self._moving_bindings) or \
            any(f.moves_buffers for f in self.translations)

    @cached_property
    def tensors(self) -> tuple[str, ...]:
        """Names of the tensors the action moves."""
        names = [b.tensor for b in self.bindings if self.group.kind not in b.invariant] + \
            [r.tensor for f in self.translations for r in f.regions] + \
            [a.bias for a in self._absorbers()]  # readers' biases absorbing a shift or a translation
        return tuple(dict.fromkeys(names))

    @property
    def reads(self) -> tuple[str, ...]:
        """Names of the tensors the action reads without moving them: the readers' weights of a shear."""
        moved = set(self.tensors)
        return tuple(dict.fromkeys(a.weight for f in self.translations for a in f.absorbers if a.weight not in moved))

    @property
    def sheared(self) -> bool:
        """A translation whose directions depend on the parameters (readers' biases absorb it)."""
        return any(f.sheared for f in self.translations)

    def _absorbers(self) -> list[Absorber]:
        return [a for f in self.translations for a in f.absorbers] + [a for a, _ in self.shifts]

    # -- numeric action -------------------------------------------------------------------------
    def moving_bindings(self) -> list[Binding]:
        """The bindings the action moves: a group permuting entries moves a diagonal map's region once
        (``permutes_entries``); positive scaling leaves regions of power 0 (the readers of a normalised value)
        where they are (``moves_region``), and an even activation's input flips the readers of its output
        (``Binding.invariant``)."""
        return list(self._moving_bindings)

    @cached_property
    def _moving_bindings(self) -> tuple[Binding, ...]:
        moving = [b for b in self.bindings if self.group.moves_region(b.power) and self.group.kind not in b.invariant]
        if not self.group.permutes_entries:
            return tuple(moving)
        first: dict = {}
        for b in moving:
            first.setdefault(b.region, b)
        return tuple(first.values())

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor,
              inplace: bool = False, checked: bool = True) -> dict[str, torch.Tensor]:
        """Parameters (and buffers) moved by the group element ``g``; untouched tensors are shared.

        ``g`` is checked to be an element of the group (:meth:`~symalg.catalogue.groups.SiteGroup.check_element`:
        shape, finiteness, membership); anything else raises ``ValueError`` naming the group.
        ``checked=False`` skips that check for elements the group made itself
        (:meth:`~symalg.catalogue.groups.SiteGroup.sample`: for a 3072-wide permutation the check costs more than
        the move). With ``inplace`` the moved regions are written into the tensors of ``params`` (the
        caller's own copies) instead of into fresh copies: composing many claims on a large model
        (certification) then copies each tensor once, not once per claim.
        """
        move = self.group.mover(g, checked)   # checks g once; operators computed once for all regions (g⁻¹ for GL)
        moved = dict(params)
        if self.translations:   # one move per family, each at the parameters the previous ones left
            start = 0
            for family in self.translations:
                count = family.count(self.shapes)
                for tensor, change in family.move(moved, g[start:start + count]).items():
                    moved[tensor] = moved[tensor] + change
                start += count
            return moved
        for b in self._moving_bindings:
            diagonal = move.diagonal(b.role, b.power)
            if diagonal is not None:   # scale the region where it lies, as hand-written code would
                moved[b.tensor] = b.scale(moved[b.tensor], diagonal, inplace)
                continue
            U = b.unfold(moved[b.tensor])
            moved[b.tensor] = b.fold(moved[b.tensor], move(U, b.role, b.power), inplace)
        for absorber, center in self.shifts:   # the moved weight W' reads τ(g): the bias gives back W' τ(g)
            tau = float(center) * (1 - torch.diagonal(g))
            moved[absorber.bias] = moved[absorber.bias] - absorber.absorbed(moved, tau)
        return moved

    def apply_algebra(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """``exp(M)·θ`` for ``M`` in the Lie algebra (checked)."""
        self.group.check_algebra_element(M)
        return self.apply(params, self.group.exp(M))

    def tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """The infinitesimal action ``M·θ`` on the tensors it moves: linear in ``M``, defined for any ``M`` of the
        algebra's shape (unchecked, so that :mod:`symalg.numeric.orbit_rank` can differentiate it under ``vmap``)."""
        if self.translations:
            return {tensor: torch.tensordot(M, D, dims=1) for tensor, D in self.directions(params).items()}
        out: dict[str, torch.Tensor] = {}
        for b in self.moving_bindings():
            dU = self.group.act_infinitesimally(M, b.unfold(params[b.tensor]), b.role, b.power)
            base = out.get(b.tensor, torch.zeros_like(params[b.tensor]))
            out[b.tensor] = base + b.fold(torch.zeros_like(params[b.tensor]), dU)
        return out

    @cached_property
    def disjoint_regions(self) -> tuple[tuple[Binding, ...], ...] | None:
        """The moving bindings grouped by region (one group per region), or None where the tangent is not the sum of
        its regions' parts: two regions of one tensor that share entries (slices of different axes, or overlapping
        slices of one), or a translation (its directions are whole tensors)."""
        if self.translations:
            return None
        regions: dict[tuple, list[Binding]] = {}
        for b in self.moving_bindings():
            regions.setdefault(b.region, []).append(b)
        spans: dict[str, list[tuple[int, int, int]]] = {}
        for b, *_ in regions.values():
            spans.setdefault(b.tensor, []).append((b.axis, b.start, b.start + b.width * b.block))
        for listed in spans.values():
            for i, (axis, start, end) in enumerate(listed):
                if any(axis != other or start < other_end and other_start < end
                       for other, other_start, other_end in listed[:i]):
                    return None
        return tuple(tuple(bindings) for bindings in regions.values())

    def region_tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[Binding, torch.Tensor]:
        """``M·θ`` region by region (:attr:`disjoint_regions`, which must not be None): ``{binding: dU}``, ``dU`` the
        change of ``binding.unfold(θ)`` summed over the bindings of its region. The regions are disjoint, so an inner
        product or norm of the tangent is the sum over them, and no tensor of the parameters' size is built (a
        head's region of a packed projection is a small part of it). Linear in ``M``; unchecked, like
        :meth:`tangent`."""
        regions = self.disjoint_regions
        if regions is None:
            raise ValueError(f"{self.label}: its regions overlap or it translates; use tangent()")
        out: dict[Binding, torch.Tensor] = {}
        for bindings in regions:
            U = bindings[0].unfold(params[bindings[0].tensor])
            for b in bindings:
                dU = self.group.act_infinitesimally(M, U, b.role, b.power)
                out[bindings[0]] = dU if b is bindings[0] else out[bindings[0]] + dU
        return out

    def directions(self, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A translation's directions ``B_i`` stacked per tensor, ``{tensor: (k, *shape)}`` (zero where ``B_i`` does
        not move it), at the dtype/device of ``params`` and, for a shear, at its readers' weights there.

        >>> import torch, symalg
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Identity(), torch.nn.Linear(3, 1))
        >>> analysis = symalg.derive(symalg.trace(model.double(), (torch.randn(4, 2, dtype=torch.float64),)))
        >>> shear = next(s for s in analysis.symmetries if s.sheared)          # 0.bias into 2.bias
        >>> params = dict(model.named_parameters())
        >>> B = shear.directions(params)
        >>> B["0.bias"].shape, torch.equal(B["2.bias"][:, 0], -params["2.weight"][0])
        (torch.Size([3, 3]), True)
        """
        listed = [direction for family in self.translations for direction in family.directions(params)]
        tensors = dict.fromkeys(t for direction in listed for t in direction)
        return {t: torch.stack([d[t] if t in d else torch.zeros_like(params[t]) for d in listed]) for t in tensors}

    # -- symbolic -------------------------------------------------------------------------------
    @cached_property
    def conserved(self) -> ConservedQuantity | None:
        """The conserved quantity of gradient flow (module docstring), or ``None``."""
        if self.acts_on_buffers or self.group.conserved_kind is None:
            return None
        symbols = _Symbols(self.shapes)
        name = _python_name(self.site)
        if self.translations:
            exprs = {}
            for family in self.translations:
                region = family.regions[0]
                U = symbols.region(region)
                whole = region.start == 0 and region.width * region.block == self.shapes[region.tensor][0]
                key = f"ell_{name}_{_python_name(region.tensor)}" + ("" if whole else f"_{region.start}")
                if family.pattern == "opposite":   # ⟨θ, B_i⟩ = U_i − V_i: the difference of the two summed biases
                    U = U - symbols.region(family.regions[1])
                exprs[key] = U if family.pattern in ("entries", "opposite") else sp.OneMatrix(1, U.shape[0]) * U
            return ConservedQuantity(f"ell_{name}", "linear", exprs, symbols.reads, symbols.suffixes,
                                     tuple(symbols.vectors), self.site)
        terms = []
        for b in self.moving_bindings():
            if b.power == 0:
                continue
            sign = 1 if b.role == "out" else -1
            power = sp.Rational(b.power.numerator, b.power.denominator)
            terms.append(sign * power * self.group.conserved_term(symbols.region(b)))
        if not terms:
            return None
        kind = self.group.conserved_kind
        key = f"{'C' if kind == 'matrix' else 'q'}_{name}"
        return ConservedQuantity(key, kind, {key: sp.MatAdd(*terms)}, symbols.reads, symbols.suffixes,
                                 tuple(symbols.vectors), self.site)

    @property
    def element_symbol(self) -> sp.MatrixSymbol:
        """The group element in :meth:`action_expressions`: ``g`` (``h × h``), or ``d`` (``h × 1``, the diagonal)
        for positive scaling."""
        return self.group.element_symbol("d" if self.group.element_format == "diagonal" else "g")

    def action_expressions(self) -> dict[sp.MatrixSymbol, sp.MatrixExpr]:
        """The action of :attr:`element_symbol` as SymPy matrix expressions, ``{region symbol: its image}``: what
        :meth:`apply` computes, for display (LaTeX) and symbolic work.

        A whole 2-D tensor is its own symbol (``W ↦ π(g) W`` for a producer's rows, ``W ↦ W π(g)⁻¹`` for a
        reader's columns, composed when both move); a bias is an ``h × 1`` column; any other region (a slice, a
        conv kernel, a block) is the ``width × rest`` unfolding named as in :attr:`conserved`. Positive scaling
        acts by ``diag(d)^power``; an affine sign flip's reader bias absorbs ``−W' τ(g)``, ``τ(g) = c(1 − g1)``.

        >>> import symalg
        >>> symmetry = symalg.derive("linear(n, h) -> identity -> linear(h, m, bias=False)").symmetries[0]
        >>> {str(k): str(v) for k, v in symmetry.action_expressions().items()}
        {'0.weight': 'g*0.weight', '0.bias': 'g*0.bias', '2.weight': '2.weight*g**(-1)'}

        Raises ``NotImplementedError`` for translations (their element is a vector of per-direction coefficients,
        see :meth:`apply`) and for a sign-flip shift read through a region that is not a whole 2-D weight.
        """
        if self.group.kind == "T":
            raise NotImplementedError(f"action_expressions: {self.label} is a translation (θ ↦ θ + Σ t_i B_i); "
                                      "it has no matrix expression")
        symbols, G = _Symbols(self.shapes), self.element_symbol
        images: dict[sp.MatrixSymbol, sp.MatrixExpr] = {}
        for b in self.moving_bindings():
            U = symbols.region(b)
            key, transposed = (U.arg, True) if isinstance(U, sp.Transpose) else (U, False)
            if self.group.homogeneity is not None:   # positive scaling: π(d) = d^power, diagonal
                power = sp.Rational(b.power.numerator, b.power.denominator) * (1 if b.role == "out" else -1)
                A = sp.DiagMatrix(G) if power == 1 else sp.DiagMatrix(sp.HadamardPower(G, power))
            else:  # a reader's unfolded region moves by π(g)⁻ᵀ (π(g) = g here)
                A = self.group.as_operator(G) if b.role == "out" else self.group.reader_expr(G)
            current = images.get(key, key)
            moved = A * (current.T if transposed else current)
            images[key] = moved.T if transposed else moved
        for absorber, _ in self.shifts:
            matrix = self._map_matrix(symbols, absorber, images)
            if matrix is None:
                raise NotImplementedError(f"action_expressions: the shift absorbed by {absorber.bias} is read through "
                                          f"{absorber.columns.describe()}, not a whole 2-D weight")
            b = symbols.region(Binding(absorber.bias, 0, 0, self.shapes[absorber.bias][0]))
            images[b] = b - matrix * self.group.shift_expr(G)
        return images

    def _map_matrix(self, symbols: _Symbols, absorber: Absorber,
                    images: Mapping[sp.MatrixSymbol, sp.MatrixExpr]) -> sp.MatrixExpr | None:
        """The reader's weight as its ``out × in`` matrix (moved, where the action moves it), or ``None`` when the
        reader reads a slice, a block or a kernel (no whole 2-D weight)."""
        if len(self.shapes[absorber.bias]) != 1 or absorber.columns.axis == absorber.out_axis:
            return None
        region = symbols.region(absorber.columns)
        key, transposed = (region.arg, True) if isinstance(region, sp.Transpose) else (region, False)
        if not isinstance(key, sp.MatrixSymbol) or key.name != absorber.weight:
            return None
        weight = images.get(key, key)
        return weight if transposed else weight.T

    @cached_property
    def angular_momentum(self) -> AngularMomentum | None:
        """The angular-momentum relation (:class:`AngularMomentum`) of an orthogonal group, whose
        antisymmetric generators have no conserved ``Q``; ``None`` for other groups and actions moving buffers."""
        if self.acts_on_buffers or not self.group.has_angular_momentum or not self.group.is_continuous:
            return None
        return AngularMomentum(self)

    def action_latex(self) -> list[str]:
        """:meth:`action_expressions` as LaTeX, one ``U \\mapsto g U`` per moved region; for a shear each
        translated region ``U \\mapsto U + t`` and each reader's bias ``b \\mapsto b - W[:, c]\\, t``; empty for
        other translations."""
        if self.group.kind == "T":
            return self._shear_latex()
        return [rf"{latex(region)} \mapsto {latex(image)}" for region, image in self.action_expressions().items()]

    def _shear_latex(self) -> list[str]:
        rows: list[str] = []
        given_back: dict[str, list[str]] = {}
        for family in self.translations:
            if not family.sheared:
                continue
            for region in family.regions:
                name = _region_latex(region, self.shapes)
                rows.append(rf"{name} \mapsto {name} + t")
            for absorber in family.absorbers:
                given_back.setdefault(absorber.bias, []).append(_region_latex(absorber.columns, self.shapes))
        for bias, columns in given_back.items():
            read = columns[0] if len(columns) == 1 else r"\left(" + " + ".join(columns) + r"\right)"
            rows.append(rf"{tensor_latex(bias)} \mapsto {tensor_latex(bias)} - {read}\, t")
        return list(dict.fromkeys(rows))

    def latex(self) -> str:
        action = self.action_latex() or [", ".join(tensor_latex(t) for t in self.tensors) + r" \text{ translated}"]
        return rf"{self.group.latex()} \text{{ on {escape_latex(self.site)}: }} " + r",\ ".join(action)

    def moves(self) -> list[str]:
        """What the action moves, in words: the bound regions, or each translated region (``pattern``) and the
        readers' biases that give a shear back."""
        moved = [b.describe() for b in self.bindings] or [f"{r.tensor} ({f.pattern})" for f in self.translations
                                                           for r in f.regions]
        moved += [a.describe() for f in self.translations for a in f.absorbers]
        return list(dict.fromkeys(moved))

    def __str__(self) -> str:
        lines = [f"{self.label}: moves " + "; ".join(self.moves())]
        if self.conserved is not None:
            lines.append(f"  conserved: {self.conserved}")
        return "\n".join(lines)

    def _repr_latex_(self) -> str:
        return f"${self.latex()}$"
