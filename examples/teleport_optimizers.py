"""Teleportation integrated with momentum and AdaGrad ([Zhao2026] Sec. 5.4.1, Fig. 5.9a/b).

Problem (Sec. 5.4.1, the same as Sec. 4.6.2; ``teleport_leaky_relu.problem``): ``min ‖Y − W₃σ(W₂σ(W₁X))‖`` with
``X ∈ R^{5×4}``, ``Y ∈ R^{8×4}``, ``W₁ 6×5``, ``W₂ 7×6``, ``W₃ 8×7``, σ = LeakyReLU(0.1), data and weights uniform on
[0, 1] (one draw per seed), full batch. Action: eq. 4.13's data-dependent ``GL`` at both hidden sites
(``teleport_leaky_relu.pair_action``; exact on the batch since 4 samples ≤ the widths). One teleport after step 5
through ``TeleportingOptimizer`` (its default safeguards: trust region 1, next-step test).

* **Momentum** (Fig. 5.9a): SGD, learning rate 1e-4 (not printed), momentum 0.9; teleport by ``GradNorm``, 10 ascent
  steps of rate 1e-3; three strategies = ``TeleportingOptimizer(state=...)``: ``"transform"`` (teleport the momentum
  too, ``m ↦ J⁻ᵀm``), ``"keep"`` (parameters only), ``"reset"`` (momentum to 0); against no teleport.
* **AdaGrad** (Fig. 5.9b): learning rate 0.1, teleport by ``GradNorm`` at rate 1.2e-5 and by
  ``MetricGradNorm(optimizer_metric(opt))`` (``‖∇L‖_A``, eq. 5.7) at rate 7.5e-3, [Zhao2026]'s rates, 10 steps.

``--runs`` seeds (5 as in [Zhao2026]); prints, per setting, the loss after 10, 50, 100 and the last step
(mean ± sd), the teleports accepted and their ``‖∇L‖²`` gain, the largest relative loss change of a teleport, and the
steps each run needs to reach the loss at which its plain run ended; ``key=value`` tokens; saves
``teleport_optimizers.png`` (mean loss per step, log scale).
Run: ``python examples/teleport_optimizers.py [--quick] [--runs N] [--out DIR]``.
"""
from __future__ import annotations

import statistics

import matplotlib
import torch

from symalg.applications.teleport import GradNorm, MetricGradNorm, Teleporter, optimizer_metric
from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer
from teleport_common import mean_sd, parse_args, runs_option, tokens
from teleport_leaky_relu import pair_action, problem

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TELEPORT_AT, ASCENT_STEPS = 5, 10
SETTINGS = {
    "momentum": {"plain": None, "transform": ("grad", 1e-3, "transform"), "keep": ("grad", 1e-3, "keep"),
                 "reset": ("grad", 1e-3, "reset")},
    "AdaGrad": {"plain": None, "grad": ("grad", 1.2e-5, "transform"), "metric": ("metric", 7.5e-3, "transform")},
}
"""Per optimizer: setting → (objective, teleport learning rate, state handling), ``None`` for no teleport."""


def make_optimizer(kind, params):
    if kind == "momentum":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    return torch.optim.Adagrad(params, lr=0.1)


def run(kind, setting, seed, steps):
    """Losses before each step, and the teleports' results."""
    model, x, init, loss = problem(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])
    optimizer = make_optimizer(kind, model.parameters())
    spec = SETTINGS[kind][setting]
    objective, lr, state = spec or ("grad", 0.0, "keep")
    measure = GradNorm() if objective == "grad" else MetricGradNorm(optimizer_metric(optimizer,
                                                                                     dict(model.named_parameters())))
    opt = TeleportingOptimizer(optimizer, model, Teleporter(pair_action(model, x, init), measure, steps=ASCENT_STEPS,
                                                            lr=lr),
                               lambda p, batch: loss(p), lambda: None,
                               Schedule(at_steps=(TELEPORT_AT,) if spec else ()), state=state)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        value = loss(dict(model.named_parameters()))
        value.backward()
        losses.append(float(value.detach()))
        opt.step()
    return losses, opt.results


def main() -> None:
    args = parse_args(__doc__, runs_option(2))
    steps = 100 if args.quick else 300
    runs = args.runs or (2 if args.quick else 5)
    marks = [m for m in (10, 50, 100) if m < steps] + [steps]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    print(f"LeakyReLU regression (5-6-7-8, 4 samples), one teleport after step {TELEPORT_AT}, {ASCENT_STEPS} ascent "
          f"steps; {steps} steps, {runs} runs (mean ± sd)")
    for ax, kind in zip(axes, SETTINGS):
        plain_end = {}
        print(f"\n{kind:9} {'setting':9} " + " ".join(f"{'L@' + str(m):>17}" for m in marks)
              + f" {'accepted':>8} {'‖∇L‖² gain':>11} {'max |dL|/L':>10} {'steps to plain end':>18}")
        for setting in SETTINGS[kind]:
            out = [run(kind, setting, seed, steps) for seed in range(runs)]
            if setting == "plain":
                plain_end = {seed: losses[-1] for seed, (losses, _) in enumerate(out)}
            cells = [mean_sd([losses[m - 1] for losses, _ in out]) for m in marks]
            reach = [next((i + 1 for i, v in enumerate(losses) if v <= plain_end[seed]), None)
                     for seed, (losses, _) in enumerate(out)]
            results = [r for _, rs in out for r in rs]
            accepted = [r for r in results if r.accepted]
            gain = statistics.median(r.objective_after / r.objective_before for r in accepted) if accepted else 1.0
            change = max((r.relative_loss_change for r in accepted), default=0.0)
            reached = [s for s in reach if s is not None]
            print(f"{kind:9} {setting:9} " + " ".join(f"{m:9.4g} ± {s:<5.2g}" for m, s in cells)
                  + (f" {len(accepted):4d}/{len(results):<3d} {gain:11.3g} {change:10.1e}" if results else " " * 36)
                  + f" {statistics.median(reached) if reached else float('nan'):10.0f} ({len(reached)}/{runs})")
            tag = f"{kind}_{setting}"
            tokens(**{f"{tag}_loss_{m}": c[0] for m, c in zip(marks, cells)}, **{f"{tag}_loss_end_sd": cells[-1][1]},
                   **({f"{tag}_accepted": len(accepted), f"{tag}_teleports": len(results), f"{tag}_gain": gain,
                       f"{tag}_max_rel_loss_change": change} if results else {}),
                   **{f"{tag}_steps_to_plain_end": statistics.median(reached) if reached else float("nan")})
            mean = [statistics.mean(losses[i] for losses, _ in out) for i in range(steps)]
            ax.plot(range(steps), mean, label=setting, linestyle="--" if setting == "plain" else "-")
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (mean over runs)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "teleport_optimizers.png", dpi=100)


if __name__ == "__main__":
    main()
