"""Running the user's model under second-order derivatives.

For ``F.scaled_dot_product_attention`` torch picks a fused kernel (flash attention on the CPU; flash,
memory-efficient or cuDNN on CUDA) whose backward has no derivative of its own and which has no forward-mode
rule: the gradient of teleportation's objective ``‖∇L‖²`` or a Hessian-vector product ``jvp(∇L, θ; v)``
through it fails (``derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not
implemented``). Inside :func:`differentiable_kernels` only the math kernel runs, ``softmax(Q Kᵀ/√d + mask) V``
in ATen ops, which has every derivative and agrees with the fused kernels to rounding.

>>> import torch, torch.nn.functional as F
>>> q = torch.randn(1, 1, 3, 2, requires_grad=True)
>>> with differentiable_kernels():
...     (g,) = torch.autograd.grad(F.scaled_dot_product_attention(q, q, q).sum(), q, create_graph=True)
...     (h,) = torch.autograd.grad(g.square().sum(), q)
>>> h.shape
torch.Size([1, 1, 3, 2])
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = ["differentiable_kernels"]


@contextmanager
def differentiable_kernels() -> Iterator[None]:
    """A context manager (or decorator) under which torch runs only kernels it can differentiate twice, forward
    mode included: the math kernel of ``scaled_dot_product_attention``. The previous choice comes back on exit.

    Wraps symalg's calls that run a model for second-order derivatives (teleportation, Hessian-vector products),
    never the user's own training.
    """
    with sdpa_kernel([SDPBackend.MATH]):
        yield
