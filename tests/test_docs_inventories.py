"""The intersphinx inventories committed in docs/_inventories: Sphinx reads each back, the names the docs link to
resolve to their documented pages, the generated ones match their table, and every private-to-public alias of
docs/_ext/references.py names a real object and lands on an inventory entry."""
from __future__ import annotations

import importlib.util
import posixpath
import sys
import zlib
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
from sphinx.util.inventory import InventoryFile  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
INVENTORIES = DOCS / "_inventories"
BASES = {
    "python": "https://docs.python.org/3.11/",
    "sympy": "https://docs.sympy.org/latest/",
    "torch": "https://docs.pytorch.org/docs/stable/",
    "networkx": "https://networkx.org/documentation/stable/",
    "numpy": "https://numpy.org/doc/stable/",
}
# (project, role, name, the URL it must resolve to)
KEY_NAMES = [
    ("python", "py:class", "fractions.Fraction", "https://docs.python.org/3.11/library/fractions.html#fractions.Fraction"),
    ("python", "py:class", "logging.NullHandler", "https://docs.python.org/3.11/library/logging.handlers.html"
                                                   "#logging.NullHandler"),
    ("sympy", "py:class", "sympy.core.expr.Expr", "https://docs.sympy.org/latest/modules/core.html#sympy.core.expr.Expr"),
    ("sympy", "py:class", "sympy.core.symbol.Symbol",
     "https://docs.sympy.org/latest/modules/core.html#sympy.core.symbol.Symbol"),
    ("sympy", "py:class", "sympy.matrices.expressions.matexpr.MatrixExpr",
     "https://docs.sympy.org/latest/modules/matrices/expressions.html#sympy.matrices.expressions.MatrixExpr"),
    ("torch", "py:class", "torch.Tensor", "https://docs.pytorch.org/docs/stable/tensors.html#torch.Tensor"),
    ("torch", "py:class", "torch.dtype", "https://docs.pytorch.org/docs/stable/tensor_attributes.html#torch.dtype"),
    ("torch", "py:class", "torch.nn.Module",
     "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module"),
    ("networkx", "py:class", "networkx.DiGraph",
     "https://networkx.org/documentation/stable/reference/classes/digraph.html#networkx.DiGraph"),
    ("numpy", "py:class", "numpy.ndarray",
     "https://numpy.org/doc/stable/reference/generated/numpy.ndarray.html#numpy.ndarray"),
]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load(project: str) -> dict:
    with open(INVENTORIES / f"{project}.inv", "rb") as stream:
        return InventoryFile.load(stream, BASES[project], posixpath.join)


@pytest.mark.parametrize("project", sorted(BASES))
def test_every_inventory_loads(project):
    inventory = _load(project)
    assert sum(map(len, inventory.values())) > 0


@pytest.mark.parametrize("project,role,name,url", KEY_NAMES)
def test_key_names_resolve(project, role, name, url):
    assert _load(project)[role][name].uri == url


def test_generated_inventories_match_their_tables():
    make = _module(INVENTORIES / "make_inventories.py", "make_inventories")
    for project, (version, entries) in make.TABLES.items():
        written = (INVENTORIES / f"{project}.inv").read_bytes()
        expected = make.inventory(project, version, entries)
        head = expected.index(b"zlib.\n") + len(b"zlib.\n")
        assert written[:head] == expected[:head]
        assert zlib.decompress(written[head:]) == zlib.decompress(expected[head:])
        loaded = _load(project)
        for name, (role, uri) in entries.items():
            assert loaded[role][name].uri == BASES[project] + uri


def _extension(name: str):
    return _module(DOCS / "_ext" / f"{name}.py", name)


def test_public_aliases_name_real_objects_and_land_in_an_inventory():
    references = _extension("references")
    entries = {name for project in BASES for role in _load(project).values() for name in role}
    for private, public in references.PUBLIC.items():
        assert references._defining_name(references._import(public)) == private, public
        assert public in entries, public


@pytest.mark.parametrize("module,cls,target,resolved", [
    ("symalg.ir.architecture", None, "SpecError", "symalg.errors.SpecError"),  # imported by the module
    ("symalg.applications.alignment", None, "Symmetry.apply", "symalg.symbolic.symmetry.Symmetry.apply"),
    ("symalg.catalogue.activations", None, "sp.Expr", "sympy.core.expr.Expr"),  # an import alias
    ("symalg.symbolic.inference", None, "symalg.frontend.tracing.ModelGraph", "symalg.ir.graph.ModelGraph"),
    ("symalg.verification.fuzz", "FuzzModel", "Module", "torch.nn.modules.module.Module"),  # torch's docstring
    ("symalg.applications.constraint_engineering", "MirrorConstraint", "right_inverse",
     "symalg.applications.constraint_engineering.MirrorConstraint.right_inverse"),  # a member of the class
    ("symalg.ir.architecture", None, "NoSuchName", None),  # nothing: the reference stays unresolved
])
def test_references_resolve_names_as_the_referencing_code_sees_them(module, cls, target, resolved):
    node = {"py:module": module, "py:class": cls}
    assert _extension("references")._as_seen_from(node, target) == resolved


def test_private_names_must_exist_to_be_shown_as_code():
    references = _extension("references")
    assert references._private("symalg.catalogue.activations._TorchActivation")
    assert not references._private("symalg.catalogue.activations._NoSuchHelper")
    assert not references._private("symalg.catalogue.activations.CATALOGUE")  # public: must resolve or warn


def test_field_descriptions_move_below_their_names():
    style = _extension("docstring_style")
    lines = ["Check.", "", "Parameters", "----------", "device, dtype : where to run (float64 by default).",
             "    more.", "**kwargs : passed on", "", "Notes", "-----", "a : b stays (not a field section)"]
    assert style.descriptions_below_names(lines) == [
        "Check.", "", "Parameters", "----------", "device, dtype", "    where to run (float64 by default).",
        "    more.", "**kwargs", "    passed on", "", "Notes", "-----", "a : b stays (not a field section)"]
