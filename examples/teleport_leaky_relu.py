"""Wall-clock speedup of teleportation on the three-layer LeakyReLU regression of [Zhao2026] Sec. 4.6.2/4.6.4.

Setup (Sec. 4.6.2): ``min ‖Y − W₃σ(W₂σ(W₁X))‖`` with ``W₁ ∈ R^{6×5}``, ``W₂ ∈ R^{7×6}``, ``W₃ ∈ R^{8×7}``, no biases,
``X ∈ R^{5×4}`` (4 samples), ``Y ∈ R^{8×4}``, σ = LeakyReLU(0.1); data and weights uniform on [0, 1], one draw per
seed. GD uses learning rate 1e-4, AdaGrad 1e-1. The loss is the Frobenius norm as written (``--loss norm``), or
``½‖·‖²`` as in the authors' public code (``--loss squared``). One teleport at step 5, maximising ``‖∇L‖²``
(``GradNorm``, as in Ch. 4 for both GD and AdaGrad; ``--objective grad``) or the gradient norm in the optimizer's
metric (``MetricGradNorm(optimizer_metric(...))``, eq. 5.7 for AdaGrad; ``--objective metric``); AdaGrad's state
is kept.

Two stopping rules, both timed on the same run:
- **criterion** (Sec. 4.6.4): the first step whose loss differs from the previous one by less than 1e-3, within
  2000 steps. It fires on any plateau, so a teleported run can "converge" sooner at a *higher* loss;
- **same loss**: the first step whose loss is at most the loss at which the plain run met the criterion.
Speedup = t_plain / t_teleport for each rule, per seed (the median over ``--repeats`` interleaved plain/teleport
pairs; the trajectories are deterministic, only the clock varies), then the median over the seeds that got there.

The action is [Zhao2026]'s: LeakyReLU's only exact linear symmetries are positive scalings and
permutations, so Ch. 4 uses the data-dependent ``GL(d)`` action of eq. 4.13 for bijective activations on each pair
of adjacent layers (``symalg.applications.teleport_actions.ExactTeleport`` at both hidden sites, widths 6 and 7, 85
coordinates). With batch 4 ≤ the layer's input width it keeps the loss on the batch exactly. ``complete=True``
adds back ``W̃(I − hh⁺)``: without it ``c = 0`` is not the identity (it projects the weights onto the data span);
completed it is a group action. Other differences: ``g = exp(T)`` (exact, composed) instead of ``I + T``, and each
ascent step is clipped to ``‖Δ‖ ≤ 1`` (``Teleporter.max_step``). Grid (Sec. 4.6.4): teleport learning rates ×
numbers of ascent steps 1…32. [Zhao2026]'s rates 1e-9…1e-5 are tied to its loss scaling and do nothing
with the norm loss (‖∇L‖² gain < 1.01 at 1e-5 and 8 steps), so its default grid is shifted to 1e-6…1e-2; the
grid of [Zhao2026] with its loss: ``--loss squared --lrs 1e-9,1e-8,1e-7,1e-6,1e-5``.

Prints tables and ``key=value`` tokens; saves ``teleport_leaky_relu.png``.
Run: ``python examples/teleport_leaky_relu.py [--quick] [--seeds N] [--repeats N] [--loss norm|squared]
[--objective grad|metric] [--lrs a,b,...] [--out DIR]``.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import matplotlib
import torch
from torch import nn

from symalg.numeric.feedforward import FeedForward
from symalg.applications.teleport import (FunctionAction, GradNorm, MetricGradNorm, TeleportResult, Teleporter,
                                          as_action, optimizer_metric)
from symalg.applications.teleport_actions import ExactTeleport
from teleport_common import parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAX_STEPS, TOLERANCE, TELEPORT_AT = 2000, 1e-3, 5
OPTIMIZERS = {"GD": (torch.optim.SGD, 1e-4), "AdaGrad": (torch.optim.Adagrad, 1e-1)}
LOSSES = {"norm": lambda r: torch.linalg.norm(r), "squared": lambda r: 0.5 * torch.linalg.norm(r) ** 2}


def problem(seed: int, loss_kind: str = "norm"):
    """Model, data, initial parameters (uniform on [0, 1]) and the loss of a parameter dict."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 6, bias=False), nn.LeakyReLU(0.1), nn.Linear(6, 7, bias=False),
                          nn.LeakyReLU(0.1), nn.Linear(7, 8, bias=False))
    x, y = torch.rand(4, 5), torch.rand(4, 8)
    params = {name: torch.rand_like(p) for name, p in model.named_parameters()}
    residual_loss = LOSSES[loss_kind]

    def loss(p):
        return residual_loss(y - torch.func.functional_call(model, p, (x,)))
    return model, x, params, loss


def pair_action(model, x, params):
    """Eq. 4.13 at both hidden sites, one after the other: coordinates ``(T₁ ∈ gl(6), T₂ ∈ gl(7))``."""
    net = FeedForward.of(model)
    sites = [as_action(ExactTeleport(net, s, complete=True), x=x, params=params) for s in range(net.sites)]
    cuts = [0]
    for site in sites:
        cuts.append(cuts[-1] + site.dim)

    def act(p, coords):
        for i, site in enumerate(sites):
            p = site(p, coords[cuts[i]:cuts[i + 1]])
        return p
    return FunctionAction(act, cuts[-1])


@dataclass
class Run:
    """One training run: the loss before each step, the seconds since the start after each step, the step at
    which the criterion fired (``None``: not within ``MAX_STEPS`` or diverged) and the teleport's result."""

    losses: list
    seconds: list
    converged_at: int | None
    teleport: TeleportResult | None

    @property
    def seconds_to_criterion(self) -> float | None:
        return None if self.converged_at is None else self.seconds[self.converged_at]

    @property
    def final_loss(self) -> float:
        return self.losses[self.converged_at if self.converged_at is not None else -1]

    def steps_to(self, target: float) -> int | None:
        """Steps up to and including the first one whose loss is at most ``target``."""
        return next((i + 1 for i, loss in enumerate(self.losses) if loss <= target), None)

    def seconds_to(self, target: float) -> float | None:
        """Seconds until the first step whose loss is at most ``target``."""
        steps = self.steps_to(target)
        return None if steps is None else self.seconds[steps - 1]


@dataclass(frozen=True)
class Teleport:
    """One grid setting: the action, the ascent's learning rate and steps, and the objective's name."""

    action: FunctionAction
    lr: float
    steps: int
    objective: str = "grad"

    def teleporter(self, optimizer: torch.optim.Optimizer, params: dict) -> Teleporter:
        objective = (GradNorm() if self.objective == "grad"
                     else MetricGradNorm(optimizer_metric(optimizer, params)))
        return Teleporter(self.action, objective, steps=self.steps, lr=self.lr)


def train(kind: str, seed: int, loss_kind: str, teleport: Teleport | None = None,
          target: float | None = None) -> Run:
    """Run ``kind`` until the criterion has fired and the loss is at most ``target`` (or ``MAX_STEPS``)."""
    model, x, init, loss = problem(seed, loss_kind)
    params = {n: p.clone().requires_grad_(True) for n, p in init.items()}
    cls, lr = OPTIMIZERS[kind]
    opt = cls(params.values(), lr=lr)
    run = Run([], [], None, None)
    start = time.perf_counter()
    for step in range(MAX_STEPS):
        if teleport is not None and step == TELEPORT_AT:
            run.teleport = teleport.teleporter(opt, params)(params, loss, wrt=list(params))
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(run.teleport.params[n])
        opt.zero_grad()
        value = loss(params)
        value.backward()
        opt.step()
        run.seconds.append(time.perf_counter() - start)
        run.losses.append(float(value.detach()))
        if not math.isfinite(run.losses[-1]):
            run.converged_at = None
            break
        if run.converged_at is None and step > 0 and abs(run.losses[-1] - run.losses[-2]) < TOLERANCE:
            run.converged_at = step
        if run.converged_at is not None and (target is None or run.losses[-1] <= target):
            break
    return run


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or denominator is None else numerator / denominator


@dataclass
class Cell:
    """Per-seed speedups of one (teleport lr, steps) setting; ``None`` where the run did not get there.
    ``same_loss_steps``: plain's steps / teleported steps to the same loss (deterministic: the teleport's effect
    without its cost or the clock's noise)."""

    criterion: list
    same_loss: list
    same_loss_steps: list
    higher_loss: int            # runs that met the criterion sooner than plain but at a loss > plain's (+1%)
    rejected: int
    worst_change: float
    step_ratio: float           # plain's steps / teleported steps to the criterion, best seed

    @staticmethod
    def median(values) -> float | None:
        got = [v for v in values if v is not None]
        return statistics.median(got) if got else None


def measure_cell(kind: str, seeds, repeats: int, loss_kind: str, teleports: dict) -> Cell:
    """Interleaved plain/teleport pairs for every seed (``teleports[seed]``: that seed's setting)."""
    cell = Cell([], [], [], 0, 0, 0.0, 0.0)
    for seed in seeds:
        by_rule = {"criterion": [], "same_loss": []}
        for _ in range(repeats):
            plain = train(kind, seed, loss_kind)
            target = plain.final_loss
            tele = train(kind, seed, loss_kind, teleports[seed], target)
            by_rule["criterion"].append(ratio(plain.seconds_to_criterion, tele.seconds_to_criterion))
            by_rule["same_loss"].append(ratio(plain.seconds_to(target), tele.seconds_to(target)))
        cell.criterion.append(None if None in by_rule["criterion"] else statistics.median(by_rule["criterion"]))
        cell.same_loss.append(None if None in by_rule["same_loss"] else statistics.median(by_rule["same_loss"]))
        cell.same_loss_steps.append(ratio(plain.steps_to(target), tele.steps_to(target)))
        result = tele.teleport
        cell.rejected += not result.accepted
        if result.accepted:
            cell.worst_change = max(cell.worst_change, result.relative_loss_change)
        if tele.converged_at is not None and plain.converged_at is not None:
            cell.step_ratio = max(cell.step_ratio, (plain.converged_at + 1) / (tele.converged_at + 1))
            if cell.criterion[-1] is not None and cell.criterion[-1] > 1 and tele.final_loss > 1.01 * target:
                cell.higher_loss += 1
    return cell


def show(value: float | None, got: int, total: int) -> str:
    return f"{'  -  ' if value is None else f'{value:5.2f}'} {got}/{total}"


def summarize(cells: dict) -> dict:
    """Counts over cells (median speedup over the seeds that got there) and over single runs."""
    out = {}
    for rule in ("criterion", "same_loss", "same_loss_steps"):
        medians = [Cell.median(getattr(c, rule)) for c in cells.values()]
        runs = [v for c in cells.values() for v in getattr(c, rule)]
        got = [v for v in runs if v is not None]
        defined = [m for m in medians if m is not None]
        out[rule] = dict(cells=len(cells), cells_defined=len(defined), cells_faster=sum(m > 1 for m in defined),
                         runs=len(runs), runs_defined=len(got), runs_faster=sum(v > 1 for v in got),
                         median=statistics.median(got) if got else float("nan"), best=max(got, default=float("nan")))
    return out


def main() -> None:
    args = parse_args(__doc__, extra=lambda p: (
        p.add_argument("--seeds", type=int, default=5, help="independent draws of data and initialisation"),
        p.add_argument("--repeats", type=int, default=1, help="interleaved plain/teleport pairs per seed"),
        p.add_argument("--loss", choices=sorted(LOSSES), default="norm"),
        p.add_argument("--objective", choices=("grad", "metric"), default="grad"),
        p.add_argument("--lrs", type=lambda s: [float(v) for v in s.split(",")], default=None)))
    lrs = args.lrs or ((1e-4, 1e-3) if args.quick else (1e-6, 1e-5, 1e-4, 1e-3, 1e-2))
    step_counts = (2, 8) if args.quick else (1, 2, 4, 8, 16, 32)
    seeds = range(1 if args.quick else args.seeds)
    actions = {seed: pair_action(*problem(seed, args.loss)[:3]) for seed in seeds}
    train("GD", 0, args.loss, Teleport(actions[0], 1e-9, 1))  # warm-up (allocator, autograd, pinv kernels)
    print(f"loss {args.loss}, objective {args.objective}; {len(seeds)} seeds × {args.repeats} interleaved pairs per "
          "cell; cell: median speedup t_plain/t_teleport over the seeds that got there, and how many did — by the "
          "criterion | to the same loss")
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.5))
    for col, kind in enumerate(OPTIMIZERS):
        plains = [train(kind, seed, args.loss) for seed in seeds]
        print(f"\n{kind}: plain meets the criterion in " + ", ".join(
            f"{p.converged_at + 1} steps (L {p.final_loss:.3g}, {p.seconds_to_criterion * 1e3:.0f} ms)"
            if p.converged_at is not None else "no" for p in plains))
        print(f"{'lr, steps':>10} " + " ".join(f"{s:>21}" for s in step_counts))
        cells, grid = {}, torch.full((len(lrs), len(step_counts)), float("nan"))
        for i, lr in enumerate(lrs):
            row = []
            for j, steps in enumerate(step_counts):
                teleports = {seed: Teleport(actions[seed], lr, steps, args.objective) for seed in seeds}
                cell = cells[lr, steps] = measure_cell(kind, seeds, args.repeats, args.loss, teleports)
                crit = Cell.median(cell.criterion)
                grid[i, j] = float("nan") if crit is None else crit
                row.append(show(crit, sum(v is not None for v in cell.criterion), len(seeds)) + " | "
                           + show(Cell.median(cell.same_loss), sum(v is not None for v in cell.same_loss), len(seeds)))
            print(f"{lr:10.0e} " + " ".join(f"{c:>21}" for c in row))
        s = summarize(cells)
        higher = sum(c.higher_loss for c in cells.values())
        rejected = sum(c.rejected for c in cells.values())
        for rule, label in (("criterion", "time by the criterion"), ("same_loss", "time to the same loss"),
                            ("same_loss_steps", "steps to the same loss")):
            r = s[rule]
            print(f"{kind}, {label}: median ratio > 1 in {r['cells_faster']} of {r['cells_defined']} cells where a "
                  f"seed got there ({r['cells']} cells); runs: {r['runs_faster']} of {r['runs_defined']} above 1 "
                  f"({r['runs']} runs), median {r['median']:.3f}, best {r['best']:.2f}")
        print(f"{kind}: {higher} of the {s['criterion']['runs_faster']} runs faster by the criterion stopped at a loss "
              f"> 1.01 × plain's; {rejected} teleports rejected")
        tokens(**{f"{kind}_{key}": value for key, value in {
            "cells": len(cells), "converged_cells": s["criterion"]["cells_defined"],
            "faster_cells": s["criterion"]["cells_faster"], "median_speedup": s["criterion"]["median"],
            "max_speedup": s["criterion"]["best"], "same_loss_cells": s["same_loss"]["cells_defined"],
            "same_loss_faster_cells": s["same_loss"]["cells_faster"], "same_loss_median": s["same_loss"]["median"],
            "runs": s["criterion"]["runs"], "faster_runs": s["criterion"]["runs_faster"],
            "same_loss_faster_runs": s["same_loss"]["runs_faster"], "faster_at_higher_loss": higher,
            "fewer_steps_runs": s["same_loss_steps"]["runs_faster"],
            "same_loss_steps_median": s["same_loss_steps"]["median"],
            "same_loss_steps_best": s["same_loss_steps"]["best"],
            "rejected": rejected, "max_rel_loss_change": max(c.worst_change for c in cells.values()),
            "max_step_ratio": max(c.step_ratio for c in cells.values())}.items()})
        shown_lr, shown_steps = lrs[min(len(lrs) - 1, len(lrs) // 2 + 1)], step_counts[1]  # default: 1e-3, 2 steps
        example = train(kind, 0, args.loss, Teleport(actions[0], shown_lr, shown_steps, args.objective))
        axes[col].semilogy(plains[0].losses, "k", label=kind)
        axes[col].semilogy(example.losses, label=f"+ teleport (lr {shown_lr:g}, {shown_steps} steps)")
        axes[col].set_xlabel("step")
        axes[col].set_ylabel(f"loss ({args.loss}), seed 0")
        axes[col].legend()
        image = axes[2 + col].imshow(grid.numpy(), aspect="auto", cmap="coolwarm", vmin=0, vmax=2)
        fig.colorbar(image, ax=axes[2 + col])
        axes[2 + col].set_title(f"{kind}: median speedup by the criterion")
        axes[2 + col].set_yticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        axes[2 + col].set_xticks(range(len(step_counts)), step_counts)
        axes[2 + col].set_xlabel("ascent steps")
        axes[2 + col].set_ylabel("teleport lr")
    fig.tight_layout()
    fig.savefig(args.out / "teleport_leaky_relu.png", dpi=100)


if __name__ == "__main__":
    main()
