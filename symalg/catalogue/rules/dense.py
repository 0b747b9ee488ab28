"""Rules for dense maps: ``linear``, ``addmm``, convolutions, embeddings, products of weights (``B @ A``), weight
norm and distances to learned centres. A map's rows carry a new site; its columns read the input's sites.

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)
['addmm', 'cdist', 'conv', 'embedding', 'linear', 'matmul', 'weight_norm']
"""
from __future__ import annotations

import operator
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from symalg.catalogue.bindings import Absorber, Binding, TranslationFamily
from symalg.catalogue.rule_examples import Conv1D, RadialBasis, around, model_example
from symalg.symbolic.inference import ALL, DIAGONAL, TRANSLATIONS, Inference, Label, Segment
from symalg.catalogue.rules._base import (Inputs, NodeData, Value, WeightExpr, _argument, _first, _is_param,
                                          _layer_call, _weight, _weights, unknown_rule)
from symalg.catalogue.rules.registry import OpSpellings, register_rule


def _producer_site(state: Inference, node: str, width: int, weight: str | WeightExpr,
                   bias: str | WeightExpr | None) -> int:
    """A site on the rows of ``weight`` (a parameter name or a :class:`WeightExpr`) and of ``bias`` (a vector or a
    piece of one), with the translations a consumer may allow: along ``1`` (whole weight parameters, bias) and of
    the bias."""
    expr = weight if isinstance(weight, WeightExpr) else WeightExpr(((weight, 0),), (), (weight,))
    rows = [Binding(t, axis, expr.start, width, node=node) for t, axis in expr.rows]
    bias_rows = None if bias is None else Binding(bias, 0, 0, width, node=node) if isinstance(bias, str) else \
        Binding(bias.rows[0][0], 0, bias.start, width, node=node)
    site = state.new_site(node, width, rows + ([bias_rows] if bias_rows is not None else []))
    if expr.row_kinds != ALL:
        state.restrict(site, expr.row_kinds, node, f"{state.where(node)}: {expr.why}")
    translations = state.site(site).translations
    translations += [("T1", node, TranslationFamily("rows", (b,))) for b in rows if b.tensor in expr.plain]
    if bias_rows is not None:
        translations.append(("T1", node, TranslationFamily("ones", (bias_rows,))))
        translations.append(("T", node, TranslationFamily("entries", (bias_rows,))))
    return site


def _read_as_map(state: Inference, node: str, label: Label, weight: str | WeightExpr, feature_dim: int,
                 bias: str | WeightExpr | None = None, why: str = "has no bias") -> None:
    """A map reads ``label`` on its input axis: bind columns (of every column tensor of a
    :class:`WeightExpr`). A translation of the input changes the output by ``W t``: a map with a whole bias and a
    weight that is one parameter (``bias`` given by the caller where the change is the same at every position) gives it
    back (``b ↦ b − W t``, :meth:`~symalg.symbolic.inference.Inference.absorb`); any other map removes it (``why``
    says why there is no ``bias``)."""
    columns = weight.cols if isinstance(weight, WeightExpr) else ((weight, 1),)
    if label.segments and label.dim != feature_dim:
        state.restrict_label(label, set(), node, f"{state.where(node)} reads axis {feature_dim} of a value whose "
                                                 f"sites run along axis {label.dim}", blocked=True)
        label = Label.data(feature_dim)
    plain = _plain_map(state, weight)
    if isinstance(bias, str) and plain is not None:
        state.restrict_label(label, ALL - {"T1"}, node, f"{state.where(node)} does not absorb a shift along 1 of "
                                                        "its input")
        state.absorb(label, Absorber(bias, Binding(plain[0], plain[1], 0, 0, role="in", node=node), plain[2], node))
    else:
        why = why if bias is None else "reads a piece of its bias" if not isinstance(bias, str) else \
            "computes its weight"
        state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)} {why}: it cannot give back the "
                                                              "change a translation of its input makes")
    if isinstance(weight, WeightExpr) and weight.col_kinds != ALL:
        state.restrict_label(label, weight.col_kinds, node, f"{state.where(node)}: {weight.why}")
    for tensor, axis in columns:
        state.bind_reader(label, tensor, axis, node)


def _plain_map(state: Inference, weight: str | WeightExpr) -> tuple[str, int, int] | None:
    """``(tensor, input axis, output axis)`` when the map's weight is one whole parameter, read as it is or transposed
    (``addmm``'s ``(in, out)`` weight); ``None`` for a weight computed from several (``W + B @ A``) or a piece."""
    if isinstance(weight, str):
        return weight, 1, 0
    if len(weight.plain) == 1 and len(weight.rows) == len(weight.cols) == 1 and weight.width is None:
        (tensor, rows), (other, cols) = weight.rows[0], weight.cols[0]
        if tensor == other == weight.plain[0] and {rows, cols} == {0, 1} and len(state.shapes[tensor]) == 2:
            return tensor, cols, rows
    return None


def _absorb_shifts(state: Inference, node: str, label: Label, weight: str | WeightExpr,
                   bias: str | WeightExpr | None) -> None:
    """A linear map or unpadded convolution reading a value shifted by affine sign flips, ``v ↦ g v + τ``: its
    bias absorbs ``−W' τ`` (``W'`` the moved weight, summed over the kernel's positions). Without a whole bias, or
    with a weight computed in ``forward`` (``B @ A``, a piece), the flips go."""
    plain = _plain_map(state, weight)
    if not isinstance(bias, str) or plain is None:
        why = "has no bias" if bias is None else "reads a piece of its bias" if not isinstance(bias, str) else \
            "computes its weight"
        _refuse_shifts(state, node, label, f"{why} to absorb the shift of an affine sign flip")
        return
    tensor, axis, out_axis = plain
    for seg in label.segments:
        if not seg.center:
            continue
        column = Binding(tensor, axis, seg.offset, seg.width, seg.block, "in", seg.power, node=node,
                         invariant=seg.unmoved())
        state.site(seg.site).shifts.append((Absorber(bias, column, out_axis, node), seg.center))


def _unpadded(settings: Mapping[str, Any]) -> bool:
    """No zero padding (``padding=0`` or ``'valid'``): every output position reads a full window, so a constant
    input shift adds the same ``Σ_k W[:, :, k] τ`` everywhere, which the bias can absorb."""
    padding = settings.get("padding", 0)
    return padding == "valid" or all(p == 0 for p in (padding if isinstance(padding, tuple) else (padding,)))


def _refuse_shifts(state: Inference, node: str, label: Label, why: str) -> None:
    """Remove the affine sign flips of every shifted segment ``label`` carries into ``node``."""
    for seg in label.segments:
        if seg.center:
            state.restrict(seg.site, ALL - {"SF"}, node, f"{state.where(node)} {why}")


@register_rule("linear", capabilities={"products", "shifts", "weights"},
               spellings={"linear": OpSpellings(modules=(nn.Linear,), functions=(F.linear,), aten=("linear",))},
               near_misses={"linear": (  # a fixed weight (a buffer, not a parameter) pins its input's site
                   around(lambda self, h: F.linear(torch.relu(h), self.fixed),
                          buffers=lambda: {"fixed": torch.randn(4, 4)}),)},
               examples={"linear": around(lambda self, h: self.inner(torch.relu(h)),
                                                   inner=lambda: torch.nn.Linear(4, 4))})
def linear_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``y = W x + b``: a new site on the rows of ``W`` and ``b``; the input's sites on its columns.
    ``W`` may be computed from parameters (``F.linear(x, W + B @ A)``: see :func:`matmul_rule`)."""
    label = _first(inputs)
    if data["kind"] == "module":
        weight, bias = data["params"]["weight"], data["params"].get("bias")
        out_features = state.shapes[weight][0]
    else:
        weight = _weight(state, inputs[1] if len(inputs) > 1 else None, pieces=True)
        bias = _bias(state, inputs[2] if len(inputs) > 2 else None)
    _shift_reader_rows(state, node, data, weight)
    if data["kind"] != "module":
        if weight is None or len(inputs) > 2 and inputs[2] is not None and bias is None:
            return unknown_rule(state, node, data, inputs)
        tensor, axis = weight.rows[0]
        out_features = weight.width or state.shapes[tensor][axis]
    return _dense_map(state, node, label, weight, bias, out_features)


def _bias(state: Inference, value: Value) -> str | WeightExpr | None:
    """A bias operand: a vector parameter, or a piece of one; ``None`` for anything else."""
    if _is_param(value) and len(state.shapes[value[1]]) == 1:
        return value[1]
    return value if isinstance(value, WeightExpr) and not value.cols and value.width is not None else None


def _dense_map(state: Inference, node: str, label: Label, weight: str | WeightExpr, bias: str | WeightExpr | None,
               out_features: int, dim: int = -1) -> Label:
    """``y = W x + b`` along axis ``dim`` (the last by default; ``W @ x`` maps axis ``-2``): the input's sites on the
    columns of ``W`` (a parameter or a :class:`WeightExpr`), a new site on its rows and ``b``."""
    _read_as_map(state, node, label, weight, dim, bias)
    _absorb_shifts(state, node, label, weight, bias)
    site = _producer_site(state, node, out_features, weight, bias)
    return Label(dim, out_features, (Segment(site, 0, out_features),))


@register_rule("addmm", capabilities={"weights"},
               spellings={"addmm": OpSpellings(functions=(torch.addmm,), aten=("addmm",))},
               examples={"addmm": around(lambda self, h: self.inner(torch.relu(h)), shape=(2, 5, 3),
                                                  inner=lambda: Conv1D(4, 4))})
def addmm_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``addmm(b, x, W) = β b + α x W``, ``W`` of shape ``(in, out)`` (GPT-2's ``Conv1D``): a dense layer whose
    weight is ``Wᵀ``, so the new site is on ``W``'s columns and ``b``, the input's sites on ``W``'s rows. The
    numbers ``α, β`` scale the map and the bias, which commutes with every action (a translation of ``b`` is a
    translation of the output)."""
    bias, value, weight = (list(inputs) + [None] * 3)[:3]
    weight = _weight(state, weight)
    if not isinstance(value, Label) or weight is None or not _is_param(bias) or len(state.shapes[bias[1]]) != 1:
        return unknown_rule(state, node, data, inputs)
    transposed = weight.transposed()
    tensor, axis = transposed.rows[0]
    return _dense_map(state, node, value, transposed, bias[1], state.shapes[tensor][axis])


@register_rule("conv", capabilities={"shifts", "weights"},
               spellings={"conv": OpSpellings(modules=(nn.Conv1d, nn.Conv2d), functions=(F.conv1d, F.conv2d),
                                              aten=("conv1d", "conv2d"),
                                              arguments=("stride", "padding", "dilation", "groups"))},
               examples={"conv": model_example(
    lambda: torch.nn.Sequential(torch.nn.Conv1d(2, 3, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv1d(3, 2, 3)),
    lambda: torch.randn(5, 2, 8))})
def conv_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Convolution: output channels are a site (kernel axis 0, bias); input channels its columns.

    ``groups = 1`` reads every input channel; a depthwise conv (``groups = in = out``) is a diagonal
    map: per-channel scalings and sign flips pass into its kernel, a permutation moves both sides.
    """
    label = _first(inputs)
    if "weight" not in data["params"] or not _layer_call(state, data, inputs):
        return unknown_rule(state, node, data, inputs)
    weight, bias = data["params"]["weight"], data["params"].get("bias")
    settings = data["settings"]
    out_channels, in_per_group = state.shapes[weight][:2]
    channel_dim = -(len(state.shapes[weight]) - 1)
    if settings.get("padding_mode", "zeros") != "zeros":
        state.restrict_label(label, set(), node, f"{state.where(node)}: padding mode {settings['padding_mode']!r}",
                             blocked=True)
    if settings["groups"] == 1:
        _read_as_map(state, node, label, weight, channel_dim, bias if _unpadded(settings) else None,
                     "has no bias" if bias is None else "pads with zeros (a shift of its input changes the borders)")
        if _unpadded(settings):
            _absorb_shifts(state, node, label, weight, bias)
        else:
            _refuse_shifts(state, node, label,
                           "pads with zeros, so the shift of an affine sign flip varies with position")
        site = _producer_site(state, node, out_channels, weight, bias)
        return Label(channel_dim, out_channels, (Segment(site, 0, out_channels),))
    if settings["groups"] == settings["in_channels"] == out_channels and in_per_group == 1:
        _refuse_shifts(state, node, label, "is depthwise: the shift of an affine sign flip is not modelled there")
        if label.segments and label.dim != channel_dim:
            state.restrict_label(label, set(), node, f"{state.where(node)}: a depthwise convolution of the channels "
                                                     f"(axis {channel_dim}) slides along the sites' axis {label.dim}",
                                 blocked=True)
            label = Label.data(channel_dim)
        return _diagonal_map(state, node, label, weight, bias, channel_dim)
    state.restrict_label(label, set(), node, f"{state.where(node)}: grouped convolution with groups="
                                             f"{settings['groups']} is not modelled", blocked=True)
    return Label.data(channel_dim, out_channels)


def _diagonal_map(state: Inference, node: str, label: Label, scale: str | None, shift: str | None, dim: int,
                  axis: int = 0) -> Label:
    """``y = s ⊙ x + t`` per feature: each input site's scalings/sign flips are absorbed by ``s``; the
    output gets a new site acting on ``s, t`` (positive scaling, sign flips), tied to the input's
    permutations, and translating ``t`` (``T``, when ``t`` is one vector for every position: the biased maps reading
    ``y`` give the shift back, a LayerNorm's bias into the next layer's). A data input (no sites) still gives the
    output its site. The feature axis is ``dim`` of
    the value and ``axis`` of ``s, t`` (a LayerNorm gain over several axes has more)."""
    state.restrict_label(label, DIAGONAL, node, f"{state.where(node)} is a per-feature (diagonal) map")
    if label.segments:
        pieces = label.segments
    else:
        parameter = scale or shift
        if parameter is None:
            raise ValueError(f"{state.where(node)}: a per-feature map needs a scale or a shift parameter")
        pieces = (Segment(-1, 0, state.shapes[parameter][axis]),)
    segments = []
    translated = shift is not None and len(state.shapes[shift]) == 1   # the same shift at every position
    for seg in pieces:
        bindings = [Binding(t, axis, seg.offset, seg.width, seg.block, diagonal=True, node=node)
                    for t in (scale, shift) if t]
        if scale:
            reader = Binding(scale, axis, seg.offset, seg.width, seg.block, "in", seg.power, diagonal=True, node=node,
                             invariant=seg.unmoved())
            if seg.site >= 0:
                state.bind(seg.site, reader)
            else:
                state.pin(reader, node)
        allowed = (DIAGONAL if seg.site >= 0 else {"PS", "SF"}) | ({"T"} if translated and seg.block == 1 else set())
        site = state.new_site(node, seg.width, bindings, allowed=allowed)
        if "T" in allowed and shift is not None:
            shifted = Binding(shift, axis, seg.offset, seg.width, node=node)
            state.site(site).translations.append(("T", node, TranslationFamily("entries", (shifted,))))
        if seg.site >= 0:
            state.tie_permutations(seg.site, site)
        segments.append(Segment(site, seg.offset, seg.width, seg.block))
    return Label(dim, label.size, tuple(segments))


@register_rule("embedding", capabilities={"weights"},
               spellings={"embedding": OpSpellings(modules=(nn.Embedding,), functions=(F.embedding,),
                                                   aten=("embedding",),
                                                   arguments=("padding_idx", "max_norm"))},
               examples={"embedding": model_example(
    lambda: torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)),
    lambda: torch.arange(6))})
def embedding_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``x = E[i]``: a site on the columns of the table ``E`` (``E ↦ E gᵀ``). The call's table is its recorded
    ``weight``, whatever the argument order (``F.embedding(i, E)``, ``aten.embedding(E, i)``). Each row may move
    along ``1`` (``E ↦ E + a 1ᵀ``: ``T1``, kept where every reader of the value ignores such a shift, as a
    LayerNorm does)."""
    weight = data["params"].get("weight")
    indices = [p for p, label in enumerate(inputs) if not _is_param(label)]
    renormed = data["settings"].get("max_norm") is not None  # rows rescaled in place to a norm: no GL
    if weight is None or renormed or len(indices) != 1 or not _layer_call(state, data, inputs, indices[0]):
        return unknown_rule(state, node, data, inputs)
    vocabulary, width = state.shapes[weight]
    state.pin(Binding(weight, 0, 0, vocabulary, node=node), node)
    columns = Binding(weight, 1, 0, width, node=node)
    site = state.new_site(node, width, [columns])
    state.site(site).translations.append(("T1", node, TranslationFamily("rows", (columns,))))
    return Label(-1, width, (Segment(site, 0, width),))


@register_rule("matmul", capabilities={"weights"},
               spellings={"matmul": OpSpellings(functions=(torch.matmul, operator.matmul, torch.bmm),
                                                methods=("matmul",), aten=("matmul", "bmm"))},
               examples={
    "matmul": around(lambda self, h: torch.nn.functional.linear(torch.relu(h), self.lora_b @ self.lora_a),
                     lora_a=lambda: torch.nn.Parameter(torch.randn(2, 4)),
                     lora_b=lambda: torch.nn.Parameter(torch.randn(4, 2)))})
def matmul_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """A product of weights ``B @ A`` (a low-rank adapter): ``GL(r)`` on the inner axis (``A ↦ g A``,
    ``B ↦ B g⁻¹``); the product's rows are ``B``'s, its columns ``A``'s. A value times a weight matrix, either way
    round, is the dense map it is (:func:`_contraction`). Products of values (attention scores) are folded before
    inference; any other product is unknown."""
    mapped = _contraction(state, node, data, inputs)
    if mapped is not None:
        return mapped
    weights = _weights(state, inputs)
    if weights is None or len(weights) != 2:
        return unknown_rule(state, node, data, inputs)
    left, right = weights
    tensor, axis = left.cols[0]
    width = state.shapes[tensor][axis]
    state.new_site(node, width, [Binding(t, a, 0, width, role="in", node=node) for t, a in left.cols] +
                   [Binding(t, a, 0, width, node=node) for t, a in right.rows],
                   allowed=(ALL - TRANSLATIONS) & left.col_kinds & right.row_kinds)
    return WeightExpr(left.rows, right.cols, row_kinds=left.row_kinds, col_kinds=right.col_kinds,
                      why="; ".join(filter(None, (left.why, right.why))))


def _contraction(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label | None:
    """A value contracted with a weight matrix (a parameter, or one computed from parameters): ``x @ M`` maps the last
    axis of ``x`` by ``Mᵀ`` (``x @ W.T``, ``torch.matmul(x, W.t())``: Falcon's projections), ``M @ x`` maps axis
    ``-2`` of ``x`` (``-1`` for a vector) by ``M``: the dense map ``y = W x`` with ``W`` the weight read that way round,
    its rows a new site, its columns reading the sites of ``x`` (``g`` on one contracted axis, ``g⁻ᵀ`` on the other).
    ``None`` for any other product (two values, two weights, a weight of another rank).

    >>> import torch, symalg
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.w1, self.w2 = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(2, 4))
    ...     def forward(self, x):
    ...         return torch.relu(x @ self.w1.T) @ self.w2.t()
    >>> [s.label for s in symalg.derive(symalg.trace(Net(), (torch.randn(5, 3),)), certify=False).symmetries]
    ['PositiveScaling(4, alpha=1) on w1', 'S(4) on w1']
    """
    if len(inputs) != 2 or data["kind"] != "function":
        return None
    (value, matrix), left = ((inputs[1], inputs[0]), True) if isinstance(inputs[1], Label) else (inputs, False)
    weight = _weight(state, matrix)
    shape = state.shape(data["inputs"][1 if left else 0])
    if not isinstance(value, Label) or weight is None or shape is None:
        return None
    weight = weight if left else weight.transposed()   # x @ M = (Mᵀ xᵀ)ᵀ: the map's weight is Mᵀ
    tensor, axis = weight.rows[0]
    return _dense_map(state, node, value, weight, None, state.shapes[tensor][axis], -2 if left and len(shape) > 1
                      else -1)


@register_rule("weight_norm", capabilities={"weights"},
               spellings={"weight_norm": OpSpellings(functions=(torch._weight_norm,), aten=("_weight_norm",))},
               examples={
    "weight_norm": around(lambda self, h: torch.nn.functional.linear(torch.relu(h), torch._weight_norm(self.v, self.g,
                                                                                                      0)),
                          v=lambda: torch.nn.Parameter(torch.randn(4, 4)),
                          g=lambda: torch.nn.Parameter(torch.randn(4, 1)))})
def weight_norm_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """``_weight_norm(v, g, 0) = g v/‖v‖`` with a norm per row (``nn.utils.weight_norm``'s hook on a linear layer): a
    weight whose rows move with those of ``v`` and ``g`` by scalings (``(d g)(d v)/‖d v‖ = d W``) and permutations
    only (a sign flip of both leaves ``W`` as it is), and whose columns move with ``v``'s by maps keeping every row's
    norm (orthogonal maps, permutations, sign flips). Other ``dim`` values and shapes are unknown."""
    v, g = (list(inputs) + [None, None])[:2]
    dim = _argument(data, 2, "dim", 0)
    if not (_is_param(v) and _is_param(g) and dim == 0 and len(state.shapes[v[1]]) == 2
            and state.shapes[g[1]] == (state.shapes[v[1]][0], 1)):
        return unknown_rule(state, node, data, inputs)
    return WeightExpr(((v[1], 0), (g[1], 0)), ((v[1], 1),), row_kinds=frozenset({"PS", "S", "T", "T1"}),
                      col_kinds=frozenset({"O", "O1", "S", "SF", "EF"}),
                      why=f"reads the weight {state.where(node)} computes as g v/‖v‖ (weight norm per row): its rows "
                          "move by scalings and permutations only, its columns by maps keeping every row's norm")


@register_rule("cdist", capabilities={"weights"},
               spellings={"cdist": OpSpellings(functions=(torch.cdist,), aten=("cdist",))},
               examples={"cdist": model_example(
    lambda: torch.nn.Sequential(RadialBasis(6, 3), torch.nn.Linear(6, 2)), lambda: torch.randn(8, 3))})
def cdist_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Distances ``‖x − c_i‖`` to centres ``C`` (rows): a site whose permutations move the centres."""
    label = _first(inputs)
    if len(inputs) < 2 or not _is_param(inputs[1]) or label.segments:
        return unknown_rule(state, node, data, inputs)
    centres = inputs[1][1]
    count = state.shapes[centres][0]
    site = state.new_site(node, count, [Binding(centres, 0, 0, count, node=node)], allowed={"S"})
    return Label(-1, count, (Segment(site, 0, count),))


def _shift_reader_rows(state: Inference, node: str, data: NodeData, weight: str | WeightExpr | None) -> None:
    """A linear map reading a gain-free layer norm's output (:func:`_zero_sum_readers`) as its input: its weight's
    columns shift together, ``W ↦ W + c 1ᵀ``, when the weight is one whole parameter read as it is."""
    for (norm, reader), site in state.zero_sums.items():
        if reader != node:
            continue
        plain = _plain_map(state, weight) if weight is not None else None
        if data["inputs"][0] != norm or plain is None or plain[1:] != (1, 0):
            state.restrict(site, set(), node, f"{state.where(node)} reads the output of the gain-free layer norm "
                                              f"{norm!r} but not as the input of one whole weight", blocked=True)
            continue
        columns = Binding(plain[0], 1, 0, state.shapes[plain[0]][1], role="in", node=node)
        state.site(site).translations.append(("T1", node, TranslationFamily("rows", (columns,))))
