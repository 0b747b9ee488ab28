"""Data-dependent nonlinear ``GL(h)`` actions ([Zhao2026] Sec. 2.4 and App. A.3).

A linear symmetry needs ``σ(g z) = π(g) σ(z)`` for all ``z``; for sigmoid only ``g = I`` qualifies.
Letting the correction depend on the data point recovers the full ``GL(h)``:

* **Frames.** For ``z ≠ 0`` the spherical frame ``R_z = |z| R(α(z))`` (appendix form, Def. A.3.1)
  satisfies ``R_z e₁ = z`` and ``R_zᵀ R_z = |z|² I`` (so ``‖R_z‖ = |z|``). ``R(β)`` is the product of
  Givens rotations ``G_{h−1}(β_{h−1}) ⋯ G_1(β_1)``, ``G_k`` rotating the plane ``(e_k, e_{k+1})``. For a
  batch ``A ∈ R^{h×k}`` (``k ≤ h``, full column rank) the QR frame ``F(A) = Q blockdiag(R, ρI)`` has
  first ``k`` columns ``A``.
* **Cocycle.** ``c(g, Z) = F(σ(gZ)) F(σ(Z))⁻¹`` satisfies ``c(I, Z) = I``,
  ``c(g₁, g₂Z) c(g₂, Z) = c(g₁g₂, Z)`` (it telescopes) and ``c(g, Z) σ(Z) = σ(gZ)`` (both sides are
  the first ``k`` columns of ``F(σ(gZ))``).
* **Action.** ``g·(U, V, x) = (U c(g, Vx)⁻¹, gV, x) = (U R_{σ(Vx)} R_{σ(gVx)}⁻¹, gV, x)`` (eq. 2.7) is
  a group action exactly when ``c`` is a cocycle, and it preserves ``F(x) = U σ(Vx)`` exactly when
  ``c`` is an equivariance. Multi-layer (corrected App. A.3.3): with hidden pre-activations
  ``Z_i = W_i a_{i−1} + b_i`` and ``g₀ = g_L = I``,
  ``W_i' = g_i W_i c_{i−1}(g_{i−1}, Z_{i−1})⁻¹``, ``b_i' = g_i b_i``, for ``i = 1, …, L`` (the last
  layer included), so that ``Z_i' = g_i Z_i`` and the output is unchanged.
* **Where it is defined.** ``σ(Z)`` and ``σ(gZ)`` must be nonzero (rank ``k``). ``σ(0) ≠ 0``
  (sigmoid, softplus): everywhere. ``σ`` vanishing only at 0 (tanh, leaky ReLU, GELU, SiLU): on the
  locus ``Z ≠ 0``, which ``GL(h)`` preserves. ReLU vanishes on ``z ≤ 0``: no ``GL(h)``-invariant
  locus; the action raises for the ``g`` that send ``Z`` into the non-positive orthant.
* **Batch size.** For ``k ≤ h`` a cocycle exists whenever ``σ(Z)``, ``σ(gZ)`` have rank ``k``; for
  ``k > h`` no ``U'`` satisfies ``U' σ(gVX) = U σ(VX)`` for all ``U`` unless ``σ(gVX)`` and ``σ(VX)`` have
  the same row space (generically false): ``frame`` refuses ``k > h``.

Conventions: weights in torch's ``nn.Linear`` layout ``W ∈ R^{out×in}`` ([Zhao2026]'s ``V ∈ R^{h×n}``,
``U ∈ R^{m×h}`` are already in it); data in torch's row layout, ``x`` of shape ``(n,)`` (one point) or
``(…, k, n)`` (``k`` points); frames and cocycles take [Zhao2026]'s column layout ``Z ∈ R^{…×h×k}``.
Everything broadcasts over leading dimensions, so hundreds of draws are one call.

API (for teleportation and symmetry ensembles)
----------------------------------------------
``FeedForward.of(model)``                 the executable view of the network (:mod:`symalg.numeric.feedforward`)
``DataDependentAction(net)(params, g, x)``  transformed copy of ``params`` (``g``: one matrix per site)
``two_layer_action(U, V, g, x, σ)``      [Zhao2026]'s ``(U', V')``
``spherical_frame``, ``frame``, ``FrameCocycle``, ``Cocycle``, ``check_cocycle``, ``lipschitz_bounds``,
``random_gl``

Example
-------
>>> import torch
>>> from torch import nn
>>> from symalg.applications.nonlinear_actions import DataDependentAction, random_gl
>>> from symalg.numeric.feedforward import FeedForward, SiteElements
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(3, 5), nn.Sigmoid(), nn.Linear(5, 2)).double()
>>> net = FeedForward.of(model)
>>> params = dict(model.named_parameters())
>>> x = torch.randn(3, dtype=torch.float64)
>>> new = DataDependentAction(net)(params, [random_gl(5, scale=1.0, dtype=torch.float64)], x)
>>> bool((net.forward(new, x) - model(x)).abs().max() < 1e-12)
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from symalg.catalogue.groups import matrix_exp
from symalg.numeric.feedforward import FeedForward, SiteElements
from symalg.numeric.linalg import relative_error

__all__ = ["TOLERANCES", "Cocycle", "CocycleCheck", "DataDependentAction", "FrameCocycle", "LipschitzBounds",
           "check_cocycle", "frame", "lipschitz_bounds", "random_gl", "rotation_matrix", "spherical_coordinates",
           "spherical_frame", "two_layer_action"]

TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-4}
"""Relative tolerances of the checks in this module and :mod:`symalg.applications.teleport_actions`, keyed by dtype."""


def _tolerance(dtype: torch.dtype) -> float:
    return TOLERANCES.get(dtype, 1e-4)


# ---------------------------------------------------------------------------------------------- frames

def spherical_coordinates(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r, α₁, …, α_{h−1})`` with ``z_i = r cos(α_i) ∏_{k<i} sin(α_k)`` and ``α_h = 0``.

    ``α_k = atan2(|z_{k+1:}|, z_k) ∈ [0, π]`` for ``k ≤ h−2`` and ``α_{h−1} = atan2(z_h, z_{h−1})``
    (signed). ``atan2(0, 0) = 0`` makes the angles defined at every ``z`` (not unique where a tail of
    ``z`` vanishes). Computed on ``z / max|z_i|``, so huge and tiny vectors neither overflow nor
    underflow. Shapes: ``z (…, h)``, ``h ≥ 2`` → ``r (…)``, ``α (…, h−1)``.

    >>> r, a = spherical_coordinates(torch.tensor([0.0, 3.0, 4.0]))
    >>> r.item(), [round(v, 4) for v in a.tolist()]
    (5.0, [1.5708, 0.9273])
    """
    if z.shape[-1] < 2:
        raise ValueError(f"spherical_coordinates: z needs at least 2 entries, got shape {tuple(z.shape)}")
    scale = z.abs().amax(-1, keepdim=True)
    u = z / scale.clamp_min(torch.finfo(z.dtype).tiny)
    tails = (u * u).flip(-1).cumsum(-1).flip(-1).sqrt()  # tails[j] = |u_{j:}|
    angles = torch.cat([torch.atan2(tails[..., 1:-1], u[..., :-2]),
                        torch.atan2(u[..., -1:], u[..., -2:-1])], -1)
    return scale[..., 0] * tails[..., 0], angles


def rotation_matrix(beta: torch.Tensor) -> torch.Tensor:
    """``R(β) ∈ SO(n+1)`` of Def. A.3.1 for ``β`` of shape ``(…, n)``:

    ``R_ij = cos(β_{j−1}) (∏_{k=j}^{i−1} sin β_k) cos(β_i)`` for ``j ≤ i``, ``R_{i,i+1} = −sin β_i``,
    zero above the superdiagonal, with ``β₀ = β_{n+1} = 0``. Equal to ``G_n(β_n) ⋯ G_1(β_1)``
    (Givens rotations), hence orthogonal; its first column is the unit vector with angles ``β``.

    >>> rotation_matrix(torch.tensor([0.5]))
    tensor([[ 0.8776, -0.4794],
            [ 0.4794,  0.8776]])
    """
    n = beta.shape[-1]
    s, c = beta.sin(), beta.cos()
    one = torch.ones_like(beta[..., :1])
    cpad = torch.cat([one, c, one], -1)  # cos β_0 … cos β_{n+1}
    # M[j, q] = sin β_{q+1} for q ≥ j (0-based), 1 before: cumprod gives ∏_{q=j}^{q'} sin β_{q+1}
    upper = torch.ones(n + 1, n, dtype=torch.bool, device=beta.device).triu()
    m = torch.where(upper, s.unsqueeze(-2), torch.ones_like(s).unsqueeze(-2))
    prods = torch.cat([torch.ones_like(m[..., :1]), m.cumprod(-1)], -1)  # prods[j, i] = ∏_{q=j}^{i−1} sin β_{q+1}
    lower = (cpad[..., None, : n + 1] * prods.transpose(-1, -2) * cpad[..., 1:, None]).tril()
    return lower - torch.diag_embed(s, offset=1)


def spherical_frame(z: torch.Tensor, name: str = "z") -> torch.Tensor:
    """``R_z = |z| R(α(z))`` (Prop. A.3.3): ``R_z e₁ = z``, ``R_zᵀ R_z = |z|² I``, ``‖R_z‖ = |z|``.

    ``z (…, h)`` → ``(…, h, h)``. For ``h = 1``, ``R_z = [z]`` (the appendix's ``|z|·R()`` would give
    ``|z|``, whose first column is not ``z`` when ``z < 0``). Raises ``ValueError`` naming ``name`` where
    ``z = 0`` (no invertible matrix has first column 0).

    >>> spherical_frame(torch.tensor([3.0, 4.0]))
    tensor([[ 3., -4.],
            [ 4.,  3.]])
    """
    zero = (z == 0).all(-1)
    if zero.any():
        where = "" if zero.dim() == 0 else f" (draws {zero.nonzero().flatten().tolist()[:5]})"
        raise ValueError(f"{name} = 0{where}: R_z needs z ≠ 0 (no invertible matrix has first column 0)")
    if z.shape[-1] == 1:
        return z.unsqueeze(-1)
    r, angles = spherical_coordinates(z)
    return r[..., None, None] * rotation_matrix(angles)


def frame(a: torch.Tensor, name: str = "a") -> torch.Tensor:
    """An invertible ``F(a) ∈ R^{h×h}`` whose first ``k`` columns are ``a ∈ R^{…×h×k}`` (columns are points).

    ``k = 1``: the spherical frame ``R_a``. ``k > 1``: ``F = Q blockdiag(R, ρ I_{h−k})`` from the complete QR
    decomposition ``a = Q [R; 0]``, ``ρ = ‖a‖_F/√k``. Raises ``ValueError`` naming ``name`` when ``k > h``
    (a frame needs ``k ≤ h``: the batch-size limit) or when ``a`` has numerical rank ``< k``.

    >>> a = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    >>> torch.allclose(frame(a)[:, :2], a)
    True
    """
    h, k = a.shape[-2:]
    if k > h:
        raise ValueError(f"{name}: a batch of k = {k} points exceeds the width h = {h}; a frame (an invertible "
                         f"matrix whose first k columns are the batch) exists only for k ≤ h")
    if k == 1:
        return spherical_frame(a[..., 0], name)
    q, r = torch.linalg.qr(a, mode="complete")
    d = r.diagonal(dim1=-2, dim2=-1).abs()  # numerical rank: a diagonal of R within 64·h ulps of zero
    if (d.amin(-1) <= 64 * h * torch.finfo(a.dtype).eps * d.amax(-1)).any():
        raise ValueError(f"{name} has rank < k = {k} (columns linearly dependent): no invertible frame has "
                         "these first columns")
    # the filler block is scaled like a (ρ = ‖a‖_F/√k, as |z| for k = 1), so that F is as well conditioned as R
    rho = torch.linalg.matrix_norm(a)[..., None, None] / k ** 0.5
    fill = rho * torch.eye(h, dtype=a.dtype, device=a.device)[:, k:]
    return q @ torch.cat([r, fill], -1)


def _right_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a b⁻¹`` by a linear solve."""
    return torch.linalg.solve(b, a, left=False)


def _columns(sigma: Callable, z: torch.Tensor) -> torch.Tensor:
    """``σ`` applied to each column of ``z (…, h, k)`` (``σ`` acts on the last axis, torch's convention)."""
    return sigma(z.transpose(-1, -2)).transpose(-1, -2)


# -------------------------------------------------------------------------------------------- cocycles

class Cocycle:
    """A map ``c: GL(h) × R^{h×k} → GL(h)`` driving the action ``(U, V, x) ↦ (U c(g, Vx)⁻¹, gV, x)``.

    That map is a group action iff ``c(I, Z) = I`` and ``c(g₁, g₂Z) c(g₂, Z) = c(g₁g₂, Z)`` (since
    ``g₁·(g₂·U) = U c(g₂, Z)⁻¹ c(g₁, g₂Z)⁻¹``), and preserves ``U σ(Vx)`` for every ``U`` iff
    ``c(g, Z) σ(Z) = σ(gZ)``. Wrap any user function ``c(g, Z) → (…, h, h)`` to use it in
    :class:`DataDependentAction` or :func:`check_cocycle`; ``inverse`` solves a linear system.
    """

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.fn = fn

    def __call__(self, g: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.fn(g, z)

    def inverse(self, g: torch.Tensor, z: torch.Tensor, where: str = "") -> torch.Tensor:
        """``c(g, Z)⁻¹``; ``where`` prefixes error messages (e.g. the site)."""
        return torch.linalg.inv(self(g, z))


class FrameCocycle(Cocycle):
    """``c(g, Z) = F(σ(gZ)) F(σ(Z))⁻¹`` for an activation ``σ`` (acting on the last axis) and a frame ``F``.

    For one point this is [Zhao2026]'s ``R_{σ(gz)} R_{σ(z)}⁻¹``; ``inverse`` gives ``R_{σ(z)} R_{σ(gz)}⁻¹``
    directly. Errors name the data (``σ(Z) = 0``, argument ``x``) or the group element (``σ(gZ) = 0``,
    argument ``g``) that puts the point off the locus where the action is defined.

    >>> c = FrameCocycle(torch.sigmoid)
    >>> g, z = torch.tensor([[2.0, 1.0], [0.0, -1.0]]), torch.tensor([[0.3], [-1.2]])
    >>> torch.allclose(c(g, z) @ torch.sigmoid(z), torch.sigmoid(g @ z))
    True
    """

    def __init__(self, activation: Callable, frame: Callable = frame):
        self.activation, self.frame = activation, frame

    def __call__(self, g: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return _right_divide(self.frame(_columns(self.activation, g @ z), "σ(g Z)"),
                             self.frame(_columns(self.activation, z), "σ(Z)"))

    def inverse(self, g: torch.Tensor, z: torch.Tensor, where: str = "") -> torch.Tensor:
        return _right_divide(self.frame(_columns(self.activation, z), f"{where}σ(Z) (argument x)"),
                             self.frame(_columns(self.activation, g @ z), f"{where}σ(g Z) (argument g)"))


def _relative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Relative error over the last two axes (one per draw)."""
    return relative_error(a, b, dim=(-2, -1))


@dataclass(frozen=True)
class CocycleCheck:
    """Largest relative errors over the draws of the unit axiom ``c(I, Z) = I``, the multiplication axiom
    ``c(g₁, g₂Z) c(g₂, Z) = c(g₁g₂, Z)`` and (with an activation) the equivariance
    ``c(g, Z) σ(Z) = σ(gZ)`` at ``g = g₁g₂``."""

    identity_error: float
    composition_error: float
    equivariance_error: float | None
    tol: float
    draws: int

    @property
    def is_cocycle(self) -> bool:
        return self.identity_error <= self.tol and self.composition_error <= self.tol

    @property
    def passed(self) -> bool:
        return self.is_cocycle and (self.equivariance_error is None or self.equivariance_error <= self.tol)

    def __str__(self) -> str:
        eq = "" if self.equivariance_error is None else f", equivariance {self.equivariance_error:.1e}"
        verdict = "PASS" if self.passed else "FAIL"
        return (f"cocycle check over {self.draws} draws: {verdict} (tol {self.tol:.0e}): unit axiom "
                f"{self.identity_error:.1e}, multiplication axiom {self.composition_error:.1e}{eq}")


def check_cocycle(c: Callable, g1: torch.Tensor, g2: torch.Tensor, z: torch.Tensor,
                  activation: Callable | None = None, tol: float | None = None) -> CocycleCheck:
    """Check the cocycle axioms (and, given ``activation``, the equivariance) of any ``c(g, Z)``.

    ``g1, g2 (…, h, h)``, ``z (…, h, k)`` (columns are points; leading axes are draws). Errors are
    relative Frobenius norms, maximised over draws; ``tol`` defaults to :data:`TOLERANCES` by dtype.

    >>> g1, g2 = random_gl(3, batch=(50,)), random_gl(3, batch=(50,))
    >>> check_cocycle(FrameCocycle(torch.tanh), g1, g2, torch.randn(50, 3, 1), torch.tanh).passed
    True
    >>> check_cocycle(lambda g, z: g, g1, g2, torch.randn(50, 3, 1), torch.tanh).is_cocycle  # π(g) = g
    True
    """
    tol = _tolerance(z.dtype) if tol is None else tol
    eye = torch.eye(g1.shape[-1], dtype=g1.dtype, device=g1.device).expand_as(g1)
    g12 = g1 @ g2
    c12 = c(g12, z)
    unit = _relative(c(eye, z), eye)
    mult = _relative(c(g1, g2 @ z) @ c(g2, z), c12)
    equiv = None
    if activation is not None:
        target = _columns(activation, g12 @ z)
        equiv = _relative(c12 @ _columns(activation, z), target).max().item()
    return CocycleCheck(unit.max().item(), mult.max().item(), equiv, tol, unit.numel())


# --------------------------------------------------------------------------------------------- networks

@dataclass(frozen=True)
class DataDependentAction:
    """The data-dependent action of ``∏_i GL(n_i)`` on ``(θ, x)`` (corrected App. A.3.3).

    ``W_i' = g_i W_i c_{i−1}(g_{i−1}, Z_{i−1})⁻¹``, ``b_i' = g_i b_i`` (``g₀ = g_L = I``), with
    ``c_i = cocycles.get(i, FrameCocycle(σ_i))``. Then ``Z_i' = g_i Z_i`` at the data, so the output
    at ``x`` is unchanged. ``x``: one point ``(n,)`` or a batch ``(…, k, n)`` with ``k ≤`` every hidden
    width (QR frames). Elsewhere the function changes (see :func:`lipschitz_bounds`).

    Calling it returns a new dict (untouched entries shared); it raises ``ValueError`` naming the site
    and the argument (``x`` or ``g``) where a frame is undefined (``σ(Z) = 0``, ``σ(gZ) = 0``, rank
    ``< k``, or ``k >`` width).
    """

    net: FeedForward
    cocycles: Mapping[int, Callable] | None = None

    def cocycle(self, site: int) -> Cocycle:
        c = (self.cocycles or {}).get(site)
        if c is None:
            return FrameCocycle(self.net.activations[site])
        return c if isinstance(c, Cocycle) else Cocycle(c)

    def __call__(self, params: Mapping[str, torch.Tensor], g: SiteElements, x: torch.Tensor) -> dict[str, torch.Tensor]:
        gs = self.net.site_elements(g)
        zs = self.net.preactivations(params, x)
        out = dict(params)
        inv_prev = None  # c_{i−1}(g_{i−1}, Z_{i−1})⁻¹
        for i, (w, b) in enumerate(zip(self.net.weights, self.net.biases)):
            gi = gs[i] if i < self.net.sites else None
            weight = params[w] if inv_prev is None else params[w] @ inv_prev
            if gi is not None:
                width = params[w].shape[-2]
                if gi.shape[-2:] != (width, width):
                    raise ValueError(f"g[{i}]: shape {tuple(gi.shape)}, expected (…, {width}, {width}) for site {i} "
                                     f"(output of {w!r})")
                weight = gi @ weight
                if b is not None:
                    out[b] = (gi @ params[b].unsqueeze(-1)).squeeze(-1)
            out[w] = weight
            inv_prev = None if gi is None else self.cocycle(i).inverse(
                gi, zs[i].transpose(-1, -2), where=f"site {i} (output of {w!r}): ")
        return out


def two_layer_action(u: torch.Tensor, v: torch.Tensor, g: torch.Tensor, x: torch.Tensor, activation: Callable,
                     cocycle: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``g·(U, V, x) = (U R_{σ(Vx)} R_{σ(gVx)}⁻¹, gV)`` (eq. 2.7), or ``(U c(g, Vx)⁻¹, gV)`` for a given ``c``.

    ``U (…, m, h)``, ``V (…, h, n)``, ``g (…, h, h)``, ``x (n,)`` or ``(…, k, n)`` (rows, ``k ≤ h``).

    >>> u, v, g, x = torch.randn(2, 4), torch.randn(4, 3), random_gl(4, scale=1.0), torch.randn(3)
    >>> u2, v2 = two_layer_action(u, v, g, x, torch.tanh)
    >>> torch.allclose(u2 @ torch.tanh(v2 @ x), u @ torch.tanh(v @ x))
    True
    """
    net = FeedForward.two_layer(activation)
    out = DataDependentAction(net, None if cocycle is None else {0: cocycle})({"0.weight": v, "2.weight": u}, [g], x)
    return out["2.weight"], out["0.weight"]


def random_gl(n: int, scale: float = 0.5, batch: Sequence[int] = (), generator: torch.Generator | None = None,
              dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Random invertible matrices ``exp(scale · N/√n)`` (``N`` standard Gaussian), shape ``(*batch, n, n)``.

    ``scale`` sets the distance from the identity (``‖log g‖_F ≈ scale·√n``); drawn on the CPU (so a seeded
    ``generator`` gives the same draws everywhere), then moved to ``device``.
    """
    noise = torch.randn(*batch, n, n, generator=generator, dtype=dtype or torch.get_default_dtype())
    return matrix_exp(scale * noise / n ** 0.5).to(device)


# -------------------------------------------------------------------------------------------- Lipschitz

@dataclass(frozen=True)
class LipschitzBounds:
    """Lipschitz bounds of ``F(x̃) = U σ(V x̃)`` before and after the action at ``x`` (Prop. 2.4.2).

    ``original = η‖U‖‖V‖``; ``bound = η‖U‖‖c(g, Vx)⁻¹‖‖g‖‖V‖``, which for the spherical cocycle is the
    proposition's ``η‖U‖‖V‖‖g‖|σ(Vx)|/|σ(gVx)|`` (``‖R_a R_b⁻¹‖ = |a|/|b|``); ``sharp = η‖U'‖‖V'‖`` (at most
    ``bound``); ``empirical = max_j ‖∂F'/∂x̃(x̃_j)‖`` over the samples, a lower bound on the true constant.
    Norms are spectral.
    """

    original: float
    bound: float
    sharp: float
    empirical: float | None
    ratio: float  # ‖c⁻¹‖ ‖g‖: the factor by which the proposition's bound moves

    @property
    def holds(self) -> bool:
        slack = 1 + 1e-9
        ok = self.sharp <= self.bound * slack
        return ok and (self.empirical is None or self.empirical <= self.sharp * slack)

    def __str__(self) -> str:
        emp = "" if self.empirical is None else f", empirical ≥ {self.empirical:.4g}"
        return (f"Lipschitz: original ≤ {self.original:.4g}; after the action ≤ {self.bound:.4g} (Prop. 2.4.2, "
                f"factor {self.ratio:.3g}), sharp ≤ {self.sharp:.4g}{emp}: {'holds' if self.holds else 'VIOLATED'}")


def lipschitz_bounds(u: torch.Tensor, v: torch.Tensor, g: torch.Tensor, x: torch.Tensor, activation: Callable,
                     eta: float, samples: torch.Tensor | None = None,
                     cocycle: Callable | None = None) -> LipschitzBounds:
    """Prop. 2.4.2 (with its ``‖g‖`` kept in the general-cocycle form) for one two-layer network and point.

    ``U (m, h)``, ``V (h, n)``, ``g (h, h)``, ``x (n,)``; ``eta`` is σ's Lipschitz constant; ``samples
    (s, n)`` (rows) give the empirical Jacobian norm of the transformed network.

    >>> b = lipschitz_bounds(torch.randn(2, 4), torch.randn(4, 3), random_gl(4), torch.randn(3), torch.tanh, 1.0,
    ...                      samples=torch.randn(64, 3))
    >>> b.holds
    True
    """
    c = FrameCocycle(activation) if cocycle is None else (cocycle if isinstance(cocycle, Cocycle) else Cocycle(cocycle))
    c_inv = c.inverse(g, (v @ x).unsqueeze(-1))
    u2, v2 = u @ c_inv, g @ v

    def norm(a: torch.Tensor) -> float:
        return torch.linalg.matrix_norm(a, ord=2).item()

    ratio = norm(c_inv) * norm(g)
    empirical = None
    if samples is not None:
        def f(t: torch.Tensor) -> torch.Tensor:
            return u2 @ activation(v2 @ t)
        empirical = torch.linalg.matrix_norm(torch.func.vmap(torch.func.jacrev(f))(samples), ord=2).max().item()
    return LipschitzBounds(eta * norm(u) * norm(v), eta * norm(u) * norm(v) * ratio, eta * norm(u2) * norm(v2),
                           empirical, ratio)
