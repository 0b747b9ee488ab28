"""Loss barriers of linear interpolation after aligning by the derived groups (``symalg.applications.alignment``).

Pairs of networks trained from different seeds; ``θ_B`` is aligned to ``θ_A`` by weight matching and by activation
matching over the groups ``symalg.derive`` certified for the traced model, in four nested sets: none, permutations
(git re-basin weight matching), + positive scalings (ReLU), + GL/orthogonal maps (attention's per-head query/key and
value/output maps, the norm-free residual stream). Reported: the barrier
``max_α [L((1−α)θ_A + αθ_B') − ((1−α)L(θ_A) + αL(θ_B'))]`` on the test set (mean ± std over pairs) and the
worst relative change of ``θ_B``'s outputs caused by the alignment (it applies group elements only: rounding).

Models: (1) digits MLP ``64 → h → h → 10`` (ReLU, cross-entropy, scikit-learn's digits, 1437/360 split);
(2) a one-block transformer without norms (embedding + positions, 2-head attention with separate q/k/v/o maps,
a ReLU MLP, residual stream) trained briefly on a generated task: output the sorted input sequence.

Usage::

    python3 examples/alignment_barriers.py [--quick] [--out DIR]

Prints a table and ``key=value`` tokens; writes ``alignment_barriers.png`` into ``--out``
(default ``examples/output/``).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call  # noqa: E402

import symalg  # noqa: E402
from symalg.applications import alignment as al  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "output"
F64 = torch.float64


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's digits, pixels scaled to [0, 1], a fixed 1437/360 split."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x, y = torch.tensor(data.data / 16.0, dtype=F64), torch.tensor(data.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1437], order[1437:]
    return x[train], y[train], x[test], y[test]


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10)).double()


class SortBlock(nn.Module):
    """One attention block without norms: ``x = E[t] + P``; ``x += O·attn(Qx, Kx, Vx)``; ``x += D relu(U x)``."""

    def __init__(self, vocab: int = 8, length: int = 6, d: int = 16, heads: int = 2, hidden: int = 32) -> None:
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(length, d))
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down, self.head = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, self.dk).transpose(1, 2) for f in (self.q, self.k, self.v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / self.dk ** 0.5, -1)
        x = x + self.o((attention @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(x)


def sort_task(count: int, seed: int, vocab: int = 8, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(seed))
    return tokens, tokens.sort(-1).values


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, seed: int,
          batch: int = 128) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        rows = torch.randint(0, len(x), (batch,), generator=gen)
        logits = model(x[rows])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[rows].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def ce_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = functional_call(model, params, (x,))
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return loss


def relative_output_change(model: nn.Module, before: dict, after: dict, x: torch.Tensor) -> float:
    with torch.no_grad():
        f0, f1 = functional_call(model, before, (x,)), functional_call(model, after, (x,))
    return float((f1 - f0).abs().max() / f0.abs().max())


def compare(make, data, pairs: int, steps: int, lr: float, points: int) -> dict:
    """Barriers for every preset and method over ``pairs`` independently trained pairs."""
    x_tr, y_tr, x_te, y_te = data
    results: dict[str, list[float]] = {}
    worst_change, curves = 0.0, {}
    for pair in range(pairs):
        torch.manual_seed(100 + 2 * pair)
        model_a = train(make(), x_tr, y_tr, steps, lr, seed=2 * pair)
        torch.manual_seed(101 + 2 * pair)
        model_b = train(make(), x_tr, y_tr, steps, lr, seed=2 * pair + 1)
        analysis = symalg.derive(symalg.trace(model_a, (x_tr[:8],)))
        a = {k: v.detach() for k, v in model_a.named_parameters()}
        b = {k: v.detach() for k, v in model_b.named_parameters()}
        loss = ce_loss(model_a, x_te, y_te)
        for preset, kinds in al.PRESETS.items():
            for method in ("weights", "activations") if kinds else ("weights",):
                aligned = al.weight_matching(analysis, a, b, kinds) if method == "weights" else \
                    al.activation_matching(analysis, model_a, a, b, x_tr, kinds)
                worst_change = max(worst_change, relative_output_change(model_a, b, aligned.params, x_te))
                key = preset if not kinds else f"{preset} [{method}]"
                results.setdefault(key, []).append(al.loss_barrier(loss, a, aligned.params, points))
                if pair == 0:
                    curves[key] = al.interpolation_losses(loss, a, aligned.params,
                                                          torch.linspace(0, 1, points, dtype=F64))
        results.setdefault("loss_A", []).append(float(loss(a)))
    return {"barriers": results, "worst_change": worst_change, "curves": curves}


def table(name: str, out: dict) -> None:
    print(f"{name}: test-loss barrier (mean ± std over pairs)")
    for key, values in out["barriers"].items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"  {key:45s} {statistics.mean(values):.4f} ± {std:.4f}")


def token(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 pairs, width 12, 60 steps (the default: 5 pairs, "
                        "width 32, 600 steps)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_default_dtype(F64)
    torch.set_num_threads(1)
    pairs, steps, points = (2, 60, 6) if args.quick else (5, 600, 11)
    mlp_out = compare(lambda: mlp(12 if args.quick else 32), digits(), pairs, steps, 1e-2, points)
    tokens, targets = sort_task(2048, 0)
    test_tokens, test_targets = sort_task(512, 1)
    tf_out = compare(SortBlock, (tokens, targets, test_tokens, test_targets), pairs, steps, 1e-2, points)
    for name, out in (("digits MLP", mlp_out), ("sort transformer", tf_out)):
        table(name, out)
        for key, values in out["barriers"].items():
            print(f"{token(name)}_{token(key)}_mean={statistics.mean(values):.6f}")
        print(f"{token(name)}_worst_relative_output_change={out['worst_change']:.3e}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (name, out) in zip(axes, (("digits MLP", mlp_out), ("sort transformer", tf_out))):
        for key, curve in out["curves"].items():
            ax.plot(torch.linspace(0, 1, len(curve)), curve, label=key)
        ax.set(title=f"{name}: test loss on (1−α)θ_A + αθ_B'", xlabel="α", ylabel="cross-entropy")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "alignment_barriers.png", dpi=110)


if __name__ == "__main__":
    main()
