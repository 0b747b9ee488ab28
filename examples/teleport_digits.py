"""Teleportation with SGD, momentum, AdaGrad, RMSProp and Adam on scikit-learn's digits ([Zhao2026] Sec. 5.4.2).

Model (Sec. 5.4.2, 8×8 digits instead of MNIST): 64 → 16 → 10 → 10, LeakyReLU(0.1), cross-entropy, mini-batches of
20, float64; 1437 training / 360 validation images. Teleport once after the first epoch on one mini-batch of 200,
3 ascent steps of learning rate 5e-2 (see ``TELEPORT_STEPS``), through ``TeleportingOptimizer`` (``state="transform"``).

Action: the exact symmetries symalg derives for the traced model (``PositiveScaling(16)``, ``PositiveScaling(10)``
at the LeakyReLU sites, ``Translations`` of the logits): batch 200 > width 16, so the data-dependent ``GL`` action
would not keep the loss ([Zhao2026] accepted that error; ``TeleportingOptimizer`` rejects such teleports).
Objective: ``GradNorm`` for SGD and momentum, ``MetricGradNorm(optimizer_metric(opt))`` (the decay rate of the
optimizer's next step, eq. 5.7) for AdaGrad, RMSProp and Adam.

Overhead: wall-clock seconds of the teleport (the ``end_epoch()`` call that runs it, optimizer state update
included) divided by the median time of one training epoch of the same run.

Prints a table and ``key=value`` tokens; saves ``teleport_digits.png`` (validation loss per epoch).
Run: ``python examples/teleport_digits.py [--quick] [--out DIR]``.
"""
from __future__ import annotations

import statistics
import time

import matplotlib
import torch
from torch.nn import functional as F

import symalg
from symalg.applications.teleport import GradNorm, MetricGradNorm, Teleporter, as_action, optimizer_metric
from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer, model_loss
from teleport_common import batches, classifier, digits, parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPTIMIZERS = {"SGD": lambda p: torch.optim.SGD(p, lr=0.05),
              "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
              "AdaGrad": lambda p: torch.optim.Adagrad(p, lr=0.05),
              "RMSProp": lambda p: torch.optim.RMSprop(p, lr=1e-3),
              "Adam": lambda p: torch.optim.Adam(p, lr=1e-3)}


def evaluate(model, x, y):
    with torch.no_grad():
        logits = model(x)
        return float(F.cross_entropy(logits, y)), float((logits.argmax(-1) == y).double().mean())


TELEPORT_BATCHES, TELEPORT_STEPS = 1, 3
"""One teleport: 3 ascent steps on one batch of 200 images. [Zhao2026]'s 8 batches × 10 steps cost
about 700 training steps, 8–10 digits epochs of 68 steps (its MNIST epochs had 2,500); this fits in one."""


def run(name, teleporting, train, val, epochs, seed=0):
    """Train one model; returns per-epoch validation losses, final metrics, epoch seconds and teleport seconds."""
    (x, y), (xv, yv) = train, val
    model = classifier(seed)
    optimizer = OPTIMIZERS[name](model.parameters())
    named = dict(model.named_parameters())
    objective = GradNorm() if name in ("SGD", "momentum") else MetricGradNorm(optimizer_metric(optimizer, named))
    action = as_action(symalg.derive(symalg.trace(model, (x[:2],))))
    generator = torch.Generator().manual_seed(seed + 1)
    teleport_data = batches(x, y, 200, generator)
    opt = TeleportingOptimizer(optimizer, model, Teleporter(action, objective, steps=TELEPORT_STEPS, lr=5e-2),
                               model_loss(model, F.cross_entropy), lambda: next(teleport_data),
                               Schedule(at_epochs=(1,) if teleporting else (), batches=TELEPORT_BATCHES),
                               state="transform")
    val_losses, epoch_seconds, teleport_seconds = [evaluate(model, xv, yv)[0]], [], 0.0
    for _ in range(epochs):
        start = time.perf_counter()
        for xb, yb in batches(x, y, 20, generator):
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
        epoch_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        opt.end_epoch()
        teleport_seconds += time.perf_counter() - start
        val_losses.append(evaluate(model, xv, yv)[0])
    return val_losses, evaluate(model, x, y), evaluate(model, xv, yv), epoch_seconds, teleport_seconds, opt.results


def main() -> None:
    args = parse_args(__doc__)
    epochs = 2 if args.quick else 20
    names = ("SGD", "AdaGrad") if args.quick else tuple(OPTIMIZERS)
    train, val = digits()
    fig, ax = plt.subplots(figsize=(8, 5))
    print(f"digits 64-16-10-10 LeakyReLU(0.1), batch 20, {epochs} epochs; one teleport after epoch 1 "
          f"({TELEPORT_BATCHES} × 200 "
          f"images, {TELEPORT_STEPS} steps, lr 5e-2)")
    print(f"{'optimizer':9} {'teleport':8} {'train loss':>10} {'train acc':>9} {'val loss':>9} {'val acc':>8} "
          f"{'epoch s':>8} {'teleport s':>10} {'overhead':>8} {'accepted':>8} {'obj. gain':>9} {'max |dL|/L':>10}")
    for name in names:
        for teleporting in (False, True):
            curve, (tl, ta), (vl, va), epoch_s, tele_s, results = run(name, teleporting, train, val, epochs)
            epoch = statistics.median(epoch_s)
            accepted = [r for r in results if r.accepted]
            gain = statistics.median(r.objective_after / r.objective_before for r in accepted) if accepted else 1.0
            change = max((r.relative_loss_change for r in accepted), default=0.0)
            tag = f"{name}_{'teleport' if teleporting else 'plain'}"
            print(f"{name:9} {'yes' if teleporting else 'no':8} {tl:10.4f} {ta:9.4f} {vl:9.4f} {va:8.4f} {epoch:8.3f} "
                  + (f"{tele_s:10.3f} {tele_s / epoch:8.3f} {len(accepted):5d}/{len(results):<2d} {gain:9.3g} "
                     f"{change:10.1e}" if teleporting else ""))
            values = {f"{tag}_train_loss": tl, f"{tag}_train_acc": ta, f"{tag}_val_loss": vl, f"{tag}_val_acc": va,
                      f"{tag}_epoch_seconds": epoch}
            if teleporting:
                values.update({f"{name}_teleport_seconds": tele_s, f"{name}_overhead_epochs": tele_s / epoch,
                               f"{name}_accepted": len(accepted), f"{name}_teleports": len(results),
                               f"{name}_objective_gain": gain, f"{name}_max_rel_loss_change": change})
            tokens(**values)
            ax.plot(curve, ("-" if teleporting else "--"), label=f"{name}{' + teleport' if teleporting else ''}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "teleport_digits.png", dpi=100)


if __name__ == "__main__":
    main()
