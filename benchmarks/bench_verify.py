"""``symalg.verify`` against depth: time, CPU time and memory of verifying deep MLPs (a script, not a test).

Model: ``nn.Sequential(Linear(w, w), ReLU(), …, Linear(w, w))`` with ``L`` linear layers of width ``w = 16``, in
float64, example input ``(8, w)``; traced and derived (certification included) before the clock starts. It has
``2(L − 1)`` claims (``PositiveScaling(16)`` and ``S(16)`` on every hidden site) and ``L − 1`` conserved quantities,
so ``6(L − 1) + 1`` checks. Each depth runs in a fresh process (``--quick``: in this one), which first verifies a
two-layer model so that one-time costs (torch.func's first use, SymPy's caches) stay out of the figures; that
warm-up is reported as ``first_call_s``.

Baseline, in the same process: one gradient evaluation of the loss verify uses (``functional_call`` forward and
backward, median of 5). ``verify / gradient`` is verify's cost in gradient evaluations: constant in ``L`` when verify
is linear in the number of claims and parameters. ``exponent`` is ``log(t₂/t₁) / log(L₂/L₁)`` between consecutive
depths (1: linear). Memory: growth of the process's peak RSS during ``verify`` (the model's float64 copy, the
gradients, the integrators' states), MiB.

Usage::

    python benchmarks/bench_verify.py                       # depths 10, 100, 1000 (about 2 min idle)
    python benchmarks/bench_verify.py --depths 10 100 300   # others
    python benchmarks/bench_verify.py --quick               # depths 3 and 12 in this process, seconds
    python benchmarks/bench_verify.py --orthogonality 1 768 12   # orthogonality checks: regions against folded

``--orthogonality LAYERS D_MODEL HEADS`` times only verify's gradient-orthogonality checks of the transformer of
``bench_transformer.py`` (:func:`orthogonality`): region by region, as ``verify`` checks, against the folded tangents
of the parameters' size, CPU time of this process on the same gradient and generators.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys

import torch

from benchlib import machine, maxrss_mib, timed, write_json

WIDTH = 16
DEPTHS = (10, 100, 1000)
QUICK_DEPTHS = (3, 9)


def mlp(depth: int, width: int = WIDTH) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i in range(depth):
        layers += [torch.nn.Linear(width, width)] + ([torch.nn.ReLU()] if i < depth - 1 else [])
    return torch.nn.Sequential(*layers).double()


def measure(depth: int, width: int = WIDTH) -> dict:
    """One depth, in this process: the warm-up, then verify and its baseline."""
    import symalg

    x = torch.randn(8, width, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    first, _, _ = timed(lambda: symalg.verify(symalg.derive(symalg.trace(mlp(2, width), (x,)))))
    model = mlp(depth, width)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    params = {k: v.detach() for k, v in model.named_parameters()}
    target = torch.randn(8, width, dtype=torch.float64)

    def gradient() -> object:
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        loss = ((torch.func.functional_call(model, leaves, (x,)) - target) ** 2).mean()
        return torch.autograd.grad(loss, list(leaves.values()))

    gradient()
    baseline = statistics.median(timed(gradient)[0] for _ in range(5))
    before = maxrss_mib()
    wall, cpu, report = timed(lambda: symalg.verify(analysis))
    return {"depth": depth, "width": width, "parameters": sum(p.numel() for p in params.values()),
            "claims": len(analysis.symmetries), "checks": len(report.checks), "passed": report.passed,
            "verify_s": wall, "verify_cpu_s": cpu, "gradient_ms": 1e3 * baseline,
            "verify_per_gradient": wall / baseline,
            "rss_growth_mib": maxrss_mib() - before, "first_call_s": first}


def run(depths: tuple[int, ...], fresh: bool) -> list[dict]:
    rows = []
    for depth in depths:
        if fresh:
            done = subprocess.run([sys.executable, __file__, "--_child", str(depth)], capture_output=True, text=True,
                                  check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            rows.append(measure(depth))
        previous = rows[-2] if len(rows) > 1 else None
        rows[-1]["exponent"] = (math.log(rows[-1]["verify_s"] / previous["verify_s"]) /
                                math.log(depth / previous["depth"])) if previous else None
    return rows


def orthogonality(layers: int = 1, d_model: int = 768, heads: int = 12) -> dict:
    """CPU time of verify's gradient-orthogonality checks on the transformer of ``bench_transformer.py``: every
    symmetry with disjoint regions checked region by region (``Symmetry.region_tangent``, what ``verify`` does)
    against the baseline, the folded ``Symmetry.tangent`` (one tensor of the parameter's size per generator and
    binding: 64 copies of a packed ``3d × d`` projection per head), on the same gradient and generators."""
    from bench_transformer import build_model

    import symalg
    from symalg.verification.checks import check_gradient_orthogonality, gradient_norm, loss_gradients

    model = build_model(layers, d_model, heads).double()
    x = torch.randn(1, 4, d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    analysis = symalg.derive(symalg.trace(model, (x,)), certify=False)
    params = {k: v.detach() for k, v in model.named_parameters()}
    grads = loss_gradients(lambda p: (torch.func.functional_call(model, p, (x,)) ** 2).sum(), params)
    norm = gradient_norm(grads)
    times = {"regions": 0.0, "folded": 0.0}
    worst = {"regions": 0.0, "folded": 0.0}
    checked = [s for s in analysis.symmetries if s.disjoint_regions is not None]
    for symmetry in checked:
        basis = symmetry.group.algebra_sample(64, torch.Generator().manual_seed(2), torch.float64, "cpu")
        unfolded = {b: b.unfold(grads[b.tensor]) for b, *_ in symmetry.disjoint_regions if b.tensor in grads}
        for path, tangent, against in (("regions", lambda M, s=symmetry: s.region_tangent(params, M), unfolded),
                                       ("folded", lambda M, s=symmetry: s.tangent(params, M), grads)):
            _, seconds, result = timed(lambda: check_gradient_orthogonality(
                symmetry.label, tangent, basis, against, 1e-9, grad_norm=norm, vectorised=True))
            times[path] += seconds
            worst[path] = max(worst[path], result.max_error)
    return {"layers": layers, "d_model": d_model, "symmetries": len(checked), "regions_s": times["regions"],
            "folded_s": times["folded"], "speed_up": times["folded"] / times["regions"],
            "worst_cosine_regions": worst["regions"], "worst_cosine_folded": worst["folded"]}


def figures(quick: bool = False) -> dict:
    """The figures of :func:`run` (``quick``: depths 3 and 12 in this process) and of :func:`orthogonality`
    (``quick``: width 48)."""
    torch.set_num_threads(1)
    return {"depths": run(QUICK_DEPTHS if quick else DEPTHS, fresh=not quick),
            "orthogonality": orthogonality(d_model=48, heads=4) if quick else orthogonality()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", help=f"numbers of linear layers (default {DEPTHS})")
    parser.add_argument("--quick", action="store_true", help=f"depths {QUICK_DEPTHS} in this process")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--orthogonality", type=int, nargs=3, metavar=("LAYERS", "D_MODEL", "HEADS"),
                        help="only the gradient-orthogonality checks of a transformer, region by region against "
                             "folded tangents (e.g. 1 768 12)")
    parser.add_argument("--_child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args._child:
        print(json.dumps(measure(args._child)))
        return
    if args.orthogonality:
        print(json.dumps({"machine": machine(), **orthogonality(*args.orthogonality)}, indent=1))
        return
    print(json.dumps(machine()))
    rows = run(tuple(args.depths) if args.depths else QUICK_DEPTHS if args.quick else DEPTHS, fresh=not args.quick)
    print("\n| depth L | parameters | claims | checks | verify s | CPU s | gradient ms | verify / gradient | "
          "exponent | +RSS MiB | passed |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        exponent = f"{r['exponent']:.2f}" if r["exponent"] is not None else "–"
        print(f"| {r['depth']} | {r['parameters']:,} | {r['claims']} | {r['checks']} | {r['verify_s']:.2f} | "
              f"{r['verify_cpu_s']:.2f} | {r['gradient_ms']:.1f} | {r['verify_per_gradient']:.0f} | {exponent} | "
              f"{r['rss_growth_mib']:.0f} | {r['passed']} |")
    print(f"\nload average after: {machine()['load_average']}")
    write_json(args.json, {"depths": rows})


if __name__ == "__main__":
    main()
