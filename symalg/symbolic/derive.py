"""The derivation: one graph in, one :class:`Analysis` out, whatever the front end.

``derive`` infers the sites and groups of the graph (:func:`~symalg.symbolic.engine.infer_model`), builds one
:class:`~symalg.symbolic.symmetry.Symmetry` per group and site class, and, when the graph carries a model (a traced
torch model, or a spec at concrete widths), certifies every claim numerically before reporting it. A spec with
symbolic widths keeps them: groups, conserved quantities and the orbit dimension are formulas in the widths.

>>> import symalg
>>> analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
>>> analysis
Analysis('linear(n, h) -> relu -> linear(h, m)': PositiveScaling(h, alpha=1) on 0, S(h) on 0)
>>> analysis.orbit_dimension()
h
>>> analysis.subs({"n": 3, "h": 5, "m": 2}).certified
True
"""
from __future__ import annotations

import logging
import numbers
from html import escape
from dataclasses import dataclass, field, replace
from typing import Mapping

import networkx as nx
import sympy as sp
import torch

from symalg.catalogue.activations import CATALOGUE, CatalogueEntry
from symalg.catalogue.groups import Permutations, Shears, SignFlips, SiteGroup, Translations
from symalg.symbolic.printing import latex, sstr
from symalg.symbolic.report import describe, kind_legend
from symalg.errors import CertificationError, SpecError, WidthError
from symalg.frontend.spec import Spec, to_graph, to_spec_string
from symalg.ir.architecture import Architecture
from symalg.ir.graph import ModelGraph
from symalg.lowering.codegen import LoweredFunction
from symalg.numeric.orbit_rank import (OrbitDimension, independent_conserved_rank, model_orbit_dimension,
                                       model_orbit_dimension_formula)
from symalg.symbolic.engine import infer_model
from symalg.symbolic.inference import Blocked, ModelSites, check_loss
from symalg.symbolic.orbit import independent_conserved_formula, orbit_dimension_formula
from symalg.symbolic.symmetry import AngularMomentum, ConservedQuantity, Symmetry, _group, _number
from symalg.verification.certification import CERTIFICATION_TOLERANCE, ClaimError, certify as certify_claims

__all__ = ["Analysis", "derive"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Analysis:
    """Everything derived for one model: its symmetries, what was blocked and why, and how it was checked.

    Attributes
    ----------
    model_graph : the graph derived from (:class:`~symalg.ir.graph.ModelGraph`).
    symmetries : one :class:`~symalg.symbolic.symmetry.Symmetry` per group and site class.
    blocked : :class:`~symalg.symbolic.inference.Blocked` notes naming the node that removed each group.
    sites : the inference result (site classes, permutation classes).
    loss : ``"mse"`` or ``"cross_entropy"``; ``catalogue`` and ``strict`` as given to :func:`derive`.
    certification : the measured error of every inferred claim, kept or removed
        (:class:`~symalg.verification.certification.ClaimError`), or ``None`` when nothing was run (``certify=False``,
        or symbolic widths: there is no model to run, and the claims rest on the symbolic checks).
    certification_points : where the claims were checked (parameters and input shapes,
        :attr:`~symalg.verification.certification.Certificate.points`); ``certification_notes``: the input shapes the
        model refused and anything else certification could not do.
    """

    model_graph: ModelGraph
    symmetries: tuple[Symmetry, ...]
    blocked: tuple[Blocked, ...]
    sites: ModelSites = field(repr=False)
    loss: str = "mse"
    catalogue: Mapping = field(default_factory=lambda: CATALOGUE, repr=False)
    strict: bool = True
    certification: tuple[ClaimError, ...] | None = field(default=None, repr=False)
    certification_points: tuple[str, ...] = field(default=(), repr=False)
    certification_notes: tuple[str, ...] = field(default=(), repr=False)

    @property
    def certified(self) -> bool:
        """True when every reported symmetry passed numerical certification."""
        return self.certification is not None

    @property
    def architecture(self) -> Architecture | None:
        """The spec the graph was emitted from (``None`` for a traced model)."""
        source = self.model_graph.source
        return source if isinstance(source, Architecture) else None

    @property
    def widths(self) -> set[sp.Symbol]:
        """The symbolic widths (empty for concrete models)."""
        return self.model_graph.widths

    @property
    def continuous(self) -> list[Symmetry]:
        return [s for s in self.symmetries if s.group.is_continuous]

    def conserved_quantities(self) -> list[ConservedQuantity]:
        """The conserved quantities of gradient flow, one family per continuous symmetry that has one."""
        return [s.conserved for s in self.symmetries if s.conserved is not None]

    def angular_momenta(self) -> list[AngularMomentum]:
        """The angular-momentum relations ``J(θ, θ̇)``, one per orthogonal symmetry (whose antisymmetric
        generators have no conserved quantity): :class:`~symalg.symbolic.symmetry.AngularMomentum`."""
        return [s.angular_momentum for s in self.symmetries if s.angular_momentum is not None]

    def orbit_dimension(self, params: Mapping[str, torch.Tensor] | None = None) -> sp.Expr | OrbitDimension:
        """Dimension of the group orbit through θ.

        ``params=None``: the generic value, a formula in the widths (a SymPy expression; an integer at concrete
        widths): the closed form of :func:`~symalg.symbolic.orbit.orbit_dimension_formula` for a spec chain, else
        (a traced model, or a concrete spec whose sites have no closed form in the widths) the generic structured
        rank of :func:`~symalg.numeric.orbit_rank.model_orbit_dimension_formula`; ``NotImplementedError`` where
        neither exists. Otherwise the certified numeric rank of ``M ↦ M·θ`` at ``params``
        (:class:`~symalg.numeric.orbit_rank.OrbitDimension`, with its certificate; it compares equal to an
        integer by its ``dimension``); symbolic widths are read from the shapes of ``params``.
        """
        if params is None:
            if self.model_graph.tracer == "spec":
                try:
                    return orbit_dimension_formula(self)
                except NotImplementedError:
                    if self.widths:
                        raise
            return model_orbit_dimension_formula(self)
        return model_orbit_dimension(self.at_widths_of(params), params)

    def independent_conserved(self, params: Mapping[str, torch.Tensor] | None = None) -> sp.Expr | int:
        """Number of *functionally independent* conserved quantities: a formula at generic θ (``params=None``,
        spec chains) or the numeric rank of ``M ↦ M·θ`` on the symmetric generators at ``params``. Below the
        number of symmetric generators when a linear site is wider than its neighbours together."""
        if params is None:
            return independent_conserved_formula(self)
        return independent_conserved_rank(self.at_widths_of(params), params)

    def at_widths_of(self, params: Mapping[str, torch.Tensor]) -> "Analysis":
        """This analysis at the widths of ``params`` (itself when its widths are concrete)."""
        arch = self.architecture
        if not self.widths or arch is None:  # only a spec has symbolic widths
            return self
        return self.subs({str(k): v for k, v in arch.widths_from_params(params).items()})

    def subs(self, widths: Mapping) -> "Analysis":
        """The same derivation at concrete widths, e.g. ``subs({"h": 5})`` (names or symbols as keys); a value
        that is not a positive integer (``{"n": "three"}``, a symbol, ``2.0``) raises
        :class:`~symalg.errors.WidthError` (rename widths on the spec: :meth:`Architecture.subs
        <symalg.ir.architecture.Architecture.subs>`)."""
        arch = self.model_graph.source
        if not isinstance(arch, Architecture):
            raise SpecError("subs: this analysis has concrete widths (a traced model); there is nothing to substitute")
        if not isinstance(widths, Mapping):
            raise WidthError(f"subs: widths must be a mapping {{name: positive int}}, got {type(widths).__name__}")
        for name, value in widths.items():
            if isinstance(value, bool) or not isinstance(value, (numbers.Integral, sp.Integer)):
                raise WidthError(f"width {name}: expected a positive integer, got {value!r} ({type(value).__name__})")
        return derive(arch.subs(widths), self.catalogue, self.strict, self.loss, certify=self.certified or not
                      arch.subs(widths).widths)

    def lower(self) -> dict[str, LoweredFunction]:
        """Torch callables for every conserved quantity: ``{name: f}`` with ``f(params)`` the values and
        ``f.source`` the generated code (actions are torch already: :meth:`Symmetry.apply`)."""
        return {q.name: q.lowered for q in self.conserved_quantities()}

    def latex(self) -> str:
        """Every symmetry (group, site, tensors moved), conserved quantity and angular-momentum relation, one
        ``align*`` row each."""
        return "\\begin{align*}\n" + self._latex_rows() + "\n\\end{align*}"

    def _latex_rows(self) -> str:
        rows = [s.latex() for s in self.symmetries]
        rows += [q.latex() for q in self.conserved_quantities()] + [j.latex() for j in self.angular_momenta()]
        return " \\\\\n".join(f"& {r}" for r in rows) or r"& \text{no symmetry}"

    def _repr_latex_(self) -> str:
        return "$\\begin{aligned}\n" + self._latex_rows() + "\n\\end{aligned}$"

    def table(self) -> list[tuple[str, str, object]]:
        """``(site, group name, Lie-algebra dimension)`` for every symmetry."""
        return [(s.site, s.group.name, s.group.dim) for s in self.symmetries]

    def to_dict(self) -> dict:
        """A JSON-serialisable summary (schema ``symalg.analysis/1``, documented in ``docs/output_schema.md``).

        Keys: ``schema``; ``model`` (the spec string, or the model's class name, unquoted); ``loss``; ``tracer``
        (``"fx"``, ``"export"``, ``"spec"``) and ``tracer_note`` (fx's failure when ``torch.export`` was the
        fallback); ``shape_note`` (``""``: the graph holds for every input shape); ``outputs``; ``widths`` (the
        symbolic widths' names); ``symmetries``, one record each: ``group``, ``site``, ``members``, ``dimension``
        (a formula, as text), ``continuous``, ``tensors`` moved, and ``conserved`` (``None``, or a record with
        ``name``, ``kind`` (``"matrix"``, ``"diagonal"``, ``"planes"``, ``"linear"``), ``site``, ``expression``,
        ``latex`` and its ``terms``: ``name``, ``expression``, ``latex`` per defining matrix); ``angular_momenta``
        (``name``, ``site``, ``latex``); ``blocked`` (``node``, ``site``, ``reason``); ``orbit_dimension`` (text);
        ``certification`` (``None`` or one record per claim), ``certification_points``, ``certification_notes``.

        >>> import json, symalg
        >>> d = json.loads(json.dumps(symalg.derive("linear(n, h) -> relu -> linear(h, m)").to_dict()))
        >>> d["model"], d["symmetries"][0]["conserved"]["kind"], d["symmetries"][0]["conserved"]["terms"][0]["name"]
        ('linear(n, h) -> relu -> linear(h, m)', 'diagonal', 'q__0')
        """
        try:
            orbit = str(self.orbit_dimension())
        except NotImplementedError as error:
            orbit = f"no closed form: {error}"
        return {
            "schema": "symalg.analysis/1",
            "model": self._name(quoted=False), "loss": self.loss, "tracer": self.model_graph.tracer,
            "tracer_note": self.model_graph.tracer_note, "shape_note": self.model_graph.shape_note,
            "outputs": list(self.model_graph.output_paths), "widths": sorted(str(w) for w in self.widths),
            "symmetries": [{"group": s.group.name, "site": s.site, "members": list(s.members),
                            "dimension": str(s.group.dim),
                            "continuous": bool(s.group.is_continuous), "tensors": list(s.tensors),
                            "conserved": None if s.conserved is None else _conserved_record(s.conserved)}
                           for s in self.symmetries],
            "angular_momenta": [{"name": j.name, "site": j.symmetry.site, "latex": j.latex()}
                                for j in self.angular_momenta()],
            "blocked": [{"node": b.node, "site": b.site, "reason": b.reason} for b in self.blocked],
            "orbit_dimension": orbit,
            "certification": None if self.certification is None else [
                {"symmetry": e.symmetry.label, "error": e.error, "holds": e.holds, "point": e.point,
                 "sensitivity": e.sensitivity, "certifiable": e.certifiable} for e in self.certification],
            "certification_points": list(self.certification_points),
            "certification_notes": list(self.certification_notes),
        }

    def _repr_html_(self) -> str:
        """A notebook's view: one table row per symmetry (group, site, kind, dimension, tensors moved, conserved
        quantity as rendered math), then the angular-momentum relations, blocked notes (with the group codes
        explained), the orbit dimension and the certification summary."""
        rows = []
        for s in self.symmetries:
            kind = "continuous" if s.group.is_continuous else "discrete"
            quantity = "" if s.conserved is None else f"$${escape(s.conserved.latex())}$$"
            rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in (
                escape(s.group.name), escape(s.site), kind, escape(str(s.group.dim)),
                "<br>".join(escape(t) for t in s.tensors), quantity)) + "</tr>")
        head = "".join(f"<th>{h}</th>" for h in ("group", "site", "kind", "dim", "tensors moved", "conserved"))
        parts = [f"<p><b>{escape(repr(self))}</b></p>",
                 f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>" if rows
                 else "<p>no symmetry</p>"]
        parts += [f"<p>angular momentum: $${escape(j.latex())}$$</p>" for j in self.angular_momenta()]
        notes = [f"<li>blocked: {escape(str(b))}</li>" for b in self.blocked]
        notes += [f"<li>restricted: {escape(str(r))}</li>" for r in self.sites.restrictions]
        legend = kind_legend([*self.blocked, *self.sites.restrictions])
        if notes:
            parts.append(f"<details><summary>{len(notes)} blocked or restricted note(s)</summary><ul>{''.join(notes)}"
                         f"</ul>{f'<p>{escape(legend)}</p>' if legend else ''}</details>")
        try:
            orbit = f"${escape(sp.latex(self.orbit_dimension()))}$"
        except NotImplementedError as error:
            orbit = f"no closed form ({escape(str(error))})"
        parts.append(f"<p>orbit dimension (generic): {orbit}</p>")
        parts.append(f"<p>{escape(self.certification_summary())}</p>")
        return "\n".join(parts)

    def _name(self, quoted: bool = True) -> str:
        source = self.model_graph.source
        if isinstance(source, Architecture):
            return repr(to_spec_string(source)) if quoted else to_spec_string(source)
        return type(self.model_graph.model).__name__ if self.model_graph.model is not None else "graph"

    def __repr__(self) -> str:
        return f"Analysis({self._name()}: {', '.join(s.label for s in self.symmetries) or 'no symmetry'})"

    def __str__(self) -> str:
        """The plain-text report of :func:`~symalg.symbolic.report.describe`."""
        return describe(self)

    def certification_summary(self) -> str:
        """One line: how many claims were certified, the worst kept error, how many failed."""
        if self.certification is None:
            why = ("symbolic widths: nothing to run; the claims rest on the symbolic checks" if self.widths else
                   "certify=False: the symmetries above are inferred, not checked numerically")
            return f"certification: none ({why})"
        kept = [e.error for e in self.certification if e.holds]
        failed = sum(not e.error <= e.tolerance for e in self.certification)
        blind = len(self.certification) - len(kept) - failed
        tolerance = max((e.tolerance for e in self.certification), default=CERTIFICATION_TOLERANCE)
        return (f"certification: {len(kept)} of {len(self.certification)} claims hold numerically (worst relative "
                f"error {max(kept, default=0.0):.1e}, tolerance {tolerance:.0e})"
                + (f"; {failed} failed (blocked)" if failed else "")
                + (f"; {blind} not certifiable here (blocked)" if blind else "")
                + (f"\n  traced graph: {self.model_graph.shape_note} (the claims are checked beyond it)"
                   if self.model_graph.shape_note else "")
                + "".join(f"\n  checked at {point}" for point in self.certification_points)
                + "".join(f"\n  {note}" for note in self.certification_notes))


def _check_arguments(catalogue: object, strict: object, loss: object, certify: object) -> None:
    if not isinstance(strict, bool):
        raise SpecError(f"derive: strict must be True or False, got {strict!r}")
    if not isinstance(certify, bool):
        raise SpecError(f"derive: certify must be True or False, got {certify!r}")
    check_loss(loss, "derive")
    if catalogue is None:
        return
    if not isinstance(catalogue, Mapping):
        raise SpecError(f"derive: catalogue must be a mapping of activation names to CatalogueEntry (e.g. "
                        f"symalg.overlay({{...}})), got {type(catalogue).__name__}")
    wrong = [key for key, entry in catalogue.items() if not isinstance(entry, CatalogueEntry)]
    if wrong:
        raise SpecError(f"derive: catalogue entry {wrong[0]!r} is a {type(catalogue[wrong[0]]).__name__}, "
                        "not a CatalogueEntry")



def _conserved_record(quantity: ConservedQuantity) -> dict:
    """A conserved quantity as :meth:`Analysis.to_dict` writes it: name, kind, site, the whole expression as text
    and LaTeX, and each defining matrix (``C``, ``q``, ...) as a term with its own text and LaTeX."""
    return {"name": quantity.name, "kind": quantity.kind, "site": quantity.site, "expression": str(quantity),
            "latex": quantity.latex(),
            "terms": [{"name": key, "expression": sstr(expr), "latex": latex(expr)}
                      for key, expr in quantity.exprs.items()]}


def derive(model: ModelGraph | str | Spec | Architecture | nx.DiGraph, catalogue: Mapping | None = None,
           strict: bool = True, loss: str = "mse", certify: bool = True) -> Analysis:
    """Derive the symmetries of ``model``: a spec (string, :class:`~symalg.frontend.spec.Spec`,
    :class:`~symalg.ir.architecture.Architecture`) or a graph (:func:`symalg.trace`, :func:`symalg.to_graph`).

    ``loss``: ``"mse"`` (every output is fixed) or ``"cross_entropy"`` (the first output is logits, free to move
    along ``1``). ``catalogue``: the activation entries (default: the spec's own, else the built-in one).
    ``strict``: a declared group that a symbolic check disproves is blocked, not claimed (``False`` keeps it,
    e.g. to watch the verifier fail). ``certify``: check every claim numerically on the model first
    (:func:`~symalg.verification.certification.certify`: ``max_x,g |F(g·θ, x) − F(θ, x)| / |F(θ, x)|`` over
    every output, group elements near and far from the identity, discrete generators, fresh inputs of the example's
    and of other shapes, the model's parameters and a generic point, buffers included, float64); a claim above
    :data:`~symalg.verification.certification.CERTIFICATION_TOLERANCE` becomes a ``Blocked`` note "failed numerical
    certification", and one whose tensors the outputs hardly react to a note "not certifiable here". A traced model
    needs its example inputs for that; a spec
    at concrete widths runs its generated module; a spec with symbolic widths has nothing to run (its claims
    rest on the symbolic checks, ``certification`` is ``None``). Arguments of the wrong type raise ``SpecError``
    naming the argument.
    """
    _check_arguments(catalogue, strict, loss, certify)
    if isinstance(model, ModelGraph):
        graph = model
        catalogue = CATALOGUE if catalogue is None else catalogue
    elif isinstance(model, torch.nn.Module):
        raise SpecError(f"derive: got a {type(model).__name__} module; trace it first with "
                        "symalg.trace(model, example_inputs)")
    else:
        if catalogue is None:
            catalogue = (model.catalogue if isinstance(model, Architecture) else None) or CATALOGUE
        graph = to_graph(model, catalogue)
    if certify and graph.model is not None and graph.example_inputs is None:
        raise SpecError("derive: the model was traced without example_inputs, so its claims cannot be certified "
                        "numerically; trace it with symalg.trace(model, example_inputs) or pass certify=False for "
                        "uncertified claims")
    if certify and graph.on_meta:
        raise SpecError("derive: the model's weights are on the meta device (shapes, no values), so its claims cannot "
                        "be certified numerically; pass certify=False (the claims are the rules' own, certified on "
                        "models with values)")
    sites = infer_model(graph, catalogue, loss, strict)
    shapes = graph.shapes
    # symmetry -> ("class", class name, kind) or ("permutation", class name): what certification removes
    origins: dict[Symmetry, tuple[str, ...]] = {}
    for cls in sites.classes:
        for kind in cls.kinds:
            if kind in ("T", "T1"):
                families = tuple(t[2] for t in cls.translations if t[0] == kind)
                count = sum(f.count(shapes) for f in families)
                group: SiteGroup = Shears(count) if any(f.sheared for f in families) else \
                    Translations(count, "bias" if kind == "T" else "along 1")
                origins[Symmetry(cls.name, cls.members, group, (), shapes, families)] = ("class", cls.name, kind)
                continue
            group = _group(kind, cls.width, cls.alpha)
            shifts = cls.shifts if kind == "SF" else ()
            if shifts:
                group = SignFlips(cls.width, center=_number(shifts[0][1]))
            if not group.is_trivial:  # S(1)
                symmetry = Symmetry(cls.name, cls.members, group, cls.bindings, shapes, shifts=shifts,
                                    checks=cls.checks_for(kind))
                origins[symmetry] = ("class", cls.name, kind)
    for perm in sites.permutations:
        origins[Symmetry(perm.name, perm.members, Permutations(perm.width), perm.bindings, shapes,
                         checks=perm.checks_for("S"))] = ("permutation", perm.name)
    analysis = Analysis(graph, tuple(origins), sites.blocked, sites, loss, catalogue, strict)
    return _certified(analysis, origins) if certify and graph.model is not None else analysis


def _certified(analysis: Analysis, origins: Mapping) -> Analysis:
    """``analysis`` without the claims that fail :func:`~symalg.verification.certification.claim_errors`: they leave
    ``symmetries`` and ``sites`` (their kind, translations, shifts or permutation class), hence every
    conserved quantity, orbit dimension and table, and become blocked notes with their measured error."""
    try:
        certificate = certify_claims(analysis)
    except Exception as error:  # the model itself fails in float64 (an op for float32 only): torch's message
        raise CertificationError(f"derive: certification runs {type(analysis.model_graph.model).__name__} in float64 "
                                 f"on fresh inputs, and it failed: {type(error).__name__}: {error}; make the model "
                                 "run in float64, or pass certify=False for uncertified claims") from error
    errors = certificate.errors
    analysis = replace(analysis, certification=errors, certification_points=certificate.points,
                       certification_notes=certificate.notes)
    failed = [e for e in errors if not e.holds]
    logger.info("derive: %d of %d claims certified", len(errors) - len(failed), len(errors))
    if not failed:
        return analysis
    for e in failed:
        logger.info("derive: %s removed: %s", e.symmetry.label, e.reason)
    notes = tuple(Blocked(e.symmetry.site, e.symmetry.site, f"{e.symmetry.group.name} {e.reason}") for e in failed)
    gone = {origins[e.symmetry] for e in failed}
    sites = analysis.sites
    classes = tuple(replace(c, kinds=tuple(k for k in c.kinds if ("class", c.name, k) not in gone),
                            translations=tuple(t for t in c.translations if ("class", c.name, t[0]) not in gone),
                            shifts=() if ("class", c.name, "SF") in gone else c.shifts) for c in sites.classes)
    permutations = tuple(p for p in sites.permutations if ("permutation", p.name) not in gone)
    removed = {e.symmetry for e in failed}
    return replace(analysis, symmetries=tuple(s for s in analysis.symmetries if s not in removed),
                   blocked=analysis.blocked + notes, certification=errors,
                   sites=replace(sites, classes=classes, permutations=permutations, blocked=sites.blocked + notes))
