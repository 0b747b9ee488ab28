"""The package layout: no import cycle between symalg's modules, and the curated public API."""
from __future__ import annotations

import ast
import pathlib

import networkx as nx

import symalg

PACKAGE = pathlib.Path(symalg.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """``module → imported symalg module`` for every import statement, module-level or deferred into a
    function (a deferred import still ties the two modules together)."""
    graph = nx.DiGraph()
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for name, path in modules.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            # the most specific symalg module each statement names
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
                    break
    return graph


def test_import_graph_sees_imports():
    graph = import_graph()
    assert graph.has_edge("symalg.symbolic.derive", "symalg.catalogue.activations")


def test_no_import_cycle_between_modules():
    graph = import_graph()
    graph.remove_node("symalg")  # the package façade imports everything and nothing imports it back
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


PUBLIC_API = ["Analysis", "Architecture", "Blocked", "CATALOGUE", "CatalogueEntry", "LoweredFunction", "ModelGraph",
              "Spec", "SpecError", "Symmetry", "VerificationReport", "derive", "from_torch", "lower", "overlay",
              "parse", "register", "to_graph", "to_module", "trace", "verify", "mirrors", "discover",
              "TracingError", "ParameterError", "WidthError", "CertificationError", "LoweringError"]


def test_the_public_api_is_the_curated_list():
    """A change to the top-level API is deliberate: it changes this snapshot."""
    assert sorted(symalg.__all__) == sorted(PUBLIC_API)
    assert all(hasattr(symalg, name) for name in symalg.__all__)


def test_every_other_top_level_attribute_is_a_subpackage():
    import types

    others = {name for name in dir(symalg) if not name.startswith("_") and name not in symalg.__all__}
    assert all(isinstance(getattr(symalg, name), types.ModuleType) for name in others), others
    assert {"applications", "catalogue", "discovery", "frontend", "ir", "lowering", "numeric", "symbolic",
            "verification"} <= others


GROUP_CLASSES = ("GeneralLinear", "Orthogonal", "OrthogonalFixingOnes", "Permutations", "PositiveScaling", "SignFlips",
                 "EvenFlips", "Translations")
"""The concrete group classes (checking that an argument is a ``SiteGroup`` at all is input validation)."""


def test_no_module_but_the_groups_switches_on_a_group_class():
    """Groups own their behaviour: outside ``catalogue/groups.py`` nothing asks ``isinstance(x, <group class>)``."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "groups.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and len(node.args) == 2):
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if names & set(GROUP_CLASSES):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], offenders
