"""Small example models that op rules register with themselves (``register_rule(..., examples=...)``).

An example is a zero-argument factory returning ``(model, example_inputs)``; the rule law tests trace
it, check that its op appears in the graph, derive its symmetries and check every claim numerically.
Most examples are dense layers around the op, built by :func:`around`:

>>> import torch
>>> model, (x,) = around(lambda self, h: torch.sin(h))()
>>> model(x).shape
torch.Size([5, 2])
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple, TypeAlias

import torch

__all__ = ["Conv1D", "Example", "ExampleModel", "ExampleOutput", "RadialBasis", "around", "model_example",
           "split_heads_attention"]

nn = torch.nn
Example: TypeAlias = Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]
Body: TypeAlias = Callable[[Any, torch.Tensor], torch.Tensor]
"""``body(model, h)``; the model is an :class:`ExampleModel` whose members are set at run time."""


class ExampleOutput(NamedTuple):
    """A named-tuple output (the ``pack`` op's example returns one)."""

    y: torch.Tensor


class ExampleModel(nn.Module):
    """``fc2(body(self, fc1(x)))``: dense layers around the op under test.

    Parameters
    ----------
    body : ``body(model, h)``, the op under test applied to ``h = fc1(x)`` (it may use ``members``).
    n, h, k, m : ``fc1 = Linear(n, h)``, ``fc2 = Linear(k, m)`` (``k`` the width ``body`` leaves, ``h``
        by default).
    packed : return ``ExampleOutput(y)`` instead of ``y``.
    buffers : tensors registered as buffers.
    members : submodules, parameters, or plain tensors (read as constants).
    """

    def __init__(self, body: Body, n: int = 3, h: int = 4, k: int | None = None, m: int = 2,
                 packed: bool = False, buffers: dict[str, torch.Tensor] | None = None, **members: Any) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(n, h), nn.Linear(h if k is None else k, m)
        self.body, self.packed = body, packed
        for name, tensor in (buffers or {}).items():
            self.register_buffer(name, tensor)
        for name, member in members.items():
            setattr(self, name, member)

    def forward(self, x: torch.Tensor) -> torch.Tensor | ExampleOutput:
        y = self.fc2(self.body(self, self.fc1(x)))
        return ExampleOutput(y) if self.packed else y


def around(body: Body, shape: tuple[int, ...] = (5, 3), **options: Any) -> Example:
    """The example ``ExampleModel(body, **options)`` on a standard normal input of ``shape``. An option
    given as a function (``inner=lambda: nn.Linear(4, 4)``) is called by each call of the example, so
    that every model gets fresh members."""
    def example() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        built = {key: value() if inspect.isfunction(value) else value for key, value in options.items()}
        return ExampleModel(body, n=shape[-1], **built), (torch.randn(*shape),)
    return example


def model_example(model: Callable[[], nn.Module], inputs: Callable[[], torch.Tensor]) -> Example:
    """The example ``(model(), (inputs(),))``: for ops that need their own layer stack (convolutions,
    embeddings)."""
    return lambda: (model(), (inputs(),))


class RadialBasis(nn.Module):
    """``exp(−‖x − c_i‖²)`` for ``count`` learned centres ``c_i`` (rows of ``centres``)."""

    def __init__(self, count: int, features: int) -> None:
        super().__init__()
        self.centres = nn.Parameter(torch.randn(count, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.cdist(x, self.centres) ** 2)


class Conv1D(nn.Module):
    """GPT-2's ``Conv1D``: a dense layer storing its weight as ``(in, out)``, ``addmm(b, x.view(-1, n), W)``."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.n_out = n_out
        self.weight, self.bias = nn.Parameter(torch.randn(n_in, n_out)), nn.Parameter(torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.size()[:-1] + (self.n_out,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size)


def split_heads_attention(model: nn.Module, h: torch.Tensor, heads: int = 2, packed: bool = False) -> torch.Tensor:
    """Hand-written multi-head attention on ``h`` of shape ``(B, T, d)`` with ``model.query/key/value`` linears
    (with ``packed``, one ``model.qkv`` linear to ``3d`` cut by ``chunk``): split into heads,
    ``F.scaled_dot_product_attention``, merge (folded into one ``attention`` node)."""
    b, t, d = h.shape

    def split(u: torch.Tensor) -> torch.Tensor:
        return u.reshape(b, t, heads, d // heads).transpose(1, 2)

    if packed:
        query, key, value = model.get_submodule("qkv")(h).chunk(3, -1)
    else:
        query, key, value = (model.get_submodule(name)(h) for name in ("query", "key", "value"))
    out = torch.nn.functional.scaled_dot_product_attention(split(query), split(key), split(value))
    return out.transpose(1, 2).reshape(b, t, d)
