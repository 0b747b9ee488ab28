"""The one error type of symalg's public API."""

__all__ = ["SpecError"]


class SpecError(ValueError):
    """Bad input: a malformed architecture, model or argument; the message names the offending node,
    parameter or argument."""
