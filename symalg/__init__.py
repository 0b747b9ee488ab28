"""symalg: parameter-space symmetries of neural networks, derived symbolically and checked numerically.

Pipeline (each stage usable on its own)::

    front end ──► Architecture ──► infer_sites ──► derive ──► lower ──► verify
    (parse, from_torch) (networkx)  (catalogue)     (SymPy)    (torch)   (report)

    any nn.Module ──► trace ──► ModelGraph ──► infer_model ──► derive ──► verify
                     (torch.fx)  (networkx)    (op rules)     (SymPy)   (functional_call)

Example
-------
>>> import symalg
>>> analysis = symalg.derive(symalg.parse("linear(n, h) -> relu -> linear(h, m)"))
>>> [s.group.name for s in analysis.symmetries]
['PositiveScaling(h, alpha=1)', 'S(h)']
>>> analysis.orbit_dimension()
h
>>> symalg.verify(analysis.subs({"n": 3, "h": 5, "m": 2})).passed
True
"""
from . import (catalogue, conjugated, conservation_laws, ensembles, flat_minima, groups, loss_symmetries,
               minima_geometry, nn, nonlinear_actions, orbit_rank, report, symmetry_init, teleport, teleport_actions,
               teleport_optim)
from .catalogue import CATALOGUE, CatalogueEntry, overlay, register
from .derive import Analysis, Symmetry, derive, parameter_symbols
from .frontend import Spec, from_torch, parse, to_module, to_spec_string
from .graph import Architecture, SpecError, validate
from .inference import Blocked, Site, infer_sites
from .lowering import LoweredFunction, lower
from .conservation_laws import Completeness, ConservationLaws, compare_with_symmetries, count_conservation_laws
from .numeric import network_function, random_data, random_params
from .orbit_rank import OrbitDimension, model_orbit_dimension, model_orbit_dimension_formula
from .verification import verify
from .tracing import ModelGraph, trace
from .model_derive import ModelAnalysis, ModelSymmetry, derive_model

__all__ = ["Analysis", "Architecture", "Blocked", "CATALOGUE", "catalogue", "CatalogueEntry",
           "compare_with_symmetries", "Completeness", "conjugated", "conservation_laws", "ConservationLaws",
           "count_conservation_laws", "derive", "derive_model", "ensembles", "flat_minima", "from_torch", "groups",
           "infer_sites", "loss_symmetries", "lower", "LoweredFunction", "minima_geometry", "model_orbit_dimension",
           "model_orbit_dimension_formula", "ModelAnalysis", "ModelGraph", "ModelSymmetry", "network_function", "nn",
           "nonlinear_actions", "orbit_rank", "OrbitDimension", "overlay", "parameter_symbols", "parse",
           "random_data", "random_params", "register", "report", "Site", "Spec", "SpecError", "Symmetry",
           "symmetry_init", "teleport", "teleport_actions", "teleport_optim", "to_module", "to_spec_string", "trace",
           "validate", "verify"]
__version__ = "0.1.0"

