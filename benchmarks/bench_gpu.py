"""The numeric stages on a CUDA device against the CPU of the same machine, float32 and float64 (a script, and
``figures(quick)`` for ``run_all.py``; without a GPU it records that none was found and measures nothing).

Cases (each on ``cpu`` and ``cuda``, in this process, one after the other):

* ``verify_mlp``          ``symalg.verify`` of the ReLU MLP of ``bench_verify.py`` (width 16, ``--depth`` layers);
* ``verify_transformer``  ``symalg.verify`` of the pre-norm transformer of ``bench_transformer.py`` (``--layers``
                          blocks at ``--d-model``, 12 heads; the full size is GPT-2 small's, 85 M parameters);
* ``orbit_rank``          ``model_orbit_dimension`` of ``Linear(h, h) → Identity → Linear(h, h)`` (``GL(h)``) at
                          ``--width``: a certified rank of a ``2h² × h²``-sized action, factorised per site;
* ``lowered_q``, ``gl_action``  the lowered per-neuron conserved quantity and the ``GL(h)`` action against the
                          hand-written torch expressions of ``bench_lowered_q.py`` at ``--width`` (``cuda`` only).

Times are wall times with ``torch.cuda.synchronize()`` before the clock is read (medians of ``--repeat`` calls after
one warm-up call). ``gpu_busy`` is the share of a call's wall time that CUDA kernels ran: the summed kernel time that
``torch.profiler`` records over one call, over that call's wall time (near 1: the GPU is the bottleneck; near 0: the
call is bound by Python and kernel launches). The profiler's own overhead lengthens the call, so the share is a
lower bound. The CPU runs at torch's default thread count (recorded).

Usage::

    python benchmarks/bench_gpu.py                 # full sizes (a GPU: a few minutes)
    python benchmarks/bench_gpu.py --quick         # small sizes, seconds
    python benchmarks/bench_gpu.py --json gpu.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch

from benchlib import machine, write_json
from bench_lowered_q import gl_hand, make_params, q_hand
from bench_transformer import build_model
from bench_verify import mlp

import symalg
from symalg.numeric.orbit_rank import model_orbit_dimension

DTYPES = (torch.float32, torch.float64)
FULL = {"depth": 30, "layers": 12, "d_model": 768, "cpu_d_model": 96, "width": 4096, "repeat": 3}
QUICK = {"depth": 4, "layers": 1, "d_model": 48, "cpu_d_model": 24, "width": 64, "repeat": 2}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(call: Callable[[], Any], device: str, repeat: int, warm_up: bool = True) -> dict:
    """Median, min and max wall time of ``repeat`` calls (after a warm-up call unless ``warm_up=False``), and on
    CUDA the ``gpu_busy`` share of one more, profiled, call."""
    if warm_up:
        call()
    times = []
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - start)
    result = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}
    if device == "cuda":
        result["gpu_busy"] = gpu_busy(call)
    return result


def gpu_busy(call: Callable[[], Any]) -> float:
    """Summed CUDA kernel time of one call over its wall time under ``torch.profiler`` (a lower bound)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return kernels * 1e-6 / wall


def verify_case(analysis: symalg.Analysis, device: str, dtype: torch.dtype, repeat: int) -> dict:
    """``symalg.verify`` timed ``repeat`` times after a warm-up on a two-layer network (a large model's own warm-up
    call would double the cost)."""
    symalg.verify(symalg.derive(symalg.trace(mlp(2), (torch.randn(4, 16, dtype=torch.float64),))), device=device,
                  dtype=dtype)
    report: list = []
    result = timed(lambda: report.append(symalg.verify(analysis, device=device, dtype=dtype)), device, repeat,
                   warm_up=False)
    return {**result, "passed": bool(report[-1].passed), "checks": len(report[-1].checks)}


def orbit_case(analysis: symalg.Analysis, params: dict, device: str, dtype: torch.dtype, repeat: int) -> dict:
    orbits: list = []
    result = timed(lambda: orbits.append(model_orbit_dimension(analysis, params, dtype=dtype, device=device)),
                   device, repeat)
    orbit = orbits[-1]
    return {**result, "dimension": orbit.dimension, "expected": orbit.expected,
            "certificates": sorted({d.certificate for d in orbit.decisions})}


CASES = ("orbit_rank", "lowered_q", "verify_transformer", "verify_mlp")


def measure(depth: int, layers: int, d_model: int, cpu_d_model: int, width: int, repeat: int,
            devices: tuple[str, ...], log: str | None = None, cases: tuple[str, ...] = CASES) -> dict:
    """Every case, most telling first: the orbit rank and the lowered code at ``width``, ``verify`` of the
    transformer at ``d_model`` on CUDA only (on a CPU it takes tens of minutes), of the deep MLP, and of the
    transformer at ``cpu_d_model`` on every device. Each row is printed, and appended to ``log`` (JSON lines), as soon
    as it is measured."""
    rows: list[dict] = []

    def row(case: str, size: str, device: str, dtype: torch.dtype, figures: dict) -> None:
        rows.append({"case": case, "size": size, "device": device, "dtype": str(dtype).replace("torch.", ""),
                     **figures})
        print(json.dumps(rows[-1]), flush=True)
        if log:
            with open(log, "a") as handle:
                handle.write(json.dumps(rows[-1]) + "\n")

    wide = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Identity(), torch.nn.Linear(width, width))
    gl_site = symalg.derive(symalg.trace(wide, (torch.randn(2, width),)), certify=False)
    for dtype in DTYPES:
        for device in devices if "orbit_rank" in cases else ():
            params = {k: v.detach().to(device, dtype) for k, v in wide.state_dict().items()}
            row("orbit_rank", f"GL({width})", device, dtype, orbit_case(gl_site, params, device, dtype, repeat))
        if "cuda" in devices and "lowered_q" in cases:
            row("lowered_q", f"h = {width}", "cuda", dtype, lowered_cases(width, dtype, repeat))
    def mlp_rows() -> None:
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        deep = symalg.derive(symalg.trace(mlp(depth), (x,)), certify=False)
        for dtype in DTYPES:
            for device in devices:
                row("verify_mlp", f"{depth} layers x 16", device, dtype, verify_case(deep, device, dtype, 1))

    cuda = tuple(d for d in devices if d == "cuda")
    transformers = tuple((size, on) for size, on in ((d_model, cuda), (cpu_d_model, devices))
                         if size and "verify_transformer" in cases)   # a size 0 is skipped
    for size, on in transformers:
        transformer = build_model(layers, size, 4 if size % 12 else 12)
        tokens = torch.randn(1, 4, size, generator=torch.Generator().manual_seed(1))
        attention = symalg.derive(symalg.trace(transformer, (tokens,)), certify=False)
        for dtype in DTYPES:
            for device in on:
                row("verify_transformer", f"{layers} x {size}", device, dtype, verify_case(attention, device, dtype, 1))
        if size == d_model and "verify_mlp" in cases:   # between the two sizes: CUDA's transformer figures first
            mlp_rows()
    if not transformers and "verify_mlp" in cases:
        mlp_rows()
    return {"rows": rows}


def lowered_cases(width: int, dtype: torch.dtype, repeat: int) -> dict:
    """Lowered ``q`` and the ``GL(h)`` action against hand-written torch on CUDA (ratios of medians)."""
    spec = "linear(n, h) -> {} -> linear(h, m)"
    (q,) = symalg.derive(symalg.parse(spec.format("relu"), n=width, h=width, m=width)).conserved_quantities()
    general = symalg.derive(symalg.parse(spec.format("identity"), n=width, h=width, m=width)).symmetries[0]
    P = {k: v.cuda() for k, v in make_params(width, dtype).items()}
    G = torch.linalg.matrix_exp(0.3 * torch.randn(width, width, dtype=dtype, device="cuda") * width ** -0.5)
    calls = 50
    figures = {}
    for name, call in (("q", lambda: q(P)), ("q_hand", lambda: q_hand(P)), ("gl", lambda: general.apply(P, G)),
                       ("gl_hand", lambda: gl_hand(P, G))):
        figures[name] = timed(lambda call=call: [call() for _ in range(calls)], "cuda", repeat)["median_s"] / calls
    return {"q_per_call_s": figures["q"], "q_ratio": figures["q"] / figures["q_hand"],
            "gl_per_call_s": figures["gl"], "gl_ratio": figures["gl"] / figures["gl_hand"]}


def figures(quick: bool = False, sizes: dict | None = None, log: str | None = None,
            cases: tuple[str, ...] = CASES) -> dict:
    """Every case at the full sizes (``quick``: small sizes; ``sizes`` overrides) on the CPU and CUDA; without a GPU,
    only that there is none."""
    if not torch.cuda.is_available():
        return {"cuda": False, "reason": "no CUDA device: nothing measured"}
    sizes = {**(QUICK if quick else FULL), **(sizes or {})}
    return {"cuda": True, "gpu": torch.cuda.get_device_name(), "torch_threads": torch.get_num_threads(),
            "sizes": sizes, **measure(**sizes, devices=("cpu", "cuda"), log=log, cases=cases)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU side (a dry run without a GPU)")
    for name, value in FULL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"default {value}")
    parser.add_argument("--json", help="write the figures and the machine to this file")
    parser.add_argument("--log", help="append each row to this file (JSON lines) as soon as it is measured")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES), help="these cases only")
    args = parser.parse_args(argv)
    sizes = {k: (QUICK if args.quick else FULL)[k] if getattr(args, k) is None else getattr(args, k) for k in FULL}
    if args.cpu_only:
        result = {"cuda": False, "sizes": sizes, **measure(**sizes, devices=("cpu",), log=args.log,
                                                           cases=tuple(args.cases))}
    elif not torch.cuda.is_available():
        sys.exit("bench_gpu: no CUDA device (use --cpu-only for a dry run)")
    else:
        result = figures(sizes=sizes, log=args.log, cases=tuple(args.cases))
    write_json(args.json, result)
    print(json.dumps({"machine": machine(), "sizes": sizes}))


if __name__ == "__main__":
    main()
