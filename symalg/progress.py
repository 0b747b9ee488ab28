"""Logging and progress for symalg's long calls.

Library messages go to the ``symalg`` logger (each module logs to its own child, ``symalg.frontend.tracing``, ...);
symalg adds no handler but a :class:`logging.NullHandler`, so nothing prints unless the application configures
logging (``logging.basicConfig(level=logging.INFO)``).

A long call (:func:`symalg.verify`, teleportation loops, discovery, the fuzzer's run) takes ``progress=``: a
callable ``progress(done, total, what)`` called after each step, ``done`` of ``total`` steps finished and ``what``
naming the step just done. :func:`progress_bar` makes one that draws a bar on a stream (the command and the
benchmark scripts use it; tests leave ``progress=None``, the default, and see nothing).

Example
-------
>>> seen = []
>>> record = lambda done, total, what: seen.append((done, total, what))
>>> for step in range(3):
...     report(record, step + 1, 3, f"step {step}")
>>> seen[-1]
(3, 3, 'step 2')
>>> report(None, 1, 3, "nothing happens")
"""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Callable, Iterator, Optional, TextIO

__all__ = ["Progress", "logger", "report", "progress_bar"]

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: ``done`` of ``total`` steps finished, ``what`` the step just done."""

logger = logging.getLogger("symalg")
logger.addHandler(logging.NullHandler())


def report(progress: Optional[Progress], done: int, total: int, what: str) -> None:
    """Call ``progress(done, total, what)`` when a callback was given, and log the step at DEBUG level."""
    logger.debug("%s: %d/%d", what, done, total)
    if progress is not None:
        progress(done, total, what)


@contextlib.contextmanager
def progress_bar(description: str, enabled: bool = True, stream: Optional[TextIO] = None,
                 width: int = 30) -> Iterator[Optional[Progress]]:
    """A :data:`Progress` callback drawing ``description [#####.....] done/total what (elapsed)`` on ``stream``
    (stderr by default), redrawn in place and ended with a newline on exit; ``None`` when not ``enabled``.

    >>> import io
    >>> out = io.StringIO()
    >>> with progress_bar("verify", stream=out, width=4) as bar:
    ...     bar(1, 2, "invariance")
    >>> out.getvalue().split("\\r")[-1].split(" (")[0]
    'verify [##..] 1/2 invariance'
    """
    if not enabled:
        yield None
        return
    out = stream if stream is not None else sys.stderr
    start = time.perf_counter()
    drawn = [0]

    def draw(done: int, total: int, what: str) -> None:
        filled = width * done // max(total, 1)
        line = f"{description} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {what} " \
               f"({time.perf_counter() - start:.1f} s)"
        out.write("\r" + line.ljust(drawn[0]))
        out.flush()
        drawn[0] = len(line)

    try:
        yield draw
    finally:
        if drawn[0]:
            out.write("\n")
            out.flush()
