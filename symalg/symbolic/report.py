"""Human-readable reports of an analysis: plain text and LaTeX, as printed by the ``symalg`` command.

>>> import symalg
>>> print(symalg.symbolic.report.describe(symalg.derive("linear(2, 3) -> tanh -> linear(3, 1)")).splitlines()[0])
model: 'linear(2, 3) -> tanh -> linear(3, 1)'
"""
from __future__ import annotations


from symalg.frontend.outputs import output_hint
from symalg.symbolic.printing import latex, sstr, tensor_latex

__all__ = ["describe", "describe_latex"]


def _formula(method):
    """``(method(), None)``, or ``(None, reason)`` where no closed form exists."""
    try:
        return method(), None
    except NotImplementedError as error:
        return None, str(error)


def _formula_text(method) -> str:
    value, reason = _formula(method)
    return sstr(value) if reason is None else f"no closed form ({reason})"


def _group_text(group) -> str:
    """The Lie-algebra dimension and the discrete generators of ``group``, in words."""
    parts = [f"Lie algebra of dim {sstr(group.dim)}"] if group.is_continuous else []
    if group.discrete_description:
        parts.append(f"discrete generators: {group.discrete_description.format(h=group.width)}")
    return "; ".join(parts)


def describe(analysis) -> str:
    """Plain-text report of any analysis (its ``str``): the tracer of a traced model (and why, for the fallback),
    its outputs and a note on each key/value cache among them, symmetries with the tensor regions they move and
    how, blocked notes (a group removed by an op nobody declared, a disproved declaration, a failed certification),
    restrictions (why a site's group is no larger: the activation's equivariance, a missing bias, the fixed
    output), orbit dimension, conserved quantities, certification."""
    graph = analysis.model_graph
    traced = [] if graph.tracer == "spec" else [f"tracer: {graph.tracer}" + (f" ({graph.tracer_note})"
                                                                              if graph.tracer_note else "")]
    if len(graph.output_paths) > 1:  # every output is fixed: say which they are
        traced.append(f"outputs: {', '.join(graph.output_paths)}")
    traced += sorted({f"note: {path.split('.')[0]} is an output{output_hint(path)}"
                      for path in graph.output_paths if output_hint(path)})
    lines = [f"model: {analysis._name()}", *traced, "", "symmetries:"]
    for symmetry in analysis.symmetries:
        kind = "continuous" if symmetry.group.is_continuous else "discrete"
        lines.append(f"  {symmetry.label}  [{kind}, dim {sstr(symmetry.group.dim)}]")
        moved = [b.describe() for b in symmetry.bindings] or [f"{r.tensor} ({f.pattern})" for f in symmetry.translations
                                                             for r in f.regions]
        lines.append(f"    moves {'; '.join(dict.fromkeys(moved))}")
        if _group_text(symmetry.group):
            lines.append(f"    {_group_text(symmetry.group)}")
    if not analysis.symmetries:
        lines.append("  none")
    lines += [f"blocked: {blocked}" for blocked in analysis.blocked]
    lines += [f"restricted: {note}" for note in analysis.sites.restrictions]  # why a site's group is no larger
    lines.append("")
    lines.append(f"orbit dimension (generic): {_formula_text(analysis.orbit_dimension)}")
    quantities = analysis.conserved_quantities()
    lines.append(f"conserved quantities: {len(quantities)} {'family' if len(quantities) == 1 else 'families'}; "
                 f"functionally independent at generic θ: {_formula_text(analysis.independent_conserved)}")
    lines += [f"  {quantity}" for quantity in quantities]
    lines += [f"angular momentum: {momentum}" for momentum in analysis.angular_momenta()]
    lines.append(analysis.certification_summary())
    return "\n".join(lines)


def describe_latex(analysis) -> str:
    """LaTeX report: one ``align*``-ready line per symmetry, per moved tensor (its action), conserved quantity and
    angular-momentum relation."""
    orbit, reason = _formula(analysis.orbit_dimension)
    lines = [rf"\text{{orbit dimension}} &= {latex(orbit)}" if reason is None
             else r"\text{orbit dimension: numeric only}"]
    for symmetry in analysis.symmetries:
        site = symmetry.site.replace("_", r"\_")
        lines.append(rf"&\text{{{site}: }} {symmetry.group.latex()}")
        lines += [rf"&\quad {row}" for row in symmetry.action_latex()]
        if symmetry.group.kind == "T":
            lines.append(r"&\quad\text{translates } " + ", ".join(tensor_latex(t) for t in symmetry.tensors))
    for quantity in analysis.conserved_quantities():
        lines.append(quantity.latex().replace(" = ", " &= ", 1))
    for momentum in analysis.angular_momenta():
        lines.append(momentum.latex().replace(" = ", " &= ", 1))
    return "\\begin{align*}\n" + " \\\\\n".join(lines) + "\n\\end{align*}"
