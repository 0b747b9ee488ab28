"""Printers for symalg's matrix expressions: LaTeX (``latex``) and plain text (``sstr``).

SymPy's own printers write ``\\operatorname{DiagMatrix}(d)``, ``1`` for a column of ones and
``HadamardPower(W, 2)``; these subclasses print ``\\operatorname{diag}(d)``, ``\\mathbf{1}`` and
``W∘W``-style powers instead.

>>> import sympy as sp
>>> d = sp.MatrixSymbol("d_1", 3, 1)
>>> latex(sp.DiagMatrix(d))
'\\\\operatorname{diag}\\\\left(d_{1}\\\\right)'
"""
from __future__ import annotations

import re

from sympy.printing.latex import LatexPrinter
from sympy.printing.str import StrPrinter

__all__ = ["latex", "sstr"]


class SymalgLatexPrinter(LatexPrinter):
    def _print_DiagMatrix(self, expr):
        return rf"\operatorname{{diag}}\left({self._print(expr.args[0])}\right)"

    def _print_OneMatrix(self, expr):
        return r"\mathbf{1}"


class SymalgStrPrinter(StrPrinter):
    def _print_DiagMatrix(self, expr):
        return f"diag({self._print(expr.args[0])})"

    def _print_HadamardPower(self, expr):
        return f"{self.parenthesize(expr.base, 100)}∘^{self._print(expr.exp)}"

    def _print_HadamardProduct(self, expr):
        return "∘".join(self.parenthesize(a, 100) for a in expr.args)

    def _print_OneMatrix(self, expr):
        return "1"

    def _print_MatrixSymbol(self, expr):
        # Velocity symbols are named in LaTeX (\dot{W}_{1}); print them as Ẇ_1 in plain text.
        match = re.fullmatch(r"\\dot\{(\w+)\}_\{(\w+)\}", expr.name)
        return f"{match[1]}\u0307_{match[2]}" if match else expr.name


def latex(expr) -> str:
    return SymalgLatexPrinter().doprint(expr)


def sstr(expr) -> str:
    return SymalgStrPrinter().doprint(expr)
