"""Learning to teleport: exact group elements from the LSTM on any action, shapes, meta-training, the example."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import symalg
from symalg.applications.learn_to_teleport import (MODES, CoordinateLSTM, MetaOptimizer, Task, evaluate, gd_curves,
                                                   largest_stable_lr, leaky_relu_task, meta_train,
                                                   tangent_coordinates)
from symalg.applications.teleport import as_action

ROOT = Path(__file__).resolve().parents[1]
SPEC = "linear(6, 6, bias=False) -> leaky_relu(slope=0.1) -> linear(6, 6, bias=False)"


def _run(meta, task, steps):
    """Every step's info from the task's start (no meta-gradient); ``m₂``'s zero head is redrawn so that it
    teleports."""
    torch.manual_seed(0)
    nn.init.normal_(meta.m2.head.weight)
    nn.init.normal_(meta.m2.head.bias)
    params, state, infos = dict(task.params), meta.start(task), []
    for _ in range(steps):
        params, state, info = meta.step(task, params, state)
        infos.append(info)
    return infos


@pytest.mark.parametrize("front_end", ["spec", "torch"])
def test_every_learned_group_element_keeps_the_leaky_relu_loss(front_end):
    # the data-dependent action of eq. 4.13 with X square and invertible: g_t moves W₁, W₂ by O(‖c‖) yet the loss
    # changes at rounding level only (1e-16 measured), at every step, from both front ends
    spec = SPEC if front_end == "spec" else nn.Sequential(nn.Linear(6, 6, bias=False), nn.LeakyReLU(0.1),
                                                           nn.Linear(6, 6, bias=False))
    task = leaky_relu_task(3, size=6, spec=spec)
    torch.manual_seed(0)
    meta = MetaOptimizer("update+tele", hidden=8, group_scale=1.0, radius=0.5).double()
    infos = _run(meta, task, 6)
    for info in infos:
        assert info.coords is not None and info.coords.shape == (36,)
        assert float(info.coords.norm()) > 1e-2                  # a real group element, not the identity
        assert info.teleport_change < 1e-12
    moved = task.action(task.params, infos[0].coords.detach())      # the same element at the start: it moves W₁
    assert float((moved["0.weight"] - task.params["0.weight"]).abs().max()) > 1e-3
    assert abs(float(task.loss(moved) / task.loss(task.params)) - 1) < 1e-12


def _derived_task(analysis, model, x, y):
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p):
        return F.mse_loss(torch.func.functional_call(model, p, (x,)), y)

    return Task(loss, params, as_action(analysis, params=params))


@pytest.mark.parametrize("front_end", ["spec", "traced"])
def test_learned_group_elements_on_derived_actions_keep_the_loss(front_end):
    # any analysed model: GL(5) and the bias shear of a spec's linear chain; positive scalings of a traced ReLU net
    torch.manual_seed(1)
    if front_end == "spec":
        analysis = symalg.derive("linear(3, 5) -> identity -> linear(5, 2)")
        model = analysis.model_graph.model.double()
        expected_dim = 25 + 5
    else:
        model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).double()
        analysis = symalg.derive(symalg.trace(model, (torch.randn(4, 3, dtype=torch.float64),)))
        expected_dim = 5
    x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
    task = _derived_task(analysis, model, x, y)
    assert task.action.dim == expected_dim
    meta = MetaOptimizer("update+tele", hidden=8, group_scale=1.0, radius=0.3).double()
    for info in _run(meta, task, 5):
        assert float(info.coords.norm()) > 1e-3
        assert info.teleport_change < 1e-12


def test_tangent_coordinates_are_the_transposed_jacobian_of_the_action():
    task = leaky_relu_task(0, size=4)
    u = {n: torch.randn_like(v) for n, v in task.params.items()}
    c = tangent_coordinates(task.action, task.params, u)

    def flat(coords):
        moved = task.action(task.params, coords)
        return torch.cat([moved[n].reshape(-1) for n in task.params])

    J = torch.autograd.functional.jacobian(flat, torch.zeros(16, dtype=torch.float64))
    expected = J.T @ torch.cat([u[n].reshape(-1) for n in task.params])
    assert torch.allclose(c, expected, rtol=1e-9, atol=1e-11)
    # the loss gradient is orthogonal to the orbit (L invariant): its pooling vanishes
    p = {n: v.clone().requires_grad_(True) for n, v in task.params.items()}
    grads = dict(zip(p, torch.autograd.grad(task.loss(p), list(p.values()))))
    assert float(tangent_coordinates(task.action, task.params, grads).abs().max()) < 1e-10


def test_shapes_and_bad_input():
    m = CoordinateLSTM(hidden=5, layers=2)
    out, (h, c) = m(torch.randn(11), m.start(11))
    assert out.shape == (11,) and h.shape == c.shape == (2, 11, 5)
    features = m.features(torch.tensor([0.0, 1e-6, -2.0]))
    assert features[0].tolist() == [-1.0, 0.0] and features[2, 1] == -1.0
    task = leaky_relu_task(0, size=4)
    curves = evaluate(MetaOptimizer("lr+tele", hidden=4), [task, leaky_relu_task(1, size=4)], steps=3)
    assert curves.losses.shape == (2, 4) and curves.mean.shape == curves.std.shape == (4,)
    with pytest.raises(ValueError, match="mode 'tele'"):
        MetaOptimizer("tele")
    with pytest.raises(ValueError, match="no action"):
        MetaOptimizer("update+tele", hidden=4).start(Task(task.loss, task.params))
    with pytest.raises(ValueError, match="wrt names"):
        Task(task.loss, task.params, wrt=("W",))


def test_lr_mode_steps_along_the_gradient_at_its_learned_rate():
    task = leaky_relu_task(2, size=4)
    meta = MetaOptimizer("lr+tele", hidden=4, group_scale=0.0)   # c = 0: only the gradient step
    p = {n: v.clone().requires_grad_(True) for n, v in task.params.items()}
    grads = torch.autograd.grad(task.loss(p), list(p.values()))
    after, _, info = meta.step(task, task.params, meta.start(task))
    for (n, v), g in zip(task.params.items(), grads):
        assert torch.allclose(after[n], v - info.lr * g, atol=1e-12)


def test_gd_baseline_and_stable_rate():
    tasks = [leaky_relu_task(s, size=5) for s in range(2)]
    curves = gd_curves(tasks, 1e-3, steps=10)
    assert (curves.losses[:, -1] < curves.losses[:, 0]).all()
    lr, finals = largest_stable_lr(tasks, [1e-3, 1e-2, 1e4], steps=10)
    assert lr == 1e-2 and finals[1e4] == float("inf") and finals[1e-2] < finals[1e-3]


@pytest.mark.parametrize("mode", MODES)
def test_meta_training_lowers_the_meta_loss_on_held_out_trajectories(mode):
    # a tiny seeded task family (size 5, 12 steps, unroll 4, 4 training trajectories): the mean loss over two
    # held-out trajectories drops (measured: to 0.61 / 0.58 of the untrained value for update+tele / update; the
    # learned-rate mode adapts one scalar, log lr, whose meta rate is raised to 0.1 so that 12 windows move it: 0.33)
    torch.manual_seed(0)
    meta = MetaOptimizer(mode, hidden=16)
    held_out = [leaky_relu_task(s, size=5) for s in range(2)]
    before = evaluate(meta, held_out, steps=12).losses.mean()
    log = meta_train(meta, [leaky_relu_task(100 + s, size=5) for s in range(4)], steps=12, unroll=4,
                     lrs=(1e-1 if mode == "lr+tele" else 1e-2, 1e-2))
    after = evaluate(meta, held_out, steps=12).losses.mean()
    assert not any(log.diverged) and len(log.seconds) == len(log.meta_losses) == 4
    assert after < 0.97 * before


def test_quick_example_runs_and_plots(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "learn_to_teleport.py"), "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "learn_to_teleport.png").stat().st_size > 1000
    tokens = dict(t.split("=", 1) for t in out.stdout.split() if "=" in t)
    assert float(tokens["max_teleport_change"]) < 1e-12
    assert {"gd_final", "update_final", "update+tele_final", "lr+tele_final"} <= set(tokens)
