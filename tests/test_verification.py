"""Numerical verification (``symalg.verify``): positive runs over many architectures, negative
controls that must be caught, the report object, and the exact identities it rests on."""
from __future__ import annotations

import random
import re

import pytest
import sympy as sp
import torch

import symalg
from symalg.catalogue import CatalogueEntry, declare_homogeneous
from symalg.graph import SpecError
from symalg.groups import Orthogonal, PositiveScaling
from symalg.numeric import mse_loss, random_data
from symalg.verification import TOLERANCES

ACTIVATIONS = ["identity", "relu", "leaky_relu", "relu_pow", "tanh", "sigmoid", "gelu", "silu", "softplus", "radial"]


def rel_err(a, b):
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-300)
    return (a - b).abs().max().item() / scale


def gradients(analysis, params, x, y):
    loss = mse_loss(symalg.network_function(analysis.architecture, analysis.catalogue), x, y)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    return dict(zip(leaves, torch.autograd.grad(loss(leaves), list(leaves.values()))))


# -- a deterministic zoo of mixed networks -------------------------------------------------------------
def random_spec(rng: random.Random) -> str:
    depth = rng.randint(2, 5)
    widths = [rng.randint(2, 6) for _ in range(depth + 1)]
    layers = []
    for i in range(depth):
        bias = "" if rng.random() < 0.6 else ", bias=False"
        layers.append(f"linear({widths[i]}, {widths[i + 1]}{bias})")
        if i < depth - 1:
            layers.append(rng.choice(ACTIVATIONS))
    return " -> ".join(layers)


_RNG = random.Random(0)
ZOO = [random_spec(_RNG) for _ in range(30)]


def test_zoo_covers_every_activation_depth_and_bias_setting():
    archs = [symalg.parse(spec) for spec in ZOO]
    ops = {site.op for arch in archs for site in symalg.infer_sites(arch)[0]}
    assert ops == set(ACTIVATIONS)
    assert {len(arch.linear_layers) for arch in archs} == {2, 3, 4, 5}
    biases = [arch.node(v)["bias"] is not None for arch in archs for v in arch.linear_layers]
    assert any(biases) and not all(biases)


@pytest.mark.parametrize("spec", ZOO)
def test_mixed_network_verifies_in_float64(spec):
    analysis = symalg.derive(spec)
    report = symalg.verify(analysis, dtype=torch.float64)
    assert report.passed, str(report)
    assert report.checks
    for check in report.checks:
        assert check.max_error <= 1e-9, str(check)
    # every symmetry was actually exercised
    assert {c.symmetry for c in report.checks if c.check == "invariance"} == {s.label for s in analysis.symmetries}


@pytest.mark.parametrize("spec", [
    "linear(2, 1) -> relu -> linear(1, 2)",
    "linear(2, 1) -> tanh -> linear(1, 2)",
    "linear(3, 1) -> gelu -> linear(1, 3) -> relu -> linear(3, 2)",
])
def test_width_one_sites_verify(spec):
    """A pointwise site of width 1 has S(1) = {e}: no generators, nothing to fail, no crash."""
    report = symalg.verify(symalg.derive(spec))
    assert report.passed, str(report)


@pytest.mark.parametrize("spec", [
    "linear(2, 3) -> relu_pow(alpha=3) -> linear(3, 2)",
    "linear(6, 6) -> relu_pow -> linear(6, 4, bias=False)",
    "linear(2, 3) -> relu_pow(alpha=1.5) -> linear(3, 2)",
    "linear(2, 3) -> leaky_relu(slope=0.2) -> linear(3, 2)",
])
def test_hyperparameter_variants_verify(spec):
    """Correct symmetries must not be reported as failing, whatever the size of the gradients."""
    analysis = symalg.derive(spec)
    assert all(check.proved is True for s in analysis.symmetries for check in s.checks)
    report = symalg.verify(analysis)
    assert report.passed, str(report)


# -- negative controls -----------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    "linear(3, 5) -> sigmoid -> linear(5, 2)",
    "linear(3, 5) -> gelu -> linear(5, 2)",
    "linear(3, 5) -> sigmoid -> linear(5, 4) -> gelu -> linear(4, 2)",
    "linear(n, h) -> gelu -> linear(h, k) -> sigmoid -> linear(k, m)",
])
def test_sigmoid_and_gelu_sites_have_no_continuous_symmetry(spec):
    analysis = symalg.derive(spec)
    assert not any(s.group.is_continuous for s in analysis.symmetries)
    assert analysis.conserved_quantities() == [] and analysis.angular_momenta() == []
    assert analysis.orbit_dimension() == 0
    assert all(not isinstance(s.group, PositiveScaling) for s in analysis.symmetries)


def _wrong_tanh():
    """tanh wrongly declared positively homogeneous: σ(c z) = c σ(z) is false."""
    return symalg.overlay({"tanh": CatalogueEntry("tanh", lambda z: sp.tanh(z), declare_homogeneous())})


def test_wrong_declaration_is_caught_numerically():
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False)
    scaling = [s for s in analysis.symmetries if isinstance(s.group, PositiveScaling)]
    assert len(scaling) == 1
    report = symalg.verify(analysis)
    assert not report.passed
    invariance = [c for c in report.checks if c.check == "invariance" and c.symmetry == scaling[0].label]
    assert len(invariance) == 1 and not invariance[0].passed
    assert invariance[0].max_error > 1e-3
    gradient = [c for c in report.checks if c.check == "gradient_orthogonality" and c.symmetry == scaling[0].label]
    assert gradient and not gradient[0].passed
    # the permutations, which tanh really has, still pass
    assert all(c.passed for c in report.checks if c.symmetry.endswith(":S(4)"))


def test_wrong_declaration_is_caught_symbolically():
    analysis = symalg.derive("linear(n, h) -> tanh -> linear(h, m)", _wrong_tanh(), strict=False)
    scaling = next(s for s in analysis.symmetries if isinstance(s.group, PositiveScaling))
    identity, invariance, infinitesimal = scaling.checks
    assert identity.proved is False
    assert infinitesimal.proved is False
    # the invariance check is conditional on the identity, so it still holds
    assert invariance.proved is True


def test_disproved_declaration_is_not_claimed_but_blocked_by_default():
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh())
    assert [s.group.name for s in analysis.symmetries] == ["S(4)"]
    (blocked,) = analysis.blocked
    assert blocked.node == "1" and blocked.site == "h1"
    assert "PositiveScaling(4, alpha=1) for tanh is disproved: σ(c z) = c^1 σ(z), c > 0: FALSE" in blocked.reason
    assert analysis.orbit_dimension() == 0 and analysis.conserved_quantities() == []
    assert symalg.verify(analysis).passed


def test_overlay_does_not_touch_the_global_catalogue():
    _wrong_tanh()
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)")
    assert [s.group.name for s in analysis.symmetries] == ["SignFlips(4)", "S(4)"]


def test_sigmoid_sign_flips_blocked_without_consumer_bias():
    analysis = symalg.derive("linear(3, 4) -> sigmoid -> linear(4, 2, bias=False)")
    assert [s.group.name for s in analysis.symmetries] == ["S(4)"]
    assert len(analysis.blocked) == 1
    blocked = analysis.blocked[0]
    assert (blocked.node, blocked.site) == ("2", "h1")
    assert "bias" in blocked.reason and "sigmoid" in blocked.reason
    assert symalg.verify(analysis).passed


def test_sigmoid_sign_flips_kept_with_consumer_bias():
    analysis = symalg.derive("linear(3, 4, bias=False) -> sigmoid -> linear(4, 2)")
    assert [s.group.name for s in analysis.symmetries] == ["SignFlips(4, center=1/2)", "S(4)"]
    assert analysis.blocked == ()
    flips = analysis.symmetries[0]
    assert "2.bias" in flips.action  # the shift is absorbed by the consumer's bias
    assert symalg.verify(analysis).passed


def test_sigmoid_blocking_is_per_site():
    analysis = symalg.derive("linear(3, 4) -> sigmoid -> linear(4, 5) -> sigmoid -> linear(5, 2, bias=False)")
    assert [s.label for s in analysis.symmetries] == ["h1:SignFlips(4, center=1/2)", "h1:S(4)", "h2:S(5)"]
    assert [(b.node, b.site) for b in analysis.blocked] == [("4", "h2")]
    assert symalg.verify(analysis).passed


def _sequential(middle: torch.nn.Module) -> torch.nn.Sequential:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.ReLU(),
            torch.nn.Linear(4, 5), middle,
            torch.nn.Linear(5, 3), torch.nn.Tanh(),
            torch.nn.Linear(3, 2)).double()


def test_unknown_module_blocks_exactly_its_site():
    model = _sequential(torch.nn.Hardswish())
    analysis = symalg.derive(symalg.from_torch(model))
    assert len(analysis.blocked) == 1
    blocked = analysis.blocked[0]
    assert (blocked.node, blocked.site) == ("3", "h2")
    assert "Hardswish" in blocked.reason
    assert "Hardswish" in str(blocked)
    labels = [s.label for s in analysis.symmetries]
    assert not any(label.startswith("h2:") for label in labels)
    # the same network with a known activation there differs exactly by that site's symmetries
    reference = symalg.derive(symalg.from_torch(_sequential(torch.nn.GELU())))
    assert [s.label for s in reference.symmetries if not s.label.startswith("h2:")] == labels
    assert [s.label for s in reference.symmetries if s.label.startswith("h2:")] == ["h2:S(5)"]
    assert labels == ["h1:PositiveScaling(4, alpha=1)", "h1:S(4)", "h3:SignFlips(3)", "h3:S(3)"]
    # the other sites still verify, with the module run as is
    report = symalg.verify(analysis, params=dict(model.named_parameters()))
    assert report.passed, str(report)
    assert {c.symmetry for c in report.checks if c.check == "invariance"} == set(labels)
    forward = symalg.network_function(analysis.architecture)
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(forward(dict(model.named_parameters()), x), model(x), rtol=0, atol=1e-14)


# -- given parameters and data ---------------------------------------------------------------------------
def test_verify_with_params_and_data_from_a_torch_model():
    model = _sequential(torch.nn.Identity())
    params = dict(model.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    analysis = symalg.derive(symalg.from_torch(model))
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, generator=generator, dtype=torch.float64)
    y = torch.randn(40, 2, generator=generator, dtype=torch.float64)
    report = symalg.verify(analysis, params=params, data=(x, y))
    assert report.passed, str(report)
    assert {c.symmetry for c in report.checks if c.check == "invariance"} == {s.label for s in analysis.symmetries}
    # the model is untouched
    assert all(torch.equal(before[k], params[k].detach()) for k in params)
    # the report was computed at these parameters and this data: its drift matches ours
    grads = gradients(analysis, {k: v.detach() for k, v in params.items()}, x, y)
    for q in analysis.conserved_quantities():
        theta = {k: v.detach() for k, v in params.items()}
        drift = (q({k: theta[k] - 0.1 * grads[k] for k in theta}) - q(theta)).abs().max().item()
        check = next(c for c in report.checks if c.check == "gd_drift" and c.symmetry == q.symmetry.label)
        reported = float(re.search(r"max\|ΔC\| = ([-+0-9.e]+)", check.detail).group(1))
        assert reported == pytest.approx(drift, rel=1e-2)


def test_verify_reads_symbolic_widths_from_params():
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    report = symalg.verify(analysis, params=dict(model.named_parameters()))
    assert report.passed, str(report)
    orbit = next(c for c in report.checks if c.check == "orbit_dimension")
    assert "formula 6" in orbit.detail and "numeric rank 6" in orbit.detail


def test_verify_rejects_params_of_the_wrong_shape():
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    params = symalg.random_params(symalg.parse("linear(3, 5) -> relu -> linear(5, 2)"))
    with pytest.raises(SpecError, match="0.weight"):
        symalg.verify(analysis, params=params)


def test_verify_in_float32_uses_its_own_tolerance():
    for spec in ["linear(3, 5) -> relu -> linear(5, 2)", "linear(3, 4) -> identity -> linear(4, 2)",
                 "linear(3, 4) -> radial -> linear(4, 3) -> tanh -> linear(3, 2)"]:
        report = symalg.verify(symalg.derive(spec), dtype=torch.float32)
        assert report.dtype == torch.float32
        assert report.passed, str(report)
        numeric = [c for c in report.checks if c.check != "orbit_dimension"]
        assert numeric and all(c.tolerance == TOLERANCES[torch.float32] for c in numeric)
        assert TOLERANCES[torch.float32] > TOLERANCES[torch.float64]
        assert "float32" in report.summary()


def test_verify_rejects_unsupported_dtype():
    with pytest.raises(ValueError, match="dtype"):
        symalg.verify(symalg.derive("linear(3, 4) -> relu -> linear(4, 2)"), dtype=torch.float16)


def test_symbolic_widths_without_params_verify_at_stated_default_widths():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    report = symalg.verify(analysis)
    assert report.passed and report.widths == {"h": 3, "m": 4, "n": 5}
    assert "widths h=3, m=4, n=5" in report.summary()


def test_partial_widths_raise_clear_error_naming_the_missing_ones():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    with pytest.raises(SpecError) as error:
        symalg.verify(analysis, widths={"h": 4})
    message = str(error.value)
    assert "symbolic widths" in message and "widths=" in message
    for name in ("n", "m"):
        assert f"'{name}'" in message


def test_verify_with_widths_keyword():
    analysis = symalg.derive("linear(n, h) -> tanh -> linear(h, k) -> relu -> linear(k, m)")
    widths = {"n": 3, "h": 5, "k": 4, "m": 2}
    report = symalg.verify(analysis, widths=widths, seed=3)
    assert report.passed, str(report)
    orbit = next(c for c in report.checks if c.check == "orbit_dimension")
    assert "formula 4" in orbit.detail
    # same as verifying the substituted analysis with the same seed
    direct = symalg.verify(analysis.subs(widths), seed=3)
    assert [(c.check, c.symmetry, c.max_error) for c in report.checks] == \
           [(c.check, c.symmetry, c.max_error) for c in direct.checks]


def test_verify_is_deterministic_in_the_seed():
    analysis = symalg.derive("linear(3, 4) -> identity -> linear(4, 5) -> relu -> linear(5, 2)")
    a, b = symalg.verify(analysis, seed=7), symalg.verify(analysis, seed=7)
    assert [c.max_error for c in a.checks] == [c.max_error for c in b.checks]


# -- the report object --------------------------------------------------------------------------------------
def test_report_of_a_passing_run():
    report = symalg.verify(symalg.derive("linear(3, 4) -> relu -> linear(4, 2)"))
    assert report.passed and report.failures == []
    n = len(report.checks)
    assert report.summary() == f"{n} passed, 0 failed ({n} checks, float64, cpu)"
    assert str(report).splitlines()[-1] == report.summary()
    assert "FAIL" not in str(report)
    assert {c.check for c in report.checks} == {"invariance", "gradient_orthogonality", "gd_drift",
                                                "gradient_flow", "orbit_dimension", "lowering"}


def test_report_of_a_failing_run():
    report = symalg.verify(symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False))
    assert not report.passed
    failures = report.failures
    assert failures and all(not c.passed for c in failures)
    assert all(c.max_error > c.tolerance for c in failures)
    assert set(failures) == {c for c in report.checks if not c.passed}
    n, k = len(report.checks), len(failures)
    assert report.summary() == f"{n - k} passed, {k} failed ({n} checks, float64, cpu)"
    assert str(report).count("FAIL") == k
    assert all("PositiveScaling" in c.symmetry for c in failures)


# -- the exact identities -------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    "linear(3, 4) -> identity -> linear(4, 2)",
    "linear(3, 4, bias=False) -> identity -> linear(4, 5) -> relu -> linear(5, 2)",
    "linear(3, 5) -> relu_pow -> linear(5, 2)",
    "linear(3, 5) -> leaky_relu -> linear(5, 4, bias=False) -> relu -> linear(4, 2)",
])
def test_gd_drift_is_exactly_eta_squared_C_of_gradient(spec):
    """``C(θ − η∇L) − C(θ) = η² C(∇L)`` exactly (the linear term vanishes by invariance)."""
    analysis = symalg.derive(spec)
    generator = torch.Generator().manual_seed(1)
    params = symalg.random_params(analysis.architecture, generator)
    x, y = random_data(analysis.architecture, generator=generator)
    grads = gradients(analysis, params, x, y)
    quantities = analysis.conserved_quantities()
    assert quantities
    for q in quantities:
        assert q(grads).abs().max().item() > 1e-6  # not vacuous
        for eta in (0.01, 0.1, 1.0, 3.0):
            stepped = {k: params[k] - eta * grads[k] for k in params}
            drift = q(stepped) - q(params)
            predicted = eta ** 2 * q(grads)
            scale = max(q(params).abs().max().item(), predicted.abs().max().item())
            assert (drift - predicted).abs().max().item() <= 1e-12 * scale, f"{q.name}, η = {eta}"
    report = symalg.verify(analysis)
    drift_checks = [c for c in report.checks if c.check == "gd_drift"]
    assert len(drift_checks) == len(quantities) and all(c.passed for c in drift_checks)


def test_gd_drift_identity_fails_for_a_non_symmetry():
    """Control: with the wrong (tanh-homogeneous) declaration the linear term does not vanish."""
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False)
    report = symalg.verify(analysis)
    drift = [c for c in report.checks if c.check == "gd_drift"]
    assert drift and not any(c.passed for c in drift)


@pytest.mark.parametrize("spec", [
    "linear(3, 4) -> radial -> linear(4, 2)",
    "linear(3, 5, bias=False) -> radial -> linear(5, 4) -> relu -> linear(4, 2)",
    "linear(2, 4) -> radial -> linear(4, 3) -> tanh -> linear(3, 5) -> radial -> linear(5, 2, bias=False)",
])
def test_angular_momentum_relation_holds_and_decays_under_heavy_ball_for_radial_networks(spec):
    analysis = symalg.derive(spec)
    momenta = analysis.angular_momenta()
    radial_sites = [s for s in analysis.symmetries if isinstance(s.group, Orthogonal)]
    assert len(momenta) == len(radial_sites) > 0
    assert not any(isinstance(q.symmetry.group, Orthogonal) for q in analysis.conserved_quantities())
    generator = torch.Generator().manual_seed(2)
    params = symalg.random_params(analysis.architecture, generator)
    x, y = random_data(analysis.architecture, generator=generator)
    grads = gradients(analysis, params, x, y)
    velocity = {k: -g for k, g in grads.items()}
    noise = {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in params.items()}
    for j in momenta:
        names = j.symmetry.symbols
        scale = sum(params[n].norm() * grads[n].norm() for n in names).item()
        value = j(params, velocity)
        assert value.shape[-1] == value.shape[-2] == int(j.symmetry.group.width)
        assert value.abs().max().item() <= 1e-12 * scale
        generic = j(params, noise)
        assert generic.abs().max().item() > 1e-3  # the relation is not vacuous
        assert torch.allclose(generic, -generic.transpose(-1, -2), atol=1e-14)
    report = symalg.verify(analysis)
    assert report.passed, str(report)
    decay = [c for c in report.checks if c.check == "angular_momentum"]
    assert {c.symmetry for c in decay} == {s.label for s in radial_sites} and all(c.passed for c in decay)


def test_angular_momentum_check_catches_a_wrong_rotation_symmetry():
    """Control: tanh declared O(h)-equivariant keeps no e^(-γt) decay of ⟨θ̇, A·θ⟩ under heavy ball."""
    wrong = symalg.overlay({"tanh": CatalogueEntry("tanh", lambda z: sp.tanh(z), symalg.catalogue.declare_radial())})
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", wrong, strict=False)
    report = symalg.verify(analysis)
    (decay,) = [c for c in report.checks if c.check == "angular_momentum"]
    assert decay.failed and decay.max_error > 1e-6


def test_radial_next_to_linear_site_still_verifies():
    """No closed-form orbit dimension there: verify reports the numeric rank and skips the formula."""
    analysis = symalg.derive("linear(3, 4) -> radial -> linear(4, 5) -> identity -> linear(5, 2)")
    report = symalg.verify(analysis)
    assert report.passed, str(report)
    orbit = next(c for c in report.checks if c.check == "orbit_dimension")
    assert orbit.skipped and not orbit.passed and "no formula" in orbit.detail
    assert "1 skipped" in report.summary()


# -- CUDA ------------------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_verify_on_cuda(dtype):
    analysis = symalg.derive("linear(3, 6) -> relu -> linear(6, 4) -> identity -> linear(4, 5) -> radial "
                             "-> linear(5, 2)")
    report = symalg.verify(analysis, device="cuda", dtype=dtype)
    assert report.device == "cuda"
    assert report.passed, str(report)
    cpu = symalg.verify(analysis, device="cpu", dtype=dtype)
    assert [(c.check, c.symmetry) for c in report.checks] == [(c.check, c.symmetry) for c in cpu.checks]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_unavailable_device_is_a_clear_error():
    with pytest.raises(ValueError, match="device 'cuda' is not available here"):
        symalg.verify(symalg.derive("linear(2, 3) -> relu -> linear(3, 1)"), device="cuda")


def test_a_nan_error_is_a_failure_not_a_pass():
    check = symalg.verification.CheckResult("gradient_orthogonality", "h1:X", float("nan"), 1e-9)
    assert check.failed and not check.passed
    report = symalg.verification.VerificationReport((check,), torch.float64, "cpu")
    assert not report.passed and "0 passed, 1 failed" in report.summary()


def test_params_and_data_are_validated_with_named_errors(generator):
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    params = symalg.random_params(analysis.architecture, generator)
    broken = {**params, "2.weight": params["2.weight"].clone().fill_(float("nan"))}
    with pytest.raises(SpecError, match="parameter '2.weight' has non-finite entries"):
        symalg.verify(analysis, params=broken)
    x, y = symalg.random_data(analysis.architecture, generator=generator)
    with pytest.raises(ValueError, match=r"data must be a pair \(x, y\)"):
        symalg.verify(analysis, params=params, data=x)
    with pytest.raises(ValueError, match=r"data x must have shape \(batch, 3\), got \(16, 5\)"):
        symalg.verify(analysis, params=params, data=(torch.randn(16, 5), y))
    assert symalg.verify(analysis, params=params, data=(x, y)).passed


def test_large_models_list_the_skipped_lowering_check():
    report = symalg.verify(symalg.derive("linear(20, 30) -> relu -> linear(30, 10)"))
    (lowering,) = [c for c in report.checks if c.check == "lowering"]
    assert lowering.skipped and "symbolic_limit=400" in lowering.detail and report.passed


@pytest.mark.parametrize("kwargs, error, message", [
    ({"seed": "0"}, SpecError, r"verify: seed must be a non-negative integer, got '0'"),
    ({"seed": True}, SpecError, r"verify: seed must be a non-negative integer, got True"),
    ({"symbolic_limit": -1}, SpecError, r"verify: symbolic_limit must be a non-negative integer, got -1"),
    ({"data": ([[0.0] * 3], torch.zeros(1, 2))}, ValueError,
     r"verify: data x must be a floating-point tensor, got list"),
    ({"data": (torch.zeros(1, 3), torch.zeros(1, 2, dtype=torch.int64))}, ValueError,
     r"data y must be a floating-point"),
], ids=["seed-str", "seed-bool", "limit-negative", "data-list", "data-int"])
def test_verify_refuses_arguments_of_the_wrong_type_naming_them(kwargs, error, message):
    with pytest.raises(error, match=message):
        symalg.verify(symalg.derive("linear(3, 4) -> relu -> linear(4, 2)"), **kwargs)


def test_verify_refuses_widths_together_with_params():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    params = dict(symalg.to_module(symalg.parse("linear(3, 4) -> relu -> linear(4, 2)")).named_parameters())
    assert symalg.verify(analysis, params=params).widths == {"h": 4, "m": 2, "n": 3}
    with pytest.raises(SpecError, match="give params or widths, not both"):
        symalg.verify(analysis, params=params, widths={"h": 5, "m": 2, "n": 3})


def test_verify_refuses_what_is_not_an_analysis():
    with pytest.raises(TypeError, match="verify: analysis must be the result of symalg.derive, got str"):
        symalg.verify("linear(3, 4) -> relu -> linear(4, 2)")


@pytest.mark.parametrize("spec", ["linear(3, 4) -> relu -> linear(4, 2)", "linear(n, h) -> tanh -> linear(h, m)",
                                  "linear(3, 4) -> identity -> linear(4, 3, bias=False)"])
def test_cross_entropy_verifies_the_logit_translation_and_its_linear_quantities(spec):
    analysis = symalg.derive(spec, loss="cross_entropy")
    report = symalg.verify(analysis)
    assert report.passed, str(report)
    assert {c.check for c in report.checks if c.symmetry.startswith("y:Translations(")} == \
        {"invariance", "gradient_orthogonality", "gd_drift", "gradient_flow", "lowering"}


def test_the_logit_translation_fails_verification_under_mse():
    import dataclasses

    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)", loss="cross_entropy")
    as_mse = dataclasses.replace(analysis, loss="mse")           # the same claim, but the outputs must not move
    failed = {c.check for c in symalg.verify(as_mse).failures if c.symmetry == analysis.translations[0].label}
    assert {"invariance", "gradient_orthogonality", "gradient_flow"} <= failed
    # given targets are probabilities; the loss is the cross-entropy against them
    x = torch.randn(8, 3, dtype=torch.float64)
    y = torch.softmax(torch.randn(8, 2, dtype=torch.float64), -1)
    assert symalg.verify(analysis, data=(x, y)).passed
