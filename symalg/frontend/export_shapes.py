"""Which input shapes a ``torch.export`` graph holds for.

``torch.export`` runs the model's Python on fake tensors, so a branch on a size (``if x.shape[0] > 1``) is
traced one way only. :func:`export_dynamic` exports with every axis of every tensor input dynamic and
size-oblivious reasoning (sizes 0 and 1 are not assumed away), and :func:`input_shapes` reads back what the graph
assumed: the axes export kept at the example's size, every dynamic axis with its size symbol (``s0, s1, ...``)
and range, and the guards on them that no range states (``s0 ≠ 1``, ``Mod(s1, 2) = 0``).

Example
-------
>>> import torch
>>> class Branchy(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc = torch.nn.Linear(3, 2)
...     def forward(self, x):
...         return torch.relu(self.fc(x)) if x.shape[0] > 1 else torch.tanh(self.fc(x))
>>> shapes = input_shapes(export_dynamic(Branchy(), (torch.zeros(4, 3),), {}))
>>> shapes.fixed, shapes.dynamic, shapes.note()
((('x', 1, 3),), (('x', 0, 's0', 2, None),), 'the graph holds for x of shape (s0, 3) with s0 ≥ 2')
"""
from __future__ import annotations

import math
from typing import Mapping, NamedTuple

import sympy as sp
import torch
from torch.fx.experimental import _config as shape_config

__all__ = ["InputShapes", "export_dynamic", "input_shapes", "static_shapes"]


class InputShapes(NamedTuple):
    """The input shapes a graph holds for.

    ``fixed``: ``(input, axis, size)`` of every tensor-input axis kept at the example's size; ``dynamic``:
    ``(input, axis, size symbol, least size, greatest size or None)`` of every other axis (axes sharing a symbol
    have one size); ``guards``: conditions on the symbols beyond their ranges (``"s0 ≠ 1"``); ``failure``: why
    every axis is fixed (the export at dynamic shapes failed).

    >>> InputShapes((("x", 1, 3),), (("x", 0, "s0", 0, None),)).note()
    'the graph holds for x of shape (s0, 3)'
    """

    fixed: tuple[tuple[str, int, int], ...]
    dynamic: tuple[tuple[str, int, str, int, int | None], ...]
    guards: tuple[str, ...] = ()
    failure: str = ""

    def note(self) -> str:
        """``""`` when there are no inputs, or every axis is dynamic over every size from 1 up with no guard; else
        the shapes the graph holds for, e.g. ``"the graph holds for x of shape (s0, 3) with s0 ≥ 2"``."""
        bounds = {symbol: _bound_text(symbol, low, high) for _, _, symbol, low, high in self.dynamic}
        conditions = [text for text in bounds.values() if text] + list(self.guards)
        if not (self.fixed or conditions):
            return ""
        sizes: dict[str, dict[int, object]] = {}
        for name, axis, size in self.fixed:
            sizes.setdefault(name, {})[axis] = size
        for name, axis, symbol, _, _ in self.dynamic:
            sizes.setdefault(name, {})[axis] = symbol
        shapes = ", ".join(f"{name} of shape ({', '.join(str(axes[a]) for a in sorted(axes))}{',' * (len(axes) == 1)})"
                           for name, axes in sizes.items())
        text = f"the graph holds for {shapes}" + (f" with {', '.join(conditions)}" if conditions else "")
        return f"{text} only ({self.failure})" if self.failure else text


def _bound_text(symbol: str, low: int, high: int | None) -> str:
    """``"s0 ≥ 2"``, ``"s0 ≤ 16"``, ``"2 ≤ s0 ≤ 16"``, or ``""`` for every size from 1 up."""
    if high is None:
        return f"{symbol} ≥ {low}" if low > 1 else ""
    return (f"{low} ≤ " if low > 1 else "") + f"{symbol} ≤ {high}"


def export_dynamic(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.export.ExportedProgram:
    """``torch.export`` (non-strict) with every axis of every tensor input dynamic (``Dim.AUTO``: export keeps an
    axis static where the model needs its size) and size-oblivious reasoning (torch's ``backed_size_oblivious``),
    so that sizes 0 and 1 are not assumed away: a branch on ``x.shape[0] > 1`` becomes the guard ``s0 ≥ 2``.

    >>> sorted(export_dynamic(torch.nn.Linear(3, 2), (torch.zeros(4, 3),), {}).range_constraints.values(), key=str)
    [VR[0, int_oo]]
    """
    shapes = torch.export.ShapesCollection()
    for value in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(value, torch.Tensor):
            shapes[value] = {axis: torch.export.Dim.AUTO for axis in range(value.dim())}
    with shape_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]  # (set by torch at import)
        return torch.export.export(model, args, kwargs, dynamic_shapes=shapes.dynamic_shapes(model, args, kwargs),
                                   strict=False)


def _user_inputs(exported: torch.export.ExportedProgram) -> list[tuple[str, torch.Tensor]]:
    """``(name, fake tensor)`` of every tensor input of an exported program, in order."""
    placeholders = {node.name: node for node in exported.graph.nodes if node.op == "placeholder"}
    named = [(spec.arg.name, placeholders[spec.arg.name].meta.get("val"))
             for spec in exported.graph_signature.input_specs
             if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT and hasattr(spec.arg, "name")]
    return [(name, value) for name, value in named if isinstance(value, torch.Tensor)]


_RELATIONS = {"==": "=", "!=": "≠", "<=": "≤", ">=": "≥", "<": "<", ">": ">"}


def _guard_text(guard: sp.Basic) -> str:
    """A guard in words: ``"s0 ≠ 1"``, ``"Mod(s1, 2) = 0"``."""
    if isinstance(guard, sp.core.relational.Relational):
        return f"{guard.lhs} {_RELATIONS[guard.rel_op]} {guard.rhs}"
    return str(guard)


def _narrowed(guard: sp.Basic, symbol: sp.Symbol, low: float, high: float) -> tuple[float, float] | None:
    """The integer range ``[low, high]`` of ``symbol`` narrowed by a guard on it alone, when the sizes it leaves
    form one range (``s0 > 1``; ``s0 ≠ 1`` where the range starts above 1; ``Min(16, s0) = s0``), else ``None``."""
    if not isinstance(guard, sp.core.relational.Relational):
        return None
    try:
        plain = sp.sympify(str(guard), locals={str(symbol): symbol})  # torch's own Min, Mod, ...: SymPy's, to solve
        allowed = sp.solveset(plain, symbol, domain=sp.S.Reals).intersect(sp.Interval(low, high))
    except (sp.SympifyError, TypeError, ValueError, NotImplementedError):  # a guard SymPy cannot read: kept as text
        return None
    if not isinstance(allowed, sp.Interval):
        return None
    least, greatest = allowed.inf, allowed.sup
    narrowed_low = math.ceil(least) + (1 if allowed.left_open and least.is_integer else 0)
    narrowed_high = math.inf if greatest is sp.oo else \
        math.floor(greatest) - (1 if allowed.right_open and greatest.is_integer else 0)
    return narrowed_low, narrowed_high


def _only_symbol(guard: sp.Basic, ranges: Mapping[sp.Symbol, list[float]]) -> sp.Symbol | None:
    """The one size symbol ``guard`` reads, or ``None`` (several, or one that is no input's size)."""
    free = guard.free_symbols
    return next(iter(free)) if len(free) == 1 and free <= set(ranges) else None


def _implied(guard: sp.Basic, symbol: sp.Symbol | None, ranges: Mapping[sp.Symbol, list[float]]) -> bool:
    """True when ``guard`` holds at every size in the (finite, at most :data:`_ENUMERATED` sizes) range of its one
    symbol: ``Eq(s1, Min(16, s1)) | Eq(Min(16, s1), 1)`` once ``s1`` runs over ``2 … 16``."""
    if symbol is None or ranges[symbol][1] - ranges[symbol][0] > _ENUMERATED:
        return False
    low, high = (int(b) for b in ranges[symbol])
    return all(bool(guard.subs(symbol, size)) for size in range(low, high + 1))


_ENUMERATED = 1024
"""The most sizes :func:`_implied` tries."""


def _checks(inputs: list[tuple[str, torch.Tensor]]) -> list[sp.Basic]:
    """Every guard and deferred runtime assertion export recorded on the sizes of the (fake) input tensors,
    simplified by its shape environment (``s70`` read as the ``s53`` it was unified with)."""
    env = next((v.fake_mode.shape_env for _, v in inputs if hasattr(v, "fake_mode")), None)
    if env is None:
        return []
    checks = [g.expr for g in env.guards] + [c.expr for deferred in env.deferred_runtime_asserts.values()
                                             for c in deferred]
    return [env.simplify(check) for check in checks]


def input_shapes(exported: torch.export.ExportedProgram) -> InputShapes:
    """The input shapes an export at dynamic shapes (:func:`export_dynamic`) holds for: the axes it kept at the
    example's size, every dynamic axis with its size symbol (renamed ``s0, s1, ...`` in order of appearance) and
    range (export's range, narrowed by every guard on that symbol alone that is an interval), and the other guards.
    """
    inputs = _user_inputs(exported)
    names: dict[sp.Symbol, sp.Symbol] = {}
    fixed: list[tuple[str, int, int]] = []
    axes: list[tuple[str, int, sp.Expr]] = []
    for name, value in inputs:
        for axis, size in enumerate(value.shape):
            if not isinstance(size, torch.SymInt) or size.node.expr.is_number:
                fixed.append((name, axis, int(size)))
                continue
            expr = size.node.expr
            for symbol in sorted(expr.free_symbols, key=str):
                names.setdefault(symbol, sp.Symbol(f"s{len(names)}", integer=True, nonnegative=True))
            axes.append((name, axis, expr.xreplace(names)))
    ranges: dict[sp.Symbol, list[float]] = {}
    for symbol, renamed in names.items():
        bounds = exported.range_constraints.get(symbol)
        upper = bounds.upper if bounds is not None else None
        ranges[renamed] = [int(bounds.lower) if bounds is not None else 0,
                           int(upper) if isinstance(upper, sp.Integer) else math.inf]  # int_oo is no Integer
    others = []
    for guard in _checks(inputs):
        renamed_guard = guard.xreplace(names)
        symbol = _only_symbol(renamed_guard, ranges)
        narrowed = None if symbol is None else _narrowed(renamed_guard, symbol, *ranges[symbol])
        if narrowed is not None:
            ranges[symbol] = list(narrowed)
        elif renamed_guard is not sp.true:
            others.append(renamed_guard)
    guards = [_guard_text(g) for g in others if not _implied(g, _only_symbol(g, ranges), ranges)]
    dynamic = tuple((name, axis, str(expr), int(ranges[expr][0]) if expr in ranges else 0,
                     None if expr not in ranges or ranges[expr][1] == math.inf else int(ranges[expr][1]))
                    for name, axis, expr in axes)
    return InputShapes(tuple(fixed), dynamic, tuple(dict.fromkeys(guards)))


def static_shapes(exported: torch.export.ExportedProgram, why: str) -> InputShapes:
    """Every axis of every tensor input fixed at the example's size: the export at dynamic shapes failed (``why``)
    and only the static export ran."""
    fixed = tuple((name, axis, int(size)) for name, value in _user_inputs(exported)
                  for axis, size in enumerate(value.shape))
    return InputShapes(fixed, (), (), f"torch.export at dynamic shapes failed ({why})")

