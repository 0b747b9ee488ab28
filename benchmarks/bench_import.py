"""Start-up cost: CPU time of ``import symalg`` and ``symalg --help`` against ``import torch``, in the same run.

    python benchmarks/bench_import.py                      # 10 rounds
    python benchmarks/bench_import.py --baseline /work/main  # also the same commands on another checkout

Each command runs in a fresh interpreter (``python -c ...``), the commands interleaved round by round so that a load
change on a shared machine hits them alike; the figure is the child's CPU time (user + system, from
``resource.getrusage(RUSAGE_CHILDREN)``), median and range over the rounds. ``python -c pass`` is the interpreter's
own start-up; the other rows include it. ``import symalg`` imports each public name on first use, so it should cost
about as much as ``pass``; ``import symalg; symalg.derive`` pays for the derivation stack (torch, SymPy, networkx).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]   # this checkout's symalg, not an installed one

from benchlib import write_json  # noqa: E402  (benchmarks/ is not a package)
from symalg.progress import progress_bar  # noqa: E402

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import symalg": ["-c", "import symalg"],
    "import symalg; symalg.derive": ["-c", "import symalg; symalg.derive"],
    "symalg --help": ["-m", "symalg", "--help"],
}
"""What is measured: the arguments of ``python`` for each row."""


def cpu_seconds(args: list[str], tree: str) -> float:
    """CPU time (user + system) of ``python *args`` with ``tree`` first on ``sys.path``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, cwd=tree,
                   env={**os.environ, "PYTHONPATH": tree})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def figures(quick: bool = False, baseline: str | None = None, show_progress: bool = False) -> dict:
    """``{"rounds", "rows": [{"tree", "command", "median_s", "min_s", "max_s"}]}``: every command on this checkout
    (and on ``baseline``), interleaved over the rounds."""
    rounds = 2 if quick else 10
    trees = {"this": ROOT, **({"baseline": baseline} if baseline else {})}
    times: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in COMMANDS}
    total = rounds * len(times)
    with progress_bar("bench_import", enabled=show_progress) as bar:
        for round_ in range(rounds):
            for i, (tree, command) in enumerate(times):
                times[tree, command].append(cpu_seconds(COMMANDS[command], trees[tree]))
                if bar is not None:
                    bar(round_ * len(times) + i + 1, total, f"{tree}: {command}")
    rows = [{"tree": tree, "command": command, "median_s": round(statistics.median(values), 3),
             "min_s": round(min(values), 3), "max_s": round(max(values), 3)}
            for (tree, command), values in times.items()]
    return {"rounds": rounds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 10")
    parser.add_argument("--baseline", default=None, help="another checkout to measure the same commands on")
    parser.add_argument("--json", default=None, help="write the figures (and the machine) to this file")
    args = parser.parse_args()
    result = figures(args.quick, args.baseline, show_progress=sys.stderr.isatty())
    print(f"CPU seconds per command, median [min, max] over {result['rounds']} rounds")
    for row in result["rows"]:
        print(f"  {row['tree']:8} {row['command']:30} {row['median_s']:6.3f}  [{row['min_s']:.3f}, {row['max_s']:.3f}]")
    write_json(args.json, result)


if __name__ == "__main__":
    main()
