"""Verification and teleportation of models whose weights are sharded (FSDP2, DTensor) or replicated (DDP).

The symmetries are those of the unsharded architecture (derive them once, on an unsharded copy or on the ``meta``
device: :func:`symalg.derive` with ``certify=False``); only the weights are distributed. Correct first: every
parameter is gathered to its full tensor on every rank (``DTensor.full_tensor()``: an all-gather over its mesh),
the one-machine code runs on the full tensors, and new values go back shard by shard
(``distribute_tensor`` from rank 0, so every replica holds rank 0's result, bit for bit).

* :func:`local_module`: the module a wrapper holds (DDP's ``module``; an FSDP2 module is its own).
* :func:`gather`: ``{name: full tensor}`` of every parameter and buffer, names as in the unwrapped module (no
  ``module.`` prefix).
* :func:`scatter`: write full tensors back into the (sharded or replicated) module, in place.
* :func:`verify_sharded`: :func:`symalg.verify` at the gathered weights.
* :func:`teleport_sharded`: :func:`~symalg.applications.teleport.teleport` at the gathered weights, scattered back
  when accepted.

Every rank must call these together (they communicate). Example (on each of two ranks, gloo on CPU)::

    model = torch.nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))        # same seed on every rank
    analysis = symalg.derive(symalg.trace(model, (x,)))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))                           # parameters become DTensors
    report = verify_sharded(analysis, model, data=(x,))
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from symalg.applications.teleport import GradNorm, Objective, TeleportResult, teleport
from symalg.errors import SpecError
from symalg.symbolic.derive import Analysis
from symalg.verification.checks import VerificationReport
from symalg.verification.verifier import verify

__all__ = ["local_module", "gather", "scatter", "verify_sharded", "teleport_sharded"]


def local_module(model: nn.Module) -> nn.Module:
    """The module whose parameter names the analysis uses: ``model.module`` for
    ``DistributedDataParallel`` (whose names carry a ``module.`` prefix), else ``model`` (FSDP2's
    ``fully_shard`` keeps the module and its names, turning parameters into DTensors)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.module
    if not isinstance(model, nn.Module):
        raise SpecError(f"local_module: expected a torch.nn.Module, got {type(model).__name__}")
    return model


def _full(value: torch.Tensor) -> torch.Tensor:
    return value.full_tensor() if isinstance(value, DTensor) else value


def gather(model: nn.Module) -> dict[str, torch.Tensor]:
    """``{name: full tensor}`` of every parameter and buffer of :func:`local_module` ``(model)``, detached.

    A DTensor is all-gathered (``full_tensor()``: every rank then holds the whole tensor, so the memory of one rank
    must hold the model); a plain or replicated tensor is taken as it is. Every rank must call it.
    """
    module = local_module(model)
    entries = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {name: _full(value.detach()) for name, value in entries.items()}


def scatter(model: nn.Module, params: Mapping[str, torch.Tensor]) -> None:
    """Write the full tensors ``params`` into :func:`local_module` ``(model)`` in place, by name.

    A DTensor parameter gets its own shard of rank 0's full tensor (``distribute_tensor`` with its mesh and
    placements: a scatter); a plain parameter (DDP's replicas) gets rank 0's tensor by broadcast when a process
    group is running. Every rank must call it with the same names; an unknown name or a wrong shape raises
    ``SpecError`` naming it, before anything is written.
    """
    module = local_module(model)
    entries = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    for name, value in params.items():
        if name not in entries:
            raise SpecError(f"scatter: the model has no parameter or buffer {name!r}")
        if tuple(value.shape) != tuple(entries[name].shape):
            raise SpecError(f"scatter: params[{name!r}] has shape {tuple(value.shape)}, the model's is "
                            f"{tuple(entries[name].shape)}")
    with torch.no_grad():
        for name in sorted(params):   # the same order on every rank: the collectives pair up
            target, value = entries[name], params[name].detach()
            if isinstance(target, DTensor):
                shard = distribute_tensor(value.to(device=target.device, dtype=target.dtype).contiguous(),
                                          target.device_mesh, target.placements)
                target.to_local().copy_(shard.to_local())
                continue
            local = value.to(device=target.device, dtype=target.dtype).contiguous()
            if dist.is_available() and dist.is_initialized():
                dist.broadcast(local, src=0)
            target.copy_(local)


def verify_sharded(analysis: Analysis, model: nn.Module, **settings: Any) -> VerificationReport:
    """:func:`symalg.verify` of ``analysis`` at the full weights of the sharded or replicated ``model``
    (:func:`gather`); ``settings`` as for ``verify`` (``data=``, ``dtype=``, ...). Every rank gets the same report.
    ``analysis`` may come from the unsharded model or from the same architecture on the ``meta`` device (then pass
    ``data=``)."""
    if "params" in settings:
        raise SpecError("verify_sharded: the parameters are the model's own (gathered); call symalg.verify for others")
    return verify(analysis, params=gather(model), **settings)


def teleport_sharded(action: Any, model: nn.Module, loss: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
                     objective: Objective | Callable = GradNorm(), **settings: Any) -> TeleportResult:
    """Teleport the sharded or replicated ``model`` along ``action`` (an analysis, symmetries or an action) and write
    the result back into it (:func:`scatter`) when it is accepted.

    ``loss(params)`` is the loss at full parameters (``{name: tensor}``, names of :func:`local_module`), e.g.
    ``functional_call(unsharded_or_meta_copy, params, (x,))``; ``settings`` as for
    :func:`~symalg.applications.teleport.teleport` (``wrt`` defaults to the model's parameters). Returns the result
    with full tensors; the model then holds its shards.
    """
    state = gather(model)
    parameters = [name for name, _ in local_module(model).named_parameters()]
    settings.setdefault("wrt", parameters)
    result = teleport(action, state, loss, objective, **settings)
    if result.accepted:
        scatter(model, {name: result.params[name] for name in parameters})
    return result
