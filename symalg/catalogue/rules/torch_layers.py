"""Op rules for torch's own layers that no other rule reads: ``bilinear`` (``nn.Bilinear``, ``F.bilinear``,
``aten.bilinear``) and ``conv_transpose1d``/``conv_transpose2d`` (``nn.ConvTranspose1d/2d``,
``F.conv_transpose1d/2d``, ``aten.conv_transpose1d/2d``).

Registered with :func:`~symalg.catalogue.rules.register_rule`, each with its spellings (:class:`OpSpellings`), its
example model (the rule law tests trace it through fx and export) and near misses (the fuzzer's ``rules`` family);
the package :mod:`symalg.catalogue.rules` imports this family module.

>>> import torch
>>> from symalg.catalogue.rules import OP_RULES, spelling_table
>>> spelling_table().modules[torch.nn.Bilinear], spelling_table().aten["conv_transpose2d"]
('bilinear', 'conv_transpose2d')
>>> OP_RULES["bilinear"] is bilinear_rule
True
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from symalg.catalogue.rule_examples import Example, model_example
from symalg.catalogue.rules._base import Inputs, NodeData, WeightExpr, _argument, _freeze, _is_param, unknown_rule
from symalg.catalogue.rules.dense import _producer_site, _read_as_map, _refuse_shifts
from symalg.catalogue.rules.registry import OpSpellings, register_rule
from symalg.symbolic.inference import Inference, Label, Segment

__all__ = ["BilinearExample", "TransposedExample", "bilinear_rule", "conv_transpose_rule"]

nn = torch.nn


class BilinearExample(nn.Module):
    """``out(relu(bilinear(relu(a(x)), tanh(b(x)))))``: two hidden sites read by one ``nn.Bilinear``, called as the
    module or (``functional``) as ``F.bilinear`` on its weights; ``same`` reads ``relu(a(x))`` on both sides (one
    site on the weight's axes 1 and 2)."""

    def __init__(self, functional: bool = False, same: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.bilinear, self.out = nn.Linear(3, 4), nn.Linear(3, 4 if same else 5), \
            nn.Bilinear(4, 4 if same else 5, 6), nn.Linear(6, 2)
        self.functional, self.same = functional, same

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = torch.relu(self.a(x))
        x2 = x1 if self.same else torch.tanh(self.b(x))
        y = F.bilinear(x1, x2, self.bilinear.weight, self.bilinear.bias) if self.functional else self.bilinear(x1, x2)
        return self.out(torch.relu(y))


@register_rule("bilinear", capabilities={"weights"},
               spellings={"bilinear": OpSpellings(modules=(nn.Bilinear,), functions=(F.bilinear,), aten=("bilinear",))},
               examples={"bilinear": model_example(BilinearExample, lambda: torch.randn(5, 3))},
               near_misses={"bilinear": (model_example(lambda: BilinearExample(functional=True, same=True),
                                                       lambda: torch.randn(5, 3)),)})
def bilinear_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """``y_k = x₁ᵀ W_k x₂ + b_k`` (``W`` of shape ``(out, in₁, in₂)``): the sites of ``x₁`` act on ``W``'s axis 1
    and those of ``x₂`` on its axis 2, each as on a linear map's columns (``x₁ ↦ g x₁``, ``W_k ↦ g⁻ᵀ W_k``:
    ``(g x₁)ᵀ g⁻ᵀ W_k x₂ = x₁ᵀ W_k x₂``; the same site on both, ``W_k ↦ g⁻ᵀ W_k g⁻¹``); a new site on the rows
    ``W_k`` and ``b``, as on a linear map's. A translation of either input, ``x₁ ↦ x₁ + t``, adds ``tᵀ W_k x₂``,
    which depends on the other input: no bias gives it back, so translations and the shifts of affine sign flips
    are refused. The module call records its weights by role; ``F.bilinear(x₁, x₂, W, b)`` and export's
    ``aten.bilinear`` read them as operands; anything else is an unknown op.

    Example
    -------
    >>> import symalg
    >>> from symalg.catalogue.rules import RULE_EXAMPLES
    >>> model, inputs = RULE_EXAMPLES["bilinear"]()
    >>> sorted(s.label for s in symalg.derive(symalg.trace(model, inputs), certify=False).symmetries)[:2]
    ['PositiveScaling(4, alpha=1) on a', 'PositiveScaling(6, alpha=1) on bilinear']
    """
    if data["kind"] == "module":
        weight, bias = data["params"].get("weight"), data["params"].get("bias")
        operands_ok = isinstance(data.get("instance"), nn.Bilinear) and len(inputs) == 2
    else:
        weight = inputs[2][1] if len(inputs) > 2 and _is_param(inputs[2]) else None
        bias = inputs[3][1] if len(inputs) > 3 and _is_param(inputs[3]) else None
        operands_ok = len(inputs) == 3 or len(inputs) == 4 and (bias is not None or inputs[3] is None)
    values = [value if isinstance(value, Label) else Label.data() for value in inputs[:2]]
    if not operands_ok or weight is None or len(state.shapes[weight]) != 3 or \
            bias is not None and len(state.shapes[bias]) != 1 or \
            any(value is not None and not isinstance(value, Label) for value in inputs[:2]):
        return unknown_rule(state, node, data, inputs)
    for value, axis in zip(values, (1, 2)):
        _read_as_map(state, node, value, WeightExpr(((weight, 0),), ((weight, axis),)), -1,
                     why="is bilinear (a shift of one input changes the output by an amount the other input scales)")
        _refuse_shifts(state, node, value, "is bilinear: the shift of an affine sign flip is scaled by the other input")
    out_features = state.shapes[weight][0]
    site = _producer_site(state, node, out_features, weight, bias)
    return Label(-1, out_features, (Segment(site, 0, out_features),))


class TransposedExample(nn.Module):
    """``up(relu(convT(relu(down(x)))))`` on ``(B, 2, 8)`` or ``(B, 2, 8, 8)``: a transposed convolution between two
    convolutions, called as the module or (``functional``) as ``F.conv_transpose{1,2}d`` on its weights; ``groups``
    splits its channels (``4`` in, ``4`` out)."""

    def __init__(self, dims: int = 1, functional: bool = False, groups: int = 1) -> None:
        super().__init__()
        conv, transposed = (nn.Conv1d, nn.ConvTranspose1d) if dims == 1 else (nn.Conv2d, nn.ConvTranspose2d)
        width = 3 if groups == 1 else 4
        self.down, self.convT, self.up = conv(2, width, 3), transposed(width, 4, 3, stride=2, padding=1,
                                                                       groups=groups), conv(4, 2, 3)
        self.functional, self.dims, self.groups = functional, dims, groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.down(x))
        if self.functional:
            call = F.conv_transpose1d if self.dims == 1 else F.conv_transpose2d
            h = call(h, self.convT.weight, self.convT.bias, 2, 1, 0, self.groups)
        else:
            h = self.convT(h)
        return self.up(torch.relu(h))


def _transposed_example(dims: int, functional: bool = False, groups: int = 1) -> Example:
    return model_example(lambda: TransposedExample(dims, functional, groups), lambda: torch.randn(5, 2, *(8,) * dims))


@register_rule("conv_transpose1d", "conv_transpose2d", capabilities={"weights"},
               spellings={f"conv_transpose{d}d": OpSpellings(modules=(module,), functions=(function,),
                                                             aten=(f"conv_transpose{d}d",))
                          for d, module, function in ((1, nn.ConvTranspose1d, F.conv_transpose1d),
                                                      (2, nn.ConvTranspose2d, F.conv_transpose2d))},
               examples={f"conv_transpose{d}d": _transposed_example(d) for d in (1, 2)},
               near_misses={  # the functional spelling, and grouped channels (refused: no claim on them)
                   f"conv_transpose{d}d": (_transposed_example(d, True), _transposed_example(d, groups=2))
                   for d in (1, 2)})
def conv_transpose_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Label:
    """A transposed convolution, ``W`` of shape ``(in, out, *k)`` (``groups = 1``): ``y[o] = Σ_i Σ_k W[i, o, k]
    x[i]`` shifted by ``k``, plus ``b[o]``. Its input channels' sites act on ``W``'s axis 0 as on a linear map's
    columns, its output channels are a new site on ``W``'s axis 1 and ``b``. A translation of the input adds
    ``Σ_k W[:, o, k]ᵀ t`` at the positions every tap reaches and less near the borders: no bias gives it back, so
    translations and the shifts of affine sign flips are refused. Grouped ones (``groups > 1``) block their input's
    sites and their weights, with a note.

    Example
    -------
    >>> import symalg
    >>> from symalg.catalogue.rules import RULE_EXAMPLES
    >>> model, inputs = RULE_EXAMPLES["conv_transpose1d"]()
    >>> sorted(s.label for s in symalg.derive(symalg.trace(model, inputs), certify=False).symmetries)
    ['PositiveScaling(3, alpha=1) on down', 'PositiveScaling(4, alpha=1) on convT', 'S(3) on down', 'S(4) on convT']
    """
    if data["kind"] == "module":
        weight, bias = data["params"].get("weight"), data["params"].get("bias")
        module = data.get("instance")
        operands_ok = isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose2d)) and len(inputs) == 1
        groups = getattr(module, "groups", 1)
    else:
        weight = inputs[1][1] if len(inputs) > 1 and _is_param(inputs[1]) else None
        bias = inputs[2][1] if len(inputs) > 2 and _is_param(inputs[2]) else None
        operands_ok = len(inputs) == 2 or len(inputs) == 3 and (bias is not None or inputs[2] is None)
        groups = _argument(data, 6, "groups", 1)
    if operands_ok and groups != 1:
        for value in inputs:
            _freeze(state, node, value, f"{state.where(node)}: a grouped transposed convolution (groups={groups}) is "
                                        "not modelled")
        return Label.data()
    if not operands_ok or weight is None or not isinstance(inputs[0], Label | None) or \
            bias is not None and len(state.shapes[bias]) != 1:
        return unknown_rule(state, node, data, inputs)
    value = inputs[0] if isinstance(inputs[0], Label) else Label.data()
    channel_dim = -(len(state.shapes[weight]) - 1)
    _read_as_map(state, node, value, WeightExpr(((weight, 1),), ((weight, 0),)), channel_dim,
                 why="is a transposed convolution (a shift of its input changes the borders)")
    _refuse_shifts(state, node, value, "is a transposed convolution: the shift of an affine sign flip varies with "
                                       "position")
    out_channels = state.shapes[weight][1]
    site = _producer_site(state, node, out_channels, WeightExpr(((weight, 1),), ((weight, 0),), (weight,)), bias)
    return Label(channel_dim, out_channels, (Segment(site, 0, out_channels),))
