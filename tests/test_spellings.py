"""Every torch spelling a catalogue entry registers reaches that entry, on the fx and the export route.

The tracing and ``from_torch`` tables are built from the entries' :class:`Spellings`, so these tests
run over the whole catalogue: a new entry's spellings are checked for free.
"""
from __future__ import annotations

import inspect

import pytest
import torch
from torch.fx.operator_schemas import get_signature_for_torch_op

import symalg
from symalg.catalogue.activations import CATALOGUE
from symalg.errors import SpecError
from symalg.frontend.canonical import ACTIVATIONS, call_activation, module_activation, opaque_module_name
from test_routes import native_module  # the differential suite's torch module per entry

nn = torch.nn
F = torch.nn.functional

SPELLED_MODULES = sorted(name for name, entry in CATALOGUE.items() if entry.spellings.modules)
FUNCTIONS = [pytest.param(name, f, id=f"{name}-{f.__name__}")
             for name in sorted(CATALOGUE) for f in CATALOGUE[name].spellings.functions]
METHODS = [pytest.param(name, m, id=f"{name}-{m}")
           for name in sorted(CATALOGUE) for m in CATALOGUE[name].spellings.methods]
ATEN = [pytest.param(name, a, id=f"{name}-{a}") for name in sorted(CATALOGUE) for a in CATALOGUE[name].spellings.aten]


class Call(nn.Module):
    """``fc2(f(fc1(x), **settings))``, or ``fc2(fc1(x).method())``."""

    def __init__(self, function=None, method=None, **settings):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)
        self.function, self.method, self.settings = function, method, settings

    def forward(self, x):
        h = self.fc1(x)
        h = getattr(h, self.method)() if self.method else self.function(h, **self.settings)
        return self.fc2(h)


def _settings_for(name: str, function) -> dict:
    """The hyper-parameter settings of entry ``name``'s native module that ``function`` takes."""
    module = native_module(name)
    try:
        accepted = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        accepted = set(get_signature_for_torch_op(function)[0].parameters)
    return {k: getattr(module, k) for k in CATALOGUE[name].spellings.arguments if k in accepted and hasattr(module, k)}


def _ops(graph) -> list[str]:
    return [graph.node(v)["op"] for v in graph.nodes if graph.node(v)["kind"] not in ("input", "output", "param")]


def example() -> tuple[torch.Tensor]:
    """A batch in the default dtype (float64 under the test suite's configuration)."""
    return (torch.randn(5, 3, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.parametrize("name", SPELLED_MODULES)
@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_module_spelling_reaches_its_entry(name, tracer):
    module = native_module(name)
    assert module_activation(module)[0] == name
    graph = symalg.trace(nn.Sequential(nn.Linear(3, 4), module, nn.Linear(4, 2)), example(), tracer=tracer)
    assert graph.tracer == tracer
    expected = ["linear", "linear"] if name == "identity" and tracer == "export" else ["linear", name, "linear"]
    assert _ops(graph) == expected     # export drops nn.Identity altogether


@pytest.mark.parametrize("name, function", FUNCTIONS)
def test_function_spelling_reaches_its_entry(name, function):
    graph = symalg.trace(Call(function, **_settings_for(name, function)), example(), tracer="fx")
    assert _ops(graph) == ["linear", name, "linear"]


@pytest.mark.parametrize("name, method", METHODS)
def test_method_spelling_reaches_its_entry(name, method):
    graph = symalg.trace(Call(method=method), example(), tracer="fx")
    assert _ops(graph) == ["linear", name, "linear"]


@pytest.mark.parametrize("name, aten", ATEN)
def test_aten_spelling_names_a_real_overload(name, aten):
    namespace, packet, overload = aten.split(".")
    op = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    assert str(op) == aten
    assert name in [e.name for e in ACTIVATIONS.aten[aten]]


def test_in_place_activation_redirects_later_readers():
    """``y = F.hardtanh_(h)`` writes ``h``: a later reader of ``h`` reads the clamped tensor."""
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = self.fc1(x)
            F.hardtanh_(h)
            return self.fc2(h)

    graph = symalg.trace(InPlace(), example())
    (clamp,) = [v for v in graph.nodes if graph.node(v)["op"] == "hardtanh"]
    (reader,) = [v for v in graph.nodes if graph.node(v)["module"] == "fc2"]
    assert graph.node(reader)["inputs"] == (clamp,)


@pytest.mark.parametrize("module, name", [
    (nn.Hardtanh(-2.0, 3.0), "Hardtanh(min_val=-2.0, max_val=3.0)"),
    (nn.Softplus(beta=2), "Softplus(beta=2, threshold=20.0)"),
    (nn.GELU(approximate="none"), None),
    (nn.CELU(), "CELU"),
])
def test_uncovered_module_settings_are_opaque_and_named_by_them(module, name):
    if name is None:
        assert module_activation(module) == ("gelu", {})
        return
    assert module_activation(module) is None
    assert opaque_module_name(module) == name and name not in CATALOGUE
    analysis = symalg.derive(symalg.trace(nn.Sequential(nn.Linear(3, 4), module, nn.Linear(4, 2)), example()))
    assert any(name in b.reason for b in analysis.blocked), analysis.blocked


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_uncovered_call_settings_are_opaque_on_both_routes(tracer):
    graph = symalg.trace(Call(F.hardtanh, min_val=-2.0, max_val=3.0), example(), tracer=tracer)
    (op,) = [o for o in _ops(graph) if o != "linear"]
    assert op not in CATALOGUE and "min_val=-2.0" in op
    assert call_activation("aten", "aten.hardtanh.default", {"min_val": 0.0, "max_val": 6.0}) == ("relu6", {})


def relu(x):
    """Not torch's ReLU: doubles its input."""
    return 2 * x


torch.fx.wrap("relu")  # a leaf: fx records the call of this module's ``relu`` instead of tracing through it


def test_function_named_like_an_entry_is_not_that_entry():
    """A callee nobody spelled keeps its name, qualified where the bare name is a catalogue entry's."""
    class CallsRelu(Call):
        def forward(self, x):
            return self.fc2(relu(self.fc1(x)))

    graph = symalg.trace(CallsRelu(), example(), tracer="fx")
    ops = _ops(graph)
    assert "relu" not in ops and any(op.endswith(".relu") for op in ops), ops


@pytest.mark.parametrize("tracer, inputs, message", [
    ("jit", example(), "tracer must be one of"), (None, example(), "tracer must be one of"),
    ("export", None, "tracer='export' needs example_inputs")])
def test_tracer_argument_is_validated(tracer, inputs, message):
    with pytest.raises(SpecError, match=message):
        symalg.trace(nn.Sequential(nn.Linear(3, 2)), inputs, tracer=tracer)


def test_fx_only_tracer_does_not_fall_back_to_export():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x) if x.shape[0] > 2 else -self.fc(x)   # fx cannot branch on a shape; export can

    with pytest.raises(SpecError, match="torch.fx cannot trace Branchy") as error:
        symalg.trace(Branchy(), example(), tracer="fx")
    assert "export" not in str(error.value)
    assert symalg.trace(Branchy(), (torch.ones(5, 3),)).tracer == "export"


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_hardtanh_at_relu6_bounds_is_relu6(tracer):
    """``hardtanh(z, 0, 6)`` is ReLU6 however it is written: the second entry spelling it takes it."""
    assert module_activation(nn.Hardtanh(0.0, 6.0)) == ("relu6", {})
    graph = symalg.trace(Call(F.hardtanh, min_val=0.0, max_val=6.0), example(), tracer=tracer)
    assert _ops(graph) == ["linear", "relu6", "linear"]
