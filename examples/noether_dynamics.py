"""Noether for learning dynamics: the paper's three experiments, reproduced with ``symalg.noether``.

1. **Toy** ``L(w) = (‖w‖² − 1)²`` in ``R³`` (invariant under ``O(3)``): gradient flow from ``(0.1, 0.1, 0.1)``;
   Newtonian dynamics and Nesterov's flow from ``w = (0.5, 0.5, 0.5)``, ``ẇ = (−2, 1, 1)``. Nesterov's flow starts at
   ``t₀ = 1`` (its friction ``3/t`` is infinite at ``t = 0``, where the paper starts it). Angular momentum
   ``w × ẇ``: zero along gradient flow, conserved by Newtonian dynamics, ``(t₀/t)³ (w × ẇ)(t₀)`` along Nesterov's flow;
   energy ``½‖ẇ‖² + L``: conserved, resp. dissipated as ``∫ 3/t ‖ẇ‖²``.
2. **Balance** on scikit-learn's 8×8 digits (in place of KMNIST): 1000 images, ReLU MLP 64-200-200-200-10 with biases,
   negative log-likelihood, learning rate 0.01, the paper's GD, discrete Newtonian (eq. 21) and Nesterov (eq. 20)
   schemes. Quantity of layer ``h = 2``: ``‖W₂‖² + ‖b₂‖² − ‖W₃‖²`` (the bias term is needed: nn.Linear has biases),
   and the exact one-step identities of each scheme (``noether.check_scheme``) along the same runs.
3. **Chain law**: 64-200-200-200-200-10 with ReLU, RePU(2), RePU(2), ReLU (spec front end: ``relu_pow(alpha=2)``),
   gradient flow (RK4) on 1000 digits, MSE to one-hot targets. The paper's ``Δ‖W₂‖² = p^k Δ‖W₄‖²`` (``p^k = 4``) holds
   without biases; with biases the law is ``Δ(‖W₂‖² + ‖b₂‖²) + 2Δ‖b₃‖² = 4Δ‖W₄‖²``. Both are printed.
4. **Swish with trainable β** (:func:`swish`): the per-neuron law of eq. (37), derived by symalg from the traced module.

Prints ``key=value`` tokens; saves ``noether_toy.png``, ``noether_balance.png``, ``noether_chain.png``.
Run: ``python examples/noether_dynamics.py [--quick] [--out DIR]``.
"""
from __future__ import annotations

import matplotlib
import torch
from torch.nn import functional as F

import symalg
from symalg import noether
from teleport_common import digits, parse_args, tokens

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def toy(out, quick: bool) -> None:
    loss = lambda p: ((p["w"] ** 2).sum() - 1) ** 2  # noqa: E731
    vec = lambda *x: {"w": torch.tensor(x, dtype=torch.float64)}  # noqa: E731
    duration, steps = (10.0, 2000) if quick else (20.0, 20000)
    runs = {"GF": noether.integrate(noether.gradient_flow(), loss, vec(0.1, 0.1, 0.1), None, duration, steps),
            "ND": noether.integrate(noether.newtonian(), loss, vec(0.5, 0.5, 0.5), vec(-2.0, 1.0, 1.0), duration,
                                    steps),
            "NAGF": noether.integrate(noether.nesterov_flow(1.0), loss, vec(0.5, 0.5, 0.5), vec(-2.0, 1.0, 1.0),
                                      duration, steps)}
    J = {name: [torch.linalg.cross(th["w"], v["w"]) for th, v in zip(run.thetas, run.velocities)]
         for name, run in runs.items()}
    nag = runs["NAGF"]
    flow = noether.nesterov_flow(1.0)
    law = max(float((j - flow.phi(time) * J["NAGF"][0]).abs().max()) for j, time in zip(J["NAGF"], nag.times))
    first = J["ND"][0]
    tokens(toy_initial_Jx=float(first[0]), toy_initial_Jy=float(first[1]), toy_initial_Jz=float(first[2]),
           toy_gf_angular_max=max(float(j.abs().max()) for j in J["GF"]),
           toy_gf_loss_increase_max=max(b - a for a, b in zip(runs["GF"].losses, runs["GF"].losses[1:])),
           toy_nd_angular_drift=max(float((j - J["ND"][0]).abs().max()) for j in J["ND"]),
           toy_nd_energy_drift=max(abs(runs["ND"].energy(i) - runs["ND"].energy(0))
                                   for i in range(len(runs["ND"].times))),
           toy_nd_plane_max=max(abs(float(th["w"][1] - th["w"][2])) for th in runs["ND"].thetas),
           toy_nag_angular_law_error=law,
           toy_nag_plane_max=max(abs(float(th["w"][1] - th["w"][2])) for th in nag.thetas),
           toy_nag_final_radius=float(nag.thetas[-1]["w"].norm()),
           toy_nag_energy_balance_error=max(abs(nag.energy(i) + nag.dissipated[i] - nag.energy(0))
                                            for i in range(len(nag.times))))
    fig = plt.figure(figsize=(13, 7))
    ax = fig.add_subplot(2, 3, 1, projection="3d")
    for name, run in runs.items():
        w = torch.stack([th["w"] for th in run.thetas]).numpy()
        ax.plot(w[:, 0], w[:, 1], w[:, 2], label=name)
    ax.set_title("trajectories (ND, NAGF in the plane y = z)")
    ax.legend()
    for index, (name, run) in enumerate(runs.items()):
        ax = fig.add_subplot(2, 3, 2 + index)
        ax.plot(run.times, run.losses, label="loss")
        ax.plot(run.times, [float(j.norm()) for j in J[name]], label="‖w × ẇ‖")
        if name != "GF":
            ax.plot(run.times, [run.energy(i) for i in range(len(run.times))], label="energy")
        ax.set_title(name)
        ax.set_xlabel("t")
        ax.legend()
    ax = fig.add_subplot(2, 3, 5)
    ax.semilogy(nag.times, [float(j.norm()) for j in J["NAGF"]], label="‖w × ẇ‖ (NAGF)")
    ax.semilogy(nag.times, [flow.phi(s) * float(J["NAGF"][0].norm()) for s in nag.times], "--", label="(t₀/t)³ law")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "noether_toy.png", dpi=110)
    plt.close(fig)


def mlp(widths, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(widths) - 2 else [])
    return torch.nn.Sequential(*layers).double()


def balances(p, layers: int) -> list[float]:
    """``A_h = ‖W_h‖² + ‖b_h‖² − ‖W_{h+1}‖²`` for ``h = 1 … layers − 1`` (Linear layers at even indices)."""
    norm = lambda k: float((p[f"{2 * k}.weight"] ** 2).sum())  # noqa: E731
    return [norm(h) + float((p[f"{2 * h}.bias"] ** 2).sum()) - norm(h + 1) for h in range(layers - 1)]


def balance(out, quick: bool) -> None:
    (x, y), _ = digits(0)
    n, widths, steps = (200, (64, 32, 32, 32, 10), 30) if quick else (1000, (64, 200, 200, 200, 10), 400)
    x, y = x[:n], y[:n]
    model = mlp(widths)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p):
        return F.nll_loss(F.log_softmax(torch.func.functional_call(model, p, (x,)), -1), y)

    def quantity(p):   # ‖W₂‖² + ‖b₂‖² − ‖W₃‖² (layers "2" and "4" of the Sequential)
        return float((p["2.weight"] ** 2).sum() + (p["2.bias"] ** 2).sum() - (p["4.weight"] ** 2).sum())

    schemes = {"GD": noether.gd(0.01), "ND": noether.paper_newtonian(0.01), "NAGD": noether.paper_nesterov(0.01)}
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    values = {}
    for ax, (name, scheme) in zip(axes, schemes.items()):
        taken, final = noether.run_scheme(scheme, lambda k: loss, params, steps)
        series = [quantity(s.theta) for s in taken] + [quantity(final)]
        w2 = [float((s.theta["2.weight"] ** 2).sum()) for s in taken]
        w3 = [float((s.theta["4.weight"] ** 2).sum()) for s in taken]
        checks = noether.check_scheme(analysis.symmetries, lambda k: loss, params, scheme, min(steps, 20))
        values[f"balance_{name}_change"] = abs(series[-1] - series[0])
        values[f"balance_{name}_w2_change"] = abs(w2[-1] - w2[0])
        values[f"balance_{name}_identity_error"] = max(c.max_error for c in checks)
        values[f"balance_{name}_identity_tolerance"] = min(c.tolerance for c in checks)
        values[f"balance_{name}_final_loss"] = float(loss(final))
        if name == "ND":   # the paper's (34): Σ_h |A_h(t)| − Σ_h |A_h(0)| ≤ 4 (L(0) − L*) t², L* ≥ 0, t = k√η
            sums = [sum(abs(a) for a in balances(s.theta, len(widths) - 1)) for s in taken]
            values["balance_ND_bound_ratio"] = max((b - sums[0]) / (4 * float(loss(params)) * (k * 0.1) ** 2)
                                                   for k, b in enumerate(sums) if k)
        ax.plot([a - w2[0] for a in w2], label="Δ‖W₂‖²")
        ax.plot([a - w3[0] for a in w3], label="Δ‖W₃‖²")
        ax.plot([a - series[0] for a in series], label="Δ(‖W₂‖² + ‖b₂‖² − ‖W₃‖²)")
        ax.set_title(f"{name} (lr 0.01)")
        ax.set_xlabel("step")
        ax.legend()
    tokens(**values)
    fig.tight_layout()
    fig.savefig(out / "noether_balance.png", dpi=110)
    plt.close(fig)


def chain_run(quick: bool, bias: bool):
    """Gradient flow on the ReLU/RePU(2)/RePU(2)/ReLU chain: the trajectory and the parameter names in order."""
    (x, y), _ = digits(0)
    n, h, duration, steps = (200, 24, 0.5, 60) if quick else (1000, 200, 2.0, 400)
    x, y = x[:n], y[:n]
    o = "" if bias else ", bias=False"
    spec = (f"linear(64, {h}{o}) -> relu -> linear({h}, {h}{o}) -> relu_pow(alpha=2) -> linear({h}, {h}{o}) -> "
            f"relu_pow(alpha=2) -> linear({h}, {h}{o}) -> relu -> linear({h}, 10{o})")
    analysis = symalg.derive(spec)
    alphas = [s.group.homogeneity for s in analysis.symmetries if s.group.kind == "PS"]
    model = analysis.model_graph.model.double()
    params = {k: (0.5 * v.detach().double()) for k, v in model.named_parameters()}
    target = F.one_hot(y, 10).double()

    def loss(p):
        return ((torch.func.functional_call(model, p, (x,)) - target) ** 2).mean()

    run = noether.integrate(noether.gradient_flow(), loss, params, None, duration, steps, samples=50)
    names = sorted({k.rsplit(".", 1)[0] for k in params}, key=lambda s: int(s.split(".")[-1]))
    return run, names, alphas


def chain(out, quick: bool) -> None:
    plain, names, _ = chain_run(quick, bias=False)
    growth = [float((th[f"{names[1]}.weight"] ** 2).sum() - (plain.thetas[0][f"{names[1]}.weight"] ** 2).sum()
                    - 4 * ((th[f"{names[3]}.weight"] ** 2).sum() - (plain.thetas[0][f"{names[3]}.weight"] ** 2).sum()))
              for th in plain.thetas]
    run, names, alphas = chain_run(quick, bias=True)
    sq = lambda th, k: float((th[k] ** 2).sum())  # noqa: E731
    W2, W4, b2, b3 = f"{names[1]}.weight", f"{names[3]}.weight", f"{names[1]}.bias", f"{names[2]}.bias"
    d = lambda key: [sq(th, key) - sq(run.thetas[0], key) for th in run.thetas]  # noqa: E731
    dW2, dW4, db2, db3 = d(W2), d(W4), d(b2), d(b3)
    paper = max(abs(a - 4 * b) for a, b in zip(dW2, dW4))
    corrected = max(abs(a + c + 2 * e - 4 * b) for a, b, c, e in zip(dW2, dW4, db2, db3))
    tokens(chain_alphas="_".join(str(a) for a in alphas), chain_nobias_law_error=max(abs(g) for g in growth),
           chain_nobias_dW2=float((plain.thetas[-1][f"{names[1]}.weight"] ** 2).sum()
                                  - (plain.thetas[0][f"{names[1]}.weight"] ** 2).sum()),
           chain_dW2=dW2[-1], chain_4dW4=4 * dW4[-1],
           chain_paper_law_error=paper, chain_corrected_law_error=corrected,
           chain_loss_start=run.losses[0], chain_loss_end=run.losses[-1])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(run.times, dW2, label="Δ‖W₂‖²")
    ax.plot(run.times, [4 * b for b in dW4], "--", label="p^k Δ‖W₄‖² (p^k = 4)")
    ax.plot(run.times, [a + c + 2 * e for a, c, e in zip(dW2, db2, db3)], ":", label="Δ(‖W₂‖²+‖b₂‖²) + 2Δ‖b₃‖²")
    ax.set_xlabel("t (gradient flow)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "noether_chain.png", dpi=110)
    plt.close(fig)


class SwishNet(torch.nn.Module):
    """``fc2(z ⊙ σ(β ⊙ z))``, ``z = fc1(x)``, with a trainable β per neuron."""

    def __init__(self, n: int, h: int, m: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(n, h), torch.nn.Linear(h, m, bias=False)
        self.beta = torch.nn.Parameter(1 + torch.rand(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.fc1(x)
        return self.fc2(z * torch.sigmoid(self.beta * z))


def swish(quick: bool) -> None:
    """Swish with a trainable β per neuron: symalg derives ``PositiveScaling`` with ``β ↦ β/c`` from the traced
    module, and its conserved quantity ``q = ‖W₁[i]‖² + b₁ᵢ² − βᵢ² − ‖W₂[:, i]‖²`` (the paper's eq. 37) is
    checked along gradient flow."""
    (x, y), _ = digits(0)
    x, target = x[:200], F.one_hot(y[:200], 10).double()
    g, h = torch.Generator().manual_seed(2), 16
    model = SwishNet(64, h, 10).double()
    params = {"fc1.weight": torch.randn(h, 64, generator=g, dtype=torch.float64) / 8,   # larger than torch's default
              "fc1.bias": torch.randn(h, generator=g, dtype=torch.float64),            # so that β moves visibly
              "beta": 1 + torch.rand(h, generator=g, dtype=torch.float64),
              "fc2.weight": torch.randn(10, h, generator=g, dtype=torch.float64) / 4}
    model.load_state_dict(params)
    analysis = symalg.derive(symalg.trace(model, (x[:8],)))
    quantity = next(s for s in analysis.symmetries if s.group.kind == "PS").conserved
    assert quantity is not None

    def loss(p):
        return (torch.func.functional_call(model, p, (x,)) - target).pow(2).mean()

    def per_neuron(p):
        return next(iter(quantity(p).values()))

    run = noether.integrate(noether.gradient_flow(), loss, params, None, 1.0 if quick else 5.0, 200 if quick else 1000)
    drift = float((per_neuron(run.thetas[-1]) - per_neuron(run.thetas[0])).abs().max())
    moved = float((run.thetas[-1]["beta"] - run.thetas[0]["beta"]).abs().max())
    tokens(swish_law_error=drift, swish_beta_moved=moved)


def main() -> None:
    args = parse_args(__doc__)
    swish(args.quick)
    toy(args.out, args.quick)
    balance(args.out, args.quick)
    chain(args.out, args.quick)


if __name__ == "__main__":
    main()
