"""The `symalg` command and the README's documented usage."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import symalg
from symalg.cli import DEFAULT_SPEC, main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_default_run_prints_groups_generators_orbit_conserved_latex_and_verification(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert f"model: {DEFAULT_SPEC!r}" in out
    assert "PositiveScaling(h1, alpha=1) on 0" in out and "GL(h2) on 2" in out and "Shears(h2) on 2" in out
    # at the default widths n=3, h1=4, h2=3, m=2: the algebras' dimensions and the discrete generators
    assert "Lie algebra of dim 9; discrete generators: reflection diag(-1, 1, ..., 1)" in out
    assert "discrete generators: transposition (0 1) and cycle" in out
    assert "orbit dimension (generic): h1 + h2**2 + h2 - (h2 - Min(h1, h2))*(h2 - Min(h2, m))" in out
    assert "orbit dimension (generic): 16" in out     # 4 + 9 + 3 − (3 − 3)(3 − 2)
    assert "moves 2.bias (entries); 4.bias absorbs −4.weight columns[0:3] (in) t" in out
    assert "C__2 = 2.bias*2.bias.T + 2.weight*2.weight.T - 4.weight.T*4.weight" in out
    assert r"C_{2} = b_{2} b_{2}^{T} + W_{2} W_{2}^{T} - W_{4}^{T} W_{4}" in out  # the LaTeX part
    assert re.search(r"verification:\n  \d+ passed, 0 failed", out)


def test_custom_spec_widths_and_verbose_checks(capsys):
    assert main(["linear(n, h) -> tanh -> linear(h, m)", "--widths", "n=2,h=3,m=1", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "SignFlips(3)" in out and "pass  invariance" in out


def test_symbolic_spec_without_widths_skips_verification(capsys):
    assert main(["linear(n, h) -> relu -> linear(h, m)"]) == 0
    assert "no verification: give --widths for h, m, n" in capsys.readouterr().out


def test_latex_only(capsys):
    assert main(["linear(n, h) -> identity -> linear(h, m)", "--latex"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("\\begin{align*}\n\\text{orbit dimension} &=") and "network:" not in out


def test_bad_spec_exits_with_an_error_naming_the_layer(capsys):
    assert main(["linear(3, 4) -> swish -> linear(4, 1)"]) == 2
    assert "layer 1: unknown layer 'swish'" in capsys.readouterr().err
    assert main(["linear(3, 4)", "--widths", "h=x"]) == 2


def test_failing_verification_gives_exit_status_1(capsys, monkeypatch):
    wrong = symalg.overlay({"tanh": symalg.CatalogueEntry("tanh", symalg.CATALOGUE["tanh"].function,
                                                          symalg.catalogue.activations.declare_homogeneous())})
    # strict=False keeps the disproved declaration, certify=False keeps derive from removing it numerically
    monkeypatch.setattr(symalg.cli, "_derive_spec", lambda spec: symalg.derive(symalg.parse(spec, catalogue=wrong),
                                                                               wrong, strict=False, certify=False))
    assert main(["linear(2, 3) -> tanh -> linear(3, 1)"]) == 1
    assert "FAIL  invariance" in capsys.readouterr().out


def test_console_script_is_installed_and_runs():
    result = subprocess.run([sys.executable, "-m", "symalg.cli", "--no-verify"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "orbit dimension" in result.stdout


def test_python_dash_m_symalg_runs_the_command_and_returns_its_status():
    ok = subprocess.run([sys.executable, "-m", "symalg", "--no-verify"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "orbit dimension" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "symalg", "linear(2, 3) -> nosuchop -> linear(3, 1)"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("symalg: error:") and "nosuchop" in bad.stderr


def test_readme_python_example_runs():
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["report"].passed, str(namespace["report"])
    assert namespace["traced"].orbit_dimension(namespace["params"]).dimension == 5


def test_widths_must_name_the_spec_widths_once(capsys):
    assert main(["linear(n, h) -> relu -> linear(h, m)", "--widths", "n=3,h=5,m=2,h=6"]) == 2
    assert "--widths: h is given twice" in capsys.readouterr().err
    assert main(["linear(2, 3) -> relu -> linear(3, 1)", "--widths", "n=3"]) == 2
    assert "the spec has no symbolic width 'n' (it has none)" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_unavailable_device_fails_before_the_report(capsys):
    assert main(["linear(2, 3) -> relu -> linear(3, 1)", "--device", "cuda"]) == 2
    captured = capsys.readouterr()
    assert "device 'cuda' is not available here" in captured.err and captured.out == ""


def test_model_file_prints_symmetries_and_the_blocking_node(capsys):
    status = main(["--model", "examples/gpt_block.py"])
    out = capsys.readouterr().out
    assert status == 0
    assert "GL(4) on attn.head1.qk" in out and "S(2) on attn.heads" in out
    assert "blocked: fc1 (node cumsum): PS, S removed" in out
    assert "0 failed" in out


def test_a_model_file_gets_the_same_report_as_its_spec(tmp_path, capsys):
    """The same network as a spec and as a ``--model`` file: the same sections, symmetries and verification."""
    path = tmp_path / "mlp.py"
    path.write_text("import torch\ntorch.manual_seed(0)\n"
                    "model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), "
                    "torch.nn.Linear(4, 2)).double()\n"
                    "example_inputs = (torch.randn(8, 3, dtype=torch.float64),)\n")
    assert main(["linear(3, 4) -> tanh -> linear(4, 2)"]) == 0
    spec = capsys.readouterr().out
    assert main(["--model", str(path)]) == 0
    model = capsys.readouterr().out

    def sections(out):  # the headings, in order
        return [line.split(":")[0] for line in out.splitlines() if line and not line.startswith((" ", "\\", "&"))]

    def groups(out):  # the symmetries, on the site named after the layer producing it on both routes
        return re.findall(r"^  (\S+ on \S+)  \[", out, re.M)

    assert sections(spec) == ["model", "symmetries", "restricted", "restricted", "orbit dimension (generic)",
                              "conserved quantities", "certification", "LaTeX", "verification"]
    assert sections(model) == ["model", "tracer", *sections(spec)[1:]] and "\ntracer: fx\n" in model
    assert groups(model) == groups(spec) == ["SignFlips(4) on 0", "S(4) on 0"]
    assert "orbit dimension (generic): 0" in spec and "orbit dimension (generic): 0" in model
    assert re.search(r"verification:\n  3 passed, 0 failed \(3 checks, float64, cpu\)", spec)
    assert re.search(r"verification:\n  3 passed, 0 failed \(3 checks, float64, cpu\)", model)


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"symalg {symalg.__version__}\n"


def test_help_is_plain_text_and_explains_the_group_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert not re.search(r"``|:(func|class|mod):`", out)          # no raw reStructuredText
    assert "--tracer {auto,fx,export}" in out and "--json" in out and "exit status: 0" in out
    assert re.search(r"^  EF  sign flips of an even activation's input$", out, re.M)
    assert re.search(r"^  T1  translation along the ones vector", out, re.M)


def test_help_and_version_import_neither_torch_nor_sympy():
    code = ("import sys, contextlib, io\nfrom symalg.cli import main\n"
            "for argv in (['--help'], ['--version']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main(argv)\n"
            "print(sorted(m for m in ('torch', 'sympy', 'networkx') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_report_explains_the_codes_of_its_notes(capsys):
    assert main(["linear(3, 4) -> relu -> linear(4, 2)", "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "restricted: 0 (node 1): EF, GL, O, O1, SF, T, T1 removed" in out
    legend = re.search(r"^  \(codes: (.*)\)$", out, re.M).group(1)
    assert legend.startswith("GL = general linear GL(h), O = orthogonal O(h), ")
    assert "EF = sign flips of an even activation's input" in legend and "PS = positive diagonal scaling" in legend


def test_json_report_has_the_analysis_the_widths_and_the_verification(capsys):
    assert main(["linear(n, h) -> tanh -> linear(h, m)", "--widths", "n=2,h=3,m=1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "symalg.cli/1" and report["version"] == symalg.__version__
    assert report["exit_status"] == 0 and report["widths"] == {"n": 2, "h": 3, "m": 1}
    assert report["analysis"]["model"] == "linear(n, h) -> tanh -> linear(h, m)"
    assert [s["group"] for s in report["analysis"]["symmetries"]] == ["SignFlips(h)", "S(h)"]
    assert [s["group"] for s in report["at_widths"]["symmetries"]] == ["SignFlips(3)", "S(3)"]
    verification = report["verification"]
    assert verification["passed"] and verification["summary"].endswith("(3 checks, float64, cpu)")
    assert {c["check"] for c in verification["checks"]} >= {"invariance"}
    assert all(c["passed"] for c in verification["checks"] if not c["skipped"])


def test_json_report_without_widths_has_no_verification(capsys):
    assert main(["linear(n, h) -> relu -> linear(h, m)", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verification"] is None and report["at_widths"] is None and report["widths"] == {}
    conserved = report["analysis"]["symmetries"][0]["conserved"]
    assert conserved["kind"] == "diagonal" and conserved["site"] == "0" and conserved["terms"][0]["name"] == "q__0"


def test_json_report_of_a_failing_verification_has_exit_status_1(capsys, monkeypatch):
    wrong = symalg.overlay({"tanh": symalg.CatalogueEntry("tanh", symalg.CATALOGUE["tanh"].function,
                                                          symalg.catalogue.activations.declare_homogeneous())})
    monkeypatch.setattr(symalg.cli, "_derive_spec", lambda spec: symalg.derive(symalg.parse(spec, catalogue=wrong),
                                                                               wrong, strict=False, certify=False))
    assert main(["linear(2, 3) -> tanh -> linear(3, 1)", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["exit_status"] == 1 and not report["verification"]["passed"]
    assert any(c["check"] == "invariance" and not c["passed"] for c in report["verification"]["checks"])


def test_tracer_option_chooses_the_tracer_of_a_model_file(tmp_path, capsys):
    path = tmp_path / "mlp.py"
    path.write_text("import torch\ntorch.manual_seed(0)\n"
                    "model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), "
                    "torch.nn.Linear(4, 2)).double()\n"
                    "example_inputs = (torch.randn(8, 3, dtype=torch.float64),)\n")
    assert main(["--model", str(path), "--tracer", "export", "--json", "--no-verify"]) == 0
    exported = json.loads(capsys.readouterr().out)["analysis"]
    assert exported["tracer"] == "export" and exported["model"] == "Sequential"
    assert main(["--model", str(path), "--tracer", "fx", "--no-verify"]) == 0
    assert "\ntracer: fx\n" in capsys.readouterr().out


def test_options_that_do_not_apply_are_refused(capsys):
    assert main(["linear(2, 3) -> relu -> linear(3, 1)", "--tracer", "fx"]) == 2
    assert "--tracer applies to --model" in capsys.readouterr().err
    assert main(["--json", "--latex"]) == 2
    assert "--json and --latex: choose one output" in capsys.readouterr().err


def test_progress_bar_is_drawn_on_stderr_only_when_asked(capsys):
    assert main(["linear(2, 3) -> relu -> linear(3, 1)", "--progress", "on"]) == 0
    captured = capsys.readouterr()
    assert "verify [" in captured.err and captured.err.rstrip().endswith(")") and "verify [" not in captured.out
    assert main(["linear(2, 3) -> relu -> linear(3, 1)"]) == 0      # auto: stderr is no terminal under pytest
    assert capsys.readouterr().err == ""
