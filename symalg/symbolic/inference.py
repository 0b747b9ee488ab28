"""Inference on a traced model: which group acts on each site, through every op that touches it.

Every value flowing through a :class:`~symalg.frontend.tracing.ModelGraph` gets a :class:`Label`: the sites
whose coordinates run along its feature axis (:class:`Segment`\\ s; a concatenation has several, a
value with none is data nothing acts on). Op rules (:mod:`symalg.catalogue.rules`) create sites where a
parameterised map writes a feature axis, bind the tensors around them (:class:`~symalg.catalogue.bindings.Binding`),
tie sites that must transform together (skip connections, shared parameters, heads) and restrict the
*kinds* of group a site may carry:

======= ===========================================================================
kind    group
======= ===========================================================================
``GL``  general linear (identity activation, attention heads, adapter ranks)
``O``   orthogonal (radial activations, gain-free RMSNorm streams, tied embeddings)
``O1``  orthogonal fixing ``1`` (inputs of a LayerNorm without gain, groups of a GroupNorm)
``C``   complex scaling of the planes ``(i, i + h/2)`` (a head's queries/keys under rotary embeddings)
``PS``  positive diagonal scaling, ``π(d) = d^power`` (ReLU, pooling, batch norm)
``SF``  sign flips (odd activations)
``S``   permutations (any pointwise op); acts on a whole *permutation class* of sites
        tied through diagonal maps (norm gains, batch norm)
``T``   translation of the producer's bias (the input of a batch norm; one group's biases under group norm), or,
        where biased maps read the value, of the bias with each reader's bias absorbing ``−W t`` (a shear)
``T1``  translation along ``1`` of the producer's map (logits under softmax/cross-entropy)
======= ===========================================================================

A site's group is the largest kind allowed by every op touching it; an op the rules do not know
restricts every site it touches to the kinds under which its input is invariant (usually none), and
each removal is recorded as a :class:`~symalg.symbolic.inference.Blocked` note naming the node.

A site is named after what users see, the same whatever the front end (:func:`site_stem`): the module path of
the layer whose parameters it moves (``0``, ``enc.0``, ``blocks.3.attn.head1.qk``), a bare parameter's name
(``w`` for ``F.linear(x, self.w)``), else the node; a name taken already (a module called twice, a norm's gain
reading several sites) gets ``#2``, ``#3``, ... in data-flow order.

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
>>> from symalg.symbolic.engine import infer_model
>>> sites = infer_model(symalg.trace(model))
>>> [(s.name, s.width, s.kinds) for s in sites.classes]
[('0', 4, ('PS',))]
>>> [(p.name, p.width) for p in sites.permutations]
[('0', 4)]
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Iterable, Mapping

import networkx as nx
import sympy as sp

from symalg.catalogue.bindings import Absorber, Binding
from symalg.catalogue.activations import CATALOGUE
from symalg.errors import SpecError
from symalg.ir.architecture import at_least, width_less, width_max
from symalg.ir.graph import ModelGraph

__all__ = ["Blocked", "Segment", "Label", "SiteClass", "PermutationClass", "ModelSites", "Inference", "solve", "KINDS",
           "GRANTED", "owner", "site_stem"]

KINDS = ("GL", "O", "O1", "C", "PS", "SF", "EF", "S", "T", "T1")
GRANTED = frozenset({"C"})
"""Kinds a site carries only where the rule making it grants them (``C``: a head's query/key planes under rotary
embeddings, :func:`~symalg.catalogue.rules.attention.attention_sites`); any restriction not naming them removes them."""
ALL = frozenset(KINDS) - GRANTED
"""The kinds a new site may carry until an op restricts them."""
DIAGONAL = frozenset({"PS", "SF", "S"})
"""Kinds acting by diagonal matrices and permutations: what a parameter multiplying a site entrywise moves with."""
DIAGONAL_MOVES = frozenset({"PS", "SF"})
"""Kinds that rescale the diagonal of a diagonal map reading the site (a norm's gain absorbs them)."""
TRANSLATIONS = frozenset({"T", "T1"})
EVEN = frozenset({"EF"})
"""Kinds that move an even activation's input only (``|z|``'s flips): the values after the activation are invariant
under them (:attr:`Segment.invariant`), the regions reading those values record it (:attr:`Binding.invariant`) and
stay, and a site keeps them only where an activation claiming them acts on it."""
LAYER_PARAMETERS = frozenset({"weight", "bias", "in_proj_weight", "in_proj_bias"})
"""A layer's own parameters (``nn.Linear``, ``nn.Conv2d``, norms, ``nn.MultiheadAttention``...): a site they
produce is named after the layer."""


def owner(tensor: str) -> str:
    """The name users see for what owns the parameter ``tensor``: a layer's module path for its own parameters
    (:data:`LAYER_PARAMETERS`), else the parameter's own name.

    >>> owner("enc.0.weight"), owner("attn.in_proj_bias"), owner("w"), owner("lora.A")
    ('enc.0', 'attn', 'w', 'lora.A')
    """
    path, _, leaf = tensor.rpartition(".")
    return path if path and leaf in LAYER_PARAMETERS else tensor


def site_stem(tensors: Iterable[str], node: str) -> str:
    """The name of a site moving the rows of ``tensors`` (the parameters producing it), made at ``node``: the
    longest module path their owners (:func:`owner`) share, else the first owner, else the node name.

    >>> site_stem(["enc.0.weight", "enc.0.bias"], "linear_3"), site_stem(["w", "b"], "linear")
    ('enc.0', 'w')
    >>> site_stem(["attn.q.weight", "attn.k.weight"], "attention_0"), site_stem([], "layer_norm")
    ('attn', 'layer_norm')
    """
    owners = [owner(t).split(".") for t in dict.fromkeys(tensors)]
    if not owners:
        return node
    common = []
    for parts in zip(*owners):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common) or ".".join(owners[0])


@dataclass(frozen=True)
class Blocked:
    """A symmetry that could not be claimed: the node responsible, the site, and why."""

    node: str
    site: str
    reason: str

    def __str__(self) -> str:
        return f"{self.site} (node {self.node}): {self.reason}"


@dataclass(frozen=True)
class Segment:
    """Coordinates ``[offset, offset + width·block)`` of a value's feature axis belong to ``site``.

    ``power``: the value transforms by ``d^power`` under positive scaling of the site (0 after a
    scale-invariant normalisation); ``invariant``: kinds under which the value does not change.
    """

    site: int
    offset: int
    width: int
    block: int = 1
    power: Fraction = Fraction(1)
    invariant: frozenset = frozenset()
    center: Fraction = Fraction(0)
    """Sign flips act affinely on the value: ``v ↦ g v + center·(1 − g1)`` (``1/2`` after a sigmoid)."""
    translates: bool = True
    """A translation ``T`` of the site moves the value by the same vector (false after a sign change or a scaling,
    where a reader's bias cannot give back ``W t``: only readers the translation leaves unchanged keep ``T``)."""

    def acts_trivially(self) -> frozenset:
        return self.invariant | ({"PS"} if self.power == 0 else set())

    def unmoved(self) -> frozenset:
        """The kinds of :data:`EVEN` the value is invariant under: a region reading it records them and stays."""
        return self.invariant & EVEN


@dataclass(frozen=True)
class Label:
    """The sites along a value's feature axis ``dim`` (a negative index) of length ``size``."""

    dim: int
    size: int | None
    segments: tuple[Segment, ...] = ()

    @staticmethod
    def data(dim: int = -1, size: int | None = None) -> "Label":
        """A value nothing acts on (model inputs, outputs of unknown ops)."""
        return Label(dim, size, ())

    def map_segments(self, **changes: Any) -> "Label":
        return Label(self.dim, self.size, tuple(replace(s, **changes) for s in self.segments))


@dataclass
class _Site:
    id: int
    name: str
    width: int
    node: str
    allowed: set = field(default_factory=lambda: set(ALL))
    bindings: list = field(default_factory=list)
    translations: list = field(default_factory=list)
    shifts: list = field(default_factory=list)
    absorbers: list = field(default_factory=list)
    """The :class:`~symalg.catalogue.bindings.Absorber` of each biased map reading the site's value, whose bias gives
    back the change of a translation ``T`` (recorded by :meth:`Inference.absorb`)."""
    removed: list = field(default_factory=list)
    dissolved: bool = False
    checks: list = field(default_factory=list)
    """Symbolic checks of the activations acting on the site, one record per activation (see :data:`CheckRecord`)."""
    row_shifts: bool = True
    """False once an op ignores only shifts that are the same at every position (a LayerNorm over several axes):
    no writer of the site's class may then move its weight's rows along ``1`` (a shift ``t·x_j`` varying with
    position); decided for the whole class, since a sum ties the writers' sites (:func:`solve`)."""


CheckRecord = tuple
"""``(node, op, ((kinds, checks), ...))``: an activation ``op`` at ``node`` acting on a site, and for each group it
declares and that was claimed, the kinds the group allows and its three :class:`~symalg.symbolic.checks.SymbolicCheck`
results."""


def checks_for(records: Iterable[CheckRecord], kind: str) -> tuple:
    """The symbolic checks behind a claim of ``kind`` on a site: for every activation acting on it (``records``,
    :data:`CheckRecord`), the checks of the most specific declared group that allows ``kind`` (``S`` of a pointwise
    activation rather than its ``GL``). Empty when no activation acts on the site (a linear bottleneck, a
    translation)."""
    found = []
    for _, _, groups in records:
        allowing = [(len(kinds), checks) for kinds, checks in groups if kind in kinds]
        if allowing:
            found.extend(min(allowing, key=lambda pair: pair[0])[1])
    return tuple(found)


@dataclass(frozen=True)
class SiteClass:
    """Sites tied together (one group acts on all of them), with what survived every constraint."""

    name: str
    width: int
    members: tuple[str, ...]
    kinds: tuple[str, ...]
    bindings: tuple[Binding, ...]
    translations: tuple = ()
    """``(kind, producer node, TranslationFamily)`` triples: the translations that survived (with the absorbers of
    the biased maps reading the site, for a shear)."""
    alpha: Fraction = Fraction(1)
    """The power at which the site's readers see positive scaling (1 for ReLU, 0 before batch norm)."""
    shifts: tuple = ()
    """``(Absorber, center)``: the readers whose biases absorb the shift of affine sign flips."""
    checks: tuple = ()
    """Symbolic checks of the activations acting on the class's sites (:data:`CheckRecord`; :meth:`checks_for`)."""

    def checks_for(self, kind: str) -> tuple:
        """The symbolic checks behind a claim of ``kind`` here (:func:`checks_for`)."""
        return checks_for(self.checks, kind)


@dataclass(frozen=True)
class PermutationClass:
    """Sites moved by one permutation (tied through diagonal maps such as norm gains)."""

    name: str
    width: int
    members: tuple[str, ...]
    bindings: tuple[Binding, ...]
    checks: tuple = ()
    """Symbolic checks of the activations acting on the member sites (:data:`CheckRecord`)."""

    def checks_for(self, kind: str = "S") -> tuple:
        """The symbolic checks behind the permutation claim (:func:`checks_for`)."""
        return checks_for(self.checks, kind)


@dataclass(frozen=True)
class ModelSites:
    """The result of :func:`infer_model`: site classes, permutation classes and blocked notes."""

    classes: tuple[SiteClass, ...]
    permutations: tuple[PermutationClass, ...]
    blocked: tuple[Blocked, ...]
    restrictions: tuple[Blocked, ...] = ()
    """Every other kind an op removed, and why (the nature of the op, not a limitation)."""
    labels: Mapping = field(default_factory=dict, repr=False)


class Inference:
    """The state op rules work on: labels of values, sites, ties and restrictions."""

    def __init__(self, model_graph: ModelGraph, catalogue: Mapping = CATALOGUE, loss: str = "mse", strict: bool = True):
        self.model_graph = model_graph
        self.graph = model_graph.graph
        self.catalogue = catalogue
        self.loss = loss
        self.strict = strict
        """Drop an activation's declared group that a symbolic check (:mod:`symalg.symbolic.checks`) disproves."""
        self.sites: list[_Site] = []
        self.site_names: set[str] = set()
        self.ties = nx.utils.UnionFind()
        self.permutation_ties = nx.utils.UnionFind()
        self.labels: dict[str, object] = {}
        self.opaque: dict[str, str] = {}
        """``{tensor: node}``: parameters read by an op the rules do not know; no action may move them."""
        self.pinned: list[tuple[Binding, str]] = []
        """``(region, node)``: tensor regions ``node`` reads against values nothing acts on (see :meth:`pin`)."""
        self.shapes = model_graph.shapes
        self.zero_sums: dict[tuple[str, str], int] = {}
        """``{(norm, reader): site}``: a site per node reading a gain-free layer norm's output, for the shift of the
        reader's rows along ``1`` (``rules._zero_sum_readers``)."""

    # -- sites ----------------------------------------------------------------------------------
    def new_site(self, node: str, width: int, bindings: Iterable[Binding] = (), name: str | None = None,
                 allowed: Iterable[str] = ALL) -> int:
        """A site made at ``node``, moving ``bindings``; named ``name``, else after the tensors whose rows it
        moves (:func:`site_stem`); a name taken already gets ``#2``, ``#3``, ... (a module called again)."""
        stem = name or site_stem([b.tensor for b in bindings if b.role == "out"], node)
        name, call = stem, 1
        while name in self.site_names:
            call += 1
            name = f"{stem}#{call}"
        site = _Site(len(self.sites), name, width if isinstance(width, sp.Basic) else int(width), node,
                     set(allowed))
        self.sites.append(site)
        self.site_names.add(name)
        self.ties[site.id]
        self.permutation_ties[site.id]
        for binding in bindings:
            self.bind(site.id, binding)
        return site.id

    def site(self, site_id: int) -> _Site:
        return self.sites[site_id]

    def bind(self, site_id: int, binding: Binding) -> None:
        self.sites[site_id].bindings.append(binding)

    def bind_reader(self, label: Label, tensor: str, axis: int, node: str, role: str = "in") -> None:
        """Bindings for a map reading ``label`` along ``axis`` of ``tensor`` (columns of a weight; ``role="out"``
        for a parameter added to the value); the coordinates of the axis no segment covers are read against
        data and are pinned."""
        covered = 0
        for seg in sorted(label.segments, key=lambda s: s.offset):
            self.bind(seg.site, Binding(tensor, axis, seg.offset, seg.width, seg.block, role, seg.power, node=node,
                                        invariant=seg.unmoved()))
            if width_less(covered, seg.offset):
                self.pin(Binding(tensor, axis, covered, seg.offset - covered, node=node), node)
            covered = width_max(covered, seg.offset + seg.width * seg.block)
        if width_less(covered, self.shapes[tensor][axis]):
            self.pin(Binding(tensor, axis, covered, self.shapes[tensor][axis] - covered, node=node), node)

    def absorb(self, label: Label, absorber: Absorber) -> None:
        """A biased map reads ``label`` with the columns ``absorber.columns`` (offset 0 at the label's first
        coordinate): on every segment a translation moves (``T`` not invariant), its bias can give back the change,
        so ``T`` stays and the segment's site records the reader (:attr:`_Site.absorbers`); a segment that moves
        by something else than the translation (``translates`` false: after ``−x``, ``c·x``) keeps no ``T``.
        ``T1`` never passes a map."""
        columns = absorber.columns
        for seg in label.segments:
            if "T" in seg.invariant:
                continue
            if not seg.translates:
                self.restrict(seg.site, ALL - TRANSLATIONS, absorber.node, f"{self.where(absorber.node)} reads the "
                              "value scaled or negated: its bias cannot give back the translation")
                continue
            region = Binding(columns.tensor, columns.axis, columns.start + seg.offset, seg.width, seg.block, "in",
                             node=absorber.node)
            self.sites[seg.site].absorbers.append(replace(absorber, columns=region))

    def pin(self, region: Binding, node: str) -> None:
        """``node`` reads ``region`` against values nothing acts on (a model input, the output of an unknown
        op, token indices): no action may move it. A ``diagonal`` in-region pins only the in-side of a
        diagonal map (its gain may still scale its output)."""
        self.pinned.append((region, node))

    def tie(self, a: int, b: int) -> None:
        """Sites ``a`` and ``b`` carry the same group element (a skip connection, a shared tensor)."""
        self.ties.union(a, b)
        self.permutation_ties.union(a, b)

    def tie_permutations(self, a: int, b: int) -> None:
        """The same permutation acts on ``a`` and ``b`` (input and output of a diagonal map)."""
        self.permutation_ties.union(a, b)

    def restrict(self, site_id: int, kinds: Iterable[str], node: str, reason: str, blocked: bool = False) -> None:
        """Only ``kinds`` may act on the site. ``blocked`` marks a restriction that is a limitation
        (an unknown op, an unsupported layout, a shared tensor) rather than the op's nature; those
        are reported in ``analysis.blocked``, naming ``node``."""
        site = self.sites[site_id]
        removed = site.allowed - set(kinds)
        if removed:
            site.allowed &= set(kinds)
            site.removed.append((frozenset(removed), node, reason, blocked))

    def restrict_label(self, label: Label, kinds: Iterable[str], node: str, reason: str,
                       blocked: bool = False) -> None:
        """Restrict every site along ``label`` to ``kinds`` plus those that act trivially on it."""
        for seg in label.segments:
            self.restrict(seg.site, set(kinds) | seg.acts_trivially(), node, reason, blocked)

    def where(self, node: str) -> str:
        return self.graph.nodes[node]["where"]

    def shape(self, node: str) -> tuple | None:
        return self.graph.nodes[node].get("shape")

    def users(self, node: str) -> list[str]:
        return list(self.graph.successors(node))


LOSSES = ("mse", "cross_entropy")
"""The losses symmetries are derived for: ``mse`` (outputs fixed) and ``cross_entropy`` (logits move along ``1``)."""


def check_loss(loss: object, caller: str) -> None:
    """Raise ``SpecError`` naming ``caller`` unless ``loss`` is one of :data:`LOSSES`."""
    if not (isinstance(loss, str) and loss in LOSSES):
        raise SpecError(f"{caller}: loss must be 'mse' or 'cross_entropy', got {loss!r}")


def _shared_regions(state: Inference) -> None:
    """A tensor region transforms one way: bindings of the same region tie their sites (reused
    modules, tied weights) and the region is moved once; opposite roles on it (tied
    embedding/unembedding) force ``O``/``S``/``SF``. The diagonal of a diagonal map (a norm's gain)
    called several times (a weight-shared block) ties the calls' sites per role: ``s ↦ d s`` once for
    all calls, each call's output scaled by the same ``d``. One node binding a region several times reads a
    product (:mod:`symalg.catalogue.products`): each factor's site moves it by its own factor, so nothing is tied."""
    regions: dict[tuple, list[tuple[int, Binding]]] = {}
    for site in state.sites:
        if site.dissolved:
            continue
        for binding in site.bindings:
            key = (binding.region, binding.role) if binding.diagonal else binding.region
            regions.setdefault(key, []).append((site.id, binding))
    _overlapping_regions(state, regions)
    for uses in regions.values():
        nodes = {b.node for _, b in uses}
        if len(uses) < 2 or len(nodes) == 1:  # one node reading a product: one binding per factor, composed
            continue
        if any([b.node for _, b in uses].count(node) > 1 for node in nodes):
            for site_id, binding in uses:
                state.restrict(site_id, set(), binding.node, f"{binding.tensor} reads a product of sites and is "
                               f"shared by {sorted(nodes)}: the factors' moves of it are not modelled", blocked=True)
            continue
        first_site, first = uses[0]
        for site_id, binding in uses[1:]:
            if binding.diagonal and binding.role == "in" and \
                    not (state.sites[first_site].allowed | state.sites[site_id].allowed) & DIAGONAL_MOVES:
                state.tie_permutations(first_site, site_id)  # only a permutation moves the gain's input side
            else:
                state.tie(first_site, site_id)
            if binding.role != first.role:
                state.restrict(site_id, {"O", "O1", "S", "SF"}, binding.node,
                               f"{first.tensor} is read and written along the same axis by {sorted(nodes)} (tied "
                               "weights): only orthogonal actions keep it one tensor", blocked=True)
            if binding.invariant != first.invariant:
                state.restrict(site_id, ALL - (binding.invariant ^ first.invariant), binding.node,
                               f"{first.tensor} reads both an even activation's input and its output", blocked=True)
            if binding.power != first.power:
                state.restrict(site_id, ALL - {"PS"}, binding.node,
                               f"{first.tensor} is used at different scaling powers by {sorted(nodes)}", blocked=True)
            state.sites[site_id].bindings.remove(binding)


def _overlapping_regions(state: Inference, regions: dict[tuple, list[tuple[int, Binding]]]) -> None:
    """Two calls of one module that bind different but overlapping regions of a tensor (one call folded into
    attention heads, the other not) would move the shared entries two ways: no site of either moves them.

    Regions made at one node (a head and the heads' permutation, a group and the groups') overlap by design."""
    by_axis: dict[tuple[str, int], list[tuple[int, Binding]]] = {}
    for uses in regions.values():
        for site_id, binding in uses:
            by_axis.setdefault((binding.tensor, binding.axis), []).append((site_id, binding))
    for uses in by_axis.values():
        for i, (site_a, a) in enumerate(uses):
            for site_b, b in uses[i + 1:]:
                overlap = a.start < b.start + b.width * b.block and b.start < a.start + a.width * a.block
                if overlap and a.region != b.region and a.node != b.node:
                    for site_id, binding in ((site_a, a), (site_b, b)):
                        state.restrict(site_id, set(), binding.node,
                                       f"{binding.tensor} is read by {a.node!r} and {b.node!r} over overlapping but "
                                       "different regions (a shared module analysed two ways)", blocked=True)


def _pinned_regions(state: Inference) -> None:
    """A site moving a region that some node reads against data (``out(w(w(x)))``: ``w``'s columns read
    ``x``) carries no group: the data read does not transform with it."""
    for site in state.sites:
        if site.dissolved:
            continue
        for binding in site.bindings:
            for region, node in state.pinned:
                if _overlap(binding, region) and (not region.diagonal or binding.diagonal and binding.role == "in"):
                    state.restrict(site.id, set(), node, f"{binding.describe()} is also read by {state.where(node)} "
                                                         "against a value nothing acts on", blocked=True)


def _overlap(a: Binding, b: Binding) -> bool:
    """True when ``a`` and ``b`` share entries of the same tensor axis."""
    return (a.tensor, a.axis) == (b.tensor, b.axis) and \
        a.start < b.start + b.width * b.block and b.start < a.start + a.width * a.block


def solve(state: Inference) -> ModelSites:
    _shared_regions(state)
    _pinned_regions(state)
    for site in state.sites:
        for tensor in dict.fromkeys(b.tensor for b in site.bindings if b.tensor in state.opaque):
            node = state.opaque[tensor]
            state.restrict(site.id, set(), node, f"{tensor} is also read by {_opaque_reader(state, node)}",
                           blocked=True)
    live = [s for s in state.sites if not s.dissolved]
    groups: dict[int, list[_Site]] = {}
    for site in live:
        groups.setdefault(state.ties[site.id], []).append(site)
    classes: list[SiteClass] = []
    blocked: list[Blocked] = []
    restrictions: list[Blocked] = []
    class_of: dict[int, SiteClass] = {}
    allowed_by_root: dict[int, set[str]] = {}
    for members in groups.values():
        allowed = set(KINDS)
        for site in members:
            allowed &= site.allowed
        allowed_by_root[state.ties[members[0].id]] = allowed
        name = members[0].name
        for site in members:
            for kinds, node, reason, is_blocked in site.removed:
                note = Blocked(node, name, f"{', '.join(sorted(kinds))} removed: {reason}")
                (blocked if is_blocked else restrictions).append(note)
        width = members[0].width
        if any(site.width != width for site in members):
            raise SpecError(f"sites {[s.name for s in members]} are tied but have widths {[s.width for s in members]}")
        bindings = tuple(b for site in members for b in site.bindings)
        row_shifts = all(site.row_shifts for site in members)
        translations = tuple(t for site in members for t in site.translations
                             if t[0] in allowed and _owned(state, t[1], t[2].parameters)
                             and (row_shifts or not (t[0] == "T1" and t[2].pattern == "rows")))
        translations = _absorbed(state, name, translations, [a for site in members for a in site.absorbers],
                                 [b for site in members for b in site.bindings], restrictions)
        # tied sites binding the same region (a group norm's group and group-permutation sites when a group has
        # one channel) record its reader's shift once each: the bias absorbs it once
        shifts = tuple(dict.fromkeys(t for site in members for t in site.shifts))
        if "SF" in allowed and not all(_owned(state, a.node, (a.bias, a.weight)) for a, _ in shifts):
            allowed.discard("SF")
            restrictions.append(Blocked(shifts[0][0].node, name,
                                        "SF removed: a bias absorbing a sign flip's shift is shared"))
        if allowed & EVEN and not any(kind in kinds for site in members for _, _, groups in site.checks
                                      for kinds, _ in groups for kind in allowed & EVEN):
            allowed -= EVEN   # no even activation acts on the site: nothing to flip
        reader_powers = {b.power for b in bindings if b.role == "in"}
        alpha = reader_powers.pop() if len(reader_powers) == 1 else Fraction(1)
        kinds = _maximal(allowed, {t[0] for t in translations})
        if "PS" in kinds and len({b.power for b in bindings if b.role == "in"}) > 1:
            kinds = tuple(k for k in kinds if k != "PS")
        checks = tuple(dict.fromkeys(record for site in members for record in site.checks))
        cls = SiteClass(name, width, tuple(s.name for s in members), kinds, bindings, translations, alpha, shifts,
                        checks)
        classes.append(cls)
        for site in members:
            class_of[site.id] = cls
    permutations = []
    perm_groups: dict[int, list[_Site]] = {}
    for site in live:
        perm_groups.setdefault(state.permutation_ties[site.id], []).append(site)
    for members in perm_groups.values():
        member_classes = list({id(class_of[s.id]): class_of[s.id] for s in members}.values())
        permutable = all("S" in allowed_by_root[state.ties[s.id]] for s in members)
        if not permutable or not at_least(members[0].width, 2):
            continue
        contained = len(member_classes) == 1 and any(k in ("GL", "O", "O1") for k in member_classes[0].kinds)
        if contained:
            continue
        moved: list[Binding] = []
        seen = set()
        for cls in member_classes:
            for binding in cls.bindings:
                if binding.region not in seen:
                    seen.add(binding.region)
                    moved.append(binding)
        checks = tuple(dict.fromkeys(record for site in members for record in site.checks))
        permutations.append(PermutationClass(member_classes[0].name, members[0].width,
                                             tuple(c.name for c in member_classes), tuple(moved), checks))
    bound = {b.tensor for site in state.sites for b in site.bindings}
    for tensor, node in state.opaque.items():   # read only where no rule reaches: no site, but the reason is said
        if tensor not in bound:
            blocked.append(Blocked(node, tensor, f"no symmetry moves {tensor}: it is read by "
                                                 f"{_opaque_reader(state, node)}"))
    return ModelSites(tuple(c for c in classes if c.kinds), tuple(permutations), tuple(blocked),
                      tuple(restrictions), state.labels)


def _opaque_reader(state: Inference, node: str) -> str:
    """``node`` and why it pins the parameters it reads (an output, or an op no rule reads as a layer)."""
    if state.graph.nodes[node]["op"] == "output":
        return f"{state.where(node)}, which returns it as a model output"
    if state.graph.nodes[node]["op"] == "pow":
        return f"{state.where(node)}, whose exponent is computed from it and held fixed"
    why = ("which no catalogue rule handles on these inputs (an unknown op, or a known op on inputs its rule does "
           "not cover, such as a product of two parameters)")
    return f"{state.where(node)}, {why}"


def _absorbed(state: Inference, name: str, translations: tuple, absorbers: list[Absorber], bindings: list[Binding],
              restrictions: list[Blocked]) -> tuple:
    """The site's translations ``T`` with the biased maps reading its value (``absorbers``, whose columns cover the
    site's coordinates) attached: each moves its bias by ``−W t`` (a shear), through the columns of the coordinates
    the translation moves (one group's under a group norm). Without readers to absorb, nothing changes; where a
    reader's bias is used by another node too (a shared module), or a translation's change is no change of the value
    (not a bias of the site's own), ``T`` goes."""
    if not absorbers or not any(kind == "T" for kind, _, _ in translations):
        return translations
    absorbers = list(dict.fromkeys(absorbers))
    shared = [a for a in absorbers if not _owned(state, a.node, (a.bias,))]
    found = [_site_offset(bindings, family.regions[0]) if family.absorbable(state.shapes) else None
             for kind, _, family in translations if kind == "T"]
    offsets = [offset for offset in found if offset is not None]
    if shared or len(offsets) < len(found):
        why = f"{shared[0].bias} absorbing it is also used elsewhere" if shared else \
            "the translated region is not the value's bias"
        restrictions.append(Blocked(absorbers[0].node, name, f"T removed: the readers' biases would absorb the "
                                                             f"translation, but {why}"))
        return tuple(t for t in translations if t[0] != "T")
    kept, offset = [], iter(offsets)
    for kind, producer, family in translations:
        if kind == "T":
            start, width = next(offset), family.regions[0].width
            readers = tuple(replace(a, columns=a.columns.restrict(start, width)) for a in absorbers)
            family = replace(family, absorbers=readers)
        kept.append((kind, producer, family))
    return tuple(kept)


def _site_offset(bindings: list[Binding], region: Binding) -> int | None:
    """The site coordinate of ``region``'s first entry: where it lies in a binding of the same tensor axis (the
    site's own bias), or ``None``."""
    for binding in bindings:
        if (binding.tensor, binding.axis, binding.block) == (region.tensor, region.axis, 1) and \
                binding.start <= region.start and region.start + region.width <= binding.start + binding.width:
            return region.start - binding.start
    return None


def _owned(state: Inference, node: str, tensors: Iterable[str | None]) -> bool:
    """True when no node but ``node`` uses ``tensors`` (a translation of a shared weight is no symmetry); a
    parameter read through its transpose (``F.linear(x, W.T, b)``) is used by the transpose's readers."""
    wanted = {t for t in tensors if t}
    for other, data in state.graph.nodes(data=True):
        if not set(data.get("params", {}).values()) & wanted:
            continue
        users = _readers(state, other) if data["kind"] == "param" else {other}
        if users - {node}:
            return False
    return True


def _readers(state: Inference, source: str) -> set[str]:
    """The nodes reading ``source``, looking through transposes of it."""
    found: set[str] = set()
    for user in state.graph.successors(source):
        found |= _readers(state, user) if state.graph.nodes[user]["op"] == "transpose" else {user}
    return found


def _maximal(allowed: set, translations: set) -> tuple[str, ...]:
    """The kinds to report: the largest group allowed, plus the ``translations`` that apply."""
    if "GL" in allowed:
        kinds = ["GL"]
    elif "O" in allowed:
        kinds = ["O"]
    elif "O1" in allowed:
        kinds = ["O1"]
    elif "C" in allowed:
        kinds = ["C"]
    else:
        kinds = [k for k in ("PS", "SF", "EF") if k in allowed]
    kinds += [k for k in ("T", "T1") if k in translations]
    return tuple(kinds)
