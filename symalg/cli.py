"""The ``symalg`` command: analyse a network spec, print its symmetries, and verify them.

Run ``symalg`` with no arguments for the built-in default network::

    $ symalg
    $ symalg "linear(n, h) -> tanh -> linear(h, m)" --widths n=3,h=5,m=2
    $ symalg "linear(4, 8) -> radial -> linear(8, 2)" --device cuda --dtype float32
    $ symalg --model examples/gpt_block.py     # a file defining `model` and `example_inputs`

It prints the sites and their groups, the actions, generators, orbit dimension and conserved
quantities (plain text, then LaTeX), then verifies every symmetry numerically at the given widths and
exits with status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import sys

import torch

from symalg.symbolic.derive import Analysis, derive
from symalg.frontend.spec import parse
from symalg.frontend.grammar import MAX_WIDTH
from symalg.errors import SpecError
from symalg.ir.architecture import as_width
from symalg.symbolic.report import describe, describe_latex
from symalg.verification.checks import VerificationReport
from symalg.verification.verifier import check_device, verify
from symalg.frontend.tracing import trace

DEFAULT_SPEC = "linear(n, h1) -> relu -> linear(h1, h2) -> identity -> linear(h2, m)"
DEFAULT_WIDTHS = "n=3,h1=4,h2=3,m=2"


def _widths(text: str, known: set[str]) -> dict[str, int]:
    """``n=3,h=5`` → ``{"n": 3, "h": 5}``; every name must be a width of the spec, given once."""
    widths = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = (piece.strip() for piece in item.partition("="))
        if not (value.isascii() and value.isdigit()) or not value.strip("0"):
            raise SpecError(f"--widths: expected name=positive integer, got {item!r}")
        if name in widths:
            raise SpecError(f"--widths: {name} is given twice")
        if name not in known:
            raise SpecError(f"--widths: the spec has no symbolic width {name!r} (it has {sorted(known) or 'none'})")
        if len(value.lstrip("0")) > len(str(MAX_WIDTH)):  # before int(): a 5000-digit value is refused by Python itself
            raise SpecError(f"--widths: {name}={value[:12]}... exceeds the limit of {MAX_WIDTH} "
                            "(symalg.frontend.grammar.MAX_WIDTH)")
        widths[name] = as_width(int(value), f"--widths {name}")
    return widths


def _load_model_file(path: str) -> dict:
    """Run the Python file ``path`` and return its ``model`` (an ``nn.Module``) and ``example_inputs``
    (a tuple) in a namespace; every way the file can fail becomes one :class:`SpecError` line."""
    import os
    import runpy

    if not os.path.isfile(path):
        raise SpecError(f"--model {path}: no such file")
    try:
        namespace = runpy.run_path(path)
    except SyntaxError as error:
        raise SpecError(f"--model {path}: syntax error at line {error.lineno}: {error.msg}") from None
    except (Exception, SystemExit) as error:  # the file's own failure, in one line
        raise SpecError(f"--model {path}: running the file raised {type(error).__name__}: {error}") from None
    missing = [name for name in ("model", "example_inputs") if name not in namespace]
    if missing:
        raise SpecError(f"--model {path}: the file defines no {' and no '.join(missing)}")
    if not isinstance(namespace["model"], torch.nn.Module):
        raise SpecError(f"--model {path}: `model` is a {type(namespace['model']).__name__}, not a torch.nn.Module")
    inputs = namespace["example_inputs"]
    namespace["example_inputs"] = inputs if isinstance(inputs, tuple) else (inputs,)
    return namespace


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="symalg", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", nargs="?", default=DEFAULT_SPEC,
                        help=f"network spec (default: {DEFAULT_SPEC!r})")
    parser.add_argument("--widths", default=None,
                        help="concrete widths for generators and verification, e.g. n=3,h=5,m=2 "
                             f"(default for the default spec: {DEFAULT_WIDTHS})")
    parser.add_argument("--no-verify", action="store_true", help="skip the numerical verification")
    parser.add_argument("--verbose", action="store_true", help="print every verification check, not just failures")
    parser.add_argument("--latex", action="store_true", help="print only the LaTeX report")
    parser.add_argument("--device", default="cpu", help="device for verification (cpu, cuda)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="a Python file defining `model` (an nn.Module) and `example_inputs` (a tuple), "
                             "optionally `loss` ('mse' or 'cross_entropy'); traced with torch.fx")
    return parser


def _run_model_file(args: argparse.Namespace) -> int:
    """Trace and derive the model a Python file defines, then print the same report as for a spec."""
    namespace = _load_model_file(args.model)
    analysis = derive(trace(namespace["model"], namespace["example_inputs"]), loss=namespace.get("loss", "mse"))
    return _report(analysis, args)


def _report(analysis: Analysis, args: argparse.Namespace, widths: dict[str, int] | None = None,
            widths_text: str = "") -> int:
    """The report every input gets: symmetries, orbit dimension, conserved quantities (text, then LaTeX), then the
    verification at concrete widths (``widths`` for a spec with symbolic widths); the exit status."""
    if args.latex:
        print(describe_latex(analysis))
        return 0
    print(describe(analysis))
    print("\nLaTeX:")
    print(describe_latex(analysis))
    symbolic = sorted(str(s) for s in analysis.widths)
    widths = widths or {}
    missing = [name for name in symbolic if name not in widths]
    if missing:
        print(f"\n(no verification: give --widths for {', '.join(missing)})")
        return 0
    concrete = analysis.subs(widths) if symbolic else analysis
    if symbolic:
        print(f"\nat widths {widths_text}:")
        print("\n".join(describe(concrete).split("\n\n")[1:]))
    if args.no_verify:
        return 0
    report = verify(concrete, device=args.device, dtype=getattr(torch, args.dtype), seed=args.seed)
    return _print_verification(report, args.verbose)


def _print_verification(report: VerificationReport, verbose: bool) -> int:
    """Print the checks (all with ``verbose``, else the failures) and the summary; the exit status."""
    print("\nverification:")
    for check in report.checks:
        if verbose or not check.passed:
            print(f"  {check}")
    print(f"  {report.summary()}")
    return 0 if report.passed else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.model is not None:
            check_device(args.device)
            return _run_model_file(args)
        analysis = derive(parse(args.spec))
        widths_text = args.widths if args.widths is not None else (DEFAULT_WIDTHS if args.spec == DEFAULT_SPEC else "")
        widths = _widths(widths_text, {str(s) for s in analysis.widths})
        if not (args.latex or args.no_verify):
            check_device(args.device)
        return _report(analysis, args, widths, widths_text)
    except (SpecError, NotImplementedError, ValueError) as error:
        print(f"symalg: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
