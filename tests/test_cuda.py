"""The pipeline's numeric stages on a CUDA device: each result equals the CPU's (skipped without a GPU).

Derivation is symbolic and runs on the CPU; what runs on the device is what reads parameter values: verification,
orbit ranks, lowered conserved quantities, group actions and teleports. Each test computes the same thing on the CPU
and on CUDA and compares.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg
from symalg.applications.teleport import as_action, teleport
from symalg.numeric.orbit_rank import model_orbit_dimension

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


class Block(nn.Module):
    """A pre-norm attention block with an MLP: GL sites, head permutations, scalings and shears."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = nn.MultiheadAttention(d, heads, batch_first=True)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.down(F.relu(self.up(self.norm2(x))))


def _analysis(model: nn.Module, x: torch.Tensor) -> symalg.Analysis:
    return symalg.derive(symalg.trace(model, (x,)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_verify_a_transformer_block_on_cuda(dtype):
    torch.manual_seed(0)
    analysis = _analysis(Block(), torch.randn(2, 5, 16))
    report = symalg.verify(analysis, device="cuda", dtype=dtype)
    assert report.device == "cuda" and report.passed, str(report)
    cpu = symalg.verify(analysis, device="cpu", dtype=dtype)
    assert [(c.check, c.symmetry) for c in report.checks] == [(c.check, c.symmetry) for c in cpu.checks]


def test_orbit_dimension_on_cuda_equals_the_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 300), nn.Identity(), nn.Linear(300, 6), nn.ReLU(), nn.Linear(6, 3))
    analysis = _analysis(model, torch.randn(2, 8))
    params = dict(model.state_dict())
    cpu = model_orbit_dimension(analysis, params)
    gpu = model_orbit_dimension(analysis, params, device="cuda")
    assert gpu.dimension == cpu.dimension == cpu.expected
    assert [d.rank for d in gpu.decisions] == [d.rank for d in cpu.decisions]
    assert {d.certificate for d in gpu.decisions} == {d.certificate for d in cpu.decisions}


def test_lowered_quantities_and_actions_on_cuda():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.Identity(), nn.Linear(6, 2)).double()
    analysis = _analysis(model, torch.randn(3, 5, dtype=torch.float64))
    cpu = {k: v.detach() for k, v in model.named_parameters()}
    gpu = {k: v.cuda() for k, v in cpu.items()}
    for quantity in analysis.conserved_quantities():
        on_gpu = quantity(gpu)
        assert all(v.device.type == "cuda" for v in on_gpu.values())
        for name, value in quantity(cpu).items():
            torch.testing.assert_close(on_gpu[name].cpu(), value, rtol=1e-12, atol=1e-12)
    x = torch.randn(4, 5, dtype=torch.float64, device="cuda")
    reference = torch.func.functional_call(model.cuda(), gpu, (x,))
    for symmetry in analysis.symmetries:
        for label, element in symmetry.group.sample(torch.Generator().manual_seed(1), torch.float64, "cuda"):
            moved = symmetry.apply(gpu, element)
            assert all(v.device.type == "cuda" for v in moved.values())
            error = (torch.func.functional_call(model, moved, (x,)) - reference).abs().max()
            assert error < 1e-10, (symmetry.label, label)


def test_teleport_on_cuda_keeps_the_loss_and_matches_the_cpu():
    results = []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.1), nn.Linear(8, 3)).double().to(device)
        x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
        y = torch.randn(16, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(device)
        analysis = _analysis(model, x)
        params = dict(model.named_parameters())

        def loss(p, model=model, x=x, y=y):
            return F.mse_loss(torch.func.functional_call(model, p, (x,)), y)

        results.append(teleport(as_action(analysis), params, loss, steps=5))
    cpu, gpu = results
    assert gpu.params["0.weight"].device.type == "cuda"
    assert gpu.accepted == cpu.accepted and abs(gpu.loss_after - gpu.loss_before) <= 1e-9 * gpu.loss_before
    assert gpu.objective_after == pytest.approx(cpu.objective_after, rel=1e-8)
