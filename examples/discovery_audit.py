"""Audit symalg's derivations with exact discovery: derived vs discovered dimension per model.

Two grids. The hand-picked one: MLPs with every catalogue activation, with and without biases, a residual block,
LayerNorm, attention, a convolution, and a model with an op the catalogue does not know. The generated one
(:func:`generated`): a seeded random grid of small architectures (MLP, residual block, LayerNorm, attention,
convolution), the ``i``-th model taking activation ``i mod 19`` of :data:`ACTIVATIONS` and architecture ``i mod 5``
(19 and 5 are coprime: 95 models cover every pair; 19 cover every activation), widths, biases and norm affinity drawn
from the seed. For every model :func:`symalg.discover` prints one row: parameters, discovered dimension, derived
dimension, explained, new, new tangent directions, and the derived symmetries discovery does NOT confirm (a
possible false claim: listed first and loudly).

    python examples/discovery_audit.py                        # both grids (the generated one: 19 models)
    python examples/discovery_audit.py --quick                # four hand-picked models, three generated ones
    python examples/discovery_audit.py --generated 95 --seed 1 --json audit.json
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Callable

import torch
import torch.nn.functional as F

import symalg

ACTIVATIONS = ["identity", "relu", "leaky_relu", "relu_pow", "tanh", "sigmoid", "gelu", "silu", "softplus",
               "gelu_tanh", "hardtanh", "relu6", "hardswish", "hardsigmoid", "elu", "mish", "selu", "radial", "abs"]
ARCHITECTURES = ["mlp", "residual", "norm", "attention", "conv"]
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x, "relu": torch.relu, "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "gelu": F.gelu, "silu": F.silu, "softplus": F.softplus,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "hardtanh": F.hardtanh, "relu6": F.relu6,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "elu": F.elu, "mish": F.mish, "selu": F.selu,
    "abs": torch.abs}
"""The activations torch spells (``relu_pow`` and ``radial`` are catalogue entries only: spec strings)."""


class Generated(torch.nn.Module):
    """One architecture of the generated grid with activation ``act`` (a key of :data:`TORCH_ACTIVATIONS`)."""

    def __init__(self, kind: str, act: str, rng: random.Random):
        super().__init__()
        self.kind, self.act = kind, TORCH_ACTIVATIONS[act]
        bias = lambda: rng.random() < 0.7   # noqa: E731
        h = rng.randint(2, 3)
        if kind == "mlp":
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, h, bias=bias()), torch.nn.Linear(h, 2, bias=bias())])
        elif kind == "residual":
            d = 2
            self.layers = torch.nn.ModuleList([torch.nn.Linear(d, h, bias=bias()), torch.nn.Linear(h, d, bias=bias()),
                                               torch.nn.Linear(d, 1, bias=bias())])
        elif kind == "norm":
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, h, bias=bias()),
                                               torch.nn.LayerNorm(h, elementwise_affine=rng.random() < 0.5),
                                               torch.nn.Linear(h, 1, bias=bias())])
        elif kind == "attention":
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2, bias=False) for _ in range(3)] +
                                              [torch.nn.Linear(2, 1, bias=bias())])
        else:
            self.layers = torch.nn.ModuleList([torch.nn.Conv1d(1, h, 2, bias=bias()), torch.nn.Conv1d(h, 1, 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, act = self.layers, self.act
        if self.kind == "mlp":
            return m[1](act(m[0](x)))
        if self.kind == "residual":
            return m[2](x + m[1](act(m[0](x))))
        if self.kind == "norm":
            return m[2](m[1](act(m[0](x))))
        if self.kind == "attention":
            scores = torch.softmax(m[0](x) @ m[1](x).transpose(-1, -2), dim=-1)
            return m[3](scores @ act(m[2](x)))
        return m[1](act(m[0](x)))


def generated(count: int, seed: int = 0) -> list[tuple[str, object, object]]:
    """The generated grid: ``count`` models ``(name, model or spec, data)`` (see the module docstring). An activation
    torch does not spell (``relu_pow``, ``radial``) is drawn as the spec ``linear(2, h) -> act -> linear(h, 2)``."""
    rng = random.Random(seed)
    grid: list[tuple[str, object, object]] = []
    for i in range(count):
        act, kind = ACTIVATIONS[i % len(ACTIVATIONS)], ARCHITECTURES[i % len(ARCHITECTURES)]
        if act not in TORCH_ACTIVATIONS:
            h = rng.randint(2, 3)
            grid.append((f"g{i} mlp/{act}", f"linear(2, {h}) -> {act} -> linear({h}, 2)", None))
            continue
        torch.manual_seed(rng.randrange(2 ** 31))
        model = Generated(kind, act, rng).double()
        shape = {"attention": (2, 3, 2), "conv": (4, 1, 5)}.get(kind, (6, 2))
        grid.append((f"g{i} {kind}/{act}", model, (torch.randn(*shape, dtype=torch.float64),)))
    return grid


class Residual(torch.nn.Module):
    def __init__(self, d: int = 3, h: int = 4):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, h), torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Normed(torch.nn.Module):
    def __init__(self, d: int = 3, h: int = 4):
        super().__init__()
        self.inp, self.norm, self.out = torch.nn.Linear(2, d), torch.nn.LayerNorm(d), torch.nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.inp(x)))


class Attention(torch.nn.Module):
    def __init__(self, d: int = 2, k: int = 2):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, k, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return scores @ self.v(x)


class Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Conv1d(1, 2, 2), torch.nn.Conv1d(2, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class SquareAbs(torch.nn.Module):
    """``W₂ (z |z|)``, ``z = W₁ x + b``, written ``z √(z z)``: homogeneous of degree 2 through ``sqrt``, which the
    catalogue knows as pointwise only (``z * z.abs()`` is derived: ``|·|`` is an entry)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.a(x)
        return self.b(z * (z * z).sqrt())


def models(quick: bool) -> list[tuple[str, object, object]]:
    """``(name, model or spec, data)``."""
    grid: list[tuple[str, object, object]] = []
    acts = ["relu", "tanh", "identity"] if quick else ACTIVATIONS
    for act in acts:
        grid.append((act, f"linear(2, 3) -> {act} -> linear(3, 2)", None))
    if quick:
        grid.append(("x*sqrt(x*x) (unknown op)", SquareAbs().double(), (torch.randn(6, 2, dtype=torch.float64),)))
        return grid
    grid += [
        ("relu, no biases", "linear(2, 3, bias=False) -> relu -> linear(3, 2, bias=False)", None),
        ("identity, no biases", "linear(2, 3, bias=False) -> identity -> linear(3, 2, bias=False)", None),
        ("deep linear", "linear(2, 2) -> identity -> linear(2, 2) -> identity -> linear(2, 1)", None),
        ("relu->tanh", "linear(2, 2) -> relu -> linear(2, 2) -> tanh -> linear(2, 1)", None),
        ("residual relu", Residual().double(), (torch.randn(6, 3, dtype=torch.float64),)),
        ("layernorm", Normed().double(), (torch.randn(6, 2, dtype=torch.float64),)),
        ("attention", Attention().double(), (torch.randn(2, 3, 2, dtype=torch.float64),)),
        ("conv relu", Conv().double(), (torch.randn(4, 1, 5, dtype=torch.float64),)),
        ("x*sqrt(x*x) (unknown op)", SquareAbs().double(), (torch.randn(6, 2, dtype=torch.float64),)),
    ]
    return grid


def audit(quick: bool, count: int | None = None, seed: int = 0, hand_picked: bool = True) -> list[dict]:
    """One row per model of the hand-picked grid and of ``generated(count, seed)`` (3 models in ``quick``, else 19)."""
    rows = []
    count = (3 if quick else len(ACTIVATIONS)) if count is None else count
    for name, model, data in (models(quick) if hand_picked else []) + generated(count, seed):
        if isinstance(model, torch.nn.Module):
            analysis = symalg.derive(symalg.trace(model, data))
        else:
            analysis = symalg.derive(model)
        report = symalg.discover(analysis)
        rows.append({"model": name, "parameters": report.parameters, "discovered": report.dimension,
                     "derived": report.derived_dimension, "explained": report.explained, "new": report.new,
                     "new_tangent": report.new_tangent,
                     "outside": list(report.outside), "unconfirmed": list(report.unconfirmed_labels),
                     "confirmed": report.confirmed, "closure_error": report.closure_error,
                     "new_moves": sorted({", ".join(g.moves) for g in report.new_generators})})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--generated", type=int, default=None, help="models of the generated grid")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated grid")
    parser.add_argument("--no-hand-picked", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = audit(args.quick, args.generated, args.seed, not args.no_hand_picked)
    for row in rows:
        if row["unconfirmed"]:
            print(f"NOT CONFIRMED: {row['model']}: {row['unconfirmed']}")
    print(f"{'model':28s} {'P':>4s} {'disc':>5s} {'der':>4s} {'expl':>5s} {'new':>4s} {'newT':>4s}  "
          "outside / new moves")
    for r in rows:
        extra = "; ".join(r["outside"] + r["new_moves"])
        print(f"{r['model']:28s} {r['parameters']:4d} {r['discovered']:5d} {r['derived']:4d} {r['explained']:5d} "
              f"{r['new']:4d} {r['new_tangent']:4d}  {extra}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
