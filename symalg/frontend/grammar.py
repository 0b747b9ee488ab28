"""The allow-list grammar of spec arguments, and the limits on what symalg will build.

Nothing here (or anywhere in symalg) hands user text to an evaluator: ``sympify``, ``eval`` and
``exec`` never see a spec string. A spec argument is read from Python's syntax tree
(``ast.parse``, which only parses) and must be one of

=================== ===================================================================
``argument``        meaning
=================== ===================================================================
``True``/``False``  a flag (``bias=False``)
``h``, ``d_model``  a name: a plain identifier, not starting with ``_`` (a SymPy symbol)
``3``, ``0.2``      a finite number; decimals are read exactly (``0.2`` is ``1/5``)
``1/5``, ``-3*2``   ``+ - * /`` of numbers, computed exactly with :class:`fractions.Fraction`
=================== ===================================================================

Anything else is refused with a :class:`~symalg.errors.SpecError` naming the argument: quoted
strings, calls, attributes, subscripts, exponentiation (``**``: write the number out), ``inf`` and
``nan`` spelled as numbers (``1e400``), division by zero, and numbers of more than
:data:`MAX_BITS` bits.

Limits (refused before anything is allocated):

* :data:`MAX_WIDTH` — the largest feature width (2²⁰), anywhere a width is given;
* :data:`MAX_ENTRIES` — the most tensor entries symalg materialises at once (10⁸, 800 MB in
  float64): the parameters of a model, and the Lie-algebra basis of a site's group.

>>> import ast
>>> literal(ast.parse("1/5", mode="eval").body, "slope")
1/5
>>> literal(ast.parse("'0.2'", mode="eval").body, "slope")
Traceback (most recent call last):
...
symalg.errors.SpecError: slope: argument '0.2' is a quoted string; give a number (0.2, 1/5) or a name
"""
from __future__ import annotations

import ast
import keyword
import math
from fractions import Fraction

import sympy as sp
from symalg.errors import SpecError

__all__ = ["MAX_BITS", "MAX_ENTRIES", "MAX_WIDTH", "check_entries", "is_plain_name", "literal", "parse_number",
           "refuse_text"]

MAX_WIDTH = 2 ** 20
"""The largest feature width symalg accepts (concrete widths only; symbols are unbounded)."""

MAX_ENTRIES = 10 ** 8
"""The most tensor entries materialised at once (parameters of a model, a group's Lie-algebra basis)."""

MAX_BITS = 256
"""The most bits in the numerator or denominator of a number written in a spec."""


def _spec_error(message: str) -> SpecError:
    return SpecError(message)


def is_plain_name(text: object) -> bool:
    """True for a plain identifier (``h``, ``d_model``): no keyword, no leading underscore."""
    return isinstance(text, str) and text.isidentifier() and not keyword.iskeyword(text) and not text.startswith("_")


def refuse_text(value: object, where: str) -> None:
    """Raise :class:`~symalg.errors.SpecError` when ``value`` is text or a list/tuple holding text anywhere:
    SymPy would parse and evaluate it (``sympify``, ``Matrix``); numbers and SymPy objects pass."""
    if isinstance(value, str):
        raise _spec_error(f"{where}: {value!r} is text; give a number or a SymPy expression")
    if isinstance(value, (list, tuple)):
        for item in value:
            refuse_text(item, where)


def check_entries(count: int | float, what: str) -> None:
    """Raise :class:`~symalg.errors.SpecError` when materialising ``count`` entries for ``what`` would
    exceed :data:`MAX_ENTRIES`."""
    if count > MAX_ENTRIES:
        raise _spec_error(f"{what} would need {count:.3g} tensor entries, more than the limit of {MAX_ENTRIES:.0e} "
                          "(symalg.frontend.grammar.MAX_ENTRIES); use smaller widths")


def _exact(value: Fraction, where: str, text: str) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise _spec_error(f"{where}: argument {text!r} is too large (more than {MAX_BITS} bits)")
    return value


_ARITHMETIC = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__,
               ast.Div: Fraction.__truediv__}


def _number(node: ast.expr, where: str, text: str) -> Fraction:
    """The exact value of ``node``, an arithmetic expression of number literals in the argument ``text``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise _spec_error(f"{where}: argument {text!r} is not a finite number")
        # a float by its decimal repr: 0.2 is 1/5, not the binary double nearest to it
        return _exact(Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value),
                      where, text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _number(node.operand, where, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _number(node.left, where, text), _number(node.right, where, text)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _spec_error(f"{where}: argument {text!r} divides by zero")
        return _exact(_ARITHMETIC[type(node.op)](left, right), where, text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        raise _spec_error(f"{where}: argument {text!r}: exponentiation (**) is not allowed in specs; "
                          "write the number out")
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        raise _spec_error(f"{where}: argument {text} is a quoted string; give a number (0.2, 1/5) or a name")
    raise _spec_error(f"{where}: argument {text!r} must be a number or a name (allowed: numbers, + - * / of "
                      "numbers, plain identifiers, True/False)")


def literal(node: ast.expr, where: str) -> bool | str | int | float | sp.Rational:
    """Read one spec argument from its syntax tree: ``bool``, a plain name (``str``), an ``int``, a finite
    ``float`` literal, or the exact ``sympy.Rational`` of an arithmetic expression; anything else raises
    :class:`~symalg.errors.SpecError` naming ``where``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if not is_plain_name(node.id):
            raise _spec_error(f"{where}: name {node.id!r} is not allowed (names are plain identifiers that do "
                              "not start with '_')")
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        _number(node, where, ast.unparse(node))  # finite, and not too large
        return node.value  # a plain float stays one: a width 2.5 is refused as such, exact() reads a slope 0.2 as 1/5
    try:
        value = _number(node, where, ast.unparse(node))
    except RecursionError:
        raise _spec_error(f"{where}: argument is nested too deeply") from None
    return int(value) if value.denominator == 1 else sp.Rational(value.numerator, value.denominator)


def parse_number(text: str, where: str) -> str | int | float | sp.Rational:
    """A number or a plain name given as text (``"0.2"``, ``"1/5"``, ``"h"``), read by :func:`literal`.

    >>> parse_number("1/5", "slope"), parse_number("h", "width")
    (1/5, 'h')
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # the parser's limits on nesting and size
        raise _spec_error(f"{where}: cannot read {text[:200]!r} as a number or a name") from None
    value = literal(node, where)
    if isinstance(value, bool):
        raise _spec_error(f"{where}: {text!r} is not a number")
    return value
