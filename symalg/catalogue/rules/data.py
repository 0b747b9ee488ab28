"""Rules for the graph's ends: inputs, constants and buffers (data), parameters read in ``forward``, outputs and
packed outputs.

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)
['buffer', 'constant', 'input', 'output', 'pack', 'param']
"""
from __future__ import annotations


import torch

from symalg.catalogue.rule_examples import around
from symalg.symbolic.inference import Inference, Label
from symalg.catalogue.rules._base import (Inputs, NodeData, Value, WeightExpr, _flat_outputs, _is_param,
                                          _whole_vector_shifts)
from symalg.catalogue.rules.registry import register_rule


@register_rule("input", "constant", "buffer", capabilities=(),
               examples={
    "input": around(lambda self, h: h),
    "constant": around(lambda self, h: self.inner(torch.relu(h)) * self.scale,
                       scale=lambda: torch.linspace(0.5, 2.0, 4), inner=lambda: torch.nn.Linear(4, 4)),
    "buffer": around(lambda self, h: self.inner(torch.relu(h)) + self.shift, inner=lambda: torch.nn.Linear(4, 4),
                     buffers=lambda: {"shift": torch.linspace(-1.0, 1.0, 4)})})
def data_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    return Label.data()


@register_rule("param", capabilities={"weights"},
               examples={
    "param": around(lambda self, h: torch.nn.functional.linear(torch.relu(h), self.w, self.b),
                    w=lambda: torch.nn.Parameter(torch.randn(4, 4)), b=lambda: torch.nn.Parameter(torch.randn(4)))})
def param_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """A parameter read in ``forward``: its own label, resolved by the op that uses it."""
    return ("param", data["params"]["value"])


@register_rule("output", capabilities={"products", "weights"},
               examples={"output": around(lambda self, h: torch.relu(h))})
def output_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> None:
    """Every returned tensor (nested in tuples, lists, dicts, dataclasses) must not change (``mse``); with
    ``cross_entropy`` the first is the logits, which may shift along ``1``. A returned parameter is
    pinned (no action may move it). Where the front end named the outputs (``settings["outputs"]``, one per
    flat output: ``'past_key_values.layers.0.keys'``), the note names the one that fixed the site."""
    flat = _flat_outputs(inputs)
    names = data["settings"].get("outputs", ())
    names = names if len(names) == len(flat) else ("",) * len(flat)
    for position, (item, name) in enumerate(zip(flat, names)):
        kinds = {"T1"} if state.loss == "cross_entropy" and position == 0 else set()
        if isinstance(item, Label):
            what = f"the model output {name}" if name else "the model output"
            state.restrict_label(item, kinds, node, f"{state.where(node)}: {what} is fixed by the loss")
            if kinds:
                _whole_vector_shifts(state, node, item, "the cross-entropy")
        elif isinstance(item, WeightExpr) or _is_param(item):
            for tensor in (item.tensors if isinstance(item, WeightExpr) else (item[1],)):
                state.opaque.setdefault(tensor, node)
    return None


@register_rule("pack", capabilities={"weights"},
               examples={"pack": around(lambda self, h: torch.tanh(h), packed=True)})
def pack_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> tuple:
    """A dataclass or named tuple built in ``forward`` (``Output(logits=…, hidden=…)``): the tuple of its
    fields' labels."""
    return tuple(inputs)
