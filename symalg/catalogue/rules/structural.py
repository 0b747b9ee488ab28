"""Rules for shape ops: concatenation, splits, reshapes, transposes, indexing, expansion and selection. They move
sites between axes and positions without computing.

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)[:5]
['cat', 'chunk', 'expand', 'flatten', 'getitem']
"""
from __future__ import annotations

import operator
from dataclasses import replace
from typing import Iterable

import torch
from torch import nn

from symalg.catalogue.bindings import Binding, TranslationFamily
from symalg.catalogue.rule_examples import around
from symalg.symbolic.inference import ALL, TRANSLATIONS, Inference, Label, Segment
from symalg.catalogue.rules._base import (Inputs, NodeData, Value, WeightExpr, _argument, _drop_axes, _first, _is_param,
                                          _normalise, _splittable, _weight, unknown_rule)
from symalg.catalogue.rules.elementwise import add_rule
from symalg.catalogue.rules.registry import OpSpellings, register_rule


@register_rule("cat", capabilities={"products", "shifts"},
               spellings={"cat": OpSpellings(functions=(torch.cat, torch.concat), aten=("cat",))},
               near_misses={"cat": (  # a site next to a slice of itself
                   around(lambda self, h: torch.cat([torch.relu(h), torch.relu(h)[:, :1]], -1), k=5),)},
               examples={"cat": around(lambda self, h: torch.cat([torch.relu(h), self.inner(h)], -1), k=7,
                                       inner=lambda: torch.nn.Linear(4, 3))})
def cat_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Concatenation along the feature axis stacks the inputs' segments; along another axis it ties them."""
    labels = [i for i in inputs if isinstance(i, Label)]
    if len(labels) != len(inputs):
        return unknown_rule(state, node, data, inputs)
    shape = state.shape(node)
    dim = _argument(data, 1, "dim", 0)
    try:
        dim = _normalise(dim, len(shape) if shape else None)
    except ValueError:
        return unknown_rule(state, node, data, inputs)
    if all(label.dim == dim for label in labels):
        segments, offset = [], 0
        for label, source in zip(labels, data["inputs"]):
            source_shape = state.shape(source)
            size = source_shape[dim] if source_shape else label.size
            if size is None:
                return unknown_rule(state, node, data, inputs)
            segments += [replace(s, offset=s.offset + offset) for s in label.segments]
            offset += size
        return Label(dim, offset, tuple(segments))
    first = labels[0]
    for other in labels[1:]:
        add_rule(state, node, data, [first, other])
    return first


@register_rule("split", "chunk", capabilities={"weights"},
               spellings={"split": OpSpellings(aten=("split", "split_with_sizes")),
                          "chunk": OpSpellings(aten=("chunk",))},
               examples={
    "split": around(lambda self, h: (lambda p: torch.cat([torch.relu(p[0]), torch.tanh(p[1])], -1))(
        h.split([1, 3], -1))),
    "chunk": around(lambda self, h: (lambda p: torch.cat([torch.relu(p[0]), torch.tanh(p[1])], -1))(
        h.chunk(2, -1)))})
def split_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """``x.split(sizes, dim)`` / ``x.chunk(n, dim)``: a tuple of pieces (read by ``getitem``).

    Along another axis than the sites' each piece carries the input's sites. Along the sites' axis a segment
    inside one piece moves to it (offset shifted); a fresh site spanning the axis (made by the map just before,
    read by the split alone: a packed ``qkv`` projection) becomes one site per piece, each moving its slice of
    the map's rows and bias (``W[a:b] ↦ g W[a:b]``), since the pieces are read apart; any other segment straddling
    a cut carries no group.

    A parameter cut along its axis 0 gives its pieces (:class:`WeightExpr`), which a linear map may read as its
    weight or bias (``nn.MultiheadAttention``'s in-projection under ``torch.export``).
    """
    label = _first(inputs)
    before, pieces = state.shape(data["inputs"][0]), state.shape(node)
    if before is None or pieces is None or not all(isinstance(p, tuple) for p in pieces) or \
            not isinstance(label, Label) and not _is_param(label):
        return unknown_rule(state, node, data, inputs)
    dim = _normalise(_argument(data, 2, "dim", 0), len(before))
    if _is_param(label):
        return _parameter_pieces(state, label[1], [p[0] for p in pieces]) \
            if dim == -len(before) and len(before) <= 2 else unknown_rule(state, node, data, inputs)
    if not label.segments or dim != label.dim:
        return tuple(label if label.segments else Label.data(-1, p[-1]) for p in pieces)
    cuts = [0]
    for piece in pieces:
        cuts.append(cuts[-1] + piece[dim])
    if _splittable(state, node, data, label, before[dim]):
        original = state.site(label.segments[0].site)
        original.dissolved = True
        out = []
        for start, end in zip(cuts, cuts[1:]):
            width = end - start
            sub = state.new_site(original.node, width, [b.restrict(start, width) for b in original.bindings],
                                 allowed=original.allowed)
            site = state.site(sub)
            site.translations.extend((kind, producer, TranslationFamily(family.pattern, tuple(
                r.restrict(start, width) for r in family.regions))) for kind, producer, family in original.translations)
            site.checks.extend(original.checks)
            out.append(Label(dim, width, (Segment(sub, 0, width, 1, label.segments[0].power,
                                                  label.segments[0].invariant),)))
        return tuple(out)
    out = []
    for start, end in zip(cuts, cuts[1:]):
        inside = tuple(replace(s, offset=s.offset - start) for s in label.segments
                       if start <= s.offset and s.offset + s.width * s.block <= end)
        out.append(Label(dim, end - start, inside))
    for s in label.segments:
        if not any(start <= s.offset and s.offset + s.width * s.block <= end for start, end in zip(cuts, cuts[1:])):
            state.restrict(s.site, set(), node, f"{state.where(node)} cuts the site's coordinates apart", blocked=True)
    return tuple(out)


def _parameter_pieces(state: Inference, tensor: str, widths: list[int]) -> tuple:
    """The pieces of ``tensor`` cut along its axis 0 into ``widths`` rows each (a matrix's rows and columns, or a
    vector's entries)."""
    matrix = len(state.shapes[tensor]) == 2
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return tuple(WeightExpr(((tensor, 0),), ((tensor, 1),) if matrix else (), (), start, width)
                 for start, width in zip(starts, widths))


@register_rule("flatten", "reshape", "unsqueeze", "squeeze",
               capabilities={"flatten": {"layout", "products", "shifts"}, "reshape": {"layout", "products", "shifts"},
                             "unsqueeze": {"layout"}, "squeeze": {"layout"}},
               spellings={"flatten": OpSpellings(modules=(nn.Flatten,), functions=(torch.flatten,),
                                                 methods=("flatten",), aten=("flatten",)),
                          "reshape": OpSpellings(functions=(torch.reshape, torch.unflatten),
                                                 methods=("view", "reshape", "unflatten"),
                                                 aten=("view", "reshape", "unflatten")),
                          "unsqueeze": OpSpellings(aten=("unsqueeze",)),
                          "squeeze": OpSpellings(aten=("squeeze",))},
               examples={
    "flatten": around(lambda self, h: torch.relu(h).flatten(0, 1), shape=(5, 2, 3)),
    "reshape": around(lambda self, h: torch.relu(h).reshape(-1, 4), shape=(5, 2, 3)),
    "unsqueeze": around(lambda self, h: torch.relu(h).unsqueeze(1)),
    "squeeze": around(lambda self, h: torch.relu(h).unsqueeze(1).squeeze(1))})
def reshape_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Reshapes (``unsqueeze`` and ``squeeze`` too) that keep the sites' axis whole (the axes before it and after
    it regrouped among themselves: ``flatten(2)`` of a conv's positions, ``(B, T, d) ↔ (B·T, d)``), or flatten it
    with trailing axes (conv → dense: each channel becomes a block of entries). Anything else splits the axis (into
    heads: only attention folding keeps per-head structure) and blocks its sites.

    The row-major index of an entry is ``(o·d + f)·r + i`` before and after when the axes before the sites' axis
    hold ``o`` entries on both sides and the axis itself is kept: so it moves with the same coordinate ``f``."""
    label = _first(inputs)
    source = data["inputs"][0]
    before, after = state.shape(source), state.shape(node)
    if before is None or after is None:
        if data["op"] == "flatten" and not label.segments:
            return label
        if label.segments:
            state.restrict_label(label, set(), node, f"{state.where(node)}: reshape without shapes (pass "
                                                     "example_inputs to trace)", blocked=True)
        return Label.data()
    if not label.segments:
        return Label.data(-1, after[-1] if after else None)
    dim = len(before) + label.dim
    for k in range(len(after)):
        if after[k] == before[dim] and _prod(after[:k]) == _prod(before[:dim]):
            return Label(k - len(after), label.size, label.segments)
    trailing = 1
    for size in before[dim + 1:]:
        trailing *= size
    merged = before[dim] * trailing
    if after[-1] == merged and _prod(after[:-1]) == _prod(before[:dim]):
        segments = tuple(replace(s, offset=s.offset * trailing, block=s.block * trailing) for s in label.segments)
        return Label(-1, merged, segments)
    unfolded = data["settings"].get("unfolded")   # why attention folding left this head split (a returned cache)
    state.restrict_label(label, set(), node, f"{state.where(node)} reshapes {before} -> {after}, splitting the "
                                             f"sites' axis {label.dim} (a split into heads keeps per-head structure "
                                             f"only inside folded attention{'; ' + unfolded if unfolded else ''})",
                         blocked=True)
    return Label.data()


def _prod(values: Iterable[int]) -> int:
    result = 1
    for v in values:
        result *= v
    return result


@register_rule("transpose", "permute", capabilities={"layout", "products", "shifts", "weights"},
               spellings={"transpose": OpSpellings(functions=(torch.transpose,), methods=("transpose", "t"),
                                                   aten=("transpose", "t")),
                          "permute": OpSpellings(functions=(torch.permute,), methods=("permute",), aten=("permute",))},
               examples={
    "transpose": around(lambda self, h: torch.relu(h).transpose(0, 1), shape=(5, 2, 3)),
    "permute": around(lambda self, h: torch.relu(h).permute(1, 0, 2), shape=(5, 2, 3))})
def transpose_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """Moving axes moves the feature axis with them; transposing a weight swaps its rows and columns. A parameter
    of another rank (a stack of expert weights ``(E, out, in)``) is read like by an unknown op."""
    weight = _weight(state, inputs[0]) if inputs else None
    if weight is not None:
        return weight.transposed()
    if inputs and (_is_param(inputs[0]) or isinstance(inputs[0], WeightExpr)):
        return unknown_rule(state, node, data, inputs)
    label = _first(inputs)
    if not label.segments:
        return label
    before = state.shape(data["inputs"][0])
    if before is None:
        state.restrict_label(label, set(), node, f"{state.where(node)}: transpose without shapes", blocked=True)
        return Label.data()
    ndim = len(before)
    position = ndim + label.dim
    if data["op"] == "transpose":
        # x.t() (aten.t) has no dims: it swaps the two axes of a matrix
        a, b = (_normalise(_argument(data, i, n, default), ndim) + ndim for i, n, default in ((1, "dim0", 0),
                                                                                              (2, "dim1", 1)))
        order = list(range(ndim))
        order[a], order[b] = order[b], order[a]
    else:
        order = _argument(data, 1, "dims")
        order = list(order if isinstance(order, (list, tuple)) else
                     [v for k, v in sorted(data["arguments"].items()) if k != "arg0"])
        order = [o % ndim for o in order]
    return Label(order.index(position) - ndim, label.size, label.segments)


@register_rule("getitem", capabilities={"layout", "weights"},
               spellings={"getitem": OpSpellings(functions=(operator.getitem,), aten=("getitem",))},
               examples={"getitem": around(
    lambda self, h: self.attention(h, h, h)[0], shape=(5, 3, 3),
    attention=lambda: torch.nn.MultiheadAttention(4, 2, batch_first=True))})
def getitem_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """Picking an output of a multi-output op; indexing a value with integers and full slices (``x[:, 0]``) is a
    selection (:func:`select_rule`); any other indexing is unknown."""
    source = inputs[0]
    index = _argument(data, 1, "index")
    if isinstance(source, tuple) and not _is_param(source) and isinstance(index, int):
        return source[index]
    index = index if isinstance(index, tuple) else (index,)
    whole = slice(None)
    if isinstance(source, Label) and len(inputs) == 1 and \
            all(isinstance(i, int) and not isinstance(i, bool) or i == whole for i in index):
        return _drop_axes(state, node, source, [p for p, i in enumerate(index) if isinstance(i, int)],
                          state.shape(data["inputs"][0]))
    return unknown_rule(state, node, data, inputs)


class _Token(torch.nn.Module):
    """A learned first token (ViT's CLS token) put before ``h``'s tokens: ``cat([t.expand(B, -1, -1), h], 1)``."""

    def __init__(self, d: int = 4):
        super().__init__()
        self.token = torch.nn.Parameter(torch.randn(1, 1, d))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(h.shape[0], -1, -1), h], 1)


@register_rule("expand", capabilities={"layout", "weights"},
               spellings={"expand": OpSpellings(methods=("expand",), aten=("expand",))},
               examples={"expand": around(lambda self, h: self.first(torch.relu(h)), shape=(5, 3, 3),
                                                    first=lambda: _Token(4))})
def expand_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``v.expand(...)`` repeats ``v`` along axes of length 1. Of a parameter ``p`` (ViT's CLS token) it is a value
    whose last axis indexes ``p``'s: a new site moving ``p`` there (``p ↦ π(g) p``), tied by whatever combines it
    (a concatenation along the tokens, a sum). Of a value along other axes than the sites' it keeps the label;
    repeating along the sites' axis blocks them."""
    source = inputs[0] if inputs and all(i is None for i in inputs[1:]) else None  # then the sizes
    after = state.shape(node)
    if _is_param(source) and after is not None and state.shapes[source[1]][-1] == after[-1]:
        shape = state.shapes[source[1]]
        site = state.new_site(node, shape[-1], [Binding(source[1], len(shape) - 1, 0, shape[-1], node=node)],
                              allowed=ALL - TRANSLATIONS)
        return Label(-1, shape[-1], (Segment(site, 0, shape[-1]),))
    if not isinstance(source, Label):
        return unknown_rule(state, node, data, inputs)
    before = state.shape(data["inputs"][0])
    if source.segments and (before is None or after is None or before[source.dim] != after[source.dim]):
        state.restrict_label(source, set(), node, f"{state.where(node)} repeats the axis {source.dim} the sites run "
                                                  "along", blocked=True)
        return Label.data()
    return source


@register_rule("select", capabilities={"layout"},
               spellings={"select": OpSpellings(functions=(torch.select,), methods=("select",), aten=("select",))},
               examples={"select": around(lambda self, h: torch.select(torch.relu(h), 1, 0),
                                                    shape=(5, 3, 3))})
def select_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``x.select(dim, i)``, ``x[:, 0]`` (a CLS token): one entry along an axis that is not the sites' keeps every
    action, since each coordinate of the sites moves as before; along the sites' axis it picks one coordinate,
    which then no action of those sites may move."""
    if len(inputs) != 1 or not isinstance(inputs[0], Label):
        return unknown_rule(state, node, data, inputs)
    return _drop_axes(state, node, inputs[0], [_argument(data, 1, "dim")], state.shape(data["inputs"][0]))
