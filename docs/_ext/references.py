"""Resolve the cross-references that the Python domain and intersphinx cannot resolve by the name as written.

Runs on ``missing-reference`` before intersphinx (priority 400 < 500), and only for the ``py`` domain:

1. A top-level name (``symalg.derive``, ``symalg.Analysis.subs``) goes to the object where it is defined
   (``symalg.symbolic.derive.derive``): ``import symalg`` re-exports each lazily, and each is documented once.
2. A name as the referencing code sees it (``SpecError``, ``Symmetry.apply``, ``sp.Expr``, torch's ``Module``
   inside an inherited ``forward`` docstring, a bare method name in a class docstring) is looked up among the
   referencing class's members, then in the namespace of its module, then of the modules of the class's bases, and
   replaced by the name of the object's definition.
3. A defining name that the other project documents under a public one (``torch._C.Generator`` -> ``torch.Generator``,
   ``sympy.matrices.expressions.matexpr.MatrixSymbol`` -> ``sympy.matrices.expressions.MatrixSymbol``) is rewritten
   by :data:`PUBLIC`, so intersphinx then finds it in ``docs/_inventories``.
4. A short name that still names nothing goes to the one documented symalg object whose name ends with it (summary
   lines of autosummary tables carry no module); several candidates leave it unresolved.
5. A private object of symalg (a component starting with ``_``), or one autodoc leaves out (module data without a
   docstring, a ``TypeVar``), has no page: it is shown as code, unlinked. It must exist (its full name imports, or a
   symalg module defines the bare name), so a misspelt one stays a warning.

Anything else is left alone and stays a warning (an error under ``-n -W``).
"""
from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import sys
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

# defining name (what ``__module__`` / ``__qualname__`` say) -> the name the project documents it under
PUBLIC = {
    "torch._C.Generator": "torch.Generator",
    "torch.nn.modules.module.Module": "torch.nn.Module",
    "torch.nn.modules.container.Sequential": "torch.nn.Sequential",
    "torch.optim.optimizer.Optimizer": "torch.optim.Optimizer",
    "torch.export.exported_program.ExportedProgram": "torch.export.ExportedProgram",
    "torch.fx.graph_module.GraphModule": "torch.fx.GraphModule",
    "torch.fx.graph.Graph": "torch.fx.Graph",
    "torch.fx.node.Node": "torch.fx.Node",
    "torch._C._linalg.linalg_matrix_exp": "torch.linalg.matrix_exp",
    "networkx.classes.digraph.DiGraph": "networkx.DiGraph",
    "networkx.classes.graph.Graph": "networkx.Graph",
    "sympy.matrices.expressions.matexpr.MatrixSymbol": "sympy.matrices.expressions.MatrixSymbol",
}


def _lookup(dotted: str, namespace: Any) -> Any:
    """The object ``dotted`` names as an attribute path from ``namespace`` (a module), or ``None``."""
    obj = namespace
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _import(dotted: str) -> Any:
    """The object an absolute dotted name names (a module, or attributes below the longest importable prefix)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return _lookup(".".join(parts[cut:]), module) if cut < len(parts) else module
    return None


def _defining_name(obj: Any) -> str | None:
    """``module.qualname`` of a class, function or method; the name of a module."""
    if inspect.ismodule(obj):
        return obj.__name__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return qualname if module == "builtins" else f"{module}.{qualname}"  # str, not builtins.str
    return None


def _member_name(owner: Any, member: str) -> str | None:
    """``Class.member`` for a member of a class (a method, property, attribute or dataclass field), named by the
    class of the MRO that defines it."""
    if not inspect.isclass(owner):
        return None
    for base in owner.__mro__:  # documented on the class that defines it (autodoc shows no inherited members)
        if member in vars(base) or member in vars(base).get("__annotations__", {}):
            return f"{_defining_name(base)}.{member}"
    return None


@functools.cache
def _imports(module_name: str) -> dict[str, str]:
    """``{local name: absolute dotted name}`` of every ``from X import Y`` in a module's source, deferred and
    ``TYPE_CHECKING`` imports included (what the module sees where the reference is written)."""
    module = _import(module_name)
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    package = module_name if hasattr(module, "__path__") else module_name.rpartition(".")[0]
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            names.update({alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names})
    return names


def _has_page(obj: Any) -> bool:
    """Whether an object is documented under its defining name (classes, functions, methods, modules)."""
    return inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)


def _data_name(module_name: str, target: str) -> str | None:
    """Where module data (a constant, a type alias) that ``module_name`` sees as ``target`` is defined."""
    first, _, rest = target.partition(".")
    origin = _imports(module_name).get(first)
    if origin is None:
        return f"{module_name}.{target}" if first in vars(_import(module_name)) else None
    return ".".join(filter(None, (origin, rest)))


def _as_seen_from(node: nodes.Element, target: str) -> str | None:
    """The defining name of what ``target`` names in the referencing module or its class's bases' modules."""
    module_name, class_name = node.get("py:module"), node.get("py:class")
    module = _import(module_name) if module_name else None
    if module is None:
        return None
    scopes = [module]
    cls = _lookup(class_name, module) if class_name else None
    if inspect.isclass(cls):
        scopes += [_import(base.__module__) for base in cls.__mro__[1:]]
    head, _, member = target.rpartition(".")
    if not head and (name := _member_name(cls, member)):
        return name  # a member of the referencing class, named without it
    for scope in filter(None, scopes):
        name = _member_name(_lookup(head, scope), member) if head else None
        obj = _lookup(target, scope)
        if name is None and obj is not None:
            name = _defining_name(obj) if _has_page(obj) else _data_name(scope.__name__, target)
        if name is not None:
            return name
    # imported where it is used (a deferred or TYPE_CHECKING import), or a module's name for such an import
    for module_name in dict.fromkeys((node.get("py:module"), target.rpartition(".")[0])):
        if module_name and module_name.startswith("symalg") and _import(module_name) is not None:
            short = target.removeprefix(f"{module_name}.") if module_name != node.get("py:module") else target
            first, _, rest = short.partition(".")
            if first in _imports(module_name) and (obj := _import(_imports(module_name)[first])) is not None:
                origin = _defining_name(obj) if _has_page(obj) else _imports(module_name)[first]
                return ".".join(filter(None, (origin, rest)))
    return None


def _top_level(target: str) -> str | None:
    """``symalg.X.rest`` for a lazily re-exported ``X``, as the name of its definition."""
    import symalg

    head, _, rest = target.removeprefix("symalg.").partition(".")
    if not target.startswith("symalg.") or head not in symalg._HOMES:
        return None
    return ".".join(filter(None, (symalg._HOMES[head], head, rest)))


def _exists(name: str) -> bool:
    """Whether an absolute dotted name names an object (a dataclass field without a default included)."""
    head, _, member = name.rpartition(".")
    return _import(name) is not None or _member_name(_import(head), member) is not None


def _absolute(target: str) -> str | None:
    """The defining name of an absolute ``symalg.…`` name (a re-export: ``symalg.catalogue.rules.attention_sites``)."""
    if not target.startswith("symalg.") or not _exists(target):
        return None
    obj = _import(target)
    return _defining_name(obj) if _has_page(obj) else target


def _unique_suffix(env: Any, target: str) -> str | None:
    """The one documented symalg object whose name ends with ``.target`` (a short name in a summary line, which
    carries no module of its own); ``None`` when there are none or several."""
    matches = [name for name in env.get_domain("py").objects if name.endswith(f".{target}")]
    return matches[0] if len(matches) == 1 and matches[0].startswith("symalg.") else None


def _private(name: str) -> bool:
    """A private object of symalg that exists: by its full name, or a bare ``_name`` some symalg module defines."""
    if name.startswith("symalg."):
        return any(part.startswith("_") for part in name.split(".")) and _exists(name)
    return name.startswith("_") and any(_exists(f"{module_name}.{name}") for module_name in list(sys.modules)
                                        if module_name.startswith("symalg"))


def _retarget(node: nodes.Element, contnode: nodes.Element, old: str, new: str) -> None:
    """Point the reference at ``new``; its text follows when it showed the old name in full."""
    node["reftarget"] = new
    if len(contnode.children) == 1 and isinstance(contnode[0], nodes.Text) and contnode.astext() == old:
        contnode.replace(contnode[0], nodes.Text(new))


def resolve(app: Sphinx, env: Any, node: nodes.Element, contnode: nodes.Element) -> nodes.Element | None:
    """The ``missing-reference`` handler (the cases are listed in the module docstring)."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not target or " " in target or hasattr(builtins, target):
        return None  # text, or a builtin (Sphinx's own resolver accepts those)
    new = _top_level(target) or _absolute(target) or _as_seen_from(node, target) or _unique_suffix(env, target) \
        or target
    new = PUBLIC.get(new, new)
    if _private(new):
        return contnode
    if new.startswith("symalg."):  # module data (a type alias in an annotation) is documented as data
        domain = env.get_domain("py")
        found = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], new, node, contnode) or \
            domain.resolve_xref(env, node["refdoc"], app.builder, "obj", new, node, contnode)
        return found or (contnode if _exists(new) else None)  # an undocumented object: code, unlinked
    if new != target:
        _retarget(node, contnode, target, new)
    return None  # intersphinx (priority 500) resolves the rewritten name


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", resolve, priority=400)
    return {"parallel_read_safe": True}
