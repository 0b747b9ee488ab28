"""Learning to teleport ([Zhao2026] Sec. 5.5, Alg. 3): meta-learned local updates and group elements.

Two coordinate-wise LSTM meta-optimisers read the gradient ``∇_t`` of the loss; ``m₁`` proposes the update
``f_t``, ``m₂`` the group element ``g_t``, and

    θ_{t+1} = g_t·(θ_t + f_t)

Their weights are trained by unrolled back-propagation of the accumulated loss ``Σ L(θ_i)`` over windows of
``unroll`` steps (truncated: parameters and LSTM states are detached between windows).

**The group element.** ``m₂`` runs coordinate-wise over the parameters, like ``m₁``, and outputs one number
``u_j`` per parameter coordinate. The Lie-algebra coordinates are its pooling onto the orbit's tangent
directions, ``c_i = ⟨u, Bᵢ·θ⟩`` with ``Bᵢ·θ = ∂/∂cᵢ (exp(Σ cₖBₖ)·θ)|_{c=0}`` (one vector–Jacobian product of
the action, :func:`tangent_coordinates`), bounded to ``‖c‖ ≤ radius``, and ``g_t = exp(Σ cᵢBᵢ)`` is applied by
the action itself. Any :class:`~symalg.applications.teleport.Action` works (a derived ``SymmetryAction`` of a
spec or a traced model, a data-dependent action), and every ``g_t`` is an exact element, so it keeps the loss
to rounding; the dimension of ``m₂``'s output never depends on the group. Since ``L`` is invariant,
``Jᵀ∇L = 0``: an ``m₂`` linear in ``∇`` would give ``c = 0``, the LSTM's nonlinearity is what moves.

Modes (:data:`MODES`): ``"update+tele"`` (both), ``"update"`` (``g_t = I``: [Andrychowicz2016]), ``"lr+tele"``
(``m₁``'s output averaged over coordinates is a log learning rate: ``f_t = −lr·e^{mean u}·∇_t``).

Example
-------
>>> import torch
>>> task = leaky_relu_task(seed=0, size=6)
>>> meta = MetaOptimizer("update+tele", hidden=8)
>>> curve = evaluate(meta, [task], steps=3)
>>> curve.losses.shape, curve.teleport_change < 1e-12      # every g_t kept the loss
((1, 4), True)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from symalg.applications.teleport import Action, as_action
from symalg.applications.teleport_actions import ExactTeleport, leaky_relu
from symalg.numeric.feedforward import FeedForward

__all__ = ["MODES", "Curves", "CoordinateLSTM", "MetaOptimizer", "MetaTrainLog", "Task", "evaluate", "gd_curves",
           "largest_stable_lr", "leaky_relu_task", "meta_train", "tangent_coordinates"]

Params = Mapping[str, torch.Tensor]
MODES = ("update+tele", "update", "lr+tele")


# ------------------------------------------------------------------------------------------------ tasks

@dataclass(frozen=True)
class Task:
    """One optimisation problem: ``loss(params) → scalar``, the initial ``params`` (the ``wrt`` entries are
    trained) and the ``action`` whose elements keep ``loss`` (``None``: no teleports possible)."""

    loss: Callable[[Params], torch.Tensor]
    params: dict[str, torch.Tensor]
    action: Action | None = None
    wrt: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.wrt:
            object.__setattr__(self, "wrt", tuple(self.params))
        missing = [n for n in self.wrt if n not in self.params]
        if missing:
            raise ValueError(f"Task: wrt names {missing} are not in params {sorted(self.params)}")


def leaky_relu_task(seed: int, size: int = 20, slope: float = 0.1, spec: str | nn.Module | None = None,
                    dtype: torch.dtype = torch.float64) -> Task:
    """[Zhao2026] Sec. 5.5: ``L = ‖Y − W₂σ(W₁X)‖_F``, ``W₁, W₂, X, Y ∈ R^{size×size}`` standard normal (seeded),
    σ = LeakyReLU(``slope``), no biases; torch layout (rows of ``x = Xᵀ`` are the samples).

    The action is eq. 4.13 at the hidden site, ``W₁' = σ⁻¹(gσ(W₁X))X⁻¹``, ``W₂' = W₂g⁻¹`` for ``g ∈ GL(size)``
    (:class:`~symalg.applications.teleport_actions.ExactTeleport`, completed): ``X`` is square and invertible
    (almost surely), so ``W₂'σ(W₁'X) = W₂g⁻¹gσ(W₁X)`` exactly and it is a group action (``XX⁻¹ = I``: the unit
    axiom holds). LeakyReLU's linear symmetries are only positive scalings and permutations (``size`` continuous
    dimensions); this data-dependent action has ``size²``. ``spec``: the network as a spec string or a torch
    module (default: the ``nn.Sequential`` below); both front ends give the same :class:`FeedForward`.

    >>> task = leaky_relu_task(0, size=4)
    >>> sorted(task.params), task.action.dim, round(float(task.loss(task.params)), 3) > 0
    (['0.weight', '2.weight'], 16, True)
    """
    g = torch.Generator().manual_seed(seed)
    draw = [torch.randn(size, size, generator=g, dtype=dtype) for _ in range(4)]
    x, y, w1, w2 = draw
    if spec is None:
        spec = nn.Sequential(nn.Linear(size, size, bias=False), nn.LeakyReLU(slope), nn.Linear(size, size, bias=False))
    net = FeedForward.of(spec)
    if len(net.weights) != 2 or any(b is not None for b in net.biases):
        raise ValueError(f"leaky_relu_task: spec must be linear → σ → linear without biases, got {net}")
    params = {net.weights[0]: w1, net.weights[1]: w2}
    action = as_action(ExactTeleport(net, 0, activation=leaky_relu(slope), complete=True), x=x, params=params)

    def loss(p: Params) -> torch.Tensor:
        return torch.linalg.norm(y - net.forward(p, x))

    return Task(loss, params, action)


# ------------------------------------------------------------------------------------------------ the group element

def tangent_coordinates(action: Action, params: Params, u: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``c = Jᵀu``: ``cᵢ = Σ_name ⟨u[name], (Bᵢ·θ)[name]⟩``, the pooling of per-parameter outputs ``u`` onto the
    orbit's tangent directions ``Bᵢ·θ = ∂/∂cᵢ (exp(Σ cₖBₖ)·θ)|_{c=0}`` at ``θ = params`` (treated as constants:
    only ``u`` is differentiated, as the inputs of a learned optimizer are). Linear in ``u``; differentiable in
    ``u`` when it requires grad. Uses ``action.first_order`` (same value and derivative at 0).

    >>> import symalg
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).double()
    >>> x = torch.randn(4, 2, dtype=torch.float64)
    >>> action = as_action(symalg.derive(symalg.trace(model, (x,))))    # positive scalings of the 3 units
    >>> p = {k: v.detach() for k, v in model.named_parameters()}
    >>> u = {k: torch.ones_like(v) for k, v in p.items()}
    >>> c = tangent_coordinates(action, p, u)    # scaling unit j: d/dc (e^c w_in, e^c b, e^-c w_out)
    >>> bool(torch.allclose(c, p["0.weight"].sum(1) + p["0.bias"] - p["2.weight"].sum(0)))
    True
    """
    fixed = {n: v.detach() for n, v in params.items()}
    like = next(v for v in fixed.values() if v.is_floating_point())
    zero = torch.zeros(action.dim, dtype=like.dtype, device=like.device, requires_grad=True)
    if action.dim == 0:
        return zero.detach()
    with torch.enable_grad():
        moved = action.first_order(fixed, zero)
        terms = [(moved[n] * u[n].to(moved[n].dtype)).sum() for n in u if moved[n] is not fixed[n]]
        if not terms:
            return torch.zeros_like(zero).detach()
        needs = any(v.requires_grad for v in u.values())
        (c,) = torch.autograd.grad(torch.stack(terms).sum(), zero, create_graph=needs, allow_unused=True)
    return torch.zeros_like(zero).detach() if c is None else c


def _bounded(c: torch.Tensor, radius: float) -> torch.Tensor:
    """``c`` shortened to ``‖c‖ ≤ radius`` (smoothly: ``radius·tanh(‖c‖/radius)·c/‖c‖``)."""
    norm = c.norm()
    if float(norm.detach()) == 0.0:
        return c
    return c * (radius * torch.tanh(norm / radius) / norm)


# ------------------------------------------------------------------------------------------------ the meta-optimisers

class CoordinateLSTM(nn.Module):
    """An LSTM applied to every coordinate separately (shared weights, [Andrychowicz2016]): input the gradient
    coordinate, preprocessed to ``(log|g|/p, sign g)`` (``(−1, eᵖg)`` when ``|g| < e^{−p}``), output one number per
    coordinate through a linear head. State ``(h, c)``, each ``(layers, n, hidden)``.

    >>> m = CoordinateLSTM(hidden=4)
    >>> out, state = m(torch.randn(7), m.start(7))
    >>> out.shape, state[0].shape
    (torch.Size([7]), torch.Size([2, 7, 4]))
    """

    def __init__(self, hidden: int = 300, layers: int = 2, preprocess: float = 10.0) -> None:
        super().__init__()
        self.hidden, self.layers, self.p = hidden, layers, preprocess
        self.lstm = nn.LSTM(2, hidden, layers)
        self.head = nn.Linear(hidden, 1)

    def start(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The zero state for ``n`` coordinates."""
        zero = torch.zeros(self.layers, n, self.hidden, dtype=self.head.weight.dtype)
        return zero, zero.clone()

    def features(self, g: torch.Tensor) -> torch.Tensor:
        """The ``(n, 2)`` preprocessed input of [Andrychowicz2016] App. A."""
        g = g.to(self.head.weight.dtype)
        big = g.abs() >= math.exp(-self.p)
        first = torch.where(big, torch.log(g.abs().clamp_min(math.exp(-self.p))) / self.p, -torch.ones_like(g))
        second = torch.where(big, torch.sign(g), math.exp(self.p) * g)
        return torch.stack([first, second], -1)

    def forward(self, g: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, state = self.lstm(self.features(g).unsqueeze(0), state)
        return self.head(out[0]).squeeze(-1), state


@dataclass
class StepInfo:
    """One step: the loss before it, the group coordinates used (``None``: no teleport), the relative loss
    change of the teleport ``|L(g·θ') − L(θ')|/L(θ')`` at ``θ' = θ + f`` (measured when asked) and the
    learning rate (mode ``"lr+tele"``)."""

    loss: torch.Tensor
    coords: torch.Tensor | None = None
    teleport_change: float = 0.0
    lr: float | None = None


State = dict[str, tuple[torch.Tensor, torch.Tensor]]


class MetaOptimizer(nn.Module):
    """The two meta-optimisers of Alg. 3 (see the module docstring): ``m₁`` (update or log learning rate) and
    ``m₂`` (group element; absent in mode ``"update"``).

    ``update_scale``: ``f_t = update_scale·m₁(∇_t)``; ``lr``: the base rate of ``"lr+tele"``; ``group_scale``:
    ``u = group_scale·m₂(∇_t)``; ``radius``: the bound on ``‖c‖`` per step (each ``g_t`` then has condition number
    at most ``e^{2·radius}`` on an orthonormal algebra basis; the default 0.01 keeps the product over a
    100-step trajectory within ``Σ‖c_t‖ ≤ 1``, the whole-teleport trust region ``TRAINING_RADIUS`` of
    :mod:`~symalg.applications.teleport_optim`); ``second_order``: keep ``∇_t`` differentiable while
    training (``False``: detach it, as [Andrychowicz2016] does; the teleport's benefit — a larger ``∇_{t+1}`` —
    then reaches the meta-gradient only through ``L(θ + f)``). ``m₂``'s output layer starts at zero, so an
    untrained meta-optimiser does not teleport (``g_t = I``). Learned group elements compound over a trajectory
    (``GL`` is not compact) and make ``‖∇L‖``, hence the next updates, explode unless ``radius`` is small — measured
    on the reduced run of docs/learn_to_teleport.md with ``radius = 0.1``: test loss from 245 to 1e5.
    """

    def __init__(self, mode: str = "update+tele", hidden: int = 300, layers: int = 2, update_scale: float = 0.1,
                 lr: float = 3e-4, group_scale: float = 0.01, radius: float = 0.01, second_order: bool = True) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"MetaOptimizer: mode {mode!r} is not one of {MODES}")
        self.mode, self.update_scale, self.lr = mode, update_scale, lr
        self.group_scale, self.radius, self.second_order = group_scale, radius, second_order
        self.m1 = CoordinateLSTM(hidden, layers)
        self.m2 = CoordinateLSTM(hidden, layers) if mode.endswith("tele") else None
        if self.m2 is not None:        # g_t = I until the meta-gradient moves it
            nn.init.zeros_(self.m2.head.weight)
            nn.init.zeros_(self.m2.head.bias)
        self._adam: torch.optim.Optimizer | None = None

    @property
    def teleports(self) -> bool:
        return self.m2 is not None

    def start(self, task: Task) -> State:
        """Zero LSTM states for ``task``'s parameters."""
        n = sum(task.params[w].numel() for w in task.wrt)
        state = {"m1": self.m1.start(n)}
        if self.m2 is not None:
            if task.action is None:
                raise ValueError(f"MetaOptimizer({self.mode!r}): the task has no action to teleport with")
            state["m2"] = self.m2.start(n)
        return state

    def step(self, task: Task, params: Params, state: State, train: bool = False, measure: bool = True
             ) -> tuple[dict[str, torch.Tensor], State, StepInfo]:
        """One step ``θ ↦ g·(θ + f)``; ``train``: keep the graph for the meta-gradient."""
        wrt = task.wrt
        create = train and self.second_order
        with torch.enable_grad():
            leaves = {n: params[n] if params[n].requires_grad else params[n].detach().requires_grad_(True)
                      for n in wrt}
            loss = task.loss({**params, **leaves})
            grads = torch.autograd.grad(loss, [leaves[n] for n in wrt], create_graph=create)
        flat = torch.cat([g.reshape(-1) for g in grads])
        if not create:
            flat = flat.detach()
        with torch.set_grad_enabled(train):
            out1, s1 = self.m1(flat, state["m1"])
            new_state = {"m1": s1}
            info = StepInfo(loss)
            if self.mode.startswith("update"):
                step = self.update_scale * out1.to(flat.dtype)
            else:
                rate = self.lr * torch.exp(out1.mean()).to(flat.dtype)
                step, info.lr = -rate * flat, float(rate.detach())
            moved = dict(params)
            for n, f in zip(wrt, self._split(step, task)):
                moved[n] = params[n] + f
            if self.m2 is None:
                return moved, new_state, info
            assert task.action is not None
            out2, new_state["m2"] = self.m2(flat, state["m2"])
            u = dict(zip(wrt, self._split(self.group_scale * out2.to(flat.dtype), task)))
            coords = _bounded(tangent_coordinates(task.action, moved, u), self.radius)
            result = task.action(moved, coords)
            info.coords = coords
            if measure:
                with torch.no_grad():
                    before, after = float(task.loss(moved)), float(task.loss(result))
                info.teleport_change = abs(after - before) / max(abs(before), 1e-300)
            return result, new_state, info

    def adam(self, lrs: tuple[float, float]) -> torch.optim.Optimizer:
        """Adam over ``m₁`` (rate ``lrs[0]``) and ``m₂`` (``lrs[1]``), made on the first call and kept, so that its
        moments persist across :func:`meta_train` calls."""
        if self._adam is None:
            groups = [{"params": list(self.m1.parameters()), "lr": lrs[0]}]
            if self.m2 is not None:
                groups.append({"params": list(self.m2.parameters()), "lr": lrs[1]})
            self._adam = torch.optim.Adam(groups)
        return self._adam

    @staticmethod
    def _split(flat: torch.Tensor, task: Task) -> list[torch.Tensor]:
        out, start = [], 0
        for n in task.wrt:
            p = task.params[n]
            out.append(flat[start:start + p.numel()].reshape(p.shape))
            start += p.numel()
        return out


# ------------------------------------------------------------------------------------------------ training

@dataclass
class MetaTrainLog:
    """Per trajectory: the mean meta-loss over its windows, its wall time (s) and whether it diverged (then its
    remaining windows were skipped)."""

    meta_losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    diverged: list[bool] = field(default_factory=list)


def meta_train(meta: MetaOptimizer, tasks: Iterable[Task], steps: int = 100, unroll: int = 10,
               lrs: tuple[float, float] = (1e-4, 1e-3), log: MetaTrainLog | None = None) -> MetaTrainLog:
    """Alg. 3: for every task (a training trajectory from its initial parameters), ``steps`` steps; every
    ``unroll`` steps one Adam step on ``m₁`` (rate ``lrs[0]``) and ``m₂`` (``lrs[1]``) from the mean loss of the
    window's iterates ``θ_{t+1} … θ_{t+unroll}``, then parameters and states are detached (truncated BPTT).
    A window whose loss is not finite ends the trajectory without an update. Adam's state persists across calls
    (:meth:`MetaOptimizer.adam`)."""
    log = log if log is not None else MetaTrainLog()
    adam = meta.adam(lrs)
    for task in tasks:
        start = time.perf_counter()
        params: dict[str, torch.Tensor] = {n: v.detach() for n, v in task.params.items()}
        state = meta.start(task)
        window_losses, diverged = [], False
        for first in range(0, steps, unroll):
            total = torch.zeros((), dtype=torch.float64)
            for _ in range(min(unroll, steps - first)):
                params, state, _ = meta.step(task, params, state, train=True, measure=False)
                total = total + task.loss(params)
            meta_loss = total / min(unroll, steps - first)
            if not torch.isfinite(meta_loss):
                diverged = True
                break
            adam.zero_grad()
            meta_loss.backward()
            adam.step()
            window_losses.append(float(meta_loss.detach()))
            params = {n: v.detach() for n, v in params.items()}
            state = {k: (h.detach(), c.detach()) for k, (h, c) in state.items()}
        log.meta_losses.append(float(np.mean(window_losses)) if window_losses else math.inf)
        log.seconds.append(time.perf_counter() - start)
        log.diverged.append(diverged)
    return log


# ------------------------------------------------------------------------------------------------ evaluation

@dataclass
class Curves:
    """Loss curves ``losses[trajectory, step]`` (``steps + 1`` columns: the start included), the wall time per
    step (s, mean over all steps), and the largest relative loss change of any teleport (0 without)."""

    losses: np.ndarray
    seconds_per_step: float
    teleport_change: float = 0.0

    @property
    def mean(self) -> np.ndarray:
        return np.asarray(self.losses.mean(0))

    @property
    def std(self) -> np.ndarray:
        return np.asarray(self.losses.std(0))


def evaluate(meta: MetaOptimizer, tasks: Sequence[Task], steps: int = 100) -> Curves:
    """Run the trained meta-optimiser (no meta-gradient) from each task's initial parameters for ``steps`` steps."""
    rows, worst, seconds = [], 0.0, 0.0
    for task in tasks:
        params = {n: v.detach() for n, v in task.params.items()}
        state = meta.start(task)
        row = []
        start = time.perf_counter()
        for _ in range(steps):
            params, state, info = meta.step(task, params, state)
            row.append(float(info.loss.detach()))
            worst = max(worst, info.teleport_change)
        seconds += time.perf_counter() - start
        row.append(float(task.loss(params)))
        rows.append(row)
    return Curves(np.array(rows), seconds / max(1, steps * len(tasks)), worst)


def gd_curves(tasks: Sequence[Task], lr: float, steps: int = 100) -> Curves:
    """Plain gradient descent ``θ ← θ − lr·∇L`` from each task's initial parameters."""
    rows, seconds = [], 0.0
    for task in tasks:
        params = {n: v.detach().clone() for n, v in task.params.items()}
        row = []
        start = time.perf_counter()
        for _ in range(steps):
            leaves = {n: params[n].requires_grad_(True) for n in task.wrt}
            loss = task.loss({**params, **leaves})
            grads = torch.autograd.grad(loss, list(leaves.values()))
            row.append(float(loss.detach()))
            params = {**params, **{n: (leaves[n] - lr * g).detach() for n, g in zip(task.wrt, grads)}}
        seconds += time.perf_counter() - start
        row.append(float(task.loss(params)))
        rows.append(row)
    return Curves(np.array(rows), seconds / max(1, steps * len(tasks)))


def largest_stable_lr(tasks: Sequence[Task], lrs: Sequence[float], steps: int = 100) -> tuple[float | None, dict]:
    """The largest rate of ``lrs`` whose GD run does not diverge on any task (every loss finite and the loss never
    above its start), and ``{lr: mean final loss}`` for all of them (``inf`` where it diverged).

    >>> lr, finals = largest_stable_lr([leaky_relu_task(0, size=4)], [1e-3, 1e3], steps=20)
    >>> lr, math.isinf(finals[1e3])
    (0.001, True)
    """
    best, finals = None, {}
    for lr in sorted(lrs):
        curves = gd_curves(tasks, lr, steps)
        ok = bool(np.isfinite(curves.losses).all() and (curves.losses <= curves.losses[:, :1] * (1 + 1e-12)).all())
        finals[lr] = float(curves.losses[:, -1].mean()) if ok else math.inf
        if ok:
            best = lr
    return best, finals
