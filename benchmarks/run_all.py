"""Run every benchmark and write its figures to one JSON file (a script, not a test).

    python benchmarks/run_all.py --quick --out figures.json        # every benchmark, small sizes, a minute or two
    python benchmarks/run_all.py --out figures.json                # the sizes of docs/benchmarks.md (an hour or more)
    python benchmarks/run_all.py --quick --only bench_verify bench_derive --out part.json

Interface for a benchmark: a module ``benchmarks/<name>.py`` named in :data:`BENCHMARKS` with a function

    def figures(quick: bool = False) -> dict

that measures and returns its figures as a JSON-serialisable dict (numbers, strings, booleans, ``None``, lists and
dicts of them), each figure with the baseline it is compared against measured in the same call. ``quick`` means small
sizes and few repeats: seconds, so that ``tests/test_benchmarks.py`` can run every benchmark. The module's command line
prints the same figures as the tables of docs/benchmarks.md. To add a benchmark, write ``figures`` and add the module's
name to :data:`BENCHMARKS`.

The runner imports each module (``benchmarks/`` on ``sys.path``), calls ``figures(quick=...)`` in this process (with
``--isolate``: each in a fresh interpreter, so that no cache or torch setting of one benchmark reaches another), and
writes::

    {"quick": bool,
     "machine": {cpu, cores, torch_threads, load_average, memory_gib, python, torch, sympy, commit},
     "benchmarks": {name: {"seconds": wall time, "load_average": [1, 5, 15 min] after it,
                           "figures": {...}}                  # or "error": "TypeError: ..." if it raised
                    ...}}

A benchmark that raises is recorded with its error and the others still run; the exit status is then 1.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

BENCHMARKS = ("bench_verify", "bench_derive", "bench_lowered_q", "bench_transformer", "bench_conservation_laws",
              "bench_hf_models", "census", "bench_orbit_rank", "bench_teleport", "bench_scaling",
              "bench_teleport_defaults", "bench_gpu", "bench_mirrors", "bench_noether", "bench_discovery",
              "bench_alignment", "bench_learn_to_teleport", "bench_learned_discovery", "bench_certify", "bench_import")
"""The benchmark modules, in the order they run (and of the sections of docs/benchmarks.md)."""


def run_one(name: str, quick: bool, isolate: bool) -> dict:
    """``{"seconds", "load_average", "figures"}`` of one benchmark, or ``{"seconds", "error"}``."""
    start = time.perf_counter()
    try:
        if isolate:
            done = subprocess.run([sys.executable, __file__, "--_one", name] + ["--quick"] * quick,
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError((done.stderr.strip().splitlines() or ["crashed"])[-1])
            figures = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            figures = importlib.import_module(name).figures(quick=quick)
            json.dumps(figures)   # JSON-serialisable, or an error naming the benchmark
    except Exception as error:   # recorded, and the next benchmark runs
        traceback.print_exc()
        return {"seconds": time.perf_counter() - start, "error": f"{type(error).__name__}: {error}"}
    return {"seconds": time.perf_counter() - start, "load_average": [round(x, 2) for x in os.getloadavg()],
            "figures": figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--out", required=False, help="the JSON file to write (default: print it)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="these benchmarks only")
    parser.add_argument("--isolate", action="store_true", help="each benchmark in a fresh interpreter")
    parser.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                        help="a progress bar on stderr, one step per benchmark (auto: when stderr is a terminal)")
    parser.add_argument("--_one", choices=BENCHMARKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._one:
        print(json.dumps(importlib.import_module(args._one).figures(quick=args.quick)))
        return 0
    from benchlib import machine
    from symalg.progress import progress_bar

    result = {"quick": args.quick, "machine": machine(), "benchmarks": {}}
    names = args.only or BENCHMARKS
    show = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    with progress_bar("benchmarks", enabled=show) as bar:
        for done, name in enumerate(names, start=1):
            if bar is None:
                print(f"# {name}", file=sys.stderr, flush=True)
            result["benchmarks"][name] = run_one(name, args.quick, args.isolate)
            if bar is not None:
                bar(done, len(names), name)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    else:
        print(text)
    failed = [name for name, entry in result["benchmarks"].items() if "error" in entry]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
