"""Write the intersphinx inventories of torch, networkx and numpy that the docs link to offline.

These projects ship no packaged ``objects.inv`` reachable from this machine, so each inventory here is written from an
explicit table: the names symalg's docs reference, each with the page of the project's documentation that documents
it (relative to the project's base URL, which ``docs/conf.py`` gives to intersphinx). The files use Sphinx's
inventory format version 2 (four header lines, then a zlib-compressed body of lines
``name domain:role priority uri dispname``). Re-run after adding a name to a table::

    python docs/_inventories/make_inventories.py
"""
from __future__ import annotations

import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

# project -> (version documented, {name: (domain:role, uri relative to the base URL)})
TABLES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "torch": ("stable", {
        "torch.Tensor": ("py:class", "tensors.html#torch.Tensor"),
        "torch.dtype": ("py:class", "tensor_attributes.html#torch.dtype"),
        "torch.device": ("py:class", "tensor_attributes.html#torch.device"),
        "torch.Generator": ("py:class", "generated/torch.Generator.html#torch.Generator"),
        "torch.nn.Module": ("py:class", "generated/torch.nn.Module.html#torch.nn.Module"),
        "torch.nn.Sequential": ("py:class", "generated/torch.nn.Sequential.html#torch.nn.Sequential"),
        "torch.nn.parameter.Parameter": ("py:class",
                                         "generated/torch.nn.parameter.Parameter.html#torch.nn.parameter.Parameter"),
        "torch.optim.Optimizer": ("py:class", "optim.html#torch.optim.Optimizer"),
        "torch.export.ExportedProgram": ("py:class", "export.html#torch.export.ExportedProgram"),
        "torch.fx.GraphModule": ("py:class", "fx.html#torch.fx.GraphModule"),
        "torch.fx.Graph": ("py:class", "fx.html#torch.fx.Graph"),
        "torch.fx.Node": ("py:class", "fx.html#torch.fx.Node"),
        "torch.func.functional_call": ("py:function", "generated/torch.func.functional_call.html"
                                                      "#torch.func.functional_call"),
        "torch.nn.utils.parametrize.register_parametrization": (
            "py:function", "generated/torch.nn.utils.parametrize.register_parametrization.html"
                           "#torch.nn.utils.parametrize.register_parametrization"),
        "torch.linalg.matrix_exp": ("py:function", "generated/torch.linalg.matrix_exp.html#torch.linalg.matrix_exp"),
    }),
    "networkx": ("stable", {
        "networkx.DiGraph": ("py:class", "reference/classes/digraph.html#networkx.DiGraph"),
        "networkx.Graph": ("py:class", "reference/classes/graph.html#networkx.Graph"),
    }),
    "numpy": ("stable", {
        "numpy.ndarray": ("py:class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
    }),
}


def inventory(project: str, version: str, entries: dict[str, tuple[str, str]]) -> bytes:
    """The bytes of an inventory (format 2) listing ``entries``, each shown under its own name (dispname ``-``)."""
    header = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
              "# The remainder of this file is compressed using zlib.\n")
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, (role, uri) in sorted(entries.items()))
    return header.encode() + zlib.compress(body.encode())


def main() -> None:
    for project, (version, entries) in TABLES.items():
        path = HERE / f"{project}.inv"
        path.write_bytes(inventory(project, version, entries))
        print(f"{path.name}: {len(entries)} names")


if __name__ == "__main__":
    main()
