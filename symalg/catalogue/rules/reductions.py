"""Rules for reductions and pooling: means and sums over axes, max and average pooling, softmax. Each constrains a
site only where it reduces or mixes along the site's axis.

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)
['avg_pool', 'log_softmax', 'max_pool', 'mean', 'softmax', 'sum']
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from symalg.catalogue.rule_examples import around
from symalg.symbolic.inference import ALL, TRANSLATIONS, Inference, Label
from symalg.catalogue.rules._base import (Inputs, NodeData, _argument, _dim, _drop_axes, _first, _normalise,
                                          _whole_vector_shifts, unknown_rule)
from symalg.catalogue.rules.registry import OpSpellings, register_rule


@register_rule("mean", "sum", capabilities=(),
               spellings={"mean": OpSpellings(aten=("mean",)),
                          "sum": OpSpellings(aten=("sum",))},
               near_misses={  # centring along the site's own axis: per-unit scalings go
                   "mean": (around(lambda self, h: torch.relu(h) - torch.relu(h).mean(-1, keepdim=True)),),
                   "sum": (around(lambda self, h: torch.relu(h) * torch.relu(h).sum(-1, keepdim=True)),)},
               examples={
    "mean": around(lambda self, h: torch.relu(h).mean(1), shape=(5, 3, 3)),
    "sum": around(lambda self, h: self.inner(torch.tanh(h)).sum(-1, keepdim=True), k=1,
                  inner=lambda: torch.nn.Linear(4, 4))})
def reduce_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``x.mean(dims)``, ``x.sum(dims)`` (``keepdim`` or not; every axis without ``dims``): a linear map along the
    reduced axes. Over other axes than the sites' it commutes with every action on the sites' coordinates
    (``mean(g x + t) = g mean(x) + t``: the label moves to the remaining axes); over the sites' axis the result is
    invariant under permutations of the sites' coordinates only (averaged attention weights under head
    permutations), and no site runs along it."""
    label = _first(inputs)
    shape = state.shape(data["inputs"][0]) if data["inputs"] and data["inputs"][0] is not None else None
    dims, keepdim = _argument(data, 1, "dim"), _argument(data, 2, "keepdim", False)
    dims = list(dims) if isinstance(dims, (list, tuple)) else [] if dims is None else [dims]
    if (len(inputs) != 1 or not isinstance(label, Label) or shape is None or not isinstance(keepdim, bool)
            or not all(_is_index(d) for d in dims)
            or any(isinstance(v, torch.dtype) for v in data["arguments"].values())):
        return unknown_rule(state, node, data, inputs)
    reduced = {d % len(shape) for d in dims} if dims else set(range(len(shape)))
    if not label.segments:
        return Label.data()
    if len(shape) + label.dim in reduced:
        state.restrict_label(label, {"S"}, node, f"{state.where(node)}: {data['op']} over the axis the sites run "
                                                 "along")
        return Label.data()
    return label if keepdim else _drop_axes(state, node, label, sorted(reduced), shape)


def _is_index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _pools_the_sites(state: Inference, node: str, data: NodeData, label: Label) -> bool:
    """``True`` (after removing every kind, with a blocked note) when a pooling op pools over the axis its
    input's sites run along (a ``MaxPool1d`` on ``(B, T, d)`` pools features): windows mix the sites'
    coordinates. The pooled axes are the last ``pooled_dims``; a pooling op without that setting counts too."""
    pooled = data["settings"].get("pooled_dims")
    if not label.segments or pooled is not None and label.dim < -pooled:
        return False
    state.restrict_label(label, set(), node, f"{state.where(node)} pools over the last {pooled or 'unknown'} axes, "
                                             f"and the sites run along axis {label.dim}", blocked=True)
    return True


def _pooling(by_dims: dict[int, tuple[Any, ...]]) -> OpSpellings:
    """Spellings of a pooling op from ``{pooled axes: (modules, functions and ATen names pooling that many)}``, each
    with its setting ``pooled_dims``."""
    spelled = [s for group in by_dims.values() for s in group]
    return OpSpellings(modules=tuple(s for s in spelled if isinstance(s, type)),
                       functions=tuple(s for s in spelled if callable(s) and not isinstance(s, type)),
                       aten=tuple(s for s in spelled if isinstance(s, str)),
                       settings={s: {"pooled_dims": dims} for dims, group in by_dims.items() for s in group})


@register_rule("max_pool", "avg_pool", capabilities=(), spellings={
    "max_pool": _pooling({1: (nn.MaxPool1d, nn.AdaptiveMaxPool1d, F.max_pool1d, "max_pool1d"),
                          2: (nn.MaxPool2d, nn.AdaptiveMaxPool2d, F.max_pool2d, "max_pool2d")}),
    "avg_pool": _pooling({1: (nn.AvgPool1d, nn.AdaptiveAvgPool1d, F.avg_pool1d, F.adaptive_avg_pool1d, "avg_pool1d",
                              "adaptive_avg_pool1d"),
                          2: (nn.AvgPool2d, nn.AdaptiveAvgPool2d, F.avg_pool2d, F.adaptive_avg_pool2d, "avg_pool2d",
                              "adaptive_avg_pool2d")})},
               examples={op: around(lambda self, h: self.pool(torch.relu(h).transpose(1, 2)).transpose(1, 2),
                                    shape=(5, 6, 3), pool=pool)
                         for op, pool in (("max_pool", lambda: torch.nn.MaxPool1d(2)),
                                          ("avg_pool", lambda: torch.nn.AvgPool1d(2)))})
def pool_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Pooling over positions: ``max`` commutes with positive per-channel scaling and channel permutations;
    averaging is linear per channel, so every channel action but translations passes through."""
    label = _first(inputs)
    if _pools_the_sites(state, node, data, label):
        return Label.data(label.dim)
    if data["op"] == "max_pool":
        state.restrict_label(label, {"PS", "S"}, node, f"{state.where(node)}: max pooling")
    else:
        state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)}: pooling")
    return label


@register_rule("softmax", "log_softmax", capabilities=(),
               spellings={"softmax": OpSpellings(modules=(nn.Softmax,), functions=(F.softmax, torch.softmax),
                                                 methods=("softmax",), aten=("_softmax", "softmax")),
                          "log_softmax": OpSpellings(modules=(nn.LogSoftmax,), functions=(F.log_softmax,
                                                     torch.log_softmax), methods=("log_softmax",),
                                                     aten=("_log_softmax", "log_softmax"))},
               near_misses={  # normalised over the batch, not the site's axis: scalings go
                   "softmax": (around(lambda self, h: torch.softmax(h, 0)),),
                   "log_softmax": (around(lambda self, h: torch.log_softmax(h, 0)),)},
               examples={"softmax": around(lambda self, h: torch.softmax(h, -1)),
                                                  "log_softmax": around(lambda self, h: torch.log_softmax(h, -1))})
def softmax_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Softmax over the feature axis: equivariant under permutations, invariant under shifts along 1."""
    label = _first(inputs)
    shape = state.shape(node)
    ndim = len(shape) if shape else None
    dim = _dim(data, 1)
    if dim is None and ndim is not None:  # torch's implicit dim (deprecated): 0 for 0-, 1- and 3-d inputs
        dim = 0 if ndim in (0, 1, 3) else 1
    try:
        dim = None if dim is None else _normalise(dim, ndim)
    except ValueError:
        dim = None
    if dim != label.dim:
        return unknown_rule(state, node, data, inputs)
    state.restrict_label(label, {"S", "T1"}, node, f"{state.where(node)}: softmax")
    _whole_vector_shifts(state, node, label, "the softmax")
    return label.map_segments(invariant=frozenset({"T1"}), power=Fraction(1))
