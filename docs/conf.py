"""Sphinx configuration: the API reference is generated from the docstrings (numpy style, read by
napoleon) by a recursive autosummary over the ``symalg`` package, so it follows the package layout; the
markdown pages in this folder are read by myst-parser. Build in nitpicky mode
(every cross-reference must resolve) with warnings as errors::

    sphinx-build -n -W --keep-going -b html docs docs/_build/html

Links to Python, SymPy, torch, networkx and numpy go through intersphinx from the inventories committed in
``docs/_inventories/`` (the build reads no network; see the README there). References that neither the Python domain
nor intersphinx resolve as written (top-level re-exports, names as a module imports them, torch's private class
names, symalg's private helpers) are handled by ``docs/_ext/references.py``.

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
    "sphinx.ext.intersphinx",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
    "executed",
    "references",
    "docstring_style",  # after napoleon: symalg's types come from annotations, never from docstring text
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext", "_generated", "_inventories"]
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
myst_enable_extensions = ["dollarmath", "amsmath"]  # $...$, $$...$$ and \begin{align} typeset by MathJax

html_theme = "alabaster"
html_title = "symalg"


_INVENTORIES = Path(__file__).resolve().parent / "_inventories"
intersphinx_mapping = {  # (site the links point to, the committed inventory read instead of the site's)
    "python": ("https://docs.python.org/3.11/", str(_INVENTORIES / "python.inv")),
    "sympy": ("https://docs.sympy.org/latest/", str(_INVENTORIES / "sympy.inv")),
    "torch": ("https://docs.pytorch.org/docs/stable/", str(_INVENTORIES / "torch.inv")),
    "networkx": ("https://networkx.org/documentation/stable/", str(_INVENTORIES / "networkx.inv")),
    "numpy": ("https://numpy.org/doc/stable/", str(_INVENTORIES / "numpy.inv")),
}
intersphinx_disabled_reftypes = ["std:doc"]  # a page name in these docs never means another project's page

nitpicky = True
nitpick_ignore = [  # types that signatures name but whose projects document no page for them (shown unlinked)
    ("py:class", "torch.utils.hooks.RemovableHandle"),
    ("py:class", "sympy.printing.pytorch.TorchPrinter"),  # newer than the SymPy 1.11 inventory
    ("py:class", "ast.expr"),  # Python documents the abstract node classes in its grammar, not as objects
]
