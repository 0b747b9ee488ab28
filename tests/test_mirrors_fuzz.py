"""Every mirror symalg lists for the fuzzer's models leaves the model's outputs unchanged: no false mirror."""
from __future__ import annotations

import pytest
import torch

import symalg
from symalg.verification.fuzz import FAMILIES, generate


def _leaves(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    values = out.values() if isinstance(out, dict) else out
    return [t for v in values for t in _leaves(v)]   # type: ignore[union-attr]


def _false_mirrors(seed: int, index: int, family: str) -> tuple[int, list[str]]:
    case = generate(seed, index, family)
    model, inputs = case.build()
    try:
        analysis = symalg.derive(symalg.trace(model, inputs, tracer=case.tracer))
    except symalg.SpecError:   # a documented refusal (the scripted and complex families): nothing is claimed
        return 0, []
    found = symalg.mirrors(analysis, limit=2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    def run(point: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)                       # the same dropout masks in every pass
            return _leaves(torch.func.functional_call(model, point, inputs))
    with torch.no_grad():
        base = run(params)
        false = []
        for mirror in found.constraints:
            moved = run(mirror.reflect(params))
            error = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(moved, base))
            if error > 1e-8:
                false.append(f"{case.description}: {mirror.label} changes the output by {error:.2e}")
    return len(found.constraints), false


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_false_mirror_on_fuzz_models(family):
    claims, false = _false_mirrors(0, 1, family)
    assert not false, false


@pytest.mark.slow
def test_no_false_mirror_on_many_fuzz_models():
    """docs/mirrors.md's figure: 5 models of every family (seed 1)."""
    total, false = 0, []
    for family in sorted(FAMILIES):
        for index in range(5):
            claims, wrong = _false_mirrors(1, index, family)
            total, false = total + claims, false + wrong
    print(f"mirror_claims={total} false={len(false)}")
    assert total > 100 and not false, false
