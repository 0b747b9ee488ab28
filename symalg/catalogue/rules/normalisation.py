"""Rules for normalisation layers: batch, layer, RMS and group norms (invariances of the normalisation, and the
affine part as a diagonal map).

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)
['batch_norm', 'group_norm', 'layer_norm', 'rms_norm']
"""
from __future__ import annotations

from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from symalg.catalogue.bindings import Binding, TranslationFamily
from symalg.catalogue.rule_examples import around
from symalg.symbolic.inference import ALL, Inference, Label, Segment, _Site
from symalg.catalogue.rules._base import (Inputs, NodeData, _first, _layer_call, _splittable, _whole_vector_shifts,
                                          unknown_rule)
from symalg.catalogue.rules.dense import _diagonal_map
from symalg.catalogue.rules.registry import OpSpellings, register_rule


def _channel_axis(state: Inference, data: NodeData) -> int | None:
    """Axis 1 of a norm's input (batch and group norm's channels) as a negative index; ``None`` without a shape."""
    shape = state.shape(data["inputs"][0])
    return 1 - len(shape) if shape is not None and len(shape) >= 2 else None


def _across_sites(state: Inference, node: str, label: Label, axes: tuple[int, ...], kinds: set[str], what: str) -> bool:
    """``True`` when ``label``'s sites run along none of ``axes``, the axes a norm computes its statistics
    and affine parameters along. The norm then treats every slice along the sites' axis alike, so only
    ``kinds`` pass (a blocked note names the node); no affine site is created on the sites' axis."""
    if not label.segments or label.dim in axes:
        return False
    state.restrict_label(label, kinds, node, f"{state.where(node)}: {what} works along axes {list(axes)}, but the "
                                             f"sites run along axis {label.dim}: only {', '.join(sorted(kinds))} "
                                             "pass", blocked=True)
    return True


@register_rule("batch_norm", capabilities={"weights"},
               spellings={"batch_norm": OpSpellings(modules=(nn.BatchNorm1d, nn.BatchNorm2d), functions=(F.batch_norm,),
                                                    aten=("batch_norm",),
                                                    arguments=("training", "momentum", "eps"))},
               examples={
    "batch_norm": around(lambda self, h: torch.relu(self.norm(h)), norm=lambda: torch.nn.BatchNorm1d(4))})
def batch_norm_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Batch norm per channel (axis 1 of its input). With batch statistics (training) it is invariant under
    translations of its input's bias and, for ``eps = 0``, under positive scalings; in eval mode the running
    statistics transform with them (mean ``↦ d·mean + t``, var ``↦ d²·var``: a bias translation moves bias and
    running mean together, unless the input itself ignores it, as after a group norm). Its affine part is a
    diagonal map on the channel axis.

    torch requires ``eps > 0`` in training, where ``BN(d·x) = BN_{eps/d²}(x)``: the scaling would have
    to move ``eps`` (one number for all channels), so it is no symmetry and is reported as blocked.
    In eval mode ``eps = 0`` is allowed and the scalings are claimed. Sites along another axis (a
    ``(B, T, d)`` input normalises each of the ``T`` positions over batch and ``d``) keep permutations only."""
    label = _first(inputs)
    settings = data["settings"]
    buffers = data["buffers"]
    channel = _channel_axis(state, data)
    if channel is None or not _layer_call(state, data, inputs):
        return unknown_rule(state, node, data, inputs)
    if _across_sites(state, node, label, (channel,), {"S"}, "batch norm"):
        return label
    batch_statistics = settings["training"] or not settings.get("track_running_stats", True)
    affine = settings.get("affine", "weight" in data["params"])
    if not batch_statistics and affine:
        return _eval_affine(state, node, label, data, channel)
    kinds = {"S", "T"} | ({"PS"} if settings["eps"] == 0 else set())
    reason = f"{state.where(node)} normalises each channel" + (
        "" if settings["eps"] == 0 else f" (eps = {settings['eps']} breaks its scale invariance: BN(d·x) is BN with "
                                        "eps/d²; only eval mode admits eps = 0)")
    state.restrict_label(label, kinds, node, reason, blocked=settings["eps"] != 0)
    if not batch_statistics:
        _running_statistics(state, node, label, buffers, 2)
    elif "running_mean" in buffers:
        for seg in label.segments:
            state.bind(seg.site, Binding(buffers["running_mean"], 0, seg.offset, seg.width, seg.block, "out",
                                         Fraction(0), buffer=True, diagonal=True, node=node, invariant=seg.unmoved()))
            state.bind(seg.site, Binding(buffers["running_var"], 0, seg.offset, seg.width, seg.block, "out",
                                         Fraction(0), buffer=True, diagonal=True, node=node, invariant=seg.unmoved()))
    normalised = Label(channel, label.size, tuple(Segment(s.site, s.offset, s.width, s.block, Fraction(0),
                                                          s.invariant | {"T"}) for s in label.segments))
    if not affine:
        return normalised
    return _diagonal_map(state, node, normalised, data["params"]["weight"], data["params"].get("bias"), channel)


def _running_statistics(state: Inference, node: str, label: Label, buffers: dict, var_power: int) -> None:
    """Bind eval-mode running statistics to the input's sites: ``μ ↦ d μ`` (and with a bias translation of the
    input, ``μ ↦ μ + t``, unless the input ignores it), ``σ² ↦ d^var_power σ²`` (``0``: permuted only, sign flips
    leave it too)."""
    for seg in label.segments:
        mean = Binding(buffers["running_mean"], 0, seg.offset, seg.width, seg.block, "out", seg.power,
                       buffer=True, node=node, invariant=seg.unmoved())
        state.bind(seg.site, mean)
        state.bind(seg.site, Binding(buffers["running_var"], 0, seg.offset, seg.width, seg.block, "out",
                                     var_power * seg.power, buffer=True, diagonal=var_power == 0, node=node,
                                     invariant=seg.unmoved() | (frozenset({"SF"}) if var_power == 0 else frozenset())))
        site = state.site(seg.site)
        if seg.block != 1:
            state.restrict(seg.site, ALL - {"T"}, node, f"{state.where(node)}: channels in blocks", blocked=True)
        if "T" not in seg.invariant:
            site.translations[:] = [(kind, producer, family.extended(mean) if kind == "T" else family)
                                    for kind, producer, family in site.translations]


def _eval_affine(state: Inference, node: str, label: Label, data: NodeData, channel: int) -> Label:
    """Eval-mode batch norm with a gain: ``y = γ (x − μ)/√(σ² + ε) + β`` per channel is a diagonal map of ``x``.
    A scaling ``x ↦ d x`` of the input's sites (any invertible diagonal ``d``: ``PS`` and ``SF``) is given back
    exactly by ``μ ↦ d μ``, ``γ ↦ γ/d`` with ``σ²`` and ``β`` kept, whatever ``ε``:
    ``(γ/d)(d x − d μ)/√(σ² + ε) = γ (x − μ)/√(σ² + ε)`` (scaling ``σ²`` by ``d²`` instead is exact only for
    ``ε = 0``). A translation of the input's bias moves ``μ`` with it; permutations move every channel vector. The
    output is the diagonal map's own site (its scalings on ``γ, β`` and the readers)."""
    state.restrict_label(label, {"S", "T", "PS", "SF"}, node, f"{state.where(node)} normalises each channel")
    _running_statistics(state, node, label, data["buffers"], 0)
    centred = Label(channel, label.size, tuple(Segment(s.site, s.offset, s.width, s.block, s.power,
                                                       s.invariant | {"T"}) for s in label.segments))
    return _diagonal_map(state, node, centred, data["params"]["weight"], data["params"].get("bias"), channel)


@register_rule("layer_norm", capabilities={"weights"},
               spellings={"layer_norm": OpSpellings(modules=(nn.LayerNorm,), functions=(F.layer_norm,),
                                                    aten=("layer_norm",),
                                                    arguments=("normalized_shape", "eps"))},
               examples={
    "layer_norm": around(lambda self, h: torch.relu(self.norm(h)), norm=lambda: torch.nn.LayerNorm(4))})
def layer_norm_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Layer norm over the last ``k = len(normalized_shape)`` axes. A site along one of them: equivariant under
    orthogonal maps fixing ``1`` (they keep the mean and the norm of the centred vector; permutations among
    them), invariant under shifts along ``1`` of the *whole* normalised vector (:func:`_whole_vector_shifts`);
    the gain and bias are a diagonal map (which leaves only the permutations). A site along another axis
    (a LayerNorm over time after a transpose): each row is normalised alike, so permutations pass, a
    translation of the row's bias cancels, and ``LN(−v) = −LN(v)`` keeps sign flips when there is no bias."""
    label = _first(inputs)
    if not _layer_call(state, data, inputs):
        return unknown_rule(state, node, data, inputs)
    k = len(_normalized_shape(data))
    weight, bias = data["params"].get("weight"), data["params"].get("bias")
    if weight is None:
        _zero_sum_readers(state, node, data, bias)
    if _across_sites(state, node, label, tuple(range(-k, 0)), {"S", "T"} | ({"SF"} if bias is None else set()),
                     "layer norm"):
        return label.map_segments(invariant=frozenset({"T"}))
    state.restrict_label(label, {"O1", "S", "T1"}, node, f"{state.where(node)}: layer norm")
    _whole_vector_shifts(state, node, label, "the layer norm", k)
    normalised = label.map_segments(invariant=frozenset({"T1"}), power=Fraction(1))
    if weight is None:   # a bias alone (F.layer_norm(x, s, None, b)) is added to the value: it moves with the site
        if bias is not None:
            state.bind_reader(normalised, bias, 0, node, role="out")
        return normalised
    dim = label.dim if label.segments else -1
    return _diagonal_map(state, node, Label(dim, label.size, normalised.segments), weight, bias, dim, k + dim)


def _normalized_shape(data: NodeData) -> tuple[int, ...]:
    """A layer or RMS norm's ``normalized_shape`` as a tuple (a module's setting, or ``F.layer_norm(x, 4)``'s int)."""
    shape = data["settings"]["normalized_shape"]
    return tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)


def _zero_sum_readers(state: Inference, node: str, data: NodeData, bias: str | None) -> None:
    """A gain-free layer norm's output ``n`` sums to zero over the normalised axis, ``1ᵀn = 0``, so a linear map
    reading all of it may add ``c 1ᵀ`` to its weight: ``(W + c 1ᵀ) n = W n`` for every ``c`` (one entry per output
    row; gradient flow conserves the row sums ``W 1``). Every node reading ``n`` gets a site for that shift (kind
    ``T1``, pattern ``"rows"`` on the weight's columns), which :func:`_shift_reader_rows` fills for a linear map; any
    other reader (an activation, a dropout, a sum, a concatenation, a slice, a reshape) gets a note naming it. A norm
    over several axes (a map reads the last, whose slices need not sum to zero) or with a bias (``1ᵀ(n + β) = 1ᵀβ``:
    the reader's bias would have to give back ``c·1ᵀβ``, a shear conserving nothing) keeps none.

    >>> import symalg, torch
    >>> model = torch.nn.Sequential(torch.nn.LayerNorm(4, elementwise_affine=False), torch.nn.Linear(4, 3))
    >>> [s.group.name for s in symalg.derive(symalg.trace(model, (torch.randn(5, 4),))).symmetries]
    ['Translations(3, along 1)']
    """
    k, shape = len(_normalized_shape(data)), state.shape(data["inputs"][0])
    if not shape:
        return
    why = f"it normalises over {k} axes, and a map reads one of them, whose slices need not sum to zero" \
        if k > 1 else "its bias makes its output sum to 1ᵀβ, not 0" if bias is not None else ""
    for reader in state.graph.successors(node):
        site = state.new_site(node, shape[-1], name=f"{reader}.columns", allowed={"T1"})
        state.zero_sums[(node, reader)] = site
        if why:
            state.restrict(site, set(), node, f"{state.where(node)} has no gain, but {why}")
        elif state.graph.nodes[reader]["op"] != "linear":
            state.restrict(site, set(), reader, f"{state.where(reader)} reads the output of the gain-free layer norm "
                                                f"{node!r} and is no linear map: no shift of a reader's rows along 1")


@register_rule("rms_norm", capabilities={"weights"},
               spellings={"rms_norm": OpSpellings(modules=(nn.RMSNorm,), functions=(F.rms_norm,), aten=("rms_norm",),
                                                  arguments=("normalized_shape", "eps"))},
               examples={
    "rms_norm": around(lambda self, h: torch.relu(self.norm(h)), norm=lambda: torch.nn.RMSNorm(4))})
def rms_norm_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """RMS norm ``x/‖x‖·√d`` over the last ``k`` axes: a site along one of them gets all of ``O(d)``; a gain is
    a diagonal map after it. A site along another axis keeps permutations and sign flips (the norm is odd)."""
    label = _first(inputs)
    if not _layer_call(state, data, inputs):
        return unknown_rule(state, node, data, inputs)
    k = len(_normalized_shape(data))
    if _across_sites(state, node, label, tuple(range(-k, 0)), {"S", "SF"}, "RMS norm"):
        return label
    state.restrict_label(label, {"O", "O1", "SF", "S"}, node, f"{state.where(node)}: RMS norm")
    normalised = label.map_segments(power=Fraction(1))
    if "weight" not in data["params"]:
        return normalised
    dim = label.dim if label.segments else -1
    return _diagonal_map(state, node, Label(dim, label.size, normalised.segments), data["params"]["weight"], None,
                         dim, k + dim)


@register_rule("group_norm", capabilities={"weights"},
               spellings={"group_norm": OpSpellings(modules=(nn.GroupNorm,), functions=(F.group_norm,),
                                                    aten=("group_norm",),
                                                    arguments=("num_groups", "eps"))},
               examples={
    "group_norm": around(lambda self, h: torch.relu(self.norm(h)), norm=lambda: torch.nn.GroupNorm(2, 4))})
def group_norm_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Group norm: ``G`` groups of ``n = C/G`` channels (axis 1), each normalised over its channels and positions.

    Per group it is invariant under a shift of the group's biases along ``1`` (``T``, one direction per
    group) and equivariant under orthogonal maps of the group's channels fixing ``1`` (``O1``: they keep
    the group's mean and variance); whole groups permute (``S(G)``). ``eps > 0`` breaks the per-group
    scalings, as for batch norm. With an affine part (a diagonal map) the orthogonal maps shrink to
    within-group permutations, which the single site of the affine output cannot express: only the
    translations and the diagonal map's own scalings and sign flips are claimed then. Splitting the
    input into group sites needs a site produced by the map just before the norm and read by it alone.
    Sites along a position axis keep permutations only.
    """
    label = _first(inputs)
    settings, params = data["settings"], data["params"]
    shape = state.shape(data["inputs"][0])
    channel = _channel_axis(state, data)
    if channel is None or shape is None or not _layer_call(state, data, inputs):
        return unknown_rule(state, node, data, inputs)
    if _across_sites(state, node, label, (channel,), {"S"}, "group norm"):
        return label
    groups, channels = settings["num_groups"], shape[1]
    n = channels // groups
    where = f"{state.where(node)}: group norm over {groups} groups of {n} channels"
    aligned = all(seg.offset % n == 0 and seg.width % n == 0 and seg.block == 1 for seg in label.segments)
    if not aligned:
        state.restrict_label(label, set(), node, f"{where}: the input's sites straddle the groups", blocked=True)
        return Label.data(label.dim, channels)
    for seg in label.segments:
        _group_translations(state.site(seg.site), n)
    if "weight" not in params and _splittable(state, node, data, label, channels):
        return Label(label.dim, channels, _split_into_groups(state, node, label.segments[0].site, groups, n, where))
    state.restrict_label(label, {"T"}, node, f"{where}" + (" with an affine part (within-group permutations are not "
                                                           "modelled)" if "weight" in params else ""))
    normalised = Label(channel, channels, label.map_segments(power=Fraction(0), invariant=frozenset({"T"})).segments)
    if "weight" not in params:
        return normalised
    return _diagonal_map(state, node, normalised, params["weight"], params.get("bias"), channel)


def _group_translations(site: _Site, n: int) -> None:
    """Keep the site's bias translations that are constant on every group of ``n`` channels: per-entry
    shifts become one shift along ``1`` per group."""
    kept = []
    for kind, producer, family in site.translations:
        first = family.regions[0]
        if kind != "T" or family.pattern == "ones" and first.start % n == 0 and first.width % n == 0:
            kept.append((kind, producer, family))
        elif family.pattern == "entries":
            kept += [(kind, producer, TranslationFamily("ones", tuple(r.restrict(j * n, n) for r in family.regions)))
                     for j in range(first.width // n)]
    site.translations[:] = kept


def _split_into_groups(state: Inference, node: str, site_id: int, groups: int, n: int,
                       where: str) -> tuple[Segment, ...]:
    """Replace the input site by one site per group (``O1``, ``S``, that group's translation) and a
    site permuting whole groups; returns the output's segments."""
    original = state.site(site_id)
    original.dissolved = True
    segments = []
    for g in range(groups):
        sub = state.new_site(original.node, n, [b.restrict(g * n, n) for b in original.bindings],
                             name=f"{original.name}.group{g}", allowed=original.allowed)
        state.site(sub).translations.extend(t for t in original.translations
                                            if t[0] == "T" and t[2].regions[0].start == g * n)
        state.restrict(sub, {"O1", "S", "T"}, node, where)
        segments.append(Segment(sub, g * n, n, 1, Fraction(0), frozenset({"T"})))
    whole = state.new_site(node, groups, [b.coarsen(n) for b in original.bindings], name=f"{original.name}.groups",
                           allowed={"S"} & original.allowed)  # e.g. a depthwise conv of data cannot permute
    return tuple(segments) + (Segment(whole, 0, groups, n),)
