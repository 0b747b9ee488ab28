"""Audit symalg's derivations with exact discovery: derived vs discovered dimension per model.

For every model of a grid (MLPs with every catalogue activation, with and without biases, a residual block,
LayerNorm, attention, a convolution, and models with ops the catalogue does not know), run
:func:`symalg.discover` and print one row: parameters, discovered dimension, derived dimension, explained,
new, and the derived symmetries discovery does NOT confirm (a possible false claim: listed first and loudly).

    python examples/discovery_audit.py            # the whole grid (a few minutes on one core)
    python examples/discovery_audit.py --quick    # four models
    python examples/discovery_audit.py --json audit.json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

import symalg

ACTIVATIONS = ["identity", "relu", "leaky_relu", "relu_pow", "tanh", "sigmoid", "gelu", "silu", "softplus",
               "gelu_tanh", "hardtanh", "relu6", "hardswish", "hardsigmoid", "elu", "mish", "selu", "radial"]


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
    """``W₂ (z |z|)``, ``z = W₁ x + b``: homogeneous of degree 2, which the catalogue only knows as ``relu_pow``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.a(x)
        return self.b(z * z.abs())


def models(quick: bool) -> list[tuple[str, object, object]]:
    """``(name, model or spec, data)``."""
    grid: list[tuple[str, object, object]] = []
    acts = ["relu", "tanh", "identity"] if quick else ACTIVATIONS
    for act in acts:
        grid.append((act, f"linear(2, 3) -> {act} -> linear(3, 2)", None))
    if quick:
        grid.append(("x*|x| (unknown op)", SquareAbs().double(), (torch.randn(6, 2, dtype=torch.float64),)))
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
        ("x*|x| (unknown op)", SquareAbs().double(), (torch.randn(6, 2, dtype=torch.float64),)),
    ]
    return grid


def audit(quick: bool) -> list[dict]:
    rows = []
    for name, model, data in models(quick):
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
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = audit(args.quick)
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
