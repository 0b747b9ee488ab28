"""What the benchmark scripts share: the machine they ran on, interleaved timing of statements, medians with spread.

``machine()`` is recorded with every set of figures (:mod:`run_all`): on a shared machine the load average says how
far absolute times can be trusted; ratios measured back to back in one process (``interleaved``) are the figures to
compare.
"""
from __future__ import annotations

import os
import platform
import resource
import statistics
import subprocess
import time
from typing import Callable

import torch
from torch.utils.benchmark import Timer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine() -> dict:
    """CPU model, cores, torch threads, load average (1, 5, 15 min), memory, versions and the code's commit."""
    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), platform.processor())
    memory = next((int(line.split()[1]) / 2 ** 20 for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal")), float("nan"))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    import sympy

    return {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()], "memory_gib": round(memory, 1),
            "python": platform.python_version(), "torch": torch.__version__, "sympy": sympy.__version__,
            "commit": commit + ("+changes" if dirty else "")}


def write_json(path: str | None, figures: dict) -> None:
    """Write ``{"machine": machine(), **figures}`` to ``path`` (a script's ``--json``; nothing when it is None)."""
    if path:
        import json

        with open(path, "w") as handle:
            json.dump({"machine": machine(), **figures}, handle, indent=1)


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def maxrss_mib() -> float:
    """Peak resident memory of this process so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spread(values: list[float]) -> dict:
    """``{"median", "iqr", "min", "max", "n"}`` of ``values``."""
    quartiles = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "iqr": quartiles[2] - quartiles[0], "min": min(values),
            "max": max(values), "n": len(values)}


def timed(call: Callable[[], object]) -> tuple[float, float, object]:
    """``(wall seconds, CPU seconds of this process, result)`` of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def interleaved(stmts: dict[str, str], env: dict, rounds: int, block_time: float,
                clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """``{label: [seconds per call, one per round]}`` of each statement, measured in interleaved rounds.

    Every statement runs the same number of calls per block (chosen so that a block of the second statement, the
    baseline, takes about ``block_time``); each round times one block of every statement, in an order rotated
    from round to round, so that drift and load from other processes hit all statements alike and rounds compare
    pairwise. ``clock`` is the process's CPU time by default: with one torch thread it does not count the time
    other jobs of a shared machine hold the core (``time.perf_counter`` for wall time).
    """
    timers = {label: Timer(stmt, globals=env, num_threads=torch.get_num_threads(), timer=clock)
              for label, stmt in stmts.items()}
    labels = list(stmts)
    for timer in timers.values():   # warm-up: allocator, first-call caches
        timer.timeit(3)
    per_call = max(timers[labels[1]].timeit(3).median, 1e-7)
    number = max(1, round(block_time / per_call))
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            times[label].append(timers[label].timeit(number).median)
    return times


def ratios(times: dict[str, list[float]], baseline: str) -> dict[str, dict]:
    """Per statement: the spread of its times (ms) and its ratios to ``baseline``: ``median`` (median / median),
    ``paired`` (median over rounds of the per-round ratio: the most robust on a shared machine) and ``min``."""
    base = times[baseline]
    out = {}
    for label, values in times.items():
        ms = spread([1e3 * v for v in values])
        out[label] = {"ms": ms, "ratio": statistics.median(values) / statistics.median(base),
                      "paired": statistics.median(a / b for a, b in zip(values, base)),
                      "min_ratio": min(values) / min(base)}
    return out
