"""Mirror enumeration and certification time: a 12-layer transformer and an MLP of width 4096.

    python benchmarks/bench_mirrors.py [--quick]

For each model: ``derive`` (the baseline, same process), :func:`symalg.mirrors` (enumeration with the orthogonality and
``P = OOᵀ`` checks of every involution), and :func:`~symalg.applications.mirrors.certify` of one mirror per family
(invariance, stationarity, GD/SGD/Adam, Fisher, ``PH = HP``) on a batch of 2, float32, one thread. Prints the figures
of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import symalg
from symalg.applications.mirrors import certify, per_sample_loss


def _family(name: str) -> str:
    return name.split(" (")[0].split(" of")[0].rstrip("0123456789 ").split(",")[0]


def measure(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, certify_count: int) -> dict:
    """Wall and CPU (``time.process_time``) seconds of derive, enumeration and certification."""
    start, cpu = time.perf_counter(), time.process_time()
    analysis = symalg.derive(symalg.trace(model, (x,)))
    derive_s, derive_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    found = symalg.mirrors(analysis)
    enumerate_s, enumerate_cpu = time.perf_counter() - start, time.process_time() - cpu
    families: dict[str, object] = {}
    for mirror in found.constraints:
        families.setdefault(f"{mirror.symmetry.group.symbol}:{_family(mirror.name)}", mirror)
    chosen = list(families.values())[:certify_count]
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss = per_sample_loss(model)
    start, cpu = time.perf_counter(), time.process_time()
    worst = 0.0
    for mirror in chosen:
        cert = certify(mirror, loss, params, (x, y), lrs=(1e-3,), weight_decays=(1e-2,), steps=1)
        errors = [cert.invariance, cert.stationarity, cert.gd, cert.sgd, cert.fisher, cert.commutation]
        worst = max([worst] + errors + ([cert.adam] if cert.coordinate_compatible else []))
    certify_s, certify_cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"parameters": sum(p.numel() for p in model.parameters()), "symmetries": len(analysis.symmetries),
            "mirrors": len(found.mirrors), "constraints": len(found.constraints), "without_mirror": len(found.without),
            "derive_s": derive_s, "derive_cpu_s": derive_cpu, "enumerate_s": enumerate_s,
            "enumerate_cpu_s": enumerate_cpu,
            "enumerate_over_derive_cpu": enumerate_cpu / derive_cpu, "certified": len(chosen), "certify_s": certify_s,
            "certify_cpu_s": certify_cpu, "certify_cpu_s_per_mirror": certify_cpu / max(len(chosen), 1),
            "certify_worst_error": worst, "families": sorted(families)}


def _transformer(layers: int, d_model: int, heads: int) -> torch.nn.Module:
    from bench_transformer import build_model
    return build_model(layers, d_model, heads)


def figures(quick: bool = False) -> dict:
    """Transformer (12 layers × 768, 12 heads; quick: 2 × 64, 4 heads) and MLP ``linear(256, w) → relu → linear(w, w)
    → tanh → linear(w, 10)`` (w = 4096; quick: 256), float32, one thread."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers, d_model, heads, width = (2, 64, 4, 256) if quick else (12, 768, 12, 4096)
    tf = _transformer(layers, d_model, heads)
    x = torch.randn(2, 4, d_model)
    out = {"transformer": {"layers": layers, "d_model": d_model, "heads": heads,
                           **measure(tf, x, torch.randn(2, 4, d_model), 8)}}
    mlp = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                              torch.nn.Tanh(), torch.nn.Linear(width, 10))
    x = torch.randn(2, 256)
    out["mlp"] = {"width": width, **measure(mlp, x, torch.randn(2, 10), 8)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(json.dumps(figures(args.quick), indent=1))


if __name__ == "__main__":
    import os
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
