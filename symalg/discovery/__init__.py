"""Symmetry discovery: the symmetries a model has, whether or not the catalogue knows them.

* :mod:`symalg.discovery.exact`: every linear (affine) vector field ``θ ↦ Aθ + c`` leaving the network
  function invariant, by a null space; compared with the derived symmetries (:func:`discover`).
* :mod:`symalg.discovery.pointwise`: the first-order null space of the per-sample losses (or outputs) at one
  parameter point and given data (:func:`null_space_at`).
"""
from symalg.discovery.exact import Discovery, Generator, discover
from symalg.discovery.pointwise import PointNullSpace, null_space_at

__all__ = ["discover", "Discovery", "Generator", "null_space_at", "PointNullSpace"]
