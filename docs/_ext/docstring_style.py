"""How napoleon reads symalg's docstrings: the types come from annotations (``autodoc_typehints``), never from text.

Two conventions of the package that napoleon's numpy style would misread, each rewritten before napoleon sees it:

1. Attribute, property and module-data docstrings are prose. Napoleon splits their first line at its first colon and
   shows the part before it as the type (``Dimension of the Lie algebra: ...`` got the type "Dimension of the Lie
   algebra", an unresolvable cross-reference); they are handed to napoleon as a function's docstring instead.
2. In ``Parameters`` and ``Attributes`` sections an entry's description starts on its name line
   (``device, dtype : where and in which precision to run``). Napoleon reads the text after `` : `` as the type; it is
   moved to the next line, indented, where napoleon reads a description.

This replaces napoleon's ``autodoc-process-docstring`` listener, so it must be loaded after ``sphinx.ext.napoleon``.
"""
from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.ext.napoleon import _process_docstring

PROSE = {"attribute", "property", "data"}
FIELD_SECTIONS = {"parameters", "other parameters", "attributes"}
_ENTRY = re.compile(r"^(\s*)(\**\w+(?:, \**\w+)*) : (.+)$")
_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def descriptions_below_names(lines: list[str]) -> list[str]:
    """``name : text`` entries of the field sections as ``name`` then ``text`` indented by four spaces."""
    out: list[str] = []
    section, base = None, 0
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and line.strip() and _UNDERLINE.match(lines[i + 1]):
            section, base = line.strip().lower(), _indent(line)
        entry = _ENTRY.match(line) if section in FIELD_SECTIONS else None
        if entry and len(entry.group(1)) == base:
            out += [entry.group(1) + entry.group(2), entry.group(1) + "    " + entry.group(3)]
        else:
            out.append(line)
    return out


def _process(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    lines[:] = descriptions_below_names(lines)
    _process_docstring(app, "function" if what in PROSE else what, name, obj, options, lines)


def setup(app: Sphinx) -> dict[str, Any]:
    listeners = app.events.listeners["autodoc-process-docstring"]
    napoleon = [listener for listener in listeners if listener.handler is _process_docstring]
    if len(napoleon) != 1:
        raise RuntimeError("docstring_style: load it after sphinx.ext.napoleon")
    app.disconnect(napoleon[0].id)
    app.connect("autodoc-process-docstring", _process, priority=napoleon[0].priority)
    return {"parallel_read_safe": True}
