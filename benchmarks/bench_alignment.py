"""Cost of aligning two networks by the derived groups, against permutation-only alignment (git re-basin).

    python benchmarks/bench_alignment.py [--quick]

Two independently initialised (untrained) networks of one architecture: an MLP ``d → w → w → 10`` (ReLU) and a
norm-free attention block (``examples/alignment_barriers.py``'s ``SortBlock``, widths scaled). For each group set of
:data:`symalg.applications.alignment.PRESETS` (except none): wall and CPU seconds of :func:`weight_matching`
(4 sweeps) and of :func:`activation_matching` on a batch, their ratio to the permutation-only time measured in the same
run, and the weight distance reached. ``derive`` (the analysis the alignment needs) is timed as the baseline of the
whole pipeline. float64, one thread.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import time

import torch

import symalg
from symalg.applications import alignment as al

_EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "alignment_barriers.py")


def _sort_block() -> type:
    spec = importlib.util.spec_from_file_location("alignment_barriers", _EXAMPLE)
    module = importlib.util.module_from_spec(spec)   # type: ignore[arg-type]
    spec.loader.exec_module(module)                  # type: ignore[union-attr]
    return module.SortBlock


def _timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def measure(make, x: torch.Tensor) -> dict:
    torch.manual_seed(0)
    model_a = make()
    torch.manual_seed(1)
    model_b = make()
    analysis, derive_s, _ = _timed(lambda: symalg.derive(symalg.trace(model_a, (x,))))
    a = {k: v.detach() for k, v in model_a.named_parameters()}
    b = {k: v.detach() for k, v in model_b.named_parameters()}
    al.weight_matching(analysis, a, b, ("S",), sweeps=1)      # warm-up: imports scipy's assignment solver
    rows = []
    for preset, kinds in al.PRESETS.items():
        if not kinds:
            continue
        w, w_s, w_cpu = _timed(lambda: al.weight_matching(analysis, a, b, kinds))
        act, a_s, a_cpu = _timed(lambda: al.activation_matching(analysis, model_a, a, b, x, kinds))
        rows.append({"groups": preset, "weights_s": w_s, "weights_cpu_s": w_cpu, "activations_s": a_s,
                     "activations_cpu_s": a_cpu, "distance_before": w.distances[0],
                     "distance_weights": w.distances[-1], "distance_activations": act.distances[-1]})
    base = rows[0]
    for row in rows:
        row["weights_ratio_to_permutation"] = row["weights_cpu_s"] / base["weights_cpu_s"]
        row["activations_ratio_to_permutation"] = row["activations_cpu_s"] / base["activations_cpu_s"]
    return {"parameters": sum(p.numel() for p in model_a.parameters()), "derive_s": derive_s, "rows": rows}


def figures(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        width = 32 if quick else 256
        mlp = measure(lambda: torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                                  torch.nn.Linear(width, width), torch.nn.ReLU(),
                                                  torch.nn.Linear(width, 10)), torch.randn(256, 64))
        block = _sort_block()
        d = 16 if quick else 32
        tokens = torch.randint(0, 8, (64, 6), generator=torch.Generator().manual_seed(0))
        transformer = measure(lambda: block(d=d, heads=2 if quick else 4, hidden=2 * d), tokens)
    finally:
        torch.set_default_dtype(dtype)
    return {"mlp_width": width, "mlp": mlp, "transformer_width": d, "transformer": transformer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    result = figures(args.quick)
    for name in ("mlp", "transformer"):
        r = result[name]
        print(f"{name}: {r['parameters']} parameters, derive {r['derive_s']:.2f} s")
        print(f"  {'groups':28s} {'weights_s':>9s} {'ratio':>6s} {'activ_s':>8s} {'ratio':>6s} "
              f"{'dist_before':>11s} {'dist_w':>8s} {'dist_act':>8s}")
        for row in r["rows"]:
            print(f"  {row['groups']:28s} {row['weights_s']:9.3f} {row['weights_ratio_to_permutation']:6.2f} "
                  f"{row['activations_s']:8.3f} {row['activations_ratio_to_permutation']:6.2f} "
                  f"{row['distance_before']:11.3f} {row['distance_weights']:8.3f} {row['distance_activations']:8.3f}")


if __name__ == "__main__":
    main()
