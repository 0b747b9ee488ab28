"""Op rules: the equivariance catalogue of layers and structural ops, one function per canonical op.

A rule receives the :class:`~symalg.symbolic.inference.Inference` state, the node, its data and the
labels of its inputs, and returns the label of its output. It may create sites (where a
parameterised map writes a feature axis), bind tensors, tie sites and restrict them. Rules are
registered by decorator into the read-only :data:`OP_RULES`; activations are served by the
catalogue (:mod:`symalg.catalogue`), and an op nobody declared is handled by :func:`unknown_rule`,
which keeps only the kinds under which its inputs are invariant.

>>> sorted(OP_RULES)[:4]
['add', 'addmm', 'attention', 'avg_pool']
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeAlias, TypeGuard

import sympy as sp
import torch

from symalg.catalogue.activations import CATALOGUE
from symalg.catalogue.groups import GeneralLinear
from symalg.catalogue.bindings import Absorber, Binding, TranslationFamily
from symalg.catalogue.products import multiply
from symalg.frontend.attention_folding import dropout_active
from symalg.ir.graph import only_user
from symalg.catalogue.rule_examples import Conv1D, Example, RadialBasis, around, model_example, split_heads_attention
from symalg.symbolic.checks import disproof, symbolic_checks
from symalg.symbolic.inference import ALL, EVEN, GRANTED, TRANSLATIONS, Inference, Label, Segment, _Site, site_stem

__all__ = ["OP_RULES", "OVERLAYABLE", "RULE_EXAMPLES", "WEIGHT_RULES", "WeightExpr", "register_rule",
           "activation_rule", "unknown_rule"]

NodeData: TypeAlias = Mapping[str, Any]
"""A node's attributes in the model graph (:mod:`symalg.ir.graph`): ``op``, ``kind``, ``inputs``, ``settings``..."""
Value: TypeAlias = "Label | WeightExpr | tuple[Any, ...] | None"
"""What inference carries along an edge: a :class:`~symalg.symbolic.inference.Label`, a :class:`WeightExpr`, a
parameter read ``("param", name)``, a tuple of values (``pack``, multi-output ops), or ``None`` (a number)."""
Inputs: TypeAlias = Sequence[Any]
"""A node's input values (each a :data:`Value`; rules tell them apart with ``isinstance``)."""
Rule: TypeAlias = Callable[[Inference, str, NodeData, Inputs], Value]
"""``rule(state, node, data, inputs)``: the value of the node's output."""

_RULES: dict[str, Rule] = {}
WEIGHT_RULES = frozenset({"param", "output", "pack", "linear", "add", "sub", "mul", "div", "pow", "matmul",
                          "transpose", "permute", "embedding", "cdist", "getitem", "conv", "layer_norm", "rms_norm",
                          "group_norm", "batch_norm", "addmm", "expand", "attention", "split", "chunk", "swish_beta",
                          "weight_norm", "aten.bilinear", "aten.conv_transpose1d", "aten.conv_transpose2d"})
"""Ops whose rules read parameters (and weights computed from them) among their inputs."""
OP_RULES = MappingProxyType(_RULES)
"""Read-only ``{canonical op: rule}``."""

DIAGONAL = frozenset({"PS", "SF", "S"})

OVERLAYABLE = frozenset({"exp", "log", "sin", "cos", "sqrt", "rsqrt", "square", "neg", "identity"})
"""Ops computing a fixed function of their one input: an overlay catalogue entry of the same name
describes such an op and replaces its rule (``overlay({"sin": CatalogueEntry("sin", sp.sin, declare_odd())})``
claims sign flips at a traced ``torch.sin``); an overlay entry named like any other op rule is refused."""


_EXAMPLES: dict[str, Example] = {}
RULE_EXAMPLES = MappingProxyType(_EXAMPLES)
"""Read-only ``{canonical op: example}``: a small model using the op (:mod:`symalg.catalogue.rule_examples`),
which the rule law tests trace, derive and check claim by claim."""


def register_rule(*ops: str, examples: Mapping[str, Example]) -> Callable[[Rule], Rule]:
    """Decorator registering ``rule`` for the canonical ``ops``, each with an example model in
    ``examples`` (``{op: factory returning (model, example_inputs)}``), so that the law tests run it.

    >>> from symalg.frontend.tracing import trace
    >>> model, inputs = RULE_EXAMPLES["sin"]()
    >>> [trace(model, inputs).graph.nodes[v]["op"] for v in trace(model, inputs).graph]
    ['input', 'linear', 'sin', 'linear', 'output']
    """
    if set(examples) != set(ops):
        raise ValueError(f"register_rule{ops}: examples must be given for exactly these ops, got {sorted(examples)}")

    def decorate(rule: Rule) -> Rule:
        for op in ops:
            _RULES[op] = rule
            _EXAMPLES[op] = examples[op]
        return rule
    return decorate


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
    if data["op"] in ("layer_norm", "rms_norm") and "normalized_shape" not in data["settings"]:
        return False
    recorded = set(data["params"].values()) | set(data["buffers"].values())
    for position, (source, label) in enumerate(zip(data["inputs"], inputs)):
        if position == data_position or source is None and label is None:
            continue
        node = state.graph.nodes[source] if source is not None else {}
        names = set(node.get("params", {}).values()) | set(node.get("buffers", {}).values())
        if node.get("kind") not in ("param", "constant") or not names or not names <= recorded:
            return False
    return True


# -- activations and unknown ops ---------------------------------------------------------------

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


@register_rule("input", "constant", "buffer", examples={
    "input": around(lambda self, h: h),
    "constant": around(lambda self, h: self.inner(torch.relu(h)) * self.scale,
                       scale=lambda: torch.linspace(0.5, 2.0, 4), inner=lambda: torch.nn.Linear(4, 4)),
    "buffer": around(lambda self, h: self.inner(torch.relu(h)) + self.shift, inner=lambda: torch.nn.Linear(4, 4),
                     buffers=lambda: {"shift": torch.linspace(-1.0, 1.0, 4)})})
def data_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    return Label.data()


@register_rule("param", examples={
    "param": around(lambda self, h: torch.nn.functional.linear(torch.relu(h), self.w, self.b),
                    w=lambda: torch.nn.Parameter(torch.randn(4, 4)), b=lambda: torch.nn.Parameter(torch.randn(4)))})
def param_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """A parameter read in ``forward``: its own label, resolved by the op that uses it."""
    return ("param", data["params"]["value"])


@register_rule("output", examples={"output": around(lambda self, h: torch.relu(h))})
def output_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> None:
    """Every returned tensor (nested in tuples, lists, dicts, dataclasses) must not change (``mse``); with
    ``cross_entropy`` the first is the logits, which may shift along ``1``. A returned parameter is
    pinned (no action may move it). Where the front end named the outputs (``settings["outputs"]``, one per
    flat output: ``'past_key_values.layers.0.keys'``), the note names the one that fixed the site."""
    flat = _flat_outputs(inputs)
    names = data["settings"].get("outputs", ())
    names = names if len(names) == len(flat) else ("",) * len(flat)
    for position, (item, name) in enumerate(zip(flat, names)):
        kinds = {"T1"} if state.loss == "cross_entropy" and position == 0 else set()
        if isinstance(item, Label):
            what = f"the model output {name}" if name else "the model output"
            state.restrict_label(item, kinds, node, f"{state.where(node)}: {what} is fixed by the loss")
            if kinds:
                _whole_vector_shifts(state, node, item, "the cross-entropy")
        elif isinstance(item, WeightExpr) or _is_param(item):
            for tensor in (item.tensors if isinstance(item, WeightExpr) else (item[1],)):
                state.opaque.setdefault(tensor, node)
    return None


@register_rule("pack", examples={"pack": around(lambda self, h: torch.tanh(h), packed=True)})
def pack_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> tuple:
    """A dataclass or named tuple built in ``forward`` (``Output(logits=…, hidden=…)``): the tuple of its
    fields' labels."""
    return tuple(inputs)


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


# -- parameterised maps ------------------------------------------------------------------------

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


@register_rule("linear", examples={"linear": around(lambda self, h: self.inner(torch.relu(h)),
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
               out_features: int) -> Label:
    """``y = W x + b`` on the last axis: the input's sites on the columns of ``W`` (a parameter or a
    :class:`WeightExpr`), a new site on its rows and ``b``."""
    _read_as_map(state, node, label, weight, -1, bias)
    _absorb_shifts(state, node, label, weight, bias)
    site = _producer_site(state, node, out_features, weight, bias)
    return Label(-1, out_features, (Segment(site, 0, out_features),))


@register_rule("addmm", examples={"addmm": around(lambda self, h: self.inner(torch.relu(h)), shape=(2, 5, 3),
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


@register_rule("conv", examples={"conv": model_example(
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


@register_rule("embedding", examples={"embedding": model_example(
    lambda: torch.nn.Sequential(torch.nn.Embedding(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)),
    lambda: torch.arange(6))})
def embedding_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``x = E[i]``: a site on the columns of the table ``E`` (``E ↦ E gᵀ``). The call's table is its recorded
    ``weight``, whatever the argument order (``F.embedding(i, E)``, ``aten.embedding(E, i)``)."""
    weight = data["params"].get("weight")
    indices = [p for p, label in enumerate(inputs) if not _is_param(label)]
    renormed = data["settings"].get("max_norm") is not None  # rows rescaled in place to a norm: no GL
    if weight is None or renormed or len(indices) != 1 or not _layer_call(state, data, inputs, indices[0]):
        return unknown_rule(state, node, data, inputs)
    vocabulary, width = state.shapes[weight]
    state.pin(Binding(weight, 0, 0, vocabulary, node=node), node)
    site = state.new_site(node, width, [Binding(weight, 1, 0, width, node=node)])
    return Label(-1, width, (Segment(site, 0, width),))


# -- structural ops ----------------------------------------------------------------------------

def _same_layout(a: Label, b: Label) -> bool:
    key = lambda label: [(s.offset, s.width, s.block) for s in label.segments]  # noqa: E731
    return a.dim == b.dim and key(a) == key(b)


@register_rule("add", "sub", examples={
    "add": around(lambda self, h: h + self.inner(torch.relu(h)), inner=lambda: torch.nn.Linear(4, 4)),
    "sub": around(lambda self, h: h - self.inner(torch.relu(h)), inner=lambda: torch.nn.Linear(4, 4))})
def add_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """``a ± b``: both summands' sites are tied (a skip connection); a fixed summand pins the other. A sum
    of weights (parameters, products of parameters) is a weight whose rows and columns are both's."""
    labels = [i for i in inputs if isinstance(i, Label)]
    constants = [i for i in inputs if i is None]
    params = [i for i in inputs if _is_param(i)]
    weights = _weights(state, inputs)
    if len(inputs) == 2 and weights is not None and _same_shape(state, data):
        first, second = weights
        return WeightExpr(first.rows + second.rows, first.cols + second.cols, first.plain + second.plain,
                          row_kinds=first.row_kinds & second.row_kinds, col_kinds=first.col_kinds & second.col_kinds,
                          why="; ".join(filter(None, (first.why, second.why))))
    if len(labels) == 1 and not params:
        (label,) = labels
        state.restrict_label(label, {"S"} if constants else set(), node,
                             f"{state.where(node)} adds a constant to the value")
        return label.map_segments(invariant=frozenset())
    if len(labels) == 1 and len(params) == 1:
        (label,), (param,) = labels, params
        _add_parameter(state, node, label, param[1])
        return label
    if len(labels) == 2 and not (labels[0].segments and labels[1].segments):
        a, b = labels
        moved = a if a.segments else b
        # a translation of the moved summand translates the sum alike (readers' biases may give it back); under
        # ``a − b`` or ``torch.add(a, b, alpha=c)`` it would arrive negated or scaled, so only ``a + b`` and the
        # first operand of ``a − b`` keep it
        plain = data["arguments"].get("alpha", 1) == 1 and (data["op"] == "add" or moved is inputs[0])
        kept = {"T"} if plain else set()
        state.restrict_label(moved, kept, node,
                             f"{state.where(node)} adds a value nothing acts on (model input or unknown op)")
        return moved
    if len(labels) != 2 or not _same_layout(*labels):
        for label in labels:
            state.restrict_label(label, set(), node, f"{state.where(node)}: summands with different site layouts",
                                 blocked=True)
        return Label.data(labels[0].dim if labels else -1)
    a, b = labels
    segments = []
    for x, y in zip(a.segments, b.segments):
        state.tie(x.site, y.site)
        if x.power != y.power:
            state.restrict(x.site, ALL - {"PS"}, node, f"{state.where(node)} adds values of different scaling "
                                                       f"powers {x.power} and {y.power}")
        state.restrict(x.site, ALL - TRANSLATIONS, node, f"{state.where(node)}: a sum does not absorb translations")
        mixed = (x.invariant ^ y.invariant) & EVEN
        if mixed:
            state.restrict(x.site, ALL - mixed, node, f"{state.where(node)} adds a value an even activation's input "
                                                      "flips leave alone to one they move")
        segments.append(Segment(x.site, x.offset, x.width, x.block, x.power, x.invariant & y.invariant))
    return Label(a.dim, a.size, tuple(segments))


def _add_parameter(state: Inference, node: str, label: Label, tensor: str) -> None:
    """``x ± p``, ``p`` broadcast against ``x`` (trailing axes aligned). Where ``p`` runs along the sites' axis
    (its axis ``p.ndim + dim``, of the same length) it moves with them, ``p ↦ π(g) p``; where it is constant
    along that axis (absent or of length 1) it cannot, and only permutations pass."""
    shape = state.shapes[tensor]
    axis = len(shape) + label.dim
    if axis < 0 or shape[axis] == 1 and label.size != 1:
        state.restrict_label(label, {"S"}, node, f"{state.where(node)} adds {tensor} of shape {shape}, constant "
                                                 f"along the sites' axis {label.dim}", blocked=True)
        return
    state.bind_reader(label, tensor, axis, node, role="out")
    state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)} adds a parameter")


@register_rule("mul", "div", examples={
    "mul": around(lambda self, h: 2.5 * torch.relu(h) * self.up(h), up=lambda: torch.nn.Linear(4, 4)),
    "div": around(lambda self, h: torch.relu(h) / 2.5)})
def scale_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """Multiplication or division by a number commutes with every linear action (a number divided by a value,
    ``c / x``, does not; a translation ``t`` becomes ``c t``, which a reader's bias no longer gives back); the
    product of two values (a gated MLP's ``act(gate x) ⊙ up x``, ``x * x``) passes
    diagonal actions and a joint permutation (:func:`symalg.catalogue.products.multiply`); anything else is
    unknown."""
    scaled = [i for i in inputs if isinstance(i, (Label, WeightExpr)) or _is_param(i)]
    numbers = all(i is None for i in inputs if not (isinstance(i, (Label, WeightExpr)) or _is_param(i)))
    numerator = data["op"] == "mul" or bool(inputs) and scaled[:1] == inputs[:1]
    if len(scaled) == 1 and numbers and numerator and not _tensor_constant(state, node):
        value = scaled[0]
        return value.map_segments(translates=False) if isinstance(value, Label) else _weight(state, value) or value
    product = multiply(state, node, data, inputs)
    if product is not None:
        return product
    parameters = [i[1] for i in inputs if _is_param(i)]
    for label in (i for i in inputs if isinstance(i, Label) and parameters):
        state.restrict_label(label, set(), node, f"{state.where(node)} multiplies the value by the parameter "
                             f"{parameters[0]} elementwise, which is modelled only inside z ⊙ sigmoid(β ⊙ z) (swish "
                             "with a trainable β, both products reading z, nothing else reading β ⊙ z or the sigmoid)",
                             blocked=True)
    return unknown_rule(state, node, data, inputs)


@register_rule("swish_beta", examples={"swish_beta": around(
    lambda self, h: h * torch.sigmoid(self.beta * h), beta=lambda: torch.nn.Parameter(torch.rand(4) + 0.5))})
def swish_beta_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Swish with a trainable ``β`` (``a = z ⊙ sigmoid(β ⊙ z)``, folded by :mod:`symalg.frontend.swish_folding`).
    For every invertible diagonal ``d``, ``(d z) ⊙ sigmoid((d⁻¹β) ⊙ (d z)) = d a``: ``β`` is read against the
    sites of ``z`` (an in-binding of ``z``'s power ``p``, ``β ↦ d^{-p} β``), the sites keep positive scalings, sign
    flips and permutations (which move ``β`` with them), and ``a`` carries ``z``'s segments. Per neuron, with
    ``z = W₁x + b₁``, ``y = W₂a``: ``q_i = ‖W₁[i]‖² + b₁ᵢ² − βᵢ² − ‖W₂[:, i]‖²``. A ``β`` constant along the sites'
    axis (one ``β`` shared by the layer) cannot follow one neuron's scale: only permutations pass and ``β`` is moved
    by nothing (a blocked note names the node)."""
    label, beta = (inputs[0], inputs[1]) if len(inputs) == 2 else (None, None)
    shapes = [state.shape(source) for source in data["inputs"][:1]] + [state.shape(node)]
    if not isinstance(label, Label) or not _is_param(beta) or None in shapes or shapes[0] != shapes[1]:
        return unknown_rule(state, node, data, inputs)
    tensor, where = beta[1], state.where(node)
    shape = state.shapes[tensor]
    axis = len(shape) + label.dim
    if axis < 0 or shape[axis] == 1 and label.size != 1:
        state.opaque.setdefault(tensor, node)
        state.restrict_label(label, {"S"}, node, f"{where} reads one β ({tensor} of shape {tuple(shape)}) for every "
                                                 f"coordinate of the sites' axis {label.dim}: a neuron's scale or "
                                                 "sign would change the β of all (only permutations pass)",
                             blocked=True)
    else:
        state.restrict_label(label, DIAGONAL, node, f"{where} (swish with trainable β) is equivariant only under "
                                                    "diagonal maps (β ↦ d⁻¹β) and permutations")
        state.bind_reader(label, tensor, axis, node, role="in")
    return label.map_segments(invariant=frozenset(), center=Fraction(0), translates=False)


def _same_shape(state: Inference, data: NodeData) -> bool:
    shapes = [state.shape(i) for i in data["inputs"]]
    return None not in shapes and len(set(shapes)) == 1


@register_rule("matmul", examples={
    "matmul": around(lambda self, h: torch.nn.functional.linear(torch.relu(h), self.lora_b @ self.lora_a),
                     lora_a=lambda: torch.nn.Parameter(torch.randn(2, 4)),
                     lora_b=lambda: torch.nn.Parameter(torch.randn(4, 2)))})
def matmul_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """A product of weights ``B @ A`` (a low-rank adapter): ``GL(r)`` on the inner axis (``A ↦ g A``,
    ``B ↦ B g⁻¹``); the product's rows are ``B``'s, its columns ``A``'s. Products of values (attention
    scores) are folded before inference; any other product is unknown."""
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


def _tensor_constant(state: Inference, node: str) -> bool:
    """True if a non-number constant (a tensor buffer or a data tensor) is an operand."""
    for source in filter(None, state.graph.nodes[node]["inputs"]):
        if state.graph.nodes[source]["kind"] in ("constant", "input", "param") and \
                not isinstance(state.labels.get(source), Label):
            return True
        if state.graph.nodes[source]["kind"] == "constant":
            return True
    return False


@register_rule("neg", "identity", examples={"neg": around(lambda self, h: -torch.relu(h)),
                                           "identity": around(lambda self, h: torch.relu(h).contiguous())})
def identity_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``±z`` commutes with every action, translations included, so nothing is restricted. An identity layer
    (``nn.Identity``, the spec's ``identity``; not ``clone``/``contiguous``) is also the catalogue's linear
    activation: its symbolic checks (``σ`` linear, hence ``GL``-equivariant) are recorded on the sites it reads,
    as for any activation (the built-in entry: this rule, not an overlay, decides the op)."""
    label = _first(inputs)
    if data["op"] == "identity" and data["kind"] == "module":
        checks = symbolic_checks(CATALOGUE["identity"], GeneralLinear(2), ())
        for segment in label.segments:
            state.site(segment.site).checks.append((node, "identity", ((ALL, checks),)))
    return label.map_segments(translates=False) if data["op"] == "neg" else label


@register_rule("dropout", examples={
    "dropout": around(lambda self, h: self.drop(torch.relu(h)), drop=lambda: torch.nn.Dropout(0.25))})
def dropout_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Dropout is the identity in eval mode (``p = 0`` likewise); in training its random mask
    commutes only with diagonal actions: a blocked note names the node (the rest holds in distribution only)."""
    label = _first(inputs)
    if dropout_active(data):
        state.restrict_label(label, {"PS", "SF"}, node, f"{state.where(node)}: dropout in training mode: its random "
                             "mask drops units independently, so for the same draw an action mixing or shifting units "
                             "(permutations, GL, O, translations) changes which values are dropped; only per-unit "
                             "scalings and sign flips commute with it (model.eval() makes it the identity)",
                             blocked=True)
    return label


@register_rule("cat", examples={"cat": around(lambda self, h: torch.cat([torch.relu(h), self.inner(h)], -1), k=7,
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


@register_rule("split", "chunk", examples={
    "split": around(lambda self, h: (lambda p: torch.cat([torch.relu(p[0]), torch.tanh(p[1])], -1))(
        h.split([1, 3], -1))),
    "chunk": around(lambda self, h: split_heads_attention(self, h, packed=True), shape=(5, 3, 3),
                    qkv=lambda: torch.nn.Linear(4, 12))})
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


@register_rule("flatten", "reshape", "unsqueeze", "squeeze", examples={
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


@register_rule("weight_norm", examples={
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


@register_rule("transpose", "permute", examples={
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


@register_rule("getitem", examples={"getitem": around(
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


@register_rule("expand", examples={"expand": around(lambda self, h: self.first(torch.relu(h)), shape=(5, 3, 3),
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


@register_rule("select", examples={"select": around(lambda self, h: torch.select(torch.relu(h), 1, 0),
                                                    shape=(5, 3, 3))})
def select_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``x.select(dim, i)``, ``x[:, 0]`` (a CLS token): one entry along an axis that is not the sites' keeps every
    action, since each coordinate of the sites moves as before; along the sites' axis it picks one coordinate,
    which then no action of those sites may move."""
    if len(inputs) != 1 or not isinstance(inputs[0], Label):
        return unknown_rule(state, node, data, inputs)
    return _drop_axes(state, node, inputs[0], [_argument(data, 1, "dim")], state.shape(data["inputs"][0]))


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


@register_rule("mean", "sum", examples={
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


@register_rule("exp", "log", "sin", "cos", "sqrt", "rsqrt", "square", examples={
    "exp": around(lambda self, h: torch.exp(h)),
    "log": around(lambda self, h: torch.log(h * h + 1)), "sin": around(lambda self, h: torch.sin(h)),
    "cos": around(lambda self, h: torch.cos(h)),
    "sqrt": around(lambda self, h: torch.sqrt(h * h + 1)), "rsqrt": around(lambda self, h: torch.rsqrt(h * h + 1)),
    "square": around(lambda self, h: h.square())})
def elementwise_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """A pointwise function the catalogue does not list: it commutes with permutations only."""
    label = _first(inputs)
    if any(isinstance(i, Label) and i.segments for i in inputs[1:]) or any(_is_param(i) for i in inputs):
        return unknown_rule(state, node, data, inputs)
    state.restrict_label(label, {"S"}, node, f"{state.where(node)} ({data['op']}) is pointwise")
    return _pointwise_image(label)


def _pointwise_image(label: Label) -> Label:
    """The label of ``f(z)``, ``f`` pointwise, once the sites of ``z`` keep only permutations and the kinds leaving
    ``z`` unchanged (:meth:`~symalg.symbolic.inference.Segment.acts_trivially`): those leave ``f(z)`` unchanged too
    (``|z|³`` under the sign flips of ``z``, ``sin`` of a batch norm's output under its translations and scalings),
    so a reader must not move for them (power 0 where scalings act trivially, 1 otherwise)."""
    return Label(label.dim, label.size, tuple(
        replace(s, power=Fraction(0 if "PS" in s.acts_trivially() else 1), center=Fraction(0))
        for s in label.segments))


@register_rule("pow", examples={"pow": around(lambda self, h: torch.relu(h) ** (self.p.abs() + 1),
                                               p=lambda: torch.nn.Parameter(torch.randn(4)))})
def power_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``z ** e`` for a value ``z`` on sites: pointwise, so permutations pass where they carry the exponent along.

    A number ``e`` (``z ** 3``) is the same at every coordinate; a positive one of small denominator
    (:func:`_positive_rational`) keeps positive scalings too, ``(d z)^α = d^α z^α``: the value's power times ``α``, as
    ``relu_pow(α)``. An exponent computed coordinate by coordinate from one parameter ``p`` running along the sites'
    axis, ``e = f(p)`` (``p``, ``|p| + 1``, ``softplus(p)``, ``exp(p)``: pointwise steps and numbers only, nothing
    else reading ``p`` or the steps; :func:`_unit_exponent`) moves with them, ``(P z)^{f(P p)} = P (z^{f(p)})``; a
    scaling would need the readers to absorb ``d_j^{f(p_j)}``, a power that depends on a parameter, which no binding
    models: a blocked note names the node and ``p``. Any other tensor ``e`` is held fixed (every parameter and buffer
    it is computed from is pinned) and passes permutations when it is constant along the sites' axis (one exponent
    for the layer); one varying along it (a data tensor, a parameter with other readers) blocks the sites, with a
    note naming the node and the parameters."""
    label, exponent = (inputs[0], inputs[1]) if len(inputs) == 2 else (None, None)
    if not isinstance(label, Label) or not label.segments or isinstance(exponent, Label) and exponent.segments:
        return unknown_rule(state, node, data, inputs)
    where, source = state.where(node), data["inputs"][1]
    if source is None:
        alpha = _positive_rational(_argument(data, 1, "exponent"))
        if alpha is None:
            state.restrict_label(label, {"S"}, node, f"{where} (pow) is pointwise")
            return _pointwise_image(label)
        state.restrict_label(label, {"S", "PS"}, node, f"{where} (pow {alpha}) is positively homogeneous")
        return Label(label.dim, label.size, tuple(replace(s, power=s.power * alpha, center=Fraction(0))
                                                  for s in label.segments))
    shape = state.shape(data["inputs"][0])
    unit = _unit_exponent(state, node, source, label) if shape == state.shape(node) else None
    if unit is not None:
        tensor, steps = unit
        for step in steps:   # the steps pinned p as an unknown op's operand; they read it coordinate by coordinate
            if state.opaque.get(tensor) == step:
                del state.opaque[tensor]
        state.bind_reader(label, tensor, len(state.shapes[tensor]) + label.dim, node, role="out")
        state.restrict_label(label, {"S"}, node, f"{where} raises the value to a per-unit exponent e computed from "
                             f"{tensor}, which permutations move with the sites; a positive scaling d would leave "
                             "d_j^(e_j) for the readers to absorb, a power that depends on a parameter, which no "
                             "binding models", blocked=True)
        return _pointwise_image(label)
    tensors = _exponent_parameters(state, source)
    for tensor in tensors:
        state.opaque.setdefault(tensor, node)
    shared = state.shape(source)
    varies = shape is None or shared is None or (len(shared) + label.dim >= 0 and shared[label.dim] != 1
                                                 and shape[label.dim] != 1)
    if varies:
        what = f"computed from {', '.join(tensors)}" if tensors else "nothing moves (a model input, a fixed tensor)"
        state.restrict_label(label, set(), node, f"{where} raises the value to an exponent {what}, which varies along "
                             f"the sites' axis {label.dim} (a permutation of the sites would have to move it)",
                             blocked=True)
        return Label.data(label.dim)
    state.restrict_label(label, {"S"}, node, f"{where} (pow) is pointwise, with one exponent for every coordinate "
                                             f"of the sites' axis {label.dim}")
    return _pointwise_image(label)


def _positive_rational(number: object) -> Fraction | None:
    """A positive number exponent ``α`` as an exact fraction of denominator at most 1000 (``2``, ``0.5``, ``1.5``),
    under which ``(d z)^α = d^α z^α`` for every ``d > 0``; ``None`` for any other (``0.1`` is no such float, ``-1``
    no positive power, ``True`` no number).

    >>> _positive_rational(2), _positive_rational(1.5), _positive_rational(0.1), _positive_rational(-1)
    (Fraction(2, 1), Fraction(3, 2), None, None)
    """
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number < float("inf"):
        return None
    exact = Fraction(number)
    return exact if exact.limit_denominator(1000) == exact else None


def _unit_exponent(state: Inference, node: str, source: str, label: Label) -> tuple[str, tuple[str, ...]] | None:
    """``(p, steps)`` when the exponent ``node`` reads from ``source`` is ``f(p)``: a parameter ``p`` of the same
    length as ``label``'s axis along it, read by one node only, then ``steps`` (from ``source`` back), each a
    pointwise op of one tensor (numbers aside) read by the next step alone; else ``None``."""
    graph, steps, user = state.graph, [], node
    while graph.nodes[source]["kind"] != "param":
        step = graph.nodes[source]
        operands = [i for i in step["inputs"] if i is not None]
        if len(operands) != 1 or not _pointwise(step) or only_user(graph, source) != user:
            return None
        steps.append(source)
        user, source = source, operands[0]
    tensor = graph.nodes[source]["params"]["value"]
    readers = [v for v, d in graph.nodes(data=True) if tensor in d.get("params", {}).values()]
    shape = state.shapes[tensor]
    axis = len(shape) + label.dim
    if readers != [source] or only_user(graph, source) != user or axis < 0 or shape[axis] != label.size:
        return None
    return tensor, tuple(steps)


def _pointwise(data: NodeData) -> bool:
    """An op acting on each coordinate alone and alike: a function the rules treat as pointwise, arithmetic (with
    numbers: the caller counts the tensor operands), or a built-in catalogue activation without parameters."""
    entry = CATALOGUE.get(data["op"])
    return (data["op"] in OVERLAYABLE | {"add", "sub", "mul", "div", "pow"}
            or entry is not None and not entry.radial and not data.get("params"))


def _exponent_parameters(state: Inference, source: str) -> tuple[str, ...]:
    """The parameters and buffers the value at ``source`` is computed from, through values no site runs along
    (a value on sites answers for itself: its rules restricted what may move it)."""
    found: dict[str, None] = {}
    stack, seen = [source], set()
    while stack:
        name = stack.pop()
        value = state.labels.get(name)
        if name in seen or isinstance(value, Label) and value.segments:
            continue
        seen.add(name)
        data = state.graph.nodes[name]
        found.update(dict.fromkeys([*data.get("params", {}).values(), *data.get("buffers", {}).values()]))
        stack += [i for i in data["inputs"] if i is not None]
    return tuple(found)


@register_rule("cdist", examples={"cdist": model_example(
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


@register_rule("max_pool", examples={"max_pool": around(
    lambda self, h: self.pool(torch.relu(h).transpose(1, 2)).transpose(1, 2), shape=(5, 6, 3),
    pool=lambda: torch.nn.MaxPool1d(2))})
def max_pool_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``max`` over positions commutes with positive per-channel scaling and channel permutations."""
    label = _first(inputs)
    if _pools_the_sites(state, node, data, label):
        return Label.data(label.dim)
    state.restrict_label(label, {"PS", "S"}, node, f"{state.where(node)}: max pooling")
    return label


@register_rule("avg_pool", examples={"avg_pool": around(
    lambda self, h: self.pool(torch.relu(h).transpose(1, 2)).transpose(1, 2), shape=(5, 6, 3),
    pool=lambda: torch.nn.AvgPool1d(2))})
def avg_pool_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """Averaging over positions is linear per channel: every channel action passes through."""
    label = _first(inputs)
    if _pools_the_sites(state, node, data, label):
        return Label.data(label.dim)
    state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)}: pooling")
    return label


@register_rule("softmax", "log_softmax", examples={"softmax": around(lambda self, h: torch.softmax(h, -1)),
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


# -- normalisation -----------------------------------------------------------------------------

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


@register_rule("batch_norm", examples={
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
    kinds = {"S", "T"} | ({"PS"} if settings["eps"] == 0 else set())
    reason = f"{state.where(node)} normalises each channel" + (
        "" if settings["eps"] == 0 else f" (eps = {settings['eps']} breaks its scale invariance: BN(d·x) is BN with "
                                        "eps/d²; only eval mode admits eps = 0)")
    state.restrict_label(label, kinds, node, reason, blocked=settings["eps"] != 0)
    if not batch_statistics:
        for seg in label.segments:
            mean = Binding(buffers["running_mean"], 0, seg.offset, seg.width, seg.block, "out", seg.power,
                           buffer=True, node=node, invariant=seg.unmoved())
            state.bind(seg.site, mean)
            state.bind(seg.site, Binding(buffers["running_var"], 0, seg.offset, seg.width, seg.block, "out",
                                         2 * seg.power, buffer=True, node=node, invariant=seg.unmoved()))
            site = state.site(seg.site)
            if seg.block != 1:
                state.restrict(seg.site, ALL - {"T"}, node, f"{state.where(node)}: channels in blocks", blocked=True)
            if "T" not in seg.invariant:
                site.translations[:] = [(kind, producer, family.extended(mean) if kind == "T" else family)
                                        for kind, producer, family in site.translations]
    elif "running_mean" in buffers:
        for seg in label.segments:
            state.bind(seg.site, Binding(buffers["running_mean"], 0, seg.offset, seg.width, seg.block, "out",
                                         Fraction(0), buffer=True, diagonal=True, node=node, invariant=seg.unmoved()))
            state.bind(seg.site, Binding(buffers["running_var"], 0, seg.offset, seg.width, seg.block, "out",
                                         Fraction(0), buffer=True, diagonal=True, node=node, invariant=seg.unmoved()))
    normalised = Label(channel, label.size, tuple(Segment(s.site, s.offset, s.width, s.block, Fraction(0),
                                                          s.invariant | {"T"}) for s in label.segments))
    if not settings.get("affine", "weight" in data["params"]):
        return normalised
    return _diagonal_map(state, node, normalised, data["params"]["weight"], data["params"].get("bias"), channel)


@register_rule("layer_norm", examples={
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
        site = state.site(segments[0].site)
        site.translations[:] = [t for t in site.translations if not (t[0] == "T1" and t[2].pattern == "rows")]


@register_rule("rms_norm", examples={
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


@register_rule("group_norm", examples={
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


# -- attention ---------------------------------------------------------------------------------

def _only_into(state: Inference, source: str, node: str) -> bool:
    """``source`` is read by ``node`` alone, possibly through ``split``/``chunk`` and the ``getitem`` of its pieces
    (a packed ``qkv`` projection cut into ``q, k, v``) and through reshapes (GPT-2's ``addmm`` then ``view``)."""
    users = state.users(source)
    return bool(users) and all(user == node or state.graph.nodes[user]["op"] in ("split", "chunk", "getitem")
                               + _PASSING and _only_into(state, user, node) for user in users)


def attention_sites(state: Inference, node: str, heads: int, q: list[Binding], k: list[Binding],
                    v: list[Binding] | None, heads_alike: bool = True, key_shifts: bool = True,
                    kv_heads: int | None = None, rotary: Mapping[str, Any] | None = None,
                    value_shifts: bool = False, apart: str = "") -> tuple[Label, Label]:
    """Per head ``GL(d_k)`` on the query/key maps (keys by ``g⁻ᵀ``), per head ``GL(d_v)`` on the
    value map (and the output map's columns, through the returned label), and one permutation of
    heads moving all per-head blocks together (only when the scores of every head are treated alike,
    ``heads_alike``). ``q, k, v`` are the producers' out-bindings. Returns the label of the merged output
    (``(…, H·d_v)``) and the label of a per-head value's head axis ``-3`` (the attention probabilities
    ``softmax(s·Q_h K_hᵀ + M)``, ``(…, H, L_q, L_k)``): it carries the head permutations only, since the
    probabilities are invariant under every ``GL`` and key-bias translation here and do not depend on values.

    ``v = None``: the values are not a map's output (``softmax(q kᵀ) σ(v x)``, or a value read elsewhere too), so
    nothing models how they move: only the ``qk`` sites are made (the probabilities do not depend on the values),
    no head may move (that would pair a head's scores with another head's values) and the output is data.

    With ``key_shifts`` (the softmax over keys ignores a per-query constant) each head's key bias translates:
    ``b_k ↦ b_k + t`` adds ``q_iᵀ t`` to every score of query ``i``, the same for all keys ``j``, so
    ``softmax_j(q_iᵀ(k_j + b_k + t))`` is unchanged (``T`` on the head's ``qk`` site; the key bias's
    entries are its directions).

    With ``value_shifts`` (every row of the attention weights sums to 1: no dropout on them) each head's value bias
    translates: ``b_v ↦ b_v + t`` adds ``t`` to every row of the head's output (``P (V + 1tᵀ) = PV + 1tᵀ``),
    which the map reading the merged heads gives back in its bias (a shear, ``T`` on the ``vo`` site: the readers
    decide, :meth:`~symalg.symbolic.inference.Inference.absorb`).

    Grouped-query attention (``kv_heads = G`` key/value heads, each read by the ``r = H/G`` query heads
    ``h`` with ``h // r = g``): every query head of group ``g`` meets the same keys and values, so one
    ``GL(d_k)`` acts on the query rows of all of them (by ``g``) and on the group's key rows (by ``g⁻ᵀ``),
    and one ``GL(d_v)`` on the group's value rows and the output columns of all of them (``group{g}.qk``,
    ``group{g}.vo``). Permutations: of the groups (query heads in blocks of ``r``, key and value heads one by
    one: ``attn.groups``) and, per group, of its query heads (query rows and output columns only:
    ``attn.group{g}.heads``).

    Rotary position embeddings (``rotary``, the setting :mod:`symalg.frontend.attention_folding` records) rotate
    each plane ``(j, j + d_k/2)`` of a query or key by a position-dependent angle; the maps commuting with every
    rotation are the complex scalings of the planes (:class:`~symalg.catalogue.groups.ComplexScaling`, kind ``C``),
    which replace ``GL(d_k)`` on every ``qk`` site when queries and keys are both rotated with tables proven equal on
    the two halves of the head axis. Tables not proven so (each plane's map is then a general ``2 × 2`` matrix, whose
    commutant is a real scalar per plane) or a rotation of one side only block the ``qk`` sites (not modelled), and
    no key bias translates: ``R_j t`` depends on the key's position ``j``, so it is no per-query constant.
    """
    groups = heads if kv_heads is None else kv_heads
    r = heads // groups
    d_k = q[0].width // heads
    stem = site_stem([b.tensor for b in q + k + (v or [])], node)  # the attention module's path (``attn``)
    key_biases = [b for b in k if len(state.shapes[b.tensor]) == 1] if key_shifts else []
    rotation = _rotary_restriction(state, node, rotary)
    value_biases = [b for b in v or () if len(state.shapes[b.tensor]) == 1] if value_shifts else []
    segments = []
    for g in range(groups):
        members = range(g * r, (g + 1) * r)
        name = f"{stem}.head{g}" if r == 1 else f"{stem}.group{g}"
        qk = state.new_site(node, d_k, [b.restrict(h * d_k, d_k) for h in members for b in q] +
                            [b.restrict(g * d_k, d_k).flipped() for b in k], name=f"{name}.qk",
                            allowed=(ALL - {"T1"}) | (GRANTED if rotation else set()))
        state.site(qk).translations.extend(("T", b.node, TranslationFamily("entries", (b.restrict(g * d_k, d_k),)))
                                           for b in key_biases)
        if rotation is not None:
            state.restrict(qk, rotation[0], node, rotation[1], blocked=rotation[2])
        if v is None:
            continue
        d_v = v[0].width // groups
        site = state.new_site(node, d_v, [b.restrict(g * d_v, d_v) for b in v], name=f"{name}.vo",
                              allowed=(ALL - TRANSLATIONS) | ({"T"} if value_biases else set()))
        state.site(site).translations.extend(("T", b.node, TranslationFamily("entries", (b.restrict(g * d_v, d_v),)))
                                             for b in value_biases)
        segments += [Segment(site, h * d_v, d_v) for h in members]
    if v is None:
        return Label.data(), Label(-3, heads, ())
    d_v = v[0].width // groups
    permutations = []
    if r > 1:
        for g in range(groups):
            within = state.new_site(node, r, [b.restrict(g * r * d_k, r * d_k).coarsen(d_k) for b in q],
                                    name=f"{stem}.group{g}.heads", allowed={"S"})
            permutations.append(Segment(within, g * r * d_v, r, d_v))
    if groups > 1:
        whole = state.new_site(node, groups, [b.coarsen(r * d_k) for b in q] + [b.coarsen(d_k) for b in k] +
                               [b.coarsen(d_v) for b in v], name=f"{stem}.heads" if r == 1 else f"{stem}.groups",
                               allowed={"S"})
        permutations.append(Segment(whole, 0, groups, r * d_v))
    for segment in permutations:
        if not heads_alike:   # ``apart``: the named op that makes the heads differ (a blocked note)
            why = apart or "a mask, bias, temperature or dropout differs between heads"
            state.restrict(segment.site, set(), node, f"{state.where(node)}: {why}, so permuting the heads changes "
                                                      "them", blocked=bool(apart))
    head_axis = tuple(replace(s, offset=s.offset // d_v, block=s.block // d_v) for s in permutations)
    return Label(-1, d_v * heads, tuple(segments + permutations)), Label(-3, heads, head_axis)


def _rotary_restriction(state: Inference, node: str, rotary: Mapping[str, Any] | None) -> tuple | None:
    """``(kinds, reason, blocked)``: what a head's ``qk`` site keeps under the rotary embeddings ``rotary``
    (:func:`attention_sites`), why, and whether that is a limitation; ``None`` without rotary embeddings."""
    if not rotary:
        return None
    where = state.where(node)
    if not (rotary["queries"] and rotary["keys"]):
        side = "queries" if rotary["queries"] else "keys"
        return set(), f"{where}: a rotary embedding rotates the {side} only (not modelled)", True
    if rotary["pairing"] != "halves" or not rotary["equal_halves"]:
        return set(), (f"{where}: the rotary tables are not proven equal on the two halves of the head axis (each "
                       "plane's map may be any 2×2 matrix; the real scalars per plane that commute with it are not "
                       "modelled)"), True
    return {"C"}, (f"{where}: rotary embeddings rotate each plane (j, j + d_k/2) by a position-dependent angle; only "
                   "complex scalings of the planes commute with every rotation"), False


@register_rule("multihead_attention", examples={"multihead_attention": around(
    lambda self, h: self.attention(h, h, h, need_weights=False)[0], shape=(5, 3, 3),
    attention=lambda: torch.nn.MultiheadAttention(4, 2, batch_first=True))})
def multihead_attention_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """``nn.MultiheadAttention`` with a packed in-projection (``q, k, v`` rows of ``in_proj_weight``).

    Its second output, the attention weights ``softmax(Q_h K_hᵀ/√d)``, is invariant under every per-head
    ``GL``; averaged over heads (the default) it is invariant under head permutations too. Dropout on the weights
    (training mode) draws a mask per head: heads do not permute, nor does a value bias translate. Per head
    (``average_attn_weights=False``) a head permutation permutes its head axis (``-3``), so the weights carry
    the head site there and whatever reads them (the output, an unknown op) decides whether heads may move.
    A 3-d ``attn_mask`` (``(B·H, L, S)``, one per head) removes the head permutation; a 2-d one, or a key padding
    mask ``(B, S)``, is the same for every head.
    """
    settings, params = data["settings"], data["params"]
    if not settings.get("same_embed") or settings.get("bias_kv") or settings.get("add_zero_attn"):
        return unknown_rule(state, node, data, inputs)
    weight, bias = params["in_proj_weight"], params.get("in_proj_bias")
    d = state.shapes[weight][1]
    heads = settings["num_heads"]
    sources = data["inputs"][:3]
    if len(set(sources)) == 1:
        _read_as_map(state, node, _first(inputs), weight, -1, bias)
    else:
        for label in inputs[:3]:
            if isinstance(label, Label):
                state.restrict_label(label, set(), node, f"{state.where(node)}: distinct query/key/value inputs "
                                                         "to a packed in-projection are not modelled", blocked=True)
        state.pin(Binding(weight, 1, 0, d, node=node), node)
    def rows(offset: int) -> list[Binding]:
        out = [Binding(weight, 0, offset, d, node=node)]
        if bias:
            out.append(Binding(bias, 0, offset, d, node=node))
        return out

    dropout = settings.get("training", True) and settings.get("dropout", 0.0)   # on the attention weights
    masks = [state.shape(mask) for mask in data["inputs"][3:] if mask is not None]
    heads_alike = not dropout and all(shape is not None and len(shape) < 3 for shape in masks)
    apart = f"dropout in training mode (p={dropout}) draws a random mask on each head's attention weights" \
        if dropout else ""
    values, head_axis = attention_sites(state, node, heads, rows(0), rows(d), rows(2 * d), heads_alike=heads_alike,
                                        value_shifts=not dropout, apart=apart)
    out_weight, out_bias = params["out_proj.weight"], params.get("out_proj.bias")
    _read_as_map(state, node, values, out_weight, -1, out_bias)
    site = _producer_site(state, node, d, out_weight, out_bias)
    per_head = _argument(data, 4, "need_weights", True) and not _argument(data, 6, "average_attn_weights", True)
    return (Label(-1, d, (Segment(site, 0, d),)), head_axis if per_head else Label.data())


def _map_outputs(state: Inference, node: str, pieces: Sequence[tuple[str, object, int, int]]) -> dict | None:
    """The sites of the attention roots ``pieces`` (``(root, label, offset, width)``), when each is the whole output
    of linear maps (out-bindings only, power 1) read by ``node`` alone, distinct roots have distinct sites, and
    pieces of one packed root do not overlap; else ``None``."""
    sites = {}
    for root, label, _, _ in pieces:
        if not isinstance(label, Label) or len(label.segments) != 1:
            return None
        segment = label.segments[0]
        if segment.power != 1 or (segment.offset, segment.width, segment.block) != (0, label.size, 1):
            return None
        sites[root] = state.site(segment.site)
    spans = sorted((root, offset, offset + width) for root, _, offset, width in pieces)
    overlapping = any(a[0] == b[0] and b[1] < a[2] for a, b in zip(spans, spans[1:]))
    if overlapping or len({s.id for s in sites.values()}) != len(sites) or \
            not all(_only_into(state, s.node, node) for s in sites.values()) or \
            any(b.role != "out" for site in sites.values() for b in site.bindings):
        return None
    return sites


@register_rule("attention", examples={"attention": around(
    split_heads_attention, shape=(5, 3, 3), query=lambda: torch.nn.Linear(4, 4), key=lambda: torch.nn.Linear(4, 4),
    value=lambda: torch.nn.Linear(4, 4))})
def attention_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """Attention folded by :mod:`symalg.frontend.attention_folding`: the first three inputs are the outputs of the
    ``q``, ``k``, ``v`` maps (each read by nothing else), whose sites are split into heads; a root read by two or
    three of them (a packed in-projection) is cut at the ``offsets`` they read from, which must not overlap. The
    other inputs are the tensors the scores are combined with (masks, biases, temperatures) and the tables of
    rotary embeddings, which nothing may move.

    Where the attention probabilities are read too (setting ``probabilities``), the result is the pair (output,
    probabilities): with the heads on axis ``-3`` (``"heads"``) the probabilities carry the head permutations
    there (see :func:`attention_sites`), and their readers decide whether heads may move; with the heads merged
    into another axis (``"merged"``) nothing models how they move, so the head permutations go."""
    settings = data["settings"]
    heads = settings["heads"]
    groups = settings.get("kv_heads", heads)
    for extra in inputs[3:]:
        if isinstance(extra, Label):
            state.restrict_label(extra, set(), node, f"{state.where(node)} combines its scores or rotates its queries "
                                                     "or keys with this value")
        elif _is_param(extra) or isinstance(extra, WeightExpr):
            for tensor in (extra.tensors if isinstance(extra, WeightExpr) else (extra[1],)):
                state.opaque.setdefault(tensor, node)
    roots = data["inputs"][:3]
    offsets = settings.get("offsets", (0, 0, 0))
    widths = (heads * settings["head_dim"], groups * settings["head_dim"], groups * settings["value_head_dim"])
    pieces = list(zip(roots, inputs[:3], offsets, widths))
    sites = _map_outputs(state, node, pieces)
    value = inputs[2]
    if sites is None:   # the values may come through an op: the scores alone keep their symmetries
        sites = _map_outputs(state, node, pieces[:2]) if roots[2] not in roots[:2] else None
        moved = {s.id for s in sites.values()} if sites is not None else set()
        if sites is None or isinstance(value, Label) and any(seg.site in moved for seg in value.segments):
            return unknown_rule(state, node, data, inputs)
        _freeze(state, node, value, f"{state.where(node)}: its values are not a linear map's output read by the "
                                    "attention alone, so the value/output maps and the heads keep no symmetry")
    for site in sites.values():
        site.dissolved = True
    q, k = ([b.restrict(offset, width) for b in sites[root].bindings] for root, _, offset, width in pieces[:2])
    v = [b.restrict(offsets[2], widths[2]) for b in sites[roots[2]].bindings] if roots[2] in sites else None
    output, head_axis = attention_sites(state, node, heads, q, k, v, heads_alike=settings.get("heads_alike", True),
                                        key_shifts=settings.get("key_shifts", True), kv_heads=settings.get("kv_heads"),
                                        rotary=settings.get("rotary"), value_shifts=settings.get("value_shifts", False))
    if "probabilities" not in settings:
        return output
    if settings["probabilities"] != "heads":
        state.restrict_label(head_axis, set(), node, f"{state.where(node)} returns its attention probabilities with "
                                                     "the heads merged into another axis", blocked=True)
        return (output, Label.data())
    return (output, head_axis)
