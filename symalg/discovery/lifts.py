"""Building new symmetries from known ones [Zhao2026, §4]: lift discovered fields to other models and data.

Proposition 4.1 of the paper: if ``L(θ, X) = j((θ₁, f(θ₂, h(θ₁, X))), X)`` (the rest of the network reads ``θ₂``
only through ``f``), a symmetry of ``f`` acting on ``θ₂`` is one of ``L`` (leaving ``θ₁`` where it is). Its
corollaries are what :func:`lift` checks numerically, for the linear fields ``V(θ₂) = Aθ₂ + c`` of a
:class:`~symalg.discovery.exact.Discovery`:

* **subnetwork → network, layer → deep network**: rename the tensors (``names``: ``{"0.weight": "2.weight"}``)
  and extend the field by zero;
* **width h → h' > h** (``U σ(V X)``, Corollary 4.2): the same entries, indices kept, inside the bigger tensors (the
  first ``h`` hidden units; the others are ``θ₁``);
* **batch size d → d' < d** (Proposition 4.4): a field that leaves the outputs on ``d`` points invariant leaves them
  on any ``d'`` of those points (the outputs on a sub-batch are a subset): pass the smaller batch as ``data``.

The negative controls are the converses and a broken factorisation: another path reading ``θ₂`` (a skip connection
reading the hidden layer the field scales, a tied weight) makes ``j`` depend on ``θ₂`` outside ``f``, and a
symmetry found on one data point does not hold on a bigger batch; :func:`lift` measures the finite invariance
error on the target and says whether it ``holds``.

>>> import symalg, torch
>>> small = symalg.discover("linear(2, 2) -> relu -> linear(2, 1)", compare=False)
>>> wide = lift(small, "linear(2, 5) -> relu -> linear(5, 1)")
>>> len(wide), all(lf.holds for lf in wide)
(2, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import torch

from symalg.discovery.exact import Discovery, Layout, ParameterLayout, _analysis, _finite_error, _Problem, dense_flow
from symalg.errors import SpecError

__all__ = ["Lift", "lift", "embed"]


@dataclass(frozen=True)
class Lift:
    """One lifted field on the target: ``(A, c)`` in its flat parameters, the finite invariance error measured there
    (largest relative output change along ``exp(±Ã)`` at held-out points), and ``holds`` (below ``tolerance``)."""

    A: torch.Tensor = field(repr=False)
    c: torch.Tensor = field(repr=False)
    moves: tuple[str, ...]
    finite_error: float
    holds: bool

    def to_dict(self) -> dict:
        return {"moves": list(self.moves), "finite_error": self.finite_error, "holds": self.holds}


def _index_map(source: Layout, target: ParameterLayout, names: Mapping[str, str]) -> np.ndarray:
    """For every flat source entry, the flat target entry with the renamed tensor and the same multi-index."""
    out = np.empty(source.P, dtype=np.int64)
    offsets = target.offsets
    for name in source.names:
        to = names.get(name, name)
        if to not in target.shapes:
            raise SpecError(f"lift: the target has no tensor {to!r} (for the source's {name!r}); pass names=")
        shape, big = source.shapes[name], target.shapes[to]
        if len(shape) != len(big) or any(s > b for s, b in zip(shape, big)):
            raise SpecError(f"lift: {name!r} of shape {shape} does not fit in {to!r} of shape {big}")
        index = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), dtype=np.int64)
        flat = np.ravel_multi_index(tuple(index), big) if shape else np.zeros(1, dtype=np.int64)
        start = source.offsets[name]
        out[start:start + source.sizes[name]] = offsets[to] + flat
    return out


def embed(A: torch.Tensor, c: torch.Tensor, source: Layout, target: ParameterLayout,
          names: Mapping[str, str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The field ``Aθ + c`` of ``source`` as a field of ``target``: tensors renamed by ``names``, entries at the same
    indices, zero on every other target entry."""
    where = torch.as_tensor(_index_map(source, target, names or {}))
    A2 = A.new_zeros(target.P, target.P)
    c2 = c.new_zeros(target.P)
    A2[where[:, None], where[None, :]] = A
    c2[where] = c
    return A2, c2


def lift(report: Discovery, target: object, data: torch.Tensor | tuple | None = None,
         names: Mapping[str, str] | None = None, tolerance: float | None = None, seed: int = 1) -> list[Lift]:
    """Lift every discovered generator of ``report`` to ``target`` (a model, spec or analysis as for
    :func:`~symalg.discovery.exact.discover`) and check it there (module docstring). ``data``: the target's inputs
    (a smaller batch for Proposition 4.4); ``names``: source tensor → target tensor."""
    analysis = _analysis(target, data, None)
    problem = _Problem(analysis, data, "function", seed)
    tensors = tuple(n for n, v in problem.params.items() if v.numel())
    layout = ParameterLayout(tensors, {n: tuple(problem.params[n].shape) for n in tensors}, (), True)
    points = problem.heldout(layout)
    bar = report.tolerance if tolerance is None else tolerance
    lifted = []
    for g in report.generators:
        A, c = embed(g.A, g.c, report.layout, layout, names)
        error = _finite_error(problem, layout, dense_flow(A, c), points)
        moves = tuple(dict.fromkeys((names or {}).get(m, m) for m in g.moves))
        lifted.append(Lift(A, c, moves, error, error <= bar))
    return lifted
