"""Teleportation speed and stability (a script, and functions returning dicts for a JSON runner).

**Speed** (:func:`speed`): 10 ascent steps of the gradient-norm objective ``‖∇L‖²`` with the data-dependent ``GL(128)``
action of eq. 4.13 at the first hidden site of a ``784 → 128 → 128 → 10`` LeakyReLU(0.1) classifier (cross-entropy,
float64, a batch of ``--batch`` random "images" in ``[0, 1]``, one torch thread), three ways, interleaved in one
process and repeated (``--repeat``; medians with min..max of the wall-clock time and of the process's CPU time, which
a shared machine inflates less: with one torch thread it is the work done):

* ``reference``: [Zhao2026]'s teleportation loop re-implemented from Alg. 1 and Sec. 4.6 (the dissertation's MNIST
  and multi-layer experiments): ``g = I + T``, ``g⁻¹ = I − T`` in eq. 4.13, ``T`` from zero by gradient ascent on
  ``‖∇L‖²`` at a fixed rate, the pseudo-inverse of the (constant) layer input computed once per teleport. It keeps the
  loss only to first order in ``T``;
* ``symalg, fixed rate``: ``teleport(as_action(ExactTeleport(net, 0), x, params), params, loss, GradNorm(), steps=10,
  lr=…)``: the exact exponential (each factor ``exp(Δ)``), the loss checked at every iterate, the best iterate returned;
* ``symalg, default``: the same with the default step rule (normalised step, line search).

Both use the same loss function (a plain ``F.linear``/``F.leaky_relu`` forward of the parameter dict), so the ratio
measures the teleport machinery. Printed: seconds for 10 steps, the ratio to the reference, the relative loss change
of the result and the objective before and after.

**Stability** (:func:`stability`): the default ``GradNorm`` teleport inside training on scikit-learn's digits (the
64 → 16 → 10 → 10 LeakyReLU(0.1) classifier of ``examples/teleport_common.py``, SGD at ``--sgd-lr``, batches of 20,
``--epochs`` epochs, one teleport after epoch 1 on a batch of 200 through ``TeleportingOptimizer``), for ``--seeds``
seeds: without teleports, with the unguarded default teleport (``radius=None, check=False``) and with the guarded
default (``TeleportingOptimizer``'s trust region and next-step check); ``--modes`` adds ``"check only"`` and
``"radius only"``. Printed: final validation accuracy and loss,
the gradient norm before and after the teleport, and whether it was accepted.

Usage::

    python benchmarks/bench_teleport.py                        # both parts (about 3 min on an idle 2-core machine)
    python benchmarks/bench_teleport.py --quick                # fewer repeats, seeds and epochs
    python benchmarks/bench_teleport.py --part speed --batch 20 --repeat 7

As functions: ``speed(batch=128, repeat=5)`` → ``{"machine", "rows": [{"method", "seconds", "range", "ratio", "cpu",
"cpu_range", "cpu_ratio", "loss_change", "objective_before", "objective_after"}]}``; ``stability(seeds=5)`` →
``{"machine", "rows": [{"seed", "mode", "accuracy", "loss", "grad_before", "grad_after", "accepted"}]}``;
``figures(quick)`` runs both (small with ``quick``) for ``run_all.py``.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTHS = (784, 128, 128, 10)
SLOPE = 0.1


def machine() -> dict:
    """Where the figures were measured."""
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "load_average": os.getloadavg()[0]}


# ------------------------------------------------------------------------------------------------ speed
def forward(params: dict, x: torch.Tensor) -> torch.Tensor:
    """The classifier's logits from a parameter dict (``nn.Sequential`` names), plain functional torch."""
    a = x
    for i in range(len(WIDTHS) - 1):
        a = F.linear(a, params[f"{2 * i}.weight"], params[f"{2 * i}.bias"])
        if i < len(WIDTHS) - 2:
            a = F.leaky_relu(a, SLOPE)
    return a


def problem(batch: int, seed: int = 0):
    """``(model, params, x, y)``: the classifier (float64) and a random batch."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
        layers += [nn.Linear(a, b)] + ([nn.LeakyReLU(SLOPE)] if i < len(WIDTHS) - 2 else [])
    model = nn.Sequential(*layers).double()
    x = torch.rand(batch, WIDTHS[0], dtype=torch.float64)
    y = torch.randint(WIDTHS[-1], (batch,))
    return model, {n: p.detach() for n, p in model.named_parameters()}, x, y


def reference(params: dict, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int) -> tuple[dict, float]:
    """[Zhao2026]'s loop for one site (the first hidden layer): ``g = I + T``, ``g⁻¹ = I − T`` in eq. 4.13,
    ``W̃₁' = σ⁻¹(g σ(W̃₁ h)) h⁺``, ``W₂' = W₂ g⁻¹`` with ``W̃₁ = [W₁ b₁]``, ``h = [x; 1]``; ``h⁺`` once (constant data);
    ``T ← lr ∂‖∇L‖²/∂T`` at ``T = 0`` each step. Returns the parameters and the last objective."""
    def sigma(z: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(z, SLOPE)

    def sigma_inv(z: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(z, 1 / SLOPE)

    w_tilde = torch.cat([params["0.weight"], params["0.bias"][:, None]], 1)
    w_next = params["2.weight"]
    h = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1).T
    h_pinv = torch.linalg.pinv(h)
    eye = torch.eye(w_tilde.shape[0], dtype=x.dtype)
    objective = math.nan
    for _ in range(steps):
        T = torch.zeros_like(eye, requires_grad=True)
        g, g_inv = eye + T, eye - T
        moved = sigma_inv(g @ sigma(w_tilde @ h)) @ h_pinv
        current = {**params, "0.weight": moved[:, :-1], "0.bias": moved[:, -1], "2.weight": w_next @ g_inv}
        leaves = {n: v if v.requires_grad else v.detach().requires_grad_(True) for n, v in current.items()}
        loss = F.cross_entropy(forward(leaves, x), y)
        grads = torch.autograd.grad(loss, list(leaves.values()), create_graph=True)
        value = sum((gr * gr).sum() for gr in grads)
        (dT,) = torch.autograd.grad(value, T)
        objective = float(value.detach())
        with torch.no_grad():
            g, g_inv = eye + lr * dT, eye - lr * dT
            w_tilde = sigma_inv(g @ sigma(w_tilde @ h)) @ h_pinv
            w_next = w_next @ g_inv
    out = {**params, "0.weight": w_tilde[:, :-1], "0.bias": w_tilde[:, -1], "2.weight": w_next}
    return out, objective


def speed(batch: int = 128, repeat: int = 5, lr: float = 1e-3, steps: int = 10) -> dict:
    """The speed comparison (module docstring); one torch thread."""
    from symalg.applications.teleport import GradNorm, as_action, teleport
    from symalg.applications.teleport_actions import ExactTeleport
    from symalg.numeric.feedforward import FeedForward

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model, params, x, y = problem(batch)
    net = FeedForward.of(model)

    def loss(p: dict) -> torch.Tensor:
        return F.cross_entropy(forward(p, x), y)

    with torch.no_grad():
        loss0 = float(loss(params))
    runs: dict[str, list[float]] = {"reference": [], "symalg, fixed rate": [], "symalg, default": []}
    cpu: dict[str, list[float]] = {method: [] for method in runs}
    outcome: dict[str, tuple[float, float, float]] = {}
    for rep in range(repeat + 1):                     # the first round warms up and is not counted
        for method in runs:
            start, start_cpu = time.perf_counter(), time.process_time()
            if method == "reference":
                moved, after = reference(params, x, y, lr, steps)
                with torch.no_grad():
                    change = abs(float(loss(moved)) - loss0) / loss0
                before = math.nan
            else:
                action = as_action(ExactTeleport(net, 0), x=x, params=params)
                settings = {"lr": lr} if method == "symalg, fixed rate" else {}
                result = teleport(action, params, loss, GradNorm(), steps=steps, **settings)
                change, before, after = result.relative_loss_change, result.objective_before, result.objective_after
            if rep:
                runs[method].append(time.perf_counter() - start)
                cpu[method].append(time.process_time() - start_cpu)
            outcome[method] = (change, before, after)
    torch.set_num_threads(threads)
    base, base_cpu = statistics.median(runs["reference"]), statistics.median(cpu["reference"])
    rows = [{"method": m, "seconds": statistics.median(t), "range": (min(t), max(t)),
             "ratio": statistics.median(t) / base, "cpu": statistics.median(cpu[m]),
             "cpu_range": (min(cpu[m]), max(cpu[m])), "cpu_ratio": statistics.median(cpu[m]) / base_cpu,
             "loss_change": outcome[m][0], "objective_before": outcome[m][1], "objective_after": outcome[m][2]}
            for m, t in runs.items()]
    return {"machine": {**machine(), "threads": 1}, "batch": batch, "repeat": repeat, "lr": lr, "steps": steps,
            "rows": rows}


# ------------------------------------------------------------------------------------------------ stability
def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(x)
        return float(F.cross_entropy(logits, y)), float((logits.argmax(-1) == y).double().mean())


MODES = {"none": {}, "unguarded": {"radius": None, "check": False}, "guarded": {},
         "check only": {"radius": None}, "radius only": {"check": False}}
"""Teleport settings of the stability runs: ``TeleportingOptimizer``'s safeguards (``none``: no teleport)."""


def train(seed: int, mode: str, epochs: int = 10, sgd_lr: float = 0.05) -> dict:
    """One training run on digits with teleport settings :data:`MODES` ``[mode]``."""
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from teleport_common import batches, classifier, digits

    import symalg
    from symalg.applications.teleport import GradNorm, Teleporter, as_action
    from symalg.applications.teleport_optim import Schedule, TeleportingOptimizer, model_loss

    (x, y), (xv, yv) = digits()
    model = classifier(seed).double()
    x, xv = x.double(), xv.double()
    action = as_action(symalg.derive(symalg.trace(model, (x[:2],))))
    generator = torch.Generator().manual_seed(seed + 1)
    teleport_data = batches(x, y, 200, generator)
    guard = MODES[mode]
    opt = TeleportingOptimizer(torch.optim.SGD(model.parameters(), lr=sgd_lr), model, Teleporter(action, GradNorm()),
                               model_loss(model, F.cross_entropy), lambda: next(teleport_data),
                               Schedule(at_epochs=() if mode == "none" else (1,)), **guard)
    for _ in range(epochs):
        for xb, yb in batches(x, y, 20, generator):
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
        opt.end_epoch()
    loss, accuracy = _evaluate(model, xv, yv)
    result = opt.results[0] if opt.results else None
    return {"seed": seed, "mode": mode, "accuracy": accuracy, "loss": loss,
            "grad_before": math.sqrt(result.objective_before) if result else math.nan,
            "grad_after": math.sqrt(result.objective_after) if result else math.nan,
            "accepted": bool(result and result.accepted), "reason": result.reason if result else ""}


def stability(seeds: int = 5, epochs: int = 20, sgd_lr: float = 0.05,
              modes: tuple[str, ...] = ("none", "unguarded", "guarded")) -> dict:
    """The stability comparison (module docstring); one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = [train(seed, mode, epochs, sgd_lr) for seed in range(seeds) for mode in modes]
    torch.set_num_threads(threads)
    return {"machine": {**machine(), "threads": 1}, "epochs": epochs, "sgd_lr": sgd_lr, "rows": rows}


def figures(quick: bool = False) -> dict:
    """Both parts for ``benchmarks/run_all.py``; ``quick``: 2 repeats at batch 128, 2 seeds of 4 epochs."""
    if quick:
        return {"speed": speed(repeat=2), "stability": stability(seeds=2, epochs=4)}
    return {"speed": speed(), "stability": stability()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("speed", "stability", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="2 repeats; 2 seeds of 4 epochs")
    parser.add_argument("--batch", type=int, default=128, help="batch of the speed problem (default 128)")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds of the speed part (default 5)")
    parser.add_argument("--seeds", type=int, default=5, help="training seeds of the stability part (default 5)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    parser.add_argument("--sgd-lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--modes", nargs="+", choices=tuple(MODES), default=["none", "unguarded", "guarded"],
                        help="teleport settings of the stability part (default: none, unguarded, guarded)")
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    info = machine()
    print(f"python {info['python']}, torch {info['torch']}, cpus {info['cpus']}, torch threads 1, "
          f"load average {info['load_average']:.2f}")
    if args.part in ("speed", "both"):
        result = speed(args.batch, 2 if args.quick else args.repeat)
        print(f"\neq. 4.13 teleport, 10 steps, 784-128-128-10, one GL(128) site, batch {args.batch} "
              f"(median of {result['repeat']}, interleaved):\n")
        print("| method | wall s (min..max) | / reference | CPU s (min..max) | / reference | relative loss change "
              "| ‖∇L‖² before → after |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for row in result["rows"]:
            (low, high), (clow, chigh) = row["range"], row["cpu_range"]
            print(f"| {row['method']} | {row['seconds']:.3f} ({low:.3f}..{high:.3f}) | {row['ratio']:.2f} "
                  f"| {row['cpu']:.3f} ({clow:.3f}..{chigh:.3f}) | {row['cpu_ratio']:.2f} "
                  f"| {row['loss_change']:.1e} | {row['objective_before']:.4g} → {row['objective_after']:.4g} |")
    if args.part in ("stability", "both"):
        seeds, epochs = (2, 4) if args.quick else (args.seeds, args.epochs)
        result = stability(seeds, epochs, args.sgd_lr, tuple(args.modes))
        print(f"\ndigits 64-16-10-10, SGD lr {args.sgd_lr}, {epochs} epochs, default GradNorm teleport after "
              "epoch 1:\n")
        print("| seed | teleport | validation accuracy | validation loss | ‖∇L‖ before → after | accepted |")
        print("|---:|---|---:|---:|---:|---|")
        for row in result["rows"]:
            grads = "–" if row["mode"] == "none" else f"{row['grad_before']:.3g} → {row['grad_after']:.3g}"
            accepted = "–" if row["mode"] == "none" else ("yes" if row["accepted"] else f"no ({row['reason']})")
            print(f"| {row['seed']} | {row['mode']} | {row['accuracy']:.3f} | {row['loss']:.3g} | {grads} "
                  f"| {accepted} |")


if __name__ == "__main__":
    main()
