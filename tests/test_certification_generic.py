"""Certification that one input shape or special parameter values cannot fool (issue 29, items 1 and 3): claims are
checked at the model's parameters, at a generic point and on inputs of other shapes, and a claim the outputs cannot
see is not certifiable. Forged claims (a true claim with one binding dropped) stand for false claims of a rule."""
import dataclasses

import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import certify, claim_errors, generic_state, shape_variants
from test_shape_specialisation import Branchy   # ReLU for batches of two or more, tanh(z) + 0.1 z² for one example


def test_a_claim_true_for_one_batch_size_only_is_not_certified():
    torch.manual_seed(0)
    model = Branchy().double()
    graph = symalg.trace(model, (torch.randn(8, 3, dtype=torch.float64),))
    raw = symalg.derive(graph, certify=False)
    assert "PositiveScaling(5, alpha=1) on fc1" in [s.label for s in raw.symmetries]   # the rule sees ReLU
    analysis = symalg.derive(graph)
    assert [s.label for s in analysis.symmetries] == ["S(5) on fc1"]   # both branches commute with permutations
    failed = {e.symmetry.label: e for e in analysis.certification}["PositiveScaling(5, alpha=1) on fc1"]
    assert failed.error > 1e-3 and failed.point == "generic parameters, inputs (1, 3)"
    assert any("at generic parameters, inputs (1, 3)" in b.reason for b in analysis.blocked)
    assert "checked at generic parameters, inputs (1, 3)" in analysis.certification_summary()
    # and the claim does change the output at batch size 1
    scaling = next(s for s in raw.symmetries if s.label.startswith("PositiveScaling"))
    params = dict(model.named_parameters())
    moved = scaling.apply(params, torch.full((5,), 2.0, dtype=torch.float64))
    x = torch.randn(1, 3, dtype=torch.float64)
    change = torch.func.functional_call(model, moved, (x,)) - model(x)
    assert change.abs().max() > 1e-3


def test_other_shapes_are_drawn_per_axis_class_and_refusals_recorded():
    ids, mask = torch.zeros(2, 7, dtype=torch.long), torch.ones(2, 7, dtype=torch.bool)
    variants = {label: shapes for label, _, _, shapes in shape_variants((ids,), {"attention_mask": mask})}
    assert variants == {"axis 0: 2 → 1": {0: (1, 7), "attention_mask": (1, 7)},
                        "axis 0: 2 → 3": {0: (3, 7), "attention_mask": (3, 7)},
                        "axis 1: 7 → 6": {0: (2, 6), "attention_mask": (2, 6)},
                        "axis 1: 7 → 8": {0: (2, 8), "attention_mask": (2, 8)}}
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    certificate = certify(symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)), certify=False))
    assert certificate.points == ("the model's parameters, inputs (6, 3)", "generic parameters, inputs (1, 3)",
                                  "generic parameters, inputs (7, 3)")
    assert "axis 1: 3 → 2 (RuntimeError" in certificate.notes[0]
    assert "axis 1: 3 → 4 (RuntimeError" in certificate.notes[0]


class Sequence(nn.Module):
    """An MLP over the last axis of ``(B, T, n)`` that branches on the sequence length ``T``."""

    def __init__(self, threshold):
        super().__init__()
        self.fc1, self.fc2, self.threshold = nn.Linear(3, 5), nn.Linear(5, 2), threshold

    def forward(self, x):
        z = self.fc1(x)
        return self.fc2(torch.relu(z) if x.shape[1] <= self.threshold else torch.tanh(z))


@pytest.mark.parametrize("threshold, traced", [(3, "SignFlips(5) on fc1"),                  # T = 4 → 3 flips it
                                               (4, "PositiveScaling(5, alpha=1) on fc1")])  # T = 4 → 5 flips it
def test_a_claim_true_for_one_sequence_length_only_is_not_certified(threshold, traced):
    torch.manual_seed(0)
    graph = symalg.trace(Sequence(threshold).double(), (torch.randn(2, 4, 3, dtype=torch.float64),))
    analysis = symalg.derive(graph)
    assert [s.label for s in analysis.symmetries] == ["S(5) on fc1"]
    failed, = [e for e in analysis.certification if not e.holds]
    assert failed.symmetry.label == traced and failed.error > 1e-3


class Swish(nn.Module):
    """``fc2(z ⊙ σ(β ⊙ z))``, ``z = fc1 x``: a per-unit ``β`` (initialised to 1) the permutations of the hidden layer
    must move."""

    def __init__(self, h=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, h), nn.Linear(h, 2)
        self.beta = nn.Parameter(torch.ones(h))

    def forward(self, x):
        z = self.fc1(x)
        return self.fc2(z * torch.sigmoid(self.beta * z))


def forged(symmetry, tensor):
    """``symmetry`` with the bindings of ``tensor`` dropped: a false claim of the kind a faulty rule makes."""
    kept = tuple(b for b in symmetry.bindings if b.tensor != tensor)
    assert len(kept) < len(symmetry.bindings)
    return dataclasses.replace(symmetry, bindings=kept)


def permutation(model, x):
    analysis = symalg.derive(symalg.trace(model, (x,)), certify=False)
    return analysis, next(s for s in analysis.symmetries if s.group.name.startswith("S("))


def test_a_false_permutation_at_equal_parameters_fails_at_the_generic_point():
    torch.manual_seed(0)
    model = Swish().double()                        # β = 1: permuting the units without β changes nothing here
    x = torch.randn(6, 3, dtype=torch.float64)
    analysis, perm = permutation(model, x)
    false = forged(perm, "beta")
    error, = claim_errors(analysis, symmetries=[false])
    assert not error.holds and error.error > 1e-3 and error.point.startswith("generic parameters")
    error, = claim_errors(analysis, symmetries=[false], draws=1)   # the model's own point alone is fooled
    assert error.holds


def test_a_zero_initialised_head_does_not_certify_a_false_claim():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    nn.init.zeros_(model[4].weight)
    analysis, perm = permutation(model, torch.randn(6, 3, dtype=torch.float64))
    false = forged(perm, "2.weight")                # the reader's columns left where they are
    error, = claim_errors(analysis, symmetries=[false])
    assert not error.holds and error.error > 1e-3


class LayerScaled(nn.Module):
    """A residual block with a learnable layer scale of ``1e-9`` (CaiT and ConvNeXt start at ``1e-6`` to ``1e-4``): at
    initialisation a change inside the block moves the outputs by about ``1e-9`` relative, under the tolerance."""

    def __init__(self, d=4, h=6):
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(d, h), nn.Linear(h, d), nn.Linear(d, 2)
        self.gamma = nn.Parameter(torch.full((d,), 1e-9))

    def forward(self, x):
        return self.head(x + self.gamma * self.fc2(torch.relu(self.fc1(x))))


def test_a_tiny_layer_scale_does_not_certify_a_false_claim():
    torch.manual_seed(0)
    model = LayerScaled().double()
    analysis, perm = permutation(model, torch.randn(6, 4, dtype=torch.float64))
    false = forged(perm, "fc2.weight")
    error, = claim_errors(analysis, symmetries=[false], draws=1)
    assert error.error < 1e-8                       # invisible at the model's own point
    error, = claim_errors(analysis, symmetries=[false])
    assert not error.holds and error.error > 1e-4


class Muted(nn.Module):
    """The block's output is multiplied by a constant ``1e-12``: no parameter point makes the outputs react."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * 1e-12 + x[:, :2]


def test_claims_the_outputs_cannot_see_are_not_certifiable():
    torch.manual_seed(0)
    graph = symalg.trace(Muted().double(), (torch.randn(6, 3, dtype=torch.float64),))
    raw = symalg.derive(graph, certify=False)
    assert raw.symmetries                            # the rules claim ReLU's groups (true, but unseen)
    analysis = symalg.derive(graph)
    assert analysis.symmetries == ()
    errors = analysis.certification
    assert all(e.error <= e.tolerance and not e.certifiable and not e.holds for e in errors)
    assert all(e.sensitivity < 1e-9 for e in errors)
    assert all("not certifiable here" in b.reason for b in analysis.blocked[-len(errors):])
    assert f"{len(errors)} not certifiable here" in analysis.certification_summary()


def test_a_sensitive_model_keeps_its_claims_with_their_sensitivity():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    assert len(analysis.symmetries) == 2
    assert all(e.holds and 1e-3 < e.sensitivity < 1e3 for e in analysis.certification)
    record = analysis.to_dict()["certification"][0]
    assert record["certifiable"] and record["point"] and record["sensitivity"] > 1e-3


@pytest.mark.parametrize("special", ["ones", "zeros", "tiny"])
def test_the_generic_point_leaves_special_values_and_keeps_positive_tensors_positive(special):
    layer = nn.BatchNorm1d(3).double().eval()
    layer.running_var.fill_(2.0)
    value = {"ones": 1.0, "zeros": 0.0, "tiny": 1e-6}[special]
    nn.init.constant_(layer.weight, value)
    state = {**dict(layer.named_parameters()), **dict(layer.named_buffers())}
    moved = generic_state(layer, state, torch.Generator().manual_seed(0))
    assert moved["weight"].std() > 1e-3               # equal entries made distinct, off the special value
    assert (moved["running_var"] > 0).all() and not torch.equal(moved["running_var"], state["running_var"])
    assert torch.equal(moved["num_batches_tracked"], state["num_batches_tracked"])   # integers stay


def test_certification_leaves_the_callers_model_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = [id(p) for p in model.parameters()]
    symalg.derive(symalg.trace(model, (torch.randn(6, 3, dtype=torch.float64),)))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [id(p) for p in model.parameters()] == parameters
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())


class NoGrad(nn.Module):
    """A block computed under ``torch.no_grad`` beside one that is not: autograd reaches no tensor of the block's
    claims, the outputs do."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.skip = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(3, 2)

    def forward(self, x):
        with torch.no_grad():
            y = self.fc2(torch.relu(self.fc1(x)))
        return y + self.skip(x)


def test_tensors_autograd_does_not_reach_are_measured_by_perturbation():
    torch.manual_seed(0)
    analysis = symalg.derive(symalg.trace(NoGrad().double(), (torch.randn(6, 3, dtype=torch.float64),)))
    assert sorted(s.label for s in analysis.symmetries) == ["PositiveScaling(4, alpha=1) on fc1", "S(4) on fc1"]
    assert all(e.holds and e.sensitivity > 1e-3 for e in analysis.certification)
