"""The torch.fx front end: any ``nn.Module`` → a :class:`ModelGraph` of canonical ops.

:func:`trace` runs ``torch.fx`` symbolic tracing, keeping torch's own layers (``nn.Linear``,
``nn.MultiheadAttention``, norm layers, ...) as single nodes and tracing through its composite layers the catalogue
does not spell (``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``: their attention, linear, norm and
dropout layers), and falls back to ``torch.export`` when fx cannot trace the model or one of those layers (a mask
makes their forward branch on a traced value; the graph keeps fx's reason, and the input shapes the exported graph
holds for); if both fail the error says why and where. Example
inputs are positional and keyword (``trace(model, input_ids=ids, use_cache=False)``), and every tensor the
model returns is an output (:mod:`symalg.frontend.outputs`). Every spelling of an op
(``nn.ReLU``, ``F.relu``, ``torch.relu``, ``x.relu()``, ``x.relu_()``) becomes one canonical name, and
with ``example_inputs`` a shape-propagation pass records every value's shape. Activation spellings come
from the catalogue (:mod:`symalg.frontend.canonical`); the tables here hold the structural ops.

The graph it emits is the one IR, :class:`~symalg.ir.graph.ModelGraph` (schema there); node names are fx node
names, in data-flow order, and ``where`` reads ``"node 'relu_1' (F.relu)"``.

One edge ``u → v`` however often ``v`` reads ``u`` (``inputs`` has every position). ``x.T`` is a
``permute`` reversing every axis (``transpose`` for a matrix), ``x.mT`` a ``transpose`` of the last two;
unused guard and assertion calls (``torch.export``'s ``_guards_fn``, ``torch._assert``) are dropped.

Hand-written attention (``q/k/v`` linears split into heads, then ``F.scaled_dot_product_attention``
or ``softmax(Q Kᵀ/√d) V``, merged back) is folded into one ``attention`` node with inputs ``q, k, v`` (then
the masks, biases and temperatures its scores meet) and ``settings["heads"]``; folding needs example inputs to
read the head layout.

Example
-------
>>> import torch, symalg
>>> class Net(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc1, self.fc2 = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
...     def forward(self, x):
...         return self.fc2(torch.relu(self.fc1(x)))
>>> g = symalg.trace(Net(), (torch.zeros(5, 3),))
>>> [g.graph.nodes[v]["op"] for v in g.graph]
['input', 'linear', 'relu', 'linear', 'output']
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import io
import logging
import operator
from dataclasses import is_dataclass
from typing import Any, Callable, Mapping

import networkx as nx
import torch
import torch.fx
from torch.fx.operator_schemas import get_signature_for_torch_op

from symalg.catalogue.activations import CATALOGUE
from symalg.catalogue.rules import spelling_table
from symalg.catalogue.rules.moe import recognise as recognise_moe
from symalg.errors import SpecError, TracingError
from symalg.frontend.attention_folding import fold_attention as fold_attention_pass
from symalg.frontend.export_shapes import InputShapes, export_dynamic, input_shapes, static_shapes
from symalg.frontend.outputs import output_hint, output_tensors
from symalg.frontend.rms_norm_folding import fold_rms_norm
from symalg.frontend.swish_folding import fold_swish_beta
from symalg.ir.graph import ModelGraph
from symalg.frontend.canonical import IN_PLACE_FUNCTIONS, IN_PLACE_METHODS, call_activation, module_activation, \
    opaque_module_name
from symalg.catalogue.modules import Activation

__all__ = ["ModelGraph", "trace", "canonical_module_op"]

logger = logging.getLogger(__name__)

nn = torch.nn

_SPELLINGS = spelling_table()
"""The structural ops' spellings, from the op-rule registry (:mod:`symalg.catalogue.rules.registry`; activation
spellings come from the catalogue)."""
_MODULE_OPS = _SPELLINGS.modules
"""``{module class: op}``."""
_FUNCTIONS = _SPELLINGS.functions
"""``{function: op}``."""
_METHODS = _SPELLINGS.methods
"""``{tensor method: op}``."""
_ATEN = _SPELLINGS.aten
"""``{ATen overload packet name: op}``."""

_IN_PLACE = {method for method in _METHODS if method.endswith("_")} | IN_PLACE_METHODS

def canonical_module_op(module: nn.Module) -> tuple[str, dict]:
    """``(canonical op, settings)`` of a module; activation modules map to catalogue names.

    >>> canonical_module_op(torch.nn.LeakyReLU(0.2))
    ('leaky_relu', {'slope': 1/5})
    """
    known = module_activation(module)
    if known is not None:
        return known
    moe = recognise_moe(module)
    if moe is not None:
        return "moe", moe
    if type(module) in _MODULE_OPS:
        return _MODULE_OPS[type(module)], _module_settings(module)
    return opaque_module_name(module), {}


def _module_settings(module: nn.Module) -> dict:
    settings = {}
    for key in ("eps", "groups", "training", "track_running_stats", "elementwise_affine", "num_heads",
                "batch_first", "start_dim", "end_dim", "dim", "p", "padding_idx", "num_groups", "normalized_shape",
                "max_norm"):
        if hasattr(module, key):
            settings[key] = getattr(module, key)
    if isinstance(module, nn.MultiheadAttention):
        settings.update(same_embed=module._qkv_same_embed_dim, bias_kv=module.bias_k is not None,
                        add_zero_attn=module.add_zero_attn, dropout=module.dropout)
    if isinstance(module, nn.RNNBase):   # what aten.lstm/gru/rnn_* take as arguments, named as the module's
        settings.update(mode=module.mode, num_layers=module.num_layers, bidirectional=module.bidirectional,
                        proj_size=module.proj_size, bias=module.bias, dropout=module.dropout)
    settings.update(_SPELLINGS.settings.get(type(module), {}))   # a pooling layer's pooled_dims
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        settings.update(padding_mode=module.padding_mode, in_channels=module.in_channels,
                        out_channels=module.out_channels, padding=module.padding)
    return settings


class _Tracer(torch.fx.Tracer):
    """fx tracer keeping torch's own modules as single nodes, except containers, modules with forward hooks,
    parametrized modules (a hook, as the hook-based ``torch.nn.utils.weight_norm`` computing ``weight`` from
    ``weight_g`` and ``weight_v``, or a parametrization is traced with the forward it changes) and torch's composite
    layers the catalogue does not spell (:func:`_opens`: ``nn.TransformerEncoderLayer``, ``nn.Transformer``...),
    which are traced through into the layers they are made of. Where fx cannot trace such a layer (its forward
    branches on a traced value: ``if src.dim() != 3``), the nodes it had recorded are taken back and the layer is
    kept as one opaque node; ``closed`` maps its qualified name to fx's reason."""

    def __init__(self) -> None:
        super().__init__()
        self.closed: dict[str, str] = {}
        self.taken_back: list[torch.fx.Node] = []  # parameter reads of a layer taken back (fx caches their proxies)

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        if isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) or module._forward_pre_hooks \
                or module._forward_hooks or nn.utils.parametrize.is_parametrized(module) \
                or type(module).__module__ == "torch.nn.utils.parametrizations":   # computes a weight (_WeightNorm)
            return False
        if _opens(module) and qualified_name not in self.closed:
            return False
        return isinstance(module, Activation) or recognise_moe(module) is not None \
            or super().is_leaf_module(module, qualified_name)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """Trace through a layer :func:`_opens`; where that fails, take its nodes back and record it as one node."""
        name = self.path_of_module(m)
        if not _opens(m) or name in self.closed:
            return super().call_module(m, forward, args, kwargs)
        recorded = len(self.graph.nodes)
        stack, calls = list(self.module_stack.items()), dict(self.num_calls)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as error:  # fx's failure inside torch's own layer (which ran eagerly): keep it closed
            for node in reversed(list(self.graph.nodes)[recorded:]):
                if node.op == "get_attr":
                    self.taken_back.append(node)
                else:
                    self.graph.erase_node(node)
            self.module_stack.clear()
            self.module_stack.update(stack)
            self.num_calls = calls
            self.closed[name] = _failure(error)
            proxy = super().call_module(m, forward, args, kwargs)
            proxy.node.meta["closed"] = f"torch.fx cannot trace through {type(m).__name__}: {self.closed[name]}"
            return proxy


def _opens(module: nn.Module) -> bool:
    """True for a torch layer fx traces through rather than keeping as one node: one of torch's own modules that the
    catalogue does not spell (no rule reads it as a whole) and that is made of other modules
    (``nn.TransformerEncoderLayer``: a ``MultiheadAttention``, ``Linear``, ``LayerNorm`` and ``Dropout`` layers).

    >>> _opens(torch.nn.TransformerEncoderLayer(8, 2)), _opens(torch.nn.MultiheadAttention(8, 2))
    (True, False)
    """
    return type(module).__module__.startswith("torch.nn.") and type(module) not in _MODULE_OPS \
        and not isinstance(module, Activation) and module_activation(module) is None \
        and next(module.children(), None) is not None


@contextlib.contextmanager
def _decomposed_layers() -> Any:
    """Trace torch's attention layers along their decomposed path: their eval-mode fast path (one fused
    ``torch._transformer_encoder_layer_fwd`` or ``torch._native_multi_head_attention`` call, which no rule reads) is
    switched off while tracing, and the setting restored. (Under ``torch.export`` the fake tensors already skip it;
    under fx its guard ``src.dim() != 3`` would stop the trace.) Both paths compute the same function."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


def _where(node: torch.fx.Node) -> str:
    """``"node 'relu_1' (call_function relu)"``, with fx's reason for a torch layer it could not trace through."""
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    closed = f"; {node.meta['closed']}" if "closed" in node.meta else ""
    return f"node {node.name!r} ({node.op} {target}{closed})"


def _canonical_params(model: nn.Module) -> tuple[dict[str, str], dict[int, str]]:
    """``{alias: canonical name}`` for tied parameters, and ``{id(tensor): canonical name}``."""
    by_id: dict[int, str] = {}
    aliases = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        canonical = by_id.setdefault(id(tensor), name)
        if canonical != name:
            aliases[name] = canonical
    for name, buffer in model.named_buffers(remove_duplicate=False):
        by_id.setdefault(id(buffer), name)
    return aliases, by_id


def _signature(model: nn.Module) -> inspect.Signature | None:
    """``model.forward``'s signature, or ``None`` where it has none (a builtin)."""
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def _bound(model: nn.Module, args: tuple, kwargs: Mapping[str, object]) -> inspect.BoundArguments | None:
    """The example inputs bound to ``model.forward``'s parameters, defaults applied; ``None`` where forward has
    no signature or takes ``*args``/``**kwargs`` (then nothing is specialised)."""
    signature = _signature(model)
    if signature is None or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in signature.parameters.values()):
        return None
    bound = signature.bind(*args, **kwargs)  # (checked by _check_example_inputs)
    bound.apply_defaults()
    return bound


def _constants(model: nn.Module, args: tuple | None, kwargs: Mapping[str, object]) -> dict[str, object]:
    """The plain non-tensor inputs of the example run (:data:`_CONSTANTS`), defaults included (``use_cache=True``,
    ``mask=None``): fx traces them as the constants they are, so ``if use_cache:`` takes the branch the example
    run took."""
    bound = _bound(model, args, kwargs) if args is not None else None
    values = kwargs if bound is None else bound.arguments
    return {k: v for k, v in values.items() if isinstance(v, _CONSTANTS)}


def _fx_graph(model: nn.Module, constants: Mapping[str, object]) -> tuple[torch.fx.GraphModule, dict[str, str]]:
    """fx's graph of ``model``, specialised on the constant keyword inputs (``use_cache=False``), and the torch
    layers fx could not trace through (:class:`_Tracer`: ``{qualified name: fx's reason}``). A forward hook
    may set a plain tensor attribute (weight_norm's ``weight``): it would hold fx's proxy after the trace, so its
    value before the trace is put back."""
    hooked = [(module, {k: v for k, v in vars(module).items() if isinstance(v, torch.Tensor)})
              for module in model.modules() if module._forward_pre_hooks or module._forward_hooks]
    tracer = _Tracer()
    for module in model.modules():   # recognised before tracing: the check runs the block, which fx's patches forbid
        recognise_moe(module)
    try:
        with _decomposed_layers():
            graph = tracer.trace(model, concrete_args=dict(constants) or None)
    finally:
        for module, attributes in hooked:
            vars(module).update(attributes)
    for node in tracer.taken_back:
        if not node.users:
            graph.erase_node(node)
    return torch.fx.GraphModule(tracer.root, graph), tracer.closed


def _flat_outputs(model: nn.Module) -> nn.Module:
    """A shallow copy of ``model`` (same submodules, parameters and signature) whose ``forward`` returns the
    tuple of :func:`~symalg.frontend.outputs.output_tensors`: ``torch.export`` then accepts any output
    structure (a ``ModelOutput`` holding a ``DynamicCache``), its graph's outputs follow the paths of
    ``output_tensors``, and parameter and module names are the model's own."""
    forward = model.forward

    @functools.wraps(forward)
    def flat_forward(*args: object, **kwargs: object) -> tuple:
        return tuple(tensor for _, tensor in output_tensors(forward(*args, **kwargs)))

    flat = copy.copy(model)
    object.__setattr__(flat, "forward", flat_forward)  # an instance attribute: the model itself is untouched
    return flat


def _export_graph(model: nn.Module, args: tuple, kwargs: Mapping[str, object]) -> tuple[torch.fx.GraphModule,
                                                                                        InputShapes]:
    """``torch.export``'s graph at the example's shapes (non-strict: the model's Python runs as written, on fake
    tensors) and the input shapes it holds for, read off an export at dynamic shapes
    (:func:`~symalg.frontend.export_shapes.export_dynamic`; where that one fails, every axis is fixed). The static
    graph is the one analysed: the dynamic one computes sizes in the graph (``sym_size``), which slices and
    selections read differently."""
    flat = _flat_outputs(model)
    with _decomposed_layers(), _moe_blocks_as_ops(model):
        static = torch.export.export(flat, tuple(args), dict(kwargs), strict=False)
    try:
        with _decomposed_layers(), _moe_blocks_as_ops(model):
            dynamic = export_dynamic(flat, tuple(args), dict(kwargs))
    except Exception as error:  # export's own failure at dynamic shapes: the graph holds at the example's only
        return static.module(), static_shapes(static, _failure(error))
    return static.module(), input_shapes(dynamic)


# -- mixture-of-experts blocks: one node (symalg.catalogue.rules.moe) ---------------------------------------------
_MOE_BLOCKS: dict[int, tuple[nn.Module, Callable[..., Any], dict[str, Any]]] = {}
"""``{id: (block, its own forward, its settings)}`` of the MoE blocks :func:`_moe_blocks_as_ops` hands to
``torch.export`` as ``symalg::moe`` calls (while it exports)."""


@torch.library.custom_op("symalg::moe", mutates_args=())
def _moe_op(x: torch.Tensor, block: int) -> torch.Tensor:
    """The MoE block ``block`` (a key of :data:`_MOE_BLOCKS`) on ``x``, run as written: one opaque call for export."""
    return _MOE_BLOCKS[block][1](x).clone()


@_moe_op.register_fake
def _moe_fake(x: torch.Tensor, block: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("symalg::moe_logits", mutates_args=())
def _moe_logits_op(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_moe_op` for a block returning ``(y, router logits)``."""
    y, logits = _MOE_BLOCKS[block][1](x)
    return y.clone(), logits.clone()


@_moe_logits_op.register_fake
def _moe_logits_fake(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    experts = _MOE_BLOCKS[block][2]["experts"]   # (tokens, E), as the recognition checked
    return torch.empty_like(x), x.new_empty((x.numel() // x.shape[-1], experts))


_MOE_OPS = {torch.ops.symalg.moe.default, torch.ops.symalg.moe_logits.default}


@contextlib.contextmanager
def _moe_blocks_as_ops(model: nn.Module) -> Any:
    """While exporting, every block :func:`~symalg.catalogue.rules.moe.recognise` finds with outputs of known shapes
    (``y``, or ``(y, logits)``) is called as one ``symalg::moe`` (or ``symalg::moe_logits``) op: its routing is
    data-dependent, export cannot trace it; fx keeps it as one module node. The forwards are restored afterwards."""
    opened = []
    for block in model.modules():
        settings = recognise_moe(block)
        if settings is not None and settings.get("logits") is not None:
            _MOE_BLOCKS[id(block)] = (block, block.forward, settings)
            object.__setattr__(block, "forward", functools.partial(_moe_call, id(block)))
            opened.append(block)
    try:
        yield
    finally:
        for block in opened:
            del _MOE_BLOCKS[id(block)]
            object.__delattr__(block, "forward")


def _moe_call(block: int, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``symalg::moe(x, block)`` for a block called on one tensor; any other call runs its forward as written."""
    _, forward, settings = _MOE_BLOCKS[block]
    if args or kwargs:
        return forward(x, *args, **kwargs)
    return (torch.ops.symalg.moe_logits if settings["logits"] else torch.ops.symalg.moe)(x, block)


def _moe_record(node: torch.fx.Node, model: nn.Module, by_id: Mapping[int, str]) -> dict:
    """The record of a ``symalg::moe`` call (its second argument the block's ``id``), as fx records the block's module
    node."""
    block = next(m for m in model.modules() if id(m) == node.args[1])
    name = next(n for n, m in model.named_modules() if m is block)
    return dict(op="moe", kind="module", module=name, settings=recognise_moe(block), instance=block,
                params={role: by_id.get(id(t), f"{name}.{role}") for role, t in block.named_parameters()},
                where=f"node {node.name!r} (mixture of experts {name!r}, {type(block).__name__})")


def _failure(error: Exception) -> str:
    """``"Type: first line of the message"``."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def _exported(model: nn.Module, args: tuple, kwargs: Mapping[str, object]) -> tuple[torch.fx.GraphModule, InputShapes]:
    """``torch.export``'s graph of ``model`` and the input shapes it holds for, or a
    :class:`~symalg.errors.TracingError` with export's reason."""
    try:
        return _export_graph(model, args, kwargs)
    except Exception as error:  # export's own failure, reported with its first line
        raise TracingError(f"trace: torch.export failed on {type(model).__name__} ({_failure(error)})") from error


def _traced(model: nn.Module, args: tuple | None, kwargs: Mapping[str, object],
            tracer: str) -> tuple[torch.fx.GraphModule, str, str, InputShapes]:
    """``(graph, tracer used, why, input shapes it holds for)``: fx's graph (which records ops, not sizes: every
    shape), else (``tracer="auto"`` with example inputs) export's, with fx's failure as the reason; the error names
    both failures. Where fx kept one of torch's composite layers closed (:class:`_Tracer`), ``"auto"`` takes export's
    graph, which sees inside it, and keeps fx's (the layer one opaque node) only when export fails; ``why`` names the
    layer and both reasons."""
    try:
        gm, closed = _fx_graph(model, _constants(model, args, kwargs))
    except Exception as fx_error:  # fx's own failure, reported with the export one below
        if tracer == "fx" or args is None:
            hint = "" if tracer == "fx" else "; pass example_inputs to try torch.export instead"
            raise TracingError(f"trace: torch.fx cannot trace {type(model).__name__}: {fx_error}{hint}") from fx_error
        logger.info("trace: torch.fx cannot trace %s (%s); trying torch.export", type(model).__name__,
                    _failure(fx_error))
        try:
            gm, shapes = _export_graph(model, args, kwargs)
            return gm, "export", f"torch.fx failed ({_failure(fx_error)})", shapes
        except Exception as export_error:
            raise TracingError(f"trace: torch.fx cannot trace {type(model).__name__} ({_failure(fx_error)}) "
                               f"and torch.export failed too ({_failure(export_error)})") from export_error
    if not closed:
        return gm, "fx", "", InputShapes((), ())
    why = "; ".join(f"torch.fx cannot trace through module {name!r} ({type(model.get_submodule(name)).__name__}: "
                    f"{reason})" for name, reason in closed.items())
    if tracer == "fx" or args is None:
        hint = "tracer='export' lets" if tracer == "fx" else "example inputs let"
        return gm, "fx", f"{why}; it is one opaque node ({hint} torch.export see inside it)", InputShapes((), ())
    try:
        exported, shapes = _export_graph(model, args, kwargs)
        return exported, "export", why, shapes
    except Exception as export_error:  # the layer stays one opaque node of fx's graph, and the note says why
        return gm, "fx", f"{why}, and torch.export failed ({_failure(export_error)}): it is one opaque node", \
            InputShapes((), ())


def _function_op(node: torch.fx.Node, gm: torch.fx.GraphModule) -> tuple[str, dict]:
    """Canonical op and settings of a ``call_function``/``call_method`` node: a catalogue activation
    (with its hyper-parameters as settings) when an entry spells the callee, else a structural op.
    A callee nobody spells keeps its name, qualified where the bare name is a catalogue entry's (a
    function that happens to be called ``relu`` is not the catalogue's ``relu``)."""
    target = node.target
    aten = isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
    spelling = "method" if node.op == "call_method" else "aten" if aten else "function"
    if not _is_pack(node):
        known = call_activation(spelling, target, _bound_arguments(node, gm))
        if known is not None:
            return known
    if _is_float_cast(node, aten):
        return "identity", {"cast": True}
    if node.op == "call_method":
        method = str(target)  # fx names a called method by a string
        return _METHODS.get(method) or (method if method not in CATALOGUE else f"Tensor.{method}"), {"method": method}
    if _is_pack(node) and isinstance(target, type):  # a pack's target is always a class
        return "pack", {"container": target.__name__}
    if target in _FUNCTIONS:
        return _FUNCTIONS[target], dict(_SPELLINGS.settings.get(target, {}))
    if aten:
        name = target.__name__.split(".")[0] if hasattr(target, "__name__") else str(target)
        return (_ATEN[name], dict(_SPELLINGS.settings.get(name, {}))) if name in _ATEN else (f"aten.{name}", {})
    name = getattr(target, "__name__", str(target))
    return (name if name not in CATALOGUE else f"{getattr(target, '__module__', '')}.{name}"), {}


def _is_float_cast(node: torch.fx.Node, aten: bool) -> bool:
    """True for ``x.to(...)`` (``aten.to``, ``aten._to_copy``) whose result is floating point (by shape propagation,
    else by a floating dtype among the arguments, or none): it changes no value beyond rounding, so every action
    passes. A cast to integers, or of unknown result, is not one."""
    target = node.target
    name = (getattr(target, "__name__", str(target)).split(".")[0] if aten else
            str(target) if node.op == "call_method" else None)
    if name not in ("to", "_to_copy"):
        return False
    value = node.meta.get("tensor_meta", node.meta.get("val"))
    if value is not None and hasattr(value, "dtype"):
        return bool(value.dtype.is_floating_point)
    values = [*node.args[1:], *node.kwargs.values()]
    return not any(isinstance(v, torch.fx.Node) for v in values) and \
        all(v.is_floating_point for v in values if isinstance(v, torch.dtype))


def _is_pack(node: torch.fx.Node) -> bool:
    """True for the constructor of a dataclass or named tuple (fx records ``return Output(y=...)`` as a call
    of the class): a container of values, not an op."""
    target = node.target
    return node.op == "call_function" and isinstance(target, type) and (
        is_dataclass(target) or issubclass(target, tuple) and hasattr(target, "_fields"))


def _node_record(node: torch.fx.Node, gm: torch.fx.GraphModule, by_id: Mapping[int, str]) -> dict:
    record: dict[str, Any] = dict(op=node.op, kind="function", module=None, params={}, buffers={}, settings={},
                                  where=_where(node), shape=None)
    if node.op == "placeholder":
        record.update(op="input", kind="input")
    elif node.op == "output":
        record.update(op="output", kind="output")
    elif node.op == "get_attr":
        tensor = _attribute(gm, str(node.target))
        if isinstance(tensor, nn.Parameter):
            record.update(op="param", kind="param", params={"value": by_id.get(id(tensor), node.target)})
        elif isinstance(tensor, torch.Tensor) and id(tensor) in by_id:
            record.update(op="buffer", kind="constant", buffers={"value": by_id[id(tensor)]})
        else:
            record.update(op="constant", kind="constant")
    elif node.op == "call_module":
        name = str(node.target)  # fx names a called module by a string
        module = gm.get_submodule(name)
        op, settings = canonical_module_op(module)
        record.update(op=op, kind="module", module=name, settings=settings,
                      params={role: by_id.get(id(t), f"{name}.{role}")
                              for role, t in module.named_parameters(recurse=True)},
                      buffers={role: by_id.get(id(t), f"{name}.{role}")
                               for role, t in module.named_buffers(recurse=True)})
        if getattr(module, "inplace", False):
            record["settings"]["inplace"] = True
        record["instance"] = module
    else:
        op, settings = _function_op(node, gm)
        record.update(op=op, settings=settings)
        if op in _LAYER_SETTINGS:
            record.update(_layer_operands(node, gm, by_id, op))
        if node.op == "call_method" and node.target in _IN_PLACE:
            record["settings"]["inplace"] = True
    if ALIASED_IN_PLACE in node.meta:   # not its functional op: no rule reads it, and the note says why
        record["op"] = f"{_callee_name(node, gm)} in place ({node.meta[ALIASED_IN_PLACE]})"
    return record


def _callee_name(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str:
    """``aten.add_``, ``relu_``, ``iadd`` or the module's class: the callee as written."""
    target = node.target
    if node.op == "call_module":
        return type(gm.get_submodule(str(target))).__name__
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__.split('.')[0]}"
    return str(target) if node.op == "call_method" else getattr(target, "__name__", str(target))


_LAYER_SETTINGS = _SPELLINGS.arguments
"""The settings a layer called as a function (``F.layer_norm``, ``aten.conv1d``) reads off its arguments, named as
the module's attributes (:attr:`~symalg.catalogue.rules.OpSpellings.arguments`)."""
_LAYER_TENSORS = ("weight", "bias", "running_mean", "running_var")


def _layer_operands(node: torch.fx.Node, gm: torch.fx.GraphModule, by_id: Mapping[int, str], op: str) -> dict:
    """``params``, ``buffers`` and ``settings`` of a layer called as a function, as its module would record them:
    every weight operand that is a parameter or buffer read directly, by its role (``weight``, ``bias``,
    ``running_mean``, ``running_var``), and the settings among the arguments. A weight computed in ``forward``
    is recorded under no role, so the op's rule finds an operand it cannot place and treats the call as unknown.

    ``aten.embedding(weight, indices)`` and ``F.embedding(indices, weight)`` both give ``params={"weight": ...}``;
    ``aten.batch_norm`` on running buffers gives ``track_running_stats``, a convolution its channels."""
    arguments = _bound_arguments(node, gm)
    params: dict[str, str] = {}
    buffers: dict[str, str] = {}
    for role in _LAYER_TENSORS:
        value = arguments.get(role)
        if isinstance(value, torch.fx.Node) and value.op == "get_attr":
            tensor = _attribute(gm, str(value.target))
            if isinstance(tensor, torch.Tensor) and id(tensor) in by_id:
                (params if isinstance(tensor, nn.Parameter) else buffers)[role] = by_id[id(tensor)]
    settings = {key: tuple(value) if isinstance(value, list) else value
                for key, value in arguments.items() if key in _LAYER_SETTINGS[op]}
    if op == "batch_norm":
        settings["track_running_stats"] = arguments.get("running_mean") is not None
    if op == "embedding" and settings.get("padding_idx") == -1:  # aten's "no padding index"
        settings["padding_idx"] = None
    weight = arguments.get("weight")
    if op == "conv" and isinstance(weight, torch.fx.Node):
        shape = _shape_of(weight.meta)
        if shape is None and weight.op == "get_attr":
            attribute = _attribute(gm, str(weight.target))
            shape = tuple(attribute.shape) if isinstance(attribute, torch.Tensor) else None
        if shape is not None:
            settings.update(padding_mode="zeros", out_channels=shape[0], in_channels=shape[1] * settings["groups"])
    return {"params": params, "buffers": buffers, "settings": settings}


def _attribute(gm: nn.Module, target: str) -> object:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _constant_args(node: torch.fx.Node) -> dict:
    """The non-tensor arguments of a node by position/keyword (``dim``, ``shape``, ``approximate``...)."""
    def plain(value: object) -> object:
        if isinstance(value, torch.fx.Node):
            return None
        if isinstance(value, (list, tuple)):
            return type(value)(plain(v) for v in value)
        return value

    arguments = {f"arg{i}": plain(a) for i, a in enumerate(node.args)}
    arguments.update({k: plain(v) for k, v in node.kwargs.items()})
    return arguments


def _tensor_inputs(node: torch.fx.Node, gm: torch.fx.GraphModule) -> list[torch.fx.Node | None]:
    """Input nodes in the callee's argument order (keywords included), flattening lists
    (``torch.cat([a, b])``); ``None`` for a constant operand (``x * 2``). Numbers passed for
    parameters typed without ``Tensor``/``Number`` (``dim: int``, ``eps: float``) are settings, not inputs.
    The output and output containers (``pack``) list every node of their nested structure (tuples,
    lists, dicts, dataclasses): every tensor a model returns is an output."""
    if node.op == "output" or _is_pack(node):
        nested: list[torch.fx.Node | None] = []
        torch.fx.node.map_arg((node.args, node.kwargs), nested.append)
        return nested
    inputs: list[torch.fx.Node | None] = []
    for value, operand in _ordered_arguments(node, gm):
        if isinstance(value, torch.fx.Node):
            inputs.append(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
            inputs.extend(v if isinstance(v, torch.fx.Node) else None for v in value)
        elif operand and isinstance(value, (int, float, torch.Tensor)) and not isinstance(value, bool):
            inputs.append(None)
    return inputs


def _binding(node: torch.fx.Node, gm: torch.fx.GraphModule) -> tuple[inspect.Signature, inspect.BoundArguments] | None:
    """The first signature of the callee that binds the node's arguments, and the binding; ``None`` when
    none does (an unknown callee)."""
    for signature in _signatures(node, gm):
        try:
            return signature, signature.bind(*node.args, **node.kwargs)
        except TypeError:
            continue
    return None


def _bound_arguments(node: torch.fx.Node, gm: torch.fx.GraphModule) -> dict:
    """``{parameter name: value}`` of a call, defaults included (``{}`` when no signature binds it)."""
    binding = _binding(node, gm)
    if binding is None:
        return {}
    bound = binding[1]
    bound.apply_defaults()
    return dict(bound.arguments)


def _ordered_arguments(node: torch.fx.Node, gm: torch.fx.GraphModule) -> list[tuple[object, bool]]:
    """``(value, may be a tensor operand)`` per argument, in the order of the first signature of the
    callee that binds them; positional then keyword order when none does (an unknown callee)."""
    binding = _binding(node, gm)
    if binding is not None:
        signature, bound = binding
        ordered = []
        for name, value in bound.arguments.items():
            parameter = signature.parameters[name]
            annotation = parameter.annotation
            operand = annotation is inspect.Parameter.empty or any(t in str(annotation) for t in ("Tensor", "Number"))
            if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                ordered += [(v, operand) for v in value]
            elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
                ordered += [(v, operand) for v in value.values()]
            else:
                ordered.append((value, operand))
        return ordered
    return [(value, True) for value in (*node.args, *node.kwargs.values())]


def _signatures(node: torch.fx.Node, gm: torch.fx.GraphModule) -> list[inspect.Signature]:
    """The callee's signatures (one per overload; ``x.add(y)`` binds like ``torch.add(x, y)``), or ``[]``."""
    callee: object
    if node.op == "call_module":
        callee = gm.get_submodule(str(node.target)).forward
    elif node.op == "call_method":
        callee = getattr(torch, str(node.target), None)
    elif node.op == "call_function":
        callee = node.target
    else:
        return []
    if not callable(callee):
        return []
    signatures = get_signature_for_torch_op(callee)
    if signatures:
        return signatures
    try:
        return [inspect.signature(callee)]
    except (TypeError, ValueError):
        return []


def _shape_of(meta: Mapping[str, Any]) -> tuple | None:
    value = meta.get("tensor_meta", meta.get("val"))
    if value is None:
        return None
    if hasattr(value, "shape"):
        return tuple(int(s) for s in value.shape)
    if isinstance(value, (list, tuple)):
        return tuple(_shape_of({"val": v}) if not hasattr(v, "shape") else tuple(int(s) for s in v.shape)
                     for v in value)
    return None


_IN_PLACE_OPERATORS = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv})
_ALIASING_CALLS = frozenset({"dropout", "alpha_dropout", "feature_alpha_dropout", "identity"})
"""Callees that may return their input itself (dropout off) although ATen's schema gives a fresh tensor."""
_ALIASING_MODULES = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                     nn.FeatureAlphaDropout, nn.Flatten, nn.Unflatten)
ALIASED_IN_PLACE = "symalg_aliased_in_place"
"""``node.meta`` key of an in-place op left as it is: the reason (its tensor is a view, or is viewed)."""


def _in_place(node: torch.fx.Node, gm: torch.fx.GraphModule) -> bool:
    """True for an op writing its first argument: fx's in-place methods, functions, ``x += y`` and modules with
    ``inplace=True``, and any ATen overload whose schema writes its first argument (export's ``aten.add_``)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        arguments = target._schema.arguments
        return bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
    return (node.op == "call_method" and target in _IN_PLACE) or \
        (node.op == "call_function" and target in IN_PLACE_FUNCTIONS | _IN_PLACE_OPERATORS) or \
        (node.op == "call_module" and getattr(gm.get_submodule(str(target)), "inplace", False)) or \
        (node.op == "call_function" and bool(node.kwargs.get("inplace", False)))


def _returns_alias(node: torch.fx.Node, gm: torch.fx.GraphModule) -> bool:
    """True when ``node``'s result may share memory with an input (a view: ``view``, ``transpose``, indexing,
    ``reshape``, a dropout that is off, ``nn.Identity``), by ATen's schema of the callee where it has one
    (``Tensor(a)`` returned, nothing written); indexing and unknown module kinds above count as views."""
    target = node.target
    if node.op == "call_module":
        return isinstance(gm.get_submodule(str(target)), _ALIASING_MODULES)
    if node.op not in ("call_function", "call_method") or _in_place(node, gm):
        return False
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):
        schemas = [target._schema]
    else:
        name = str(target) if node.op == "call_method" else getattr(target, "__name__", "")
        if name in _ALIASING_CALLS:
            return True
        packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
        schemas = [getattr(packet, o)._schema for o in packet.overloads()] if \
            isinstance(packet, torch._ops.OpOverloadPacket) else []
    return any(r.alias_info is not None and not r.alias_info.is_write for schema in schemas for r in schema.returns)


def _aliasing_conflict(node: torch.fx.Node, gm: torch.fx.GraphModule) -> str | None:
    """Why the in-place ``node`` is not its functional op, or ``None``. The tensor it writes is followed back through
    earlier in-place ops to the value that made it; reading the write as a new value is exact unless that value is a
    parameter or buffer (the model's state changes), a view of another tensor (which the write changes too), or is
    viewed by another node (whose readers would see the write)."""
    chain = [node]
    while isinstance(chain[-1].args[0], torch.fx.Node) and _in_place(chain[-1].args[0], gm):
        chain.append(chain[-1].args[0])
    root = chain[-1].args[0]
    assert isinstance(root, torch.fx.Node)  # (checked by the caller)
    if root.op == "get_attr":
        return f"it writes the model's tensor {root.target!r}"
    if _returns_alias(root, gm):
        return f"it writes node {root.name!r}, a view of another tensor"
    for value in (root, *chain[1:]):
        for user in value.users:
            if user not in chain and _returns_alias(user, gm):
                return f"node {user.name!r} is a view of the tensor it writes"
    return None


def _redirect_in_place(gm: torch.fx.GraphModule) -> None:
    """After ``y = x.relu_()`` (``aten.add_(x, r)``, ``x += r``), later readers of ``x`` see the mutated tensor: make
    them read ``y``, which is then the functional op's result. Where that is not exact (:func:`_aliasing_conflict`)
    the node keeps its in-place name (no rule reads it) and ``node.meta[ALIASED_IN_PLACE]`` the reason."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if not node.args or not isinstance(node.args[0], torch.fx.Node) or not _in_place(node, gm):
            continue
        conflict = _aliasing_conflict(node, gm)
        if conflict is not None:
            node.meta[ALIASED_IN_PLACE] = conflict
            continue
        source = node.args[0]
        for user in list(source.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(source, node)


def _check_modules(model: nn.Module) -> None:
    """Refuse lazy modules not initialised yet, TorchScript modules (compiled code neither tracer reads),
    complex parameters (symalg's groups act over the reals) and parameters with no entries (a layer of width 0
    has no neuron for a group to move: ``nn.Linear(3, 0)`` would give a site of width 0), naming the module."""
    module: nn.Module  # named_modules is unannotated in torch
    for name, module in model.named_modules():
        where = f"module {name!r} ({type(module).__name__})" if name else f"the model ({type(module).__name__})"
        if isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params():
            raise SpecError(f"{where}: lazy module not initialised yet; run one forward pass first")
        if isinstance(module, torch.jit.ScriptModule):
            scripted = f"module {name!r}" if name else "the model"
            raise SpecError(f"trace: {scripted} ({module.original_name}) is a TorchScript module (torch.jit.script "
                            "or torch.jit.trace): its compiled code is opaque to torch.fx and torch.export, and "
                            "nothing about it can be proven; pass the original nn.Module instead")
        for role, parameter in module.named_parameters(recurse=False):
            qualified = '.'.join(filter(None, (name, role)))
            if parameter.is_complex():
                raise SpecError(f"trace: parameter {qualified!r} of {where} is complex ({parameter.dtype}): complex "
                                "parameters are not supported (symalg derives symmetries over the reals; split a "
                                "complex weight into real and imaginary parameters)")
            if parameter.numel() == 0:
                raise SpecError(f"trace: parameter {qualified!r} of {where} has shape "
                                f"{tuple(parameter.shape)}: a layer of width 0 has no symmetry to derive; remove "
                                "it or give it a positive width")


_CONSTANTS = (type(None), bool, int, float, str)
"""Non-tensor keyword inputs passed through as constants (``use_cache=False``): the trace is specialised on them."""


def _check_example_inputs(model: nn.Module, args: tuple, kwargs: Mapping[str, object]) -> None:
    """Refuse example inputs that ``model.forward`` does not take, empty or non-finite example tensors and
    keyword inputs that are neither tensors nor plain constants, naming the input (``example input 0``,
    ``example input 'attention_mask'``)."""
    signature = _signature(model)
    if signature is not None:  # (a forward without a signature: running it decides)
        try:
            signature.bind(*args, **kwargs)
        except TypeError as error:
            name = type(model).__name__
            raise TracingError(f"trace: running {name} on the example inputs failed in {name}: TypeError: {error} "
                               f"(its forward{signature})") from error
    named = [(f"example input {i}", v) for i, v in enumerate(args)]
    named += [(f"example input {k!r}", v) for k, v in kwargs.items()]
    for name, value in named:
        if isinstance(value, torch.Tensor) and value.numel() == 0:
            raise SpecError(f"trace: {name} is empty (shape {tuple(value.shape)})")
        if isinstance(value, torch.Tensor) and value.is_complex():
            raise SpecError(f"trace: {name} is complex ({value.dtype}): complex inputs are not supported (symalg "
                            "derives symmetries over the reals; pass torch.view_as_real(x) to a real model)")
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not value.is_meta \
                and not value.isfinite().all():  # meta tensors have shapes only
            raise SpecError(f"trace: {name} has non-finite entries (NaN or inf)")
    for key, value in kwargs.items():
        if not isinstance(value, (torch.Tensor, *_CONSTANTS)):
            raise SpecError(f"trace: keyword example input {key!r} must be a tensor or a constant (None, bool, int, "
                            f"float, str), got {type(value).__name__}")


def _run_example(model: nn.Module, args: tuple, kwargs: Mapping[str, object]) -> tuple[str, ...]:
    """Run ``model`` once on the example inputs (restoring its buffers and the RNG afterwards) and return the
    paths of its outputs (:func:`~symalg.frontend.outputs.output_tensors`); when it fails, raise
    :class:`~symalg.errors.TracingError` (chained from the model's exception) with torch's own message and the
    innermost module that was running."""
    if any(t.is_meta for t in (*model.parameters(), *model.buffers(), *args, *kwargs.values())
           if isinstance(t, torch.Tensor)):
        return ()  # shapes only: eager code may read values (`.item()`), which only a tracer skips; the tracer runs it
    running: list[str] = []  # the modules being run, innermost last

    def enter_hook(name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:  # returns None: the hook changes nothing
            running.append(name)
        return hook

    def leave_hook(*_: object) -> None:
        running.pop()

    enter = [m.register_forward_pre_hook(enter_hook(name)) for name, m in model.named_modules()]
    leave = [m.register_forward_hook(leave_hook) for m in model.modules()]
    saved = [(buffer, buffer.clone()) for buffer in model.buffers()]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # no trace of the run: RNG and buffers restored
            return tuple(path for path, _ in output_tensors(model(*args, **kwargs)))
    except Exception as error:  # torch's own message, naming the module it came from
        where = running[-1] if running else ""
        module = f"module {where!r} ({type(model.get_submodule(where)).__name__})" if where else type(model).__name__
        raise TracingError(f"trace: running {type(model).__name__} on the example inputs failed in {module}: "
                           f"{type(error).__name__}: {error}") from error
    finally:
        for handle in enter + leave:
            handle.remove()
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _propagate_shapes(model: nn.Module, gm: torch.fx.GraphModule, args: tuple, kwargs: Mapping[str, object]) -> None:
    """Record every value's shape in fx's graph (``ShapeProp``), keyword inputs bound to their placeholders."""
    from torch.fx.passes.shape_prop import ShapeProp

    bound = _bound(model, args, kwargs)
    values = args if bound is None else tuple(bound.arguments.values())  # fx's placeholders, in forward's order
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints a traceback of its own
            ShapeProp(gm).propagate(*values)
    except Exception as error:  # the model ran eagerly, but its fx graph does not: torch's message, not fx's
        cause = error.__cause__ or error
        raise TracingError(f"trace: running the fx graph of {type(model).__name__} on the example inputs failed: "
                           f"{type(cause).__name__}: {cause}") from cause


TRACERS = ("auto", "fx", "export")
"""``trace(tracer=...)``: fx with ``torch.export`` as the fallback, fx only, or ``torch.export`` only."""


def trace(model: nn.Module, example_inputs: tuple | torch.Tensor | None = None, fold_attention: bool = True,
          tracer: str = "auto", **example_kwargs: object) -> ModelGraph:
    """Trace ``model`` into a :class:`ModelGraph` (fx first, ``torch.export`` as the fallback).

    Parameters
    ----------
    model : any ``nn.Module``.
    example_inputs : a tuple of positional example inputs (a single tensor is one input); enables shape
        propagation (needed for convolutions followed by ``flatten`` and for hand-written attention), the export
        fallback, and the numerical certification of :func:`symalg.derive`.
    fold_attention : fold hand-written multi-head attention into ``attention`` nodes.
    tracer : ``"auto"`` (fx, then ``torch.export`` when fx fails or cannot trace through one of torch's composite
        layers, which fx alone keeps as one opaque node), ``"fx"`` (no fallback) or
        ``"export"`` (``torch.export`` only, which needs example inputs): both routes give the same
        canonical ops, so forcing one checks that they agree. The graph records which one ran and, for the
        fallback, fx's failure (``ModelGraph.tracer_note``); an exported graph also records the input shapes it
        holds for (``ModelGraph.shape_note``, ``specialised_axes``, ``dynamic_axes``:
        :mod:`~symalg.frontend.export_shapes`), read off a second export with every input axis dynamic.
    **example_kwargs : keyword example inputs, as the model takes them
        (``input_ids=ids, attention_mask=mask``): tensors are inputs like the positional ones; ``None``,
        booleans, numbers and strings (``use_cache=False``) are constants the trace is specialised on. They are
        passed again whenever the model is run (certification, :func:`symalg.verify`). An input named
        ``fold_attention`` or ``tracer`` goes in ``example_inputs``.

    Notes
    -----
    Every tensor the model returns is an output (tuples, dicts, dataclasses, Hugging Face ``ModelOutput``
    objects and the key/value caches in them: :func:`~symalg.frontend.outputs.output_tensors`); the exported
    graph's outputs carry their paths (``settings["outputs"]`` of the ``output`` node), so that a blocked note
    names the output.

    Example
    -------
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Hardswish(), torch.nn.Linear(4, 2))
    >>> graph = trace(model, (torch.zeros(5, 3),), tracer="export")
    >>> graph.tracer, [graph.graph.nodes[v]["op"] for v in graph.graph]
    ('export', ['param', 'param', 'param', 'param', 'input', 'linear', 'hardswish', 'linear', 'output'])
    """
    if not isinstance(model, nn.Module):
        raise SpecError(f"trace: expected a torch.nn.Module, got {type(model).__name__}")
    if not (isinstance(tracer, str) and tracer in TRACERS):
        raise SpecError(f"trace: tracer must be one of {TRACERS}, got {tracer!r}")
    if example_inputs is not None and not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if example_inputs is None and example_kwargs:
        example_inputs = ()
    if tracer == "export" and example_inputs is None:
        raise SpecError("trace: tracer='export' needs example_inputs (torch.export runs the model)")
    _check_modules(model)
    paths: tuple[str, ...] = ()
    if example_inputs is not None:
        _check_example_inputs(model, example_inputs, example_kwargs)
        paths = _run_example(model, example_inputs, example_kwargs)
    if tracer == "export" and example_inputs is not None:  # (export without example inputs is refused above)
        (gm, holds_for), tracer, note = _exported(model, example_inputs, example_kwargs), "export", ""
    else:
        gm, tracer, note, holds_for = _traced(model, example_inputs, example_kwargs, tracer)
    _drop_guards(gm)
    _redirect_in_place(gm)
    if example_inputs is not None and tracer == "fx":
        _propagate_shapes(model, gm, example_inputs, example_kwargs)
    aliases, by_id = _canonical_params(model)
    graph = nx.DiGraph()
    for node in gm.graph.nodes:
        record = _node_record(node, gm, by_id) if node.target not in _MOE_OPS else \
            {**_node_record(node, gm, by_id), **_moe_record(node, model, by_id)}
        record["shape"] = _shape_of(node.meta)
        record["arguments"] = _constant_args(node)
        record.update(_transpose_attribute(node, gm))
        inputs = _tensor_inputs(node, gm)
        record["inputs"] = tuple(i.name if i is not None else None for i in inputs)
        if node.op == "output" and tracer == "export" and len(inputs) == len(paths):  # export's outputs are flat
            record["settings"] = {"outputs": tuple(f"{p!r}{output_hint(p)}" for p in paths)}
        graph.add_node(node.name, **record)
    for name, data in list(graph.nodes(data=True)):
        kept = tuple(i if i in graph else None for i in data["inputs"])
        data["inputs"] = kept
        for index, source in enumerate(kept):
            if source is not None and not graph.has_edge(source, name):
                graph.add_edge(source, name, index=index)
    _drop_shape_queries(graph)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    buffer_shapes = {name: tuple(b.shape) for name, b in model.named_buffers()}
    graph = fold_swish_beta(fold_rms_norm(graph))
    if fold_attention:
        graph = fold_attention_pass(graph)
    return ModelGraph(graph, shapes, buffer_shapes, model, example_inputs, tracer, aliases,
                      example_kwargs=dict(example_kwargs), tracer_note=note, output_paths=paths,
                      shape_note=holds_for.note(), specialised_axes=holds_for.fixed,
                      dynamic_axes=holds_for.dynamic)


_SHAPE_ARITHMETIC = frozenset({"getitem", "add", "sub", "mul", "div", "floordiv", "mod", "pow", "neg", "sqrt"})
"""Ops that, applied to shape queries only, compute a number (``math.sqrt(q.size(-1))``, ``T // 2``)."""


def _drop_shape_queries(graph: nx.DiGraph) -> None:
    """``x.size()``, ``x.shape`` and arithmetic on them only read shapes: drop them from the data flow.

    Only Python arithmetic on them (:data:`_SHAPE_ARITHMETIC`, with no tensor result) is dropped: a tensor made from
    a shape (``torch.arange(x.shape[-1])``) is data that varies along an axis, and stays (as an op a rule must know).
    """
    queries = set()
    for name in list(nx.topological_sort(graph)):
        data = graph.nodes[name]
        sources = [i for i in data["inputs"] if i is not None]
        attribute = data["op"] == "getattr" and data["arguments"].get("arg1") in ("shape", "device", "dtype", "ndim")
        arithmetic = (sources and all(s in queries for s in sources) and data["kind"] == "function"
                      and data["op"] in _SHAPE_ARITHMETIC and data["shape"] is None)
        if data["op"] == "size" or attribute or arithmetic:
            queries.add(name)
    for name in queries:
        for user in list(graph.successors(name)):
            data = graph.nodes[user]
            data["inputs"] = tuple(None if i == name else i for i in data["inputs"])
    graph.remove_nodes_from(queries)


def _transpose_attribute(node: torch.fx.Node, gm: torch.fx.GraphModule) -> dict:
    """The record fields of ``x.mT``/``x.mH``/``x.H`` (swap the last two axes) and ``x.T`` (reverse
    every axis: ``permute``; the identity below two axes); ``{}`` for any other node. ``x.T`` of unknown
    rank becomes the op ``T``, which no rule knows, so it blocks what it touches."""
    if node.op != "call_function":
        return {}
    swap_last = {"op": "transpose", "arguments": {"dim0": -2, "dim1": -1}}
    attribute = node.args[1] if node.target is getattr else None
    if attribute in ("mT", "mH", "H"):
        return swap_last
    if attribute != "T" and node.target is not torch.ops.aten.numpy_T.default:
        return {}
    ndim = _rank(node.args[0], gm)
    if ndim is None:
        return {"op": "T", "where": f"node {node.name!r} (x.T of unknown rank: pass example_inputs to trace)"}
    if ndim < 2:
        return {"op": "identity", "arguments": {}}
    return swap_last if ndim == 2 else {"op": "permute", "arguments": {"dims": tuple(range(ndim - 1, -1, -1))}}


def _rank(value: object, gm: torch.fx.GraphModule) -> int | None:
    """Number of axes of a traced value: from shape propagation, or from the tensor a ``get_attr`` reads."""
    if not isinstance(value, torch.fx.Node):
        return None
    shape = _shape_of(value.meta)
    if shape is not None:
        return len(shape)
    tensor = _attribute(gm, str(value.target)) if value.op == "get_attr" else None
    return tensor.dim() if isinstance(tensor, torch.Tensor) else None


def _drop_guards(gm: torch.fx.GraphModule) -> None:
    """Erase unused guard and assertion calls (``torch.export``'s ``_guards_fn``, ``torch._assert``, and fx's
    checks that a constant input has its traced value, ``use_cache_1 == False``): they check the inputs and
    compute nothing."""
    for node in reversed(list(gm.graph.nodes)):  # users first: a check's comparison is unused once it is gone
        if node.users:
            continue
        if node.op == "call_function" and node.target is operator.eq:
            guard = len(node.args) == 2 and isinstance(node.args[0], torch.fx.Node) \
                and node.args[0].op == "placeholder" and not isinstance(node.args[1], torch.fx.Node)
        elif node.op == "call_module":
            guard = type(gm.get_submodule(node.target)).__name__ == "GuardsFn"
        elif isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            guard = node.target.__name__.split(".")[0] in _GUARD_OPS
        else:
            guard = node.op == "call_function" and node.target in _GUARD_FUNCTIONS
        if guard:
            gm.graph.erase_node(node)


_GUARD_OPS = {"_assert_scalar", "_assert_async", "_assert_tensor_metadata", "sym_constrain_range",
              "sym_constrain_range_for_size"}
_GUARD_FUNCTIONS: set[object] = {torch._assert, torch._check, torch._check_is_size, torch._assert_scalar,
                    torch.fx._symbolic_trace._assert_is_none}

