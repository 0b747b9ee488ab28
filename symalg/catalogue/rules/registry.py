"""The op-rule registry: one self-describing registration per canonical op.

A registration (:class:`Registration`) holds everything the rest of symalg needs to know about an op: its rule
(``rule(state, node, data, inputs) -> value``), the torch spellings that the front end reads as it
(:class:`OpSpellings`: module classes, functions, tensor methods, ATen overload packets), what the rule can do
(:data:`CAPABILITIES`), a small example model, which the law tests trace, derive and check claim by claim, and
its near misses (models that look like the op's example but whose claims a careless rule would get wrong), which the
false-claim fuzzer checks. The tracer's tables (:func:`spelling_table`), the engine's dispatch (:func:`capable`), the
law tests and the fuzzer's ``rules`` family all read the registry, so a new rule is one registration plus its
tests.

Ops that a front-end pass consumes (``sdpa`` folded into ``attention``, ``size`` read as a number) are spelled
here too (:func:`register_spelling`) without a rule; left unconsumed they are unknown ops.

>>> sorted(REGISTRY["linear"].capabilities)
['products', 'shifts', 'weights']
>>> import torch
>>> spelling_table().functions[torch.nn.functional.linear]
'linear'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping


from symalg.catalogue.rule_examples import Example
from symalg.catalogue.rules._base import Rule

__all__ = ["CAPABILITIES", "OP_RULES", "OpSpellings", "REGISTRY", "RULE_EXAMPLES", "Registration",
           "SpellingTable", "capable", "register_rule", "register_spelling", "spelling_table"]

CAPABILITIES = MappingProxyType({
    "weights": "reads parameters, and weights computed from them, among its inputs (otherwise a parameter read as a "
               "value makes the op unknown: a parameter under ``relu`` is not a feature axis)",
    "shifts": "carries or absorbs the shift ``center·(1 − g1)`` of an affine sign flip (any other reader of a shifted "
              "value removes the flips)",
    "products": "handles a value carrying several factor sites on the same coordinates (binds, restricts, moves or "
                "ties every segment alike); any other op gets the factors separated first",
    "pointwise": "computes a fixed function of each entry of its one input: an overlay catalogue entry of the same "
                 "name describes the op and replaces its rule; equal entries stay equal",
    "arithmetic": "an entrywise op of broadcast tensors and numbers (``+ − × ÷ **``): entries computed from equal "
                  "operands are equal",
    "entrywise": "each output entry is a fixed function of its inputs' entries at the same (broadcast) position: the "
                 "ops a model builds its attention masks with",
    "layout": "moves entries without computing (reshape, transpose, indexing): the attention fold replays it on index "
              "tensors",
})
"""What a rule may declare it can do: ``{capability: meaning}``."""


@dataclass(frozen=True)
class OpSpellings:
    """How torch writes one canonical op; the tracer's tables (:func:`spelling_table`) are built from these.

    Parameters
    ----------
    modules : module classes, matched by exact type.
    functions : callables as ``torch.fx`` records them (``F.linear``, ``operator.add``, ``torch.add``).
    methods : tensor-method names (``"view"``, ``"add_"``).
    aten : ATen overload packet names as ``torch.export`` shows them, without ``aten.`` (``"linear"``).
    settings : ``{spelling: settings}`` the node gets for that spelling (a module class, a function or an ATen name):
        ``{F.max_pool2d: {"pooled_dims": 2}}``.
    arguments : for a layer called as a function (``F.layer_norm``, ``aten.conv1d``), the arguments it records as
        settings, named as the module's attributes (``("normalized_shape", "eps")``); its weight operands are then
        recorded by role (``weight``, ``bias``, ``running_mean``, ``running_var``).

    Example
    -------
    >>> import torch
    >>> REGISTRY["max_pool"].spellings.settings[torch.nn.MaxPool2d]
    {'pooled_dims': 2}
    """

    modules: tuple[type, ...] = ()
    functions: tuple[Callable[..., Any], ...] = ()
    methods: tuple[str, ...] = ()
    aten: tuple[str, ...] = ()
    settings: Mapping[object, Mapping[str, Any]] = field(default_factory=dict)
    arguments: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[object]:
        """Every spelling: the modules, functions, methods and ATen names."""
        return iter((*self.modules, *self.functions, *self.methods, *self.aten))


@dataclass(frozen=True, eq=False)
class Registration:
    """One canonical op: its rule, spellings, capabilities (:data:`CAPABILITIES`), example and near misses.

    ``rule`` is ``None`` for an op that a front-end pass consumes (:func:`register_spelling`); ``consumer`` says
    which."""

    op: str
    rule: Rule | None
    spellings: OpSpellings
    capabilities: frozenset[str] = frozenset()
    example: Example | None = None
    near_misses: tuple[Example, ...] = ()
    consumer: str = ""


_REGISTRY: dict[str, Registration] = {}
REGISTRY = MappingProxyType(_REGISTRY)
"""Read-only ``{canonical op: registration}``, rules and pass ops alike."""
_RULES: dict[str, Rule] = {}
OP_RULES = MappingProxyType(_RULES)
"""Read-only ``{canonical op: rule}``."""
_EXAMPLES: dict[str, Example] = {}
RULE_EXAMPLES = MappingProxyType(_EXAMPLES)
"""Read-only ``{canonical op: example}``: a small model using the op (:mod:`symalg.catalogue.rule_examples`),
which the rule law tests trace, derive and check claim by claim."""


def _per_op(ops: tuple[str, ...], value: Mapping[str, Any] | None, what: str, required: bool) -> Mapping[str, Any]:
    value = {} if value is None else value
    if required and set(value) != set(ops):
        raise ValueError(f"register_rule{ops}: {what} must be given for exactly these ops, got {sorted(value)}")
    if not set(value) <= set(ops):
        raise ValueError(f"register_rule{ops}: {what} may be given only for these ops, got {sorted(value)}")
    return value


def register_rule(*ops: str, examples: Mapping[str, Example],
                  capabilities: Mapping[str, Iterable[str]] | Iterable[str],
                  spellings: Mapping[str, OpSpellings] | None = None,
                  near_misses: Mapping[str, Iterable[Example]] | None = None) -> Callable[[Rule], Rule]:
    """Decorator registering ``rule`` for the canonical ``ops``, each with an example model (``{op: factory returning
    (model, example_inputs)}``), its declared capabilities (names from :data:`CAPABILITIES`, possibly none: one set for
    every op, or ``{op: set}``), its torch spellings (``{op: OpSpellings}``) and its near misses for the fuzzer
    (``{op: examples}``).

    A rule ``f`` registered as ``register_rule("sin", examples={"sin": ex}, capabilities={"pointwise"},
    spellings={"sin": OpSpellings(functions=(torch.sin,), aten=("sin",))})(f)`` is traced from ``torch.sin``, law-tested
    on ``ex`` and fuzzed on ``ex`` and its near misses.

    >>> from symalg.frontend.tracing import trace
    >>> model, inputs = RULE_EXAMPLES["sin"]()
    >>> [trace(model, inputs).graph.nodes[v]["op"] for v in trace(model, inputs).graph]
    ['input', 'linear', 'sin', 'linear', 'output']
    """
    examples = _per_op(ops, examples, "examples", True)
    capabilities = _per_op(ops, capabilities if isinstance(capabilities, Mapping) else
                           dict.fromkeys(ops, tuple(capabilities)), "capabilities", True)
    spelled = _per_op(ops, spellings, "spellings", False)
    missed = _per_op(ops, near_misses, "near misses", False)
    unknown = {c for op in ops for c in capabilities[op]} - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"register_rule{ops}: unknown capabilities {sorted(unknown)}; known: {sorted(CAPABILITIES)}")

    def decorate(rule: Rule) -> Rule:
        for op in ops:
            _add(Registration(op, rule, spelled.get(op, OpSpellings()), frozenset(capabilities[op]), examples[op],
                              tuple(missed.get(op, ()))))
        return rule
    return decorate


def register_spelling(op: str, spellings: OpSpellings, consumer: str, capabilities: Iterable[str] = ()) -> None:
    """Spell an op that a front-end pass consumes (``consumer`` says which) and no rule reads; ``capabilities`` are
    what the pass may rely on (:data:`CAPABILITIES`).

    >>> REGISTRY["sdpa"].consumer
    'attention folding (symalg.frontend.attention_folding)'
    """
    unknown = set(capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"register_spelling({op!r}): unknown capabilities {sorted(unknown)}")
    _add(Registration(op, None, spellings, frozenset(capabilities), consumer=consumer))


def _add(registration: Registration) -> None:
    taken = {s: other.op for other in _REGISTRY.values() if other.op != registration.op for s in other.spellings}
    clashes = sorted(f"{s!r} (spells {taken[s]!r})" for s in registration.spellings if s in taken)
    if clashes:
        raise ValueError(f"register_rule: {registration.op!r} cannot take spellings already registered: "
                         f"{', '.join(clashes)}")
    _REGISTRY[registration.op] = registration
    if registration.rule is not None:
        _RULES[registration.op] = registration.rule
        if registration.example is not None:
            _EXAMPLES[registration.op] = registration.example


def capable(op: str, capability: str) -> bool:
    """True when ``op``'s registration declares ``capability`` (:data:`CAPABILITIES`).

    >>> capable("pow", "weights"), capable("relu", "weights")
    (True, False)
    """
    registration = _REGISTRY.get(op)
    return registration is not None and capability in registration.capabilities


@dataclass(frozen=True)
class SpellingTable:
    """``{torch spelling: canonical op}`` per kind of spelling, the settings each spelling gives, and
    ``{op: arguments}`` for the layers called as functions (:class:`OpSpellings`; read-only)."""

    modules: Mapping[type, str]
    functions: Mapping[object, str]
    methods: Mapping[str, str]
    aten: Mapping[str, str]
    settings: Mapping[object, Mapping[str, Any]]
    arguments: Mapping[str, tuple[str, ...]]


def spelling_table() -> SpellingTable:
    """The tracer's tables, built from every registration's spellings."""
    tables: tuple[dict, ...] = ({}, {}, {}, {}, {}, {})
    for registration in _REGISTRY.values():
        spelled = registration.spellings
        for table, keys in zip(tables, (spelled.modules, spelled.functions, spelled.methods, spelled.aten)):
            table.update(dict.fromkeys(keys, registration.op))
        tables[4].update(spelled.settings)
        if spelled.arguments:
            tables[5][registration.op] = spelled.arguments
    return SpellingTable(*(MappingProxyType(table) for table in tables))
