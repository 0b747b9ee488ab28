"""The ``symalg`` command: analyse a network spec, print its symmetries, and verify them.

Run ``symalg`` with no arguments for the built-in default network::

    $ symalg
    $ symalg "linear(n, h) -> tanh -> linear(h, m)" --widths n=3,h=5,m=2
    $ symalg "linear(4, 8) -> radial -> linear(8, 2)" --device cuda --dtype float32
    $ symalg --model examples/gpt_block.py     # a file defining `model` and `example_inputs`
    $ symalg --model examples/gpt_block.py --tracer export --json > report.json

It prints the sites and their groups, the actions, generators, orbit dimension and conserved
quantities (plain text, then LaTeX), then verifies every symmetry numerically at the given widths and
exits with status 1 if any check fails (2 for bad input). ``--json`` prints one JSON object instead
(schema ``symalg.cli/1``, in ``docs/output_schema.md``).

Heavy modules (torch, SymPy) are imported only once the arguments are parsed: ``symalg --help`` and
``symalg --version`` stay cheap.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from symalg._version import __version__
from symalg.errors import SpecError
from symalg.kinds import KIND_NAMES

if TYPE_CHECKING:
    from symalg.symbolic.derive import Analysis
    from symalg.verification.checks import VerificationReport

DEFAULT_SPEC = "linear(n, h1) -> relu -> linear(h1, h2) -> identity -> linear(h2, m)"
DEFAULT_WIDTHS = "n=3,h1=4,h2=3,m=2"
TRACER_CHOICES = ("auto", "fx", "export")
"""``--tracer``: the tracers of :func:`symalg.trace` (:data:`symalg.frontend.tracing.TRACERS`)."""


def _widths(text: str, known: set[str]) -> dict[str, int]:
    """``n=3,h=5`` → ``{"n": 3, "h": 5}``; every name must be a width of the spec, given once."""
    from symalg.frontend.grammar import MAX_WIDTH
    from symalg.ir.architecture import as_width

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

    import torch

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


DESCRIPTION = """Analyse a network: print its parameter-space symmetries (groups, actions, generators), the orbit
dimension and the conserved quantities of gradient flow (plain text, then LaTeX), then verify every symmetry
numerically. The input is a network spec (a built-in default network when none is given) or, with --model, a
Python file defining a torch model."""

EPILOG = f"""examples:
  symalg
  symalg "linear(n, h) -> tanh -> linear(h, m)" --widths n=3,h=5,m=2
  symalg "linear(4, 8) -> radial -> linear(8, 2)" --device cuda --dtype float32
  symalg --model examples/gpt_block.py --tracer export
  symalg --json > report.json

group codes in the "blocked:" and "restricted:" notes:
{chr(10).join(f"  {code:3} {name}" for code, name in KIND_NAMES.items())}

exit status: 0 every check passed (or none was run), 1 a verification check failed, 2 bad input."""


def build_parser() -> argparse.ArgumentParser:
    """The command's options; its help is plain text (``symalg --help``)."""
    parser = argparse.ArgumentParser(prog="symalg", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="?", default=DEFAULT_SPEC,
                        help=f"network spec (default: {DEFAULT_SPEC!r})")
    parser.add_argument("--version", action="version", version=f"symalg {__version__}")
    parser.add_argument("--widths", default=None,
                        help="concrete widths for generators and verification, e.g. n=3,h=5,m=2 "
                             f"(default for the default spec: {DEFAULT_WIDTHS})")
    parser.add_argument("--no-verify", action="store_true", help="skip the numerical verification")
    parser.add_argument("--verbose", action="store_true", help="print every verification check, not just failures")
    parser.add_argument("--latex", action="store_true", help="print only the LaTeX report")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (the analysis, the widths, the verification; schema symalg.cli/1 "
                             "in docs/output_schema.md) instead of the text report")
    parser.add_argument("--device", default="cpu", help="device for verification (cpu, cuda)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="a Python file defining `model` (an nn.Module) and `example_inputs` (a tuple), "
                             "optionally `loss` ('mse' or 'cross_entropy')")
    parser.add_argument("--tracer", choices=TRACER_CHOICES, default=None,
                        help="how --model is traced: auto (torch.fx, torch.export where fx fails; the default), fx "
                             "or export")
    parser.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                        help="a progress bar on stderr during verification (auto: when stderr is a terminal)")
    return parser


def _derive_spec(spec: str) -> Analysis:
    """The analysis of a spec string (:func:`~symalg.frontend.spec.parse`, then :func:`~symalg.derive`)."""
    from symalg.frontend.spec import parse
    from symalg.symbolic.derive import derive

    return derive(parse(spec))


def _run_model_file(args: argparse.Namespace) -> int:
    """Trace (with ``--tracer``) and derive the model a Python file defines, then print the same report as for a
    spec."""
    from symalg.frontend.tracing import trace
    from symalg.symbolic.derive import derive

    namespace = _load_model_file(args.model)
    graph = trace(namespace["model"], namespace["example_inputs"], tracer=args.tracer or "auto")
    analysis = derive(graph, loss=namespace.get("loss", "mse"))
    return _report(analysis, args)


def _report(analysis: Analysis, args: argparse.Namespace, widths: dict[str, int] | None = None,
            widths_text: str = "") -> int:
    """The report every input gets: symmetries, orbit dimension, conserved quantities (text, then LaTeX), then the
    verification at concrete widths (``widths`` for a spec with symbolic widths); the exit status. With ``--json``
    the same content as one JSON object (:func:`json_report`)."""
    from symalg.symbolic.report import describe, describe_latex

    if args.latex:
        print(describe_latex(analysis))
        return 0
    symbolic = sorted(str(s) for s in analysis.widths)
    widths = widths or {}
    missing = [name for name in symbolic if name not in widths]
    concrete = None if missing else (analysis.subs(widths) if symbolic else analysis)
    if not args.json:
        print(describe(analysis))
        print("\nLaTeX:")
        print(describe_latex(analysis))
        if concrete is None:
            print(f"\n(no verification: give --widths for {', '.join(missing)})")
        elif symbolic:
            print(f"\nat widths {widths_text}:")
            print("\n".join(describe(concrete).split("\n\n")[1:]))
    report = None if concrete is None or args.no_verify else _verify(concrete, args)
    status = 0 if report is None or report.passed else 1
    if args.json:
        print(json.dumps(json_report(analysis, concrete, widths, report, status), indent=1))
    elif report is not None:
        _print_verification(report, args.verbose)
    return status


def _verify(analysis: Analysis, args: argparse.Namespace) -> VerificationReport:
    """:func:`~symalg.verification.verifier.verify` as the options ask, with a progress bar on stderr when
    ``--progress`` asks for one."""
    import torch

    from symalg.progress import progress_bar
    from symalg.verification.verifier import verify

    show = args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty())
    with progress_bar("verify", enabled=show) as callback:
        return verify(analysis, device=args.device, dtype=getattr(torch, args.dtype), seed=args.seed,
                      progress=callback)


def json_report(analysis: Analysis, concrete: Analysis | None, widths: dict[str, int],
                report: VerificationReport | None, status: int) -> dict[str, Any]:
    """The ``--json`` object (schema ``symalg.cli/1``): ``schema``, ``version``, ``analysis``
    (:meth:`Analysis.to_dict <symalg.symbolic.derive.Analysis.to_dict>`), ``widths`` (the concrete widths given,
    ``{}`` for none), ``at_widths`` (the analysis at those widths, ``None`` when the spec keeps symbolic widths
    without values, or is concrete already), ``verification`` (:meth:`VerificationReport.to_dict
    <symalg.verification.checks.VerificationReport.to_dict>`, ``None`` when not run), ``exit_status``."""
    return {"schema": "symalg.cli/1", "version": __version__, "analysis": analysis.to_dict(), "widths": widths,
            "at_widths": concrete.to_dict() if concrete is not None and concrete is not analysis else None,
            "verification": None if report is None else report.to_dict(), "exit_status": status}


def _print_verification(report: VerificationReport, verbose: bool) -> int:
    """Print the checks (all with ``verbose``, else the failures) and the summary; the exit status."""
    print("\nverification:")
    for check in report.checks:
        if verbose or not check.passed:
            print(f"  {check}")
    print(f"  {report.summary()}")
    return 0 if report.passed else 1


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (``sys.argv[1:]`` by default) and return its exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.json and args.latex:
            raise SpecError("--json and --latex: choose one output")
        if args.model is None and args.tracer is not None:
            raise SpecError("--tracer applies to --model (a spec is not traced)")
        from symalg.verification.verifier import check_device

        if args.model is not None:
            check_device(args.device)
            return _run_model_file(args)
        analysis = _derive_spec(args.spec)
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
