"""The structured ansatz of exact discovery: per-axis linear maps, cross-tensor contractions and a translation.

``discover(..., blocks="axes")`` searches the vector fields ``V(θ) = Aθ + c`` whose linear part acts on each tensor
``T`` (shape ``n_1 × … × n_k``) through one matrix per axis, plus contractions of other tensors with a vector:

    V_T(θ) = Σ_a L_{T,a} ×_a T  +  Σ_{(S, a)} S ×_a v_{T,S,a}  +  c_T,

``L ×_a T`` multiplying the axis ``a`` of ``T`` by ``L`` (``n_a × n_a``) and ``S ×_a v`` contracting the axis ``a`` of
another tensor ``S`` with ``v`` (``S`` with that axis removed must have ``T``'s shape). The unknowns grow like
``Σ_T Σ_a n_a² + P``, not ``P²``: ``linear(2, h) -> act -> linear(h, 2)`` has ``3h² + 7h + 16`` instead of
``(5h + 2)² + 5h + 2``.

What it holds: every catalogue symmetry that moves tensors by linear maps of their axes (a site's ``GL``/``O``/
positive scaling/permutation generators move a writer's rows, its bias and a reader's columns; attention's
``W_Q ↦ G W_Q``, ``W_K ↦ G^{-T} W_K``, also inside one fused ``in_proj`` tensor since ``L`` is a full matrix on the
row axis), the translations of identity sites (``b_in += t``: ``c``; ``b_out −= W_out t``: the contraction of
``W_out``'s column axis), and the constant shifts of LayerNorm readers (``W += u 1ᵀ``: ``c``). What it does not:
fields mixing two tensors other than by a contraction to the moved tensor's shape (a shear ``W_2 += X W_1`` between
two layers' weights), and maps acting jointly on two axes of one tensor (``L ∈ gl(n_1 n_2)`` not of the form
``L_1 ⊗ 1 + 1 ⊗ L_2``). A derived symmetry of that form is reported under ``outside``, never as missing.

**Injectivity.** ``(L_a)_a ↦ Σ_a L_a ×_a T`` has the kernel ``L_a = λ_a 1`` with ``Σ λ_a = 0`` (every scalar tie
between the axes); the last diagonal entry of ``L_a`` is dropped for every axis but the first, which removes it,
so distinct unknown vectors are distinct fields and dimensions count fields.

**Rows.** The constraint ``J V(θ_s) = 0`` at a sample gives, for ``L_{T,a}[i, j]``, the contraction of ``J_T`` and ``T``
over every axis but ``a`` (a matrix product after moving ``a`` to the front), no Kronecker product of size ``P²``.

>>> import torch
>>> layout = AxesLayout.build(("w", "b"), {"w": (3, 2), "b": (3,)}, True)
>>> layout.unknowns                      # w: 9 + (4 - 1); b: 9; b from w along axis 1: 2; c: 9
32
>>> theta, u = torch.randn(9, dtype=torch.float64), torch.randn(32, dtype=torch.float64)
>>> A, c = layout.dense(u)
>>> bool(torch.allclose(layout.field(u, theta), A @ theta + c))
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Mapping, Sequence

import numpy as np
import torch

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Piece:
    """One block of unknowns: ``kind`` ``"axis"`` (``L_{tensor, axis}``, ``size`` its free entries), ``"cross"`` (the
    vector ``v`` contracting ``source``'s ``axis``) or ``"shift"`` (``c`` on ``tensor``); ``start`` its first index."""

    kind: str
    tensor: str
    source: str
    axis: int
    start: int
    size: int


def _dims(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes the ansatz sees: a scalar is one axis of size 1."""
    return shape if shape else (1,)


class FlatParameters:
    """The parameters ``names`` (of ``shapes``) flattened in that order: sizes, offsets, ``P`` and the conversions
    (shared by the layouts of :mod:`symalg.discovery.exact` and :class:`AxesLayout`)."""

    names: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]]

    @cached_property
    def sizes(self) -> dict[str, int]:
        return {n: math.prod(self.shapes[n]) for n in self.names}

    @cached_property
    def offsets(self) -> dict[str, int]:
        out, start = {}, 0
        for n in self.names:
            out[n] = start
            start += self.sizes[n]
        return out

    @cached_property
    def P(self) -> int:
        return sum(self.sizes.values())

    def flatten(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([params[n].reshape(-1) for n in self.names])

    def unflatten(self, theta: torch.Tensor) -> Params:
        size, offset = self.sizes, self.offsets
        return {n: theta[offset[n]:offset[n] + size[n]].reshape(self.shapes[n]) for n in self.names}

    def entry(self, index: int) -> str:
        """``tensor[i, j]`` for a flat parameter index."""
        for n in self.names:
            start = self.offsets[n]
            if index < start + self.sizes[n]:
                where = np.unravel_index(index - start, self.shapes[n]) if self.shapes[n] else ()
                return f"{n}[{', '.join(str(int(i)) for i in where)}]"
        raise IndexError(index)


@dataclass(frozen=True)
class AxesLayout(FlatParameters):
    """The parameters flattened in ``named_parameters`` order and the unknowns of the axes ansatz (module docstring)."""

    names: tuple[str, ...]
    shapes: Mapping[str, tuple[int, ...]]
    affine: bool
    pieces: tuple[Piece, ...]

    @staticmethod
    def build(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]], affine: bool) -> "AxesLayout":
        """Every axis map, every cross contraction whose shape fits (one per source for axes of size 1, whose
        contractions coincide) and, with ``affine``, ``c``."""
        pieces, start = [], 0

        def add(kind: str, tensor: str, source: str, axis: int, size: int) -> None:
            nonlocal start
            if size:
                pieces.append(Piece(kind, tensor, source, axis, start, size))
                start += size
        for t in names:
            for a, n in enumerate(_dims(shapes[t])):
                add("axis", t, t, a, n * n - (a > 0))
            for s in names:
                unit_done = False
                for a, n in enumerate(_dims(shapes[s]) if s != t else ()):
                    rest = _dims(shapes[s])[:a] + _dims(shapes[s])[a + 1:]
                    if rest != _dims(shapes[t]) and not (rest == () and shapes[t] in ((), (1,))):
                        continue
                    if n == 1 and unit_done:
                        continue
                    unit_done |= n == 1
                    add("cross", t, s, a, n)
            if affine:
                add("shift", t, t, 0, math.prod(shapes[t]))
        return AxesLayout(tuple(names), dict(shapes), affine, tuple(pieces))

    @cached_property
    def unknowns(self) -> int:
        return self.pieces[-1].start + self.pieces[-1].size if self.pieces else 0

    # -- the ansatz ----------------------------------------------------------------------------------------------
    def _view(self, theta: torch.Tensor, name: str) -> torch.Tensor:
        """``theta``'s tensor ``name`` with the ansatz's axes (leading batch axes of ``theta`` kept)."""
        offset, size = self.offsets[name], self.sizes[name]
        return theta[..., offset:offset + size].reshape(*theta.shape[:-1], *_dims(self.shapes[name]))

    def _matrix(self, piece: Piece, vector: torch.Tensor) -> torch.Tensor:
        """``L`` of an axis piece (the dropped last diagonal entry 0)."""
        n = _dims(self.shapes[piece.tensor])[piece.axis]
        values = vector[piece.start:piece.start + piece.size]
        if piece.axis > 0:
            values = torch.cat([values, values.new_zeros(1)])
        return values.reshape(n, n)

    def piece_rows(self, J: torch.Tensor, theta: torch.Tensor, pieces: Sequence[Piece]) -> torch.Tensor:
        """The constraint rows of ``J`` (``r × P``) at ``θ`` restricted to the unknowns of ``pieces``: entry
        ``∂(J V(θ))/∂u`` for each of their unknowns ``u``."""
        r, parts = J.shape[0], []
        for p in pieces:
            Jt = self._view(J, p.tensor)                                   # r × dims(T)
            if p.kind == "axis":
                n = Jt.shape[1 + p.axis]
                Jm = Jt.movedim(1 + p.axis, 1).reshape(r, n, -1)
                tm = self._view(theta, p.tensor).movedim(p.axis, 0).reshape(n, -1)
                block = (Jm @ tm.T).reshape(r, n * n)
                parts.append(block[:, :-1] if p.axis > 0 else block)
            elif p.kind == "cross":
                S = self._view(theta, p.source).movedim(p.axis, -1).reshape(-1, p.size)
                parts.append(Jt.reshape(r, -1) @ S)
            else:
                parts.append(Jt.reshape(r, -1))
        return torch.cat(parts, dim=1) if parts else J.new_zeros(r, 0)

    def rows(self, J: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """The constraint rows of one sample (``J``: ``r × P``), ``r × unknowns``."""
        return self.piece_rows(J, theta, self.pieces)

    def field(self, vector: torch.Tensor, theta: torch.Tensor, constant: float = 1.0) -> torch.Tensor:
        """``Aθ + constant · c`` of the unknown vector ``vector`` at the flat ``θ`` (``… × P``: a batch of points)."""
        batch = theta.shape[:-1]
        out = {n: theta.new_zeros(*batch, *_dims(self.shapes[n])) for n in self.names}
        for p in self.pieces:
            if p.kind == "axis":
                axis = len(batch) + p.axis
                t = self._view(theta, p.tensor).movedim(axis, -1)
                out[p.tensor] += (t @ self._matrix(p, vector).T).movedim(-1, axis)
            elif p.kind == "cross":
                S = self._view(theta, p.source).movedim(len(batch) + p.axis, -1)
                out[p.tensor] += (S @ vector[p.start:p.start + p.size]).reshape(out[p.tensor].shape)
            elif constant:
                out[p.tensor] += constant * vector[p.start:p.start + p.size].reshape(_dims(self.shapes[p.tensor]))
        return torch.cat([out[n].reshape(*batch, -1) for n in self.names], dim=-1)

    def dense(self, vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, c)`` (``P × P`` and ``P``) of one unknown vector: for tests and small models only."""
        c = self.field(vector, vector.new_zeros(self.P))
        return self.field(vector, torch.eye(self.P, dtype=vector.dtype), 0.0).T, c

    def normalised(self, vector: torch.Tensor) -> torch.Tensor:
        """``vector`` scaled so that an upper bound on ``‖Ã‖₂`` (``Ã = [[A, c], [0, 0]]``) is 1: per moved tensor, the
        sum of its maps' Frobenius norms (each bounds its operator norm) and of ``‖c_T‖``, combined in quadrature."""
        bound: dict[str, float] = {}
        for p in self.pieces:
            bound[p.tensor] = bound.get(p.tensor, 0.0) + float(vector[p.start:p.start + p.size].norm())
        total = math.sqrt(sum(b * b for b in bound.values()))
        return vector / max(total, 1e-300)

    def flow(self, vector: torch.Tensor, theta: torch.Tensor, t: float) -> torch.Tensor:
        """``exp(t Ã)(θ, 1)`` by its Taylor series, applying the field term by term (no ``P × P`` matrix):
        ``θ + t(Aθ + c) + Σ_{k≥2} t^k A^{k−1}(Aθ + c)/k!``, summed until a term is below ``10⁻¹⁸`` of the sum (at
        most 60 terms; ``‖t Ã‖ ≤ 1`` after :meth:`normalised` makes 25 terms exact to rounding)."""
        term = t * self.field(vector, theta)
        out = theta + term
        for k in range(2, 60):
            term = t * self.field(vector, term, 0.0) / k
            out = out + term
            if float(term.norm()) <= 1e-18 * float(out.norm()):
                break
        return out

    def matrices(self, vector: torch.Tensor) -> dict[tuple[str, int], torch.Tensor]:
        """The axis maps ``L_{T,a}`` of ``vector`` in their most readable form: the scalar ties (module docstring) let
        ``λ 1`` move from an axis ``a > 0`` to axis 0; each such axis gives up the most frequent value of its
        diagonal (ties: the smallest in magnitude), so a scaling of one column reads ``L[i, i] = −1``, not
        ``−1`` on axis 0 and ``+1`` on every other column."""
        out = {(p.tensor, p.axis): self._matrix(p, vector) for p in self.pieces if p.kind == "axis"}
        for (t, a), L in out.items():
            if a == 0 or L.shape[0] < 2:
                continue
            diagonal = L.diagonal()
            scale = max(float(diagonal.abs().max()), 1e-300)
            values, counts = torch.unique(torch.round(diagonal / scale * 1e9), return_counts=True)
            best = max(range(len(values)), key=lambda k: (int(counts[k]), -abs(float(values[k]))))
            shift = float(values[best]) * scale / 1e9
            if shift and (t, 0) in out:
                out[(t, a)] = L - shift * torch.eye(L.shape[0], dtype=L.dtype)
                out[(t, 0)] = out[(t, 0)] + shift * torch.eye(out[(t, 0)].shape[0], dtype=L.dtype)
        return out

    def terms(self, vector: torch.Tensor, cut: float) -> Iterator[tuple[str, str, float, str | None]]:
        """``(moved tensor, moved entry, coefficient, read entry or None)`` for each term above ``cut``: an axis
        entry ``L[i, j]`` (:meth:`matrices`) moves ``T[…, i, …]`` by ``T[…, j, …]`` (``:`` for the other axes), a
        cross entry ``v[k]`` moves all of ``T`` by ``S[…, k, …]``, a shift entry one entry of ``T``."""
        matrices = self.matrices(vector)
        for p in self.pieces:
            dims = _dims(self.shapes[p.tensor])
            if p.kind == "axis":
                L = matrices[(p.tensor, p.axis)]
                for i, j in torch.nonzero(L.abs() > cut).tolist():
                    moved, read = [":"] * len(dims), [":"] * len(dims)
                    moved[p.axis], read[p.axis] = str(i), str(j)
                    yield p.tensor, f"{p.tensor}[{', '.join(moved)}]", float(L[i, j]), \
                        f"{p.tensor}[{', '.join(read)}]"
                continue
            values = vector[p.start:p.start + p.size]
            for k in torch.nonzero(values.abs() > cut).reshape(-1).tolist():
                if p.kind == "cross":
                    index = [":"] * len(_dims(self.shapes[p.source]))
                    index[p.axis] = str(k)
                    yield p.tensor, f"{p.tensor}[:]", float(values[k]), f"{p.source}[{', '.join(index)}]"
                else:
                    yield p.tensor, self.entry(self.offsets[p.tensor] + k), float(values[k]), None

    def fit(self, points: Sequence[torch.Tensor], values: Sequence[torch.Tensor]
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The unknown vectors of affine fields given by their ``values`` (``k × P`` each) at the flat ``points``,
        by least squares one moved tensor at a time (its pieces only), and each field's relative residual: what of
        it lies outside the ansatz. Needs ``len(points) · size_T ≥`` the unknowns moving ``T``
        (:meth:`points_needed`)."""
        k = values[0].shape[0]
        out = values[0].new_zeros(k, self.unknowns)
        residual = values[0].new_zeros(k)
        norm = torch.stack([v.pow(2).sum(1) for v in values]).sum(0)
        eye = torch.eye(self.P, dtype=values[0].dtype)
        for t in self.names:
            own = [p for p in self.pieces if p.tensor == t]
            if not own:
                continue
            sl = slice(self.offsets[t], self.offsets[t] + self.sizes[t])
            B = torch.cat([self.piece_rows(eye[sl], theta, own) for theta in points])      # (q·size_T) × n_T
            Y = torch.cat([v[:, sl].T for v in values])                                       # (q·size_T) × k
            X = torch.linalg.lstsq(B, Y, driver="gelsd").solution
            residual += (B @ X - Y).pow(2).sum(0)
            columns = torch.cat([torch.arange(p.start, p.start + p.size) for p in own])
            out[:, columns] = X.T
        return out, (residual / norm.clamp_min(1e-300)).sqrt()

    def points_needed(self) -> int:
        """Random points :meth:`fit` needs: the most unknowns moving one tensor over its size, plus 2."""
        per: dict[str, int] = {}
        for p in self.pieces:
            per[p.tensor] = per.get(p.tensor, 0) + p.size
        return max(math.ceil(n / self.sizes[t]) for t, n in per.items()) + 2
