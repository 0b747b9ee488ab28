"""Flat minima: the Hessian's null space at a minimum against the orbit of the symmetry group.

Why orbit tangents lie in ``ker H``. Let a symmetry act linearly, ``θ ↦ A_g θ``, with ``L(A_g θ) = L(θ)``
for all ``g`` and ``θ``. Differentiating in ``θ`` gives ``A_gᵀ ∇L(A_g θ) = ∇L(θ)``; differentiating
that along ``g = exp(sM)`` at ``s = 0`` (``A_g = I + s𝔐 + O(s²)``, ``𝔐θ = M·θ`` the infinitesimal
action) gives, for every ``θ``,

    H(θ) (M·θ) = −𝔐ᵀ ∇L(θ).

At a critical point the right side vanishes: every tangent ``t = M·θ`` of the orbit lies in ``ker H``,
so ``dim ker H ≥`` the orbit dimension. Away from one, ``H t = −𝔐ᵀ∇L`` is nonzero in general (the
negative control). A translation (``θ ↦ θ + sB``, affine) gives ``H B = 0`` at every ``θ``; a shear (``B(θ)``
reading weights: a bias moved into the next layer's) ``H B(θ) = −(∂B/∂θ)ᵀ ∇L``, zero at critical points.

When ``ker H`` is larger than the orbit's tangent space (the *excess*):

* zero loss with ``mse``: the residual term of ``H`` vanishes, ``H = JᵀJ/N`` (``J`` the Jacobian of
  the ``N·d_out`` outputs on the data), so ``ker H = ker J`` and ``dim ker H ≥ P − N·d_out``: with
  too few data points the interpolating set is wider than the orbit;
* the network function has flat directions no claimed group generates: a linear bottleneck
  ``min(n, m) < h < max(n, m)`` (the fibres of ``(U, V) ↦ UV`` exceed the ``GL(h)`` orbits by
  ``(h − min(n, m))(max(n, m) − h)``), a ReLU neuron active on every data point (it acts linearly:
  ``b_j ↦ b_j + δ``, ``b_out ↦ b_out − u_j δ``, the shear symalg claims across an identity site), dead or
  duplicated neurons, rank-deficient weights
  (docs/flat_minima.md derives each case).

Numerics. ``H`` is the Hessian of ``L`` in the flattened parameters (the order of ``params``). An
eigenvalue counts as zero when ``|λ| ≤ rtol·‖H‖`` (default ``rtol = √eps``: 1.5e-8 in float64);
the report gives the largest dropped and smallest kept ``|λ|/‖H‖`` (the spectral gap).

* ``method="dense"``: ``H`` from ``P`` Hessian-vector products, then ``eigvalsh`` (``P ≤ 3000`` for
  ``"auto"``).
* ``method="randomized"``: Hessian-vector products only (``jvp`` of ``grad``, vmapped). A randomized
  range finder ``Y = HΩ`` (Gaussian ``Ω``, ``k`` columns, doubled until resolved), ``Q = orth(Y)``,
  Rayleigh–Ritz ``B = Qᵀ H Q``, and a posterior probe: with ``p`` fresh Gaussian ``ω_i``,
  ``δ = 10 √(2/π) max_i ‖(I − QQᵀ) H ω_i‖ ≥ ‖(I − QQᵀ) H‖`` with probability ``≥ 1 − 10⁻ᵖ``
  (Halko, Martinsson, Tropp 2011, Lemma 4.1). Then ``‖H − Q B Qᵀ‖ ≤ 2δ``, so by Weyl every
  eigenvalue of ``H`` lies within ``2δ`` of a Ritz value or of 0. The method *certifies the rank of
  H* (hence ``dim ker H = P − rank``) when every Ritz value clears the threshold by more than
  ``2δ``; the reported gap bounds include the ``2δ``. It needs ``rank H < max_rank``: it suits
  over-parameterised models at (near) zero loss, where ``rank H ≤ N·d_out``.

Example
-------
>>> import symalg
>>> from symalg.applications.flat_minima import flat_minimum, linear_teacher_minimum
>>> model, x, y = linear_teacher_minimum(4, 6, 3, samples=12)
>>> report = flat_minimum(model, x, y)
>>> report.n_params, report.orbit_dimension, report.null_dimension, report.tangents_in_null_space
(42, 30, 30, True)
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vmap

from symalg.errors import SpecError
from symalg.frontend.spec import to_spec_string
from symalg.frontend.tracing import trace
from symalg.numeric.autodiff import differentiable_kernels
from symalg.symbolic.derive import Analysis, derive
from symalg.symbolic.symmetry import Symmetry

__all__ = ["NullSpace", "OrbitTangents", "FlatMinimumReport", "TrainingRun", "hessian_null_space",
           "hessian_vector_products", "orbit_tangents", "flat_minimum", "model_loss", "linear_teacher_minimum",
           "train_to_minimum"]

LOSSES = ("mse", "cross_entropy")
METHODS = ("auto", "dense", "randomized")
DENSE_LIMIT = 3000
"""Parameters up to which ``method="auto"`` forms the dense Hessian."""

ParamLoss = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]
"""A loss as a function of the parameters ``{name: tensor}`` (a scalar tensor)."""

Forward = Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]
"""A model run on given parameters: ``f(params, x)``."""


# -- parameters as one vector ---------------------------------------------------------------------
class _Flat:
    """``{name: tensor}`` as one vector, in the order of ``params``."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.names = list(params)
        self.shapes = [params[n].shape for n in self.names]
        self.sizes = [params[n].numel() for n in self.names]
        self.size = sum(self.sizes)

    def flatten(self, tensors: Mapping[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """One vector; names missing from ``tensors`` are zero (a tangent moves only some tensors)."""
        unknown = set(tensors) - set(self.names)
        if unknown:
            raise ValueError(f"tensors {sorted(unknown)} are not among the parameters {self.names}")
        return torch.cat([tensors[n].reshape(-1) if n in tensors else like.new_zeros(size)
                          for n, size in zip(self.names, self.sizes)])

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: chunk.reshape(shape) for n, chunk, shape in zip(self.names, vector.split(self.sizes), self.shapes)}


class _Objective:
    """``L`` as a function of the flat parameter vector: gradient, Hessian-vector products, dense Hessian."""

    def __init__(self, loss: ParamLoss, params: Mapping[str, torch.Tensor], chunk_size: int = 64) -> None:
        if not params:
            raise ValueError("params: no parameters given")
        self.flat = _Flat(params)
        reference = next(iter(params.values()))
        self.theta = self.flat.flatten({k: v.detach() for k, v in params.items()}, reference)
        self.f = lambda vector: loss(self.flat.unflatten(vector))
        self._grad = grad(self.f)
        self._hvp = vmap(lambda v: jvp(self._grad, (self.theta,), (v,))[1], chunk_size=chunk_size)
        self.hvps = 0

    def value(self) -> float:
        return float(self.f(self.theta))

    def gradient(self) -> torch.Tensor:
        return self._grad(self.theta)

    def hvp(self, vectors: torch.Tensor) -> torch.Tensor:
        """``H v`` for every row ``v`` of ``vectors``."""
        self.hvps += vectors.shape[0]
        with differentiable_kernels():  # forward over reverse through the model
            return self._hvp(vectors) if vectors.shape[0] else vectors.clone()

    def dense(self) -> torch.Tensor:
        """``H`` from ``P`` Hessian-vector products against the identity (chunked; measured 10–35× faster
        than ``torch.func.hessian`` at ``P = 750``), symmetrised."""
        H = self.hvp(torch.eye(self.flat.size, dtype=self.theta.dtype, device=self.theta.device))
        return (H + H.T) / 2


def _rtol(rtol: float | None, dtype: torch.dtype) -> float:
    if rtol is None:
        return torch.finfo(dtype).eps ** 0.5
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must lie in (0, 1), got {rtol}")
    return float(rtol)


def hessian_vector_products(loss: ParamLoss, params: Mapping[str, torch.Tensor], vectors: torch.Tensor,
                            chunk_size: int = 64) -> torch.Tensor:
    """``H v`` for every row ``v`` of ``vectors`` (``k × P``, parameters flattened in the order of
    ``params``) by forward-over-reverse differentiation, ``jvp(∇L, θ; v)``; no Hessian is formed.

    >>> import torch
    >>> loss = lambda p: (p["a"] ** 2 * p["b"]).sum()
    >>> hessian_vector_products(loss, {"a": torch.tensor([1.0]), "b": torch.tensor([2.0])}, torch.eye(2))
    tensor([[4., 2.],
            [2., 0.]])
    """
    objective = _Objective(loss, params, chunk_size)
    if vectors.dim() != 2 or vectors.shape[1] != objective.flat.size:
        raise ValueError(f"vectors: expected shape (k, {objective.flat.size}), got {tuple(vectors.shape)}")
    return objective.hvp(vectors)


# -- null space ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NullSpace:
    """The numerical null space of ``H``: eigenvalues with ``|λ| ≤ rtol·‖H‖`` count as zero.

    ``smallest_kept`` and ``largest_dropped`` are ``|λ|/‖H‖`` on either side of the threshold (for the
    randomized method, bounds that include the posterior error ``2δ``); ``most_negative`` is the
    smallest ``λ/‖H‖`` (below ``−rtol``: not a minimum); ``error_bound`` is ``2δ/‖H‖`` (0 for dense).
    """

    method: str
    n_params: int
    rank: int
    rtol: float
    norm: float
    smallest_kept: float
    largest_dropped: float
    most_negative: float
    error_bound: float
    hvps: int

    @property
    def dimension(self) -> int:
        return self.n_params - self.rank

    @property
    def gap(self) -> float:
        """``smallest_kept / largest_dropped``: how clearly the threshold separates the spectrum."""
        return self.smallest_kept / self.largest_dropped if self.largest_dropped > 0 else math.inf

    @property
    def certified(self) -> bool:
        """Every eigenvalue is on its side of the threshold (randomized: with the posterior error)."""
        return self.smallest_kept > self.rtol >= self.largest_dropped

    def __str__(self) -> str:
        return (f"dim ker H = {self.dimension} of P = {self.n_params} ({self.method}, rank {self.rank}, "
                f"‖H‖ = {self.norm:.3g}); |λ|/‖H‖: kept ≥ {self.smallest_kept:.2e}, dropped ≤ "
                f"{self.largest_dropped:.2e}, threshold {self.rtol:.1e}, gap {self.gap:.2e}; λ_min/‖H‖ = "
                f"{self.most_negative:.1e}")


def _spectrum(method: str, n_params: int, eigenvalues: torch.Tensor, rtol: float, error: float,
              hvps: int) -> NullSpace:
    """The :class:`NullSpace` of eigenvalues (Ritz values) known up to ``±error`` (absolute)."""
    norm = float(eigenvalues.abs().max()) if eigenvalues.numel() else 0.0
    if norm == 0.0:
        return NullSpace(method, n_params, 0, rtol, 0.0, math.inf, 0.0, 0.0, 0.0, hvps)
    magnitude = eigenvalues.abs() / norm
    kept = magnitude > rtol
    bound = error / norm
    dropped = magnitude[~kept]
    return NullSpace(method, n_params, int(kept.sum()), rtol, norm,
                     float(magnitude[kept].min()) - bound if kept.any() else math.inf,
                     (float(dropped.max()) if dropped.numel() else 0.0) + bound,
                     float(eigenvalues.min()) / norm, bound, hvps)


def _dense(objective: _Objective, rtol: float) -> tuple[NullSpace, torch.Tensor]:
    H = objective.dense()
    return _spectrum("dense", objective.flat.size, torch.linalg.eigvalsh(H), rtol, 0.0, objective.hvps), H


def _randomized(objective: _Objective, rtol: float, block: int, max_rank: int, probes: int,
                generator: torch.Generator) -> NullSpace:
    P, theta = objective.flat.size, objective.theta

    def gaussian(k: int) -> torch.Tensor:
        return torch.randn(k, P, generator=generator, dtype=theta.dtype).to(theta.device)

    Y = objective.hvp(gaussian(min(block, P)))  # rows: H ω
    while True:
        Q = torch.linalg.qr(Y.T).Q  # P × k, spans the sampled range of H
        k = Q.shape[1]
        ritz = torch.linalg.eigvalsh((lambda B: (B + B.T) / 2)(Q.T @ objective.hvp(Q.T).T))
        fresh = objective.hvp(gaussian(probes))
        outside = fresh - (fresh @ Q) @ Q.T
        delta = 10 * math.sqrt(2 / math.pi) * float(outside.norm(dim=1).max())
        values = torch.cat([ritz, ritz.new_zeros(1)]) if k < P else ritz  # the P − k implicit zeros
        result = _spectrum("randomized", P, values, rtol, 2 * delta, objective.hvps)
        if k >= P or (result.rank < k and result.certified):
            return result
        if k >= max_rank:
            raise ValueError(f"hessian_null_space: rank of H not resolved with max_rank={max_rank} ({result.rank} Ritz "
                             f"values above the threshold, posterior error 2δ/‖H‖ = {result.error_bound:.1e}); raise "
                             "max_rank or use method='dense'")
        extra = max(min(2 * k, max_rank, P) - k - probes, 0)
        Y = torch.cat([Y, fresh, objective.hvp(gaussian(extra))])


def _check_options(method: str, block: int, max_rank: int, probes: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, value in (("block", block), ("max_rank", max_rank), ("probes", probes)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _null_space(objective: _Objective, method: str, rtol: float, block: int, max_rank: int, probes: int,
                generator: torch.Generator) -> tuple[NullSpace, torch.Tensor | None]:
    """The null space, and the dense ``H`` when it was formed."""
    if method == "dense" or (method == "auto" and objective.flat.size <= DENSE_LIMIT):
        return _dense(objective, rtol)
    return _randomized(objective, rtol, block, max_rank, probes, generator), None


def hessian_null_space(loss: Callable, params: Mapping[str, torch.Tensor], method: str = "auto",
                       rtol: float | None = None, block: int = 64, max_rank: int = 2048, probes: int = 10,
                       seed: int = 0) -> NullSpace:
    """Dimension of ``ker ∇²L`` at ``params`` (see the module docstring for both methods).

    ``loss`` maps ``{name: tensor}`` to a scalar; ``block`` is the first range-finder size (doubled
    until resolved, at most ``max_rank``), ``probes`` the number of posterior probes.

    >>> import torch
    >>> loss = lambda p: ((p["u"] * p["v"] - 1.0) ** 2).sum()      # zero on the hyperbola uv = 1
    >>> ns = hessian_null_space(loss, {"u": torch.tensor([2.0]), "v": torch.tensor([0.5])})
    >>> ns.dimension, ns.rank, ns.certified
    (1, 1, True)
    """
    _check_options(method, block, max_rank, probes)
    objective = _Objective(loss, params)
    return _null_space(objective, method, _rtol(rtol, objective.theta.dtype), block, max_rank, probes,
                       torch.Generator().manual_seed(seed))[0]


# -- orbit tangents -----------------------------------------------------------------------------
@dataclass(frozen=True)
class OrbitTangents:
    """Tangent vectors ``t = M·θ`` of the orbit (rows, flattened like the parameters) and their rank.

    ``exact``: the rows span the whole tangent space (all basis elements, or random combinations
    numbering more than the rank, which span it with probability 1). ``skipped``: continuous
    symmetries left out, with the reason.
    """

    vectors: torch.Tensor
    dimension: int
    exact: bool
    symmetries: tuple[str, ...]
    skipped: tuple[str, ...]


def orbit_tangents(symmetries: Sequence[Symmetry], params: Mapping[str, torch.Tensor], max_tangents: int = 4096,
                   seed: int = 0) -> OrbitTangents:
    """Tangents ``M·θ`` of every continuous symmetry at ``params`` and the orbit dimension (their rank).

    ``symmetries``: the ``symmetries`` of an :class:`~symalg.symbolic.derive.Analysis` (anything with ``group``,
    ``label`` and ``tangent(params, M)``). With at most ``k = min(max_tangents, P)`` Lie-algebra generators in all,
    one row per basis element; otherwise ``k`` random combinations over all symmetries at once (Gaussian
    coefficients on the basis): they span the tangent space with probability 1 when ``k`` exceeds its
    dimension, in particular when ``k = P``. Actions that move buffers are skipped (the loss is invariant
    only when the buffers move too).

    >>> import symalg.numeric.sampling, torch
    >>> analysis = symalg.derive("linear(3, 4, bias=False) -> identity -> linear(4, 2, bias=False)")
    >>> params = symalg.numeric.sampling.random_params(analysis.architecture, torch.Generator().manual_seed(0))
    >>> orbit_tangents(analysis.symmetries, params).dimension      # 4² − (4 − 3)(4 − 2)
    14
    """
    if not isinstance(max_tangents, int) or max_tangents < 1:
        raise ValueError(f"max_tangents must be a positive integer, got {max_tangents!r}")
    flat = _Flat(params)
    reference = next(iter(params.values()))
    dtype, device = reference.dtype, reference.device
    params = {k: v.detach() for k, v in params.items()}
    used: list[Symmetry] = []
    skipped: list[str] = []
    for symmetry in symmetries:
        if not symmetry.group.is_continuous:
            continue
        if getattr(symmetry, "acts_on_buffers", False):
            skipped.append(f"{symmetry.label}: moves buffers")
        else:
            used.append(symmetry)
    total = sum(int(s.group.dim) for s in used)
    count = min(max_tangents, flat.size)  # the rank is at most P: P random combinations span the tangent space
    if total <= count:
        rows = [flat.flatten(s.tangent(params, M), reference)
                for s in used for M in s.group.algebra_basis(dtype, device)]
    else:
        generator = torch.Generator().manual_seed(seed)
        rows = [sum((flat.flatten(s.tangent(params, s.group.gaussian_algebra_element(generator, dtype, device)),
                                  reference)
                     for s in used), reference.new_zeros(flat.size)) for _ in range(count)]
    vectors = torch.stack(rows) if rows else reference.new_zeros(0, flat.size)
    rank = int(torch.linalg.matrix_rank(vectors)) if rows else 0
    exact = total <= count or rank < count or count == flat.size
    return OrbitTangents(vectors, rank, exact, tuple(s.label for s in used), tuple(skipped))


# -- losses, minima -----------------------------------------------------------------------------
def _loss_of(output: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "mse":
        return 0.5 * ((output - y) ** 2).reshape(output.shape[0], -1).sum(-1).mean()
    return nn.functional.cross_entropy(output, y)


def _check_loss(loss: str) -> None:
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")


def _first_tensor(output: Any) -> torch.Tensor:
    while isinstance(output, (tuple, list)):
        output = output[0]
    return output


def _module_forward(module: nn.Module, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> Forward:
    """``f(params, x)``: ``module`` run on ``params`` by ``functional_call``, its buffers cast to ``dtype``."""
    buffers = {k: v.to(device=device, dtype=dtype) if torch.is_floating_point(v) and dtype is not None else v
               for k, v in module.named_buffers()}
    return lambda params, x: _first_tensor(functional_call(module, {**buffers, **params}, (x,)))


def model_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str = "mse") -> ParamLoss:
    """``L(params)`` of ``model`` on the data ``(x, y)`` (buffers as in the model).

    ``mse``: ``½ mean_i ‖f(x_i) − y_i‖²`` (as :func:`symalg.numeric.sampling.mse_loss`); ``cross_entropy``: the mean
    of ``−log softmax(f(x_i))_{y_i}``.

    >>> import torch
    >>> layer = torch.nn.Linear(2, 1, bias=False)
    >>> loss = model_loss(layer, torch.ones(3, 2), torch.zeros(3, 1))
    >>> float(loss({"weight": torch.tensor([[1.0, 2.0]])}))                # ½ (1 + 2)²
    4.5
    """
    _check_loss(loss)
    forward = _module_forward(model)
    return lambda params: _loss_of(forward(params, x), y, loss)


def linear_teacher_minimum(n: int, h: int, m: int, samples: int, seed: int = 0,
                           dtype: torch.dtype = torch.float64) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    """A zero-loss minimum of the two-layer linear network ``f(x) = U V x`` for a teacher ``A``.

    The model is ``nn.Sequential(Linear(n, h), Identity(), Linear(h, m))`` without biases, ``V`` =
    ``0.weight`` (``h × n``), ``U`` = ``2.weight`` (``m × h``). The teacher ``A = B C`` has the network's
    generic rank ``r = min(n, h, m)`` (``B ∈ R^{m×r}``, ``C ∈ R^{r×n}`` Gaussian); ``V = G [C; D]`` with
    Gaussian ``G``, ``D``, so ``row(A) ⊆ row(V)``, and ``U = A V⁺``, so ``U V = A`` (up to rounding).
    The data are ``samples`` Gaussian inputs (rows) and ``y = x Aᵀ``: with ``samples ≥ n`` they span
    ``R^n`` and the zero-loss set is exactly ``{U V = A}``.

    >>> model, x, y = linear_teacher_minimum(3, 5, 2, samples=6)
    >>> bool((model(x) - y).abs().max() < 1e-12), tuple(model[0].weight.shape), tuple(model[2].weight.shape)
    (True, (5, 3), (2, 5))
    """
    for name, value in (("n", n), ("h", h), ("m", m), ("samples", samples)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    generator = torch.Generator().manual_seed(seed)

    def gaussian(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype)

    r = min(n, h, m)
    C = gaussian(r, n)
    A = gaussian(m, r) @ C / math.sqrt(r)
    V = gaussian(h, h) @ torch.cat([C, gaussian(h - r, n)]) / math.sqrt(h * n)
    U = A @ torch.linalg.pinv(V)
    first, last = nn.Linear(n, h, bias=False), nn.Linear(h, m, bias=False)
    model = nn.Sequential(first, nn.Identity(), last).to(dtype)
    with torch.no_grad():
        first.weight.copy_(V)
        last.weight.copy_(U)
    x = gaussian(samples, n)
    return model, x, x @ A.T


@dataclass(frozen=True)
class TrainingRun:
    """A model trained by :func:`train_to_minimum` (a float64 copy), its final loss and ``‖∇L‖``, the
    L-BFGS iterations and the Newton steps taken."""

    model: nn.Module
    loss: float
    gradient_norm: float
    iterations: int
    newton_steps: int
    seconds: float


NEWTON_CUTOFF = 1e-10
"""Newton steps skip eigen-directions of ``H`` with ``|λ| ≤ NEWTON_CUTOFF·‖H‖`` (the flat ones)."""


def _newton_step(objective: _Objective, loss: ParamLoss) -> _Objective | None:
    """``θ − t H⁺∇L`` (pseudo-inverse over ``|λ| > NEWTON_CUTOFF·‖H‖``), ``t`` halved until ``‖∇L‖``
    decreases; ``None`` when no ``t ≥ 2⁻²⁰`` does."""
    gradient = objective.gradient()
    eigenvalues, vectors = torch.linalg.eigh(objective.dense())
    keep = eigenvalues.abs() > NEWTON_CUTOFF * eigenvalues.abs().max()
    step = vectors[:, keep] @ ((vectors[:, keep].T @ gradient) / eigenvalues[keep])
    for halvings in range(21):
        moved = _Objective(loss, objective.flat.unflatten(objective.theta - step / 2 ** halvings))
        if moved.gradient().norm() < gradient.norm():
            return moved
    return None


def train_to_minimum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str = "mse", max_iter: int = 2000,
                     gtol: float = 1e-11, newton_steps: int = 0, dtype: torch.dtype = torch.float64) -> TrainingRun:
    """Full-batch L-BFGS (strong Wolfe line search) on a ``dtype`` copy of ``model`` until
    ``max |∂L/∂θ| ≤ gtol`` or ``max_iter`` iterations, then up to ``newton_steps`` pseudo-inverse
    Newton steps (dense Hessian, :data:`NEWTON_CUTOFF`) while ``‖∇L‖ > gtol``; the input model is left
    untouched. L-BFGS's line search stalls once loss differences reach rounding (``‖∇L‖ ≈ 1e-8`` is
    typical); Newton steps then converge quadratically near a minimum whose flat directions form a
    manifold, but from farther away they may head for a saddle (check the report's ``most_negative``).

    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(20, 3, generator=g, dtype=torch.float64)
    >>> y = torch.randn(20, 1, generator=g, dtype=torch.float64)
    >>> run = train_to_minimum(torch.nn.Linear(3, 1), x, y, gtol=1e-14, newton_steps=2)   # least squares
    >>> run.gradient_norm < 1e-13
    True
    """
    _check_loss(loss)
    if not isinstance(newton_steps, int) or newton_steps < 0:
        raise ValueError(f"newton_steps must be a non-negative integer, got {newton_steps!r}")
    start = time.perf_counter()
    trained = copy.deepcopy(model).to(dtype)
    x = x.to(dtype) if torch.is_floating_point(x) else x
    y = y.to(dtype) if loss == "mse" else y
    optimizer = torch.optim.LBFGS(trained.parameters(), lr=1, max_iter=max_iter, tolerance_grad=gtol,
                                  tolerance_change=0, history_size=100, line_search_fn="strong_wolfe")
    objective_of = model_loss(trained, x, y, loss)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        value = objective_of(dict(trained.named_parameters()))
        value.backward()
        return value

    optimizer.step(closure)
    iterations = int(optimizer.state[next(iter(trained.parameters()))].get("n_iter", 0))
    objective = _Objective(objective_of, {k: v.detach() for k, v in trained.named_parameters()})
    steps = 0
    while steps < newton_steps and objective.gradient().norm() > gtol:
        moved = _newton_step(objective, objective_of)
        if moved is None:
            break
        objective, steps = moved, steps + 1
    with torch.no_grad():
        for name, value in objective.flat.unflatten(objective.theta).items():
            trained.get_parameter(name).copy_(value)
    return TrainingRun(trained, objective.value(), float(objective.gradient().norm()), iterations, steps,
                       time.perf_counter() - start)


# -- the comparison -----------------------------------------------------------------------------
@dataclass(frozen=True)
class FlatMinimumReport:
    """Hessian null space against orbit dimension at one point (see :func:`flat_minimum`).

    ``tangent_residual`` is ``max_t ‖H t‖ / (‖H‖ ‖t‖)`` over the orbit tangents; ``outputs`` is
    ``N·d_out`` for ``mse`` (``None`` otherwise); ``blocked`` lists what symalg could not claim; ``hvps``
    counts the Hessian-vector products of the null space and the tangent check together.
    """

    label: str
    loss: float
    loss_kind: str
    gradient_norm: float
    orbit: OrbitTangents
    null_space: NullSpace
    tangent_residual: float
    outputs: int | None
    blocked: tuple[object, ...]
    hvps: int
    seconds: float

    @property
    def n_params(self) -> int:
        return self.null_space.n_params

    @property
    def orbit_dimension(self) -> int:
        return self.orbit.dimension

    @property
    def null_dimension(self) -> int:
        return self.null_space.dimension

    @property
    def excess(self) -> int:
        """``dim ker H − orbit dimension``: flat directions the claimed symmetries do not explain."""
        return self.null_dimension - self.orbit_dimension

    @property
    def tangents_in_null_space(self) -> bool:
        return self.tangent_residual <= self.null_space.rtol

    @property
    def passed(self) -> bool:
        """The orbit's tangents lie in ``ker H`` and ``dim ker H ≥`` orbit dimension."""
        return self.tangents_in_null_space and self.excess >= 0

    @property
    def explanation(self) -> str:
        """Why ``dim ker H`` and the orbit dimension differ (or that they agree)."""
        if not self.tangents_in_null_space:
            return (f"orbit tangents are not in ker H (max ‖Ht‖/(‖H‖‖t‖) = {self.tangent_residual:.1e} > "
                    f"{self.null_space.rtol:.1e}): not a critical point (‖∇L‖ = {self.gradient_norm:.1e}; H t = "
                    "−𝔐ᵀ∇L), or a claimed symmetry that is not one")
        if self.excess < 0:
            return ("fewer null directions than the orbit dimension: the threshold rtol cuts through the orbit's "
                    "spectrum")
        if self.excess == 0:
            return "ker H is exactly the orbit's tangent space: no flat direction beyond the symmetries"
        zero_loss = self.loss_kind == "mse" and self.loss <= self.null_space.rtol ** 2
        if zero_loss and self.outputs is not None and self.n_params - self.outputs > self.orbit_dimension:
            return (f"excess {self.excess} forced by the data: at zero loss H = JᵀJ/N with rank ≤ N·d_out = "
                    f"{self.outputs}, so dim ker H ≥ {self.n_params - self.outputs} > orbit dimension")
        blocked = f"; blocked: {', '.join(str(b) for b in self.blocked)}" if self.blocked else ""
        return (f"excess {self.excess}: flat directions no claimed symmetry generates (a linear bottleneck, a "
                f"neuron acting linearly on the data, dead or duplicated neurons, rank-deficient weights, or an "
                f"unclaimed symmetry{blocked})")

    def __str__(self) -> str:
        orbit = f"{self.orbit_dimension}" + ("" if self.orbit.exact else " (lower bound)")
        lines = [f"{self.label}: P = {self.n_params}, orbit dimension {orbit}, dim ker H = {self.null_dimension} "
                 f"(excess {self.excess})",
                 f"  point: {self.loss_kind} loss {self.loss:.3e}, ‖∇L‖ = {self.gradient_norm:.2e}",
                 f"  Hessian: {self.null_space}",
                 f"  tangents: {self.orbit.vectors.shape[0]} from {', '.join(self.orbit.symmetries) or 'none'}; "
                 f"max ‖Ht‖/(‖H‖‖t‖) = {self.tangent_residual:.2e} ({self.hvps} Hessian-vector products in all)",
                 f"  {self.explanation}",
                 f"  {'passed' if self.passed else 'FAILED'} in {self.seconds:.2f} s"]
        if self.orbit.skipped:
            lines.insert(4, f"  skipped: {'; '.join(self.orbit.skipped)}")
        return "\n".join(lines)


def _resolve(model: nn.Module | Analysis, x: torch.Tensor, loss: str | None, params: Mapping[str, torch.Tensor] | None,
             dtype: torch.dtype, device: torch.device | str
             ) -> tuple[Analysis, Forward, str, Mapping[str, torch.Tensor], str]:
    """The analysis, a forward ``f(params, x)``, the loss kind, the parameters and a label for ``model``.

    One path for every front end: an ``nn.Module`` is traced and derived; an :class:`Analysis` runs its graph's
    module (a traced model, or the module a spec generates at concrete widths). Symbolic widths are read off
    ``params`` first (:meth:`Analysis.at_widths_of`).
    """
    if isinstance(model, nn.Module):
        first = next(model.parameters(), None)
        example = x.to(first.dtype) if first is not None and torch.is_floating_point(x) else x
        model = derive(trace(model, (example,)), loss=loss or "mse")
    if not isinstance(model, Analysis):
        raise TypeError(f"flat_minimum: model must be an nn.Module or an Analysis, got {type(model).__name__}")
    if model.widths:
        if params is None:
            raise SpecError(f"flat_minimum: widths {sorted(map(str, model.widths))} are symbolic; pass params (their "
                            "shapes give the widths) or use analysis.subs(...)")
        model = model.at_widths_of(params)
    module = model.model_graph.model
    if module is None:
        raise ValueError("flat_minimum: model: the analysis's graph carries no module to run")
    params = dict(module.named_parameters()) if params is None else params
    label = to_spec_string(model.architecture) if model.architecture is not None else type(module).__name__
    return model, _module_forward(module, dtype, device), loss or model.loss, params, label


def flat_minimum(model: nn.Module | Analysis, x: torch.Tensor, y: torch.Tensor,
                 params: Mapping[str, torch.Tensor] | None = None, *,
                 loss: str | None = None, symmetries: Sequence[Symmetry] | None = None, method: str = "auto",
                 rtol: float | None = None, max_tangents: int = 4096, block: int = 64, max_rank: int = 2048,
                 probes: int = 10, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu",
                 seed: int = 0, label: str | None = None) -> FlatMinimumReport:
    """Compare ``dim ker H`` with the orbit dimension at ``params`` and check ``H t = 0`` for the tangents.

    Parameters
    ----------
    model : an ``nn.Module`` (traced and derived here) or an :class:`~symalg.symbolic.derive.Analysis` of any
        front end (a spec runs its generated module; symbolic widths are read off ``params``).
    x, y : the data (one input tensor, rows as samples); ``loss`` ``"mse"`` or ``"cross_entropy"``
        (default: the analysis's, else ``"mse"``).
    params : ``{name: tensor}``, default the model's own parameters (for a spec, the seeded ones of its
        generated module); required for symbolic widths.
    symmetries : default the analysis's; pass others to test a claimed symmetry.
    method, rtol, block, max_rank, probes : see :func:`hessian_null_space`; ``max_tangents`` and ``seed``:
        see :func:`orbit_tangents`. The tangents are checked with the dense Hessian when it was formed,
        otherwise with one Hessian-vector product each.
    dtype, device : where everything is computed (float64 by default).
    """
    start = time.perf_counter()
    _check_options(method, block, max_rank, probes)
    rtol = _rtol(rtol, dtype)
    if loss is not None:
        _check_loss(loss)
    analysis, forward, loss, params, name = _resolve(model, x, loss, params, dtype, device)
    params = {k: v.detach().to(device=device, dtype=dtype) for k, v in params.items()}
    x = x.to(device=device, dtype=dtype) if torch.is_floating_point(x) else x.to(device)
    y = y.to(device=device, dtype=dtype) if loss == "mse" else y.to(device)
    objective = _Objective(lambda values: _loss_of(forward(values, x), y, loss), params)
    null, H = _null_space(objective, method, rtol, block, max_rank, probes, torch.Generator().manual_seed(seed))
    orbit = orbit_tangents(analysis.symmetries if symmetries is None else symmetries, params, max_tangents, seed)
    T = orbit.vectors
    HT = T @ H if H is not None else objective.hvp(T)
    norms = T.norm(dim=1)
    moving = norms > 0
    residual = (float((HT.norm(dim=1)[moving] / (norms[moving] * null.norm)).max())
                if moving.any() and null.norm else 0.0)
    with torch.no_grad():
        outputs = forward(params, x).numel() if loss == "mse" else None
    return FlatMinimumReport(label or name, objective.value(), loss, float(objective.gradient().norm()), orbit, null,
                             residual, outputs, tuple(analysis.blocked), objective.hvps, time.perf_counter() - start)
