"""The approximate action of eq. 3.6 and its bound (Prop. 3.4.1); Props. 3.3.4–3.3.6 as computations."""
from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from symalg.applications import mode_connectivity as mc
from symalg.applications.minima_geometry import homogeneous_segment_loss

F64 = torch.float64
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def leaky(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.leaky_relu(z, 0.1)


def _net(m, h, n, k, seed):
    gen = torch.Generator().manual_seed(seed)
    u, v, x = (torch.randn(*s, generator=gen, dtype=F64) for s in ((m, h), (h, n), (n, k)))
    g = torch.randn(h, h, generator=gen, dtype=F64) / math.sqrt(h)
    return u, v, x, g


@pytest.mark.parametrize("m,h,n,k", [(3, 6, 4, 5), (7, 5, 4, 12), (2, 2, 9, 30), (10, 40, 3, 40), (4, 3, 3, 3)])
def test_action_matches_formula_and_bound(m, h, n, k):
    u, v, x, g = _net(m, h, n, k, seed=m * 100 + k)
    u2, v2 = mc.approximate_action(u, v, g, x, torch.sigmoid)
    s_ga = torch.sigmoid(g @ v @ x)
    assert torch.allclose(u2, u @ torch.sigmoid(v @ x) @ torch.linalg.pinv(s_ga), atol=1e-10)
    assert torch.allclose(v2, g @ v, atol=1e-14)
    F = u @ torch.sigmoid(v @ x)
    projector = torch.linalg.pinv(s_ga) @ s_ga                  # orthogonal: symmetric and idempotent
    assert torch.allclose(projector, projector.mT, atol=1e-9)
    e = mc.action_error(u, v, g, x, torch.sigmoid)
    residual = F @ (torch.eye(k, dtype=F64) - projector)
    assert e.error == pytest.approx(float(torch.linalg.matrix_norm(residual)), rel=1e-6, abs=1e-9)
    assert e.error <= e.bound * (1 + 1e-12)
    spectral_change = torch.linalg.matrix_norm(F - u2 @ torch.sigmoid(v2 @ x), 2)
    assert spectral_change <= torch.linalg.matrix_norm(F, 2) * (1 + 1e-12)
    if k <= h:                                                   # rank σ(gVX) = k: exact on the batch
        assert e.exact and e.error < 1e-9 * e.bound
    else:                                                        # above the width the output really changes
        assert not e.exact and e.error > 1e-3 * e.bound


def test_curve_starts_at_a_projection_below_full_rank():
    u, v, x, _ = _net(5, 8, 4, 3, seed=1)                       # k = 3 < h = 8: unit axiom fails
    C = 0.3 * torch.randn(8, 8, generator=torch.Generator().manual_seed(2), dtype=F64)
    u0, v0 = mc.approximate_curve(u, v, C, x, leaky, 0.0)
    assert torch.equal(v0, v)
    assert float(torch.linalg.matrix_norm(u0 - u)) > 0.1 * float(torch.linalg.matrix_norm(u))
    assert torch.allclose(u0 @ leaky(v0 @ x), u @ leaky(v @ x), atol=1e-10)          # same outputs on the batch
    x_new = torch.randn(4, 20, generator=torch.Generator().manual_seed(3), dtype=F64)
    assert float((u0 @ leaky(v0 @ x_new) - u @ leaky(v @ x_new)).abs().max()) > 1e-3   # not off the batch
    for t in (0.5, 1.0):                                         # and the batch loss stays on the whole curve
        ut, vt = mc.approximate_curve(u, v, C, x, leaky, t)
        assert torch.allclose(ut @ leaky(vt @ x), u @ leaky(v @ x), atol=1e-9)
    u, v, x, _ = _net(5, 4, 6, 10, seed=4)                      # k ≥ h with rank σ(VX) = h: γ(0) = (U, V)
    u0, _ = mc.approximate_curve(u, v, 0.3 * torch.eye(4, dtype=F64), x, leaky, 0.0)
    assert torch.allclose(u0, u, atol=1e-10)


def _prop_334_case(seed):
    gen = torch.Generator().manual_seed(seed)
    w1, w2, f = (torch.randn(*s, generator=gen, dtype=F64) for s in ((4, 3), (2, 4), (3, 6)))
    return w1, w2, f


@pytest.mark.parametrize("degree", [1, 2])
def test_prop_334_permuted_midpoint_grows_like_m_to_2k(degree):
    sigma = leaky if degree == 1 else (lambda z: torch.relu(z) ** 2)
    w1, w2, f = _prop_334_case(seed=degree)
    y = w2 @ sigma(w1 @ f)
    m = 3.0
    losses = mc.permuted_midpoint_losses(w1, w2, f, y, m, sigma)
    assert len(losses) == 24
    c = (0.5 + 0.5 * m ** -degree) * (0.5 + 0.5 * m) ** degree   # P = I: eq. B.5 at α = ½
    assert float(losses[0]) == pytest.approx((1 - c) ** 2 * float((y ** 2).sum()), rel=1e-10)
    eye = torch.eye(4, dtype=F64)
    limit = min(float(((w2 @ eye[list(o)].T @ sigma(w1 @ f)) ** 2).sum())
                for o in itertools.permutations(range(4))) / 2 ** (2 * (degree + 1))
    big = 1e4 if degree == 1 else 1e3
    ratio = float(mc.permuted_midpoint_losses(w1, w2, f, y, big, sigma).min()) / big ** (2 * degree)
    assert ratio == pytest.approx(limit, rel=0.02)
    assert limit > 0.01                                          # the assumption of the proposition holds here


def test_prop_335_lower_bound_and_growth():
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(3, 3, generator=gen, dtype=F64), torch.randn(3, 3, generator=gen, dtype=F64)
    assert mc.orbit_exit_lower_bound(a, b, 1.0) == pytest.approx(0.0, abs=1e-9)
    bounds = []
    for beta in (2.0, 10.0, 50.0):
        lower, numeric = mc.orbit_exit_lower_bound(a, b, beta), mc.orbit_exit_distance(a, b, beta, starts=1)
        assert lower <= numeric * (1 + 1e-9)
        bounds.append(lower)
    assert bounds[2] / bounds[1] == pytest.approx(
        (50 + 1 / 50) / (10 + 1 / 10), rel=0.05)                # linear growth in c = (β + 1/β)/2
    eye = torch.eye(3, dtype=F64)                                # W₁ = W₂ = I: the bound is the distance
    assert mc.orbit_exit_lower_bound(eye, eye, 5.0) == pytest.approx(mc.orbit_exit_distance(eye, eye, 5.0), rel=1e-8)


def test_prop_336_bound_holds_and_is_attained():
    gen = torch.Generator().manual_seed(6)
    w_prev, w_last = torch.randn(5, 3, generator=gen, dtype=F64), torch.randn(2, 5, generator=gen, dtype=F64)
    features = torch.relu(torch.randn(20, 3, generator=gen, dtype=F64) @ w_prev.mT)
    y = features @ w_last.mT
    c = 10.0
    bound = mc.bounded_orbit_barrier(features, w_prev, w_last, y, c, 1.0)
    n_prev, n_last = float(torch.linalg.matrix_norm(w_prev, 2)), float(torch.linalg.matrix_norm(w_last, 2))
    alphas = torch.linspace(0, 1, 41).tolist()
    for m in torch.exp(torch.linspace(math.log(n_last / c), math.log(c / n_prev), 7)).tolist():
        worst = max(float(homogeneous_segment_loss(features, w_last, None, y, m, 1.0, a)) for a in alphas)
        assert worst <= bound * (1 + 1e-9)
    end = max(float(homogeneous_segment_loss(features, w_last, None, y, m, 1.0, 0.5))
              for m in (n_last / c, c / n_prev))
    assert end == pytest.approx(bound, rel=1e-9)                 # attained at an end of the range, at α = ½
    assert mc.bounded_orbit_barrier(features, w_prev, w_last, y, 4 * c, 1.0) > 10 * bound
    with pytest.raises(ValueError, match="must exceed"):
        mc.bounded_orbit_barrier(features, w_prev, w_last, y, 0.5 * n_prev, 1.0)


def test_action_shape_is_checked():
    u, v, x, _ = _net(3, 4, 2, 3, seed=0)
    with pytest.raises(ValueError, match="hidden width"):
        mc.approximate_action(u, v, torch.eye(3, dtype=F64), x, torch.sigmoid)


def test_example_quick(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "mode_connectivity.py"), "--quick", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    values = {k: float(v) for k, v in re.findall(r"(\w+)=([-+0-9.eE]+)", result.stdout)}
    assert (tmp_path / "mode_connectivity.png").stat().st_size > 0
    assert values["bound_violations"] == 0 and values["bound_exact_max_ratio"] < 1e-9
    assert values["curve_k8_c2_0_batch_max"] < 1e-12 < values["chord_k8_c2_0_batch_max"]   # exact on the batch
    assert values["curve_k64_c2_0_batch_max"] > 1e-3                                       # k > h: not exact
    assert values["p336_violations"] == 0
    assert values["p334_m10000_ratio"] == pytest.approx(values["p334_limit"], rel=0.02)
