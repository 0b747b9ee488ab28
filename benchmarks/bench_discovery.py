"""Exact symmetry discovery time vs parameter count (a script, not a test).

Models ``linear(n, h) -> relu -> linear(h, m)`` (and the ``identity`` bottleneck, whose algebra ``gl(h) ⋉ R^h``
grows with ``h²``) at growing widths; for each, :func:`symalg.discover` with ``blocks="all"`` (``P² + P``
unknowns) and, beyond :data:`~symalg.discovery.exact.MAX_UNKNOWNS`, ``"local"``. Figures: parameters ``P``,
unknowns, samples, rows, discovered and derived dimensions, seconds with and without the comparison with the
derived symmetries (``compare``: ``P + 1`` evaluations of their action), the baseline being the same model's
``symalg.derive`` in the same run. Float64, the machine's threads.
Run: ``python benchmarks/bench_discovery.py [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import time

import symalg

WIDTHS = {"quick": (2,), "full": (2, 3, 4, 6, 8)}


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


def figures(quick: bool = False) -> dict:
    rows = []
    symalg.discover("linear(1, 1) -> relu -> linear(1, 1)", compare=False)   # warm-up: torch.func's first call
    for h in WIDTHS["quick" if quick else "full"]:
        for act in ("relu", "identity"):
            spec = f"linear(2, {h}) -> {act} -> linear({h}, 2)"
            rows.append(_row(spec, "auto"))
    if not quick:
        rows.append(_row("linear(2, 4) -> relu -> linear(4, 4) -> relu -> linear(4, 4) -> relu -> linear(4, 2)",
                         "local"))
    return {"rows": rows}


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


if __name__ == "__main__":
    main()
