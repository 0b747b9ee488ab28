"""Printers for symalg's matrix expressions: LaTeX (``latex``) and plain text (``sstr``).

SymPy's own printers write ``\\operatorname{DiagMatrix}(d)``, ``1`` for a column of ones and
``HadamardPower(W, 2)``; these subclasses print ``\\operatorname{diag}(d)``, ``\\mathbf{1}`` and
``W∘W``-style powers instead. In LaTeX, torch parameter names (symbols named ``0.weight``, ``fc.bias``)
print as ``W_{0}``, ``b_{\\mathrm{fc}}`` (:func:`tensor_latex`); plain text keeps the parameter name. Every
name symalg writes into LaTeX (parameters, sites, quantities) goes through :func:`escape_latex`.

>>> import sympy as sp
>>> d = sp.MatrixSymbol("d_1", 3, 1)
>>> latex(sp.DiagMatrix(d))
'\\\\operatorname{diag}\\\\left(d_{1}\\\\right)'
>>> W = sp.MatrixSymbol("0.weight", 3, 2)
>>> latex(W * W.T), sstr(W * W.T)
('W_{0} W_{0}^{T}', '0.weight*0.weight.T')
"""
from __future__ import annotations

import re

from sympy import Basic
from sympy.printing.latex import LatexPrinter
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

__all__ = ["latex", "sstr", "tensor_latex", "name_latex", "escape_latex"]

_ROLES = {"weight": "W", "bias": "b"}


def tensor_latex(name: str) -> str:
    """LaTeX for a parameter or buffer name: ``0.weight`` → ``W_{0}``, ``encoder.fc.bias`` →
    ``b_{\\mathrm{encoder.fc}}``, any other name (a region ``0.weight[0:4]_(1)``) in ``\\mathrm``."""
    prefix, _, role = name.rpartition(".")
    if prefix and role in _ROLES:
        return f"{_ROLES[role]}_{{{name_latex(prefix)}}}"
    return rf"\mathrm{{{escape_latex(name)}}}"


def name_latex(name: str) -> str:
    """A name (a site, a module path) for a LaTeX subscript: a short ASCII alphanumeric one as it is, any other
    upright and escaped (:func:`escape_latex`).

    >>> name_latex("0"), name_latex("enc.0#2"), name_latex("blocks_1")
    ('0', '\\\\mathrm{enc.0\\\\#2}', '\\\\mathrm{blocks\\\\_1}')
    """
    return name if name.isalnum() and name.isascii() and len(name) <= 3 else rf"\mathrm{{{escape_latex(name)}}}"


_ESCAPES = {"_": r"\_", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "{": r"\{", "}": r"\}",
            "\\": r"\text{\textbackslash}", "^": r"\text{\textasciicircum}", "~": r"\text{\textasciitilde}"}
"""Characters that LaTeX reads as commands, with their escapes valid in ``\\text{}`` and ``\\mathrm{}`` alike."""


def escape_latex(text: str) -> str:
    """``text`` (a parameter, module or site name) made safe inside ``\\text{...}`` or ``\\mathrm{...}``
    (amsmath): LaTeX's special characters are escaped, characters beyond ASCII are set as text (math fonts
    have none); dots and digits stay as they are.

    >>> print(escape_latex("blocks.0.attn_x^2"))
    blocks.0.attn\\_x\\text{\\textasciicircum}2
    """
    return "".join(_ESCAPES.get(c, c if c.isascii() else rf"\text{{{c}}}") for c in text)


class SymalgLatexPrinter(LatexPrinter):
    def _print_DiagMatrix(self, expr: Basic) -> str:
        return rf"\operatorname{{diag}}\left({self._print(expr.args[0])}\right)"

    def _print_OneMatrix(self, expr: Basic) -> str:
        return r"\mathbf{1}"

    def _print_HadamardPower(self, expr: Basic) -> str:
        # SymPy writes d^{\circ \left({-1}\right)} for a negative power; print d^{\circ (-1)}.
        if expr.exp.is_negative:
            return rf"{self.parenthesize(expr.base, PRECEDENCE['Pow'])}^{{\circ ({self._print(expr.exp)})}}"
        return super()._print_HadamardPower(expr)

    def _print_MatrixSymbol(self, expr: Basic) -> str:
        # SymPy prints a name it cannot split into symbol and subscripts unchanged ("0.weight", "w_in[0:4]_(1)",
        # "a&b.weight": invalid LaTeX); torch names print through tensor_latex. Names starting with a backslash
        # are LaTeX already (velocities, \dot{W}_{1}); plain names ("W_1", "w_in") are SymPy's.
        if not expr.name.startswith("\\") and not re.fullmatch(r"[A-Za-z0-9_]+", expr.name):
            return tensor_latex(expr.name)
        return super()._print_MatrixSymbol(expr)


class SymalgStrPrinter(StrPrinter):
    def _print_DiagMatrix(self, expr: Basic) -> str:
        return f"diag({self._print(expr.args[0])})"

    def _print_HadamardPower(self, expr: Basic) -> str:
        return f"{self.parenthesize(expr.base, 100)}∘^{self._print(expr.exp)}"

    def _print_HadamardProduct(self, expr: Basic) -> str:
        return "∘".join(self.parenthesize(a, 100) for a in expr.args)

    def _print_OneMatrix(self, expr: Basic) -> str:
        return "1"

    def _print_MatrixSymbol(self, expr: Basic) -> str:
        # Velocity symbols are named in LaTeX (\dot{W}_{1}); print them as Ẇ_1 in plain text.
        match = re.fullmatch(r"\\dot\{(\w+)\}_\{(\w+)\}", expr.name)
        return f"{match[1]}\u0307_{match[2]}" if match else expr.name


def latex(expr: Basic) -> str:
    return SymalgLatexPrinter().doprint(expr)


def sstr(expr: Basic) -> str:
    return SymalgStrPrinter().doprint(expr)
