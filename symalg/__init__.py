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
from symalg.applications import (conjugated, conservation_laws, ensembles, flat_minima, loss_symmetries,
                                 minima_geometry, nonlinear_actions, symmetry_init, teleport, teleport_actions,
                                 teleport_optim)
from symalg.applications.conservation_laws import (Completeness, ConservationLaws, compare_with_symmetries,
                                                   count_conservation_laws)
from symalg.catalogue import groups
from symalg.catalogue.activations import CATALOGUE, CatalogueEntry, overlay, register
from symalg.errors import SpecError
from symalg.frontend.spec import Spec, from_torch, parse, to_graph, to_module, to_spec_string
from symalg.frontend.tracing import trace
from symalg.ir.graph import ModelGraph
from symalg.ir.architecture import Architecture, validate
from symalg.lowering.codegen import LoweredFunction, lower
from symalg.numeric import orbit_rank
from symalg.numeric.orbit_rank import OrbitDimension
from symalg.numeric.sampling import network_function, random_data, random_params
from symalg.symbolic import report
from symalg.symbolic.inference import Blocked
from symalg.symbolic.derive import Analysis, derive
from symalg.symbolic.symmetry import Symmetry
from symalg.verification.verifier import verify

__all__ = ["Analysis", "Architecture", "Blocked", "CATALOGUE", "CatalogueEntry",
           "compare_with_symmetries", "Completeness", "conjugated", "conservation_laws", "ConservationLaws",
           "count_conservation_laws", "derive", "derive", "ensembles", "flat_minima", "from_torch", "groups",
           "loss_symmetries", "lower", "LoweredFunction", "minima_geometry", "Analysis", "ModelGraph", "Symmetry",
           "network_function",
           "nonlinear_actions", "orbit_rank", "OrbitDimension", "overlay", "parse",
           "random_data", "random_params", "register", "report", "Spec", "SpecError", "Symmetry",
           "symmetry_init", "teleport", "teleport_actions", "teleport_optim", "to_graph", "to_module", "to_spec_string",
           "trace", "validate", "verify"]
__version__ = "0.1.0"

