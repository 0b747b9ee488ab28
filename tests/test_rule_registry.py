"""A rule is one self-describing registration (issue 30): its spellings, capabilities, example and near misses.

The tracer's spelling tables, the engine's dispatch, the attention fold, the rule law tests and the fuzzer's
``rules`` family all read the registry (:mod:`symalg.catalogue.rules.registry`); these tests hold that, so that a
new rule is one registration plus its tests.
"""
from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

import symalg
import test_rule_laws
from symalg.catalogue.rules import (CAPABILITIES, OP_RULES, REGISTRY, RULE_EXAMPLES, OpSpellings, capable,
                                    register_rule, register_spelling, spelling_table)
from symalg.catalogue.rules import registry
from symalg.catalogue.rules.elementwise import elementwise_rule
from symalg.catalogue.rule_examples import around
from symalg.frontend import tracing
from symalg.verification import fuzz
from symalg.verification.certification import assert_claims_hold

nn = torch.nn
KINDS = ("modules", "functions", "methods", "aten")


def test_the_tracer_tables_are_the_registry_spellings():
    """Every spelling the tracer reads resolves through the registry to the op registering it, and every registered
    spelling is in the tracer's tables: the tracer keeps no table of its own."""
    tables = dict(zip(KINDS, (tracing._MODULE_OPS, tracing._FUNCTIONS, tracing._METHODS, tracing._ATEN)))
    for kind, table in tables.items():
        assert table == getattr(spelling_table(), kind)
        for spelling, op in table.items():
            assert spelling in getattr(REGISTRY[op].spellings, kind), (kind, spelling, op)
    for op, registration in REGISTRY.items():
        for kind in KINDS:
            for spelling in getattr(registration.spellings, kind):
                assert tables[kind][spelling] == op, (kind, spelling, op)
    assert tracing._LAYER_SETTINGS["layer_norm"] == ("normalized_shape", "eps")
    assert tracing._SPELLINGS.settings[nn.AdaptiveAvgPool2d] == {"pooled_dims": 2}


class Spelled(nn.Module):
    """Structural ops in several spellings: a module, functions, methods (export shows their ATen forms)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.flat = nn.Linear(3, 4), nn.Linear(4, 2), nn.Flatten(0, -1)

    def forward(self, x):
        h = torch.relu(self.fc1(x)).view(5, 1, 4)
        h = torch.bmm(h, h.transpose(1, 2)) @ h
        return self.fc2(h.reshape(5, 4).contiguous() * 2.0), self.flat(h)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_spellings_trace_to_their_registered_ops(tracer):
    graph = symalg.trace(Spelled(), (torch.randn(5, 3),), tracer=tracer)
    ops = {graph.node(v)["op"] for v in graph.nodes}
    assert {"linear", "reshape", "matmul", "transpose", "mul", "flatten"} <= ops, ops
    assert ops <= set(REGISTRY) | set(symalg.CATALOGUE), ops - set(REGISTRY)


def test_every_registration_is_a_rule_or_is_consumed_by_a_pass():
    for op, registration in REGISTRY.items():
        assert (registration.rule is None) == bool(registration.consumer), op
        assert registration.capabilities <= set(CAPABILITIES), op
    assert REGISTRY["sdpa"].rule is None and "sdpa" not in OP_RULES


def test_every_rule_has_an_example_and_declared_capabilities():
    for op, rule in OP_RULES.items():
        assert REGISTRY[op].rule is rule and REGISTRY[op].example is RULE_EXAMPLES[op]
    assert capable("linear", "weights") and capable("linear", "shifts") and not capable("relu", "weights")
    assert {op for op in REGISTRY if capable(op, "pointwise")} == {"exp", "log", "sin", "cos", "sqrt", "rsqrt",
                                                                    "square", "neg", "identity"}


def test_every_rule_is_exercised_by_the_law_tests_and_the_fuzzer():
    assert test_rule_laws.OPS == sorted(OP_RULES)
    drawn = fuzz.registered_models()
    assert {op for op, k in drawn if k == 0} == set(OP_RULES)
    assert len(drawn) == len(OP_RULES) + sum(len(r.near_misses) for r in REGISTRY.values())
    assert {fuzz.generate(0, i, "rules").registered for i in range(2000)} == set(drawn)


NEAR_MISSES = [pytest.param(op, k, id=f"{op}-{k}") for op, k in fuzz.registered_models() if k]


@pytest.mark.parametrize("op, k", NEAR_MISSES)
def test_near_misses_use_their_op_and_their_raw_claims_hold(op, k):
    torch.manual_seed(0)
    model, inputs = fuzz.build_registered(op, k)
    graph = symalg.trace(model, inputs)
    assert op in [graph.node(v)["op"] for v in graph.nodes]
    assert_claims_hold(symalg.derive(graph, certify=False), draws=2)


def test_a_near_miss_loses_what_its_example_keeps():
    """``relu(h) * c`` with ``c`` not constant along the site keeps the scalings of the hidden layer and loses its
    permutations; the example (a number times a gated product) keeps both."""
    def groups(op, k):
        torch.manual_seed(0)
        return sorted(s.group.name for s in symalg.derive(symalg.trace(*fuzz.build_registered(op, k)),
                                                          certify=False).symmetries)
    assert {"PositiveScaling(4, alpha=1)", "S(4)"} <= set(groups("mul", 0))
    assert groups("mul", 1) == ["PositiveScaling(4, alpha=1)"]


@pytest.fixture
def scratch_registry():
    """The registry as it is, put back after the test."""
    saved = [dict(table) for table in (registry._REGISTRY, registry._RULES, registry._EXAMPLES)]
    yield
    for table, before in zip((registry._REGISTRY, registry._RULES, registry._EXAMPLES), saved):
        table.clear()
        table.update(before)


def test_a_new_rule_is_one_registration(scratch_registry):
    """Registering ``erf`` (pointwise: permutations pass) spells it for the tracer's table, declares it pointwise
    for the engine and hands its example and near miss to the law tests and the fuzzer."""
    example = around(lambda self, h: torch.erf(h))
    near_miss = around(lambda self, h: torch.erf(h) * self.scale, scale=lambda: torch.linspace(0.5, 2.0, 4))
    register_rule("erf", capabilities={"pointwise"}, spellings={"erf": OpSpellings(functions=(torch.erf,),
                                                                                    aten=("erf",))},
                  near_misses={"erf": (near_miss,)}, examples={"erf": example})(elementwise_rule)
    assert spelling_table().functions[torch.erf] == "erf" and spelling_table().aten["erf"] == "erf"
    assert OP_RULES["erf"] is elementwise_rule and RULE_EXAMPLES["erf"] is example and capable("erf", "pointwise")
    assert {("erf", 0), ("erf", 1)} <= set(fuzz.registered_models())


@pytest.mark.parametrize("arguments, message", [
    (dict(capabilities={"reads_minds"}), r"unknown capabilities \['reads_minds'\]"),
    (dict(capabilities=(), spellings={"erf": OpSpellings(functions=(torch.add,))}), r"torch.add|add.*spells 'add'"),
    (dict(capabilities={"erf": ()}, spellings={"other": OpSpellings()}), r"spellings may be given only for these ops"),
])
def test_a_registration_naming_unknown_capabilities_or_taken_spellings_is_refused(scratch_registry, arguments,
                                                                                  message):
    with pytest.raises(ValueError, match=message):
        register_rule("erf", examples={"erf": RULE_EXAMPLES["sin"]}, **arguments)(elementwise_rule)
    assert "erf" not in REGISTRY
    with pytest.raises(ValueError, match="unknown capabilities"):
        register_spelling("erf", OpSpellings(), "a pass", {"reads_minds"})


ALLOWED = {
    "symalg.frontend.tracing._SHAPE_ARITHMETIC": "Python arithmetic on sizes (floordiv, mod), not a rule capability",
    "symalg.frontend.tracing._ALIASING_CALLS": "module calls whose result aliases their input (the in-place guard)",
    "symalg.verification.fuzz.OPS": "the fuzzer's own model language (print templates), not ops of the registry",
    "symalg.verification.fuzz.FAMILIES": "fuzz family names",
    "symalg.verification.fuzz.EXPORTED": "fuzz family names (the share of each that torch.export traces)",
    "symalg.ir.architecture._REQUIRED": "the spec grammar's required layer keys",
    "symalg.applications.conservation_laws._ACTIVATIONS": "the activations of the conservation-law examples",
}
"""Module-level collections of op names that are not capabilities of rules (each with why)."""


def test_no_set_of_op_names_outside_the_registry():
    """What a rule can do is declared on its registration: no module outside :mod:`symalg.catalogue.rules` keeps a
    set (or a table keyed by op) naming two or more registered ops, except the :data:`ALLOWED` ones."""
    ops, found = set(REGISTRY), []
    for info in pkgutil.walk_packages(symalg.__path__, "symalg."):
        if info.name.startswith("symalg.catalogue.rules"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__") or getattr(value, "__module__", info.name) != info.name:
                continue
            keys = value if isinstance(value, (set, frozenset, tuple, list)) else \
                value.keys() if type(value) is dict else ()
            if len(ops & {k for k in keys if isinstance(k, str)}) >= 2 and f"{info.name}.{name}" not in ALLOWED:
                found.append(f"{info.name}.{name}")
    assert not found, f"op-name sets outside the registry (declare them as capabilities): {found}"
