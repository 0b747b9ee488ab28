"""What symalg's symmetries are used for: teleportation, flat minima, conservation laws, minima geometry,
nonlinear and data-dependent actions, loss symmetries, conjugated actions, ensembles, initialisation,
mirror constraints, Noether laws of training dynamics, learned teleportation, the elementwise conserved quantity
of whitened inputs.

Every application takes an :class:`~symalg.Analysis` (or an action built from one) and never asks which front end
made it.
"""
from symalg.applications import (conjugated, conservation_laws, constraint_engineering, ensembles, flat_minima,
                                 loss_symmetries, minima_geometry, mirrors, noether, nonlinear_actions, symmetry_init,
                                 teleport, teleport_actions, teleport_optim, whitened)
from symalg.applications import learn_to_teleport

__all__ = ["conjugated", "conservation_laws", "constraint_engineering", "ensembles", "flat_minima", "loss_symmetries",
           "minima_geometry", "mirrors", "noether", "nonlinear_actions", "symmetry_init", "teleport",
           "teleport_actions", "teleport_optim", "learn_to_teleport", "whitened"]
