"""Human-readable reports of an analysis: plain text and LaTeX, as printed by the ``symalg`` command.

>>> import symalg
>>> print(symalg.symbolic.report.describe(symalg.derive("linear(2, 3) -> tanh -> linear(3, 1)")).splitlines()[0])
model: 'linear(2, 3) -> tanh -> linear(3, 1)'
"""
from __future__ import annotations

import re
from typing import Callable, Protocol, Sequence

import sympy as sp

from symalg.catalogue.groups import SiteGroup
from symalg.kinds import KIND_NAMES
from symalg.frontend.outputs import output_hint
from symalg.ir.graph import ModelGraph
from symalg.symbolic.inference import Blocked, ModelSites
from symalg.symbolic.printing import escape_latex, latex, sstr, tensor_latex
from symalg.symbolic.symmetry import AngularMomentum, ConservedQuantity, Symmetry

__all__ = ["describe", "describe_latex", "kind_legend"]


def kind_legend(notes: Sequence[object]) -> str:
    """``"codes: GL = general linear GL(h), ..."`` for the group codes the notes list as removed (``"GL, O removed"``);
    ``""`` when they list none.

    >>> kind_legend(["0 (node 1): GL, O removed: layer 1 (relu) is equivariant only under PS, S"])
    'codes: GL = general linear GL(h), O = orthogonal O(h)'
    """
    used = {code for note in notes for listed in re.findall(r"((?:\b[A-Z][A-Z0-9]?, )*\b[A-Z][A-Z0-9]?) removed",
                                                            str(note))
            for code in listed.split(", ")}
    codes = [code for code in KIND_NAMES if code in used]
    return "codes: " + ", ".join(f"{code} = {KIND_NAMES[code]}" for code in codes) if codes else ""


class Analysed(Protocol):
    """What a report reads of an analysis (a :class:`~symalg.symbolic.derive.Analysis`; that module imports this
    one, so the report names the surface it uses)."""

    @property
    def model_graph(self) -> ModelGraph: ...
    @property
    def symmetries(self) -> Sequence[Symmetry]: ...
    @property
    def blocked(self) -> Sequence[Blocked]: ...
    @property
    def sites(self) -> ModelSites: ...
    def _name(self) -> str: ...
    def orbit_dimension(self) -> object: ...
    def independent_conserved(self) -> object: ...
    def conserved_quantities(self) -> Sequence[ConservedQuantity]: ...
    def angular_momenta(self) -> Sequence[AngularMomentum]: ...
    def certification_summary(self) -> str: ...


def _formula(method: Callable[[], object]) -> tuple[object, str | None]:
    """``(method(), None)``, or ``(None, reason)`` where no closed form exists."""
    try:
        return method(), None
    except NotImplementedError as error:
        return None, str(error)


def _formula_text(method: Callable[[], object]) -> str:
    value, reason = _formula(method)
    return sstr(value) if reason is None else f"no closed form ({reason})"


def _group_text(group: SiteGroup) -> str:
    """The Lie-algebra dimension and the discrete generators of ``group``, in words."""
    parts = [f"Lie algebra of dim {sstr(group.dim)}"] if group.is_continuous else []
    if group.discrete_description:
        parts.append(f"discrete generators: {group.discrete_description.format(h=group.width)}")
    return "; ".join(parts)


def _basis_text(group: SiteGroup, limit: int = 4) -> str:
    """The first ``limit`` Lie-algebra basis matrices of a small concrete group (``""`` otherwise).

    Only groups of at most :data:`SHOWN_BASIS_MAX` algebra dimensions are listed: a report never materialises the
    basis of a large group. E.g. ``GL(2)``: ``basis: [[1, 0], [0, 0]], [[0, 1], [0, 0]], ... (4 in all)``;
    a diagonal group's elements are spelled ``diag([1, 0, 0])``.
    """
    dim = sp.sympify(group.dim)
    if not group.is_continuous or not dim.is_Integer or not 0 < int(dim) <= SHOWN_BASIS_MAX:
        return ""
    basis = group.algebra_basis()
    spell = (lambda b: f"diag({b.to(int).tolist()})") if group.element_format == "diagonal" else (
        lambda b: str(b.to(int).tolist()))
    shown = ", ".join(spell(b) for b in basis[:limit])
    return f"basis: {shown}{', ...' if len(basis) > limit else ''} ({len(basis)} in all)"


SHOWN_BASIS_MAX = 64
"""The largest Lie-algebra dimension whose basis matrices a report lists (``GL(8)``)."""


def describe(analysis: Analysed) -> str:
    """Plain-text report of any analysis (its ``str``): the tracer of a traced model (and why, for the fallback),
    the input shapes its graph holds for when not every shape (``torch.export``'s specialisations and guards), its
    outputs and a note on each key/value cache among them, symmetries with the tensor regions they move and
    how, blocked notes (a group removed by an op nobody declared, a disproved declaration, a failed certification),
    restrictions (why a site's group is no larger: the activation's equivariance, a missing bias, the fixed
    output), orbit dimension, conserved quantities, certification."""
    graph = analysis.model_graph
    traced = [] if graph.tracer == "spec" else [f"tracer: {graph.tracer}" + (f" ({graph.tracer_note})"
                                                                              if graph.tracer_note else "")]
    if graph.shape_note:  # claims certified on the example's shapes say nothing about the others
        traced.append(f"shapes: {graph.shape_note}")
    if len(graph.output_paths) > 1:  # every output is fixed: say which they are
        traced.append(f"outputs: {', '.join(graph.output_paths)}")
    traced += sorted({f"note: {path.split('.')[0]} is an output{output_hint(path)}"
                      for path in graph.output_paths if output_hint(path)})
    lines = [f"model: {analysis._name()}", *traced, "", "symmetries:"]
    for symmetry in analysis.symmetries:
        kind = "continuous" if symmetry.group.is_continuous else "discrete"
        lines.append(f"  {symmetry.label}  [{kind}, dim {sstr(symmetry.group.dim)}]")
        lines.append(f"    moves {'; '.join(symmetry.moves())}")
        lines += [f"    {text}" for text in (_group_text(symmetry.group), _basis_text(symmetry.group)) if text]
    if not analysis.symmetries:
        lines.append("  none")
    lines += [f"blocked: {blocked}" for blocked in analysis.blocked]
    lines += [f"restricted: {note}" for note in analysis.sites.restrictions]  # why a site's group is no larger
    legend = kind_legend([*analysis.blocked, *analysis.sites.restrictions])
    lines += [f"  ({legend})"] if legend else []
    lines.append("")
    lines.append(f"orbit dimension (generic): {_formula_text(analysis.orbit_dimension)}")
    quantities = analysis.conserved_quantities()
    lines.append(f"conserved quantities: {len(quantities)} {'family' if len(quantities) == 1 else 'families'}; "
                 f"functionally independent at generic θ: {_formula_text(analysis.independent_conserved)}")
    lines += [f"  {quantity}" for quantity in quantities]
    lines += [f"angular momentum: {momentum}" for momentum in analysis.angular_momenta()]
    lines.append(analysis.certification_summary())
    return "\n".join(lines)


def describe_latex(analysis: Analysed) -> str:
    """LaTeX report: one ``align*``-ready line per symmetry, per moved tensor (its action), conserved quantity and
    angular-momentum relation."""
    orbit, reason = _formula(analysis.orbit_dimension)
    lines = [rf"\text{{orbit dimension}} &= {latex(orbit)}" if reason is None
             else r"\text{orbit dimension: numeric only}"]
    for symmetry in analysis.symmetries:
        lines.append(rf"&\text{{{escape_latex(symmetry.site)}: }} {symmetry.group.latex()}")
        rows = symmetry.action_latex()
        lines += [rf"&\quad {row}" for row in rows]
        if symmetry.group.kind == "T" and not rows:
            lines.append(r"&\quad\text{translates } " + ", ".join(tensor_latex(t) for t in symmetry.tensors))
    for quantity in analysis.conserved_quantities():
        lines.append(quantity.latex().replace(" = ", " &= ", 1))
    for momentum in analysis.angular_momenta():
        lines.append(momentum.latex().replace(" = ", " &= ", 1))
    return "\\begin{align*}\n" + " \\\\\n".join(lines) + "\n\\end{align*}"
