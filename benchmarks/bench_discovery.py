"""Exact symmetry discovery time vs parameter count (a script, not a test).

Models ``linear(n, h) -> relu -> linear(h, m)`` (and the ``identity`` bottleneck, whose algebra ``gl(h) ⋉ R^h``
grows with ``h²``) at growing widths; for each, :func:`symalg.discover` with ``blocks="all"`` (``P² + P``
unknowns) and, beyond :data:`~symalg.discovery.exact.MAX_UNKNOWNS`, ``"local"``. Figures: parameters ``P``,
unknowns, samples, rows, discovered and derived dimensions, seconds with and without the comparison with the
derived symmetries (``compare``: ``P + 1`` evaluations of their action), the baseline being the same model's
``symalg.derive`` in the same run. Float64, the machine's threads.
The null-space solvers are compared on the same stacked rows in the same run (``solver_rows``): the dense SVD
(``solver="svd"``, the baseline) against the Gram solver (``"gram"``: ``eigh`` of ``RᵀR``, then the SVD of the
thin ``R V`` on the candidates), timing the solve alone and the sampling loop's rank test with each, and checking
that both return the same space (largest principal angle) with the Gram solver's certificate.
The axes ansatz (``scaling_rows``): ``blocks="axes"`` (unknowns ``≈ Σ_T Σ_a n_a² + P``) at widths up to 32, with the
dense ``blocks="all"`` baseline in the same run at the widths where it fits (a time ratio and the same dimension),
each run with the comparison with the derived symmetries and the finite checks.
Run: ``python benchmarks/bench_discovery.py [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import time

import math

import torch

import symalg
from symalg.discovery import exact

WIDTHS = {"quick": (2,), "full": (2, 3, 4, 6, 8)}
AXES_WIDTHS = {"quick": ((2, True),), "full": ((4, True), (8, True), (16, False), (24, False), (32, False))}
"""``(width, with the dense baseline)`` of the axes-ansatz rows."""
SOLVER_WIDTHS = {"quick": (3,), "full": (3, 5, 7, 9)}


def _row(spec: str, blocks: str) -> dict:
    start = time.perf_counter()
    analysis = symalg.derive(spec)
    derive_s = time.perf_counter() - start
    start = time.perf_counter()
    bare = symalg.discover(analysis, blocks=blocks, compare=False)
    bare_s = time.perf_counter() - start
    start = time.perf_counter()
    full = symalg.discover(analysis, blocks=blocks)
    full_s = time.perf_counter() - start
    return {"spec": spec, "blocks": blocks, "parameters": full.parameters, "unknowns": full.unknowns,
            "samples": bare.samples, "rows": bare.rows, "discovered": full.dimension,
            "derived": full.derived_dimension, "new": full.new, "unconfirmed": len(full.unconfirmed_labels),
            "derive_s": derive_s, "discover_s": bare_s, "discover_compare_s": full_s,
            "ratio_to_derive": bare_s / derive_s}


def _timed(analysis: object, blocks: str) -> tuple[symalg.discovery.Discovery, float]:
    start = time.perf_counter()
    report = symalg.discover(analysis, blocks=blocks)
    return report, time.perf_counter() - start


def _scaling_row(act: str, h: int, baseline: bool) -> dict:
    """``discover(blocks="axes")`` and, with ``baseline``, ``"all"`` on ``linear(2, h) -> act -> linear(h, 2)``."""
    spec = f"linear(2, {h}) -> {act} -> linear({h}, 2)"
    analysis = symalg.derive(spec)
    axes, axes_s = _timed(analysis, "axes")
    row = {"spec": spec, "parameters": axes.parameters, "axes_unknowns": axes.unknowns, "samples": axes.samples,
           "rows": axes.rows, "dimension": axes.dimension, "derived": axes.derived_dimension,
           "explained": axes.explained, "new": axes.new, "outside": len(axes.outside), "confirmed": axes.confirmed,
           "complete": bool(axes.certificate and axes.certificate.complete), "axes_s": axes_s}
    if baseline:
        dense, dense_s = _timed(analysis, "all")
        row.update(all_unknowns=dense.unknowns, all_dimension=dense.dimension, all_s=dense_s,
                   ratio=dense_s / axes_s)
    return row


def scaling_rows(quick: bool = False) -> list[dict]:
    """The axes ansatz against the dense baseline (module docstring)."""
    return [_scaling_row(act, h, baseline) for h, baseline in AXES_WIDTHS["quick" if quick else "full"]
            for act in ("relu", "identity")]


def _stacked_rows(spec: str) -> tuple[int, torch.Tensor]:
    """The rows ``discover(spec, blocks="all")`` stacks (the sampling loop run to its end once)."""
    analysis = symalg.derive(spec)
    problem = exact._Problem(analysis, None, "function", 0)
    names = tuple(n for n, v in problem.params.items() if v.numel())
    shapes = {n: tuple(problem.params[n].shape) for n in names}
    sizes = {n: math.prod(shapes[n]) for n in names}
    layout = exact.ParameterLayout(names, shapes, exact._blocks(names, sizes, "all", True, 10 ** 9), True)
    return layout.P, exact._constraints(problem, layout, 1.3, stack=True).matrix()


def _solver_row(spec: str) -> dict:
    P, R = _stacked_rows(spec)
    timings, spaces = {}, {}
    for name, solve, rank in (("svd", exact._svd_null_space, lambda M: int(torch.linalg.matrix_rank(M, rtol=1e-10))),
                              ("gram", exact._gram_null_space, exact._gram_rank)):
        start = time.perf_counter()
        N, decision, certificate = solve(R, 1e-9)
        timings[name] = time.perf_counter() - start
        start = time.perf_counter()
        rank(R)
        timings[name + "_rank"] = time.perf_counter() - start
        spaces[name] = (N, decision, certificate)
    (Ns, ds, _), (Ng, dg, cg) = spaces["svd"], spaces["gram"]
    # sin of the largest principal angle, ‖(I − Nsᵀ Ns) Ngᵀ‖₂ (arccos of the cosines loses everything below 1e-8)
    angle = float(torch.linalg.matrix_norm(Ng.T - Ns.T @ (Ns @ Ng.T), ord=2)) if Ns.shape[0] == Ng.shape[0] and \
        Ns.shape[0] else (0.0 if Ns.shape[0] == Ng.shape[0] else 1.0)
    return {"spec": spec, "parameters": P, "rows": R.shape[0], "unknowns": R.shape[1], "dimension_svd": Ns.shape[0],
            "dimension_gram": Ng.shape[0], "sin_largest_angle": angle, "gap_svd": ds.gap, "gap_gram": dg.gap,
            "residual_gram": cg.residual, "floor_gram": cg.floor, "complete_gram": cg.complete,
            "candidates": cg.candidates, "svd_s": timings["svd"], "gram_s": timings["gram"],
            "svd_rank_s": timings["svd_rank"], "gram_rank_s": timings["gram_rank"],
            "speedup": timings["svd"] / timings["gram"], "rank_speedup": timings["svd_rank"] / timings["gram_rank"]}


def figures(quick: bool = False) -> dict:
    solver_rows = [_solver_row(f"linear(2, {h}) -> relu -> linear({h}, 2)")
                   for h in SOLVER_WIDTHS["quick" if quick else "full"]]
    rows = []
    symalg.discover("linear(1, 1) -> relu -> linear(1, 1)", compare=False)   # warm-up: torch.func's first call
    for h in WIDTHS["quick" if quick else "full"]:
        for act in ("relu", "identity"):
            spec = f"linear(2, {h}) -> {act} -> linear({h}, 2)"
            rows.append(_row(spec, "auto"))
    if not quick:
        rows.append(_row("linear(2, 4) -> relu -> linear(4, 4) -> relu -> linear(4, 4) -> relu -> linear(4, 2)",
                         "local"))
    return {"rows": rows, "solver_rows": solver_rows, "scaling_rows": scaling_rows(quick)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = figures(args.quick)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{'model':58s} {'blocks':6s} {'P':>4s} {'unknowns':>8s} {'disc':>4s} {'der':>4s} {'derive s':>8s} "
          f"{'discover s':>10s} {'+compare s':>10s}")
    for r in result["rows"]:
        print(f"{r['spec']:58s} {r['blocks']:6s} {r['parameters']:4d} {r['unknowns']:8d} {r['discovered']:4d} "
              f"{r['derived']:4d} {r['derive_s']:8.3f} {r['discover_s']:10.2f} {r['discover_compare_s']:10.2f}")
    print(f"\n{'solver comparison (same rows, blocks=all)':44s} {'P':>3s} {'rows×unknowns':>13s} {'dim':>7s} "
          f"{'sin∠':>8s} {'svd s':>7s} {'gram s':>7s} {'×':>5s} {'rank svd s':>10s} {'rank gram s':>11s} "
          f"{'residual':>8s} {'floor':>7s}")
    for r in result["solver_rows"]:
        print(f"{r['spec']:44s} {r['parameters']:3d} {r['rows']:6d}×{r['unknowns']:<6d} "
              f"{r['dimension_svd']:3d}/{r['dimension_gram']:<3d} {r['sin_largest_angle']:8.1e} {r['svd_s']:7.2f} "
              f"{r['gram_s']:7.2f} {r['speedup']:5.1f} {r['svd_rank_s']:10.2f} {r['gram_rank_s']:11.2f} "
              f"{r['residual_gram']:8.1e} {r['floor_gram']:7.1e}")
    print(f"\n{'axes ansatz vs all blocks':44s} {'P':>4s} {'axes n':>7s} {'dim':>4s} {'der':>4s} {'axes s':>8s} "
          f"{'all n':>7s} {'all dim':>7s} {'all s':>8s} {'×':>6s}")
    for r in result["scaling_rows"]:
        dense = (f"{r['all_unknowns']:7d} {r['all_dimension']:7d} {r['all_s']:8.2f} {r['ratio']:6.1f}"
                 if "all_s" in r else "")
        print(f"{r['spec']:44s} {r['parameters']:4d} {r['axes_unknowns']:7d} {r['dimension']:4d} {r['derived']:4d} "
              f"{r['axes_s']:8.2f} {dense}")


if __name__ == "__main__":
    main()
