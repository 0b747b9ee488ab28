"""symalg: parameter-space symmetries of neural networks, derived symbolically and checked numerically.

One pipeline, whatever the front end (each stage usable on its own)::

    spec string, Spec ──► to_graph ─┐
                                     ├─► ModelGraph ──► derive ──► Analysis ──► lower / verify / applications
    any nn.Module ─────► trace ─────┘   (the IR)      (inference, symbolic       (torch callables, a report,
                        (fx, export)                     derivation, certification) teleportation, ...)

Subpackages: :mod:`symalg.ir` (the graph), :mod:`symalg.frontend`, :mod:`symalg.catalogue` (activations, groups,
op rules), :mod:`symalg.symbolic`, :mod:`symalg.lowering`, :mod:`symalg.numeric`, :mod:`symalg.verification`,
:mod:`symalg.applications`.

Example
-------
>>> import symalg
>>> analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
>>> [s.group.name for s in analysis.symmetries]
['PositiveScaling(h, alpha=1)', 'S(h)']
>>> analysis.orbit_dimension()
h
>>> symalg.verify(analysis.subs({"n": 3, "h": 5, "m": 2})).passed
True
"""
from symalg import applications  # noqa: F401  (the subpackage: symalg.applications.teleport, ...)
from symalg.applications import noether  # noqa: F401  (symalg.noether: laws of training dynamics)
from symalg.discovery import discover
from symalg.catalogue.activations import CATALOGUE, CatalogueEntry, overlay, register
from symalg.errors import SpecError
from symalg.frontend.spec import Spec, from_torch, parse, to_graph, to_module
from symalg.frontend.tracing import trace
from symalg.ir.architecture import Architecture
from symalg.ir.graph import ModelGraph
from symalg.lowering.codegen import LoweredFunction, lower
from symalg.symbolic.derive import Analysis, derive
from symalg.symbolic.inference import Blocked
from symalg.symbolic.symmetry import Symmetry
from symalg.verification.checks import VerificationReport
from symalg.verification.verifier import verify
from symalg.applications.mirrors import mirrors

__all__ = [
    # front ends and the graph they emit
    "parse", "Spec", "Architecture", "to_graph", "to_module", "trace", "from_torch", "ModelGraph",
    # derivation
    "derive", "Analysis", "Symmetry", "Blocked",
    # the catalogue
    "CATALOGUE", "CatalogueEntry", "register", "overlay",
    # lowering and verification
    "lower", "LoweredFunction", "verify", "VerificationReport",
    # errors
    "SpecError",
    # applications
    "mirrors",
    # discovery of the symmetries the catalogue does not know
    "discover",
]
__version__ = "0.1.0"
