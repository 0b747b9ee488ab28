"""Numerical verification of a :class:`~symalg.symbolic.derive.Analysis` on the model itself.

The traced model is run with ``torch.func.functional_call`` on moved parameters and buffers, so every
check is on the real ``forward``, not on a re-implementation. Checks per symmetry (results, never
assertions):

``invariance``
    every output (tuples, dicts, dataclasses, Hugging-Face-style output objects:
    :func:`~symalg.frontend.outputs.output_tensors`) and the loss unchanged under the elements of
    :func:`~symalg.verification.certification.sample_elements` (``exp(10⁻³ M)``, ``exp(M)`` with ``‖M‖ = 1``, every
    discrete generator, the other component of ``GL``/``O``). For ``cross_entropy`` the first output is
    compared as ``softmax(logits)``. The claims are tested composed (a composition of symmetries is a symmetry):
    ``4⌈log₄ n⌉`` forward passes per test element for ``n`` claims, in sets that separate every two claims, with
    a failing set halved until its failing claims stand alone (:func:`_invariance`), so the cost is linear in the
    claims and the depth up to that logarithm.
``gradient_orthogonality``
    ``⟨∇L, M·θ⟩ = 0`` for every Lie-algebra basis element (at most ``max_generators``, then random
    combinations), relative to ``‖∇L‖ ‖M·θ‖``; skipped for actions that move buffers.
``gd_drift``
    one gradient-descent step ``θ' = θ − η∇L`` changes each quadratic quantity by exactly
    ``η² C(∇L)`` and leaves each linear one unchanged.
``gradient_flow``
    each conserved quantity stays constant along gradient flow ``θ̇ = −∇L(θ)``, integrated on the model
    by the core's RK4 (``flow_steps`` steps, each moving ``θ`` by at most ``min(10⁻⁴, √(tol/steps))``
    relative: small enough for steps across ReLU kinks, see :func:`_gradient_flow`); buffers are
    passed along unchanged (training-mode running statistics are updated on copies).
``angular_momentum``
    for each orthogonal group (whose antisymmetric generators have no conserved ``Q``), heavy-ball dynamics
    ``θ̈ + γ θ̇ = −∇L`` from a random velocity: every entry of ``J(θ, θ̇)``
    (:class:`~symalg.symbolic.symmetry.AngularMomentum`) decays exactly as ``e^{−γt}``
    (:func:`~symalg.verification.checks.check_angular_momentum`).
``lowering``
    each lowered conserved quantity equals the value of its SymPy expressions at the same numbers, evaluated node by
    node from SymPy's meaning of each node (:func:`symalg.verification.checks.compare_to_sympy`,
    :func:`symalg.lowering.codegen.evaluate_symbolic`), independently of the torch printer. Every symbol holds its
    tensor unfolded by its read suffix, as the lowered code reads it, so the check covers the printed expression.
    Skipped for a quantity reading more than ``symbolic_limit`` entries.

``noether_*`` (only with ``dynamics=``)
    the laws of a training dynamics or the exact one-step identities of a discrete scheme
    (:mod:`symalg.applications.noether`): ``noether_decay`` (``J(t) = φ(t) J(t₀)``), ``noether_translation``,
    ``noether_restriction``, ``noether_energy`` by integration, with tolerances from a run at half the step;
    ``noether_scheme`` along a real training run (``torch.optim`` as users run it), to rounding (``4096 ε``).

``orbit_dimension``
    the orbit dimension at the verified parameters, computed with the structure of the action
    (:func:`symalg.numeric.orbit_rank.model_orbit_dimension`), equals its generic formula and the dense
    Jacobian's rank (the latter where that Jacobian fits in ``DENSE_ORBIT_BYTES``); skipped when
    neither exists.

The loss is computed on the first output: for ``cross_entropy`` against the classes
``torch.randint(k, batch_shape, generator=torch.Generator().manual_seed(seed))`` (``k`` logits); otherwise the
MSE ``mean((output − y)²)`` against ``y = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed),
dtype=dtype)``: the first draws of that generator. The other outputs enter only ``invariance``.

Actions that move buffers have no conserved quantity, so ``gd_drift``, ``gradient_flow`` and
``lowering`` have nothing to check for them.

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
>>> analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),)))
>>> symalg.verify(analysis).passed
True
"""
from __future__ import annotations

import copy
import math
import numbers
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from torch.func import functional_call

from symalg.applications import noether
from symalg.numeric.orbit_rank import model_orbit_dimension
from symalg.symbolic.derive import Analysis
from symalg.symbolic.symmetry import Symmetry
from symalg.verification.certification import check_in_separating_sets, compose, output_change, sample_elements
from symalg.errors import SpecError, WidthError
from symalg.progress import Progress, report
from symalg.frontend.outputs import output_tensors
from symalg.verification.checks import (MAX_GENERATORS, TOLERANCES, CheckResult, VerificationReport,
                                        check_angular_momentum, check_device, check_gradient_orthogonality,
                                        check_params, compare_to_sympy, gradient_norm, integrate_gradient_flow,
                                        loss_gradients, relative_error)

__all__ = ["verify", "default_widths"]

Params = Mapping[str, torch.Tensor]
"""Tensors by name: parameters, and buffers where a model has them."""
Outputs = list[tuple[str, torch.Tensor]]
"""Every output of a model as ``(path, tensor)`` pairs (:func:`~symalg.frontend.outputs.output_tensors`)."""

SYMBOLIC_LIMIT = 2000
"""Largest number of tensor entries a conserved quantity may read for the ``lowering`` check."""


def _inputs(analysis: Analysis, inputs: object, dtype: torch.dtype, device: str | torch.device) -> tuple:
    """The model inputs, moved: ``data`` (a tensor or a tuple), else the example inputs. A floating example input
    needs a floating tensor in its place; anything else raises ``SpecError`` naming ``data``."""
    examples = analysis.model_graph.example_inputs
    if inputs is None:
        inputs = examples
        if inputs is None:
            raise SpecError("verify: the model was traced without example_inputs; pass data=(tensor, ...)")
        if any(isinstance(x, torch.Tensor) and x.is_meta for x in inputs):
            raise SpecError("verify: the example inputs are on the meta device (shapes, no values); pass "
                            "data=(tensor, ...)")
    elif isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif not isinstance(inputs, tuple):
        raise SpecError(f"verify: data must be the model's inputs, a tensor or a tuple of tensors, got "
                        f"{type(inputs).__name__}")
    for index, x in enumerate(inputs):
        example = examples[index] if examples is not None and index < len(examples) else None
        if isinstance(example, torch.Tensor) and torch.is_floating_point(example) and not (
                isinstance(x, torch.Tensor) and torch.is_floating_point(x)):
            got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
            raise SpecError(f"verify: data[{index}] must be a floating-point tensor like the example input, got {got}")
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not torch.isfinite(x).all():
            raise SpecError(f"verify: data[{index}] has non-finite entries")
    return tuple(_moved(x, dtype, device) for x in inputs)


def _moved(x: object, dtype: torch.dtype, device: str | torch.device) -> object:
    """An input on ``device``; floating tensors in ``dtype``, other values as they are."""
    if not isinstance(x, torch.Tensor):
        return x
    return x.to(device=device, dtype=dtype) if torch.is_floating_point(x) else x.to(device)


def _model(analysis: Analysis, params: Params | None, device: str | torch.device,
           dtype: torch.dtype) -> torch.nn.Module:
    """A copy of the analysed model on ``device`` in ``dtype``. A model on the ``meta`` device (shapes, no values)
    takes every value from ``params``, which must then hold every parameter and buffer (e.g. the full tensors
    gathered from a sharded model: :func:`symalg.applications.distributed.gather`)."""
    graph = analysis.model_graph
    model = graph.require_model("verify")
    if not graph.on_meta:
        return copy.deepcopy(model).to(device=device, dtype=dtype)
    names = [*dict(model.named_parameters()), *dict(model.named_buffers())]
    missing = [name for name in names if params is None or name not in params]
    if missing:
        graph.require_values(f"verify without params[{missing[0]!r}]")
    return copy.deepcopy(model).to_empty(device=device).to(dtype=dtype)


def _shapes(inputs: Sequence[object]) -> list:
    return [tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs]


def default_widths(analysis: Analysis) -> dict[str, int]:
    """Widths used when none are given: 3, 4, 5, ... in alphabetical order of the width names."""
    return {name: 3 + i for i, name in enumerate(sorted(str(s) for s in analysis.widths))}


def _concrete(analysis: Analysis, params: Params | None, widths: Mapping[str, int] | None,
              caller: str) -> tuple[Analysis, dict[str, int]]:
    """``(analysis at concrete widths, the widths substituted)``: read from ``params``, else ``widths``, else
    :func:`default_widths`; a concrete analysis refuses ``widths``."""
    if not analysis.widths:
        if widths is not None:
            raise SpecError(f"{caller}: widths= sets symbolic widths; this analysis has concrete widths")
        return analysis, {}
    if params is not None:
        if widths is not None:
            raise SpecError(f"{caller}: give params or widths, not both (the widths are those of the parameters)")
        check_params(params, analysis.model_graph.parameter_shapes, caller)
        arch = analysis.architecture
        assert arch is not None  # only a spec has symbolic widths
        substituted = {str(k): int(v) for k, v in arch.widths_from_params(params).items()}
    else:
        wrong = [(k, v) for k, v in (widths or {}).items()
                 if isinstance(v, bool) or not isinstance(v, numbers.Integral)]
        if wrong:
            raise WidthError(f"{caller}: widths= values must be integers, got {wrong[0][0]}={wrong[0][1]!r}")
        substituted = {str(k): int(v) for k, v in (widths or default_widths(analysis)).items()}
        missing = sorted(str(s) for s in analysis.widths if str(s) not in substituted)
        if missing:
            raise SpecError(f"{caller}: no value for the symbolic widths {missing}; pass params or widths=")
    return analysis.subs(substituted), substituted


def verify(analysis: Analysis, params: Params | None = None, data: torch.Tensor | tuple | None = None,
           device: str = "cpu", dtype: torch.dtype = torch.float64, widths: Mapping[str, int] | None = None,
           seed: int = 0, max_generators: int = MAX_GENERATORS, learning_rate: float = 0.1, flow_steps: int = 10,
           symbolic_limit: int = SYMBOLIC_LIMIT, dynamics: object = None,
           progress: Progress | None = None) -> VerificationReport:
    """Check every symmetry of ``analysis`` numerically by running its model (see the module docstring).

    Parameters
    ----------
    analysis : the result of :func:`symalg.derive`, from any front end. A spec with symbolic widths is verified
        at the widths of ``params``, else at ``widths``, else at :func:`default_widths` (recorded in the report).
    params : ``{name: tensor}``, every parameter of the model and any of its buffers (e.g.
        ``dict(model.named_parameters())``); by default the model's own (a spec's generated module is seeded).
        An unknown or missing name, a wrong shape or a non-finite entry raises ``SpecError`` naming it.
    data : the model's positional inputs, a tensor or a tuple of tensors (not an ``(x, y)`` pair: the loss target
        is drawn from ``seed``, see the module docstring); by default the example inputs it was traced with (a
        spec's are a seeded ``(8, n)`` batch). The keyword example inputs (``attention_mask=...``,
        ``use_cache=False``) are always passed as traced. Anything else, a non-floating tensor where the model
        takes a floating one, a non-finite entry, or inputs the model cannot run on raise ``SpecError`` naming
        ``data``.
    device, dtype : where and in which precision to run (float64 by default; tolerances by dtype).
    seed : seed of the targets and group elements. ``max_generators``: most Lie-algebra generators checked one by
        one for ``gradient_orthogonality``; ``learning_rate``: the ``gd_drift`` step; ``flow_steps``: RK4 steps of
        ``gradient_flow``; ``symbolic_limit``: most entries a quantity may read for ``lowering``.
    dynamics : a :class:`~symalg.applications.noether.Dynamics` (its Noether laws checked by integration:
        :func:`~symalg.applications.noether.check_dynamics`), a :class:`~symalg.applications.noether.Scheme` (its
        exact one-step identities along a real training run: :func:`~symalg.applications.noether.check_scheme`; a
        scheme with ``batch`` takes the loss on ``batch`` seeded random rows of the first output per step), or a
        list of them.
    progress : ``progress(done, total, what)`` after each stage (invariance, each symmetry's checks, gradient flow,
        angular momentum, lowering, orbit dimension, dynamics): :mod:`symalg.progress`.
    """
    if not isinstance(analysis, Analysis):
        raise SpecError(f"verify: analysis must be the result of symalg.derive, got {type(analysis).__name__}")
    if dtype not in TOLERANCES:
        raise SpecError(f"verify: dtype {dtype} is not supported; use one of {list(TOLERANCES)}")
    for name, value in (("seed", seed), ("symbolic_limit", symbolic_limit), ("max_generators", max_generators),
                        ("flow_steps", flow_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(f"verify: {name} must be a non-negative integer, got {value!r}")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
            or not 0 < learning_rate < math.inf:
        raise SpecError(f"verify: learning_rate must be a positive finite number, got {learning_rate!r}")
    if widths is not None and not isinstance(widths, Mapping):
        raise SpecError(f"verify: widths must be a mapping {{name: positive int}}, got {type(widths).__name__}")
    analysis, substituted = _concrete(analysis, params, widths, "verify")
    inputs = data
    check_device(device)
    tol = TOLERANCES[dtype]
    generator = torch.Generator().manual_seed(seed)
    model = _model(analysis, params, device, dtype)
    state = {**{k: v.detach() for k, v in model.named_parameters()},
             **{k: v.detach() for k, v in model.named_buffers()}}
    parameter_names = [k for k, _ in model.named_parameters()]
    if params is not None:
        check_params(params, {k: tuple(v.shape) for k, v in state.items()}, "verify",
                     optional=set(state) - set(parameter_names))
        state.update({k: v.detach().to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
                      for k, v in params.items()})
    x = _inputs(analysis, inputs, dtype, device)
    keywords = {k: _moved(v, dtype, device) for k, v in analysis.model_graph.example_kwargs.items()}
    cross_entropy = analysis.loss == "cross_entropy"

    parameter_set = set(parameter_names)

    def forward(values: Params) -> Outputs:
        """Every output at ``values``, as ``(path, tensor)`` pairs; buffers cloned (training-mode running stats)."""
        values = {k: v.clone() if k not in parameter_set else v for k, v in values.items()}
        return output_tensors(functional_call(model, values, x, keywords))

    try:
        outputs = forward(state)
    except (RuntimeError, TypeError, ValueError) as error:
        examples = analysis.model_graph.example_inputs
        expected = f" (example inputs of shapes {_shapes(examples)})" if examples is not None else ""
        raise SpecError(f"verify: the model does not run on data of shapes {_shapes(x)}{expected}; data= are the "
                        f"model's inputs, a tensor or a tuple of tensors: {type(error).__name__}: {error}") from error
    if not outputs:
        raise SpecError(f"verify: {type(model).__name__} returns no tensor to compare")
    reference = outputs[0][1]
    classes: torch.Tensor | None = None
    target: torch.Tensor | None = None
    if cross_entropy:
        classes = torch.randint(reference.shape[-1], reference.shape[:-1], generator=generator).to(device)
    else:
        target = torch.randn(reference.shape, generator=generator, dtype=dtype).to(device)

    def loss_of(outputs: Outputs, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of the first output (see the module docstring), on the given ``rows`` of it (a minibatch)."""
        output = outputs[0][1]
        labels, wanted = classes, target
        if rows is not None:
            output = output[rows]
            labels = labels[rows] if labels is not None else None
            wanted = wanted[rows] if wanted is not None else None
        if labels is not None:
            return torch.nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), labels.reshape(-1))
        assert wanted is not None
        return ((output - wanted) ** 2).mean()

    def loss_on(rows: torch.Tensor | None) -> Callable[[Params], torch.Tensor]:
        """The loss as a function of the parameters, on ``rows`` of the first output (all: ``None``)."""
        return lambda params: loss_of(forward({**state, **params}), rows)

    def loss(params: Params) -> torch.Tensor:
        """The loss as a function of the parameters alone (buffers as in ``state``)."""
        return loss_of(forward({**state, **params}))

    params = {k: state[k] for k in parameter_names}
    grads = loss_gradients(loss, params)
    grad_norm = gradient_norm(grads)
    stepped = {**state, **{k: state[k] - learning_rate * g for k, g in grads.items()}}
    at_gradient = {**state, **grads}
    stages = len(analysis.symmetries) + 6
    invariance = _invariance(analysis.symmetries, state, forward, loss_of, cross_entropy, generator, dtype, device,
                             tol)
    report(progress, 1, stages, "invariance")
    checks = []
    for done, (symmetry, invariant) in enumerate(zip(analysis.symmetries, invariance), start=2):
        checks.append(invariant)
        if symmetry.group.is_continuous and not symmetry.acts_on_buffers:
            checks.append(_orthogonality(symmetry, state, grads, grad_norm, generator, dtype, device, tol,
                                         max_generators))
        if symmetry.conserved is not None:
            checks.append(_drift(symmetry, state, stepped, at_gradient, learning_rate, tol))
        report(progress, done, stages, symmetry.label)
    done = len(analysis.symmetries) + 1
    conserving = [s for s in analysis.symmetries if s.conserved is not None]
    checks += _gradient_flow(conserving, loss, state, params, grads, tol, flow_steps)
    report(progress, done + 1, stages, "gradient flow")
    checks += check_angular_momentum(analysis, loss, params, grads, generator, tol)
    report(progress, done + 2, stages, "angular momentum")
    with torch.no_grad():
        checks += [_lowering(s, state, tol, symbolic_limit) for s in conserving]
    report(progress, done + 3, stages, "lowering")
    checks.append(_orbit_dimension(analysis, state))
    report(progress, done + 4, stages, "orbit dimension")
    checks += _noether(analysis.symmetries, dynamics, loss_on, reference.shape[0] if reference.dim() else 1, params,
                       grads, seed)
    report(progress, done + 5, stages, "dynamics")
    return VerificationReport(tuple(checks), dtype, str(device), substituted)


def _noether(symmetries: Sequence[Symmetry], dynamics: object,
             loss_on: Callable[[torch.Tensor | None], Callable[[Params], torch.Tensor]], rows: int, params: Params,
             grads: Params, seed: int) -> list[CheckResult]:
    """The checks of ``dynamics=`` (see :func:`verify`)."""
    if dynamics is None:
        return []
    listed = list(dynamics) if isinstance(dynamics, (list, tuple)) else [dynamics]
    results: list[CheckResult] = []
    for item in listed:
        if isinstance(item, noether.Dynamics):
            results += noether.check_dynamics(symmetries, loss_on(None), params, grads, item,
                                              torch.Generator().manual_seed(seed))
        elif isinstance(item, noether.Scheme):
            results += noether.check_scheme(symmetries, _step_losses(item, loss_on, rows, seed),
                                            params, item)
        else:
            raise SpecError(f"verify: dynamics must be a noether.Dynamics or noether.Scheme (or a list of them), "
                            f"got {type(item).__name__}")
    return results


def _step_losses(scheme: "noether.Scheme", loss_on: Callable[[torch.Tensor | None], Callable[[Params], torch.Tensor]],
                 rows: int, seed: int) -> Callable[[int], Callable[[Params], torch.Tensor]]:
    """The loss of step ``k``: the full loss, or with ``scheme.batch`` the loss on that many rows (first axis) of the
    first output, drawn from ``seed + k``: a minibatch loss, invariant like the full one."""
    if scheme.batch is None:
        return lambda k: loss_on(None)
    if scheme.batch > rows:
        raise SpecError(f"verify: batch={scheme.batch} exceeds the {rows} rows of the model's first output")
    batch = scheme.batch
    return lambda k: loss_on(torch.randperm(rows, generator=torch.Generator().manual_seed(seed + k))[:batch])


DENSE_ORBIT_BYTES = 64 * 2 ** 20
"""Largest Jacobian the ``orbit_dimension`` check builds for the dense baseline."""


def _orbit_dimension(analysis: Analysis, state: Params) -> CheckResult:
    """The structured orbit dimension at the verified parameters (:mod:`symalg.orbit_rank`) against its
    generic formula and, where the Jacobian is small, the dense baseline; integers, so exact equality."""
    structured = model_orbit_dimension(analysis, state)
    compared = {}
    try:
        compared["formula"] = int(analysis.orbit_dimension())
    except NotImplementedError:
        pass
    try:
        compared["dense"] = model_orbit_dimension(analysis, state, method="dense",
                                                  max_bytes=DENSE_ORBIT_BYTES).dimension
    except MemoryError:
        pass
    detail = f"structured {structured.dimension} of {structured.algebra_dim}"
    if not compared:
        return CheckResult("orbit_dimension", "*", float("nan"), 0.0, detail + "; no formula, dense Jacobian too large",
                           skipped=True)
    error = max(abs(value - structured.dimension) for value in compared.values())
    detail += "".join(f", {name} {value}" for name, value in compared.items())
    return CheckResult("orbit_dimension", "*", float(error), 0.0, detail)


def _invariance(symmetries: Sequence[Symmetry], state: Params, forward: Callable[[Params], Outputs],
                loss_of: Callable[[Outputs], torch.Tensor], cross_entropy: bool, generator: torch.Generator,
                dtype: torch.dtype, device: str | torch.device, tol: float) -> list[CheckResult]:
    """Each symmetry's worst relative change of any output or of the loss under its test elements, claims composed.

    Round ``r`` moves θ by the ``r``-th test element (:func:`sample_elements`) of every symmetry that has one. A
    composition of symmetries is a symmetry, so one forward pass checks a whole set of claims, in sets that separate
    every two claims (:func:`~symalg.verification.certification.check_in_separating_sets`, as certification does:
    ``4⌈log₄ n⌉`` passes for ``n`` claims instead of ``n``), so two false claims whose composition holds cannot pass
    together. A claim's error is the worst of the passing sets it was in and its own error where it failed alone.
    Each claim draws its elements from its own generator (seeded from ``generator``), anew each round: one round's
    elements are held at a time.
    """
    with torch.no_grad():
        outputs = forward(state)
        base_loss = loss_of(outputs)
        seeds = torch.randint(0, 2 ** 62, (len(symmetries),), generator=generator).tolist()
        worst: list[tuple[float, str]] = [(0.0, "")] * len(symmetries)
        counts = [1] * len(symmetries)   # test elements per claim, known after round 0
        r = 0
        while r < max(counts, default=0):
            active = [i for i, count in enumerate(counts) if r < count]
            elements = {}
            for i in active:
                sample = sample_elements(symmetries[i].group, torch.Generator().manual_seed(seeds[i]), dtype, device)
                counts[i] = len(sample)
                if r < len(sample):
                    elements[i] = sample[r]
            active = [i for i in active if i in elements]

            def change(members: list[int]) -> tuple[float, str]:
                moved = forward(compose(state, [(symmetries[active[i]], elements[active[i]][1]) for i in members]))
                error, path = output_change(moved, outputs, cross_entropy)
                loss_error = relative_error(loss_of(moved), base_loss)
                return (error, f"output {path!r}") if loss_error <= error else (loss_error, "loss")

            def record(members: list[int], error: float, where: str) -> None:
                others = f" (composed with {len(members) - 1} other claims)" if len(members) > 1 else ""
                for i in members:
                    claim = active[i]
                    if not error <= worst[claim][0]:
                        worst[claim] = (error, f"{elements[claim][0]}{others}, {where}")

            check_in_separating_sets(len(active), change, tol, record)
            r += 1
    return [CheckResult("invariance", s.label, error, tol, detail) for s, (error, detail) in zip(symmetries, worst)]


def _orthogonality(symmetry: Symmetry, state: Params, grads: Params, grad_norm: torch.Tensor,
                   generator: torch.Generator, dtype: torch.dtype, device: str | torch.device, tol: float,
                   max_generators: int) -> CheckResult:
    basis = symmetry.group.algebra_sample(max_generators, generator, dtype, device)
    if symmetry.disjoint_regions is None:
        return check_gradient_orthogonality(symmetry.label, lambda M: symmetry.tangent(state, M), basis, grads, tol,
                                            grad_norm=grad_norm, vectorised=True)
    # region by region: the same inner products and norms without tangents of the parameters' size
    unfolded = {b: b.unfold(grads[b.tensor]) for b, *_ in symmetry.disjoint_regions if b.tensor in grads}
    return check_gradient_orthogonality(symmetry.label, lambda M: symmetry.region_tangent(state, M), basis, unfolded,
                                        tol, grad_norm=grad_norm, vectorised=True)


def _drift(symmetry: Symmetry, state: Params, stepped: Params, at_gradient: Params, learning_rate: float,
           tol: float) -> CheckResult:
    """``C(θ − η∇L) = C(θ) + η² C(∇L)`` (``stepped`` = θ − η∇L, ``at_gradient`` = ∇L, buffers as in ``state``)."""
    quantity = symmetry.conserved
    assert quantity is not None  # called for conserving symmetries only
    before, after = quantity(state), quantity(stepped)
    worst, change = 0.0, 0.0
    for key in before:
        if quantity.kind == "linear" or symmetry.group.kind == "T":
            predicted = before[key]
        else:
            predicted = before[key] + learning_rate ** 2 * quantity(at_gradient)[key]
        worst = max(worst, _deviation(after[key], predicted))
        change = max(change, (after[key] - before[key]).abs().max().item())
    exact = "ΔC = 0" if quantity.kind == "linear" or symmetry.group.kind == "T" else "ΔC = η² C(∇L)"
    return CheckResult("gd_drift", symmetry.label, worst, tol, f"{quantity.kind} quantity {quantity.name}: {exact}, "
                       f"η = {learning_rate}, max|ΔC| = {change:.6e}")


def _deviation(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative difference; absolute where ``expected`` is exactly zero (a quantity that is 0 at θ)."""
    return relative_error(actual, expected) if expected.abs().max() > 0 else (actual - expected).abs().max().item()


def _gradient_flow(symmetries: Sequence[Symmetry], loss: Callable[[Params], torch.Tensor], state: Params,
                   params: Params, grads: Params, tol: float, steps: int) -> list[CheckResult]:
    """Each ``C`` at the end of gradient flow ``θ̇ = −∇L`` from ``params`` equals ``C`` at the start.

    Where no step crosses a kink of the loss, RK4 changes a quadratic ``C`` by ``O(δ⁵)`` per step of
    relative move ``δ``. A step across a kink (ReLU, max pooling: frequent in conv nets) loses RK4's
    cancellation and changes ``C`` by ``O(δ²)``, so ``δ = min(10⁻⁴, √(tol/steps))`` keeps ``C`` within
    ``tol`` even with a kink in every step; a quantity that is not conserved still drifts at first
    order, by about ``steps·δ = √(steps·tol) ≫ tol`` (``10⁻⁴`` in float64 with 10 steps).
    """
    if not symmetries:
        return []
    flowed, detail = integrate_gradient_flow(loss, params, grads, steps, max_move=min(1e-4, math.sqrt(tol / steps)))
    flowed = {**state, **flowed}
    results = []
    for symmetry in symmetries:
        quantity = symmetry.conserved
        assert quantity is not None  # called for conserving symmetries only
        before, after = quantity(state), quantity(flowed)
        error = max(_deviation(after[key], before[key]) for key in before)
        results.append(CheckResult("gradient_flow", symmetry.label, error, tol, f"{quantity.name}: {detail}"))
    return results


def _lowering(symmetry: Symmetry, state: Params, tol: float, symbolic_limit: int) -> CheckResult:
    """The lowered quantity against the value of its SymPy expressions at the same numbers (``compare_to_sympy``)."""
    quantity = symmetry.conserved
    assert quantity is not None  # called for conserving symmetries only
    values = {s.name: _read(state[tensor], quantity.suffixes.get(s, "")) for s, tensor in quantity.reads.items()}
    size = sum(v.size for v in values.values())
    if size > symbolic_limit:
        return CheckResult("lowering", symmetry.label, float("nan"), tol, f"{quantity.name} reads {size} entries > "
                           f"symbolic_limit={symbolic_limit}: exact SymPy evaluation skipped", skipped=True)
    return CheckResult("lowering", symmetry.label, compare_to_sympy(quantity(state), quantity.exprs, values), tol,
                       f"{quantity.name} vs SymPy")


def _read(tensor: torch.Tensor, suffix: str) -> np.ndarray:
    """The value of a symbol: ``tensor`` unfolded by the source ``suffix`` of the lowered read."""
    return eval(f"tensor{suffix}", {"__builtins__": {}}, {"tensor": tensor.detach().cpu().double()}).numpy()
