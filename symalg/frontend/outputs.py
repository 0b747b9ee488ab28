"""Every tensor a model returns: tensors, tuples, lists, dicts, dataclasses, Hugging Face ``ModelOutput``
objects and any other object holding tensors in its attributes (a key/value cache such as ``DynamicCache``),
flattened to ``(path, tensor)`` pairs in a fixed order.

A symmetry holds only if it keeps *every* output; checks compare all of them, never the first alone. A
key/value cache returned beside the hidden states is an output like any other: the query/key ``GL(d_k)``
of attention changes it, so it blocks that group (:func:`output_hint` says how to leave it out).

>>> import torch
>>> class Cache:
...     def __init__(self):
...         self.keys, self.offloading = [torch.ones(2)], False
>>> out = {"logits": torch.zeros(2), "aux": (torch.ones(1), None, 3), "past_key_values": Cache()}
>>> [path for path, _ in output_tensors(out)]
['logits', 'aux.0', 'past_key_values.keys.0']
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import torch

__all__ = ["output_tensors", "output_hint"]

_PLAIN = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.nn.Module)
"""Leaves that hold no output tensor (a module's parameters are not outputs)."""


def output_tensors(output: object, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """``[(path, tensor), ...]`` for every tensor in ``output``, in the order the model returns them.

    Mappings (``dict``, Hugging Face's ``ModelOutput``) give their keys, sequences their positions,
    dataclasses their fields, any other object its public attributes (``past_key_values.layers.0.keys``
    of a ``DynamicCache``). Leaves that are not tensors (``None``, numbers, strings, devices) carry nothing
    to compare and are skipped; an object met twice on one path (a cycle) is read once.
    """
    return _flatten(output, path, set())


def _flatten(output: object, path: str, seen: set[int]) -> list[tuple[str, torch.Tensor]]:
    def child(key: object) -> str:
        return f"{path}.{key}" if path else str(key)

    def children(items: Iterable[tuple[object, object]]) -> list[tuple[str, torch.Tensor]]:
        inner = seen | {id(output)}
        return [pair for key, value in items for pair in _flatten(value, child(key), inner)]

    if isinstance(output, torch.Tensor):
        return [(path or "output", output)]
    if isinstance(output, _PLAIN) or id(output) in seen or callable(output):
        return []
    if isinstance(output, Mapping):
        return children(output.items())
    if isinstance(output, (tuple, list)):
        return children(enumerate(output))
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return children((f.name, getattr(output, f.name)) for f in dataclasses.fields(output))
    attributes = getattr(output, "__dict__", {})
    return children((k, v) for k, v in attributes.items() if not k.startswith("_"))


def output_hint(path: str) -> str:
    """Advice for an output that blocks a symmetry: a key/value cache (``past_key_values``, ``...cache...``)
    is left out of a Hugging Face model's outputs by ``use_cache=False``; ``""`` for any other output.

    >>> output_hint("past_key_values.layers.0.keys").split(";")[1]
    ' trace with use_cache=False to leave it out of the outputs)'
    >>> output_hint("last_hidden_state")
    ''
    """
    lowered = path.lower()
    if "past_key_values" in lowered or "cache" in lowered:
        return (" (a key/value cache: the attention symmetries that move keys or values change it; trace with "
                "use_cache=False to leave it out of the outputs)")
    return ""
