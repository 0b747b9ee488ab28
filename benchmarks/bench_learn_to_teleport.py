"""Cost of learning to teleport (``symalg.applications.learn_to_teleport``) against gradient descent, same run.

Per method on the LeakyReLU task (``W₁, W₂, X, Y ∈ R^{20×20}``): the wall time of one test step (the trained
meta-optimiser applied, no meta-gradient) and of one meta-training step (the unrolled step with its graph, the
window's backward and Adam step shared out), each as a ratio to one GD step measured in the same call. Hidden size
300 (printed) and 32 (the reduced run of docs/learn_to_teleport.md); ``quick``: 6 × 6 matrices, hidden 8.

    python benchmarks/bench_learn_to_teleport.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from symalg.applications.learn_to_teleport import MODES, MetaOptimizer, evaluate, gd_curves, leaky_relu_task, meta_train


def figures(quick: bool = False) -> dict:
    """``{"size", "gd_s_per_step", "methods": {hidden: {mode: {"test_s_per_step", "train_s_per_step", ratios}}}}``."""
    torch.set_num_threads(1)
    size, steps = (6, 10) if quick else (20, 20)
    hiddens = (8,) if quick else (32, 300)
    tasks = [leaky_relu_task(s, size=size) for s in range(2)]
    gd_curves(tasks[:1], 3e-4, 2)
    gd = gd_curves(tasks, 3e-4, steps).seconds_per_step
    out: dict = {"size": size, "steps": steps, "gd_s_per_step": gd, "methods": {}}
    for hidden in hiddens:
        rows = {}
        for mode in MODES:
            torch.manual_seed(0)
            meta = MetaOptimizer(mode, hidden=hidden)
            evaluate(meta, tasks[:1], 2)                      # warm-up: first calls of the kernels
            test = evaluate(meta, tasks, steps).seconds_per_step
            start = time.perf_counter()
            meta_train(meta, tasks, steps=steps, unroll=min(10, steps))
            train = (time.perf_counter() - start) / (steps * len(tasks))
            rows[mode] = {"test_s_per_step": test, "train_s_per_step": train, "test_vs_gd": test / gd,
                          "train_vs_gd": train / gd}
        out["methods"][str(hidden)] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    result = figures(parser.parse_args().quick)
    print(f"size {result['size']}, GD: {result['gd_s_per_step'] * 1e3:.2f} ms/step")
    print(f"{'hidden':>6s} {'method':14s} {'test ms/step':>13s} {'× GD':>7s} {'train ms/step':>14s} {'× GD':>7s}")
    for hidden, rows in result["methods"].items():
        for mode, r in rows.items():
            print(f"{hidden:>6s} {mode:14s} {r['test_s_per_step'] * 1e3:13.2f} {r['test_vs_gd']:7.1f} "
                  f"{r['train_s_per_step'] * 1e3:14.2f} {r['train_vs_gd']:7.1f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
