"""Hostile-input corpus: every case is refused with a clear error naming the problem, and nothing is evaluated.

Each case asserts the error type and a regex on the offending token. Every case runs with a marker file
path in ``tmp_path``; the injection payloads would create it, and each test asserts it does not exist.
CLI cases run ``symalg.cli.main`` in-process: exit status 2, one ``symalg: error:`` line (or argparse's
usage error), no traceback. See docs/soundness.md, "Hostile input".
"""
from __future__ import annotations

import re

import pytest
import sympy as sp
import torch
from torch import nn

import symalg
from symalg.cli import main
from symalg.applications.conjugated import ellipse, quadratic_form
from symalg.errors import SpecError
from symalg.catalogue.groups import GeneralLinear
from symalg.catalogue.modules import Activation

MARKER = "MARKER"  # replaced by the quoted path of the marker file in every case


def payload(marker) -> str:
    """Python that creates the marker file if anything evaluates it."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "evaluated"
    yield path
    assert not path.exists(), "a hostile input was evaluated"


# -- spec strings: the allow-list grammar --------------------------------------------------------
SPECS = [
    ('linear(3, 4) -> leaky_relu(slope="PAYLOAD or 0.2") -> linear(4, 2)', r"slope: argument .* is a quoted string"),
    ('linear(3, 4) -> leaky_relu(slope="0.2") -> linear(4, 2)', r"layer 1 \(leaky_relu\) slope: .*quoted string"),
    ("linear(3, 4) -> leaky_relu(slope=PAYLOAD) -> linear(4, 2)", r"slope: argument .*touch.* must be a number"),
    ("linear(3, PAYLOAD) -> relu -> linear(4, 2)", r"layer 0 \(linear\): argument .*pathlib.* must be a number"),
    ("linear('3', 4) -> relu -> linear(4, 2)", r"layer 0 \(linear\): argument '3' is a quoted string"),
    ("linear(3, (lambda: 4)()) -> relu -> linear(4, 2)", r"argument .*lambda.* must be a number or a name"),
    ("linear(3, os.sep) -> relu -> linear(4, 2)", r"argument 'os\.sep' must be a number or a name"),
    ("linear(3, h[0]) -> relu -> linear(h, 2)", r"argument 'h\[0\]' must be a number or a name"),
    ("linear(3, 4) -> PAYLOAD -> linear(4, 2)", r"layer 1: expected `name` or `name\(args\)`"),
    ("linear(*[3, 4]) -> relu -> linear(4, 2)", r"layer 0 \(linear\): \* and \*\* arguments are not allowed"),
    ("linear(3, 4) -> leaky_relu(**{'slope': 0.2}) -> linear(4, 2)", r"\* and \*\* arguments are not allowed"),
    ("linear(3, __builtins__) -> relu -> linear(__builtins__, 2)", r"name '__builtins__' is not allowed"),
    ("linear(3, 4) -> relu -> linear(4, 2); PAYLOAD", r"layer 2: cannot parse"),
    ("linear(3, 4) -> relu -> linear(4, 2) if PAYLOAD else 0", r"layer 2: expected `name`"),
    ("linear(3, 9**9**9) -> relu -> linear(9**9**9, 2)", r"argument '9 \*\* 9 \*\* 9': exponentiation"),
    ("linear(3, 4) -> leaky_relu(slope=10**10**10) -> linear(4, 2)", r"slope: argument .*exponentiation"),
    ("linear(3, 4) -> leaky_relu(slope=1e400) -> linear(4, 2)", r"slope: argument .* is not a finite number"),
    ("linear(3, 4) -> leaky_relu(slope=-1e400) -> linear(4, 2)", r"slope: argument .* is not a finite number"),
    ("linear(3, 4) -> leaky_relu(slope=1/0) -> linear(4, 2)", r"slope: argument '1 / 0' divides by zero"),
    ("linear(3, 4) -> leaky_relu(slope=1j) -> linear(4, 2)", r"slope: argument '1j' must be a number"),
    ("linear(3, 4) -> leaky_relu(slope=1" + "0" * 100 + ") -> linear(4, 2)", r"slope: argument '10+' is too large"),
    ("linear(3, 4) -> leaky_relu(slope=" + "1" * 5000 + ") -> linear(4, 2)", r"layer 1: cannot parse"),
    ("linear(3, 4) -> leaky_relu(slope=" + "-" * 100000 + "1) -> linear(4, 2)", r"layer 1: cannot parse"),
    ("linear(3, 4) -> leaky_relu(slope=" + "+".join(["1"] * 900) + ") -> linear(4, 2)",
     r"slope: argument is nested too deeply"),
    ("linear(3, 1000000000000) -> relu -> linear(1000000000000, 2)", r"width 1000000000000 exceeds the limit"),
    ("linear(0, 4) -> relu -> linear(4, 2)", r"layer 0 \(linear\) in_features: width 0 must be positive"),
    ("linear(3, -4) -> relu -> linear(-4, 2)", r"out_features: width -4 must be positive"),
    ("linear(2.5, 4) -> relu -> linear(4, 2)", r"in_features: width 2\.5 is not an integer"),
    ("linear(True, 4) -> relu -> linear(4, 2)", r"in_features: width True is not an integer"),
    ("linaer(h, m)", r"layer 0: unknown layer 'linaer'; did you mean 'linear'"),
    ("linear(3, 4) -> rleu -> linear(4, 2)", r"layer 1: unknown layer 'rleu'; did you mean 'relu'"),
    ("linear(3, 4) -> relu -> linear(4, 2, bias='False')", r"bias: argument 'False' is a quoted string"),
    ("linear(3, 4) -> relu -> linear(4, 2, bias=0)", r"layer 2 \(linear\): bias must be True or False, got 0"),
    ("linear(3, 4) -> leaky_relu(sloap=0.2) -> linear(4, 2)", r"layer 1: .*no hyper-parameter \['sloap'\]"),
    ("linear(3, 4) -> leaky_relu(slope=nan) -> linear(4, 2)", r"layer 1: .*slope=nan must be a finite real number"),
    ("linear(3, 4) -> relu_pow(alpha=-1/2) -> linear(4, 2)", r"alpha=-1/2 must be positive"),
    ("", r"the network is empty"),
    ("linear(3, 4) ->", r"empty layer in spec"),
]


@pytest.mark.parametrize("spec, message", SPECS, ids=[
    "quoted-payload-slope", "quoted-number-slope", "call-payload-slope", "call-payload-width", "quoted-width",
    "lambda-width", "attribute-width", "subscript-width", "payload-as-layer", "starred-args", "double-star-kwargs",
    "dunder-name-width", "statement-after-spec", "conditional-expression", "power-tower-width", "power-tower-slope",
    "overflowing-slope", "overflowing-negative-slope", "division-by-zero", "complex-slope", "300-bit-slope",
    "5000-digit-slope", "deeply-nested-unary", "900-term-sum", "width-10-to-12", "zero-width", "negative-width",
    "fractional-width", "boolean-width", "misspelt-linear", "misspelt-relu", "quoted-bias", "integer-bias",
    "unknown-hyper-parameter", "nan-slope-name", "negative-degree", "empty-spec", "dangling-arrow"])
def test_spec_string_is_refused_without_evaluation(spec, message, marker):
    with pytest.raises(SpecError, match=message):
        symalg.parse(spec.replace("PAYLOAD", payload(marker)))


# -- the Python API: builder, activation modules, width substitution ------------------------------
API = [
    (lambda m: symalg.Spec().linear(3, 4).leaky_relu(slope=payload(m)).linear(4, 2).build(), SpecError,
     r"layer 1: hyper-parameter .*must be a number or a name"),
    (lambda m: symalg.Spec().linear(3, 4).leaky_relu(slope=f"{payload(m)} or 0.2").linear(4, 2).build(), SpecError,
     r"layer 1: hyper-parameter .*must be a number or a name"),
    (lambda m: Activation("leaky_relu", slope=payload(m)), ValueError, r"hyper-parameter .*must be a number"),
    (lambda m: Activation("relu_pow", alpha="9**9**9"), ValueError, r"exponentiation \(\*\*\) is not allowed"),
    (lambda m: Activation("leaky_relu", slope=float("inf")), ValueError, r"hyper-parameter inf is not a finite number"),
    (lambda m: Activation("leaky_relu", slope=object()), ValueError, r"\(object\) is not a number"),
    (lambda m: symalg.Spec().linear(3, f"h; {payload(m)}").relu().linear("h", 2).build(), SpecError,
     r"layer 0 \(linear\) out_features: width .h; .*pathlib.* is not a valid symbol name"),
    (lambda m: symalg.Spec().linear(3, sp.Symbol("a b")).relu().linear(sp.Symbol("a b"), 2).build(), SpecError,
     r"width 'a b' is not a valid symbol name"),
    (lambda m: symalg.Spec().linear(3, "lambda").relu().linear("lambda", 2).build(), SpecError,
     r"width 'lambda' is not a valid symbol name"),
    (lambda m: symalg.parse("linear(3, h) -> relu -> linear(h, 2)", h="9**9**9"), SpecError,
     r"subs: width h: width '9\*\*9\*\*9' is not a valid symbol name"),
    (lambda m: symalg.parse("linear(3, h) -> relu -> linear(h, 2)", h=payload(m)), SpecError,
     r"subs: width h: width .*pathlib.* is not a valid symbol name"),
    (lambda m: symalg.parse("linear(3, h) -> relu -> linear(h, 2)", h=10 ** 12), SpecError,
     r"subs: width h: width 1000000000000 exceeds the limit of 1048576"),
    (lambda m: symalg.parse("linear(3, h) -> relu -> linear(h, 2)", h=-1), SpecError,
     r"subs: width h: width -1 must be positive"),
    (lambda m: symalg.parse("linear(3, h) -> relu -> linear(h, 2)", k=4), SpecError, r"subs: no width named \['k'\]"),
    # a width named like a name of the generated code would overwrite it (`params = W.shape[-2]`)
    (lambda m: symalg.derive("linear(n, params) -> relu -> linear(params, m)").conserved_quantities()[0](_params()),
     ValueError, r"width\(s\) \['params'\] have the name of a tensor or function the generated code uses"),
    (lambda m: symalg.derive("linear(n, torch) -> relu -> linear(torch, m)").conserved_quantities()[0](_params()),
     ValueError,
     r"width\(s\) \['torch'\] have the name of a tensor or function"),
    # text handed to SymPy constructors elsewhere in the API is refused, not parsed
    (lambda m: GeneralLinear(payload(m)).dim, SpecError, r"GeneralLinear: width: .*pathlib.* is text"),
    (lambda m: ellipse(payload(m)), SpecError, r"ellipse: a: .*pathlib.* is text"),
    (lambda m: quadratic_form([[payload(m), 0], [0, 1]]), SpecError, r"matrix entries: .*pathlib.* is text"),
]


def test_a_width_named_like_a_chain_bias_is_read_correctly():
    """Generated code reads tensors as ``_0_bias`` (a width cannot start with ``_``): a width ``b_1`` overwrites
    nothing."""
    params = _params()
    (q,) = symalg.derive("linear(n, b_1) -> relu -> linear(b_1, m)").conserved_quantities()
    W1, b1, W2 = params["0.weight"], params["0.bias"], params["2.weight"]
    expected = (W1 ** 2).sum(1) + b1 ** 2 - (W2 ** 2).sum(0)
    torch.testing.assert_close(q(params)["q__0"], expected)


@pytest.mark.parametrize("call, error, message", API, ids=[
    "builder-payload-slope", "builder-payload-or-number", "activation-payload-slope", "activation-power-tower",
    "activation-infinite-slope", "activation-object-slope", "builder-width-with-payload", "symbol-with-space",
    "keyword-width-name", "subs-power-tower", "subs-payload", "subs-10-to-12", "subs-negative", "subs-unknown-name",
    "width-named-like-the-argument", "width-named-torch", "group-width-text", "ellipse-text", "quadratic-form-text"])
def test_api_argument_is_refused_without_evaluation(call, error, message, marker):
    with pytest.raises(error, match=message):
        call(marker)


# -- sizes: refused before anything is allocated --------------------------------------------------
SIZES = [
    (lambda: symalg.to_module(symalg.parse("linear(3, 1048576) -> relu -> linear(1048576, 1048576)")),
     r"to_module: the parameters would need 1\.1e\+12 tensor entries, more than the limit"),
    (lambda: symalg.to_module(symalg.parse("linear(3, h) -> relu -> linear(h, 2)")),
     r"to_module: widths \['h'\] are symbolic"),
    (lambda: symalg.verify(symalg.derive("linear(n, h) -> tanh -> linear(h, m)"), widths={"n": 3, "h": 100000, "m": 2}),
     r"site of width 100000 .* 1e\+10 tensor entries"),
    (lambda: symalg.derive("linear(2, 200) -> identity -> linear(200, 2)").symmetries[0].group.algebra_basis(),
     r"the Lie-algebra basis of GL\(200\) would need 1\.6e\+09 tensor entries"),
    (lambda: symalg.derive("linear(2, 1000) -> radial -> linear(1000, 2)").symmetries[0].group.algebra_basis(),
     r"the Lie-algebra basis of O\(1000\) would need 5e\+11 tensor entries"),
]


@pytest.mark.parametrize("call, message", SIZES, ids=[
    "to-module-1e12-parameters", "to-module-symbolic", "verify-width-100000", "gl-basis-200", "orthogonal-basis-1000"])
def test_size_is_refused_before_allocating(call, message, marker):
    with pytest.raises(SpecError, match=message):
        call()


def test_verify_of_a_wide_linear_site_draws_its_generators_without_the_basis():
    """GL(200)'s basis would need 1.6e9 entries (refused above); verify pairs the gradient with 64 Gaussian algebra
    elements drawn one h × h matrix at a time, and passes."""
    report = symalg.verify(symalg.derive("linear(2, 200) -> identity -> linear(200, 2)"))
    assert report.passed, str(report)
    (orthogonality,) = [c for c in report.checks if c.check == "gradient_orthogonality" and "GL" in c.symmetry]
    assert orthogonality.detail == "64 generators" and orthogonality.max_error < 1e-9


# -- example inputs of traced models ----------------------------------------------------------------
def _mlp():
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


class _TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(5, 4)

    def forward(self, x, z):
        return self.a(x) + self.b(z)


INPUTS = [
    (_mlp, lambda: (torch.randn(5, 7),),
     r"failed in module '0' \(Linear\): RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    (_mlp, lambda: (torch.zeros(5, 3, dtype=torch.int64),), r"failed in module '0' \(Linear\): .*same dtype"),
    (_mlp, lambda: (torch.full((5, 3), float("nan")),), r"example input 0 has non-finite entries"),
    (_mlp, lambda: (torch.full((5, 3), float("-inf")),), r"example input 0 has non-finite entries"),
    (_mlp, lambda: (torch.zeros(0, 3),), r"example input 0 is empty \(shape \(0, 3\)\)"),
    (_mlp, lambda: (torch.randn(5, 3), torch.randn(5, 3)), r"failed in Sequential: TypeError: .*positional argument"),
    (_TwoInputs, lambda: (torch.randn(5, 3), torch.randn(5, 4)),
     r"failed in module 'b' \(Linear\): RuntimeError: mat1 and mat2"),
    (_TwoInputs, lambda: (torch.randn(5, 3), torch.full((5, 5), float("nan"))),
     r"example input 1 has non-finite entries"),
]


@pytest.mark.parametrize("build, inputs, message", INPUTS, ids=[
    "wrong-width", "integer-dtype", "nan", "minus-inf", "empty-batch", "too-many-inputs", "second-input-wrong-width",
    "second-input-nan"])
def test_example_input_error_names_the_module_and_shows_torchs_message(build, inputs, message, marker, capfd):
    with pytest.raises(SpecError, match=message):
        symalg.trace(build(), inputs())
    assert "tlparse" not in capfd.readouterr().err


class _ReshapesOnlyUnderFx(nn.Module):
    """Runs eagerly, but its fx graph reshapes a batch of 5 into 7 rows."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        if torch.fx._symbolic_trace.is_fx_tracing():
            x = x.reshape(7, -1)
        return self.fc(x)


def test_fx_graph_failure_shows_torchs_message_not_fx_metadata(marker, capfd):
    with pytest.raises(SpecError, match=r"fx graph of _ReshapesOnlyUnderFx .*failed: RuntimeError: shape '\[7, -1\]' "
                                        r"is invalid for input of size 15"):
        symalg.trace(_ReshapesOnlyUnderFx(), (torch.randn(5, 3),))
    assert "tlparse" not in capfd.readouterr().err


def test_trace_refuses_a_non_module(marker):
    with pytest.raises(SpecError, match=r"trace: expected a torch.nn.Module, got str"):
        symalg.trace("linear(3, 4) -> relu -> linear(4, 2)")


# -- parameters given to verify and to conserved-quantity callables ----------------------------------
_SPEC = "linear(3, 4) -> relu -> linear(4, 2)"


def _params(**changes):
    params = {"0.weight": torch.randn(4, 3), "0.bias": torch.randn(4), "2.weight": torch.randn(2, 4),
              "2.bias": torch.randn(2)}
    params.update(changes)
    return {k: v for k, v in params.items() if v is not None}


PARAMETERS = [
    (lambda: symalg.verify(symalg.derive(_SPEC), params=_params(**{"0.weight": torch.full((4, 3), float("nan"))})),
     SpecError, r"parameter '0\.weight' has non-finite entries"),
    (lambda: symalg.verify(symalg.derive(_SPEC), params=_params(**{"2.bias": torch.tensor([1.0, float("inf")])})),
     SpecError, r"parameter '2\.bias' has non-finite entries"),
    (lambda: symalg.verify(symalg.derive(_SPEC), params=_params(**{"2.bias": None})),
     SpecError, r"parameter '2\.bias' is missing"),
    (lambda: symalg.verify(symalg.derive(_SPEC), params=_params(**{"0.weight": torch.randn(5, 3)})),
     SpecError, r"parameter '0\.weight' has shape \(5, 3\), expected \(4, 3\)"),
    (lambda: symalg.verify(symalg.derive(_SPEC), params=_params(**{"0.bias": torch.randn(4, 1)})),
     SpecError, r"parameter '0\.bias' has shape \(4, 1\), expected \(4,\)"),
    (lambda: symalg.verify(symalg.derive("linear(n, h) -> relu -> linear(h, m)"),
                           params=_params(**{"2.weight": torch.randn(2, 6)})),
     SpecError, r"parameter '2\.weight': width h"),
    (lambda: symalg.verify(symalg.derive(_SPEC), data=torch.randn(8, 5)),
     SpecError, r"verify: the model does not run on data of shapes \[\(8, 5\)\] "
                r"\(example inputs of shapes \[\(8, 3\)\]\)"),
    (lambda: symalg.verify(symalg.derive(_SPEC), dtype=torch.float16), ValueError,
     r"dtype torch.float16 is not supported"),
    (lambda: symalg.derive(_SPEC).conserved_quantities()[0](_params(**{"0.weight": torch.randn(5, 3)})),
     ValueError, r"q_0: parameter '0\.weight' has shape \(5, 3\), expected \(\.\.\., 4, 3\)"),
    (lambda: symalg.derive(_SPEC).conserved_quantities()[0](_params(**{"0.bias": torch.randn(1)})),
     ValueError, r"q_0: parameter '0\.bias' has shape \(1,\), expected \(\.\.\., 4\)"),
    (lambda: symalg.derive("linear(n, h) -> relu -> linear(h, m)").conserved_quantities()[0](
        _params(**{"2.weight": torch.randn(2, 6)})),
     ValueError, r"parameter '2\.weight' has shape \(2, 6\), expected \(\.\.\., 2, 4\)"),
    (lambda: symalg.derive(_SPEC).conserved_quantities()[0](_params(**{"2.weight": None})),
     KeyError, r"parameter\(s\) \['2\.weight'\] missing"),
    (lambda: symalg.derive(_SPEC).conserved_quantities()[0](_params(**{"0.bias": [0.0] * 4})),
     TypeError, r"parameter '0\.bias' is a list, not a tensor"),
]


@pytest.mark.parametrize("call, error, message", PARAMETERS, ids=[
    "verify-nan-weight", "verify-inf-bias", "verify-missing-bias", "verify-wrong-rows", "verify-bias-as-column",
    "verify-inconsistent-symbolic-width", "verify-data-wrong-width", "verify-float16", "conserved-wrong-rows",
    "conserved-broadcastable-bias", "conserved-inconsistent-symbolic-width", "conserved-missing-weight",
    "conserved-list-bias"])
def test_bad_parameters_are_refused_naming_the_parameter(call, error, message, marker):
    with pytest.raises(error, match=message):
        call()


# -- the command line --------------------------------------------------------------------------------
def _cli(argv, capsys) -> tuple[int, str]:
    """Run ``symalg argv`` in-process; its exit status and stderr."""
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        status = exit_.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return status, captured.err


_TANH = "linear(n, h) -> tanh -> linear(h, m)"
CLI = [
    ([_TANH, "--widths", "n=3,h=abc,m=2"], r"symalg: error: --widths: expected name=positive integer, got 'h=abc'"),
    ([_TANH, "--widths", "n=3,h=-3,m=2"], r"--widths: expected name=positive integer, got 'h=-3'"),
    ([_TANH, "--widths", "n=3,h=0,m=2"], r"--widths: expected name=positive integer, got 'h=0'"),
    ([_TANH, "--widths", "n=3,h"], r"--widths: expected name=positive integer, got 'h'"),
    ([_TANH, "--widths", "n=3,h=2,h=4,m=2"], r"--widths: h is given twice"),
    ([_TANH, "--widths", "n=3,k=2,m=2"], r"--widths: the spec has no symbolic width 'k'"),
    ([_TANH, "--widths", "n=3,h=1e5,m=2"], r"--widths: expected name=positive integer, got 'h=1e5'"),
    ([_TANH, "--widths", "n=3,h=٣,m=2"], r"--widths: expected name=positive integer, got 'h=٣'"),
    ([_TANH, "--widths", "n=3,h=100000,m=2"], r"site of width 100000 .*more than the limit of 1e\+08"),
    ([_TANH, "--widths", "n=3,h=4000000,m=2"], r"--widths h: width 4000000 exceeds the limit of 1048576"),
    ([_TANH, "--widths", "n=3,h=" + "9" * 5000 + ",m=2"], r"--widths: h=999999999999\.\.\. exceeds the limit"),
    ([_TANH, "--widths", "n=3,h=4,m=2", "--dtype", "float16"], r"argument --dtype: invalid choice: 'float16'"),
    ([_TANH, "--widths", "n=3,h=4,m=2", "--device", "bogus"], r"symalg: error: .*'bogus'"),
    ([_TANH, "--widths", "n=3,h=4,m=2", "--seed", "abc"], r"argument --seed: invalid int value: 'abc'"),
    (['linear(3, 4) -> leaky_relu(slope="PAYLOAD or 0.2") -> linear(4, 2)'], r"symalg: error: .*quoted string"),
    (["linear(3, PAYLOAD) -> relu -> linear(4, 2)"], r"symalg: error: .*must be a number or a name"),
    (["linaer(n, h) -> relu -> linear(h, m)"],
     r"symalg: error: layer 0: unknown layer 'linaer'; did you mean 'linear'"),
    (["linear(3, 9**9**9) -> relu -> linear(9**9**9, 2)"], r"symalg: error: .*exponentiation"),
]


@pytest.mark.parametrize("argv, message", CLI, ids=[
    "widths-not-a-number", "widths-negative", "widths-zero", "widths-no-value", "widths-duplicate",
    "widths-unknown-name", "widths-float-notation", "widths-arabic-digit", "widths-100000", "widths-above-max-width",
    "widths-5000-digits", "dtype-unknown", "device-bogus", "seed-not-int", "spec-quoted-payload", "spec-call-payload",
    "spec-misspelt-layer", "spec-power-tower"])
def test_cli_flag_is_refused_with_one_clear_line(argv, message, marker, capsys):
    status, err = _cli([a.replace("PAYLOAD", payload(marker)) for a in argv], capsys)
    assert status == 2
    assert re.search(message, err), err


_MODEL_FILES = [
    (None, r"--model .*missing\.py: no such file"),
    ("def f(:\n", r"--model .*: syntax error at line 1"),
    ("raise RuntimeError('boom at import')\n", r"--model .*: running the file raised RuntimeError: boom at import"),
    ("import sys\nsys.exit(3)\n", r"--model .*: running the file raised SystemExit: 3"),
    ("x = 1\n", r"--model .*: the file defines no model and no example_inputs"),
    ("import torch\nmodel = torch.nn.Linear(3, 2)\n", r"--model .*: the file defines no example_inputs"),
    ("import torch\nmodel = 3\nexample_inputs = (torch.zeros(2, 3),)\n", r"`model` is a int, not a torch.nn.Module"),
    ("import torch\nmodel = torch.nn.Linear(3, 2)\nexample_inputs = (torch.zeros(2, 5),)\n",
     r"failed in Linear: RuntimeError: mat1 and mat2 shapes cannot be multiplied \(2x5 and 3x2\)"),
    ("import torch\nmodel = torch.nn.Linear(3, 2)\nexample_inputs = torch.full((2, 3), float('nan'))\n",
     r"example input 0 has non-finite entries"),
    ("PAYLOAD_STATEMENT\nraise ValueError('stop')\n", r"running the file raised ValueError: stop"),
]


@pytest.mark.parametrize("source, message", _MODEL_FILES, ids=[
    "missing-file", "syntax-error", "exception-at-import", "exit-at-import", "no-model", "no-example-inputs",
    "model-not-a-module", "example-wrong-width", "example-nan", "file-runs-then-raises"])
def test_cli_model_file_error_is_one_clear_line(source, message, tmp_path, capsys):
    path = tmp_path / ("missing.py" if source is None else "model.py")
    ran = tmp_path / "ran"
    if source is not None:
        path.write_text(source.replace("PAYLOAD_STATEMENT", payload(ran)))
    status, err = _cli(["--model", str(path), "--no-verify"], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(message, err), err
    # a model file is the user's own code and is meant to run (unlike a spec string): the marker shows it did
    assert ran.exists() == (source is not None and "PAYLOAD_STATEMENT" in source)


# -- arguments of derive and verify ----------------------------------------------------------------------------
ARGUMENTS = [
    (lambda: symalg.verify(symalg.derive(_SPEC), params=_params(extra=torch.zeros(3))), r"'extra'"),
    (lambda: symalg.derive(_SPEC, strict="yes"), r"strict"),
    (lambda: symalg.derive(_SPEC, loss="nonsense"), r"nonsense"),
]


@pytest.mark.parametrize("call, message", ARGUMENTS, ids=["verify-unknown-parameter", "derive-strict-yes",
                                                          "derive-loss-nonsense"])
def test_derive_and_verify_arguments_are_refused_naming_them(call, message):
    with pytest.raises((SpecError, ValueError, TypeError), match=message):
        call()
