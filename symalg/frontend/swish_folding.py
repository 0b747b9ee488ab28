"""Recognise Swish with a trainable ``β`` written out as one ``swish_beta`` node: a pass, graph → graph, on the
canonical ops of :func:`symalg.trace`.

    a = z ⊙ f(β ⊙ z)          (``β`` a parameter, one entry per neuron; ``f`` pointwise: sigmoid for Swish)

written ``z * torch.sigmoid(self.beta * z)`` (either operand order in either product; ``torch.sigmoid``,
``F.sigmoid``, ``z.sigmoid()`` and ``nn.Sigmoid`` are one canonical ``sigmoid``) becomes
``swish_beta(z, β)``, whose rule (:func:`symalg.catalogue.rules.elementwise.swish_beta_rule`) binds ``β`` to
the sites of ``z``.
The gate ``f`` may be any pointwise activation of the built-in catalogue without parameters of its own (``tanh``,
``gelu``, ``relu``, …; not a radial one, not ``softmax``): ``(d z) ⊙ f((d⁻¹β) ⊙ (d z)) = d (z ⊙ f(β ⊙ z))`` for
every invertible diagonal ``d`` whatever ``f`` is, as long as it acts on each coordinate alone and alike (the gate
is kept in the node's settings). Nothing else is folded: ``β`` must be a parameter (a buffer or a number is no
trainable ``β``: with a fixed ``β`` the product stays as it is and claims no scaling), both products must read the
very same value ``z``, and the inner product and the gate must be read by nothing but the next step. So
``f(β z + c)`` or ``z ⊙ f(β z')`` for another ``z'`` stay unfolded, and the unknown product of a parameter and a
value (``β ⊙ z``) blocks the sites it reads, with a note naming the node.

Example
-------
>>> import torch, symalg
>>> class Swish(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.beta = torch.nn.Parameter(torch.ones(4))
...     def forward(self, z):
...         return z * torch.sigmoid(self.beta * z)
>>> graph = symalg.trace(Swish(), (torch.randn(2, 4),))
>>> [(graph.node(v)["op"], graph.node(v)["params"]) for v in graph.nodes if graph.node(v)["kind"] == "function"]
[('swish_beta', {'beta': 'beta'})]
"""
from __future__ import annotations

from typing import Any, Mapping

import networkx as nx

from symalg.catalogue.activations import CATALOGUE
from symalg.ir.graph import only_user


__all__ = ["fold_swish_beta"]


def fold_swish_beta(graph: nx.DiGraph) -> nx.DiGraph:
    """A copy of ``graph`` with every written-out Swish with a trainable ``β`` replaced by one ``swish_beta`` node
    (named like the pattern's outer product, so that its readers read it)."""
    graph = graph.copy()
    for name in list(graph.nodes):
        if name in graph and _pointwise_gate(graph.nodes[name]):
            match = _match(graph, name)
            if match is not None:
                _replace(graph, name, *match)
    return graph


def _pointwise_gate(data: Mapping[str, Any]) -> bool:
    """A built-in catalogue activation acting on each coordinate alone and alike: not radial, no parameters."""
    entry = CATALOGUE.get(data["op"])
    return entry is not None and not entry.radial and not data.get("params")


def _operands(data: Mapping[str, Any]) -> list[str]:
    """The two operands of a product of two tensors (no number among them), else ``[]``."""
    inputs = list(data["inputs"])
    return inputs if data["op"] == "mul" and len(inputs) == 2 and None not in inputs else []


def _match(graph: nx.DiGraph, gate: str) -> tuple[str, str, str, str] | None:
    """``(z, β node, inner product, outer product)`` of the pattern around ``gate``, else ``None``."""
    sources = [i for i in graph.nodes[gate]["inputs"] if i is not None]
    outer = only_user(graph, gate)
    if len(sources) != 1 or len(graph.nodes[gate]["inputs"]) != 1 or outer is None or \
            only_user(graph, sources[0]) != gate:
        return None
    inner = sources[0]
    factors, others = _operands(graph.nodes[inner]), _operands(graph.nodes[outer])
    if not factors or others.count(gate) != 1:
        return None
    z = others[1 - others.index(gate)]
    params = [f for f in factors if graph.nodes[f]["kind"] == "param"]
    if len(params) != 1 or z == params[0] or sorted(factors) != sorted([z, params[0]]):
        return None
    return z, params[0], inner, outer


def _replace(graph: nx.DiGraph, gate: str, z: str, beta: str, inner: str, outer: str) -> None:
    """Make ``outer`` the ``swish_beta`` node reading ``z`` and ``β``, and drop the inner product and the gate."""
    data, op = graph.nodes[outer], graph.nodes[gate]["op"]
    for source in list(graph.predecessors(outer)):
        graph.remove_edge(source, outer)
    graph.remove_nodes_from((inner, gate))
    data.update(op="swish_beta", kind="function", module=None, buffers={}, arguments={}, settings={"gate": op},
                params={"beta": graph.nodes[beta]["params"]["value"]}, inputs=(z, beta),
                where=f"node {outer!r} (swish with a trainable β written out: mul({beta}), {op}, mul)")
    graph.add_edge(z, outer, index=0)
    graph.add_edge(beta, outer, index=1)
