"""Human-readable reports of an analysis: plain text and LaTeX, as printed by the ``symalg`` command.

>>> import symalg
>>> print(symalg.symbolic.report.describe(symalg.derive("linear(2, 3) -> tanh -> linear(3, 1)")).splitlines()[0])
network: linear(2, 3) -> tanh -> linear(3, 1)
"""
from __future__ import annotations

import sympy as sp

from symalg.frontend.spec import to_spec_string
from symalg.symbolic.printing import latex, sstr

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


def _generators_text(symmetry, limit: int = 4) -> list[str]:
    """Generators of one symmetry: the Lie-algebra basis (first few, concrete widths) and discrete ones."""
    group = symmetry.group
    if not sp.sympify(group.width).is_Integer:
        lines = []
        if group.is_continuous:
            lines.append(f"Lie algebra: dim {sstr(group.dim)}")
        if group.discrete_description:
            lines.append(f"discrete generators: {group.discrete_description.format(h=group.width)}")
        return lines
    lines = []
    basis = symmetry.generators()
    if basis:
        shown = ", ".join(sstr(m.tolist()) for m in basis[:limit])
        lines.append(f"Lie-algebra basis ({len(basis)}): {shown}{' ...' if len(basis) > limit else ''}")
    discrete = symmetry.discrete_generators()
    if discrete:
        shown = ", ".join(sstr(m.tolist()) for m in discrete[:limit])
        lines.append(f"discrete generators ({len(discrete)}): {shown}{' ...' if len(discrete) > limit else ''}")
    return lines


def describe(analysis) -> str:
    """Plain-text report: sites, groups, actions, generators, orbit dimension, conserved quantities."""
    lines = [f"network: {to_spec_string(analysis.architecture)}"]
    for site in analysis.sites:
        groups = ", ".join(g.name for g in site.groups) or "none"
        lines.append(f"site {site.name} (width {site.width}, activation {site.op}): {groups}")
    for blocked in analysis.blocked:
        lines.append(f"blocked: {blocked}")
    lines.append("")
    lines.append("symmetries:")
    for symmetry in analysis.symmetries:
        kind = "continuous" if symmetry.group.is_continuous else "discrete"
        lines.append(f"  {symmetry.label}  [{kind}, dim {symmetry.group.dim}]")
        for name, expr in symmetry.action.items():
            lines.append(f"    {symmetry.symbols[name]} -> {sstr(expr)}")
        for name, expr in symmetry.infinitesimal.items():
            lines.append(f"    d{symmetry.symbols[name]} = {sstr(expr)}")
        lines += [f"    {line}" for line in _generators_text(symmetry)]
        lines += [f"    check: {check}" for check in symmetry.checks]
    lines += [f"  {translation}" for translation in analysis.translations]
    lines.append("")
    lines.append(f"orbit dimension (generic): {_formula_text(analysis.orbit_dimension)}")
    lines.append(f"conserved quantities: {sstr(analysis.conserved_count())} (one per symmetric generator); "
                 f"functionally independent at generic θ: {_formula_text(analysis.independent_conserved)}")
    for quantity in analysis.conserved_quantities():
        lines.append(f"  {quantity}")
    for momentum in analysis.angular_momenta():
        lines.append(f"  {momentum}")
    return "\n".join(lines)


def describe_latex(analysis) -> str:
    """LaTeX report: one ``align*``-ready line per action and conserved quantity."""
    orbit, reason = _formula(analysis.orbit_dimension)
    lines = [rf"\text{{orbit dimension}} &= {latex(orbit)}" if reason is None
             else r"\text{orbit dimension: numeric only}"]
    for symmetry in analysis.symmetries:
        lines.append(rf"&\text{{{symmetry.site.name}: }} {symmetry.group.latex()}")
        lines += [rf"{latex(symmetry.symbols[n])} &\mapsto {latex(e)}" for n, e in symmetry.action.items()]
    lines += [translation.latex() for translation in analysis.translations]
    for quantity in analysis.conserved_quantities():
        lines.append(quantity.latex().replace(" = ", " &= ", 1))
    for momentum in analysis.angular_momenta():
        lines.append(momentum.latex().replace(" = ", " &= ", 1))
    return "\\begin{align*}\n" + " \\\\\n".join(lines) + "\n\\end{align*}"
