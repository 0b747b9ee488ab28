"""Numerical verification of an :class:`~symalg.derive.Analysis`, returning a report (never asserting).

Checks, each reported per symmetry with its maximum relative error and the tolerance of the dtype:

``invariance``
    output and loss unchanged under group elements near (``exp(10⁻³ M)``) and far (``exp(M)``,
    ``‖M‖ = 1``) from the identity, under every discrete generator, and (for ``GL``/``O``) under an
    element of the other component.
``gradient_orthogonality``
    ``⟨∇L, M·θ⟩ = 0`` for every Lie-algebra basis generator, relative to ``‖∇L‖ ‖M·θ‖``.
``gd_drift``
    one gradient-descent step ``θ' = θ − η ∇L`` changes ``C`` by exactly ``η² C(∇L)``.
``gradient_flow``
    ``C`` stays constant along gradient flow (RK4, steps scaled to the gradient).
``angular_momentum``
    for ``O(h)``: under heavy-ball dynamics ``θ̈ + γθ̇ = −∇L`` the angular momentum ``J(θ, θ̇)`` decays
    exactly as ``e^{−γt}`` (conserved for ``γ = 0``).
``orbit_dimension``
    the formula at the model's widths equals the numeric rank at θ (skipped where no formula exists).
``lowering``
    lowered callables agree with SymPy's exact evaluation (small models only).

>>> import symalg
>>> report = symalg.verify(symalg.derive("linear(3, 4) -> relu -> linear(4, 2)"))
>>> report.passed, sorted({c.check for c in report.checks})
(True, ['gd_drift', 'gradient_flow', 'gradient_orthogonality', 'invariance', 'lowering', 'orbit_dimension'])
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import torch

from .conserved import AngularMomentum, ConservedQuantity
from .graph import SpecError
from .lowering import evaluate_symbolic
from .numeric import mse_loss, network_function, random_data, random_params

if TYPE_CHECKING:
    from .derive import Analysis, LogitTranslation, Symmetry
    from .graph import Architecture
    from .model_derive import ModelAnalysis

Params = Mapping[str, torch.Tensor]
Loss = Callable[[Params], torch.Tensor]
Forward = Callable[[Params, torch.Tensor], torch.Tensor]

__all__ = ["verify", "check_device", "default_widths", "CheckResult", "VerificationReport", "TOLERANCES",
           # building blocks shared with the other verifiers (traced models, loss symmetries, conjugated actions)
           "check_angular_momentum", "check_gd_drift", "check_gradient_flow", "check_gradient_orthogonality",
           "check_params", "compare_to_sympy", "integrate_gradient_flow", "loss_gradients", "relative_error", "rk4"]

TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-4}
"""Relative tolerance of every check, keyed by dtype."""

_SYMBOLIC_LIMIT = 400  # parameters above which the exact SymPy comparison is skipped


@dataclass(frozen=True)
class CheckResult:
    """One check on one symmetry (or on the whole analysis, ``symmetry='*'``)."""

    check: str
    symmetry: str
    max_error: float
    tolerance: float
    detail: str = ""
    skipped: bool = False

    @property
    def passed(self) -> bool:
        """True when the check ran and its error is within tolerance (False when skipped)."""
        return not self.skipped and self.max_error <= self.tolerance

    @property
    def failed(self) -> bool:
        """True when the check ran and its error exceeds the tolerance or is not a number."""
        return not self.skipped and not self.max_error <= self.tolerance

    def __str__(self) -> str:
        verdict = "skip" if self.skipped else ("pass" if self.passed else "FAIL")
        return (f"{verdict:4}  {self.check:22} {self.symmetry:34} err={self.max_error:.2e} "
                f"tol={self.tolerance:.0e}  {self.detail}")


@dataclass(frozen=True)
class VerificationReport:
    """All check results; ``passed`` when every check passed."""

    checks: tuple[CheckResult, ...]
    dtype: torch.dtype
    device: str
    widths: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no check failed (skipped checks are listed, not counted as passes)."""
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if c.failed]

    def summary(self) -> str:
        n_fail, n_skip = len(self.failures), sum(c.skipped for c in self.checks)
        at = f", widths {', '.join(f'{k}={v}' for k, v in self.widths.items())}" if self.widths else ""
        skipped = f", {n_skip} skipped" if n_skip else ""
        return (f"{len(self.checks) - n_fail - n_skip} passed, {n_fail} failed{skipped} "
                f"({len(self.checks)} checks, {str(self.dtype).replace('torch.', '')}, {self.device}{at})")

    def __str__(self) -> str:
        return "\n".join([str(c) for c in self.checks] + [self.summary()])


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a − b| / max(max|a|, max|b|)`` (the dtype's smallest positive number when both vanish)."""
    scale = max(a.abs().max().item(), b.abs().max().item(), torch.finfo(a.dtype).tiny)
    return (a - b).abs().max().item() / scale


def _total(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """``Σ terms`` for a non-empty iterable of tensors (typed as a tensor: ``sum`` starts from the integer 0)."""
    return functools.reduce(operator.add, terms)


def loss_gradients(loss: Loss, params: Params) -> dict[str, torch.Tensor]:
    """``∇L`` at ``params`` (``{name: tensor}``), taken on detached copies: ``params`` are not touched. A
    parameter the loss does not use has gradient zero."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    value = loss(leaves)
    grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    return {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}


def _check_invariance(symmetry: Symmetry | LogitTranslation, forward: Forward, loss: Loss, params: Params,
                      x: torch.Tensor, generator: torch.Generator, tol: float) -> CheckResult:
    from .certification import sample_elements  # certification builds on this module

    reference_out, reference_loss = forward(params, x), loss(params)
    worst, where = 0.0, ""
    for label, g in sample_elements(symmetry.group, generator, reference_out.dtype, reference_out.device):
        moved = symmetry.apply(params, g)
        error = max(relative_error(forward(moved, x), reference_out), relative_error(loss(moved), reference_loss))
        if error >= worst:
            worst, where = error, label
    return CheckResult("invariance", symmetry.label, worst, tol, f"worst: {where}")


def _check_gradient_orthogonality(symmetry: Symmetry, params: Params, grads: Params, tol: float) -> CheckResult:
    reference = params[symmetry.roles["W_in"]]
    basis = symmetry.group.algebra_basis(reference.dtype, reference.device)
    tangent = symmetry.tangent(params, basis)
    inner = _total((tangent[n] * grads[n]).flatten(1).sum(1) for n in tangent)
    norms = torch.sqrt(_total(tangent[n].flatten(1).pow(2).sum(1) for n in tangent))
    grad_norm = torch.sqrt(_total(grads[n].pow(2).sum() for n in tangent))
    error = (inner.abs() / (norms * grad_norm).clamp_min(torch.finfo(reference.dtype).tiny)).max().item()
    return CheckResult("gradient_orthogonality", symmetry.label, error, tol, f"{basis.shape[0]} generators")


def check_gradient_orthogonality(label: str, tangent: Callable[[torch.Tensor], Params],
                                 basis: torch.Tensor | Sequence[torch.Tensor], grads: Params,
                                 tol: float) -> CheckResult:
    """``max_M |⟨∇L, M·θ⟩| / (‖∇L‖ ‖M·θ‖)`` over the Lie-algebra elements ``basis``; ``tangent(M)`` returns
    ``{name: M·θ}`` (entries that are not parameters, such as moved buffers, count in ``‖M·θ‖`` only). A zero
    tangent is orthogonal to everything."""
    grad_norm = torch.sqrt(_total(g.pow(2).sum() for g in grads.values()))
    worst = 0.0
    for M in basis:
        moved = tangent(M)
        inner = [(grads[k] * v).sum() for k, v in moved.items() if k in grads]
        norm = torch.sqrt(_total(v.pow(2).sum() for v in moved.values()))
        if norm > 0 and inner:
            worst = max(worst, (abs(_total(inner)) / (grad_norm * norm).clamp_min(torch.finfo(norm.dtype).tiny)).item())
    return CheckResult("gradient_orthogonality", label, worst, tol, f"{len(basis)} generators")


def check_gd_drift(quantity: ConservedQuantity, params: Params, grads: Params, tol: float,
                   learning_rate: float = 0.1) -> CheckResult:
    """``C(θ − η g) − C(θ) = η² C(g)``; the error is relative to the size of ``C(θ)`` and of the drift."""
    value = quantity(params)
    drift = quantity({k: v - learning_rate * grads[k] for k, v in params.items()}) - value
    predicted = learning_rate ** 2 * quantity(grads)
    scale = max(value.abs().max().item(), drift.abs().max().item(), predicted.abs().max().item(), 1e-300)
    return CheckResult("gd_drift", quantity.symmetry.label, (drift - predicted).abs().max().item() / scale, tol,
                       f"ΔC = η² C(∇L), η = {learning_rate}, max|ΔC| = {drift.abs().max().item():.2e}")


def rk4(field: Callable[[dict], dict], state: dict, dt: float, steps: int) -> dict:
    """Integrate ``d state/dt = field(state)`` (dicts of tensors) with the classical RK4 scheme."""
    for _ in range(steps):
        k1 = field(state)
        k2 = field({k: state[k] + dt / 2 * k1[k] for k in state})
        k3 = field({k: state[k] + dt / 2 * k2[k] for k in state})
        k4 = field({k: state[k] + dt * k3[k] for k in state})
        state = {k: state[k] + dt / 6 * (k1[k] + 2 * k2[k] + 2 * k3[k] + k4[k]) for k in state}
    return state


def _flow_step(params: Params, grads: Params, max_dt: float = 2.5e-4, max_move: float = 1e-4) -> float:
    """RK4 step for the dynamical checks: at most ``max_dt``, and small enough that one step moves θ
    by at most ``max_move`` relative, so that integrator error stays far below the tolerance."""
    theta = torch.sqrt(_total(p.pow(2).sum() for p in params.values())).item()
    grad = torch.sqrt(_total(g.pow(2).sum() for g in grads.values())).item()
    return min(max_dt, max_move * theta / max(grad, 1e-300))


def integrate_gradient_flow(loss: Loss, params: Params, grads: Params, steps: int,
                            max_move: float = 1e-4) -> tuple[dict, str]:
    """``θ(T)`` along gradient flow ``θ̇ = −∇L`` from ``params`` (RK4, ``steps`` of :func:`_flow_step`),
    and a description of the run for the report."""
    dt = _flow_step(params, grads, max_move=max_move)
    flowed = rk4(lambda p: {k: -g for k, g in loss_gradients(loss, p).items()}, dict(params), dt, steps)
    moved = torch.sqrt(_total((flowed[k] - p).pow(2).sum() for k, p in params.items()) /
                       sum(p.pow(2).sum() for p in params.values())).item()
    return flowed, f"RK4 dt={dt:.1e}, {steps} steps; θ moved {moved:.1e} (relative)"


def check_gradient_flow(analysis: Any, loss: Loss, params: Params, grads: Params, tol: float,
                        steps: int = 40) -> list[CheckResult]:
    """Every ``C`` of ``analysis.conserved_quantities()`` is constant along gradient flow ``θ̇ = −∇L``."""
    quantities = analysis.conserved_quantities()
    if not quantities:
        return []
    flowed, detail = integrate_gradient_flow(loss, params, grads, steps)
    return [CheckResult("gradient_flow", q.symmetry.label, relative_error(q(flowed), q(params)), tol, detail)
            for q in quantities]


def check_angular_momentum(analysis: Any, loss: Loss, params: Params, grads: Params, generator: torch.Generator,
                           tol: float, damping: float = 1.0, steps: int = 40) -> list[CheckResult]:
    """Heavy-ball dynamics ``θ̈ + γ θ̇ = −∇L`` from a random velocity: every entry of ``J(θ, θ̇)``
    (``⟨θ̇, A·θ⟩`` for antisymmetric ``A``) decays exactly as ``e^{−γt}``, since
    ``d/dt ⟨θ̇, A·θ⟩ = −γ ⟨θ̇, A·θ⟩ − ⟨∇L, A·θ⟩ + ⟨θ̇, A·θ̇⟩`` and the last two terms vanish."""
    momenta = analysis.angular_momenta()
    if not momenta:
        return []
    grad_norm = torch.sqrt(_total(g.pow(2).sum() for g in grads.values()))
    velocity = {k: torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for k, p in params.items()}
    velocity_norm = torch.sqrt(_total(v.pow(2).sum() for v in velocity.values()))
    velocity = {k: v * (grad_norm / velocity_norm) for k, v in velocity.items()}
    dt = _flow_step(params, grads)

    def field(state: dict) -> dict:
        theta = {k: state[("θ", k)] for k in params}
        gradient = loss_gradients(loss, theta)
        return {**{("θ", k): state[("v", k)] for k in params},
                **{("v", k): -damping * state[("v", k)] - gradient[k] for k in params}}

    state = rk4(field, {**{("θ", k): p for k, p in params.items()}, **{("v", k): v for k, v in velocity.items()}},
                 dt, steps)
    end_theta, end_velocity = ({k: state[(part, k)] for k in params} for part in ("θ", "v"))
    decay = torch.exp(torch.tensor(-damping * dt * steps, dtype=grad_norm.dtype)).item()
    results = []
    for j in momenta:
        start = j(params, velocity)
        error = (j(end_theta, end_velocity) - decay * start).abs().max().item() / max(start.abs().max().item(), 1e-300)
        results.append(CheckResult("angular_momentum", j.symmetry.label, error, tol,
                                   f"heavy ball γ={damping}: J(t) = e^(-γt) J(0), RK4 dt={dt:.1e}, {steps} steps"))
    return results


def _check_translations(translations: Sequence[LogitTranslation], observed: Forward, loss: Loss, params: Params,
                        grads: Params, x: torch.Tensor, generator: torch.Generator, tol: float,
                        symbolic_limit: int) -> list[CheckResult]:
    """The logit translations of cross-entropy (:class:`~symalg.derive.LogitTranslation`): invariance of the
    softmax and the loss, ``⟨∇L, M·θ⟩ = 0``, and their linear quantities checked as the traced verifier does."""
    from .model_verification import _drift, _gradient_flow, _lowering

    checks = []
    for translation in translations:
        with torch.no_grad():
            checks.append(_check_invariance(translation, observed, loss, params, x, generator, tol))
            basis = translation.group.algebra_basis(x.dtype, x.device)
            checks.append(check_gradient_orthogonality(translation.label, lambda M: translation.tangent(params, M),
                                                       basis, grads, tol))
            checks.append(_drift(translation, params, grads, 0.1, tol))
            checks.append(_lowering(translation, params, tol, symbolic_limit))
        checks += _gradient_flow([translation], loss, params, params, grads, tol, 40)
    return checks


def _check_orbit_dimension(analysis: Analysis, params: Params) -> CheckResult:
    numeric = analysis.orbit_dimension(params)
    try:
        formula = analysis.orbit_dimension()
    except NotImplementedError as error:
        return CheckResult("orbit_dimension", "*", float("nan"), 0.0, f"numeric rank {numeric}; no formula: {error}",
                           skipped=True)
    formula = int(formula.subs(analysis.architecture.widths_from_params(params)))
    return CheckResult("orbit_dimension", "*", float(abs(formula - numeric)), 0.0,
                       f"formula {formula}, numeric rank {numeric}")


def _check_lowering(analysis: Analysis, params: Params, generator: torch.Generator, tol: float) -> list[CheckResult]:
    """Lowered torch values against SymPy's exact evaluation at the same numbers."""
    from .certification import sample_elements  # certification builds on this module

    values = {s.name: params[n].detach().cpu().double().numpy() for n, s in analysis.symbols.items()}
    results = []
    for symmetry in analysis.symmetries:
        reference = params[symmetry.roles["W_in"]]
        g = sample_elements(symmetry.group, generator, reference.dtype, reference.device)[-1][1]
        error = compare_to_sympy(symmetry.lowered_action(params, g), symmetry.action,
                         {**values, symmetry.element.name: g.detach().cpu().double().numpy()})
        results.append(CheckResult("lowering", symmetry.label, error, tol, "action vs SymPy"))
        if symmetry.algebra_element is not None:  # a continuous group
            M = symmetry.group.random_algebra_element(1.0, generator, reference.dtype, reference.device)
            results.append(CheckResult("lowering", symmetry.label, compare_to_sympy(
                symmetry.tangent(params, M), symmetry.infinitesimal,
                {**values, symmetry.algebra_element.name: M.cpu().double().numpy()}), tol,
                "infinitesimal action vs SymPy"))
        if isinstance(symmetry.conserved, ConservedQuantity):
            q = symmetry.conserved
            results.append(CheckResult("lowering", symmetry.label,
                                       compare_to_sympy({"C": q(params)}, {"C": q.expr}, values), tol,
                                       f"{q.name} vs SymPy"))
        elif isinstance(symmetry.conserved, AngularMomentum):
            j = symmetry.conserved
            velocity = {n: torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device)
                        for n, p in params.items()}
            exact_values = {**values, **{s.name: velocity[n].cpu().double().numpy() for n, s in j.velocities.items()}}
            results.append(CheckResult("lowering", symmetry.label,
                                       compare_to_sympy({"J": j(params, velocity)}, {"J": j.expr}, exact_values), tol,
                                       f"{j.name} vs SymPy"))
    return results


def compare_to_sympy(lowered: Mapping[str, torch.Tensor], exprs: Mapping, values: Mapping) -> float:
    """Largest relative difference between lowered tensors and SymPy's exact values of ``exprs``."""
    return max(relative_error(lowered[n].detach().cpu().double(),
                              torch.from_numpy(evaluate_symbolic(e, values)).reshape(lowered[n].shape))
               for n, e in exprs.items())


def _data(arch: Architecture, data: object) -> tuple[torch.Tensor, torch.Tensor]:
    """``data`` checked to be ``(x, y)`` with ``x`` of shape ``(batch, n_in)`` and ``y`` of ``(batch, n_out)``."""
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise ValueError("verify: data must be a pair (x, y) of tensors, x of shape (batch, inputs) and y of "
                         "shape (batch, outputs)")
    x, y = data
    for name, tensor, width in (("x", x, arch.node("input")["features"]), ("y", y, arch.node("output")["features"])):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise ValueError(f"verify: data {name} must be a floating-point tensor, got {type(tensor).__name__}")
        if tensor.dim() != 2 or tensor.shape[-1] != int(width):
            raise ValueError(f"verify: data {name} must have shape (batch, {width}), got {tuple(tensor.shape)}")
    return x, y


def check_device(device: str | torch.device) -> None:
    """Raise ``ValueError`` naming ``device`` when torch cannot allocate on it here."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"device {device!r} is not available here ({error})") from None


def check_params(params: object, shapes: Mapping[str, tuple], caller: str, optional: Sequence[str] = ()) -> None:
    """Raise ``SpecError`` naming the parameter unless ``params`` maps names of ``shapes`` to finite tensors:
    no unknown name, none missing but those in ``optional`` (buffers), each concrete shape as given
    (symbolic widths are read off and compared by ``Architecture.widths_from_params``)."""
    if not isinstance(params, Mapping):
        raise SpecError(f"{caller}: params must be a mapping {{name: tensor}}, got {type(params).__name__}")
    for name, value in params.items():
        if name not in shapes:
            raise SpecError(f"{caller}: unknown parameter {name!r} (expected names: {sorted(shapes)})")
        if not isinstance(value, torch.Tensor):
            raise SpecError(f"{caller}: parameter {name!r} is a {type(value).__name__}, not a tensor")
        expected = tuple(shapes[name])
        concrete = all(isinstance(size, int) or getattr(size, "is_Integer", False) for size in expected)
        if concrete and tuple(value.shape) != tuple(int(size) for size in expected):
            raise SpecError(f"{caller}: parameter {name!r} has shape {tuple(value.shape)}, expected {expected}")
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise SpecError(f"{caller}: parameter {name!r} has non-finite entries")
    missing = sorted(set(shapes) - set(params) - set(optional))
    if missing:
        raise SpecError(f"{caller}: parameter {missing[0]!r} is missing (expected names: {sorted(shapes)})")


def default_widths(arch: Architecture) -> dict[str, int]:
    """Widths used when none are given: 3, 4, 5, ... in alphabetical order of the width names."""
    return {name: 3 + i for i, name in enumerate(sorted(str(s) for s in arch.widths))}


def verify(analysis: Analysis | ModelAnalysis, params: Mapping[str, torch.Tensor] | None = None,
           data: tuple | None = None, device: str = "cpu",
           dtype: torch.dtype = torch.float64, widths: Mapping | None = None, seed: int = 0,
           symbolic_limit: int | None = None) -> VerificationReport:
    """Check every symmetry of ``analysis`` numerically and return a :class:`VerificationReport`.

    Parameters
    ----------
    analysis : the result of :func:`symalg.derive`; a traced model's analysis goes to
        :func:`symalg.model_verification.verify_model` (``data`` are then the model inputs, ``params`` its
        parameters and, optionally, buffers).
    params : ``{name: tensor}`` (e.g. ``dict(model.named_parameters())``), converted to ``dtype``;
        random (the model's own for a traced model) when None. An unknown or missing name, a wrong shape
        or a non-finite entry raises ``SpecError`` naming the parameter.
    data : ``(x, y)``: inputs ``(batch, n_in)`` and regression targets ``(batch, n_out)`` in torch's row
        layout; random when None. The loss is ``½ mean ‖f(x) − y‖²``; for an analysis derived with
        ``loss="cross_entropy"`` it is cross-entropy with target probabilities ``y`` (random: a softmax), and
        invariance compares ``softmax(f(x))``.
    device, dtype : where and in which precision to run (float64 by default).
    widths : values for symbolic widths when ``params`` is None; by default :func:`default_widths`
        (recorded in the report). Refused with ``params`` and for a traced model (their widths are fixed).
    seed : seed of the random parameters, data and group elements.
    symbolic_limit : largest parameter count for the exact SymPy comparison of lowered code (for a traced
        model: the largest entry count of a conserved quantity); default 400 (2000 traced).
    """
    from .derive import Analysis
    from .model_derive import ModelAnalysis

    if not isinstance(analysis, (Analysis, ModelAnalysis)):
        raise TypeError(f"verify: analysis must be the result of symalg.derive, got {type(analysis).__name__}")
    if dtype not in TOLERANCES:
        raise ValueError(f"dtype {dtype} is not supported; use one of {list(TOLERANCES)}")
    for name, value in (("seed", seed), ("symbolic_limit", 0 if symbolic_limit is None else symbolic_limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(f"verify: {name} must be a non-negative integer, got {value!r}")

    if isinstance(analysis, ModelAnalysis):
        from .model_verification import SYMBOLIC_LIMIT, verify_model

        if widths is not None:
            raise SpecError("verify: widths= sets symbolic widths of a chain architecture; a traced model's widths "
                            "are those of its parameters")
        return verify_model(analysis, inputs=data, params=params, device=device, dtype=dtype, seed=seed,
                            symbolic_limit=SYMBOLIC_LIMIT if symbolic_limit is None else symbolic_limit)
    symbolic_limit = _SYMBOLIC_LIMIT if symbolic_limit is None else symbolic_limit
    check_device(device)
    tol = TOLERANCES[dtype]
    generator = torch.Generator().manual_seed(seed)
    arch = analysis.architecture
    if params is not None:
        if widths is not None:
            raise SpecError("verify: give params or widths, not both (the widths are those of the parameters)")
        check_params(params, arch.parameter_shapes, "verify")
        params = {k: v.detach().to(device=device, dtype=dtype) for k, v in params.items()}
        substituted = {str(k): v for k, v in arch.widths_from_params(params).items()}
    else:
        substituted = {str(k): int(v) for k, v in (widths or default_widths(arch)).items()} if arch.widths else {}
        missing = sorted(str(s) for s in arch.widths if str(s) not in substituted)
        if missing:
            raise SpecError(f"verify: no value for the symbolic widths {missing}; pass params or widths=")
    if substituted:
        analysis = analysis.subs(substituted)
    if params is None:
        params = random_params(analysis.architecture, generator, dtype, device)
    arch = analysis.architecture
    x, y = _data(arch, data) if data is not None else random_data(arch, generator=generator, dtype=dtype, device=device)
    x, y = x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)
    forward = network_function(arch, analysis.catalogue)
    if analysis.loss == "cross_entropy":
        y = y if data is not None else y.softmax(-1)
        loss = lambda p: torch.nn.functional.cross_entropy(forward(p, x), y)  # noqa: E731
        observed = lambda p, inputs: forward(p, inputs).softmax(-1)  # noqa: E731
    else:
        loss, observed = mse_loss(forward, x, y), forward
    grads = loss_gradients(loss, params)
    checks = []
    with torch.no_grad():
        for symmetry in analysis.symmetries:
            checks.append(_check_invariance(symmetry, observed, loss, params, x, generator, tol))
            if symmetry.group.is_continuous:
                checks.append(_check_gradient_orthogonality(symmetry, params, grads, tol))
        for q in analysis.conserved_quantities():
            checks.append(check_gd_drift(q, params, grads, tol))
    checks += _check_translations(analysis.translations, observed, loss, params, grads, x, generator, tol,
                                  symbolic_limit)
    checks += check_gradient_flow(analysis, loss, params, grads, tol)
    checks += check_angular_momentum(analysis, loss, params, grads, generator, tol)
    checks.append(_check_orbit_dimension(analysis, params))
    size = sum(p.numel() for p in params.values())
    if size <= symbolic_limit:
        with torch.no_grad():
            checks += _check_lowering(analysis, params, generator, tol)
    else:
        checks.append(CheckResult("lowering", "*", float("nan"), tol, f"{size} parameters > symbolic_limit="
                                  f"{symbolic_limit}: exact SymPy evaluation skipped", skipped=True))
    return VerificationReport(tuple(checks), dtype, str(device), substituted)
