"""Rules for elementwise ops: sums (ties), products (numbers, gates, weights), pointwise functions, powers,
trainable swish, dropout and the identity.

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)[:5]
['add', 'cos', 'div', 'dropout', 'exp']
"""
from __future__ import annotations

import operator
from dataclasses import replace
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from symalg.catalogue.activations import CATALOGUE
from symalg.catalogue.groups import GeneralLinear
from symalg.catalogue.products import multiply
from symalg.ir.graph import only_user
from symalg.catalogue.rule_examples import around
from symalg.symbolic.checks import symbolic_checks
from symalg.symbolic.inference import ALL, DIAGONAL, EVEN, Inference, Label, Segment
from symalg.catalogue.rules._base import (Inputs, NodeData, Value, WeightExpr, _argument, _first, _is_param, _weight,
                                          _weights, dropout_active, unknown_rule)
from symalg.catalogue.rules.dense import _diagonal_map
from symalg.catalogue.rules.registry import OpSpellings, capable, register_rule


def _same_layout(a: Label, b: Label) -> bool:
    key = lambda label: [(s.offset, s.width, s.block) for s in label.segments]  # noqa: E731
    return a.dim == b.dim and key(a) == key(b)


def _ramp() -> torch.Tensor:
    """Four distinct entries: a fixed summand or factor that is not constant along a site of width 4 (near misses).

    >>> _ramp()
    tensor([0.5000, 1.0000, 1.5000, 2.0000])
    """
    return torch.linspace(0.5, 2.0, 4)


@register_rule("add", "sub", capabilities={"arithmetic", "entrywise", "products", "weights"},
               spellings={"add": OpSpellings(functions=(operator.add, torch.add, operator.iadd),
                                             methods=("add", "add_"), aten=("add", "add_")),
                          "sub": OpSpellings(functions=(operator.sub, torch.sub, operator.isub),
                                             methods=("sub", "sub_"), aten=("sub", "sub_"))},
               near_misses={  # a fixed summand that is not constant along the site: it pins the site
                   "add": (around(lambda self, h: torch.relu(h) + self.shift, shift=_ramp),),
                   "sub": (around(lambda self, h: torch.relu(h) - self.shift, shift=_ramp),)},
               examples={
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
        kept = {"T", "T1"} if plain else {"T1"}  # a shift along ``1`` stays one, whatever the sign or factor
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
        state.restrict(x.site, ALL - {"T"}, node, f"{state.where(node)}: a sum does not absorb a bias "
                       "translation (one along 1 stays one)")
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
    state.restrict_label(label, ALL - {"T"}, node, f"{state.where(node)} adds a parameter")


@register_rule("mul", "div", capabilities={"arithmetic", "entrywise", "products", "weights"},
               spellings={"mul": OpSpellings(functions=(operator.mul, torch.mul, operator.imul),
                                             methods=("mul", "mul_"), aten=("mul", "mul_")),
                          "div": OpSpellings(functions=(operator.truediv, torch.div, operator.itruediv),
                                             methods=("div", "div_"), aten=("div", "div_"))},
               near_misses={  # a factor not constant along the site: permutations go, scalings stay; a parameter
                   # factor: a layer scale γ moves with the permutations, one γ for all or per position is refused
                   "mul": (around(lambda self, h: torch.relu(h) * self.scale, scale=_ramp),
                           *(around(lambda self, h: torch.relu(h) * self.gamma,
                                    gamma=lambda shape=shape: torch.nn.Parameter(torch.rand(shape) + 0.5))
                             for shape in ((4,), (1,), (5, 4)))),
                   "div": (around(lambda self, h: torch.relu(h) / self.scale, scale=_ramp),)},
               examples={
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
    scaled_by = _layer_scale(state, node, data, inputs)
    if scaled_by is not None:
        return scaled_by
    parameters = [i[1] for i in inputs if _is_param(i)]
    for label in (i for i in inputs if isinstance(i, Label) and parameters):
        state.restrict_label(label, set(), node, f"{state.where(node)} multiplies the value by the parameter "
                             f"{parameters[0]} elementwise, which is modelled only with one entry per coordinate of "
                             "the sites' axis (a layer scale x ⊙ γ) or inside z ⊙ sigmoid(β ⊙ z) (swish with a "
                             "trainable β, both products reading z, nothing else reading β ⊙ z or the sigmoid)",
                             blocked=True)
    return unknown_rule(state, node, data, inputs)


def _layer_scale(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label | None:
    """``y = x ⊙ γ`` (either order) with ``γ`` a parameter holding one entry per coordinate of the sites' axis of ``x``
    and ones elsewhere (a learnable layer scale: ConvNeXt's ``γ`` of shape ``(C,)`` or ``(C, 1, 1)``, CaiT's): a
    diagonal map (:func:`~symalg.catalogue.rules.dense._diagonal_map`), ``γ`` absorbing the scalings and sign flips
    of ``x``'s sites (``γ ↦ D⁻¹γ``) and carrying a new site of its own, tied to theirs in permutations. ``None`` for
    anything else (a broadcast that grows ``x``, factors sharing coordinates, shapes unknown): the caller refuses it.

    For ``x ↦ P D x``: ``(P D x) ⊙ (P D⁻¹ γ) = P (x ⊙ γ)``, and ``y ↦ E y`` is given back by ``γ ↦ E γ``.
    """
    if data["op"] != "mul" or len(inputs) != 2 or data["kind"] != "function":
        return None
    position = next((i for i, value in enumerate(inputs) if _is_param(value)), None)
    if position is None or not isinstance(inputs[1 - position], Label):
        return None
    label, tensor = inputs[1 - position], inputs[position][1]
    value_shape, shape, gamma = state.shape(data["inputs"][1 - position]), state.shape(node), state.shapes[tensor]
    if value_shape is None or shape is None or tuple(value_shape) != tuple(shape) or len(gamma) > len(shape) \
            or not label.segments or label.dim >= 0:
        return None
    axis = len(gamma) + label.dim
    ranges = [(seg.offset, seg.width, seg.block) for seg in label.segments]
    if axis < 0 or gamma[axis] != label.size or any(n != 1 for i, n in enumerate(gamma) if i != axis) \
            or len(set(ranges)) != len(ranges):
        return None
    return _diagonal_map(state, node, label, tensor, None, label.dim, axis)


@register_rule("swish_beta", capabilities={"weights"},
               examples={"swish_beta": around(
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


def _tensor_constant(state: Inference, node: str) -> bool:
    """True if a non-number constant (a tensor buffer or a data tensor) is an operand."""
    for source in filter(None, state.graph.nodes[node]["inputs"]):
        if state.graph.nodes[source]["kind"] in ("constant", "input", "param") and \
                not isinstance(state.labels.get(source), Label):
            return True
        if state.graph.nodes[source]["kind"] == "constant":
            return True
    return False


@register_rule("neg", "identity",
               capabilities={"neg": {"entrywise", "pointwise", "products"},
                             "identity": {"layout", "pointwise", "products", "shifts"}},
               spellings={"neg": OpSpellings(functions=(operator.neg, torch.neg), methods=("neg",), aten=("neg",)),
                          "identity": OpSpellings(methods=("contiguous", "clone"), aten=("clone", "contiguous"))},
               examples={"neg": around(lambda self, h: -torch.relu(h)),
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


@register_rule("dropout", capabilities={"products"},
               spellings={"dropout": OpSpellings(modules=(nn.Dropout,), functions=(F.dropout,), aten=("dropout",))},
               examples={
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


@register_rule("exp", "log", "sin", "cos", "sqrt", "rsqrt", "square", capabilities={"pointwise"},
               spellings={"exp": OpSpellings(functions=(torch.exp,), methods=("exp",), aten=("exp",)),
                          "log": OpSpellings(functions=(torch.log,), aten=("log",)),
                          "sin": OpSpellings(functions=(torch.sin,), aten=("sin",)),
                          "cos": OpSpellings(functions=(torch.cos,), aten=("cos",)),
                          "sqrt": OpSpellings(functions=(torch.sqrt,), methods=("sqrt",), aten=("sqrt",)),
                          "rsqrt": OpSpellings(aten=("rsqrt",)),
                          "square": OpSpellings(methods=("square",), aten=("square",))},
               examples={
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


@register_rule("pow", capabilities={"arithmetic", "weights"},
               spellings={"pow": OpSpellings(functions=(operator.pow, torch.pow), methods=("pow",), aten=("pow",))},
               examples={"pow": around(lambda self, h: torch.relu(h) ** (self.p.abs() + 1),
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
    return (capable(data["op"], "pointwise") or capable(data["op"], "arithmetic")
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
