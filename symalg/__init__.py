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

Importing the package is cheap: every name below is imported on first use (``symalg.derive`` loads the derivation
stack, ``symalg.applications.teleport`` the teleportation module), so ``symalg --help`` and ``import symalg`` do not
pay for torch, SymPy and the applications they do not use.
"""
import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING, Any as _Any

from symalg._version import __version__ as __version__  # re-exported: the one version source

if _TYPE_CHECKING:  # the names as static tools see them; at run time __getattr__ imports each on first use
    from symalg import applications  # noqa: F401
    from symalg.applications import noether  # noqa: F401
    from symalg.applications.mirrors import mirrors
    from symalg.catalogue.activations import CATALOGUE, CatalogueEntry, overlay, register
    from symalg.discovery import discover
    from symalg.errors import (CertificationError, LoweringError, ParameterError, SpecError, TracingError,
                               WidthError)
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

__all__ = [
    # front ends and the graph they emit
    "parse", "Spec", "Architecture", "to_graph", "to_module", "trace", "from_torch", "ModelGraph",
    # derivation
    "derive", "Analysis", "Symmetry", "Blocked",
    # the catalogue
    "CATALOGUE", "CatalogueEntry", "register", "overlay",
    # lowering and verification
    "lower", "LoweredFunction", "verify", "VerificationReport",
    # errors (every one a SpecError)
    "SpecError", "TracingError", "ParameterError", "WidthError", "CertificationError", "LoweringError",
    # applications
    "mirrors",
    # discovery of the symmetries the catalogue does not know
    "discover",
]

# public name -> the module defining it
_HOMES = {
    "parse": "symalg.frontend.spec", "Spec": "symalg.frontend.spec", "to_graph": "symalg.frontend.spec",
    "to_module": "symalg.frontend.spec", "from_torch": "symalg.frontend.spec", "trace": "symalg.frontend.tracing",
    "Architecture": "symalg.ir.architecture", "ModelGraph": "symalg.ir.graph",
    "derive": "symalg.symbolic.derive", "Analysis": "symalg.symbolic.derive", "Symmetry": "symalg.symbolic.symmetry",
    "Blocked": "symalg.symbolic.inference",
    "CATALOGUE": "symalg.catalogue.activations", "CatalogueEntry": "symalg.catalogue.activations",
    "register": "symalg.catalogue.activations", "overlay": "symalg.catalogue.activations",
    "lower": "symalg.lowering.codegen", "LoweredFunction": "symalg.lowering.codegen",
    "verify": "symalg.verification.verifier", "VerificationReport": "symalg.verification.checks",
    "SpecError": "symalg.errors", "TracingError": "symalg.errors", "ParameterError": "symalg.errors",
    "WidthError": "symalg.errors", "CertificationError": "symalg.errors", "LoweringError": "symalg.errors",
    "mirrors": "symalg.applications.mirrors", "discover": "symalg.discovery.exact",
}
# attributes that are modules: the subpackages, and symalg.noether (laws of training dynamics)
_MODULES = {name: f"symalg.{name}" for name in ("applications", "catalogue", "discovery", "frontend", "ir",
                                                  "lowering", "numeric", "symbolic", "verification", "cli")}
_MODULES["noether"] = "symalg.applications.noether"


def __getattr__(name: str) -> _Any:
    """Import a public name (or a subpackage) on first use and keep it (PEP 562)."""
    if name in _HOMES:
        value = getattr(_importlib.import_module(_HOMES[name]), name)
    elif name in _MODULES:
        value = _importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'symalg' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES) | set(_MODULES))
