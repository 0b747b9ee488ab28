"""Verification and teleportation of a model sharded with FSDP2 (DTensor parameters) or replicated with DDP: two
processes on CPU with the gloo backend. The workers assert; a failure in either fails the test with its traceback."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import symalg

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from symalg.applications.distributed import gather, local_module, scatter, teleport_sharded, verify_sharded  # noqa: E402

WORLD = 2


def _model():
    torch.manual_seed(0)   # the same weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2)).double()
    return model, (torch.randn(16, 3, dtype=torch.float64),)


def _loss(plain, x):
    target = torch.randn(16, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return lambda p: ((torch.func.functional_call(plain, dict(p), x) - target) ** 2).mean()


def _check(rank, model, wrap):
    """Gather, verify and teleport the wrapped ``model`` on this rank; assert against the unsharded run."""
    plain, x = _model()
    analysis = symalg.derive(symalg.trace(plain, x))
    reference = {k: v.detach().clone() for k, v in plain.named_parameters()}
    wrapped = wrap(model)
    full = gather(wrapped)
    assert sorted(full) == sorted(reference)                  # names without DDP's "module." prefix
    assert all(torch.equal(full[k], reference[k]) for k in reference)
    report = verify_sharded(analysis, wrapped)
    assert report.passed, report
    assert report.checks == symalg.verify(analysis).checks    # the same report as on one machine
    loss = _loss(plain, x)
    result = teleport_sharded(analysis, wrapped, loss, steps=5)
    single = symalg.applications.teleport.teleport(analysis, reference, loss, steps=5, wrt=list(reference))
    assert result.accepted and result.objective_after > 2 * result.objective_before   # GradNorm: ascend |∇L|
    assert result.objective_after == pytest.approx(single.objective_after, rel=1e-9)
    assert abs(result.loss_after - result.loss_before) < 1e-8 * result.loss_before
    after = gather(wrapped)                                    # the model now holds the teleported weights
    assert all(torch.allclose(after[k], result.params[k], rtol=0, atol=0) for k in reference)
    assert not torch.equal(after["0.weight"], reference["0.weight"])
    return local_module(wrapped)


def _fsdp(rank, path):
    torch.set_num_threads(1)   # a forked worker with the parent's thread pool can hang in a threaded matmul
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        model, _ = _model()
        module = _check(rank, model, lambda m: fully_shard(m, mesh=mesh))
        weight = module.get_parameter("2.weight")
        assert isinstance(weight, DTensor) and weight.to_local().shape == (8 // WORLD, 8)   # each rank a half
        # the analysis of the same architecture on the meta device (no weights at all) verifies the sharded weights
        with torch.device("meta"):
            shapes, meta_x = _model()
        meta = symalg.derive(symalg.trace(shapes, meta_x), certify=False)
        plain, x = _model()
        report = verify_sharded(meta, module, data=x)
        assert report.passed and report.checks == symalg.verify(symalg.derive(symalg.trace(plain, x)),
                                                                params=gather(module)).checks
        with pytest.raises(symalg.SpecError, match=r"params\['0.weight'\] has shape \(2, 3\)"):
            scatter(module, {"0.weight": torch.zeros(2, 3)})
    finally:
        dist.destroy_process_group()


def _ddp(rank, path):
    torch.set_num_threads(1)   # a forked worker with the parent's thread pool can hang in a threaded matmul
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    try:
        model, _ = _model()
        module = _check(rank, model, torch.nn.parallel.DistributedDataParallel)
        mine = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        every = [torch.empty_like(mine) for _ in range(WORLD)]
        dist.all_gather(every, mine)
        assert torch.equal(every[0], every[1])                  # the replicas stay identical
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("worker", [_fsdp, _ddp], ids=["fsdp2", "ddp"])
def test_sharded_and_replicated_models_verify_and_teleport_like_one_machine(worker, tmp_path):
    mp.start_processes(worker, args=(str(tmp_path / "rendezvous"),), nprocs=WORLD, start_method="fork")


def test_local_module_refuses_what_is_not_a_module():
    with pytest.raises(symalg.SpecError, match="expected a torch.nn.Module, got dict"):
        local_module({})
    assert os.environ.get("RANK") is None   # nothing here started a process group
