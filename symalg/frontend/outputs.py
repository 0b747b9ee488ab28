"""Every tensor a model returns: tensors, tuples, lists, dicts, dataclasses and Hugging-Face-style
output objects, flattened to ``(path, tensor)`` pairs in a fixed order.

A symmetry holds only if it keeps *every* output; checks compare all of them, never the first alone.

>>> import torch
>>> out = {"logits": torch.zeros(2), "aux": (torch.ones(1), None, 3)}
>>> [path for path, _ in output_tensors(out)]
['logits', 'aux.0']
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

__all__ = ["output_tensors"]


def output_tensors(output: object, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """``[(path, tensor), ...]`` for every tensor in ``output``, in the order the model returns them.

    Mappings (``dict``, Hugging Face's ``ModelOutput``) give their keys, sequences their positions,
    dataclasses their fields. Leaves that are not tensors (``None``, numbers, strings) carry nothing to
    compare and are skipped.
    """
    def child(key: object) -> str:
        return f"{path}.{key}" if path else str(key)

    if isinstance(output, torch.Tensor):
        return [(path or "output", output)]
    if isinstance(output, Mapping):
        return [pair for key, value in output.items() for pair in output_tensors(value, child(key))]
    if isinstance(output, (tuple, list)):
        return [pair for i, value in enumerate(output) for pair in output_tensors(value, child(i))]
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return [pair for f in dataclasses.fields(output)
                for pair in output_tensors(getattr(output, f.name), child(f.name))]
    return []
