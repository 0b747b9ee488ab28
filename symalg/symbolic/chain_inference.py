"""Inference: which group acts on each hidden site, and which node blocked what.

A *site* is the feature axis between two linear layers (a hidden layer's neurons). The producer
layer's rows and the consumer layer's columns transform with the site; the activation applied on
the site decides, through its catalogue entry, which groups may act. An activation the catalogue
does not know admits no symmetry on its site, and an affine identity whose shift the consumer
cannot absorb (no bias) is dropped; both are recorded as :class:`Blocked` notes.

>>> import symalg
>>> sites, blocked = symalg.infer_sites(symalg.parse("linear(2, 3) -> sigmoid -> linear(3, 1, bias=False)"))
>>> [g.name for g in sites[0].groups], blocked[0].reason[:32]
(['S(3)'], 'sign flips need a bias in layer ')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import sympy as sp

from symalg.catalogue.activations import CATALOGUE
from symalg.ir.architecture import Architecture
from symalg.catalogue.groups import SignFlips, SiteGroup

__all__ = ["Site", "Blocked", "infer_sites"]


@dataclass(frozen=True)
class Site:
    """A hidden feature axis: ``h_k = σ(W_k h_{k-1} + b_k)``, read by layer ``k + 1``.

    ``index`` is ``k`` (1-based); ``producer`` and ``consumer`` are the linear layers' node names;
    ``op``/``params`` the activation on the site (``identity`` when there is none).
    """

    name: str
    index: int
    width: object
    op: str
    params: Mapping
    activation_node: str | None
    producer: str
    consumer: str
    groups: tuple[SiteGroup, ...] = field(default=())


@dataclass(frozen=True)
class Blocked:
    """A symmetry that could not be claimed: the node responsible, the site, and why."""

    node: str
    site: str
    reason: str

    def __str__(self):
        return f"{self.site} (node {self.node}): {self.reason}"


def _is_trivial(group: SiteGroup) -> bool:
    """True for a group with only the identity at a concrete width (e.g. ``S_1``): nothing to claim."""
    return sp.sympify(group.width).is_Integer and not group.is_continuous and not group.discrete_generators()


def infer_sites(arch: Architecture, catalogue: Mapping = CATALOGUE) -> tuple[tuple[Site, ...], tuple[Blocked, ...]]:
    """The hidden sites of ``arch`` with the groups acting on them, and the blocked symmetries."""
    linear = arch.linear_layers
    order = arch.layer_names
    sites, blocked = [], []
    for k, (producer, consumer) in enumerate(zip(linear, linear[1:]), start=1):
        between = order[order.index(producer) + 1: order.index(consumer)]
        name = f"h{k}"
        width = arch.node(producer)["out_features"]
        node = between[0] if between else None
        op = arch.node(node)["op"] if node else "identity"
        params = arch.node(node)["params"] if node else {}
        if op not in catalogue:
            blocked.append(Blocked(node, name, f"op {op!r} is not in the equivariance catalogue: no symmetry "
                                              f"is claimed on {name}"))
            groups = ()
        else:
            groups = []
            for group in catalogue[op].site_groups(width, **params):
                if _is_trivial(group):
                    continue
                if isinstance(group, SignFlips) and group.center != 0 and not arch.node(consumer)["bias"]:
                    blocked.append(Blocked(consumer, name, f"sign flips need a bias in layer {consumer} to absorb "
                                                           f"the shift 2c = {2 * group.center} of {op}"))
                    continue
                groups.append(group)
            groups = tuple(groups)
        sites.append(Site(name, k, width, op, dict(params), node, producer, consumer, groups))
    return tuple(sites), tuple(blocked)
