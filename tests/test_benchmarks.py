"""The benchmark runner: ``benchmarks/run_all.py --quick`` runs every benchmark's quick mode and writes one JSON file
holding every benchmark's figures (no timing is asserted: the figures are what the run measured)."""
import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from run_all import BENCHMARKS  # noqa: E402  (benchmarks/ is not a package)


def test_run_all_quick_writes_every_benchmarks_figures_as_json(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run_all.py"), "--quick", "--out",
                           str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["quick"] is True
    assert {"cpu", "cores", "torch_threads", "load_average", "commit"} <= set(result["machine"])
    assert list(result["benchmarks"]) == list(BENCHMARKS)
    for name, entry in result["benchmarks"].items():
        assert "error" not in entry, (name, entry.get("error"))
        assert entry["seconds"] > 0 and isinstance(entry["figures"], dict) and entry["figures"], name
    verify = result["benchmarks"]["bench_verify"]["figures"]["depths"]
    assert [r["depth"] for r in verify] == [3, 9] and all(r["passed"] for r in verify)
    assert all(r["verify_s"] > 0 and r["gradient_ms"] > 0 for r in verify)
    orthogonality = result["benchmarks"]["bench_verify"]["figures"]["orthogonality"]
    assert orthogonality["symmetries"] > 0 and orthogonality["regions_s"] > 0
    assert orthogonality["worst_cosine_regions"] < 1e-9 and orthogonality["worst_cosine_folded"] < 1e-9
    gpu = result["benchmarks"]["bench_gpu"]["figures"]
    assert gpu["cuda"] == torch.cuda.is_available()
    assert all(r["passed"] for r in gpu.get("rows", []) if r["case"].startswith("verify"))
    lowered = result["benchmarks"]["bench_lowered_q"]["figures"]["rows"]
    assert {(r["case"], r["width"]) for r in lowered} >= {("q (ReLU site, h)", 256), ("action GL(h)", 256)}
    spec = result["benchmarks"]["bench_derive"]["figures"]["spec_vs_traced"]
    assert all(r["spec_symbolic"]["claims"] == r["spec_concrete"]["claims"] == r["traced"]["claims"] for r in spec)


def test_a_failing_benchmark_is_recorded_and_the_run_fails(tmp_path, monkeypatch):
    import types

    import run_all

    def broken(quick=False):
        raise ValueError("no figures")

    monkeypatch.setitem(sys.modules, "bench_verify", types.SimpleNamespace(figures=broken))
    out = tmp_path / "figures.json"
    assert run_all.main(["--quick", "--only", "bench_verify", "--out", str(out)]) == 1
    entry = json.loads(out.read_text())["benchmarks"]["bench_verify"]
    assert entry["error"] == "ValueError: no figures" and "figures" not in entry
