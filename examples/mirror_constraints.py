"""Structured constraints from mirror symmetries: the reproductions, at CPU sizes (docs/mirrors.md).

Six experiments, each with a plot and ``key=value`` tokens (``--only NAME`` runs one):

* ``sparsity``    — ``wᵀx`` vs ``(w⊙u)ᵀx`` under batch-1 SGD over a learning-rate sweep: fraction of ``|v_i| < 1e-6``;
  for the collapsed coordinates, the conserved ``u_i² − w_i²`` of gradient flow before and after (its drift);
* ``lowrank``     — numerical rank of ``W U`` vs the label noise ``μ``, and of ``(I + W)(I + U)`` (residual);
* ``correlation`` — correlation of a digits MLP's penultimate neurons with and without weight decay;
* ``plasticity``  — 10 tasks in sequence, Adam without momentum, dead parameters of four arms;
* ``landscape``   — ``(wu − 1)²`` and ``−‖θ‖² + ‖θ‖⁴``: GD started on a mirror's fixed set stays on it;
* ``dcs``         — a digits CNN with every parameter ``u ⊙ w`` (the DCS in the coordinate basis) vs vanilla.

    python examples/mirror_constraints.py --out DIR [--quick] [--only sparsity ...]
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import matplotlib
import torch
from torch import nn

from symalg.applications.constraint_engineering import FixedRandomBias, add_gradient_noise
from symmetry_ensembles import load as load_digits_split

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def sparsity(out: Path, quick: bool) -> None:
    d, steps = (50, 4000) if quick else (200, 30000)
    lrs = [0.01, 0.03, 0.05, 0.07, 0.1, 0.15] if quick else [0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05]
    g = torch.Generator().manual_seed(0)
    L = len(lrs)
    lr = torch.tensor(lrs).unsqueeze(1)
    w_plain = torch.zeros(L, d)
    u = torch.full((L, d), 0.3) + 0.05 * torch.randn(L, d, generator=g)
    w = torch.full((L, d), 0.3) + 0.05 * torch.randn(L, d, generator=g)
    q0 = u ** 2 - w ** 2
    scale = 1.0
    for _ in range(steps):
        x = torch.randn(d, generator=g)
        y = x.mean() + torch.randn((), generator=g)
        r_plain = w_plain @ x - y
        w_plain = w_plain - lr * scale * r_plain.unsqueeze(1) * x
        r = (u * w) @ x - y
        u, w = u - lr * scale * r.unsqueeze(1) * x * w, w - lr * scale * r.unsqueeze(1) * x * u
        w_plain[~torch.isfinite(w_plain).all(1) | (w_plain.abs() > 1e6).any(1)] = float("nan")   # diverged
        bad = ~torch.isfinite(u).all(1) | (u.abs() > 1e6).any(1)
        u[bad], w[bad] = float("nan"), float("nan")
    v = u * w
    plain_sparse = torch.where(w_plain.isnan().any(1), float("nan"), (w_plain.abs() < 1e-6).double().mean(1))
    sym_sparse = torch.where(v.isnan().any(1), float("nan"), (v.abs() < 1e-6).double().mean(1))
    for i, eta in enumerate(lrs):
        collapsed = v[i].abs() < 1e-6
        q_before = float(q0[i][collapsed].abs().min()) if collapsed.any() else float("nan")
        q_after = float((u[i] ** 2 - w[i] ** 2)[collapsed].abs().max()) if collapsed.any() else float("nan")
        print(f"sparsity lr={eta * scale:.3g} plain={float(plain_sparse[i]):.3f} hadamard={float(sym_sparse[i]):.3f} "
              f"min_abs_Q_initial_collapsed={q_before:.3g} max_abs_Q_final_collapsed={q_after:.3g}")
    print(f"sparsity_plain_max={float(plain_sparse.nan_to_num(0).max()):.4f} "
          f"sparsity_hadamard_max={float(sym_sparse.nan_to_num(0).max()):.4f}")
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot([e * scale for e in lrs], plain_sparse, "o-", label="wᵀx")
    ax.plot([e * scale for e in lrs], sym_sparse, "s-", label="(w⊙u)ᵀx")
    ax.set(xlabel="learning rate", ylabel="fraction |v_i| < 1e-6", title=f"sparsity, d={d}, {steps} SGD steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "mirrors_sparsity.png", dpi=120)


def _rank(M: torch.Tensor, tol: float = 1e-3) -> int:
    """The number of singular values above ``tol`` (absolute: the target's are ``μ``)."""
    return int((torch.linalg.svdvals(M) > tol).sum())


def lowrank(out: Path, quick: bool) -> None:
    d, steps, lr = (20, 6000, 0.04) if quick else (50, 40000, 0.016)
    mus = [0.0, 0.05, 0.1, 0.2, 0.5, 1.0]
    noise_std = torch.sqrt(2.0 / torch.arange(1, d + 1))
    eye = torch.eye(d)
    ranks, residual_ranks = [], []
    for mu in mus:
        g = torch.Generator().manual_seed(1)
        W, U = [0.3 * torch.randn(d, d, generator=g) / math.sqrt(d) + 0.3 * torch.eye(d) for _ in range(2)]
        Wr, Ur = [0.01 * torch.randn(d, d, generator=g) for _ in range(2)]
        for _ in range(steps):
            x = torch.randn(d, generator=g)
            y = mu * x + (1 - mu) * noise_std * torch.randn(d, generator=g)
            r = W @ (U @ x) - y
            W, U = W - lr * torch.outer(r, U @ x), U - lr * torch.outer(W.T @ r, x)
            A, B = eye + Wr, eye + Ur
            rr = A @ (B @ x) - y
            Wr, Ur = Wr - lr * torch.outer(rr, B @ x), Ur - lr * torch.outer(A.T @ rr, x)
        ranks.append(_rank(W @ U))
        residual_ranks.append(_rank((eye + Wr) @ (eye + Ur)))
        print(f"lowrank mu={mu} rank_WU={ranks[-1]} rank_residual={residual_ranks[-1]} d={d}")
    print(f"lowrank_min_rank={min(ranks)} lowrank_residual_min_rank={min(residual_ranks)}")
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot(mus, ranks, "o-", label="W U x")
    ax.plot(mus, residual_ranks, "s-", label="(I + W)(I + U) x")
    ax.set(xlabel="μ (signal fraction)", ylabel="numerical rank (σ > 1e-3)", title=f"rank, d={d}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "mirrors_lowrank.png", dpi=120)


def _digits(seed: int = 0):
    """Digits in [0, 1], split 75 % / 25 % (symmetry_ensembles.load), as float32."""
    xtr, ytr, xte, yte = load_digits_split(seed)
    return xtr.float(), ytr, xte.float(), yte


def correlation(out: Path, quick: bool) -> None:
    xtr, ytr, xte, yte = _digits()
    epochs = 15 if quick else 150
    fig, axes = plt.subplots(2, 2, figsize=(6.5, 6))
    for col, wd in enumerate((0.0, 1e-3 if not quick else 1e-2)):
        torch.manual_seed(0)
        body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128))
        head = nn.Sequential(nn.ReLU(), nn.Linear(128, 10))
        opt = torch.optim.SGD(list(body.parameters()) + list(head.parameters()), lr=0.1, momentum=0.9,
                              weight_decay=wd)
        for _ in range(epochs):
            for idx in torch.randperm(len(xtr)).split(128):
                opt.zero_grad()
                nn.functional.cross_entropy(head(body(xtr[idx])), ytr[idx]).backward()
                opt.step()
        with torch.no_grad():
            pre = body(xte)
            acc = float((head(pre).argmax(1) == yte).float().mean())
        for row, acts in enumerate((pre, torch.relu(pre))):
            alive = acts.std(0) > 1e-8
            C = torch.corrcoef(acts[:, alive].T)
            order = torch.argsort(torch.linalg.eigh(C)[1][:, -1])
            C = C[order][:, order]
            off = C[~torch.eye(len(C), dtype=torch.bool)]
            kind = "pre" if row == 0 else "post"
            print(f"correlation wd={wd} {kind}_alive={int(alive.sum())} {kind}_frac_abs_corr_above_0.9="
                  f"{float((off.abs() > 0.9).double().mean()):.4f} accuracy={acc:.3f}")
            axes[row, col].imshow(C, vmin=-1, vmax=1, cmap="RdBu_r")
            axes[row, col].set_title(f"{kind}-activation, wd={wd}", fontsize=9)
            axes[row, col].axis("off")
    fig.tight_layout()
    fig.savefig(out / "mirrors_correlation.png", dpi=120)


def plasticity(out: Path, quick: bool) -> None:
    d, tasks, steps = 100, (4 if quick else 10), (300 if quick else 2500)
    arms = ("vanilla", "u⊙w", "u⊙w + noise", "u⊙w + random bias")
    dead: dict[str, list[int]] = {arm: [] for arm in arms}
    for arm in arms:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(2)
        if arm == "vanilla":
            params = [nn.Parameter(0.01 * torch.randn(d))]
        else:
            params = [nn.Parameter(0.1 * torch.randn(d)), nn.Parameter(0.1 * torch.randn(d))]
        shift = FixedRandomBias((d,), 1e-2 if arm.endswith("bias") else 0.0, torch.Generator().manual_seed(3))
        handles = add_gradient_noise(params, 1e-2, torch.Generator().manual_seed(4)) if arm.endswith("noise") else []
        opt = torch.optim.Adam(params, lr=1e-2, betas=(0.0, 0.999))

        def v() -> torch.Tensor:
            return params[0] if len(params) == 1 else shift(params[0]) * shift(params[1])
        for _ in range(tasks):
            x = torch.randn(100, d, generator=g)
            y = x.mean(1) + torch.randn(100, generator=g)
            for _ in range(steps):
                idx = torch.randint(0, 100, (16,), generator=g)
                opt.zero_grad()
                ((x[idx] @ v() - y[idx]) ** 2).mean().backward()
                opt.step()
            grads = torch.autograd.grad(((x @ v() - y) ** 2).mean(), params)
            dead[arm].append(int(sum((gr.abs() < 1e-6).sum() for gr in grads)))
        for h in handles:
            h.remove()
        print(f"plasticity arm={arm.replace(' ', '')} dead_per_task={dead[arm]}")
    print(" ".join(f"dead_final_{i}={dead[arm][-1]}" for i, arm in enumerate(arms)))
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for arm in arms:
        ax.plot(range(1, tasks + 1), dead[arm], "o-", label=arm)
    ax.set(xlabel="task", ylabel="parameters with |∂L/∂θ| < 1e-6", title="loss of plasticity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "mirrors_plasticity.png", dpi=120)


def landscape(out: Path, quick: bool) -> None:
    def f1(p: torch.Tensor) -> torch.Tensor:
        return (p[..., 0] * p[..., 1] - 1) ** 2

    def f2(p: torch.Tensor) -> torch.Tensor:
        r2 = (p ** 2).sum(-1)
        return -r2 + r2 ** 2
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.3))
    grid = torch.linspace(-1.6, 1.6, 161)
    P = torch.stack(torch.meshgrid(grid, grid, indexing="xy"), -1)
    worst = 0.0
    starts = {0: [(0.3, 0.3), (-0.4, 0.4), (1.5, 1.5), (-1.2, 1.2)],
              1: [(0.1, 0.05), (-0.2, 0.3), (1.2, -0.6), (0.05, -0.02)]}
    for k, (f, ax) in enumerate(zip((f1, f2), axes)):
        ax.contour(grid, grid, f(P), levels=30, linewidths=0.5)
        for s in starts[k]:
            p = torch.tensor(s, dtype=torch.float64, requires_grad=True)
            direction = p.detach() / p.detach().norm()
            path = [p.detach().clone()]
            for _ in range(200):
                (gr,) = torch.autograd.grad(f(p), p)
                p = (p - 0.01 * gr).detach().requires_grad_(True)
                path.append(p.detach().clone())
            trace = torch.stack(path)
            # on the fixed set: u = ±w for the first landscape, the starting ray for the second
            off = (trace[:, 0].abs() - trace[:, 1].abs()).abs().max() if k == 0 else \
                (trace - (trace @ direction).unsqueeze(1) * direction).norm(dim=1).max()
            worst = max(worst, float(off))
            ax.plot(trace[:, 0], trace[:, 1], "-", lw=1.5)
        ax.set_title(["(wu − 1)²: u = ±w invariant", "−‖θ‖² + ‖θ‖⁴: rays invariant"][k], fontsize=9)
    print(f"landscape_max_offline={worst:.3g}")
    fig.tight_layout()
    fig.savefig(out / "mirrors_landscape.png", dpi=120)


class _Hadamard(nn.Module):
    """Every parameter ``θ = u ⊙ w`` (the DCS in the coordinate basis: ``O`` the identity)."""

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base
        self.names = [n for n, _ in base.named_parameters()]
        self.u = nn.ParameterList()
        self.w = nn.ParameterList()
        for _, p in base.named_parameters():
            root = p.detach().abs().sqrt()
            self.u.append(nn.Parameter(torch.sign(p.detach()) * root))
            self.w.append(nn.Parameter(root.clone()))

    def effective(self) -> dict[str, torch.Tensor]:
        return {n: u * w for n, u, w in zip(self.names, self.u, self.w)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.base, self.effective(), (x,))


def dcs(out: Path, quick: bool) -> None:
    xtr, ytr, xte, yte = _digits()
    xtr, xte = xtr.reshape(-1, 1, 8, 8), xte.reshape(-1, 1, 8, 8)
    epochs, wd = (20, 5e-4) if quick else (100, 5e-4)
    results = {}
    curves = {}
    for arm in ("vanilla", "u⊙w"):
        torch.manual_seed(0)
        cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(256, 10))
        model: nn.Module = cnn if arm == "vanilla" else _Hadamard(cnn)
        lr = 0.05 if arm == "vanilla" else 0.2      # u⊙w moves θ by 2|θ|·lr·∇: a larger lr for a comparable pace
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
        curves[arm] = []
        for _ in range(epochs):
            for idx in torch.randperm(len(xtr)).split(128):
                opt.zero_grad()
                nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                opt.step()
            sched.step()
            with torch.no_grad():
                curves[arm].append(float((model(xte).argmax(1) == yte).float().mean()))
        with torch.no_grad():
            theta = model.effective() if isinstance(model, _Hadamard) else dict(cnn.named_parameters())
            flat = torch.cat([t.reshape(-1) for t in theta.values()])
            sparse = float((flat.abs() < 1e-6).float().mean())
            zeroed = {n: torch.where(t.abs() < 1e-6, torch.zeros_like(t), t) for n, t in theta.items()}
            acc_zeroed = float((torch.func.functional_call(cnn, zeroed, (xte,)).argmax(1) == yte).float().mean())
        results[arm] = (curves[arm][-1], sparse, acc_zeroed)
        print(f"dcs arm={arm} accuracy={curves[arm][-1]:.4f} sparsity={sparse:.4f} accuracy_zeroed={acc_zeroed:.4f}")
    fig, axes = plt.subplots(1, 2, figsize=(7, 3))
    for arm, curve in curves.items():
        axes[0].plot(range(1, epochs + 1), curve, label=arm)
    axes[0].set(xlabel="epoch", ylabel="test accuracy")
    axes[0].legend()
    axes[1].bar(list(results), [r[1] for r in results.values()])
    axes[1].set(ylabel="fraction |θ| < 1e-6")
    fig.tight_layout()
    fig.savefig(out / "mirrors_dcs.png", dpi=120)


EXPERIMENTS = {"sparsity": sparsity, "lowrank": lowrank, "correlation": correlation, "plasticity": plasticity,
               "landscape": landscape, "dcs": dcs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds each)")
    parser.add_argument("--only", nargs="*", choices=sorted(EXPERIMENTS), default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.only or EXPERIMENTS:
        start = time.perf_counter()
        EXPERIMENTS[name](args.out, args.quick)
        print(f"seconds_{name}={time.perf_counter() - start:.1f}")


if __name__ == "__main__":
    main()
