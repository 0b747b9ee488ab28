"""Learned discovery: the corrected closure loss against the printed one, and a short training run's report."""
from __future__ import annotations

import json

import pytest
import torch

from symalg.discovery.learned import (ActionNetwork, LearnedConfig, closure_loss, fundamental_field,
                                      generator_regularisers, learn, printed_closure_loss, reference_training_loss,
                                      training_loss, two_layer_linear)


@pytest.fixture(autouse=True)
def one_thread():
    """Small matrices: on a loaded machine two torch threads made a training step 30× slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _pair(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((3,), (3, 3), (3, 3)))


def test_corrected_closure_vanishes_on_true_left_actions_where_the_printed_one_does_not():
    theta, h1, h2 = _pair(0)

    def linear(g, th):
        return g @ th

    def conjugation(g, th):   # a(g, M) = g M g⁻¹ on M ∈ R^{3×3}: nonlinear in g
        return (g @ th.reshape(3, 3) @ torch.linalg.inv(g)).reshape(-1)
    M = torch.randn(9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for action, point in ((linear, theta), (conjugation, M)):
        assert float(closure_loss(action, point, h1, h2)) < 1e-12
        assert float(closure_loss(action, point, h1, h1)) < 1e-12
        assert printed_closure_loss(action, point, h1, h1) > 1e-2      # penalises a true action
        assert printed_closure_loss(action, point, h1, h2) > 1e-2


def test_orthogonality_term_is_minimised_by_orthogonal_generators_where_the_printed_signed_sum_is_not():
    """[Zhao2024] eq. 10 prints ``Σ cos(h_i, h_j)``: anti-aligned generators (one group) score −1 < 0 = orthogonal;
    the corrected ``Σ |cos|`` scores them 1 > 0 and its minimum over the angle is at the right angle."""
    cfg = LearnedConfig(sparse=0.0)
    angles = torch.linspace(0, torch.pi, 181, dtype=torch.float64)
    basis = torch.eye(4, dtype=torch.float64).reshape(4, 2, 2)
    pairs = [torch.stack([basis[1], torch.cos(a) * basis[1] + torch.sin(a) * basis[2]]) for a in angles]
    corrected = torch.stack([generator_regularisers(h, cfg) for h in pairs])
    signed = torch.stack([(h[0] * h[1]).sum() / (h[0].norm() * h[1].norm()) for h in pairs])
    assert float(angles[corrected.argmin()]) == pytest.approx(torch.pi / 2, abs=1e-12)
    assert float(corrected.min()) < 1e-15 and float(corrected[-1]) == pytest.approx(1.0)
    assert float(angles[signed.argmin()]) == pytest.approx(torch.pi) and float(signed.min()) == pytest.approx(-1.0)


def test_corrected_closure_detects_a_right_action():
    theta, h1, h2 = _pair(2)

    def right(g, th):   # a(g₁g₂) = a(g₂)∘a(g₁): not a left action
        return g.T @ th
    commutator = h1 @ h2 - h2 @ h1
    assert float(closure_loss(right, theta, h1, h2)) == pytest.approx(2 * float((commutator.T @ theta).norm()))


def test_short_training_reports_span_overlap_and_curves():
    loss, sample, tangent = two_layer_linear(1, 1, 1)
    config = LearnedConfig(steps=30, hidden=(16, 16), lr=1e-2, batch=8)
    result = learn(loss, sample, 1, config, tangent=tangent)
    assert result.generators.shape == (1, 1, 1) and result.span == 1
    assert len(result.history) == 2 and all(v == v and v < float("inf") for v in result.history)
    assert result.learned_curve[4] == 0.0 and result.curve_t[4] == 0.0     # a(I, θ) = θ by construction
    assert 0.0 <= result.overlap <= 1.0 + 1e-12
    d = json.loads(json.dumps(result.to_dict()))
    assert d["span"] == 1 and len(d["learned_curve"]) == 9
    assert "pmatrix" in result.latex()


def test_data_dependent_defaults_are_the_papers():
    config = LearnedConfig.data_dependent()
    assert (config.invariance, config.identity, config.nontrivial, config.orthogonal, config.sparse) == \
        (1.0, 10.0, 10.0, 1.0, 0.1)
    assert config.data_input and not LearnedConfig().data_input
    default = LearnedConfig()
    assert (default.invariance, default.identity, default.nontrivial, default.orthogonal, default.sparse,
            default.lr, default.decay, default.decay_every, default.hidden) == \
        (10.0, 1.0, 1.0, 1.0, 0.1, 1e-3, 0.6, 1000, (64, 64, 64))



def _scalar_run(**options: object) -> tuple[float, float, float]:
    """Train on ``ℓ = (y − u v x)²`` (seed 0, 150 steps) and return the held-out mean over 64 fresh ``(θ, X)`` of
    ``max_{|t|≤1} |ℓ(θ(t)) − ℓ(θ)| / (|ℓ(θ)| + 1)`` along the learned curve and along a random direction of the same
    speed, and the overlap with the derived tangent ``(−u, v)``."""
    loss, sample, tangent = two_layer_linear(1, 1, 1)
    config = LearnedConfig(steps=150, hidden=(16, 16), lr=1e-2, batch=8, **options)  # type: ignore[arg-type]
    result = learn(loss, sample, 1, config, tangent=tangent, seed=0)
    rng = torch.Generator().manual_seed(123)
    ts = torch.linspace(-1, 1, 9, dtype=torch.float64)
    learned = random = 0.0
    for _ in range(64):
        theta, x = sample(rng)
        base, h = loss(theta, x), result.generators[0]
        speed = fundamental_field(lambda g, th: result.network(g, th, x), theta, h).norm()
        r = torch.randn(theta.shape, generator=rng, dtype=theta.dtype)
        r = r * speed / r.norm()
        with torch.no_grad():
            learned += max(float((loss(result.network(torch.linalg.matrix_exp(t * h), theta, x), x) - base).abs()
                                 / (base.abs() + 1)) for t in ts)
            random += max(float((loss(theta + t * r, x) - base).abs() / (base.abs() + 1)) for t in ts)
    assert result.overlap is not None
    return learned / 64, random / 64, result.overlap


@pytest.mark.parametrize("finite", [0.0, 10.0])
def test_normalised_invariance_beats_random_directions_on_the_scalar_network(finite):
    # measured (seed 0): normalise alone 0.247 vs 0.751 random, overlap 0.98; with finite 10: 0.018 vs 0.038,
    # overlap 0.97. The papers' weights shrink the field (both errors < 1e-3) with overlap 0.81: they fail here
    learned, random, overlap = _scalar_run(normalise=True, finite=finite)
    assert learned < 0.6 * random
    assert overlap > 0.93


def test_the_papers_weights_leave_the_field_misaligned():
    learned, random, overlap = _scalar_run()
    assert overlap < 0.9 and learned < 1e-2 and random < 1e-2     # short, barely aligned fields


@pytest.mark.parametrize("exact_identity", [True, False])
@pytest.mark.parametrize("normalise", [True, False])
def test_batched_training_loss_is_the_per_sample_definition(exact_identity, normalise):
    # the closed-form jets (fields of all generators and commutators at once, the closure's second derivatives by
    # hand through the MLP) against jvp's per sample: same value and same gradient in φ and h
    loss, sample, _ = two_layer_linear(1, 2, 1)
    rng = torch.Generator().manual_seed(4)
    theta, x = (torch.stack(v) for v in zip(*(sample(rng) for _ in range(5))))
    config = LearnedConfig(generators=3, hidden=(8, 8), normalise=normalise, finite=2.0, exact_identity=exact_identity)
    net = ActionNetwork(2, theta.shape[1], 0, config.hidden, exact_identity, torch.float64)
    h = torch.randn(3, 2, 2, generator=rng, dtype=torch.float64).requires_grad_()
    t = 2 * torch.rand(5, 3, generator=rng, dtype=torch.float64) - 1
    values, grads = [], []
    for compute in (training_loss, reference_training_loss):
        value = compute(net, h, loss, theta, x, config, t=t)
        values.append(float(value.detach()))
        grads.append(torch.autograd.grad(value, [h, *net.parameters()]))
    assert values[0] == pytest.approx(values[1], rel=1e-12) and values[0] > 1.0
    for mine, reference in zip(*grads):
        assert torch.allclose(mine, reference, rtol=1e-9, atol=1e-12)


def _linear_two_ratios(seed: int, **options: object) -> tuple[float, float, float]:
    """``W₂ W₁ x`` with ``W₁ 2×1``, ``W₂ 1×2`` (``GL(2)``, three generators, so the closure has three pairs), 150
    steps: the learned curve's held-out error over the random direction of the same speed's and over the random
    direction ⊥ ∇ℓ at the same distance's, and the learned fields' |cos| with ∇ℓ."""
    loss, sample, tangent = two_layer_linear(1, 2, 1)
    config = LearnedConfig(generators=3, steps=150, lr=1e-2, **options)  # type: ignore[arg-type]
    result = learn(loss, sample, 2, config, tangent=tangent, seed=seed)
    return (result.learned_error / result.random_error, result.learned_error / max(result.tangent_curve),
            result.alignment)


def test_options_beat_random_directions_on_the_wider_linear_network_over_seeds():
    # measured (seeds 0-2): learned/random 0.11-0.14, learned/(random ⊥ ∇ℓ, same distance) 0.22-0.40, |cos| ≤ 0.05;
    # the papers' weights 0.87-1.49 of random. The earlier "1.9× worse than random" was the max over 8 held-out
    # samples of |Δℓ|/|ℓ|, dominated by one sample with ℓ ≈ 0 (docs/discovery.md)
    runs = [_linear_two_ratios(seed, normalise=True, finite=10.0) for seed in range(3)]
    assert sum(r[0] for r in runs) / 3 < 0.3 and max(r[0] for r in runs) < 0.5
    assert sum(r[1] for r in runs) / 3 < 0.7      # beyond first order: better than lines tangent to the level set
    assert all(r[2] < 0.15 for r in runs)          # aligned with the level set (random: ≈ 0.4)
    papers = _linear_two_ratios(0)
    assert papers[0] > 0.6 and papers[2] > 0.2    # the papers' weights: no better than random, not aligned


def test_on_one_data_point_the_learned_fields_are_the_data_kernel_and_beat_tangent_lines():
    # W₃ tanh(W₂ tanh(W₁ x₀)) on one point x₀: ℓ is constant along W₁ ↦ W₁ + c vᵀ, v ⊥ x₀ (a symmetry of this loss,
    # not of the network function, so the catalogue derives none). Measured here (seeds 0-2): the learned fields lie
    # ≥ 0.998 in it; the learned curve changes ℓ 0.07-0.11 × as much as a line tangent to the level set, 0.03-0.05 ×
    # a random direction
    x0 = torch.tensor([[0.8, -1.3]], dtype=torch.float64)

    def loss(theta, xy):
        W1, W2, W3 = theta[:4].reshape(2, 2), theta[4:8].reshape(2, 2), theta[8:].reshape(1, 2)
        return ((W3 @ torch.tanh(W2 @ torch.tanh(W1 @ xy[0, :2, None])) - xy[0, 2]) ** 2).sum()

    def sample(rng):
        return (torch.randn(10, generator=rng, dtype=torch.float64),
                torch.cat([x0, torch.randn(1, 1, generator=rng, dtype=torch.float64)], 1))
    v = torch.tensor([1.3, 0.8], dtype=torch.float64)                        # ⊥ x₀
    kernel = torch.zeros(2, 10, dtype=torch.float64)
    kernel[0, :2], kernel[1, 2:4] = v, v                                     # W₁[i] += c v
    config = LearnedConfig.data_dependent(generators=3, steps=150, lr=1e-2, normalise=True, finite=10.0)
    result = learn(loss, sample, 2, config, tangent=lambda theta: kernel, seed=0)
    assert result.overlap > 0.95
    assert result.learned_error < 0.5 * max(result.tangent_curve) and result.learned_error < 0.1 * result.random_error
