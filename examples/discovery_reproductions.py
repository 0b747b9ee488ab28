"""The papers' discovery experiments [Zhao2026, ch. 6], with consistent shapes and numbers instead of heat maps.

For each model: the exact first-order null space (:func:`symalg.discover`: dimension, derived, explained, new), then
learned discovery (:func:`symalg.discovery.learned.learn`, the papers' losses with the corrected closure term) and
what the learned fields are at held-out parameters: the fraction of their norm that the derived tangent explains,
the fraction in the exact discovered tangent but not the derived one (genuinely new), the rest (spurious); and the
held-out relative loss change along ``a_φ(exp(t h), θ, X)`` for ``|t| ≤ 1`` against random directions of the same
speed. Shapes (torch layout ``W ∈ R^{out×in}``; the papers write ``U σ(V X)``):

* ``scalar``: ``W₂ W₁ x``, all widths 1 (one generator);
* ``linear-2``: ``W₁ ∈ R^{2×1}``, ``W₂ ∈ R^{1×2}`` (as printed);
* ``sigmoid``: printed ``W₁`` 3×3 and ``W₂`` 3×1 cannot compose with a scalar output; read ``W₂`` as ``1×3`` (the
  transpose), one data point;
* ``tanh``: printed ``W₁, W₂`` 2×2 and ``W₃`` 2×1: ``W₃`` read as ``1×2``; no skip connection (the one mention
  of it contradicts the printed equation); one data point;
* ``transformer``: one head, ``B = 8, T = 2, d = 2, d_ff = 4``, the FFN read as ``W₂ relu(W₁ z)`` (printed
  ``Z W₂ W₁``, whose shapes only compose in that order); traced from :class:`TinyTransformer`, learned with ``GL(2)``
  on fresh batches (data-independent setting).

    python examples/discovery_reproductions.py --quick --out /tmp/discovery   # seconds per model, 2 plots
    python examples/discovery_reproductions.py --steps 2000                   # the papers' step count
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import symalg  # noqa: E402
from symalg.discovery.learned import LearnedConfig, fraction_inside, learn  # noqa: E402

SPECS = {
    "scalar": ("linear(1, 1, bias=False) -> identity -> linear(1, 1, bias=False)", 1, False),
    "linear-2": ("linear(1, 2, bias=False) -> identity -> linear(2, 1, bias=False)", 2, False),
    "sigmoid": ("linear(3, 3, bias=False) -> sigmoid -> linear(3, 1, bias=False)", 3, True),
    "tanh": ("linear(2, 2, bias=False) -> tanh -> linear(2, 2, bias=False) -> tanh -> linear(2, 1, bias=False)", 2,
             True),
    "transformer": ("TinyTransformer (traced module): the printed linear FFN, no FFN residual", 2, False),
    "transformer-relu": ("TinyTransformer(relu=True) (traced module): residual ReLU FFN with biases", 2, False),
}


class TinyTransformer(torch.nn.Module):
    """The printed model ([Zhao2026] Sec. 6.5.5): ``z = x + softmax(q kᵀ/√d) v``, ``y = W₂ W₁ z`` (a linear FFN
    without bias and without a residual; printed ``Z W₂ W₁``, whose shapes compose only as ``Z W₁ W₂``); one head,
    ``d = 2``, ``d_ff = 4``: ``3·d² + 2·d·d_ff = 28`` parameters, not the printed ``p = 32``.

    ``relu=True`` is the variant measured before (``y = z + W₂ relu(W₁ z + b₁) + b₂``, 34 parameters)."""

    def __init__(self, d: int = 2, ff: int = 4, relu: bool = False):
        super().__init__()
        self.relu = relu
        self.q, self.k, self.v = (torch.nn.Linear(d, d, bias=False) for _ in range(3))
        self.up, self.down = torch.nn.Linear(d, ff, bias=relu), torch.nn.Linear(ff, d, bias=relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / 2 ** 0.5
        z = x + torch.softmax(scores, -1) @ self.v(x)
        return z + self.down(torch.relu(self.up(z))) if self.relu else self.down(self.up(z))


def _build(name: str):
    """``(analysis, loss(θ, X), sample(rng), unflatten, point)`` of a model: squared error against a random target;
    ``X`` the one data point (fixed, the same for every seed) or fresh standard normal inputs."""
    spec, _, one_point = SPECS[name]
    transformer = name.startswith("transformer")
    if transformer:
        torch.manual_seed(0)
        inputs = torch.randn(8, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        analysis = symalg.derive(symalg.trace(TinyTransformer(relu=name == "transformer-relu").double(), (inputs,)))
    else:
        analysis = symalg.derive(spec)
    model = analysis.model_graph.require_model("reproduction").double()
    names = [n for n, _ in model.named_parameters()]
    shapes = {n: p.shape for n, p in model.named_parameters()}
    sizes = [p.numel() for p in model.parameters()]
    n_in = next(iter(model.parameters())).shape[1]
    point = torch.randn(1, n_in, generator=torch.Generator().manual_seed(0), dtype=torch.float64) if one_point \
        else None

    def unflatten(theta: torch.Tensor) -> dict:
        return {n: t.reshape(shapes[n]) for n, t in zip(names, theta.split(sizes))}

    def loss(theta: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
        x, y = (xy[0], xy[1]) if transformer else (xy[:, :n_in], xy[:, n_in:])
        return ((torch.func.functional_call(model, unflatten(theta), (x,)) - y) ** 2).sum()

    def sample(rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        theta = torch.randn(sum(sizes), generator=rng, dtype=torch.float64)
        if transformer:   # a fresh batch (B = 8, T = 2, d = 2) and target
            return theta, torch.randn(2, 8, 2, 2, generator=rng, dtype=torch.float64)
        x = point if point is not None else torch.randn(1, n_in, generator=rng, dtype=torch.float64)
        return theta, torch.cat([x, torch.randn(1, 1, generator=rng, dtype=torch.float64)], 1)
    return analysis, loss, sample, unflatten, point


def _config(name: str, steps: int, generators: int, **options: object) -> LearnedConfig:
    """The papers' weights (data-independent, or data-dependent on one data point) with ``options`` changed; lr
    ``1e-3`` for 1000 steps or more, else ``1e-2`` (unless ``options`` give ``lr``)."""
    lr = options.pop("lr", None) or (1e-3 if steps >= 1000 else 1e-2)
    make = LearnedConfig.data_dependent if SPECS[name][2] else LearnedConfig
    return make(generators=generators, steps=steps, lr=lr, **options)


def problem(name: str, steps: int, generators: int, **options: object) -> tuple[Callable, Callable, int,
                                                                               LearnedConfig]:
    """``(loss, sample, n, config)``: what :func:`~symalg.discovery.learned.learn` takes for a model."""
    _, loss, sample, _, _ = _build(name)
    return loss, sample, SPECS[name][1], _config(name, steps, generators, **options)


def reproduce(name: str, steps: int, seed: int = 0, **options: object) -> dict:
    """One reproduction; ``options`` change the :class:`LearnedConfig` (``normalise``, ``finite``, ``lr``, ``beta``)."""
    analysis, loss, sample, unflatten, point = _build(name)
    exact = symalg.discover(analysis, data=point)
    from symalg.numeric.orbit_rank import action_matrix

    def derived(theta: torch.Tensor) -> torch.Tensor:
        return action_matrix(analysis, unflatten(theta))

    def discovered(theta: torch.Tensor) -> torch.Tensor:
        return torch.stack([g.field(theta) for g in exact.generators]) if exact.generators else theta[None, :0]
    config = _config(name, steps, min(max(exact.dimension, 1), 3), **options)
    start = time.perf_counter()
    result = learn(loss, sample, SPECS[name][1], config, seed=seed)
    seconds = time.perf_counter() - start
    # the learned fields against the exact discovered tangent and the derived one; the derived tangent lies in the
    # discovered one (every derived symmetry is confirmed), so the part in neither is new: sqrt(in_exact² − in_derived²)
    rng = torch.Generator().manual_seed(seed + 1)
    inside_exact, inside_derived = [], []
    for _ in range(16):
        theta, x = sample(rng)
        fields = result.network.jets(theta[None], x[None], result.generators)[0][0].detach()
        inside_exact.append(fraction_inside(fields, discovered(theta)))
        inside_derived.append(fraction_inside(fields, derived(theta)))
    return {"model": name, "spec": SPECS[name][0], "one_point": point is not None, "seed": seed, "steps": steps,
            "generators": config.generators, "options": {k: v for k, v in options.items()},
            "parameters": exact.parameters, "null_space": exact.dimension, "derived": exact.derived_dimension,
            "explained": exact.explained, "new": exact.new, "new_tangent": exact.new_tangent,
            "learned": result.to_dict(), "learned_in_derived": sum(inside_derived) / len(inside_derived),
            "learned_in_exact": sum(inside_exact) / len(inside_exact),
            "new_fraction": sum(max(e * e - d * d, 0.0) ** 0.5 for e, d in zip(inside_exact, inside_derived)) / 16,
            "seconds": seconds}


CURVES = (("learned_curve", "learned a(exp(t h), θ)"), ("random_curve", "random, same speed"),
          ("distance_curve", "random, same distance"), ("tangent_curve", "random ⊥ ∇ℓ, same distance"))


def plot(rows: list[dict], out: str) -> list[str]:
    """Loss change along learned vs random curves, and the generators, for the first run of each model."""
    firsts = list({r["model"]: r for r in reversed(rows)}.values())[::-1]
    paths = []
    fig, axes = plt.subplots(1, len(firsts), figsize=(3.2 * len(firsts), 2.8), squeeze=False)
    for ax, row in zip(axes[0], firsts):
        learned = row["learned"]
        moved = [i for i, t in enumerate(learned["t"]) if t]      # t = 0 changes nothing (a(I, θ) = θ)
        for key, label in CURVES:
            ax.semilogy([learned["t"][i] for i in moved], [max(learned[key][i], 1e-300) for i in moved], ".-",
                        label=label)
        ax.set_title(f"{row['model']} (seed {row['seed']})")
        ax.set_xlabel("t")
    axes[0][0].set_ylabel("held-out |Δℓ| / (|ℓ| + 1)")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    paths.append(os.path.join(out, "discovery_curves.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(firsts), figsize=(3.2 * len(firsts), 2.8), squeeze=False)
    for ax, row in zip(axes[0], firsts):
        h = torch.tensor(row["learned"]["generators"])
        ax.imshow(h.reshape(-1, h.shape[-1]).numpy(), cmap="RdBu")
        ax.set_title(f"{row['model']}: generators")
    fig.tight_layout()
    paths.append(os.path.join(out, "discovery_generators.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def summary(rows: list[dict]) -> list[dict]:
    """Per model: mean and spread over seeds of the learned curve's error relative to each random baseline."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        runs = [r for r in rows if r["model"] == name]
        entry = {"model": name, "seeds": [r["seed"] for r in runs]}
        for key in ("random_error", "distance_error", "tangent_error"):
            ratios = torch.tensor([r["learned"]["learned_error"] / max(r["learned"][key], 1e-300) for r in runs])
            entry[f"vs_{key}"] = [float(ratios.mean()), float(ratios.min()), float(ratios.max())]
        for key in ("learned_in_derived", "learned_in_exact", "new_fraction"):
            entry[key] = float(torch.tensor([r[key] for r in runs]).mean())
        for key in ("alignment", "random_alignment", "stretch"):
            entry[key] = float(torch.tensor([r["learned"][key] for r in runs]).mean())
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two models, 40 steps, seed 0")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds")
    parser.add_argument("--out", default=".")
    parser.add_argument("--models", default="", help=f"comma-separated, of: {', '.join(SPECS)}")
    parser.add_argument("--normalise", action="store_true", help="invariance as |cos∠(∇ℓ, ξ)| (LearnedConfig)")
    parser.add_argument("--finite", type=float, default=0.0, help="weight of the finite invariance term")
    parser.add_argument("--beta", type=float, default=None, help="the field speed the non-triviality term asks")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small matrices: one is fastest)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    names = [m for m in args.models.split(",") if m] or (["scalar", "linear-2"] if args.quick else list(SPECS))
    options: dict = {"normalise": args.normalise, "finite": args.finite, "lr": args.lr}
    if args.beta is not None:
        options["beta"] = args.beta
    seeds = [int(v) for v in args.seeds.split(",")]
    print(f"{'model':11s} {'seed':>4s} {'P':>3s} {'null':>4s} {'der':>3s} {'new':>3s} {'newT':>4s} {'∈der':>5s} "
          f"{'∈exact':>6s} {'new':>5s} {'learned':>9s} {'random':>9s} {'same d':>9s} {'⊥∇ℓ':>9s} {'|cos|':>5s} "
          f"{'rand':>5s} {'stretch':>7s} {'s':>5s}", flush=True)
    rows = []
    for name in names:
        for seed in seeds:
            r = reproduce(name, 40 if args.quick else args.steps, seed, **options)
            rows.append(r)
            d = r["learned"]
            print(f"{r['model']:11s} {r['seed']:4d} {r['parameters']:3d} {r['null_space']:4d} {r['derived']:3d} "
                  f"{r['new']:3d} {r['new_tangent']:4d} {r['learned_in_derived']:5.3f} {r['learned_in_exact']:6.3f} "
                  f"{r['new_fraction']:5.3f} {d['learned_error']:9.3g} {d['random_error']:9.3g} "
                  f"{d['distance_error']:9.3g} {d['tangent_error']:9.3g} {d['alignment']:5.3f} "
                  f"{d['random_alignment']:5.3f} {d['stretch']:7.2f} {r['seconds']:5.0f}", flush=True)
    for m in summary(rows):
        print(f"{m['model']}: learned/random {m['vs_random_error'][0]:.2f} [{m['vs_random_error'][1]:.2f}, "
              f"{m['vs_random_error'][2]:.2f}], /same-distance {m['vs_distance_error'][0]:.2f} "
              f"[{m['vs_distance_error'][1]:.2f}, {m['vs_distance_error'][2]:.2f}], /tangent "
              f"{m['vs_tangent_error'][0]:.2f} [{m['vs_tangent_error'][1]:.2f}, {m['vs_tangent_error'][2]:.2f}] "
              f"over seeds {m['seeds']}")
    paths = plot(rows, args.out)
    with open(os.path.join(args.out, "discovery_reproductions.json"), "w") as handle:
        json.dump({"runs": rows, "summary": summary(rows)}, handle, indent=1)
    print("plots:", ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
