"""The discovery examples run in quick mode: the audit's rows and the reproductions' plots and JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_audit_quick_confirms_every_derived_symmetry(tmp_path):
    out = tmp_path / "audit.json"
    done = subprocess.run([sys.executable, str(EXAMPLES / "discovery_audit.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["model"]: r for r in json.loads(out.read_text())}
    assert all(not r["unconfirmed"] and r["confirmed"] for r in rows.values())
    assert (rows["relu"]["discovered"], rows["relu"]["derived"]) == (3, 3)
    assert (rows["identity"]["discovered"], rows["identity"]["explained"]) == (12, 12)
    assert rows["x*sqrt(x*x) (unknown op)"]["new_tangent"] == 3 and rows["x*sqrt(x*x) (unknown op)"]["derived"] == 0
    generated = [r for name, r in rows.items() if name.startswith("g")]   # the generated grid's first three
    assert [r["model"] for r in generated] == ["g0 mlp/identity", "g1 residual/relu", "g2 norm/leaky_relu"]
    assert all(r["discovered"] >= r["derived"] > 0 and r["explained"] == r["derived"] for r in generated)


def test_reproductions_quick_write_plots_and_figures(tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLES / "discovery_reproductions.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("discovery_curves.png", "discovery_generators.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = {r["model"]: r for r in json.loads((tmp_path / "discovery_reproductions.json").read_text())["runs"]}
    assert (rows["scalar"]["null_space"], rows["scalar"]["derived"]) == (1, 1)       # the rescaling
    # gl(2), and two fields along the kernel of the one-row reader W₂ (no new direction: docs/discovery.md)
    assert (rows["linear-2"]["null_space"], rows["linear-2"]["derived"], rows["linear-2"]["new_tangent"]) == (6, 4, 0)
    assert all(0.0 <= r["learned_in_derived"] <= 1.0 + 1e-9 for r in rows.values())
    assert all(len(r["learned"]["t"]) == 9 and len(r["learned"]["tangent_curve"]) == 9 for r in rows.values())
    assert all(0.0 <= r["new_fraction"] <= r["learned_in_exact"] + 1e-9 for r in rows.values())
