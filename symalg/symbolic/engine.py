"""The inference engine: run every op rule over the graph in data-flow order, then solve.

The state the rules work on and the solver live in :mod:`symalg.symbolic.inference`, the rules in
:mod:`symalg.catalogue.rules`; this module dispatches one to the other.

>>> import symalg
>>> sites = infer_model(symalg.to_graph("linear(n, h) -> relu -> linear(h, m)"))
>>> [(c.name, c.kinds) for c in sites.classes]
[('0', ('PS',))]
"""
from __future__ import annotations

from fractions import Fraction
from typing import Mapping

import networkx as nx

from symalg.catalogue.activations import CATALOGUE
from symalg.catalogue.products import PRODUCT_AWARE, separate_factors
from symalg.catalogue.rules import (OP_RULES, OVERLAYABLE, WEIGHT_RULES, Inputs, Rule, WeightExpr, activation_rule,
                                   unknown_rule)
import symalg.catalogue.torch_layer_rules  # noqa: F401  (registers the rules of torch's own layers)
from symalg.errors import SpecError
from symalg.ir.graph import ModelGraph
from symalg.symbolic.inference import ALL, CENTER_AWARE, Inference, Label, ModelSites, check_loss, solve

__all__ = ["infer_model", "rule_for", "check_overlays"]


def rule_for(op: str, inputs: Inputs, catalogue: Mapping) -> Rule:
    """The op's rule; an op reading a parameter (or a weight computed from parameters) as a value gets
    the unknown rule unless its rule reads weights (a parameter under ``relu`` is not a feature axis).
    An overlay entry (one that is not the built-in catalogue's) named like a pointwise op rule
    (``sin``, ``abs``; :data:`~symalg.catalogue.rules.OVERLAYABLE`) replaces that rule: the user's declared
    identity is what the op is checked and claimed under."""
    if op not in WEIGHT_RULES and any(isinstance(i, WeightExpr) or isinstance(i, tuple) and i[:1] == ("param",)
                                      for i in inputs):
        return unknown_rule
    if op in OVERLAYABLE and op in catalogue and catalogue[op] is not CATALOGUE.get(op):
        return activation_rule
    if op in OP_RULES:
        return OP_RULES[op]
    if op in catalogue:
        return activation_rule
    return unknown_rule


def check_overlays(catalogue: Mapping) -> None:
    """Refuse an overlay entry named like a structural op (``add``, ``linear``): an activation entry
    cannot describe what that op does, and its rule would silently win."""
    for name in catalogue:
        if name in OP_RULES and name not in OVERLAYABLE and catalogue[name] is not CATALOGUE.get(name):
            raise SpecError(f"catalogue: entry {name!r} names the structural op {name!r}, which an activation "
                            f"entry cannot describe; only pointwise ops ({', '.join(sorted(OVERLAYABLE))}) may be "
                            "overlaid")



def infer_model(model_graph: ModelGraph, catalogue: Mapping = CATALOGUE, loss: str = "mse",
                strict: bool = True) -> ModelSites:
    """Run every op rule in data-flow order and solve the ties and restrictions.

    ``loss`` is ``"mse"`` (outputs must not change) or ``"cross_entropy"`` (outputs are logits: a
    shift along ``1`` leaves the loss unchanged). With ``strict``, an activation's declared group that
    a symbolic check disproves is not claimed (a ``Blocked`` note says which check failed).
    """
    check_loss(loss, "infer_model")
    check_overlays(catalogue)
    state = Inference(model_graph, catalogue, loss, strict)
    for node in nx.topological_sort(state.graph):
        data = state.graph.nodes[node]
        inputs = [state.labels.get(i) if i is not None else None for i in data["inputs"]]
        if data["op"] not in PRODUCT_AWARE:
            inputs = [separate_factors(state, node, i) if isinstance(i, Label) else i for i in inputs]
        if data["op"] not in CENTER_AWARE:
            for label in inputs:
                if isinstance(label, Label) and any(seg.center for seg in label.segments):
                    state.restrict_label(label.map_segments(center=Fraction(0)), ALL - {"SF"}, node,
                                         f"{state.where(node)} cannot absorb the shift of an affine sign flip")
        state.labels[node] = rule_for(data["op"], inputs, catalogue)(state, node, data, inputs)
    return solve(state)
