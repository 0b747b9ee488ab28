"""Rules for attention: folded attention nodes (``attention``) and ``nn.MultiheadAttention``; the per-head groups of
the query/key and value/output spaces (:func:`attention_sites`).

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)
['attention', 'multihead_attention']
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from symalg.catalogue.bindings import Binding, TranslationFamily
from symalg.catalogue.rule_examples import around, split_heads_attention
from symalg.symbolic.inference import ALL, GRANTED, TRANSLATIONS, Inference, Label, Segment, site_stem
from symalg.catalogue.rules._base import (Inputs, NodeData, Value, WeightExpr, _PASSING, _argument, _first, _freeze,
                                          _is_param, unknown_rule)
from symalg.catalogue.rules.dense import _producer_site, _read_as_map
from symalg.catalogue.rules.registry import OpSpellings, register_rule


def _only_into(state: Inference, source: str, node: str) -> bool:
    """``source`` is read by ``node`` alone, possibly through ``split``/``chunk`` and the ``getitem`` of its pieces
    (a packed ``qkv`` projection cut into ``q, k, v``) and through reshapes (GPT-2's ``addmm`` then ``view``)."""
    users = state.users(source)
    return bool(users) and all(user == node or state.graph.nodes[user]["op"] in ("split", "chunk", "getitem")
                               + _PASSING and _only_into(state, user, node) for user in users)


@dataclass(frozen=True)
class HeadColumns:
    """The column map of a head split: query head ``h`` reads the coordinates ``[queries[h], queries[h] + head_dim)``
    of its producer's site, key/value head ``g`` ``[keys[g], keys[g] + head_dim)`` and
    ``[values[g], values[g] + value_head_dim)`` of theirs (GPT-NeoX's packed ``(…, H, 3d)``: ``queries[h] = 3hd``,
    ``keys[h] = 3hd + d``, ``values[h] = 3hd + 2d``)."""

    queries: tuple[int, ...]
    keys: tuple[int, ...]
    values: tuple[int, ...]
    head_dim: int
    value_head_dim: int

    @staticmethod
    def consecutive(heads: int, groups: int, head_dim: int, value_head_dim: int) -> "HeadColumns":
        """Head ``h`` reads the ``h``-th block of its site's coordinates."""
        return HeadColumns(tuple(range(0, heads * head_dim, head_dim)), tuple(range(0, groups * head_dim, head_dim)),
                           tuple(range(0, groups * value_head_dim, value_head_dim)), head_dim, value_head_dim)


def attention_sites(state: Inference, node: str, heads: int, q: list[Binding], k: list[Binding],
                    v: list[Binding] | None, heads_alike: bool = True, key_shifts: bool = True,
                    kv_heads: int | None = None, rotary: Mapping[str, Any] | None = None,
                    value_shifts: bool = False, apart: str = "", columns: HeadColumns | None = None
                    ) -> tuple[Label, Label]:
    """Per head ``GL(d_k)`` on the query/key maps (keys by ``g⁻ᵀ``), per head ``GL(d_v)`` on the
    value map (and the output map's columns, through the returned label), and one permutation of
    heads moving all per-head blocks together (only when the scores of every head are treated alike,
    ``heads_alike``). ``q, k, v`` are the producers' out-bindings (equal lists: one packed producer), each head
    reading the coordinates ``columns`` says (by default the ``h``-th block). Returns the label of the merged output
    (``(…, H·d_v)``) and the label of a per-head value's head axis ``-3`` (the attention probabilities
    ``softmax(s·Q_h K_hᵀ + M)``, ``(…, H, L_q, L_k)``): it carries the head permutations only, since the
    probabilities are invariant under every ``GL`` and key-bias translation here and do not depend on values.

    A permutation of heads (or key/value groups) moves each unit's rows of every producer as one block of
    consecutive rows (:func:`_unit_blocks`): per producer either the units' rows of all its roles together (GPT-NeoX:
    head ``h``'s ``q, k, v`` rows ``[3hd, 3(h+1)d)``) or each role's apart (``[Q | K | V]``); a layout in which
    neither is a sequence of equal blocks gets no permutation.

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
    columns = columns or HeadColumns.consecutive(heads, groups, q[0].width // heads,
                                                 v[0].width // groups if v else 0)
    d_k, d_v = columns.head_dim, columns.value_head_dim
    stem = site_stem([b.tensor for b in q + k + (v or [])], node)  # the attention module's path (``attn``)
    rotation = _rotary_restriction(state, node, rotary)
    key_biases = [b for b in k if len(state.shapes[b.tensor]) == 1] if key_shifts and not (
        rotation and not rotation[0]) else []
    # the leading coordinates a rotary embedding rotates (a blocked one: the whole head)
    rotated = 0 if rotation is None else (rotary or {}).get("dims") or d_k if rotation[0] else d_k
    value_biases = [b for b in v or () if len(state.shapes[b.tensor]) == 1] if value_shifts else []
    segments = []
    for g in range(groups):
        members = range(g * r, (g + 1) * r)
        name = f"{stem}.head{g}" if r == 1 else f"{stem}.group{g}"
        # the coordinates a partial rotary embedding rotates, and the others (the scores are the sum of both parts)
        key = columns.keys[g]
        spans = [(0, d_k, "qk")] if rotated in (0, d_k) else [(0, rotated, "qk.rotated"), (rotated, d_k - rotated,
                                                                                         "qk.passed")]
        for start, width, part in spans:
            qk = state.new_site(node, width, [b.restrict(columns.queries[h] + start, width) for h in members for b in q]
                                + [b.restrict(key + start, width).flipped() for b in k], name=f"{name}.{part}",
                                allowed=(ALL - {"T1"}) | (GRANTED if rotation else set()))
            if rotation is not None and start < rotated:
                state.restrict(qk, rotation[0], node, rotation[1], blocked=rotation[2])
            else:
                state.site(qk).translations.extend(
                    ("T", b.node, TranslationFamily("entries", (b.restrict(key + start, width),)))
                    for b in key_biases)
        if v is None:
            continue
        value = columns.values[g]
        site = state.new_site(node, d_v, [b.restrict(value, d_v) for b in v], name=f"{name}.vo",
                              allowed=(ALL - TRANSLATIONS) | ({"T"} if value_biases else set()))
        state.site(site).translations.extend(("T", b.node, TranslationFamily("entries", (b.restrict(value, d_v),)))
                                             for b in value_biases)
        segments += [Segment(site, h * d_v, d_v) for h in members]
    if v is None:
        return Label.data(), Label(-3, heads, ())
    permutations = []
    if r > 1:
        for g in range(groups):
            moved = _unit_blocks([[(q, columns.queries[h], d_k)] for h in range(g * r, (g + 1) * r)])
            if moved is not None:
                within = state.new_site(node, r, moved, name=f"{stem}.group{g}.heads", allowed={"S"})
                permutations.append(Segment(within, g * r * d_v, r, d_v))
    if groups > 1:
        moved = _unit_blocks([[(q, columns.queries[h], d_k) for h in range(g * r, (g + 1) * r)] +
                              [(k, columns.keys[g], d_k), (v, columns.values[g], d_v)] for g in range(groups)])
        if moved is not None:
            whole = state.new_site(node, groups, moved, name=f"{stem}.heads" if r == 1 else f"{stem}.groups",
                                   allowed={"S"})
            permutations.append(Segment(whole, 0, groups, r * d_v))
    for segment in permutations:
        if not heads_alike:   # ``apart``: the named op that makes the heads differ (a blocked note)
            why = apart or "a mask, bias, temperature or dropout differs between heads"
            state.restrict(segment.site, set(), node, f"{state.where(node)}: {why}, so permuting the heads changes "
                                                      "them", blocked=bool(apart))
    head_axis = tuple(replace(s, offset=s.offset // d_v, block=s.block // d_v) for s in permutations)
    return Label(-1, d_v * heads, tuple(segments + permutations)), Label(-3, heads, head_axis)


Piece = tuple[list[Binding], int, int]
"""``(bindings, start, width)``: coordinates ``[start, start + width)`` of the producer site of ``bindings``."""


def _unit_blocks(units: list[list[Piece]]) -> list[Binding] | None:
    """Bindings under which a permutation of the ``units`` (heads, or key/value groups) moves each unit's pieces to
    the corresponding pieces of its image, or ``None`` where the layout allows no such bindings.

    Per producer (the pieces with equal bindings, the ``i``-th piece of every unit corresponding), a permutation
    moves blocks ``[first + u·size, first + (u + 1)·size)`` of its coordinates; that is the permutation of the
    units when unit ``u``'s pieces tile that block exactly, at the same places within it for every ``u``. All the
    producer's pieces are tried as one block per unit (GPT-NeoX's ``[q_h | k_h | v_h]``), then each piece position
    apart (``[Q | K | V]``)."""
    producers: dict[tuple, list[int]] = {}
    for i, (bindings, _, _) in enumerate(units[0]):
        producers.setdefault(tuple(bindings), []).append(i)
    moved: list[Binding] = []
    for producer, positions in producers.items():
        for parts in ([positions], [[i] for i in positions]):
            blocks = [_block([[unit[i] for i in part] for unit in units]) for part in parts]
            if all(block is not None for block in blocks):
                for first, size in (block for block in blocks if block is not None):
                    moved += [b.restrict(first, len(units) * size).coarsen(size) for b in producer]
                break
        else:
            return None
    return moved


def _block(units: list[list[Piece]]) -> tuple[int, int] | None:
    """``(first, size)`` where unit ``u``'s pieces tile ``[first + u·size, first + (u + 1)·size)``, each at the
    same offset within it as in unit 0; else ``None``."""
    tiles = [sorted((start, width) for _, start, width in unit) for unit in units]
    first = tiles[0][0][0]
    size = sum(width for _, width in tiles[0])
    for u, (unit, tile) in enumerate(zip(units, tiles)):
        base = first + u * size
        ends = [start + width for start, width in tile]
        if tile[0][0] != base or ends[-1] != base + size or any(e != s for e, (s, _) in zip(ends, tile[1:])) or \
                any(start - base != start0 - first for (_, start, _), (_, start0, _) in zip(unit, units[0])):
            return None
    return first, size


def _rotary_restriction(state: Inference, node: str, rotary: Mapping[str, Any] | None) -> tuple | None:
    """``(kinds, reason, blocked)``: what a head's ``qk`` site keeps under the rotary embeddings ``rotary``
    (:func:`attention_sites`), why, and whether that is a limitation; ``None`` without rotary embeddings."""
    if not rotary:
        return None
    where = state.where(node)
    if not (rotary["queries"] and rotary["keys"]):
        side = "queries" if rotary["queries"] else "keys"
        return set(), f"{where}: a rotary embedding rotates the {side} only (not modelled)", True
    if rotary.get("dims", 1) is None:
        return set(), f"{where}: rotary embeddings rotate the queries and keys on different coordinates", True
    if rotary["pairing"] != "halves" or not rotary["equal_halves"]:
        return set(), (f"{where}: the rotary tables are not proven equal on the two halves of the head axis (each "
                       "plane's map may be any 2×2 matrix; the real scalars per plane that commute with it are not "
                       "modelled)"), True
    planes = f"(j, j + {rotary['dims']}/2) of the first {rotary['dims']} coordinates" if rotary.get("dims") else \
        "(j, j + d_k/2)"
    return {"C"}, (f"{where}: rotary embeddings rotate each plane {planes} by a position-dependent angle; only "
                   "complex scalings of the planes commute with every rotation"), False


@register_rule("multihead_attention", capabilities=(),
               spellings={"multihead_attention": OpSpellings(modules=(nn.MultiheadAttention,))},
               examples={"multihead_attention": around(
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


def _map_outputs(state: Inference, node: str, pieces: Sequence[tuple[str, object, tuple[int, ...], int]]
                 ) -> dict | None:
    """The sites of the attention roots ``pieces`` (``(root, label, starts, width)``: its heads read the columns
    ``[start, start + width)``), when each is the whole output of linear maps (out-bindings only, power 1, the site
    still allowing ``GL``) read by ``node`` alone, distinct roots have distinct sites, and no two heads read the same
    column of a root (a query head and a key head sharing columns cannot move them by ``g`` and ``g⁻ᵀ`` at once); else
    ``None``. A root produced by a per-feature map (the gain of a norm over the whole projection, OLMoE's ``q_norm``)
    has lost ``GL`` there: its site is dissolved into the heads' sites, which would not inherit that restriction."""
    sites = {}
    for root, label, _, _ in pieces:
        if not isinstance(label, Label) or len(label.segments) != 1:
            return None
        segment = label.segments[0]
        if segment.power != 1 or (segment.offset, segment.width, segment.block) != (0, label.size, 1):
            return None
        sites[root] = state.site(segment.site)
        if "GL" not in sites[root].allowed:
            return None
    spans = sorted((root, start, start + width) for root, _, starts, width in pieces for start in starts)
    overlapping = any(a[0] == b[0] and b[1] < a[2] for a, b in zip(spans, spans[1:]))
    if overlapping or len({s.id for s in sites.values()}) != len(sites) or \
            not all(_only_into(state, s.node, node) for s in sites.values()) or \
            any(b.role != "out" for site in sites.values() for b in site.bindings):
        return None
    return sites


@register_rule("attention", capabilities={"weights"},
               examples={"attention": around(
    split_heads_attention, shape=(5, 3, 3), query=lambda: torch.nn.Linear(4, 4), key=lambda: torch.nn.Linear(4, 4),
    value=lambda: torch.nn.Linear(4, 4))})
def attention_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """Attention folded by :mod:`symalg.frontend.attention_folding`: the first three inputs are the outputs of the
    ``q``, ``k``, ``v`` maps (each read by nothing else), whose sites are split into heads; a root read by two or
    three of them (a packed in-projection) is cut at the columns they read (settings ``offsets``: head ``h`` of a role
    at ``offset + h·d``; or ``columns``: each head's first column, :class:`HeadColumns`), which must not overlap. The
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
    d_k, d_v = settings["head_dim"], settings["value_head_dim"]
    starts = settings["columns"] if "columns" in settings else tuple(
        tuple(range(offset, offset + n * width, width)) for offset, n, width in
        zip(settings.get("offsets", (0, 0, 0)), (heads, groups, groups), (d_k, d_k, d_v)))
    columns = HeadColumns(starts[0], starts[1], starts[2], d_k, d_v)
    pieces = list(zip(roots, inputs[:3], (columns.queries, columns.keys, columns.values), (d_k, d_k, d_v)))
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
    q, k = (list(sites[root].bindings) for root in roots[:2])
    v = list(sites[roots[2]].bindings) if roots[2] in sites else None
    output, head_axis = attention_sites(state, node, heads, q, k, v, heads_alike=settings.get("heads_alike", True),
                                        key_shifts=settings.get("key_shifts", True), kv_heads=settings.get("kv_heads"),
                                        rotary=settings.get("rotary"), value_shifts=settings.get("value_shifts", False),
                                        columns=columns)
    if "probabilities" not in settings:
        return output
    if settings["probabilities"] != "heads":
        state.restrict_label(head_axis, set(), node, f"{state.where(node)} returns its attention probabilities with "
                                                     "the heads merged into another axis", blocked=True)
        return (output, Label.data())
    return (output, head_axis)
