"""What symalg's symmetries are used for: teleportation, flat minima, conservation laws, minima geometry,
nonlinear and data-dependent actions, loss symmetries, conjugated actions, ensembles, initialisation,
mirror constraints, Noether laws of training dynamics, learned teleportation, the elementwise conserved quantity
of whitened inputs.

Every application takes an :class:`~symalg.Analysis` (or an action built from one) and never asks which front end
made it.

Each submodule is imported on first use (``symalg.applications.teleport`` loads only teleportation).
"""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["conjugated", "conservation_laws", "constraint_engineering", "ensembles", "flat_minima", "loss_symmetries",
           "minima_geometry", "mirrors", "noether", "nonlinear_actions", "symmetry_init", "teleport",
           "teleport_actions", "teleport_optim", "learn_to_teleport", "whitened"]


def __getattr__(name: str) -> ModuleType:
    """Import the application module ``name`` on first use (PEP 562)."""
    if name not in __all__:
        raise AttributeError(f"module 'symalg.applications' has no attribute {name!r}")
    return importlib.import_module(f"symalg.applications.{name}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
