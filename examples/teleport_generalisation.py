"""Teleporting to change sharpness or curvature near convergence, and its effect on generalisation ([Zhao2026]
Sec. 5.3, Fig. 5.7 (SGD) and 5.8 (AdaGrad), on scikit-learn's digits instead of CIFAR-10).

Model (Sec. 5.3's smaller CIFAR size): 64 → 32 → 10 → 10, LeakyReLU(0.1), cross-entropy, mini-batches of 20,
float64; SGD and AdaGrad at learning rate 0.05 (not printed for Sec. 5.3), 40 epochs. One teleport at epoch 20 on 5
mini-batches in turn (2000 images each in [Zhao2026]; digits has 1437 training images, so 500 here), through
``TeleportingOptimizer`` (``state="transform"``, its default safeguards). Objectives, each in both directions:

* ``Sharpness`` (eq. 5.1 less the loss; displacements 0.05, 0.1 and 2×8 directions), 10 steps per batch;
* ``Curvature`` (eq. 5.2, ``k = 1`` random curve), 1 step per batch.

Action: the exact symmetries ``symalg.derive`` finds (the positive scalings at the two LeakyReLU sites, 32 + 10
coordinates), which keep the loss on every input, so the validation loss right after the teleport is unchanged
(the data-dependent ``GL`` action of [Zhao2026] keeps it only on the teleport batch, which Sec. 5.3 notes acts like
a warm restart). Steps: the normalised step of ``Teleporter`` (``lr=None``, ``‖Δ‖ = 1`` halved by the line search,
total length ≤ 1) instead of the fixed rate 5e-2, whose effect depends on the objective's scale (sharpness ≈ 1e-4
here: 5e-2 × its gradient barely moves).

Prints, per optimizer, objective and direction, the mean ± standard deviation over ``--runs`` seeds (5 as in
[Zhao2026]) of the final validation and training loss, the objective's change over the teleports, the loss kept,
and the objective measured again at the end of training; ``key=value`` tokens; saves ``teleport_generalisation.png``
(validation loss per epoch, mean over runs).
Run: ``python examples/teleport_generalisation.py [--quick] [--runs N] [--out DIR]``.
"""
from __future__ import annotations

import statistics

import matplotlib
import torch
from torch.nn import functional as F

import symalg
from symalg.applications.teleport import Curvature, Sharpness, Teleporter, as_action
from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer, model_loss
from teleport_common import classifier, digits, forever, mean_sd, parse_args, runs_option, tokens, train_epoch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WIDTHS = (64, 32, 10, 10)
OPTIMIZERS = {"SGD": lambda p: torch.optim.SGD(p, lr=0.05), "AdaGrad": lambda p: torch.optim.Adagrad(p, lr=0.05)}
OBJECTIVES = {"sharpness": (Sharpness(), 10), "curvature": (Curvature(curves=1), 1)}
"""Objective and ascent steps per batch (Sec. 5.3: 10 for sharpness, 1 for curvature)."""
DIRECTIONS = ("increase", "decrease")


def run(name, objective, direction, seed, train, val, epochs, at, teleport_batches, teleport_size):
    """One training run; ``objective=None``: no teleport. Returns per-epoch (train, val) losses, the teleport
    results and both objectives at the end of training (on the training set)."""
    (x, y), (xv, yv) = train, val
    model = classifier(seed, WIDTHS)
    action = as_action(symalg.derive(symalg.trace(model, (x[:2],))))
    data = forever(x, y, teleport_size, torch.Generator().manual_seed(seed + 1))
    measure, steps = OBJECTIVES[objective or "sharpness"]
    teleporter = Teleporter(action, measure, steps=steps, maximize=direction == "increase")
    opt = TeleportingOptimizer(OPTIMIZERS[name](model.parameters()), model, teleporter,
                               model_loss(model, F.cross_entropy), lambda: next(data),
                               Schedule(at_epochs=(at,) if objective else (), batches=teleport_batches))
    generator = torch.Generator().manual_seed(seed + 2)
    curve = []
    for _ in range(epochs):
        train_epoch(opt, model, x, y, generator)
        with torch.no_grad():
            curve.append((float(F.cross_entropy(model(x), y)), float(F.cross_entropy(model(xv), yv))))
    params = {n: p.detach() for n, p in model.named_parameters()}

    def loss(p):
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)
    final = {key: float(m(params, loss, action, list(params)).detach()) for key, (m, _) in OBJECTIVES.items()}
    return curve, opt.results, final


def main() -> None:
    args = parse_args(__doc__, runs_option(1))
    train, val = digits()
    epochs, at, tb, ts = (4, 2, 1, 200) if args.quick else (40, 20, 5, 500)
    runs = args.runs or (1 if args.quick else 5)
    print(f"digits {'-'.join(map(str, WIDTHS))} LeakyReLU(0.1), batch 20, {epochs} epochs; teleport at epoch {at} on "
          f"{tb} × {ts} images; {runs} runs (mean ± sd)")
    print(f"{'optimizer':9} {'objective':10} {'direction':9} {'val loss':>17} {'train loss':>17} {'accepted':>8} "
          f"{'obj. after/before':>17} {'max |dL|/L':>10} {'obj. at end':>17}")
    fig, axes = plt.subplots(1, len(OPTIMIZERS), figsize=(7 * len(OPTIMIZERS), 4.5), squeeze=False)
    for ax, name in zip(axes[0], OPTIMIZERS):
        for objective, direction in [(None, None)] + [(o, d) for o in OBJECTIVES for d in DIRECTIONS]:
            out = [run(name, objective, direction, seed, train, val, epochs, at, tb, ts) for seed in range(runs)]
            curves = [c for c, _, _ in out]
            val_end, train_end = mean_sd([c[-1][1] for c in curves]), mean_sd([c[-1][0] for c in curves])
            mean_val = [statistics.mean(c[e][1] for c in curves) for e in range(epochs)]
            label = "no teleport" if objective is None else f"{objective} {direction}"
            ax.plot(range(1, epochs + 1), mean_val, label=label, linestyle="--" if objective is None else "-")
            tag = f"{name}_{'plain' if objective is None else f'{objective}_{direction}'}"
            values = {f"{tag}_val_loss": val_end[0], f"{tag}_val_loss_sd": val_end[1],
                      f"{tag}_train_loss": train_end[0]}
            row = f"{name:9} {objective or '-':10} {direction or '-':9} {val_end[0]:9.4f} ± {val_end[1]:.4f} " \
                  f"{train_end[0]:9.4f} ± {train_end[1]:.4f}"
            ends = {key: mean_sd([f[key] for _, _, f in out]) for key in OBJECTIVES}
            values.update({f"{tag}_{key}_at_end": v[0] for key, v in ends.items()})
            if objective is None:
                row += "".join(f"   {key} at end {v[0]:.4g} ± {v[1]:.2g}" for key, v in ends.items())
            else:
                results = [r for _, rs, _ in out for r in rs]
                accepted = [r for r in results if r.accepted]
                ratio = [r.objective_after / r.objective_before for r in accepted]
                sign = 1 if direction == "increase" else -1
                # direction of the change: every accepted teleport moved the objective the asked way
                right_way = sum(sign * (r.objective_after - r.objective_before) > 0 for r in accepted)
                change = max((r.relative_loss_change for r in results), default=0.0)
                low, high = min(ratio, default=1.0), max(ratio, default=1.0)
                row += (f" {len(accepted):4d}/{len(results):<3d} {low:8.3g}…{high:<8.3g}"
                        f" {change:10.1e} {ends[objective][0]:9.4g} ± {ends[objective][1]:.2g}")
                values.update({f"{tag}_accepted": len(accepted), f"{tag}_teleports": len(results),
                               f"{tag}_right_way": right_way, f"{tag}_max_rel_loss_change": change,
                               f"{tag}_ratio_median": statistics.median(ratio) if ratio else 1.0})
            print(row)
            tokens(**values)
        ax.axvline(at, color="grey", linewidth=0.5)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation loss (mean over runs)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "teleport_generalisation.png", dpi=100)


if __name__ == "__main__":
    main()
