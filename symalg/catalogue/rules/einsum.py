"""The rule for ``torch.einsum`` (fx: ``torch.einsum``; ``torch.export``: ``aten.einsum``), read as the contraction
its equation spells.

The equation is parsed as data (:class:`Equation`: letters, ``,``, ``->``; nothing is evaluated) and every index of
the operand carrying sites is classified: **contracted** with a weight (in the weight, not in the output: the weight
is a linear map whose axis of that index reads the sites, ``g`` on the value, ``g⁻ᵀ`` on the weight), **free** (kept
in the output: the sites move to the output axis the equation gives), **batch** (in both operands and the output),
or **summed** in one operand only (a reduction along that axis).

>>> Equation.parse("bti, hdi -> bthd")
Equation(operands=('bti', 'hdi'), output='bthd')
>>> Equation.parse("ij,jk").output      # implicit output: the letters seen once, in ASCII order (torch's)
'ik'
"""
from __future__ import annotations

import string
from collections import Counter
from dataclasses import dataclass

import torch

from symalg.catalogue.rule_examples import around
from symalg.catalogue.rules._base import Inputs, NodeData, WeightExpr, _argument, _freeze, _is_param, unknown_rule
from symalg.catalogue.rules.dense import _producer_site, _read_as_map, _refuse_shifts
from symalg.catalogue.rules.registry import OpSpellings, register_rule
from symalg.errors import SpecError
from symalg.symbolic.inference import ALL, TRANSLATIONS, Inference, Label, Segment

__all__ = ["Equation", "einsum_rule"]

_LETTERS = frozenset(string.ascii_letters)


@dataclass(frozen=True)
class Equation:
    """An einsum equation: one subscript string per operand and the output's (``...`` kept as the token ``.``,
    which the rule refuses)."""

    operands: tuple[str, ...]
    output: str

    @classmethod
    def parse(cls, text: object, where: str = "einsum") -> "Equation":
        """Parse ``text`` (grammar: ``operand ("," operand)* ["->" output]``, an operand being letters and at most one
        ``...``; spaces ignored); without ``->`` the output is every letter seen once, in ASCII order, as torch
        writes it. Anything else raises :class:`~symalg.errors.SpecError` naming ``where``."""
        if not isinstance(text, str):
            raise SpecError(f"{where}: the einsum equation must be a string, got {type(text).__name__}")
        compact = text.replace(" ", "")
        inputs, arrow, output = compact.partition("->")
        if "->" in output:
            raise SpecError(f"{where}: einsum equation {text!r} has more than one '->'")
        operands = tuple(_subscripts(part, text, where) for part in inputs.split(","))
        if arrow:
            return cls(operands, _subscripts(output, text, where))
        counts = Counter(letter for operand in operands for letter in operand if letter != ".")
        return cls(operands, "".join(sorted(letter for letter, n in counts.items() if n == 1)))

    def __str__(self) -> str:
        return f"{','.join(self.operands)}->{self.output}".replace(".", "...")


def _subscripts(part: str, text: str, where: str) -> str:
    """One operand's (or the output's) subscripts, ``...`` as ``.``."""
    compact = part.replace("...", ".")
    if compact.count(".") > 1 or not set(compact) <= _LETTERS | {"."}:
        raise SpecError(f"{where}: einsum equation {text!r}: subscripts {part!r} are not letters with at most one "
                        "'...'")
    return compact


class _Refused(Exception):
    """An equation the rule does not model; the message is the blocked note's reason."""


def _site_letter(label: Label, subscripts: str) -> str | None:
    """The index of the axis ``label``'s sites run along (``None`` for a value without sites)."""
    if not label.segments:
        return None
    if not -len(subscripts) <= label.dim < 0:
        raise _Refused(f"its sites run along axis {label.dim}, which operand {subscripts!r} does not have")
    return subscripts[len(subscripts) + label.dim]


def _output_dim(equation: Equation, letter: str) -> int:
    return equation.output.index(letter) - len(equation.output)


@register_rule("einsum", capabilities={"weights"},
               spellings={"einsum": OpSpellings(functions=(torch.einsum,), aten=("einsum",))},
               near_misses={"einsum": (
                   # the weight contracted on its other axis: its rows read the sites
                   around(lambda self, h: torch.einsum("bi,io->bo", torch.relu(h), self.w),
                          w=lambda: torch.nn.Parameter(torch.randn(4, 4))),
                   # the sites kept as a batch index of the weight: a per-unit map, no GL
                   around(lambda self, h: torch.einsum("bi,oi->bi", torch.tanh(h), self.w),
                          w=lambda: torch.nn.Parameter(torch.randn(4, 4))),
                   # a diagonal: the sites' axis paired with a data axis
                   around(lambda self, h: torch.einsum("bii->bi", torch.relu(h)), shape=(5, 4, 3)),
                   # a sum over the sites' axis: only permutations
                   around(lambda self, h: torch.relu(h) * torch.einsum("bi->b", torch.relu(h))[:, None]),
                   # a sum over a data axis: the sites pass, their translations do not
                   around(lambda self, h: torch.einsum("bti->bi", torch.relu(h)), shape=(5, 3, 3)),
                   # two activations contracted: blocked
                   around(lambda self, h: torch.einsum("bi,bj->bij", torch.relu(h), torch.tanh(h)).flatten(1), k=16))},
               examples={"einsum": around(lambda self, h: torch.einsum("bti,oi->bto", torch.relu(h), self.w),
                                          shape=(5, 2, 3), w=lambda: torch.nn.Parameter(torch.randn(4, 4)))})
def einsum_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``torch.einsum(equation, *operands)`` with one operand carrying sites and at most one weight (a parameter):

    - an index of the sites **contracted** with the weight: ``y = Σ_i W[…, i, …] x[…, i]`` is a linear map reading the
      sites on the weight's axis of ``i`` (``x ↦ g x``, ``W ↦ W g⁻¹`` along that axis: :func:`_read_as_map`, as for
      ``x @ W.T``); the weight's index kept in the output (the last one if several, ``d`` of ``bti,hdi->bthd``: the
      same ``g`` for every head) is a new site, as a linear map's rows; an einsum has no bias, so translations and
      the shifts of affine sign flips are refused;
    - **free** (kept in the output, not in the weight): the sites move to their output axis; the weight mixes data
      axes only, which commutes with every action but translations;
    - **summed** in their operand alone: the output is invariant under permutations of the sites only;
    - a **batch** index (in the weight and the output): not modelled (blocked).

    A repeated index (a diagonal ``ii->i``), ``...``, two operands carrying sites (``Q Kᵀ``, attention written as
    einsum is not folded) or a weight computed in ``forward`` block the sites and make the weight opaque, with a note
    naming the node."""
    where = state.where(node)
    equation = Equation.parse(_argument(data, 0, "equation"), where)
    weights = [value for value in inputs if _is_param(value)]
    values = [value for value in inputs if isinstance(value, Label)]
    if len(inputs) != len(equation.operands) or len(weights) > 1 or len(weights) + len(values) != len(inputs) or \
            any(isinstance(value, WeightExpr) for value in inputs):
        return unknown_rule(state, node, data, inputs)
    try:
        _check_indices(equation, len(values))
        position = next(p for p, value in enumerate(inputs) if isinstance(value, Label))
        label, subscripts = inputs[position], equation.operands[position]
        if not weights:
            return _single(state, node, equation, label)
        tensor = weights[0][1]
        return _with_weight(state, node, equation, label, subscripts, tensor, equation.operands[1 - position])
    except _Refused as refused:
        for value in inputs:
            _freeze(state, node, value, f"{where}: einsum {str(equation)!r} {refused}")
        return Label.data()


def _check_indices(equation: Equation, values: int) -> None:
    """Refuse what the rule does not model: ``...``, a repeated index, two operands carrying values."""
    if any("." in s for s in (*equation.operands, equation.output)):
        raise _Refused("broadcasts with '...' (not modelled)")
    if any(len(set(s)) != len(s) for s in (*equation.operands, equation.output)):
        raise _Refused("repeats an index in one operand or the output (a diagonal: not modelled)")
    if values == 0:
        raise _Refused("reads weights only (a product of weights is not modelled)")
    if values > 1:
        raise _Refused(f"reads {values} activations: contractions of values (Q Kᵀ, P V written as einsum) are not "
                       "modelled outside the attention fold")


def _single(state: Inference, node: str, equation: Equation, label: Label) -> Label:
    """One operand: a permutation of axes moves the sites; a sum over other axes is a linear map along them
    (translations and shifts removed); a sum over the sites' axis keeps only their permutations."""
    (subscripts,) = equation.operands
    letter = _site_letter(label, subscripts)
    if letter is None:
        return Label.data()
    where = state.where(node)
    if letter not in equation.output:
        state.restrict_label(label, {"S"}, node, f"{where}: einsum {str(equation)!r} sums over the axis the sites run "
                                                 "along")
        return Label.data()
    if len(equation.output) < len(subscripts):
        _sums_data_axes(state, node, label, f"einsum {str(equation)!r} sums over data axes")
    return Label(_output_dim(equation, letter), label.size, label.segments)


def _sums_data_axes(state: Inference, node: str, label: Label, what: str) -> None:
    """A weighted sum over axes the sites do not run along: a translation of the sites (the same vector at every
    position) is scaled by the weights' sum, and so is an affine sign flip's shift: both go."""
    state.restrict_label(label, ALL - TRANSLATIONS, node, f"{state.where(node)}: {what} (a translation of its input "
                                                          "is not one of its output)")
    _refuse_shifts(state, node, label, f"{what}: the shift of an affine sign flip is not one of its output")


def _with_weight(state: Inference, node: str, equation: Equation, label: Label, subscripts: str, weight: str,
                 weight_subscripts: str) -> Label:
    """The value ``x`` (``subscripts``) and the weight (``weight_subscripts``): see :func:`einsum_rule`."""
    where, text = state.where(node), str(equation)
    if len(state.shapes[weight]) != len(weight_subscripts):
        raise SpecError(f"{where}: einsum {text!r} reads the weight {weight!r} of shape {state.shapes[weight]} with "
                        f"{len(weight_subscripts)} indices")
    letter = _site_letter(label, subscripts)
    if letter is not None and letter in weight_subscripts and letter in equation.output:
        raise _Refused(f"keeps the sites' index {letter!r} in the weight {weight!r} and the output (a batch index: "
                       "one map per unit, not modelled)")
    if letter is not None and letter not in weight_subscripts:
        if letter not in equation.output:
            state.restrict_label(label, {"S"}, node, f"{where}: einsum {text!r} sums over the axis the sites run "
                                                     "along")
        else:   # the weight mixes data axes only: its rows get no site (a value has one site axis)
            _sums_data_axes(state, node, label, f"einsum {text!r} mixes data axes with the weight {weight!r}")
            return Label(_output_dim(equation, letter), label.size, label.segments)
    rows = [r for r in equation.output if r in weight_subscripts and r not in subscripts]
    # a whole matrix map, as ``linear`` reads it: its rows may shift along 1 (``T1``) where a softmax reads them
    whole = len(weight_subscripts) == len(rows) + 1 == 2 and \
        all(c in subscripts and c not in equation.output for c in weight_subscripts if c not in rows)
    if letter is not None and letter in weight_subscripts:
        column = ((weight, weight_subscripts.index(letter)),)
        _read_as_map(state, node, label, WeightExpr((), column, (weight,) if whole else ()), label.dim,
                     why="is an einsum (it has no bias)")
        _refuse_shifts(state, node, label, "is an einsum: it has no bias to absorb the shift of an affine sign flip")
    if not rows:
        return Label.data()
    axis = weight_subscripts.index(rows[-1])
    width = state.shapes[weight][axis]
    site = _producer_site(state, node, width, WeightExpr(((weight, axis),), (), (weight,) if whole else ()), None)
    return Label(_output_dim(equation, rows[-1]), width, (Segment(site, 0, width),))

