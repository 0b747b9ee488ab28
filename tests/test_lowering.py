"""Lowering: SymalgTorchPrinter overrides (by printed string and by value), ``lower()`` and the lowered
activation functions of ``symalg.nn``.

In the style of SymPy's ``sympy/printing/tests/test_torch.py``: every override is checked once by its
printed source and once by value, against SymPy's exact evaluation (``evaluate_symbolic``) or numpy.
"""
import math

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sympy.printing.pytorch import TorchPrinter

import symalg
from symalg.lowering.codegen import LoweredFunction, SymalgTorchPrinter, evaluate_symbolic, lower, torch_source
from symalg.catalogue.modules import Activation, activation_function

x, y = sp.symbols("x y", real=True)
n, h, m = sp.symbols("n h m", integer=True, positive=True)
X = sp.MatrixSymbol("X", 3, 3)
Y = sp.MatrixSymbol("Y", 2, 3)
d = sp.MatrixSymbol("d", 3, 1)
W = sp.MatrixSymbol("W_1", h, n)
b = sp.MatrixSymbol("b_1", h, 1)
g = sp.MatrixSymbol("g_1", h, h)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _scalar_fn(expr, *symbols):
    """Evaluate the printed torch source of a scalar expression as ``lambda *symbols: ...``."""
    source = torch_source(expr)
    return eval(f"lambda {', '.join(map(str, symbols))}: {source}", {"torch": torch})


def _compare(expr, values, vector_inputs=(), atol=1e-10, **extra):
    """Lower ``expr`` reading every matrix symbol from ``params`` by name; compare with SymPy's exact value."""
    symbols = sorted(expr.atoms(sp.MatrixSymbol), key=lambda s: s.name)
    f = lower("f", expr, {s: s.name for s in symbols}, vector_inputs=vector_inputs, **extra)
    result = f({k: torch.as_tensor(v, dtype=torch.float64) for k, v in values.items()})
    expected = evaluate_symbolic(expr, values)
    assert tuple(result.shape) == expected.shape
    np.testing.assert_allclose(result.numpy(), expected, atol=atol, rtol=1e-10)
    return f


# -- printed strings -------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, source", [
    (sp.Max(x, 0), "torch.clamp(x, min=0)"),
    (sp.Min(x, 0), "torch.clamp(x, max=0)"),
    (sp.Max(x, y), "torch.maximum(x, y)"),
    (sp.Min(x, y), "torch.minimum(x, y)"),
    (sp.Max(x, sp.Rational(1, 2)), "torch.clamp(x, min=0.5)"),
    (sp.Min(x, -sp.Rational(3, 2)), "torch.clamp(x, max=-1.5)"),
    (sp.Max(x, y, 0), "torch.clamp(torch.maximum(x, y), min=0)"),
    (sp.Trace(X), "torch.diagonal(X, dim1=-2, dim2=-1).sum(-1)"),
    (sp.DiagMatrix(d) * X, "(d * X)"),
    (X * sp.DiagMatrix(d), "(X * d.transpose(-1, -2))"),
    (sp.DiagMatrix(d), "torch.diag_embed(d.squeeze(-1))"),
    (X * sp.OneMatrix(3, 1), "X.sum(-1, keepdim=True)"),
    (X.T * sp.OneMatrix(3, 1), "X.sum(-2, keepdim=True).transpose(-1, -2)"),
    (sp.HadamardPower(Y.T, 2) * sp.OneMatrix(2, 1), "(Y * Y).sum(-2, keepdim=True).transpose(-1, -2)"),
    (X.T * X * sp.OneMatrix(3, 1), "torch.matmul(X.transpose(-1, -2), X).sum(-1, keepdim=True)"),
    (sp.HadamardPower(X, 2), "(X * X)"),
    (sp.HadamardPower(X * X, 2), "torch.pow(torch.linalg.matrix_power(X, 2), 2)"),
    (sp.MatPow(X, 3), "torch.linalg.matrix_power(X, 3)"),
    (sp.OneMatrix(3, 2), "torch.ones(3, 2, **_like)"),
    (sp.ZeroMatrix(2, 3), "torch.zeros(2, 3, **_like)"),
    (sp.Identity(3), "torch.eye(3, **_like)"),
    (sp.OneMatrix(h, 1), "torch.ones(h, 1, **_like)"),
    (sp.Rational(1, 3) * X, "0.3333333333333333*X"),
    (sp.Rational(1, 2) * X * Y.T, "0.5*torch.matmul(X, Y.transpose(-1, -2))"),
])
def test_printed_source(expr, source):
    assert torch_source(expr) == source


def test_latex_symbol_names_print_as_python_identifiers():
    # symalg.lowering.codegen.identifier documents ``\dot{W}_{1}`` -> ``dot_W_1`` (velocity symbols).
    assert torch_source(sp.MatrixSymbol(r"\dot{W}_{1}", 2, 2)) == "dot_W_1"
    assert torch_source(sp.MatrixSymbol(r"\dot{b}_{2}", 2, 1)) == "dot_b_2"


@pytest.mark.parametrize("expr", [X.T, Y.T])
def test_transpose_of_a_symbol_prints_as_a_method_call(expr):
    # The module docstring of symalg.lowering documents ``W_1.transpose(-1, -2)`` for a bare symbol.
    assert torch_source(expr) == f"{expr.arg.name}.transpose(-1, -2)"


def test_printer_is_a_sympy_torch_printer_subclass():
    assert issubclass(SymalgTorchPrinter, TorchPrinter)


# -- Max / Min: elementwise, never a reduction ---------------------------------------------------
def test_sympy_printer_uses_torch_max_which_reduces_but_ours_is_elementwise():
    assert "torch.max(" in TorchPrinter().doprint(sp.Max(x, 0))
    t = torch.tensor([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]])
    # torch.max(t, 0) is a reduction over dim 0 returning (values, indices) ...
    assert tuple(torch.max(t, 0).values.shape) == (3,)
    # ... while the lowered Max(x, 0) keeps the shape and clamps elementwise.
    assert "torch.max(" not in torch_source(sp.Max(x, 0))
    result = _scalar_fn(sp.Max(x, 0), x)(t)
    assert result.shape == t.shape
    np.testing.assert_array_equal(result.numpy(), np.maximum(t.numpy(), 0))


@pytest.mark.parametrize("expr, reference", [
    (sp.Max(x, 0), lambda a, c: np.maximum(a, 0)),
    (sp.Min(x, 0), lambda a, c: np.minimum(a, 0)),
    (sp.Max(x, sp.Rational(1, 3)), lambda a, c: np.maximum(a, 1 / 3)),
    (sp.Min(x, -2), lambda a, c: np.minimum(a, -2)),
    (sp.Max(x, y), lambda a, c: np.maximum(a, c)),
    (sp.Min(x, y), lambda a, c: np.minimum(a, c)),
    (sp.Max(x, y, 0), lambda a, c: np.maximum(np.maximum(a, c), 0)),
    (sp.Min(x, y, 1), lambda a, c: np.minimum(np.minimum(a, c), 1)),
    (sp.Max(x, 0) + sp.Rational(1, 5) * sp.Min(x, 0), lambda a, c: np.where(a > 0, a, 0.2 * a)),
])
def test_max_min_by_value_elementwise(expr, reference):
    rng = _rng(1)
    a, c = rng.standard_normal((4, 5)) * 3, rng.standard_normal((4, 5)) * 3
    result = _scalar_fn(expr, x, y)(torch.tensor(a), torch.tensor(c))
    assert result.shape == (4, 5)
    np.testing.assert_allclose(result.numpy(), reference(a, c), rtol=1e-15, atol=0)


@settings(max_examples=40, deadline=None)
@given(st.fractions(min_value=-5, max_value=5, max_denominator=12), st.booleans(),
       st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=8))
def test_max_min_with_any_rational_constant(constant, is_max, values):
    c = sp.Rational(constant.numerator, constant.denominator)
    expr = sp.Max(x, c) if is_max else sp.Min(x, c)
    t = torch.tensor(values, dtype=torch.float64)
    expected = (np.maximum if is_max else np.minimum)(t.numpy(), float(c))
    np.testing.assert_array_equal(_scalar_fn(expr, x)(t).numpy(), expected)


def test_max_min_against_sympy_exact_values():
    f = _scalar_fn(sp.Max(x, sp.Rational(1, 2)) - sp.Min(y, -sp.Rational(1, 4)), x, y)
    for a, c in [(-3, 2), (0.25, -1), (7, -0.1), (0.5, -0.25)]:
        exact = (sp.Max(x, sp.Rational(1, 2)) - sp.Min(y, -sp.Rational(1, 4))).subs({x: sp.nsimplify(a),
                                                                                    y: sp.nsimplify(c)})
        assert float(f(torch.tensor(float(a)), torch.tensor(float(c)))) == pytest.approx(float(exact), abs=1e-15)


def test_irrational_constants_print_as_numbers():
    # sqrt(2) is a number: it must lower to a float, not to torch.sqrt of a Python int.
    t = torch.tensor([-1.0, 0.5, 3.0])
    np.testing.assert_allclose(_scalar_fn(sp.Max(x, sp.sqrt(2)), x)(t).numpy(), np.maximum(t.numpy(), math.sqrt(2)))
    np.testing.assert_allclose(_scalar_fn(sp.sqrt(2) / 2 * x, x)(t).numpy(), t.numpy() * math.sqrt(2) / 2)


# -- Transpose -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 3), (2, 5)])
def test_transpose_by_value(shape):
    A = sp.MatrixSymbol("A", *shape)
    value = _rng(2).standard_normal(shape)
    _compare(A.T, {"A": value})
    _compare(A * A.T, {"A": value})
    _compare(A.T * A, {"A": value})


def test_sympy_transpose_of_a_square_matrix_is_broken_but_ours_runs():
    # SymPy prints ``torch.transpose(X).t()``, which torch rejects (transpose needs dims).
    with pytest.raises(TypeError):
        eval(TorchPrinter().doprint(X.T), {"torch": torch, "X": torch.eye(3)})
    t = torch.arange(9.0).reshape(3, 3)
    assert torch.equal(eval(torch_source(X.T), {"torch": torch, "X": t}), t.T)


@pytest.mark.parametrize("shape", [(3, 3), (2, 5)])
def test_transpose_on_batched_inputs(shape):
    A = sp.MatrixSymbol("A", *shape)
    value = torch.as_tensor(_rng(3).standard_normal((4, 6, *shape)))
    f = lower("t", A.T, {A: "A"})
    result = f({"A": value})
    assert result.shape == (4, 6, shape[1], shape[0])
    for i in range(4):
        for j in range(6):
            np.testing.assert_array_equal(result[i, j].numpy(), evaluate_symbolic(A.T, {"A": value[i, j].numpy()}))


# -- Trace -----------------------------------------------------------------------------------------
def test_trace_by_value():
    _compare(sp.Trace(X), {"X": _rng(4).standard_normal((3, 3))})
    _compare(sp.Trace(W * W.T), {"W_1": _rng(4).standard_normal((4, 2))})


def test_trace_on_batches():
    value = torch.as_tensor(_rng(5).standard_normal((7, 3, 3)))
    f = lower("tr", sp.Trace(X), {X: "X"})
    result = f({"X": value})
    assert result.shape == (7,)
    np.testing.assert_allclose(result.numpy(), np.trace(value.numpy(), axis1=-2, axis2=-1), rtol=1e-13)
    # torch.trace (what SymPy prints) refuses a batch
    with pytest.raises(RuntimeError):
        torch.trace(value)


def test_matrix_slices_slice_the_last_two_axes_by_value_and_on_batches():
    """SymPy prints ``X[0:2, :]``, which on a batch slices the batch axis; ours slices the matrix axes."""
    expr = X[:2, :] + X[1:, :]
    assert torch_source(expr) == "((X)[..., 0:2, 0:3] + (X)[..., 1:3, 0:3])"
    _compare(expr, {"X": _rng(7).standard_normal((3, 3))})
    _compare(X[1:, 1:2], {"X": _rng(8).standard_normal((3, 3))})
    with pytest.raises(NotImplementedError, match="has a step"):   # SymPy's own shape of X[::2, :] is wrong
        torch_source(X[::2, :])
    value = torch.as_tensor(_rng(9).standard_normal((5, 3, 3)))
    result = lower("f", expr, {X: "X"})({"X": value})
    assert torch.equal(result, value[:, :2, :] + value[:, 1:, :])


# -- MatMul with DiagMatrix and with a column of ones ----------------------------------------------
def test_diag_on_the_left_and_right_by_value():
    rng = _rng(6)
    values = {"X": rng.standard_normal((3, 3)), "d": rng.standard_normal(3), "Y": rng.standard_normal((2, 3))}
    _compare(sp.DiagMatrix(d) * X, values, vector_inputs=[d])
    _compare(X * sp.DiagMatrix(d), values, vector_inputs=[d])
    _compare(Y * sp.DiagMatrix(d), values, vector_inputs=[d])
    _compare(sp.DiagMatrix(d) * Y.T, values, vector_inputs=[d])
    _compare(sp.DiagMatrix(d) * X * sp.DiagMatrix(d), values, vector_inputs=[d])
    _compare(Y * sp.DiagMatrix(d) * X, values, vector_inputs=[d])
    _compare(2 * sp.DiagMatrix(d) * X, values, vector_inputs=[d])
    _compare(sp.DiagMatrix(d), values, vector_inputs=[d])


def test_diag_product_is_not_a_dense_matmul():
    source = torch_source(sp.DiagMatrix(d) * X * sp.DiagMatrix(d))
    assert "matmul" not in source and "diag_embed" not in source


def test_diag_on_batched_inputs():
    rng = _rng(7)
    dv, wv = torch.as_tensor(rng.standard_normal((5, 4))), torch.as_tensor(rng.standard_normal((5, 4, 3)))
    f = lower("scale", {"left": sp.DiagMatrix(b) * W, "right": W.T * sp.DiagMatrix(b)}, {W: "w"},
              args=[b], vector_inputs=[b])
    out = f({"w": wv}, dv)
    assert out["left"].shape == (5, 4, 3) and out["right"].shape == (5, 3, 4)
    for i in range(5):
        D = np.diag(dv[i].numpy())
        np.testing.assert_allclose(out["left"][i].numpy(), D @ wv[i].numpy(), rtol=1e-13)
        np.testing.assert_allclose(out["right"][i].numpy(), wv[i].numpy().T @ D, rtol=1e-13)


def test_one_column_gives_row_sums():
    rng = _rng(8)
    value = rng.standard_normal((4, 3))
    f = _compare(W * sp.OneMatrix(n, 1), {"W_1": value})
    assert "matmul" not in f.source and ".sum(-1, keepdim=True)" in f.source
    _compare(sp.HadamardPower(W, 2) * sp.OneMatrix(n, 1), {"W_1": value})
    _compare(sp.HadamardPower(W.T, 2) * sp.OneMatrix(h, 1), {"W_1": value})
    _compare(W.T * sp.OneMatrix(h, 1), {"W_1": value})
    batched = torch.as_tensor(rng.standard_normal((6, 4, 3)))
    out = lower("rows", W * sp.OneMatrix(n, 1), {W: "w"})({"w": batched})
    np.testing.assert_allclose(out.numpy(), batched.numpy().sum(-1, keepdims=True), rtol=1e-13)
    columns = lower("columns", sp.HadamardPower(W.T, 2) * sp.OneMatrix(h, 1), {W: "w"})({"w": batched})
    np.testing.assert_allclose(columns.numpy(), (batched.numpy() ** 2).sum(-2)[..., None], rtol=1e-13)


# -- HadamardPower, MatPow, Rational ---------------------------------------------------------------
@pytest.mark.parametrize("exponent", [2, 3, sp.Rational(1, 2), -1])
def test_hadamard_power_by_value(exponent):
    value = np.abs(_rng(9).standard_normal((2, 3))) + 0.5
    _compare(sp.HadamardPower(Y, exponent), {"Y": value})


@pytest.mark.parametrize("exponent", [1, 2, 3, 5, -1, -2])
def test_matpow_by_value(exponent):
    value = _rng(10).standard_normal((3, 3)) + 3 * np.eye(3)
    _compare(sp.MatPow(X, exponent), {"X": value}, atol=1e-9)


def test_matpow_on_batches():
    value = torch.as_tensor(_rng(11).standard_normal((4, 3, 3)))
    out = lower("p", sp.MatPow(X, 3), {X: "X"})({"X": value})
    for i in range(4):
        np.testing.assert_allclose(out[i].numpy(), np.linalg.matrix_power(value[i].numpy(), 3), rtol=1e-12)


def test_rational_constants_by_value():
    value = _rng(12).standard_normal((3, 3))
    _compare(sp.Rational(1, 3) * X, {"X": value}, atol=1e-15)
    _compare(sp.Rational(-7, 2) * X + sp.Rational(2, 3) * sp.Identity(3), {"X": value}, atol=1e-15)
    _compare(sp.Rational(1, 3) * X * X.T, {"X": value}, atol=1e-14)
    # a float32 input stays float32 (the constant is a Python float, not a float64 tensor)
    out = lower("r", sp.Rational(1, 3) * X, {X: "X"})({"X": torch.ones(3, 3, dtype=torch.float32)})
    assert out.dtype == torch.float32
    assert torch.allclose(out, torch.full((3, 3), 1 / 3, dtype=torch.float32))


# -- constants follow the inputs' dtype and device -------------------------------------------------
CONSTANTS = [
    X + sp.Identity(3),
    X + sp.OneMatrix(3, 3),
    sp.OneMatrix(3, 3) * X,
    X * sp.OneMatrix(3, 1),
    sp.ZeroMatrix(3, 3),
    sp.Identity(3),
    sp.DiagMatrix(d) + X,
]


@pytest.mark.parametrize("expr", CONSTANTS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constants_follow_dtype(expr, dtype):
    f = lower("c", expr, {X: "X", d: "d"}, vector_inputs=[d])
    out = f({"X": torch.ones(3, 3, dtype=dtype), "d": torch.ones(3, dtype=dtype)})
    assert out.dtype == dtype


@pytest.mark.parametrize("expr", CONSTANTS, ids=str)
def test_constants_follow_device(expr):
    f = lower("c", expr, {X: "X", d: "d"}, vector_inputs=[d])
    out = f({"X": torch.empty(3, 3, device="meta"), "d": torch.empty(3, device="meta")})
    assert out.device.type == "meta"


def test_constants_by_value():
    value = _rng(13).standard_normal((3, 3))
    _compare(X + sp.Identity(3), {"X": value})
    _compare(X + sp.OneMatrix(3, 3), {"X": value})
    _compare(sp.OneMatrix(3, 3) * X, {"X": value})


def test_sympy_constants_ignore_dtype_but_ours_do_not():
    f = lower("i", X + sp.Identity(3), {X: "X"})
    assert "**_like" in f.source
    assert f({"X": torch.zeros(3, 3, dtype=torch.float32)}).dtype == torch.float32


# -- lower(): the generated function -------------------------------------------------------------
def _action():
    return lower("act", {"0.weight": g * W, "0.bias": g * b}, {W: "0.weight", b: "0.bias"}, args=[g],
                 vector_outputs=["0.bias"], vector_inputs=[b])


def test_generated_source_is_inspectable():
    f = _action()
    assert isinstance(f, LoweredFunction)
    assert f.name == "act" and f.arg_names == ("g_1",)
    lines = f.source.splitlines()
    assert lines[0] == "def act(params, g_1):"
    assert "    W_1 = params['0.weight']" in lines
    assert "    b_1 = params['0.bias'].unsqueeze(-1)" in lines
    assert not any(" = W_1.shape" in line for line in lines)   # no width is read: the code uses none
    assert not any("_like" in line for line in lines)  # no constant matrix: no dtype/device reference
    assert "        '0.weight': torch.matmul(g_1, W_1)," in lines
    assert "        '0.bias': torch.matmul(g_1, b_1).squeeze(-1)," in lines
    # it opens with the shape guard: one lookup of the shapes of the parameters read
    assert lines[2] == "        _known = (params['0.weight'].shape, params['0.bias'].shape) in _accepted"
    # the source is the code that runs: recompiling it (with torch and the guard's objects) gives the same function
    namespace = {name: f.fn.__globals__[name] for name in ("torch", "_accepted", "_check_params")}
    exec(f.source, namespace)
    params = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4)}
    G = torch.randn(4, 4)
    assert torch.equal(namespace["act"](params, G)["0.weight"], f(params, G)["0.weight"])


def test_single_expression_returns_a_tensor():
    f = lower("gram", W * W.T, {W: "0.weight"})
    assert f.source.splitlines()[-1] == "    return torch.matmul(W_1, W_1.transpose(-1, -2))"
    assert f({"0.weight": torch.ones(3, 2)}).shape == (3, 3)


@pytest.mark.parametrize("rows, cols", [(4, 3), (2, 6), (1, 1)])
def test_symbolic_widths_bound_from_shapes(rows, cols):
    f = lower("widths", {"ones": W * sp.OneMatrix(n, 1), "eye": sp.Identity(h) + W * W.T,
                         "scaled": h * W}, {W: "w"})
    value = torch.as_tensor(_rng(14).standard_normal((rows, cols)))
    out = f({"w": value})
    assert out["ones"].shape == (rows, 1)
    np.testing.assert_allclose(out["eye"].numpy(), np.eye(rows) + value.numpy() @ value.numpy().T, rtol=1e-13)
    np.testing.assert_allclose(out["scaled"].numpy(), rows * value.numpy(), rtol=1e-15)


def test_vector_inputs_and_outputs():
    f = _action()
    w, bias, G = torch.randn(4, 3), torch.randn(4), torch.randn(4, 4)
    out = f({"0.weight": w, "0.bias": bias}, G)
    assert out["0.bias"].shape == (4,) and out["0.weight"].shape == (4, 3)
    torch.testing.assert_close(out["0.bias"], G @ bias)
    torch.testing.assert_close(out["0.weight"], G @ w)
    exact = evaluate_symbolic(g * b, {"g_1": G.numpy(), "b_1": bias.numpy()})
    np.testing.assert_allclose(out["0.bias"].numpy(), exact[:, 0], rtol=1e-12, atol=1e-14)


def test_vector_args_are_unsqueezed():
    f = lower("shift", b + sp.DiagMatrix(b) * b, {}, args=[b], vector_inputs=[b])
    assert "    b_1 = b_1.unsqueeze(-1)" in f.source.splitlines()
    out = f({}, torch.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(out.numpy()[:, 0], [2.0, 6.0, 12.0])


def test_batched_arguments_with_leading_dims():
    f = _action()
    w, bias = torch.randn(4, 3), torch.randn(4)
    G = torch.randn(2, 5, 4, 4)
    out = f({"0.weight": w, "0.bias": bias}, G)
    assert out["0.weight"].shape == (2, 5, 4, 3) and out["0.bias"].shape == (2, 5, 4)
    for i in range(2):
        for j in range(5):
            torch.testing.assert_close(out["0.weight"][i, j], G[i, j] @ w)
            torch.testing.assert_close(out["0.bias"][i, j], G[i, j] @ bias)


def test_batched_params_with_leading_dims():
    f = lower("q", {"value": sp.HadamardPower(W, 2) * sp.OneMatrix(n, 1) + sp.HadamardPower(b, 2)},
              {W: "w", b: "b"}, vector_outputs=["value"], vector_inputs=[b])
    w, bias = torch.randn(3, 4, 2), torch.randn(3, 4)
    out = f({"w": w, "b": bias})["value"]
    assert out.shape == (3, 4)
    torch.testing.assert_close(out, (w ** 2).sum(-1) + bias ** 2)


def test_stray_matrix_symbol_is_an_error():
    V = sp.MatrixSymbol("V", h, h)
    with pytest.raises(ValueError, match=r"lower\(bad\).*\['V'\]"):
        lower("bad", g * V, {W: "0.weight"}, args=[g])


def test_stray_scalar_symbol_is_an_error_at_lowering_time():
    # A scalar symbol that is neither a width read off a shape nor anything else must be reported
    # by lower() itself, not surface as a NameError when the function is first called.
    with pytest.raises(ValueError, match="x"):
        lower("bad", x * W, {W: "0.weight"})


def test_wrong_number_of_args():
    f = _action()
    params = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4)}
    with pytest.raises(TypeError, match=r"act takes params and 1 more arguments \['g_1'\], got 0"):
        f(params)
    with pytest.raises(TypeError, match="got 2"):
        f(params, torch.eye(4), torch.eye(4))


def test_evaluate_symbolic_reads_widths_and_columns():
    value, bias = _rng(15).standard_normal((3, 2)), _rng(16).standard_normal(3)
    result = evaluate_symbolic(W * W.T + b * b.T, {"W_1": value, "b_1": bias})
    np.testing.assert_allclose(result, value @ value.T + np.outer(bias, bias), rtol=1e-13)
    assert evaluate_symbolic(sp.Trace(W.T * W), {"W_1": value}).shape == ()


# -- lowered activation functions ------------------------------------------------------------------
def _inputs(shape=(64,)):
    gen = torch.Generator().manual_seed(0)
    random = torch.randn(shape, generator=gen, dtype=torch.float64)
    special = torch.tensor([0.0, -0.0, 1e-300, -1e-300, 1e-8, -1e-8, 1.0, -1.0, 19.9, 20.0, 20.1, -20.0,
                            30.0, -30.0, 40.0, -40.0, 700.0, -700.0, 800.0, -800.0, 1e4, -1e4, 1e8, -1e8,
                            1e150, -1e150, 1e300, -1e300], dtype=torch.float64)
    return torch.cat([random, random * 10, random * 1e3, random * 1e6, special])


TORCH_REFERENCE = [
    ("relu", {}, torch.relu),
    ("leaky_relu", {}, lambda z: F.leaky_relu(z)),  # both default to 0.01
    ("leaky_relu", {"slope": 0.2}, lambda z: F.leaky_relu(z, negative_slope=0.2)),
    ("leaky_relu", {"slope": 0.3}, lambda z: F.leaky_relu(z, negative_slope=0.3)),
    ("leaky_relu", {"slope": 0.05}, lambda z: F.leaky_relu(z, negative_slope=0.05)),
    ("tanh", {}, torch.tanh),
    ("sigmoid", {}, torch.sigmoid),
    ("gelu", {}, F.gelu),
    ("silu", {}, F.silu),
    ("softplus", {}, F.softplus),
    ("identity", {}, lambda z: z),
    ("relu_pow", {}, lambda z: torch.relu(z) ** 2),
    ("relu_pow", {"alpha": 3}, lambda z: torch.relu(z) ** 3),
]


@pytest.mark.parametrize("op, params, reference", TORCH_REFERENCE,
                         ids=[f"{op}{params or ''}" for op, params, _ in TORCH_REFERENCE])
def test_activation_matches_torch(op, params, reference):
    fn, source = activation_function(op, params)
    assert source.startswith(f"def {op}(z):")
    z = _inputs()
    if op == "relu_pow":  # keep the powers finite
        z = z[z.abs() < 1e100]
    torch.testing.assert_close(fn(z), reference(z), rtol=1e-14, atol=0)
    # acts elementwise on any shape, and the module form agrees
    z2 = z[:60].reshape(3, 4, 5)
    torch.testing.assert_close(fn(z2), reference(z2), rtol=1e-14, atol=0)
    torch.testing.assert_close(Activation(op, **params)(z2), reference(z2), rtol=1e-14, atol=0)


@pytest.mark.parametrize("slope", [0.01, 0.2, 0.5, 1 / 3])
def test_leaky_relu_from_torch_module_matches_torch(slope):
    module = torch.nn.LeakyReLU(negative_slope=slope)
    arch = symalg.parse(torch.nn.Sequential(torch.nn.Linear(2, 3), module, torch.nn.Linear(3, 1)))
    fn, _ = activation_function("leaky_relu", arch.node("1")["params"])
    z = _inputs()
    torch.testing.assert_close(fn(z), module(z), rtol=1e-14, atol=0)


def test_leaky_relu_with_the_slope_one_over_sqrt2():
    # torch's negative_slope is any float; nsimplify turns 0.7071067811865476 into sqrt(2)/2, which
    # must still lower to a working function.
    slope = 0.7071067811865476
    fn, _ = activation_function("leaky_relu", {"slope": slope})
    z = _inputs()
    torch.testing.assert_close(fn(z), F.leaky_relu(z, negative_slope=slope), rtol=1e-14, atol=0)


def test_gelu_is_the_exact_erf_form_not_the_tanh_approximation():
    z = _inputs()
    assert not torch.allclose(activation_function("gelu")[0](z), F.gelu(z, approximate="tanh"), rtol=1e-12, atol=0)


def _radial_reference(z):
    norm = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    return z / torch.sqrt(1 + norm ** 2)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 10.0, 1e3, 1e6])
def test_radial_matches_its_formula(scale):
    fn, source = activation_function("radial")
    assert "vector_norm(z / _scale, dim=-1, keepdim=True)" in source
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(50, 4, generator=gen, dtype=torch.float64) * scale
    out = fn(z)
    torch.testing.assert_close(out, _radial_reference(z), rtol=1e-13, atol=0)
    assert torch.all(torch.linalg.vector_norm(out, dim=-1) < 1)
    # it acts on the last axis only: a batch of batches gives the same rows
    torch.testing.assert_close(fn(z.reshape(5, 10, 4)), out.reshape(5, 10, 4), rtol=1e-15, atol=0)


def test_radial_value_and_orthogonal_equivariance():
    fn, _ = activation_function("radial")
    z = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(fn(z), z / math.sqrt(26))
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    zz = torch.randn(10, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(fn(zz @ q.T), fn(zz) @ q.T)


def test_radial_large_magnitude_does_not_overflow_to_zero():
    # z / sqrt(1 + |z|^2) -> z / |z| for large |z|: the output has norm close to 1, not 0.
    fn, _ = activation_function("radial")
    z = torch.tensor([[3e200, 4e200], [-1e180, 0.0]], dtype=torch.float64)
    expected = torch.tensor([[0.6, 0.8], [-1.0, 0.0]], dtype=torch.float64)  # z / |z| to double precision
    torch.testing.assert_close(fn(z), expected, rtol=1e-13, atol=0)


def test_unknown_activation_function():
    with pytest.raises(KeyError, match="swish"):
        activation_function("swish")


# -- the oracle: evaluate_symbolic against SymPy's exact arithmetic --------------------------------------
_h = sp.Symbol("h", integer=True, positive=True)
_W, _b, _V, _Q = (sp.MatrixSymbol("W", _h, 3), sp.MatrixSymbol("b", _h, 1), sp.MatrixSymbol("V", 2, _h),
                  sp.MatrixSymbol("Q", _h, _h))


@pytest.mark.parametrize("expr", [
    sp.HadamardPower(_b, 2) + sp.HadamardPower(_W, 2) * sp.OneMatrix(3, 1)
    - sp.HadamardPower(_V.T, 2) * sp.OneMatrix(2, 1),
    _b * _b.T + _W * _W.T - sp.Rational(3, 2) * _V.T * _V,
    sp.Inverse(_Q) * _Q.T - 2 * _Q ** 2 + _Q ** -1,
    sp.DiagMatrix(_b) * _W + sp.HadamardProduct(_W, _W) - sp.Identity(_h) * _W,
    sp.OneMatrix(1, _h) * _W * sp.Trace(_Q) + _h * sp.OneMatrix(1, 3),
    sp.Adjoint(_Q) + sp.sqrt(2) * _Q,   # Adjoint has no NumPy rule: SymPy evaluates it
], ids=["diagonal-q", "gram-C", "inverse-and-powers", "diag-hadamard-identity", "ones-trace-width", "sympy-fallback"])
def test_evaluate_symbolic_equals_sympy_exact_arithmetic_on_rational_matrices(expr):
    rng = _rng(21)
    shapes = {"W": (4, 3), "b": (4,), "V": (2, 4), "Q": (4, 4)}
    values = {k: np.round(rng.standard_normal(s) * 8) / 8 + (4 * np.eye(4) if k == "Q" else 0)
              for k, s in shapes.items()}
    exact = {k: sp.ImmutableMatrix([[sp.Rational(str(x)) for x in row] for row in (v[:, None] if v.ndim == 1 else v)])
             for k, v in values.items()}   # eighths: exact in binary and in SymPy
    reference = expr.subs(_h, 4)
    reference = reference.xreplace({s: exact[s.name] for s in reference.atoms(sp.MatrixSymbol)}).doit()
    reference = np.array(reference.as_explicit() if isinstance(reference, sp.MatrixExpr) else reference, dtype=float)
    np.testing.assert_allclose(evaluate_symbolic(expr, values), reference, rtol=1e-13, atol=1e-13)


def test_a_width_is_read_only_where_the_printed_code_uses_it():
    f = lower("ones", W * sp.OneMatrix(n, n), {W: "W"})
    assert "    n = W_1.shape[-1]" in f.source.splitlines() and "h = " not in f.source
    assert torch.equal(f({"W": torch.ones(4, 3)}), torch.full((4, 3), 3.0))


def test_per_unit_columns_are_computed_as_vectors():
    """q = b∘b + (W∘W)1 − (Vᵀ∘Vᵀ)1 prints with no unsqueeze, keepdim or transpose, and is returned as (..., h)."""
    V = sp.MatrixSymbol("V", 2, h)
    q = sp.HadamardPower(b, 2) + sp.HadamardPower(W, 2) * sp.OneMatrix(n, 1) \
        - sp.HadamardPower(V.T, 2) * sp.OneMatrix(2, 1)
    f = lower("q", {"q": q}, {W: "W", b: "b", V: "V"}, vector_outputs=["q"], vector_inputs=[b])
    assert not any(view in f.source for view in ("unsqueeze", "keepdim", "transpose", "squeeze"))
    # three torch calls fewer than the formula as written: the squares' row and column sums as dot products, the
    # bias square fused into the sum
    assert "torch.addcmul((torch.linalg.vecdot(W_1, W_1) - torch.linalg.vecdot(V, V, dim=-2)), b_1, b_1)" in f.source
    values = {"W": torch.randn(5, 4, 3), "b": torch.randn(5, 4), "V": torch.randn(5, 2, 4)}
    expected = values["b"] ** 2 + (values["W"] ** 2).sum(-1) - (values["V"] ** 2).sum(-2)
    torch.testing.assert_close(f(values)["q"], expected)
    as_column = lower("q", {"q": q}, {W: "W", b: "b", V: "V"}, vector_inputs=[b])
    assert as_column.source.count("unsqueeze") == 1
    torch.testing.assert_close(as_column(values)["q"], expected.unsqueeze(-1))


def test_fused_sums_keep_signs_coefficients_and_gradients():
    """``c b∘b`` terms fold into ``torch.addcmul(..., value=c)``, a product ``b∘d`` too; a sum of squares only keeps
    one term outside; values and gradients are those of the formula."""
    d = sp.MatrixSymbol("d", h, 1)
    cases = {"minus": -sp.HadamardPower(b, 2) + sp.HadamardPower(W, 2) * sp.OneMatrix(n, 1),
             "scaled": sp.Rational(1, 2) * sp.HadamardPower(b, 2) + sp.HadamardProduct(b, d) - 3 * d,
             "squares": sp.HadamardPower(b, 2) - sp.HadamardPower(d, 2)}
    f = lower("fused", cases, {W: "W", b: "b", d: "d"}, vector_outputs=list(cases), vector_inputs=[b, d])
    assert "value=-1" in f.source and "value=0.5" in f.source and f.source.count("torch.addcmul") == 4
    values = {"W": torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True),
              "b": torch.randn(2, 4, dtype=torch.float64, requires_grad=True),
              "d": torch.randn(4, dtype=torch.float64, requires_grad=True)}
    W_, b_, d_ = values["W"], values["b"], values["d"]
    expected = {"minus": (W_ ** 2).sum(-1) - b_ ** 2, "scaled": b_ ** 2 / 2 + b_ * d_ - 3 * d_,
                "squares": b_ ** 2 - d_ ** 2}
    out = f(values)
    for key, value in expected.items():
        torch.testing.assert_close(out[key], value, rtol=1e-14, atol=1e-14)
        grads = torch.autograd.grad(out[key].sum(), [W_, b_, d_], allow_unused=True, materialize_grads=True)
        wanted = torch.autograd.grad(value.sum(), [W_, b_, d_], allow_unused=True, materialize_grads=True)
        for got, want in zip(grads, wanted):
            torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)


def test_the_shape_guard_checks_every_new_shape_after_the_first_call():
    """A call with shapes already checked skips the check; any other shape is checked again, so a broadcastable
    wrong bias after a good call is still refused by name, and a batch of parameters is accepted."""
    b4, V = sp.MatrixSymbol("b", 4, 1), sp.MatrixSymbol("V", 2, 4)
    f = lower("q", {"q": sp.HadamardPower(b4, 2) - sp.HadamardPower(V.T, 2) * sp.OneMatrix(2, 1)},
              {b4: "b", V: "V"}, vector_outputs=["q"], vector_inputs=[b4])
    good = {"b": torch.randn(4), "V": torch.randn(2, 4)}
    f(good)
    assert f._accepted == {(torch.Size([4]), torch.Size([2, 4]))}
    with pytest.raises(ValueError, match=r"q: parameter 'b' has shape \(1,\), expected \(\.\.\., 4\)"):
        f({**good, "b": torch.randn(1)})
    with pytest.raises(KeyError, match=r"parameter\(s\) \['V'\] missing"):
        f({"b": good["b"]})
    assert f({"b": torch.randn(3, 4), "V": torch.randn(3, 2, 4)})["q"].shape == (3, 4)
    assert len(f._accepted) == 2


def test_a_column_that_needs_a_matrix_product_stays_a_column():
    f = lower("Wb", {"Wb": W.T * b}, {W: "W", b: "b"}, vector_outputs=["Wb"], vector_inputs=[b])
    assert "params['b'].unsqueeze(-1)" in f.source
    values = {"W": torch.randn(4, 3), "b": torch.randn(4)}
    torch.testing.assert_close(f(values)["Wb"], values["W"].T @ values["b"])
