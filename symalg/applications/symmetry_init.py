"""Symmetry-aware initialisation: move parameters along their symmetry orbit until the conserved
quantities take chosen values, without changing the network function; and the sharpness estimators
used to measure what that does to training.

Split of a conserved quantity. For a ``GL(h)`` site write ``P = Σ_out p·U Uᵀ`` and
``R = Σ_in p·U Uᵀ`` (out-regions move by ``g``, in-regions by ``g⁻ᵀ``), so ``C = P − R`` and

    C(g·θ) = g P gᵀ − g⁻ᵀ R g⁻¹.

This is *not* a congruence of ``C``: the inertia of ``C`` can change. The orbit keeps ``rank P``,
``rank R`` and the spectrum ``μ`` of ``P R`` (``g P R g⁻¹`` is similar to it, and ``μ ≥ 0`` because
``PR`` is similar to ``P^{1/2} R P^{1/2}``). ``P`` and ``R`` are read off the quantity itself by
homogeneity: ``C(c·θ) = c² P − c⁻² R`` for the scalar element ``c·I``.

Closed form (``P ≻ 0``). With ``P = L Lᵀ`` (``L = P^{1/2}`` here), ``Lᵀ R L = Q diag(μ) Qᵀ`` and the target
``T = V diag(t) Vᵀ``,

    g = V diag(√x) Qᵀ L⁻¹,   x_i − μ_i / x_i = t_i,   x_i = (t_i + √(t_i² + 4 μ_i)) / 2,

gives ``g P gᵀ = V diag(x) Vᵀ`` and ``g⁻ᵀ R g⁻¹ = V diag(μ/x) Vᵀ``, hence ``C = T``. A slot with
``μ_i = 0`` needs ``t_i > 0``. Reachable set: every symmetric ``T`` with at least ``h − rank R``
positive eigenvalues, and nothing else (``T + g⁻ᵀRg⁻¹ = gPgᵀ ≻ 0`` and the second term has rank
``rank R``, so ``T`` is positive definite on an ``(h − rank R)``-dimensional subspace). With ``R ≻ 0``
the mirror image (``g ↦ g⁻ᵀ``, ``P ↔ R``, ``T ↦ −T``): at least ``h − rank P`` negative eigenvalues.
When both are singular (a site wider than its fan-in and its fan-out) this module raises. When both
are definite, every symmetric ``T`` is reachable; the solver then starts from ``P`` for ``tr T > 0`` and
from ``R`` for ``tr T < 0`` (so that ``x ≈ t`` rather than ``μ/|t|``: at condition numbers 1e6 the other
side loses about five digits). Eigenvalues below ``1000·h·eps·‖·‖`` count as zero. For
``T = 0`` the element is the geometric mean: ``gᵀg = P⁻¹ # R = L⁻ᵀ (LᵀRL)^{1/2} L⁻¹``, the unique
positive definite ``S`` with ``S P S = R``. For a scalar target ``λI`` the symmetric positive definite
``g`` is returned (an orthogonal factor only rotates ``C``, and gradient descent is equivariant under it).

Positive scaling (``π(d) = d^α`` on the readers), per neuron: ``q_i(d) = a_i d² − b_i d^{−2α}`` with
``a_i, b_i ≥ 0`` the out and in parts, strictly increasing in ``d > 0``. So ``q_i = t_i`` is solvable
iff ``a_i, b_i > 0`` (any ``t_i``), ``b_i = 0 < a_i`` (``t_i > 0``), ``a_i = 0 < b_i`` (``t_i < 0``), or
``a_i = b_i = 0`` (``t_i = 0``, a dead neuron). For ``α = 1``, ``x = a d²`` solves ``x − ab/x = t``: the
root above with ``μ = ab``. For ``α ≠ 1``: bisection in ``log d``.

Several sites are coupled (``g_k`` moves the next layer's weights, which enter the next ``C`` through
``g_kᵀ g_k``). :func:`set_conserved` sweeps the sites, solving each exactly given the others, until
every residual is below ``tol``. For scalar GL targets ``λ_k`` (and any scaling targets ``t_k``) this is
block-coordinate descent on the geodesically convex function ``Φ(g) = ½‖g·θ‖² − Σ_k λ_k log det g_k``
(``− Σ_k ⟨t_k, log d_k⟩``), whose derivative along a symmetric ``M`` at site ``k`` is
``tr(M (C_k − λ_k I))``: each site's exact solve is the block minimiser, and the balanced point is the
minimum-norm point of the orbit (Kempf–Ness).

Example
-------
>>> import torch, symalg
>>> from symalg.applications.symmetry_init import balance
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Identity(), torch.nn.Linear(3, 3)).double()
>>> x = torch.randn(5, 3, dtype=torch.float64)
>>> analysis = symalg.derive(symalg.trace(model, (x,)))
>>> result = balance(analysis, dict(model.named_parameters()))
>>> float(result.conserved["0"].abs().max()) < 1e-12
True
>>> moved = torch.func.functional_call(model, result.params, (x,))
>>> float((moved - model(x)).abs().max()) < 1e-12
True
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import sympy as sp
import torch

from symalg.applications.flat_minima import ParamLoss, hessian_vector_products

if TYPE_CHECKING:   # the derivation imports this module's callers; its types are read, not imported at run time
    from symalg.symbolic.derive import Analysis
    from symalg.symbolic.symmetry import Symmetry

__all__ = ["UnreachableTarget", "InitResult", "imbalance_element", "scaling_element", "set_conserved", "balance",
           "HessianEigenvalue", "TraceEstimate", "top_hessian_eigenvalue", "hessian_trace"]


Targets = float | Mapping[str, float | torch.Tensor]
"""Conserved-quantity targets: one number for every site, or ``{site: number | tensor}``."""


class UnreachableTarget(ValueError):
    """A target value of a conserved quantity lies outside what the group orbit can reach."""


def _rank_tol(matrix: torch.Tensor) -> float:
    """Eigenvalues below this count as zero: ``1000·h·eps·‖matrix‖``."""
    scale = float(torch.linalg.matrix_norm(matrix, ord=2)) if matrix.numel() else 0.0
    return 1000 * max(matrix.shape[-1], 1) * torch.finfo(matrix.dtype).eps * scale


def _root(t: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """The root ``x ≥ 0`` of ``x − μ/x = t``, written without cancellation for either sign of ``t``."""
    s = torch.sqrt(t * t + 4 * mu)
    return torch.where(t >= 0, (t + s) / 2, 2 * mu / (s - t).clamp_min(torch.finfo(t.dtype).tiny))


def _rank(matrix: torch.Tensor) -> int:
    return int((torch.linalg.eigvalsh(matrix) > _rank_tol(matrix)).sum())


def _condition(matrix: torch.Tensor) -> float:
    """``λ_max / λ_min`` of a positive semidefinite matrix; ``inf`` when it is singular (:func:`_rank_tol`)."""
    values = torch.linalg.eigvalsh(matrix)
    return float(values[-1] / values[0]) if values[0] > _rank_tol(matrix) else math.inf


def _element_for_definite(P: torch.Tensor, R: torch.Tensor, target: torch.Tensor, where: str,
                          sign: int) -> torch.Tensor:
    """``g`` with ``g P gᵀ − g⁻ᵀ R g⁻¹ = target`` for ``P ≻ 0`` (module docstring). ``sign`` is −1 when
    called for the mirror image (``P``, ``R``, ``target`` standing for ``R``, ``P``, ``−C``), for the message."""
    p, W = torch.linalg.eigh(P)
    # P = L Lᵀ with L = P^{1/2} (torch's cholesky: 14 ms at 10 × 10)
    L, L_inv = (W * p.sqrt()) @ W.T, (W / p.sqrt()) @ W.T
    K = L.T @ R @ L
    mu, Q = torch.linalg.eigh((K + K.T) / 2)
    mu = mu.clamp_min(0)
    zero = int((mu <= _rank_tol(K)).sum())
    t, V = torch.linalg.eigh(target)
    t, V = t.flip(0), V.flip(1)  # zero μ (first) meets the largest t
    positive = int((t > 0).sum())
    if positive < zero:
        h = P.shape[0]
        part, kind, example = ("in part R", "positive", "λ > 0") if sign > 0 else ("out part P", "negative", "λ < 0")
        raise UnreachableTarget(
            f"{where}: unreachable target: the {part} has rank {h - zero} < h = {h}, and moved by any g it differs "
            f"from ±C by a definite matrix, so C keeps at least {zero} {kind} eigenvalues (Sylvester's law of "
            f"inertia); the target has {positive}. Reachable: every symmetric target with at least {zero} {kind} "
            f"eigenvalues (e.g. λI with {example})")
    x = _root(t, mu)
    return V @ (x.sqrt()[:, None] * (Q.T @ L_inv))


def imbalance_element(P: torch.Tensor, R: torch.Tensor, target: torch.Tensor, where: str = "GL site") -> torch.Tensor:
    """An invertible ``g`` with ``g P gᵀ − g⁻ᵀ R g⁻¹ = target`` (``P, R ⪰ 0``, ``target`` symmetric ``h × h``).

    Closed form and reachable set in the module docstring: needs ``P ≻ 0`` (then ``target`` must have at
    least ``h − rank R`` positive eigenvalues) or ``R ≻ 0`` (at least ``h − rank P`` negative ones);
    raises :class:`UnreachableTarget` otherwise, naming ``where``. A scalar target ``λI`` gets the symmetric
    positive definite solution.

    >>> diag = lambda *v: torch.diag(torch.tensor(v, dtype=torch.float64))
    >>> P, R = diag(4., 1.), diag(1., 9.)
    >>> g = imbalance_element(P, R, diag(0., 0.))                      # balance: g² = P⁻¹ # R
    >>> [round(v, 12) for v in torch.diagonal(g @ g).tolist()]
    [0.5, 3.0]
    """
    h = P.shape[-1]
    for name, value in (("P", P), ("R", R), ("target", target)):
        if value.shape != (h, h) or not torch.isfinite(value).all():
            raise ValueError(f"{where}: {name} must be a finite {h} × {h} matrix, got shape {tuple(value.shape)}")
    if (target - target.T).abs().max() > _rank_tol(target):
        raise ValueError(f"{where}: target must be symmetric (C is), got an asymmetry of "
                         f"{float((target - target.T).abs().max()):.3g}")
    target = (target + target.T).to(P) / 2
    cond_p, cond_r = _condition(P), _condition(R)
    trace = float(torch.trace(target))
    if cond_p < math.inf and (cond_r == math.inf or trace > 0 or (trace == 0 and cond_p <= cond_r)):
        # both definite: the side where the target is mostly positive, so that x ≈ t rather than μ/|t|
        # (measured: up to 1e6× smaller errors at condition numbers 1e6), else the better conditioned one
        g = _element_for_definite(P, R, target, where, 1)
    elif cond_r < math.inf:
        g = torch.linalg.inv(_element_for_definite(R, P, -target, where, -1)).T
    else:
        raise UnreachableTarget(
            f"{where}: both the out part P (rank {_rank(P)}) and the in part R (rank {_rank(R)}) are singular at "
            f"width {h} (the site is wider than its fan-in and its fan-out); this solver needs one of them "
            f"definite. Necessary for any target T: at most rank P positive and at most rank R negative eigenvalues")
    if torch.equal(target, target[0, 0] * torch.eye(h, dtype=target.dtype, device=target.device)):
        _, sigma, Vh = torch.linalg.svd(g)    # the polar factor (gᵀg)^{1/2} = V Σ Vᵀ, without squaring cond(g)
        g = (Vh.T * sigma) @ Vh
    return g


def scaling_element(a: torch.Tensor, b: torch.Tensor, target: torch.Tensor, alpha: float = 1.0,
                    where: str = "PS site") -> torch.Tensor:
    """Per-neuron ``d > 0`` with ``a d² − b d^{−2α} = target`` (``a, b ≥ 0``: out and in parts of ``q``).

    Closed form for ``α = 1``, bisection in ``log d`` otherwise; the reachable targets per neuron are in
    the module docstring (:class:`UnreachableTarget` names the first offending neuron).

    >>> scaling_element(torch.tensor([1.0]), torch.tensor([4.0]), torch.tensor([0.0]))   # d⁴ = 4
    tensor([1.4142])
    """
    bad = ((a == 0) & (b == 0) & (target != 0)) | ((b == 0) & (target <= 0) & (a > 0)) | \
        ((a == 0) & (target >= 0) & (b > 0))
    if bad.any():
        i = int(bad.nonzero()[0])
        raise UnreachableTarget(
            f"{where}: unreachable target {float(target[i]):.4g} for neuron {i}: q_i(d) = a d² − b d^(−2α) with "
            f"out part a = {float(a[i]):.3g}, in part b = {float(b[i]):.3g} ranges over "
            + ("{0}" if a[i] == 0 and b[i] == 0 else "(0, ∞)" if b[i] == 0 else "(−∞, 0)") + f" ({int(bad.sum())} "
            f"neuron(s) unreachable)")
    safe_a, safe_b = torch.where(a > 0, a, 1.0), torch.where(b > 0, b, 1.0)
    if alpha == 1:
        x, y = _root(target, a * b), _root(-target, a * b)    # a d² and b d⁻²
        d2 = torch.where(a > 0, x / safe_a, torch.where(b > 0, safe_b / y.clamp_min(torch.finfo(a.dtype).tiny), 1.0))
        return d2.sqrt()
    lo, hi = torch.full_like(target, -60.0), torch.full_like(target, 60.0)   # log d
    for _ in range(110):
        mid = (lo + hi) / 2
        above = a * torch.exp(2 * mid) - b * torch.exp(-2 * alpha * mid) > target
        lo, hi = torch.where(above, lo, mid), torch.where(above, mid, hi)
    return torch.where((a == 0) & (b == 0), 1.0, torch.exp((lo + hi) / 2))


# -- whole analyses ---------------------------------------------------------------------------------
def _quantity(symmetry: Symmetry, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``C`` (``h × h``) or ``q`` (``h``) of the symmetry's conserved family at ``params``."""
    conserved = symmetry.conserved
    if conserved is None:
        raise ValueError(f"{symmetry.label} has no conserved quantity")
    (value,) = conserved(params).values()
    return value.reshape(-1) if symmetry.group.element_format == "diagonal" else value


def _degree(symmetry: Symmetry) -> float:
    """The degree ``α`` of the activation at a positive-scaling site (1 for ``GL``)."""
    return float(sp.sympify(symmetry.group.alpha))


def _scalar_element(symmetry: Symmetry, c: float, like: torch.Tensor) -> torch.Tensor:
    return c * symmetry.group.identity(like.dtype, like.device)


def _split(symmetry: Symmetry, params: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, R)`` (or ``(a, b)``) with ``C = P − R``, from ``C(c·θ) = c² P − c^{−2α} R`` at ``c = 1, 2`` (a power
    of two scales exactly, so a neuron without input or without readers gets an exact zero part)."""
    alpha = _degree(symmetry)
    now = _quantity(symmetry, params)
    scaled = _quantity(symmetry, symmetry.apply(params, _scalar_element(symmetry, 2.0, now)))
    out = (scaled - 2.0 ** (-2 * alpha) * now) / (4 - 2.0 ** (-2 * alpha))
    return out, out - now


@dataclass(frozen=True)
class InitResult:
    """What :func:`set_conserved` did.

    ``params``: all parameters after the move (untouched ones shared); ``elements``: per site, the group
    element applied in all (``sym.apply(original, elements[site])`` over the sites reproduces ``params``);
    ``conserved``: per site, ``C`` or ``q`` after; ``residual``: max over sites of ``|value − target|``
    relative to the site's ``‖P‖ + ‖R‖`` (at its last solve); ``sweeps``: Gauss–Seidel sweeps taken.
    """

    params: dict[str, torch.Tensor]
    elements: dict[str, torch.Tensor]
    conserved: dict[str, torch.Tensor]
    residual: float
    sweeps: int


def _targets(symmetries: dict[str, Symmetry], targets: Targets, params: Mapping[str, torch.Tensor]
             ) -> dict[str, torch.Tensor]:
    """``{site: target tensor}`` from a number (every site) or a mapping ``{site: number | tensor}``."""
    if not isinstance(targets, Mapping):
        targets = dict.fromkeys(symmetries, targets)
    unknown = sorted(set(targets) - set(symmetries))
    if unknown:
        raise ValueError(f"targets: sites {unknown} have no GL or positive-scaling conserved quantity; "
                         f"those that do: {sorted(symmetries)}")
    out = {}
    for site, value in targets.items():
        like = _quantity(symmetries[site], params)
        if isinstance(value, numbers.Real):
            tensor = torch.full_like(like, float(value))
            if like.dim() == 2:
                tensor = float(value) * torch.eye(like.shape[0], dtype=like.dtype, device=like.device)
        elif isinstance(value, torch.Tensor) and value.shape == like.shape and torch.isfinite(value).all():
            tensor = value.to(like)
        else:
            raise ValueError(f"targets[{site!r}]: expected a number or a finite tensor of shape {tuple(like.shape)} "
                             f"({'q' if like.dim() == 1 else 'C'} of {symmetries[site].group.name}), got "
                             f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
        out[site] = tensor
    return out


def set_conserved(analysis: Analysis, params: Mapping[str, torch.Tensor], targets: Targets = 0.0, *, tol: float = 1e-11,
                  max_sweeps: int = 500) -> InitResult:
    """Apply group elements so that every targeted conserved quantity equals its target.

    ``analysis``: a :class:`~symalg.symbolic.derive.Analysis` of any front end (``symalg.derive(symalg.trace(model,
    (x,)))``, or of a spec: symbolic widths are read off ``params``); its ``GL`` sites (``C``) and
    positive-scaling sites (``q``) can be targeted. ``targets``: a number ``λ`` for all of them
    (``C = λI``, ``q = λ·1``) or ``{site: number | tensor}`` (sites not named keep ``g = I``; their values
    still change where a neighbour moves). Sites are swept in order, each solved in closed form given
    the others (module docstring), until the relative residual is below ``tol``; raises
    :class:`UnreachableTarget` (naming the site) for a target outside the orbit's reach and
    ``RuntimeError`` if ``max_sweeps`` do not converge. The network function is unchanged: only
    ``symmetry.apply`` moves parameters. Work in float64 for exactness.

    >>> import torch, symalg
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2)).double()
    >>> analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 4, dtype=torch.float64),)))
    >>> result = set_conserved(analysis, dict(model.named_parameters()), targets=-0.5)
    >>> torch.allclose(result.conserved["0"], torch.full((6,), -0.5, dtype=torch.float64))
    True
    """
    if not isinstance(max_sweeps, int) or max_sweeps < 1:
        raise ValueError(f"max_sweeps must be a positive integer, got {max_sweeps!r}")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")
    analysis = analysis.at_widths_of(params)
    symmetries = {s.site: s for s in analysis.symmetries
                  if s.group.conserved_kind in ("matrix", "diagonal") and s.conserved is not None}
    if not symmetries:
        raise ValueError("analysis: no GL or positive-scaling site with a conserved quantity to set")
    state = {k: v.detach() for k, v in params.items()}
    wanted = _targets(symmetries, targets, state)
    elements: dict[str, torch.Tensor] = {}
    scales: dict[str, float] = {}
    for sweep in range(1, max_sweeps + 1):
        for site, target in wanted.items():
            symmetry = symmetries[site]
            P, R = _split(symmetry, state)
            scales[site] = float(torch.linalg.norm(P) + torch.linalg.norm(R)) or 1.0
            where = f"targets[{site!r}] ({symmetry.group.name} on {site})"
            if symmetry.group.element_format == "diagonal":
                g = scaling_element(P.clamp_min(0), R.clamp_min(0), target, _degree(symmetry), where)
            else:
                g = imbalance_element((P + P.T) / 2, (R + R.T) / 2, target, where)
            state = symmetry.apply(state, g)
            previous = elements.get(site)
            elements[site] = g if previous is None else (g * previous if g.dim() == 1 else g @ previous)
        conserved = {site: _quantity(symmetries[site], state) for site in wanted}
        error = max(float((conserved[site] - wanted[site]).abs().max()) / scales[site] for site in wanted)
        if error <= tol:
            return InitResult(state, elements, conserved, error, sweep)
    raise RuntimeError(f"set_conserved: no convergence in max_sweeps={max_sweeps} sweeps (relative residual "
                       f"{error:.3g} > tol={tol:g}); the joint targets may be unreachable although each site's is")


def balance(analysis: Analysis, params: Mapping[str, torch.Tensor], **options: Any) -> InitResult:
    """:func:`set_conserved` with every target 0: ``C = 0`` on GL sites, ``q = 0`` on scaling sites (the
    minimum-norm point of the orbit).

    >>> import torch, symalg
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Identity(), torch.nn.Linear(2, 2)).double()
    >>> analysis = symalg.derive(symalg.trace(model, (torch.randn(3, 2, dtype=torch.float64),)))
    >>> balance(analysis, dict(model.named_parameters())).sweeps
    1
    """
    return set_conserved(analysis, params, 0.0, **options)


# -- sharpness ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HessianEigenvalue:
    """The Hessian eigenvalue of largest magnitude (``eigenvalue``, a Rayleigh quotient), the relative
    residual ``‖Hv − λv‖ / |λ|`` of its vector, and the Hessian-vector products used."""

    eigenvalue: float
    residual: float
    iterations: int


def _flat_size(params: Mapping[str, torch.Tensor]) -> tuple[int, torch.Tensor]:
    reference = next(iter(params.values()))
    return sum(p.numel() for p in params.values()), reference


def top_hessian_eigenvalue(loss: ParamLoss, params: Mapping[str, torch.Tensor],
                           max_iter: int = 300, rtol: float = 1e-4, change_tol: float = 0.0,
                           generator: torch.Generator | None = None) -> HessianEigenvalue:
    """Power iteration on Hessian-vector products (:func:`~symalg.applications.flat_minima.hessian_vector_products`):
    the eigenvalue of largest ``|λ|`` of ``∇²L`` at ``params`` (``λ_max`` at a minimum, where ``H ⪰ 0``).

    Stops when ``‖Hv − λv‖ ≤ rtol·|λ|`` (then some eigenvalue lies within ``rtol·|λ|`` of ``λ``, ``H``
    being symmetric), when successive estimates differ by at most ``change_tol·|λ|`` (PyHessian's
    criterion: cheaper, not a certificate; the residual is reported either way), or after ``max_iter``
    products. For ``H ⪰ 0`` the estimates increase towards ``λ_max``, at the rate ``(λ₂/λ₁)^{2k}``.

    >>> loss = lambda p: 0.5 * (1.0 - p["u"] * p["v"]).pow(2).sum()        # scalar two-layer net, x = y = 1
    >>> s = top_hessian_eigenvalue(loss, {"u": torch.tensor([2.0 ** 0.5]), "v": torch.tensor([0.5 ** 0.5])})
    >>> round(s.eigenvalue, 6)                                               # √(Q² + 4), Q = u² − v² = 1.5
    2.5
    """
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    size, reference = _flat_size(params)
    v = torch.randn(size, generator=generator, dtype=reference.dtype).to(reference.device)
    v = v / v.norm()
    eigenvalue, residual = math.nan, math.inf
    for iteration in range(1, max_iter + 1):
        w = hessian_vector_products(loss, params, v[None])[0]
        previous, eigenvalue = eigenvalue, float(v @ w)
        scale = max(abs(eigenvalue), torch.finfo(reference.dtype).tiny)
        residual = float((w - eigenvalue * v).norm()) / scale
        if residual <= rtol or abs(eigenvalue - previous) <= change_tol * scale or not float(w.norm()):
            break
        v = w / w.norm()
    return HessianEigenvalue(eigenvalue, residual, iteration)


@dataclass(frozen=True)
class TraceEstimate:
    """Hutchinson's estimate of ``tr ∇²L``: the mean of ``zᵀHz`` over Rademacher probes, its standard error."""

    value: float
    stderr: float
    probes: int


def hessian_trace(loss: ParamLoss, params: Mapping[str, torch.Tensor],
                  probes: int = 64, generator: torch.Generator | None = None) -> TraceEstimate:
    """Hutchinson's estimator ``tr H ≈ mean_i z_iᵀ H z_i`` with Rademacher ``z_i`` (variance
    ``2(‖H‖_F² − Σ H_jj²)/probes``), the products batched.

    >>> loss = lambda p: (p["a"] ** 2).sum() + 3 * (p["b"] ** 2).sum()   # H = diag(2, 2, 6): exact for any z
    >>> hessian_trace(loss, {"a": torch.zeros(2), "b": torch.zeros(1)}, probes=4).value
    10.0
    """
    if not isinstance(probes, int) or probes < 2:
        raise ValueError(f"probes must be an integer >= 2, got {probes!r}")
    size, reference = _flat_size(params)
    z = torch.randint(0, 2, (probes, size), generator=generator).to(reference) * 2 - 1
    samples = (z * hessian_vector_products(loss, params, z)).sum(1)
    return TraceEstimate(float(samples.mean()), float(samples.std() / probes ** 0.5), probes)
