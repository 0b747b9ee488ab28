"""Sphinx configuration: the API reference is generated from the docstrings (numpy style, read by
napoleon) by a recursive autosummary over the ``symalg`` package, so it follows the package layout; the
markdown pages in this folder are read by myst-parser. Build with warnings as errors::

    sphinx-build -W --keep-going -b html docs docs/_build/html

The tutorial and the gallery run their code while the docs build (``exec-python``, ``docs/_ext/executed.py``; the
gallery's plots go to ``docs/_generated/``).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # document this checkout, not an installed copy
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))  # exec-python: pages executed when the docs build

project = "symalg"
author = "the symalg authors"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
    "executed",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext", "_generated"]
templates_path = ["_templates"]

autosummary_generate = True
autosummary_imported_members = False  # each object is documented once, in the module that defines it;
# with ignore-module-all, autodoc skips re-exports too (a package's __all__ names what it re-exports)
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

myst_heading_anchors = 3  # the pages link to their own sections as #slug
myst_enable_extensions = ["dollarmath"]

html_theme = "alabaster"
html_title = "symalg"


def _top_level_name(app, env, node, contnode):
    """Resolve a reference to a top-level name (``symalg.derive``, ``symalg.Analysis.subs``) to the object where it is
    defined (``symalg.symbolic.derive.derive``): ``import symalg`` re-exports each lazily, and each is documented once,
    in its module."""
    import symalg

    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("symalg."):
        return None
    head, _, rest = target.removeprefix("symalg.").partition(".")
    if head not in symalg._HOMES:
        return None
    defined = ".".join(filter(None, (symalg._HOMES[head], head, rest)))
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"], defined, node,
                                             contnode)


def setup(app):
    app.connect("missing-reference", _top_level_name)
