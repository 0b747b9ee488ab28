"""Lowering: SymPy matrix expressions compiled to torch callables with inspectable source.

Built on SymPy's own :class:`sympy.printing.pytorch.TorchPrinter`; :class:`SymalgTorchPrinter`
overrides only what it gets wrong or slow for our expressions, each override saying why. Matrix
expressions use the column convention of [Zhao2023] and [Zhao2026] (a bias is an ``h × 1`` column); the compiled
function adapts torch's layout (bias vectors of shape ``(h,)``) at its boundary, and every matrix
operation works on the last two axes, so leading batch dimensions broadcast.

Example
-------
>>> import sympy as sp, torch
>>> from symalg.lowering.codegen import lower
>>> W = sp.MatrixSymbol("W_1", 3, 2)
>>> f = lower("gram", W * W.T, params={W: "0.weight"})
>>> print(f.source.splitlines()[-1])
    return torch.matmul(W_1, W_1.transpose(-1, -2))
>>> f({"0.weight": torch.ones(3, 2)}).shape
torch.Size([3, 3])
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import re

import numpy as np
import sympy as sp
import torch
from sympy.printing.pytorch import TorchPrinter

from symalg.errors import LoweringError, MissingParameterError, ParameterError, ParameterTypeError, SpecError

__all__ = ["SymalgTorchPrinter", "LoweredFunction", "check_params", "compile_function", "lower", "reads",
           "torch_source", "evaluate_symbolic"]


def identifier(name: str) -> str:
    """A Python identifier for a symbol name (``\\dot{W}_{1}`` → ``dot_W_1``)."""
    cleaned = re.sub(r"[\W_]+", "_", name.replace("\\", "")).strip("_")
    return cleaned if cleaned.isidentifier() else f"_{cleaned}"


class SymalgTorchPrinter(TorchPrinter):
    """SymPy's torch printer with fixes for batching, devices and a few wrong translations."""

    def _print_MatrixSymbol(self, expr: sp.MatrixSymbol) -> str:
        # Symbol names may be LaTeX (velocities are \dot{W}_{1}); print them as Python identifiers.
        return identifier(expr.name)

    def _print_Max(self, expr: sp.Max) -> str:
        # SymPy maps Max to torch.max, which for (tensor, 0) reduces over dim 0 and returns
        # (values, indices); clamp against constants and use the elementwise torch.maximum otherwise.
        return self._print_extremum(expr, "min", "torch.maximum")

    def _print_Min(self, expr: sp.Min) -> str:
        # Same problem as Max: torch.min(x, 0) is a reduction, not an elementwise minimum.
        return self._print_extremum(expr, "max", "torch.minimum")

    def _print_extremum(self, expr: sp.Basic, bound: str, elementwise: str) -> str:
        constants = [a for a in expr.args if a.is_number]
        others = [self._print(a) for a in expr.args if not a.is_number]
        result = others[0]
        for other in others[1:]:
            result = f"{self._module_format(elementwise)}({result}, {other})"
        for c in constants:
            result = f"{self._module_format('torch.clamp')}({result}, {bound}={self._print(c)})"
        return result

    def _print_Transpose(self, expr: sp.Transpose) -> str:
        # SymPy prints torch.transpose(X).t() (an invalid call) for square matrices and a reversed
        # permute string otherwise; neither works on batches. Swap the last two axes.
        arg = self._print(expr.arg)
        return f"{arg if isinstance(expr.arg, sp.MatrixSymbol) else f'({arg})'}.transpose(-1, -2)"

    def _print_Trace(self, expr: sp.Trace) -> str:
        # torch.trace accepts 2-D tensors only; sum the diagonal of the last two axes instead.
        return f"{self._module_format('torch.diagonal')}({self._print(expr.arg)}, dim1=-2, dim2=-1).sum(-1)"

    def _print_MatMul(self, expr: sp.MatMul) -> str:
        # (1) diag(d) X is printed as the broadcast product d * X (and X diag(d) as X * dᵀ) rather than
        #     a dense h×h matrix product; (2) X 1 (a column of ones) as a row sum, not a matmul, and
        #     Yᵀ 1 (or (Yᵀ)∘(Yᵀ) 1) as Y's column sums transposed: summing a transposed view's rows
        #     reads it across its memory order, ~1.3× slower; (3) X A⁻¹ as a linear solve; (4) scalar
        #     factors stay one Python product in front.
        scalars = [a for a in expr.args if not isinstance(a, sp.MatrixExpr)]
        factors = [a for a in expr.args if isinstance(a, sp.MatrixExpr)]
        leading = []
        while len(factors) > 1 and isinstance(factors[0], sp.DiagMatrix):
            leading.append(factors.pop(0))
        result = self._print(factors[0])
        for position, factor in enumerate(factors[1:]):
            untransposed = _untransposed(factors[0]) if position == 0 else None
            if isinstance(factor, sp.OneMatrix) and factor.shape[1] == 1 and untransposed is not None:
                result = f"{self._print(untransposed)}.sum(-2, keepdim=True).transpose(-1, -2)"
            elif isinstance(factor, sp.OneMatrix) and factor.shape[1] == 1:
                result = f"{result}.sum(-1, keepdim=True)"
            elif isinstance(factor, sp.DiagMatrix):
                result = f"({result} * {self._print(factor.args[0])}.transpose(-1, -2))"
            elif isinstance(factor, sp.Inverse):
                # X A⁻¹ solved as X = B A rather than forming the inverse: faster and more accurate.
                result = f"{self._module_format('torch.linalg.solve')}({self._print(factor.arg)}, {result}, left=False)"
            else:
                result = f"{self._module_format('torch.matmul')}({result}, {self._print(factor)})"
        for factor in reversed(leading):
            result = f"({self._print(factor.args[0])} * {result})"
        coefficient = sp.Mul(*scalars)
        if coefficient == -1:
            return f"-{result}"
        if scalars:
            result = f"{self.parenthesize(coefficient, 40)}*{result}"
        return result

    def _print_MatAdd(self, expr: sp.MatAdd) -> str:
        # SymPy folds torch.add(torch.add(A, B), (-1)*C): nested calls plus a multiply per negative
        # term. Print one flat sum with subtraction instead.
        text = ""
        for term in expr.args:
            coeff, rest = term.as_coeff_mmul()
            negative = coeff == -1
            printed = self._print(rest if negative else term)
            text = (f"-{printed}" if negative else printed) if not text else \
                f"{text} {'-' if negative else '+'} {printed}"
        return f"({text})"

    def _print_DiagMatrix(self, expr: sp.DiagMatrix) -> str:
        # A stand-alone diag(d): d is an h×1 column; torch.diag_embed builds (..., h, h).
        return f"{self._module_format('torch.diag_embed')}({self._print(expr.args[0])}.squeeze(-1))"

    def _print_HadamardPower(self, expr: sp.HadamardPower) -> str:
        # Squares of a plain symbol (or its transpose) as X * X, which is faster than torch.pow(X, 2).
        if expr.exp == 2 and isinstance(expr.base, (sp.MatrixSymbol, sp.Transpose)):
            base = self._print(expr.base)
            return f"({base} * {base})"
        return f"{self._module_format('torch.pow')}({self._print(expr.base)}, {self._print(expr.exp)})"

    def _print_MatPow(self, expr: sp.MatPow) -> str:
        # SymPy chains torch.mm, which fails for negative or large exponents and for batches.
        return f"{self._module_format('torch.linalg.matrix_power')}({self._print(expr.base)}, {self._print(expr.exp)})"

    def _print_OneMatrix(self, expr: sp.OneMatrix) -> str:
        # SymPy's torch.ones(shape) ignores dtype and device; match the reference tensor.
        return f"torch.ones({self._print(expr.shape[0])}, {self._print(expr.shape[1])}, **_like)"

    def _print_ZeroMatrix(self, expr: sp.ZeroMatrix) -> str:
        return f"torch.zeros({self._print(expr.shape[0])}, {self._print(expr.shape[1])}, **_like)"

    def _print_MatrixSlice(self, expr: sp.MatrixSlice) -> str:
        # SymPy prints X[a:b, c:d], which slices the leading (batch) axes of a batch; slice the last two. A step is
        # refused: SymPy 1.14 gives X[::2, :] of a 3-row X one row, not two.
        if expr.rowslice[2] != 1 or expr.colslice[2] != 1:
            raise NotImplementedError(f"lowering: the slice {expr} has a step")
        rows, cols = (f"{self._print(piece[0])}:{self._print(piece[1])}" for piece in (expr.rowslice, expr.colslice))
        return f"({self._print(expr.parent)})[..., {rows}, {cols}]"

    def _print_Identity(self, expr: sp.Identity) -> str:
        return f"torch.eye({self._print(expr.shape[0])}, **_like)"

    def _print(self, expr: Any, **kwargs: Any) -> str:
        # Any non-integer real constant (1/5, sqrt(2)/2, pi) as a Python float: SymPy would print
        # torch.sqrt(2), which fails on a Python int.
        if isinstance(expr, sp.Expr) and not isinstance(expr, sp.MatrixExpr) and expr.is_number \
                and not expr.is_Integer and expr.is_real:
            return repr(float(expr))
        return super()._print(expr, **kwargs)


class _VectorPrinter(SymalgTorchPrinter):
    """Prints an ``h × 1`` column as a torch vector ``(..., h)`` (see :func:`_vector_form`), in fewer torch calls than
    the plain printer (each call costs a dispatch, which at small widths is a fifth of the arithmetic): ``X 1`` as
    ``X.sum(-1)`` and ``Yᵀ 1`` as ``Y.sum(-2)``, with no ``keepdim``, ``unsqueeze`` or ``transpose`` views; the row
    sums of a square ``(A∘A) 1`` as one ``torch.linalg.vecdot(A, A)`` (``dim=-2`` for column sums); and a sum with a
    square term ``R + c b∘b`` as one ``torch.addcmul(R, b, b, value=c)``.

    >>> W, b = sp.MatrixSymbol("W", 3, 2), sp.MatrixSymbol("b", 3, 1)
    >>> _VECTOR_PRINTER.doprint(sp.HadamardPower(W, 2) * sp.OneMatrix(2, 1) - sp.HadamardPower(b, 2))
    'torch.addcmul(torch.linalg.vecdot(W, W), b, b, value=-1)'
    """

    def _print_MatMul(self, expr: sp.MatMul) -> str:
        coefficient, factors = _split_scalars(expr)
        if len(factors) == 1:
            result = self._print(factors[0])
        else:
            matrix = factors[0]
            untransposed = _untransposed(matrix)
            summed, axis = (untransposed, -2) if untransposed is not None else (matrix, -1)
            pair = _factor_pair(summed)
            if pair is not None:
                left, right = (_PRINTER._print(f) for f in pair)
                result = f"torch.linalg.vecdot({left}, {right}{', dim=-2' if axis == -2 else ''})"
            else:
                result = f"{_PRINTER._print(summed)}.sum({axis})"
        if coefficient == -1:
            return f"-{result}"
        return result if coefficient == 1 else f"{self.parenthesize(coefficient, 40)}*{result}"

    def _print_MatAdd(self, expr: sp.MatAdd) -> str:
        products: list[tuple[sp.Expr, tuple[sp.MatrixExpr, sp.MatrixExpr]]] = []
        others: list[sp.MatrixExpr] = []
        for term in expr.args:
            coefficient, rest = term.as_coeff_mmul()
            if isinstance(rest, sp.MatMul) and len(rest.args) == 1:
                rest = rest.args[0]
            pair = _factor_pair(rest)
            if pair is not None and coefficient.is_number and all(isinstance(f, sp.MatrixSymbol) for f in pair):
                products.append((coefficient, pair))
            else:
                others.append(term)
        if not products:
            return super()._print_MatAdd(expr)
        if not others:   # at least one term outside addcmul
            coefficient, (left, right) = products.pop(0)
            others.append(coefficient * sp.HadamardProduct(left, right) if left != right
                          else coefficient * sp.HadamardPower(left, 2))
        result = (super()._print_MatAdd(sp.MatAdd(*others)) if len(others) > 1 else self._print(others[0]))
        for coefficient, (left, right) in products:
            value = "" if coefficient == 1 else f", value={self._print(coefficient)}"
            result = f"torch.addcmul({result}, {self._print(left)}, {self._print(right)}{value})"
        return result


def _factor_pair(expr: sp.Basic) -> tuple[sp.MatrixExpr, sp.MatrixExpr] | None:
    """``(A, A)`` for ``A∘A`` (a Hadamard square) and ``(A, B)`` for ``A∘B``, else None."""
    if isinstance(expr, sp.HadamardPower) and expr.exp == 2:
        return expr.base, expr.base
    if isinstance(expr, sp.HadamardProduct) and len(expr.args) == 2:
        return expr.args[0], expr.args[1]
    return None


def _split_scalars(expr: sp.MatMul) -> tuple[sp.Expr, list[sp.MatrixExpr]]:
    scalars = [a for a in expr.args if not isinstance(a, sp.MatrixExpr)]
    return sp.Mul(*scalars), [a for a in expr.args if isinstance(a, sp.MatrixExpr)]


def _vector_form(expr: sp.Basic, columns: set[sp.MatrixSymbol]) -> bool:
    """Whether the column ``expr`` prints as a vector: sums, scalar multiples and Hadamard products or powers of the
    ``columns`` (read as vectors) and of row sums ``A 1`` of matrices ``A`` that use no column.

    >>> b, W = sp.MatrixSymbol("b", 3, 1), sp.MatrixSymbol("W", 3, 2)
    >>> q = sp.HadamardPower(b, 2) + sp.HadamardPower(W, 2) * sp.OneMatrix(2, 1)
    >>> _vector_form(q, {b}), _vector_form(W * W.T * b, {b})
    (True, False)
    """
    if isinstance(expr, sp.MatrixSymbol):
        return expr in columns
    if isinstance(expr, (sp.MatAdd, sp.HadamardProduct)):
        return all(_vector_form(term, columns) for term in expr.args)
    if isinstance(expr, sp.HadamardPower):
        return _vector_form(expr.base, columns)
    if isinstance(expr, sp.MatMul):
        _, factors = _split_scalars(expr)
        if len(factors) == 1:
            return _vector_form(factors[0], columns)
        return (len(factors) == 2 and isinstance(factors[1], sp.OneMatrix) and factors[1].shape[1] == 1
                and not (factors[0].free_symbols & columns) and isinstance(factors[0], sp.MatrixExpr))
    return False


def _untransposed(expr: sp.MatrixExpr) -> sp.MatrixExpr | None:
    """``Y`` for ``expr = Yᵀ`` or ``expr = Yᵀ∘Yᵀ`` (= ``(Y∘Y)ᵀ``), else None."""
    if isinstance(expr, sp.Transpose):
        return expr.arg
    if isinstance(expr, sp.HadamardPower) and isinstance(expr.base, sp.Transpose):
        return sp.HadamardPower(expr.base.arg, expr.exp)
    return None


_PRINTER = SymalgTorchPrinter({"fully_qualified_modules": True})
_VECTOR_PRINTER = _VectorPrinter({"fully_qualified_modules": True})


def torch_source(expr: sp.Basic) -> str:
    """The torch expression printed for ``expr`` (names of symbols as variables)."""
    return _PRINTER.doprint(expr)


def compile_function(name: str, source: str, origin: str = "lowered",
                     bindings: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The function ``name`` defined by generated ``source``: the one place symalg turns code into a callable.

    ``source`` is code symalg printed itself (:func:`torch_source` of SymPy expressions, identifiers from
    :func:`identifier`), never a user's string; it runs in a namespace holding only ``torch`` and the objects
    symalg ``bindings`` names (e.g. the shape guard of :func:`lower`), and its tracebacks name the file
    ``<symalg.{origin}.{name}>``.

    >>> f = compile_function("double", "def double(x):\\n    return 2 * x")
    >>> f(torch.ones(2)).tolist()
    [2.0, 2.0]
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise SpecError(f"compile_function: name must be a Python identifier, got {name!r}")
    namespace: dict[str, Any] = {"torch": torch, **(bindings or {})}
    exec(compile(source, f"<symalg.{origin}.{name}>", "exec"), namespace)
    if not callable(namespace.get(name)):
        raise SpecError(f"compile_function: the source does not define a function {name!r}")
    return namespace[name]


ACCEPTED_SHAPES = 16
"""Most tuples of parameter shapes a :class:`LoweredFunction` remembers as checked."""


@dataclass(frozen=True)
class LoweredFunction:
    """A compiled torch callable with its printed ``source``.

    Called as ``f(params, *args)`` where ``params`` is ``dict(model.named_parameters())`` (or any
    name → tensor mapping) and ``args`` are the extra inputs (group or Lie-algebra elements,
    velocities) in the order of :attr:`arg_names`.
    """

    name: str
    source: str
    arg_names: tuple[str, ...]
    fn: Callable[..., Any] = field(repr=False)
    param_names: tuple[str, ...] = ()
    param_shapes: Mapping[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)
    """Trailing shape each parameter must have (ints, or symbols that must agree across parameters)."""
    _accepted: set[tuple[Any, ...]] = field(default_factory=set, repr=False, compare=False)
    """The tuples of parameter shapes already checked (at most :data:`ACCEPTED_SHAPES`), read by the shape guard at
    the top of :attr:`source`."""

    def __call__(self, params: Mapping[str, torch.Tensor], *args: torch.Tensor) -> Any:
        if len(args) != len(self.arg_names):
            raise LoweringError(f"{self.name} takes params and {len(self.arg_names)} more arguments "
                                f"{list(self.arg_names)}, got {len(args)}")
        return self.fn(params, *args)


def check_params(name: str, param_names: Sequence[str], param_shapes: Mapping[str, tuple[Any, ...]],
                 accepted: set[tuple[Any, ...]], params: Mapping[str, torch.Tensor]) -> None:
    """The check behind a lowered function's shape guard: raise :class:`~symalg.errors.MissingParameterError` (a
    ``KeyError``) naming the parameters missing from ``params``, :class:`~symalg.errors.ParameterTypeError` (a
    ``TypeError``) naming one that is not a tensor, and :class:`~symalg.errors.ParameterError` naming one whose
    trailing shape is not ``param_shapes`` (ints, or symbols that must agree across parameters; leading batch
    dimensions are free), as torch would otherwise broadcast or fail without the name; else remember the shapes in
    ``accepted``.

    >>> check_params("q", ["b"], {"b": (3,)}, set(), {"b": torch.ones(2)})
    Traceback (most recent call last):
    symalg.errors.ParameterError: q: parameter 'b' has shape (2,), expected (..., 3)
    """
    missing = [p for p in param_names if p not in params]
    if missing:
        raise MissingParameterError(f"{name}: parameter(s) {missing} missing from params "
                                    f"(it reads {list(param_names)})")
    bound: dict[sp.Symbol, int] = {}
    for parameter, expected in param_shapes.items():
        value = params[parameter]
        if not isinstance(value, torch.Tensor):
            raise ParameterTypeError(f"{name}: parameter {parameter!r} is a {type(value).__name__}, not a tensor")
        actual = tuple(value.shape[value.dim() - len(expected):]) if value.dim() >= len(expected) else None
        ok = actual is not None and all(bound.setdefault(e, a) == a if isinstance(e, sp.Symbol) else int(e) == a
                                        for e, a in zip(expected, actual))
        if not ok:
            raise ParameterError(f"{name}: parameter {parameter!r} has shape {tuple(value.shape)}, expected "
                             f"(..., {', '.join(str(bound.get(e, e)) for e in expected)})")
    if len(accepted) < ACCEPTED_SHAPES:
        accepted.add(tuple(getattr(params[p], "shape", None) for p in param_names))


def _shape_guard(name: str, param_names: tuple[str, ...], param_shapes: Mapping[str, tuple[Any, ...]],
                 accepted: set[tuple[Any, ...]]) -> tuple[list[str], dict[str, Any]]:
    """The lines that open a lowered function, and the objects they read: a call whose parameter shapes were checked
    before costs one set lookup (a check costs more than a small quantity's arithmetic); any other runs
    ``_check_params``, :func:`check_params` bound to this function."""
    shapes = "".join(f"params[{p!r}].shape, " for p in param_names)
    lines = ["    try:   # the shapes of a call already checked: one lookup",
             f"        _known = ({shapes.rstrip(' ') if len(param_names) == 1 else shapes[:-2]}) in _accepted",
             "    except (KeyError, AttributeError, TypeError):",
             "        _known = False",
             "    if not _known:",
             "        _check_params(params)   # names a missing, non-tensor or mis-shaped parameter"]
    return lines, {"_accepted": accepted,
                   "_check_params": functools.partial(check_params, name, param_names, param_shapes, accepted)}


def reads(symbols: Mapping[str, sp.MatrixSymbol]) -> dict[sp.MatrixSymbol, str]:
    """``{symbol: parameter name}`` from ``{parameter name: symbol}``: the form :func:`lower` reads."""
    return {symbol: name for name, symbol in symbols.items()}


def lower(name: str, expr: sp.MatrixExpr | Mapping[str, sp.MatrixExpr], params: Mapping[sp.MatrixSymbol, str],
          args: Sequence[sp.MatrixSymbol] = (), vector_outputs: Sequence[str] = (),
          vector_inputs: Sequence[sp.MatrixSymbol] = (),
          read_suffixes: Mapping[sp.MatrixSymbol, str] | None = None) -> LoweredFunction:
    """Compile ``expr`` (or a dict of named expressions) to a torch function.

    Parameters
    ----------
    name : Python name of the generated function.
    expr : a SymPy matrix expression, or ``{output name: expression}`` for several outputs.
    params : parameter symbols and the names they are read from in the ``params`` mapping.
    args : further symbols taken positionally.
    vector_outputs : names of dict outputs returned as vectors ``(..., h)`` (e.g. biases).
    vector_inputs : column symbols (``h × 1``: biases, diagonal elements) passed as torch vectors
        of shape ``(..., h)``.
    read_suffixes : code appended to ``params[name]`` when reading a symbol (e.g. the unfolding
        ``.narrow(0, 0, 4).reshape(4, -1)`` of a slice of a conv kernel).
    """
    outputs = dict(expr) if isinstance(expr, Mapping) else None
    exprs: list[sp.MatrixExpr] = list(outputs.values()) if outputs is not None else [expr]
    columns = set(vector_inputs)
    # Column-valued outputs built only from columns and row sums are computed as torch vectors (their columns read
    # without unsqueeze), then returned as (..., h, 1) columns, or as vectors where asked.
    vectors = outputs is not None and bool(columns) and all(_vector_form(e, columns) for e in exprs)
    if outputs is None:
        body = [f"    return {torch_source(expr)}"]
    else:
        def output(key: str, value: sp.MatrixExpr) -> str:
            if vectors:
                return _VECTOR_PRINTER.doprint(value) + ("" if key in vector_outputs else ".unsqueeze(-1)")
            return torch_source(value) + (".squeeze(-1)" if key in vector_outputs else "")

        body = ["    return {", *(f"        {key!r}: {output(key, v)}," for key, v in outputs.items()), "    }"]
    needs_like = any("_like" in line for line in body)
    used = set().union(*(e.free_symbols for e in exprs))
    stray = sorted(str(s) for s in used - set(params) - set(args) if isinstance(s, sp.MatrixSymbol))
    if stray:
        raise SpecError(f"lower({name}): expression uses {stray}, which are neither params nor args")
    # read the parameters the expressions use, plus any needed only for a width or for dtype/device
    to_read = [s for s in params if s in used]
    inputs = to_read + list(args)
    missing = {s for s in used if not isinstance(s, sp.MatrixSymbol)} - {w for m in inputs for w in m.shape}
    for symbol in params:
        if symbol not in to_read and (missing & set(symbol.shape) or (needs_like and not inputs)):
            to_read.append(symbol)
            inputs.append(symbol)
            missing -= set(symbol.shape)
    lines = [f"def {name}(params{''.join(', ' + identifier(a.name) for a in args)}):"]
    for symbol in to_read:
        suffix = (read_suffixes or {}).get(symbol, ".unsqueeze(-1)" if symbol in columns and not vectors else "")
        lines.append(f"    {identifier(symbol.name)} = params[{params[symbol]!r}]{suffix}")
    lines += [f"    {identifier(s.name)} = {identifier(s.name)}.unsqueeze(-1)" for s in args
              if s in columns and not vectors]
    bound: set[sp.Symbol] = set()
    taken = {identifier(s.name) for s in inputs} | {"torch", "params", "_like", name}
    clash = sorted({str(w) for s in inputs for w in s.shape if sp.sympify(w).is_Symbol and str(w) in taken})
    if clash:  # `b_1 = W_1.shape[-2]` would overwrite the bias b_1: a wrong value, silently
        raise SpecError(f"lower({name}): width(s) {clash} have the name of a tensor or function the generated code "
                         "uses; rename the width")
    printed = "\n".join(body)
    for symbol in inputs:
        axes = symbol.shape[:1] if vectors and symbol in columns else symbol.shape
        for axis, size in enumerate(axes):
            if sp.sympify(size).is_Symbol and size not in bound:
                bound.add(size)
                if re.search(rf"\b{size}\b", printed):   # widths the printed code reads, not just its shapes
                    lines.append(f"    {size} = {identifier(symbol.name)}.shape[{axis - len(axes)}]")
    unbound = sorted(str(s) for s in used - bound if not isinstance(s, sp.MatrixSymbol))
    if unbound:
        raise SpecError(f"lower({name}): expression uses {unbound}, which are neither params, args nor widths "
                         "read off their shapes")
    if needs_like:
        if not inputs:
            raise SpecError(f"lower({name}): a constant matrix needs at least one input for its dtype and device")
        reference = identifier(inputs[0].name)
        lines.append(f"    _like = dict(dtype={reference}.dtype, device={reference}.device)")
    shapes = {params[s]: tuple(s.shape[:1] if s in columns else s.shape)
              for s in to_read if s not in (read_suffixes or {})}
    param_names = tuple(params[s] for s in to_read)
    accepted: set[tuple[Any, ...]] = set()
    guard, bindings = _shape_guard(name, param_names, shapes, accepted) if param_names else ([], {})
    source = "\n".join(lines[:1] + guard + lines[1:] + body)
    function = compile_function(name, source, bindings=bindings)
    return LoweredFunction(name, source, tuple(identifier(a.name) for a in args), function, param_names, shapes,
                           accepted)


def _explicit_entrywise(expr: sp.Basic) -> sp.Basic:
    """Write ``OneMatrix`` and Hadamard powers of explicit matrices out as explicit matrices: SymPy
    otherwise evaluates them one entry at a time through the whole product (quadratic in the size)."""
    expr = expr.replace(lambda e: isinstance(e, sp.OneMatrix), lambda e: sp.ImmutableMatrix.ones(*e.shape))

    def power(e: sp.HadamardPower) -> sp.Basic:
        base = e.base.doit()
        return base.applyfunc(lambda v: v ** e.exp) if isinstance(base, sp.MatrixBase) else e

    return expr.replace(lambda e: isinstance(e, sp.HadamardPower), power)


class _Unsupported(Exception):
    """A node :func:`_numeric` has no rule for: the expression is evaluated in SymPy instead."""


def _numeric(expr: sp.Basic, arrays: Mapping[str, np.ndarray], widths: Mapping[sp.Symbol, int]) -> Any:
    """The value of ``expr`` in float64 NumPy, node by node from SymPy's own meaning of each node (a matrix symbol's
    array, sums, products, transposes, Hadamard powers and products, ``1``/``0``/``I``, ``diag``, inverses, integer
    matrix powers, traces, numbers): independent of the torch printer it checks. Scalars are floats, matrices
    2-D arrays; any other node raises :class:`_Unsupported`."""
    if isinstance(expr, sp.MatrixSymbol):
        return arrays[expr.name]
    if isinstance(expr, sp.MatrixBase):
        return np.array(expr.evalf(), dtype=float)
    if not isinstance(expr, sp.MatrixExpr):
        if not isinstance(expr, sp.Expr) or expr.free_symbols - set(widths):
            raise _Unsupported(expr)
        return float(expr.xreplace(widths))
    if isinstance(expr, (sp.OneMatrix, sp.ZeroMatrix, sp.Identity)):
        rows, cols = (int(sp.sympify(size).xreplace(widths)) for size in expr.shape)
        return np.ones((rows, cols)) if isinstance(expr, sp.OneMatrix) else np.zeros((rows, cols)) \
            if isinstance(expr, sp.ZeroMatrix) else np.eye(rows)
    if isinstance(expr, sp.MatPow) and not sp.sympify(expr.exp).is_Integer:
        raise _Unsupported(expr)
    values = [_numeric(a, arrays, widths) for a in expr.args]
    if isinstance(expr, sp.MatMul):
        return functools.reduce(lambda a, b: a @ b if np.ndim(a) == 2 and np.ndim(b) == 2 else a * b, values)
    rules: dict[type, Callable[..., Any]] = {
        sp.MatAdd: lambda *terms: functools.reduce(np.add, terms),
        sp.HadamardProduct: lambda *factors: functools.reduce(np.multiply, factors),
        sp.HadamardPower: np.power,
        sp.Transpose: np.transpose,
        sp.DiagMatrix: lambda v: np.diag(v.ravel()),
        sp.Inverse: lambda m, _exponent: np.linalg.inv(m),   # Inverse(Q) is MatPow(Q, -1)
        sp.MatPow: lambda base, exponent: np.linalg.matrix_power(base, int(exponent)),
        sp.Trace: lambda m: float(np.trace(m)),
    }
    if type(expr) not in rules:
        raise _Unsupported(expr)
    return rules[type(expr)](*values)


def evaluate_symbolic(expr: sp.Basic, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Evaluate ``expr`` at concrete matrices given by symbol name, from SymPy's meaning of its nodes (small checks).

    Vectors stand for columns; symbolic widths are read from the values' shapes. Matrix expressions are evaluated
    node by node in float64 NumPy (:func:`_numeric`: one NumPy operation per node, milliseconds where SymPy's explicit
    matrices of ``Float`` took a third of a second for a 16 × 16 layer); an expression with a node it has no rule for
    is evaluated by SymPy itself (``doit`` on explicit matrices, then ``evalf``).

    >>> W = sp.MatrixSymbol("W", 2, 2)
    >>> evaluate_symbolic(sp.HadamardPower(W, 2) * sp.OneMatrix(2, 1), {"W": np.array([[1.0, 2.0], [3.0, 4.0]])})
    array([[ 5.],
           [25.]])
    """
    arrays: dict[str, np.ndarray] = {}
    widths: dict[sp.Symbol, int] = {}
    for symbol in sp.sympify(expr).atoms(sp.MatrixSymbol):
        value = np.asarray(values[symbol.name], dtype=float)
        value = value[:, None] if value.ndim == 1 else value
        arrays[symbol.name] = value
        widths.update({size: actual for size, actual in zip(symbol.shape, value.shape) if sp.sympify(size).is_Symbol})
    try:
        return np.asarray(_numeric(sp.sympify(expr), arrays, widths), dtype=float)
    except _Unsupported:
        pass
    concrete = sp.sympify(expr).subs(widths)
    replacements = {s: sp.ImmutableMatrix(arrays[s.name].tolist()) for s in concrete.atoms(sp.MatrixSymbol)}
    result = _explicit_entrywise(concrete.xreplace(replacements)).doit()
    if isinstance(result, sp.MatrixExpr):
        result = result.as_explicit()
    if isinstance(result, sp.MatrixBase):
        return np.array(result.evalf(), dtype=float)
    return np.array(float(result))
