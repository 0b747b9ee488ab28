"""Op rules: the equivariance catalogue of layers and structural ops, one function per canonical op.

A rule receives the :class:`~symalg.model_inference.Inference` state, the node, its data and the
labels of its inputs, and returns the label of its output. It may create sites (where a
parameterised map writes a feature axis), bind tensors, tie sites and restrict them. Rules are
registered by decorator into the read-only :data:`OP_RULES`; activations are served by the
catalogue (:mod:`symalg.catalogue`), and an op nobody declared is handled by :func:`unknown_rule`,
which keeps only the kinds under which its inputs are invariant.

>>> sorted(OP_RULES)[:4]
['abs', 'add', 'attention', 'avg_pool']
"""
from __future__ import annotations

from fractions import Fraction
from types import MappingProxyType
from typing import Callable

from .bindings import Binding
from .groups import GeneralLinear, Orthogonal, Permutations, PositiveScaling, SignFlips
from .model_inference import ALL, TRANSLATIONS, Inference, Label, Segment

__all__ = ["OP_RULES", "register_rule", "activation_rule", "unknown_rule"]

_RULES: dict[str, Callable] = {}
OP_RULES = MappingProxyType(_RULES)
"""Read-only ``{canonical op: rule}``."""

DIAGONAL = frozenset({"PS", "SF", "S"})


def register_rule(*ops: str):
    def decorate(rule):
        for op in ops:
            _RULES[op] = rule
        return rule
    return decorate


def _argument(data, position: int, name: str, default=None):
    arguments = data.get("arguments", {})
    if name in arguments:
        return arguments[name]
    return arguments.get(f"arg{position}", default)


def _dim(data, position: int, default=-1):
    dim = _argument(data, position, "dim", default)
    return data["settings"].get("dim", dim) if data["kind"] == "module" else dim


def _normalise(dim: int, ndim: int | None) -> int:
    """A dimension as a negative index (needs ``ndim`` for non-negative ones)."""
    if dim < 0:
        return dim
    if ndim is None:
        raise ValueError("needs shapes")
    return dim - ndim


def _first(inputs) -> Label:
    return inputs[0] if inputs and inputs[0] is not None else Label.data()


# -- activations and unknown ops ---------------------------------------------------------------

_KINDS_OF_GROUP = {GeneralLinear: ALL - TRANSLATIONS, Orthogonal: {"O", "SF", "S"}, PositiveScaling: {"PS"},
                   SignFlips: {"SF"}, Permutations: {"S"}}


def activation_rule(state: Inference, node, data, inputs) -> Label:
    """A catalogue activation on the feature axis: ``σ(g z) = π(g) σ(z)`` for the entry's groups."""
    label = _first(inputs)
    entry = state.catalogue[data["op"]]
    params = entry.resolve({k: v for k, v in data["settings"].items() if k in entry.defaults})
    groups = entry.site_groups(2, **params)
    kinds, alpha = set(), Fraction(1)
    for group in groups:
        if isinstance(group, SignFlips) and group.center != 0:
            continue  # an affine sign flip needs a bias to absorb its shift: not modelled on traced graphs
        kinds |= _KINDS_OF_GROUP[type(group)]
        if isinstance(group, PositiveScaling):
            alpha = Fraction(str(group.alpha))
    if entry.radial and label.dim != -1 and label.segments:
        state.restrict_label(label, set(), node, f"{state.where(node)}: radial activation on a non-last axis", blocked=True)
        return Label.data(label.dim, label.size)
    state.restrict_label(label, kinds, node, f"{state.where(node)} ({data['op']}) is equivariant only under "
                                             f"{', '.join(sorted(kinds)) or 'nothing'}")
    return Label(label.dim, label.size, tuple(Segment(s.site, s.offset, s.width, s.block, s.power * alpha,
                                                      s.invariant) for s in label.segments))


def unknown_rule(state: Inference, node, data, inputs) -> Label:
    """An op nobody declared: every site it reads keeps only the kinds its input is invariant under."""
    for label in inputs:
        if isinstance(label, Label):
            state.restrict_label(label, set(), node, f"{state.where(node)}: op {data['op']!r} is not in the "
                                                     "equivariance catalogue", blocked=True)
        elif isinstance(label, tuple):
            for item in label:
                state.restrict_label(item, set(), node, f"{state.where(node)}: op {data['op']!r} is unknown", blocked=True)
    return Label.data()


@register_rule("input", "constant", "buffer")
def data_rule(state, node, data, inputs) -> Label:
    return Label.data()


@register_rule("param")
def param_rule(state, node, data, inputs):
    """A parameter read in ``forward``: its own label, resolved by the op that uses it."""
    return ("param", data["params"]["value"])


@register_rule("output")
def output_rule(state: Inference, node, data, inputs) -> None:
    """Model outputs must not change (``mse``); logits may shift along ``1`` (``cross_entropy``)."""
    kinds = {"T1"} if state.loss == "cross_entropy" else set()
    for label in inputs:
        for item in (label if isinstance(label, tuple) and not _is_param(label) else (label,)):
            if isinstance(item, Label):
                state.restrict_label(item, kinds, node, "the model output is fixed by the loss")
    return None


def _is_param(label) -> bool:
    return isinstance(label, tuple) and len(label) == 2 and label[0] == "param"


# -- parameterised maps ------------------------------------------------------------------------

def _producer_site(state, node, width, weight, bias, axis=0, name=None) -> int:
    bindings = [Binding(weight, axis, 0, width, node=node)]
    if bias:
        bindings.append(Binding(bias, 0, 0, width, node=node))
    site = state.new_site(node, width, bindings, name=name)
    state.site(site).translations.append(("T1", node, weight, bias))
    if bias:
        state.site(site).translations.append(("T", node, weight, bias))
    return site


def _read_as_map(state, node, label: Label, weight: str, feature_dim: int) -> None:
    """A map reads ``label`` on its input axis: bind columns; translations of the input cannot pass."""
    if label.segments and label.dim != feature_dim:
        state.restrict_label(label, set(), node, f"{state.where(node)} reads axis {feature_dim} of a value whose "
                                                 f"sites run along axis {label.dim}", blocked=True)
        return
    state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)} does not absorb translations")
    state.bind_reader(label, weight, 1, node)


@register_rule("linear")
def linear_rule(state: Inference, node, data, inputs) -> Label:
    """``y = W x + b``: a new site on the rows of ``W`` and ``b``; the input's sites on its columns."""
    label = _first(inputs)
    if data["kind"] == "module":
        weight, bias = data["params"]["weight"], data["params"].get("bias")
    else:
        params = [i for i in inputs[1:] if _is_param(i)]
        if not params or not _is_param(inputs[1] if len(inputs) > 1 else None):
            return unknown_rule(state, node, data, inputs)
        weight = inputs[1][1]
        bias = inputs[2][1] if len(inputs) > 2 and _is_param(inputs[2]) else None
        if len(inputs) > 2 and inputs[2] is not None and not _is_param(inputs[2]):
            return unknown_rule(state, node, data, inputs)
    out_features, _ = state.shapes[weight]
    _read_as_map(state, node, label, weight, -1)
    site = _producer_site(state, node, out_features, weight, bias)
    return Label(-1, out_features, (Segment(site, 0, out_features),))


@register_rule("conv")
def conv_rule(state: Inference, node, data, inputs) -> Label:
    """Convolution: output channels are a site (kernel axis 0, bias); input channels its columns.

    ``groups = 1`` reads every input channel; a depthwise conv (``groups = in = out``) is a diagonal
    map: per-channel scalings and sign flips pass into its kernel, a permutation moves both sides.
    """
    label = _first(inputs)
    weight, bias = data["params"]["weight"], data["params"].get("bias")
    settings = data["settings"]
    out_channels, in_per_group = state.shapes[weight][:2]
    channel_dim = -(len(state.shapes[weight]) - 1)
    if settings.get("padding_mode", "zeros") != "zeros":
        state.restrict_label(label, set(), node, f"{state.where(node)}: padding mode {settings['padding_mode']!r}", blocked=True)
    if settings["groups"] == 1:
        _read_as_map(state, node, label, weight, channel_dim)
        site = _producer_site(state, node, out_channels, weight, bias)
        return Label(channel_dim, out_channels, (Segment(site, 0, out_channels),))
    if settings["groups"] == settings["in_channels"] == out_channels and in_per_group == 1:
        return _diagonal_map(state, node, label, weight, bias, channel_dim)
    state.restrict_label(label, set(), node, f"{state.where(node)}: grouped convolution with groups="
                                             f"{settings['groups']} is not modelled", blocked=True)
    return Label.data(channel_dim, out_channels)


def _diagonal_map(state, node, label: Label, scale: str | None, shift: str | None, dim: int) -> Label:
    """``y = s ⊙ x + t`` per feature: each input site's scalings/sign flips are absorbed by ``s``; the
    output gets a new site acting on ``s, t`` (positive scaling, sign flips), tied to the input's
    permutations. A data input (no sites) still gives the output its site."""
    state.restrict_label(label, DIAGONAL, node, f"{state.where(node)} is a per-feature (diagonal) map")
    pieces = label.segments or (Segment(-1, 0, state.shapes[scale or shift][0]),)
    segments = []
    for seg in pieces:
        bindings = [Binding(t, 0, seg.offset, seg.width, seg.block, diagonal=True, node=node)
                    for t in (scale, shift) if t]
        if scale and seg.site >= 0:
            state.bind(seg.site, Binding(scale, 0, seg.offset, seg.width, seg.block, "in", seg.power,
                                         diagonal=True, node=node))
        site = state.new_site(node, seg.width, bindings, allowed=DIAGONAL if seg.site >= 0 else {"PS", "SF"})
        if seg.site >= 0:
            state.tie_permutations(seg.site, site)
        segments.append(Segment(site, seg.offset, seg.width, seg.block))
    return Label(dim, label.size, tuple(segments))


@register_rule("embedding")
def embedding_rule(state: Inference, node, data, inputs) -> Label:
    """``x = E[i]``: a site on the columns of the table ``E`` (``E ↦ E gᵀ``)."""
    weight = data["params"].get("weight") if data["kind"] == "module" else (
        inputs[1][1] if len(inputs) > 1 and _is_param(inputs[1]) else None)
    if weight is None:
        return unknown_rule(state, node, data, inputs)
    width = state.shapes[weight][1]
    site = state.new_site(node, width, [Binding(weight, 1, 0, width, node=node)])
    return Label(-1, width, (Segment(site, 0, width),))


# -- structural ops ----------------------------------------------------------------------------

def _same_layout(a: Label, b: Label) -> bool:
    key = lambda label: [(s.offset, s.width, s.block) for s in label.segments]  # noqa: E731
    return a.dim == b.dim and key(a) == key(b)


@register_rule("add", "sub")
def add_rule(state: Inference, node, data, inputs) -> Label:
    """``a ± b``: both summands' sites are tied (a skip connection); a fixed summand pins the other."""
    labels = [i for i in inputs if isinstance(i, Label)]
    constants = [i for i in inputs if i is None]
    params = [i for i in inputs if _is_param(i)]
    if len(labels) == 1 and not params:
        (label,) = labels
        state.restrict_label(label, {"S"} if constants else set(), node,
                             f"{state.where(node)} adds a constant to the value")
        return label.map_segments(invariant=frozenset())
    if len(labels) == 1 and len(params) == 1:
        (label,), (param,) = labels, params
        shape = state.shapes[param[1]]
        for seg in label.segments:
            state.bind(seg.site, Binding(param[1], len(shape) - 1, seg.offset, seg.width, seg.block, "out",
                                         seg.power, node=node))
        state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)} adds a parameter")
        return label
    if len(labels) == 2 and not (labels[0].segments and labels[1].segments):
        a, b = labels
        state.restrict_label(a if a.segments else b, set(), node,
                             f"{state.where(node)} adds a value nothing acts on (model input or unknown op)")
        return a if a.segments else b
    if len(labels) != 2 or not _same_layout(*labels):
        for label in labels:
            state.restrict_label(label, set(), node, f"{state.where(node)}: summands with different site layouts", blocked=True)
        return Label.data(labels[0].dim if labels else -1)
    a, b = labels
    segments = []
    for x, y in zip(a.segments, b.segments):
        state.tie(x.site, y.site)
        if x.power != y.power:
            state.restrict(x.site, ALL - {"PS"}, node, f"{state.where(node)} adds values of different scaling "
                                                       f"powers {x.power} and {y.power}")
        state.restrict(x.site, ALL - TRANSLATIONS, node, f"{state.where(node)}: a sum does not absorb translations")
        segments.append(Segment(x.site, x.offset, x.width, x.block, x.power, x.invariant & y.invariant))
    return Label(a.dim, a.size, tuple(segments))


@register_rule("mul", "div")
def scale_rule(state: Inference, node, data, inputs) -> Label:
    """Multiplication by a number commutes with every linear action; by a tensor it is unknown."""
    labels = [i for i in inputs if isinstance(i, Label)]
    numbers = all(i is None for i in inputs if not isinstance(i, Label))
    if len(labels) == 1 and numbers and not _tensor_constant(state, node):
        return labels[0]
    return unknown_rule(state, node, data, inputs)


def _tensor_constant(state, node) -> bool:
    """True if a non-number constant (a tensor buffer or a data tensor) is an operand."""
    for source in state.graph.predecessors(node):
        if state.graph.nodes[source]["kind"] in ("constant", "input", "param") and \
                not isinstance(state.labels.get(source), Label):
            return True
        if state.graph.nodes[source]["kind"] == "constant":
            return True
    return False


@register_rule("neg", "identity")
def identity_rule(state, node, data, inputs) -> Label:
    return _first(inputs)


@register_rule("dropout")
def dropout_rule(state, node, data, inputs) -> Label:
    """Dropout is the identity in eval mode (``p = 0`` likewise); in training its random mask
    commutes only with diagonal actions."""
    label = _first(inputs)
    p = data["settings"].get("p", _argument(data, 1, "p", 0.5))
    training = data["settings"].get("training", _argument(data, 2, "training", True))
    if p and training:
        state.restrict_label(label, {"PS", "SF"}, node, f"{state.where(node)}: dropout in training mode")
    return label


@register_rule("cat")
def cat_rule(state: Inference, node, data, inputs) -> Label:
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
            size = state.shape(source)[dim] if state.shape(source) else label.size
            if size is None:
                return unknown_rule(state, node, data, inputs)
            segments += [Segment(s.site, s.offset + offset, s.width, s.block, s.power, s.invariant)
                         for s in label.segments]
            offset += size
        return Label(dim, offset, tuple(segments))
    first = labels[0]
    for other in labels[1:]:
        add_rule(state, node, data, [first, other])
    return first


@register_rule("flatten", "reshape")
def reshape_rule(state: Inference, node, data, inputs) -> Label:
    """Reshapes that keep the feature axis last, or flatten it with trailing axes (conv → dense:
    each channel becomes a block of entries). Anything else splits the axis: unknown."""
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
    trailing = 1
    for size in before[dim + 1:]:
        trailing *= size
    merged = before[dim] * trailing
    if after[-1] == merged and _prod(after[:-1]) == _prod(before[:dim]):
        segments = tuple(Segment(s.site, s.offset * trailing, s.width, s.block * trailing, s.power, s.invariant)
                         for s in label.segments)
        return Label(-1, merged, segments)
    state.restrict_label(label, set(), node, f"{state.where(node)} reshapes {before} -> {after}, splitting the "
                                             "feature axis", blocked=True)
    return Label.data()


def _prod(values) -> int:
    result = 1
    for v in values:
        result *= v
    return result


@register_rule("transpose", "permute")
def transpose_rule(state: Inference, node, data, inputs) -> Label:
    """Moving axes moves the feature axis with them."""
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
        a, b = (_normalise(_argument(data, i, n), ndim) + ndim for i, n in ((1, "dim0"), (2, "dim1")))
        order = list(range(ndim))
        order[a], order[b] = order[b], order[a]
    else:
        order = _argument(data, 1, "dims")
        order = list(order if isinstance(order, (list, tuple)) else
                     [v for k, v in sorted(data["arguments"].items()) if k != "arg0"])
        order = [o % ndim for o in order]
    return Label(order.index(position) - ndim, label.size, label.segments)


@register_rule("getitem")
def getitem_rule(state: Inference, node, data, inputs):
    """Picking an output of a multi-output op; indexing a tensor is unknown."""
    source = inputs[0]
    index = _argument(data, 1, "index")
    if isinstance(source, tuple) and not _is_param(source) and isinstance(index, int):
        return source[index]
    return unknown_rule(state, node, data, inputs)


@register_rule("exp", "pow", "log", "sin", "cos", "abs", "sqrt", "rsqrt", "square")
def elementwise_rule(state, node, data, inputs) -> Label:
    """A pointwise function the catalogue does not list: it commutes with permutations only."""
    label = _first(inputs)
    if any(isinstance(i, Label) and i.segments for i in inputs[1:]) or any(_is_param(i) for i in inputs):
        return unknown_rule(state, node, data, inputs)
    state.restrict_label(label, {"S"}, node, f"{state.where(node)} ({data['op']}) is pointwise")
    return label.map_segments(power=Fraction(1), invariant=frozenset())


@register_rule("cdist")
def cdist_rule(state: Inference, node, data, inputs) -> Label:
    """Distances ``‖x − c_i‖`` to centres ``C`` (rows): a site whose permutations move the centres."""
    label = _first(inputs)
    if len(inputs) < 2 or not _is_param(inputs[1]) or label.segments:
        return unknown_rule(state, node, data, inputs)
    centres = inputs[1][1]
    count = state.shapes[centres][0]
    site = state.new_site(node, count, [Binding(centres, 0, 0, count, node=node)], allowed={"S"})
    return Label(-1, count, (Segment(site, 0, count),))


@register_rule("max_pool")
def max_pool_rule(state, node, data, inputs) -> Label:
    """``max`` over positions commutes with positive per-channel scaling and channel permutations."""
    label = _first(inputs)
    state.restrict_label(label, {"PS", "S"}, node, f"{state.where(node)}: max pooling")
    return label


@register_rule("avg_pool")
def avg_pool_rule(state, node, data, inputs) -> Label:
    """Averaging over positions is linear per channel: every channel action passes through."""
    label = _first(inputs)
    state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)}: pooling")
    return label


@register_rule("softmax", "log_softmax")
def softmax_rule(state: Inference, node, data, inputs) -> Label:
    """Softmax over the feature axis: equivariant under permutations, invariant under shifts along 1."""
    label = _first(inputs)
    ndim = len(state.shape(node)) if state.shape(node) else None
    try:
        dim = _normalise(_dim(data, 1), ndim)
    except ValueError:
        dim = None
    if dim != label.dim:
        return unknown_rule(state, node, data, inputs)
    state.restrict_label(label, {"S", "T1"}, node, f"{state.where(node)}: softmax")
    return label.map_segments(invariant=frozenset({"T1"}), power=Fraction(1))


# -- normalisation -----------------------------------------------------------------------------

@register_rule("batch_norm")
def batch_norm_rule(state: Inference, node, data, inputs) -> Label:
    """Batch norm per channel. With batch statistics (training) it is invariant under translations of
    its input and, for ``eps = 0``, under positive scalings; in eval mode the running statistics
    transform instead (mean ``↦ d·mean + t``, var ``↦ d²·var``). Its affine part is a diagonal map."""
    label = _first(inputs)
    settings = data["settings"]
    buffers = data["buffers"]
    batch_statistics = settings["training"] or not settings.get("track_running_stats", True)
    kinds = {"S", "T"} | ({"PS"} if settings["eps"] == 0 else set())
    reason = f"{state.where(node)} normalises each channel" + (
        "" if settings["eps"] == 0 else f" (eps = {settings['eps']} breaks its scale invariance; exact for eps = 0)")
    state.restrict_label(label, kinds, node, reason, blocked=settings["eps"] != 0)
    if not batch_statistics:
        for seg in label.segments:
            state.bind(seg.site, Binding(buffers["running_mean"], 0, seg.offset, seg.width, seg.block, "out",
                                         seg.power, buffer=True, node=node))
            state.bind(seg.site, Binding(buffers["running_var"], 0, seg.offset, seg.width, seg.block, "out",
                                         2 * seg.power, buffer=True, node=node))
            state.restrict(seg.site, ALL - {"T"}, node, f"{state.where(node)}: in eval mode a bias translation "
                                                        "must move the running mean too (not modelled)", blocked=True)
    elif "running_mean" in buffers:
        for seg in label.segments:
            state.bind(seg.site, Binding(buffers["running_mean"], 0, seg.offset, seg.width, seg.block, "out",
                                         Fraction(0), buffer=True, diagonal=True, node=node))
            state.bind(seg.site, Binding(buffers["running_var"], 0, seg.offset, seg.width, seg.block, "out",
                                         Fraction(0), buffer=True, diagonal=True, node=node))
    normalised = Label(label.dim, label.size, tuple(Segment(s.site, s.offset, s.width, s.block, Fraction(0),
                                                            s.invariant | {"T"}) for s in label.segments))
    if not settings.get("affine", "weight" in data["params"]):
        return normalised
    return _diagonal_map(state, node, normalised, data["params"]["weight"], data["params"].get("bias"), label.dim)


@register_rule("layer_norm")
def layer_norm_rule(state: Inference, node, data, inputs) -> Label:
    """Layer norm over the feature axis: equivariant under permutations, invariant under shifts along
    1; its gain and bias are a diagonal map."""
    label = _first(inputs)
    if data["kind"] != "module" or len(data["settings"]["normalized_shape"]) != 1:
        return unknown_rule(state, node, data, inputs)
    state.restrict_label(label, {"S", "T1"}, node, f"{state.where(node)}: layer norm")
    normalised = label.map_segments(invariant=frozenset({"T1"}), power=Fraction(1))
    if "weight" not in data["params"]:
        return normalised
    return _diagonal_map(state, node, normalised, data["params"]["weight"], data["params"].get("bias"), label.dim)


@register_rule("rms_norm")
def rms_norm_rule(state: Inference, node, data, inputs) -> Label:
    """RMS norm ``x/‖x‖·√d``: equivariant under all of ``O(d)``; a gain is a diagonal map after it."""
    label = _first(inputs)
    if data["kind"] != "module" or len(data["settings"]["normalized_shape"]) != 1 or label.dim != -1:
        return unknown_rule(state, node, data, inputs)
    state.restrict_label(label, {"O", "SF", "S"}, node, f"{state.where(node)}: RMS norm")
    normalised = label.map_segments(power=Fraction(1))
    if "weight" not in data["params"]:
        return normalised
    return _diagonal_map(state, node, normalised, data["params"]["weight"], None, label.dim)


@register_rule("group_norm")
def group_norm_rule(state: Inference, node, data, inputs) -> Label:
    """Group norm: only its affine part (a diagonal map) is modelled; the input's symmetries stop here."""
    label = _first(inputs)
    state.restrict_label(label, set(), node, f"{state.where(node)}: group norm mixes channels within groups "
                                             "(per-group symmetries are not modelled)", blocked=True)
    out = Label.data(label.dim, label.size)
    if "weight" not in data["params"] or label.size is None and not label.segments:
        return out
    channels = state.shapes[data["params"]["weight"]][0]
    site = state.new_site(node, channels, [Binding(data["params"]["weight"], 0, 0, channels, node=node)] +
                          ([Binding(data["params"]["bias"], 0, 0, channels, node=node)]
                           if "bias" in data["params"] else []), allowed={"PS", "SF"})
    return Label(label.dim, channels, (Segment(site, 0, channels),))


# -- attention ---------------------------------------------------------------------------------

def attention_sites(state: Inference, node, heads: int, q: list[Binding], k: list[Binding], v: list[Binding]):
    """Per head ``GL(d_k)`` on the query/key maps (keys by ``g⁻ᵀ``), per head ``GL(d_v)`` on the
    value map (and the output map's columns, through the returned label), and one permutation of
    heads moving all per-head blocks together. ``q, k, v`` are the producers' out-bindings."""
    d_k = q[0].width // heads
    d_v = v[0].width // heads
    segments = []
    for h in range(heads):
        state.new_site(node, d_k, [b.restrict(h * d_k, d_k) for b in q] +
                       [b.restrict(h * d_k, d_k).flipped() for b in k], name=f"{node}.head{h}.qk",
                       allowed=ALL - TRANSLATIONS)
        site = state.new_site(node, d_v, [b.restrict(h * d_v, d_v) for b in v], name=f"{node}.head{h}.vo",
                              allowed=ALL - TRANSLATIONS)
        segments.append(Segment(site, h * d_v, d_v))
    if heads > 1:
        head_site = state.new_site(node, heads, [b.coarsen(d_k) for b in q + k] + [b.coarsen(d_v) for b in v],
                                   name=f"{node}.heads", allowed={"S"})
        segments.append(Segment(head_site, 0, heads, d_v))
    return Label(-1, d_v * heads, tuple(segments))


@register_rule("multihead_attention")
def multihead_attention_rule(state: Inference, node, data, inputs):
    """``nn.MultiheadAttention`` with a packed in-projection (``q, k, v`` rows of ``in_proj_weight``)."""
    settings, params = data["settings"], data["params"]
    if not settings.get("same_embed") or settings.get("bias_kv") or settings.get("add_zero_attn"):
        return unknown_rule(state, node, data, inputs)
    weight, bias = params["in_proj_weight"], params.get("in_proj_bias")
    d = state.shapes[weight][1]
    heads = settings["num_heads"]
    sources = data["inputs"][:3]
    if len(set(sources)) == 1:
        _read_as_map(state, node, _first(inputs), weight, -1)
    else:
        for label in inputs[:3]:
            if isinstance(label, Label):
                state.restrict_label(label, set(), node, f"{state.where(node)}: distinct query/key/value inputs "
                                                         "to a packed in-projection are not modelled", blocked=True)
    def rows(offset):
        out = [Binding(weight, 0, offset, d, node=node)]
        if bias:
            out.append(Binding(bias, 0, offset, d, node=node))
        return out

    values = attention_sites(state, node, heads, rows(0), rows(d), rows(2 * d))
    out_weight, out_bias = params["out_proj.weight"], params.get("out_proj.bias")
    state.bind_reader(values, out_weight, 1, node)
    site = _producer_site(state, node, d, out_weight, out_bias)
    return (Label(-1, d, (Segment(site, 0, d),)), Label.data())


@register_rule("attention")
def attention_rule(state: Inference, node, data, inputs) -> Label:
    """Hand-written attention folded by :mod:`symalg.attention_folding`: inputs are the outputs of the
    ``q``, ``k``, ``v`` maps (each read by nothing else); their sites are split into heads."""
    heads = data["settings"]["heads"]
    sites = []
    for label in inputs[:3]:
        if not isinstance(label, Label) or len(label.segments) != 1 or label.segments[0].power != 1:
            return unknown_rule(state, node, data, inputs)
        sites.append(state.site(label.segments[0].site))
    if len({s.id for s in sites}) != 3 or any(len(state.users(s.node)) != 1 for s in sites):
        return unknown_rule(state, node, data, inputs)
    out_bindings = []
    for site in sites:
        site.dissolved = True
        out_bindings.append([b for b in site.bindings if b.role == "out"])
        readers = [b for b in site.bindings if b.role != "out"]
        if readers:
            return unknown_rule(state, node, data, inputs)
    return attention_sites(state, node, heads, *out_bindings)
