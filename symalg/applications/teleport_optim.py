"""Teleportation inside a torch training loop: a wrapper around any ``torch.optim`` optimizer.

API
---
``TeleportingOptimizer(optimizer, model, teleporter, loss_fn, data, schedule=Schedule(every=100), state="transform")``
    ``step()`` runs the optimizer's step, then teleports the model when the schedule says so (so the next
    gradient is taken at the teleported point); ``end_epoch()`` counts epochs for ``Schedule.at_epochs``;
    ``teleport()`` teleports now. ``teleporter`` is a :class:`~symalg.applications.teleport.Teleporter`, or a callable
    ``batch → Teleporter`` (data-dependent actions need the batch). ``loss_fn(params, batch)`` is the loss at a
    parameter dict (:func:`model_loss` builds one); ``data`` a callable returning a batch or an iterable (cycled).
``Schedule(every=k, at_steps=(...), at_epochs=(...), batches=n)``: when, and on how many mini-batches (one
    teleport per batch, in turn, as in [Zhao2026] Sec. 5.4.2).
``TeleportingOptimizer(..., radius=TRAINING_RADIUS, check=True)``
    the safeguards, on by default (:meth:`TeleportingOptimizer.guarded`).

Safeguards during training
--------------------------
A gradient-norm teleport on a non-compact orbit can raise ``‖∇L‖`` without bound (``GL``, positive scalings), and the
next optimizer step, taken at the same learning rate, then overshoots: one default ``GradNorm`` teleport on digits
(64-16-10-10, SGD at 0.05) raised ``‖∇L‖`` from 0.09 to 182 and training diverged (``benchmarks/bench_teleport.py``).
Every teleport here therefore runs with

* a **trust region** ``radius`` (default :data:`TRAINING_RADIUS` = 1): the ascent's steps add up to at most 1, so
  ``‖∇L‖`` grows by at most ``e²`` for a linear action (:class:`~symalg.applications.teleport.Teleporter`);
* the **next-step test** (``check``): among the iterates that kept the loss, the best one at which this optimizer's
  next step is stable (:class:`~symalg.applications.teleport.NextStep` from :func:`next_step`: the curvature along the
  step at most half its stability limit, ``lr·dᵀHd ≤ gᵀd``, and the loss decreasing over the step by at least half
  of what the quadratic model predicts); when no improving iterate passes, the teleport is rejected.

``radius=None, check=False`` turns both off (a teleporter's own smaller radius or own ``next_step`` is kept).

``handle_state(optimizer, named_params, action, moves, params_after, mode)``: the state handling on its own.

State handling at a teleport ``θ' = g·θ`` (``J = ∂θ'/∂θ``)
------------------------------------------------------------
``"transform"``
    *First moments* (SGD's ``momentum_buffer``, Adam's ``exp_avg``, RMSprop's ``momentum_buffer``/``grad_avg``)
    are linear combinations of past gradients, i.e. cotangent vectors, and move as gradients do:
    ``m ↦ J⁻ᵀ m`` (:func:`~symalg.applications.teleport.transform_cotangent`). For a linear action ``J`` is constant and
    ``∇L(g·θ_s) = J⁻ᵀ∇L(θ_s)`` at every past iterate, so ``J⁻ᵀm`` is exactly the momentum that the teleported
    trajectory ``g·θ_s`` would have accumulated. Moving ``m`` by ``J`` instead (as a velocity) would add a tangent
    vector to the next (cotangent) gradient, which is basis-independent only for orthogonal ``J`` (``J = J⁻ᵀ``).
    *Second moments* (``exp_avg_sq``, ``max_exp_avg_sq``, Adagrad's ``sum``, RMSprop's ``square_avg``) are the
    diagonal of ``E[ggᵀ]``, which maps to ``J⁻ᵀ E[ggᵀ] J⁻¹``; its diagonal is determined by the old diagonal only
    when ``J`` is monomial (a permutation times a diagonal: positive scalings, permutations, odd sign flips,
    translations), where ``v ↦ (J⁻ᵀ)∘² v = (J⁻ᵀ√v)²`` exactly. For other actions (``GL``, ``O``, data-dependent)
    a diagonal second moment has no covariant transform and is **kept**. Step counters are kept. Tensor state
    of any other name raises ``ValueError`` (use ``"keep"`` or ``"reset"``).
``"keep"``
    Leave the state as it is ([Zhao2026]'s "teleport parameters but not momentum").
``"reset"``
    Make the state of every moved parameter that of a fresh optimizer (momentum zero, no accumulated squares,
    step 0; Adagrad's ``sum`` back to ``initial_accumulator_value``): [Zhao2026]'s "reset momentum".

Example
-------
>>> import torch, symalg
>>> from symalg.applications.teleport import Teleporter, as_action
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2)).double()
>>> x, y = torch.randn(16, 3, dtype=torch.float64), torch.randn(16, 2, dtype=torch.float64)
>>> teleporter = Teleporter(as_action(symalg.derive(symalg.trace(model, (x,)))), steps=3, lr=0.01)
>>> opt = TeleportingOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), model, teleporter,
...                            model_loss(model, torch.nn.functional.mse_loss), lambda: (x, y), Schedule(every=5))
>>> for _ in range(10):
...     opt.zero_grad()
...     torch.nn.functional.mse_loss(model(x), y).backward()
...     _ = opt.step()
>>> len(opt.results), all(r.accepted for r in opt.results)
(2, True)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from symalg.applications.teleport import (Action, Move, NextStep, Teleporter, TeleportResult, optimizer_metric,
                                          transform_cotangent)

__all__ = ["FIRST_MOMENTS", "SECOND_MOMENTS", "STATE_MODES", "TRAINING_RADIUS", "Schedule", "TeleportingOptimizer",
           "handle_state", "model_loss", "next_step"]

TRAINING_RADIUS = 1.0
"""Default trust region of a teleport during training (:attr:`Teleporter.radius`): the steps' lengths add up to at
most 1, so a linear action changes ``‖∇L‖`` by at most a factor ``e²``."""

FIRST_MOMENTS = ("momentum_buffer", "exp_avg", "grad_avg")
"""Optimizer state entries that are gradient-like (cotangent) and move by ``J⁻ᵀ``."""
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq", "sum", "square_avg")
"""Optimizer state entries that average squared gradients (move by ``(J⁻ᵀ)∘²`` for monomial ``J``, else kept)."""
STATE_MODES = ("transform", "keep", "reset")


@dataclass(frozen=True)
class Schedule:
    """When to teleport: after every ``every``-th optimizer step, after the steps ``at_steps`` (counted from 1),
    and after the epochs ``at_epochs`` (counted by :meth:`TeleportingOptimizer.end_epoch`, from 1); each time on
    ``batches`` mini-batches in turn. Teleport before training by calling :meth:`TeleportingOptimizer.teleport`.

    >>> [s for s in range(1, 10) if Schedule(every=4, at_steps=(1,)).due_step(s)]
    [1, 4, 8]
    """

    every: int | None = None
    at_steps: tuple[int, ...] = ()
    at_epochs: tuple[int, ...] = ()
    batches: int = 1

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 1:
            raise ValueError(f"Schedule: every must be a positive step count, got {self.every}")
        if any(s < 1 for s in (*self.at_steps, *self.at_epochs)):
            raise ValueError(f"Schedule: at_steps {self.at_steps} / at_epochs {self.at_epochs} count from 1 "
                             "(call teleport() yourself before training)")
        if self.batches < 1:
            raise ValueError(f"Schedule: batches must be at least 1, got {self.batches}")

    def due_step(self, step: int) -> bool:
        return (self.every is not None and step % self.every == 0) or step in self.at_steps

    def due_epoch(self, epoch: int) -> bool:
        return epoch in self.at_epochs


BatchLoss = Callable[[Mapping[str, torch.Tensor], Any], torch.Tensor]
"""A loss of the parameters on one mini-batch: ``loss(params, batch)``."""


def model_loss(model: torch.nn.Module, criterion: Callable[[Any, Any], torch.Tensor]) -> BatchLoss:
    """``(params, (x, y)) ↦ criterion(model(x; params), y)`` through ``torch.func.functional_call``."""
    def loss(params: Mapping[str, torch.Tensor], batch: Any) -> torch.Tensor:
        x, y = batch
        return criterion(torch.func.functional_call(model, dict(params), (x,)), y)
    return loss


def next_step(optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.Tensor]) -> NextStep:
    """The :class:`~symalg.applications.teleport.NextStep` of ``optimizer``: ``lr`` the largest learning rate of its
    parameter groups, ``P`` the preconditioner :func:`~symalg.applications.teleport.optimizer_metric` reads (Adagrad,
    RMSprop, Adam/AdamW; ``1`` for SGD and any other optimizer) times each group's rate over ``lr``. Momentum is left
    out: the test is of the fresh gradient's part of the step.

    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> step = next_step(torch.optim.SGD([w], lr=0.1), {"w": w})
    >>> step.lr, step.metric({"w": torch.ones(2)})["w"].tolist()
    (0.1, [1.0, 1.0])
    """
    groups = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    found = {n: groups[id(p)].get("lr") for n, p in named_params.items() if id(p) in groups}
    if not found or any(not isinstance(r, (int, float)) or r <= 0 for r in found.values()):
        raise ValueError(f"next_step: {type(optimizer).__name__} has no positive learning rate 'lr' in its parameter "
                         "groups; pass check=False to TeleportingOptimizer")
    rates = {n: float(r) for n, r in found.items() if r is not None}
    lr = max(rates.values())
    try:
        preconditioner: Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]] | None = \
            optimizer_metric(optimizer, {n: p for n, p in named_params.items() if n in rates})
    except ValueError:        # an optimizer optimizer_metric does not know: plain gradient steps
        preconditioner = None

    def metric(grads: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        P = preconditioner(grads) if preconditioner is not None else {}
        return {n: P.get(n, torch.ones_like(g)) * (rates.get(n, lr) / lr) for n, g in grads.items()}

    return NextStep(lr, metric)


def _reset(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> None:
    """State of ``p`` as a fresh optimizer has it (torch initialises lazily, except Adagrad)."""
    if isinstance(optimizer, torch.optim.Adagrad):
        group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
        optimizer.state[p]["sum"].fill_(group["initial_accumulator_value"])
        optimizer.state[p]["step"].zero_()
    else:
        optimizer.state.pop(p, None)


def handle_state(optimizer: torch.optim.Optimizer, named_params: Mapping[str, torch.Tensor], action: Action,
                 moves: Sequence[Move], params_after: Mapping[str, torch.Tensor], mode: str = "transform",
                 moved: Iterable[str] | None = None) -> None:
    """Update ``optimizer``'s state for the teleport ``moves`` that produced ``params_after`` (see the module
    docstring). ``named_params``: ``{name: parameter}`` of the optimizer's tensors; ``moved``: names the teleport
    changed (for ``"reset"``; default all)."""
    if mode not in STATE_MODES:
        raise ValueError(f"state must be one of {STATE_MODES}, got {mode!r}")
    if mode == "keep":
        return
    if mode == "reset":
        for name in (named_params if moved is None else moved):
            if name in named_params:
                _reset(optimizer, named_params[name])
        return
    per_key: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in named_params.items():
        for key, value in optimizer.state.get(p, {}).items():
            if not isinstance(value, torch.Tensor) or value.shape != p.shape:
                continue
            if key not in FIRST_MOMENTS + SECOND_MOMENTS:
                raise ValueError(f"state='transform': {type(optimizer).__name__} state {key!r} of {name!r} is "
                                 f"neither a first moment {FIRST_MOMENTS} nor a second moment {SECOND_MOMENTS}; "
                                 "use 'keep' or 'reset'")
            per_key.setdefault(key, {})[name] = value
    for key, values in per_key.items():
        if key in FIRST_MOMENTS:
            new = transform_cotangent(action, moves, params_after, values)
        elif action.monomial_jacobian:
            new = {n: v * v for n, v in transform_cotangent(action, moves, params_after,
                                                            {n: v.sqrt() for n, v in values.items()}).items()}
        else:
            continue
        for name, value in values.items():
            value.copy_(new[name])


class TeleportingOptimizer:
    """Any ``torch.optim`` optimizer with scheduled symmetry teleportation (see the module docstring).

    ``results`` lists every :class:`~symalg.applications.teleport.TeleportResult` so far. Gradients in ``.grad`` are
    left as they are (they belong to the pre-teleport point; the next ``zero_grad``/``backward`` replaces them).
    ``state_dict()`` is the inner optimizer's plus ``"teleport": {"steps", "epochs"}``, the schedule's counters.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                 teleporter: Teleporter | Callable[[Any], Teleporter], loss_fn: BatchLoss,
                 data: Callable[[], Any] | Iterable[Any], schedule: Schedule = Schedule(every=100),
                 state: str = "transform", radius: float | None = TRAINING_RADIUS, check: bool = True) -> None:
        if state not in STATE_MODES:
            raise ValueError(f"TeleportingOptimizer: state must be one of {STATE_MODES}, got {state!r}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"TeleportingOptimizer: optimizer must be a torch.optim.Optimizer, "
                            f"got {type(optimizer).__name__}")
        in_groups = {id(p) for g in optimizer.param_groups for p in g["params"]}
        self.named = {n: p for n, p in model.named_parameters() if id(p) in in_groups}
        if not self.named:
            raise ValueError("TeleportingOptimizer: none of model's parameters are in the optimizer")
        if radius is not None and not (isinstance(radius, (int, float)) and 0 < radius < float("inf")):
            raise ValueError(f"TeleportingOptimizer: radius must be a finite positive number or None, got {radius!r}")
        self.optimizer, self.model, self.teleporter, self.loss_fn = optimizer, model, teleporter, loss_fn
        self.schedule, self.state_mode, self.radius, self.check = schedule, state, radius, check
        self._data = data
        self._iterator: Iterator[Any] | None = None
        self.steps, self.epochs = 0, 0
        self.results: list[TeleportResult] = []

    # -- torch.optim.Optimizer surface --------------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict and the schedule's counters (under ``"teleport"``)."""
        return {**self.optimizer.state_dict(), "teleport": {"steps": self.steps, "epochs": self.epochs}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the inner optimizer and, when saved, the schedule's counters (a plain optimizer state dict
        leaves them as they are)."""
        state_dict = dict(state_dict)
        counters = state_dict.pop("teleport", None)
        self.optimizer.load_state_dict(state_dict)
        if counters is not None:
            self.steps, self.epochs = int(counters["steps"]), int(counters["epochs"])

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """The optimizer's step, then a teleport if ``schedule.due_step`` (returns the closure's loss)."""
        loss = self.optimizer.step(closure)
        self.steps += 1
        if self.schedule.due_step(self.steps):
            self.teleport()
        return loss

    def end_epoch(self) -> list[TeleportResult]:
        """Count an epoch; teleport if ``schedule.due_epoch`` (returns that teleport's results, else ``[]``)."""
        self.epochs += 1
        return self.teleport() if self.schedule.due_epoch(self.epochs) else []

    # -- teleportation ------------------------------------------------------------------------------------------
    def _batch(self) -> Any:
        if callable(self._data):
            return self._data()
        if self._iterator is None:
            self._iterator = iter(self._data)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self._data)
            return next(self._iterator)

    def _params(self) -> dict[str, torch.Tensor]:
        return {**{n: p.detach() for n, p in self.model.named_parameters()},
                **{n: b.detach() for n, b in self.model.named_buffers()}}

    def guarded(self, teleporter: Teleporter) -> Teleporter:
        """``teleporter`` with the safeguards of training: the trust region ``radius`` (unless it has a smaller one)
        and, with ``check``, the next-step test of this optimizer at its current learning rate (:func:`next_step`),
        unless it has its own."""
        changes: dict[str, Any] = {}
        if self.radius is not None and (teleporter.radius is None or teleporter.radius > self.radius):
            changes["radius"] = self.radius
        if self.check and teleporter.next_step is None:
            changes["next_step"] = next_step(self.optimizer, self.named)
        return dataclasses.replace(teleporter, **changes) if changes else teleporter

    def teleport(self, batches: int | None = None) -> list[TeleportResult]:
        """Teleport now on ``batches`` mini-batches (default ``schedule.batches``), one after another, writing the
        accepted results into the model and updating the optimizer state; returns the results."""
        results = []
        for _ in range(self.schedule.batches if batches is None else batches):
            batch = self._batch()
            teleporter = self.guarded(self.teleporter if isinstance(self.teleporter, Teleporter)
                                      else self.teleporter(batch))
            current = self._params()
            def loss(p: Mapping[str, torch.Tensor], batch: Any = batch) -> torch.Tensor:
                return self.loss_fn(p, batch)

            result = teleporter(current, loss, wrt=tuple(self.named))
            results.append(result)
            if not (result.accepted and result.moves):
                continue
            moved = [n for n, t in result.params.items() if t is not current[n]]
            handle_state(self.optimizer, self.named, teleporter.action, result.moves, result.params,
                         self.state_mode, moved)
            targets = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
            with torch.no_grad():
                for name in moved:
                    targets[name].copy_(result.params[name])
        self.results.extend(results)
        return results
