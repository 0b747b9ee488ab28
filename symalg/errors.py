"""symalg's errors: one family under :class:`SpecError`, so ``except symalg.SpecError`` catches every one.

============================  ==========================================================================
class                         raised when
============================  ==========================================================================
:class:`SpecError`            bad input in general: a malformed spec, architecture, argument or option
:class:`TracingError`         a ``torch.nn.Module`` cannot be traced (its own ``forward`` raised, or
                              neither torch.fx nor torch.export could capture it); the model's exception
                              is the ``__cause__``
:class:`ParameterError`       a parameter dict does not fit the analysis: a missing, extra or misshapen
                              tensor (:class:`MissingParameterError` is also a ``KeyError``,
                              :class:`ParameterTypeError` a ``TypeError``)
:class:`WidthError`           a width is not a positive integer (``Analysis.subs({"n": "three"})``)
:class:`CertificationError`   a certification or verification run cannot be carried out as asked
:class:`LoweringError`        a lowered torch callable is called with the wrong number of arguments
                              (also a ``TypeError``)
============================  ==========================================================================

Each is a :class:`ValueError` too (bad input), and its message names the offending node, parameter or argument.

Example
-------
>>> import symalg
>>> try:
...     symalg.derive("linear(n, h) -> relu -> linear(h, m)").subs({"n": "three"})
... except symalg.SpecError as error:
...     print(type(error).__name__, "|", error)
WidthError | width n: expected a positive integer, got 'three' (str)
"""

__all__ = ["SpecError", "TracingError", "ParameterError", "MissingParameterError", "ParameterTypeError", "WidthError",
           "CertificationError", "LoweringError"]


class SpecError(ValueError):
    """Bad input: a malformed architecture, model or argument; the message names the offending node,
    parameter or argument. The base of every symalg error."""


class TracingError(SpecError):
    """A model cannot be traced: its ``forward`` raised on the example inputs (that exception is ``__cause__``),
    or neither torch.fx nor torch.export can capture it."""


class ParameterError(SpecError):
    """A parameter dict does not fit the analysis or model: a name missing or unknown, a shape or dtype wrong."""


class MissingParameterError(ParameterError, KeyError):
    """A parameter the call reads is missing from ``params`` (a ``KeyError`` too, printed without its quotes)."""

    __str__ = BaseException.__str__  # KeyError's own str() would quote the message


class ParameterTypeError(ParameterError, TypeError):
    """A value in ``params`` is not a tensor (a ``TypeError`` too)."""


class WidthError(SpecError):
    """A width given for a symbolic width is not a positive integer within the grammar's limit."""


class CertificationError(SpecError):
    """A certification or verification run cannot be carried out as asked (bad samples, an unusable device)."""


class LoweringError(SpecError, TypeError):
    """A lowered torch callable was called with the wrong number of arguments (a ``TypeError`` too; its parameter
    errors are :class:`ParameterError`)."""
