"""The check library every verifier uses: results and reports, relative errors, gradients, the exact
gradient-descent drift, gradient-flow and heavy-ball integrators, argument checks.

A check returns a :class:`CheckResult` (never asserts); a verifier collects them into a
:class:`VerificationReport`. Tolerances are keyed by dtype (:data:`TOLERANCES`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Mapping, Protocol, Sequence, TypeVar

import torch

from symalg.errors import MissingParameterError, ParameterError, ParameterTypeError, SpecError
from symalg.numeric.linalg import relative_error
from symalg.lowering.codegen import evaluate_symbolic

__all__ = ["CheckResult", "VerificationReport", "TOLERANCES", "MAX_GENERATORS", "check_device",
           "check_angular_momentum",
           "check_gd_drift", "check_gradient_flow", "check_gradient_orthogonality",
           "check_params", "compare_to_sympy", "gradient_norm", "integrate_gradient_flow", "loss_gradients",
           "relative_error", "rk4"]

TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-4}
"""Relative tolerance of every check, keyed by dtype."""

MAX_GENERATORS = 64
"""Most Lie-algebra elements ``gradient_orthogonality`` pairs with the gradient: the basis up to this dimension, random
combinations of it beyond (:meth:`~symalg.catalogue.groups.SiteGroup.algebra_sample`)."""

Params = Mapping[str, torch.Tensor]
Loss = Callable[[Params], torch.Tensor]
"""``loss(params)``: a scalar tensor, differentiable in the parameters."""
Key = TypeVar("Key", bound=Hashable)


class Conserving(Protocol):
    """What :func:`check_gradient_flow` reads: an analysis, or a loss symmetry, with conserved quantities (each
    called at parameters, its ``symmetry.label`` naming it in the report)."""

    def conserved_quantities(self) -> Sequence[Any]: ...


class Rotating(Protocol):
    """What :func:`check_angular_momentum` reads: angular momenta ``J(params, velocity)`` (each naming its
    ``symmetry.label``)."""

    def angular_momenta(self) -> Sequence[Any]: ...



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

    def to_dict(self) -> dict:
        """A JSON-serialisable dict: the fields, ``passed``, and a non-finite error as the string
        ``"nan"``/``"inf"``."""
        error = self.max_error if self.max_error == self.max_error and abs(self.max_error) != float("inf") \
            else str(self.max_error)
        return {"check": self.check, "symmetry": self.symmetry, "max_error": error, "tolerance": self.tolerance,
                "detail": self.detail, "skipped": self.skipped, "passed": self.passed}

    def __str__(self) -> str:
        verdict = "skip" if self.skipped else ("pass" if self.passed else "FAIL")
        return (f"{verdict:4}  {self.check:22} {self.symmetry:34} err={self.max_error:.2e} tol={self.tolerance:.0e}  "
                f"{self.detail}")


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

    def to_dict(self) -> dict:
        """A JSON-serialisable dict: ``passed``, the summary, dtype (``"float64"``), device, widths and every check
        (:meth:`CheckResult.to_dict`).

        >>> import json
        >>> report = VerificationReport((CheckResult("invariance", "S(3) on 0", 0.0, 1e-9),), torch.float64, "cpu")
        >>> json.loads(json.dumps(report.to_dict()))["checks"][0]["passed"]
        True
        """
        return {"passed": self.passed, "summary": self.summary(), "dtype": str(self.dtype).replace("torch.", ""),
                "device": self.device, "widths": {str(k): int(v) for k, v in self.widths.items()},
                "checks": [c.to_dict() for c in self.checks]}

    def summary(self) -> str:
        n_fail, n_skip = len(self.failures), sum(c.skipped for c in self.checks)
        at = f", widths {', '.join(f'{k}={v}' for k, v in self.widths.items())}" if self.widths else ""
        skipped = f", {n_skip} skipped" if n_skip else ""
        return (f"{len(self.checks) - n_fail - n_skip} passed, {n_fail} failed{skipped} "
                f"({len(self.checks)} checks, {str(self.dtype).replace('torch.', '')}, {self.device}{at})")

    def __str__(self) -> str:
        return "\n".join([str(c) for c in self.checks] + [self.summary()])


def loss_gradients(loss: Loss, params: Params) -> dict[str, torch.Tensor]:
    """``∇L`` at ``params`` (``{name: tensor}``), taken on detached copies: ``params`` are not touched. A
    parameter the loss does not use has gradient zero."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}   # new tensors sharing the storage
    value = loss(leaves)
    grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    return {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}


def check_gradient_orthogonality(label: str, tangent: Callable[[torch.Tensor], Mapping[Any, torch.Tensor]],
                                 basis: torch.Tensor | Sequence[torch.Tensor], grads: Mapping[Any, torch.Tensor],
                                 tol: float, grad_norm: torch.Tensor | None = None,
                                 vectorised: bool = False) -> CheckResult:
    """``max_M |⟨∇L, M·θ⟩| / (‖∇L‖ ‖M·θ‖)`` over the Lie-algebra elements ``basis``; ``tangent(M)`` returns
    ``{name: M·θ}`` (entries that are not parameters, such as moved buffers, count in ``‖M·θ‖`` only). A zero
    tangent is orthogonal to everything. The keys may be any that ``tangent`` and ``grads`` share, such as disjoint
    regions of the parameters (``Symmetry.region_tangent``, with ``grads`` unfolded the same way); then ``grad_norm``
    must be the norm of the whole gradient. ``grad_norm``: ``‖∇L‖`` (:func:`gradient_norm`) when the caller checks many
    symmetries against the same gradient, so that each check costs its own tensors, not all of them. With
    ``vectorised``, ``tangent`` maps the whole stacked basis at once under ``torch.func.vmap`` (a symalg
    ``Symmetry.tangent`` does: out-of-place torch operations only), one call instead of one per element.

    >>> tangent = lambda M: {"w": M * torch.tensor([1.0, 0.0])}
    >>> grads = {"w": torch.tensor([0.0, 2.0])}
    >>> check_gradient_orthogonality("scaling", tangent, torch.ones(3, 1), grads, 1e-9, vectorised=True).max_error
    0.0
    """
    grad_norm = gradient_norm(grads) if grad_norm is None else grad_norm
    if vectorised:
        stacked = basis if isinstance(basis, torch.Tensor) else torch.stack(list(basis))
        cosines = [_cosines(torch.func.vmap(tangent)(stacked), grads, grad_norm)] if len(stacked) else []
    else:
        cosines = [_cosines({k: v.unsqueeze(0) for k, v in tangent(M).items()}, grads, grad_norm) for M in basis]
    worst = max((c.max().item() for c in cosines if c.numel()), default=0.0)
    return CheckResult("gradient_orthogonality", label, worst, tol, f"{len(basis)} generators")


def _cosines(moved: Mapping[Any, torch.Tensor], grads: Mapping[Any, torch.Tensor], grad_norm: torch.Tensor
             ) -> torch.Tensor:
    """``|⟨∇L, t_i⟩| / (‖∇L‖ ‖t_i‖)`` for a batch of tangents ``{name: (k, *shape)}``; 0 where ``t_i = 0`` or where
    no tangent entry is a parameter (empty when there is none)."""
    if not moved:
        return torch.zeros(0)
    products = [(grads[k] * v).flatten(1).sum(1) for k, v in moved.items() if k in grads]
    first = next(iter(moved.values()))
    if not products:
        return first.new_zeros(first.shape[0])
    squares = [(v * v).flatten(1).sum(1) for v in moved.values()]
    norms = torch.sqrt(sum(squares[1:], squares[0]))
    inner = sum(products[1:], products[0])
    ratio = inner.abs() / (grad_norm * norms).clamp_min(torch.finfo(norms.dtype).tiny)
    return torch.where(norms > 0, ratio, torch.zeros_like(ratio))


def check_gd_drift(quantity: Any, params: Params, grads: Params, tol: float,
                   learning_rate: float = 0.1) -> CheckResult:
    """``C(θ − η g) − C(θ) = η² C(g)``; the error is relative to the size of ``C(θ)`` and of the drift."""
    value = quantity(params)
    drift = quantity({k: v - learning_rate * grads[k] for k, v in params.items()}) - value
    predicted = learning_rate ** 2 * quantity(grads)
    scale = max(value.abs().max().item(), drift.abs().max().item(), predicted.abs().max().item(), 1e-300)
    return CheckResult("gd_drift", quantity.symmetry.label, (drift - predicted).abs().max().item() / scale, tol,
                       f"ΔC = η² C(∇L), η = {learning_rate}, max|ΔC| = {drift.abs().max().item():.2e}")


def _squared_norm(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """``Σ ‖t‖²`` over ``tensors`` (at least one): the squared Frobenius norm of a parameter dict."""
    squares = [t.pow(2).sum() for t in tensors]
    return sum(squares[1:], squares[0])


def _norm(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """``√(Σ ‖t‖²)`` over ``tensors`` (at least one)."""
    return torch.sqrt(_squared_norm(tensors))


def gradient_norm(grads: Params) -> torch.Tensor:
    """``‖∇L‖``: the Frobenius norm of a gradient dict (at least one tensor), as a 0-d tensor.

    >>> gradient_norm({"w": torch.tensor([3.0]), "b": torch.tensor([4.0])}).item()
    5.0
    """
    return _norm(grads.values())


def rk4(field: Callable[[dict[Key, torch.Tensor]], Mapping[Key, torch.Tensor]], state: dict[Key, torch.Tensor],
        dt: float, steps: int) -> dict[Key, torch.Tensor]:
    """Integrate ``d state/dt = field(state)`` (dicts of tensors) with the classical RK4 scheme. The updates run as
    ``torch._foreach_*`` operations over all tensors at once (a model with thousands of tensors)."""
    keys = list(state)
    x: list[torch.Tensor] | tuple[torch.Tensor, ...] = [state[k] for k in keys]

    def slope(at: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        value = field(dict(zip(keys, at)))
        return [value[k] for k in keys]

    for _ in range(steps):
        k1 = slope(x)
        k2 = slope(torch._foreach_add(x, k1, alpha=dt / 2))
        k3 = slope(torch._foreach_add(x, k2, alpha=dt / 2))
        k4 = slope(torch._foreach_add(x, k3, alpha=dt))
        total = torch._foreach_add(k1, k2, alpha=2)   # k1 + 2 k2 + 2 k3 + k4
        torch._foreach_add_(total, k3, alpha=2)
        torch._foreach_add_(total, k4)
        x = torch._foreach_add(x, total, alpha=dt / 6)
    return dict(zip(keys, x))


def _flow_step(params: Params, grads: Params, max_dt: float = 2.5e-4, max_move: float = 1e-4) -> float:
    """RK4 step for the dynamical checks: at most ``max_dt``, and small enough that one step moves θ
    by at most ``max_move`` relative, so that integrator error stays far below the tolerance."""
    theta = _norm(params.values()).item()
    grad = _norm(grads.values()).item()
    return min(max_dt, max_move * theta / max(grad, 1e-300))


def integrate_gradient_flow(loss: Loss, params: Params, grads: Params, steps: int,
                            max_move: float = 1e-4) -> tuple[dict[str, torch.Tensor], str]:
    """``θ(T)`` along gradient flow ``θ̇ = −∇L`` from ``params`` (RK4, ``steps`` of :func:`_flow_step`),
    and a description of the run for the report."""
    dt = _flow_step(params, grads, max_move=max_move)
    flowed = rk4(lambda p: {k: -g for k, g in loss_gradients(loss, p).items()}, dict(params), dt, steps)
    moved = torch.sqrt(_squared_norm(flowed[k] - p for k, p in params.items()) / _squared_norm(params.values())).item()
    return flowed, f"RK4 dt={dt:.1e}, {steps} steps; θ moved {moved:.1e} (relative)"


def check_gradient_flow(analysis: Conserving, loss: Loss, params: Params, grads: Params, tol: float,
                        steps: int = 40) -> list[CheckResult]:
    """Every ``C`` is constant along gradient flow ``θ̇ = −∇L``."""
    quantities = analysis.conserved_quantities()
    if not quantities:
        return []
    flowed, detail = integrate_gradient_flow(loss, params, grads, steps)
    return [CheckResult("gradient_flow", q.symmetry.label, relative_error(q(flowed), q(params)), tol, detail)
            for q in quantities]


def check_angular_momentum(analysis: Rotating, loss: Loss, params: Params, grads: Params, generator: torch.Generator,
                           tol: float, damping: float = 1.0, steps: int = 40) -> list[CheckResult]:
    """Heavy-ball dynamics ``θ̈ + γ θ̇ = −∇L`` from a random velocity: every entry of ``J(θ, θ̇)``
    (``⟨θ̇, A·θ⟩`` for antisymmetric ``A``) decays exactly as ``e^{−γt}``, since
    ``d/dt ⟨θ̇, A·θ⟩ = −γ ⟨θ̇, A·θ⟩ − ⟨∇L, A·θ⟩ + ⟨θ̇, A·θ̇⟩`` and the last two terms vanish."""
    momenta = analysis.angular_momenta()
    if not momenta:
        return []
    grad_norm = _norm(grads.values())
    velocity = {k: torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for k, p in params.items()}
    velocity_norm = _norm(velocity.values())
    velocity = {k: v * (grad_norm / velocity_norm) for k, v in velocity.items()}
    dt = _flow_step(params, grads)

    def field(state: dict[tuple[str, str], torch.Tensor]) -> dict[tuple[str, str], torch.Tensor]:
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


def compare_to_sympy(lowered: Mapping[str, torch.Tensor], exprs: Mapping, values: Mapping) -> float:
    """Largest relative difference between lowered tensors and the values of ``exprs`` at ``values`` (SymPy's meaning
    of each node, :func:`~symalg.lowering.codegen.evaluate_symbolic`)."""
    return max(relative_error(lowered[n].detach().cpu().double(),
                              torch.from_numpy(evaluate_symbolic(e, values)).reshape(lowered[n].shape))
               for n, e in exprs.items())


def check_device(device: torch.device | str | int) -> None:
    """Raise :class:`~symalg.errors.SpecError` (a ``ValueError``) naming ``device`` when torch cannot allocate on
    it here, or when it is no device at all."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, TypeError) as error:
        raise SpecError(f"device {device!r} is not available here ({error})") from None


def check_params(params: object, shapes: Mapping[str, tuple], caller: str, optional: Iterable[str] = ()) -> None:
    """Raise :class:`~symalg.errors.ParameterError` naming the parameter unless ``params`` maps names of ``shapes`` to
    finite tensors: no unknown name, none missing but those in ``optional`` (buffers), each concrete shape as given
    (symbolic widths are read off and compared by ``Architecture.widths_from_params``)."""
    if not isinstance(params, Mapping):
        raise ParameterTypeError(f"{caller}: params must be a mapping {{name: tensor}}, got {type(params).__name__}")
    for name, value in params.items():
        if name not in shapes:
            raise ParameterError(f"{caller}: unknown parameter {name!r} (expected names: {sorted(shapes)})")
        if not isinstance(value, torch.Tensor):
            raise ParameterTypeError(f"{caller}: parameter {name!r} is a {type(value).__name__}, not a tensor")
        expected = tuple(shapes[name])
        concrete = all(isinstance(size, int) or getattr(size, "is_Integer", False) for size in expected)
        if concrete and tuple(value.shape) != tuple(int(size) for size in expected):
            raise ParameterError(f"{caller}: parameter {name!r} has shape {tuple(value.shape)}, expected {expected}")
        if value.is_floating_point() and not torch.isfinite(value).all():
            raise ParameterError(f"{caller}: parameter {name!r} has non-finite entries")
    missing = sorted(set(shapes) - set(params) - set(optional))
    if missing:
        raise MissingParameterError(f"{caller}: parameter {missing[0]!r} is missing (expected names: {sorted(shapes)})")
