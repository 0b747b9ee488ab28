"""Lowered conserved quantities and group actions against hand-written torch (a script, not a test).

Two-layer networks with ``n = h = m = 1024`` (``--width`` to change):

* identity site ``linear(n, h) -> identity -> linear(h, m)`` (group ``GL(h)``): the matrix
  ``C = W1 W1ᵀ + b1 b1ᵀ − W2ᵀ W2`` (h × h);
* ReLU site ``linear(n, h) -> relu -> linear(h, m)`` (positive scaling): the vector
  ``q = rowsum(W1∘W1) + b1∘b1 − colsum(W2∘W2)`` (length h; lowered as an h × 1 column).

Each lowered callable (``q(params)``, i.e. ``q.lowered(params)``, a dict ``{name: value}``) is timed against the
hand-written torch expression a user would type, on the same tensors, with
``torch.utils.benchmark.Timer.timeit``: every statement runs the same number of calls per block
(blocks of ~50 ms), and the statements are interleaved block by block for 30 rounds (rotating the
order), so that drift and load from other processes hit all of them alike. Reported: the median time
per call, ``/ hand`` = median(lowered) / median(hand), ``paired`` = median over rounds of the
per-round ratio (the most robust figure on a shared machine) and ``min/min``. Values are checked to
agree (``torch.testing.assert_close``) before timing. A second, "optimised" hand-written variant
(``addmm_`` in place; row norms by ``vector_norm``; ``linalg.solve`` instead of ``inv``; index
gathering instead of a dense permutation matrix) is shown for reference but is not the target.

Group actions (skip with ``--no-actions``): also times ``analysis.symmetries[i].apply(params, g)`` against the
hand-written action for positive scaling (ReLU), permutations (ReLU) and GL(h) (identity).

Usage::

    python benchmarks/bench_lowered_q.py              # float64 + float32, 1 thread, ~1.5 min
    python benchmarks/bench_lowered_q.py --quick      # fewer/shorter rounds, ~20 s
    python benchmarks/bench_lowered_q.py --threads 0  # torch's default thread count
    python benchmarks/bench_lowered_q.py --dtypes float32 --no-actions --show-source
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from torch.utils.benchmark import Timer

import symalg

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


def time_case(stmts: dict, env: dict, rounds: int, block_time: float) -> dict:
    """``{label: [seconds per call, one value per round]}``, measured in interleaved rounds.

    Every statement is run ``number`` times per block, the same ``number`` for all (chosen so that a
    block of the plain hand-written statement takes about ``block_time``); each round times one block
    of every statement, in an order rotated from round to round, so that drift and load from other
    processes hit all statements alike and rounds can be compared pairwise.
    """
    timers = {label: Timer(stmt, globals=env, num_threads=torch.get_num_threads()) for label, stmt in stmts.items()}
    labels = list(stmts)
    for timer in timers.values():  # warm-up (allocator, first-call caches)
        timer.timeit(3)
    per_call = timers[labels[1]].timeit(3).median
    number = max(1, round(block_time / per_call))
    times = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            times[label].append(timers[label].timeit(number).median)
    return times


def summarise(times: list[float]) -> tuple[float, float]:
    median = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [median, median, median]
    return median, q[2] - q[0]


def run_case(title, dtype, stmts: dict, env: dict, rounds, block_time, rows):
    """Time ``stmts`` (first = lowered, second = plain hand-written, rest = references); add rows."""
    times = time_case(stmts, env, rounds, block_time)
    labels = list(stmts)
    hand = times[labels[1]]
    for label in labels:
        median, iqr = summarise(times[label])
        paired = statistics.median(a / b for a, b in zip(times[label], hand))
        rows.append({"case": title, "dtype": str(dtype).replace("torch.", ""), "impl": label,
                     "median_ms": 1e3 * median, "iqr_ms": 1e3 * iqr, "min_ms": 1e3 * min(times[label]),
                     "rounds": len(times[label]), "ratio": median / statistics.median(hand),
                     "ratio_paired": paired, "ratio_min": min(times[label]) / min(hand)})
    low, ref = rows[-len(labels)], rows[-len(labels) + 1]
    print(f"  {title:<26} {str(dtype):<14} lowered {low['median_ms']:9.3f} ms  hand {ref['median_ms']:9.3f} ms  "
          f"ratio {low['ratio']:5.3f} (paired {low['ratio_paired']:5.3f}, min/min {low['ratio_min']:5.3f})",
          flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 rounds instead of 30 (~20 s)")
    parser.add_argument("--width", type=int, default=1024, help="n = h = m (default 1024)")
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    parser.add_argument("--rounds", type=int, help="interleaved rounds per case (default 30, quick 8)")
    parser.add_argument("--block-time", type=float, default=0.05,
                        help="seconds per timed block of the hand-written statement (default 0.05)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (default 1: on a small shared machine multi-threaded "
                             "timings are dominated by interference; 0 keeps torch's default)")
    parser.add_argument("--no-actions", action="store_true", help="skip the group-action timings")
    parser.add_argument("--show-source", action="store_true", help="print the generated torch source")
    args = parser.parse_args(argv)
    rounds = args.rounds or (8 if args.quick else 30)
    block_time = args.block_time
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    h = args.width
    print(f"python {platform.python_version()}, torch {torch.__version__}, cpus {os.cpu_count()}, "
          f"torch threads {torch.get_num_threads()}, width {h}, {rounds} rounds, blocks of ~{block_time} s")
    identity = symalg.derive(symalg.parse(IDENTITY_SPEC, n=h, h=h, m=h))
    relu = symalg.derive(symalg.parse(RELU_SPEC, n=h, h=h, m=h))
    (C,), (q,) = identity.conserved_quantities(), relu.conserved_quantities()
    (C_name,), (q_name,) = C.exprs, q.exprs
    by_group = {type(s.group).__name__: s for s in (*identity.symmetries, *relu.symmetries)}
    scaling, permutations, general = by_group["PositiveScaling"], by_group["Permutations"], by_group["GeneralLinear"]
    if args.show_source:
        for f in (C.lowered, q.lowered):  # the actions are torch already (Symmetry.apply)
            print(f.source, end="\n\n")

    rows = []
    for dtype in (getattr(torch, name) for name in args.dtypes):
        P = make_params(h, dtype)
        g = torch.Generator().manual_seed(1)
        d = torch.rand(h, generator=g, dtype=dtype) + 0.5
        perm = torch.randperm(h, generator=g)
        Pm = torch.eye(h, dtype=dtype)[perm]
        G = torch.linalg.matrix_exp(0.3 * torch.randn(h, h, generator=g, dtype=dtype) * h ** -0.5)
        env = dict(globals(), C=C, q=q, P=P, d=d, perm=perm, Pm=Pm, G=G,
                   scaling=scaling, permutations=permutations, general=general)

        check_close(C(P)[C_name], C_hand(P), "C lowered vs hand")
        check_close(C_hand_addmm(P), C_hand(P), "C addmm vs hand")
        check_close(q(P)[q_name].squeeze(-1), q_hand(P), "q lowered vs hand")
        check_close(q_hand_norm(P), q_hand(P), "q norm vs hand")
        run_case("C (identity site, h x h)", dtype,
                 {"lowered": "C(P)", "hand": "C_hand(P)", "hand addmm_": "C_hand_addmm(P)"},
                 env, rounds, block_time, rows)
        run_case("q (ReLU site, h)", dtype,
                 {"lowered": "q(P)", "hand": "q_hand(P)", "hand norm": "q_hand_norm(P)"},
                 env, rounds, block_time, rows)
        if args.no_actions:
            continue
        check_close(scaling.apply(P, d), scaling_hand(P, d), "scaling action")
        check_close(permutations.apply(P, Pm), permutation_hand(P, Pm), "permutation action")
        check_close(permutations.apply(P, Pm), permutation_gather(P, perm), "permutation gather")
        check_close(general.apply(P, G), gl_hand(P, G), "GL action")
        check_close(general.apply(P, G), gl_hand_solve(P, G), "GL solve")
        run_case("action PositiveScaling", dtype,
                 {"lowered": "scaling.apply(P, d)", "hand": "scaling_hand(P, d)"}, env, rounds, block_time, rows)
        run_case("action S(h) (dense g)", dtype,
                 {"lowered": "permutations.apply(P, Pm)", "hand": "permutation_hand(P, Pm)",
                  "hand gather": "permutation_gather(P, perm)"}, env, rounds, block_time, rows)
        run_case("action GL(h)", dtype,
                 {"lowered": "general.apply(P, G)", "hand": "gl_hand(P, G)", "hand solve": "gl_hand_solve(P, G)"},
                 env, max(2, rounds // 2), block_time, rows)

    head = (f"{'case':<26} {'dtype':<8} {'impl':<12} {'median ms':>10} {'IQR ms':>8} {'min ms':>9} "
            f"{'/ hand':>7} {'paired':>7} {'min/min':>7}")
    print("\nResults (same inputs, interleaved rounds; times per call; '/ hand' = median / median of the plain "
          "hand-written expression, 'paired' = median over rounds of the per-round ratio, 'min/min' = fastest "
          "block / fastest block; target for 'lowered' <= 1.10)")
    print(head)
    print("-" * len(head))
    for r in rows:
        flag = "  <-- above 1.10" if r["impl"] == "lowered" and r["ratio_paired"] > 1.10 else ""
        print(f"{r['case']:<26} {r['dtype']:<8} {r['impl']:<12} {r['median_ms']:10.3f} {r['iqr_ms']:8.3f} "
              f"{r['min_ms']:9.3f} {r['ratio']:7.3f} {r['ratio_paired']:7.3f} {r['ratio_min']:7.3f}{flag}")
    print("\nall values agreed (torch.testing.assert_close; float64 rtol=atol=1e-10, float32 1e-4)")
    print(f"wall time of the benchmark: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
