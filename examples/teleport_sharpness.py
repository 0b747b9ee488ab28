"""Correlation of sharpness (eq. 5.1) and curvature (eq. 5.2) with validation loss over many trained models
(dissertation Sec. 5.2.3, Fig. 5.3/5.4, on scikit-learn's digits instead of MNIST).

Models: the 64 → 16 → 10 → 10 LeakyReLU(0.1) classifier of Sec. 5.2.3, trained with SGD from different seeds,
learning rates (0.01, 0.03, 0.1), batch sizes (8, 32, 128) and epochs (4, 8), float64. Measures at the trained
parameters, on the training set:

* sharpness: ``symalg.applications.teleport.Sharpness`` (eq. 5.1 less the loss) with [Zhao2026]'s displacements
  ``T = 0.001, 0.011, …, 0.191`` and ``|D|`` = 50 antithetic direction pairs (200 in [Zhao2026]; 10 and
  6 models with ``--quick``);
* curvature: ``symalg.applications.teleport.Curvature`` (eq. 5.2) averaged over 8 random curves ``exp(tM)·θ`` of the
  exact symmetries symalg derives (positive scalings of the LeakyReLU sites, logit translations); [Zhao2026]
  used ``k = 1`` curve of its data-dependent ``GL`` action.

``--identical``: the protocol of Sec. 5.2.3 instead, 100 models that differ only in the seed (initialisation and
batch order), SGD at 0.01, batch 20, 40 epochs, ``|D|`` = 2×100 directions, curvature of ``k = 1`` curve (and, beside
it, the mean over 8); printed beside Table 5.1's coefficients. Sharpness is reported both as eq. 5.1 prints it,
``φ = mean L(θ + t d)`` (which contains the loss), and as ``φ − L`` (``Sharpness``). ``--models N`` overrides the count.

Prints each model, then Pearson and Spearman correlations with the validation loss (and, for reference, the
train loss and the generalisation gap); saves ``teleport_sharpness.png``.
Run: ``python examples/teleport_sharpness.py [--quick] [--identical] [--models N] [--out DIR]``.
"""
from __future__ import annotations

import itertools

import matplotlib
import torch
from scipy import stats
from torch.nn import functional as F

import symalg
from symalg.applications.teleport import Curvature, Sharpness, as_action
from teleport_common import batches, classifier, digits, parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DISPLACEMENTS = tuple(0.001 + 0.01 * i for i in range(20))
TABLE_5_1 = {"sharpness": {"MNIST": 0.704, "Fashion-MNIST": 0.790, "CIFAR-10": 0.899},
             "curvature": {"MNIST": -0.050, "Fashion-MNIST": -0.232, "CIFAR-10": -0.167}}
"""[Zhao2026] Table 5.1: Pearson correlation of eq. 5.1 / eq. 5.2 with the validation loss (100 models each)."""


def train_model(seed, lr, batch, epochs, train):
    x, y = train
    model = classifier(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for xb, yb in batches(x, y, batch, generator):
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model


def measures(model, train, val, sharpness, curves):
    """(train loss, validation loss, sharpness φ − L, curvature mean over ``curves``, curvature of curve 0)."""
    (x, y), (xv, yv) = train, val
    params = {n: p.detach() for n, p in model.named_parameters()}
    action = as_action(symalg.derive(symalg.trace(model, (x[:2],))))

    def loss(p):
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)
    wrt = list(params)
    with torch.no_grad():
        train_loss = float(loss(params))
        val_loss = float(F.cross_entropy(model(xv), yv))
        sharp = float(sharpness(params, loss, action, wrt))
    per_curve = [float(Curvature(curves=1, seed=s)(params, loss, action, wrt).detach()) for s in range(curves)]
    return train_loss, val_loss, sharp, sum(per_curve) / curves, per_curve[0]


def correlations(a, b):
    return float(stats.pearsonr(a, b)[0]), float(stats.spearmanr(a, b)[0])


def options(parser) -> None:
    parser.add_argument("--identical", action="store_true",
                        help="Sec. 5.2.3's protocol: identical hyper-parameters, only the seed differs")
    parser.add_argument("--models", type=int, default=None, help="number of models")


def main() -> None:
    args = parse_args(__doc__, options)
    train, val = digits()
    if args.identical:
        count, directions, curves, epochs = (6, 10, 2, 2) if args.quick else (100, 100, 8, 40)
        count = args.models or count
        settings = [(seed, 0.01, 20, epochs) for seed in range(count)]
    else:
        grid = list(itertools.product((0.01, 0.03, 0.1), (8, 32, 128), (4, 8)))
        count, directions, curves = (6, 10, 2) if args.quick else (54, 50, 8)
        count = args.models or count
        settings = [(seed, *grid[(3 * seed if args.quick else seed) % len(grid)]) for seed in range(count)]
    sharpness = Sharpness(displacements=DISPLACEMENTS, directions=directions, seed=0)
    rows = []
    print(f"{count} models (SGD on digits), sharpness |T| = 20, |D| = 2×{directions}; curvature over {curves} curves")
    print(f"{'seed':>4} {'lr':>5} {'batch':>5} {'epochs':>6} {'train L':>8} {'val L':>8} "
          f"{'sharpness':>10} {'curvature':>10} {'curv. k=1':>10}")
    for seed, lr, batch, epochs in settings:
        row = measures(train_model(seed, lr, batch, epochs, train), train, val, sharpness, curves)
        rows.append(row)
        print(f"{seed:4d} {lr:5.2f} {batch:5d} {epochs:6d} {row[0]:8.4f} {row[1]:8.4f} {row[2]:10.4g} {row[3]:10.4g} "
              f"{row[4]:10.4g}")
    train_loss, val_loss, sharp, curv, curv1 = (list(c) for c in zip(*rows))
    phi = [s + t for s, t in zip(sharp, train_loss)]                     # eq. 5.1 as printed: contains the loss
    gap = [v - t for t, v in zip(train_loss, val_loss)]
    print(f"\n{'measure':10} {'vs':10} {'Pearson':>8} {'Spearman':>8}")
    values = {}
    for name, measure in (("sharpness", sharp), ("phi", phi), ("curvature", curv), ("curvature_k1", curv1)):
        for target_name, target in (("val_loss", val_loss), ("gap", gap)):
            pearson, spearman = correlations(measure, target)
            print(f"{name:10} {target_name:10} {pearson:8.3f} {spearman:8.3f}")
            values[f"{name}_{target_name}_pearson"], values[f"{name}_{target_name}_spearman"] = pearson, spearman
    pearson, spearman = correlations(train_loss, val_loss)
    print(f"{'train loss':10} {'val_loss':10} {pearson:8.3f} {spearman:8.3f}")
    if args.identical:
        print("\nTable 5.1 (Pearson with validation loss; MNIST / Fashion-MNIST / CIFAR-10) vs digits, measured:")
        for name, measured in (("sharpness", ("phi", "sharpness")), ("curvature", ("curvature_k1", "curvature"))):
            printed = " / ".join(f"{v:+.3f}" for v in TABLE_5_1[name].values())
            here = ", ".join(f"{m} {values[f'{m}_val_loss_pearson']:+.3f}" for m in measured)
            print(f"  {name:10} printed {printed}   measured: {here}")
        print(f"  spread: val loss {min(val_loss):.4f}…{max(val_loss):.4f}, train loss {min(train_loss):.4f}…"
              f"{max(train_loss):.4f}, gap {min(gap):.4f}…{max(gap):.4f}")
    tokens(models=count, **values, train_loss_val_loss_pearson=pearson, train_loss_val_loss_spearman=spearman)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, measure, label in ((axes[0], phi, "sharpness φ (eq. 5.1)"), (axes[1], sharp, "φ − L"),
                               (axes[2], curv1 if args.identical else curv, "curvature ψ (eq. 5.2)")):
        ax.scatter(measure, val_loss)
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss")
    fig.tight_layout()
    fig.savefig(args.out / ("teleport_sharpness_identical.png" if args.identical else "teleport_sharpness.png"),
                dpi=100)


if __name__ == "__main__":
    main()
