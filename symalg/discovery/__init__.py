"""Symmetry discovery: the symmetries a model has, whether or not the catalogue knows them.

* :mod:`symalg.discovery.exact`: every linear (affine) vector field ``θ ↦ Aθ + c`` leaving the network
  function invariant, by a null space; compared with the derived symmetries (:func:`discover`).
"""
from symalg.discovery.exact import Discovery, Generator, discover

__all__ = ["discover", "Discovery", "Generator"]
