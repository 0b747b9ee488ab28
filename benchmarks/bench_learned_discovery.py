"""Learned symmetry discovery: training steps per second, closed-form jets against the per-sample ``jvp`` s.

One training step (loss, backward, Adam) of :func:`symalg.discovery.learned.learn` on the reproduction problems of
``examples/discovery_reproductions.py`` (``linear-2``: ``W₂ W₁ x`` with ``W₁ 2×1``, ``W₂ 1×2``, ``GL(2)``; ``tanh``:
the three-layer tanh network on one data point, ``GL(2)``, data-dependent action), three generators (so the closure
has three pairs), ``normalise=True, finite=10``, hidden ``64-64-64``, batch 32, float64. The figure is
:func:`~symalg.discovery.learned.training_loss` (all fields and commutator fields from one closed-form forward-mode
pass, the closure's second derivatives from a second) against the baseline measured in the same run,
:func:`~symalg.discovery.learned.reference_training_loss` (``vmap`` over samples of one ``jvp`` per field and two per
closure pair: the earlier training step), both on the same batches, after one warm-up step each, at one torch thread
(``threads``): on the shared 2-core machine two threads made the closed-form step 30× slower (0.97 s against
0.029 s; small matrices, the threads wait on each other under load).
Run: ``python benchmarks/bench_learned_discovery.py [--quick]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

from symalg.discovery.learned import ActionNetwork, LearnedConfig, reference_training_loss, training_loss

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import discovery_reproductions  # noqa: E402


def _steps_per_second(compute, net: ActionNetwork, h: torch.Tensor, loss, batches, config: LearnedConfig) -> float:
    optimiser = torch.optim.Adam([*net.parameters(), h], lr=config.lr)
    for i, (theta, x, t) in enumerate(batches):
        if i == 1:
            start = time.perf_counter()
        total = compute(net, h, loss, theta, x, config, t=t)
        optimiser.zero_grad()
        total.backward()
        optimiser.step()
    return (len(batches) - 1) / (time.perf_counter() - start)


def figures(quick: bool = False, threads: int = 1) -> dict:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return {"threads": threads, "rows": [_row(name, quick) for name in ("linear-2", "tanh")]}
    finally:
        torch.set_num_threads(before)


def _row(name: str, quick: bool) -> dict:
    loss, sample, n, config = discovery_reproductions.problem(name, steps=1, generators=3, normalise=True,
                                                              finite=10.0)
    config = dataclasses.replace(config, batch=8 if quick else 32)
    rng = torch.Generator().manual_seed(0)
    draws = [[sample(rng) for _ in range(config.batch)] for _ in range(3 if quick else 6)]
    batches = [(torch.stack([d[0] for d in b]), torch.stack([d[1] for d in b]),
                2 * torch.rand(config.batch, 3, generator=rng, dtype=torch.float64) - 1) for b in draws]
    theta0, x0 = draws[0][0]
    speeds = {}
    for label, compute, count in (("closed_form", training_loss, len(batches)),
                                  ("reference", reference_training_loss, 2 if quick else 3)):
        torch.manual_seed(0)
        net = ActionNetwork(n, theta0.numel(), x0.numel() if config.data_input else 0, config.hidden,
                            dtype=torch.float64)
        h = torch.nn.Parameter(torch.randn(3, n, n, dtype=torch.float64) / n)
        speeds[label] = _steps_per_second(compute, net, h, loss, batches[:count], config)
    return {"model": name, "parameters": theta0.numel(), "batch": config.batch,
            "steps_per_s": speeds["closed_form"], "reference_steps_per_s": speeds["reference"],
            "speedup": speeds["closed_form"] / speeds["reference"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    result = figures(args.quick, args.threads)
    for r in result["rows"]:
        print(f"{r['model']:9s} P={r['parameters']:3d} batch {r['batch']}: {r['steps_per_s']:8.2f} steps/s "
              f"(reference {r['reference_steps_per_s']:.3f}; ×{r['speedup']:.0f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
