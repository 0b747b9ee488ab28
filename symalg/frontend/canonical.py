"""The activation part of the op-spelling tables, built from the catalogue entries' :class:`Spellings`.

Every way torch writes a catalogue activation (a module class, a function, a tensor method, an ATen
overload as ``torch.export`` shows it) maps to the entries that spell it. An op is the first of those
entries whose ``read`` covers torch's settings; a spelling no entry covers at these settings gets a
name that carries them (``hardtanh(min_val=-2.0, max_val=3.0)``) and so is no catalogue entry: the op is
opaque and blocks its site. Registering an entry with its spellings is all the front ends need.

>>> import torch
>>> module_activation(torch.nn.ReLU6())
('relu6', {})
>>> module_activation(torch.nn.Hardtanh(-2.0, 3.0)) is None
True
>>> opaque_module_name(torch.nn.Hardtanh(-2.0, 3.0))
'Hardtanh(min_val=-2.0, max_val=3.0)'
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch

from symalg.catalogue.activations import CATALOGUE, CatalogueEntry
from symalg.catalogue.modules import Activation

__all__ = ["SpellingTable", "spelling_table", "ACTIVATIONS", "module_activation", "opaque_module_name",
           "call_activation", "IN_PLACE_FUNCTIONS", "IN_PLACE_METHODS"]

Entries = tuple[CatalogueEntry, ...]


@dataclass(frozen=True)
class SpellingTable:
    """``{torch spelling: entries spelling it}`` per kind of spelling (read-only mappings)."""

    modules: Mapping[type, Entries]
    functions: Mapping[Callable, Entries]
    methods: Mapping[str, Entries]
    aten: Mapping[str, Entries]


def spelling_table(catalogue: Mapping[str, CatalogueEntry] = CATALOGUE) -> SpellingTable:
    """The spelling table of ``catalogue``, entries in catalogue order under each spelling.

    >>> spelling_table().aten["aten.hardtanh.default"]   # doctest: +ELLIPSIS
    (CatalogueEntry(name='hardtanh', ...), CatalogueEntry(name='relu6', ...))
    """
    tables: tuple[dict, ...] = ({}, {}, {}, {})
    for entry in catalogue.values():
        spelled = entry.spellings
        for table, keys in zip(tables, (spelled.modules, spelled.functions, spelled.methods, spelled.aten)):
            for key in keys:
                table[key] = table.get(key, ()) + (entry,)
    return SpellingTable(*(MappingProxyType(table) for table in tables))


ACTIVATIONS = spelling_table()
"""The built-in catalogue's spelling table."""

IN_PLACE_FUNCTIONS = frozenset(f for f in ACTIVATIONS.functions if getattr(f, "__name__", "").endswith("_"))
"""Activation functions that write their input (``F.relu_``): later readers of the input read the result."""
IN_PLACE_METHODS = frozenset(m for m in ACTIVATIONS.methods if m.endswith("_"))
"""Activation tensor methods that write their tensor (``x.relu_()``)."""


def _covering(entries: Entries, torch_args: Mapping) -> tuple[str, dict] | None:
    """``(name, hyper-parameters)`` of the first entry covering torch's settings, else ``None``."""
    for entry in entries:
        params = entry.spellings.read(torch_args)
        if params is not None:
            return entry.name, entry.resolve(params)
    return None


def _arguments(entries: Entries) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for entry in entries for name in entry.spellings.arguments))


def module_activation(module: torch.nn.Module) -> tuple[str, dict] | None:
    """``(op, hyper-parameters)`` of an activation module the catalogue covers, else ``None``.

    A module is matched by its exact class (a subclass may compute something else), its settings read
    off its attributes named in the entries' ``arguments``.

    >>> module_activation(torch.nn.LeakyReLU(0.2))
    ('leaky_relu', {'slope': 1/5})
    """
    if isinstance(module, Activation):
        return module.op, dict(module.params)
    entries = ACTIVATIONS.modules.get(type(module), ())
    settings = {name: getattr(module, name) for name in _arguments(entries) if hasattr(module, name)}
    return _covering(entries, settings)


def opaque_module_name(module: torch.nn.Module) -> str:
    """The op name of a module the catalogue does not cover: its class, with the settings no entry
    covers when the class is spelled by one (``GELU(approximate='sigmoid')``)."""
    entries = ACTIVATIONS.modules.get(type(module), ())
    settings = {name: getattr(module, name) for name in _arguments(entries) if hasattr(module, name)}
    return _with_settings(type(module).__name__, settings)


def _with_settings(name: str, settings: Mapping) -> str:
    if not settings:
        return name
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in settings.items())})"


def call_activation(spelling: str, target: object, torch_args: Mapping[str, object]) -> tuple[str, dict] | None:
    """``(op, hyper-parameters)`` of a call the catalogue spells, ``(name with settings, {})`` when it
    spells the callee but covers none of its settings, ``None`` when it does not spell the callee.

    Parameters
    ----------
    spelling : ``"function"``, ``"method"`` (``target`` a method name) or ``"aten"`` (``target`` an
        ATen overload or its name, ``"aten.relu.default"``).
    target : the callee.
    torch_args : the call's arguments by torch's parameter names, defaults included.

    Examples
    --------
    >>> call_activation("aten", "aten.hardtanh.default", {"min_val": 0.0, "max_val": 6.0})
    ('relu6', {})
    >>> call_activation("aten", "aten.hardtanh.default", {"min_val": -2.0, "max_val": 6.0})
    ('aten.hardtanh.default(min_val=-2.0, max_val=6.0)', {})
    """
    if spelling not in ("function", "method", "aten"):
        raise ValueError(f"call_activation: spelling must be 'function', 'method' or 'aten', got {spelling!r}")
    tables: dict[str, Mapping[Any, Entries]] = {"function": ACTIVATIONS.functions, "method": ACTIVATIONS.methods,
                                                "aten": ACTIVATIONS.aten}
    table = tables[spelling]
    key = str(target) if spelling == "aten" else target
    entries = table.get(key, ())
    if not entries:
        return None
    known = _covering(entries, torch_args)
    if known is not None:
        return known
    # a qualified name, never a catalogue name, so that the uncovered call stays opaque
    name = {"function": f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', target)}",
            "method": f"Tensor.{target}", "aten": str(target)}[spelling]
    return _with_settings(name, {k: torch_args[k] for k in _arguments(entries) if k in torch_args}), {}
