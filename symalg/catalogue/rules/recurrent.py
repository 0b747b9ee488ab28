"""Rules for torch's recurrent layers: ``nn.RNN`` (tanh, ReLU), ``nn.GRU``, ``nn.LSTM`` (fx leaf modules) and
``aten.rnn_tanh``, ``aten.rnn_relu``, ``aten.gru``, ``aten.lstm`` (``torch.export``).

Layer ``l`` (direction ``d``) has ``G`` gate blocks of ``H`` rows in ``W_ih (G·H × in)``, ``W_hh (G·H × H)``,
``b_ih``, ``b_hh`` (RNN ``G = 1``; GRU ``r, z, n``; LSTM ``i, f, g, o``) and hidden units ``h`` (zero initial state):

- ``S``: a permutation ``P`` of the units moves the rows of every gate block (``W_ih``, ``W_hh``, biases) and the
  columns of ``W_hh`` (``W_hh ↦ P W_hh Pᵀ`` block by block) and of whatever reads ``h`` (the next layer's ``W_ih``, a
  readout): every gate is a fixed function of each unit's own pre-activations.
- ``SF`` (tanh cells) or ``PS`` (ReLU RNN): a diagonal ``D`` with ``h ↦ D h``. RNN: ``tanh(D z) = D tanh(z)``
  (``relu(D z) = D relu(z)`` for ``D > 0``), so ``W_ih, b ↦ D ·``, ``W_hh ↦ D W_hh D⁻¹``. LSTM: flip the rows of the
  cell candidate ``g``, so ``c = f ⊙ c + i ⊙ g`` and ``h = o ⊙ tanh(c)`` flip; the sigmoid gates see ``W_hh D h``
  unchanged through their columns. GRU: flip the candidate ``n`` rows (``W_in, b_in``, ``W_hn ↦ D W_hn D``,
  ``b_hn``), so ``h' = (1 − z) ⊙ n + z ⊙ h`` flips. The rows moved differ from ``S``'s, so each layer has a
  permutation site (``<layer>.units``) and a diagonal site (``<layer>``) on the same coordinates of ``h``.
- ``T``: ``b_ih`` and ``b_hh`` enter as a sum (GRU: the ``r, z`` blocks; ``b_hn`` sits inside ``r ⊙ (·)``):
  ``b_ih ↦ b_ih + t``, ``b_hh ↦ b_hh − t`` changes nothing (``<layer>.bias``, pattern ``opposite``; conserved
  ``b_ih − b_hh``).

Layer 0's input is read by ``W_ih`` alone, like a linear map's (its sites keep ``GL``; an input translation is
absorbed by ``b_ih``). A bidirectional layer's output concatenates its two directions, each its own sites.

The unit sites cannot move (blocked, naming the node) where an initial state ``h0``/``c0`` is given that is not a
constant zero tensor (it would have to move too), where dropout acts between layers (training mode), or where the
final state ``h_n``/``c_n`` of several layers or directions is read (it stacks their units along axis 0; of one
layer and direction it carries the layer's sites). ``proj_size > 0`` (``h = W_hr (o ⊙ tanh c)``) and packed
sequences are refused (not modelled).

>>> from symalg.catalogue.rules import REGISTRY
>>> sorted(op for op, r in REGISTRY.items() if r.rule is not None and r.rule.__module__ == __name__)
['gru', 'lstm', 'rnn']
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from symalg.catalogue.bindings import Binding, TranslationFamily
from symalg.catalogue.rule_examples import around
from symalg.catalogue.rules._base import Inputs, NodeData, Value, _freeze, _is_param, _first
from symalg.catalogue.rules.dense import _read_as_map
from symalg.catalogue.rules.registry import OpSpellings, register_rule
from symalg.symbolic.inference import Inference, Label, Segment

GATES = {"rnn": 1, "gru": 3, "lstm": 4}
"""Gate blocks of ``W_ih``, ``W_hh`` and the biases, per cell."""
FLIPPED_GATE = {"rnn": 0, "gru": 2, "lstm": 2}
"""The gate block whose rows the diagonal ``D`` moves: the RNN's only one, the GRU's ``n``, the LSTM's ``g``."""
SUMMED_GATES = {"rnn": 1, "gru": 2, "lstm": 4}
"""The gate blocks whose ``b_ih`` and ``b_hh`` enter as a sum (the GRU's ``r, z``)."""
ZERO_STATES = ("aten.zeros", "zeros", "new_zeros", "aten.new_zeros")
"""Ops that make the all-zero initial state (torch's own, under ``torch.export``; ``torch.zeros`` in ``forward``)."""


@dataclass(frozen=True)
class _Layer:
    """What a recurrent call reads: its cell (``rnn``, ``gru``, ``lstm``), nonlinearity, layers, directions,
    hidden width, whether it has biases, whether dropout acts between layers, its parameters by role
    (``weight_ih_l0_reverse``...) and its initial-state inputs (``(node, label)``)."""

    cell: str
    relu: bool
    layers: int
    directions: int
    hidden: int
    bias: bool
    dropout: bool
    params: Mapping[str, str]
    states: tuple[tuple[str | None, Any], ...]


def _roles(layers: int, directions: int, bias: bool, projected: bool) -> list[str]:
    """The parameter roles in torch's order (``_flat_weights_names``): per layer and direction ``W_ih, W_hh``
    [, ``b_ih, b_hh``] [, ``W_hr``]."""
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if bias else []) + (["weight_hr"] if projected else [])
    return [f"{name}_l{k}{suffix}" for k in range(layers) for suffix in ("", "_reverse")[:directions]
            for name in names]


def _read_layer(state: Inference, node: str, data: NodeData, inputs: Inputs) -> _Layer | str:
    """The call as a :class:`_Layer`, or why it is refused."""
    cell = data["op"]
    states = 2 if cell == "lstm" else 1
    if data["kind"] == "module":
        settings = data["settings"]
        if settings.get("proj_size"):
            return f"proj_size={settings['proj_size']} (h = W_hr (o ⊙ tanh c)) is not modelled"
        relu = settings.get("mode") == "RNN_RELU"
        layers, directions, bias = settings["num_layers"], 1 + bool(settings["bidirectional"]), settings["bias"]
        dropout = bool(settings["dropout"]) and settings.get("training", True) and layers > 1
        params = dict(data["params"])
        hx = list(zip(data["inputs"][1:], inputs[1:]))
    else:
        arguments = data.get("arguments", {})
        if not isinstance(arguments.get("arg3"), bool):
            return "a packed sequence (aten's data overload) is not modelled"
        bias, layers, directions = arguments["arg3"], arguments["arg4"], 1 + bool(arguments["arg7"])
        relu = data["settings"].get("nonlinearity") == "relu"
        dropout = bool(arguments["arg5"]) and bool(arguments["arg6"]) and layers > 1
        weights = inputs[1 + states:]
        per = len(weights) // (layers * directions)
        if not all(_is_param(w) for w in weights) or per != 2 + 2 * bias:
            return "its weights are not the layer's own parameters, or it has a projection (proj_size > 0)"
        params = {role: w[1] for role, w in zip(_roles(layers, directions, bias, False), weights)}
        hx = list(zip(data["inputs"][1:1 + states], inputs[1:1 + states]))
    if set(_roles(layers, directions, bias, False)) != set(params):
        return f"its parameters {sorted(params)} are not those of {layers} layer(s) of {cell}"
    hidden = state.shapes[params["weight_hh_l0"]][1]
    return _Layer(cell, relu, layers, directions, hidden, bias, dropout, params, tuple(hx))


def _stem(node: str, data: NodeData, layer: _Layer) -> str:
    """The module path of the layer (``rnn``), else the node."""
    if data["kind"] == "module":
        return data["module"]
    path = layer.params["weight_ih_l0"].rpartition(".")[0]
    return path or node


def _direction_sites(state: Inference, node: str, layer: _Layer, name: str, suffix: str) -> tuple[int, int]:
    """The permutation and diagonal sites of one layer and direction (roles ``…_l{l}{suffix}``) and its bias-sum
    translation; returns ``(permutation site, diagonal site)``."""
    H, gates, p = layer.hidden, GATES[layer.cell], layer.params
    rowed = [p[f"weight_ih{suffix}"], p[f"weight_hh{suffix}"]] + \
        ([p[f"bias_ih{suffix}"], p[f"bias_hh{suffix}"]] if layer.bias else [])
    columns = Binding(p[f"weight_hh{suffix}"], 1, 0, H, role="in", node=node)

    def rows(gate: int) -> list[Binding]:
        return [Binding(tensor, 0, gate * H, H, node=node) for tensor in rowed]

    permutation = state.new_site(node, H, [b for gate in range(gates) for b in rows(gate)] + [columns],
                                 name=f"{name}.units", allowed={"S"})
    diagonal = state.new_site(node, H, rows(FLIPPED_GATE[layer.cell]) + [columns], name=name,
                              allowed={"PS"} if layer.relu else {"SF"})
    if layer.bias:
        width = SUMMED_GATES[layer.cell] * H
        summed = state.new_site(node, width, name=f"{name}.bias", allowed={"T"})
        state.site(summed).translations.append(("T", node, TranslationFamily("opposite", (
            Binding(p[f"bias_ih{suffix}"], 0, 0, width, node=node),
            Binding(p[f"bias_hh{suffix}"], 0, 0, width, node=node)))))
    return permutation, diagonal


def _final_states_read(state: Inference, node: str) -> list[str]:
    """The nodes reading the final states ``h_n``/``c_n`` (or the whole result) of the recurrent call ``node``:
    users other than ``getitem`` of the output (index 0), looking through ``getitem`` nodes that nothing reads."""
    def readers(value: str, top: bool) -> list[str]:
        found = []
        for user in state.users(value):
            data = state.graph.nodes[user]
            if data["op"] != "getitem":
                found.append(user)
            elif not (top and data.get("arguments", {}).get("arg1") == 0):
                found += readers(user, False)
        return found
    return readers(node, True)


def recurrent_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """``nn.RNN``/``GRU``/``LSTM`` and their ATen ops (module docstring): per layer and direction, ``S`` on the
    units, ``SF`` (``PS`` for a ReLU RNN) on the units through the gate it moves, ``T`` on the bias sum; the input
    is read as by a linear map."""
    layer = _read_layer(state, node, data, inputs)
    flat = data["kind"] != "module"
    if isinstance(layer, str):
        for label in inputs:
            _freeze(state, node, label, f"{state.where(node)}: {layer}")
        return _outputs(data["op"], Label.data(), Label.data(), flat)
    stem, value, made = _stem(node, data, layer), _first(inputs), []
    for depth in range(layer.layers):
        segments = []
        for d, suffix in enumerate(("", "_reverse")[:layer.directions]):
            roles = f"_l{depth}{suffix}"
            _read_as_map(state, node, value, layer.params[f"weight_ih{roles}"], -1,
                         layer.params[f"bias_ih{roles}"] if layer.bias else None)
            name = f"{stem}.l{depth}{suffix}" if layer.layers * layer.directions > 1 else stem
            sites = _direction_sites(state, node, layer, name, roles)
            segments += [Segment(site, d * layer.hidden, layer.hidden) for site in sites]
            made.append((depth, sites))
        value = Label(-1, layer.directions * layer.hidden, tuple(segments))
    _block_units(state, node, layer, made)
    single = layer.layers * layer.directions == 1
    final = Label(-1, layer.hidden, value.segments) if single else Label.data()
    return _outputs(data["op"], value, final, flat)


def _block_units(state: Inference, node: str, layer: _Layer, made: list[tuple[int, tuple[int, int]]]) -> None:
    """Remove every kind from the unit sites (``made``: ``(layer, sites)``) that a given initial state, dropout
    between layers or a read stacked final state forbids (module docstring)."""
    where = state.where(node)
    for source, label in layer.states:
        if source is not None and state.graph.nodes[source]["op"] in ZERO_STATES:
            continue
        _freeze(state, node, label, f"{where} reads it as an initial state")
        for _, sites in made:
            for site in sites:
                state.restrict(site, set(), node, f"{where}: the initial state {source} is given and does not move "
                                                  "with the hidden units", blocked=True)
    if layer.dropout:
        for depth, sites in made:
            for site in sites if depth < layer.layers - 1 else ():
                state.restrict(site, set(), node, f"{where}: dropout in training mode draws a random mask on the "
                                                  f"outputs of layer {depth}", blocked=True)
    readers = _final_states_read(state, node) if layer.layers * layer.directions > 1 else []
    if readers:
        for _, sites in made:
            for site in sites:
                state.restrict(site, set(), node, f"{where}: its final state, read by {readers[0]}, stacks the units "
                                                  "of every layer and direction along axis 0 (not modelled)",
                               blocked=True)


def _outputs(cell: str, output: Label, final: Label, flat: bool) -> tuple:
    """The call's result: ``(output, h_n)``; an LSTM's ``(output, (h_n, c_n))`` as a module, flat under export.
    ``c_n`` moves as ``h_n`` (``S`` permutes it, the flips of ``g`` flip it)."""
    if cell != "lstm":
        return (output, final)
    return (output, final, final) if flat else (output, (final, final))


def _recurrent(cell: type[nn.Module], k: int = 4, **options: Any) -> Any:
    """The example ``fc2(cell(fc1(x))[0])``: a cell of width 4 (output width ``k``) on a batch of sequences."""
    return around(lambda self, h: self.rnn(h)[0], shape=(2, 5, 3), k=k,
                  rnn=lambda: cell(4, 4, batch_first=True, **options))


register_rule("rnn", "gru", "lstm", capabilities={"weights"},
              spellings={"rnn": OpSpellings(modules=(nn.RNN,), aten=("rnn_tanh", "rnn_relu"),
                                            settings={"rnn_tanh": {"nonlinearity": "tanh"},
                                                      "rnn_relu": {"nonlinearity": "relu"}}),
                         "gru": OpSpellings(modules=(nn.GRU,), aten=("gru",)),
                         "lstm": OpSpellings(modules=(nn.LSTM,), aten=("lstm",))},
              examples={"rnn": _recurrent(nn.RNN), "gru": _recurrent(nn.GRU), "lstm": _recurrent(nn.LSTM)},
              near_misses={"rnn": (_recurrent(nn.RNN, nonlinearity="relu"),
                                   around(lambda self, h: self.rnn(h)[1][-1], shape=(2, 5, 3),
                                          rnn=lambda: nn.RNN(4, 4, num_layers=2, batch_first=True))),
                           "gru": (around(lambda self, h: self.rnn(h, torch.tanh(h[:1]))[0], shape=(2, 5, 3),
                                          rnn=lambda: nn.GRU(4, 4)),),
                           "lstm": (_recurrent(nn.LSTM, 8, bidirectional=True, num_layers=2),
                                    _recurrent(nn.LSTM, 2, proj_size=2))})(recurrent_rule)
