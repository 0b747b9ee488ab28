"""The ``gradient_flow`` and ``lowering`` checks of ``verify_model`` on traced models: they run and pass
on real models (adapters, batch norm with buffers, attention, cross-entropy), and they fail when a
conserved quantity is not conserved or its lowered code disagrees with its SymPy expressions."""
import copy
import dataclasses

import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from torch import nn

import symalg
import symalg.catalogue.groups
from symalg.lowering.codegen import lower
from symalg.symbolic.symmetry import ConservedQuantity
from symalg.verification.verifier import SYMBOLIC_LIMIT, verify as verify_model
from symalg.verification.checks import TOLERANCES
from test_models import PreNormBlock, SmallCNN


class LoRANet(nn.Module):
    def __init__(self):
        super().__init__()
        self.base = nn.Linear(6, 5)
        self.lora_A, self.lora_B = nn.Linear(6, 2, bias=False), nn.Linear(2, 5, bias=False)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return self.out(F.relu(self.base(x) + self.lora_B(self.lora_A(x)) * 0.5))


def derive(model, *inputs, loss="mse"):
    inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    return symalg.derive(symalg.trace(model.double(), inputs), loss=loss)


def lora():
    return derive(LoRANet(), torch.randn(9, 6))


def cnn_in_training_mode():
    return derive(SmallCNN(), torch.randn(5, 3, 8, 8))


def cnn_in_eval_mode():
    model = SmallCNN().double()
    model(torch.randn(5, 3, 8, 8, dtype=torch.float64))     # non-trivial running statistics
    return derive(model.eval(), torch.randn(5, 3, 8, 8))


def attention():
    return derive(PreNormBlock(), torch.randn(2, 5, 8))


def cross_entropy():
    return derive(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)), torch.randn(10, 4), loss="cross_entropy")


def checks_of(report, name):
    return {c.symmetry: c for c in report.checks if c.check == name}


def state_of(model):
    return {k: v.clone() for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()}


@pytest.mark.parametrize("build, limit, exact", [
    (lora, SYMBOLIC_LIMIT, {"GL(2) on lora_A", "PositiveScaling(5, alpha=1) on base"}),
    # q_b2 reads the fc columns of each channel's flattened 2x2 block: 132 entries
    (cnn_in_training_mode, 140, {"Translations(4, bias) on c1", "Translations(6, bias) on c2",
                                 "PositiveScaling(6, alpha=1) on b2"}),
    (attention, SYMBOLIC_LIMIT, {f"GL(4) on attn.head{h}.{p}" for h in (0, 1) for p in ("qk", "vo")} |
     {f"PositiveScaling(8, alpha=1) on ln{i}" for i in (1, 2)} |
     {f"Translations(4, bias) on attn.head{h}.qk" for h in (0, 1)}),   # the key bias, conserved
    (cross_entropy, SYMBOLIC_LIMIT, {"Translations(6, along 1) on 2"}),
], ids=["lora", "cnn-train", "attention", "cross-entropy"])
def test_gradient_flow_and_lowering_run_and_pass_for_every_conserved_quantity(build, limit, exact):
    analysis = build()
    before = state_of(analysis.model_graph.model)
    report = verify_model(analysis, symbolic_limit=limit)
    assert report.passed, str(report)
    conserving = {s.label for s in analysis.symmetries if s.conserved is not None}
    flow, lowering = checks_of(report, "gradient_flow"), checks_of(report, "lowering")
    assert set(flow) == set(lowering) == conserving
    assert all(c.max_error <= TOLERANCES[torch.float64] for c in flow.values())
    # the quantities small enough for SymPy are compared, to rounding
    assert {label for label, c in lowering.items() if not c.skipped} == exact
    assert all(lowering[label].max_error <= 1e-14 for label in exact)
    # the flow ran on copies: the model's parameters and running statistics are untouched
    after = state_of(analysis.model_graph.model)
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_eval_mode_batch_norm_flows_with_fixed_running_statistics():
    """Actions that move the running statistics have no conserved quantity and get neither check; the
    scalings of the batch-norm gains do, and are conserved with the statistics held fixed."""
    analysis = cnn_in_eval_mode()
    moving_buffers = {s.label for s in analysis.symmetries if s.acts_on_buffers}
    assert "S(4) on c1" in moving_buffers
    assert all(s.conserved is None for s in analysis.symmetries if s.label in moving_buffers)
    report = verify_model(analysis)
    assert report.passed, str(report)
    assert set(checks_of(report, "gradient_flow")) == set(checks_of(report, "lowering")) == \
        {"PositiveScaling(4, alpha=1) on b1", "PositiveScaling(6, alpha=1) on b2"}


def test_a_quantity_that_is_zero_is_compared_absolutely():
    """Zero conv biases under a training-mode batch norm: ``ℓ = b = 0`` stays 0 up to rounding noise in
    the gradient, which is no relative error of 1."""
    model = SmallCNN()
    with torch.no_grad():
        model.c1.bias.zero_()
    analysis = derive(model, torch.randn(5, 3, 8, 8))
    label = "Translations(4, bias) on c1"
    report = verify_model(analysis)
    assert report.passed, str(report)
    assert checks_of(report, "gradient_flow")[label].max_error <= 1e-15
    assert checks_of(report, "lowering")[label].max_error == 0


def test_quantities_above_the_symbolic_limit_are_listed_as_skipped():
    analysis = cnn_in_training_mode()
    report = verify_model(analysis, symbolic_limit=200)
    skipped = checks_of(report, "lowering")["PositiveScaling(4, alpha=1) on b1"]
    assert skipped.skipped and "q_b1 reads 224 entries > symbolic_limit=200" in skipped.detail
    assert report.passed and "1 skipped" in report.summary()   # q_b2 (132 entries) is compared
    report = verify_model(lora(), symbolic_limit=0)
    assert all(c.skipped for c in checks_of(report, "lowering").values())


def test_float32_uses_its_own_tolerance():
    report = verify_model(lora(), dtype=torch.float32)
    assert report.passed, str(report)
    for name in ("gradient_flow", "lowering"):
        checks = checks_of(report, name).values()
        assert checks and all(c.tolerance == TOLERANCES[torch.float32] for c in checks)


# -- negative controls ---------------------------------------------------------------------------------------
def _rank_symmetry(analysis):
    return next(s for s in analysis.symmetries if s.label == "GL(2) on lora_A")


def test_lowering_fails_when_the_lowered_code_disagrees_with_sympy(monkeypatch):
    """``2C`` is conserved too, so only the exact comparison with the SymPy expression catches it."""
    analysis = lora()
    quantity = _rank_symmetry(analysis).conserved
    doubled = lower("doubled", {key: 2 * expr for key, expr in quantity.exprs.items()}, quantity.reads,
                    vector_inputs=quantity.vectors, read_suffixes=quantity.suffixes)
    monkeypatch.setitem(quantity.__dict__, "lowered", doubled)
    report = verify_model(analysis)
    label = _rank_symmetry(analysis).label
    assert [c.symmetry for c in report.failures] == [label]
    lowering = checks_of(report, "lowering")[label]
    assert lowering.failed and lowering.max_error == pytest.approx(0.5)     # |2C − C| / |2C|
    assert checks_of(report, "gradient_flow")[label].passed and checks_of(report, "gd_drift")[label].passed


def test_lowering_fails_for_a_broken_lowered_source(monkeypatch):
    """Code that reads ``2.weight`` transposed (the 4×4 weight fits either way) computes ``W₂W₂ᵀ`` where
    SymPy has ``W₂ᵀW₂``."""
    analysis = derive(nn.Sequential(nn.Linear(3, 4), nn.Identity(), nn.Linear(4, 4)), torch.randn(6, 3))
    (symmetry,) = [s for s in analysis.symmetries if s.conserved is not None]
    quantity = symmetry.conserved
    source = quantity.lowered.source
    assert "params['2.weight']" in source
    broken = lower("broken", dict(quantity.exprs), quantity.reads, vector_inputs=quantity.vectors,
                   read_suffixes={s: ".transpose(0, 1)" for s, name in quantity.reads.items() if name == "2.weight"})
    assert broken.source != source
    monkeypatch.setitem(quantity.__dict__, "lowered", broken)
    lowering = checks_of(verify_model(analysis), "lowering")[symmetry.label]
    assert lowering.failed and lowering.max_error > 1e-3


def test_gradient_flow_fails_for_a_quantity_that_is_not_conserved(monkeypatch):
    """``A Aᵀ + Bᵀ B`` (the wrong sign) grows along gradient flow, at first order in the time."""
    analysis = lora()
    symmetry = _rank_symmetry(analysis)
    A = sp.MatrixSymbol("lora_A.weight", 2, 6)
    B = sp.MatrixSymbol("lora_B.weight", 5, 2)
    wrong = ConservedQuantity("C_wrong", "matrix", {"C_wrong": A * A.T + B.T * B},
                           {A: "lora_A.weight", B: "lora_B.weight"}, {})
    monkeypatch.setitem(symmetry.__dict__, "conserved", wrong)
    report = verify_model(analysis)
    flow = checks_of(report, "gradient_flow")[symmetry.label]
    assert flow.failed and flow.max_error > 1e3 * flow.tolerance and "C_wrong" in flow.detail
    assert checks_of(report, "lowering")[symmetry.label].passed      # its lowering is right, it is just not conserved
    assert checks_of(report, "gd_drift")[symmetry.label].failed


def test_orbit_dimension_is_checked_against_formula_and_dense_rank():
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2), nn.Identity(), nn.Linear(2, 4)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    (check,) = [c for c in verify_model(analysis).checks if c.check == "orbit_dimension"]
    # 5 scalings + GL(2) between a 5-wide input and a 4-wide output with its shear (2.bias into 4.bias):
    # 5 + 4 + 2 = 11 (the affine site: 2² + 2 − (2 − 2)(2 − 2))
    assert check.passed and check.detail == "structured 11 of 11, formula 11, dense 11"
    with torch.no_grad():       # neuron 0 cut off on both sides: its scaling stops moving anything
        model[0].weight[0], model[0].bias[0], model[2].weight[:, 0] = 0, 0, 0
    (check,) = [c for c in verify_model(analysis).checks if c.check == "orbit_dimension"]
    assert check.failed and check.detail == "structured 10 of 11, formula 11, dense 10"


def test_a_parameter_the_model_does_not_use_has_zero_gradient():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    model.spare = nn.Parameter(torch.randn(5, dtype=torch.float64))     # registered, never read in forward
    report = verify_model(symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),))))
    assert report.passed and any(c.check == "gradient_flow" for c in report.checks)


def test_gradient_orthogonality_fails_for_a_group_the_site_does_not_have():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    scaling = next(s for s in analysis.symmetries if s.group.is_continuous)
    wrong = dataclasses.replace(scaling, group=symalg.catalogue.groups.GeneralLinear(4))      # GL(4) on a ReLU site
    report = verify_model(dataclasses.replace(analysis, symmetries=(wrong,)))
    checks = {c.check: c for c in report.checks if c.symmetry == wrong.label}
    assert checks["gradient_orthogonality"].failed and checks["invariance"].failed
    checks = {c.check: c for c in verify_model(analysis).checks if c.symmetry == scaling.label}
    assert checks["gradient_orthogonality"].passed


# ---------------------------------------------------------------------------------------------
# every argument of verify is honoured or refused
# ---------------------------------------------------------------------------------------------
def _relu_net():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    return model, symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),)))


def test_verify_runs_at_the_given_parameters_not_the_models():
    model, analysis = _relu_net()
    before = state_of(model)
    zeros = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    own, at_zero = symalg.verify(analysis), symalg.verify(analysis, params=zeros)
    assert checks_of(own, "orbit_dimension")["*"].detail.startswith("structured 4 of 4")
    # at θ = 0 no scaling moves anything: the orbit is a point, below its generic dimension
    orbit = checks_of(at_zero, "orbit_dimension")["*"]
    assert orbit.detail.startswith("structured 0 of 4") and orbit.failed
    assert checks_of(at_zero, "gd_drift")["PositiveScaling(4, alpha=1) on 0"].max_error == 0
    assert all(torch.equal(v, before[k]) for k, v in state_of(model).items())       # the model is untouched
    # float32 parameters are cast to the report's dtype; the result equals verifying a model holding them
    other = {k: torch.randn_like(v).float() for k, v in model.named_parameters()}
    holder = copy.deepcopy(model)
    holder.load_state_dict({k: v.double() for k, v in other.items()})
    expected = symalg.verify(symalg.derive(symalg.trace(holder, analysis.model_graph.example_inputs)))
    given = symalg.verify(analysis, params=other)
    assert [(c.max_error, c.detail) for c in given.checks] == [(c.max_error, c.detail) for c in expected.checks]
    assert [c.detail for c in given.checks] != [c.detail for c in own.checks]


def test_verify_takes_buffers_from_params_and_keeps_the_models_otherwise():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)).double().eval()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    assert symalg.verify(analysis, params=params).passed
    broken = {**params, "1.running_var": torch.full((4,), float("nan"), dtype=torch.float64)}
    with pytest.raises(symalg.SpecError, match="parameter '1.running_var' has non-finite entries"):
        symalg.verify(analysis, params=broken)


@pytest.mark.parametrize("change, message", [
    (lambda p: {**p, "extra.weight": torch.zeros(2)}, r"verify: unknown parameter 'extra.weight'"),
    (lambda p: {k: v for k, v in p.items() if k != "2.bias"}, r"verify: parameter '2.bias' is missing"),
    (lambda p: {**p, "0.weight": torch.zeros(3, 4)},
     r"verify: parameter '0.weight' has shape \(3, 4\), expected \(4, 3\)"),
    (lambda p: {**p, "0.bias": torch.full((4,), float("inf"))}, r"verify: parameter '0.bias' has non-finite entries"),
    (lambda p: {**p, "0.bias": [0.0] * 4}, r"verify: parameter '0.bias' is a list, not a tensor"),
    (lambda p: list(p.values()), r"verify: params must be a mapping"),
], ids=["unknown", "missing", "shape", "inf", "not-a-tensor", "not-a-mapping"])
@pytest.mark.parametrize("pipeline", ["spec", "traced"])
def test_verify_refuses_parameters_it_does_not_know_naming_them(pipeline, change, message):
    model, traced = _relu_net()
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)") if pipeline == "spec" else traced
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises(symalg.SpecError, match=message):
        symalg.verify(analysis, params=change(params))


def test_verify_refuses_widths_and_unusable_data_for_a_traced_model():
    _, analysis = _relu_net()
    with pytest.raises(symalg.SpecError,
                       match="verify: widths= sets symbolic widths; this analysis has concrete widths"):
        symalg.verify(analysis, widths={"h": 4})
    with pytest.raises(symalg.SpecError,
                       match=r"the model does not run on data of shapes \[\(5, 7\)\] .* mat1 and mat2 shapes"):
        symalg.verify(analysis, data=torch.randn(5, 7, dtype=torch.float64))
    # data are honoured as the model's inputs, symbolic_limit as the lowering limit
    report = symalg.verify(analysis, data=torch.randn(7, 3, dtype=torch.float64), symbolic_limit=0)
    assert checks_of(report, "lowering")["PositiveScaling(4, alpha=1) on 0"].skipped


# ---------------------------------------------------------------------------------------------
# invariance: claims composed, failing sets split, two halves of one symmetry told apart
# ---------------------------------------------------------------------------------------------
class GatedWithTail(nn.Module):
    """A gated MLP (one S(4) moves gate rows, up rows and down columns) and four tanh layers: 14 claims (with
    ``Shears(3) on down``: down's bias moved into the first tail layer's, across the identity site between them)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate, self.up, self.down = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(4, 3)
        self.tail = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(3, 3), nn.Tanh())], nn.Linear(3, 2))

    def forward(self, x):
        return self.tail(self.down(torch.tanh(self.gate(x)) * self.up(x)))


def test_invariance_tells_apart_two_false_claims_whose_composition_holds():
    analysis = derive(GatedWithTail(), torch.randn(6, 3, generator=torch.Generator().manual_seed(1)))
    joint = next(s for s in analysis.symmetries if s.label == "S(4) on gate")
    assert {b.tensor for b in joint.bindings} == {"gate.weight", "gate.bias", "down.weight", "up.weight", "up.bias"}
    # the tie split in two: each half alone changes the output; both together, moved by the same swap, do not
    gate_half = dataclasses.replace(joint, bindings=tuple(b for b in joint.bindings if not b.tensor.startswith("up")))
    up_half = dataclasses.replace(joint, site="up", bindings=tuple(b for b in joint.bindings
                                                                    if b.tensor.startswith("up")))
    claims = tuple(s for s in analysis.symmetries if s is not joint) + (gate_half, up_half)
    assert len(claims) == 15   # more than 4 · 2 digits: the claims are composed, not checked one by one
    invariance = checks_of(verify_model(dataclasses.replace(analysis, symmetries=claims)), "invariance")
    assert invariance["S(4) on gate"].failed and invariance["S(4) on up"].failed
    assert invariance["S(4) on gate"].max_error > 1e-4 and "composed" not in invariance["S(4) on gate"].detail
    others = [c for label, c in invariance.items() if "S(4)" not in label]
    assert len(others) == 13 and all(c.passed for c in others)
    assert any("composed with" in c.detail for c in others)
    assert checks_of(verify_model(analysis), "invariance")["S(4) on gate"].passed


def test_invariance_finds_the_one_false_claim_among_many_deep_ones():
    layers = [m for _ in range(12) for m in (nn.Linear(4, 4), nn.ReLU())] + [nn.Linear(4, 2)]
    torch.manual_seed(0)
    analysis = derive(nn.Sequential(*layers), torch.randn(8, 4))
    scaling = next(s for s in analysis.symmetries if s.label == "PositiveScaling(4, alpha=1) on 10")
    wrong = dataclasses.replace(scaling, group=symalg.catalogue.groups.GeneralLinear(4))   # GL(4) on a ReLU site
    claims = analysis.symmetries + (wrong,)
    assert len(claims) == 25
    invariance = checks_of(verify_model(dataclasses.replace(analysis, symmetries=claims)), "invariance")
    assert [label for label, c in invariance.items() if c.failed] == ["GL(4) on 10"]
    assert invariance["GL(4) on 10"].max_error > 1e-3 and "composed" not in invariance["GL(4) on 10"].detail
    assert all("composed with" in c.detail for label, c in invariance.items() if label != "GL(4) on 10")
