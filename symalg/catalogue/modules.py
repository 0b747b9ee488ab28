"""Torch modules for catalogue activations that ``torch.nn`` lacks (radial, ``max(z, 0)^α``, ...).

``Activation(op, **params)`` evaluates the catalogue entry's SymPy function lowered to torch, so the
module computes exactly the function the analysis reasons about.

>>> import torch, symalg
>>> act = symalg.catalogue.modules.Activation("radial")
>>> act(torch.tensor([[3.0, 4.0]]))
tensor([[0.5883, 0.7845]])
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Mapping

import sympy as sp
import torch

from symalg.catalogue.activations import CATALOGUE, CatalogueEntry
from symalg.lowering.codegen import compile_function, identifier, torch_source

__all__ = ["Activation", "activation_function"]


@lru_cache(maxsize=None)
def _compiled(entry: CatalogueEntry,
              params: tuple[tuple[str, sp.Expr], ...]) -> tuple[Callable[..., torch.Tensor], str]:
    if entry.radial:
        r = sp.Symbol("_norm", positive=True)
        body = f"z * ({torch_source(entry.expression(r, **dict(params)))})"
        # ‖z‖ computed as s‖z/s‖ with s = max|z_i|, so that huge inputs do not overflow
        prologue = ("    _scale = z.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(z.dtype).tiny)\n"
                    "    _norm = _scale * torch.linalg.vector_norm(z / _scale, dim=-1, keepdim=True)\n")
    else:
        z = sp.Symbol("z", real=True)
        body, prologue = torch_source(entry.expression(z, **dict(params))), ""
    name = identifier(entry.name)
    source = f"def {name}(z):\n{prologue}    return {body}"
    return compile_function(name, source, "activation"), source


def activation_function(op: str, params: Mapping[str, object] | None = None,
                        catalogue: Mapping[str, CatalogueEntry] = CATALOGUE) -> tuple[Callable[..., torch.Tensor], str]:
    """The torch function of catalogue entry ``op`` (acting on the last axis), and its source."""
    if op not in catalogue:
        raise KeyError(f"activation {op!r} is not in the catalogue ({sorted(catalogue)})")
    entry = catalogue[op]
    items = tuple(sorted(entry.resolve(dict(params or {})).items()))
    return _compiled(entry, items)


class Activation(torch.nn.Module):
    """An activation from the catalogue as a module: ``Activation("leaky_relu", slope=0.2)``."""

    def __init__(self, op: str, catalogue: Mapping[str, CatalogueEntry] = CATALOGUE, **params: object) -> None:
        super().__init__()
        if op not in catalogue:
            raise KeyError(f"activation {op!r} is not in the catalogue ({sorted(catalogue)})")
        self.op = op
        self.params = catalogue[op].resolve(params)
        self._fn, self.source = activation_function(op, self.params, catalogue)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self._fn(z)

    def extra_repr(self) -> str:
        return ", ".join([repr(self.op)] + [f"{k}={v}" for k, v in self.params.items()])
