"""The elementwise product of values: gated MLPs (SwiGLU, GeGLU, ReGLU), ``down(act(gate x) ⊙ up x)``.

Let ``a`` carry site ``A`` and ``b`` site ``B`` along the same feature axis of width ``h`` (torch layout:
``a = σ(W_g x + b_g)``, ``b = W_u x + b_u``, ``y = W_d (a ⊙ b) + b_d``). A diagonal ``D`` (a positive scaling
``d^p`` of a value of degree ``p``, or a sign flip ``diag(±1)``) acting on ``a`` alone passes through the product,
``(D a) ⊙ b = D (a ⊙ b)``, so the reader absorbs it: ``W_d ↦ W_d D⁻¹``. The same holds for ``b``, hence

    a ⊙ b  ↦  D_A D_B (a ⊙ b),       W_d ↦ W_d D_A⁻¹ D_B⁻¹:

the product's per-neuron scale is the product of its factors' scales. On the up projection (no activation)
``W_u ↦ D W_u, b_u ↦ D b_u`` for *any* invertible diagonal ``D``, i.e. ``(R^×)^h``, which the catalogue
expresses as positive scaling times sign flips (``PS`` and ``SF``); on the gate side what the activation allows
(ReLU: positive scaling; tanh: sign flips; SiLU, GELU: nothing diagonal). A permutation ``P`` passes only if
it moves both factors, ``(P a) ⊙ (P b) = P (a ⊙ b)``: the two sites' permutations are tied (one ``S(h)`` moves
the gate rows, the up rows and the down columns). Nothing non-diagonal passes (``g a ⊙ g b ≠ g (a ⊙ b)``), nor
a translation (``(b + t) ⊙ a`` adds ``t ⊙ a``, which depends on the input). A factor's *affine* sign flip
(sigmoid, ``σ(−z) = 1 − σ(z)``) shifts the product by ``c(1 − g) ⊙ b``, which no bias absorbs: the engine drops it
before the product (``mul`` is no center-aware op), and the product carries no center.

The output keeps every factor's segment (several segments on the same coordinates): a map reading it binds its
columns once per factor, each factor's site moving them by its own ``D⁻¹`` (composed, not tied:
:func:`symalg.symbolic.inference.solve` keeps the factor bindings one node makes of one region). ``x ⊙ x`` falls
out: the site appears twice, so scaling moves the reader by ``d^{-2p}`` and a sign flip by ``g² = 1``. A product
with a value nothing acts on (a model input, a constant tensor) passes the diagonal groups of the other factor,
and its permutations when that value is constant along the feature axis.

Ops that do not know about several factors on the same coordinates (those whose registration does not declare
``products``, :mod:`symalg.catalogue.rules.registry`) get the product through :func:`separate_factors`, which keeps
only the joint permutation.

>>> import torch, symalg
>>> class ReGLU(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.gate, self.up, self.down = torch.nn.Linear(3, 4), torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
...     def forward(self, x):
...         return self.down(torch.relu(self.gate(x)) * self.up(x))
>>> analysis = symalg.derive(symalg.from_torch(ReGLU(), (torch.randn(5, 3),)))
>>> sorted(s.label for s in analysis.symmetries)
['PositiveScaling(4, alpha=1) on gate', 'PositiveScaling(4, alpha=1) on up', 'S(4) on gate', 'SignFlips(4) on up']
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence
from fractions import Fraction

from symalg.symbolic.inference import DIAGONAL, Inference, Label, Segment

__all__ = ["multiply", "separate_factors"]


def _ranges(label: Label) -> dict[tuple, list[Segment]]:
    """``{(offset, width, block): segments}``: the factor segments on each range of coordinates."""
    ranges: dict[tuple, list[Segment]] = {}
    for seg in label.segments:
        ranges.setdefault((seg.offset, seg.width, seg.block), []).append(seg)
    return ranges


def multiply(state: Inference, node: str, data: Mapping[str, Any], inputs: Sequence[Any]) -> Label | None:
    """``a ⊙ b`` of two values (module docstring); ``None`` when the rule does not apply (a broadcast that changes
    a factor's feature axis, factors whose sites cover different coordinates, an operand that is no value)."""
    if data["op"] != "mul" or len(inputs) != 2 or not all(isinstance(i, Label) for i in inputs):
        return None
    a, b = inputs
    if not (a.segments or b.segments):
        return None
    out_shape = state.shape(node)
    known = [state.shape(source) for source in data["inputs"]]
    shapes = [shape for shape in known if shape is not None]
    if out_shape is None or len(shapes) != len(known):
        return None
    where = state.where(node)
    if a.segments and b.segments:
        if a.dim != b.dim or not shapes[0] == shapes[1] == out_shape or set(_ranges(a)) != set(_ranges(b)):
            return None
        for factors in (_ranges(a)[key] + _ranges(b)[key] for key in _ranges(a)):
            for seg in factors:
                state.restrict(seg.site, DIAGONAL | seg.acts_trivially(), node,
                               f"{where} multiplies two values elementwise: only diagonal maps and a joint "
                               "permutation of both factors pass")
                state.tie_permutations(factors[0].site, seg.site)
        return Label(a.dim, a.size, tuple(replace(s, center=Fraction(0))
                                          for key in _ranges(a) for s in _ranges(a)[key] + _ranges(b)[key]))
    (factor, shape), other = ((a, shapes[0]), shapes[1]) if a.segments else ((b, shapes[1]), shapes[0])
    if len(shape) + factor.dim < 0 or shape[factor.dim] != out_shape[factor.dim]:
        return None
    constant = len(other) + factor.dim < 0 or other[factor.dim] == 1
    state.restrict_label(factor, {"PS", "SF"} | ({"S"} if constant else set()), node,
                         f"{where} multiplies by a value nothing acts on" +
                         ("" if constant else f", which varies along the sites' axis {factor.dim}"))
    return factor.map_segments(center=Fraction(0))


def separate_factors(state: Inference, node: str, label: Label) -> Label:
    """``label`` for an op not declaring ``products``: where several factors share coordinates, only their
    joint permutation passes (a blocked note names ``node``) and the first factor alone stands for them."""
    if all(len(factors) == 1 for factors in _ranges(label).values()):
        return label
    kept = []
    for factors in _ranges(label).values():
        if len(factors) > 1:
            for seg in factors:
                state.restrict(seg.site, {"S"} | seg.acts_trivially(), node,
                               f"{state.where(node)} ({state.graph.nodes[node]['op']}) reads a product of sites, which "
                               "its rule does not model: only the factors' joint permutation passes", blocked=True)
        kept.append(factors[0])
    return Label(label.dim, label.size, tuple(kept))
