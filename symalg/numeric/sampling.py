"""Numeric helpers shared by verification, examples and benchmarks: parameters, forward pass, loss.

The forward pass runs in torch's row convention, ``x ∈ R^{batch × n}``, ``y = x Wᵀ + b``; the
activations are the catalogue entries' SymPy functions lowered to torch (or the stored module of an
op the catalogue does not know), so the numbers are those of the function the analysis reasons about.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from symalg.ir.architecture import Architecture
from symalg.numeric.feedforward import FeedForward

__all__ = ["random_params", "random_data", "network_function", "mse_loss"]


def random_params(arch: Architecture, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64,
                  device: torch.device | str = "cpu", scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Gaussian parameters for a concrete-width architecture: weights ``N(0, scale² / in_features)``,
    biases ``N(0, scale²)``."""
    arch.check_materialisable("random_params")
    params = {}
    for name, shape in arch.parameter_shapes.items():
        shape = tuple(int(s) for s in shape)
        fan_in = shape[1] if len(shape) == 2 else 1
        params[name] = (torch.randn(shape, generator=generator, dtype=dtype) * scale / fan_in ** 0.5).to(device)
    return params


def random_data(arch: Architecture, batch: int = 16, generator: torch.Generator | None = None,
                dtype: torch.dtype = torch.float64,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and regression targets ``(x, y)`` of the architecture's widths."""
    n_in = int(arch.node("input")["features"])
    n_out = int(arch.node("output")["features"])
    x = torch.randn(batch, n_in, generator=generator, dtype=dtype).to(device)
    y = torch.randn(batch, n_out, generator=generator, dtype=dtype).to(device)
    return x, y


def network_function(arch: Architecture) -> Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]:
    """``f(params, x)``: the network's output for parameters ``params`` and inputs ``x`` (rows), the forward pass
    of :meth:`FeedForward.of(arch) <symalg.numeric.feedforward.FeedForward.of>` (activations from the
    architecture's catalogue)."""
    return FeedForward.of(arch).forward


def mse_loss(forward: Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor], x: torch.Tensor,
             y: torch.Tensor) -> Callable[[Mapping[str, torch.Tensor]], torch.Tensor]:
    """``L(params) = ½ mean ‖f(params, x) − y‖²``."""
    return lambda params: 0.5 * ((forward(params, x) - y) ** 2).sum(-1).mean()
