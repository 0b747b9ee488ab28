"""The spec front end: spec strings, the :class:`Spec` builder and chain ``torch.nn.Sequential`` → :class:`Architecture`
→ the one graph (:func:`to_graph`); :func:`from_torch` traces any other model into the same graph format.

Spec strings are layers separated by ``->``; a layer is ``linear(in, out)`` (``bias=False`` to drop
the bias) or an activation from the catalogue, with optional hyper-parameters::

    >>> import symalg
    >>> symalg.parse("linear(n, h) -> leaky_relu(slope=0.2) -> linear(h, m, bias=False)")
    Architecture('linear(n, h) -> leaky_relu(slope=0.2) -> linear(h, m, bias=False)')
    >>> symalg.Spec().linear("n", "h").relu().linear("h", "m").build()
    Architecture('linear(n, h) -> relu -> linear(h, m)')

Widths are integers or names (which become positive-integer SymPy symbols). All front ends name
parameters as ``nn.Sequential`` would (``"0.weight"``, ``"2.bias"``), so analyses apply directly to
``dict(model.named_parameters())``.
"""
from __future__ import annotations

import ast
import difflib
from typing import Any, Callable, Iterator, Mapping

import networkx as nx
import sympy as sp
import torch

from symalg.catalogue.activations import CATALOGUE
from symalg.frontend.canonical import module_activation, opaque_module_name
from symalg.frontend.grammar import literal
from symalg.errors import SpecError
from symalg.ir.architecture import Architecture, as_width, to_spec_string
from symalg.ir.graph import ModelGraph
from symalg.frontend.tracing import _MODULE_OPS
from symalg.frontend.tracing import trace
from symalg.catalogue.modules import Activation

__all__ = ["Spec", "parse", "from_torch", "to_graph", "to_module", "to_spec_string"]


class Spec:
    """Chainable builder: ``Spec().linear(n, h).relu().linear(h, m).build()``.

    Any catalogue name is a method (``.tanh()``, ``.leaky_relu(slope=0.2)``); ``.activation(name,
    **params)`` is the explicit form.
    """

    def __init__(self, catalogue: Mapping = CATALOGUE):
        self._layers: list[tuple] = []
        self._catalogue = catalogue

    def linear(self, in_features: int | str | sp.Symbol, out_features: int | str | sp.Symbol,
               bias: bool = True) -> "Spec":
        self._layers.append(("linear", in_features, out_features, bias))
        return self

    def activation(self, name: str, **params: object) -> "Spec":
        self._layers.append(("activation", name, params))
        return self

    def __getattr__(self, name: str) -> Callable[..., "Spec"]:
        if name.startswith("_"):
            raise AttributeError(name)

        def add_activation(*args: object, **params: object) -> "Spec":
            if args:
                raise SpecError(f"Spec.{name}(): activations take keyword hyper-parameters only "
                                f"(got {args}); dense layers are Spec.linear(in, out)")
            return self.activation(name, **params)
        return add_activation

    def build(self) -> Architecture:
        return _architecture(self._layers, self._catalogue)


def _chain_graph(nodes: list[tuple[str, dict]], catalogue: Mapping) -> Architecture:
    """Link ``(name, attributes)`` layer nodes into the schema's path graph, naming the axes.

    Axes are ``x`` before the first linear layer, ``h1, h2, ...`` after each hidden one and ``y``
    after the last; every edge records the width flowing along it.
    """
    linear = [name for name, attrs in nodes if attrs["kind"] == "linear"]
    if not linear:
        raise SpecError("the network is empty: it has no linear layer")
    graph = nx.DiGraph()
    first = dict(nodes)[linear[0]]
    graph.add_node("input", kind="input", op="input", features=first["in_features"])
    previous, width, axis = "input", first["in_features"], "x"
    for name, attrs in nodes:
        graph.add_node(name, **attrs)
        graph.add_edge(previous, name, features=width, axis=axis)
        if attrs["kind"] == "linear":
            width = attrs["out_features"]
            axis = "y" if name == linear[-1] else f"h{linear.index(name) + 1}"
        previous = name
    graph.add_node("output", kind="output", op="output", features=width)
    graph.add_edge(previous, "output", features=width, axis=axis)
    return Architecture(graph, None if catalogue is CATALOGUE else catalogue)


def _check_activation_position(nodes: list[tuple[str, dict]], where: str) -> None:
    if not nodes:
        raise SpecError(f"layer {where}: an activation before the first linear layer has no known width; "
                        "start with a linear layer")
    if nodes[-1][1]["kind"] == "activation":
        raise SpecError(f"layer {where}: two activations in a row ({nodes[-1][1]['op']} -> ...) are not "
                        "supported yet (element-wise modules such as nn.Dropout count as activations)")


def _architecture(layers: list[tuple], catalogue: Mapping) -> Architecture:
    if not layers:
        raise SpecError("the network is empty: give at least one linear layer")
    nodes: list[tuple[str, dict]] = []
    width = None
    for index, layer in enumerate(layers):
        if layer[0] == "linear":
            _, n_in, n_out, bias = layer
            n_in = as_width(n_in, f"layer {index} (linear) in_features")
            n_out = as_width(n_out, f"layer {index} (linear) out_features")
            if width is not None and sp.sympify(width) != sp.sympify(n_in):
                raise SpecError(f"layer {index} (linear): in_features={n_in} but the previous layer "
                                f"produces {width} features")
            nodes.append((str(index), dict(kind="linear", op="linear", in_features=n_in, out_features=n_out,
                                           weight=f"{index}.weight", bias=f"{index}.bias" if bias else None)))
            width = n_out
        else:
            _, op, params = layer
            if op not in catalogue:
                raise _unknown_layer(op, index, catalogue)
            _check_activation_position(nodes, f"{index} ({op})")
            try:
                params = catalogue[op].resolve(params)
            except ValueError as error:
                raise SpecError(f"layer {index}: {error}") from None
            nodes.append((str(index), dict(kind="activation", op=op, params=params, module=None)))
    return _chain_graph(nodes, catalogue)


def _unknown_layer(name: str, index: int, catalogue: Mapping) -> SpecError:
    """The error for a layer name that is neither ``linear`` nor in ``catalogue``, with the closest names."""
    known = ["linear", *sorted(catalogue)]
    close = difflib.get_close_matches(name, known, n=2)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    return SpecError(f"layer {index}: unknown layer {name!r}{hint} (known layers: {', '.join(known)})")


def _parse_layer(text: str, index: int, catalogue: Mapping) -> tuple:
    """One layer of a spec string, read from its syntax tree with the allow-list grammar of
    :mod:`symalg.grammar` (never evaluated): ``name`` or ``name(arguments)``."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # the parser's limits on nesting and size
        raise SpecError(f"layer {index}: cannot parse {text.strip()[:200]!r}") from None
    if isinstance(node, ast.Name):
        name, args, kwargs = node.id, [], {}
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise SpecError(f"layer {index} ({name}): * and ** arguments are not allowed")
        args = [literal(a, f"layer {index} ({name})") for a in node.args]
        kwargs = {k.arg: literal(k.value, f"layer {index} ({name}) {k.arg}") for k in node.keywords}
    else:
        raise SpecError(f"layer {index}: expected `name` or `name(args)`, got {text.strip()!r}")
    if name != "linear" and name not in catalogue:
        raise _unknown_layer(name, index, catalogue)
    if name == "linear":
        if len(args) != 2 or set(kwargs) - {"bias"}:
            raise SpecError(f"layer {index} (linear): expected linear(in, out) or linear(in, out, bias=False)")
        bias = kwargs.get("bias", True)
        if not isinstance(bias, bool):
            raise SpecError(f"layer {index} (linear): bias must be True or False, got {bias!r}")
        return ("linear", args[0], args[1], bias)
    if args:
        raise SpecError(f"layer {index} ({name}): positional arguments are for linear(in, out) only; an "
                        f"activation takes keyword hyper-parameters, e.g. leaky_relu(slope=0.2)")
    return ("activation", name, kwargs)


def parse(spec: str | Spec | Architecture | torch.nn.Module | nx.DiGraph, catalogue: Mapping = CATALOGUE,
          **widths: int | str | sp.Symbol) -> Architecture:
    """Build an :class:`Architecture` from a spec string, a :class:`Spec`, a chain ``nn.Sequential``,
    a validated ``networkx.DiGraph`` or an :class:`Architecture`; ``widths`` substitutes symbols.

    A chain ``nn.Sequential`` (``nn.Linear`` and parameter-free activation modules, nested Sequentials
    allowed) is read as the spec it spells, named like its parameters; any other model is not a spec:
    :func:`from_torch` traces it.

    >>> parse("linear(n, h) -> tanh -> linear(h, 1)", h=4)
    Architecture('linear(n, 4) -> tanh -> linear(4, 1)')
    """
    if isinstance(spec, Architecture):
        arch = spec
    elif isinstance(spec, Spec):
        arch = _architecture(spec._layers, catalogue)
    elif isinstance(spec, str):
        pieces = [p for p in spec.split("->")]
        if not spec.strip() or any(not p.strip() for p in pieces):
            raise SpecError(f"empty layer in spec {spec!r}" if spec.strip() else "the network is empty")
        arch = _architecture([_parse_layer(p, i, catalogue) for i, p in enumerate(pieces)], catalogue)
    elif isinstance(spec, torch.nn.Module):
        if not _is_chain(spec):
            raise SpecError(f"parse: expected a chain nn.Sequential of Linear and activation modules, got "
                            f"{type(spec).__name__}; trace general models with symalg.from_torch")
        arch = _from_sequential(spec, catalogue)
    elif isinstance(spec, nx.DiGraph):
        arch = Architecture(spec, None if catalogue is CATALOGUE else catalogue)
    else:
        raise SpecError(f"cannot parse an architecture from {type(spec).__name__}")
    return arch.subs(widths) if widths else arch


def _leaves(module: torch.nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.nn.Module]]:
    """Every position of a nested ``nn.Sequential`` with its dotted path; a module used twice is listed at both
    positions (``named_children`` would skip the second)."""
    for name, child in module._modules.items():
        if child is None:
            continue
        path = f"{prefix}{name}"
        if isinstance(child, torch.nn.Sequential):
            yield from _leaves(child, path + ".")
        else:
            yield path, child


def _is_chain(module: torch.nn.Module) -> bool:
    """An ``nn.Sequential`` of ``nn.Linear`` and parameter-free activation-like modules."""
    if not isinstance(module, torch.nn.Sequential):
        return False
    for _, child in _leaves(module):
        if isinstance(child, torch.nn.Linear):
            continue
        if any(True for _ in child.parameters()) or type(child) in _MODULE_OPS:
            return False
    return True


def from_torch(module: torch.nn.Module, example_inputs: tuple | torch.Tensor | None = None,
               **example_kwargs: Any) -> ModelGraph:
    """The one graph (:class:`~symalg.ir.graph.ModelGraph`) of any torch model: :func:`symalg.trace` by its
    friendly name (torch.fx, ``torch.export`` as the fallback), whatever the model.

    ``example_inputs`` (a tensor or a tuple of positional inputs) and ``example_kwargs`` (keyword inputs as the
    model takes them: ``from_torch(model, input_ids=ids, attention_mask=mask)``; non-tensor values such as
    ``use_cache=False`` are constants) give the graph its shapes and let :func:`~symalg.symbolic.derive.derive`
    certify every claim by running the model; without them the model is traced without shapes and ``derive``
    needs ``certify=False``. To read a chain ``nn.Sequential`` of ``nn.Linear`` and activation modules as a spec
    (symbolic widths, ``subs``, a spec string), use :func:`parse` instead. A traced graph holds no catalogue:
    give a custom one to ``derive(graph, catalogue=...)``.
    """
    if not isinstance(example_inputs, (tuple, torch.Tensor, type(None))):
        raise SpecError(f"from_torch: example_inputs must be a tensor or a tuple of tensors, got "
                        f"{type(example_inputs).__name__}")
    return trace(module, example_inputs, **example_kwargs)


def _from_sequential(module: torch.nn.Module, catalogue: Mapping = CATALOGUE) -> Architecture:
    """The spec of a chain ``nn.Sequential`` (see :func:`parse`): activations the catalogue does not know are
    opaque nodes that admit no symmetry; they must preserve the feature width."""
    nodes: list[tuple[str, dict]] = []
    width = None
    linears: dict[int, str] = {}
    for path, child in _leaves(module):
        if isinstance(child, torch.nn.modules.lazy.LazyModuleMixin) and child.has_uninitialized_params():
            raise SpecError(f"layer {path} ({type(child).__name__}): lazy module not initialised yet; run one "
                            "forward pass first")
        if isinstance(child, torch.nn.Linear):
            for side in ("in_features", "out_features"):
                as_width(getattr(child, side), f"layer {path} (Linear) {side}")
            first = linears.setdefault(id(child), path)
            if first != path:
                raise SpecError(f"layer {path} (Linear): the same module as layer {first}; shared weights are not "
                                "a chain spec (trace the model with symalg.from_torch)")
            if width is not None and width != child.in_features:
                raise SpecError(f"layer {path} (Linear): in_features={child.in_features} but the previous "
                                f"layer produces {width} features")
            nodes.append((path, dict(kind="linear", op="linear", in_features=child.in_features,
                                     out_features=child.out_features, weight=f"{path}.weight",
                                     bias=f"{path}.bias" if child.bias is not None else None)))
            width = child.out_features
            continue
        _check_activation_position(nodes, f"{path} ({type(child).__name__})")
        known = module_activation(child)
        if known is not None and known[0] in catalogue:
            nodes.append((path, dict(kind="activation", op=known[0], params=known[1], module=None)))
            continue
        assert width is not None  # _check_activation_position: a linear layer came first
        reference = next(module.parameters(), torch.zeros(()))
        with torch.no_grad():
            try:
                shape = tuple(child(torch.zeros(2, width, dtype=reference.dtype, device=reference.device)).shape)
            except Exception as error:  # the module's own failure, reported with its name
                raise SpecError(f"layer {path} ({type(child).__name__}): cannot run it on a (batch, {width}) "
                                f"input: {error}") from None
        if shape != (2, width):
            raise SpecError(f"layer {path} ({type(child).__name__}): unknown module changes the shape "
                            f"{(2, width)} -> {shape}")
        nodes.append((path, dict(kind="activation", op=opaque_module_name(child), params={}, module=child)))
    return _chain_graph(nodes, catalogue)


def to_module(arch: Architecture, dtype: torch.dtype = torch.float64,
              generator: torch.Generator | None = None) -> torch.nn.Sequential:
    """An ``nn.Sequential`` for a concrete-width architecture, named like its parameters.

    Parameters get torch's default initialisation, ``U(±1/√in_features)`` for weights and biases
    (drawn from ``generator`` when given).
    """
    arch.check_materialisable("to_module")
    modules: list[torch.nn.Module] = []
    for name in arch.layer_names:
        node = arch.node(name)
        if node["kind"] == "linear":
            modules.append(torch.nn.Linear(int(node["in_features"]), int(node["out_features"]),
                                           bias=node["bias"] is not None, dtype=dtype))
        elif node["module"] is not None:
            modules.append(node["module"])
        else:
            modules.append(Activation(node["op"], arch.catalogue or CATALOGUE, **node["params"]))  # overlays too
    model = torch.nn.Sequential(*modules)
    if generator is not None:
        with torch.no_grad():
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    bound = 1 / layer.in_features ** 0.5
                    for p in layer.parameters():
                        p.uniform_(-bound, bound, generator=generator)
    return model


EXAMPLE_BATCH = 8
"""Rows of the example input a concrete-width spec graph carries (for certification and verification)."""


def to_graph(spec: str | Spec | Architecture | torch.nn.Module | nx.DiGraph,
             catalogue: Mapping | None = None) -> ModelGraph:
    """Emit the one graph format (:class:`~symalg.ir.graph.ModelGraph`) for a spec (anything :func:`parse` takes).

    Widths stay symbolic: shapes hold SymPy symbols (the batch axis is ``B``). At concrete widths the graph
    also carries the module of :func:`to_module` (float64, seeded) and a seeded ``(8, n)`` example input,
    so that claims can be certified and verified by running it, as for a traced model.

    >>> g = to_graph("linear(3, h) -> tanh -> linear(h, 2)")
    >>> g.parameter_shapes["2.weight"], g.model is None
    ((2, h), True)
    >>> to_graph("linear(3, 4) -> tanh -> linear(4, 2)").model[1].op
    'tanh'
    """
    if isinstance(spec, Architecture) and catalogue is None:
        arch = spec
    else:
        arch = parse(spec, catalogue=catalogue or CATALOGUE)
    batch = sp.Symbol("B", integer=True, positive=True) if arch.widths else EXAMPLE_BATCH
    graph, previous = nx.DiGraph(), "input"
    shapes: dict[str, tuple] = {}
    features = arch.graph.nodes["input"]["features"]

    def add(name: str, op: str, kind: str, shape: tuple, where: str, params: Mapping[str, str] | None = None,
            settings: Mapping[str, object] | None = None, module: str | None = None) -> None:
        graph.add_node(name, op=op, kind=kind, module=module, params=params or {}, buffers={}, settings=settings or {},
                       where=where, shape=shape, arguments={}, inputs=(previous,) if kind != "input" else ())
        if kind != "input":
            graph.add_edge(previous, name, index=0)

    add("input", "input", "input", (batch, features), "the input")
    for name in arch.layer_names:
        node = arch.node(name)
        if node["kind"] == "linear":
            params = {"weight": node["weight"], **({"bias": node["bias"]} if node["bias"] else {})}
            shapes[node["weight"]] = (node["out_features"], node["in_features"])
            if node["bias"]:
                shapes[node["bias"]] = (node["out_features"],)
            features = node["out_features"]
            add(name, "linear", "module", (batch, features), f"layer {name} (linear)", params, module=name)
        else:
            add(name, node["op"], "module", (batch, features), f"layer {name}",
                settings=dict(node["params"]), module=name)
        previous = name
    add("output", "output", "output", (batch, features), "the output")
    model, example = None, None
    if not arch.widths:
        with torch.random.fork_rng(devices=[]):  # nn.Linear's own initialisation draws from torch's global state
            model = to_module(arch, generator=torch.Generator().manual_seed(0))
        example = (torch.randn(EXAMPLE_BATCH, int(arch.graph.nodes["input"]["features"]), dtype=torch.float64,
                               generator=torch.Generator().manual_seed(1)),)
    return ModelGraph(graph, shapes, {}, model, example, "spec", {}, arch)
