"""Front ends (spec strings, the Spec builder, nn.Sequential) and the architecture graph schema."""
import math

import networkx as nx
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import symalg
from symalg import Architecture, Spec, SpecError, from_torch, parse, to_module
from symalg.frontend.spec import to_spec_string
from symalg.ir.architecture import validate

n, h, m, k = sp.symbols("n h m k", integer=True, positive=True)


def _same_graph(a: Architecture, b: Architecture) -> bool:
    return nx.utils.graphs_equal(a.graph, b.graph)


def _edges(arch):
    return [(u, v, data["features"], data["axis"]) for u, v, data in arch.graph.edges(data=True)]


# -- parse: widths, bias, hyper-parameters -------------------------------------------------------
def test_parse_integer_widths():
    arch = parse("linear(3, 5) -> relu -> linear(5, 2)")
    assert arch.layer_names == ["0", "1", "2"]
    assert arch.linear_layers == ["0", "2"]
    first, second = arch.node("0"), arch.node("2")
    assert (first["in_features"], first["out_features"], second["in_features"], second["out_features"]) == (3, 5, 5, 2)
    assert all(type(first[key]) is int for key in ("in_features", "out_features"))
    assert arch.widths == set()
    assert arch.parameter_shapes == {"0.weight": (5, 3), "0.bias": (5,), "2.weight": (2, 5), "2.bias": (2,)}


def test_parse_symbolic_widths_are_positive_integer_symbols():
    arch = parse("linear(n, h) -> relu -> linear(h, m)")
    assert arch.widths == {n, h, m}
    for symbol in arch.widths:
        assert symbol.is_integer is True and symbol.is_positive is True
    assert arch.node("0")["in_features"] == n and arch.node("0")["out_features"] == h
    assert arch.node("2")["in_features"] == h and arch.node("2")["out_features"] == m
    assert arch.parameter_shapes == {"0.weight": (h, n), "0.bias": (h,), "2.weight": (m, h), "2.bias": (m,)}


def test_parse_mixed_widths_and_whitespace():
    arch = parse("linear(n,4)->tanh->linear( 4 , 1 )")
    assert arch.widths == {n}
    assert arch.parameter_shapes == {"0.weight": (4, n), "0.bias": (4,), "2.weight": (1, 4), "2.bias": (1,)}
    assert _same_graph(arch, parse("linear(n, 4) -> tanh -> linear(4, 1)"))


@pytest.mark.parametrize("spec, biases", [
    ("linear(n, h, bias=False) -> relu -> linear(h, m)", [None, "2.bias"]),
    ("linear(n, h) -> relu -> linear(h, m, bias=False)", ["0.bias", None]),
    ("linear(n, h, bias=False) -> relu -> linear(h, m, bias=False)", [None, None]),
    ("linear(n, h, bias=True) -> relu -> linear(h, m)", ["0.bias", "2.bias"]),
])
def test_parse_bias_false_per_layer(spec, biases):
    arch = parse(spec)
    assert [arch.node(v)["bias"] for v in arch.linear_layers] == biases
    assert [arch.node(v)["weight"] for v in arch.linear_layers] == ["0.weight", "2.weight"]
    expected = {"0.weight", "2.weight"} | {bias for bias in biases if bias}
    assert set(arch.parameter_shapes) == expected


@pytest.mark.parametrize("spec, op, params", [
    ("leaky_relu(slope=0.2)", "leaky_relu", {"slope": sp.Rational(1, 5)}),
    ("leaky_relu", "leaky_relu", {"slope": sp.Rational(1, 100)}),
    ("leaky_relu(slope=1)", "leaky_relu", {"slope": 1}),
    ("relu_pow(alpha=3)", "relu_pow", {"alpha": 3}),
    ("relu_pow", "relu_pow", {"alpha": 2}),
    ("relu", "relu", {}),
    ("radial", "radial", {}),
])
def test_parse_hyper_parameters(spec, op, params):
    arch = parse(f"linear(n, h) -> {spec} -> linear(h, m)")
    node = arch.node("1")
    assert node["kind"] == "activation" and node["op"] == op and node["module"] is None
    assert node["params"] == params
    for value in node["params"].values():
        assert isinstance(value, sp.Rational)  # exact, not a float


def test_parse_substitutes_widths():
    arch = parse("linear(n, h) -> tanh -> linear(h, 1)", h=4)
    assert arch.widths == {n}
    assert arch.node("0")["out_features"] == 4 and arch.node("2")["in_features"] == 4


def test_parse_accepts_every_front_end_form():
    arch = parse("linear(2, 3) -> relu -> linear(3, 1)")
    assert parse(arch) is arch
    assert _same_graph(parse(Spec().linear(2, 3).relu().linear(3, 1)), arch)
    assert _same_graph(parse(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))), arch)
    assert _same_graph(parse(arch.graph.copy()), arch)


def test_repr_shows_the_spec_string():
    assert repr(parse("linear(n, h) -> leaky_relu(slope=0.2) -> linear(h, m, bias=False)")) == \
        "Architecture('linear(n, h) -> leaky_relu(slope=0.2) -> linear(h, m, bias=False)')"


# -- the Spec builder ------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, built", [
    ("linear(n, h) -> relu -> linear(h, m)", lambda: Spec().linear("n", "h").relu().linear("h", "m")),
    ("linear(n, h) -> leaky_relu(slope=0.2) -> linear(h, m, bias=False)",
     lambda: Spec().linear("n", "h").leaky_relu(slope=0.2).linear("h", "m", bias=False)),
    ("linear(3, 5) -> relu_pow(alpha=3) -> linear(5, 2)",
     lambda: Spec().linear(3, 5).activation("relu_pow", alpha=3).linear(5, 2)),
    ("linear(n, h) -> tanh -> linear(h, k) -> radial -> linear(k, m)",
     lambda: Spec().linear("n", "h").tanh().linear("h", "k").radial().linear("k", "m")),
    ("linear(n, h) -> linear(h, m)", lambda: Spec().linear(n, h).linear(h, m)),
    ("linear(n, h) -> sigmoid", lambda: Spec().linear("n", "h").sigmoid()),
])
def test_spec_builder_gives_the_same_graph_as_the_string(spec, built):
    from_builder = built().build()
    assert isinstance(from_builder, Architecture)
    assert _same_graph(from_builder, parse(spec))
    assert to_spec_string(from_builder) == to_spec_string(parse(spec))


def test_spec_builder_accepts_sympy_symbols_without_assumptions():
    arch = Spec().linear(sp.Symbol("n"), sp.Symbol("h")).relu().linear(sp.Symbol("h"), 2).build()
    assert arch.widths == {n, h}
    assert _same_graph(arch, parse("linear(n, h) -> relu -> linear(h, 2)"))


# -- to_spec_string round trip ---------------------------------------------------------------------
ROUND_TRIP = [
    "linear(n, h) -> relu -> linear(h, m)",
    "linear(n, h, bias=False) -> identity -> linear(h, m, bias=False)",
    "linear(3, 5) -> leaky_relu(slope=0.2) -> linear(5, 4) -> tanh -> linear(4, 2)",
    "linear(n, h) -> relu_pow(alpha=3) -> linear(h, k) -> sigmoid -> linear(k, m)",
    "linear(n, h) -> gelu -> linear(h, k) -> silu -> linear(k, m) -> softplus -> linear(m, 1)",
    "linear(n, h) -> radial -> linear(h, m)",
    "linear(n, h) -> linear(h, m)",
]


@pytest.mark.parametrize("spec", ROUND_TRIP)
def test_to_spec_string_round_trip(spec):
    arch = parse(spec)
    assert to_spec_string(arch) == spec
    again = parse(to_spec_string(arch))
    assert _same_graph(again, arch)


_WIDTH = st.one_of(st.integers(1, 9), st.sampled_from(["n", "h", "k", "m", "w_1"]))
_ACTIVATION = st.one_of(
    st.sampled_from(["relu", "tanh", "sigmoid", "gelu", "silu", "softplus", "identity", "radial"]),
    st.integers(1, 4).map(lambda alpha: f"relu_pow(alpha={alpha})"),
)


@st.composite
def _specs(draw):
    widths = draw(st.lists(_WIDTH, min_size=2, max_size=5))
    layers = []
    for index, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        bias = "" if draw(st.booleans()) else ", bias=False"
        layers.append(f"linear({n_in}, {n_out}{bias})")
        if index < len(widths) - 2 and draw(st.booleans()):
            layers.append(draw(_ACTIVATION))
    return " -> ".join(layers)


@settings(max_examples=60, deadline=None)
@given(_specs())
def test_round_trip_and_builder_property(spec):
    arch = parse(spec)
    assert to_spec_string(arch) == spec
    assert _same_graph(parse(to_spec_string(arch)), arch)
    builder = Spec()
    for layer in spec.split(" -> "):
        if layer.startswith("linear("):
            args = [a.strip() for a in layer[len("linear("):-1].split(",")]
            widths = [int(a) if a.isdigit() else a for a in args[:2]]
            builder.linear(*widths, bias=len(args) == 2)
        elif "(" in layer:
            builder.activation(layer.split("(")[0], alpha=int(layer.split("=")[1][:-1]))
        else:
            getattr(builder, layer)()
    assert _same_graph(builder.build(), arch)
    assert len(arch.linear_layers) == spec.count("linear(")
    axes = [axis for *_, axis in _edges(arch)]
    assert axes[0] == "x" and axes[-1] == "y"


def test_to_spec_string_canonicalises():
    assert to_spec_string(parse("linear(n,h)->leaky_relu(slope=0.2)->linear(h,m,bias=False)")) == \
        "linear(n, h) -> leaky_relu(slope=0.2) -> linear(h, m, bias=False)"
    assert to_spec_string(parse("linear(n, h) -> leaky_relu -> linear(h, m)")) == \
        "linear(n, h) -> leaky_relu(slope=0.01) -> linear(h, m)"


def test_to_spec_string_round_trips_a_torch_model():
    model = nn.Sequential(nn.Linear(3, 5), nn.LeakyReLU(0.2), nn.Sequential(nn.Linear(5, 4), nn.Tanh()),
                          nn.Linear(4, 2, bias=False))
    text = to_spec_string(parse(model))
    assert text == "linear(3, 5) -> leaky_relu(slope=0.2) -> linear(5, 4) -> tanh -> linear(4, 2, bias=False)"
    # node names differ (nested "2.0" vs "2"), the layers do not
    parsed = parse(text)
    torch_arch = parse(model)
    assert ([torch_arch.node(v)["op"] for v in torch_arch.layer_names]
            == [parsed.node(v)["op"] for v in parsed.layer_names])


# -- parse(nn.Sequential) reads a chain as a spec; from_torch traces any model --------------------------
def test_from_torch_always_returns_the_one_graph():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    for graph in (from_torch(model), from_torch(model, (x,)), from_torch(model, x),
                  from_torch(model, example_inputs=(x,))):
        assert isinstance(graph, symalg.ModelGraph) and graph.tracer == "fx"
        assert graph.parameter_shapes == {k: tuple(v.shape) for k, v in model.named_parameters()}
    assert from_torch(model).example_inputs is None
    with pytest.raises(SpecError, match="traced without example_inputs.*pass certify=False"):
        symalg.derive(from_torch(model))
    uncertified = symalg.derive(from_torch(model), certify=False)
    certified = symalg.derive(from_torch(model, (x,)))
    assert [s.label for s in uncertified.symmetries] == [s.label for s in certified.symmetries] == \
        ["PositiveScaling(4, alpha=1) on 0", "S(4) on 0"]
    assert uncertified.certification is None and certified.certified
    with pytest.raises(SpecError, match="from_torch: example_inputs must be a tensor or a tuple of tensors, got list"):
        from_torch(model, [x])
    with pytest.raises(SpecError,
                       match="failed in Sequential: TypeError: got an unexpected keyword argument 'catalogue'"):
        from_torch(model, (x,), catalogue=symalg.CATALOGUE)  # a graph holds no catalogue: derive(graph, catalogue=...)


SUPPORTED = [
    (nn.ReLU(), "relu", "relu", {}),
    (nn.LeakyReLU(), "leaky_relu", "leaky_relu", {"slope": sp.Rational(1, 100)}),
    (nn.LeakyReLU(negative_slope=0.2), "leaky_relu(slope=0.2)", "leaky_relu", {"slope": sp.Rational(1, 5)}),
    (nn.Tanh(), "tanh", "tanh", {}),
    (nn.Sigmoid(), "sigmoid", "sigmoid", {}),
    (nn.GELU(), "gelu", "gelu", {}),
    (nn.SiLU(), "silu", "silu", {}),
    (nn.Softplus(), "softplus", "softplus", {}),
    (nn.Identity(), "identity", "identity", {}),
    (nn.GELU(approximate="tanh"), "gelu_tanh", "gelu_tanh", {}),
    (nn.Hardswish(), "hardswish", "hardswish", {}),
    (nn.Hardsigmoid(), "hardsigmoid", "hardsigmoid", {}),
    (nn.Hardtanh(), "hardtanh", "hardtanh", {}),
    (nn.ReLU6(), "relu6", "relu6", {}),
    (nn.ELU(), "elu", "elu", {"alpha": 1}),
    (nn.ELU(alpha=0.5), "elu(alpha=0.5)", "elu", {"alpha": sp.Rational(1, 2)}),
    (nn.Mish(), "mish", "mish", {}),
    (nn.SELU(), "selu", "selu", {}),
    (symalg.catalogue.modules.Activation("radial"), "radial", "radial", {}),
    (symalg.catalogue.modules.Activation("relu_pow", alpha=3), "relu_pow(alpha=3)", "relu_pow", {"alpha": 3}),
    (symalg.catalogue.modules.Activation("leaky_relu", slope=0.2), "leaky_relu(slope=0.2)", "leaky_relu",
     {"slope": sp.Rational(1, 5)}),
]
SUPPORTED_IDS = [f"{type(s[0]).__name__}-{s[1]}" for s in SUPPORTED]


@pytest.mark.parametrize("module, spec, op, params", SUPPORTED, ids=SUPPORTED_IDS)
def test_from_torch_supported_activations(module, spec, op, params):
    model = nn.Sequential(nn.Linear(3, 4), module, nn.Linear(4, 2))
    arch = parse(model)
    node = arch.node("1")
    assert node == {"kind": "activation", "op": op, "params": params, "module": None}
    # the same graph as the equivalent spec string
    assert _same_graph(arch, parse(f"linear(3, 4) -> {spec} -> linear(4, 2)"))
    assert symalg.to_graph(arch).graph.nodes["1"]["op"] == op
    # the spec route and the traced route claim the same groups
    traced = symalg.derive(from_torch(model.double(), (torch.randn(6, 3, dtype=torch.float64),)))
    assert [s.group.name for s in symalg.derive(arch).symmetries] == [s.group.name for s in traced.symmetries]


@pytest.mark.parametrize("module, spec, op, params", SUPPORTED, ids=SUPPORTED_IDS)
def test_from_torch_then_to_module_computes_the_same_function(module, spec, op, params):
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, dtype=torch.float64), module, nn.Linear(4, 2, dtype=torch.float64))
    rebuilt = to_module(parse(model), dtype=torch.float64)
    rebuilt.load_state_dict(model.state_dict())
    x = torch.randn(16, 3, generator=gen, dtype=torch.float64) * 3
    torch.testing.assert_close(rebuilt(x), model(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("slope", [0.1, 1 / math.sqrt(2), (math.sqrt(5) - 1) / 2])
def test_from_torch_leaky_relu_with_any_torch_slope(slope):
    # torch's negative_slope is an arbitrary float; the architecture must keep its value and the
    # rebuilt module must compute torch's function.
    model = nn.Sequential(nn.Linear(2, 3, dtype=torch.float64), nn.LeakyReLU(negative_slope=slope),
                          nn.Linear(3, 1, dtype=torch.float64))
    arch = parse(model)
    assert float(arch.node("1")["params"]["slope"]) == pytest.approx(slope, rel=1e-15)
    rebuilt = to_module(arch, dtype=torch.float64)
    rebuilt.load_state_dict(model.state_dict())
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(rebuilt(x), model(x))


def test_from_torch_nested_sequentials_and_parameter_names():
    model = nn.Sequential(
        nn.Sequential(nn.Linear(3, 5), nn.ReLU()),
        nn.Sequential(nn.Sequential(nn.Linear(5, 4, bias=False), nn.Tanh())),
        nn.Linear(4, 2),
    )
    arch = parse(model)
    assert arch.layer_names == ["0.0", "0.1", "1.0.0", "1.0.1", "2"]
    assert arch.linear_layers == ["0.0", "1.0.0", "2"]
    params = dict(model.named_parameters())
    assert set(arch.parameter_shapes) == set(params)
    for name, shape in arch.parameter_shapes.items():
        assert tuple(params[name].shape) == shape
    assert arch.node("1.0.0")["bias"] is None
    assert _edges(arch) == [("input", "0.0", 3, "x"), ("0.0", "0.1", 5, "h1"), ("0.1", "1.0.0", 5, "h1"),
                            ("1.0.0", "1.0.1", 4, "h2"), ("1.0.1", "2", 4, "h2"), ("2", "output", 2, "y")]
    assert arch.widths_from_params(params) == {}


def test_from_torch_parameter_names_match_named_parameters_of_a_flat_model():
    model = nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.Linear(5, 5), nn.Identity(), nn.Linear(5, 1, bias=False))
    arch = parse(model)
    params = dict(model.named_parameters())
    assert arch.parameter_shapes == {name: tuple(p.shape) for name, p in params.items()}
    analysis = symalg.derive(arch)
    assert set(analysis.model_graph.parameter_shapes) == set(params)
    assert {t for s in analysis.symmetries for t in s.tensors} <= set(params)
    assert from_torch(model).parameter_shapes == arch.parameter_shapes


@pytest.mark.parametrize("module", [nn.CELU(), nn.Hardtanh(-2.0, 3.0), nn.Softplus(beta=2),
                                    nn.Softsign(), nn.Tanhshrink()], ids=lambda mod: repr(mod))
def test_unknown_shape_preserving_module_is_an_opaque_node(module):
    model = nn.Sequential(nn.Linear(3, 4), module, nn.Linear(4, 2))
    arch = parse(model)
    node = arch.node("1")
    assert node["kind"] == "activation"
    assert node["op"].startswith(type(module).__name__)  # Hardtanh(min_val=-2.0, max_val=3.0), Softplus(beta=2, ...)
    assert node["module"] is module
    assert node["params"] == {}
    analysis = symalg.derive(arch)
    assert analysis.symmetries == ()
    assert [(b.node, b.site) for b in analysis.blocked] == [("1", "0")]
    assert "not in the equivariance catalogue" in analysis.blocked[0].reason


@pytest.mark.parametrize("convert", [lambda model: model.float(), lambda model: model.to("meta")],
                         ids=["float32-model", "meta-device-model"])
def test_sequential_with_a_parameterised_layer_is_traced_in_its_own_dtype_or_device(convert):
    # A layer with parameters takes the Sequential off the chain schema: it is traced with fx, and the
    # shape pass runs on inputs of the model's own dtype and device.
    model = convert(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)))
    reference = next(model.parameters())
    graph = from_torch(model, (torch.zeros(2, 3, dtype=reference.dtype, device=reference.device),))
    assert isinstance(graph, symalg.ModelGraph)
    assert [graph.node(v)["op"] for v in graph.nodes] == ["input", "linear", "layer_norm", "linear", "output"]
    assert graph.node("_1")["params"] == {"weight": "1.weight", "bias": "1.bias"}


def test_opaque_module_survives_to_module():
    module = nn.CELU()
    model = nn.Sequential(nn.Linear(3, 4), module, nn.Linear(4, 2))
    rebuilt = to_module(parse(model), dtype=torch.float32)
    assert rebuilt[1] is module


# -- graph schema ----------------------------------------------------------------------------------
def test_graph_schema_nodes_and_edges():
    arch = parse("linear(n, h) -> relu -> linear(h, k, bias=False) -> leaky_relu(slope=0.2) -> linear(k, m)")
    graph = arch.graph
    assert isinstance(graph, nx.DiGraph)
    assert set(graph.nodes) == {"input", "0", "1", "2", "3", "4", "output"}
    assert all(isinstance(v, str) for v in graph.nodes)
    assert graph.nodes["input"] == {"kind": "input", "op": "input", "features": n}
    assert graph.nodes["output"] == {"kind": "output", "op": "output", "features": m}
    assert graph.nodes["0"] == {"kind": "linear", "op": "linear", "in_features": n, "out_features": h,
                                "weight": "0.weight", "bias": "0.bias"}
    assert graph.nodes["2"] == {"kind": "linear", "op": "linear", "in_features": h, "out_features": k,
                                "weight": "2.weight", "bias": None}
    assert graph.nodes["1"] == {"kind": "activation", "op": "relu", "params": {}, "module": None}
    assert graph.nodes["3"] == {"kind": "activation", "op": "leaky_relu", "params": {"slope": sp.Rational(1, 5)},
                                "module": None}
    assert _edges(arch) == [("input", "0", n, "x"), ("0", "1", h, "h1"), ("1", "2", h, "h1"),
                            ("2", "3", k, "h2"), ("3", "4", k, "h2"), ("4", "output", m, "y")]
    for _, _, data in graph.edges(data=True):
        assert set(data) == {"features", "axis"}
    assert list(nx.topological_sort(graph)) == ["input", "0", "1", "2", "3", "4", "output"]
    validate(graph)


@pytest.mark.parametrize("spec, axes", [
    ("linear(n, m)", ["x", "y"]),
    ("linear(n, h) -> linear(h, m)", ["x", "h1", "y"]),
    ("linear(n, h) -> relu -> linear(h, m)", ["x", "h1", "h1", "y"]),
    ("linear(n, h) -> linear(h, k) -> linear(k, m)", ["x", "h1", "h2", "y"]),
    ("linear(n, h) -> tanh", ["x", "y", "y"]),
])
def test_axis_names(spec, axes):
    assert [axis for *_, axis in _edges(parse(spec))] == axes


def test_edge_widths_follow_the_layers():
    arch = parse("linear(2, 7) -> tanh -> linear(7, 3) -> relu -> linear(3, 1)")
    for u, v, data in arch.graph.edges(data=True):
        source = arch.graph.nodes[u]
        produced = source.get("out_features", source.get("features"))
        if source["kind"] == "activation":
            produced = arch.graph.edges[next(iter(arch.graph.predecessors(u))), u]["features"]
        assert data["features"] == produced
        target = arch.graph.nodes[v]
        if target["kind"] == "linear":
            assert target["in_features"] == data["features"]


def test_architecture_of_a_hand_built_graph():
    graph = nx.DiGraph()
    graph.add_node("input", kind="input", op="input", features=2)
    graph.add_node("lin", kind="linear", op="linear", in_features=2, out_features=3, weight="lin.weight", bias=None)
    graph.add_node("output", kind="output", op="output", features=3)
    graph.add_edge("input", "lin", features=2, axis="x")
    graph.add_edge("lin", "output", features=3, axis="y")
    arch = Architecture(graph)
    assert arch.layer_names == ["lin"] and arch.parameter_shapes == {"lin.weight": (3, 2)}


# -- Architecture.subs, widths, parameter_shapes, widths_from_params -----------------------------
def test_subs_with_string_and_symbol_keys():
    arch = parse("linear(n, h) -> relu -> linear(h, m)")
    half = arch.subs({"h": 8})
    assert half.widths == {n, m}
    assert half.parameter_shapes == {"0.weight": (8, n), "0.bias": (8,), "2.weight": (m, 8), "2.bias": (m,)}
    assert [data["features"] for *_, data in half.graph.edges(data=True)] == [n, 8, 8, m]
    full = arch.subs({n: 3, "h": 5, m: 2})
    assert full.widths == set()
    assert all(type(full.node(v)[key]) is int for v in full.linear_layers for key in ("in_features", "out_features"))
    assert full.graph.nodes["input"]["features"] == 3 and full.graph.nodes["output"]["features"] == 2
    # the original is untouched
    assert arch.widths == {n, h, m} and arch.node("0")["out_features"] == h
    assert _same_graph(full, parse("linear(3, 5) -> relu -> linear(5, 2)"))


def test_subs_renames_a_width():
    assert to_spec_string(parse("linear(n, h) -> relu -> linear(h, m)").subs({"h": sp.Symbol("k")})) == \
        "linear(n, k) -> relu -> linear(k, m)"


def test_subs_unknown_width():
    with pytest.raises(SpecError, match=r"subs: no width named \['q'\]"):
        parse("linear(n, h) -> relu -> linear(h, m)").subs({"q": 3})


@pytest.mark.parametrize("value", [0, -4])
def test_subs_non_positive_width_names_the_width(value):
    with pytest.raises(SpecError, match=rf"\bh\b.*{value}|{value}.*\bh\b"):
        parse("linear(n, h) -> relu -> linear(h, m)").subs({"h": value})


def test_widths_and_parameter_shapes():
    arch = parse("linear(n, h, bias=False) -> relu -> linear(h, 3)")
    assert arch.widths == {n, h}
    assert arch.parameter_shapes == {"0.weight": (h, n), "2.weight": (3, h), "2.bias": (3,)}
    assert parse("linear(2, 3) -> relu -> linear(3, 1)").widths == set()


def test_widths_from_params():
    arch = parse("linear(n, h) -> relu -> linear(h, m)")
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    widths = arch.widths_from_params(dict(model.named_parameters()))
    assert widths == {n: 3, h: 5, m: 2}
    assert all(type(v) is int for v in widths.values())
    assert parse("linear(3, h) -> relu -> linear(h, 2)").widths_from_params(dict(model.named_parameters())) == {h: 5}
    # extra entries (velocities, buffers) are ignored
    assert arch.widths_from_params({**dict(model.named_parameters()), "extra": torch.zeros(1)}) == widths


def _params(**changes):
    params = {"0.weight": torch.zeros(5, 3), "0.bias": torch.zeros(5), "2.weight": torch.zeros(2, 5),
              "2.bias": torch.zeros(2)}
    params.update(changes)
    return {k: v for k, v in params.items() if v is not None}


@pytest.mark.parametrize("spec, params, message", [
    ("linear(n, h) -> relu -> linear(h, m)", _params(**{"2.bias": None}), r"'2\.bias' is missing"),
    ("linear(n, h) -> relu -> linear(h, m)", _params(**{"0.weight": None}), r"'0\.weight' is missing"),
    ("linear(n, h) -> relu -> linear(h, m)", _params(**{"2.weight": torch.zeros(2, 6)}), r"'2\.weight'.*\bh\b"),
    ("linear(n, h) -> relu -> linear(h, m)", _params(**{"2.bias": torch.zeros(3)}), r"'2\.bias'.*\bm\b"),
    ("linear(n, h) -> relu -> linear(h, m)", _params(**{"2.bias": torch.zeros(2, 1)}), r"'2\.bias'.*dimensions"),
    ("linear(3, h) -> relu -> linear(h, 2)", _params(**{"0.weight": torch.zeros(5, 4)}), r"'0\.weight'.*\(5, 4\)"),
    ("linear(3, 5) -> relu -> linear(5, 2)", _params(**{"2.weight": torch.zeros(2, 4)}), r"'2\.weight'"),
])
def test_widths_from_params_errors(spec, params, message):
    with pytest.raises(SpecError, match=message):
        parse(spec).widths_from_params(params)


def test_to_module_names_parameters_like_the_architecture():
    arch = parse("linear(n, h) -> relu -> linear(h, m, bias=False)").subs({"n": 3, "h": 4, "m": 2})
    model = to_module(arch)
    assert {k: tuple(v.shape) for k, v in model.named_parameters()} == arch.parameter_shapes
    assert all(p.dtype == torch.float64 for p in model.parameters())
    with pytest.raises(SpecError, match=r"to_module.*\['h'\]"):
        to_module(parse("linear(3, h) -> relu -> linear(h, 2)"))


# -- errors name the offending layer / parameter ---------------------------------------------------
@pytest.mark.parametrize("spec, message", [
    # unknown activation
    ("linear(n, h) -> swish -> linear(h, m)", r"layer 1: unknown layer 'swish'"),
    ("linear(n, h) -> relu -> linear(h, k) -> Relu -> linear(k, m)", r"layer 3: unknown layer 'Relu'"),
    # mismatched widths
    ("linear(n, h) -> relu -> linear(k, m)", r"layer 2 \(linear\): in_features=k but the previous layer produces h"),
    ("linear(3, 4) -> relu -> linear(5, 2)", r"layer 2 \(linear\): in_features=5 .* produces 4"),
    ("linear(3, 4) -> linear(4, 2) -> linear(3, 1)", r"layer 2 \(linear\): in_features=3 .* produces 2"),
    # zero and negative widths
    ("linear(0, h) -> relu -> linear(h, m)", r"layer 0 \(linear\) in_features: width 0 must be positive"),
    ("linear(n, 0) -> relu -> linear(0, m)", r"layer 0 \(linear\) out_features: width 0"),
    ("linear(n, h) -> relu -> linear(h, -3)", r"layer 2 \(linear\) out_features: width -3 must be positive"),
    ("linear(-1, h)", r"layer 0 .*-1"),
    ("linear(2.5, h)", r"layer 0 .*2\.5"),
    # empty network
    ("", r"empty"),
    ("   ", r"empty"),
    ("linear(n, h) -> ", r"empty layer"),
    # an activation first / two activations in a row
    ("relu -> linear(n, h)", r"layer 0 \(relu\): an activation before the first linear layer"),
    ("tanh", r"layer 0 \(tanh\)"),
    ("linear(n, h) -> relu -> tanh -> linear(h, m)", r"layer 2 \(tanh\): two activations in a row"),
    # unknown / positional hyper-parameters
    ("linear(n, h) -> leaky_relu(alpha=2) -> linear(h, m)",
     r"layer 1: .*'leaky_relu' has no hyper-parameter \['alpha'\]"),
    ("linear(n, h) -> relu(slope=0.1) -> linear(h, m)", r"layer 1: .*'relu' has no hyper-parameter \['slope'\]"),
    ("linear(n, h) -> leaky_relu(0.2) -> linear(h, m)",
     r"layer 1 \(leaky_relu\): positional arguments are for linear\(in, out\) only"),
    # malformed layers
    ("linear(n) -> relu -> linear(h, m)", r"layer 0 \(linear\): expected linear\(in, out\)"),
    ("linear(n, h, bias=maybe) -> relu -> linear(h, m)", r"layer 0 \(linear\): bias must be True or False"),
    ("linear(n, h) -> relu -> linear(h, m, biass=False)", r"layer 2 \(linear\)"),
    ("linear(n, h) -> relu( -> linear(h, m)", r"layer 1: cannot parse"),
    ("linear(n, h+1) -> relu -> linear(h, m)", r"layer 0 \(linear\): argument 'h \+ 1'"),
])
def test_parse_errors_name_the_layer(spec, message):
    with pytest.raises(SpecError, match=message):
        parse(spec)


@pytest.mark.parametrize("build, message", [
    (lambda: Spec().linear("n", "h").swish().linear("h", "m"), r"layer 1: unknown layer 'swish'"),
    (lambda: Spec().linear("n", "h").relu().linear("k", "m"), r"layer 2 \(linear\): in_features=k"),
    (lambda: Spec().linear(3, 0), r"layer 0 \(linear\) out_features: width 0"),
    (lambda: Spec().linear(-2, 3), r"layer 0 \(linear\) in_features: width -2"),
    (lambda: Spec().linear("n", "h").leaky_relu(negative_slope=0.2).linear("h", "m"),
     r"layer 1: .*\['negative_slope'\]"),
    (lambda: Spec().relu().linear("n", "h"), r"layer 0 \(relu\)"),
    (lambda: Spec().linear("n", "h").relu().relu().linear("h", "m"), r"layer 2 \(relu\): two activations"),
    (lambda: Spec(), r"empty"),
    (lambda: Spec().linear("n", "h bad"), r"layer 0 \(linear\) out_features: width 'h bad'"),
])
def test_spec_builder_errors_name_the_layer(build, message):
    with pytest.raises(SpecError, match=message):
        build().build()


_SHARED = nn.Linear(3, 3)


@pytest.mark.parametrize("model, message", [
    (nn.ModuleList([nn.Linear(3, 4)]), r"expected a chain nn\.Sequential .* got ModuleList; trace general models"),
    (nn.Sequential(), r"empty"),
    (nn.Sequential(nn.ReLU(), nn.Linear(3, 4)), r"layer 0 \(ReLU\): an activation before the first linear layer"),
    (nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Tanh(), nn.Linear(4, 2)), r"layer 2 \(Tanh\): two activations"),
    (nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(5, 2)), r"layer 2 \(Linear\): in_features=5 .* produces 4"),
    (nn.Sequential(nn.Sequential(nn.Linear(3, 4)), nn.Sequential(nn.Linear(6, 2))), r"layer 1\.0 \(Linear\)"),
    (nn.Sequential(_SHARED, nn.Tanh(), _SHARED), r"layer 2 \(Linear\): the same module as layer 0; shared weights"),
    (nn.Sequential(nn.Linear(3, 0), nn.ReLU(), nn.Linear(0, 2)), r"layer 0 \(Linear\) out_features: width 0 must be"),
])
def test_parse_of_a_sequential_errors_name_the_layer(model, message):
    with pytest.raises(SpecError, match=message):
        parse(model)


def test_parse_reads_a_module_used_at_two_positions_at_both():
    """``named_children`` lists a reused module once; dropping its second use would analyse another network (here a
    linear-linear site, GL(3), where the model has tanh)."""
    shared = nn.Tanh()
    arch = parse(nn.Sequential(nn.Linear(2, 3), shared, nn.Linear(3, 3), shared, nn.Linear(3, 1)))
    assert str(arch) == "Architecture('linear(2, 3) -> tanh -> linear(3, 3) -> tanh -> linear(3, 1)')"
    assert sorted(s.group.name for s in symalg.derive(arch).symmetries) == ["S(3)", "S(3)", "SignFlips(3)",
                                                                          "SignFlips(3)"]
class _RootScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.scale = nn.Linear(3, 2), nn.Parameter(torch.ones(0))

    def forward(self, x):
        return self.fc(x) * self.scale.sum()


@pytest.mark.parametrize("make, message", [
    (lambda: nn.Sequential(nn.Linear(3, 0), nn.ReLU(), nn.Linear(0, 2)),
     r"parameter '0\.weight' of module '0' \(Linear\) has shape \(0, 3\): a layer of width 0"),
    (lambda: nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(0, bias=False))),
     r"parameter '1\.1\.weight' of module '1\.1' \(LayerNorm\) has shape \(0,\)"),
    (lambda: nn.Sequential(nn.Conv1d(3, 0, 1), nn.ReLU()), r"parameter '0\.weight' of module '0' \(Conv1d\)"),
    (_RootScale, r"parameter 'scale' of the model \(_RootScale\) has shape \(0,\)"),
])
@pytest.mark.parametrize("tracer", ["auto", "export"])
def test_from_torch_refuses_a_layer_of_width_0_naming_the_parameter(make, message, tracer):
    # A width-0 layer has no neuron for a group to act on (it once gave PositiveScaling(0) and a crashing verify).
    x = torch.randn(2, 3, 5) if "Conv1d" in message else torch.randn(2, 3)
    with pytest.raises(SpecError, match=message):
        symalg.trace(make(), (x,), tracer=tracer)
    if tracer == "auto":
        with pytest.raises(SpecError, match=message):
            from_torch(make())                               # without example inputs too


@pytest.mark.parametrize("route", [
    lambda: symalg.derive("linear(3, 0) -> relu -> linear(0, 2)"),
    lambda: symalg.to_graph(Spec().linear(3, 0).relu().linear(0, 2).build()),
    lambda: symalg.derive(parse(nn.Sequential(nn.Linear(3, 0), nn.ReLU(), nn.Linear(0, 2)))),
], ids=["spec-string", "builder", "parsed-sequential"])
def test_spec_routes_refuse_a_layer_of_width_0_naming_it(route):
    with pytest.raises(SpecError, match=r"layer 0 \((linear|Linear)\) out_features: width 0 must be positive"):
        route()


def test_from_torch_errors_name_the_model():
    with pytest.raises(SpecError, match=r"torch\.fx cannot trace ModuleList"):
        from_torch(nn.ModuleList([nn.Linear(3, 4)]))


def test_parse_rejects_other_objects():
    with pytest.raises(SpecError, match="cannot parse an architecture from int"):
        parse(42)
    with pytest.raises(SpecError, match="expected a chain nn.Sequential .* got Linear"):
        parse(nn.Linear(2, 3))


def _hand_built(cycle=False):
    graph = nx.DiGraph()
    graph.add_node("input", kind="input", op="input", features=2)
    graph.add_node("0", kind="linear", op="linear", in_features=2, out_features=2, weight="0.weight", bias=None)
    graph.add_node("1", kind="activation", op="relu", params={}, module=None)
    graph.add_node("2", kind="linear", op="linear", in_features=2, out_features=2, weight="2.weight", bias=None)
    graph.add_node("output", kind="output", op="output", features=2)
    graph.add_edge("input", "0", features=2, axis="x")
    graph.add_edge("0", "1", features=2, axis="h1")
    graph.add_edge("1", "2", features=2, axis="h1")
    graph.add_edge("2", "output", features=2, axis="y")
    if cycle:
        graph.add_edge("2", "0", features=2, axis="h1")
    return graph


@pytest.mark.parametrize("check", [validate, Architecture, parse], ids=["validate", "Architecture", "parse"])
def test_cycle_in_a_hand_built_graph(check):
    validate(_hand_built())
    with pytest.raises(SpecError, match=r"layer [012]: the graph has a cycle through \['[012]', '[012]', '[012]'\]"):
        check(_hand_built(cycle=True))


def test_two_node_cycle_names_its_layers():
    graph = _hand_built()
    graph.remove_node("1")
    graph.add_edge("0", "2", features=2, axis="h1")
    graph.add_edge("2", "0", features=2, axis="h1")
    with pytest.raises(SpecError, match=r"cycle through \['(0', '2|2', '0)'\]"):
        validate(graph)


def _broken(edit):
    graph = _hand_built()
    edit(graph)
    return graph


@pytest.mark.parametrize("edit, message", [
    (lambda g: g.remove_node("output"), r"no 'output' node"),
    (lambda g: g.remove_node("input"), r"no 'input' node"),
    (lambda g: g.nodes["1"].update(kind="conv"), r"layer 1: unknown node kind 'conv'"),
    (lambda g: g.nodes["2"].update(in_features=3), r"layer 2 \(linear\): in_features=3 but the previous layer 1"),
    (lambda g: g.edges["0", "1"].update(features=5), r"layer 0: produces 2 features but its edge to 1 says 5"),
    (lambda g: g.edges["0", "1"].update(features=0), r"edge 0->1: width 0 must be positive"),
    (lambda g: g.nodes["0"].update(weight=None), r"layer 0 \(linear\): no weight parameter name"),
    (lambda g: (g.add_node("3", kind="activation", op="relu", params={}, module=None),
                g.add_edge("0", "3", features=2, axis="h1")), r"layer 0: expected one outgoing edge, found 2"),
    (lambda g: [g.nodes[v].update(kind="activation", op="relu", params={}, module=None) for v in ("0", "2")],
     r"empty"),
    # widths must agree along every edge: into the output node ...
    (lambda g: g.nodes["output"].update(features=7), r"output.*\b(7|2)\b"),
    # ... and through an activation, which cannot change the width
    (lambda g: (g.edges["1", "2"].update(features=5), g.nodes["2"].update(in_features=5)), r"layer [12]\b.*\b(5|2)\b"),
], ids=["no-output", "no-input", "unknown-kind", "in-features-mismatch", "edge-width-mismatch", "zero-edge-width",
        "no-weight-name", "branching", "no-linear-layer", "output-width-mismatch", "activation-changes-width"])
def test_validate_errors_name_the_node(edit, message):
    with pytest.raises(SpecError, match=message):
        validate(_broken(edit))
    with pytest.raises(SpecError, match=message):
        Architecture(_broken(edit))


def test_validate_rejects_a_non_digraph():
    with pytest.raises(SpecError, match="expected a networkx.DiGraph, got Graph"):
        validate(nx.Graph())


def test_hyper_parameters_accept_arithmetic_of_numbers_exactly():
    arch = parse("linear(3, 5) -> leaky_relu(slope=1/5) -> linear(5, 4)")
    assert arch.node("1")["params"]["slope"] == sp.Rational(1, 5)
    with pytest.raises(SpecError, match="layer 1 .*must be a number or a name"):
        parse("linear(3, 5) -> leaky_relu(slope=__import__('os')) -> linear(5, 4)")


@pytest.mark.parametrize("spec, message", [
    ("linear(2, 3) -> relu_pow(alpha=0) -> linear(3, 1)", "alpha=0 must be positive"),
    ("linear(2, 3) -> relu_pow(alpha=-1) -> linear(3, 1)", "alpha=-1 must be positive"),
    ("linear(2, 3) -> relu_pow(alpha=x) -> linear(3, 1)", "alpha=x must be a finite real number"),
    ("linear(2, 3) -> leaky_relu(slope=nan) -> linear(3, 1)", "must be a finite real number"),
])
def test_invalid_hyper_parameters_name_the_layer(spec, message):
    with pytest.raises(SpecError, match=rf"layer 1: .*{message}"):
        parse(spec)
