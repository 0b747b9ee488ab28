"""Shared pieces of the op rules: the types a rule works with, argument readers, weight expressions, and the
activation and unknown-op rules (which the engine picks without a registration).

>>> WeightExpr((("w", 0),), (("w", 1),), ("w",)).transposed().rows
(('w', 1),)
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeAlias, TypeGuard

import sympy as sp

from symalg.symbolic.checks import disproof, symbolic_checks
from symalg.symbolic.inference import ALL, Inference, Label, Segment


NodeData: TypeAlias = Mapping[str, Any]
"""A node's attributes in the model graph (:mod:`symalg.ir.graph`): ``op``, ``kind``, ``inputs``, ``settings``..."""


Value: TypeAlias = "Label | WeightExpr | tuple[Any, ...] | None"
"""What inference carries along an edge: a :class:`~symalg.symbolic.inference.Label`, a :class:`WeightExpr`, a
parameter read ``("param", name)``, a tuple of values (``pack``, multi-output ops), or ``None`` (a number)."""


Inputs: TypeAlias = Sequence[Any]
"""A node's input values (each a :data:`Value`; rules tell them apart with ``isinstance``)."""


Rule: TypeAlias = Callable[[Inference, str, NodeData, Inputs], Value]
"""``rule(state, node, data, inputs)``: the value of the node's output."""


def _argument(data: NodeData, position: int, name: str, default: Any = None) -> Any:
    arguments = data.get("arguments", {})
    if name in arguments:
        return arguments[name]
    return arguments.get(f"arg{position}", default)


def _dim(data: NodeData, position: int, default: int | None = -1) -> Any:
    dim = _argument(data, position, "dim", default)
    return data["settings"].get("dim", dim) if data["kind"] == "module" else dim


def _normalise(dim: int, ndim: int | None) -> int:
    """A dimension as a negative index (needs ``ndim`` for non-negative ones)."""
    if dim < 0:
        return dim
    if ndim is None:
        raise ValueError("needs shapes")
    return dim - ndim


def _first(inputs: Inputs) -> Label:
    return inputs[0] if inputs and inputs[0] is not None else Label.data()


def _layer_call(state: Inference, data: NodeData, inputs: Inputs, data_position: int = 0) -> bool:
    """True when a layer (norm, convolution, embedding) reads its weights as the parameters and buffers recorded by
    role in ``params``/``buffers``: a module call, or a function call (``F.layer_norm(x, s, w, b)``,
    ``aten.conv1d``) whose every operand but the data (at ``data_position``) is one of them. A weight computed in
    ``forward`` or a second value fails: the caller treats the op as unknown."""
    if data["kind"] == "module":
        return True
    if data["op"] in ("layer_norm", "rms_norm") and not _integers(data["settings"].get("normalized_shape")):
        return False   # absent, or computed in ``forward`` (``x.shape[-2:]`` under fx: a node, not numbers)
    recorded = set(data["params"].values()) | set(data["buffers"].values())
    for position, (source, label) in enumerate(zip(data["inputs"], inputs)):
        if position == data_position or source is None and label is None:
            continue
        node = state.graph.nodes[source] if source is not None else {}
        names = set(node.get("params", {}).values()) | set(node.get("buffers", {}).values())
        if node.get("kind") not in ("param", "constant") or not names or not names <= recorded:
            return False
    return True


def _integers(value: object) -> bool:
    """``value`` is an ``int`` or a list or tuple of them (a recorded ``normalized_shape``)."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    return all(isinstance(v, int) and not isinstance(v, bool) for v in items)


def _fraction(value: object) -> Fraction:
    """An exact number (an ``int`` or a SymPy rational: a group's ``alpha`` or ``c``) as a ``Fraction``, without
    printing it (SymPy's printer costs a millisecond, once per activation of a deep model).

    >>> import sympy as sp
    >>> _fraction(sp.Rational(3, 2)), _fraction(2)
    (Fraction(3, 2), Fraction(2, 1))
    """
    number = sp.sympify(value)
    if not number.is_Rational:
        raise ValueError(f"{value!r} is not an exact rational number")
    return Fraction(int(number.p), int(number.q))


def activation_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """A catalogue activation on the feature axis: ``σ(g z) = π(g) σ(z) + τ(g)`` for the entry's groups
    (``τ ≠ 0`` for affine sign flips, ``σ(−z) = 1 − σ(z)``: the output's segments carry the center). The
    symbolic checks of every group it claims are recorded on the sites along its input (``Symmetry.checks``)."""
    label = _first(inputs)
    entry = state.catalogue[data["op"]]
    params = entry.resolve({k: v for k, v in data["settings"].items() if k in entry.defaults})
    groups = entry.site_groups(label.size or 2, **params)     # the width only names the groups in notes
    kinds, alpha, center, disproved, claimed = set(), Fraction(1), Fraction(0), {}, []
    unmoved: set = set()   # kinds under which the output does not move (an even activation's input flips)
    for group in groups:
        checks = symbolic_checks(entry, group, tuple(sorted(params.items())))
        reason = disproof(data["op"], group, checks)
        if state.strict and reason:
            disproved[reason] = group.kinds_it_preserves
            continue
        kinds |= group.kinds_it_preserves
        claimed.append((frozenset(group.kinds_it_preserves), checks))
        if group.homogeneity is not None:
            alpha = _fraction(group.homogeneity)
        if group.affine:
            center = _fraction(group.center)
        if group.output_invariant:
            unmoved |= group.kinds_it_preserves
    if entry.radial and label.dim != -1 and label.segments:
        state.restrict_label(label, set(), node, f"{state.where(node)}: radial activation on a non-last axis",
                             blocked=True)
        return Label.data(label.dim, label.size)
    for reason, refuted in disproved.items():   # the same checks and wording as the chain pipeline's derive
        state.restrict_label(label, ALL - (refuted - kinds), node, f"{state.where(node)}: {reason}", blocked=True)
    state.restrict_label(label, kinds, node, f"{state.where(node)} ({data['op']}) is equivariant only under "
                                             f"{', '.join(sorted(kinds)) or 'nothing'}")
    for segment in label.segments:   # the checks behind every claim this activation allows on the site
        state.site(segment.site).checks.append((node, data["op"], tuple(claimed)))
    return Label(label.dim, label.size, tuple(Segment(s.site, s.offset, s.width, s.block, s.power * alpha,
                                                      s.invariant | unmoved, center) for s in label.segments))


def unknown_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """An op nobody declared: every site it reads keeps only the kinds its input is invariant under, and
    every parameter it reads becomes opaque (no action may move it)."""
    for label in inputs:
        _freeze(state, node, label, f"{state.where(node)}: op {data['op']!r} is not in the equivariance catalogue")
    return Label.data()


def _freeze(state: Inference, node: str, label: object, reason: str) -> None:
    """Nothing ``label`` stands for may move: its sites keep only the kinds acting trivially on it (``reason`` in the
    blocked note), a parameter (or a weight computed from parameters) becomes opaque; nested tuples alike."""
    if _is_param(label) or isinstance(label, WeightExpr):
        for tensor in (label.tensors if isinstance(label, WeightExpr) else (label[1],)):
            state.opaque.setdefault(tensor, node)
    elif isinstance(label, Label):
        state.restrict_label(label, set(), node, reason, blocked=True)
    elif isinstance(label, tuple):
        for item in label:
            _freeze(state, node, item, reason)


def _flat_outputs(items: Iterable[Any]) -> list[Any]:
    """Labels and parameters in nested output tuples (multi-output ops, ``pack``), depth first."""
    flat: list[Any] = []
    for item in items:
        if isinstance(item, tuple) and not _is_param(item):
            flat += _flat_outputs(item)
        else:
            flat.append(item)
    return flat


def _is_param(label: object) -> TypeGuard[tuple[str, str]]:
    return isinstance(label, tuple) and len(label) == 2 and label[0] == "param"


@dataclass(frozen=True)
class WeightExpr:
    """A weight computed from parameters in ``forward`` (``W + s·B @ A``): the ``(tensor, axis)`` pairs
    indexing its rows and its columns, and the whole parameters among its summands. A *piece* of a parameter
    (``W.split(sizes)[i]``, ``b.chunk(3)[i]``, as ``nn.MultiheadAttention`` cuts its in-projection) is its rows
    ``[start, start + width)`` (no columns for a vector); only a linear map reads one (:func:`_weight`)."""

    rows: tuple[tuple[str, int], ...]
    cols: tuple[tuple[str, int], ...]
    plain: tuple[str, ...] = ()
    start: int = 0
    width: int | None = None
    row_kinds: frozenset[str] = ALL
    """The kinds that may move its rows (a weight-normalised ``g v/‖v‖``: scalings and permutations) ..."""
    col_kinds: frozenset[str] = ALL
    """... and its columns (orthogonal maps, permutations and sign flips keep every row's norm)."""
    why: str = ""
    """Why they are restricted (the blocked note's reason)."""

    def transposed(self) -> "WeightExpr":
        return WeightExpr(self.cols, self.rows, self.plain, row_kinds=self.col_kinds, col_kinds=self.row_kinds,
                          why=self.why)

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for t, _ in self.rows + self.cols))


def _weight(state: Inference, label: Value, pieces: bool = False) -> WeightExpr | None:
    """``label`` as a matrix-valued weight expression, or ``None`` (a value, a tensor of another rank, a piece of a
    parameter unless ``pieces``)."""
    if isinstance(label, WeightExpr):
        return label if label.cols and (pieces or label.width is None) else None
    if _is_param(label) and len(state.shapes[label[1]]) == 2:
        return WeightExpr(((label[1], 0),), ((label[1], 1),), (label[1],))
    return None


def _weights(state: Inference, inputs: Inputs) -> list[WeightExpr] | None:
    """Every input as a weight expression (:func:`_weight`), or ``None`` when one is not a weight."""
    weights = [_weight(state, i) for i in inputs]
    return None if None in weights else [w for w in weights if w is not None]


def _drop_axes(state: Inference, node: str, label: Label, dims: list[int], shape: tuple[int, ...] | None) -> Label:
    """The label after picking one entry along each of ``dims`` (axes of a value of ``shape``)."""
    if not label.segments:
        return Label.data()
    if shape is None or not all(isinstance(d, int) for d in dims):
        state.restrict_label(label, set(), node, f"{state.where(node)}: selection without shapes", blocked=True)
        return Label.data()
    removed = {d % len(shape) for d in dims}
    position = len(shape) + label.dim
    if position in removed:
        state.restrict_label(label, set(), node, f"{state.where(node)} picks one coordinate of the axis "
                                                 f"{label.dim} the sites run along", blocked=True)
        return Label.data()
    return Label(-1 - sum(p not in removed for p in range(position + 1, len(shape))), label.size, label.segments)


def _whole_vector_shifts(state: Inference, node: str, label: Label, what: str, axes: int = 1) -> None:
    """Keep translations along ``1`` of ``label``'s sites only where they add one number to the whole vector
    that ``what`` (a layer norm over ``axes`` axes, a softmax) ignores shifts of: one site must span the axis (not
    one slice of a concatenation, whose shift changes the mean), and a shift of a weight's rows (``+ t·x_j``,
    varying with position) needs the op to run along the site's axis alone (``axes = 1``, no blocks)."""
    segments = label.segments
    if not segments:
        return
    if len(segments) > 1 or segments[0].offset != 0 or segments[0].width * segments[0].block != label.size:
        state.restrict_label(label, ALL - {"T1"}, node, f"{state.where(node)}: the axis {what} runs along holds "
                                                        "several sites or data, and a shift along 1 of one of them "
                                                        "is no shift of the whole vector", blocked=True)
    elif axes > 1 or segments[0].block != 1:
        state.site(segments[0].site).row_shifts = False


_PASSING = ("reshape", "flatten", "identity")
"""Ops that pass a value on whole, or block it (:func:`reshape_rule`): between a map and what reads its fresh site."""


def _splittable(state: Inference, node: str, data: NodeData, label: Label, channels: int) -> bool:
    """True when the input is one fresh site: made by the map just before ``node`` (or before reshapes keeping the
    site's axis, GPT-2's ``addmm(...).view(B, T, 3d)``), read only by it."""
    if len(label.segments) != 1 or label.segments[0].width != channels:
        return False
    site = state.site(label.segments[0].site)
    alone = all(state.ties[other.id] != state.ties[site.id] and
                state.permutation_ties[other.id] != state.permutation_ties[site.id]
                for other in state.sites if other.id != site.id)
    reader, value = node, data["inputs"][0]
    while value != site.node and state.graph.nodes[value]["op"] in _PASSING and state.users(value) == [reader]:
        reader, value = value, state.graph.nodes[value]["inputs"][0]
    return alone and value == site.node and state.users(site.node) == [reader] and \
        all(b.role == "out" for b in site.bindings)


def dropout_active(data: Mapping[str, Any]) -> bool:
    """A ``dropout`` node (module, ``F.dropout``, ``aten.dropout``) that zeroes entries: ``p > 0`` in training mode
    (the module's settings, else the call's arguments; ``F.dropout`` trains by default); any other node is none."""
    if data.get("op") != "dropout":
        return False
    arguments, settings = data.get("arguments", {}), data.get("settings", {})
    p = settings.get("p", arguments.get("p", arguments.get("arg1", 0.5)))
    training = settings.get("training", arguments.get("training", arguments.get("arg2", True)))
    return bool(p) and bool(training)
