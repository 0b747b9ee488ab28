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
* non-triviality ``E |β − ‖ξ_h(θ)‖|``; orthogonality ``Σ_{i<j} |cos(h_i, h_j)|``, **corrected** (the printed signed
  sum is minimised by anti-aligned generators, :func:`generator_regularisers`); sparsity ``Σ |h_kj|``.

Defaults are the papers' data-independent setting: ``γ_inv = 10``, ``γ_id = γ_reg = γ_orth = 1``,
``γ_sparse = 0.1``, learning rate ``1e-3`` decayed ``× 0.6`` every 1000 steps, MLP hidden ``64-64-64``; the
closure weight (not given) is ``1`` and ``β`` (not given) ``1``. :func:`training_loss` evaluates all of it for a
batch in closed form (:meth:`ActionNetwork.jets`); :func:`reference_training_loss` is the same sum written with
per-sample ``jvp`` s, the definition it is tested against.

>>> import torch
>>> theta, h = torch.tensor([1.0, 2.0]), torch.tensor([[0.0, 1.0], [0.0, 0.0]])
>>> linear = lambda g, th: g @ th                        # a(g, θ) = gθ: a true left action
>>> round(printed_closure_loss(linear, theta, h, h), 3), round(float(closure_loss(linear, theta, h, h)), 3)
(4.0, 0.0)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, cast

import torch

__all__ = ["LearnedConfig", "ActionNetwork", "LearnedDiscovery", "learn", "training_loss", "reference_training_loss",
           "fraction_inside", "closure_loss", "generator_regularisers", "printed_closure_loss", "fundamental_field"]

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
    ``θ`` to hide every held-out invariance figure). ``g``, ``θ`` and ``X`` may carry the same leading batch
    dimensions (``g``: ``(…, n, n)``, ``θ``: ``(…, P)``, ``X``: ``(…, *shape)``)."""

    def __init__(self, n: int, parameters: int, data: int, hidden: tuple[int, ...], exact_identity: bool = True,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.exact_identity = exact_identity
        sizes = [n * n + parameters + data, *hidden, parameters]
        self.linears = torch.nn.ModuleList(torch.nn.Linear(a, b, dtype=dtype) for a, b in zip(sizes[:-1], sizes[1:]))
        self.n, self.data = n, data

    def mlp(self, u: torch.Tensor) -> torch.Tensor:
        """The MLP: linear layers with ``tanh`` between them."""
        for i, linear in enumerate(self.linears):
            u = linear(torch.tanh(u) if i else u)
        return u

    def _inputs(self, g: torch.Tensor, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        eye = torch.eye(self.n, dtype=g.dtype, device=g.device)
        data = x.reshape(*theta.shape[:-1], -1)[..., :self.data]
        return torch.cat([(g - eye).flatten(-2), theta, data], -1)

    def forward(self, g: torch.Tensor, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        moved = self.mlp(self._inputs(g, theta, x))
        if self.exact_identity:
            eye = torch.eye(self.n, dtype=g.dtype, device=g.device).expand_as(g)
            moved = moved - self.mlp(self._inputs(eye, theta, x))
        return theta + moved

    def jets(self, theta: torch.Tensor, x: torch.Tensor, hs: torch.Tensor, second: int = 0) -> tuple[
            torch.Tensor, torch.Tensor | None]:
        """Fundamental fields and their derivatives along each other, in closed form for a batch.

        ``θ``: ``(B, P)``, ``X``: ``(B, …)``, ``hs``: ``(D, n, n)``. Returns ``fields[b, d] = ξ_{h_d}(θ_b)``
        (``(B, D, P)``) and, for the first ``second`` matrices, ``mixed[b, i, j] = Dξ_{h_i}(θ_b)[ξ_{h_j}(θ_b)]``
        (``(B, s, s, P)``; ``None`` when ``second = 0``). Forward-mode by hand through the MLP at
        ``u₀ = [0, θ, X]``: a linear layer maps value and tangents alike; ``tanh`` maps the tangents
        ``ż ↦ σ'ż`` and the mixed one ``z̈ ↦ σ''ż_d ż_e + σ'z̈`` (``σ' = 1 − a²``, ``σ'' = −2aσ'``). Equal to
        :func:`fundamental_field` and the two ``jvp`` s of :func:`closure_loss` (tested), without ``functorch``
        transforms per sample.
        """
        first, *rest = cast(list[torch.nn.Linear], list(self.linears))
        square = self.n * self.n
        z = first(self._inputs(torch.eye(self.n, dtype=theta.dtype).expand(*theta.shape[:-1], -1, -1), theta, x))
        zd = (hs.reshape(hs.shape[0], square) @ first.weight[:, :square].T).expand(theta.shape[0], -1, -1)
        slopes = []
        for linear in rest:
            a = torch.tanh(z)
            s1 = 1 - a * a
            slopes.append((s1, -2 * a * s1, zd[:, :second]))
            z, zd = linear(a), (s1[:, None] * zd) @ linear.weight.T
        if not second:
            return zd, None
        ze = zd[:, :second] @ first.weight[:, square:square + theta.shape[-1]].T
        zde = torch.zeros(*ze.shape[:2], *ze.shape[1:], dtype=ze.dtype)
        for (s1, s2, zd_i), linear in zip(slopes, rest):
            zde = (s2[:, None, None] * zd_i[:, :, None] * ze[:, None] + s1[:, None, None] * zde) @ linear.weight.T
            ze = (s1[:, None] * ze) @ linear.weight.T
        return zd, zde


@dataclass(frozen=True)
class LearnedDiscovery:
    """What :func:`learn` found.

    ``generators`` (``k × n × n``), ``span`` their numerical rank; ``history`` the total loss every 100 steps;
    ``overlap`` the fraction of the learned fields' norm inside the known tangent span at held-out ``θ`` (``None``
    without a known tangent). Curves over ``curve_t`` (``|t| ≤ 1``), each the mean over held-out ``(θ, X)`` and
    generators of the relative loss change ``|ℓ(θ') − ℓ(θ)| / (|ℓ(θ)| + 1)``:

    * ``learned_curve``: along ``θ' = a_φ(exp(t h), θ, X)``;
    * ``random_curve``: along ``θ + t r``, ``r`` random of the same speed ``‖r‖ = ‖ξ_h(θ)‖``;
    * ``distance_curve``: along ``θ + d(t) r̂``, random ``r̂`` at the learned curve's distance
      ``d(t) = ‖θ'(t) − θ‖`` (a curve that moves further than its speed says is not favoured or penalised);
    * ``tangent_curve``: as ``distance_curve`` with ``r̂ ⊥ ∇_θ ℓ(θ, X)``: straight lines already invariant at first
      order, the baseline a curve beats only by following the level set beyond first order.

    ``alignment`` / ``random_alignment``: mean ``|cos∠(∇ℓ, ξ_h)|`` of the learned fields and of the random
    directions; ``stretch``: mean ``d(±1) / ‖ξ_h‖`` (1 for a straight line at the field's speed).
    ``learned_error`` etc. are the curves' maxima over ``t``.
    """

    generators: torch.Tensor
    span: int
    history: tuple[float, ...]
    overlap: float | None
    curve_t: tuple[float, ...]
    learned_curve: tuple[float, ...]
    random_curve: tuple[float, ...]
    distance_curve: tuple[float, ...]
    tangent_curve: tuple[float, ...]
    alignment: float
    random_alignment: float
    stretch: float
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
                "distance_error": max(self.distance_curve), "tangent_error": max(self.tangent_curve),
                "alignment": self.alignment, "random_alignment": self.random_alignment, "stretch": self.stretch,
                "t": list(self.curve_t), "learned_curve": list(self.learned_curve),
                "random_curve": list(self.random_curve), "distance_curve": list(self.distance_curve),
                "tangent_curve": list(self.tangent_curve),
                "final_loss": self.history[-1] if self.history else None}

    def latex(self) -> str:
        """The learned generators as LaTeX matrices."""
        def matrix(h: torch.Tensor) -> str:
            rows = [" & ".join(f"{v:.2f}" for v in row) for row in h.tolist()]
            return "\\begin{pmatrix}" + " \\\\ ".join(rows) + "\\end{pmatrix}"
        return ",\\ ".join(f"h_{{{i}}} = {matrix(h)}" for i, h in enumerate(self.generators))


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Sampler = Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def _draw(sample: Sampler, rng: torch.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    drawn = [sample(rng) for _ in range(count)]
    return torch.stack([d[0] for d in drawn]), torch.stack([d[1] for d in drawn])


def _batched(loss: Loss, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``ℓ`` over leading batch dimensions of ``θ`` (``(…, P)``) and ``X`` (the same ones)."""
    batch = theta.shape[:-1]
    flat = torch.func.vmap(loss)(theta.reshape(-1, theta.shape[-1]), x.reshape(-1, *x.shape[len(batch):]))
    return flat.reshape(batch)


def training_loss(net: ActionNetwork, h: torch.Tensor, loss: Loss, theta: torch.Tensor, x: torch.Tensor,
                  config: "LearnedConfig", t: torch.Tensor | None = None) -> torch.Tensor:
    """The weighted sum of the module docstring's losses on a batch ``θ`` (``(B, P)``), ``X`` (``(B, …)``); ``t``
    (``(B, k)``, default ``U[−1, 1]``) the finite term's times. All generators' fields (and the commutators') come
    from one :meth:`ActionNetwork.jets` pass, the closure's second derivatives from a second."""
    k = h.shape[0]
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)] if config.closure else []
    hs = torch.cat([h, torch.stack([h[i] @ h[j] - h[j] @ h[i] for i, j in pairs])]) if pairs else h
    fields, mixed = net.jets(theta, x, hs, second=k if pairs else 0)
    own = fields[:, :k]
    grad = torch.func.vmap(torch.func.grad(loss))(theta, x)
    inner = (own @ grad[:, :, None])[..., 0].abs()
    if config.normalise:
        inner = inner / (grad.norm(dim=-1, keepdim=True) * own.norm(dim=-1) + 1e-12)
    out = config.invariance * inner.sum(-1) + config.nontrivial * (config.beta - own.norm(dim=-1)).abs().sum(-1)
    if mixed is not None:
        out = out + config.closure * sum((mixed[:, j, i] - mixed[:, i, j] + fields[:, k + p]).norm(dim=-1)
                                         for p, (i, j) in enumerate(pairs))
    if not net.exact_identity:
        eye = torch.eye(h.shape[-1], dtype=h.dtype).expand(theta.shape[0], -1, -1)
        out = out + config.identity * (net(eye, theta, x) - theta).norm(dim=-1)
    if config.finite:
        t = 2 * torch.rand(theta.shape[0], k, dtype=theta.dtype) - 1 if t is None else t
        expand = (theta.shape[0], k)
        xk = x[:, None].expand(*expand, *x.shape[1:])
        moved = net(torch.linalg.matrix_exp(t[..., None, None] * h), theta[:, None].expand(*expand, -1), xk)
        base = _batched(loss, theta, x)[:, None]
        out = out + config.finite * ((_batched(loss, moved, xk) - base).abs() / (base.abs() + 1)).sum(-1)
    return out.mean() + generator_regularisers(h, config)


def generator_regularisers(h: torch.Tensor, config: "LearnedConfig") -> torch.Tensor:
    """The generators' own terms: ``γ_orth Σ_{i<j} |cos(h_i, h_j)| + γ_sparse Σ |h|``.

    The orthogonality term is a **correction** of the printed one ([Zhao2024] eq. 10, [Zhao2026] Sec. 6.5.2): the
    papers print the signed sum ``Σ_{i<j} cos(h_i, h_j)``, which is unbounded below in the pair's angle and is
    minimised (``−1`` per pair) by anti-aligned generators ``h_j = −h_i``, the same one-parameter group; the
    absolute value is minimised (``0``) by orthogonal generators, which is what the papers ask for.

    >>> import torch
    >>> cfg = LearnedConfig(sparse=0.0)
    >>> h = torch.tensor([[[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]])   # orthogonal generators
    >>> float(generator_regularisers(h, cfg)), float(generator_regularisers(torch.stack([h[0], -h[0]]), cfg))
    (0.0, 1.0)
    """
    flat = h.reshape(h.shape[0], -1)
    unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return config.orthogonal * (unit @ unit.T).triu(1).abs().sum() + config.sparse * flat.abs().sum()


def reference_training_loss(net: ActionNetwork, h: torch.Tensor, loss: Loss, theta: torch.Tensor, x: torch.Tensor,
                            config: "LearnedConfig", t: torch.Tensor) -> torch.Tensor:
    """:func:`training_loss` as written in the module docstring: per sample (``vmap``), each field a ``jvp`` in
    ``g`` (:func:`fundamental_field`), each pair's closure two more (:func:`closure_loss`). The definition the closed
    form is tested against, and the baseline of ``benchmarks/bench_learned_discovery.py`` (the earlier training
    step)."""
    k = h.shape[0]
    eye = torch.eye(h.shape[-1], dtype=h.dtype)

    def one(th: torch.Tensor, xb: torch.Tensor, tb: torch.Tensor) -> torch.Tensor:
        action: Action = lambda g, p: net(g, p, xb)  # noqa: E731
        grad = torch.func.grad(lambda p: loss(p, xb))(th)
        base, out = loss(th, xb), torch.zeros((), dtype=th.dtype)
        for i in range(k):
            f = fundamental_field(action, th, h[i])
            inner = (grad @ f).abs()
            out = out + config.invariance * (inner / (grad.norm() * f.norm() + 1e-12) if config.normalise else inner)
            out = out + config.nontrivial * (config.beta - f.norm()).abs()
            if config.finite:
                moved = net(torch.linalg.matrix_exp(tb[i] * h[i]), th, xb)
                out = out + config.finite * (loss(moved, xb) - base).abs() / (base.abs() + 1)
            for j in range(i + 1, k):
                out = out + config.closure * closure_loss(action, th, h[i], h[j])
        return out + config.identity * torch.linalg.norm(net(eye, th, xb) - th)
    return torch.func.vmap(one)(theta, x, t).mean() + generator_regularisers(h, config)


def fraction_inside(fields: torch.Tensor, rows: torch.Tensor, rtol: float = 1e-8) -> float:
    """``‖Π fields‖ / ‖fields‖``, ``Π`` the orthogonal projection onto the span of ``rows`` (``(D, P)``, any rank:
    the span is read off the SVD, singular values above ``rtol · σ_max``; a QR of rank-deficient rows would return
    a basis of the whole space when ``D ≥ P``).

    >>> round(fraction_inside(torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0, 0.0], [2.0, 0.0]])), 6)
    0.6
    """
    if not rows.numel():
        return 0.0
    u, s, _ = torch.linalg.svd(rows.T, full_matrices=False)
    q = u[:, s > rtol * s.max()] if float(s.max()) > 0 else u[:, :0]
    return float(((fields @ q) @ q.T).norm() / fields.norm().clamp_min(1e-300))


def learn(loss: Loss, sample: Sampler, n: int, config: LearnedConfig = LearnedConfig(),
          tangent: Callable[[torch.Tensor], torch.Tensor] | None = None, seed: int = 0,
          points: int = 32) -> LearnedDiscovery:
    """Train an action network and ``config.generators`` generators in ``gl(n)`` (module docstring).

    Parameters
    ----------
    loss : ``ℓ(θ, X)`` for one flat parameter vector and one data batch (a scalar; ``torch.func`` transformable).
    sample : ``generator ↦ (θ, X)``: fresh parameters and data (the papers' random samples).
    n : the size of the group's matrices.
    tangent : ``θ ↦`` rows spanning the known tangent space at ``θ`` (e.g. the rows of
        :func:`~symalg.numeric.orbit_rank.action_matrix`), for the overlap.
    points : held-out ``(θ, X)`` for the evaluation (:class:`LearnedDiscovery`).
    """
    rng = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    theta0, x0 = sample(rng)
    net = ActionNetwork(n, theta0.numel(), x0.numel() if config.data_input else 0, config.hidden,
                        config.exact_identity, theta0.dtype)   # initialised in θ's dtype, whatever the default
    h = torch.nn.Parameter(torch.randn(config.generators, n, n, generator=rng, dtype=theta0.dtype) / n)
    optimiser = torch.optim.Adam([*net.parameters(), h], lr=config.lr)
    schedule = torch.optim.lr_scheduler.StepLR(optimiser, config.decay_every, config.decay)
    history = []
    for step in range(config.steps):
        total = training_loss(net, h, loss, *_draw(sample, rng, config.batch), config)
        optimiser.zero_grad()
        total.backward()
        optimiser.step()
        schedule.step()
        if step % 100 == 0 or step == config.steps - 1:
            history.append(float(total.detach()))
    return _evaluate(loss, sample, net, h.detach(), tangent, history, rng, points)


def _evaluate(loss: Loss, sample: Sampler, net: ActionNetwork, h: torch.Tensor,
              tangent: Callable[[torch.Tensor], torch.Tensor] | None, history: list[float],
              rng: torch.Generator, points: int) -> LearnedDiscovery:
    """Span, overlap with the known tangent, and held-out loss change along ``exp(t h)`` vs the random baselines."""
    span = int(torch.linalg.matrix_rank(h.reshape(h.shape[0], -1), rtol=1e-6)) if h.numel() else 0
    ts = torch.linspace(-1, 1, 9, dtype=h.dtype)
    theta, x = _draw(sample, rng, points)
    k, T = h.shape[0], len(ts)
    with torch.no_grad():
        fields = net.jets(theta, x, h)[0]                                      # (N, k, P)
        grad = torch.func.vmap(torch.func.grad(loss))(theta, x)                # (N, P)
        base = _batched(loss, theta, x)[:, None, None]
        scale = base.abs() + 1
        shape = (points, T, k)
        xs = x[:, None, None].expand(*shape, *x.shape[1:])
        start = theta[:, None, None].expand(*shape, -1)
        moved = net(torch.linalg.matrix_exp(ts[:, None, None, None] * h).expand(points, -1, -1, -1, -1), start, xs)
        distance = (moved - start).norm(dim=-1, keepdim=True) * ts.sign()[:, None, None]
        r = torch.randn(points, 1, k, theta.shape[-1], generator=rng, dtype=h.dtype)
        unit = grad[:, None, None] / grad.norm(dim=-1).clamp_min(1e-300)[:, None, None, None]
        normal = r - (r * unit).sum(-1, keepdim=True) * unit

        def curve(path: torch.Tensor) -> tuple[float, ...]:
            change = (_batched(loss, path, xs) - base).abs() / scale
            return tuple(float(v) for v in change.mean(dim=(0, 2)))
        speed = fields.norm(dim=-1, keepdim=True)[:, None]
        random = curve(start + ts[:, None, None] * speed * r / r.norm(dim=-1, keepdim=True))
        far = curve(start + distance * r / r.norm(dim=-1, keepdim=True))
        flat = curve(start + distance * normal / normal.norm(dim=-1, keepdim=True).clamp_min(1e-300))

        def cosine(v: torch.Tensor) -> float:
            return float(((v @ grad[:, :, None])[..., 0].abs() / (v.norm(dim=-1) * grad.norm(dim=-1, keepdim=True))
                          .clamp_min(1e-300)).mean())
        stretch = float((distance[:, [0, -1]].abs() / speed.clamp_min(1e-300)).mean())
    overlap = None if tangent is None else \
        sum(fraction_inside(fields[i], tangent(theta[i])) for i in range(points)) / points
    return LearnedDiscovery(h, span, tuple(history), overlap, tuple(float(t) for t in ts), curve(moved), random,
                            far, flat, cosine(fields), cosine(r[:, 0]), stretch, net)


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

