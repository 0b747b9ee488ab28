"""Fold hand-written multi-head attention into one ``attention`` node of a :class:`~symalg.frontend.tracing.ModelGraph`.

A root value ``X`` of shape ``(…, L, d)`` (typically a ``q``, ``k`` or ``v`` linear's output) is *split
into heads* when ``H·d_k = d`` and

    X_h[…, i, j] = X[…, i, h·d_k + j],   h < H, i < L, j < d_k,

i.e. ``X_h = X.reshape(…, L, H, d_k).transpose(-3, -2)``, of shape ``(…, H, L, d_k)``: head ``h`` holds the
feature columns ``[h·d_k, (h+1)·d_k)``. Keys and values may have ``G`` heads (``G·d_k = d``) repeated to ``H``,
each read by ``r = H/G`` consecutive query heads (grouped-query attention): ``X_h = X_{⌊h/r⌋}``, written
``repeat_interleave(r, dim)``, ``x[:, :, None].expand(…, G, r, L, d_k).reshape(…, H, L, d_k)`` or left to
``sdpa(..., enable_gqa=True)``; the node then has the setting ``kv_heads = G``. Attention per head and the inverse merge

    A_h = softmax(s · Q_h K_hᵀ + M) V_h,   Y[…, i, h·d_v + j] = A_h[…, i, j]

(``Y = A.transpose(-3, -2).reshape(…, L_q, H·d_v)``) is written either with
``F.scaled_dot_product_attention(Q, K, V, ...)`` (any ``attn_mask``, ``is_causal``, ``dropout_p``,
``scale``) or explicitly: ``Q @ Kᵀ`` (``matmul``), then any chain of *score modifiers*, ``softmax`` over
the last axis, optionally ``dropout``, then ``@ V``. A modifier combines the scores ``S`` with a number
(a Python number, or a value computed from shapes only such as ``math.sqrt(q.size(-1))``) or with a tensor
``E`` computed without the scores: ``S·E``, ``S/E``, ``E/S``, ``S ± E``, ``E − S`` (a learnable temperature, a
T5 relative-position bias, an additive mask) or ``S.masked_fill(mask, c)`` (a causal mask).
Such a pattern becomes one node ``attention(q, k, v, *E)`` reading the three roots and the modifiers'
tensors (the ``sdpa`` mask included), with settings ``heads = H``, ``head_dim = d_k``,
``value_head_dim = d_v``, ``form`` (``"sdpa"``/``"explicit"``) and two facts about the modifiers:

- ``heads_alike``: every tensor ``E`` is the same for all heads (its axis ``-3`` is absent or of length 1),
  so permuting the heads permutes the scores of a per-head ``E`` nowhere, and no dropout acts on the weights
  (its mask differs between heads);
- ``key_shifts``: a per-query constant added to the scores, ``S_ij + c_i``, is still one after every
  modifier (sums, a factor or divisor constant along the keys, ``masked_fill`` with ``-inf``), so the
  softmax over keys ignores it; ``E/S`` and ``masked_fill`` with a finite value do not keep it;
- ``value_shifts``: every row of the attention weights sums to 1 (no dropout acts on them: ``sdpa``'s
  ``dropout_p`` is 0, a ``dropout`` after the softmax is off), so ``A_h`` moves by ``1tᵀ`` when ``V_h`` does.
  (A row whose scores are all ``-inf`` is NaN whatever the values.)

The readers of ``Y`` read the node instead. ``Q_h ↦ Q_h g``, ``K_h ↦ K_h g⁻ᵀ`` leaves ``Q_h K_hᵀ``, hence
any function of it and of tensors that do not depend on it, unchanged.

**Rotary position embeddings.** Between the split and ``Q`` (or ``K``) there may be rotary steps

    Y = X·cos + rotate_half(X)·sin,   rotate_half(X) = cat(−X[…, m:], X[…, :m], −1),   m = d_k/2

(``add(mul(X, cos), mul(cat(neg(slice(X)), slice(X)), sin))`` as ``torch.export`` writes Hugging Face's
``apply_rotary_pos_emb``; ``x[..., :m]``, ``torch.cat((-x2, x1), dim=-1)`` in fx; either operand order of every
``mul`` and of the ``add``), where ``X`` is the standard split (its head axis ``-3``, its head coordinate ``j``
along the last axis) and ``cos``, ``sin`` are tensors computed without the attention's inputs that broadcast to
``X``. ``rotate_half`` is checked exactly, sign included, by replaying it on ``arange(1, n + 1)``; the steps'
nodes are folded, the tables become further inputs of the node (nothing may move them), and the node gets the
setting ``rotary = {"queries", "keys": bool, "pairing": "halves", "equal_halves": bool}``. ``equal_halves`` says
that every table is proven equal on the two halves of the last axis (``cos[…, j] = cos[…, j + m]``): then each
plane ``(j, j + m)`` is multiplied by the complex number ``cos_j + i sin_j`` and the head's query/key group is
:class:`~symalg.catalogue.groups.ComplexScaling` (see there). The proof is structural: the table is computed from
``cat((f, f), -1)`` through pointwise functions, numbers, products of such tables and layout ops, replayed on
index tensors whose equal entries stand for equal values (:func:`_value_ids`); a table that is a parameter, a
buffer or anything else is not proven. The tables are ``heads_alike`` when they do not vary along axis ``-3``.
Interleaved pairs (GPT-J's ``rotate_every_two``) and partial rotary embeddings (GPT-NeoX's ``rotary_ndims``) do not
match: the heads are not folded and their split blocks the sites.

The layout chains between a root and ``Q``/``Kᵀ``/``V`` (and between ``A`` and ``Y``) are ``reshape``,
``flatten``, ``unsqueeze``, ``transpose``, ``permute``, ``identity``, ``expand``, ``repeat_interleave`` and
``getitem`` nodes (whole slices and new axes only), each read by nothing but the next. Such a
chain moves entries without changing them, so it is checked exactly by *replaying* it on the index
tensor ``arange(n).reshape(shape of the root)`` (reshapes to their recorded shapes, transposes and
permutes with their recorded dims) and comparing with the standard split above (transposed on its last
two axes for ``Kᵀ``) or, for the merge, with ``Y`` computed from ``arange(n).reshape(shape of A)``. The
recorded shapes come from shape propagation, so nothing is folded without example inputs; nor where any
check fails, where a folded value has a reader outside the pattern, or where heads, head widths,
batch axes or key lengths disagree between ``Q``, ``K`` and ``V``: folding never guesses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, Mapping, TypeGuard

import networkx as nx
import torch

__all__ = ["fold_attention", "dropout_active"]

_LAYOUT = frozenset({"reshape", "flatten", "transpose", "permute", "identity", "unsqueeze", "getitem", "expand",
                     "repeat_interleave"})

_REPLAY_ERRORS = (RuntimeError, IndexError, TypeError, ValueError)


@dataclass(frozen=True)
class _Rotary:
    """One rotary step ``output = x·cos + rotate_half(x)·sin`` (module docstring): the nodes it consists of (``x`` and
    the tables excluded), its ``(cos, sin)`` tables and whether both are proven equal on the halves of the last axis."""

    x: str
    output: str
    nodes: frozenset[str]
    tables: tuple[str, str]
    equal_halves: bool


@dataclass(frozen=True)
class _Split:
    """A root ``(*lead, length, heads·width)`` split into heads ``(*lead, heads, length, width)`` by ``chain`` (layout
    nodes, and the outputs of the rotary steps in ``rotations``)."""

    root: str
    chain: tuple[str, ...]
    lead: tuple[int, ...]
    heads: int
    length: int
    width: int
    groups: int
    rotations: tuple[_Rotary, ...] = ()


@dataclass(frozen=True)
class _Modifier:
    """One op between the scores and the softmax: its scores operand, the tensor it combines them with (if
    any) and whether a per-query constant added to the scores stays one (see the module docstring)."""

    node: str
    scores: str
    extra: str | None
    key_shifts: bool


@dataclass(frozen=True)
class _Match:
    """One attention pattern: the roots, the head layout, the nodes it replaces and the merged output."""

    roots: tuple[str, str, str]
    extras: tuple[str, ...]
    heads_alike: bool
    key_shifts: bool
    value_shifts: bool
    heads: int
    kv_heads: int
    head_dim: int
    value_head_dim: int
    form: str
    folded: frozenset[str]
    final: str
    rotary: dict | None = None


def dropout_active(data: Mapping[str, Any]) -> bool:
    """A ``dropout`` node (module, ``F.dropout``, ``aten.dropout``) that zeroes entries: ``p > 0`` in training mode
    (the module's settings, else the call's arguments; ``F.dropout`` trains by default)."""
    arguments, settings = data.get("arguments", {}), data.get("settings", {})
    p = settings.get("p", arguments.get("p", arguments.get("arg1", 0.5)))
    training = settings.get("training", arguments.get("training", arguments.get("arg2", True)))
    return bool(p) and bool(training)


def scale_constant(value: object) -> bool:
    """True for a Python number (the only non-tensor operand of ``mul``/``div`` we treat as linear)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fold_attention(graph: nx.DiGraph) -> nx.DiGraph:
    """A pass: a copy of ``graph`` with every hand-written multi-head attention replaced by one ``attention``
    node; patterns that do not match exactly (see the module docstring) are left as they are.
    """
    graph = graph.copy()
    for name in list(graph):
        if name not in graph:
            continue
        op = graph.nodes[name]["op"]
        match = _match_sdpa(graph, name) if op == "sdpa" else _match_explicit(graph, name) if op == "softmax" else None
        if match is not None:
            _fold(graph, match)
    return graph


def _match_sdpa(graph: nx.DiGraph, name: str) -> _Match | None:
    """``F.scaled_dot_product_attention(q, k, v, ...)`` with ``q, k, v`` given positionally."""
    data = graph.nodes[name]
    inputs = data["inputs"]
    if len(inputs) < 3 or None in inputs[:3] or any(f"arg{i}" not in data["arguments"] for i in range(3)):
        return None
    masks = tuple(m for m in inputs[3:] if m is not None)
    modifiers = tuple(_Modifier(name, inputs[0], m, True) for m in masks)
    dropout = data["arguments"].get("dropout_p", data["arguments"].get("arg4", 0.0))
    return _match_core(graph, inputs[0], inputs[1], inputs[2], name, {name}, "sdpa", modifiers, keys_transposed=False,
                       repeats_keys=data["arguments"].get("enable_gqa") is True, value_shifts=not dropout)


def _match_explicit(graph: nx.DiGraph, name: str) -> _Match | None:
    """``softmax(c · q @ kᵀ, -1)`` (optionally dropped out) ``@ v``, found from its ``softmax`` node."""
    data = graph.nodes[name]
    shape = data["shape"]
    dim = data["settings"].get("dim", data["arguments"].get("dim", data["arguments"].get("arg1")))
    if (shape is None or not _single_input(data) or isinstance(dim, bool) or dim not in (-1, len(shape) - 1)
            or any(isinstance(v, torch.dtype) for v in data["arguments"].values())):
        return None
    body = {name}
    path = _scores_path(graph, data["inputs"][0])
    if path is None:
        return None
    scores, modifiers = path
    body |= {m.node for m in modifiers}
    probabilities = name
    user = _only_user(graph, probabilities)
    value_shifts = True
    if user is not None and graph.nodes[user]["op"] == "dropout" and _single_input(graph.nodes[user]):
        body.add(user)
        probabilities = user
        value_shifts = not dropout_active(graph.nodes[user])
        user = _only_user(graph, probabilities)
    if user is None:
        return None
    first, second = graph.nodes[scores], graph.nodes[user]
    if (first["op"] != "matmul" or second["op"] != "matmul"
            or len(first["inputs"]) != 2 or None in first["inputs"]
            or len(second["inputs"]) != 2 or second["inputs"][0] != probabilities or second["inputs"][1] is None):
        return None
    body |= {scores, user}
    if any(_only_user(graph, n) not in body for n in body - {user}):
        return None
    q, k = first["inputs"]
    return _match_core(graph, q, k, second["inputs"][1], user, body, "explicit", modifiers, keys_transposed=True,
                       value_shifts=value_shifts)


def _scores_path(graph: nx.DiGraph, name: str) -> tuple[str, tuple[_Modifier, ...]] | None:
    """The ``matmul`` computing the scores that reach ``name`` through score modifiers (each read by the next
    only), and those modifiers; ``None`` where there is no such chain."""
    if graph.nodes[name]["op"] == "matmul":
        return name, ()
    for modifier in _modifier_options(graph, name):
        rest = _scores_path(graph, modifier.scores) if _only_user(graph, modifier.scores) == name else None
        if rest is not None:
            return rest[0], (modifier,) + rest[1]
    return None


def _modifier_options(graph: nx.DiGraph, name: str) -> list[_Modifier]:
    """The ways ``name`` can be a score modifier, one per operand that may be the scores (see the module
    docstring); the other operand is a number or a tensor whose shape broadcasts to the scores'."""
    data = graph.nodes[name]
    op, inputs, arguments, shape = data["op"], data["inputs"], data["arguments"], data["shape"]
    if shape is None:
        return []
    if op == "masked_fill":
        value = arguments.get("value", arguments.get("arg2"))
        if (len(inputs) != 3 or None in inputs[:2] or inputs[2] is not None or not isinstance(value, (int, float))
                or isinstance(value, bool) or set(arguments) != {"arg0", "arg1", "arg2"}):
            return []
        return [_Modifier(name, inputs[0], inputs[1], value == -math.inf)]
    if op not in ("mul", "div", "add", "sub") or len(inputs) != 2 or set(arguments) != {"arg0", "arg1"}:
        return []
    options = []
    for position in (0, 1):
        scores, other = inputs[position], inputs[1 - position]
        if scores is None or graph.nodes[scores]["shape"] != shape:
            continue
        if other is None:
            number = arguments[f"arg{1 - position}"]
            if number is not None and not (scale_constant(number) and number != 0):
                continue
            along_keys = True
        else:
            extra_shape = graph.nodes[other]["shape"]
            if extra_shape is None:
                continue
            along_keys = len(extra_shape) == 0 or extra_shape[-1] == 1
        key_shifts = op in ("add", "sub") or along_keys and (op == "mul" or position == 0)   # not E / S
        options.append(_Modifier(name, scores, other, key_shifts))
    return options


def _match_core(graph: nx.DiGraph, q: str, k: str, v: str, out: str, body: set[str], form: str,
                modifiers: tuple[_Modifier, ...], keys_transposed: bool, repeats_keys: bool = False,
                value_shifts: bool = False) -> _Match | None:
    """Check the three head splits, their agreement, the output shape and the merge of the heads. With
    ``repeats_keys`` (``sdpa(..., enable_gqa=True)``) keys and values may have fewer heads, which ``sdpa`` repeats
    by ``repeat_interleave``."""
    queries, keys, values = _split(graph, q, False), _split(graph, k, keys_transposed), _split(graph, v, False)
    if queries is None or keys is None or values is None or values.rotations:
        return None
    lead, heads, length = queries.lead, queries.heads, queries.length
    kv_heads = keys.groups if keys.heads == heads else keys.heads
    if repeats_keys and keys.heads != heads and (heads % keys.heads or keys.groups != keys.heads):
        return None
    if (keys.lead != lead or values.lead != lead or (keys.heads != heads and not repeats_keys)
            or values.heads != keys.heads or queries.groups != heads or keys.groups != values.groups
            or keys.width != queries.width or keys.length != values.length
            or graph.nodes[out]["shape"] != (*lead, heads, length, values.width)):
        return None
    merge = _merge(graph, out, lead, heads, length, values.width)
    if merge is None:
        return None
    rotations = queries.rotations + keys.rotations
    folded = frozenset(body) | set(queries.chain) | set(keys.chain) | set(values.chain) | set(merge) | {
        n for r in rotations for n in r.nodes}
    final = merge[-1]
    roots = (queries.root, keys.root, values.root)
    if any(r in folded for r in roots) or any(u not in folded for n in folded - {final} for u in graph.successors(n)):
        return None
    extras = tuple(dict.fromkeys([m.extra for m in modifiers if m.extra is not None] +
                                 [t for r in rotations for t in r.tables]))
    if any((nx.ancestors(graph, e) | {e}) & (folded | set(roots)) for e in extras):
        return None    # a modifier computed from the scores or the attention's own inputs
    extra_shapes = [graph.nodes[e]["shape"] for e in extras]
    if None in extra_shapes:
        return None
    heads_alike = value_shifts and all(len(s) < 3 or s[-3] == 1 for s in extra_shapes)   # dropout masks differ
    key_shifts = all(m.key_shifts for m in modifiers) and not keys.rotations   # R_j b_k varies with the key j
    rotary = None if not rotations else {
        "queries": bool(queries.rotations), "keys": bool(keys.rotations), "pairing": "halves",
        "equal_halves": all(r.equal_halves for r in rotations)}
    return _Match(roots, extras, heads_alike, key_shifts, value_shifts, heads, kv_heads, queries.width, values.width,
                  form, folded, final, rotary)


def _split(graph: nx.DiGraph, name: str, transposed: bool) -> _Split | None:
    """The longest chain of layout nodes and rotary steps ending at ``name`` that splits its root into heads
    (``None`` if none does). Each node of the chain is read by the next alone; the input of a rotary step by that
    step's nodes alone.

    With ``transposed`` the chain must end in the split's transpose on its last two axes (``Kᵀ``).
    """
    path: list[str] = []
    rotations: dict[str, _Rotary] = {}
    node, readers = name, None      # readers: who may read ``node`` (None: any one node)
    while (set(graph.successors(node)) == readers if readers is not None else graph.out_degree(node) == 1):
        if _is_layout(graph.nodes[node]):
            path.append(node)
            node, readers = graph.nodes[node]["inputs"][0], None
        elif (rotary := _rotary(graph, node)) is not None:
            path.append(node)
            rotations[node] = rotary
            node, readers = rotary.x, {n for n in rotary.nodes if rotary.x in graph.nodes[n]["inputs"]}
        else:
            break
    path.reverse()
    for start in range(len(path)):
        root = node if start == 0 else path[start - 1]
        split = _check_split(graph, root, tuple(path[start:]), transposed, rotations)
        if split is not None:
            return split
    return None


def _check_split(graph: nx.DiGraph, root: str, chain: tuple[str, ...], transposed: bool,
                 rotations: dict[str, _Rotary]) -> _Split | None:
    """The split ``chain`` makes of ``root``, checked by replay; a rotary step keeps every entry's place (it mixes
    entries along the last axis within a head) and must act on the standard split (module docstring)."""
    shape, out = graph.nodes[root]["shape"], graph.nodes[chain[-1]]["shape"]
    if (shape is None or out is None or not all(_is_int(n) for n in (*shape, *out)) or len(shape) < 2
            or len(out) != len(shape) + 1 or 0 in shape):
        return None    # no shape, or the tuple of shapes of a multi-output op (``split``)
    heads, length, width = (out[-3], out[-1], out[-2]) if transposed else out[-3:]
    lead = shape[:-2]
    groups = shape[-1] // width if width else 0
    if out[:-3] != lead or length != shape[-2] or groups * width != shape[-1] or not groups or heads % groups:
        return None
    index = _index(shape)
    standard = index.reshape(*lead, length, groups, width).transpose(-3, -2)
    expected = standard.repeat_interleave(heads // groups, -3)
    if transposed:
        expected = expected.transpose(-2, -1)
    replayed: torch.Tensor | None = index
    for step in chain:
        if step not in rotations:
            replayed = _replay(graph, replayed, (step,)) if replayed is not None else None
            continue
        repeats = replayed.shape[-3] // groups if replayed is not None and replayed.dim() >= 3 else 0
        if replayed is None or not repeats or not _same(replayed, standard.repeat_interleave(repeats, -3)):
            return None     # a rotary step elsewhere than on the heads' coordinates
    if replayed is None or not _same(replayed, expected):
        return None
    return _Split(root, chain, lead, heads, length, width, groups, tuple(rotations[s] for s in chain if s in rotations))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def _merge(graph: nx.DiGraph, out: str, lead: tuple, heads: int, length: int, width: int) -> tuple[str, ...] | None:
    """The longest layout chain from ``out`` (each node read by the next only) that merges the heads back."""
    index = _index(graph.nodes[out]["shape"])
    expected = index.transpose(-3, -2).reshape(*lead, length, heads * width)
    path, best = [], None
    node = out
    while (user := _only_user(graph, node)) is not None and _is_layout(graph.nodes[user]):
        replayed = _replay(graph, index, (user,))
        if replayed is None:
            break
        index = replayed
        path.append(user)
        if index.shape == expected.shape and torch.equal(index, expected):
            best = len(path)
        node = user
    return tuple(path[:best]) if best else None


def _index(shape: tuple[int, ...]) -> torch.Tensor:
    """``arange(n).reshape(shape)``: every entry names its position."""
    numel = torch.Size(shape).numel()
    return torch.arange(numel, dtype=torch.int32 if numel < 2 ** 31 else torch.int64).reshape(shape)


def _replay(graph: nx.DiGraph, tensor: torch.Tensor, chain: tuple[str, ...]) -> torch.Tensor | None:
    """Apply a layout chain to ``tensor``; ``None`` where an op cannot be replayed or a shape disagrees."""
    for name in chain:
        data = graph.nodes[name]
        if data["shape"] is None:
            return None
        try:
            if data["op"] in ("reshape", "flatten", "unsqueeze"):
                tensor = tensor.reshape(data["shape"])
            elif data["op"] == "getitem":
                tensor = tensor[_new_axes(data["arguments"])]
            elif data["op"] == "expand":
                tensor = tensor.expand(data["shape"])
            elif data["op"] == "repeat_interleave":
                tensor = tensor.repeat_interleave(*_repeats(data["arguments"]))
            elif data["op"] == "transpose":
                tensor = tensor.transpose(*_transpose_dims(data["arguments"]))
            elif data["op"] == "permute":
                tensor = tensor.permute(_permute_dims(data["arguments"]))
        except _REPLAY_ERRORS:
            return None
        if tuple(tensor.shape) != tuple(data["shape"]):
            return None
    return tensor


def _new_axes(arguments: dict[str, object]) -> tuple[slice | EllipsisType | None, ...]:
    """An index of whole slices, ``None`` (new axes) and ``...`` only (``x[:, :, None]``): it moves no entry."""
    index = arguments.get("arg1")
    items = index if isinstance(index, tuple) else (index,)
    kept = tuple(i for i in items if i is None or i is Ellipsis or isinstance(i, slice) and i == slice(None))
    if len(kept) != len(items):
        raise ValueError(f"index {index} selects entries")
    return kept


def _repeats(arguments: dict[str, object]) -> tuple[int, int]:
    """``(repeats, dim)`` of ``x.repeat_interleave(repeats, dim)`` with a number of repeats and a dimension."""
    repeats, dim = arguments.get("repeats", arguments.get("arg1")), arguments.get("dim", arguments.get("arg2"))
    if _is_int(repeats) and _is_int(dim):
        return repeats, dim
    raise ValueError(f"repeat_interleave{(repeats, dim)} not recorded")


def _transpose_dims(arguments: dict[str, object]) -> tuple[int, int]:
    dim0, dim1 = arguments.get("dim0", arguments.get("arg1")), arguments.get("dim1", arguments.get("arg2"))
    if _is_int(dim0) and _is_int(dim1):
        return dim0, dim1
    raise ValueError(f"transpose dims {(dim0, dim1)} not recorded")


def _permute_dims(arguments: dict) -> tuple[int, ...]:
    if "dims" in arguments:
        dims = arguments["dims"]
    elif isinstance(arguments.get("arg1"), (list, tuple)):
        dims = arguments["arg1"]
    else:
        dims = [arguments[f"arg{i}"] for i in range(1, len(arguments)) if f"arg{i}" in arguments]
    if not isinstance(dims, (list, tuple)) or not dims or not all(_is_int(d) for d in dims):
        raise ValueError(f"permute dims {dims} not recorded")
    return tuple(dims)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _single_input(data: dict) -> bool:
    """One tensor input, in first position (the other entries are constants)."""
    inputs = data["inputs"]
    return bool(inputs) and inputs[0] is not None and all(i is None for i in inputs[1:])


def _is_layout(data: dict) -> bool:
    """A layout op on one tensor (not ``view(dtype)``, which reinterprets the entries)."""
    return (data["op"] in _LAYOUT and _single_input(data)
            and not any(isinstance(v, torch.dtype) for v in data["arguments"].values()))


def _only_user(graph: nx.DiGraph, name: str) -> str | None:
    users = list(graph.successors(name))
    return users[0] if len(users) == 1 else None


def _fold(graph: nx.DiGraph, match: _Match) -> None:
    """Put one ``attention`` node where the merged output was; its readers read the new node instead."""
    k = 0
    while f"attention_{k}" in graph:
        k += 1
    name = f"attention_{k}"
    record = {"op": "attention", "kind": "function", "module": None, "params": {}, "buffers": {},
              "settings": {"heads": match.heads, "head_dim": match.head_dim,
                           "value_head_dim": match.value_head_dim, "form": match.form,
                           "heads_alike": match.heads_alike, "key_shifts": match.key_shifts,
                           "value_shifts": match.value_shifts}
              | ({"kv_heads": match.kv_heads} if match.kv_heads != match.heads else {})
              | ({"rotary": match.rotary} if match.rotary else {}),
              "inputs": match.roots + match.extras, "arguments": {}, "shape": graph.nodes[match.final]["shape"],
              "where": f"node {name!r} (folded attention)"}
    users = [(user, dict(graph.edges[match.final, user])) for user in graph.successors(match.final)]
    for user, _ in users:
        data = graph.nodes[user]
        data["inputs"] = tuple(name if i == match.final else i for i in data["inputs"])
    nodes = [(name, record) if n == match.final else (n, d) for n, d in graph.nodes(data=True)
             if n == match.final or n not in match.folded]
    edges = [(u, v, d) for u, v, d in graph.edges(data=True) if u not in match.folded and v not in match.folded]
    edges += [(root, name, {"index": i}) for i, root in enumerate(match.roots + match.extras)]
    edges += [(name, user, d) for user, d in users]
    attributes = dict(graph.graph)
    graph.clear()
    graph.graph.update(attributes)
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)


# -- rotary position embeddings ----------------------------------------------------------------------------------

_POINTWISE = frozenset({"cos", "sin", "neg", "exp", "log", "abs", "sqrt", "rsqrt", "square", "identity"})
"""Ops computing a fixed function of each entry of their one tensor input (a float cast is an ``identity``): equal
entries stay equal."""
_ARITHMETIC = frozenset({"mul", "div", "add", "sub", "pow"})
"""Entrywise ops of broadcast tensors and numbers: entries computed from equal operands are equal."""
_SOURCE_DEPTH = 64
"""How far back :func:`_value_ids` follows a table's computation."""


def _rotary(graph: nx.DiGraph, name: str) -> _Rotary | None:
    """The rotary step ending at the ``add`` node ``name`` (module docstring), or ``None``."""
    data = graph.nodes[name]
    shape, inputs = data["shape"], data["inputs"]
    if (data["op"] != "add" or len(inputs) != 2 or None in inputs or set(data["arguments"]) != {"arg0", "arg1"}
            or shape is None or not shape or not all(_is_int(n) for n in shape) or shape[-1] % 2):
        return None
    for plain, rotated in (inputs, inputs[::-1]):
        for x, cos in _factors(graph, plain, shape):
            for half, sin in _factors(graph, rotated, shape):
                nodes = _rotate_half(graph, half, x, shape)
                if nodes is None or graph.nodes[x]["shape"] != shape:
                    continue
                nodes |= {name, plain, rotated}
                if x in nodes or any(set(graph.successors(n)) - nodes for n in nodes - {name}) or \
                        set(graph.successors(x)) - nodes:
                    return None
                tables = (cos, sin)
                return _Rotary(x, name, frozenset(nodes), tables, all(_equal_halves(graph, t) for t in tables))
    return None


def _factors(graph: nx.DiGraph, name: str, shape: tuple) -> list[tuple[str, str]]:
    """``[(a, b), (b, a)]`` for ``name = a * b`` of two tensors of which ``b`` broadcasts to ``shape`` (the
    product's own), else ``[]``."""
    data = graph.nodes[name]
    inputs = data["inputs"]
    if (data["op"] != "mul" or len(inputs) != 2 or None in inputs or set(data["arguments"]) != {"arg0", "arg1"}
            or data["shape"] != shape):
        return []
    return [(a, b) for a, b in (inputs, inputs[::-1]) if _broadcasts(graph.nodes[b]["shape"], shape)]


def _broadcasts(small: tuple | None, shape: tuple) -> bool:
    return small is not None and len(small) <= len(shape) and all(
        _is_int(n) and n in (1, m) for n, m in zip(small[::-1], shape[::-1]))


def _rotate_half(graph: nx.DiGraph, name: str, x: str, shape: tuple) -> set[str] | None:
    """The nodes of ``cat(−x[…, m:], x[…, :m], −1)`` ending at ``name`` (``m`` half the last axis), checked by replay
    on ``arange(1, n + 1)`` (so that a missing or misplaced negation shows), or ``None``."""
    data = graph.nodes[name]
    inputs, arguments = data["inputs"], data["arguments"]
    dim = arguments.get("dim", arguments.get("arg1", 0))
    if data["op"] != "cat" or len(inputs) != 2 or None in inputs or dim not in (-1, len(shape) - 1):
        return None
    negated, low = inputs
    neg = graph.nodes[negated]
    if neg["op"] != "neg" or not _single_input(neg):
        return None
    high = neg["inputs"][0]
    if any(graph.nodes[s]["inputs"][:1] != (x,) or not _single_input(graph.nodes[s]) for s in (high, low)):
        return None
    index = torch.arange(1, math.prod(shape) + 1, dtype=torch.int64).reshape(shape)
    m = shape[-1] // 2
    try:
        replayed = torch.cat((-_sliced(graph, high, index), _sliced(graph, low, index)), -1)
    except _REPLAY_ERRORS:
        return None
    if not _same(replayed, torch.cat((-index[..., m:], index[..., :m]), -1)):
        return None
    return {name, negated, high, low}


def _sliced(graph: nx.DiGraph, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` sliced as the node ``name`` slices its input (``aten.slice(x, dim, start, end, step)`` or ``x[…]``
    with slices only), checked against the recorded shape. A bound fx recorded as a node (``x.shape[-1] // 2``) is
    read off that shape: with step 1 one unknown bound is determined by the length (module docstring)."""
    data = graph.nodes[name]
    arguments, out = data["arguments"], data["shape"]
    if out is None or len(out) != tensor.dim():
        raise ValueError(f"{name}: no shape, or a slice that changes the rank")
    if data["op"] == "aten.slice":
        dim = arguments.get("arg1", 0)
        bounds = tuple(arguments.get(f"arg{i}", default) for i, default in ((2, None), (3, None), (4, 1)))
        if not _is_int(dim) or not all(b is None or _is_int(b) for b in bounds):
            raise ValueError(f"{name}: slice{bounds} along {dim} not recorded")
        items: tuple = (slice(None),) * (dim % tensor.dim()) + (slice(*bounds),)
    elif data["op"] == "getitem":
        index = arguments.get("arg1")
        items = index if isinstance(index, tuple) else (index,)
        if items.count(Ellipsis) > 1 or not all(i is Ellipsis or isinstance(i, slice) for i in items):
            raise ValueError(f"{name}: index {index} is not slices")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items = items[:at] + (slice(None),) * (tensor.dim() - len(items) + 1) + items[at + 1:]
        items = tuple(_resolved(i, tensor.shape[axis], out[axis]) for axis, i in enumerate(items))
    else:
        raise ValueError(f"{name}: {data['op']} is not a slice")
    result = tensor[items]
    if tuple(result.shape) != tuple(out):
        raise ValueError(f"{name}: replayed shape {tuple(result.shape)} is not the recorded {tuple(out)}")
    return result


def _resolved(item: slice, length: int, out: int) -> slice:
    """``item`` with a bound recorded as a node (not an ``int``) replaced by the one value giving ``out`` entries of
    ``length`` (step 1; both bounds unknown only for the whole axis)."""
    start, stop, step = item.start, item.stop, item.step
    known = [b is None or _is_int(b) for b in (start, stop)]
    if all(known):
        return item
    if step not in (None, 1):
        raise ValueError(f"slice {item} with a step and a bound not recorded")
    if not any(known):
        if out != length:
            raise ValueError(f"slice {item}: bounds not recorded")
        return slice(None)
    if known[1]:
        end = range(length)[slice(None, stop)].stop if stop is not None else length
        return slice(end - out, end)
    begin = range(length)[slice(start, None)].start if start is not None else 0
    return slice(begin, begin + out)


def _equal_halves(graph: nx.DiGraph, table: str) -> bool:
    """The table's entries are equal on the two halves of its last axis (or it does not vary along that axis),
    proven by :func:`_value_ids`."""
    shape = graph.nodes[table]["shape"]
    if shape is None or not shape or shape[-1] == 1:
        return shape is not None
    ids = _value_ids(graph, table, _SOURCE_DEPTH)
    m = shape[-1] // 2
    return ids is not None and not shape[-1] % 2 and torch.equal(ids[..., :m], ids[..., m:])


def _value_ids(graph: nx.DiGraph, name: str, depth: int) -> torch.Tensor | None:
    """Integer ids of the entries of ``name`` (of its recorded shape) such that equal ids are provably equal values
    (distinct ids may still be equal values), or ``None`` when nothing is known.

    ``cat((f, f), -1)`` gives ``cat((I, I), -1)`` with ``I`` distinct ids for ``f``; a pointwise op or arithmetic
    with a number keeps its input's ids; arithmetic of tensors numbers the distinct tuples of its operands' ids
    (broadcast to its shape); a layout op is replayed on its input's ids. Any other node gets distinct ids."""
    data = graph.nodes[name]
    shape, inputs, op = data["shape"], data["inputs"], data["op"]
    if shape is None or not all(_is_int(n) for n in shape):
        return None
    distinct = _index(shape).to(torch.int64)
    tensors = [i for i in inputs if i is not None]
    if depth == 0 or not tensors or data["kind"] != "function":   # a module named like an op is not that op
        return distinct
    dim = data["arguments"].get("dim", data["arguments"].get("arg1"))
    if op == "cat" and len(inputs) == 2 and inputs[0] == inputs[1] and dim in (-1, len(shape) - 1):
        half = graph.nodes[inputs[0]]["shape"]
        if half is None or (*half[:-1], 2 * half[-1]) != tuple(shape):
            return distinct
        ids = _index(half).to(torch.int64)
        return torch.cat((ids, ids), -1)
    if op in _POINTWISE and len(tensors) == 1 and graph.nodes[tensors[0]]["shape"] == shape:
        return _value_ids(graph, tensors[0], depth - 1)
    if op in _ARITHMETIC:
        operands = [_value_ids(graph, t, depth - 1) for t in tensors]
        if any(o is None or not _broadcasts(tuple(o.shape), shape) for o in operands):
            return distinct
        stacked = torch.stack([o.expand(shape) for o in operands if o is not None], -1)
        return torch.unique(stacked.reshape(-1, len(operands)), dim=0, return_inverse=True)[1].reshape(shape)
    if _is_layout(data):
        source = _value_ids(graph, tensors[0], depth - 1)
        replayed = _replay(graph, source, (name,)) if source is not None else None
        return replayed if replayed is not None else distinct
    return distinct
