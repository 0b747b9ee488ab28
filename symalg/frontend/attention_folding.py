"""Fold multi-head attention written out op by op into one ``attention`` node of a
:class:`~symalg.frontend.tracing.ModelGraph`.

A root value ``X`` of shape ``(…, F)`` (typically a ``q``, ``k`` or ``v`` linear's output, ``x @ W.T``, or a
packed in-projection read three times) is *split into heads* by a chain of layout ops and cuts whose result
``X_split`` has shape ``(*I, L, d)``: each *instance* ``n`` (an index of the leading axes ``I``) reads one head
``h(n)`` of ``X``, ``d`` consecutive feature columns from the head's first column ``c_h`` (the *column map*), at
``L`` rows ``r(n, 0), …, r(n, L−1)`` of ``X`` (a row: an index of the axes before the features, in row-major order):

    X_split[n, i, j] = X[r(n, i), c_{h(n)} + j].

The heads are the distinct first columns, numbered in increasing order, and must be disjoint. The standard split
has ``c_h = o + h·d`` (``o``: the offset of a packed piece; the node's setting ``offsets``); GPT-NeoX's
``view(B, T, H, 3d)`` cut by ``chunk(3, -1)`` has query columns ``c_h = 3hd``, key columns ``3hd + d``, value
columns ``3hd + 2d``, BLOOM's ``view(B, T, H, 3, d)`` read by ``select`` the same, Falcon's ``view(B, T, H + 2, d)``
cut by slices ``c_h = hd`` and one key/value head at ``Hd``, ``(H + 1)d`` (any other map: the setting ``columns``,
each role's first columns). Cuts are replayed like layout ops: ``aten.slice``, ``x[…]`` with integer slices, and
the pieces of ``split``/``chunk`` (Phi-3's ``qkv[..., :d]``, GPTBigCode's ``split((D, d, d), -1)``); the chains
are first read through cuts up to the projection, then, where that does not fold (a piece read elsewhere too),
with the pieces as roots. ``matmul`` broadcasts the instance axes (one key/value head ``(B, 1, L, d)`` read by
every query head), and the scores may be cast to a floating dtype or have their instance axes reshaped (BLOOM's
``view(B·H, L, L) → (B, H, L, L)`` and back) between the product and the softmax.

The standard split ``X.view(B, L, H, d).transpose(1, 2)`` has ``I = (B, H)``, ``h(b, h) = h``,
``r((b, h), i) = b·L + i``; ``nn.MultiheadAttention`` under ``torch.export`` cuts its packed projection
``(L, B, 3E)`` by ``unflatten``/``unsqueeze``/``transpose``/``squeeze``/``select`` and merges batch and heads
(``I = (B·H,)``). Keys and values may have ``G`` heads read by ``r = H/G`` consecutive query heads (grouped-query
attention): the key instance paired with query instance ``n`` reads key/value head ``h(n) // r`` (written
``repeat_interleave(r, dim)``, ``x[:, :, None].expand(…, G, r, L, d_k).reshape(…, H, L, d_k)`` or left to
``sdpa(..., enable_gqa=True)``; the node then has the setting ``kv_heads = G``). Attention per instance and the
inverse merge

    A[n] = softmax(s · Q[n] K[n]ᵀ + M) V[n],   Y[r(n, i), h(n)·d_v + j] = A[n, i, j]

(``Y``'s rows in the query root's row order) is written either with ``F.scaled_dot_product_attention(Q, K, V,
...)`` (any ``attn_mask``, ``is_causal``, ``dropout_p``, ``scale``) or explicitly: ``Q @ Kᵀ`` (``matmul``, ``bmm``,
or ``baddbmm(E, Q, Kᵀ) = E + Q Kᵀ``), then any chain of *score modifiers*, ``softmax`` over the last axis
(in a floating dtype of its own too), optionally ``dropout``, ``nn.Identity`` or a cast (HF's ``.to(q.dtype)``),
then ``@ V``. A modifier combines the scores ``S`` with a number (a Python number, or a value computed from shapes
only such as ``math.sqrt(q.size(-1))``) or with a tensor ``E`` computed without the scores: ``S·E``, ``S/E``,
``E/S``, ``S ± E``, ``E − S`` (a learnable temperature, a T5 relative-position bias, an additive mask) or
``S.masked_fill(mask, c)`` (a causal mask); a modifier may also be a fixed function of each score without
parameters (a pointwise catalogue activation or ``pointwise`` op: Gemma 2's soft cap ``c·tanh(S/c)``). A chain may
also scale by a number (``Q · d^-½``).
Such a pattern becomes one node ``attention(q, k, v, *E)`` reading the three roots and the modifiers' tensors (the
``sdpa`` mask included), with settings ``heads = H``, ``head_dim = d_k``, ``value_head_dim = d_v``, ``form``
(``"sdpa"``/``"explicit"``), ``offsets`` (the first feature column each of ``q, k, v`` reads, where a root is read
in pieces) and two facts about the modifiers:

- ``heads_alike``: every tensor ``E`` is the same for all heads: instances that read the same rows in different
  heads read the same entries of ``E`` (decided by replaying ``E``'s own layout chain from its source, so a
  key-padding mask expanded over the heads is alike), so permuting the heads permutes the scores of a per-head
  ``E`` nowhere, and no dropout acts on the weights (its mask differs between heads);
- ``key_shifts``: a per-query constant added to the scores, ``S_ij + c_i``, is still one after every
  modifier (sums, a factor or divisor constant along the keys, ``masked_fill`` with ``-inf``), so the
  softmax over keys ignores it; ``E/S``, ``masked_fill`` with a finite value and a function of each score
  (``tanh(S + c) ≠ tanh(S) + c``) do not keep it;
- ``value_shifts``: every row of the attention weights sums to 1 (no dropout acts on them: ``sdpa``'s
  ``dropout_p`` is 0, a ``dropout`` after the softmax is off), so ``A_h`` moves by ``1tᵀ`` when ``V_h`` does.
  (A row whose scores are all ``-inf`` is NaN whatever the values.)

The readers of ``Y`` read the node instead. ``Q_h ↦ Q_h g``, ``K_h ↦ K_h g⁻ᵀ`` leaves ``Q_h K_hᵀ``, hence
any function of it and of tensors that do not depend on it, unchanged.

**Rotary position embeddings.** Between the split and ``Q`` (or ``K``) there may be rotary steps

    Y = X·cos + rotate_half(X)·sin,   rotate_half(X) = cat(−X[…, m:], X[…, :m], −1),   m = d_k/2

(``add(mul(X, cos), mul(cat(neg(slice(X)), slice(X)), sin))`` as ``torch.export`` writes Hugging Face's
``apply_rotary_pos_emb``; ``x[..., :m]``, ``torch.cat((-x2, x1), dim=-1)`` in fx; either operand order of every
``mul`` and of the ``add``), where ``X`` is a head split ``(…, H', L, d_k)`` of the root: the heads along axis
``-3``, each row of the last axis one head's ``d_k`` columns in order (the standard
``X.view(…, L, H, d_k).transpose(-3, -2)``, possibly repeated over the heads, or GPT-NeoX's pieces; checked by
replay, :func:`_head_split`, and each such row is a head of the final split) and ``cos``, ``sin`` are tensors
computed without the attention's inputs that broadcast to ``X``.
``rotate_half`` is checked exactly, sign included, by replaying it on ``arange(1, n + 1)``; the steps' nodes are
folded, the tables become further inputs of the node (nothing may move them), and the node gets the
setting ``rotary = {"queries", "keys": bool, "pairing": "halves", "equal_halves": bool}``. ``equal_halves`` says
that every table is proven equal on the two halves of the last axis (``cos[…, j] = cos[…, j + m]``): then each
plane ``(j, j + m)`` is multiplied by the complex number ``cos_j + i sin_j`` and the head's query/key group is
:class:`~symalg.catalogue.groups.ComplexScaling` (see there). The proof is structural: the table is computed from
``cat((f, f), -1)`` through pointwise functions, numbers, products of such tables and layout ops, replayed on
index tensors whose equal entries stand for equal values (:func:`_value_ids`); a table that is a parameter, a
buffer or anything else is not proven. The tables are ``heads_alike`` when they do not vary along axis ``-3``.
*Partial* rotary embeddings (GPT-NeoX's ``rotary_ndims``, Phi's ``partial_rotary_factor``, StableLM) rotate the
first ``r < d_k`` coordinates only, ``cat((rope(X[…, :r]), X[…, r:]), −1)`` (:func:`_partial_rotary`: both slices
replayed exactly on ``X``'s index tensor, ``X`` read by them alone, the rotated part first); the setting then has
``"dims": r`` (``None`` where the queries and keys are rotated on different coordinates), the tables are checked on
the halves of their own ``r`` coordinates, and the key bias still translates (``key_shifts``) since it can move on
the ``d_k − r`` coordinates no step rotates. Interleaved pairs (GPT-J's ``rotate_every_two``), the passed
coordinates first or the trailing ones rotated do not match: the heads are not folded and their split blocks the
sites.

**Returned probabilities.** The probabilities ``P = softmax(…)`` (after the dropout, when there is one, eval mode
or ``p = 0`` only) may have readers outside the pattern (Hugging Face's ``output_attentions``, the averaged weights
of ``nn.MultiheadAttention``). Then the node has two results, read through ``getitem`` nodes ``attention_k_output``
and ``attention_k_probabilities``, and the setting ``probabilities``: ``"heads"`` where the value read outside has
the heads on axis ``-3`` (``(…, H, L_q, L_k)``, reached from ``P`` by a layout chain, such as export's
``view(B, H, L, S)`` of ``(B·H, L, S)``, which is folded too), else ``"merged"``.

The layout chains between a root and ``Q``/``Kᵀ``/``V`` (and between ``A`` and ``Y``, ``P`` and its head layout)
are ``reshape``, ``flatten``, ``unsqueeze``, ``squeeze``, ``transpose``, ``permute``, ``identity``, ``expand``,
``repeat_interleave``, ``select`` and ``getitem`` nodes (whole slices and new axes only). Such a chain moves
entries without changing them, so it is checked exactly by *replaying* it on the index tensor
``arange(n).reshape(shape of the root)`` (reshapes to their recorded shapes, transposes, permutes and selections
with their recorded arguments) and reading ``r``, ``h`` and the feature columns off the replayed indices. The
pattern folds only where every head's instances read the same rows (each query row once per head), keys and values
are paired row by row, and the merge puts every entry of ``A`` where ``Y`` above says. The recorded shapes come from
shape propagation, so nothing is folded without example inputs; nor where any check fails, or where a folded value
(but ``Y`` and the probabilities) has a reader outside the pattern: folding never guesses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import EllipsisType
from typing import Mapping, TypeGuard

import networkx as nx
import torch

from symalg.catalogue.activations import CATALOGUE
from symalg.catalogue.rules import capable
from symalg.catalogue.rules._base import dropout_active
from symalg.ir.graph import only_user

__all__ = ["fold_attention", "dropout_active"]


_REPLAY_ERRORS = (RuntimeError, IndexError, TypeError, ValueError)


@dataclass(frozen=True)
class _Rotary:
    """One rotary step ``output = x·cos + rotate_half(x)·sin`` (module docstring): the nodes it consists of (``x`` and
    the tables excluded), its ``(cos, sin)`` tables, whether both are proven equal on the halves of their last axis,
    and how many leading coordinates of ``x``'s last axis it rotates (``dims``; the rest pass unchanged)."""

    x: str
    output: str
    nodes: frozenset[str]
    tables: tuple[str, str]
    equal_halves: bool
    dims: int


@dataclass(frozen=True, eq=False)
class _Split:
    """A root ``(…, features)`` read by ``chain`` as ``(*I, L, width)``: per instance, its head (``head``, shape
    ``I``) and the root rows it reads (``rows``, shape ``(*I, L)``); head ``h`` reads the feature columns
    ``[starts[h], starts[h] + width)`` (the column map; ``starts`` ascending, the heads disjoint).
    ``rotations``: the rotary steps of the chain (each acting on a head split of the root, :func:`_head_split`)."""

    root: str
    chain: tuple[str, ...]
    width: int
    starts: tuple[int, ...]
    head: torch.Tensor
    rows: torch.Tensor
    rotations: tuple[_Rotary, ...] = ()

    @property
    def length(self) -> int:
        return self.rows.shape[-1]

    @property
    def heads(self) -> int:
        return len(self.starts)


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
    """One attention pattern: the roots, the head layout, the nodes it replaces, the merged output and, where they
    are read outside, the probabilities (the node whose readers read them, and their layout)."""

    roots: tuple[str, str, str]
    columns: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
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
    probabilities: str | None = None
    layout: str | None = None
    rotary: dict | None = None


@dataclass(frozen=True)
class _Unfolded:
    """A pattern that matches but for a value read outside it: the nodes of its head splits, and why."""

    nodes: tuple[str, ...]
    reason: str


def scale_constant(value: object) -> bool:
    """True for a Python number (the only non-tensor operand of ``mul``/``div`` we treat as linear)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fold_attention(graph: nx.DiGraph) -> nx.DiGraph:
    """A pass: a copy of ``graph`` with every multi-head attention written out replaced by one ``attention``
    node; patterns that do not match exactly (see the module docstring) are left as they are.
    """
    graph = graph.copy()
    for name in list(graph):
        if name not in graph:
            continue
        op = graph.nodes[name]["op"]
        match = _match_sdpa(graph, name) if op == "sdpa" else _match_explicit(graph, name) if op == "softmax" else None
        if isinstance(match, _Match):
            _fold(graph, match)
        elif match is not None:   # the head splits, left as they are, say why (the rules' notes quote it)
            for node in match.nodes:
                graph.nodes[node]["settings"] = dict(graph.nodes[node]["settings"], unfolded=match.reason)
    return graph


def _match_sdpa(graph: nx.DiGraph, name: str) -> _Match | _Unfolded | None:
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


def _match_explicit(graph: nx.DiGraph, name: str) -> _Match | _Unfolded | None:
    """``softmax(c · q @ kᵀ, -1)`` (optionally dropped out) ``@ v``, found from its ``softmax`` node."""
    data = graph.nodes[name]
    shape = data["shape"]
    dim = data["settings"].get("dim", data["arguments"].get("dim", data["arguments"].get("arg1")))
    if (shape is None or not _single_input(data) or isinstance(dim, bool) or dim not in (-1, len(shape) - 1)
            or any(isinstance(v, torch.dtype) and not v.is_floating_point for v in data["arguments"].values())):
        return None    # (a floating dtype, ViT's softmax in float32, changes values by rounding only)
    path = _scores_path(graph, data["inputs"][0])
    if path is None:
        return None
    scores, modifiers = path
    body = {name, scores} | {m.node for m in modifiers}
    probabilities, random = name, False
    while (after := only_user(graph, probabilities)) is not None and (
            _instances_reshaped(graph, after) or
            graph.nodes[after]["op"] in ("dropout", "identity") and _single_input(graph.nodes[after])):
        probabilities, random = after, random or dropout_active(graph.nodes[after])
        body.add(probabilities)
    readers = [u for u in graph.successors(probabilities) if _weighs_values(graph.nodes[u], probabilities)]
    operands = _scores_operands(graph.nodes[scores])
    if len(readers) != 1 or operands is None:
        return None
    user = readers[0]
    outside = set(graph.successors(probabilities)) - {user}
    if outside and random:
        return None
    body.add(user)
    if any(only_user(graph, n) not in body for n in body - {user, probabilities}):
        return None
    q, k = operands
    return _match_core(graph, q, k, graph.nodes[user]["inputs"][1], user, body, "explicit", modifiers,
                       keys_transposed=True, probabilities=probabilities if outside else None, value_shifts=not random)


def _weighs_values(data: dict, probabilities: str) -> bool:
    """``probabilities @ v``."""
    inputs = data["inputs"]
    return data["op"] == "matmul" and len(inputs) == 2 and inputs[0] == probabilities and inputs[1] is not None


def _scores_operands(data: dict) -> tuple[str, str] | None:
    """``(Q, Kᵀ)`` of ``Q @ Kᵀ`` (``matmul``, ``bmm``) or ``baddbmm(E, Q, Kᵀ)``."""
    inputs = tuple(data["inputs"])
    count = {"matmul": 2, "baddbmm": 3}.get(data["op"])
    if count is None or len(inputs) < count or None in inputs[count - 2:count] or any(
            i is not None for i in inputs[count:]):    # (``torch.export`` records ``baddbmm``'s factors as constants)
        return None
    return inputs[count - 2], inputs[count - 1]


def _scores_path(graph: nx.DiGraph, name: str) -> tuple[str, tuple[_Modifier, ...]] | None:
    """The product computing the scores that reach ``name`` through score modifiers (each read by the next
    only), and those modifiers; ``None`` where there is no such chain. ``baddbmm(E, Q, Kᵀ) = E + Q Kᵀ`` (its
    factors ``α``, ``β`` numbers) is the product and the modifier ``+ E``."""
    data = graph.nodes[name]
    if data["op"] == "matmul":
        return name, ()
    if data["op"] == "baddbmm":
        if data["inputs"][:1] == (None,) or not all(scale_constant(v) for k, v in data["arguments"].items()
                                                    if k in ("beta", "alpha")) \
                or set(data["arguments"]) - {"arg0", "arg1", "arg2", "beta", "alpha"}:
            return None
        return name, (_Modifier(name, name, data["inputs"][0], True),)
    options = [_Modifier(name, data["inputs"][0], None, True)] if _instances_reshaped(graph, name) or \
        _float_cast(data) else _modifier_options(graph, name)
    for modifier in options:
        rest = _scores_path(graph, modifier.scores) if only_user(graph, modifier.scores) == name else None
        if rest is not None:
            return rest[0], (modifier,) + rest[1]
    return None


def _instances_reshaped(graph: nx.DiGraph, name: str) -> bool:
    """``name`` reshapes the instance axes of scores or weights ``(*I, L_q, L_k)`` only (BLOOM's ``view`` of
    ``(B·H, L, L)`` as ``(B, H, L, L)`` and back): the entries keep their row-major order, so an instance keeps its
    number; a score modifier that changes no value."""
    data = graph.nodes[name]
    if data["op"] != "reshape" or not _is_layout(data):
        return False
    shape, before = data["shape"], graph.nodes[data["inputs"][0]]["shape"]
    return (isinstance(shape, tuple) and isinstance(before, tuple) and len(shape) >= 3 and len(before) >= 3
            and shape[-2:] == before[-2:] and math.prod(shape) == math.prod(before))


def _float_cast(data: dict) -> bool:
    """A cast of the scores to a floating dtype (MPT's ``.float()`` before the softmax): it changes values by
    rounding only (the fold records the lowest precision for the certification's tolerance)."""
    dtypes = [v for v in data["arguments"].values() if isinstance(v, torch.dtype)]
    return data["op"] == "identity" and _single_input(data) and len(dtypes) == 1 and dtypes[0].is_floating_point


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
    if _fixed_function(data) and graph.nodes[inputs[0]]["shape"] == shape:
        return [_Modifier(name, inputs[0], None, False)]   # c·tanh(S/c): S_ij + t_i does not pass tanh
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


def _fixed_function(data: dict) -> bool:
    """A fixed function of each entry of one tensor, without parameters: a pointwise activation of the catalogue
    (``tanh``, not a radial one) or an op registered ``pointwise`` (``exp``, ``neg``)."""
    entry = CATALOGUE.get(data["op"])
    return (_single_input(data) and not data["params"] and not data["buffers"]
            and (capable(data["op"], "pointwise") or entry is not None and not entry.radial))


def _match_core(graph: nx.DiGraph, q: str, k: str, v: str, out: str, body: set[str], form: str,
                modifiers: tuple[_Modifier, ...], keys_transposed: bool, repeats_keys: bool = False,
                probabilities: str | None = None, value_shifts: bool = False) -> _Match | _Unfolded | None:
    """Check the three head splits, their agreement, the output shape, the merge of the heads and, where the
    ``probabilities`` are read outside, their layout. With ``repeats_keys`` (``sdpa(..., enable_gqa=True)``) keys
    and values may have fewer heads, which ``sdpa`` repeats by ``repeat_interleave`` along axis ``-3``. A pattern
    that matches but for another value read outside (keys returned in a cache) is :class:`_Unfolded`.

    The head splits are read first through cuts (``aten.slice``, the pieces of ``split``/``chunk``) up to the
    projection they cut, then, where that does not fold (a piece also read elsewhere), with the pieces as roots."""
    unfolded = None
    for cuts in (True, False):
        match = _match_layout(graph, q, k, v, out, body, form, modifiers, keys_transposed, repeats_keys,
                              probabilities, value_shifts, cuts)
        if isinstance(match, _Match):
            return match
        unfolded = unfolded or match
    return unfolded


def _match_layout(graph: nx.DiGraph, q: str, k: str, v: str, out: str, body: set[str], form: str,
                  modifiers: tuple[_Modifier, ...], keys_transposed: bool, repeats_keys: bool,
                  probabilities: str | None, value_shifts: bool, cuts: bool) -> _Match | _Unfolded | None:
    """:func:`_match_core` with head splits read through cuts or not (``cuts``)."""
    queries, keys, values = (_split(graph, q, False, cuts), _split(graph, k, keys_transposed, cuts),
                             _split(graph, v, False, cuts))
    if queries is None or keys is None or values is None or values.rotations:
        return None
    if repeats_keys and keys.heads != queries.heads:
        keys, values = _repeated(keys, queries.heads), _repeated(values, queries.heads)
        if keys is None or values is None:
            return None
    if form == "explicit":   # ``matmul`` broadcasts the instance axes (one key/value head read by every query head)
        keys, values = _broadcast(keys, queries.head.shape), _broadcast(values, queries.head.shape)
        if keys is None or values is None:
            return None
    instances, heads, groups = queries.head.shape, queries.heads, keys.heads
    if (keys.head.shape != instances or values.head.shape != instances or keys.width != queries.width
            or values.heads != groups or heads % groups or not torch.equal(values.head, keys.head)
            or not torch.equal(keys.head, queries.head // (heads // groups))
            or graph.nodes[keys.root]["shape"][:-1] != graph.nodes[values.root]["shape"][:-1]
            or not torch.equal(keys.rows, values.rows)
            or graph.nodes[out]["shape"] != (*instances, queries.length, values.width)):
        return None
    slots = _slots(queries, keys)
    merge = _merge(graph, out, queries, values.width)
    if slots is None or merge is None:
        return None
    rotations = queries.rotations + keys.rotations
    folded = set(body) | set(queries.chain) | set(keys.chain) | set(values.chain) | set(merge) | {
        n for r in rotations for n in r.nodes}
    final = merge[-1] if merge else out
    ends = {final}
    layout = None
    if probabilities is not None:
        chain, layout = _probabilities_layout(graph, probabilities, folded, queries, keys.length, slots)
        folded |= set(chain)
        probabilities = chain[-1] if chain else probabilities
        ends.add(probabilities)
    roots = (queries.root, keys.root, values.root)
    if any(r in folded for r in roots):
        return None
    leaks = [(n, u) for n in sorted(folded - ends) for u in graph.successors(n) if u not in folded]
    if leaks:
        node, reader = leaks[0]
        splits = queries.chain + keys.chain + values.chain
        return _Unfolded(splits, f"the attention at node {out!r} is not folded: node {node!r} is also read by "
                                 f"{_reader(graph, node, reader)}")
    masks = tuple(dict.fromkeys(m.extra for m in modifiers if m.extra is not None))
    tables = tuple(dict.fromkeys(t for r in rotations for t in r.tables))
    extras = tuple(dict.fromkeys(masks + tables))
    if any((nx.ancestors(graph, e) | {e}) & (folded | set(roots)) for e in extras):
        return None    # a modifier computed from the scores or the attention's own inputs
    if any(graph.nodes[e]["shape"] is None for e in extras):
        return None
    scores = (*instances, queries.length, keys.length)
    heads_alike = value_shifts and all(   # a modifier's own shape: the scores, their instance axes reshaped perhaps
        _alike(graph, m.extra, graph.nodes[m.node]["shape"] if form == "explicit" else scores, queries, slots)
        for m in modifiers if m.extra is not None) and all(
        len(s) < 3 or s[-3] == 1 for s in (graph.nodes[t]["shape"] for t in tables))   # dropout masks differ
    rotary = None if not rotations else {
        "queries": bool(queries.rotations), "keys": bool(keys.rotations), "pairing": "halves",
        "equal_halves": all(r.equal_halves for r in rotations)}
    dims = {r.dims for r in rotations}
    if rotary and dims != {queries.width}:   # partial: the first ``dims`` coordinates rotated (None: not alike)
        rotary["dims"] = dims.pop() if len(dims) == 1 else None
    # R_j b_k varies with the key j: a key bias translates on coordinates no step rotates only
    key_shifts = all(m.key_shifts for m in modifiers) and (not keys.rotations or bool(rotary and rotary.get("dims")))
    columns = (queries.starts, keys.starts, values.starts)
    return _Match(roots, columns, extras, heads_alike, key_shifts, value_shifts, heads, groups, queries.width,
                  values.width, form, frozenset(folded), final, probabilities, layout, rotary)


def _reader(graph: nx.DiGraph, node: str, reader: str) -> str:
    """``reader`` as a note names it: the model output by its path (and hint) where the tracer named it."""
    data = graph.nodes[reader]
    names = data["settings"].get("outputs", ())
    if data["op"] != "output":
        return f"node {reader!r}"
    return f"the model output {names[data['inputs'].index(node)]}" if len(names) == len(data["inputs"]) else \
        "the model output"


def _split(graph: nx.DiGraph, name: str, transposed: bool, cuts: bool = False) -> _Split | None:
    """The longest chain of layout ops, scalings, rotary steps and, with ``cuts``, cuts (:func:`_is_cut`) ending at
    ``name`` that splits its root into heads (``None`` if none does); a node above ``name`` may have several readers
    where all of them are such steps (the pieces of a packed projection); the input of a rotary step is read by that
    step's nodes alone.

    With ``transposed`` the chain must end in the split's transpose on its last two axes (``Kᵀ``).
    """
    path: list[str] = []
    rotations: dict[str, _Rotary] = {}
    node, readers = name, None      # readers: who must read ``node`` (None: layout ops or scalings)
    while node == name or (set(graph.successors(node)) == readers if readers is not None else
                           all(_is_step(graph.nodes[u], graph, cuts) for u in graph.successors(node))):
        if _is_step(graph.nodes[node], graph, cuts):
            path.append(node)
            node, readers = _operand(graph.nodes[node], graph), None
        elif (rotary := _rotary(graph, node) or _partial_rotary(graph, node)) is not None:
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
    # one head, no layout step at all: ``name`` is its own root ``(*I, L, d)`` (``q(x) @ k(x).transpose(-2, -1)``)
    return None if transposed or path else _check_split(graph, name, (), False, rotations)


def _check_split(graph: nx.DiGraph, root: str, chain: tuple[str, ...], transposed: bool,
                 rotations: Mapping[str, _Rotary]) -> _Split | None:
    """Replay ``chain`` on the root's index tensor and read the instances' heads and rows off it (see the module
    docstring); ``None`` unless every instance reads ``width`` consecutive columns at fixed rows, the instances that
    start at the same column being one head and the heads' columns disjoint. A rotary step keeps every entry's place
    (it mixes entries along the last axis within a head) and must act on a head split (:func:`_head_split`) whose
    rows are heads of the final split."""
    shape, out = graph.nodes[root]["shape"], graph.nodes[chain[-1] if chain else root]["shape"]
    if (shape is None or out is None or not all(_is_int(n) for n in (*shape, *out)) or len(shape) < 2
            or len(out) < 3 or 0 in shape):
        return None    # no shape, or the tuple of shapes of a multi-output op (``split``)
    replayed: torch.Tensor | None = _index(shape)
    rotated: list[tuple[torch.Tensor, int]] = []     # the first columns and width of the heads a rotary step rotates
    for step in chain:
        if replayed is None:
            return None
        if step not in rotations:
            replayed = _replay(graph, replayed, (step,))
        elif (starts := _head_split(replayed, shape[-1])) is None:
            return None     # a rotary step elsewhere than on the heads' coordinates
        else:
            rotated.append((starts, replayed.shape[-1]))
    if replayed is None:
        return None
    replayed = (replayed.transpose(-2, -1) if transposed else replayed).long()
    features, width = shape[-1], replayed.shape[-1]
    rows, columns = replayed // features, replayed % features
    first = columns[..., :1]
    if not (bool((columns == first + torch.arange(width)).all()) and bool((rows == rows[..., :1]).all())
            and bool((first == first[..., :1, :]).all())):
        return None
    start = first[..., 0, 0]
    starts = torch.unique(start)     # sorted: head ``h`` is the ``h``-th first column
    if bool((starts.diff() < width).any()) or any(w != width or not bool(torch.isin(s, starts).all())
                                                 for s, w in rotated):
        return None    # heads overlapping, or a rotation across two heads
    head = torch.searchsorted(starts, start.contiguous())
    return _Split(root, chain, width, tuple(int(c) for c in starts), head, rows[..., 0],
                  tuple(rotations[s] for s in chain if s in rotations))


def _head_split(replayed: torch.Tensor, features: int) -> torch.Tensor | None:
    """The first columns of ``replayed`` (indices of a root with ``features`` columns) where it is a head split
    ``(…, H', L, d)``: along its last axis ``d`` consecutive columns of one root row (a head's coordinates), the
    heads along axis ``-3`` (the same columns whatever the other axes), the rows along the others (the same whatever
    the head). The standard ``root.view(…, L, G, d).transpose(-3, -2)`` (possibly repeated over the heads) is one,
    so is GPT-NeoX's ``view(…, L, H, 3d).transpose(-3, -2).chunk(3, -1)``. ``None`` where it is not."""
    if replayed.dim() < 3:
        return None
    index = replayed.long()
    rows, columns = index // features, index % features
    first = columns[..., :1]
    lead = (0,) * (replayed.dim() - 3)
    if not (bool((columns == first + torch.arange(replayed.shape[-1])).all()) and bool((rows == rows[..., :1]).all())
            and bool((first == first[lead][..., :1, :]).all()) and bool((rows == rows[..., :1, :, :]).all())):
        return None
    return first[lead][:, 0, 0]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def _repeated(split: _Split | None, heads: int) -> _Split | None:
    """``split`` as ``sdpa(..., enable_gqa=True)`` reads it: its axis ``-3`` (the last instance axis) repeated by
    ``repeat_interleave`` up to ``heads``."""
    if split is None or split.head.dim() < 1 or heads % split.head.shape[-1]:
        return None
    r = heads // split.head.shape[-1]
    return _Split(split.root, split.chain, split.width, split.starts, split.head.repeat_interleave(r, -1),
                  split.rows.repeat_interleave(r, -2), split.rotations)


def _broadcast(split: _Split, instances: torch.Size) -> _Split | None:
    """``split`` as ``matmul`` reads it against an operand with instance axes ``instances``: its own broadcast to
    them (``None`` where they do not broadcast)."""
    if split.head.shape == instances:
        return split
    try:
        head = split.head.expand(instances)
        rows = split.rows.expand(*instances, split.length)
    except RuntimeError:
        return None
    return _Split(split.root, split.chain, split.width, split.starts, head, rows, split.rotations)


def _slots(queries: _Split, keys: _Split) -> torch.Tensor | None:
    """Every head's instances read the same query and key rows, each query row once per head: the *slot* of an
    instance (shape ``I``) numbers its rows within its head, so that instances of one slot differ by their head
    only; ``None`` where the heads read differently."""
    head = queries.head.reshape(-1)
    rows = queries.rows.reshape(len(head), -1)
    reads = torch.cat([rows, keys.rows.reshape(len(head), -1)], 1)
    slot, reference = torch.empty_like(head), None
    for h in range(queries.heads):
        members = (head == h).nonzero().squeeze(1)
        read, order = torch.unique(reads[members], dim=0, return_inverse=True)
        once = torch.unique(rows[members]).numel() == rows[members].numel()
        if not once or (reference is not None and not torch.equal(read, reference)):
            return None
        reference, slot[members] = read, order
    return slot.reshape(queries.head.shape)


def _merge(graph: nx.DiGraph, out: str, queries: _Split, width: int) -> tuple[str, ...] | None:
    """The longest layout chain from ``out`` (each node read by the next only) that merges the heads back."""
    index = _index(graph.nodes[out]["shape"])
    numel = index.numel()
    path: list[str] = []
    best = 0 if queries.heads == 1 and _merged(index.long(), queries, width) else None   # one head: no merge
    node = out
    while (user := only_user(graph, node)) is not None and _is_layout(graph.nodes[user]):
        replayed = _replay(graph, index, (user,))
        if replayed is None:
            break
        index = replayed
        path.append(user)
        if index.numel() == numel and _merged(index.long(), queries, width):
            best = len(path)
        node = user
    return tuple(path[:best]) if best is not None else None


def _merged(merged: torch.Tensor, queries: _Split, width: int) -> bool:
    """True when the entry ``A[n, i, j]`` (its flat index in ``merged``) sits at ``Y[r(n, i), h(n)·width + j]``."""
    heads, length = queries.heads, queries.length
    if merged.dim() < 1 or merged.shape[-1] != heads * width:
        return False
    n, i, j = merged // (length * width), merged // width % length, merged % width
    column = torch.arange(heads * width)
    row = torch.arange(merged.numel() // merged.shape[-1]).reshape(*merged.shape[:-1], 1)
    head, rows = queries.head.reshape(-1), queries.rows.reshape(len(queries.head.reshape(-1)), length)
    return bool((j == column % width).all() and (head[n] == column // width).all() and (rows[n, i] == row).all())


def _probabilities_layout(graph: nx.DiGraph, probabilities: str, folded: set[str], queries: _Split, keys: int,
                          slots: torch.Tensor) -> tuple[tuple[str, ...], str]:
    """The probabilities ``P`` of shape ``(*I, L_q, L_k)`` read outside the pattern: the longest layout chain from
    ``P`` (its first node ``P``'s one outside reader, the others read by the next only) after which the heads are
    axis ``-3``, and ``"heads"``; ``((), "merged")`` where neither ``P`` nor any such chain has them there."""
    index = _index(graph.nodes[probabilities]["shape"])
    best: tuple[str, ...] | None = () if _heads_axis(index.long(), queries, keys, slots) else None
    outside = [u for u in graph.successors(probabilities) if u not in folded]
    path: list[str] = []
    user = outside[0] if len(outside) == 1 else None
    while user is not None and _is_layout(graph.nodes[user]):
        replayed = _replay(graph, index, (user,))
        if replayed is None:
            break
        index = replayed
        path.append(user)
        if index.numel() == slots.numel() * queries.length * keys and _heads_axis(index.long(), queries, keys, slots):
            best = tuple(path)
        user = only_user(graph, user)
    return (best, "heads") if best is not None else ((), "merged")


def _heads_axis(layout: torch.Tensor, queries: _Split, keys: int, slots: torch.Tensor) -> bool:
    """True when ``layout`` (flat indices of ``P``) is ``(…, H, L_q, L_k)`` with ``P[n, i, s]`` at head ``h(n)``,
    query ``i``, key ``s``, and the instances along axis ``-3`` differing by their head only (one slot)."""
    length = queries.length
    if layout.dim() < 3 or tuple(layout.shape[-3:]) != (queries.heads, length, keys):
        return False
    n, i, s = layout // (length * keys), layout // keys % length, layout % keys
    head, slot = queries.head.reshape(-1)[n], slots.reshape(-1)[n]
    return bool((i == torch.arange(length)[:, None]).all() and (s == torch.arange(keys)).all()
                and (head == torch.arange(queries.heads)[:, None, None]).all() and (slot == slot[..., :1, :, :]).all())


def _alike(graph: nx.DiGraph, extra: str, scores: tuple[int, ...], queries: _Split, slots: torch.Tensor) -> bool:
    """True when ``extra``, broadcast to the ``scores``, gives the instances of one slot equal entries: entries with
    the same provenance (:func:`_provenance`: a key-padding mask viewed, expanded over the heads, reshaped and added
    to a causal mask) are equal."""
    provenance = _provenance(graph, extra, _PROVENANCE_DEPTH)
    if provenance is None:
        return False
    head, slot = queries.head.reshape(-1), slots.reshape(-1)
    first = torch.empty_like(slot)
    first[slot[head == 0]] = (head == 0).nonzero().squeeze(1)
    for index in provenance:
        try:
            entries = torch.broadcast_to(index, scores).reshape(slots.numel(), -1)
        except RuntimeError:
            return False
        if not torch.equal(entries, entries[first[slot]]):
            return False
    return True


_PROVENANCE_DEPTH = 16


def _provenance(graph: nx.DiGraph, name: str, depth: int) -> list[torch.Tensor] | None:
    """Index tensors of ``name``'s shape naming, per entry, the entries it is computed from: through layout ops
    (replayed) and entry-wise ops (registered ``entrywise``, :mod:`symalg.catalogue.rules`: the masks a model builds,
    ``zeros_like(m).masked_fill_(m, -inf)``, ``causal + padding``; one tensor per operand, broadcast) up to ``depth``
    nodes back; any other node is its own source (``arange``). Two entries with equal provenance are equal. ``None``
    without shapes."""
    data = graph.nodes[name]
    shape = data["shape"]
    if not isinstance(shape, tuple) or not all(_is_int(n) for n in shape):
        return None
    sources = [i for i in data["inputs"] if i is not None]
    if depth and _is_layout(data):
        inner = _provenance(graph, sources[0], depth - 1) or []
        replayed = [_replay(graph, index, (name,)) for index in inner]
        if inner and all(index is not None for index in replayed):
            return [index for index in replayed if index is not None]
    elif depth and capable(data["op"], "entrywise") and sources:
        parts = [_provenance(graph, source, depth - 1) for source in sources]
        if all(part is not None for part in parts):
            try:
                return [torch.broadcast_to(index, shape) for part in parts if part is not None for index in part]
            except RuntimeError:   # an operand that does not broadcast (no such op runs): the node's own entries
                pass
    return [_index(shape)]


def _index(shape: tuple[int, ...]) -> torch.Tensor:
    """``arange(n).reshape(shape)``: every entry names its position."""
    numel = torch.Size(shape).numel()
    return torch.arange(numel, dtype=torch.int32 if numel < 2 ** 31 else torch.int64).reshape(shape)


def _replay(graph: nx.DiGraph, tensor: torch.Tensor, chain: tuple[str, ...]) -> torch.Tensor | None:
    """Apply a chain of layout ops and scalings to ``tensor``; ``None`` where an op cannot be replayed or a shape
    disagrees."""
    for name in chain:
        data = graph.nodes[name]
        if data["shape"] is None:
            return None
        try:
            if data["op"] in ("reshape", "flatten", "unsqueeze", "squeeze"):
                tensor = tensor.reshape(data["shape"])
            elif data["op"] in ("split", "chunk"):
                continue     # the pieces are cut by their ``getitem``
            elif data["op"] == "getitem" and graph.nodes[data["inputs"][0]]["op"] in ("split", "chunk"):
                tensor = _piece(graph.nodes[data["inputs"][0]], data["arguments"].get("arg1"), tensor)
            elif data["op"] == "aten.slice":
                tensor = _sliced(graph, name, tensor)
            elif data["op"] == "getitem":
                tensor = tensor[_plain_index(data["arguments"])]
            elif data["op"] == "expand":
                tensor = tensor.expand(data["shape"])
            elif data["op"] == "repeat_interleave":
                tensor = tensor.repeat_interleave(*_repeats(data["arguments"]))
            elif data["op"] == "transpose":
                tensor = tensor.transpose(*_transpose_dims(data["arguments"]))
            elif data["op"] == "permute":
                tensor = tensor.permute(_permute_dims(data["arguments"]))
            elif data["op"] == "select":
                tensor = tensor.select(*_select(data["arguments"]))
        except _REPLAY_ERRORS:
            return None
        if tuple(tensor.shape) != tuple(data["shape"]):
            return None
    return tensor


def _piece(split: dict, index: object, tensor: torch.Tensor) -> torch.Tensor:
    """Piece ``index`` of ``tensor`` cut as the ``split``/``chunk`` node ``split`` cuts its input (its recorded
    piece shapes, along its ``dim``)."""
    arguments, pieces = split["arguments"], split["shape"]
    dim = arguments.get("dim", arguments.get("arg2", 0))
    if not _is_int(index) or not _is_int(dim) or not 0 <= index < len(pieces):
        raise ValueError(f"piece {index} of a cut along {dim} not recorded")
    start = sum(piece[dim] for piece in pieces[:index])
    return tensor.narrow(dim, start, pieces[index][dim])


def _plain_index(arguments: dict[str, object]) -> tuple[int | slice | EllipsisType | None, ...]:
    """The index of ``x[…]`` where it is integers, slices with integer bounds, ``None`` (new axes) and ``...`` only
    (``x[:, :, None]``, Phi-3's ``qkv[..., :d]``, BLOOM's ``fused[..., 0, :]``): replayed exactly."""
    index = arguments.get("arg1")
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or _is_int(i) or isinstance(i, slice) and all(
            b is None or _is_int(b) for b in (i.start, i.stop, i.step)) for i in items):
        raise ValueError(f"index {index} is not plain")
    return items


def _repeats(arguments: dict[str, object]) -> tuple[int, int]:
    """``(repeats, dim)`` of ``x.repeat_interleave(repeats, dim)`` with a number of repeats and a dimension."""
    repeats, dim = arguments.get("repeats", arguments.get("arg1")), arguments.get("dim", arguments.get("arg2"))
    if _is_int(repeats) and _is_int(dim):
        return repeats, dim
    raise ValueError(f"repeat_interleave{(repeats, dim)} not recorded")


def _select(arguments: dict[str, object]) -> tuple[int, int]:
    """``(dim, index)`` of ``x.select(dim, index)``."""
    dim, index = arguments.get("dim", arguments.get("arg1")), arguments.get("index", arguments.get("arg2"))
    if _is_int(dim) and _is_int(index):
        return dim, index
    raise ValueError(f"select{(dim, index)} not recorded")


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
    return (capable(data["op"], "layout") and _single_input(data)
            and not any(isinstance(v, torch.dtype) for v in data["arguments"].values()))


def _is_step(data: dict, graph: nx.DiGraph, cuts: bool = False) -> bool:
    """A layout op, a concatenation with empty tensors only (an empty key/value cache), or one tensor times
    (divided by) a nonzero number, ``q · d^-½``: it scales the scores or the values by that number, which every
    action commutes with (the last two replayed as the identity); with ``cuts`` also a cut (:func:`_is_cut`)."""
    inputs, arguments = data["inputs"], data["arguments"]
    if _is_cut(data, graph):
        return cuts
    if data["op"] == "cat":
        shapes = [graph.nodes[i]["shape"] for i in inputs if i is not None]
        return len(shapes) == len(inputs) > 1 and all(isinstance(shape, tuple) for shape in shapes) and \
            sum(0 not in shape for shape in shapes) == 1
    if data["op"] not in ("mul", "div") or len(inputs) != 2 or set(arguments) != {"arg0", "arg1"}:
        return _is_layout(data)
    number = 1 if inputs[0] is not None else 0 if data["op"] == "mul" else None   # not c / x
    return (number is not None and inputs[number] is None and inputs[1 - number] is not None
            and scale_constant(arguments[f"arg{number}"]) and arguments[f"arg{number}"] != 0)


def _is_cut(data: dict, graph: nx.DiGraph) -> bool:
    """A cut of one tensor replayed exactly: ``aten.slice`` with recorded bounds, ``x[…]`` with a slice other than
    ``:`` (:func:`_plain_index`), ``split``/``chunk`` (a tuple of pieces) and the ``getitem`` taking one piece
    (Phi-3's ``qkv[..., :d]``, GPT-NeoX's ``qkv.chunk(3, -1)``, GPTBigCode's ``split((d, d_k, d_k), -1)``)."""
    op, inputs = data["op"], data["inputs"]
    if not _single_input(data):
        return False
    if op == "aten.slice":
        return all(_is_int(v) for k, v in data["arguments"].items() if k != "arg0")
    if op in ("split", "chunk"):
        return isinstance(data["shape"], tuple) and all(isinstance(p, tuple) for p in data["shape"])
    if op != "getitem":
        return False
    if graph.nodes[inputs[0]]["op"] in ("split", "chunk"):
        return _is_int(data["arguments"].get("arg1"))
    try:
        index = _plain_index(data["arguments"])
    except ValueError:
        return False
    return any(isinstance(i, slice) and i != slice(None) for i in index)


def _operand(data: dict, graph: nx.DiGraph) -> str:
    """The tensor a step reads (of a concatenation, the one that is not empty)."""
    return next(i for i in data["inputs"]
                if i is not None and (data["op"] != "cat" or 0 not in graph.nodes[i]["shape"]))


def _fold(graph: nx.DiGraph, match: _Match) -> None:
    """Put one ``attention`` node where the merged output was; its readers read the new node instead (through
    ``getitem`` nodes ``…_output`` and ``…_probabilities`` where the probabilities are read too). The lowest floating
    precision a folded op casts to (ViT's ``softmax(..., dtype=torch.float32)``) is its argument ``dtype``, which
    the certification's tolerance reads."""
    k = 0
    while f"attention_{k}" in graph:
        k += 1
    name = f"attention_{k}"
    settings = {"heads": match.heads, "head_dim": match.head_dim, "value_head_dim": match.value_head_dim,
                "form": match.form, "heads_alike": match.heads_alike, "key_shifts": match.key_shifts,
                "value_shifts": match.value_shifts}
    widths = (match.head_dim, match.head_dim, match.value_head_dim)
    offsets = tuple(starts[0] for starts in match.columns)
    if any(starts != tuple(range(starts[0], starts[0] + len(starts) * width, width))
           for starts, width in zip(match.columns, widths)):
        settings["columns"] = match.columns    # a head reads other columns than the h-th block at an offset
    elif any(offset or graph.nodes[root]["shape"][-1] != len(starts) * width
             for root, offset, starts, width in zip(match.roots, offsets, match.columns, widths)):
        settings["offsets"] = offsets
    if match.kv_heads != match.heads:
        settings["kv_heads"] = match.kv_heads
    if match.rotary:
        settings["rotary"] = match.rotary
    ends = [match.final] + ([match.probabilities] if match.probabilities is not None else [])
    shapes = tuple(graph.nodes[end]["shape"] for end in ends)
    if match.probabilities is not None:
        settings["probabilities"] = match.layout
    casts = [v for n in match.folded for v in graph.nodes[n]["arguments"].values()
             if isinstance(v, torch.dtype) and v.is_floating_point]
    arguments = {"dtype": max(casts, key=lambda dtype: torch.finfo(dtype).eps)} if casts else {}
    records = {name: {"op": "attention", "kind": "function", "module": None, "params": {}, "buffers": {},
                      "settings": settings, "inputs": match.roots + match.extras, "arguments": arguments,
                      "shape": shapes[0] if len(ends) == 1 else shapes, "where": f"node {name!r} (folded attention)"}}
    renamed = {match.final: name}
    if len(ends) > 1:
        for position, (end, suffix, what) in enumerate(zip(ends, ("output", "probabilities"),
                                                           ("output", "attention probabilities"))):
            renamed[end] = f"{name}_{suffix}"
            records[renamed[end]] = {"op": "getitem", "kind": "function", "module": None, "params": {},
                                     "buffers": {}, "settings": {}, "inputs": (name, None),
                                     "arguments": {"arg0": None, "arg1": position}, "shape": shapes[position],
                                     "where": f"node {renamed[end]!r} (the {what} of folded attention {name!r})"}
    users = [(end, user, dict(graph.edges[end, user])) for end in ends for user in graph.successors(end)
             if user not in match.folded]
    for _, user, _ in users:
        data = graph.nodes[user]
        data["inputs"] = tuple(renamed.get(i, i) for i in data["inputs"])
    nodes = []
    for n, d in graph.nodes(data=True):
        if n == match.final:
            nodes += list(records.items())
        elif n not in match.folded:
            nodes.append((n, d))
    edges = [(u, v, d) for u, v, d in graph.edges(data=True) if u not in match.folded and v not in match.folded]
    edges += [(root, name, {"index": i}) for i, root in reversed(list(enumerate(match.roots + match.extras)))]
    edges += [(name, getitem, {"index": 0}) for getitem in records if getitem != name]
    edges += [(renamed[end], user, d) for end, user, d in users]
    attributes = dict(graph.graph)
    graph.clear()
    graph.graph.update(attributes)
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)


# -- rotary position embeddings ----------------------------------------------------------------------------------

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
                return _Rotary(x, name, frozenset(nodes), tables, all(_equal_halves(graph, t) for t in tables),
                               shape[-1])
    return None


def _partial_rotary(graph: nx.DiGraph, name: str) -> _Rotary | None:
    """The rotary step ``cat((rope(x[…, :r]), x[…, r:]), −1)`` ending at the ``cat`` node ``name`` (GPT-NeoX's
    ``rotary_ndims``, Phi's ``partial_rotary_factor``): the first ``r < d`` coordinates rotated, the others passed;
    both slices are checked by replay on ``x``'s index tensor, and ``x`` is read by them alone."""
    data = graph.nodes[name]
    inputs, shape = data["inputs"], data["shape"]
    dim = data["arguments"].get("dim", data["arguments"].get("arg1", 0))
    if (data["op"] != "cat" or len(inputs) != 2 or None in inputs or not shape or not all(_is_int(n) for n in shape)
            or dim not in (-1, len(shape) - 1)):
        return None
    rotated, passed = inputs
    inner = _rotary(graph, rotated)
    if inner is None or not _single_input(graph.nodes[inner.x]) or not _single_input(graph.nodes[passed]):
        return None
    x = graph.nodes[inner.x]["inputs"][0]
    r, index = inner.dims, _index(shape)
    if graph.nodes[passed]["inputs"][0] != x or graph.nodes[x]["shape"] != shape or not 0 < r < shape[-1]:
        return None
    try:
        if not (_same(_sliced(graph, inner.x, index), index[..., :r])
                and _same(_sliced(graph, passed, index), index[..., r:])):
            return None
    except _REPLAY_ERRORS:
        return None
    nodes = inner.nodes | {name, inner.x, passed}
    if any(set(graph.successors(n)) - nodes for n in nodes - {name}) or set(graph.successors(x)) - nodes:
        return None
    return _Rotary(x, name, frozenset(nodes), inner.tables, inner.equal_halves, r)


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
    # a fixed function of each entry (a float cast is an ``identity``; ``|z|``, a catalogue activation): equal entries
    # stay equal
    if (capable(op, "pointwise") or op == "abs") and len(tensors) == 1 and graph.nodes[tensors[0]]["shape"] == shape:
        return _value_ids(graph, tensors[0], depth - 1)
    if capable(op, "arithmetic"):
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
