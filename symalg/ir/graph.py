"""The one graph format: a ``networkx.DiGraph`` of canonical ops that every front end emits.

Spec strings and the ``Spec`` builder emit it with symbolic widths (shapes hold ``int`` or SymPy
symbols) and no model; torch models are traced into it with concrete shapes and keep the model, so
that claims can be certified and verified by running it. Schema of ``ModelGraph.graph`` (node names
in data-flow order):

============ ==============================================================================
attribute    meaning
============ ==============================================================================
``op``       canonical op (``linear``, ``conv``, ``relu``, ``add``, ``layer_norm``,
             ``multihead_attention``, ``attention``, ...; the fx target's name when unknown)
``kind``     ``input``, ``output``, ``param`` (a parameter read in ``forward``), ``module``,
             ``function``, ``constant``
``module``   qualified name of the called module (``None`` for functions)
``params``   ``{role: canonical parameter name}`` (tied parameters get the first name)
``buffers``  ``{role: buffer name}``
``settings`` hyper-parameters (``eps``, ``groups``, ``dim``, ``heads``, ...)
``inputs``   tensor inputs in the callee's argument order (keywords included; a value read twice,
             ``x * x``, is listed twice): node names, or ``None`` where a constant operand stands
``shape``    the output shape (``None`` when unknown)
``where``    ``"node 'relu_1' (F.relu)"``, for error messages
============ ==============================================================================

Edges ``u → v`` carry ``index``: the first position of ``u`` in ``v``'s ``inputs``.

Example
-------
>>> import symalg
>>> g = symalg.to_graph("linear(n, h) -> relu -> linear(h, m)")
>>> [g.graph.nodes[v]["op"] for v in g.graph]
['input', 'linear', 'relu', 'linear', 'output']
>>> g.parameter_shapes["0.weight"]
(h, n)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import networkx as nx
import sympy as sp
import torch

from symalg.errors import SpecError

__all__ = ["ModelGraph", "only_user"]


def only_user(graph: nx.DiGraph, name: str) -> str | None:
    """The one node reading ``name`` in ``graph``, or ``None`` when none or several do (what a fold pass needs to
    know before it may swallow ``name`` into a pattern)."""
    users = list(graph.successors(name))
    return users[0] if len(users) == 1 else None


@dataclass(frozen=True, eq=False)
class ModelGraph:
    """The canonical op graph (schema in the module docstring), the shapes of the parameters and buffers it
    reads, and, for a traced model, the model itself.

    ``tracer``: ``"fx"``, ``"export"`` (the fallback) or ``"spec"``; ``aliases``: ``{alias: canonical
    parameter name}`` for tied parameters; ``source``: the front end's own description the graph was
    emitted from (the parsed spec), which :meth:`symalg.Analysis.subs` re-emits at new widths.
    ``example_kwargs``: the keyword example inputs (``input_ids=...``, constants such as ``use_cache=False``),
    passed with ``example_inputs`` whenever the model is run; ``tracer_note``: why that tracer ran (the
    fx failure when ``torch.export`` was the fallback, ``""`` when fx traced or the spec emitted the graph);
    ``output_paths``: the path of every tensor the model returned on its example inputs
    (:func:`~symalg.frontend.outputs.output_tensors`: ``last_hidden_state``, ``past_key_values.layers.0.keys``).

    The input shapes the graph holds for (``torch.export`` records sizes; fx records ops, and its graph holds for
    every shape): ``specialised_axes``, ``(input, axis, size)`` of every tensor-input axis that export kept at the
    example's size; ``dynamic_axes``, ``(input, axis, size symbol, least size, greatest size or None)`` of every
    other axis (axes sharing a symbol have one size); ``shape_note``, those shapes in words when they are not
    every shape (``"the graph holds for x of shape (s0, 3) with s0 ≥ 2"``: a branch on ``x.shape[0] > 1`` was
    traced), ``""`` otherwise. Claims certified on the example's shapes say nothing about other shapes.
    """

    graph: nx.DiGraph
    parameter_shapes: Mapping[str, tuple]
    buffer_shapes: Mapping[str, tuple] = field(default_factory=dict)
    model: torch.nn.Module | None = field(default=None, repr=False)
    example_inputs: tuple | None = field(default=None, repr=False)
    tracer: str = "fx"
    aliases: Mapping[str, str] = field(default_factory=dict)
    source: object = field(default=None, repr=False)
    example_kwargs: Mapping[str, object] = field(default_factory=dict, repr=False)
    tracer_note: str = ""
    output_paths: tuple[str, ...] = ()
    shape_note: str = ""
    specialised_axes: tuple[tuple[str, int, int], ...] = ()
    dynamic_axes: tuple[tuple[str, int, str, int, int | None], ...] = ()

    @property
    def nodes(self) -> list[str]:
        return list(self.graph.nodes)

    def node(self, name: str) -> Mapping:
        return self.graph.nodes[name]

    @property
    def shapes(self) -> dict[str, tuple]:
        """Shapes of every parameter and buffer by name."""
        return {**self.parameter_shapes, **self.buffer_shapes}

    @property
    def widths(self) -> set[sp.Symbol]:
        """The symbolic widths (empty for a traced model)."""
        return {s for shape in self.shapes.values() for w in shape if isinstance(w, sp.Basic) for s in w.free_symbols}

    def require_model(self, caller: str) -> torch.nn.Module:
        """The model, or a ``SpecError`` saying that ``caller`` needs one (a graph with symbolic widths has none)."""
        if self.model is None:
            widths = ", ".join(sorted(map(str, self.widths))) or "none"
            raise SpecError(f"{caller} needs concrete widths (symbolic widths: {widths}); substitute them first, "
                            "e.g. analysis.subs({'h': 5})")
        return self.model

    @property
    def on_meta(self) -> bool:
        """True when the model's parameters or buffers are on the ``meta`` device (shapes, no values): the graph and
        every generic result (groups, formulas, generic orbit dimension) stand, nothing can be run on it."""
        return self.model is not None and any(t.is_meta for t in (*self.model.parameters(), *self.model.buffers()))

    def require_values(self, caller: str) -> torch.nn.Module:
        """The model, or a ``SpecError`` saying that ``caller`` runs it and its weights are on the meta device."""
        model = self.require_model(caller)
        if self.on_meta:
            raise SpecError(f"{caller} runs the model, whose weights are on the meta device (shapes, no values); "
                            "build it on a real device (or load its weights) for numbers")
        return model

    def parameters(self) -> dict[str, torch.Tensor]:
        """The model's parameters by canonical name (tied parameters once)."""
        return dict(self.require_model("parameters()").named_parameters())

    def buffers(self) -> dict[str, torch.Tensor]:
        return dict(self.require_model("buffers()").named_buffers())

    def __repr__(self) -> str:
        ops = [self.graph.nodes[v]["op"] for v in self.graph]
        what = type(self.model).__name__ if self.model is not None else "no model"
        return f"ModelGraph({what}, tracer={self.tracer!r}, ops={ops})"
