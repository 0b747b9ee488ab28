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
>>> analysis = symalg.derive(symalg.trace(model))
>>> [s.group.name for s in analysis.symmetries]
['GL(4)']
>>> print(analysis.symmetries[0].conserved)
C__0 = 0.bias*0.bias.T + 0.weight*0.weight.T - 2.weight.T*2.weight
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

import sympy as sp
import torch

from .bindings import Binding
from .catalogue import CATALOGUE
from .groups import (GeneralLinear, Orthogonal, Permutations, PositiveScaling, SignFlips, SiteGroup,
                     Translations)
from .inference import Blocked
from .lowering import LoweredFunction, lower
from .model_inference import ModelSites, infer_model
from .printing import latex, sstr
from .tracing import ModelGraph

__all__ = ["ModelSymmetry", "ModelAnalysis", "ModelConserved", "derive_model"]


def _group(kind: str, width: int, alpha) -> SiteGroup:
    return {"GL": lambda: GeneralLinear(width), "O": lambda: Orthogonal(width),
            "PS": lambda: PositiveScaling(width, alpha=alpha if alpha.denominator != 1 else int(alpha)),
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
    directions : for translations, ``(tensor, tensor → direction)`` builders of the basis ``B_i``.
    acts_on_buffers : the action moves buffers (running statistics) as well as parameters.
    """

    site: str
    members: tuple[str, ...]
    group: SiteGroup
    bindings: tuple[Binding, ...]
    shapes: Mapping[str, tuple] = field(repr=False)
    directions: tuple = field(default=(), repr=False)

    @property
    def label(self) -> str:
        return f"{self.group.name} on {self.site}"

    @property
    def acts_on_buffers(self) -> bool:
        return any(b.buffer and (b.power != 0 or isinstance(self.group, Permutations)) for b in self.bindings) or \
            any(d[2] for d in self.directions)

    @property
    def tensors(self) -> tuple[str, ...]:
        """Names of the tensors the action moves."""
        names = [b.tensor for b in self.bindings] + [d[0] for d in self.directions]
        return tuple(dict.fromkeys(names))

    # -- numeric action -------------------------------------------------------------------------
    def _operator(self, b: Binding, g: torch.Tensor) -> torch.Tensor:
        """The matrix (or diagonal) by which ``g`` multiplies the unfolded region of ``b``."""
        if isinstance(self.group, PositiveScaling):
            return g ** (float(b.power) if b.role == "out" else -float(b.power))
        if b.role == "out" or isinstance(self.group, (Orthogonal, Permutations, SignFlips)):
            return g
        return torch.linalg.inv(g).transpose(-1, -2)

    def _moves(self) -> list[Binding]:
        """Bindings that act: a permutation moves a diagonal map's region once."""
        if isinstance(self.group, Permutations):
            seen, moves = set(), []
            for b in self.bindings:
                if b.region not in seen:
                    seen.add(b.region)
                    moves.append(b)
            return moves
        return [b for b in self.bindings if not (isinstance(self.group, PositiveScaling) and b.power == 0)]

    def apply(self, params: Mapping[str, torch.Tensor], g: torch.Tensor) -> dict[str, torch.Tensor]:
        """Parameters (and buffers) moved by the group element ``g``; untouched tensors are shared."""
        moved = dict(params)
        if isinstance(self.group, Translations):
            for index, (tensor, direction, _) in enumerate(self._basis(params)):
                moved[tensor] = moved[tensor] + g[index] * direction
            return moved
        for b in self._moves():
            A = self._operator(b, g)
            U = b.unfold(moved[b.tensor])
            moved[b.tensor] = b.fold(moved[b.tensor], A[:, None] * U if A.dim() == 1 else A @ U)
        return moved

    def apply_algebra(self, params, M: torch.Tensor) -> dict[str, torch.Tensor]:
        """``exp(M)·θ``."""
        return self.apply(params, self.group.exp(M))

    def tangent(self, params: Mapping[str, torch.Tensor], M: torch.Tensor) -> dict[str, torch.Tensor]:
        """The infinitesimal action ``M·θ`` on the tensors it moves."""
        if isinstance(self.group, Translations):
            out: dict[str, torch.Tensor] = {}
            for index, (tensor, direction, _) in enumerate(self._basis(params)):
                out[tensor] = out.get(tensor, 0) + M[index] * direction
            return out
        out = {}
        for b in self._moves():
            if isinstance(self.group, PositiveScaling):
                dA = float(b.power) * (M if b.role == "out" else -M)
            else:
                dA = M if b.role == "out" else -M.transpose(-1, -2)
            U = b.unfold(params[b.tensor])
            dU = dA[:, None] * U if dA.dim() == 1 else dA @ U
            base = out.get(b.tensor, torch.zeros_like(params[b.tensor]))
            out[b.tensor] = base + b.fold(torch.zeros_like(params[b.tensor]), dU)
        return out

    def _basis(self, params) -> list[tuple[str, torch.Tensor, bool]]:
        """Translation directions ``(tensor, B_i, is_buffer)`` at the dtype/device of ``params``."""
        basis = []
        for tensor, build, is_buffer, _ in self.directions:
            for direction in build(params[tensor]):
                basis.append((tensor, direction, is_buffer))
        return basis

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
            for tensor, kind in self._linear_terms():
                b = Binding(tensor, 0, 0, self.shapes[tensor][0])
                U = symbols.region(b)
                key = f"ell_{name}_{_python_name(tensor)}"
                exprs[key] = sp.OneMatrix(1, U.shape[0]) * U if kind == "column sums" else U
            return ModelConserved(f"ell_{name}", "linear", exprs, symbols.reads, symbols.suffixes,
                                  tuple(symbols.vectors))
        diagonal = isinstance(self.group, PositiveScaling)
        terms = []
        for b in self._moves():
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

    def _linear_terms(self) -> list[tuple[str, str]]:
        return [(tensor, kind) for tensor, kind in (d[3] for d in self.directions)]

    def latex(self) -> str:
        moved = ", ".join(rf"\mathrm{{{t}}}" for t in self.tensors)
        return rf"{self.group.latex()} \text{{ on {self.site}, moving }} {moved}"

    def __str__(self):
        lines = [f"{self.label}: moves " + "; ".join(b.describe() for b in self.bindings)]
        if self.directions:
            lines.append("  translations of " + ", ".join(dict.fromkeys(d[0] for d in self.directions)))
        if self.conserved is not None:
            lines.append(f"  conserved: {self.conserved}")
        return "\n".join(lines)

    def _repr_latex_(self):
        return f"${self.latex()}$"


@dataclass(frozen=True, eq=False)
class ModelAnalysis:
    """Everything derived for a traced model: symmetries, blocked notes, and the inference result."""

    model_graph: ModelGraph
    symmetries: tuple[ModelSymmetry, ...]
    blocked: tuple[Blocked, ...]
    sites: ModelSites = field(repr=False)
    loss: str = "mse"

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
        return "\n".join(lines)


def _translation_directions(kind: str, node: str, weight, bias) -> tuple:
    """Builders of the translation basis: ``T`` moves each bias entry (or running mean) alone; ``T1``
    adds ``1 vᵀ`` to the weight (``v`` over its input entries) and ``1`` to the bias."""
    directions = []
    if kind == "T":
        is_buffer = weight is None
        directions.append((bias, _unit_vectors, is_buffer, (bias, "entries")))
    else:
        directions.append((weight, _constant_rows, False, (weight, "column sums")))
        if bias:
            directions.append((bias, _all_ones, False, (bias, "column sums")))
    return tuple(directions)


def _unit_vectors(tensor: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.eye(tensor.numel(), dtype=tensor.dtype, device=tensor.device).reshape(-1, *tensor.shape))


def _constant_rows(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``1 ⊗ e_j``: the same change for every output row, one direction per entry of a row."""
    rest = tensor[0].numel()
    eye = torch.eye(rest, dtype=tensor.dtype, device=tensor.device).reshape(rest, 1, *tensor.shape[1:])
    return list(eye.expand(rest, *tensor.shape))


def _all_ones(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [torch.ones_like(tensor)]


def derive_model(model_graph: ModelGraph, catalogue: Mapping = CATALOGUE, loss: str = "mse") -> ModelAnalysis:
    """Infer the sites of a traced model and build its symmetries (see the module docstring)."""
    sites = infer_model(model_graph, catalogue, loss)
    shapes = {**{k: tuple(v.shape) for k, v in model_graph.model.named_parameters()},
              **{k: tuple(v.shape) for k, v in model_graph.model.named_buffers()}}
    symmetries = []
    for cls in sites.classes:
        for kind in cls.kinds:
            if kind in ("T", "T1"):
                directions = tuple(d for t in cls.translations if t[0] == kind
                                   for d in _translation_directions(*t))
                width = sum(len(build(torch.empty(shapes[tensor], device="meta"))) for tensor, build, *_ in directions)
                group = Translations(width, "bias" if kind == "T" else "along 1")
                symmetries.append(ModelSymmetry(cls.name, cls.members, group, (), shapes, directions))
                continue
            group = _group(kind, cls.width, cls.alpha)
            if group.is_continuous or not isinstance(group, Permutations) or cls.width > 1:  # S(1) is trivial
                symmetries.append(ModelSymmetry(cls.name, cls.members, group, cls.bindings, shapes))
    for perm in sites.permutations:
        symmetries.append(ModelSymmetry(perm.name, perm.members, Permutations(perm.width), perm.bindings, shapes))
    return ModelAnalysis(model_graph, tuple(symmetries), sites.blocked, sites, loss)
