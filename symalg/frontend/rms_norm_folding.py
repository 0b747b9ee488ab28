"""Recognise RMS norm written out (Llama's and T5's own ``RMSNorm`` classes) as one ``rms_norm`` node: a pass,
graph → graph, on the canonical ops of :func:`symalg.trace`.

    y = w ⊙ x · rsqrt(mean(x², -1, keepdim=True) + ε)

written as ``pow(x, 2)`` (or ``x.square()``, ``x * x``) → ``mean(-1, keepdim=True)`` → ``+ ε`` → ``rsqrt`` →
``x * ·`` → optionally casts (``identity``) and ``w * ·`` (``w`` a parameter of shape ``(d,)``) becomes
``rms_norm(x, w)`` with settings ``normalized_shape = (d,)`` and ``eps = ε``, which the ``rms_norm`` rule reads
like ``nn.RMSNorm``'s: ``O(d)`` passes a site along the last axis, since ``‖g x‖ = ‖x‖`` for orthogonal ``g``.
Floating casts (``x.to(torch.float32)``) may stand between ``x`` and the square or the product. Nothing else is
folded: the mean must run over the last axis alone and keep it, ``ε`` must be a number ``≥ 0``, and every
intermediate must be read by nothing but the next step (a variance used elsewhere stays as it is).

Example
-------
>>> import torch, symalg
>>> class Norm(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.weight = torch.nn.Parameter(torch.ones(4))
...     def forward(self, x):
...         return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
>>> graph = symalg.trace(Norm(), (torch.randn(2, 4),))
>>> [(graph.node(v)["op"], graph.node(v)["settings"]) for v in graph.nodes if graph.node(v)["kind"] == "function"]
[('rms_norm', {'normalized_shape': (4,), 'eps': 1e-06})]
"""
from __future__ import annotations

from typing import Any, Mapping

import networkx as nx

from symalg.ir.graph import only_user


__all__ = ["fold_rms_norm"]


def fold_rms_norm(graph: nx.DiGraph) -> nx.DiGraph:
    """A copy of ``graph`` with every written-out RMS norm replaced by one ``rms_norm`` node (named like the
    pattern's last node, so that its readers read it)."""
    graph = graph.copy()
    for name in list(graph.nodes):
        if name in graph and graph.nodes[name]["op"] == "rsqrt":
            match = _match(graph, name)
            if match is not None:
                _replace(graph, *match)
    return graph


def _users(graph: nx.DiGraph, name: str) -> list[str]:
    return list(graph.successors(name))


def _sources(data: Mapping[str, Any]) -> list[str]:
    return [i for i in data["inputs"] if i is not None]


def _uncast(graph: nx.DiGraph, name: str) -> tuple[str, list[str]]:
    """``name`` with the floating casts (``identity`` calls) before it skipped, and the casts skipped."""
    casts = []
    while _is_cast(graph.nodes[name]) and len(_sources(graph.nodes[name])) == 1:
        casts.append(name)
        name = _sources(graph.nodes[name])[0]
    return name, casts


def _number(arguments: dict) -> float | None:
    numbers = [v for v in arguments.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(numbers[0]) if len(numbers) == 1 else None


def _argument(arguments: Mapping[str, Any], position: int, name: str) -> Any:
    return arguments.get(name, arguments.get(f"arg{position}"))


def _squared(graph: nx.DiGraph, name: str) -> str | None:
    """The value ``name`` squares (``pow(x, 2)``, ``x.square()``, ``x * x``), else ``None``."""
    data = graph.nodes[name]
    sources = _sources(data)
    if data["op"] == "pow" and len(sources) == 1 and data["inputs"][0] == sources[0] and \
            _argument(data["arguments"], 1, "exponent") == 2:
        return sources[0]
    if data["op"] == "square" and len(sources) == 1 or data["op"] == "mul" and len(data["inputs"]) == 2 and \
            len(set(data["inputs"])) == 1 and sources:
        return sources[0]
    return None


def _is_last_axis_mean(data: Mapping[str, Any], ndim: int) -> bool:
    dim = _argument(data["arguments"], 1, "dim")
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    return data["op"] == "mean" and len(dims) == 1 and isinstance(dims[0], int) and \
        dims[0] % ndim == ndim - 1 and _argument(data["arguments"], 2, "keepdim") is True


def _match(graph: nx.DiGraph, rsqrt: str) -> tuple[str, str | None, float, int, str, list[str]] | None:
    """``(x, weight node or None, eps, d, last node, nodes to remove)`` of the pattern around ``rsqrt``, else
    ``None``."""
    sources = _sources(graph.nodes[rsqrt])
    if len(sources) != 1 or only_user(graph, sources[0]) != rsqrt:
        return None
    add = graph.nodes[sources[0]]
    eps = _number(add["arguments"])
    if add["op"] != "add" or len(_sources(add)) != 1 or eps is None or eps < 0:
        return None
    mean = _sources(add)[0]
    shape = graph.nodes[mean]["shape"]
    if not shape or only_user(graph, mean) != sources[0] or len(_sources(graph.nodes[mean])) != 1 or \
            not _is_last_axis_mean(graph.nodes[mean], len(shape)):
        return None
    square = _sources(graph.nodes[mean])[0]
    base = _squared(graph, square) if only_user(graph, square) == mean else None
    product = only_user(graph, rsqrt)
    if base is None or product is None or graph.nodes[product]["op"] != "mul" or \
            len(graph.nodes[product]["inputs"]) != 2:
        return None
    others = [i for i in graph.nodes[product]["inputs"] if i != rsqrt]
    x, casts = _uncast(graph, base)
    if len(others) != 1 or others[0] is None or _uncast(graph, others[0])[0] != x or not graph.nodes[x]["shape"]:
        return None
    d = graph.nodes[x]["shape"][-1]
    removed = [square, mean, sources[0], rsqrt]
    reader = square
    for cast in casts:  # casts read by the square alone go with it
        if _users(graph, cast) != [reader]:
            break
        removed.append(cast)
        reader = cast
    tail = [product]
    while (following := only_user(graph, tail[-1])) is not None and _is_cast(graph.nodes[following]):
        tail.append(following)
    scale = only_user(graph, tail[-1])
    if scale is not None and graph.nodes[scale]["op"] == "mul" and len(graph.nodes[scale]["inputs"]) == 2:
        other = [i for i in graph.nodes[scale]["inputs"] if i != tail[-1]]
        if len(other) == 1 and other[0] is not None and graph.nodes[other[0]]["kind"] == "param" and \
                graph.nodes[other[0]]["shape"] == (d,):
            return x, other[0], eps, d, scale, removed + tail
    return x, None, eps, d, product, removed


def _is_cast(data: Mapping[str, Any]) -> bool:
    return data["op"] == "identity" and data["kind"] == "function"


def _replace(graph: nx.DiGraph, x: str, weight: str | None, eps: float, d: int, last: str, removed: list[str]) -> None:
    """Make ``last`` the ``rms_norm`` node reading ``x`` (and ``weight``), and drop the pattern's other nodes."""
    data = graph.nodes[last]
    steps = [graph.nodes[n]["op"] for n in removed[:4]]
    for source in list(graph.predecessors(last)):
        graph.remove_edge(source, last)
    graph.remove_nodes_from(n for n in removed if n != last)
    data.update(op="rms_norm", kind="function", module=None, buffers={}, arguments={},
                params={"weight": graph.nodes[weight]["params"]["value"]} if weight else {},
                settings={"normalized_shape": (d,), "eps": eps}, inputs=(x, weight) if weight else (x,),
                where=f"node {last!r} (RMS norm written out: {', '.join(steps)}, mul{', weight' if weight else ''})")
    graph.add_edge(x, last, index=0)
    if weight:
        graph.add_edge(weight, last, index=1)
