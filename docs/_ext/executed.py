"""``exec-python``: a directive that runs its Python code when the docs build and shows the code, then what it printed.

In a MyST page::

    ```{exec-python}
    import symalg
    print(symalg.derive("linear(n, h) -> relu -> linear(h, m)").orbit_dimension())
    ```

The blocks of one page share one namespace, in page order (a notebook's cells), which starts with ``DOCS``, the
documentation's source folder; nothing is cached, so the page shows what this checkout computes. Code that raises
is a build warning with the traceback (an error under ``-W``).
"""
from __future__ import annotations

import contextlib
import io
import time
import traceback
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


class ExecPython(SphinxDirective):
    """Run the content in the page's namespace; a literal block of the code, then one of its standard output."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        code = "\n".join(self.content)
        namespace = self.env.temp_data.setdefault("exec_python", {"__name__": f"docs.{self.env.docname}",
                                                                  "DOCS": Path(self.env.srcdir)})
        printed = io.StringIO()
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"<{self.env.docname}>", "exec"), namespace)
        except Exception:
            logger.warning("exec-python: the code raised\n%s", traceback.format_exc(), location=self.get_location())
        logger.info("exec-python: %s block ran in %.1f s", self.env.docname, time.perf_counter() - start)
        shown: list[nodes.Node] = [nodes.literal_block(code, code, language="python")]
        if printed.getvalue():
            output = printed.getvalue().rstrip("\n")
            shown.append(nodes.literal_block(output, output, language="text", classes=["exec-output"]))
        return shown


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("exec-python", ExecPython)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
