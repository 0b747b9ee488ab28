"""Exact linear symmetry discovery: every linear (optionally affine) vector field that leaves a model invariant.

A vector field ``V(θ) = Aθ + c`` on the parameters ``θ ∈ R^P`` is an infinitesimal symmetry of the network
function when ``J_f(θ, x) V(θ) = 0`` for every ``θ`` and input ``x`` (``J_f`` the Jacobian of every output in
``θ``): then ``f`` is constant along the flow ``θ(t) = exp(t Ã)(θ, 1)``, ``Ã = [[A, c], [0, 0]]``, exactly, not only
to first order. The condition is linear in the unknowns ``(A, c)``: at a sample ``(θ_s, x_s)`` output ``o`` gives
the row ``(J_s[o] ⊗ θ_s, J_s[o])``, since ``J_s[o] (Aθ_s + c) = Σ_ij J_s[o, i] A_ij θ_s[j] + J_s[o] · c``. The
solutions form a Lie algebra under the bracket of vector fields
``[Aθ + a, Bθ + b] = (BA − AB)θ + (Ba − Ab)``: :func:`discover` stacks rows from random ``θ_s`` (and random
inputs, or the given data) until there are more rows than unknowns, takes the null space of the stacked rows
from its singular values (a certified rank, :func:`~symalg.numeric.orbit_rank.certified_rank`'s rule with a
relative floor), and checks what the sampling cannot promise: that the null space is closed under the bracket,
and that each basis field (and a random combination) leaves every output unchanged along ``exp(Ã)`` at
held-out parameters and inputs (a finite, not infinitesimal, check).

**Structure.** ``A`` is split into blocks ``A[T, T']`` (tensor ``T`` moved in proportion to tensor ``T'``).
``blocks="all"`` allows every pair (``P²`` unknowns); ``"local"`` only pairs of tensors of the same or of
neighbouring modules (in the order of ``named_parameters``), which holds every catalogue symmetry of a chain
of layers (each moves a layer's rows against the next one's columns) at a fraction of the unknowns;
``"axes"`` (:mod:`symalg.discovery.axes`) one matrix per axis of each tensor, contractions of one tensor into
another's shape and ``c`` (unknowns ``≈ Σ_T Σ_a n_a² + P``: no ``P × P`` matrix anywhere on that path); ``"auto"``
(default) takes ``"all"``, then ``"local"`` up to ``max_unknowns``, then ``"axes"``. A symmetry whose field needs a
block outside the ansatz (a residual stream read by distant layers, under ``"local"``) is reported as outside it,
never as missing.

**Readable basis.** The null space is returned in reduced row-echelon form (pivots chosen by a column-pivoted
QR): each generator has a pivot entry 1 that no other generator has, so ``gl(h)`` comes out as the matrix
units ``E_ij`` acting on a layer pair and positive scaling as one generator per neuron. Each generator
lists the tensors it moves and the tensors its field reads.

**Comparison with the derived symmetries.** Each derived continuous symmetry's infinitesimal action
``M_i·θ`` (:func:`~symalg.numeric.orbit_rank.action_matrix`) is affine in ``θ``; its ``(A_i, c_i)`` are read off
at ``θ = 0`` and the unit vectors. With ``D`` the discovered span and ``E`` the derived one (in the same
coordinates): ``explained = dim(D ∩ E)``, ``new = dim D − explained`` (what the catalogue misses, with a
readable basis of ``D ⊖ E``), and ``unconfirmed``: derived symmetries whose fields do not lie in ``D``, which
either need a block outside the ansatz or are **claims discovery does not confirm** (the report lists them
first).

>>> import symalg
>>> report = symalg.discover("linear(2, 3) -> relu -> linear(3, 1)")
>>> report.dimension, report.derived_dimension, report.explained, report.new, report.unconfirmed_labels
(3, 3, 3, 0, ())
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence, Union

import numpy as np
import torch
from torch.func import functional_call

from symalg.discovery.axes import AxesLayout, FlatParameters
from symalg.errors import SpecError
from symalg.progress import Progress, report
from symalg.frontend.outputs import output_tensors
from symalg.numeric.orbit_rank import RankDecision, action_matrix
from symalg.symbolic.derive import Analysis, derive
from symalg.verification.verifier import _concrete, _inputs, _model

__all__ = ["Generator", "Discovery", "discover", "ParameterLayout", "NullSpaceCertificate", "bracket"]

Params = dict[str, torch.Tensor]
BLOCK_MODES = ("auto", "all", "local", "axes")
MAX_UNKNOWNS = 3000
"""Largest number of unknowns ``blocks="auto"`` takes as ``"all"`` (a dense SVD of about ``1.3 n × n``)."""


# ---------------------------------------------------------------------------------------------
# the parameter layout and the unknowns
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParameterLayout(FlatParameters):
    """The parameters flattened in ``named_parameters`` order, and the unknowns ``(A blocks, c)``.

    ``blocks`` are ``(row tensor, column tensor)`` pairs: block ``(T, T')`` holds ``A[T, T']`` row-major;
    the affine part ``c`` (all ``P`` entries) follows when ``affine``.
    """

    names: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]]
    blocks: tuple[tuple[str, str], ...]
    affine: bool

    @property
    def block_offsets(self) -> dict[tuple[str, str], int]:
        out, start = {}, 0
        for b in self.blocks:
            out[b] = start
            start += self.sizes[b[0]] * self.sizes[b[1]]
        return out

    @property
    def linear_unknowns(self) -> int:
        return sum(self.sizes[r] * self.sizes[c] for r, c in self.blocks)

    @property
    def unknowns(self) -> int:
        return self.linear_unknowns + (self.P if self.affine else 0)

    def rows(self, J: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """The constraint rows ``(J[o] ⊗ θ restricted to the blocks, J[o])`` of one sample (``J``: ``r × P``)."""
        size, offset = self.sizes, self.offsets
        parts = []
        for r, c in self.blocks:
            Jr = J[:, offset[r]:offset[r] + size[r]]
            tc = theta[offset[c]:offset[c] + size[c]]
            parts.append((Jr[:, :, None] * tc[None, None, :]).reshape(J.shape[0], -1))
        if self.affine:
            parts.append(J)
        return torch.cat(parts, dim=1)

    def dense(self, vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, c)`` (``P × P`` and ``P``) of one unknown vector."""
        P, size, offset = self.P, self.sizes, self.offsets
        A = vector.new_zeros(P, P)
        for (r, c), start in self.block_offsets.items():
            block = vector[start:start + size[r] * size[c]].reshape(size[r], size[c])
            A[offset[r]:offset[r] + size[r], offset[c]:offset[c] + size[c]] = block
        c_vec = vector[self.linear_unknowns:] if self.affine else vector.new_zeros(P)
        return A, c_vec

    def vector(self, A: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The unknown vector of ``(A, c)`` and the norm of what lies outside the ansatz (blocks not allowed, or
        a ``c`` without ``affine``)."""
        size, offset = self.sizes, self.offsets
        parts, kept = [], A.new_zeros(A.shape)
        for r, col in self.blocks:
            block = A[offset[r]:offset[r] + size[r], offset[col]:offset[col] + size[col]]
            parts.append(block.reshape(-1))
            kept[offset[r]:offset[r] + size[r], offset[col]:offset[col] + size[col]] = block
        outside = torch.linalg.norm(A - kept) ** 2
        if self.affine:
            parts.append(c)
        else:
            outside = outside + torch.linalg.norm(c) ** 2
        return torch.cat(parts), float(outside.sqrt())

    def field(self, vector: torch.Tensor, theta: torch.Tensor, constant: float = 1.0) -> torch.Tensor:
        """``Aθ + constant · c`` of one unknown vector."""
        A, c = self.dense(vector)
        return A @ theta + constant * c

    def normalised(self, vector: torch.Tensor) -> torch.Tensor:
        """``vector`` scaled to ``‖Ã‖_F = 1`` (``Ã = [[A, c], [0, 0]]``; its entries are the unknowns)."""
        return vector / max(float(torch.linalg.norm(vector)), 1e-300)

    def flow(self, vector: torch.Tensor, theta: torch.Tensor, t: float) -> torch.Tensor:
        """``exp(t Ã)(θ, 1)`` by ``matrix_exp`` of the dense ``(P + 1) × (P + 1)`` matrix."""
        A, c = self.dense(vector)
        M = torch.zeros(self.P + 1, self.P + 1, dtype=A.dtype)
        M[:self.P, :self.P], M[:self.P, self.P] = A, c
        return (torch.linalg.matrix_exp(t * M) @ torch.cat([theta, theta.new_ones(1)]))[:self.P]

    def terms(self, vector: torch.Tensor, cut: float) -> Iterator[tuple[str, str, float, str | None]]:
        """``(moved tensor, moved entry, coefficient, read entry or None for c)`` for each entry above ``cut``."""
        A, c = self.dense(vector)
        tensor_of = [n for n in self.names for _ in range(self.sizes[n])]
        for i, j in zip(*torch.nonzero(A.abs() > cut, as_tuple=True)):
            yield tensor_of[int(i)], self.entry(int(i)), float(A[i, j]), self.entry(int(j))
        for i in torch.nonzero(c.abs() > cut).reshape(-1).tolist():
            yield tensor_of[i], self.entry(i), float(c[i]), None


Layout = Union[ParameterLayout, AxesLayout]
"""A layout of the unknowns: dense blocks (``"all"``/``"local"``) or the axes ansatz (:mod:`symalg.discovery.axes`)."""


def _module(name: str) -> str:
    return name.rpartition(".")[0]


def _blocks(names: Sequence[str], sizes: Mapping[str, int], mode: str, affine: bool,
            max_unknowns: int) -> tuple[tuple[str, str], ...]:
    """The allowed ``(row, column)`` tensor pairs (module docstring)."""
    every = tuple((r, c) for r in names for c in names)
    count = sum(sizes[r] * sizes[c] for r, c in every) + (sum(sizes.values()) if affine else 0)
    if mode == "all" or (mode == "auto" and count <= max_unknowns):
        return every
    modules = list(dict.fromkeys(_module(n) for n in names))
    index = {m: i for i, m in enumerate(modules)}
    return tuple((r, c) for r, c in every if abs(index[_module(r)] - index[_module(c)]) <= 1)


def _layout(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]], mode: str, affine: bool,
            max_unknowns: int) -> tuple[Layout, str]:
    """The layout of ``mode`` and the mode taken: ``"auto"`` is ``"all"``, then ``"local"`` up to ``max_unknowns``,
    then ``"axes"``."""
    if mode != "axes":
        sizes = {n: math.prod(shapes[n]) for n in names}
        dense = ParameterLayout(tuple(names), shapes, _blocks(names, sizes, mode, affine, max_unknowns), affine)
        if mode != "auto" or dense.unknowns <= max_unknowns:
            return dense, mode
    return AxesLayout.build(names, shapes, affine), "axes"


def bracket(x: tuple[torch.Tensor, torch.Tensor], y: tuple[torch.Tensor, torch.Tensor]
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The Lie bracket of the affine vector fields ``X = Aθ + a`` and ``Y = Bθ + b``:
    ``[X, Y] = DY·X − DX·Y = (BA − AB)θ + (Ba − Ab)``.

    >>> A, B = torch.tensor([[0., 1.], [0., 0.]]), torch.tensor([[0., 0.], [1., 0.]])
    >>> bracket((A, torch.zeros(2)), (B, torch.zeros(2)))[0]
    tensor([[-1.,  0.],
            [ 0.,  1.]])
    """
    (A, a), (B, b) = x, y
    return B @ A - A @ B, B @ a - A @ b


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Generator:
    """One discovered vector field ``V(θ) = Aθ + c`` (a basis element of the discovered algebra).

    ``moves``: the tensors ``V`` changes; ``reads``: the tensors ``V`` depends on; ``terms``: its nonzero entries as
    ``(moved entry, coefficient, read entry or None for c)``; ``finite_error``: the largest relative change of any
    output along ``exp(±Ã)`` at held-out parameters and inputs; ``explained``: the fraction of the field (its
    norm) that the derived symmetries span.
    """

    vector: torch.Tensor = field(repr=False)
    layout: "Layout" = field(repr=False)
    moves: tuple[str, ...]
    reads: tuple[str, ...]
    terms: tuple[tuple[str, float, str | None], ...] = field(repr=False)
    finite_error: float
    explained: float

    @property
    def A(self) -> torch.Tensor:
        """The dense ``P × P`` linear part (built on demand: small models only under ``blocks="axes"``)."""
        return self.layout.dense(self.vector)[0]

    @property
    def c(self) -> torch.Tensor:
        return self.layout.field(self.vector, self.vector.new_zeros(self.layout.P))

    def field(self, theta: torch.Tensor) -> torch.Tensor:
        """``Aθ + c`` at a flat parameter vector."""
        return self.layout.field(self.vector, theta)

    def latex(self, limit: int = 6) -> str:
        """The field as ``\\dot\\theta`` equations, its first ``limit`` terms."""
        def name(entry: str) -> str:
            tensor, _, index = entry.partition("[")
            return f"\\theta^{{\\mathtt{{{tensor}}}}}_{{{index.rstrip(']')}}}"
        pieces = []
        for moved, coefficient, read in self.terms[:limit]:
            value = f"{coefficient:+.3g}"
            pieces.append(f"\\dot{{{name(moved)}}} \\mathrel{{+}}= {value}" + (f"\\,{name(read)}" if read else ""))
        more = f",\\ \\dots (+{len(self.terms) - limit})" if len(self.terms) > limit else ""
        return ",\\ ".join(pieces) + more

    def __str__(self) -> str:
        shown = "; ".join(f"d{m} += {c:+.3g}" + (f"·{r}" if r else "") for m, c, r in self.terms[:4])
        more = f"; … ({len(self.terms)} terms)" if len(self.terms) > 4 else ""
        return f"moves {', '.join(self.moves)}: {shown}{more}"

    def to_dict(self) -> dict:
        return {"moves": list(self.moves), "reads": list(self.reads),
                "terms": [[m, c, r] for m, c, r in self.terms], "finite_error": self.finite_error,
                "explained": self.explained}


@dataclass(frozen=True)
class Discovery:
    """What :func:`discover` found (module docstring).

    Attributes
    ----------
    model : the model's name; ``target`` ``"function"`` or ``"loss"``; ``affine`` whether ``c`` was allowed;
        ``blocks_mode`` the block ansatz used and ``unknowns`` its size; ``samples``/``rows`` what was stacked.
    rank : the :class:`~symalg.numeric.orbit_rank.RankDecision` of the stacked constraints;
        ``dimension = unknowns − rank``.
    generators : the readable basis (:class:`Generator`), grouped by the tensors they move.
    closure_error : the largest relative distance of a bracket of two generators from their span.
    combination_error : the finite check of a random combination of all generators; ``tolerance`` the bar.
    derived_dimension : the dimension of the derived symmetries' span inside the ansatz; ``outside`` the labels of
        derived symmetries the ansatz cannot hold (blocks, buffers); ``explained``/``new`` as in the module
        docstring; ``new_generators`` a readable basis of the new directions; ``unconfirmed_labels`` the derived
        symmetries whose fields discovery does not find (with the residual ``unconfirmed_errors``).
    certificate : the null-space solver's :class:`NullSpaceCertificate` (residual and completeness floor).
    tangent : ``(discovered, derived, joint)`` ranks of the tangent spaces at a held-out ``θ``: new *fields* may
        still point along derived directions at every ``θ`` (a translation along ``1`` before a LayerNorm with a
        coefficient that is any linear function of ``θ``); ``new_tangent = joint − derived`` counts the directions
        the catalogue misses pointwise.
    """

    model: str
    target: str
    affine: bool
    blocks_mode: str
    parameters: int
    unknowns: int
    samples: int
    rows: int
    rank: RankDecision
    generators: tuple[Generator, ...]
    closure_error: float
    combination_error: float
    tolerance: float
    derived_dimension: int
    derived_labels: tuple[str, ...]
    outside: tuple[str, ...]
    explained: int
    new_generators: tuple[Generator, ...]
    unconfirmed_labels: tuple[str, ...]
    unconfirmed_errors: tuple[float, ...]
    tangent: tuple[int, int, int]
    layout: Layout = field(repr=False)
    certificate: NullSpaceCertificate | None = None

    @property
    def dimension(self) -> int:
        """Dimension of the discovered Lie algebra: the linear (affine) vector fields ``θ ↦ Aθ + c`` leaving the
        model invariant at every ``θ``. Not the first-order null space at one point, which
        :func:`symalg.discovery.pointwise.null_space_at` reports."""
        return len(self.generators)

    @property
    def new(self) -> int:
        return len(self.new_generators)

    @property
    def new_tangent(self) -> int:
        """Tangent directions at a generic ``θ`` that discovery finds and the derived symmetries do not span."""
        return self.tangent[2] - self.tangent[1]

    @property
    def confirmed(self) -> bool:
        """Every generator and their random combination passed the finite check, and the span is closed."""
        return all(g.finite_error <= self.tolerance for g in self.generators) and \
            self.combination_error <= self.tolerance and self.closure_error <= math.sqrt(self.tolerance)

    @property
    def symmetries(self) -> tuple[Generator, ...]:
        """The generators that passed the finite invariance check: the ones reported as symmetries."""
        return tuple(g for g in self.generators if g.finite_error <= self.tolerance)

    def summary(self) -> str:
        lines = [f"discover({self.model}, target={self.target}, affine={self.affine}, blocks={self.blocks_mode}): "
                 f"{self.parameters} parameters, {self.unknowns} unknowns, {self.rows} rows from {self.samples} "
                 "samples"]
        if self.unconfirmed_labels:
            lines.append("NOT CONFIRMED by discovery (derived, but no invariant field found): " + "; ".join(
                f"{lab} (residual {err:.2g})" for lab, err in zip(self.unconfirmed_labels, self.unconfirmed_errors)))
        lines.append(f"discovered dimension {self.dimension} ({len(self.symmetries)} pass the finite check, "
                     f"closure error {self.closure_error:.2g}, combination error {self.combination_error:.2g}); "
                     f"{self.rank}")
        lines.append(f"derived dimension {self.derived_dimension}: explained {self.explained}, new {self.new} "
                     f"(tangent at a held-out θ: discovered {self.tangent[0]}, derived {self.tangent[1]}, "
                     f"new {self.new_tangent})"
                     + (f"; outside the ansatz: {', '.join(self.outside)}" if self.outside else ""))
        groups: dict[tuple[str, ...], int] = {}
        for g in self.generators:
            groups[g.moves] = groups.get(g.moves, 0) + 1
        lines += [f"  {count} generator(s) moving {', '.join(moves)}" for moves, count in groups.items()]
        lines += [f"  new: {g}" for g in self.new_generators[:10]]
        return "\n".join(lines)

    __str__ = summary

    def latex(self, limit: int = 12) -> str:
        """A LaTeX ``align*`` of the new directions (or of the basis when none is new) and the dimensions."""
        shown = self.new_generators or self.generators
        rows = [f"\\text{{dim}} &= {self.dimension},\\ \\text{{derived}} = {self.derived_dimension},\\ "
                f"\\text{{explained}} = {self.explained},\\ \\text{{new}} = {self.new}"]
        rows += [f"h_{{{i}}}: &\\ {g.latex()}" for i, g in enumerate(shown[:limit])]
        return "\\begin{align*}\n" + " \\\\\n".join(rows) + "\n\\end{align*}"

    def _repr_latex_(self) -> str:
        return "$" + self.latex().replace("align*", "aligned") + "$"

    def to_dict(self) -> dict:
        return {"model": self.model, "target": self.target, "affine": self.affine, "blocks": self.blocks_mode,
                "parameters": self.parameters, "unknowns": self.unknowns, "samples": self.samples,
                "rows": self.rows, "dimension": self.dimension, "rank": self.rank.rank, "gap": self.rank.gap,
                "closure_error": self.closure_error, "combination_error": self.combination_error,
                "tolerance": self.tolerance, "confirmed": self.confirmed,
                "derived_dimension": self.derived_dimension, "derived": list(self.derived_labels),
                "outside": list(self.outside), "explained": self.explained, "new": self.new,
                "tangent": {"discovered": self.tangent[0], "derived": self.tangent[1], "new": self.new_tangent},
                "unconfirmed": [{"symmetry": lab, "residual": err}
                                for lab, err in zip(self.unconfirmed_labels, self.unconfirmed_errors)],
                "generators": [g.to_dict() for g in self.generators],
                "new_generators": [g.to_dict() for g in self.new_generators],
                "certificate": dataclasses.asdict(self.certificate) if self.certificate else None}


# ---------------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------------
def _analysis(model_or_analysis: object, data: object, widths: Mapping[str, int] | None) -> Analysis:
    if isinstance(model_or_analysis, Analysis):
        analysis = model_or_analysis
    elif isinstance(model_or_analysis, torch.nn.Module):
        if data is None:
            raise SpecError("discover: a torch module is traced on its inputs; pass data=(tensor, ...)")
        from symalg.frontend.tracing import trace
        analysis = derive(trace(model_or_analysis, data if isinstance(data, tuple) else (data,)))
    else:
        analysis = derive(model_or_analysis)
    return _concrete(analysis, None, widths, "discover")[0]


class _Problem:
    """The model as a function of its flat parameters, with input and parameter samplers."""

    def __init__(self, analysis: Analysis, data: object, target: str, seed: int):
        self.model = _model(analysis, None, "cpu", torch.float64)
        self.inputs = _inputs(analysis, data, torch.float64, "cpu")
        self.keywords = {k: v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                         for k, v in analysis.model_graph.example_kwargs.items()}
        self.fixed = data is not None
        self.target = target
        self.buffers = {k: v.detach() for k, v in self.model.named_buffers()}
        self.params = {k: v.detach() for k, v in self.model.named_parameters()}
        self.generator = torch.Generator().manual_seed(seed)
        self.cross_entropy = analysis.loss == "cross_entropy"

    def _scale(self) -> float:
        """A log-uniform scale in ``[10^-0.5, 10]``: samples reach the kinks and saturations of bounded
        activations (``relu6`` is ``relu`` below 6, ``hardsigmoid`` linear on ``[-3, 3]``), which unit-scale
        samples would miss and report their scaling as a symmetry."""
        return float(10 ** (torch.rand((), generator=self.generator, dtype=torch.float64) * 1.5 - 0.5))

    def sample_inputs(self, scale: float | None = None) -> tuple:
        if self.fixed:
            return self.inputs
        factor = self._scale() if scale is None else scale
        return tuple(factor * torch.randn(x.shape, generator=self.generator, dtype=x.dtype)
                     if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in self.inputs)

    def sample_theta(self, layout: Layout, scale: float | None = None) -> torch.Tensor:
        """Gaussian parameters at the scale of the model's own (per tensor: their RMS, at least 0.1), times a
        random scale (:meth:`_scale`) or ``scale``."""
        factor = self._scale() if scale is None else scale
        parts = []
        for n in layout.names:
            own = max(float(self.params[n].pow(2).mean().sqrt()), 0.1) if self.params[n].numel() else 1.0
            parts.append(torch.randn(layout.sizes[n], generator=self.generator, dtype=torch.float64) * own * factor)
        return torch.cat(parts)

    def heldout(self, layout: Layout) -> list[tuple[torch.Tensor, tuple]]:
        """Held-out ``(θ, inputs)`` at the scales ``0.3, 1, 10`` (the finite check's points)."""
        return [(self.sample_theta(layout, scale), self.sample_inputs(scale)) for scale in (0.3, 1.0, 10.0)]

    def outputs(self, layout: Layout, inputs: tuple) -> Callable[[torch.Tensor], torch.Tensor]:
        """``θ ↦`` every output flattened (``target="function"``) or the per-sample losses of the first output."""
        targets: dict[str, torch.Tensor] = {}

        def f(theta: torch.Tensor) -> torch.Tensor:
            values = {**{k: v.clone() for k, v in self.buffers.items()}, **layout.unflatten(theta)}
            outs = output_tensors(functional_call(self.model, values, inputs, self.keywords))
            if self.target == "function":
                return torch.cat([o.reshape(-1) for _, o in outs if o.is_floating_point()])
            out = outs[0][1]
            out = out.reshape(-1, out.shape[-1]) if out.dim() > 1 else out.reshape(-1, 1)
            if "y" not in targets:
                targets["y"] = (torch.randint(out.shape[-1], out.shape[:1], generator=self.generator)
                                if self.cross_entropy else
                                torch.randn(out.shape, generator=self.generator, dtype=out.dtype))
            if self.cross_entropy:
                return torch.nn.functional.cross_entropy(out, targets["y"], reduction="none")
            return 0.5 * ((out - targets["y"]) ** 2).sum(-1)
        return f


def _compressed(R: torch.Tensor) -> torch.Tensor:
    """Rows spanning the row space of ``R`` (``S Vh`` of its SVD, singular values above ``1e-12 σ_max``):
    the constraints of one sample, as many rows as they are independent."""
    if R.shape[0] == 0:
        return R
    _, S, Vh = torch.linalg.svd(R, full_matrices=False)
    keep = S > 1e-12 * S[0]
    return S[keep, None] * Vh[keep]


_CHUNK = 16
"""Samples whose Jacobians are computed in one ``vmap``."""


def _jacobians(problem: "_Problem", layout: Layout, thetas: list[torch.Tensor],
               inputs: list[tuple]) -> list[torch.Tensor]:
    """``J(θ_s, x_s)`` for every sample: one ``vmap`` of ``jacrev`` over the samples (network function), else (the
    loss, whose targets are drawn inside, or a model ``vmap`` cannot run) one ``jacrev`` per sample."""
    if problem.target == "function":
        floats = [i for i, x in enumerate(inputs[0]) if isinstance(x, torch.Tensor) and x.is_floating_point()]

        def f(theta: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
            xs = list(inputs[0])
            for i, v in zip(floats, values):
                xs[i] = v
            return problem.outputs(layout, tuple(xs))(theta)
        try:
            stacked = [torch.stack([inp[i] for inp in inputs]) for i in floats]
            return list(torch.func.vmap(torch.func.jacrev(f))(torch.stack(thetas), *stacked))
        except (RuntimeError, ValueError, TypeError, NotImplementedError):
            pass
    return [torch.func.jacrev(problem.outputs(layout, x))(theta) for theta, x in zip(thetas, inputs)]


def _sample_rows(problem: "_Problem", layout: Layout, thetas: list[torch.Tensor], inputs: list[tuple]
                 ) -> tuple[list[torch.Tensor], list[int]]:
    """Each sample's constraint rows (normalised, zero rows dropped) and the rank of its Jacobian, which bounds the
    independent rows it brings (an SVD of the small ``r × P`` Jacobian, not of the ``r × unknowns`` rows)."""
    rows, ranks = [], []
    for theta, J in zip(thetas, _jacobians(problem, layout, thetas, inputs)):
        J = J.reshape(-1, layout.P)
        R = layout.rows(J, theta)
        norms = R.norm(dim=1)
        rows.append(R[norms > 0] / norms[norms > 0, None])
        ranks.append(int(torch.linalg.matrix_rank(J, rtol=1e-12)) if J.numel() else 0)
    return rows, ranks


class _Rows:
    """The constraint rows of the sampled ``(θ_s, x_s)``, built chunk by chunk (:data:`_CHUNK` samples).

    ``stack=True`` (the SVD solver) keeps the rows, each sample's compressed to its row space (:func:`_compressed`).
    ``stack=False`` (the Gram solver) never stacks them: ``RᵀR`` is accumulated per chunk and the chunks' draws
    (their ``θ_s`` and inputs) are kept, so :meth:`times` recomputes ``R V`` for the second stage chunk by chunk: the
    memory is ``n²`` (the Gram matrix) instead of ``m n``, at the price of computing the Jacobians twice.
    """

    def __init__(self, problem: "_Problem", layout: Layout, stack: bool):
        self.problem, self.layout, self.stack = problem, layout, stack
        self.stacked: list[torch.Tensor] = []
        self.draws: list[tuple[list[torch.Tensor], list[tuple]]] = []
        self.gram = torch.zeros(0 if stack else layout.unknowns, 0 if stack else layout.unknowns,
                                dtype=torch.float64)
        self.m = self.samples = self.count = 0

    def add_chunk(self) -> None:
        thetas = [self.problem.sample_theta(self.layout) for _ in range(_CHUNK)]
        inputs = [self.problem.sample_inputs() for _ in range(_CHUNK)]
        rows, ranks = _sample_rows(self.problem, self.layout, thetas, inputs)
        self.samples += len(rows)
        if self.stack:
            rows = [_compressed(R) for R in rows]
            self.stacked += rows
            self.count += sum(max(R.shape[0], 1) for R in rows)
        else:
            chunk = torch.cat(rows)
            self.gram.addmm_(chunk.T, chunk)
            self.draws.append((thetas, inputs))
            self.count += sum(max(r, 1) for r in ranks)
        self.m += sum(R.shape[0] for R in rows)

    def matrix(self) -> torch.Tensor:
        """The stacked rows (``stack=True``)."""
        return torch.cat(self.stacked) if self.stacked else torch.zeros(0, self.layout.unknowns, dtype=torch.float64)

    def rank(self) -> int:
        """The rank the sampling loop watches: ``matrix_rank`` of the rows, or (Gram) the eigenvalues of ``RᵀR``
        above ``10⁻¹⁴ λ_max`` (:func:`_gram_rank`)."""
        if self.stack:
            R = self.matrix()
            return int(torch.linalg.matrix_rank(R, rtol=1e-10)) if R.shape[0] else 0
        return _eigen_rank(torch.linalg.eigvalsh(self.gram))

    def times(self, V: torch.Tensor) -> torch.Tensor:
        """``R V`` (``m × k``), recomputing the rows of the kept draws (Gram) or from the stacked rows."""
        if self.stack:
            return self.matrix() @ V
        return torch.cat([torch.cat(_sample_rows(self.problem, self.layout, thetas, inputs)[0]) @ V
                          for thetas, inputs in self.draws])


def _constraints(problem: "_Problem", layout: Layout, oversampling: float, stack: bool) -> _Rows:
    """Sample until ``oversampling × unknowns`` independent rows (estimated per sample) are in, then again 25% more
    samples until the rank stops growing (a sample's rows are often far fewer than its outputs: a linear layer's
    Jacobian spans ``in + 1`` directions per output, whatever the batch)."""
    n_u = layout.unknowns
    rows = _Rows(problem, layout, stack)
    rank, target = -1, int(oversampling * n_u) + 10
    while True:
        while rows.count < target:
            rows.add_chunk()
        now = rows.rank()
        if now == rank or now == n_u or rows.samples > 50 * n_u:
            return rows
        rank, target = now, rows.count + max(rows.count // 4, 10)


SOLVERS = ("auto", "svd", "gram")
GRAM_ABOVE = 1500
"""Unknowns above which ``solver="auto"`` takes the Gram solver (:func:`_gram_null_space`) instead of the SVD."""
CANDIDATE = 1e-8
"""The Gram solver's first cut, relative to ``λ_max(RᵀR)``: eigenvalues below it (singular values below ``10⁻⁴ σ_max``)
span the candidate space the second stage decides in."""


@dataclass(frozen=True)
class NullSpaceCertificate:
    """What the solver guarantees about the returned null space ``N`` (orthonormal rows) of the stacked rows ``R``.

    ``residual = ‖R Nᵀ‖₂ / σ_max(R)``, computed: each returned direction is a null direction to this relative
    tolerance. ``floor``: a lower bound on ``‖R v‖ / σ_max`` for every unit ``v`` orthogonal to the space the solver
    searched (every ``v`` for the SVD; the candidate space of the Gram solver, whose complement has eigenvalues of
    ``RᵀR`` at least ``λ_{k+1} − δ``, Weyl's bound with ``δ = (m + n) ε λ_max`` the rounding of ``RᵀR`` and of
    ``eigh``): when ``floor`` exceeds the rank threshold, no null direction was missed outside the searched space,
    and inside it the SVD of ``R V`` decides. ``solver`` ``"svd"`` or ``"gram"``; ``candidates`` the searched
    space's dimension.
    """

    solver: str
    residual: float
    floor: float
    threshold: float
    candidates: int

    @property
    def complete(self) -> bool:
        """No direction outside the searched space has ``‖R v‖ ≤ threshold``."""
        return self.floor > self.threshold


def _threshold(sigma_max: float, shape: tuple[int, ...], rtol: float) -> float:
    """The rank rule: singular values above ``max(σ_max · max(shape) · ε, σ_max · rtol)`` count."""
    return max(sigma_max * max(shape) * torch.finfo(torch.float64).eps, sigma_max * rtol)


def _svd_null_space(R: torch.Tensor, rtol: float) -> tuple[torch.Tensor, RankDecision, NullSpaceCertificate]:
    """The null space of ``R`` from its full SVD (the reference: ``O(m n²)`` time, ``m n + n²`` memory)."""
    _, S, Vh = torch.linalg.svd(R, full_matrices=True)
    sigma = float(S[0]) if S.numel() else 0.0
    threshold = _threshold(sigma, tuple(R.shape), rtol) if S.numel() else 0.0
    r = int((S > threshold).sum())
    decision = RankDecision("constraints", r, tuple(R.shape), threshold, float(S[r - 1]) if r else None,
                            float(S[r]) if r < S.numel() else None)
    N = Vh[r:]
    residual = float(torch.linalg.matrix_norm(R @ N.T, ord=2)) / sigma if N.shape[0] and sigma else 0.0
    return N, decision, NullSpaceCertificate("svd", residual, math.inf, threshold / sigma if sigma else 0.0,
                                             R.shape[1])


def _gram(R: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """``RᵀR`` accumulated over blocks of rows (no ``m × n`` temporary beyond ``R`` itself)."""
    G = R.new_zeros(R.shape[1], R.shape[1])
    for rows in R.split(block):
        G.addmm_(rows.T, rows)
    return G


def _eigen_rank(lam: torch.Tensor) -> int:
    """The eigenvalues of ``RᵀR`` above ``10⁻¹⁴ λ_max`` (``σ > 10⁻⁷ σ_max``)."""
    return int((lam > 1e-14 * float(lam[-1])).sum()) if lam.numel() and float(lam[-1]) > 0 else 0


def _gram_rank(R: torch.Tensor) -> int:
    """The rank the sampling loop watches, from the eigenvalues of ``RᵀR``: ``eigvalsh`` of an ``n × n`` matrix
    instead of the SVD of the ``m × n`` rows."""
    return _eigen_rank(torch.linalg.eigvalsh(_gram(R)))


def _gram_null_space(R: torch.Tensor, rtol: float) -> tuple[torch.Tensor, RankDecision, NullSpaceCertificate]:
    """:func:`_gram_null_space_of` on stacked rows."""
    return _gram_null_space_of(_gram(R), R.shape[0], lambda V: R @ V, rtol)


def _gram_null_space_of(G: torch.Tensor, m: int, times: Callable[[torch.Tensor], torch.Tensor], rtol: float
                        ) -> tuple[torch.Tensor, RankDecision, NullSpaceCertificate]:
    """The null space of ``R`` in two stages: ``eigh(RᵀR)`` (one symmetric eigenproblem, ``n × n``) keeps the
    eigenvectors ``V`` with ``λ ≤ CANDIDATE · λ_max``; the SVD of the thin ``R V`` (``m × k``, ``k`` the candidates)
    then applies the same rank rule as the dense SVD to singular values of ``R`` itself, which squaring would lose
    below ``√ε σ_max``. A null vector's component outside ``span V`` along an eigenvector of eigenvalue ``λ_j`` is
    ``|E_j|/λ_j`` (``E`` the rounding of ``RᵀR``), so it adds ``≲ ε σ_max / √CANDIDATE ≈ 2·10⁻¹²·σ_max`` to ``‖R v‖``:
    far below the rank threshold. :class:`NullSpaceCertificate` records the computed residual and the floor."""
    n = G.shape[0]
    lam, V = torch.linalg.eigh(G)
    lam_max = float(lam[-1]) if lam.numel() else 0.0
    if lam_max <= 0:                                            # no constraint: every direction is null
        return (torch.eye(n, dtype=G.dtype), RankDecision("constraints", 0, (m, n), 0.0, None, None),
                NullSpaceCertificate("gram", 0.0, math.inf, 0.0, n))
    sigma = math.sqrt(lam_max)
    threshold = _threshold(sigma, (m, n), rtol)
    k = int((lam <= CANDIDATE * lam_max).sum())
    Vc = V[:, :k]
    RV = times(Vc) if k else None
    _, S, Vh = torch.linalg.svd(RV, full_matrices=True) if RV is not None else (None, lam[:0], Vc.T)
    small = S <= threshold
    d = int(small.sum()) + (k - S.numel())                     # singular values of R V that are not listed are 0
    N = Vh[k - d:] @ Vc.T if d else Vc.T[:0]
    above = [float(S[~small].min())] if bool((~small).any()) else []
    if k < n:
        above.append(math.sqrt(max(float(lam[k]), 0.0)))
    dropped = float(S[small].max()) if bool(small.any()) else (0.0 if d else None)
    decision = RankDecision("constraints", n - d, (m, n), threshold, min(above) if above else None, dropped)
    residual = float(torch.linalg.matrix_norm(RV @ (Vc.T @ N.T), ord=2)) / sigma if d and RV is not None else 0.0
    delta = (m + n) * torch.finfo(torch.float64).eps * lam_max
    floor = math.sqrt(max(float(lam[k]) - delta, 0.0)) / sigma if k < n else math.inf
    return N, decision, NullSpaceCertificate("gram", residual, floor, threshold / sigma, k)


def _rref(N: torch.Tensor) -> torch.Tensor:
    """A basis of the row space of ``N`` (``d × n``, independent rows) in reduced row-echelon form: Gauss-Jordan
    with complete pivoting (each pivot the largest remaining entry), entries below ``1e-10`` of the largest set to
    zero."""
    B = N.clone()
    free = torch.ones(B.shape[1], dtype=torch.bool)
    pivots = []
    for k in range(B.shape[0]):
        rest = B[k:, :].abs() * free
        flat = int(rest.argmax())
        row, col = k + flat // B.shape[1], flat % B.shape[1]
        B[[k, row]] = B[[row, k]]
        B[k] /= B[k, col].clone()
        others = torch.arange(B.shape[0]) != k
        B[others] -= B[others, col:col + 1] * B[k]
        free[col] = False
        pivots.append(col)
    if B.numel():
        B[B.abs() < 1e-10 * B.abs().max()] = 0.0
    return B[torch.tensor(pivots).argsort()] if B.shape[0] else B


def _orthonormal(M: torch.Tensor, rtol: float = 1e-8, atol: float = 0.0) -> torch.Tensor:
    """Orthonormal rows spanning the rows of ``M`` (singular values above ``max(rtol · σ_max, atol)``)."""
    if M.shape[0] == 0:
        return M
    _, S, Vh = torch.linalg.svd(M, full_matrices=False)
    return Vh[S > max(rtol * float(S[0]), atol)] if S.numel() else Vh[:0]


def _generator(vector: torch.Tensor, layout: Layout, error: float, explained: float) -> Generator:
    terms = list(layout.terms(vector, 1e-10 * float(torch.linalg.norm(vector))))
    moved = {t for t, _, _, _ in terms}
    read = {r.partition("[")[0] for _, _, _, r in terms if r is not None}
    moves, reads = tuple(n for n in layout.names if n in moved), tuple(n for n in layout.names if n in read)
    return Generator(vector, layout, moves, reads, tuple((m, v, r) for _, m, v, r in terms), error, explained)


Flow = Callable[[torch.Tensor, float], torch.Tensor]
"""``(θ, t) ↦ exp(t Ã)(θ, 1)``."""


def dense_flow(A: torch.Tensor, c: torch.Tensor) -> Flow:
    """The flow of ``Aθ + c`` with ``Ã = [[A, c], [0, 0]]`` scaled to Frobenius norm 1, by ``matrix_exp``."""
    P = A.shape[0]
    M = torch.zeros(P + 1, P + 1, dtype=A.dtype)
    M[:P, :P], M[:P, P] = A, c
    M = M / max(float(torch.linalg.norm(M)), 1e-300)
    return lambda theta, t: (torch.linalg.matrix_exp(t * M) @ torch.cat([theta, theta.new_ones(1)]))[:P]


def _layout_flow(layout: Layout, vector: torch.Tensor) -> Flow:
    """The flow of one unknown vector, scaled by ``layout.normalised`` (Frobenius norm 1 for dense blocks, an
    operator-norm bound 1 for the axes ansatz)."""
    unit = layout.normalised(vector)
    return lambda theta, t: layout.flow(unit, theta, t)


def _finite_error(problem: _Problem, layout: Layout, flow: Flow,
                  points: Sequence[tuple[torch.Tensor, tuple]]) -> float:
    """Largest relative change of every output along ``flow`` at ``t = ±1`` from the held-out ``points``."""
    problem_target, problem.target = problem.target, "function"
    try:
        worst = 0.0
        for theta, inputs in points:
            f = problem.outputs(layout, inputs)
            with torch.no_grad():
                base = f(theta)
                for t in (1.0, -1.0):
                    moved = flow(theta, t)
                    worst = max(worst, float(torch.linalg.norm(f(moved) - base) /
                                             max(float(torch.linalg.norm(base)), 1e-300)))
    finally:
        problem.target = problem_target
    return worst


Fit = Callable[[Analysis], tuple[torch.Tensor, bool]]
"""A derived symmetry (an analysis with that one symmetry) ↦ its generators' unknown vectors and whether their
fields lie outside the ansatz."""


def _block_fit(layout: ParameterLayout, problem: _Problem) -> Fit:
    """Fields read off :func:`action_matrix` at ``θ = 0`` (``c_i``) and the unit vectors (``A_i e_j``); outside when
    an entry lies in a block the ansatz does not allow (relative ``10⁻¹²``)."""
    P = layout.P

    def fit(one: Analysis) -> tuple[torch.Tensor, bool]:
        base = action_matrix(one, {n: torch.zeros_like(v) for n, v in problem.params.items()})       # rows: c_i
        columns = [action_matrix(one, layout.unflatten(unit)) - base for unit in torch.eye(P, dtype=torch.float64)]
        rows, worst = [], 0.0
        for A, c in zip(torch.stack(columns, dim=-1), base):                     # A: the P × P A_i
            vec, out = layout.vector(A, c)
            worst = max(worst, out / max(float(torch.linalg.norm(A) + torch.linalg.norm(c)), 1e-300))
            rows.append(vec)
        return torch.stack(rows), worst > 1e-12
    return fit


def _axes_fit(layout: AxesLayout, problem: _Problem) -> Fit:
    """Fields ``M_i·θ`` at :meth:`~AxesLayout.points_needed` random ``θ`` (:func:`action_matrix`), fitted by
    :meth:`AxesLayout.fit` (least squares per moved tensor, no ``P × P`` matrix); outside above a relative residual
    of ``10⁻⁸``."""
    points = [problem.sample_theta(layout, 1.0) for _ in range(layout.points_needed())]

    def fit(one: Analysis) -> tuple[torch.Tensor, bool]:
        fitted, residual = layout.fit(points, [action_matrix(one, layout.unflatten(theta)) for theta in points])
        return fitted, float(residual.max()) > 1e-8
    return fit


def _derived_fields(analysis: Analysis, layout: Layout, problem: _Problem
                    ) -> tuple[list[str], list[torch.Tensor], list[str]]:
    """``(labels, unknown vectors, outside)``: each derived continuous symmetry's fields ``M_i·θ = A_iθ + c_i``
    as unknown vectors (one row per generator, :func:`_block_fit` or :func:`_axes_fit`); symmetries that move
    buffers or whose fields lie outside the ansatz go to ``outside``."""
    labels, vectors, outside = [], [], []
    fit = _axes_fit(layout, problem) if isinstance(layout, AxesLayout) else _block_fit(layout, problem)
    kind = "axes" if isinstance(layout, AxesLayout) else "block"
    for symmetry in analysis.symmetries:
        if not symmetry.group.is_continuous:
            continue
        if symmetry.acts_on_buffers:
            outside.append(f"{symmetry.label} (moves buffers)")
            continue
        rows, out = fit(dataclasses.replace(analysis, symmetries=(symmetry,)))
        if out:
            outside.append(f"{symmetry.label} (outside the {kind} ansatz)")
            continue
        labels.append(symmetry.label)
        vectors.append(rows)
    return labels, vectors, outside


def discover(model_or_analysis: object, data: torch.Tensor | tuple | None = None, *, target: str = "function",
             affine: bool = True, blocks: str = "auto", max_unknowns: int = MAX_UNKNOWNS, oversampling: float = 1.3,
             rtol: float = 1e-9, tolerance: float = 1e-8, widths: Mapping[str, int] | None = None,
             compare: bool = True, seed: int = 0, solver: str = "auto",
             progress: Progress | None = None) -> Discovery:
    """Every linear (``affine``: affine) vector field leaving the model invariant (module docstring).

    Parameters
    ----------
    model_or_analysis : an :class:`~symalg.symbolic.derive.Analysis`, a spec string / ``Spec`` / graph (derived
        here; symbolic widths at ``widths`` or the verifier's defaults), or a ``torch.nn.Module`` (traced on
        ``data``).
    data : the model's inputs (a tensor or a tuple); given, the symmetries are those of the model on these
        inputs (data-dependent, as in the papers' one-data-point experiments); by default fresh random inputs
        of the example inputs' shapes at every sample (symmetries of the function).
    target : ``"function"`` (every output) or ``"loss"`` (the per-sample loss of the first output, targets drawn
        from ``seed``).
    blocks : ``"auto"``, ``"all"``, ``"local"`` or ``"axes"`` (module docstring); ``max_unknowns`` the ``"auto"``
        switch (the refusal is above ``4 × max_unknowns`` for every ansatz).
    oversampling : rows stacked per unknown; ``rtol`` the relative floor of the rank decision; ``tolerance`` the
        finite check's bar (relative output change).
    compare : compare with the derived symmetries (costs ``P + 1`` evaluations of their action).
    solver : ``"svd"`` (the dense SVD of the stacked rows), ``"gram"`` (:func:`_gram_null_space`: ``eigh`` of ``RᵀR``,
        then the SVD of the thin ``R V`` on the candidates; the sampling loop's rank from ``eigvalsh``), or ``"auto"``
        (the Gram solver above :data:`GRAM_ABOVE` unknowns and for ``blocks="axes"``). ``report.certificate`` says what
        either guarantees.
    progress : ``progress(done, 4, stage)`` after sampling, the null space, the comparison with the derived
        symmetries and the generators' checks (:mod:`symalg.progress`).
    """
    if target not in ("function", "loss"):
        raise SpecError(f"discover: target must be 'function' or 'loss', got {target!r}")
    if blocks not in BLOCK_MODES:
        raise SpecError(f"discover: blocks must be one of {BLOCK_MODES}, got {blocks!r}")
    if solver not in SOLVERS:
        raise SpecError(f"discover: solver must be one of {SOLVERS}, got {solver!r}")
    analysis = _analysis(model_or_analysis, data, widths)
    problem = _Problem(analysis, data, target, seed)
    names = tuple(n for n, v in problem.params.items() if v.numel())
    if not names:
        raise SpecError("discover: the model has no parameters")
    shapes = {n: tuple(problem.params[n].shape) for n in names}
    layout, mode = _layout(names, shapes, blocks, affine, max_unknowns)
    n_u = layout.unknowns
    if n_u > 4 * max_unknowns:
        raise SpecError(f"discover: {n_u} unknowns under blocks={mode!r} (more than 4 × max_unknowns = "
                        f"{4 * max_unknowns}); discover a subnetwork, or raise max_unknowns")
    gram = solver == "gram" or solver == "auto" and (n_u > GRAM_ABOVE or mode == "axes")
    sampled = _constraints(problem, layout, oversampling, stack=not gram)
    report(progress, 1, 4, "constraints sampled")
    N, decision, certificate = _gram_null_space_of(sampled.gram, sampled.m, sampled.times, rtol) if gram else \
        _svd_null_space(sampled.matrix(), rtol)                                           # N: d × n_u, orthonormal
    report(progress, 2, 4, "null space")
    basis = _rref(N)
    heldout = problem.heldout(layout)

    # the derived symmetries' span and the decomposition
    labels: list[str] = []
    outside: list[str] = []
    vectors: list[torch.Tensor] = []
    if compare:
        labels, vectors, outside = _derived_fields(analysis, layout, problem)
    report(progress, 3, 4, "derived symmetries")
    E = torch.cat(vectors) if vectors else torch.zeros(0, n_u, dtype=torch.float64)
    Eo = _orthonormal(E)
    unconfirmed, residuals = [], []
    for label, rows in zip(labels, vectors):
        residual = rows - (rows @ N.T) @ N
        error = float(residual.norm() / max(float(rows.norm()), 1e-300))
        if error > 1e-6:
            unconfirmed.append(label)
            residuals.append(error)
    explained_fraction = [float(((b @ Eo.T) @ Eo).norm() / b.norm()) if Eo.shape[0] else 0.0 for b in basis]
    inter = N.shape[0] + Eo.shape[0] - _orthonormal(torch.cat([N, Eo])).shape[0] if Eo.shape[0] else 0
    new_part = N - (N @ Eo.T) @ Eo if Eo.shape[0] else N
    new_basis = _rref(_orthonormal(new_part, 0.0, 1e-6)) if new_part.shape[0] else new_part

    def make(vector: torch.Tensor, explained: float) -> Generator:
        return _generator(vector, layout, _finite_error(problem, layout, _layout_flow(layout, vector), heldout),
                          explained)

    generators = sorted((make(b, e) for b, e in zip(basis, explained_fraction)), key=lambda g: (g.moves, g.reads))
    new_generators = tuple(make(b, 0.0) for b in new_basis)
    report(progress, 4, 4, "generators checked")
    closure = _sampled_closure_error(basis, layout, N, seed) if isinstance(layout, AxesLayout) else \
        _closure_error(basis, layout, N, seed)
    combination = torch.randn(basis.shape[0], generator=problem.generator, dtype=torch.float64) @ basis \
        if basis.shape[0] else None
    combination_error = _finite_error(problem, layout, _layout_flow(layout, combination), heldout) \
        if combination is not None else 0.0
    theta = heldout[1][0]
    discovered_tangent = torch.stack([g.field(theta) for g in generators]) if generators else theta[None, :0]
    continuous = compare and any(s.group.is_continuous for s in analysis.symmetries)
    derived_tangent = action_matrix(analysis, layout.unflatten(theta)) if continuous else theta.new_zeros(0, layout.P)
    tangent = (_rank(discovered_tangent), _rank(derived_tangent),
               _rank(torch.cat([discovered_tangent.reshape(-1, layout.P), derived_tangent])))
    name = analysis._name()
    return Discovery(name, target, affine, mode, layout.P, n_u, sampled.samples, sampled.m, decision, tuple(generators),
                     closure, combination_error, tolerance, Eo.shape[0], tuple(labels), tuple(outside), inter,
                     new_generators, tuple(unconfirmed), tuple(residuals), tangent, layout, certificate)


def _rank(matrix: torch.Tensor) -> int:
    return int(torch.linalg.matrix_rank(matrix, rtol=1e-8)) if matrix.numel() else 0


def _pairs(d: int, seed: int, max_pairs: int) -> list[tuple[int, int]]:
    """The pairs ``i < j < d``, ``max_pairs`` of them drawn by ``seed`` when there are more."""
    pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
    if len(pairs) > max_pairs:
        rng = np.random.default_rng(seed)
        pairs = [pairs[k] for k in rng.choice(len(pairs), max_pairs, replace=False)]
    return pairs


def _sampled_closure_error(basis: torch.Tensor, layout: Layout, N: torch.Tensor, seed: int,
                           max_pairs: int = 200) -> float:
    """:func:`_closure_error` without ``P × P`` matrices: the bracket ``[X, Y](θ) = A_Y X(θ) − A_X Y(θ)`` (``A_X``
    the linear part, applied as a field with ``c`` off) evaluated at ``q`` random points, ``qP ≥ d + 1``, and
    projected on the span of the basis fields' values there. A bracket in the span has residual 0 (up to
    rounding); one outside it keeps a residual unless its values at the random points happen to fall in that span,
    a set of measure zero once ``qP > d``: a randomized check, not a proof (the finite check stands on its own)."""
    d = basis.shape[0]
    if d < 2:
        return 0.0
    rng = torch.Generator().manual_seed(seed)
    q = math.ceil((d + 1) / layout.P) + 2
    points = torch.randn(q, layout.P, generator=rng, dtype=torch.float64)
    fields = [layout.field(b, points) for b in basis]
    values = torch.stack([f.reshape(-1) for f in fields])
    span = _orthonormal(values, 1e-12)
    worst = 0.0
    for i, j in _pairs(d, seed, max_pairs):
        z = (layout.field(basis[j], fields[i], 0.0) - layout.field(basis[i], fields[j], 0.0)).reshape(-1)
        norm = float(z.norm())
        if norm < 1e-12 * float(values[i].norm() * values[j].norm()):
            continue
        worst = max(worst, float((z - (z @ span.T) @ span).norm()) / norm)
    return worst


def _closure_error(basis: torch.Tensor, layout: ParameterLayout, N: torch.Tensor, seed: int,
                   max_pairs: int = 200) -> float:
    """Largest ``‖[X, Y] − proj_span [X, Y]‖ / ‖[X, Y]‖`` over pairs of basis fields (``max_pairs`` at most, drawn
    by ``seed`` beyond that). A bracket with entries outside the ansatz counts as outside the span."""
    pairs = _pairs(basis.shape[0], seed, max_pairs)
    dense = [layout.dense(b) for b in basis]
    worst = 0.0
    for i, j in pairs:
        A, c = bracket(dense[i], dense[j])
        norm = float(torch.linalg.norm(A) + torch.linalg.norm(c))
        if norm < 1e-12:
            continue
        vec, out = layout.vector(A, c)
        residual = vec - (vec @ N.T) @ N
        worst = max(worst, (float(residual.norm()) + out) / norm)
    return worst
