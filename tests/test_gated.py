"""Gated MLPs ``down(act(gate x) ⊙ up x)``: the elementwise product of two sites (``symalg.catalogue.products``).

Positive claims are checked on the model (invariance of every output under sampled group elements), by the
certified orbit rank, and by the conserved quantities along gradient flow; negative controls check that what
is not claimed indeed changes the outputs, and that what cannot pass a product (other widths, a parameter, a
product read by an op that does not know products) is refused with a note naming the node.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

import symalg
from symalg.verification.certification import assert_claims_hold, claim_errors
from symalg.verification.checks import integrate_gradient_flow, loss_gradients

N, H, M = 3, 5, 2

PRODUCTS = {"*": lambda a, b: a * b, "torch.mul": torch.mul, ".mul": lambda a, b: a.mul(b)}


class Gated(nn.Module):
    """``down(act(gate x) ⊙ up x)``; ``order="up-first"`` writes ``up x ⊙ act(gate x)``."""

    def __init__(self, act, bias=True, product="*", order="gate-first", gate_width=H):
        super().__init__()
        self.gate, self.up = nn.Linear(N, gate_width, bias=bias), nn.Linear(N, H, bias=bias)
        self.down = nn.Linear(H, M, bias=bias)
        self.act, self.product, self.order = act, PRODUCTS[product], order

    def forward(self, x):
        a, b = self.act(self.gate(x)), self.up(x)
        return self.down(self.product(a, b) if self.order == "gate-first" else self.product(b, a))


def _derive(model, tracer="fx", shape=(6, N), **options):
    torch.manual_seed(1)
    model = model.double()
    return symalg.derive(symalg.trace(model, (torch.randn(*shape, dtype=torch.float64),), tracer=tracer), **options)


def _labels(analysis) -> list[str]:
    return sorted(s.label for s in analysis.symmetries)


def _params(analysis) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}


SCALE_UP = [f"PositiveScaling({H}, alpha=1) on up", f"SignFlips({H}) on up"]
EXPECTED = {   # the gate's activation decides the gate side; the up side is (R^×)^H = PS × SF in every case
    "swiglu": (nn.functional.silu, [f"S({H}) on gate"] + SCALE_UP, H),
    "geglu": (nn.functional.gelu, [f"S({H}) on gate"] + SCALE_UP, H),
    "reglu": (torch.relu, [f"PositiveScaling({H}, alpha=1) on gate", f"S({H}) on gate"] + SCALE_UP, 2 * H),
    "tanh": (torch.tanh, [f"S({H}) on gate", f"SignFlips({H}) on gate"] + SCALE_UP, H),
    "glu": (torch.sigmoid, [f"S({H}) on gate"] + SCALE_UP, H),   # sigmoid's affine flip: no bias absorbs its shift
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_gated_mlp_claims_hold_and_orbit_rank_is_certified(kind, bias):
    act, expected, orbit = EXPECTED[kind]
    analysis = _derive(Gated(act, bias), certify=False)
    assert _labels(analysis) == sorted(expected)
    errors = claim_errors(analysis, draws=3)
    assert max(e.error for e in errors) < 1e-12, [str(e) for e in errors]
    dimension = analysis.orbit_dimension(_params(analysis))
    assert dimension == orbit and dimension.expected == orbit
    joint = next(s for s in analysis.symmetries if s.label == f"S({H}) on gate")
    assert {"gate.weight", "up.weight", "down.weight"} <= set(joint.tensors)   # one permutation moves all three


@pytest.mark.parametrize("tracer", ["fx", "export"])
@pytest.mark.parametrize("product", sorted(PRODUCTS))
@pytest.mark.parametrize("order", ["gate-first", "up-first"])
def test_every_spelling_and_tracer_finds_the_same_groups(product, order, tracer):
    analysis = _derive(Gated(nn.functional.silu, product=product, order=order), tracer=tracer, certify=False)
    assert [s.group.name for s in sorted(analysis.symmetries, key=lambda s: s.label)] == \
        [f"PositiveScaling({H}, alpha=1)", f"S({H})", f"SignFlips({H})"]
    assert_claims_hold(analysis, draws=2)


def _mse(model, x, target):
    return lambda params: ((functional_call(model, params, (x,)) - target) ** 2).mean()


@pytest.mark.parametrize("kind", ["swiglu", "reglu"])
def test_conserved_quantities_stay_put_along_gradient_flow_and_the_gate_alone_does_not(kind):
    """``q_up = ‖up rows‖² + up_b² − ‖down columns‖²`` (and ``q_gate`` for ReGLU) per neuron do not move along
    gradient flow; for SwiGLU the same expression on the gate side (no symmetry behind it) drifts."""
    act, _, _ = EXPECTED[kind]
    analysis = _derive(Gated(act))
    model = analysis.model_graph.model
    params = _params(analysis)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(16, N, generator=generator, dtype=torch.float64)
    loss = _mse(model, x, torch.randn(16, M, generator=generator, dtype=torch.float64))
    flowed, _ = integrate_gradient_flow(loss, params, loss_gradients(loss, params), steps=40, max_move=1e-3)
    quantities = {q.name: q for q in analysis.conserved_quantities()}
    assert sorted(quantities) == (["q_gate", "q_up"] if kind == "reglu" else ["q_up"])
    for q in quantities.values():
        (before,), (after,) = q(params).values(), q(flowed).values()
        assert (after - before).abs().max() < 1e-10 * before.abs().max()

    def gate_side(p):
        return p["gate.weight"].pow(2).sum(1) + p["gate.bias"].pow(2) - p["down.weight"].pow(2).sum(0)

    drift = (gate_side(flowed) - gate_side(params)).abs().max()
    assert (drift > 1e-6) if kind == "swiglu" else (drift < 1e-10)


def test_conserved_quantity_of_up_is_what_the_group_says():
    """Written out: ``q_up[j] = ‖W_up[j]‖² + b_up[j]² − ‖W_down[:, j]‖²`` (each factor has degree 1)."""
    analysis = _derive(Gated(nn.functional.silu))
    params = _params(analysis)
    (q,) = analysis.conserved_quantities()
    (value,) = q(params).values()
    expected = params["up.weight"].pow(2).sum(1) + params["up.bias"].pow(2) - params["down.weight"].pow(2).sum(0)
    assert torch.allclose(value.flatten(), expected, rtol=1e-14, atol=1e-14)


class Square(nn.Module):
    """``down(u ⊙ u)``, ``u = up(x)``: a site multiplied by itself."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(N, H), nn.Linear(H, M)

    def forward(self, x):
        u = self.up(x)
        return self.down(u * u)


def test_square_of_a_site_has_degree_two():
    """``(d u)² = d² u²``: scaling the up rows by ``d`` moves the down columns by ``d⁻²`` (so ``q`` weighs them
    twice), and a sign flip leaves ``u²`` alone (the down columns flip twice, i.e. not at all)."""
    analysis = _derive(Square(), certify=False)
    assert _labels(analysis) == sorted([f"PositiveScaling({H}, alpha=1) on up", f"S({H}) on up",
                                        f"SignFlips({H}) on up"])
    assert_claims_hold(analysis, draws=3)
    params = _params(analysis)
    scaling = next(s for s in analysis.symmetries if s.group.kind == "PS")
    d = torch.linspace(0.5, 2.0, H, dtype=torch.float64)
    moved = scaling.apply(params, d)
    assert torch.allclose(moved["down.weight"], params["down.weight"] / d ** 2, rtol=1e-14)
    flips = next(s for s in analysis.symmetries if s.group.kind == "SF")
    g = torch.diag(torch.tensor([-1.0, 1, 1, -1, 1], dtype=torch.float64))
    moved = flips.apply(params, g)
    assert torch.equal(moved["down.weight"], params["down.weight"])
    assert torch.equal(moved["up.weight"], g @ params["up.weight"])
    (q,) = [q for q in analysis.conserved_quantities()]
    (value,) = q(params).values()
    expected = params["up.weight"].pow(2).sum(1) + params["up.bias"].pow(2) - 2 * params["down.weight"].pow(2).sum(0)
    assert torch.allclose(value.flatten(), expected, rtol=1e-14, atol=1e-14)


def _output_change(model, moved: dict, x) -> float:
    reference = model(x)
    return ((functional_call(model, moved, (x,)) - reference).norm() / reference.norm()).item()


def test_scaling_the_silu_gate_alone_is_not_claimed_and_changes_the_output():
    analysis = _derive(Gated(nn.functional.silu))
    assert not [s for s in analysis.symmetries if s.site == "gate" and s.group.kind in ("PS", "SF")]
    model, params = analysis.model_graph.model, _params(analysis)
    d = torch.linspace(0.5, 2.0, H, dtype=torch.float64)
    moved = {**params, "gate.weight": d[:, None] * params["gate.weight"], "gate.bias": d * params["gate.bias"],
             "down.weight": params["down.weight"] / d}
    assert _output_change(model, moved, torch.randn(8, N, dtype=torch.float64)) > 1e-2


def test_permuting_one_factor_alone_changes_the_output():
    """The permutation is joint: moving the up rows (and the down columns) without the gate rows is no symmetry."""
    analysis = _derive(Gated(nn.functional.silu))
    model, params = analysis.model_graph.model, _params(analysis)
    order = torch.tensor([1, 0, 2, 3, 4])
    moved = {**params, "up.weight": params["up.weight"][order], "up.bias": params["up.bias"][order],
             "down.weight": params["down.weight"][:, order]}
    assert _output_change(model, moved, torch.randn(8, N, dtype=torch.float64)) > 1e-2


def test_factors_of_different_widths_are_refused_at_the_product():
    """A width-1 gate broadcast against a width-5 up: neither site keeps anything, and the note names the node."""
    analysis = _derive(Gated(nn.functional.silu, gate_width=1), certify=False)
    assert analysis.symmetries == () or not [s for s in analysis.symmetries if s.site in ("gate", "up")]
    assert any(b.node == "mul" and b.site == "up" and "not in the equivariance catalogue" in b.reason
               for b in analysis.blocked)


class TimesInput(nn.Module):
    """``down(up(x) ⊙ x)``: a product with a value nothing acts on."""

    def __init__(self, n=H):
        super().__init__()
        self.up, self.down = nn.Linear(n, H), nn.Linear(H, M)

    def forward(self, x):
        return self.down(self.up(x) * x)


def test_product_with_data_keeps_the_scalings_but_not_the_permutations():
    analysis = _derive(TimesInput(), shape=(6, H), certify=False)
    assert _labels(analysis) == SCALE_UP
    assert_claims_hold(analysis, draws=3)
    model, params = analysis.model_graph.model, _params(analysis)
    order = torch.tensor([1, 0, 2, 3, 4])
    moved = {**params, "up.weight": params["up.weight"][order], "up.bias": params["up.bias"][order],
             "down.weight": params["down.weight"][:, order]}
    assert _output_change(model, moved, torch.randn(8, H, dtype=torch.float64)) > 1e-2


class TimesParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(N, H), nn.Linear(H, M)
        self.gain = nn.Parameter(torch.randn(H))

    def forward(self, x):
        return self.down(self.up(x) * self.gain)


class TimesRowParameter(TimesParameter):
    """The same product with a gain per batch row and unit, ``(6, H)``: not one entry per unit."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.randn(6, H))


def test_product_with_a_per_unit_parameter_is_a_diagonal_map():
    """``down(up(x) ⊙ gain)`` with one gain per unit is a layer scale: the gain moves with the unit scalings, flips
    and permutations of ``up``'s units, and every claim holds."""
    analysis = _derive(TimesParameter(), certify=False)
    assert _labels(analysis) == ["PositiveScaling(5, alpha=1) on gain", "PositiveScaling(5, alpha=1) on up",
                                 "S(5) on up", "SignFlips(5) on gain", "SignFlips(5) on up"]
    assert any("gain" in {b.tensor for b in s.bindings} for s in analysis.symmetries)
    assert_claims_hold(analysis, draws=2)


def test_product_with_a_parameter_of_another_shape_is_refused():
    analysis = _derive(TimesRowParameter(), certify=False)
    assert analysis.symmetries == ()
    assert any(b.node == "mul" and "multiplies the value by the parameter gain elementwise" in b.reason
               for b in analysis.blocked)


class Reciprocal(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(N, H), nn.Linear(H, M)

    def forward(self, x):
        return self.down(2.5 / self.up(x))


def test_a_number_divided_by_a_value_is_no_scaling():
    """``c / u`` is not linear in ``u`` (``c / (d u) = d⁻¹ c / u``): nothing is claimed on ``up``, and the note
    names the division."""
    analysis = _derive(Reciprocal(), certify=False)
    assert analysis.symmetries == ()
    assert any(b.node == "truediv" and b.site == "up" for b in analysis.blocked), analysis.blocked


class NormAfterProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(N, H), nn.Linear(N, H), nn.Linear(H, M)
        self.norm = nn.LayerNorm(H)

    def forward(self, x):
        return self.down(self.norm(torch.relu(self.gate(x)) * self.up(x)))


def test_an_op_that_does_not_know_products_keeps_only_the_joint_permutation():
    analysis = _derive(NormAfterProduct(), certify=False)
    assert [s.group.name for s in analysis.symmetries if s.site in ("gate", "up")] == [f"S({H})"]
    assert_claims_hold(analysis, draws=2)
    assert any(b.node == "norm" and "reads a product of sites" in b.reason for b in analysis.blocked)


class SharedDown(nn.Module):
    """One ``down`` reading two products (weight sharing): the factors' moves of it are not modelled."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.up2 = nn.Linear(N, H), nn.Linear(N, H), nn.Linear(N, H)
        self.down = nn.Linear(H, M)

    def forward(self, x):
        return self.down(torch.relu(self.gate(x)) * self.up(x)) + self.down(self.up2(x) * self.up(x))


def test_a_map_shared_by_two_products_is_blocked():
    analysis = _derive(SharedDown(), certify=False)
    assert not [s for s in analysis.symmetries if s.site in ("gate", "up", "up2")]
    assert any("reads a product of sites and is shared" in b.reason for b in analysis.blocked)


def test_llama_mlp_from_transformers():
    """Hugging Face's ``LlamaMLP`` (SwiGLU, no biases), passed as is: joint ``S(32)``, and ``(R^×)^32`` on the up
    projection with its 32 conserved quantities; certified by ``derive`` and verified."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4,
                                      num_key_value_heads=4)
    analysis = symalg.derive(symalg.from_torch(LlamaMLP(config), (torch.randn(2, 5, 16),)))
    assert _labels(analysis) == ["PositiveScaling(32, alpha=1) on up_proj", "S(32) on gate_proj",
                                 "SignFlips(32) on up_proj"]
    assert analysis.certified
    assert analysis.orbit_dimension(_params(analysis)) == 32
    report = symalg.verify(analysis)
    assert report.passed and {"invariance", "gradient_flow", "gd_drift"} <= {c.check for c in report.checks}
