"""Learning to teleport ([Zhao2026] Sec. 5.5, Fig. 5.12): LSTM meta-optimisers for the update and the group element.

Task: ``L = ‖Y − W₂σ(W₁X)‖``, all four matrices ``size × size`` standard normal, σ = LeakyReLU(0.1); the group is
``GL(size)`` acting by eq. 4.13 (exact: ``X`` is square and invertible). Methods, all on the same unseen test
trajectories:

- ``GD``: gradient descent at the printed rate 3e-4, and at the largest rate of a grid that does not diverge
  (``tuned``: every loss finite and never above the start over the trajectory);
- ``LSTM(update)``: ``m₁`` only (``g_t = I``); ``LSTM(update,tele)``: ``m₁`` and ``m₂``;
  ``LSTM(lr,tele)``: ``m₂`` and a learned learning rate;
- the ablation ``LSTM(update,tele), g_t = I``: the ``m₁`` trained with ``m₂``, run without its group elements.

Sizes (``--size``: the run's settings, printed at the start):

- ``--size full``: the printed ones (hidden 300, 100 steps, unroll 10, 700/600/30 training trajectories, 5 test
  trajectories, meta rates 1e-4 and 1e-3) — hours on two CPU cores;
- ``--size reduced`` (default): the same task, steps, unroll, meta rates and test trajectories, hidden 32 and
  ``--train`` (default 12) training trajectories per method;
- ``--quick``: 6 × 6 matrices, hidden 8, 20 steps, unroll 5, 2 training trajectories, meta rates 1e-2 (a smoke
  run).

Prints ``key=value`` tokens (final test loss mean and std per method, seconds per meta-training trajectory and per
test step, the largest relative loss change of any learned teleport) and saves ``learn_to_teleport.png``
(test loss, mean ± std over the test trajectories).
Run: ``python examples/learn_to_teleport.py [--quick] [--size reduced|full] [--train N] [--hidden H]
[--meta-lrs a,b] [--seed S] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import os

import matplotlib
import numpy as np
import torch

from symalg.applications.learn_to_teleport import (Curves, MetaOptimizer, evaluate, gd_curves, largest_stable_lr,
                                                   leaky_relu_task, meta_train)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SIZES = {
    "full": dict(size=20, hidden=300, steps=100, unroll=10, train={"update+tele": 700, "update": 600, "lr+tele": 30},
                 test=5, meta_lrs=(1e-4, 1e-3)),
    "reduced": dict(size=20, hidden=32, steps=100, unroll=10, train=None, test=5, meta_lrs=(1e-4, 1e-3)),
    "quick": dict(size=6, hidden=8, steps=20, unroll=5, train=None, test=5, meta_lrs=(1e-2, 1e-2)),
}
PRINTED_GD_LR = 3e-4
GD_GRID = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0)
LABELS = {"update": "LSTM(update)", "update+tele": "LSTM(update,tele)", "lr+tele": "LSTM(lr,tele)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--size", choices=("reduced", "full"), default="reduced")
    parser.add_argument("--train", type=int, default=None, help="training trajectories per method")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--meta-lrs", default=None, help="meta learning rates of m1,m2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = dict(SIZES["quick" if args.quick else args.size])
    hidden = args.hidden or cfg["hidden"]
    meta_lrs = tuple(float(v) for v in args.meta_lrs.split(",")) if args.meta_lrs else cfg["meta_lrs"]
    default_train = 2 if args.quick else 12
    train = cfg["train"] or {m: args.train or default_train for m in LABELS}
    steps, unroll, size = cfg["steps"], cfg["unroll"], cfg["size"]
    print(f"settings: size={size} hidden={hidden} steps={steps} unroll={unroll} train={train} test={cfg['test']} "
          f"meta_lrs={meta_lrs}", flush=True)

    test = [leaky_relu_task(args.seed + s, size=size) for s in range(cfg["test"])]           # unseen: other seeds
    stable, finals = largest_stable_lr(test, GD_GRID, steps)
    print("GD final loss by rate: " + ", ".join(f"{lr:g}: {v:.4g}" for lr, v in finals.items()), flush=True)
    curves: dict[str, Curves] = {f"GD lr={PRINTED_GD_LR:g}": gd_curves(test, PRINTED_GD_LR, steps)}
    if stable is not None and stable != PRINTED_GD_LR:
        curves[f"GD lr={stable:g} (tuned)"] = gd_curves(test, stable, steps)
    tokens = {"stable_lr": stable, "gd_final": curves[f"GD lr={PRINTED_GD_LR:g}"].mean[-1],
              "gd_s_per_step": curves[f"GD lr={PRINTED_GD_LR:g}"].seconds_per_step}
    worst = 0.0
    for k, (mode, label) in enumerate(LABELS.items()):
        torch.manual_seed(args.seed)       # the same m₁ at the start of every method
        meta = MetaOptimizer(mode, hidden=hidden)
        tasks = (leaky_relu_task(10_000 * (k + 1) + args.seed + s, size=size) for s in range(train[mode]))
        log = meta_train(meta, tasks, steps=steps, unroll=unroll, lrs=meta_lrs)
        result = evaluate(meta, test, steps)
        curves[label] = result
        worst = max(worst, result.teleport_change)
        tokens.update({f"{mode}_final": result.mean[-1], f"{mode}_final_std": result.std[-1],
                       f"{mode}_s_per_traj": float(np.mean(log.seconds)), f"{mode}_s_per_step": result.seconds_per_step,
                       f"{mode}_diverged": sum(log.diverged)})
        if mode == "update+tele":            # ablation: the same trained m₁ with g_t = I
            plain = MetaOptimizer("update", hidden=hidden)
            plain.m1 = meta.m1
            ablated = evaluate(plain, test, steps)
            curves["LSTM(update,tele), g_t = I"] = ablated
            tokens.update({"update+tele_without_g_final": ablated.mean[-1],
                           "update+tele_without_g_final_std": ablated.std[-1]})
        print(f"{label}: meta-loss first/last trajectory {log.meta_losses[0]:.4g} / {log.meta_losses[-1]:.4g}, "
              f"test final {result.mean[-1]:.4g} ± {result.std[-1]:.2g}", flush=True)
    tokens["max_teleport_change"] = worst

    print(f"\n{'method':28s} {'L(0)':>9s} {'L(T/2)':>9s} {'L(T)':>18s} {'s/test step':>12s}")
    for name, c in curves.items():
        print(f"{name:28s} {c.mean[0]:9.4g} {c.mean[steps // 2]:9.4g} {c.mean[-1]:9.4g} ± {c.std[-1]:<6.2g} "
              f"{c.seconds_per_step:12.2e}")
    print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in tokens.items()))

    fig, ax = plt.subplots(figsize=(6, 4))
    t = np.arange(steps + 1)
    for name, c in curves.items():
        ax.plot(t, c.mean, label=name)
        ax.fill_between(t, c.mean - c.std, c.mean + c.std, alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("test loss  ‖Y − W₂σ(W₁X)‖")
    ax.set_yscale("log")
    ax.set_title(f"learning to teleport ({size}×{size}, hidden {hidden}, mean ± std over {len(test)} tests)",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(args.out, exist_ok=True)
    fig.savefig(os.path.join(args.out, "learn_to_teleport.png"), dpi=120)


if __name__ == "__main__":
    main()
