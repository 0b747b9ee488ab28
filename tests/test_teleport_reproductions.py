"""The teleportation reproductions (``examples/teleport_*.py``) run in quick mode and show
what they claim: closed-form optima reached, loss kept, overhead measured, correlations well defined."""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(script: str, out: Path, *args: str, plot: str | None = None) -> dict[str, float]:
    """Run ``script --quick *args`` with plots into ``out`` (``plot``: the file it must write, by default the script's
    name with ``.png``); return its ``key=number`` tokens."""
    result = subprocess.run([sys.executable, str(EXAMPLES / script), "--quick", *args, "--out", str(out)],
                            capture_output=True, text=True, timeout=240, cwd=EXAMPLES)
    assert result.returncode == 0, result.stderr
    assert (out / (plot or script.replace(".py", ".png"))).stat().st_size > 0
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-+0-9.eEnaif]+)", result.stdout)}


def test_test_functions_reach_the_closed_form_optimum_and_speed_up_gd(tmp_path):
    v = _run("teleport_test_functions.py", tmp_path)
    for name in ("quadratic3", "quadratic5", "booth"):
        assert v[f"{name}_min_ratio"] >= 0.99, name            # every teleport reaches 4 λ_max ℓ
        assert v[f"{name}_start_ratio"] < 0.9, name            # and started away from it
        assert v[f"{name}_final_loss_teleport"] < 1e-2 * v[f"{name}_final_loss_gd"], name
    for name in ("quadratic3", "quadratic5", "booth", "rosenbrock"):
        assert v[f"{name}_teleports"] >= 1
        assert v[f"{name}_max_rel_loss_change"] < 1e-10, name  # teleports keep the loss
    # Rosenbrock: the converged ascent ends at a local maximum of the orbit, below the global one (reported)
    assert 0.5 < v["rosenbrock_converged_ratio"] <= 1 + 1e-9
    # [Zhao2026]'s 10 fixed steps jump around the orbit; their best iterate is far above the start, and GD at
    # lr 1e-3 diverges from there (curvature ~1e5): maximising ‖∇f‖² needs a step size adapted to the new point
    assert v["rosenbrock_start_ratio"] < 0.02 and v["rosenbrock_first_ratio"] > 0.4
    assert not v["rosenbrock_final_loss_teleport"] < v["rosenbrock_final_loss_gd"]


@pytest.mark.slow
def test_leaky_relu_grid_keeps_the_loss_and_measures_speedups(tmp_path):
    v = _run("teleport_leaky_relu.py", tmp_path)
    for kind in ("GD", "AdaGrad"):
        assert v[f"{kind}_cells"] == v[f"{kind}_runs"] == 4     # quick: 2 × 2 grid, one seed
        assert v[f"{kind}_max_rel_loss_change"] < 1e-10        # eq. 4.13 is exact at batch 4 ≤ width
        assert v[f"{kind}_converged_cells"] >= 2
        assert math.isfinite(v[f"{kind}_median_speedup"]) and v[f"{kind}_median_speedup"] > 0
        # a run faster by the criterion but stopping at a higher loss is one of the faster runs, and counted
        assert 0 <= v[f"{kind}_faster_at_higher_loss"] <= v[f"{kind}_faster_runs"] <= v[f"{kind}_converged_cells"]
        assert v[f"{kind}_same_loss_faster_runs"] <= v[f"{kind}_same_loss_cells"] <= v[f"{kind}_cells"]
    # deterministic part: some teleport cuts GD's steps to the criterion at least twofold
    assert v["GD_max_step_ratio"] > 2
    # the Fig. 4.7 verdict (not reproduced), on step counts so that the machine's load cannot flip it: teleports
    # cut GD's steps to plain's final loss (quick: best 18.7×) but larger ones keep GD from the criterion at all
    # (quick: 2 of 4 cells), and AdaGrad reaches plain's loss in about as many steps with or without (best 1.03×)
    assert v["GD_same_loss_steps_best"] > 2 and v["GD_converged_cells"] < v["GD_cells"]
    assert v["AdaGrad_same_loss_steps_best"] < 1.2
    assert math.isfinite(v["GD_same_loss_median"]) and v["GD_same_loss_median"] > 0


@pytest.mark.slow
def test_digits_teleport_overhead_is_measured_and_the_loss_kept(tmp_path):
    v = _run("teleport_digits.py", tmp_path)
    for name in ("SGD", "AdaGrad"):
        assert v[f"{name}_teleports"] == 1 and v[f"{name}_accepted"] == 1
        assert v[f"{name}_overhead_epochs"] < 1                # one teleport costs less than one epoch
        assert v[f"{name}_max_rel_loss_change"] < 1e-10
        assert v[f"{name}_objective_gain"] >= 1                # the ascent never lowers the objective
        assert math.isfinite(v[f"{name}_overhead_epochs"]) and v[f"{name}_overhead_epochs"] > 0
        for tag in ("plain", "teleport"):
            assert 0 <= v[f"{name}_{tag}_val_acc"] <= 1 and math.isfinite(v[f"{name}_{tag}_val_loss"])
    assert v["AdaGrad_objective_gain"] > 1                     # the metric objective moves (no NaN gradient)
    # Figs. 5.10–5.11 not reproduced as a speed-up: a teleport cheaper than an epoch raises the objective by a few
    # per cent at most (quick: 1.00 SGD, 1.01 AdaGrad; full run 1.00–1.03), too little to change the training
    for name in ("SGD", "AdaGrad"):
        assert v[f"{name}_objective_gain"] < 1.1, name


def test_sharpness_and_curvature_correlations_are_defined(tmp_path):
    v = _run("teleport_sharpness.py", tmp_path)
    assert v["models"] == 6
    keys = [k for k in v if k.endswith(("_pearson", "_spearman"))]
    assert len(keys) == 18                                     # 4 measures × 2 targets × 2 coefficients, + train
    for key in keys:
        assert math.isfinite(v[key]) and -1 <= v[key] <= 1, key
    # Figs. 5.3–5.4 not reproduced as a generalisation effect: across hyper-parameters the validation loss follows the
    # training loss (quick: +1.00), the sharper models are the better trained ones (−0.75; the paper: strongly
    # positive) and the curvature rises with the loss (+0.98; the paper: weakly negative). Six models, fixed seeds.
    assert v["train_loss_val_loss_pearson"] > 0.99
    assert v["sharpness_val_loss_pearson"] < 0 < v["curvature_val_loss_pearson"]
