"""Certification before claiming: ``derive`` checks every inferred claim of a traced model
numerically and blocks the ones that fail, with the measured error; ``verify`` compares every output.

False claims are produced on purpose: a monkeypatched op rule (``sin`` read as the identity claims
``GL`` through it), and a traced graph whose module later returns per-head attention weights (the
forward that certification and verification run is the module's own)."""
import dataclasses
import math

import pytest
import torch
from torch import nn

import symalg
from symalg.catalogue import rules as op_rules
from symalg.verification.certification import (CERTIFICATION_TOLERANCE, assert_claims_hold, claim_errors, compose,
                                               sample_elements)
from symalg.symbolic.derive import derive
from symalg.numeric.orbit_rank import model_orbit_dimension, model_orbit_dimension_formula
from test_model_verification import GatedWithTail   # the gated MLP with a tanh tail


class SinMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.sin(self.fc1(x)))


def sin_graph(monkeypatch):
    """A traced ``fc2(sin(fc1 x))`` whose inference reads ``sin`` as the identity: it claims a false GL(4)."""
    monkeypatch.setitem(op_rules._RULES, "sin", op_rules.identity_rule)
    torch.manual_seed(0)
    return symalg.trace(SinMLP().double(), (torch.randn(6, 3, dtype=torch.float64),))


def test_a_false_claim_is_claimed_without_certification_and_fails_verify(monkeypatch):
    analysis = symalg.derive(sin_graph(monkeypatch), certify=False)
    assert analysis.table() == [("fc1", "GL(4)", 16), ("fc1", "Shears(4)", 4)]   # sin as the identity: both false
    assert analysis.certification is None and not analysis.certified
    assert "not checked numerically" in str(analysis)
    report = symalg.verify(analysis)
    assert [(c.check, c.symmetry) for c in report.failures] == [
        ("invariance", "GL(4) on fc1"), ("gradient_orthogonality", "GL(4) on fc1"), ("gd_drift", "GL(4) on fc1"),
        ("invariance", "Shears(4) on fc1"), ("gradient_orthogonality", "Shears(4) on fc1"),
        ("gradient_flow", "GL(4) on fc1")]
    with pytest.raises(AssertionError, match=r"GL\(4\) on fc1: relative error"):
        assert_claims_hold(analysis)  # the helper the false-claim tests rest on fails on it


def test_a_false_claim_is_blocked_with_its_measured_error_and_disappears_everywhere(monkeypatch):
    graph = sin_graph(monkeypatch)
    analysis = symalg.derive(graph)
    assert analysis.table() == [] and analysis.conserved_quantities() == []
    error, shear = analysis.certification
    assert error.symmetry.label == "GL(4) on fc1" and not error.holds and error.error > 0.1
    assert shear.symmetry.label == "Shears(4) on fc1" and not shear.holds and shear.error > 0.1
    note, _ = analysis.blocked
    assert (note.node, note.site) == ("fc1", "fc1")
    assert note.reason == (f"GL(4) failed numerical certification: relative error {error.error:.1e} on output "
                           f"'output' under {error.element} at {error.point}")
    assert error.point == "the model's parameters, inputs (6, 3)"   # fails at the first point already
    assert note in analysis.sites.blocked
    assert all("GL" not in c.kinds for c in analysis.sites.classes)
    assert model_orbit_dimension_formula(analysis) == 0 and model_orbit_dimension(analysis).dimension == 0
    assert "certification: 0 of 2 claims hold numerically" in str(analysis) and "2 failed (blocked)" in str(analysis)
    assert symalg.verify(analysis).passed


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention(8, 2)`` returning ``(out, weights)``: head-averaged or per-head weights."""

    def __init__(self, per_head: bool):
        super().__init__()
        self.attn, self.per_head = nn.MultiheadAttention(8, 2, batch_first=True), per_head

    def forward(self, x):
        return self.attn(x, x, x, average_attn_weights=not self.per_head)


def attention(per_head: bool):
    torch.manual_seed(0)
    return SelfAttention(per_head).double(), (torch.randn(2, 5, 8, dtype=torch.float64),)


def test_head_permutation_holds_for_averaged_weights():
    analysis = symalg.derive(symalg.trace(*attention(per_head=False)))
    assert ("attn.heads", "S(2)", 0) in analysis.table() and analysis.blocked == ()
    assert symalg.verify(analysis).passed


def test_verify_compares_every_output_and_fails_the_head_permutation_on_per_head_weights():
    # The certified analysis of the averaged model, checked on the same module once it returns per-head
    # weights as its second output: the first output is unchanged, the second one is not.
    model, inputs = attention(per_head=False)
    analysis = symalg.derive(symalg.trace(model, inputs))
    model.per_head = True
    report = symalg.verify(analysis)
    (failure,) = report.failures
    assert (failure.check, failure.symmetry) == ("invariance", "S(2) on attn.heads")
    assert failure.max_error > 0.1 and "output '1'" in failure.detail


def test_per_head_weights_reproduction_verify_fails_whatever_inference_still_claims():
    analysis = symalg.derive(symalg.trace(*attention(per_head=True)), certify=False)
    report = symalg.verify(analysis)
    claimed = {s.label for s in analysis.symmetries}
    failed = {c.symmetry for c in report.failures}
    assert failed == ({"S(2) on attn.heads"} & claimed)


def test_certification_blocks_a_permutation_class_that_changes_a_second_output():
    model, inputs = attention(per_head=False)
    graph = symalg.trace(model, inputs)    # inference sees averaged weights and claims the head permutation
    model.per_head = True                  # certification runs the module, which now returns per-head weights
    analysis = symalg.derive(graph)
    assert "S(2)" not in {name for _, name, _ in analysis.table()}
    assert analysis.sites.permutations == ()
    (note,) = [b for b in analysis.blocked if "failed numerical certification" in b.reason]
    assert note.site == "attn.heads" and note.reason.startswith("S(2) failed numerical certification: relative error")
    assert "on output '1' under discrete generator 0" in note.reason
    assert symalg.verify(analysis).passed


def test_models_traced_without_example_inputs_cannot_be_certified():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    graph = symalg.trace(model)
    with pytest.raises(symalg.SpecError, match="traced without example_inputs.*certify=False"):
        symalg.derive(graph)
    analysis = symalg.derive(graph, certify=False)
    assert sorted(analysis.table()) == [("0", "PositiveScaling(4, alpha=1)", 4), ("0", "S(4)", 0)]
    assert analysis.certification is None and "not checked numerically" in str(analysis)


@pytest.mark.parametrize("certify", ["yes", 1, None])
def test_certify_must_be_a_bool(certify):
    graph = symalg.trace(nn.Linear(3, 2), (torch.randn(4, 3),))
    with pytest.raises(symalg.SpecError, match="certify must be True or False"):
        symalg.derive(graph, certify=certify)
    with pytest.raises(symalg.SpecError, match="certify must be True or False"):
        derive(graph, certify=certify)


def relu_mlp(depth: int) -> nn.Module:
    layers = [nn.Linear(3, 4), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(4, 4), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(4, 2)).double()


def test_certification_costs_forward_passes_logarithmic_in_the_number_of_claims():
    # 1 pass to find the generic point, 2 for the batch sizes it accepts (1 and 7; the feature axis is refused inside
    # the first layer: no pass completes), 2 backward passes for the sensitivities (at the model's parameters and at
    # the generic ones); at each of the 3 points (the model's
    # parameters, the generic point at batches of 1 and of 7) 1 reference and 1 pass per scale of exp(M) (each claim its
    # own draw: all composed; |M| = 1e-3 at batch 1 only); for S(4)'s 2 discrete generators 1 composed pass at the
    # model's parameters and at batch 7, and at batch 1 1 pass per separating set of the d permutation claims: d one by
    # one for d <= 2, else ceil(log2(d + 1)) (5: 3, 20: 5)
    passes = {}
    for depth in (1, 5, 20):
        model = relu_mlp(depth)
        graph = symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),))
        calls = []
        model.register_forward_hook(lambda *_: calls.append(1))  # after tracing: count derive's passes alone
        analysis = symalg.derive(graph)
        assert len(analysis.symmetries) == 2 * depth
        assert all(e.error <= CERTIFICATION_TOLERANCE for e in analysis.certification)
        passes[depth] = len(calls)          # certification runs a copy of the module, hooks included
    assert passes == {1: 5 + 4 + (1 + 2 + 2 * 1) + 4, 5: 5 + 4 + (1 + 2 + 2 * 3) + 4, 20: 5 + 4 + (1 + 2 + 2 * 5) + 4}


def test_composed_claims_move_the_tensors_as_each_claim_applied_in_turn():
    """``compose`` moves the small tensors of one shape in batches (the scalings' factors multiplied, the permutations'
    indices gathered, for all of them at once), here with the scalings' elements drawn at once (rows of
    ``random_algebra_elements``): the result is each claim's own ``apply`` in turn (the scalings first), to rounding,
    and the claims do move the tensors."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(),
                          nn.Linear(4, 2)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 4, dtype=torch.float64),)), certify=False)
    generator = torch.Generator().manual_seed(1)
    scalings = [s for s in analysis.symmetries if s.label.startswith("PositiveScaling")]
    permutations = [s for s in analysis.symmetries if s.label.startswith("S(")]
    assert len(scalings) == len(permutations) == 3
    elements = scalings[0].group.exp(scalings[0].group.random_algebra_elements(3, 1.0, generator))
    claims = [(s, g) for s, g in zip(scalings, elements)] + \
             [(s, s.group.discrete_generators()[k % 2]) for k, s in enumerate(permutations)]
    state = {name: t.detach() for name, t in model.named_parameters()}
    expected = dict(state)
    for s, g in claims:
        expected = s.apply(expected, g, checked=False)
    moved = compose(state, claims)
    assert set(moved) == set(state)
    for name in state:
        assert torch.allclose(moved[name], expected[name], rtol=1e-14, atol=0), name
    assert all(not torch.allclose(moved[name], state[name]) for name in state if name != "6.bias")


def test_certification_tells_apart_two_false_claims_whose_composition_holds():
    """The gate and up rows of a gated MLP are permuted together; split in two, each half changes the output, while
    both moved by the same swap do not. Composed in sets that separate every two claims, each half fails alone."""
    model = GatedWithTail().double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    joint = next(s for s in analysis.symmetries if s.label == "S(4) on gate")
    gate_half = dataclasses.replace(joint, bindings=tuple(b for b in joint.bindings if not b.tensor.startswith("up")))
    up_half = dataclasses.replace(joint, site="up", bindings=tuple(b for b in joint.bindings
                                                                    if b.tensor.startswith("up")))
    claims = [s for s in analysis.symmetries if s is not joint] + [gate_half, up_half]
    assert len(claims) > 8   # more than 4 · 2 digits: the claims are composed in sets, not checked one by one
    errors = {e.symmetry.label: e for e in claim_errors(analysis, symmetries=claims)}
    assert not errors["S(4) on gate"].holds and not errors["S(4) on up"].holds
    assert errors["S(4) on gate"].error > 1e-4 and "composed" not in errors["S(4) on gate"].element
    others = [e for label, e in errors.items() if "S(4)" not in label]
    assert others and all(e.holds for e in others) and any("composed with" in e.element for e in others)
    assert all(e.holds for e in claim_errors(analysis))


class TanhMLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(3, width), nn.Tanh(), nn.Linear(width, 2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_wide_sign_flips_are_certified_by_random_sign_patterns():
    # SignFlips(32) is tested with random patterns, not its 32 generators; a true claim passes, and the same
    # claim on the module whose tanh became softplus after tracing (not odd) is blocked.
    torch.manual_seed(0)
    model = TanhMLP(32).double()
    graph = symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),))
    assert ("fc1", "SignFlips(32)", 0) in symalg.derive(graph).table()
    model.act = nn.Softplus()
    analysis = symalg.derive(graph)
    assert ("fc1", "SignFlips(32)", 0) not in analysis.table()
    (note,) = [b for b in analysis.blocked if b.reason.startswith("SignFlips(32) failed numerical certification")]
    assert "under random sign pattern" in note.reason


def test_in_place_application_equals_the_functional_one():
    torch.manual_seed(0)
    model = TanhMLP(5).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    state = {k: v.detach() for k, v in model.named_parameters()}
    generator = torch.Generator().manual_seed(1)
    for symmetry in analysis.symmetries:
        for _, g in sample_elements(symmetry.group, generator):
            copies = {k: v.clone() for k, v in state.items()}
            expected, moved = symmetry.apply(state, g), symmetry.apply(copies, g, inplace=True)
            assert all(torch.equal(expected[k], moved[k]) for k in state)
            assert all(torch.equal(state[k], model.state_dict()[k]) for k in state)   # the functional call copies


def test_output_change_compares_non_finite_entries_exactly():
    """Returned masked scores hold ``-inf``: they must stay where they are; the finite entries compare relatively."""
    from symalg.verification.certification import output_change

    scores = torch.tensor([[0.5, -math.inf], [0.25, 1.0]], dtype=torch.float64)
    reference = [("scores", scores)]
    assert output_change([("scores", scores.clone())], reference, False) == (0.0, "scores")
    moved = scores.clone()
    moved[1, 1] = 1.5
    assert output_change([("scores", moved)], reference, False)[0] == pytest.approx(0.5 / 1.5)
    for entry, value in (((0, 1), 3.0), ((0, 1), math.inf), ((0, 0), -math.inf), ((0, 0), math.nan)):
        broken = scores.clone()
        broken[entry] = value
        assert output_change([("scores", broken)], reference, False)[0] == math.inf, (entry, value)
    with_nan = scores.clone()
    with_nan[1, 0] = math.nan
    assert output_change([("scores", with_nan.clone())], [("scores", with_nan)], False)[0] == 0.0
