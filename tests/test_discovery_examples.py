"""The discovery examples run in quick mode: the audit's rows and the reproductions' plots and JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import symalg

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



def _tiny_transformer_module():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import discovery_reproductions
    finally:
        sys.path.remove(str(EXAMPLES))
    return discovery_reproductions


def test_tiny_transformer_is_the_printed_model_with_28_parameters():
    """[Zhao2026] Sec. 6.5.5: a linear FFN ``Z W₁ W₂`` after ``X + Attn(X)``, no FFN residual, no biases. Counting:
    ``3·2² + 2·2·4 = 28`` parameters (printed ``p = 32``)."""
    model = _tiny_transformer_module().TinyTransformer().double()
    assert sum(p.numel() for p in model.parameters()) == 28
    x = torch.randn(3, 2, 2, dtype=torch.float64)
    z = x + torch.softmax(model.q(x) @ model.k(x).transpose(-2, -1) / 2 ** 0.5, -1) @ model.v(x)
    assert torch.allclose(model(x), z @ model.up.weight.T @ model.down.weight.T, atol=1e-14)


@pytest.mark.slow
def test_tiny_transformer_null_space_is_derived():
    """The printed model's exact null space is ``gl(2)`` on the query-key space plus ``gl(4)`` on the linear FFN's
    hidden site, 4 + 16 = 20, every direction derived (about 80 s on the loaded 2-core machine)."""
    analysis, _, _, _, point = _tiny_transformer_module()._build("transformer")
    exact = symalg.discover(analysis, data=point)
    assert (exact.parameters, exact.dimension, exact.derived_dimension, exact.new) == (28, 20, 20, 0)
