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
class _Split:
    """A root ``(*lead, length, heads·width)`` split into heads ``(*lead, heads, length, width)`` by ``chain``."""

    root: str
    chain: tuple[str, ...]
    lead: tuple[int, ...]
    heads: int
    length: int
    width: int
    groups: int


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
    if queries is None or keys is None or values is None:
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
    folded = frozenset(body) | set(queries.chain) | set(keys.chain) | set(values.chain) | set(merge)
    final = merge[-1]
    roots = (queries.root, keys.root, values.root)
    if any(r in folded for r in roots) or any(u not in folded for n in folded - {final} for u in graph.successors(n)):
        return None
    extras = tuple(dict.fromkeys(m.extra for m in modifiers if m.extra is not None))
    if any((nx.ancestors(graph, e) | {e}) & (folded | set(roots)) for e in extras):
        return None    # a modifier computed from the scores or the attention's own inputs
    extra_shapes = [graph.nodes[e]["shape"] for e in extras]
    if None in extra_shapes:
        return None
    heads_alike = value_shifts and all(len(s) < 3 or s[-3] == 1 for s in extra_shapes)   # dropout masks differ
    key_shifts = all(m.key_shifts for m in modifiers)
    return _Match(roots, extras, heads_alike, key_shifts, value_shifts, heads, kv_heads, queries.width, values.width,
                  form, folded, final)


def _split(graph: nx.DiGraph, name: str, transposed: bool) -> _Split | None:
    """The longest layout chain ending at ``name`` that splits its root into heads (``None`` if none does).

    With ``transposed`` the chain must end in the split's transpose on its last two axes (``Kᵀ``).
    """
    path = []
    node = name
    while _is_layout(graph.nodes[node]) and graph.out_degree(node) == 1:
        path.append(node)
        node = graph.nodes[node]["inputs"][0]
    path.reverse()
    for start in range(len(path)):
        root = node if start == 0 else path[start - 1]
        split = _check_split(graph, root, tuple(path[start:]), transposed)
        if split is not None:
            return split
    return None


def _check_split(graph: nx.DiGraph, root: str, chain: tuple[str, ...], transposed: bool) -> _Split | None:
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
    expected = index.reshape(*lead, length, groups, width).transpose(-3, -2).repeat_interleave(heads // groups, -3)
    if transposed:
        expected = expected.transpose(-2, -1)
    replayed = _replay(graph, index, chain)
    if replayed is None or replayed.shape != expected.shape or not torch.equal(replayed, expected):
        return None
    return _Split(root, chain, lead, heads, length, width, groups)


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
              | ({"kv_heads": match.kv_heads} if match.kv_heads != match.heads else {}),
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
