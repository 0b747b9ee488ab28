"""Noether laws of training dynamics on a GPT-style transformer: law generation and verification (a script, not a
test).

Model: :func:`bench_transformer.build_model` (pre-norm blocks of ``nn.MultiheadAttention`` and a GELU MLP, final
``LayerNorm`` and a linear head) with ``--layers`` blocks (default 12), ``d_model`` 64 and 4 heads (``--quick``: 2
blocks, ``d_model`` 32), float64, example input ``(2, 4, d_model)``; traced and derived (certification included)
before the clock starts. Stages, each timed once in this process with ``time.perf_counter``:

* ``laws``: ``noether.laws(analysis, dyn)`` for gradient flow, Newtonian, heavy ball and Nesterov's flow (SymPy
  decay laws included; the first call pays SymPy's integration, so it is reported separately);
* ``verify``: ``symalg.verify(analysis)`` (the baseline: the checks without dynamics);
* ``verify + dynamics``: ``symalg.verify(analysis, dynamics=[...])`` with heavy ball, Nesterov's flow, torch SGD
  with Nesterov momentum and weight decay, the paper's Newtonian scheme and Adam.

``noether / verify`` is the cost the dynamics add, against the baseline measured in the same run; ``gradient`` (one
forward and backward pass of the loss verify uses, median of 5) gives it in gradient evaluations. The figures also
give the number of laws by status and the worst ``error / tolerance`` of the added checks.

Usage::

    python benchmarks/bench_noether.py              # 12 blocks, d_model 64
    python benchmarks/bench_noether.py --quick      # 2 blocks, d_model 32 (seconds)
    python benchmarks/bench_noether.py --layers 12 --d-model 128 --heads 8
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from bench_transformer import build_model
from benchlib import machine, timed


def measure(layers: int, d_model: int, heads: int) -> dict:
    import symalg
    from symalg import noether

    model = build_model(layers, d_model, heads).double().eval()
    x = torch.randn(2, 4, d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def gradient() -> None:
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        out = torch.func.functional_call(model, leaves, (x,))
        torch.autograd.grad((out ** 2).mean(), list(leaves.values()))

    gradient_s = statistics.median(timed(gradient)[0] for _ in range(5))
    flows = [noether.gradient_flow(), noether.newtonian(), noether.heavy_ball(1.0), noether.nesterov_flow()]
    first_s, _, _ = timed(lambda: noether.laws(analysis, flows[0]))
    laws_s, _, generated = timed(lambda: [noether.laws(analysis, dyn) for dyn in flows])
    statuses: dict[str, int] = {}
    for table in generated:
        for law in table:
            key = f"{table.dynamics.name.split(' (')[0]}: {law.status}"
            statuses[key] = statuses.get(key, 0) + 1
    verify_s, _, report = timed(lambda: symalg.verify(analysis))
    dynamics = [noether.heavy_ball(1.0), noether.nesterov_flow(),
                noether.momentum(0.01, 0.9, nesterov=True, weight_decay=1e-3), noether.paper_newtonian(0.01),
                noether.adam(1e-3)]
    noether_s, _, full = timed(lambda: symalg.verify(analysis, dynamics=dynamics))
    added = [c for c in full.checks if c.check.startswith("noether")]
    worst = max(added, key=lambda c: c.max_error / c.tolerance)
    return {"layers": layers, "d_model": d_model, "heads": heads, "parameters": sum(p.numel() for p in params.values()),
            "symmetries": len(analysis.symmetries), "laws_by_status": statuses, "laws_first_call_s": first_s,
            "laws_four_dynamics_s": laws_s, "gradient_s": gradient_s, "verify_s": verify_s,
            "verify_with_dynamics_s": noether_s, "noether_over_verify": (noether_s - verify_s) / verify_s,
            "noether_in_gradients": (noether_s - verify_s) / gradient_s, "noether_checks": len(added),
            "noether_passed": all(c.passed for c in added), "baseline_passed": report.passed,
            "worst_error_over_tolerance": worst.max_error / worst.tolerance, "worst_check": str(worst)[:160]}


def figures(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    return measure(2, 32, 4) if quick else measure(12, 64, 4)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = figures(True) if args.quick else measure(args.layers, args.d_model, args.heads)
    print(json.dumps({"machine": machine(), "figures": result}, indent=1))


if __name__ == "__main__":
    main()
