"""The architecture graph: one validated ``networkx.DiGraph`` schema shared by every front end.

Schema
------
Nodes are strings. ``"input"`` and ``"output"`` are the two boundary nodes; every other node is a
layer named like the module of the equivalent ``torch.nn.Sequential`` (``"0"``, ``"1"``, ...).
Every node carries ``kind`` and ``op``:

========== ============ ========================================================================
kind       op           further attributes
========== ============ ========================================================================
input      ``input``    ``features``: width of the data
linear     ``linear``   ``in_features``, ``out_features``, ``weight`` (parameter name),
                        ``bias`` (parameter name or ``None``)
activation canonical    ``params``: hyper-parameters (e.g. ``{"slope": 0.01}``), ``module``:
           name         the torch module for ops the catalogue does not know (else ``None``)
output     ``output``   ``features``: width of the network output
========== ============ ========================================================================

Edges carry ``features`` (the width of the feature axis flowing along them) and ``axis`` (its name:
``x`` for the input, ``h1, h2, ...`` for hidden sites, ``y`` for the output). Widths are positive
``int``\\ s or positive-integer SymPy symbols. Layers follow torch's ``nn.Linear`` layout,
``y = W x + b`` with ``W`` of shape ``(out_features, in_features)``.

Example
-------
>>> import symalg
>>> arch = symalg.parse("linear(n, h) -> relu -> linear(h, m)")
>>> [arch.graph.nodes[v]["op"] for v in arch.layer_names]
['linear', 'relu', 'linear']
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, TypeAlias

import networkx as nx
import sympy as sp

from symalg.errors import MissingParameterError, ParameterError, SpecError
from symalg.frontend.grammar import MAX_WIDTH, check_entries, is_plain_name

__all__ = ["Architecture", "Width", "as_width", "at_least", "to_spec_string", "validate", "width_less", "width_max"]

Width: TypeAlias = int | sp.Symbol


def at_least(width: Width, n: int) -> bool:
    """``width ≥ n`` for a concrete width; for a symbolic width, true unless SymPy proves otherwise (a symbolic
    width stands for a generic, large width: ``at_least(h, 2)`` is true).

    >>> at_least(1, 2), at_least(sp.Symbol("h", positive=True, integer=True), 2)
    (False, True)
    """
    if isinstance(width, int):
        return width >= n
    if isinstance(width, sp.Symbol):   # a positive integer, unbounded above: never provably below n (SymPy's Ge costs
        return True                    # an assumptions query, milliseconds per site)
    relation = sp.Ge(width, n)
    return bool(relation) if relation in (sp.true, sp.false) else True


def width_max(a: Width | sp.Expr, b: Width | sp.Expr) -> Width | sp.Expr:
    """``max(a, b)`` of two offsets or widths (non-negative ints or SymPy expressions in positive widths), decided by
    SymPy only where neither is zero, nor both equal, nor both ints (an assumptions query costs milliseconds).

    >>> h = sp.Symbol("h", positive=True, integer=True)
    >>> width_max(0, h), width_max(h, h), width_max(2, 3)
    (h, h, 3)
    """
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if a == 0 or a == b:
        return b
    return a if b == 0 else max(a, b)


def width_less(a: Width | sp.Expr, b: Width | sp.Expr) -> bool:
    """``a < b`` of two offsets or widths, as :func:`width_max` decides: Python for ints, ``False`` for equal ones,
    SymPy otherwise (a ``TypeError`` when SymPy cannot decide, as ``a < b`` itself).

    >>> h = sp.Symbol("h", positive=True, integer=True)
    >>> width_less(h, h), width_less(0, h), width_less(h, h + 1)
    (False, True, True)
    """
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return False if a == b else bool(a < b)


def as_width(value: object, where: str) -> Width:
    """Return ``value`` as a width (positive int up to :data:`~symalg.frontend.grammar.MAX_WIDTH`, or a
    positive-integer symbol with a plain-identifier name), or raise naming ``where``.

    >>> as_width("h", "layer 0"), as_width(3, "layer 0")
    (h, 3)
    """
    if isinstance(value, bool):
        raise SpecError(f"{where}: width {value!r} is not an integer or a symbol")
    if isinstance(value, (str, sp.Symbol)):
        name = value if isinstance(value, str) else value.name
        if not is_plain_name(name):
            raise SpecError(f"{where}: width {name!r} is not a valid symbol name (a plain identifier not "
                            "starting with '_')")
        if isinstance(value, sp.Symbol) and value.is_positive is True and value.is_integer is True:
            return value
        return sp.Symbol(name, integer=True, positive=True)
    if isinstance(value, (int, sp.Integer)) or (hasattr(value, "__index__") and not isinstance(value, float)):
        value = int(value)
        if value <= 0:
            raise SpecError(f"{where}: width {value} must be positive")
        if value > MAX_WIDTH:
            raise SpecError(f"{where}: width {value} exceeds the limit of {MAX_WIDTH} "
                            "(symalg.frontend.grammar.MAX_WIDTH)")
        return value
    raise SpecError(f"{where}: width {value!r} is not an integer or a symbol")


def _same_width(a: Width, b: Width, where: str) -> bool:
    return as_width(a, where) == as_width(b, where)


_REQUIRED = {"input": ("features",), "output": ("features",), "activation": ("op", "params", "module"),
             "linear": ("in_features", "out_features", "weight", "bias")}


def validate(graph: nx.DiGraph) -> None:
    """Check ``graph`` against the schema; raise :class:`SpecError` naming the offending node.

    Feed-forward networks are a single path ``input -> layer -> ... -> output`` containing at
    least one linear layer; widths must agree along every edge.
    """
    if not isinstance(graph, nx.DiGraph):
        raise SpecError(f"expected a networkx.DiGraph, got {type(graph).__name__}")
    for required in ("input", "output"):
        if required not in graph:
            raise SpecError(f"graph has no {required!r} node")
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        raise SpecError(f"layer {cycle[0][0]}: the graph has a cycle through {[u for u, _ in cycle]}")
    for node, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind not in ("input", "linear", "activation", "output"):
            raise SpecError(f"layer {node}: unknown node kind {kind!r}")
        if kind != "input" and graph.in_degree(node) != 1:
            raise SpecError(f"layer {node}: expected one incoming edge, found {graph.in_degree(node)}")
        if kind != "output" and graph.out_degree(node) != 1:
            raise SpecError(f"layer {node}: expected one outgoing edge, found {graph.out_degree(node)}")
        missing = [key for key in _REQUIRED[kind] if key not in data]
        if missing:
            raise SpecError(f"layer {node} ({kind}): missing attribute(s) {missing}")
    order = list(nx.topological_sort(graph))
    if order[0] != "input" or order[-1] != "output":
        raise SpecError(f"the graph must run from 'input' to 'output', but it starts at {order[0]!r} "
                        f"and ends at {order[-1]!r}")
    if not any(graph.nodes[v]["kind"] == "linear" for v in order):
        raise SpecError("the network is empty: it has no linear layer")
    for previous, node in zip(order, order[1:]):
        if graph.nodes[previous]["kind"] == graph.nodes[node]["kind"] == "activation":
            raise SpecError(f"layer {node}: two activations in a row ({previous} -> {node}) are not supported yet")
    owners: dict[str, str] = {}
    for node in order:
        data = graph.nodes[node]
        for name in (data.get("weight"), data.get("bias")) if data["kind"] == "linear" else ():
            if name and owners.setdefault(name, node) != node:
                raise SpecError(f"layer {node}: parameter name {name!r} is already used by layer {owners[name]}")
    for u, v, data in graph.edges(data=True):
        width = as_width(data.get("features"), f"edge {u}->{v}")
        target = graph.nodes[v]
        if target["kind"] == "linear" and not _same_width(target["in_features"], width,
                                                          f"layer {v} (linear) in_features"):
            raise SpecError(
                f"layer {v} (linear): in_features={target['in_features']} but the previous "
                f"layer {u} produces {width} features")
        source = graph.nodes[u]
        if source["kind"] == "activation":
            produced = graph.edges[next(iter(graph.in_edges(u)))]["features"]
        else:
            produced = source.get("out_features", source.get("features"))
        if not _same_width(produced, width, f"layer {u}"):
            raise SpecError(f"layer {u}: produces {produced} features but its edge to {v} says {width}")
        if target["kind"] == "output" and not _same_width(target.get("features"), width, f"layer {v}"):
            raise SpecError(f"layer {v}: output features={target.get('features')} but layer {u} produces {width}")
    for node, data in graph.nodes(data=True):
        if data["kind"] == "linear":
            as_width(data["in_features"], f"layer {node} (linear) in_features")
            as_width(data["out_features"], f"layer {node} (linear) out_features")
            if not data.get("weight"):
                raise SpecError(f"layer {node} (linear): no weight parameter name")


@dataclass(frozen=True, eq=False)
class Architecture:
    """A validated feed-forward architecture: the graph plus convenient read-only views.

    Build one with :func:`symalg.parse` (a spec string or a chain ``nn.Sequential``) or :class:`symalg.Spec`.
    """

    graph: nx.DiGraph
    catalogue: Mapping[str, Any] | None = None
    """The catalogue the architecture was parsed with (None: the built-in one); ``derive`` uses it."""

    def __post_init__(self) -> None:
        validate(self.graph)

    @property
    def layer_names(self) -> list[str]:
        """Layer nodes in data-flow order (boundary nodes excluded)."""
        return [v for v in nx.topological_sort(self.graph) if v not in ("input", "output")]

    def node(self, name: str) -> Mapping[str, Any]:
        return self.graph.nodes[name]

    @property
    def linear_layers(self) -> list[str]:
        return [v for v in self.layer_names if self.graph.nodes[v]["kind"] == "linear"]

    @property
    def widths(self) -> set[sp.Symbol]:
        """The symbolic widths (empty when every width is concrete)."""
        symbols: set[sp.Symbol] = set()
        for v in self.linear_layers:
            node = self.graph.nodes[v]
            symbols |= sp.sympify(node["in_features"]).free_symbols | sp.sympify(node["out_features"]).free_symbols
        return symbols

    @property
    def parameter_shapes(self) -> dict[str, tuple[Width, ...]]:
        """``{parameter name: shape}`` in torch layout (weights ``(out, in)``, biases ``(out,)``)."""
        shapes: dict[str, tuple[Width, ...]] = {}
        for v in self.linear_layers:
            node = self.graph.nodes[v]
            shapes[node["weight"]] = (node["out_features"], node["in_features"])
            if node["bias"]:
                shapes[node["bias"]] = (node["out_features"],)
        return shapes

    def check_materialisable(self, what: str) -> None:
        """Raise :class:`SpecError` naming ``what`` unless every width is concrete and the parameters,
        ``Σ out·in + out`` entries, fit in :data:`~symalg.frontend.grammar.MAX_ENTRIES`; call before allocating them."""
        if self.widths:
            raise SpecError(f"{what}: widths {sorted(map(str, self.widths))} are symbolic; use arch.subs(...)")
        check_entries(sum(math.prod(int(s) for s in shape) for shape in self.parameter_shapes.values()),
                      f"{what}: the parameters")

    def subs(self, widths: Mapping[str | sp.Symbol, object]) -> "Architecture":
        """A copy with symbolic widths replaced, e.g. ``arch.subs({"h": 8})``; names may be str."""
        by_name = {str(k): v for k, v in widths.items()}
        unknown = set(by_name) - {s.name for s in self.widths}
        if unknown:
            raise SpecError(f"subs: no width named {sorted(unknown)} "
                            f"(widths are {sorted(s.name for s in self.widths)})")

        given = {name: as_width(value, f"subs: width {name}") for name, value in by_name.items()}

        def concrete(w: Width) -> Width:
            return given.get(w.name, w) if isinstance(w, sp.Symbol) else w

        graph = self.graph.copy()
        for v, data in graph.nodes(data=True):
            for key in ("in_features", "out_features", "features"):
                if key in data:
                    data[key] = concrete(data[key])
        for _, _, data in graph.edges(data=True):
            data["features"] = concrete(data["features"])
        return Architecture(graph, self.catalogue)

    def widths_from_params(self, params: Mapping[str, Any]) -> dict[sp.Symbol, int]:
        """Read the symbolic widths off concrete parameter tensors; raise on missing, mismatched or
        non-finite ones, naming the parameter."""
        found: dict[sp.Symbol, int] = {}
        for name, shape in self.parameter_shapes.items():
            if name not in params:
                raise MissingParameterError(f"parameter {name!r} is missing "
                                            f"(expected names: {sorted(self.parameter_shapes)})")
            actual = tuple(params[name].shape)
            if hasattr(params[name], "isfinite") and not params[name].isfinite().all():
                raise ParameterError(f"parameter {name!r} has non-finite entries")
            if len(actual) != len(shape):
                raise ParameterError(f"parameter {name!r}: expected {len(shape)} dimensions, got shape {actual}")
            for expected, size in zip(shape, actual):
                expected = sp.sympify(expected)
                if expected.is_Symbol:
                    if found.setdefault(expected, size) != size:
                        raise ParameterError(f"parameter {name!r}: width {expected} is {size} here but "
                                             f"{found[expected]} elsewhere")
                elif int(expected) != size:
                    raise ParameterError(f"parameter {name!r}: expected shape {shape}, got {actual}")
        return found

    def __repr__(self) -> str:
        return f"Architecture({to_spec_string(self)!r})"


def _number(value: object) -> str:
    """A hyper-parameter as spec text: integers as such, anything else as a Python float."""
    number = sp.sympify(value)
    return str(number) if number.is_Integer else repr(float(number))


def to_spec_string(arch: Architecture) -> str:
    """The spec string of ``arch`` (round-trips through :func:`symalg.parse` for catalogue activations)."""
    parts = []
    for name in arch.layer_names:
        node = arch.node(name)
        if node["kind"] == "linear":
            bias = "" if node["bias"] else ", bias=False"
            parts.append(f"linear({node['in_features']}, {node['out_features']}{bias})")
        elif node["params"]:
            parts.append(f"{node['op']}({', '.join(f'{k}={_number(v)}' for k, v in node['params'].items())})")
        else:
            parts.append(node["op"])
    return " -> ".join(parts)
