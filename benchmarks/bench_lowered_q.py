"""Lowered conserved quantities and group actions against hand-written torch (a script, not a test).

Two-layer networks with ``n = h = m`` at each width of ``--widths`` (default 32, 256, 1024):

* identity site ``linear(n, h) -> identity -> linear(h, m)`` (group ``GL(h)``): the matrix
  ``C = W1 W1ᵀ + b1 b1ᵀ − W2ᵀ W2`` (h × h);
* ReLU site ``linear(n, h) -> relu -> linear(h, m)`` (positive scaling): the vector
  ``q = rowsum(W1∘W1) + b1∘b1 − colsum(W2∘W2)`` (length h; returned as a vector of shape ``(h,)``).

Each lowered callable (``q(params)``, i.e. ``q.lowered(params)``, a dict ``{name: value}``) is timed against the
hand-written torch expression a user would type, on the same tensors (:func:`benchlib.interleaved`): every statement
runs the same number of calls per block (blocks of ~50 ms), the statements are interleaved block by block for 30
rounds (rotating the order), and the clock is the process's CPU time (one torch thread; ``--wall`` for wall time),
so that load from other processes hits all of them alike. Reported: the median time per call, ``/ hand`` =
median(lowered) / median(hand), ``paired`` = median over rounds of the per-round ratio (the most robust figure on a
shared machine) and ``min/min``. Values are checked to agree (``torch.testing.assert_close``) before timing. A second,
"optimised" hand-written variant (``addmm_`` in place; row norms by ``vector_norm``; ``linalg.solve`` instead of
``inv``; index gathering instead of a dense permutation matrix) is shown for reference but is not the target.

At ``--action-width`` (default 1024; skip with ``--no-actions``): ``analysis.symmetries[i].apply(params, g)`` against
the hand-written action for positive scaling (ReLU), permutations (ReLU) and ``GL(h)`` (identity; its membership check
``group.check_element(g)`` alone is a reference row), and a random Lie-algebra element of ``GL(h)``
(``group.gaussian_algebra_element``) against ``torch.randn(h, h)``.

Usage::

    python benchmarks/bench_lowered_q.py              # float64 + float32, 1 thread, ~3 min idle
    python benchmarks/bench_lowered_q.py --quick      # 8 rounds
    python benchmarks/bench_lowered_q.py --threads 0  # torch's default thread count
    python benchmarks/bench_lowered_q.py --dtypes float32 --no-actions --show-source
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

import symalg
from benchlib import interleaved, machine, ratios, write_json

IDENTITY_SPEC = "linear(n, h) -> identity -> linear(h, m)"
RELU_SPEC = "linear(n, h) -> relu -> linear(h, m)"


def make_params(width: int, dtype, seed: int = 0) -> dict:
    """Parameters of the two-layer network (names as in ``nn.Sequential``: the identity layer is
    module 1 but has no parameters, so the second linear layer is ``2.*`` in both specs)."""
    g = torch.Generator().manual_seed(seed)
    scale = width ** -0.5
    return {"0.weight": torch.randn(width, width, generator=g, dtype=dtype) * scale,
            "0.bias": torch.randn(width, generator=g, dtype=dtype) * scale,
            "2.weight": torch.randn(width, width, generator=g, dtype=dtype) * scale,
            "2.bias": torch.randn(width, generator=g, dtype=dtype) * scale}


# Hand-written references (what a user would write from the formulas).
def C_hand(P):
    W1, b1, W2 = P["0.weight"], P["0.bias"], P["2.weight"]
    return W1 @ W1.T + torch.outer(b1, b1) - W2.T @ W2


def C_hand_addmm(P):
    W1, b1, W2 = P["0.weight"], P["0.bias"], P["2.weight"]
    return torch.addmm(torch.outer(b1, b1), W1, W1.T).addmm_(W2.T, W2, alpha=-1)


def q_hand(P):
    W1, b1, W2 = P["0.weight"], P["0.bias"], P["2.weight"]
    return (W1 * W1).sum(1) + b1 * b1 - (W2 * W2).sum(0)


def q_hand_norm(P):
    # Row norms without an h x h temporary (vector_norm over the contiguous axis); the column part
    # stays a square-and-sum (vector_norm over dim 0 of a row-major matrix is ~10x slower).
    W1, b1, W2 = P["0.weight"], P["0.bias"], P["2.weight"]
    return torch.linalg.vector_norm(W1, dim=1).square() + b1 * b1 - (W2 * W2).sum(0)


def scaling_hand(P, d):
    return {**P, "0.weight": d[:, None] * P["0.weight"], "0.bias": d * P["0.bias"], "2.weight": P["2.weight"] / d}


def permutation_hand(P, g):
    return {**P, "0.weight": g @ P["0.weight"], "0.bias": g @ P["0.bias"], "2.weight": P["2.weight"] @ g.T}


def permutation_gather(P, perm):
    return {**P, "0.weight": P["0.weight"][perm], "0.bias": P["0.bias"][perm], "2.weight": P["2.weight"][:, perm]}


def gl_hand(P, g):
    return {**P, "0.weight": g @ P["0.weight"], "0.bias": g @ P["0.bias"],
            "2.weight": P["2.weight"] @ torch.linalg.inv(g)}


def gl_hand_solve(P, g):
    return {**P, "0.weight": g @ P["0.weight"], "0.bias": g @ P["0.bias"],
            "2.weight": torch.linalg.solve(g, P["2.weight"], left=False)}


def check_close(a, b, what):
    """``a`` and ``b``: tensors or dicts of tensors; raise with ``what`` in the message if they differ."""
    if isinstance(a, dict):
        for key in b:
            check_close(a[key], b[key], f"{what}[{key}]")
        return
    rtol, atol = (1e-10, 1e-10) if a.dtype == torch.float64 else (1e-4, 1e-4)
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def run_case(title, dtype, width, stmts: dict, env: dict, rounds, block_time, rows, clock):
    """Time ``stmts`` (first = symalg, second = plain hand-written, rest = references); add rows."""
    times = interleaved(stmts, env, rounds, block_time, clock)
    labels = list(stmts)
    for label, r in ratios(times, labels[1]).items():
        rows.append({"case": title, "dtype": str(dtype).replace("torch.", ""), "width": width, "impl": label,
                     "median_ms": r["ms"]["median"], "iqr_ms": r["ms"]["iqr"], "min_ms": r["ms"]["min"],
                     "rounds": r["ms"]["n"], "ratio": r["ratio"], "ratio_paired": r["paired"],
                     "ratio_min": r["min_ratio"]})
    low, ref = rows[-len(labels)], rows[-len(labels) + 1]
    print(f"  {title:<26} {str(dtype):<14} h={width:<5} symalg {low['median_ms']:9.3f} ms  hand "
          f"{ref['median_ms']:9.3f} ms  ratio {low['ratio']:5.3f} (paired {low['ratio_paired']:5.3f}, min/min "
          f"{low['ratio_min']:5.3f})", flush=True)


def quantities(h: int):
    """The lowered ``C`` (identity site) and ``q`` (ReLU site) of the two-layer networks at width ``h``."""
    (C,) = symalg.derive(symalg.parse(IDENTITY_SPEC, n=h, h=h, m=h)).conserved_quantities()
    (q,) = symalg.derive(symalg.parse(RELU_SPEC, n=h, h=h, m=h)).conserved_quantities()
    return C, q


def measure(widths, action_width, dtypes, rounds, block_time, actions=True, clock=time.process_time,
            show_source=False) -> list[dict]:
    """Every case at every width (the actions and the algebra element at ``action_width``); rows as printed."""
    rows: list[dict] = []
    for dtype in (getattr(torch, name) for name in dtypes):
        for h in widths:
            C, q = quantities(h)
            (C_name,), (q_name,) = C.exprs, q.exprs
            if show_source and dtype == getattr(torch, dtypes[0]):
                print(C.lowered.source, q.lowered.source, sep="\n\n")
            P = make_params(h, dtype)
            env = dict(globals(), C=C, q=q, P=P)
            check_close(C(P)[C_name], C_hand(P), "C lowered vs hand")
            check_close(C_hand_addmm(P), C_hand(P), "C addmm vs hand")
            check_close(q(P)[q_name], q_hand(P), "q lowered vs hand")
            check_close(q_hand_norm(P), q_hand(P), "q norm vs hand")
            run_case("C (identity site, h x h)", dtype, h,
                     {"lowered": "C(P)", "hand": "C_hand(P)", "hand addmm_": "C_hand_addmm(P)"},
                     env, rounds, block_time, rows, clock)
            run_case("q (ReLU site, h)", dtype, h,
                     {"lowered": "q(P)", "hand": "q_hand(P)", "hand norm": "q_hand_norm(P)"},
                     env, rounds, block_time, rows, clock)
        if not actions:
            continue
        h = action_width
        identity = symalg.derive(symalg.parse(IDENTITY_SPEC, n=h, h=h, m=h))
        relu = symalg.derive(symalg.parse(RELU_SPEC, n=h, h=h, m=h))
        by_group = {type(s.group).__name__: s for s in (*identity.symmetries, *relu.symmetries)}
        P = make_params(h, dtype)
        g = torch.Generator().manual_seed(1)
        d = torch.rand(h, generator=g, dtype=dtype) + 0.5
        perm = torch.randperm(h, generator=g)
        Pm = torch.eye(h, dtype=dtype)[perm]
        G = torch.linalg.matrix_exp(0.3 * torch.randn(h, h, generator=g, dtype=dtype) * h ** -0.5)
        env = dict(globals(), P=P, d=d, perm=perm, Pm=Pm, G=G, scaling=by_group["PositiveScaling"],
                   permutations=by_group["Permutations"], general=by_group["GeneralLinear"],
                   group=by_group["GeneralLinear"].group, gen=torch.Generator().manual_seed(2), h=h, dtype=dtype)
        check_close(env["scaling"].apply(P, d), scaling_hand(P, d), "scaling action")
        check_close(env["permutations"].apply(P, Pm), permutation_hand(P, Pm), "permutation action")
        check_close(env["permutations"].apply(P, Pm), permutation_gather(P, perm), "permutation gather")
        check_close(env["general"].apply(P, G), gl_hand(P, G), "GL action")
        check_close(env["general"].apply(P, G), gl_hand_solve(P, G), "GL solve")
        run_case("action PositiveScaling", dtype, h,
                 {"lowered": "scaling.apply(P, d)", "hand": "scaling_hand(P, d)"}, env, rounds, block_time, rows,
                 clock)
        run_case("action S(h) (dense g)", dtype, h,
                 {"lowered": "permutations.apply(P, Pm)", "hand": "permutation_hand(P, Pm)",
                  "hand gather": "permutation_gather(P, perm)"}, env, rounds, block_time, rows, clock)
        run_case("action GL(h)", dtype, h,
                 {"lowered": "general.apply(P, G)", "hand": "gl_hand(P, G)", "hand solve": "gl_hand_solve(P, G)",
                  "membership check": "group.check_element(G)"}, env, max(2, rounds // 2), block_time, rows, clock)
        run_case("GL(h) algebra element", dtype, h,
                 {"lowered": "group.gaussian_algebra_element(gen, dtype)",
                  "hand": "torch.randn(h, h, generator=gen, dtype=dtype)"}, env, rounds, block_time, rows, clock)
    return rows


def print_rows(rows: list[dict]) -> None:
    head = (f"{'case':<26} {'dtype':<8} {'h':>5} {'impl':<16} {'median ms':>10} {'IQR ms':>8} {'min ms':>9} "
            f"{'/ hand':>7} {'paired':>7} {'min/min':>7}")
    print("\nResults (same inputs, interleaved rounds; times per call; '/ hand' = median / median of the plain "
          "hand-written expression, 'paired' = median over rounds of the per-round ratio, 'min/min' = fastest "
          "block / fastest block; target for 'lowered' <= 1.10)")
    print(head)
    print("-" * len(head))
    for r in rows:
        flag = "  <-- above 1.10" if r["impl"] == "lowered" and r["ratio_paired"] > 1.10 else ""
        print(f"{r['case']:<26} {r['dtype']:<8} {r['width']:>5} {r['impl']:<16} {r['median_ms']:10.4f} "
              f"{r['iqr_ms']:8.4f} {r['min_ms']:9.4f} {r['ratio']:7.3f} {r['ratio_paired']:7.3f} "
              f"{r['ratio_min']:7.3f}{flag}")


def figures(quick: bool = False) -> dict:
    """Every case; ``quick``: widths 32 and 256, the actions at 256, 3 rounds of 5 ms blocks."""
    torch.set_num_threads(1)
    if quick:
        return {"rows": measure((32, 256), 256, ("float64", "float32"), rounds=3, block_time=0.005)}
    return {"rows": measure(WIDTHS, 1024, ("float64", "float32"), rounds=30, block_time=0.05)}


WIDTHS = (32, 256, 1024)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 rounds instead of 30")
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS),
                        help=f"n = h = m of the conserved quantities (default {WIDTHS})")
    parser.add_argument("--action-width", type=int, default=1024, help="width of the group actions (default 1024)")
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    parser.add_argument("--rounds", type=int, help="interleaved rounds per case (default 30, quick 8)")
    parser.add_argument("--block-time", type=float, default=0.05,
                        help="seconds per timed block of the hand-written statement (default 0.05)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1: on a small shared machine multi-threaded "
                             "timings are dominated by interference; 0 keeps torch's default)")
    parser.add_argument("--wall", action="store_true", help="time with the wall clock instead of the CPU time")
    parser.add_argument("--no-actions", action="store_true", help="skip the group-action timings")
    parser.add_argument("--show-source", action="store_true", help="print the generated torch source")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    rounds = args.rounds or (8 if args.quick else 30)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    print(json.dumps(machine()))
    print(f"widths {args.widths}, actions at {args.action_width}, {rounds} rounds, blocks of ~{args.block_time} s, "
          f"{'wall' if args.wall else 'CPU'} time")
    rows = measure(args.widths, args.action_width, args.dtypes, rounds, args.block_time, not args.no_actions,
                   time.perf_counter if args.wall else time.process_time, args.show_source)
    print_rows(rows)
    print("\nall values agreed (torch.testing.assert_close; float64 rtol=atol=1e-10, float32 1e-4)")
    print(f"wall time of the benchmark: {time.perf_counter() - started:.1f} s; load average {os.getloadavg()}")
    write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
