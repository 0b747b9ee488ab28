"""The rule for sparse mixture-of-experts blocks (``moe``): the routing is opened as one op.

A block computes, per token ``x ∈ R^H`` (torch layout: rows are tokens),

    p = softmax(W_r x),   K = topk(p, k),   w_e = p_e / Σ_{j∈K} p_j  (or ``p_e`` unnormalised),
    y = Σ_{e ∈ K} w_e · D_e (σ(G_e x) ⊙ U_e x)  [+ sigmoid(g·x) · D_s (σ(G_s x) ⊙ U_s x), a shared expert]

with the router ``W_r ∈ R^{E×H}`` and the experts stored fused (Hugging Face 5.x): ``gate_up_proj (E, 2I, H)``
(rows ``[0, I)`` are ``G_e``, ``[I, 2I)`` are ``U_e``) and ``down_proj (E, H, I)``. Neither tracer can follow the
routing (fx: ``'Proxy' object does not support item assignment``; export: a data-dependent expert loop), so the
tracer keeps a *recognised* block as one node (:func:`recognise`: found by structure, then its forward compared with
the formula above at random parameters and inputs) and this rule declares its groups:

- **expert permutations** ``S(E)``: router rows and the experts' slices (axis 0 of both expert tensors) permuted
  together. ``softmax`` and ``topk`` are equivariant (ties have measure zero at generic parameters) and the sum
  over the selected experts does not depend on their order; the renormalised weights too.
- **hidden units**: ``S(I)`` on the gate and up rows and the down columns, and any diagonal ``D`` on the up rows
  against ``D⁻¹`` on the down columns (``PS``, ``SF``), as for a dense SwiGLU. The engine's bindings address one
  tensor axis, so one element acts on *every expert alike* (the diagonal of ``Π_e G_e``): a sound subgroup of
  each expert's own groups, which are independent in truth.
- **input**: every map reading ``x`` (router columns, axis 2 of ``gate_up_proj``, the shared expert's and its gate's
  columns) moves with the input's sites, ``W ↦ W A⁻¹``: the router logits are unchanged, so is the routing. No
  bias absorbs a translation.
- **output**: ``y ↦ B y`` with every down projection's rows ``↦ B D`` (``GL``; the weights ``w_e`` are scalars).

A block returning its router logits as well (``(y, W_r x)``) gives them the expert site: a permutation permutes an
output, which the outputs then refuse. A block that looks like one but whose forward does not match the formula
(router noise in training mode, another routing: PhiMoE's sparsemixer, a score-correction bias) is a node whose rule
refuses everything with a note naming it.

>>> import torch, symalg
>>> block = SparseMoE(4, 3, experts=4, top_k=2)
>>> recognise(block)["experts"], recognise(block)["top_k"]
(4, 2)
"""
from __future__ import annotations

import copy
import weakref
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from symalg.catalogue.bindings import Binding
from symalg.catalogue.rule_examples import Example
from symalg.catalogue.rules._base import Inputs, NodeData, Value, _first
from symalg.catalogue.rules.dense import _read_as_map, _refuse_shifts
from symalg.catalogue.rules.registry import register_rule
from symalg.symbolic.inference import ALL, TRANSLATIONS, Inference, Label, Segment

__all__ = ["MoEStack", "SparseMoE", "recognise"]


class SparseMoE(nn.Module):
    """A hand-written top-``k`` MoE block in Hugging Face's layout (``gate.weight (E, H)``, ``experts.gate_up_proj
    (E, 2I, H)``, ``experts.down_proj (E, H, I)``), routing token by token with ``index_add_``.

    ``jitter``: multiplicative router noise in training mode (Mixtral's); ``logits``: return ``(y, W_r x)``;
    ``normalise``: renormalise the top-``k`` weights; ``widths``: per-expert hidden widths (experts of different
    widths: columns beyond an expert's width are masked to zero, so it is no fused block of equal experts);
    ``shared``: the width of a shared expert gated by ``sigmoid(g·x)`` (Qwen2-MoE's), 0 for none; ``swapped``: the
    up rows before the gate rows in ``gate_up_proj`` (not Hugging Face's layout)."""

    def __init__(self, hidden: int, intermediate: int, experts: int = 4, top_k: int = 2, jitter: float = 0.0,
                 logits: bool = False, normalise: bool = True, widths: tuple[int, ...] | None = None, shared: int = 0,
                 swapped: bool = False) -> None:
        super().__init__()
        self.top_k, self.jitter, self.logits, self.normalise, self.widths = top_k, jitter, logits, normalise, widths
        self.swapped = swapped
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * intermediate, hidden) / hidden ** 0.5)
        self.experts.down_proj = nn.Parameter(torch.randn(experts, hidden, intermediate) / intermediate ** 0.5)
        if shared:
            self.shared_expert = nn.Module()
            self.shared_expert.gate_proj = nn.Linear(hidden, shared, bias=False)
            self.shared_expert.up_proj = nn.Linear(hidden, shared, bias=False)
            self.shared_expert.down_proj = nn.Linear(shared, hidden, bias=False)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        if self.training and self.jitter:
            h = h * torch.empty_like(h).uniform_(1 - self.jitter, 1 + self.jitter)
        logits = self.gate(h)
        weights, chosen = torch.topk(logits.softmax(-1), self.top_k, dim=-1)
        if self.normalise:
            weights = weights / weights.sum(-1, keepdim=True)
        y = torch.zeros_like(h)
        experts: Any = self.experts   # (parameters or, under torch.func.functional_call, plain tensors)
        gate_up, down = experts.gate_up_proj, experts.down_proj
        for e in range(gate_up.shape[0]):
            tokens, slot = torch.where(chosen == e)
            g, u = F.linear(h[tokens], gate_up[e]).chunk(2, dim=-1)
            g, u = (u, g) if self.swapped else (g, u)
            inner = F.silu(g) * u
            if self.widths is not None:
                inner = inner * (torch.arange(inner.shape[-1]) < self.widths[e])
            y.index_add_(0, tokens, F.linear(inner, down[e]) * weights[tokens, slot, None])
        if hasattr(self, "shared_expert"):
            gate, up, down_s, weight = (self.get_submodule(name) for name in (
                "shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert.down_proj", "shared_expert_gate"))
            y = y + torch.sigmoid(weight(h)) * down_s(F.silu(gate(h)) * up(h))
        y = y.reshape(shape)
        return (y, logits) if self.logits else y


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "relu": F.relu}
"""The expert activations the reference formula may use (each a fixed pointwise function: the gate rows keep ``S``)."""

_RECOGNISED: "weakref.WeakKeyDictionary[nn.Module, dict[bool, dict | None]]" = weakref.WeakKeyDictionary()


def recognise(module: nn.Module) -> dict[str, Any] | None:
    """The settings of a sparse MoE block, or ``None`` for a module that does not look like one.

    Looks like one: its parameters are a router ``weight (E, H)`` (one child, ``E ≥ 2``), fused experts
    ``gate_up_proj (E, 2I, H)`` and ``down_proj (E, H, I)`` (one child), and optionally a shared expert
    (``gate_proj``, ``up_proj``, ``down_proj`` without biases) with a gate ``weight (1, H)``; no forward hooks inside.
    Then its forward is compared (a float64 copy, fresh random parameters, two random inputs, its own training mode)
    with the formula in the module docstring, for each activation of :data:`_ACTIVATIONS` and with or without
    renormalised weights; the settings record the match, or ``refused`` says why none matched. Cached per module and
    training mode."""
    cached = _RECOGNISED.setdefault(module, {})
    if module.training not in cached:
        cached[module.training] = _recognise(module)
    return cached[module.training]


def _recognise(module: nn.Module) -> dict[str, Any] | None:
    roles = _roles(module)
    if roles is None or any(m._forward_hooks or m._forward_pre_hooks for m in module.modules()):
        return None
    params = dict(module.named_parameters())
    experts, hidden = params[roles["router"]].shape
    intermediate = params[roles["down"]].shape[2]
    top_k = getattr(getattr(module, roles["router"].rpartition(".")[0]), "top_k", getattr(module, "top_k", None))
    settings: dict[str, Any] = {"experts": experts, "hidden": hidden, "intermediate": intermediate, "top_k": top_k,
                                "roles": roles}
    if not (isinstance(top_k, int) and 1 <= top_k <= experts):
        return {**settings, "refused": f"its number of selected experts top_k={top_k!r} is not in [1, {experts}]"}
    try:
        match, logits = _reference_match(module, settings)
    except Exception as error:   # the module's own failure on random inputs: refused with its message
        return {**settings, "refused": f"its forward failed on random inputs ({type(error).__name__}: {error})"}
    if match is None:
        mode = " in training mode" if module.training else ""
        return {**settings, "logits": logits, "refused": f"its forward{mode} does not match a top-{top_k} softmax "
                "routing over SwiGLU experts (router noise, another routing or expert layout?)"}
    return {**settings, "logits": logits, **match}


def _roles(module: nn.Module) -> dict[str, str] | None:
    """``{role: parameter name}`` of a block's parameters by shape (see :func:`recognise`), or ``None``."""
    params = dict(module.named_parameters())
    cubes = {n: p for n, p in params.items() if p.dim() == 3}
    if len(cubes) != 2 or any(n.count(".") != 1 for n in cubes):
        return None
    (a, pa), (b, pb) = cubes.items()
    gate_up, down = (a, b) if pa.shape[1] == 2 * pb.shape[2] else (b, a)
    (experts, double, hidden), (_, hidden2, intermediate) = params[gate_up].shape, params[down].shape
    if gate_up.rpartition(".")[0] != down.rpartition(".")[0] or (double, hidden2) != (2 * intermediate, hidden) \
            or params[down].shape[0] != experts or experts < 2:
        return None
    rest = {n: p for n, p in params.items() if n not in cubes}
    shared = _shared_roles(rest, hidden)
    rest = {n: p for n, p in rest.items() if n not in (shared or {}).values()}
    routers = [n for n, p in rest.items() if n.endswith("weight") and tuple(p.shape) == (experts, hidden)]
    if len(routers) != 1 or len(rest) != 1:
        return None
    return {"router": routers[0], "gate_up": gate_up, "down": down, **(shared or {})}


def _shared_roles(rest: Mapping[str, torch.Tensor], hidden: int) -> dict[str, str] | None:
    """The shared expert (``….gate_proj.weight``, ``….up_proj.weight`` ``(S, H)``, ``….down_proj.weight (H, S)``) and
    its gate (a sibling ``weight (1, H)``) among the parameters ``rest`` besides the experts', or ``None``."""
    found = {role: [n for n in rest if n.endswith(f".{role}_proj.weight")] for role in ("gate", "up", "down")}
    if any(len(names) != 1 for names in found.values()):
        return None
    names = {role: found[role][0] for role in found}
    gates = [n for n, p in rest.items() if n not in names.values() and n.endswith("gate.weight")
             and tuple(p.shape) == (1, hidden)]
    width = rest[names["gate"]].shape[0]
    shapes = tuple(tuple(rest[names[role]].shape) for role in ("gate", "up", "down"))
    if len(gates) != 1 or shapes != ((width, hidden), (width, hidden), (hidden, width)):
        return None
    return {"shared_gate": names["gate"], "shared_up": names["up"], "shared_down": names["down"],
            "shared_weight": gates[0]}


def _reference(params: Mapping[str, torch.Tensor], roles: Mapping[str, str], x: torch.Tensor, top_k: int,
               activation: Callable[[torch.Tensor], torch.Tensor], normalise: bool) -> tuple[torch.Tensor, ...]:
    """``(y, router logits)`` of the formula in the module docstring, tokens along every axis but the last."""
    h = x.reshape(-1, x.shape[-1])
    logits = h @ params[roles["router"]].T
    probabilities = logits.softmax(-1)
    weights, chosen = probabilities.topk(top_k, dim=-1)
    if normalise:
        weights = weights / weights.sum(-1, keepdim=True)
    mixture = torch.zeros_like(probabilities).scatter(-1, chosen, weights)     # (N, E): w_e, zero off the top k
    gate, up = torch.einsum("eih,nh->nei", params[roles["gate_up"]], h).chunk(2, dim=-1)
    y = torch.einsum("ehi,nei,ne->nh", params[roles["down"]], activation(gate) * up, mixture)
    if "shared_gate" in roles:
        inner = activation(h @ params[roles["shared_gate"]].T) * (h @ params[roles["shared_up"]].T)
        y = y + torch.sigmoid(h @ params[roles["shared_weight"]].T) * (inner @ params[roles["shared_down"]].T)
    return y.reshape(x.shape), logits


def _reference_match(module: nn.Module, settings: dict[str, Any]) -> tuple[dict[str, Any] | None, bool | None]:
    """``{"activation", "normalise"}`` of the formula the module's forward matches (relative error below ``1e-6`` on
    two random inputs at fresh random parameters, in float64: routers computing the softmax in float32, as Mixtral's,
    round at ``1e-8``), or ``None``; and whether it returns ``(y, logits)`` shaped as the formula's (``True``), ``y``
    (``False``) or something else (``None``)."""
    probe = copy.deepcopy(module).double()
    hidden = settings["hidden"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for p in probe.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) / p.shape[-1] ** 0.5)
        params = dict(probe.named_parameters())
        inputs = [torch.randn(2, 3, hidden, generator=generator, dtype=torch.float64),
                  torch.randn(1, 5, hidden, generator=generator, dtype=torch.float64)]
        outputs = [probe(x) for x in inputs]
        references = {(name, normalise): [_reference(params, settings["roles"], x, settings["top_k"], activation,
                                                     normalise) for x in inputs]
                      for name, activation in _ACTIVATIONS.items() for normalise in (True, False)}
    shapes = [[tuple(t.shape) for t in reference] for reference in references[("silu", True)]]
    got = [[tuple(t.shape) for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
           for out in outputs]
    logits = True if got == shapes else False if got == [s[:1] for s in shapes] else None
    for (name, normalise), reference in references.items():
        if logits is not None and all(_matches(out, ref) for out, ref in zip(outputs, reference)):
            return {"activation": name, "normalise": normalise}, logits
    return None, logits


def _matches(out: object, reference: tuple[torch.Tensor, ...]) -> bool:
    """``out`` is ``y`` or ``(y, logits)`` of ``reference`` to a relative ``1e-6`` (shapes checked already)."""
    got = out if isinstance(out, tuple) else (out,)
    return all(a.shape == b.shape and float((a - b).norm()) <= 1e-6 * float(b.norm()) + 1e-12
               for a, b in zip(got, reference))


class MoEStack(nn.Module):
    """``fc2(block(fc1(x)))`` around a :class:`SparseMoE` block (input ``(…, 3)``, width 4, output 2); with
    ``block.logits`` it returns ``(y, router logits)``."""

    def __init__(self, block: SparseMoE) -> None:
        super().__init__()
        self.fc1, self.block, self.fc2 = nn.Linear(3, 4), block, nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out = self.block(self.fc1(x))
        return (self.fc2(out[0]), out[1]) if self.block.logits else self.fc2(out)


def _stack(train: bool = False, **options: Any) -> Example:
    """The example :class:`MoEStack` on ``x`` of shape ``(2, 5, 3)``, with ``SparseMoE(4, 3, **options)``."""
    return lambda: (MoEStack(SparseMoE(4, 3, **options)).train(train), (torch.randn(2, 5, 3),))


@register_rule("moe", capabilities=(), examples={"moe": _stack()},
               near_misses={"moe": (_stack(train=True, jitter=0.1), _stack(logits=True),
                                    _stack(normalise=False, widths=(3, 2, 3, 1)))})
def moe_rule(state: Inference, node: str, data: NodeData, inputs: Inputs) -> Value:
    """A recognised sparse MoE block (:func:`recognise`): the groups of the module docstring on its parameters."""
    settings, params = data["settings"], data["params"]
    label = _first(inputs)
    if "refused" in settings:
        for tensor in params.values():
            state.opaque.setdefault(tensor, node)
        state.restrict_label(label, set(), node, f"{state.where(node)} looks like a mixture of experts, but "
                                                 f"{settings['refused']}: not modelled", blocked=True)
        shape = state.shape(node)
        outputs = len(shape) if shape and isinstance(shape[0], tuple) else 0   # a tuple of tensors, or one
        return tuple(Label.data() for _ in range(outputs)) if outputs else Label.data()
    roles = {role: params[name] for role, name in settings["roles"].items()}
    experts, hidden, width = settings["experts"], settings["hidden"], settings["intermediate"]
    stem = data.get("module") or node
    _read_as_map(state, node, label, roles["router"], -1)
    _refuse_shifts(state, node, label, "has no bias to absorb the shift of an affine sign flip")
    readers = [(roles["gate_up"], 2)] + [(roles[r], 1) for r in ("shared_gate", "shared_up", "shared_weight")
                                          if r in roles]
    for tensor, axis in readers:
        state.bind_reader(label if label.dim == -1 else Label.data(), tensor, axis, node)
    expert_site = state.new_site(node, experts, [Binding(roles["router"], 0, 0, experts, node=node),
                                                 Binding(roles["gate_up"], 0, 0, experts, node=node),
                                                 Binding(roles["down"], 0, 0, experts, node=node)],
                                 name=f"{stem}.experts", allowed={"S"})
    _swiglu_sites(state, node, f"{stem}.experts.hidden", width,
                  Binding(roles["gate_up"], 1, 0, width, node=node), Binding(roles["gate_up"], 1, width, width,
                                                                              node=node),
                  Binding(roles["down"], 2, 0, width, role="in", node=node))
    rows = [Binding(roles["down"], 1, 0, hidden, node=node)]
    if "shared_gate" in roles:
        shared = state.shapes[roles["shared_gate"]][0]
        _swiglu_sites(state, node, f"{stem}.shared_expert", shared, Binding(roles["shared_gate"], 0, 0, shared,
                                                                            node=node),
                      Binding(roles["shared_up"], 0, 0, shared, node=node),
                      Binding(roles["shared_down"], 1, 0, shared, role="in", node=node))
        rows.append(Binding(roles["shared_down"], 0, 0, hidden, node=node))
    output = state.new_site(node, hidden, rows, name=stem, allowed=ALL - TRANSLATIONS)
    value = Label(-1, hidden, (Segment(output, 0, hidden),))
    return (value, Label(-1, experts, (Segment(expert_site, 0, experts),))) if settings["logits"] else value


def _swiglu_sites(state: Inference, node: str, name: str, width: int, gate: Binding, up: Binding,
                  down: Binding) -> None:
    """``D (σ(G x) ⊙ U x)``: ``S`` on the gate rows (any pointwise ``σ``), ``PS``, ``SF`` and ``S`` on the up rows
    against the down columns (:mod:`symalg.catalogue.products`), one permutation moving both."""
    gate_site = state.new_site(node, width, [gate, down], name=f"{name}.gate", allowed={"S"})
    up_site = state.new_site(node, width, [up, down], name=f"{name}.up", allowed={"PS", "SF", "S"})
    state.tie_permutations(gate_site, up_site)
