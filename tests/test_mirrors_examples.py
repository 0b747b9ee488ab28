"""The mirror reproductions run end to end in quick mode, plot, and show what the theory predicts at that size."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "mirror_constraints.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mirrors")
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout, out


def _tokens(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", stdout))


def test_every_experiment_plots(quick_run):
    _, out = quick_run
    for name in ("sparsity", "lowrank", "correlation", "plasticity", "landscape", "dcs"):
        assert (out / f"mirrors_{name}.png").stat().st_size > 0, name


def test_sparsity_only_with_the_mirror_and_collapse_drifts_the_conserved_quantity(quick_run):
    stdout, _ = quick_run
    values = _tokens(stdout)
    assert float(values["sparsity_plain_max"]) == 0.0 and float(values["sparsity_hadamard_max"]) > 0.5
    for line in stdout.splitlines():
        if line.startswith("sparsity lr=") and "hadamard=0.000" not in line and "nan" not in line.split("hadamard=")[1]:
            row = _tokens(line)
            # u_i² − w_i² was nonzero at the start: gradient flow would keep it; the discrete steps drove it to ~0
            assert float(row["min_abs_Q_initial_collapsed"]) > 1e-6
            assert float(row["max_abs_Q_final_collapsed"]) < float(row["min_abs_Q_initial_collapsed"])


def test_landscape_fixed_sets_are_invariant_and_dcs_keeps_accuracy(quick_run):
    stdout, _ = quick_run
    assert float(_tokens(stdout)["landscape_max_offline"]) < 1e-12
    dcs = {m[0]: (float(m[1]), float(m[2])) for m in re.findall(r"dcs arm=(\S+) accuracy=(\S+) sparsity=\S+ "
                                                                r"accuracy_zeroed=(\S+)", stdout)}
    assert set(dcs) == {"vanilla", "u⊙w"}
    for accuracy, zeroed in dcs.values():
        assert accuracy > 0.85 and zeroed == accuracy
