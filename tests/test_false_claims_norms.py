"""Regression tests for false claims around normalisations (root causes 4-6 of docs/soundness.md).

Each test traces a minimal reproduction, certifies every remaining claim on the model itself
(``claim_errors``: every output, fresh inputs, buffers moved), checks which groups are still claimed (the
true symmetries survive) and that the restriction is reported as a blocked note naming the norm's node.
"""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import assert_claims_hold
from symalg.verification.fuzz import randomize


def certified(model, *inputs, running_statistics=False):
    """Derive ``model`` (float64) traced with ``inputs`` without certification (the inference rules alone);
    assert every claim keeps every output."""
    model = model.double()
    if running_statistics:
        model.eval()
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                with torch.no_grad():
                    module.running_mean.normal_()
                    module.running_var.uniform_(0.5, 2.0)
    analysis = symalg.derive(symalg.trace(model, inputs), certify=False)
    assert_claims_hold(analysis)
    return analysis


def claims(analysis) -> list[tuple[str, str]]:
    return sorted((site, group) for site, group, _ in analysis.table())


def blocked_at(analysis, node: str) -> list[str]:
    return [b.reason for b in analysis.blocked if b.node == node]


class Norm(nn.Module):
    """``head(norm(body(x)))``, with an optional transpose of the last two axes before the norm."""

    def __init__(self, body, norm, head, transpose=False):
        super().__init__()
        self.body, self.norm, self.head, self.transpose = body, norm, head, transpose

    def forward(self, x):
        h = self.body(x)
        return self.head(self.norm(h.transpose(1, 2) if self.transpose else h))


# -- root cause 4: a norm's channel axis is not always the last axis ----------------------------

@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_1d_on_a_sequence_normalises_positions_not_features(training):
    # BatchNorm1d(4) on (B, T=4, d=4) normalises each of the T positions over batch and d: the linear
    # map's scalings, sign flips and bias translations along d change the output; permutations of d do not.
    model = Norm(nn.Linear(4, 4), nn.BatchNorm1d(4, eps=0.0 if not training else 1e-5), nn.Linear(4, 3))
    model.train(training)
    analysis = certified(model, torch.randn(6, 4, 4), running_statistics=not training)
    assert claims(analysis) == [("body", "S(4)")]
    assert any("batch norm works along axes [-2], but the sites run along axis -1" in r
               for r in blocked_at(analysis, "norm"))


def test_batch_norm_2d_reading_a_last_axis_site():
    model = Norm(nn.Linear(4, 4), nn.BatchNorm2d(3), nn.Linear(4, 2))
    analysis = certified(model, torch.randn(6, 3, 5, 4))
    assert claims(analysis) == [("body", "S(4)")]
    assert any("axes [-3]" in r for r in blocked_at(analysis, "norm"))


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(4), nn.GroupNorm(2, 4)], ids=["batch_norm", "group_norm"])
def test_affine_channel_norm_on_data_puts_its_site_on_the_channel_axis(norm):
    # (B, C=4, L=5) data: the gain and bias scale channels (axis -2), which the linear map on L cannot
    # absorb; before the fix the affine site was put on the last axis and its scalings were claimed.
    analysis = certified(Norm(nn.Identity(), norm, nn.Linear(5, 3)), torch.randn(6, 4, 5))
    assert claims(analysis) == []
    assert any("reads axis -1 of a value whose sites run along axis -2" in b.reason for b in analysis.blocked
               if b.site == "norm")


def test_group_norm_on_a_last_axis_site_keeps_position_permutations():
    model = Norm(nn.Linear(4, 4), nn.GroupNorm(2, 4), nn.Linear(4, 3))
    analysis = certified(model, torch.randn(6, 4, 4))
    assert claims(analysis) == [("body", "S(4)")]
    assert any("group norm works along axes [-2]" in r for r in blocked_at(analysis, "norm"))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_over_time_after_a_transpose(affine):
    # (B, T=5, d=4) -> linear on d -> transpose -> LayerNorm(5) over time: each feature row is normalised
    # alone, so its bias translation cancels and permutations pass; a shift along 1 of the linear map
    # (the old claim) changes the output, and sign flips survive only without the norm's bias.
    model = Norm(nn.Linear(4, 4), nn.LayerNorm(5, elementwise_affine=affine), nn.Linear(5, 3), transpose=True)
    analysis = certified(model, torch.randn(6, 5, 4))
    # without a gain the head reads a zero-sum vector: its rows shift along 1 (W ↦ W + c 1ᵀ)
    assert claims(analysis) == [("body", "Translations(4, bias)")] + \
        ([] if affine else [("head.columns", "Translations(3, along 1)")])
    reasons = blocked_at(analysis, "norm")
    assert any("layer norm works along axes [-1], but the sites run along axis -2: only " +
               ("S, T" if affine else "S, SF, T") + " pass" in r for r in reasons)


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_over_two_axes(affine):
    # LayerNorm((T, d)) normalises the whole (T, d) slice: O(d)_1 per position keeps its mean and centred
    # norm, the bias shift along 1 cancels, but a shift of the weight's rows (+ t·x_j, varying with the
    # position) does not: 1 translation, not 4 + 1.
    model = Norm(nn.Linear(4, 4), nn.LayerNorm((5, 4), elementwise_affine=affine), nn.Linear(4, 3))
    analysis = certified(model, torch.randn(6, 5, 4))
    if affine:
        assert claims(analysis) == [("body", "S(4)"), ("body", "Translations(1, along 1)"),
                                    ("norm", "PositiveScaling(4, alpha=1)"), ("norm", "SignFlips(4)")]
    else:
        assert claims(analysis) == [("body", "O(4)_1"), ("body", "Translations(1, along 1)")]


@pytest.mark.parametrize("norm", [nn.RMSNorm(5), nn.RMSNorm(5, elementwise_affine=False)], ids=["gain", "plain"])
def test_rms_norm_over_time_keeps_permutations_and_sign_flips(norm):
    # RMS(−v) = −RMS(v) row by row: sign flips and permutations of d pass a norm over time; here the
    # reading linear map on T removes them, so nothing is claimed and both steps are reported.
    analysis = certified(Norm(nn.Linear(4, 4), norm, nn.Linear(5, 3), transpose=True), torch.randn(6, 5, 4))
    assert claims(analysis) == []
    assert any("RMS norm works along axes [-1], but the sites run along axis -2: only S, SF pass" in r
               for r in blocked_at(analysis, "norm"))


def test_rms_norm_over_time_before_a_feature_map_keeps_sign_flips():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.norm, self.head = nn.Linear(4, 4), nn.RMSNorm(5), nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.norm(self.body(x).transpose(1, 2)).transpose(1, 2))

    analysis = certified(Model(), torch.randn(6, 5, 4))
    assert claims(analysis) == [("body", "S(4)"), ("body", "SignFlips(4)")]


# -- root cause 5: a translation the group norm ignores moves no running mean -------------------

class GroupThenBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.gn = nn.Conv1d(3, 4, 3), nn.GroupNorm(2, 4, affine=False)
        self.bn, self.head = nn.BatchNorm1d(4), nn.Conv1d(4, 2, 1)

    def forward(self, x):
        return self.head(self.bn(self.gn(self.conv(x))))


def test_group_norm_translation_does_not_move_the_next_running_mean():
    analysis = certified(GroupThenBatchNorm(), torch.randn(6, 3, 7), running_statistics=True)
    assert ("conv.group0", "Translations(1, bias)") in claims(analysis)
    assert ("conv.group1", "Translations(1, bias)") in claims(analysis)
    for symmetry in analysis.symmetries:
        if symmetry.label.startswith("Translations"):
            assert not symmetry.acts_on_buffers, symmetry.label
    # the eval-mode batch norm is a per-channel affine map: it removes the groups' orthogonal maps, named there
    assert any(r.node == "bn" and "normalises each channel" in r.reason for r in analysis.sites.restrictions)


# -- root cause 6: a shift along 1 must move the whole normalised vector -------------------------

class CatNorm(nn.Module):
    def __init__(self, affine):
        super().__init__()
        self.a, self.c = nn.Linear(3, 2), nn.Linear(3, 3)
        self.norm, self.head = nn.LayerNorm(5, elementwise_affine=affine), nn.Linear(5, 2)

    def forward(self, x):
        return self.head(self.norm(torch.cat([self.a(x), self.c(x)], -1)))


@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_after_cat_claims_no_per_slice_shift(affine):
    analysis = certified(CatNorm(affine), torch.randn(6, 3))
    # the gain's slices over a's and c's coordinates are two sites: norm and norm#2
    expected = [("a", "S(2)"), ("c", "S(3)"), ("norm", "PositiveScaling(2, alpha=1)"), ("norm", "Shears(2)"),
                ("norm", "SignFlips(2)"), ("norm#2", "PositiveScaling(3, alpha=1)"), ("norm#2", "Shears(3)"),
                ("norm#2", "SignFlips(3)")] \
        if affine else [("a", "O(2)_1"), ("c", "O(3)_1"),   # O1 on a slice keeps the global mean and centred norm
                        ("head.columns", "Translations(2, along 1)")]   # the head reads the whole zero-sum vector
    assert claims(analysis) == expected
    notes = [b for b in analysis.blocked if b.node == "norm" and "shift along 1 of one of them" in b.reason]
    assert sorted(b.site for b in notes) == ["a", "c"]


# -- pooling over the sites' axis -----------------------------------------------------------------

class Pooled(nn.Module):
    """``head(pool(relu(body(x))))`` on ``(B, T, d)``; ``over_time`` pools ``T`` (transposing first)."""

    def __init__(self, pool, over_time=False):
        super().__init__()
        self.body, self.pool, self.over_time = nn.Linear(4, 4), pool, over_time
        self.head = nn.Linear(2 if not over_time else 4, 3)

    def forward(self, x):
        h = torch.relu(self.body(x))
        if self.over_time:
            return self.head(self.pool(h.transpose(1, 2)).transpose(1, 2))
        return self.head(self.pool(h) if isinstance(self.pool, nn.Module) else self.pool(h, 2))


@pytest.mark.parametrize("pool", [nn.MaxPool1d(2), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(2),
                                  torch.nn.functional.max_pool1d], ids=["max", "avg", "adaptive_avg", "F.max_pool1d"])
def test_pooling_over_the_feature_axis_mixes_the_sites(pool):
    # A 1-d pool on (B, T, d) pools d: windows of features mix, so no action of the linear map's rows passes.
    analysis = certified(Pooled(pool), torch.randn(6, 5, 4))
    assert claims(analysis) == []
    node = "pool" if isinstance(pool, nn.Module) else "max_pool1d"
    assert any("pools over the last 1 axes, and the sites run along axis -1" in r for r in blocked_at(analysis, node))


@pytest.mark.parametrize("pool", [nn.MaxPool1d(2), nn.AvgPool1d(2)], ids=["max", "avg"])
def test_pooling_over_time_keeps_the_feature_scalings(pool):
    analysis = certified(Pooled(pool, over_time=True), torch.randn(6, 5, 4))
    assert ("body", "PositiveScaling(4, alpha=1)") in claims(analysis)


class CatLogits(nn.Module):
    def __init__(self, softmax):
        super().__init__()
        self.a, self.c, self.softmax = nn.Linear(3, 2), nn.Linear(3, 3), softmax

    def forward(self, x):
        z = torch.cat([self.a(x), self.c(x)], -1)
        return z.softmax(-1) if self.softmax else z


@pytest.mark.parametrize("loss", ["softmax", "cross_entropy"])
def test_softmax_after_cat_claims_no_per_slice_shift(loss):
    # softmax(z + c·[1, 0]) ≠ softmax(z): only a shift of every slice together would cancel.
    model = CatLogits(softmax=loss == "softmax").double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(6, 3),)), loss="mse" if loss == "softmax" else loss,
                             certify=False)
    assert_claims_hold(analysis)
    assert claims(analysis) == []
    node = "softmax" if loss == "softmax" else "output"
    notes = [b for b in analysis.blocked if b.node == node and "no shift of the whole vector" in b.reason]
    assert sorted(b.site for b in notes) == ["a", "c"]


def test_softmax_over_flattened_channels_keeps_only_the_bias_shift():
    # Flattening conv channels (blocks of positions) into the softmax axis: a shift of the kernel's rows adds
    # t·x_j(position), which varies along the softmax axis; the bias shift along 1 adds one number.
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 3, 3)

        def forward(self, x):
            return torch.softmax(self.conv(x).flatten(1), -1)

    analysis = certified(Model(), torch.randn(6, 2, 7))
    assert claims(analysis) == [("conv", "Translations(1, along 1)")]


# -- broadcasts, depthwise convolutions and softmax axes -----------------------------------------

class AddParameter(nn.Module):
    """``head(relu(conv(x) + p))`` with ``p`` broadcast against ``(B, C=4, L=5)``."""

    def __init__(self, shape):
        super().__init__()
        self.conv, self.head = nn.Conv1d(2, 4, 3, bias=False), nn.Conv1d(4, 2, 1)
        self.p = nn.Parameter(torch.randn(shape))

    def forward(self, x):
        return self.head(torch.relu(self.conv(x) + self.p))


@pytest.mark.parametrize("shape, expected", [
    ((4, 1), [("conv", "PositiveScaling(4, alpha=1)"), ("conv", "S(4)")]),  # p runs along the channels
    ((4, 5), [("conv", "PositiveScaling(4, alpha=1)"), ("conv", "S(4)")]),
    ((5,), [("conv", "S(4)")]),  # p is one vector over positions for every channel: it cannot be scaled per channel
    ((1, 5), [("conv", "S(4)")]),
    ((1,), [("conv", "S(4)")]),
])
def test_added_parameter_moves_along_the_axis_it_broadcasts_on(shape, expected):
    analysis = certified(AddParameter(shape), torch.randn(6, 2, 7))
    assert claims(analysis) == expected
    constant = shape[-2] == 1 if len(shape) > 1 else True
    assert any("constant along the sites' axis -2" in r for r in blocked_at(analysis, "add")) == constant


def test_depthwise_convolution_along_the_sites_axis_mixes_them():
    # A depthwise conv on (B, T=4, d=4) convolves along d, mixing neighbouring features of the linear map.
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.dw, self.head = nn.Linear(3, 4), nn.Conv1d(4, 4, 3, groups=4, padding=1), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.dw(torch.relu(self.body(x))))

    analysis = certified(Model(), torch.randn(6, 4, 3))
    assert ("body", "PositiveScaling(4, alpha=1)") not in claims(analysis)
    assert any("slides along the sites' axis -1" in r for r in blocked_at(analysis, "dw"))


def test_softmax_without_dim_uses_torchs_implicit_axis():
    # F.softmax(z) on a 3-d value normalises axis 0 (torch's deprecated implicit dim), not the features.
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(torch.nn.functional.softmax(self.body(x)))

    with pytest.warns(UserWarning, match="Implicit dimension"):
        analysis = certified(Model(), torch.randn(6, 5, 3))
    assert claims(analysis) == []
    assert blocked_at(analysis, "softmax")


# -- fuzzer findings F4-F6 (symalg.verification.fuzz.generate(0, 68 | 45 | 43, ...)), as found ----------------------

def fuzzed(model, x, eval_modules=()):
    """The fuzzer's set-up (:func:`symalg.verification.fuzz.randomize`), then the listed modules in eval mode."""
    model = randomize(model.double())
    for module in eval_modules:
        module.eval()
    return certified(model, x)


def test_fuzz_f4_batch_norm_on_a_sequence_in_training():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1, self.m2 = nn.Linear(5, 5), nn.BatchNorm1d(5), nn.Linear(5, 2)

        def forward(self, x):
            return self.m2(torch.sigmoid(self.m1(nn.functional.silu(self.m0(x)))))

    analysis = fuzzed(Model(), torch.randn(3, 5, 5))
    assert claims(analysis) == [("m0", "S(5)")]  # not the sign flips of the affine part on the wrong axis


def test_fuzz_f5_layer_norm_over_time_between_transposes():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1, self.m2 = nn.Linear(1, 4), nn.LayerNorm(2), nn.Linear(4, 4, bias=False)

        def forward(self, x):
            h = self.m1(torch.tanh(self.m0(x)).transpose(1, -1)).transpose(1, -1)
            return self.m2(nn.functional.leaky_relu(h))

    analysis = fuzzed(Model(), torch.randn(3, 2, 1))
    assert claims(analysis) == [("m0", "S(4)")]
    assert any("layer norm works along axes [-1], but the sites run along axis -2" in r
               for r in blocked_at(analysis, "m1"))


def test_fuzz_f6_group_norm_then_eval_batch_norm():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1 = nn.Conv1d(5, 3, 3, padding="same"), nn.GroupNorm(3, 3, affine=False)
            self.m2, self.m3 = nn.BatchNorm1d(3), nn.Conv1d(3, 6, 1)

        def forward(self, x):
            return self.m3(nn.functional.silu(self.m2(self.m1(self.m0(x))))).mean(-1)

    model = Model()
    analysis = fuzzed(model, torch.randn(2, 5, 6), eval_modules=(model.m2,))
    assert claims(analysis) == [(f"m0.group{g}", "Translations(1, bias)") for g in range(3)] + [("m0.groups", "S(3)")]


def test_fuzz_group_norm_groups_of_a_depthwise_convolution_of_data_do_not_permute():
    # symalg.verification.fuzz.generate(0, 6348, "conv"): the depthwise conv reads data, so permuting its channels (the
    # group norm's whole groups) changes which input channel each reads
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1 = nn.Conv2d(2, 2, 1, padding=1, groups=2), nn.GroupNorm(2, 2, affine=False)
            self.m2, self.m3 = nn.BatchNorm2d(2), nn.Conv2d(2, 2, 1)

        def forward(self, x):
            return self.m3(nn.functional.leaky_relu(self.m2(self.m1(self.m0(x))))).flatten(1)

    analysis = fuzzed(Model(), torch.randn(3, 2, 4, 4))
    assert not any(site == "m0.groups" for site, _ in claims(analysis))
    # the batch norm's gain reads three sites (two groups, the groups' permutation): m2, m2#2, m2#3
    assert ("m2#3", "PositiveScaling(2, alpha=1)") in claims(analysis)


def test_fuzz_sigmoid_flip_after_a_one_channel_group_norm_shifts_the_bias_once():
    # symalg.verification.fuzz.generate(0, 7622, "conv"): with one channel, the group's site and the
    # group-permutation site bind the same region and are tied; the reader's bias absorbed the flip's shift once
    # per site (twice)
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.m0, self.m1 = nn.Conv2d(1, 1, 1, padding="same"), nn.GroupNorm(1, 1, affine=False)
            self.m2, self.m3 = nn.BatchNorm2d(1), nn.Conv2d(1, 3, 1)

        def forward(self, x):
            return self.m3(torch.sigmoid(self.m2(self.m1(self.m0(x))))).flatten(1)

    analysis = fuzzed(Model(), torch.randn(3, 1, 4, 4))
    assert ("m2", "SignFlips(1, center=1/2)") in claims(analysis)


class FunctionalNorm(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.body, self.head, self.norm = nn.Linear(3, 4), nn.Linear(4, 2), norm
        self.weight, self.bias = nn.Parameter(torch.rand(4) + 0.5), nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.head(self.norm(self, self.body(x)))


class ModuleNorm(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.body, self.head, self.norm = nn.Linear(3, 4), nn.Linear(4, 2), norm

    def forward(self, x):
        return self.head(self.norm(self.body(x)))


FUNCTIONAL_NORMS = {
    "F.layer_norm": (lambda m, h: nn.functional.layer_norm(h, (4,), m.weight, m.bias), lambda: nn.LayerNorm(4)),
    "F.layer_norm_plain": (lambda m, h: nn.functional.layer_norm(h, (4,)), lambda: nn.LayerNorm(4, bias=False,
                                                                                               elementwise_affine=False)),
    "F.rms_norm": (lambda m, h: nn.functional.rms_norm(h, (4,), m.weight), lambda: nn.RMSNorm(4)),
    "F.batch_norm": (lambda m, h: nn.functional.batch_norm(h, None, None, m.weight, m.bias, training=True),
                     lambda: nn.BatchNorm1d(4, track_running_stats=False)),
    "F.batch_norm_plain": (lambda m, h: nn.functional.batch_norm(h, None, None, training=True),
                           lambda: nn.BatchNorm1d(4, affine=False, track_running_stats=False)),
    "F.group_norm": (lambda m, h: nn.functional.group_norm(h, 2, m.weight, m.bias), lambda: nn.GroupNorm(2, 4)),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONAL_NORMS))
@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_functional_norms_claim_what_their_modules_claim(name, tracer):
    """A norm called as a function (``F.layer_norm(h, s, w, b)``, and ``aten.layer_norm`` through export) reads
    its weights by role like the module: the same groups, and every claim keeps the outputs."""
    functional, module = FUNCTIONAL_NORMS[name]
    torch.manual_seed(0)
    x = torch.randn(6, 3, dtype=torch.float64)
    called = symalg.derive(symalg.trace(FunctionalNorm(functional).double(), (x,), tracer=tracer), certify=False)
    assert_claims_hold(called, draws=2)
    twin = symalg.derive(symalg.trace(ModuleNorm(module()).double(), (x,)), certify=False)
    assert sorted(g for _, g in claims(called)) == sorted(g for _, g in claims(twin)) != []


@pytest.mark.parametrize("norm, node", [
    (lambda m, h: nn.functional.layer_norm(h, (4,), m.weight * 2, m.bias), "layer_norm"),
    (lambda m, h: nn.functional.rms_norm(h, (4,), m.weight + m.bias), "rms_norm"),
    (lambda m, h: nn.functional.group_norm(h, 2, m.weight.exp(), m.bias), "group_norm"),
], ids=["F.layer_norm", "F.rms_norm", "F.group_norm"])
def test_functional_norms_with_computed_weights_are_not_modelled_and_say_so(norm, node):
    # A weight computed in forward is no parameter the rule can move by its role: nothing passes the norm, and
    # the note names the node.
    analysis = certified(FunctionalNorm(norm), torch.randn(6, 3))
    assert ("body", "S(4)") not in claims(analysis)
    assert any("not in the equivariance catalogue" in r for r in blocked_at(analysis, node))
