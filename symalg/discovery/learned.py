"""Learned symmetry discovery [Zhao2026, ch. 6]: an action network and learnable generators.

A group ``G ⊂ GL(n)`` acts on the parameters through an action network ``a_φ(g, θ, X) → θ'`` (an MLP of
``vec(g − I)``, ``θ`` and, data-dependent, ``X``; residual: ``a_φ = θ + MLP(·)``); ``k`` learnable generators
``h_1, …, h_k ∈ gl(n)``. The infinitesimal action (the fundamental vector field) is
``ξ_h(θ) = D_g a_φ|_{g=I}(h)`` (a ``jvp`` in ``g``). Losses (weights ``γ``):

* invariance ``E |⟨∇_θ ℓ(θ, X), ξ_h(θ)⟩|``; identity ``E ‖a_φ(I, θ, X) − θ‖`` (zero by construction unless
  ``exact_identity=False``, :class:`ActionNetwork`);
* closure, **corrected**: for a left action ``a(g₁g₂, θ) = a(g₁, a(g₂, θ))`` the fundamental fields are an
  anti-homomorphism, ``ξ_{[h₁, h₂]} = −[ξ_{h₁}, ξ_{h₂}]`` with the bracket of vector fields
  ``[X, Y] = DY·X − DX·Y``; the loss is ``E ‖Dξ_{h₂}[ξ_{h₁}] − Dξ_{h₁}[ξ_{h₂}] + ξ_{[h₁, h₂]}‖`` over pairs
  ``i < j`` (two ``jvp`` s in ``θ``). The printed loss ``‖ξ_{h₂} ξ_{h₁} − ½ ξ_{[h₁, h₂]}‖`` multiplies two
  tangent vectors (read entrywise it is not even invariant under a change of coordinates) and drops the
  second-order terms ``Dξ_{h₂}[ξ_{h₁}]`` of the expansion; :func:`printed_closure_loss` shows it penalising a
  true action (``a(g, θ) = gθ`` with ``h₁ = h₂``: printed ``‖(hθ)⊙(hθ)‖ > 0``, corrected ``0``);
* non-triviality ``E |β − ‖ξ_h(θ)‖|``; orthogonality ``Σ_{i<j} |cos(h_i, h_j)|``; sparsity ``Σ |h_kj|``.

Defaults are the papers' data-independent setting: ``γ_inv = 10``, ``γ_id = γ_reg = γ_orth = 1``,
``γ_sparse = 0.1``, learning rate ``1e-3`` decayed ``× 0.6`` every 1000 steps, MLP hidden ``64-64-64``; the
closure weight (not given) is ``1`` and ``β`` (not given) ``1``.

>>> import torch
>>> theta, h = torch.tensor([1.0, 2.0]), torch.tensor([[0.0, 1.0], [0.0, 0.0]])
>>> linear = lambda g, th: g @ th                        # a(g, θ) = gθ: a true left action
>>> round(printed_closure_loss(linear, theta, h, h), 3), round(float(closure_loss(linear, theta, h, h)), 3)
(4.0, 0.0)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["LearnedConfig", "ActionNetwork", "LearnedDiscovery", "learn", "closure_loss", "printed_closure_loss",
           "fundamental_field"]

Action = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``a(g, θ)`` for one ``θ`` (``(P,)``) and one ``g`` (``(n, n)``); data closed over."""


def fundamental_field(action: Action, theta: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``ξ_h(θ) = D_g a(g, θ)|_{g=I}(h)``."""
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    return torch.func.jvp(lambda g: action(g, theta), (eye,), (h,))[1]


def closure_loss(action: Action, theta: torch.Tensor, h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    """``‖Dξ_{h₂}(θ)[ξ_{h₁}(θ)] − Dξ_{h₁}(θ)[ξ_{h₂}(θ)] + ξ_{[h₁, h₂]}(θ)‖``: zero for every left action
    (module docstring). Returns a tensor (differentiable in the action's parameters)."""
    x1, x2 = fundamental_field(action, theta, h1), fundamental_field(action, theta, h2)
    d2_x1 = torch.func.jvp(lambda th: fundamental_field(action, th, h2), (theta,), (x1,))[1]
    d1_x2 = torch.func.jvp(lambda th: fundamental_field(action, th, h1), (theta,), (x2,))[1]
    commutator = h1 @ h2 - h2 @ h1
    return torch.linalg.norm(d2_x1 - d1_x2 + fundamental_field(action, theta, commutator))


def printed_closure_loss(action: Action, theta: torch.Tensor, h1: torch.Tensor, h2: torch.Tensor) -> float:
    """The paper's printed loss ``‖ξ_{h₂} ξ_{h₁} − ½ ξ_{[h₁, h₂]}‖``, the product read entrywise (the only reading
    that type-checks for two vectors)."""
    x1, x2 = fundamental_field(action, theta, h1), fundamental_field(action, theta, h2)
    commutator = h1 @ h2 - h2 @ h1
    return float(torch.linalg.norm(x2 * x1 - 0.5 * fundamental_field(action, theta, commutator)))


@dataclass(frozen=True)
class LearnedConfig:
    """Weights and training settings (module docstring); ``data_dependent()`` gives the papers' other setting,
    whose action network also reads the data (``data_input``)."""

    generators: int = 1
    hidden: tuple[int, ...] = (64, 64, 64)
    invariance: float = 10.0
    identity: float = 1.0
    exact_identity: bool = True
    closure: float = 1.0
    nontrivial: float = 1.0
    orthogonal: float = 1.0
    sparse: float = 0.1
    beta: float = 1.0
    lr: float = 1e-3
    decay: float = 0.6
    decay_every: int = 1000
    steps: int = 2000
    batch: int = 32
    data_input: bool = False
    normalise: bool = False
    """Invariance as ``|cos∠(∇ℓ, ξ_h)|`` instead of ``|⟨∇ℓ, ξ_h⟩|``: scale-free, so that samples with a large gradient
    do not dominate and the non-triviality term (which fixes ``‖ξ_h‖ = β``) does not trade against it."""
    finite: float = 0.0
    """Weight of the finite invariance ``|ℓ(a_φ(exp(t h), θ)) − ℓ(θ)| / (|ℓ(θ)| + 1)`` at one ``t ~ U[−1, 1]`` per
    sample and generator: what the held-out curves measure, which the first-order terms leave to the network's
    curvature."""

    @classmethod
    def data_dependent(cls, **changes: object) -> "LearnedConfig":
        """``γ_inv = 1``, ``γ_id = γ_reg = 10``, ``γ_orth = 1``, ``γ_sparse = 0.1``, lr ``1e-3``."""
        base = dict(invariance=1.0, identity=10.0, nontrivial=10.0, orthogonal=1.0, sparse=0.1, data_input=True)
        return cls(**{**base, **changes})  # type: ignore[arg-type]


class ActionNetwork(torch.nn.Module):
    """``a_φ(g, θ, X) = θ + MLP([vec(g − I), θ, vec X]) − MLP([0, θ, vec X])`` (``X`` omitted when ``data`` is 0):
    the identity axiom ``a(I, θ, X) = θ`` holds by construction (``exact_identity``; without it the last term is
    dropped and only the identity loss asks for it: after a short training ``a(I, θ)`` is then far enough from
    ``θ`` to hide every held-out invariance figure)."""

    def __init__(self, n: int, parameters: int, data: int, hidden: tuple[int, ...], exact_identity: bool = True,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.exact_identity = exact_identity
        sizes = [n * n + parameters + data, *hidden, parameters]
        layers: list[torch.nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [torch.nn.Linear(a, b, dtype=dtype), torch.nn.Tanh()]
        self.mlp = torch.nn.Sequential(*layers[:-1])
        self.n, self.data = n, data

    def forward(self, g: torch.Tensor, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(self.n, dtype=g.dtype, device=g.device)
        data = x.reshape(-1)[:self.data]
        moved = self.mlp(torch.cat([(g - eye).reshape(-1), theta, data]))
        if self.exact_identity:
            moved = moved - self.mlp(torch.cat([torch.zeros_like(eye).reshape(-1), theta, data]))
        return theta + moved


@dataclass(frozen=True)
class LearnedDiscovery:
    """What :func:`learn` found.

    ``generators`` (``k × n × n``), ``span`` their numerical rank; ``history`` the total loss every 100 steps;
    ``overlap`` the fraction of the learned fields' norm inside the known tangent span at held-out ``θ`` (``None``
    without a known tangent); ``curve_t`` and ``learned_curve``/``random_curve``: the largest held-out relative
    loss change along ``θ(t) = a_φ(exp(t h), θ, X)`` for the learned generators and along ``θ + t r`` for random
    directions ``r`` of the same speed ``‖r‖ = ‖ξ_h(θ)‖``;
    ``learned_error``/``random_error`` their maxima over ``|t| ≤ 1``.
    """

    generators: torch.Tensor
    span: int
    history: tuple[float, ...]
    overlap: float | None
    curve_t: tuple[float, ...]
    learned_curve: tuple[float, ...]
    random_curve: tuple[float, ...]
    network: ActionNetwork = field(repr=False)

    @property
    def learned_error(self) -> float:
        return max(self.learned_curve)

    @property
    def random_error(self) -> float:
        return max(self.random_curve)

    def to_dict(self) -> dict:
        return {"generators": self.generators.tolist(), "span": self.span, "overlap": self.overlap,
                "learned_error": self.learned_error, "random_error": self.random_error,
                "t": list(self.curve_t), "learned_curve": list(self.learned_curve),
                "random_curve": list(self.random_curve), "final_loss": self.history[-1] if self.history else None}

    def latex(self) -> str:
        """The learned generators as LaTeX matrices."""
        def matrix(h: torch.Tensor) -> str:
            rows = [" & ".join(f"{v:.2f}" for v in row) for row in h.tolist()]
            return "\\begin{pmatrix}" + " \\\\ ".join(rows) + "\\end{pmatrix}"
        return ",\\ ".join(f"h_{{{i}}} = {matrix(h)}" for i, h in enumerate(self.generators))


def learn(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], sample: Callable[[torch.Generator],
          tuple[torch.Tensor, torch.Tensor]], n: int, config: LearnedConfig = LearnedConfig(),
          tangent: Callable[[torch.Tensor], torch.Tensor] | None = None, seed: int = 0) -> LearnedDiscovery:
    """Train an action network and ``config.generators`` generators in ``gl(n)`` (module docstring).

    Parameters
    ----------
    loss : ``ℓ(θ, X)`` for one flat parameter vector and one data batch (a scalar).
    sample : ``generator ↦ (θ, X)``: fresh parameters and data (the papers' random samples).
    n : the size of the group's matrices.
    tangent : ``θ ↦`` rows spanning the known tangent space at ``θ`` (e.g. the rows of
        :func:`~symalg.numeric.orbit_rank.action_matrix`), for the overlap.
    """
    rng = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    theta0, x0 = sample(rng)
    net = ActionNetwork(n, theta0.numel(), x0.numel() if config.data_input else 0, config.hidden,
                        config.exact_identity, theta0.dtype)   # initialised in θ's dtype, whatever the default
    h = torch.nn.Parameter(torch.randn(config.generators, n, n, generator=rng, dtype=theta0.dtype) / n)
    optimiser = torch.optim.Adam([*net.parameters(), h], lr=config.lr)
    schedule = torch.optim.lr_scheduler.StepLR(optimiser, config.decay_every, config.decay)
    eye = torch.eye(n, dtype=theta0.dtype)
    history = []
    k = config.generators

    def terms(theta: torch.Tensor, x: torch.Tensor, gens: torch.Tensor) -> torch.Tensor:
        """The per-sample loss terms (invariance, identity, non-triviality, closure), weighted and summed."""
        action: Action = lambda g, th: net(g, th, x)  # noqa: E731
        grad = torch.func.grad(lambda th: loss(th, x))(theta)
        fields = [fundamental_field(action, theta, gens[i]) for i in range(k)]
        if config.normalise:
            scale = [grad.norm() * f.norm() + 1e-12 for f in fields]
            out = config.invariance * sum((grad @ f).abs() / c for f, c in zip(fields, scale))
        else:
            out = config.invariance * sum((grad @ f).abs() for f in fields)
        if config.finite:
            base = loss(theta, x)
            for i in range(k):
                t = 2 * torch.rand((), dtype=theta.dtype) - 1
                moved = net(torch.linalg.matrix_exp(t * gens[i]), theta, x)
                out = out + config.finite * (loss(moved, x) - base).abs() / (base.abs() + 1)
        out = out + config.identity * torch.linalg.norm(net(eye, theta, x) - theta)
        out = out + config.nontrivial * sum((config.beta - torch.linalg.norm(f)).abs() for f in fields)
        for i in range(k):
            for j in range(i + 1, k):
                out = out + config.closure * closure_loss(action, theta, gens[i], gens[j])
        return out

    batched = torch.func.vmap(terms, in_dims=(0, 0, None), randomness="different")
    for step in range(config.steps):
        drawn = [sample(rng) for _ in range(config.batch)]
        thetas, xs = torch.stack([d[0] for d in drawn]), torch.stack([d[1] for d in drawn])
        total = batched(thetas, xs, h).mean()
        flat = h.reshape(config.generators, -1)
        unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
        cos = unit @ unit.T
        total = total + config.orthogonal * cos.triu(1).abs().sum() + config.sparse * flat.abs().sum()
        optimiser.zero_grad()
        total.backward()
        optimiser.step()
        schedule.step()
        if step % 100 == 0 or step == config.steps - 1:
            history.append(float(total.detach()))
    return _evaluate(loss, sample, net, h.detach(), tangent, history, rng)


def _evaluate(loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
              sample: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]], net: ActionNetwork,
              h: torch.Tensor, tangent: Callable[[torch.Tensor], torch.Tensor] | None, history: list[float],
              rng: torch.Generator, points: int = 8) -> LearnedDiscovery:
    """Span, overlap with the known tangent, and held-out loss change along ``exp(t h)`` vs random ``h``."""
    span = int(torch.linalg.matrix_rank(h.reshape(h.shape[0], -1), rtol=1e-6)) if h.numel() else 0
    ts = tuple(float(t) for t in torch.linspace(-1, 1, 9))
    learned = [0.0] * len(ts)
    randoms = [0.0] * len(ts)
    overlaps = []
    for _ in range(points):
        theta, x = sample(rng)
        base = loss(theta, x).detach()
        scale = max(float(base.abs()), 1e-12)
        fields = torch.stack([fundamental_field(lambda g, th: net(g, th, x), theta, g) for g in h]).detach()
        with torch.no_grad():
            for k, t in enumerate(ts):
                for g, f in zip(h, fields):   # the learned curve, and a random direction of the same speed
                    moved = net(torch.linalg.matrix_exp(t * g), theta, x)
                    learned[k] = max(learned[k], float((loss(moved, x) - base).abs()) / scale)
                    r = torch.randn(theta.shape, generator=rng, dtype=theta.dtype)
                    r = r * f.norm() / r.norm()
                    randoms[k] = max(randoms[k], float((loss(theta + t * r, x) - base).abs()) / scale)
        if tangent is not None:
            basis = tangent(theta)
            if basis.numel():
                q = torch.linalg.qr(basis.T).Q
                inside = (fields @ q) @ q.T
                overlaps.append(float(inside.norm() / fields.norm().clamp_min(1e-300)))
            else:
                overlaps.append(0.0)
    overlap = sum(overlaps) / len(overlaps) if overlaps else None
    return LearnedDiscovery(h, span, tuple(history), overlap, ts, tuple(learned), tuple(randoms), net)


def two_layer_linear(m: int, hidden: int, n: int, data: int = 1) -> tuple[
        Callable[[torch.Tensor, torch.Tensor], torch.Tensor], Callable[[torch.Generator], tuple[torch.Tensor,
                                                                                              torch.Tensor]],
        Callable[[torch.Tensor], torch.Tensor]]:
    """The papers' two-layer linear network ``ℓ = ‖Y − U V X‖²``, ``U ∈ R^{m×h}``, ``V ∈ R^{h×n}``, ``X ∈
    R^{n×data}`` (columns as samples), ``θ = (vec U, vec V)``; returns ``(loss, sample, known tangent)``, the known
    tangent ``M ↦ (−U M, M V)`` over the matrix units of ``gl(h)``."""
    def split(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return theta[:m * hidden].reshape(m, hidden), theta[m * hidden:].reshape(hidden, n)

    def loss(theta: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
        U, V = split(theta)
        X, Y = xy[:n], xy[n:]
        return ((Y - U @ V @ X) ** 2).sum()

    def sample(rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        theta = torch.randn(m * hidden + hidden * n, generator=rng, dtype=torch.float64)
        xy = torch.randn(n + m, data, generator=rng, dtype=torch.float64)
        return theta, xy

    def tangent(theta: torch.Tensor) -> torch.Tensor:
        U, V = split(theta)
        rows = []
        for i in range(hidden):
            for j in range(hidden):
                M = torch.zeros(hidden, hidden, dtype=theta.dtype)
                M[i, j] = 1.0
                rows.append(torch.cat([(-U @ M).reshape(-1), (M @ V).reshape(-1)]))
        return torch.stack(rows)

    return loss, sample, tangent

