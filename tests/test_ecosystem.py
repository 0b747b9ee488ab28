"""The conventions of a well-kept scientific Python package: packaging metadata, a lazy import, the error family,
structured output (``to_dict``, the notebook's HTML), logging and progress callbacks."""
import html
import io
import json
import logging
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import symalg
from symalg.errors import (CertificationError, LoweringError, MissingParameterError, ParameterError,
                           ParameterTypeError, SpecError, TracingError, WidthError)
from symalg.progress import progress_bar

ROOT = Path(__file__).resolve().parents[1]


# packaging

def test_metadata_is_pep621_with_one_version_source_and_a_license():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "symalg" and project["dynamic"] == ["version"]
    version_file = (ROOT / "symalg" / "_version.py").read_text()
    assert re.search(rf'^__version__ = "{re.escape(symalg.__version__)}"$', version_file, re.M)
    assert "[metadata]" not in (ROOT / "setup.cfg").read_text()          # one place for the metadata
    assert project["license"] == {"text": "MIT"} and (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert f"## [{symalg.__version__}]" in (ROOT / "CHANGELOG.md").read_text()
    assert {"test", "docs", "lint"} <= set(project["optional-dependencies"])
    assert project["scripts"] == {"symalg": "symalg.cli:main"}
    assert "Programming Language :: Python :: 3.11" in project["classifiers"]


def test_torch_is_a_range_in_the_package_and_pinned_in_the_readme_install_command():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_requirement = next(Requirement(r) for r in project["dependencies"] if r.startswith("torch"))
    assert "2.13.0" in torch_requirement.specifier and "2.5.0" not in torch_requirement.specifier
    assert len(torch_requirement.specifier) == 2                               # a range, not a pin
    readme = (ROOT / "README.md").read_text()
    install = re.search(r"^\$ (pip install .*)$", readme, re.M).group(1)      # what .ci/run runs
    assert install == 'pip install -e ".[test]" "torch==2.13.0"'
    minimum = project["requires-python"].removeprefix(">=")
    assert f"Python {minimum} or newer" in readme


# a lazy import

def test_import_symalg_loads_neither_torch_nor_sympy_until_a_name_is_used():
    code = ("import sys, symalg\n"
            "before = sorted(m for m in ('torch', 'sympy', 'networkx') if m in sys.modules)\n"
            "symalg.derive\n"
            "print(before, 'torch' in sys.modules, symalg.__version__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["[]", "True", symalg.__version__], result.stderr


def test_every_public_name_resolves_and_is_listed():
    for name in symalg.__all__:
        assert getattr(symalg, name) is not None
    assert set(symalg.__all__) <= set(dir(symalg))
    assert symalg.applications.teleport.__name__ == "symalg.applications.teleport"
    assert symalg.noether.__name__ == "symalg.applications.noether"
    with pytest.raises(AttributeError, match="module 'symalg' has no attribute 'nonsense'"):
        symalg.nonsense
    with pytest.raises(AttributeError, match="'symalg.applications' has no attribute 'nonsense'"):
        symalg.applications.nonsense


# errors

def test_every_error_is_a_spec_error_and_a_value_error_or_the_builtin_it_replaces():
    for error in (TracingError, ParameterError, WidthError, CertificationError, LoweringError):
        assert issubclass(error, SpecError) and issubclass(error, ValueError)
    assert issubclass(MissingParameterError, KeyError) and issubclass(ParameterTypeError, TypeError)
    assert issubclass(LoweringError, TypeError)
    assert str(MissingParameterError("q: parameter(s) ['W'] missing")) == "q: parameter(s) ['W'] missing"


def test_subs_refuses_a_width_that_is_not_a_positive_integer():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    for value in ("three", 2.0, True):
        with pytest.raises(WidthError, match=r"width n: expected a positive integer, got"):
            analysis.subs({"n": value, "h": 4, "m": 2})
    with pytest.raises(SpecError, match="width 0 must be positive"):
        analysis.subs({"n": 0})
    assert analysis.subs({"n": 3, "h": 4, "m": 2}).orbit_dimension() == 4


def test_a_forward_that_raises_is_a_tracing_error_chained_from_the_users_exception():
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise ZeroDivisionError("the user's own bug")

    with pytest.raises(TracingError, match="failed in Broken: ZeroDivisionError: the user's own bug") as info:
        symalg.trace(Broken(), (torch.randn(2, 3),))
    assert isinstance(info.value.__cause__, ZeroDivisionError) and str(info.value.__cause__) == "the user's own bug"


def test_lowered_callables_raise_the_parameter_errors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    params = dict(model.named_parameters())
    quantity = symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),))).conserved_quantities()[0]
    with pytest.raises(MissingParameterError, match=r"parameter\(s\) \['2\.weight'\] missing") as missing:
        quantity({k: v for k, v in params.items() if k != "2.weight"})
    assert isinstance(missing.value, KeyError) and isinstance(missing.value, SpecError)
    with pytest.raises(ParameterTypeError, match="parameter '0.bias' is a list, not a tensor"):
        quantity({**params, "0.bias": [0.0] * 4})
    with pytest.raises(ParameterError, match=r"parameter '0\.bias' has shape \(5,\), expected \(\.\.\., 4\)"):
        quantity({**params, "0.bias": torch.zeros(5, dtype=torch.float64)})
    with pytest.raises(LoweringError, match="takes params and 0 more arguments"):
        quantity.lowered(params, torch.zeros(1))


# structured output

def test_to_dict_holds_the_model_name_and_each_conserved_quantity_as_fields():
    analysis = symalg.derive("linear(3, 4) -> relu -> linear(4, 2)")
    summary = json.loads(json.dumps(analysis.to_dict()))
    assert summary["schema"] == "symalg.analysis/1" and summary["model"] == "linear(3, 4) -> relu -> linear(4, 2)"
    quantity = analysis.conserved_quantities()[0]
    record = summary["symmetries"][0]["conserved"]
    assert record == {"name": quantity.name, "kind": "diagonal", "site": "0", "expression": str(quantity),
                      "latex": quantity.latex(), "terms": record["terms"]}
    assert [t["name"] for t in record["terms"]] == list(quantity.exprs)
    assert record["terms"][0]["latex"] in quantity.latex()
    assert summary["symmetries"][1]["conserved"] is None and summary["widths"] == []
    radial = symalg.derive("linear(2, 3) -> radial -> linear(3, 1)").to_dict()
    assert [(j["name"], j["site"]) for j in radial["angular_momenta"]] == [("J__0", "0")]


def test_html_repr_is_a_table_of_groups_sites_tensors_and_rendered_conserved_quantities():
    analysis = symalg.derive("linear(n, h) -> relu -> linear(h, m)")
    page = analysis._repr_html_()
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td>"
                      r"</tr>", page)
    assert [row[:4] for row in rows] == [("PositiveScaling(h, alpha=1)", "0", "continuous", "h"),
                                         ("S(h)", "0", "discrete", "0")]
    assert rows[0][4] == "0.weight<br>0.bias<br>2.weight"
    assert rows[0][5] == f"$${html.escape(analysis.conserved_quantities()[0].latex())}$$" and rows[1][5] == ""
    assert "orbit dimension (generic): $h$" in page and "certification: none" in page


def test_html_repr_lists_the_blocked_notes_with_their_codes_explained():
    class Cumulative(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)).cumsum(-1))

    analysis = symalg.derive(symalg.trace(Cumulative().double(), (torch.randn(5, 3, dtype=torch.float64),)))
    page = analysis._repr_html_()
    assert analysis.blocked and all(f"<li>blocked: {html.escape(str(b))}</li>" in page for b in analysis.blocked)
    assert "PS = positive diagonal scaling" in page and "<table>" not in page and "no symmetry" in page


# logging and progress

def test_verify_reports_progress_stage_by_stage():
    analysis = symalg.derive("linear(2, 3) -> relu -> linear(3, 1)")
    seen = []
    report = symalg.verify(analysis, progress=lambda done, total, what: seen.append((done, total, what)))
    assert report.passed
    total = len(analysis.symmetries) + 6
    assert [done for done, _, _ in seen] == list(range(1, total + 1)) and {t for _, t, _ in seen} == {total}
    assert [what for _, _, what in seen] == ["invariance", *(s.label for s in analysis.symmetries), "gradient flow",
                                             "angular momentum", "lowering", "orbit dimension", "dynamics"]


def test_progress_bar_draws_in_place_and_ends_its_line():
    out = io.StringIO()
    with progress_bar("teleport", stream=out, width=10) as bar:
        bar(1, 4, "step 1")
        bar(4, 4, "step 4")
    frames = out.getvalue().split("\r")[1:]
    assert frames[0].startswith("teleport [##........] 1/4 step 1 (")
    assert frames[1].startswith("teleport [##########] 4/4 step 4 (") and frames[1].endswith("\n")
    with progress_bar("off", enabled=False) as nothing:
        assert nothing is None


def test_library_messages_go_to_the_symalg_logger(caplog):
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("symalg").handlers)

    class Branchy(torch.nn.Module):   # control flow on a shape: fx fails, torch.export takes over
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x) if x.shape[0] > 1 else -self.fc(x)

    with caplog.at_level(logging.INFO, logger="symalg"):
        analysis = symalg.derive(symalg.trace(Branchy().double(), (torch.ones(4, 3, dtype=torch.float64),)))
    assert analysis.model_graph.tracer == "export"
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    assert ("symalg.frontend.tracing", "trace: torch.fx cannot trace Branchy (TraceError: symbolically traced "
            "variables cannot be used as inputs to control flow); trying torch.export") in messages
    assert any(name == "symalg.symbolic.derive" and re.fullmatch(r"derive: \d+ of \d+ claims certified", message)
               for name, message in messages)


def test_teleport_discovery_and_the_fuzzer_report_progress():
    from symalg.applications.teleport import GradNorm, as_action, teleport
    from symalg.verification import fuzz

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Identity(), torch.nn.Linear(4, 2)).double()
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    params = {k: v.detach() for k, v in model.named_parameters()}
    steps = []
    result = teleport(as_action(analysis), params,
                      lambda p: ((torch.func.functional_call(model, p, (x,)) - y) ** 2).mean(), GradNorm(), steps=3,
                      progress=lambda done, total, what: steps.append((done, total, what)))
    assert result.steps == len(steps) > 0 and steps == [(k, 3, "teleport") for k in range(1, result.steps + 1)]
    stages = []
    symalg.discover("linear(2, 3) -> relu -> linear(3, 1)", progress=lambda *step: stages.append(step))
    assert stages == [(1, 4, "constraints sampled"), (2, 4, "null space"), (3, 4, "derived symmetries"),
                      (4, 4, "generators checked")]
    models = []
    report = fuzz.run(2, families=["mlp"], progress=lambda *step: models.append(step))
    assert not report.false_claims and models == [(1, 2, "model 0"), (2, 2, "model 1")]


def test_exec_python_pages_show_the_code_and_what_it_printed_and_fail_on_errors(tmp_path):
    """The directive behind the executed tutorial and gallery (``docs/_ext/executed.py``), on a two-page site."""
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'docs' / '_ext')!r})\n"
                                    "extensions = ['myst_parser', 'executed']\n")
    (source / "index.md").write_text("# Page\n\n```{exec-python}\nx = 6 * 7\n```\n\ntext\n\n"
                                     "```{exec-python}\nprint('answer', x, DOCS.name)\n```\n")
    (source / "broken.md").write_text("# Broken\n\n```{exec-python}\nraise ValueError('no good')\n```\n")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(source), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    text = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "out" / "index.html").read_text()))
    assert text.index("x = 6 * 7") < text.index("answer 42 src")   # one namespace, in page order, code then output
    assert "the code raised" in done.stderr and "ValueError: no good" in done.stderr
