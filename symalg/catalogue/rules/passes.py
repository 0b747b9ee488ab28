"""Ops a front-end pass consumes: spelled for the tracer, read by no rule (left unconsumed, they are unknown ops).

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is None)[-5:]
['baddbmm', 'masked_fill', 'repeat_interleave', 'sdpa', 'size']
"""
from __future__ import annotations

import torch.nn.functional as F

from symalg.catalogue.rules.registry import OpSpellings, register_spelling

__all__: list[str] = []

_FOLDING = "attention folding (symalg.frontend.attention_folding)"
register_spelling("sdpa", OpSpellings(functions=(F.scaled_dot_product_attention,),
                                      aten=("scaled_dot_product_attention",)), _FOLDING)
register_spelling("baddbmm", OpSpellings(aten=("baddbmm",)), _FOLDING)
register_spelling("repeat_interleave", OpSpellings(aten=("repeat_interleave",)), _FOLDING, {"layout"})
register_spelling("masked_fill", OpSpellings(aten=("masked_fill",)), _FOLDING, {"entrywise"})
for _name in ("masked_fill_", "where", "zeros_like", "logical_not", "logical_or", "logical_and"):
    # the masks torch.export spells with ATen ops (named as an unspelled ATen op would be: aten.where)
    register_spelling(f"aten.{_name}", OpSpellings(aten=(_name,)), _FOLDING, {"entrywise"})
register_spelling("size", OpSpellings(methods=("size", "dim")), "shape propagation (a size is a number)")
