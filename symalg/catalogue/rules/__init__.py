"""Op rules: the equivariance catalogue of layers and structural ops, one registration per canonical op.

A rule receives the :class:`~symalg.symbolic.inference.Inference` state, the node, its data and the labels of its
inputs, and returns the label of its output. It may create sites (where a parameterised map writes a feature axis),
bind tensors, tie sites and restrict them. Each rule is registered once (:func:`register_rule`,
:mod:`~symalg.catalogue.rules.registry`) with its torch spellings, its capabilities, an example model and its near
misses; the registrations live in one module per family:

- :mod:`~symalg.catalogue.rules.data`: inputs, parameters, outputs;
- :mod:`~symalg.catalogue.rules.dense`: dense maps (linear, ``addmm``, convolutions, embeddings, weight products);
- :mod:`~symalg.catalogue.rules.einsum`: ``torch.einsum`` read as the contraction its equation spells;
- :mod:`~symalg.catalogue.rules.elementwise`: sums, products, pointwise functions, powers, dropout;
- :mod:`~symalg.catalogue.rules.structural`: shape ops (reshape, transpose, cat, split, indexing);
- :mod:`~symalg.catalogue.rules.reductions`: means, sums, pooling, softmax;
- :mod:`~symalg.catalogue.rules.normalisation`: batch, layer, RMS and group norms;
- :mod:`~symalg.catalogue.rules.attention`: attention and ``nn.MultiheadAttention``;
- :mod:`~symalg.catalogue.rules.torch_layers`: ``bilinear`` and ``conv_transpose1d/2d`` (torch's own layers);
- :mod:`~symalg.catalogue.rules.recurrent`: ``nn.RNN``, ``nn.GRU`` and ``nn.LSTM`` (their gate blocks and hidden units);
- :mod:`~symalg.catalogue.rules.moe`: sparse mixture-of-experts blocks (the routing as one op);
- :mod:`~symalg.catalogue.rules.passes`: ops a front-end pass consumes (spellings only).

Activations are served by the catalogue (:mod:`symalg.catalogue`), and an op nobody declared is handled by
:func:`unknown_rule`, which keeps only the kinds under which its inputs are invariant.

>>> {"add", "linear", "softmax", "bilinear", "einsum"} <= set(OP_RULES)
True
"""
from __future__ import annotations

from symalg.catalogue.rules import (attention, data, dense, einsum, elementwise, moe, normalisation, passes,
                                    recurrent, reductions, structural, torch_layers)
from symalg.catalogue.rules._base import Inputs, NodeData, Rule, Value, WeightExpr, activation_rule, unknown_rule
from symalg.catalogue.rules.registry import (_RULES, CAPABILITIES, OP_RULES, REGISTRY, RULE_EXAMPLES, OpSpellings,
                                             Registration, capable, register_rule, register_spelling, spelling_table)
from symalg.catalogue.rules.elementwise import identity_rule

__all__ = ["CAPABILITIES", "Inputs", "NodeData", "OP_RULES", "OpSpellings", "REGISTRY", "RULE_EXAMPLES",
           "Registration", "Rule", "Value", "WeightExpr", "activation_rule", "capable", "register_rule",
           "register_spelling", "spelling_table", "unknown_rule", "identity_rule", "_RULES"]

FAMILIES = (data, dense, einsum, elementwise, structural, reductions, normalisation, attention, torch_layers, recurrent,
            moe, passes)
"""The family modules, each registering its rules on import."""
