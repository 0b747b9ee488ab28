"""The executable view of a feed-forward :class:`~symalg.ir.architecture.Architecture`.

:class:`FeedForward` is what the numeric code and the applications run: per linear layer ``i`` the names
of ``W_i ∈ R^{n_i × n_{i−1}}`` and ``b_i`` in a parameter dict, and the activation after it as a torch
callable on the last axis. ``FeedForward.of(spec)`` reads them off the one description (a spec, a chain
``nn.Sequential``, a :class:`~symalg.frontend.spec.Spec`, an Architecture): catalogue activations become
their entry's torch function (:class:`~symalg.catalogue.modules.Activation`, which keeps ``op`` and
``params``), ops the catalogue does not know keep the module the architecture stores, and two linear layers
in a row get the built-in identity between them. The constructor takes the same view with the
activations given directly (any callables).

Rows convention: ``Z_i = a_{i−1} W_iᵀ + b_i``, ``a_i = σ_i(Z_i)``, data ``x`` of shape ``(n,)`` or
``(…, k, n)``; parameters may carry leading batch axes (draws).

>>> import torch, symalg
>>> net = FeedForward.of("linear(3, 4) -> tanh -> linear(4, 2)")
>>> net.weights, net.biases, net.sites
(('0.weight', '2.weight'), ('0.bias', '2.bias'), 1)
>>> model = symalg.to_module(symalg.parse("linear(3, 4) -> tanh -> linear(4, 2)"))
>>> x = torch.randn(5, 3, dtype=torch.float64)
>>> torch.allclose(net.forward(dict(model.named_parameters()), x), model(x))
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from symalg.catalogue.activations import CATALOGUE
from symalg.catalogue.modules import Activation
from symalg.errors import SpecError
from symalg.frontend.spec import Spec, parse
from symalg.ir.architecture import Architecture

__all__ = ["FeedForward"]


def _rows(x: torch.Tensor) -> torch.Tensor:
    """Data as ``(…, k, n)`` rows: a single point ``(n,)`` becomes ``(1, n)``."""
    return x.unsqueeze(0) if x.dim() == 1 else x


SiteElements = torch.Tensor | Sequence[torch.Tensor | None] | Mapping[int, torch.Tensor]
"""Group elements per hidden site: one matrix (a single site), a sequence (one per site, ``None`` = identity) or
``{site: matrix}``."""


@dataclass(frozen=True)
class FeedForward:
    """A stack ``Linear → σ₁ → Linear → … → σ_{L−1} → Linear [→ σ_L]`` described by parameter names.

    ``weights[i]``/``biases[i]`` name layer ``i``'s ``W_i``/``b_i`` in a parameter dict (``None``: no
    bias); ``activations[i]`` is the activation after layer ``i`` (hidden *site* ``i``, of width ``n_i``),
    acting on the last axis; ``output_activation`` follows the last layer (``None``: none).

    >>> net = FeedForward(("0.weight", "2.weight"), (None, None), (torch.tanh,))  # activations given directly
    >>> net.forward({"0.weight": torch.eye(2), "2.weight": torch.ones(1, 2)}, torch.tensor([0.0, 1.0]))
    tensor([0.7616])
    """

    weights: tuple[str, ...]
    biases: tuple[str | None, ...]
    activations: tuple[Callable, ...]
    output_activation: Callable | None = None

    def __post_init__(self) -> None:
        if not self.weights:
            raise ValueError("FeedForward: needs at least one linear layer, got no weights")
        if len(self.biases) != len(self.weights) or len(self.activations) != len(self.weights) - 1:
            raise ValueError(f"FeedForward: {len(self.weights)} weights need as many biases and "
                             f"{len(self.weights) - 1} activations, got {len(self.biases)} and {len(self.activations)}")

    @classmethod
    def of(cls, spec: Architecture | str | Spec | torch.nn.Module) -> "FeedForward":
        """The view of an :class:`Architecture`, or of anything :func:`symalg.parse` reads (a spec string, a
        chain ``nn.Sequential``, a ``Spec``); activations come from the architecture's catalogue (overlays
        included). Raises :class:`SpecError` naming the layer where the chain does not start with a linear
        layer.

        >>> from torch import nn
        >>> net = FeedForward.of(nn.Sequential(nn.Linear(3, 4), nn.LeakyReLU(0.2), nn.Linear(4, 2), nn.Tanh()))
        >>> net.activations, net.output_activation
        ((Activation('leaky_relu', slope=1/5),), Activation('tanh'))
        """
        arch = spec if isinstance(spec, Architecture) else parse(spec)
        catalogue = arch.catalogue or CATALOGUE
        weights: list[str] = []
        biases: list[str | None] = []
        acts: list[Callable] = []
        pending: Callable | None = None
        for name in arch.layer_names:
            node = arch.node(name)
            if node["kind"] == "linear":
                if weights:
                    acts.append(Activation("identity") if pending is None else pending)  # built in, never an overlay
                weights.append(node["weight"])
                biases.append(node["bias"])
                pending = None
            elif not weights:
                raise SpecError(f"layer {name} ({node['op']}): an activation before the first linear layer")
            else:
                pending = node["module"] if node["module"] is not None else \
                    Activation(node["op"], catalogue, **node["params"])
        return cls(tuple(weights), tuple(biases), tuple(acts), pending)

    @classmethod
    def two_layer(cls, activation: Callable) -> "FeedForward":
        """``F(x) = U σ(V x)`` with ``V = params["0.weight"]``, ``U = params["2.weight"]``, no biases, ``σ`` any
        callable."""
        return cls(("0.weight", "2.weight"), (None, None), (activation,))

    @property
    def sites(self) -> int:
        """The number of hidden sites (``L − 1``)."""
        return len(self.activations)

    def preactivations(self, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                       layers: int | None = None) -> list[torch.Tensor]:
        """``Z_i = a_{i−1} W_iᵀ + b_i`` for every layer (the first ``layers`` only, when given), as rows
        ``(…, k, n_i)``."""
        a, zs = _rows(x), []
        for i, (w, b) in enumerate(zip(self.weights[:layers], self.biases[:layers])):
            z = a @ params[w].transpose(-1, -2)
            if b is not None:
                z = z + params[b].unsqueeze(-2)
            zs.append(z)
            if i < self.sites:
                a = self.activations[i](z)
        return zs

    def forward(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The output for inputs ``x`` (rows; a single point ``(n,)`` gives ``(m,)``)."""
        out = self.preactivations(params, x)[-1]
        if self.output_activation is not None:
            out = self.output_activation(out)
        return out[..., 0, :] if x.dim() == 1 else out

    def site_elements(self, g: SiteElements) -> list[torch.Tensor | None]:
        """Normalise ``g`` to one matrix (or ``None`` = identity) per hidden site.

        ``g`` is a sequence with one entry per site, a mapping ``{site: matrix}``, or (one hidden site
        only) a single matrix.
        """
        if isinstance(g, torch.Tensor):
            if self.sites != 1:
                raise ValueError(f"g: a single matrix is ambiguous for {self.sites} hidden sites; pass a sequence "
                                 "or a mapping {site: matrix}")
            return [g]
        if isinstance(g, Mapping):
            bad = [s for s in g if not 0 <= s < self.sites]
            if bad:
                raise ValueError(f"g: sites {bad} out of range (the network has hidden sites 0…{self.sites - 1})")
            return [g.get(s) for s in range(self.sites)]
        g = list(g)
        if len(g) != self.sites:
            raise ValueError(f"g: {len(g)} elements for {self.sites} hidden sites")
        return g
