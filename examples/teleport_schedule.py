"""When and how often to teleport ([Zhao2026] Sec. 4.6.3, Fig. 4.8, on scikit-learn's digits instead of MNIST).

Model: the 64 → 16 → 10 → 10 LeakyReLU(0.1) classifier (``teleport_common.classifier``), cross-entropy, SGD with
mini-batches of 20, float64. [Zhao2026] used learning rate 2e-3 on MNIST (2500 steps per epoch); a digits epoch has
72 steps, so 0.05 here (the rate of ``teleport_digits.py``). Each teleport: ``GradNorm``, 10 ascent steps per
mini-batch of 200 (the normalised step, ``Teleporter(lr=None)``), one mini-batch after another, through
``TeleportingOptimizer`` (default safeguards); action: the exact symmetries ``symalg.derive`` finds. Panels:

* **(a) once at different epochs** on 4 mini-batches: before training (epoch 0, ``opt.teleport()``), after epoch
  1, 2, 5 or 10 (``Schedule(at_epochs=(e,), batches=4)``);
* **(b) five times with different schedules** on 4 mini-batches each: ``K = {1, 1 + i, …, 1 + 4i}`` for intervals
  ``i = 1…5``;
* **(c) after epoch 1 on different numbers of mini-batches**: 1, 2, 4, 8, 16.

``--runs`` seeds (5); prints, per setting, the training loss (whole training set) after epochs 2, 5, 10 and the last,
and the final validation loss (mean ± sd), with the teleports accepted; ``key=value`` tokens; saves
``teleport_schedule.png`` (training and validation loss per epoch, mean over runs, one panel each).
Run: ``python examples/teleport_schedule.py [--quick] [--runs N] [--out DIR]``.
"""
from __future__ import annotations

import statistics

import matplotlib
import torch
from torch.nn import functional as F

import symalg
from symalg.applications.teleport import GradNorm, Teleporter, as_action
from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer, model_loss
from teleport_common import classifier, digits, forever, mean_sd, parse_args, runs_option, tokens, train_epoch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LR, ASCENT_STEPS, TELEPORT_SIZE = 0.05, 10, 200


def panels(quick):
    """Panel → {label: (teleport epochs, mini-batches per teleport)}; epoch 0 is before training."""
    if quick:
        return {"a": {"epoch 0": ((0,), 2), "epoch 1": ((1,), 2)}, "b": {"interval 1": ((1, 2), 2)},
                "c": {"1 batch": ((1,), 1), "4 batches": ((1,), 4)}}
    return {"a": {f"epoch {e}": ((e,), 4) for e in (0, 1, 2, 5, 10)},
            "b": {f"interval {i}": (tuple(1 + i * k for k in range(5)), 4) for i in range(1, 6)},
            "c": {f"{n} batch{'es' if n > 1 else ''}": ((1,), n) for n in (1, 2, 4, 8, 16)}}


def run(seed, at, n_batches, train, val, epochs):
    """Per-epoch (train, validation) loss, index 0 at initialisation; and the teleports' results."""
    (x, y), (xv, yv) = train, val
    model = classifier(seed)
    action = as_action(symalg.derive(symalg.trace(model, (x[:2],))))
    data = forever(x, y, TELEPORT_SIZE, torch.Generator().manual_seed(seed + 1))
    opt = TeleportingOptimizer(torch.optim.SGD(model.parameters(), lr=LR), model,
                               Teleporter(action, GradNorm(), steps=ASCENT_STEPS), model_loss(model, F.cross_entropy),
                               lambda: next(data), Schedule(at_epochs=tuple(e for e in at if e > 0), batches=n_batches))

    def losses():
        with torch.no_grad():
            return float(F.cross_entropy(model(x), y)), float(F.cross_entropy(model(xv), yv))
    curve = [losses()]
    if 0 in at:
        opt.teleport()
    generator = torch.Generator().manual_seed(seed + 2)
    for _ in range(epochs):
        train_epoch(opt, model, x, y, generator)
        curve.append(losses())
    return curve, opt.results


def main() -> None:
    args = parse_args(__doc__, runs_option(1))
    epochs = 4 if args.quick else 25
    runs = args.runs or (1 if args.quick else 5)
    marks = [m for m in (2, 5, 10) if m < epochs] + [epochs]
    train, val = digits()
    layout = panels(args.quick)
    print(f"digits 64-16-10-10 LeakyReLU(0.1), SGD lr {LR}, batch 20, {epochs} epochs; teleports of {ASCENT_STEPS} "
          f"GradNorm steps per mini-batch of {TELEPORT_SIZE}; {runs} runs (mean ± sd)")
    print(f"{'panel':5} {'setting':12} " + " ".join(f"{'train L@' + str(m):>16}" for m in marks)
          + f" {'val L end':>16} {'accepted':>9}")
    plain = [run(seed, (), 1, train, val, epochs) for seed in range(runs)]
    fig, axes = plt.subplots(1, len(layout), figsize=(6 * len(layout), 4.5), squeeze=False)
    for ax, (panel, settings) in zip(axes[0], layout.items()):
        for label, (at, n_batches) in {"no teleport": ((), 1), **settings}.items():
            out = plain if not at else [run(seed, at, n_batches, train, val, epochs) for seed in range(runs)]
            cells = [mean_sd([curve[m][0] for curve, _ in out]) for m in marks]
            val_end = mean_sd([curve[-1][1] for curve, _ in out])
            results = [r for _, rs in out for r in rs]
            accepted = sum(r.accepted for r in results)
            print(f"{panel:5} {label:12} " + " ".join(f"{m:8.4f} ± {s:<5.3f}" for m, s in cells)
                  + f" {val_end[0]:8.4f} ± {val_end[1]:<5.3f} {accepted:4d}/{len(results):<4d}")
            tag = f"{panel}_{label.replace(' ', '_')}"
            tokens(**{f"{tag}_train_{m}": c[0] for m, c in zip(marks, cells)}, **{f"{tag}_val_end": val_end[0],
                   f"{tag}_accepted": accepted, f"{tag}_teleports": len(results),
                   f"{tag}_max_rel_loss_change": max((r.relative_loss_change for r in results), default=0.0)})
            train_mean, val_mean = ([statistics.mean(curve[e][c] for curve, _ in out) for e in range(epochs + 1)]
                                    for c in (0, 1))
            (line,) = ax.plot(range(epochs + 1), train_mean, "-", label=label, color="black" if not at else None)
            ax.plot(range(epochs + 1), val_mean, ":", color=line.get_color())
        ax.set_yscale("log")
        ax.set_title(f"({panel}) train (solid), validation (dotted)")
        ax.set_xlabel("epoch")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "teleport_schedule.png", dpi=100)


if __name__ == "__main__":
    main()
