"""Numerical verification (``symalg.verify``): positive runs over many architectures, negative
controls that must be caught, the report object, and the exact identities it rests on."""
from __future__ import annotations

import dataclasses
import random
import re

import pytest
import sympy as sp
import torch

import symalg
from symalg.catalogue.activations import CatalogueEntry, declare_homogeneous
from symalg.errors import SpecError
from symalg.catalogue.groups import Orthogonal, PositiveScaling
from symalg.symbolic.checks import symbolic_checks
from symalg.catalogue.groups import Translations
from symalg.numeric.sampling import random_data
from symalg.verification.verifier import SYMBOLIC_LIMIT
from torch.func import functional_call
from symalg.verification.checks import TOLERANCES

ACTIVATIONS = ["identity", "relu", "leaky_relu", "relu_pow", "tanh", "sigmoid", "gelu", "silu", "softplus", "radial"]


def rel_err(a, b):
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-300)
    return (a - b).abs().max().item() / scale


def gradients(analysis, params, x, y):
    """``∇L`` of the MSE of the analysis' own model (its generated module for a spec) at ``params``."""
    model = analysis.model_graph.model
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    loss = ((functional_call(model, leaves, (x,)) - y) ** 2).mean()
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def verifier_target(output_shape, seed=0, dtype=torch.float64):
    """The MSE target ``verify`` draws from its seed (documented in :mod:`symalg.verification.verifier`)."""
    return torch.randn(output_shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


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
    ops = {arch.node(v)["op"] for arch in archs for v in arch.graph if v not in arch.linear_layers}
    assert set(ACTIVATIONS) <= ops
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
    assert analysis.blocked == () and analysis.certified  # every declaration proved and certified
    assert any(isinstance(s.group, PositiveScaling) for s in analysis.symmetries)
    node = symalg.parse(spec).node("1")
    entry = analysis.catalogue[node["op"]]
    settings = tuple(sorted(entry.resolve(dict(node["params"])).items()))
    for s in analysis.symmetries:  # the three symbolic checks (identity, invariance, infinitesimal) prove each group
        assert [c.proved for c in symbolic_checks(entry, s.group, settings)] == [True, True, True], s.label
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
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False, certify=False)
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
    assert [c for c in report.checks if c.symmetry == "S(4) on 0"]
    assert all(c.passed for c in report.checks if c.symmetry == "S(4) on 0")


def test_wrong_declaration_is_caught_symbolically():
    analysis = symalg.derive("linear(n, h) -> tanh -> linear(h, m)", _wrong_tanh(), strict=False)
    scaling = next(s for s in analysis.symmetries if isinstance(s.group, PositiveScaling))
    identity, invariance, infinitesimal = symbolic_checks(analysis.catalogue["tanh"], scaling.group, ())
    assert identity.proved is False
    assert infinitesimal.proved is False
    # the invariance check is conditional on the identity, so it still holds
    assert invariance.proved is True


def test_disproved_declaration_is_not_claimed_but_blocked_by_default():
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh())
    assert [s.group.name for s in analysis.symmetries] == ["S(4)"]
    (blocked,) = analysis.blocked
    assert blocked.node == "1" and blocked.site == "0"
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
    assert analysis.blocked == ()
    (note,) = [b for b in analysis.sites.restrictions if b.reason.startswith("SF removed")]
    assert (note.node, note.site) == ("2", "0")
    assert "no bias to absorb the shift of an affine sign flip" in note.reason
    assert symalg.verify(analysis).passed


def test_sigmoid_sign_flips_kept_with_consumer_bias():
    analysis = symalg.derive("linear(3, 4, bias=False) -> sigmoid -> linear(4, 2)")
    assert [s.group.name for s in analysis.symmetries] == ["SignFlips(4, center=1/2)", "S(4)"]
    assert analysis.blocked == ()
    flips = analysis.symmetries[0]
    assert [reader.bias for reader, _ in flips.shifts] == ["2.bias"]  # the shift is absorbed by the consumer's bias
    assert "2.bias" in flips.tensors
    assert symalg.verify(analysis).passed


def test_sigmoid_blocking_is_per_site():
    analysis = symalg.derive("linear(3, 4) -> sigmoid -> linear(4, 5) -> sigmoid -> linear(5, 2, bias=False)")
    assert [s.label for s in analysis.symmetries] == ["SignFlips(4, center=1/2) on 0", "S(4) on 0", "S(5) on 2"]
    assert [(b.node, b.site) for b in analysis.sites.restrictions if b.reason.startswith("SF removed")] == [("4", "2")]
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
    model = _sequential(torch.nn.CELU())
    analysis = symalg.derive(symalg.parse(model))
    assert len(analysis.blocked) == 1
    blocked = analysis.blocked[0]
    assert (blocked.node, blocked.site) == ("3", "2")
    assert "CELU" in blocked.reason
    assert "CELU" in str(blocked)
    labels = [s.label for s in analysis.symmetries]
    assert not any(label.endswith(" on 2") for label in labels)
    # the same network with a known activation there differs exactly by that site's symmetries
    reference = symalg.derive(symalg.parse(_sequential(torch.nn.GELU())))
    assert [s.label for s in reference.symmetries if not s.label.endswith(" on 2")] == labels
    assert [s.label for s in reference.symmetries if s.label.endswith(" on 2")] == ["S(5) on 2"]
    assert labels == ["PositiveScaling(4, alpha=1) on 0", "SignFlips(3) on 4", "S(4) on 0", "S(3) on 4"]
    # the other sites still verify, with the module run as is
    report = symalg.verify(analysis, params=dict(model.named_parameters()))
    assert report.passed, str(report)
    assert {c.symmetry for c in report.checks if c.check == "invariance"} == set(labels)
    # the verified module computes the model itself (the unknown module included) at the model's parameters
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        verified = functional_call(analysis.model_graph.model, dict(model.named_parameters()), (x,))
        assert torch.allclose(verified, model(x), rtol=0, atol=1e-14)


# -- given parameters and data ---------------------------------------------------------------------------
def test_verify_with_params_and_data_from_a_torch_model():
    model = _sequential(torch.nn.Identity())
    params = dict(model.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    analysis = symalg.derive(symalg.parse(model))
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, generator=generator, dtype=torch.float64)
    report = symalg.verify(analysis, params=params, data=x)
    assert report.passed, str(report)
    assert {c.symmetry for c in report.checks if c.check == "invariance"} == {s.label for s in analysis.symmetries}
    # the model is untouched
    assert all(torch.equal(before[k], params[k].detach()) for k in params)
    # the report was computed at these parameters and this data: its drift matches ours
    grads = gradients(analysis, {k: v.detach() for k, v in params.items()}, x, verifier_target((40, 2)))
    theta = {k: v.detach() for k, v in params.items()}
    drift_checks = 0
    for s in analysis.symmetries:
        if s.conserved is None:
            continue
        q = s.conserved
        stepped, before = q({k: theta[k] - 0.1 * grads[k] for k in theta}), q(theta)
        drift = max((stepped[k] - before[k]).abs().max().item() for k in before)
        assert drift > 1e-6  # not vacuous
        check = next(c for c in report.checks if c.check == "gd_drift" and c.symmetry == s.label)
        reported = float(re.search(r"max\|ΔC\| = ([-+0-9.e]+)", check.detail).group(1))
        assert reported == pytest.approx(drift, rel=1e-4)
        drift_checks += 1
    assert drift_checks
    # other data give another report: the data are really used
    other = symalg.verify(analysis, params=params, data=2 * x)
    assert [c.detail for c in other.checks if c.check == "gd_drift"] != \
        [c.detail for c in report.checks if c.check == "gd_drift"]


def test_verify_reads_symbolic_widths_from_params():
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    report = symalg.verify(analysis, params=dict(model.named_parameters()))
    assert report.passed, str(report)
    orbit = next(c for c in report.checks if c.check == "orbit_dimension")
    assert "formula 6" in orbit.detail and "structured 6" in orbit.detail and orbit.passed


def test_verify_rejects_params_of_the_wrong_shape():
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    params = symalg.numeric.sampling.random_params(symalg.parse("linear(3, 5) -> relu -> linear(5, 2)"))
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
    report = symalg.verify(symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False,
                                         certify=False))
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
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    x, y = random_data(analysis.architecture, generator=generator)
    grads = gradients(analysis, params, x, y)
    quantities = analysis.conserved_quantities()
    assert quantities
    for q in quantities:
        at_grads, at_params = q(grads), q(params)
        for key in at_params:
            assert at_grads[key].abs().max().item() > 1e-6  # not vacuous
        for eta in (0.01, 0.1, 1.0, 3.0):
            stepped = q({k: params[k] - eta * grads[k] for k in params})
            for key in at_params:
                drift, predicted = stepped[key] - at_params[key], eta ** 2 * at_grads[key]
                scale = max(at_params[key].abs().max().item(), predicted.abs().max().item())
                assert (drift - predicted).abs().max().item() <= 1e-12 * scale, f"{q.name}, η = {eta}"
    report = symalg.verify(analysis)
    drift_checks = [c for c in report.checks if c.check == "gd_drift"]
    assert len(drift_checks) == len(quantities) and all(c.passed for c in drift_checks)


def test_gd_drift_identity_fails_for_a_non_symmetry():
    """Control: with the wrong (tanh-homogeneous) declaration the linear term does not vanish."""
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False, certify=False)
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
    assert all(s.conserved is None for s in radial_sites)  # antisymmetric generators: no vacuous Q
    generator = torch.Generator().manual_seed(2)
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    x, y = random_data(analysis.architecture, generator=generator)
    grads = gradients(analysis, params, x, y)
    velocity = {k: -g for k, g in grads.items()}
    noise = {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in params.items()}
    for j in momenta:
        names = j.symmetry.tensors
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
    wrong = symalg.overlay({"tanh": CatalogueEntry("tanh", lambda z: sp.tanh(z),
                                                   symalg.catalogue.activations.declare_radial())})
    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", wrong, strict=False, certify=False)
    report = symalg.verify(analysis)
    (decay,) = [c for c in report.checks if c.check == "angular_momentum"]
    assert decay.failed and decay.max_error > 1e-6


def test_radial_next_to_linear_site_still_verifies():
    """No closed form in the widths there (adjacent O and GL sites): symbolic widths are refused by name; at concrete
    widths the generic value is the structured one, and verify compares it with the rank at θ and the dense rank."""
    symbolic = symalg.derive("linear(n, h) -> radial -> linear(h, k) -> identity -> linear(k, m)")
    with pytest.raises(NotImplementedError, match=r"adjacent sites \['0', '2'\]"):
        symbolic.orbit_dimension()
    analysis = symalg.derive("linear(3, 4) -> radial -> linear(4, 5) -> identity -> linear(5, 2)")
    report = symalg.verify(analysis)
    assert report.passed, str(report)
    orbit = next(c for c in report.checks if c.check == "orbit_dimension")
    structured = int(re.search(r"structured (\d+)", orbit.detail).group(1))
    assert orbit.passed and f"formula {structured}" in orbit.detail and f"dense {structured}" in orbit.detail
    assert structured == analysis.orbit_dimension(analysis.model_graph.model.state_dict()).dimension


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
    check = symalg.verification.verifier.CheckResult("gradient_orthogonality", "h1:X", float("nan"), 1e-9)
    assert check.failed and not check.passed
    report = symalg.verification.verifier.VerificationReport((check,), torch.float64, "cpu")
    assert not report.passed and "0 passed, 1 failed" in report.summary()


def test_params_and_data_are_validated_with_named_errors(generator):
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    params = symalg.numeric.sampling.random_params(analysis.architecture, generator)
    broken = {**params, "2.weight": params["2.weight"].clone().fill_(float("nan"))}
    with pytest.raises(SpecError, match="parameter '2.weight' has non-finite entries"):
        symalg.verify(analysis, params=broken)
    x, y = symalg.numeric.sampling.random_data(analysis.architecture, generator=generator)
    with pytest.raises(SpecError, match=r"verify: the model does not run on data of shapes \[\(16, 3\), \(16, 2\)\]"):
        symalg.verify(analysis, params=params, data=(x, y))  # the inputs, not an (x, y) pair
    with pytest.raises(SpecError, match=r"verify: the model does not run on data of shapes \[\(16, 5\)\] "
                                        r"\(example inputs of shapes \[\(8, 3\)\]\)"):
        symalg.verify(analysis, params=params, data=torch.randn(16, 5, dtype=torch.float64))
    with pytest.raises(SpecError, match=r"verify: data\[0\] has non-finite entries"):
        symalg.verify(analysis, params=params, data=torch.full((4, 3), float("nan")))
    assert symalg.verify(analysis, params=params, data=x).passed


def test_large_models_list_the_skipped_lowering_check():
    analysis = symalg.derive("linear(20, 30) -> relu -> linear(30, 10)")  # q reads 20·30 + 30 + 30·10 = 930 entries
    report = symalg.verify(analysis, symbolic_limit=400)
    (lowering,) = [c for c in report.checks if c.check == "lowering"]
    assert lowering.skipped and "symbolic_limit=400" in lowering.detail and report.passed
    assert "1 skipped" in report.summary()
    (checked,) = [c for c in symalg.verify(analysis).checks if c.check == "lowering"]  # 930 <= SYMBOLIC_LIMIT
    assert SYMBOLIC_LIMIT >= 930 and checked.passed


@pytest.mark.parametrize("kwargs, error, message", [
    ({"seed": "0"}, SpecError, r"verify: seed must be a non-negative integer, got '0'"),
    ({"seed": True}, SpecError, r"verify: seed must be a non-negative integer, got True"),
    ({"symbolic_limit": -1}, SpecError, r"verify: symbolic_limit must be a non-negative integer, got -1"),
    ({"data": [[0.0] * 3]}, SpecError,
     r"verify: data must be the model's inputs, a tensor or a tuple of tensors, got list"),
    ({"data": torch.zeros(1, 3, dtype=torch.int64)}, SpecError,
     r"verify: data\[0\] must be a floating-point tensor like the example input, got torch.int64"),
    ({"data": (torch.zeros(1, 3, dtype=torch.float64), "x")}, SpecError, r"verify: the model does not run on data of "
     r"shapes \[\(1, 3\), 'str'\]"),
    ({"learning_rate": float("inf")}, SpecError, r"verify: learning_rate must be a positive finite number, got inf"),
    ({"dtype": "float64"}, SpecError, r"verify: dtype float64 is not supported"),
    ({"device": object()}, SpecError, r"device <object object at .*> is not available here"),
    ({"params": [torch.zeros(4, 3)]}, SpecError, r"verify: params must be a mapping \{name: tensor\}, got list"),
    ({"widths": {"h": 4}}, SpecError, r"verify: widths= sets symbolic widths; this analysis has concrete widths"),
], ids=["seed-str", "seed-bool", "limit-negative", "data-list", "data-int", "data-not-a-tensor", "learning-rate-inf",
        "dtype-str", "device-object", "params-list", "widths-concrete"])
def test_verify_refuses_arguments_of_the_wrong_type_naming_them(kwargs, error, message):
    with pytest.raises(error, match=message):
        symalg.verify(symalg.derive("linear(3, 4) -> relu -> linear(4, 2)"), **kwargs)


@pytest.mark.parametrize("widths, message", [
    ("n=3,h=4,m=2", r"verify: widths must be a mapping \{name: positive int\}, got str"),
    ({"n": 3, "h": "4", "m": 2}, r"verify: widths= values must be integers, got h='4'"),
    ({"n": 3, "h": 4.0, "m": 2}, r"verify: widths= values must be integers, got h=4.0"),
    ({"n": 3, "h": True, "m": 2}, r"verify: widths= values must be integers, got h=True"),
    ({"n": 3, "h": 0, "m": 2}, r"width h: width 0 must be positive"),
], ids=["text", "str-value", "float-value", "bool-value", "zero"])
def test_verify_refuses_widths_that_are_not_positive_integers(widths, message):
    with pytest.raises(SpecError, match=message):
        symalg.verify(symalg.derive("linear(n, h) -> relu -> linear(h, m)"), widths=widths)


def test_verify_refuses_widths_together_with_params():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    params = dict(symalg.to_module(symalg.parse("linear(3, 4) -> relu -> linear(4, 2)")).named_parameters())
    assert symalg.verify(analysis, params=params).widths == {"h": 4, "m": 2, "n": 3}
    with pytest.raises(SpecError, match="give params or widths, not both"):
        symalg.verify(analysis, params=params, widths={"h": 5, "m": 2, "n": 3})


def test_verify_refuses_what_is_not_an_analysis():
    with pytest.raises(SpecError, match="verify: analysis must be the result of symalg.derive, got str"):
        symalg.verify("linear(3, 4) -> relu -> linear(4, 2)")


@pytest.mark.parametrize("spec", ["linear(3, 4) -> relu -> linear(4, 2)", "linear(n, h) -> tanh -> linear(h, m)",
                                  "linear(3, 4) -> identity -> linear(4, 3, bias=False)"])
def test_cross_entropy_verifies_the_logit_translation_and_its_linear_quantities(spec):
    analysis = symalg.derive(spec, loss="cross_entropy")
    report = symalg.verify(analysis)
    assert report.passed, str(report)
    (translation,) = [s for s in analysis.symmetries if isinstance(s.group, Translations)]
    assert translation.site == analysis.model_graph.source.linear_layers[-1]  # the logits' producing layer
    concrete = analysis.subs(report.widths) if analysis.widths else analysis  # labels at the verified widths
    (verified,) = [s for s in concrete.symmetries if isinstance(s.group, Translations)]
    assert {c.check for c in report.checks if c.symmetry == verified.label} == \
        {"invariance", "gradient_orthogonality", "gd_drift", "gradient_flow", "lowering"}


def test_the_logit_translation_fails_verification_under_mse():
    import dataclasses

    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)", loss="cross_entropy")
    as_mse = dataclasses.replace(analysis, loss="mse")           # the same claim, but the outputs must not move
    (translation,) = [s for s in analysis.symmetries if isinstance(s.group, Translations)]
    failed = {c.check for c in symalg.verify(as_mse).failures if c.symmetry == translation.label}
    assert {"invariance", "gradient_orthogonality", "gradient_flow"} <= failed
    # under the cross-entropy it holds on other inputs too
    x = torch.randn(8, 3, dtype=torch.float64)
    assert symalg.verify(analysis, data=x).passed


def test_report_to_dict_is_json_serialisable_and_round_trips():
    import json

    analysis = symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)", _wrong_tanh(), strict=False, certify=False)
    report = symalg.verify(analysis, symbolic_limit=0)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is False and data["summary"] == report.summary()
    assert data["dtype"] == "float64" and data["device"] == "cpu" and data["widths"] == {}
    assert [(c["check"], c["symmetry"], c["passed"], c["skipped"]) for c in data["checks"]] == \
        [(c.check, c.symmetry, c.passed, c.skipped) for c in report.checks]
    assert [c["max_error"] for c in data["checks"] if not c["skipped"]] == \
        [c.max_error for c in report.checks if not c.skipped]
    assert {c["max_error"] for c in data["checks"] if c["skipped"]} == {"nan"}  # skipped lowering: no error
    widths = symalg.verify(symalg.derive("linear(n, h) -> relu -> linear(h, m)")).to_dict()["widths"]
    assert json.loads(json.dumps(widths)) == {"h": 3, "m": 4, "n": 5}


@pytest.mark.parametrize("spec", ["linear(3, 4) -> radial -> linear(4, 2)",
                                  "linear(2, 4) -> radial -> linear(4, 3) -> tanh -> linear(3, 5) -> radial "
                                  "-> linear(5, 2, bias=False)"])
def test_angular_momentum_pairs_with_every_antisymmetric_generator_as_the_tangent_does(spec):
    """``⟨θ̇, A·θ⟩ = ½ ⟨A, J(θ, θ̇)⟩`` for every basis element ``A`` of the algebra, ``A·θ`` the symmetry's own
    tangent."""
    analysis = symalg.derive(spec)
    generator = torch.Generator().manual_seed(4)
    params = {k: v.detach() for k, v in analysis.model_graph.model.named_parameters()}
    velocity = {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in params.items()}
    for j in analysis.angular_momenta():
        J = j(params, velocity)
        assert torch.allclose(J, -J.T, rtol=0, atol=1e-14) and J.abs().max() > 1e-3
        for A in j.symmetry.group.algebra_basis():
            tangent = j.symmetry.tangent(params, A)
            inner = sum((velocity[k] * v).sum() for k, v in tangent.items())
            assert torch.allclose(inner, 0.5 * (A * J).sum(), rtol=1e-12, atol=1e-12)


class _LayerNormMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 5), torch.nn.Linear(5, 2)
        self.norm = torch.nn.LayerNorm(5, elementwise_affine=False)

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


def test_angular_momentum_of_a_subalgebra_is_projected_on_it_and_decays():
    """A layer norm's site has O(h) fixing 1 (antisymmetric ``A`` with ``A1 = 0``): ``J`` is projected on that
    subalgebra (the rest of ``so(h)`` is no symmetry and does not decay), and the heavy-ball check passes."""
    torch.manual_seed(0)
    model = _LayerNormMLP().double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(8, 3, dtype=torch.float64),)))
    (j,) = analysis.angular_momenta()
    params = dict(model.named_parameters())
    velocity = {k: torch.randn_like(v) for k, v in params.items()}
    J = j(params, velocity)
    assert torch.allclose(J @ torch.ones(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64), atol=1e-13)
    report = symalg.verify(analysis)
    assert report.passed, str(report)
    (decay,) = [c for c in report.checks if c.check == "angular_momentum"]
    assert decay.symmetry == j.symmetry.label and decay.passed


# -- gradient orthogonality region by region -------------------------------------------------------------------
def test_region_tangents_give_the_cosines_of_the_full_tangents():
    """``Symmetry.region_tangent`` (the verifier's path: no tensor of the parameters' size per generator) gives the
    same inner products and norms as the folded ``tangent``, for every symmetry of an attention block whose regions
    are disjoint; regions of one tensor along two axes are not, and keep the folded path."""
    from symalg.verification.checks import _cosines, gradient_norm, loss_gradients

    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    analysis = symalg.derive(symalg.trace(block, (x,)))
    params = {k: v.detach() for k, v in block.named_parameters()}
    grads = loss_gradients(lambda p: (torch.func.functional_call(block, p, (x,)) ** 2).sum(), params)
    norm = gradient_norm(grads)
    regional = [s for s in analysis.symmetries if s.disjoint_regions is not None]
    assert len(regional) >= 8 and any(len(s.disjoint_regions) > 1 for s in regional)
    for symmetry in regional:
        basis = symmetry.group.algebra_sample(6, torch.Generator().manual_seed(1), torch.float64, "cpu")
        full = _cosines(torch.func.vmap(lambda M: symmetry.tangent(params, M))(basis), grads, norm)
        unfolded = {b: b.unfold(grads[b.tensor]) for b, *_ in symmetry.disjoint_regions}
        pieces = torch.func.vmap(lambda M: symmetry.region_tangent(params, M))(basis)
        torch.testing.assert_close(_cosines(pieces, unfolded, norm), full, rtol=1e-10, atol=1e-14)
    # a square weight bound along its rows and its columns (a site reading what it writes): regions that share entries
    gl = symalg.derive("linear(4, 4) -> identity -> linear(4, 2)").symmetries[0]
    rows = next(b for b in gl.bindings if b.tensor == "0.weight")
    both = dataclasses.replace(gl, bindings=gl.bindings + (dataclasses.replace(rows, axis=1, role="in"),))
    assert gl.disjoint_regions is not None and both.disjoint_regions is None
    with pytest.raises(ValueError, match="overlap"):
        both.region_tangent({"0.weight": torch.zeros(4, 4)}, torch.zeros(4, 4))
