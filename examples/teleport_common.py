"""Shared plumbing of the teleportation reproductions (``examples/teleport_*.py``): command line, one torch
thread, ``key=value`` tokens, and the digits data and LeakyReLU classifier of [Zhao2026] Ch. 5."""
from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


def parse_args(doc: str, extra: Callable[[argparse.ArgumentParser], object] | None = None) -> argparse.Namespace:
    """``--quick``, ``--out DIR`` and whatever ``extra(parser)`` adds; pins torch to one intra-op thread (the
    machine is shared) and float64."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small settings, under 30 s")
    parser.add_argument("--out", type=Path, default=Path("examples/output"), help="folder for the plot")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    return args


def tokens(**values) -> None:
    """Print ``key=value`` tokens on one line (parsed by the tests)."""
    print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()))


def digits(seed: int = 0, validation: float = 0.2):
    """scikit-learn's 8×8 digits, pixels scaled to [0, 1], split into train and validation at random."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.data / 16.0)
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(math.floor(len(y) * (1 - validation)))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def classifier(seed: int, widths=(64, 16, 10, 10), slope: float = 0.1) -> nn.Sequential:
    """[Zhao2026]'s three-layer LeakyReLU(0.1) classifier (Sec. 5.2.3 / 5.4.2 sizes h₁ = 16, h₂ = 10)."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.LeakyReLU(slope)] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def batches(x: torch.Tensor, y: torch.Tensor, size: int, generator: torch.Generator):
    """One epoch of shuffled mini-batches."""
    order = torch.randperm(len(y), generator=generator)
    for start in range(0, len(y), size):
        idx = order[start:start + size]
        yield x[idx], y[idx]


def forever(x: torch.Tensor, y: torch.Tensor, size: int, generator: torch.Generator):
    """Shuffled mini-batches of ``size``, epoch after epoch."""
    while True:
        yield from batches(x, y, size, generator)


def train_epoch(optimizer, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator,
                size: int = 20) -> None:
    """One epoch of cross-entropy mini-batch steps of ``optimizer`` (a ``TeleportingOptimizer`` counts the epoch)."""
    for xb, yb in batches(x, y, size, generator):
        optimizer.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    if hasattr(optimizer, "end_epoch"):
        optimizer.end_epoch()


def runs_option(quick_runs: int) -> Callable[[argparse.ArgumentParser], object]:
    """The ``--runs N`` option (seeds per setting; default 5 as in [Zhao2026], ``quick_runs`` with ``--quick``)."""
    def add(parser: argparse.ArgumentParser) -> object:
        return parser.add_argument("--runs", type=int, default=None,
                                   help=f"seeds per setting (default 5; --quick {quick_runs})")
    return add


def mean_sd(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
