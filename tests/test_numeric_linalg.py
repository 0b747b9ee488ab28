"""The one relative error and the one code generator."""
from __future__ import annotations

import pytest
import torch

from symalg.lowering.codegen import compile_function
from symalg.numeric.linalg import relative_error


def test_relative_error_is_the_largest_change_over_the_largest_entry():
    a, b = torch.tensor([1.0, -4.0]), torch.tensor([1.5, -4.0])
    assert relative_error(a, b) == pytest.approx(0.5 / 4.0)
    assert relative_error(a, b) == relative_error(b, a)


def test_relative_error_of_zero_tensors_and_of_a_change_of_zero():
    zero = torch.zeros(3, dtype=torch.float64)
    assert relative_error(zero, zero) == 0.0
    assert relative_error(zero + 1e-300, zero) == pytest.approx(1.0)
    assert relative_error(torch.zeros(0), torch.zeros(0)) == 0.0


def test_a_floor_makes_small_errors_absolute():
    a, b = torch.tensor([1e-3]), torch.tensor([2e-3])
    assert relative_error(a, b) == pytest.approx(0.5)
    assert relative_error(a, b, floor=1.0) == pytest.approx(1e-3)


def test_relative_error_over_axes_gives_one_error_per_remaining_index():
    a = torch.tensor([[3.0, 4.0], [1.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    rows = relative_error(a, b, dim=-1)
    assert rows.tolist() == [1.0, 0.0]
    draws = relative_error(a[None].expand(2, 2, 2), b[None].expand(2, 2, 2), dim=(-2, -1))
    assert draws.shape == (2,) and torch.allclose(draws, torch.full((2,), 5.0 / 26.0 ** 0.5, dtype=torch.float64))


def test_relative_error_refuses_shapes_that_do_not_broadcast_and_non_tensors():
    with pytest.raises(ValueError, match="do not broadcast"):
        relative_error(torch.zeros(2), torch.zeros(3))
    with pytest.raises(TypeError, match="tensors"):
        relative_error([1.0], torch.zeros(1))


def test_compile_function_compiles_generated_source_with_only_torch_in_scope():
    f = compile_function("norm2", "def norm2(x):\n    return torch.linalg.vector_norm(x)")
    assert f(torch.tensor([3.0, 4.0])).item() == 5.0
    leak = compile_function("peek", "def peek():\n    return sorted(k for k in globals() if not k.startswith('__'))")
    assert leak() == ["peek", "torch"]


def test_compile_function_refuses_a_name_that_is_no_identifier_or_not_defined():
    with pytest.raises(ValueError, match="identifier"):
        compile_function("not a name", "x = 1")
    with pytest.raises(ValueError, match="does not define a function 'g'"):
        compile_function("g", "def f():\n    return 1")
