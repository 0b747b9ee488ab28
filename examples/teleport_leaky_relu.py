"""Wall-clock speedup of teleportation on the three-layer LeakyReLU regression of dissertation Sec. 4.6.2/4.6.4.

Setup (Sec. 4.6.2): ``min ‖Y − W₃σ(W₂σ(W₁X))‖`` with ``W₁ ∈ R^{6×5}``, ``W₂ ∈ R^{7×6}``, ``W₃ ∈ R^{8×7}``, no biases,
``X ∈ R^{5×4}`` (4 samples), ``Y ∈ R^{8×4}``, σ = LeakyReLU(0.1); data and weights uniform on [0, 1]. GD uses
learning rate 1e-4, AdaGrad 1e-1. The loss is the Frobenius norm (not squared), as written.
Convergence (Sec. 4.6.4): the first step whose loss differs from the previous one by less than 1e-3, within
2000 steps (else "no"). One teleport at step 5, maximising ``‖∇L‖²`` (``GradNorm``, as in Ch. 4 for both GD and
AdaGrad; AdaGrad's state is kept).

The action is the dissertation's: LeakyReLU's only exact linear symmetries are positive scalings and
permutations, so Ch. 4 teleports with the data-dependent ``GL(d)`` action of eq. 4.13 for bijective activations
on each pair of adjacent layers (``symalg.teleport_actions.ExactTeleport`` at both hidden sites, widths 6 and 7,
85 coordinates). With batch 4 ≤ the layer's input width it preserves the loss on the batch exactly. We use
``complete=True`` (adds back ``W̃(I − hh⁺)``): without it ``c = 0`` is not the identity (it projects the weights
onto the data span, changing ``‖∇L‖²`` by a few per cent before any ascent); completed it is a group action.
Other differences: ``g = exp(T)`` (exact, composed) instead of ``I + T``,
and each ascent step is clipped to ``‖Δ‖ ≤ 1`` (``Teleporter.max_step``). Grid (Sec. 4.6.4): teleport learning
rates × numbers of ascent steps 1…32; speedup = t_plain / t_teleport, the median over 3 interleaved pairs of
runs (1 with ``--quick``). "Converged" is the criterion above, which can fire at a higher loss than plain
training reaches: the loss at convergence is printed next to each speedup. The dissertation's learning rates
1e-9…1e-5 are for its own loss scaling and do nothing here
(‖∇L‖² gain < 1.01 at 1e-5 and 8 steps), so the grid is shifted to 1e-6…1e-2 (5 × 6 cells, as there).

Prints tables and ``key=value`` tokens; saves ``teleport_leaky_relu.png``.
Run: ``python examples/teleport_leaky_relu.py [--quick] [--out DIR]``.
"""
from __future__ import annotations

import statistics
import time

import matplotlib
import torch
from torch import nn

from symalg.nonlinear_actions import FeedForward
from symalg.teleport import FunctionAction, Teleporter, as_action
from symalg.teleport_actions import ExactTeleport
from teleport_common import parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MAX_STEPS, TOLERANCE, TELEPORT_AT = 2000, 1e-3, 5
OPTIMIZERS = {"GD": (torch.optim.SGD, 1e-4), "AdaGrad": (torch.optim.Adagrad, 1e-1)}


def problem(seed: int):
    """Model, data, initial parameters (uniform on [0, 1]) and the loss of a parameter dict."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 6, bias=False), nn.LeakyReLU(0.1), nn.Linear(6, 7, bias=False),
                          nn.LeakyReLU(0.1), nn.Linear(7, 8, bias=False))
    x, y = torch.rand(4, 5), torch.rand(4, 8)
    params = {name: torch.rand_like(p) for name, p in model.named_parameters()}

    def loss(p):
        return torch.linalg.norm(y - torch.func.functional_call(model, p, (x,)))
    return model, x, params, loss


def pair_action(model, x, params):
    """Eq. 4.13 at both hidden sites, one after the other: coordinates ``(T₁ ∈ gl(6), T₂ ∈ gl(7))``."""
    net = FeedForward.from_sequential(model)
    sites = [as_action(ExactTeleport(net, s, complete=True), x=x, params=params) for s in range(net.sites)]
    cuts = [0]
    for site in sites:
        cuts.append(cuts[-1] + site.dim)

    def act(p, coords):
        for i, site in enumerate(sites):
            p = site(p, coords[cuts[i]:cuts[i + 1]])
        return p
    return FunctionAction(act, cuts[-1])


def train(kind, seed, teleporter=None):
    """Run ``kind`` until converged; returns (losses, seconds to convergence or None, teleport result)."""
    model, x, init, loss = problem(seed)
    params = {n: p.clone().requires_grad_(True) for n, p in init.items()}
    cls, lr = OPTIMIZERS[kind]
    opt = cls(params.values(), lr=lr)
    losses, result = [], None
    start = time.perf_counter()
    for step in range(MAX_STEPS):
        if teleporter is not None and step == TELEPORT_AT:
            result = teleporter(params, loss, wrt=list(params))
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(result.params[n])
        opt.zero_grad()
        value = loss(params)
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
        if not torch.isfinite(value):
            return losses, None, result
        if step > 0 and abs(losses[-1] - losses[-2]) < TOLERANCE:
            return losses, time.perf_counter() - start, result
    return losses, None, result


def paired(kind, seed, repeats, teleporter):
    """``repeats`` interleaved (plain, teleport) runs: the trajectories are deterministic, only the clock varies
    (the machine is loaded), so the speedup is the median of the per-pair ratios t_plain / t_teleport."""
    ratios = []
    for _ in range(repeats):
        _, t_plain, _ = train(kind, seed)
        losses, t, result = train(kind, seed, teleporter)
        ratios.append(None if t is None or t_plain is None else t_plain / t)
    return losses, (None if None in ratios else statistics.median(ratios)), result


def main() -> None:
    args = parse_args(__doc__)
    lrs = (1e-4, 1e-3) if args.quick else (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
    step_counts = (2, 8) if args.quick else (1, 2, 4, 8, 16, 32)
    repeats, seed = (1, 0) if args.quick else (3, 0)
    model, x, params, _ = problem(seed)
    action = pair_action(model, x, params)
    paired("GD", seed, 1, Teleporter(action, steps=1, lr=1e-9))  # warm-up (allocator, autograd, pinv kernels)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for col, kind in enumerate(OPTIMIZERS):
        plain, t_plain, _ = train(kind, seed)
        print(f"\n{kind}: plain converges in {len(plain)} steps at loss {plain[-1]:.3g}, {t_plain * 1e3:.1f} ms "
              f"(one run); cells: speedup t_plain/t_teleport (steps, loss at convergence)")
        print(f"{'lr, steps':>10} " + " ".join(f"{s:>24}" for s in step_counts))
        speedups, step_ratios, cells, rejected, worst_change = [], [], 0, 0, 0.0
        grid = torch.full((len(lrs), len(step_counts)), float("nan"))
        for i, lr in enumerate(lrs):
            row = []
            for j, steps in enumerate(step_counts):
                losses, speedup, r = paired(kind, seed, repeats, Teleporter(action, steps=steps, lr=lr))
                cells += 1
                rejected += not r.accepted
                if r.accepted:
                    worst_change = max(worst_change, r.relative_loss_change)
                mark = "" if r.accepted else " rej"
                if speedup is None:
                    row.append(f"no conv.{mark}")
                    continue
                speedups.append(speedup)
                step_ratios.append(len(plain) / len(losses))
                grid[i, j] = speedup
                row.append(f"{speedup:5.2f} ({len(losses):4d}, L {losses[-1]:.3g}){mark}")
                if steps == max(step_counts) and lr == lrs[len(lrs) // 2]:
                    axes[col].semilogy(losses, label=f"{kind} + teleport (lr {lr:g}, {steps} steps)")
            print(f"{lr:10.0e} " + " ".join(f"{c:>24}" for c in row))
        axes[col].semilogy(plain, "k", label=kind)
        axes[col].set_xlabel("step")
        axes[col].set_ylabel("loss ‖Y − f(X)‖")
        axes[col].legend()
        if kind == "GD":
            fig.colorbar(axes[2].imshow(grid.numpy(), aspect="auto", cmap="coolwarm", vmin=0, vmax=2), ax=axes[2])
        faster = sum(s > 1 for s in speedups)
        print(f"{kind}: speedup > 1 in {faster} of {cells} cells ({cells - len(speedups)} without convergence, "
              f"{rejected} teleports rejected); median speedup {statistics.median(speedups) if speedups else float('nan'):.3f}")
        tokens(**{f"{kind}_plain_steps": len(plain), f"{kind}_plain_seconds": t_plain if t_plain else float("nan"),
                  f"{kind}_cells": cells, f"{kind}_faster_cells": faster, f"{kind}_converged_cells": len(speedups),
                  f"{kind}_rejected": rejected, f"{kind}_max_rel_loss_change": worst_change,
                  f"{kind}_max_step_ratio": max(step_ratios) if step_ratios else float("nan"),
                  f"{kind}_plain_final_loss": plain[-1],
                  f"{kind}_median_speedup": statistics.median(speedups) if speedups else float("nan"),
                  f"{kind}_max_speedup": max(speedups) if speedups else float("nan")})
    axes[2].set_title("GD speedup (rows: teleport lr, cols: steps)")
    axes[2].set_yticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
    axes[2].set_xticks(range(len(step_counts)), step_counts)
    fig.tight_layout()
    fig.savefig(args.out / "teleport_leaky_relu.png", dpi=100)


if __name__ == "__main__":
    main()
