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
* ``transformer`` (exact only): one head, ``B = 8, T = 2, d = 2, d_ff = 4``, the FFN read as
  ``W₂ relu(W₁ z)`` (printed ``Z W₂ W₁``, whose shapes only compose in that order).

    python examples/discovery_reproductions.py --quick --out /tmp/discovery   # seconds per model, 2 plots
    python examples/discovery_reproductions.py --steps 2000                   # the papers' step count
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import symalg  # noqa: E402
from symalg.discovery.learned import LearnedConfig, learn  # noqa: E402

SPECS = {
    "scalar": ("linear(1, 1, bias=False) -> identity -> linear(1, 1, bias=False)", 1, False),
    "linear-2": ("linear(1, 2, bias=False) -> identity -> linear(2, 1, bias=False)", 2, False),
    "sigmoid": ("linear(3, 3, bias=False) -> sigmoid -> linear(3, 1, bias=False)", 3, True),
    "tanh": ("linear(2, 2, bias=False) -> tanh -> linear(2, 2, bias=False) -> tanh -> linear(2, 1, bias=False)", 2,
             True),
}


class TinyTransformer(torch.nn.Module):
    """``z = x + softmax(q kᵀ/√d) v``, ``y = z + W₂ relu(W₁ z)``; one head, ``d = 2``, ``d_ff = 4``."""

    def __init__(self, d: int = 2, ff: int = 4):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d, bias=False) for _ in range(3))
        self.up, self.down = torch.nn.Linear(d, ff), torch.nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / 2 ** 0.5
        z = x + torch.softmax(scores, -1) @ self.v(x)
        return z + self.down(torch.relu(self.up(z)))


def _problem(spec: str, point: torch.Tensor | None):
    """``(loss(θ, X), sample(rng), forward)`` of a spec's network: squared error against a random target; ``X`` the
    one data point (fixed) or fresh standard normal inputs."""
    analysis = symalg.derive(spec)
    model = analysis.model_graph.require_model("reproduction").double()
    names = [n for n, _ in model.named_parameters()]
    shapes = {n: p.shape for n, p in model.named_parameters()}
    sizes = [p.numel() for p in model.parameters()]
    n_in = next(iter(model.parameters())).shape[1]

    def unflatten(theta: torch.Tensor) -> dict:
        return {n: t.reshape(shapes[n]) for n, t in zip(names, theta.split(sizes))}

    def loss(theta: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
        x, y = xy[:, :n_in], xy[:, n_in:]
        return ((torch.func.functional_call(model, unflatten(theta), (x,)) - y) ** 2).sum()

    def sample(rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        theta = torch.randn(sum(sizes), generator=rng, dtype=torch.float64)
        x = point if point is not None else torch.randn(1, n_in, generator=rng, dtype=torch.float64)
        return theta, torch.cat([x, torch.randn(1, 1, generator=rng, dtype=torch.float64)], 1)
    return analysis, loss, sample, unflatten


def reproduce(name: str, steps: int, seed: int = 0, **options: object) -> dict:
    """One reproduction; ``options`` change the :class:`LearnedConfig` (``normalise``, ``finite``, ``lr``)."""
    spec, n, one_point = SPECS[name]
    torch.manual_seed(seed)
    point = torch.randn(1, int(spec.split("(")[1].split(",")[0]), dtype=torch.float64) if one_point else None
    analysis, loss, sample, unflatten = _problem(spec, point)
    exact = symalg.discover(analysis, data=point)
    from symalg.numeric.orbit_rank import action_matrix

    def derived(theta: torch.Tensor) -> torch.Tensor:
        return action_matrix(analysis, unflatten(theta))

    def discovered(theta: torch.Tensor) -> torch.Tensor:
        return torch.stack([g.field(theta) for g in exact.generators]) if exact.generators else theta[None, :0]
    generators = min(max(exact.dimension, 1), 3)
    lr = options.pop("lr", None) or (1e-3 if steps >= 1000 else 1e-2)
    config = LearnedConfig(generators=generators, steps=steps, hidden=(64, 64, 64), lr=lr, **options)
    if one_point:
        config = LearnedConfig.data_dependent(generators=generators, steps=steps, lr=lr, **options)
    result = learn(loss, sample, n, config, tangent=derived, seed=seed)
    # the learned fields against the exact discovered tangent (what is new but real)
    rng = torch.Generator().manual_seed(seed + 1)
    inside_exact = []
    for _ in range(8):
        theta, x = sample(rng)
        fields = torch.stack([symalg.discovery.learned.fundamental_field(
            lambda g, th: result.network(g, th, x), theta, h) for h in result.generators]).detach()
        basis = discovered(theta)
        if basis.shape[1] and basis.shape[0]:
            q = torch.linalg.qr(basis.T).Q
            inside_exact.append(float(((fields @ q) @ q.T).norm() / fields.norm().clamp_min(1e-300)))
        else:
            inside_exact.append(0.0)
    return {"model": name, "spec": spec, "one_point": one_point, "parameters": exact.parameters,
            "null_space": exact.dimension, "derived": exact.derived_dimension, "explained": exact.explained,
            "new": exact.new, "new_tangent": exact.new_tangent, "learned": result.to_dict(),
            "learned_in_derived": result.overlap, "learned_in_exact": sum(inside_exact) / len(inside_exact)}


def transformer_exact() -> dict:
    torch.manual_seed(0)
    model = TinyTransformer().double()
    x = torch.randn(8, 2, 2, dtype=torch.float64)
    report = symalg.discover(model, (x,))
    return {"model": "transformer", "parameters": report.parameters, "null_space": report.dimension,
            "derived": report.derived_dimension, "explained": report.explained, "new": report.new,
            "new_tangent": report.new_tangent, "derived_labels": list(report.derived_labels)}


def plot(rows: list[dict], out: str) -> list[str]:
    paths = []
    fig, axes = plt.subplots(1, len(rows), figsize=(3 * len(rows), 2.6))
    for ax, row in zip(axes if len(rows) > 1 else [axes], rows):
        learned = row["learned"]
        ax.semilogy(learned["t"], [max(v, 1e-16) for v in learned["learned_curve"]], label="learned exp(t h)")
        ax.semilogy(learned["t"], [max(v, 1e-16) for v in learned["random_curve"]], label="random direction")
        ax.set_title(row["model"])
        ax.set_xlabel("t")
    axes_list = list(axes) if len(rows) > 1 else [axes]
    axes_list[0].set_ylabel("held-out relative loss change")
    axes_list[0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out, "discovery_curves.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(rows), figsize=(3 * len(rows), 2.6))
    for ax, row in zip(axes if len(rows) > 1 else [axes], rows):
        h = torch.tensor(row["learned"]["generators"])
        ax.imshow(h.reshape(-1, h.shape[-1]).numpy(), cmap="RdBu")
        ax.set_title(f"{row['model']}: generators")
    fig.tight_layout()
    paths.append(os.path.join(out, "discovery_generators.png"))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two models, 40 steps")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", default=".")
    parser.add_argument("--models", default="", help=f"comma-separated, of: {', '.join(SPECS)}")
    parser.add_argument("--normalise", action="store_true", help="invariance as |cos∠(∇ℓ, ξ)| (LearnedConfig)")
    parser.add_argument("--finite", type=float, default=0.0, help="weight of the finite invariance term")
    parser.add_argument("--lr", type=float, default=None)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    names = [m for m in args.models.split(",") if m] or (["scalar", "linear-2"] if args.quick else list(SPECS))
    options = {"normalise": args.normalise, "finite": args.finite, "lr": args.lr}
    rows = [reproduce(name, 40 if args.quick else args.steps, **options) for name in names]
    print(f"{'model':10s} {'P':>3s} {'null':>4s} {'der':>4s} {'new':>4s} {'newT':>4s} {'learned∈der':>11s} "
          f"{'learned∈exact':>13s} {'learned err':>11s} {'random err':>10s}")
    for r in rows:
        print(f"{r['model']:10s} {r['parameters']:3d} {r['null_space']:4d} {r['derived']:4d} {r['new']:4d} "
              f"{r['new_tangent']:4d} {r['learned_in_derived']:11.3f} {r['learned_in_exact']:13.3f} "
              f"{r['learned']['learned_error']:11.3g} {r['learned']['random_error']:10.3g}")
    if not args.quick and not args.models:
        t = transformer_exact()
        rows.append(t)
        print(f"transformer: P {t['parameters']}, null space {t['null_space']}, derived {t['derived']}, new "
              f"{t['new']}, new tangent {t['new_tangent']}")
    paths = plot([r for r in rows if "learned" in r], args.out)
    with open(os.path.join(args.out, "discovery_reproductions.json"), "w") as handle:
        json.dump(rows, handle, indent=1)
    print("plots:", ", ".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
