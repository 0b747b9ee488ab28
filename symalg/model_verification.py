"""Numerical verification of a :class:`~symalg.model_derive.ModelAnalysis` on the model itself.

The traced model is run with ``torch.func.functional_call`` on moved parameters and buffers, so every
check is on the real ``forward``, not on a re-implementation. Checks per symmetry (results, never
assertions):

``invariance``
    output and loss unchanged under ``exp(10⁻³ M)``, ``exp(M)`` (``‖M‖ ≈ 0.5``) and every discrete
    generator. For ``cross_entropy`` the compared output is ``softmax(logits)``.
``gradient_orthogonality``
    ``⟨∇L, M·θ⟩ = 0`` for every Lie-algebra basis element (at most ``max_generators``, then random
    combinations), relative to ``‖∇L‖ ‖M·θ‖``; skipped for actions that move buffers.
``gd_drift``
    one gradient-descent step ``θ' = θ − η∇L`` changes each quadratic quantity by exactly
    ``η² C(∇L)`` and leaves each linear one unchanged.

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
>>> analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),)))
>>> verify_model(analysis).passed
True
"""
from __future__ import annotations

import copy

import torch
from torch.func import functional_call

from .graph import SpecError
from .groups import Translations
from .verification import TOLERANCES, CheckResult, VerificationReport, check_device

__all__ = ["verify_model"]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _inputs(analysis, inputs, dtype, device) -> tuple:
    inputs = inputs if inputs is not None else analysis.model_graph.example_inputs
    if inputs is None:
        raise SpecError("verify: the model was traced without example_inputs; pass inputs=(tensor, ...)")
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return tuple(x.to(device=device, dtype=dtype) if torch.is_floating_point(x) else x.to(device) for x in inputs)


def _first_tensor(output):
    while isinstance(output, (tuple, list)):
        output = output[0]
    return output


def verify_model(analysis, inputs: tuple | None = None, device: str = "cpu", dtype=torch.float64, seed: int = 0,
                 max_generators: int = 64, learning_rate: float = 0.1) -> VerificationReport:
    """Check every symmetry of ``analysis`` on its model at random parameters (see the module docstring).

    ``inputs`` default to the example inputs the model was traced with; the parameters are the
    model's own (cast to ``dtype``/``device`` on a copy).
    """
    check_device(device)
    tol = TOLERANCES[dtype]
    generator = torch.Generator().manual_seed(seed)
    model = copy.deepcopy(analysis.model_graph.model).to(device=device, dtype=dtype)
    state = {**{k: v.detach() for k, v in model.named_parameters()},
             **{k: v.detach() for k, v in model.named_buffers()}}
    parameter_names = [k for k, _ in model.named_parameters()]
    x = _inputs(analysis, inputs, dtype, device)
    cross_entropy = analysis.loss == "cross_entropy"

    def forward(values):
        values = {k: v.clone() if k not in parameter_names else v for k, v in values.items()}  # running stats
        return _first_tensor(functional_call(model, values, x))

    reference = forward(state)
    if cross_entropy:
        classes = torch.randint(reference.shape[-1], reference.shape[:-1], generator=generator).to(device)
    else:
        target = torch.randn(reference.shape, generator=generator, dtype=dtype).to(device)

    def loss_of(output):
        if cross_entropy:
            return torch.nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), classes.reshape(-1))
        return ((output - target) ** 2).mean()

    def observed(output):
        return output.softmax(-1) if cross_entropy else output

    def loss(values):
        return loss_of(forward(values))

    params = {k: state[k].clone().requires_grad_(True) for k in parameter_names}
    value = loss({**state, **params})
    grads = dict(zip(parameter_names, torch.autograd.grad(value, list(params.values()))))
    checks = []
    for symmetry in analysis.symmetries:
        checks.append(_invariance(symmetry, state, forward, loss_of, observed, generator, dtype, device, tol))
        if symmetry.group.is_continuous and not symmetry.acts_on_buffers:
            checks.append(_orthogonality(symmetry, state, grads, generator, dtype, device, tol, max_generators))
        if symmetry.conserved is not None:
            checks.append(_drift(symmetry, state, grads, learning_rate, tol))
    return VerificationReport(tuple(checks), dtype, device)


def _elements(symmetry, generator, dtype, device):
    group = symmetry.group
    elements = []
    if group.is_continuous:
        for scale in (1e-3, 0.5):
            M = group.random_algebra_element(scale, generator, dtype, device)
            elements.append((f"exp(M), |M|={scale}", group.exp(M)))
    elements += [(f"discrete generator {i}", g) for i, g in enumerate(group.discrete_generators(dtype, device))]
    return elements


def _invariance(symmetry, state, forward, loss_of, observed, generator, dtype, device, tol) -> CheckResult:
    with torch.no_grad():
        output = forward(state)
        base_loss = loss_of(output)
        worst, detail = 0.0, ""
        for description, g in _elements(symmetry, generator, dtype, device):
            moved = forward(symmetry.apply(state, g))
            error = max(_relative(observed(moved), observed(output)), _relative(loss_of(moved), base_loss))
            if not error <= worst:
                worst, detail = error, description
    return CheckResult("invariance", symmetry.label, worst, tol, detail)


def _orthogonality(symmetry, state, grads, generator, dtype, device, tol, max_generators) -> CheckResult:
    basis = symmetry.group.algebra_basis(dtype, device)
    if basis.shape[0] > max_generators:
        coefficients = torch.randn(max_generators, basis.shape[0], generator=generator, dtype=dtype).to(device)
        basis = torch.tensordot(coefficients, basis, dims=1)
    gradient_norm = torch.sqrt(sum((g ** 2).sum() for g in grads.values()))
    worst = 0.0
    for M in basis:
        tangent = symmetry.tangent(state, M)
        inner = sum((grads[k] * v).sum() for k, v in tangent.items() if k in grads)
        norm = torch.sqrt(sum((v ** 2).sum() for v in tangent.values()))
        if norm > 0:
            worst = max(worst, (inner.abs() / (gradient_norm * norm).clamp_min(1e-30)).item())
    return CheckResult("gradient_orthogonality", symmetry.label, worst, tol, f"{basis.shape[0]} generators")


def _drift(symmetry, state, grads, learning_rate, tol) -> CheckResult:
    quantity = symmetry.conserved
    stepped = {**state, **{k: state[k] - learning_rate * g for k, g in grads.items()}}
    before, after = quantity(state), quantity(stepped)
    worst = 0.0
    for key in before:
        if quantity.kind == "linear" or isinstance(symmetry.group, Translations):
            predicted = before[key]
        else:
            predicted = before[key] + learning_rate ** 2 * quantity({**state, **grads})[key]
        worst = max(worst, _relative(after[key], predicted) if predicted.abs().max() > 0 else
                    (after[key] - predicted).abs().max().item())
    return CheckResult("gd_drift", symmetry.label, worst, tol, f"{quantity.kind} quantity {quantity.name}")
