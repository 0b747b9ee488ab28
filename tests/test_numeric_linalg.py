"""The one relative error and the one code generator."""
from __future__ import annotations

import pytest
import torch

from symalg.lowering.codegen import compile_function
from symalg.numeric.linalg import (relative_error, smallest_singular_value_bound, spectral_norm_bound,
                                  triangular_inverse)


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


# ---------------------------------------------------------------------------------------------
# certified bounds on singular values (the QR certificate of symalg.numeric.orbit_rank)
# ---------------------------------------------------------------------------------------------
def upper_triangular(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).R


@pytest.mark.parametrize("n, leaf", [(1, 256), (7, 2), (600, 64), (257, 256)])
def test_triangular_inverse_is_the_inverse(n, leaf):
    R = upper_triangular(n)
    X = triangular_inverse(R, leaf)
    eye = torch.eye(n, dtype=torch.float64)
    assert torch.equal(X, X.triu())                                       # upper triangular, like R
    assert (R @ X - eye).abs().max() < 1e-10 and (X @ R - eye).abs().max() < 1e-10
    with pytest.raises(ValueError, match="must be a square matrix"):
        triangular_inverse(R[:, :-1] if n > 1 else torch.zeros(2, 1))


@pytest.mark.parametrize("n", [5, 300, 700])
def test_smallest_singular_value_bound_is_below_the_exact_value_and_within_root_n(n):
    R = upper_triangular(n, seed=n)
    exact = torch.linalg.svdvals(R)[-1].item()
    bound = smallest_singular_value_bound(R, leaf=64)
    assert exact / n ** 0.5 <= bound <= exact
    assert bound > exact / 2                                     # random R: ‖R⁻¹‖_F ≈ ‖R⁻¹‖₂ (few small values)


def test_smallest_singular_value_bound_is_zero_when_it_cannot_certify():
    R = upper_triangular(50)
    singular = R.clone()
    singular[20, 20] = 0.0
    assert smallest_singular_value_bound(singular) == 0.0                # a zero eigenvalue on the diagonal
    assert smallest_singular_value_bound(R, floor=float(R.diagonal().abs().min())) == 0.0   # not above the floor
    # all diagonal entries 1, every entry above it -1: σ_min ≈ 2^(2-n), invisible on the diagonal; the inverse
    # (entries 2^(j-i-1)) overflows at n = 1100 and the bound is 0, not a false certificate
    for n in (60, 1100):
        T = torch.eye(n, dtype=torch.float64) - torch.ones(n, n, dtype=torch.float64).triu(1)
        bound = smallest_singular_value_bound(T)
        assert bound <= 2.0 ** (3 - n)


def test_spectral_norm_bound_is_an_upper_bound():
    g = torch.Generator().manual_seed(2)
    for shape in ((3, 3), (40, 7), (7, 40)):
        A = torch.randn(*shape, generator=g, dtype=torch.float64)
        exact = torch.linalg.matrix_norm(A, ord=2).item()
        assert exact <= spectral_norm_bound(A) * (1 + 1e-12) <= exact * min(shape) ** 0.5 * (1 + 1e-12)
