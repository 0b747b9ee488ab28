"""The false-claim fuzzer: random small torch models, every claimed symmetry checked on the model itself.

:func:`generate` draws one model per ``(seed, index)`` from a seeded ``random.Random``: a family
(:data:`FAMILIES`), widths 1-6, float64, random parameters, buffers and example inputs. A model is a
:class:`Case`: a list of layers and a straight-line ``forward`` program over a small op table
(:data:`OPS`), which :meth:`Case.build` runs as an ``nn.Module`` and :meth:`Case.source` prints as a
standalone Python script building the same model with the same values (a failure is a copy-paste
reproduction). The ``rules`` family draws from the op-rule registry instead (:func:`registered_models`): every
registered rule's example and near misses, so a new rule is fuzzed with no change here.

:func:`run` traces (:func:`symalg.trace`: fx first, or ``torch.export`` alone for a share of the attention
families, :data:`EXPORTED`), derives (:func:`derive_claims`, with or without the numerical
certification inside ``derive``) and checks every claim ``θ ↦ g·θ`` with
:func:`symalg.verification.certification.claim_errors`: the worst relative change of any output,
``‖F(g·θ, x) − F(θ, x)‖ / ‖F(θ, x)‖``, over group elements near and far from the identity and discrete
generators, on fresh inputs, buffers included. A claim is false when that change exceeds
:data:`~symalg.verification.certification.CERTIFICATION_TOLERANCE`. The outcome of each model is one of: claims checked,
a documented refusal (:class:`symalg.SpecError` or a subclass), a crash (any other exception) or a hang
(over ``time_limit`` CPU seconds, stopped by ``SIGPROF``).

Command line::

    python -m symalg.verification.fuzz --models 1000 --seed 0 [--start 0] [--families mlp,norm] [--workers 2] [--raw]
                                       [--tracer auto|fx|export]
    python -m symalg.verification.fuzz --show SEED INDEX [FAMILY]      # the reproduction script of one model

>>> report = run(3, seed=0, families=["mlp"])
>>> report.models, len(report.crashes), len(report.hangs)
(3, 0, 0)
"""
from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import signal
import sys
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Iterator, Mapping, NoReturn, Sequence, cast

import torch
import torch.nn.functional as F
from torch import nn

from symalg.verification.certification import CERTIFICATION_TOLERANCE, ClaimError, claim_errors
from symalg.catalogue.activations import CatalogueEntry
from symalg.catalogue.rules import REGISTRY
from symalg.catalogue.rules.moe import SparseMoE
from symalg.errors import SpecError
from symalg.progress import Progress, report as report_progress
from symalg.ir.graph import ModelGraph
from symalg.symbolic.derive import Analysis, derive
from symalg.frontend.tracing import trace

__all__ = ["Case", "EXPORTED", "FAMILIES", "FuzzReport", "check_case", "derive_claims", "generate",
           "main", "run"]


# ---------------------------------------------------------------------------------------------------
# The model language: layers, and a forward program over a small op table.

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``rotate_half``: ``(x₁, x₂) ↦ (−x₂, x₁)`` on the two halves of the last axis."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(x: torch.Tensor, dim: int, base: float = 10000.0,
                interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary ``(cos, sin)`` tables of shape ``(T, dim)`` for the positions of ``x`` (``T = x.shape[-2]``),
    as Hugging Face's ``LlamaRotaryEmbedding`` computes them: ``θ_i = base^(−2i/dim)``, angles ``t θ_i``,
    each frequency twice (``cat((freqs, freqs))``; with ``interleaved``, side by side as GPT-J's
    ``duplicate_interleave``)."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim)
    freqs = torch.outer(torch.arange(x.shape[-2], dtype=x.dtype), inv_freq)
    angles = freqs.repeat_interleave(2, -1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rope_tables_per_head(x: torch.Tensor, dim: int, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables of shape ``(heads, T, dim)`` that differ between heads (head ``h`` uses the base ``10^(h+1)``),
    each frequency twice as in :func:`rope_tables`: permuting the heads changes the scores."""
    bases = 10.0 ** torch.arange(1, heads + 1, dtype=x.dtype)
    inv_freq = 1.0 / bases[:, None] ** (torch.arange(0, dim, 2, dtype=x.dtype) / dim)
    freqs = torch.arange(x.shape[-2], dtype=x.dtype)[None, :, None] * inv_freq[:, None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rope_partial(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, r: int, passed_first: bool = False,
                 trailing: bool = False) -> torch.Tensor:
    """GPT-NeoX's partial rotary embedding ``cat((rope(x[…, :r]), x[…, r:]), −1)``; near misses: the passed
    coordinates first (``passed_first``), or the trailing ones rotated (``trailing``: ``x[…, :r]`` passed)."""
    rotated, passed = (x[..., r:], x[..., :r]) if trailing else (x[..., :r], x[..., r:])
    rotated = rotated * cos + rotate_half(rotated) * sin
    return torch.cat((passed, rotated) if passed_first or trailing else (rotated, passed), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's ``rotate_every_two``: ``(x_{2i}, x_{2i+1}) ↦ (−x_{2i+1}, x_{2i})`` (interleaved pairs)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def alibi(scores: torch.Tensor) -> torch.Tensor:
    """ALiBi: ``scores[b, h, i, j] − m_h |i − j|`` with slopes ``m_h = 2^(−8(h+1)/H)``."""
    heads, t = scores.shape[1], scores.shape[-1]
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, dtype=scores.dtype) / heads)
    positions = torch.arange(t)
    distance = (positions[None, :] - positions[:, None]).abs().to(scores.dtype)
    return scores - slopes[:, None, None] * distance


@dataclass(frozen=True)
class Op:
    """A forward op: ``template`` prints it (``{0}``, ``{1}`` the tensor operands, ``{name}`` constants),
    ``fn(module, *tensors, **constants)`` runs it."""

    template: str
    fn: Callable[..., Any]


COMPARISONS: dict[str, Callable[[int, int], bool]] = {
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
"""The comparisons a shape branch (op ``branch``) may print."""

OPS: dict[str, Op] = {
    "layer": Op("self.{layer}({0})", lambda m, x, layer: getattr(m, layer)(x)),
    "act": Op("F.{name}({0})", lambda m, x, name: getattr(F, name)(x)),
    "add": Op("{0} + {1}", lambda m, a, b: a + b),
    "abs": Op("torch.abs({0})", lambda m, x: torch.abs(x)),
    "abs_method": Op("{0}.abs()", lambda m, x: x.abs()),
    "absolute": Op("torch.absolute({0})", lambda m, x: torch.absolute(x)),
    "abs_plus": Op("{0}.abs() + {0}", lambda m, x: x.abs() + x),
    "abs_times": Op("{0} * {0}.abs()", lambda m, x: x * x.abs()),
    "abs_shifted": Op("({0} - 0.5).abs()", lambda m, x: (x - 0.5).abs()),
    "abs_sigmoid": Op("torch.sigmoid({0}.abs())", lambda m, x: torch.sigmoid(x.abs())),
    "tanh_abs": Op("torch.tanh({0}).abs()", lambda m, x: torch.tanh(x).abs()),
    "mul": Op("{0} * {1}", lambda m, a, b: a * b),
    "mul_fn": Op("torch.mul({0}, {1})", lambda m, a, b: torch.mul(a, b)),
    "mul_method": Op("{0}.mul({1})", lambda m, a, b: a.mul(b)),
    "matmul": Op("{0} @ {1}", lambda m, a, b: a @ b),
    "matmul_t": Op("{0} @ {1}.transpose(-2, -1)", lambda m, a, b: a @ b.transpose(-2, -1)),
    "scale": Op("{0} * {c}", lambda m, x, c: x * c),
    "softmax": Op("{0}.softmax({dim})", lambda m, x, dim: x.softmax(dim)),
    "cat": Op("torch.cat([{0}, {1}], dim={dim})", lambda m, a, b, dim: torch.cat([a, b], dim=dim)),
    "transpose": Op("{0}.transpose({a}, {b})", lambda m, x, a, b: x.transpose(a, b)),
    "reshape": Op("{0}.reshape{shape}", lambda m, x, shape: x.reshape(shape)),
    "flatten": Op("{0}.flatten(1)", lambda m, x: x.flatten(1)),
    "max": Op("{0}.max({dim})[0]", lambda m, x, dim: x.max(dim)[0]),
    "mean": Op("{0}.mean({dim})", lambda m, x, dim: x.mean(dim)),
    "linear_w": Op("F.linear({0}, self.{layer}.weight)", lambda m, x, layer: F.linear(x, getattr(m, layer).weight)),
    "weight_add": Op("{0} + self.{layer}.weight", lambda m, x, layer: x + getattr(m, layer).weight),
    "weight_mul": Op("{0} * self.{layer}.weight", lambda m, x, layer: x * getattr(m, layer).weight),
    "weight_rdiv": Op("self.{layer}.weight / {0}", lambda m, x, layer: getattr(m, layer).weight / x),
    "causal_fill_value": Op("{0}.masked_fill(torch.ones({t}, {t}, dtype=torch.bool).triu(1), {value})",
                            lambda m, x, t, value: x.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), value)),
    "sdpa_mask_param": Op("F.scaled_dot_product_attention({0}, {1}, {2}, attn_mask=self.{layer}.weight)",
                          lambda m, q, k, v, layer: F.scaled_dot_product_attention(
                              q, k, v, attn_mask=getattr(m, layer).weight)),
    "sdpa": Op("F.scaled_dot_product_attention({0}, {1}, {2}, is_causal={causal})",
               lambda m, q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)),
    "addmm": Op("torch.addmm(self.{layer}.bias, {0}.reshape(-1, {n}), self.{layer}.weight.t()).reshape{shape}",
                lambda m, x, layer, n, shape: torch.addmm(getattr(m, layer).bias, x.reshape(-1, n),
                                                          getattr(m, layer).weight.t()).reshape(shape)),
    "gelu_tanh": Op("F.gelu({0}, approximate='tanh')", lambda m, x: F.gelu(x, approximate="tanh")),
    "layer_norm_fn": Op("F.layer_norm({0}, ({d},), self.{layer}.weight, self.{layer}.bias)",
                        lambda m, x, layer, d: F.layer_norm(x, (d,), getattr(m, layer).weight, getattr(m, layer).bias)),
    "rms_written": Op("{0} * torch.rsqrt({0}.pow(2).mean(-1, keepdim=True) + {eps})",
                      lambda m, x, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)),
    "gain": Op("self.{layer}.weight * {0}", lambda m, x, layer: getattr(m, layer).weight * x),
    "token0": Op("{0}[:, 0]", lambda m, x: x[:, 0]),
    "prepend": Op("torch.cat([self.{layer}.weight.expand({batch}, 1, {d}), {0}], 1)",
                  lambda m, x, layer, batch, d: torch.cat([getattr(m, layer).weight.expand(batch, 1, d), x], 1)),
    "select": Op("{0}.select({dim}, {index})", lambda m, x, dim, index: x.select(dim, index)),
    "sum": Op("{0}.sum({dim})", lambda m, x, dim: x.sum(dim)),
    "bmm": Op("torch.bmm({0}, {1})", lambda m, a, b: torch.bmm(a, b)),
    "bmm_t": Op("torch.bmm({0}, {1}.transpose(1, 2))", lambda m, a, b: torch.bmm(a, b.transpose(1, 2))),
    "mha": Op("self.{layer}({0}, {0}, {0}, need_weights={need}, average_attn_weights={average})",
              lambda m, x, layer, need, average: getattr(m, layer)(x, x, x, need_weights=need,
                                                                   average_attn_weights=average)),
    # transformer blocks
    "param": Op("self.{layer}", lambda m, layer: getattr(m, layer)),
    "view": Op("{0}.view{shape}", lambda m, x, shape: x.view(shape)),
    "unflatten": Op("{0}.unflatten(-1, {sizes})", lambda m, x, sizes: x.unflatten(-1, sizes)),
    "flatten_from": Op("{0}.flatten({start})", lambda m, x, start: x.flatten(start)),
    "contiguous": Op("{0}.contiguous()", lambda m, x: x.contiguous()),
    "chunk": Op("{0}.chunk({n}, dim=-1)", lambda m, x, n: x.chunk(n, dim=-1)),
    "split": Op("{0}.split({sizes}, dim=-1)", lambda m, x, sizes: x.split(sizes, dim=-1)),
    "repeat_interleave": Op("{0}.repeat_interleave({r}, dim=1)", lambda m, x, r: x.repeat_interleave(r, dim=1)),
    "repeat_kv": Op("{0}[:, :, None].expand{shape}.reshape{merged}",  # Hugging Face's repeat_kv
                    lambda m, x, shape, merged: x[:, :, None].expand(shape).reshape(merged)),
    "causal_fill": Op("{0}.masked_fill(torch.ones({t}, {t}, dtype=torch.bool).triu(1), float('-inf'))",
                      lambda m, x, t: x.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))),
    "causal_fill_min": Op("{0}.masked_fill(torch.ones({t}, {t}, dtype=torch.bool).tril() == 0, "
                          "torch.finfo({0}.dtype).min)",
                          lambda m, x, t: x.masked_fill(torch.ones(t, t, dtype=torch.bool).tril() == 0,
                                                        torch.finfo(x.dtype).min)),
    "alibi": Op("alibi({0})", lambda m, x: alibi(x)),
    "rope_tables": Op("rope_tables({0}, {dim})", lambda m, x, dim: rope_tables(x, dim)),
    "rope": Op("{0} * {1} + rotate_half({0}) * {2}", lambda m, x, cos, sin: x * cos + rotate_half(x) * sin),
    "rope_swapped": Op("rotate_half({0}) * {2} + {1} * {0}", lambda m, x, cos, sin: rotate_half(x) * sin + cos * x),
    "rope_tables_per_head": Op("rope_tables_per_head({0}, {dim}, {heads})",
                               lambda m, x, dim, heads: rope_tables_per_head(x, dim, heads)),
    "rope_partial": Op("rope_partial({0}, {1}, {2}, {r})", lambda m, x, cos, sin, r: rope_partial(x, cos, sin, r)),
    "rope_tables_interleaved": Op("rope_tables({0}, {dim}, interleaved=True)",
                                  lambda m, x, dim: rope_tables(x, dim, interleaved=True)),
    "rope_interleaved": Op("{0} * {1} + rotate_every_two({0}) * {2}",
                           lambda m, x, cos, sin: x * cos + rotate_every_two(x) * sin),
    "rope_unsigned": Op("{0} * {1} + torch.cat([{0}[..., {h}:], {0}[..., :{h}]], dim=-1) * {2}",
                        lambda m, x, cos, sin, h: x * cos + torch.cat([x[..., h:], x[..., :h]], dim=-1) * sin),
    "rms_hf": Op("{0} * torch.rsqrt({0}.pow(2).mean(-1, keepdim=True) + 1e-6) * self.{layer}",
                 lambda m, x, layer: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * getattr(m, layer)),
    "layer_norm_f": Op("F.layer_norm({0}, ({d},), self.{weight}, self.{bias})",
                       lambda m, x, d, weight, bias: F.layer_norm(x, (d,), getattr(m, weight), getattr(m, bias))),
    "sdpa_mask": Op("F.scaled_dot_product_attention({0}, {1}, {2}, attn_mask={3})",
                    lambda m, q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
    "sdpa_gqa": Op("F.scaled_dot_product_attention({0}, {1}, {2}, is_causal={causal}, enable_gqa=True)",
                   lambda m, q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                              enable_gqa=True)),
    "neg": Op("-{0}", lambda m, x: -x),
    "partial_passed_first": Op("rope_partial({0}, {1}, {2}, {r}, passed_first=True)",
                            lambda m, x, cos, sin, r: rope_partial(x, cos, sin, r, passed_first=True)),
    "partial_trailing": Op("rope_partial({0}, {1}, {2}, {r}, trailing=True)",
                        lambda m, x, cos, sin, r: rope_partial(x, cos, sin, r, trailing=True)),
    "softcap": Op("torch.tanh({0} / {c}) * {c}", lambda m, x, c: torch.tanh(x / c) * c),
    "tanh": Op("torch.tanh({0})", lambda m, x: torch.tanh(x)),
    "cut": Op("{0}[..., {a}:{b}]", lambda m, x, a, b: x[..., a:b]),
    "cut_slots": Op("{0}[:, :, :, {a}:{b}]", lambda m, x, a, b: x[:, :, :, a:b]),
    "sub": Op("{0} - {1}", lambda m, a, b: a - b),
    "cumsum": Op("{0}.cumsum(-1)", lambda m, x: x.cumsum(-1)),
    "add_alpha": Op("torch.add({0}, {1}, alpha={alpha})", lambda m, a, b, alpha: torch.add(a, b, alpha=alpha)),
    "layer_norm_bare": Op("F.layer_norm({0}, ({d},))", lambda m, x, d: F.layer_norm(x, (d,))),
    "layer_norm_bias": Op("F.layer_norm({0}, ({d},), None, self.{bias})",
                          lambda m, x, d, bias: F.layer_norm(x, (d,), None, getattr(m, bias))),
    "dropout_fn": Op("F.dropout({0}, {p}, training={training})",
                     lambda m, x, p, training: F.dropout(x, p, training=training)),
    "sdpa_dropout": Op("F.scaled_dot_product_attention({0}, {1}, {2}, dropout_p={p}, is_causal={causal})",
                       lambda m, q, k, v, p, causal: F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                                                                     is_causal=causal)),
    "mha_kv": Op("self.{layer}({0}, {1}, {1}, need_weights={need}, average_attn_weights={average})",
                  lambda m, x, kv, layer, need, average: getattr(m, layer)(x, kv, kv, need_weights=need,
                                                                           average_attn_weights=average)),
    "mha_padding": Op("self.{layer}({0}, {1}, {1}, key_padding_mask=(torch.arange({batch})[:, None] == 0) & "
                      "(torch.arange({length}) == {length} - 1), need_weights={need}, average_attn_weights={average})",
                      lambda m, x, kv, layer, batch, length, need, average: getattr(m, layer)(
                          x, kv, kv, key_padding_mask=(torch.arange(batch)[:, None] == 0) &
                          (torch.arange(length) == length - 1), need_weights=need, average_attn_weights=average)),
    "mha_mask": Op("self.{layer}({0}, {1}, {1}, attn_mask=self.{mask}.weight, need_weights={need}, "
                   "average_attn_weights={average})",
                   lambda m, x, kv, layer, mask, need, average: getattr(m, layer)(
                       x, kv, kv, attn_mask=getattr(m, mask).weight, need_weights=need, average_attn_weights=average)),
    # torch's composite layers: a causal mask (fx cannot trace through the masked layer), a mask per head (B·H, L, L)
    "torch_layer_causal": Op("self.{layer}({0}, src_mask=nn.Transformer.generate_square_subsequent_mask({t}, "
                             "dtype={0}.dtype), is_causal=True)",
                             lambda m, x, layer, t: getattr(m, layer)(
                                 x, src_mask=nn.Transformer.generate_square_subsequent_mask(t, dtype=x.dtype),
                                 is_causal=True)),
    "torch_layer_mask": Op("self.{layer}({0}, src_mask=self.{mask}.weight)",
                           lambda m, x, layer, mask: getattr(m, layer)(x, src_mask=getattr(m, mask).weight)),
    "decoder_layer": Op("self.{layer}({0}, {1})", lambda m, x, memory, layer: getattr(m, layer)(x, memory)),
    "decoder_layer_causal": Op("self.{layer}({0}, {1}, tgt_mask=nn.Transformer.generate_square_subsequent_mask({t}, "
                               "dtype={0}.dtype), tgt_is_causal=True)",
                               lambda m, x, memory, layer, t: getattr(m, layer)(
                                   x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(t, dtype=x.dtype),
                                   tgt_is_causal=True)),
    "bilinear": Op("self.{layer}({0}, {1})", lambda m, a, b, layer: getattr(m, layer)(a, b)),
    "einsum": Op("torch.einsum({equation!r}, {0})", lambda m, x, equation: torch.einsum(equation, x)),
    "einsum2": Op("torch.einsum({equation!r}, {0}, {1})", lambda m, a, b, equation: torch.einsum(equation, a, b)),
    # torch's recurrent layers: the output sequence, or the final state h_n (an LSTM's h_n or c_n), or an initial
    # state h0 (h0 and c0 alike for an LSTM) computed from a value of shape (B, H)
    "recurrent": Op("self.{layer}({0})[0]", lambda m, x, layer: getattr(m, layer)(x)[0]),
    "recurrent_final": Op("self.{layer}({0})", lambda m, x, layer: getattr(m, layer)(x)),
    "recurrent_lstm_final": Op("(lambda r: (r[0], r[1][{which}]))(self.{layer}({0}))",
                               lambda m, x, layer, which: (lambda r: (r[0], r[1][which]))(getattr(m, layer)(x))),
    "recurrent_h0": Op("self.{layer}({0}, {1}.unsqueeze(0).repeat({k}, 1, 1))[0]",
                       lambda m, x, h, layer, k: getattr(m, layer)(x, h.unsqueeze(0).repeat(k, 1, 1))[0]),
    "recurrent_lstm_h0": Op("self.{layer}({0}, ({1}.unsqueeze(0).repeat({k}, 1, 1), "
                            "{1}.unsqueeze(0).repeat({k}, 1, 1)))[0]",
                            lambda m, x, h, layer, k: getattr(m, layer)(
                                x, (h.unsqueeze(0).repeat(k, 1, 1), h.unsqueeze(0).repeat(k, 1, 1)))[0]),
    "sigmoid": Op("torch.sigmoid({0})", lambda m, x: torch.sigmoid(x)),
    "to_complex": Op("{0}.to(torch.complex128)", lambda m, x: x.to(torch.complex128)),
    "real": Op("torch.real({0})", lambda m, x: torch.real(x)),
    "fft": Op("torch.fft.fft({0})", lambda m, x: torch.fft.fft(x)),
    "fft_abs": Op("torch.fft.fft({0}).abs()", lambda m, x: torch.fft.fft(x).abs()),
    "rfft_real": Op("torch.view_as_real(torch.fft.rfft({0})).flatten(-2)",
                    lambda m, x: torch.view_as_real(torch.fft.rfft(x)).flatten(-2)),
    "sigmoid_method": Op("{0}.sigmoid()", lambda m, x: x.sigmoid()),
    "shift": Op("{0} + {c}", lambda m, x, c: x + c),
    "branch": Op("F.{a}({0}) if {0}.shape[{axis}] {cmp} {k} else F.{b}({0})",
                 lambda m, x, a, b, axis, cmp, k: getattr(F, a)(x) if COMPARISONS[cmp](x.shape[axis], k)
                 else getattr(F, b)(x)),
    "exp": Op("{0}.exp()", lambda m, x: x.exp()),
    "flip": Op("{0}.flip(-1)", lambda m, x: x.flip(-1)),
    "bias": Op("self.{layer}.bias", lambda m, layer: getattr(m, layer).bias),
    "pow": Op("{0} ** {1}", lambda m, a, b: a ** b),
    "pow_method": Op("{0}.pow({1})", lambda m, a, b: a.pow(b)),
    "pow_fn": Op("torch.pow({0}, {1})", lambda m, a, b: torch.pow(a, b)),
    "pow_number": Op("{0} ** {c}", lambda m, x, c: x ** c),
    "add_": Op("{0}.add_({1})", lambda m, a, b: a.add_(b)),
    "iadd": Op("_iadd({0}, {1})", lambda m, a, b: _iadd(a, b)),
    "mul_": Op("{0}.mul_({c})", lambda m, x, c: x.mul_(c)),
    "relu_": Op("F.relu({0}, inplace=True)", lambda m, x: F.relu(x, inplace=True)),
    "channels": Op("{0}[:, :{k}]", lambda m, x, k: x[:, :k]),
    "mha_causal": Op("self.{layer}({0}, {0}, {0}, attn_mask=torch.ones({t}, {t}, dtype=torch.bool).triu(1), "
                     "need_weights={need}, average_attn_weights={average})",
                     lambda m, x, layer, t, need, average: getattr(m, layer)(
                         x, x, x, attn_mask=torch.ones(t, t, dtype=torch.bool).triu(1), need_weights=need,
                         average_attn_weights=average)),
}


def _iadd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a += b``, as a residual block writes it (fx: ``operator.iadd``; export: ``aten.add_``)."""
    a += b
    return a


def _weight_norm(module: nn.Module, dim: int | None) -> nn.Module:
    """The hook-based ``nn.utils.weight_norm`` (deprecated; its warning silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(module, dim=cast(int, dim))   # None: over the whole weight (torch's stub: int)


def _script(module: nn.Module) -> nn.Module:
    """``torch.jit.script(module)`` (deprecated; its warning silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(module)


WRAPS: dict[str, tuple[str, Callable[[nn.Module], nn.Module]]] = {
    "weight_norm": ("nn.utils.weight_norm({})", lambda m: _weight_norm(m, 0)),
    "weight_norm_all": ("nn.utils.weight_norm({}, dim=None)", lambda m: _weight_norm(m, None)),
    "weight_norm_in": ("nn.utils.weight_norm({}, dim=1)", lambda m: _weight_norm(m, 1)),
    "spectral_norm": ("nn.utils.spectral_norm({})", nn.utils.spectral_norm),
    "script": ("torch.jit.script({})", _script),
}
"""What a :class:`Layer` may be wrapped in: ``(template, function)``, the template printing the call around the
module's source."""


EXTRA_LAYERS: dict[str, Callable[..., nn.Module]] = {"SparseMoE": SparseMoE}
"""Layers a :class:`Layer` may name besides ``torch.nn``'s (the ``moe`` family's blocks)."""


@dataclass(frozen=True)
class Layer:
    """``nn.<cls>(*args, **kwargs)``, in eval mode when ``train`` is false, wrapped in ``WRAPS[wrap]`` when given;
    ``Layer("Parameter", shape)`` is ``nn.Parameter(torch.zeros(shape))`` (given its values by :func:`randomize`)."""

    cls: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    train: bool = True
    wrap: str = ""

    def make(self) -> nn.Module | nn.Parameter:
        if self.cls == "Parameter":
            return nn.Parameter(torch.zeros(self.args))
        module = (EXTRA_LAYERS.get(self.cls) or getattr(nn, self.cls))(*self.args, **dict(self.kwargs))
        return WRAPS[self.wrap][1](module) if self.wrap else module

    def source(self) -> str:
        if self.cls == "Parameter":
            return f"nn.Parameter(torch.zeros({self.args!r}))"
        arguments = ", ".join([repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs])
        module = f"{'' if self.cls in EXTRA_LAYERS else 'nn.'}{self.cls}({arguments})"
        return WRAPS[self.wrap][0].format(module) if self.wrap else module


@dataclass(frozen=True)
class Step:
    """``out = OPS[op](*inputs, **constants)``; ``out`` is a name, or a tuple of names for a tuple result."""

    out: str | tuple[str, ...]
    op: str
    inputs: tuple[str, ...]
    constants: tuple[tuple[str, Any], ...] = ()

    def source(self) -> str:
        target = ", ".join(self.out) if isinstance(self.out, tuple) else self.out
        return f"{target} = {OPS[self.op].template.format(*self.inputs, **dict(self.constants))}"


_Output = tuple[str, tuple[str, ...]]
"""A program's output: ``(kind, names)``, kind ``"tensor"`` (the first name), ``"tuple"`` or ``"dict"``."""

_Drawn = tuple[tuple[int, ...], int, str | tuple[str, ...]]
"""What a family returns: the input shape, the vocabulary (0: a float input) and the output name(s)."""


class FuzzModel(nn.Module):
    """Runs a :class:`Case`'s program: ``forward(x)`` executes the steps, then returns ``output``."""

    def __init__(self, layers: Sequence[tuple[str, Layer]], steps: Sequence[Step], output: _Output):
        super().__init__()
        for name, layer in layers:
            setattr(self, name, layer.make())
        self.steps, self.output = tuple(steps), output

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]:
        env: dict[str, Any] = {"x": x}
        for step in self.steps:
            value = OPS[step.op].fn(self, *(env[i] for i in step.inputs), **dict(step.constants))
            # index a tuple result rather than iterate it: fx proxies cannot be iterated
            env.update({n: value[i] for i, n in enumerate(step.out)} if isinstance(step.out, tuple) else
                       {step.out: value})
        kind, names = self.output
        if kind == "dict":
            return {name: env[name] for name in names}
        return tuple(env[name] for name in names) if kind == "tuple" else env[names[0]]



def randomize(model: nn.Module) -> nn.Module:
    """The fuzzer's values, in place: parameters ``N(0, 0.7²)`` (norm gains included, so no gain is 1),
    running means ``N(0, 1)``, running variances ``U(0.5, 2)`` (eval-mode norms are not the identity)."""
    with torch.no_grad():
        for p in model.parameters():
            nn.init.normal_(p, std=0.7)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.normal_()
            elif name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
    return model

@dataclass(frozen=True)
class Case:
    """One generated model: ``family``, its layers and program, its input, and the torch seed its values
    are drawn with. :meth:`build` makes it, :meth:`source` prints it as a standalone script."""

    seed: int
    index: int
    family: str
    variant: str
    layers: tuple[tuple[str, Layer], ...]
    steps: tuple[Step, ...]
    output: _Output
    input_shape: tuple[int, ...]
    vocab: int = 0
    torch_seed: int = 0
    tracer: str = "auto"
    """How :func:`check_case` traces it (:func:`symalg.trace`'s ``tracer``): ``"export"`` for the attention
    families' export-forced cases, whose ``torch.export`` graphs fx would never hand over."""
    special: tuple[tuple[str, float], ...] = ()
    """Parameters set to special values after :func:`randomize` (the ``special`` family): ``(name, value)``."""
    registered: tuple[str, int] | None = None
    """The ``rules`` family's model: ``(op, k)``, the registered example (``k = 0``) or near miss ``k − 1`` of the op
    rule (:func:`registered_models`); ``layers`` and ``steps`` are then empty."""

    @property
    def description(self) -> str:
        call = f"symalg.verification.fuzz.generate({self.seed}, {self.index}, {self.family!r})"
        return f"{self.family}/{self.variant} ({call})"

    def build(self) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """``(model, (x,))`` in float64 (a registered model: its example inputs); the global torch seed is left as it
        was."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.torch_seed)
            if self.registered is not None:
                return build_registered(*self.registered)
            model = randomize(FuzzModel(self.layers, self.steps, self.output).double())
            with torch.no_grad():
                for name, value in self.special:
                    model.get_parameter(name).fill_(value)
            for name, layer in self.layers:
                if not layer.train:
                    getattr(model, name).eval()
            x = (torch.randint(0, self.vocab, self.input_shape) if self.vocab
                 else torch.randn(self.input_shape, dtype=torch.float64))
        return model, (x,)

    def source(self) -> str:
        """A standalone script that builds the same model and input, values included, and prints its false claims."""
        if self.registered is not None:
            return "\n".join(["# " + self.description, "import torch", "import symalg",
                              "from symalg.verification.certification import claim_errors",
                              "from symalg.verification.fuzz import build_registered", "",
                              f"torch.manual_seed({self.torch_seed})",
                              f"model, inputs = build_registered{self.registered!r}",
                              f"analysis = symalg.derive(symalg.trace(model, inputs{self._tracer_argument}))",
                              "print([str(e) for e in claim_errors(analysis) if not e.holds])"]) + "\n"
        kind, names = self.output
        returned = {"tensor": names[0], "tuple": f"({', '.join(names)},)",
                    "dict": "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"}[kind]
        x = (f"torch.randint(0, {self.vocab}, {self.input_shape})" if self.vocab
             else f"torch.randn({self.input_shape}, dtype=torch.float64)")
        lines = ["# " + self.description, "import torch", "import torch.nn.functional as F", "from torch import nn",
                 "from symalg.verification.fuzz import _iadd, alibi, rope_partial, rope_tables, rope_tables_per_head, "
                 "rotate_every_two, rotate_half", "from symalg.catalogue.rules.moe import SparseMoE",
                 "", "", "class Model(nn.Module):", "    def __init__(self):", "        super().__init__()"]
        lines += [f"        self.{name} = {layer.source()}" for name, layer in self.layers]
        lines += ["", "    def forward(self, x):"] + [f"        {s.source()}" for s in self.steps]
        lines += [f"        return {returned}", "", "", f"torch.manual_seed({self.torch_seed})",
                  "model = Model().double()", "with torch.no_grad():", "    for p in model.parameters():",
                  "        nn.init.normal_(p, std=0.7)", "    for name, b in model.named_buffers():",
                  "        if name.endswith('running_mean'):", "            b.normal_()",
                  "        elif name.endswith('running_var'):", "            b.uniform_(0.5, 2.0)"]
        lines += [f"    model.get_parameter({name!r}).fill_({value!r})" for name, value in self.special]
        lines += [f"model.{name}.eval()" for name, layer in self.layers if not layer.train]
        lines += [f"x = {x}", "", "import symalg", "from symalg.verification.certification import claim_errors",
                  f"analysis = symalg.derive(symalg.trace(model, (x,){self._tracer_argument}))",
                  "print([str(e) for e in claim_errors(analysis) if not e.holds])"]
        return "\n".join(lines) + "\n"

    @property
    def _tracer_argument(self) -> str:
        return "" if self.tracer == "auto" else f", tracer={self.tracer!r}"


class _Builder:
    """Collects layers and steps while a family draws a model."""

    def __init__(self, rng: random.Random, extra: random.Random | None = None):
        self.rng, self.count = rng, 0
        self.extra = extra or random.Random(0)
        """The choices added after a family's first version (a returned map's reader, eval dropout on the
        probabilities, the ``bmm`` layout) are drawn from their own stream: a model that takes none of them is the
        one its ``(seed, index)`` always gave, so the reproductions in docs/soundness.md still hold."""
        self.layers: list[tuple[str, Layer]] = []
        self.steps: list[Step] = []
        self.variant: list[str] = []
        self.registered: tuple[str, int] | None = None
        """Set by the ``rules`` family: the registered model it drew (:attr:`Case.registered`)."""

        self.reuse: Iterator[tuple[str, Layer]] | None = None   # inside twice(): the first call's layers
        self.evens: random.Random | None = None
        """Set by the ``even`` family: the stream drawing ``|·|`` and its near misses in place of activations."""

    def width(self, low: int = 1) -> int:
        return self.rng.randint(low, 6)

    def add(self, cls: str, *args: Any, train: bool = True, wrap: str = "", **kwargs: Any) -> str:
        layer = Layer(cls, args, tuple(kwargs.items()), train, wrap)
        if self.reuse is not None:  # inside the second call of twice(): the first call's layer, in turn
            name, first = next(self.reuse)
            assert first == layer, (first, layer)
            return name
        name = f"m{len(self.layers)}"
        self.layers.append((name, layer))
        return name

    def twice(self, block: Callable[[str], str], x: str) -> str:
        """``block(block(x))`` with the same modules (weight sharing): the second call replays the first call's
        random choices (same RNG state) and reuses, in turn, the layers the first call added."""
        state, extra, first, variant = self.rng.getstate(), self.extra.getstate(), len(self.layers), list(self.variant)
        evens = self.evens.getstate() if self.evens is not None else None
        y = block(x)
        after, variant, self.reuse = self.rng.getstate(), list(self.variant), iter(self.layers[first:])
        self.rng.setstate(state)
        self.extra.setstate(extra)
        if self.evens is not None and evens is not None:
            self.evens.setstate(evens)
        try:
            y = block(y)
        finally:
            self.reuse = None
        assert self.rng.getstate() == after
        self.variant = variant
        return y

    def op(self, op: str, *inputs: str, **constants: Any) -> str:
        """A step with one result; its name."""
        return self._step(op, inputs, constants, 1)[0]

    def ops(self, op: str, *inputs: str, outs: int, **constants: Any) -> tuple[str, ...]:
        """A step with a tuple of ``outs`` results; their names."""
        return self._step(op, inputs, constants, outs)

    def _step(self, op: str, inputs: tuple[str, ...], constants: dict[str, Any], outs: int) -> tuple[str, ...]:
        self.count += outs
        names = tuple(f"h{self.count - outs + i}" for i in range(outs))
        self.steps.append(Step(names if outs > 1 else names[0], op, inputs, tuple(constants.items())))
        return names

    def call(self, layer: str, x: str) -> str:
        return self.op("layer", x, layer=layer)

    def linear(self, x: str, n_in: int, n_out: int, bias: bool | None = None) -> str:
        bias = self.rng.random() < 0.8 if bias is None else bias
        return self.call(self.add("Linear", n_in, n_out, bias=bias), x)

    def act(self, x: str, names: Sequence[str] = ("relu", "leaky_relu", "tanh", "sigmoid", "gelu", "silu",
                                                   "softplus", "elu", "identity", "hardtanh", "hardsigmoid",
                                                   "hardswish", "relu6", "mish", "selu")) -> str:
        name = self.rng.choice(names)
        if self.evens is not None and self.evens.random() < 0.7:
            even = self.evens.choice(EVEN_OPS)
            self.variant.append(even)
            return self.op(even, x)
        return x if name == "identity" else self.op("act", x, name=name)

    def norm(self, x: str, shape: tuple[int, ...]) -> str:
        """A random norm applied to ``x`` of ``shape`` ``(B, ..., d)`` along some axis (transposing when the
        norm's channel axis is not where ``x`` has it)."""
        rng, d = self.rng, shape[-1]
        kind = rng.choice(["batchnorm", "layernorm", "groupnorm", "rmsnorm", "layernorm_axis"])
        train = rng.random() < 0.5
        self.variant.append(f"{kind}{'' if train else '-eval'}")
        if kind == "batchnorm":
            if len(shape) == 2:
                return self.call(self.add("BatchNorm1d", d, affine=rng.random() < 0.8, train=train), x)
            # on axis 1, its channel axis (a false claim once found: BatchNorm1d(4) on (B, T=4, d=4))
            if rng.random() < 0.5:
                self.variant.append("axis1")
                return self.call(self.add("BatchNorm1d", shape[1], affine=rng.random() < 0.8, train=train), x)
            y = self.call(self.add("BatchNorm1d", d, train=train), self.op("transpose", x, a=1, b=-1))
            return self.op("transpose", y, a=1, b=-1)
        if kind == "layernorm":
            return self.call(self.add("LayerNorm", d, elementwise_affine=rng.random() < 0.8,
                                      bias=rng.random() < 0.7), x)
        if kind == "rmsnorm":
            return self.call(self.add("RMSNorm", d, elementwise_affine=rng.random() < 0.8), x)
        if kind == "groupnorm":
            channels = shape[1] if len(shape) > 2 and rng.random() < 0.5 else d
            groups = rng.choice([g for g in range(1, channels + 1) if channels % g == 0])
            layer = self.add("GroupNorm", groups, channels, affine=rng.random() < 0.7, train=train)
            if len(shape) == 2 or channels == shape[1]:
                return self.call(layer, x)
            return self.op("transpose", self.call(layer, self.op("transpose", x, a=1, b=-1)), a=1, b=-1)
        if len(shape) == 2:  # layernorm over a non-last axis needs one
            return self.call(self.add("LayerNorm", d), x)
        t = shape[1]  # LayerNorm over the time axis, after a transpose
        y = self.call(self.add("LayerNorm", t, elementwise_affine=rng.random() < 0.8),
                      self.op("transpose", x, a=1, b=-1))
        return self.op("transpose", y, a=1, b=-1)

    def mlp(self, x: str, n_in: int, n_out: int, depth: int | None = None) -> str:
        depth = self.rng.randint(1, 3) if depth is None else depth
        widths = [n_in] + [self.width() for _ in range(depth - 1)] + [n_out]
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            x = self.linear(x, a, b)
            if i < depth - 1:
                x = self.act(x)
        return x


# ---------------------------------------------------------------------------------------------------
# Families: each draws layers and steps into a builder and returns (input shape, vocab, outputs).

def _mlp(b: _Builder) -> _Drawn:
    """lin → act → [dropout] → 1-2 more layers, on (B, n) or (B, T, n)."""
    n, m = b.width(), b.width()
    shape = (b.rng.randint(2, 5), n) if b.rng.random() < 0.7 else (b.rng.randint(2, 3), b.width(), n)
    x = b.linear("x", n, h := b.width())
    x = b.act(x)
    if b.rng.random() < 0.3:
        x = b.call(b.add("Dropout", 0.2), x)
        b.variant.append("dropout")
    return shape, 0, b.mlp(x, h, m, b.rng.randint(1, 2))


def _gated(b: _Builder) -> _Drawn:
    """Gated MLPs ``down(act(gate x) ⊙ up x)`` (SwiGLU, GeGLU, ReGLU, GLU, bilinear) on ``(B, n)`` or ``(B, T, n)``,
    with the product spelled ``*``, ``torch.mul`` or ``.mul``, its factors in either order, and variants: a
    square ``u ⊙ u``, a third factor, a product with the input or with a width-1 gate (broadcast), a norm,
    activation or dropout between the product and ``down``, a residual sum of two gated branches, and one
    ``down`` reading two products (shared weights)."""
    rng = b.rng
    n, h, m = b.width(), b.width(), b.width()
    shape = (rng.randint(2, 5), n) if rng.random() < 0.7 else (2, b.width(), n)
    variant = rng.choice(["plain"] * 4 + ["square", "triple", "input", "broadcast", "after", "residual", "shared"])
    if variant == "input":
        h = n
    spell = rng.choice(["mul", "mul_fn", "mul_method"])
    act = rng.choice(["silu", "gelu", "relu", "tanh", "sigmoid", "leaky_relu", "identity", "softplus", "hardtanh"])
    b.variant += [{"silu": "swiglu", "gelu": "geglu", "relu": "reglu", "sigmoid": "glu"}.get(act, act), variant, spell]

    def product(x: str, n_in: int, width: int) -> str:
        gate = b.act(b.linear(x, n_in, 1 if variant == "broadcast" else width), [act])
        up = b.linear(x, n_in, width)
        if variant == "square":
            return b.op(spell, up, up) if rng.random() < 0.5 else b.op(spell, gate, gate)
        if variant == "input":
            return b.op(spell, gate, x) if rng.random() < 0.5 else b.op(spell, x, up)
        out = b.op(spell, gate, up) if rng.random() < 0.5 else b.op(spell, up, gate)
        if variant == "triple":
            out = b.op(spell, out, b.act(b.linear(x, n_in, width)))
        return out

    p = product("x", n, h)
    if variant == "after":
        p = rng.choice([lambda: b.act(p), lambda: b.call(b.add("Dropout", 0.0), p),
                        lambda: b.norm(p, shape[:-1] + (h,)), lambda: b.op("scale", p, c=0.5)])()
    if variant == "shared":
        down = b.add("Linear", h, m, bias=rng.random() < 0.8)
        return shape, 0, b.op("add", b.call(down, p), b.call(down, product("x", n, h)))
    if variant == "residual":
        p = b.op("add", b.linear(p, h, n), "x")
        return shape, 0, b.linear(b.op("add", p, b.linear(product(p, n, h), h, n)), n, m)
    return shape, 0, b.linear(p, h, m)


def _residual(b: _Builder) -> _Drawn:
    """lin, then 1-2 blocks ``x ← x + mlp(norm(x))`` (norm or none), then act → lin."""
    n, d, m = b.width(), b.width(), b.width()
    shape = (b.rng.randint(2, 5), n) if b.rng.random() < 0.5 else (2, b.width(), n)
    x = b.linear("x", n, d)
    for _ in range(b.rng.randint(1, 2)):
        y = b.norm(x, shape[:-1] + (d,)) if b.rng.random() < 0.5 else x
        x = b.op("add", x, b.mlp(y, d, d, b.rng.randint(1, 2)))
    return shape, 0, b.linear(b.act(x), d, m)


def _norm(b: _Builder) -> _Drawn:
    """lin → act → norm (any axis, train or eval) → act → lin, on (B, d) or (B, T, d)."""
    n, h, m = b.width(), b.width(), b.width()
    shape: tuple[int, ...]
    if b.rng.random() < 0.3:
        shape = (b.rng.randint(2, 4), n)
    elif b.rng.random() < 0.3:  # a false claim once found: (B, T=d, d)
        shape = (b.rng.randint(2, 3), h, n)
    else:
        shape = (b.rng.randint(2, 3), b.width(2), n)
    if len(shape) == 3 and shape[1] == h:
        b.variant.append("T=d")
    x = b.act(b.linear("x", n, h))
    x = b.norm(x, shape[:-1] + (h,))
    return shape, 0, b.linear(b.act(x), h, m)


def _conv(b: _Builder) -> _Drawn:
    """conv (padding, groups, depthwise) → [GroupNorm(affine=False) → BatchNorm(eval)] → act → conv → head."""
    rng, two_d = b.rng, b.rng.random() < 0.4
    dim, c_in, c = ("2d" if two_d else "1d"), b.width(), b.width()
    length = rng.randint(3, 6)
    shape = (rng.randint(2, 3), c_in) + ((length, length) if two_d else (length,))
    groups = rng.choice([g for g in range(1, min(c_in, c) + 1) if c_in % g == 0 and c % g == 0])
    if rng.random() < 0.3:
        c, groups = c_in, c_in  # depthwise
    padding = rng.choice([0, 1, "same"])
    b.variant.append(f"conv{dim}-groups{groups}-pad{padding}")
    kernel = rng.choice([1, 3] if padding == "same" else [1, 2, 3])  # even kernels with "same" pad unevenly
    x = b.call(b.add(f"Conv{dim}", c_in, c, kernel, padding=padding, groups=groups,
                     bias=rng.random() < 0.8), "x")
    if rng.random() < 0.3:  # a false claim once found: conv → GroupNorm(affine=False) → BatchNorm(eval)
        b.variant.append("gn-bn")
        x = b.call(b.add("GroupNorm", rng.choice([g for g in range(1, c + 1) if c % g == 0]), c, affine=False), x)
        x = b.call(b.add(f"BatchNorm{dim}", c, train=rng.random() < 0.3), x)
    x = b.act(x)
    c2 = b.width()
    x = b.call(b.add(f"Conv{dim}", c, c2, 1, bias=rng.random() < 0.8), x)
    x = b.op("mean", x, dim=-1) if rng.random() < 0.5 else b.op("flatten", x)
    return shape, 0, x


def _pooling(b: _Builder) -> _Drawn:
    rng = b.rng
    c_in, c = b.width(), b.width()
    two_d = rng.random() < 0.4
    dim = "2d" if two_d else "1d"
    shape = (rng.randint(2, 3), c_in) + ((4, 4) if two_d else (rng.randint(4, 6),))
    kernel = rng.choice([1, 2])
    x = b.act(b.call(b.add(f"Conv{dim}", c_in, c, kernel, bias=rng.random() < 0.8), "x"))
    pool = rng.choice([("MaxPool", (2,)), ("AvgPool", (2,)), ("AdaptiveAvgPool", (1,)), ("AdaptiveMaxPool", (1,))])
    b.variant.append(pool[0])
    x = b.op("flatten", b.call(b.add(pool[0] + dim, *pool[1]), x))
    if rng.random() < 0.25:  # the pooled channels are the output: nothing may move them
        return shape, 0, x
    positions = 1 if pool[0].startswith("Adaptive") else ((shape[2] - kernel + 1) // 2) ** (2 if two_d else 1)
    return shape, 0, b.linear(x, c * positions, b.width())  # a head reads the channels: scalings may pass


def _mha(b: _Builder) -> _Drawn:
    """``nn.MultiheadAttention``: weights returned or used, averaged or per head; batch first or not; keys and
    values from another projection (cross-attention: ``torch.export`` cuts the packed in-projection into pieces),
    a key padding mask, or a per-head 3-d ``attn_mask`` (which must remove the head permutation)."""
    rng, extra = b.rng, b.extra
    heads = rng.randint(1, 3)
    d = heads * rng.randint(1, 3)
    need, average = rng.random() < 0.6, rng.random() < 0.5
    b.variant.append(f"heads{heads}-need{need}-avg{average}")
    n, t = b.width(), b.width(2)
    x = b.linear("x", n, d)
    batch_first, cross, mask = extra.random() < 0.7, extra.random() < 0.3, extra.choice(["", "", "padding", "mask"])
    batch, length = (2, t) if batch_first else (t, 2)
    b.variant += ["seq-first"] * (not batch_first) + ["cross"] * cross + [mask] * bool(mask)
    kv = b.linear("x", n, d) if cross else x
    attn = b.add("MultiheadAttention", d, heads, batch_first=batch_first, bias=rng.random() < 0.8)
    if mask == "padding":
        out, weights = b.ops("mha_padding", x, kv, layer=attn, batch=batch, length=length, need=need, average=average,
                             outs=2)
    elif mask == "mask":   # (B·H, L, S): one mask per head
        layer = b.add("Conv1d", length, batch * heads, length, bias=False)
        out, weights = b.ops("mha_mask", x, kv, layer=attn, mask=layer, need=need, average=average, outs=2)
    else:
        out, weights = (b.ops("mha_kv", x, kv, layer=attn, need=need, average=average, outs=2) if cross else
                        b.ops("mha", x, layer=attn, need=need, average=average, outs=2))
    y = b.linear(b.act(out), d, b.width())
    return (2, t, n), 0, y if not need else (y, weights)


def _attention(b: _Builder) -> _Drawn:
    """Hand-written single/multi-head attention, or ``F.scaled_dot_product_attention``; at times the values pass
    through an activation (before or after the head split: the scores keep their ``GL``, nothing else), and the near
    misses where the value map's output is read again, or the values are computed from the queries."""
    rng = b.rng
    heads, dk = rng.randint(1, 3), rng.randint(1, 3)
    d, n, t, batch = heads * dk, b.width(), b.width(2), 2
    kind = rng.choice(["single", "multi", "sdpa"]) if heads > 1 else rng.choice(["single", "sdpa"])
    b.variant.append(f"{kind}-heads{heads}")
    q, k, v = (b.linear("x", n, d if kind != "single" else dk) for _ in range(3))
    value = b.extra.choice(["", "", "", "act", "read", "query"] + ["act-split"] * (kind != "single"))
    b.variant += [f"value-{value}"] * bool(value)
    mapped = v
    if value in ("act", "query"):
        v = b.act(q if value == "query" else v)
    if kind == "single":
        # one head without a head split: written out, with bmm, by sdpa on (B, L, d); near misses where the query
        # or the key is read again (the output adds it, or it is also the value): QKᵀ is then not all that reads it
        spelling = b.extra.choice(["", "", "bmm", "sdpa", "query-read", "key-as-value"])
        b.variant += [f"single-{spelling}"] * bool(spelling)
        v = k if spelling == "key-as-value" else v
        if spelling == "sdpa":
            o = b.op("sdpa", q, k, v, causal=rng.random() < 0.5)
        elif spelling == "bmm":
            o = b.op("bmm", b.op("softmax", b.op("scale", b.op("bmm_t", q, k), c=dk ** -0.5), dim=-1), v)
        else:
            o = b.op("matmul", b.op("softmax", b.op("scale", b.op("matmul_t", q, k), c=dk ** -0.5), dim=-1), v)
        if spelling == "query-read":
            o = b.op("add", o, q)
    else:
        q, k, v = (b.op("transpose", b.op("reshape", z, shape=(batch, t, heads, dk)), a=1, b=2) for z in (q, k, v))
        if value == "act-split":
            v = b.act(v)
        if kind == "sdpa":
            o = b.op("sdpa", q, k, v, causal=rng.random() < 0.5)
        else:
            o = b.op("matmul", b.op("softmax", b.op("scale", b.op("matmul_t", q, k), c=dk ** -0.5), dim=-1), v)
        o = b.op("reshape", b.op("transpose", o, a=1, b=2), shape=(batch, t, d))
        dk = d
    if value == "read":
        o = b.op("add", o, mapped)
    return (batch, t, n), 0, b.linear(o, dk, b.width())


def _scores(b: _Builder) -> _Drawn:
    """Multi-head attention (``q, k, v`` maps separate or one packed map cut by ``chunk``/``split``; grouped-query
    attention by ``repeat_interleave``, HF's ``[:, :, None].expand(...).reshape(...)`` or ``sdpa(enable_gqa=True)``)
    whose scores are combined with a mask, a bias or a temperature before the softmax; its output may be cut by
    ``split`` into two pieces.

    A tensor ``E`` is the weight of a layer used for its shape only: ``Linear(1, 1)`` (a temperature),
    ``Conv1d(1, H, 1)`` (one per head), ``Linear(T, T)`` (a bias shared by the heads), ``Conv1d(T, H, T)``
    (``(H, T, T)``: one per head), ``Linear(T, 1)`` (``(1, T)``: a factor varying along the keys, which keeps
    the per-head groups but not the key-bias shifts, like ``E / S`` and a finite ``masked_fill``).
    """
    rng = b.rng
    heads, dk = rng.randint(1, 4), rng.randint(1, 3)
    d, n, t, batch = heads * dk, b.width(), b.width(2), 2
    groups = rng.choice([g for g in range(1, heads) if heads % g == 0] or [heads]) if rng.random() < 0.4 else heads
    kv = groups * dk
    if rng.random() < 0.3:   # a packed projection cut into q, k, v (a piece may also be returned)
        b.variant.append("packed")
        packed = b.linear("x", n, d + 2 * kv)
        q, k, v = (b.ops("chunk", packed, n=3, outs=3) if kv == d else
                   b.ops("split", packed, sizes=[d, kv, kv], outs=3))
    else:
        q, k, v = b.linear("x", n, d), b.linear("x", n, kv), b.linear("x", n, kv)
    q = b.op("transpose", b.op("reshape", q, shape=(batch, t, heads, dk)), a=1, b=2)
    k, v = (b.op("transpose", b.op("reshape", z, shape=(batch, t, groups, dk)), a=1, b=2) for z in (k, v))
    spelling = ""
    if groups != heads:   # grouped-query attention: each key/value head serves heads/groups query heads
        spelling = rng.choice(["repeat_interleave", "expand", "enable_gqa"])
        b.variant.append(f"gqa{groups}-{spelling}")
        if spelling != "enable_gqa":
            k, v = (b.op("repeat_interleave", z, r=heads // groups) if spelling == "repeat_interleave" else
                    b.op("repeat_kv", z, shape=(batch, groups, heads // groups, t, dk), merged=(batch, heads, t, dk))
                    for z in (k, v))
    if spelling == "enable_gqa":
        o = b.op("sdpa_gqa", q, k, v, causal=False)
    elif rng.random() < 0.2:
        shared = rng.random() < 0.5
        b.variant.append(f"sdpa-mask-{'shared' if shared else 'per-head'}")
        mask = b.add("Linear", t, t, bias=False) if shared else b.add("Conv1d", t, heads, t, bias=False)
        o = b.op("sdpa_mask_param", q, k, v, layer=mask)
    else:
        scores = b.op("matmul_t", q, k)
        kinds = [rng.choice(["scale", "temperature", "head-temperature", "bias", "head-bias", "key-factor",
                             "key-divisor", "causal-inf", "causal-finite"]) for _ in range(rng.randint(1, 3))]
        # a mask comes last, as in real models: a factor after a -inf fill could make +inf (or NaN) scores
        for kind in sorted(kinds, key=lambda kind: kind.startswith("causal")):
            b.variant.append(kind)
            if kind == "scale":
                scores = b.op("scale", scores, c=dk ** -0.5)
            elif kind in ("temperature", "head-temperature", "key-factor"):
                layer = {"temperature": lambda: b.add("Linear", 1, 1, bias=False),
                         "head-temperature": lambda: b.add("Conv1d", 1, heads, 1, bias=False),
                         "key-factor": lambda: b.add("Linear", t, 1, bias=False)}[kind]()
                scores = b.op("weight_mul", scores, layer=layer)
            elif kind in ("bias", "head-bias"):
                layer = (b.add("Linear", t, t, bias=False) if kind == "bias" else
                         b.add("Conv1d", t, heads, t, bias=False))
                scores = b.op("weight_add", scores, layer=layer)
            elif kind == "key-divisor":
                scores = b.op("weight_rdiv", scores, layer=b.add("Linear", 1, 1, bias=False))
            else:
                scores = b.op("causal_fill_value", scores, t=t, value=float("-inf") if kind == "causal-inf" else -1.5)
        o = b.op("matmul", b.op("softmax", scores, dim=-1), v)
    o = b.op("reshape", b.op("transpose", o, a=1, b=2), shape=(batch, t, d))
    m = b.width()
    y = b.linear(o, d, m)
    if m > 1 and rng.random() < 0.4:   # the output cut in two pieces, each through its own activation
        cut = rng.randint(1, m - 1)
        b.variant.append(f"split{cut}")
        first, second = b.ops("split", y, sizes=[cut, m - cut], outs=2)
        pieces = [b.act(first), b.act(second)]
        y = b.linear(b.op("cat", *(pieces if rng.random() < 0.7 else pieces[::-1]), dim=-1), m, b.width())
    return (batch, t, n), 0, y


def _layouts(b: _Builder) -> _Drawn:
    """Multi-head attention whose heads read other columns of one packed projection than the ``h``-th block
    (:mod:`symalg.frontend.attention_folding`'s column map): GPT-NeoX's ``view(B, T, H, 3d)`` cut by ``chunk`` (the
    pieces in any order, CodeGen's ``q, v, k`` too), BLOOM's ``view(B, T, H, 3, d)`` read by ``select``, Phi-3's
    ``[Q | K | V]`` cut by slices (grouped-query: ``repeat_interleave``) and Falcon's ``view(B, T, G, r + 2, d)`` cut
    into ``r`` query slots and one key and one value slot per group; written with ``sdpa`` or explicitly. Near
    misses: the keys are the queries (shared columns), a key slice overlapping the queries' last column, the
    keys' heads reordered by layout ops (query head ``h`` meets another head's keys), and the packed projection
    normed as a whole before the split (``normed``)."""
    rng = b.rng
    heads, dk = rng.randint(1, 4), rng.randint(1, 3)
    d, n, t, batch = heads * dk, b.width(), b.width(2), 2
    groups = rng.choice([g for g in range(1, heads + 1) if heads % g == 0])
    r, kv = heads // groups, groups * dk
    layout = rng.choice(["neox", "bloom", "sliced", "slots"])
    miss = rng.choice(["", "", "", "shared", "overlap", "normed"] + ["crossed"] * (heads == 4))
    b.variant += [layout] + [f"gqa{groups}"] * (layout in ("sliced", "slots") and groups != heads) + \
        [f"miss-{miss}"] * bool(miss)

    def split(z: str, h: int) -> str:
        return b.op("transpose", b.op("reshape", z, shape=(batch, t, h, dk)), a=1, b=2)

    def project(width: int) -> str:
        """The packed projection; for the near miss ``normed``, through a norm over all of it (OLMoE's ``q_norm``
        before the head split: its gain allows no per-head group)."""
        y = b.linear("x", n, width)
        if miss != "normed":
            return y
        return b.call(b.add(rng.choice(["RMSNorm", "LayerNorm"]), width), y)

    if layout == "neox":
        order = rng.choice([(0, 1, 2), (0, 2, 1), (1, 0, 2)])
        b.variant.append("order" + "".join(map(str, order)))
        packed = b.op("transpose", b.op("view", project(3 * d), shape=(batch, t, heads, 3 * dk)), a=1, b=2)
        pieces = b.ops("chunk", packed, n=3, outs=3)
        q, k, v = (pieces[i] for i in order)
    elif layout == "bloom":
        fused = b.op("view", project(3 * d), shape=(batch, t, heads, 3, dk))
        q, k, v = (b.op("transpose", b.op("select", fused, dim=3, index=i), a=1, b=2) for i in range(3))
    elif layout == "sliced":
        packed = project(d + 2 * kv)
        low = d - 1 if miss == "overlap" and d > 1 else d
        q, k, v = (split(b.op("cut", packed, a=a, b=a + w), h)
                   for a, w, h in ((0, d, heads), (low, kv, groups), (d + kv, kv, groups)))
        if r > 1:
            k, v = (b.op("repeat_interleave", z, r=r) for z in (k, v))
    else:
        fused = b.op("view", project(groups * (r + 2) * dk), shape=(batch, t, groups, r + 2, dk))
        q = b.op("reshape", b.op("cut_slots", fused, a=0, b=r), shape=(batch, t, heads, dk))
        k, v = (b.op("reshape", b.op("cut_slots", fused, a=a, b=a + 1), shape=(batch, t, groups, dk))
                for a in (r, r + 1))
        q, k, v = (b.op("transpose", z, a=1, b=2) for z in (q, k, v))
        if r > 1:
            k, v = (b.op("repeat_interleave", z, r=r) for z in (k, v))
    if miss == "shared":
        k = q
    elif miss == "crossed":   # heads (0, 2, 1, 3) of the keys, by layout ops alone
        k = b.op("reshape", b.op("transpose", b.op("reshape", k, shape=(batch, 2, 2, t, dk)), a=1, b=2),
                 shape=(batch, 4, t, dk))
    if rng.random() < 0.5:
        o = b.op("sdpa", q, k, v, causal=rng.random() < 0.5)
    else:
        o = b.op("matmul", b.op("softmax", b.op("scale", b.op("matmul_t", q, k), c=dk ** -0.5), dim=-1), v)
    o = b.op("reshape", b.op("transpose", o, a=1, b=2), shape=(batch, t, d))
    return (batch, t, n), 0, b.linear(o, d, b.width())


def _embedding(b: _Builder) -> _Drawn:
    """Token embeddings; heads tied through ``F.linear(·, emb.weight)``, pooled by max or mean."""
    rng = b.rng
    vocab, d = b.width(2), b.width()
    emb = b.add("Embedding", vocab, d)
    x = b.call(emb, "x")
    if rng.random() < 0.6:
        x = b.mlp(x, d, d)
    if rng.random() < 0.4:  # a false claim once found: F.linear(fc(emb(t)).max(1)[0], emb.weight)
        x = b.op("max", x, dim=1) if rng.random() < 0.6 else b.op("mean", x, dim=1)
        b.variant.append("pooled")
    if rng.random() < 0.6:
        b.variant.append("tied")
        return (2, b.width()), vocab, b.op("linear_w", x, layer=emb)
    return (2, b.width()), vocab, b.linear(x, d, b.width())


def _concat(b: _Builder) -> _Drawn:
    """Two branches concatenated, then (often) a norm over the concatenation, then a head."""
    rng = b.rng
    n, h1, h2 = b.width(), b.width(), b.width()
    shape = (rng.randint(2, 4), n) if rng.random() < 0.6 else (2, b.width(), n)
    left = b.act(b.linear("x", n, h1))
    right = b.act(b.linear("x", n, h2)) if rng.random() < 0.7 else b.mlp("x", n, h2)
    x = b.op("cat", left, right, dim=-1)
    if rng.random() < 0.7:
        x = b.norm(x, shape[:-1] + (h1 + h2,))
    return shape, 0, b.linear(b.act(x), h1 + h2, b.width())


def _shared(b: _Builder) -> _Drawn:
    """One module called twice: ``out(w(w(x)))``, or ``w`` on the raw input and on a hidden value."""
    rng = b.rng
    d = b.width()
    w = b.add("Linear", d, d, bias=rng.random() < 0.7)
    if rng.random() < 0.5:
        b.variant.append("w(w(x))")
        x = b.call(w, b.act(b.call(w, "x"), ["relu", "identity", "tanh"]))
    else:
        b.variant.append("w(x)+w(h)")
        h = b.act(b.linear("x", d, d))
        x = b.op("add", b.call(w, "x"), b.call(w, h))
    return (rng.randint(2, 4), d), 0, b.linear(x, d, b.width())


def _albert(b: _Builder) -> _Drawn:
    """ALBERT-style weight-shared blocks: ``x ← norm(x + mlp(x))`` with the same modules k times."""
    rng = b.rng
    n, d, h = b.width(), b.width(), b.width()
    shape = (2, b.width(), n) if rng.random() < 0.6 else (rng.randint(2, 4), n)
    x = b.linear("x", n, d)
    up, down = b.add("Linear", d, h), b.add("Linear", h, d)
    norm = b.add(rng.choice(["LayerNorm", "RMSNorm"]), d)
    act = rng.choice(["relu", "gelu", "tanh"])
    k = rng.randint(2, 3)
    b.variant.append(f"x{k}")
    for _ in range(k):
        x = b.call(norm, b.op("add", x, b.call(down, b.act(b.call(up, x), [act]))))
    return shape, 0, b.linear(x, d, b.width())


def _shear(b: _Builder) -> _Drawn:
    """Biases moved into the next layer's bias (``β ↦ β + t``, ``b ↦ b − W t``) and the near misses where no reader's
    bias can give ``W t`` back, on ``(B, T, n)`` or ``(B, n)``: a norm's output (LayerNorm with or without bias,
    ``F.layer_norm``, an eval batch norm) or a linear's output through identity-like ops (``nn.Identity``, dropout
    on or off, a reshape, a transpose there and back, ``torch.cat`` with itself) or ops that change the shift
    (``-y``, ``y * c``, an activation), read by one or two biased or unbiased linears, ``addmm``, a linear shared
    with another input, a linear and a norm, the residual sum, the output, a biased linear whose output is summed
    with the raw input (``x + u``, ``u + x``, ``u − x``; near misses ``x − u``, ``torch.add(x, u, alpha=c)``, an
    activation or an unbiased map reading the sum); or attention (:func:`_shear_attention`)
    whose value bias moves into the output projection's bias."""
    rng = b.rng
    n, d = b.width(), b.width()
    shape = (2, b.width(2), n) if rng.random() < 0.7 else (rng.randint(2, 4), n)
    if len(shape) == 3 and rng.random() < 0.45:
        return _shear_attention(b, shape, d)
    x = b.linear("x", n, d)
    source = rng.choice(["layernorm", "layernorm", "layer_norm_f", "batchnorm", "linear"])
    b.variant.append(source)
    if source == "layernorm":
        y = b.call(b.add("LayerNorm", d, bias=rng.random() < 0.8, elementwise_affine=rng.random() < 0.9), x)
    elif source == "layer_norm_f":
        y = b.op("layer_norm_f", x, d=d, weight=b.add("Parameter", d), bias=b.add("Parameter", d))
    elif source == "batchnorm" and len(shape) == 2:
        y = b.call(b.add("BatchNorm1d", d, train=rng.random() < 0.3), x)
    elif source == "batchnorm":
        y = b.op("transpose", b.call(b.add("BatchNorm1d", d, train=rng.random() < 0.3),
                                     b.op("transpose", x, a=1, b=2)), a=1, b=2)
    else:
        y = x
    width = d
    between = rng.choice(["none", "none", "identity", "dropout", "reshape", "transpose", "cat", "neg", "scale", "act"])
    b.variant.append(between)
    if between == "identity":
        y = b.call(b.add("Identity"), y)
    elif between == "dropout":
        train = rng.random() < 0.5
        b.variant.append("train" if train else "eval")
        y = b.op("dropout_fn", y, p=0.25, training=train)
    elif between == "reshape":
        y = b.op("reshape", b.op("reshape", y, shape=(-1, d)), shape=shape[:-1] + (d,))
    elif between == "transpose" and len(shape) == 3:
        y = b.op("transpose", b.op("transpose", y, a=1, b=2), a=1, b=2)
    elif between == "cat":
        y, width = b.op("cat", y, y, dim=-1), 2 * d
    elif between == "neg":
        y = b.op("neg", y)
    elif between == "scale":
        y = b.op("scale", y, c=rng.choice([0.5, 2.0]))
    elif between == "act":
        y = b.act(y, ("relu", "tanh", "gelu"))
    m = b.width()
    readers = rng.choice(["linear", "linear", "two", "unbiased", "addmm", "residual", "returned", "shared",
                          "normed", "stream"])
    b.variant.append(readers)
    if readers == "stream":   # a biased map's output summed with the raw input (nothing acts on it), then read
        spelling = b.extra.choice(["add", "add", "first", "sub", "sub_first", "alpha", "act", "unbiased"])
        b.variant.append(spelling)
        u = b.linear(y, width, n, True)
        stream = (b.op("sub", "x", u) if spelling == "sub" else b.op("sub", u, "x") if spelling == "sub_first" else
                  b.op("add", u, "x") if spelling == "first" else
                  b.op("add_alpha", "x", u, alpha=b.extra.choice([2.0, -1.0])) if spelling == "alpha" else
                  b.op("add", "x", u))
        stream = b.act(stream, ("relu", "tanh", "gelu")) if spelling == "act" else stream
        out = b.linear(stream, n, m, spelling != "unbiased")
    elif readers == "addmm" and len(shape) == 3:
        out = b.op("addmm", y, layer=b.add("Linear", width, m), n=width, shape=shape[:-1] + (m,))
    elif readers == "two":
        out = b.op("add", b.linear(y, width, m, rng.random() < 0.8), b.linear(y, width, m, rng.random() < 0.8))
    elif readers == "unbiased":
        out = b.linear(y, width, m, False)
    elif readers == "residual" and width == d:
        out = b.linear(b.op("add", x, b.linear(y, width, d, True)) if rng.random() < 0.5 else b.op("add", y, x), d, m)
    elif readers == "returned":
        return shape, 0, (b.linear(y, width, m, True), y)
    elif readers == "shared" and width == d:   # one linear reads the shifted value and another one
        layer = b.add("Linear", d, m)
        out = b.op("add", b.call(layer, y), b.call(layer, x if rng.random() < 0.5 else b.op("scale", y, c=0.5)))
    elif readers == "normed":   # a linear and a norm (any kind and axis, which may ignore the shift) read it
        out = b.op("add", b.linear(y, width, m, True), b.linear(b.norm(y, shape[:-1] + (width,)), width, m))
    else:
        out = b.linear(y, width, m, True)
    return shape, 0, out if rng.random() < 0.7 else b.linear(b.act(out), m, b.width())


def _shear_attention(b: _Builder, shape: tuple, d: int) -> _Drawn:
    """Attention whose value bias moves into the output projection's bias: hand-written (``softmax`` with a causal
    ``-inf`` or finite fill, dropout on the weights on or off), ``sdpa`` (causal, ``dropout_p``), grouped-query
    heads, or ``nn.MultiheadAttention`` (train or eval, with or without bias); the output projection with or
    without bias, the merged heads also returned or summed into the stream, a pre-norm before it."""
    rng = b.rng
    batch, t, n = shape
    x = b.linear("x", n, d)
    if rng.random() < 0.5:
        b.variant.append("pre-ln")
        x = b.call(b.add("LayerNorm", d, bias=rng.random() < 0.8), x)
    kind = rng.choice(["hand", "sdpa", "mha"])
    b.variant.append(kind)
    if kind == "mha":
        heads = rng.choice(_divisors(d))
        train = rng.random() < 0.3
        b.variant.append(f"heads{heads}{'-train' if train else ''}")
        layer = b.add("MultiheadAttention", d, heads, batch_first=True, bias=rng.random() < 0.8,
                      dropout=0.25 if train or rng.random() < 0.5 else 0.0, train=train)
        out, weights = (b.ops("mha_causal", x, layer=layer, t=t, need=False, average=True, outs=2)
                        if rng.random() < 0.5 else b.ops("mha", x, layer=layer, need=False, average=True, outs=2))
        return shape, 0, b.linear(out, d, b.width()) if rng.random() < 0.6 else out
    heads, dk = rng.randint(1, 3), rng.randint(1, 2)
    groups = rng.choice(_divisors(heads))
    inner, kv = heads * dk, groups * dk
    v_bias = rng.random() < 0.8
    q, k = b.linear(x, d, inner), b.linear(x, d, kv)
    v = b.linear(x, d, kv, v_bias)
    b.variant.append(f"heads{heads}-groups{groups}-vbias{v_bias}")
    q = b.op("transpose", b.op("reshape", q, shape=(batch, t, heads, dk)), a=1, b=2)
    k, v = (b.op("transpose", b.op("reshape", z, shape=(batch, t, groups, dk)), a=1, b=2) for z in (k, v))
    if groups < heads:
        k, v = (b.op("repeat_interleave", z, r=heads // groups) for z in (k, v))
    if kind == "sdpa":
        p = rng.choice([0.0, 0.0, 0.3])
        b.variant.append(f"p{p}")
        o = b.op("sdpa_dropout", q, k, v, p=p, causal=rng.random() < 0.5)
    else:
        scores = b.op("scale", b.op("matmul_t", q, k), c=dk ** -0.5)
        fill = rng.choice(["none", "causal_fill", "causal_fill_min", "finite"])
        b.variant.append(fill)
        if fill == "finite":
            scores = b.op("causal_fill_value", scores, t=t, value=-1.5)
        elif fill != "none":
            scores = b.op(fill, scores, t=t)
        weights = b.op("softmax", scores, dim=-1)
        if rng.random() < 0.5:
            train = rng.random() < 0.5
            b.variant.append(f"dropout-{'train' if train else 'eval'}")
            weights = b.op("dropout_fn", weights, p=0.25, training=train)
        o = b.op("matmul", weights, v)
    o = b.op("reshape", b.op("transpose", o, a=1, b=2), shape=(batch, t, inner))
    o_bias = rng.random() < 0.8
    reader = rng.choice(["proj", "proj", "proj", "proj", "returned", "residual", "act"])
    b.variant.append(f"obias{o_bias}-{reader}")
    if reader == "act":
        o = b.act(o, ("relu", "tanh"))
    y = b.linear(o, inner, d, o_bias)
    if reader == "returned":
        return shape, 0, (y, o)
    if reader == "residual" and inner == d:
        y = b.op("add", y, o)
    return shape, 0, b.linear(y, d, b.width()) if rng.random() < 0.5 else y


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _block_norm(b: _Builder, x: str, shape: tuple) -> str:
    """A norm of the stream ``x`` of ``shape`` ``(B, T, d)``: ``nn.LayerNorm``/``nn.RMSNorm`` over the features,
    Hugging Face's RMSNorm written out (``x · rsqrt(mean(x²) + ε) · w``), ``F.layer_norm``, a LayerNorm over
    ``(T, d)``, or any norm of :meth:`_Builder.norm` (batch and group norms, the time axis)."""
    rng, (_, t, d) = b.rng, shape
    kind = rng.choice(["layernorm", "rmsnorm", "rms_hf", "layer_norm_f", "two_axes", "any"])
    if kind == "any":
        return b.norm(x, shape)
    b.variant.append(kind)
    if kind == "layernorm":
        return b.call(b.add("LayerNorm", d, bias=rng.random() < 0.7), x)
    if kind == "rmsnorm":
        return b.call(b.add("RMSNorm", d, elementwise_affine=rng.random() < 0.8), x)
    if kind == "rms_hf":
        return b.op("rms_hf", x, layer=b.add("Parameter", d))
    if kind == "layer_norm_f":
        return b.op("layer_norm_f", x, d=d, weight=b.add("Parameter", d), bias=b.add("Parameter", d))
    return b.call(b.add(rng.choice(["LayerNorm", "RMSNorm"]), (t, d)), x)


_Map = tuple[str, int, bool]
"""An attention map: ``(name, heads, merged)``; ``heads`` 0 where it has no head axis (averaged weights), ``merged``
where batch and heads share axis 0 (``(B·H, T, T)``)."""


def _block_attention(b: _Builder, x: str, shape: tuple) -> tuple[str, _Map | None]:
    """Self-attention on ``x`` of ``shape`` ``(B, T, d)``: ``(output, attention map or None)``.

    ``nn.MultiheadAttention`` (causal or not, weights averaged or per head), or q/k/v projections (separate,
    or packed and split by ``chunk``/``split``), heads split by ``view``/``reshape``/``unflatten``, grouped
    key/value heads (``repeat_interleave`` or Hugging Face's ``repeat_kv``), q/k norms over the head axis,
    RoPE, then ``F.scaled_dot_product_attention`` (causal, an additive mask parameter, ``enable_gqa``) or
    ``softmax(q kᵀ/√d_k [· temperature] [+ bias | ALiBi] [causal masked_fill]) v`` written out (by ``@`` on
    ``(B, H, T, d_k)``, or by ``torch.bmm`` on ``(B·H, T, d_k)`` as BART and ``nn.MultiheadAttention`` do), whose
    probabilities, dropped out in eval mode at times, are the attention map (for ``sdpa``, at times the merged heads).
    """
    rng, (batch, t, d) = b.rng, shape
    kind = rng.choice(["hand", "hand", "sdpa", "mha"])
    if kind == "mha":
        heads, causal = rng.choice(_divisors(d)[:3]), rng.random() < 0.4
        need, average = rng.random() < 0.5, rng.random() < 0.5
        b.variant.append(f"mha{heads}{'-causal' if causal else ''}-need{need}-avg{average}")
        layer = b.add("MultiheadAttention", d, heads, batch_first=True, bias=rng.random() < 0.7)
        out, weights = (b.ops("mha_causal", x, layer=layer, t=t, need=need, average=average, outs=2) if causal else
                        b.ops("mha", x, layer=layer, need=need, average=average, outs=2))
        return out, (weights, 0 if average else heads, False) if need else None
    heads = rng.randint(1, 4)
    groups = rng.choice(_divisors(heads)) if rng.random() < 0.4 else heads
    rope = rng.choice(ROPE_KINDS) if rng.random() < 0.3 else None
    dk = (4 if rope == "partial" else rng.choice([2, 4])) if rope else rng.randint(1, 3)
    inner, kv, bias = heads * dk, groups * dk, rng.random() < 0.6
    b.variant.append(f"{kind}{heads}" + (f"-gqa{groups}" if groups < heads else "") + (f"-rope-{rope}" if rope else ""))
    if rng.random() < 0.3:
        b.variant.append("qkv")
        qkv = b.linear(x, d, inner + 2 * kv, bias)
        q, k, v = (b.ops("chunk", qkv, n=3, outs=3) if kv == inner and rng.random() < 0.5 else
                   b.ops("split", qkv, sizes=(inner, kv, kv), outs=3))
    else:
        q, k, v = b.linear(x, d, inner, bias), b.linear(x, d, kv, bias), b.linear(x, d, kv, bias)
    split = rng.choice(["view", "reshape", "unflatten"])

    def split_heads(z: str, n: int) -> str:
        z = b.op("unflatten", z, sizes=(n, dk)) if split == "unflatten" else b.op(split, z, shape=(batch, t, n, dk))
        return b.op("transpose", z, a=1, b=2)

    q, k, v = split_heads(q, heads), split_heads(k, groups), split_heads(v, groups)
    if rng.random() < 0.2:  # q/k norms over the head axis (Qwen3, OLMo 2)
        b.variant.append("qknorm")
        cls = rng.choice(["LayerNorm", "RMSNorm"])
        q, k = b.call(b.add(cls, dk), q), b.call(b.add(cls, dk), k)
    if rope:
        q, k = _block_rope(b, rope, q, k, heads, groups, t, dk)

    def repeat(z: str) -> str:
        r = heads // groups
        return (b.op("repeat_interleave", z, r=r) if rng.random() < 0.5 else
                b.op("repeat_kv", z, shape=(batch, groups, r, t, dk), merged=(batch, heads, t, dk)))

    attention_map: _Map | None = None
    if kind == "sdpa":
        causal = rng.random() < 0.5
        if groups < heads and rng.random() < 0.5:
            o = b.op("sdpa_gqa", q, k, v, causal=causal)
        else:
            k, v = (repeat(k), repeat(v)) if groups < heads else (k, v)
            if rng.random() < 0.3:
                b.variant.append("mask")
                mask = b.op("param", layer=b.add("Parameter", rng.choice([1, heads]), t, t))
                o = b.op("sdpa_mask", q, k, v, mask)
            else:
                b.variant.append("causal" if causal else "full")
                o = b.op("sdpa", q, k, v, causal=causal)
    else:
        k, v = (repeat(k), repeat(v)) if groups < heads else (k, v)
        merged = b.extra.random() < 0.25
        if merged:
            b.variant.append("bmm")
            q, k, v = (b.op("reshape", z, shape=(batch * heads, t, dk)) for z in (q, k, v))
        scores = b.op("scale", b.op("bmm_t" if merged else "matmul_t", q, k), c=dk ** -0.5)
        if rng.random() < 0.2:
            b.variant.append("temperature")
            scores = b.op("mul", scores, b.op("param", layer=b.add("Parameter", 1)))
        position = rng.choice(["none", "none", "bias"] + ([] if merged else ["alibi"]))
        if position == "bias":  # a learned additive (relative-position) bias, per head or shared
            b.variant.append("bias")
            scores = b.op("add", scores, b.op("param", layer=b.add("Parameter", 1 if merged else
                                                                   rng.choice([1, heads]), t, t)))
        elif position == "alibi":
            b.variant.append("alibi")
            scores = b.op("alibi", scores)
        if rng.random() < 0.5:
            b.variant.append("causal")
            scores = b.op(rng.choice(["causal_fill", "causal_fill_min"]), scores, t=t)
        probabilities = b.op("softmax", scores, dim=-1)
        if b.extra.random() < 0.25:   # dropout on the probabilities, in eval mode
            b.variant.append("dropout")
            probabilities = b.call(b.add("Dropout", b.extra.choice([0.1, 0.5]), train=False), probabilities)
        attention_map = (probabilities, heads, merged)
        o = b.op("bmm" if merged else "matmul", probabilities, v)
        if merged:
            o = b.op("reshape", o, shape=(batch, heads, t, dk))
    o = b.op("transpose", o, a=1, b=2)
    merge = rng.choice(["reshape", "view", "flatten"])
    if merge == "flatten":
        o = b.op("flatten_from", o, start=2)
    else:
        o = b.op(merge, b.op("contiguous", o) if merge == "view" else o, shape=(batch, t, inner))
    if attention_map is None and rng.random() < 0.3:   # the merged heads returned: the value bias cannot move
        b.variant.append("merged")
        attention_map = (o, 0, False)   # read as it is or summed over its features, never per head
    return b.linear(o, inner, d, rng.random() < 0.6), attention_map


ROPE_KINDS = ("hf", "hf", "swapped", "per-head", "learned", "q-only", "partial", "interleaved", "unsigned")
"""The rotary embeddings :func:`_block_rope` draws (Hugging Face's twice as often as each near miss)."""


def _block_rope(b: _Builder, kind: str, q: str, k: str, heads: int, groups: int, t: int, dk: int) -> tuple[str, str]:
    """Rotary embeddings of ``kind`` (:data:`ROPE_KINDS`) on the split queries and keys (``(B, H, T, d_k)``): Hugging
    Face's (``rope_tables`` and ``q·cos + rotate_half(q)·sin``, or ``rotate_half(q)·sin + cos·q``), and near misses
    the rules must not take for it: tables that differ per head (the head permutation must go), learned tables (not
    equal on the halves: the query/key group must go), the queries alone rotated, GPT-NeoX's partial rotation (the
    first half of ``d_k``), GPT-J's interleaved pairs, ``rotate_half`` without its sign. Tables per head are drawn for
    the ``heads`` query heads and the ``groups`` key heads apart (other tables for the queries than for the keys)."""
    if kind == "per-head":
        cos, sin = b.ops("rope_tables_per_head", q, dim=dk, heads=heads, outs=2)
        if groups != heads:
            key_cos, key_sin = b.ops("rope_tables_per_head", k, dim=dk, heads=groups, outs=2)
            return b.op("rope", q, cos, sin), b.op("rope", k, key_cos, key_sin)
    elif kind == "learned":
        cos, sin = (b.op("param", layer=b.add("Parameter", t, dk)) for _ in range(2))
    elif kind == "interleaved":
        cos, sin = b.ops("rope_tables_interleaved", q, dim=dk, outs=2)
    else:
        cos, sin = b.ops("rope_tables", q, dim=dk // 2 if kind == "partial" else dk, outs=2)
    if kind == "partial":
        return b.op("rope_partial", q, cos, sin, r=dk // 2), b.op("rope_partial", k, cos, sin, r=dk // 2)
    if kind in ("interleaved", "unsigned"):
        extra = {"h": dk // 2} if kind == "unsigned" else {}
        return b.op(f"rope_{kind}", q, cos, sin, **extra), b.op(f"rope_{kind}", k, cos, sin, **extra)
    op = "rope_swapped" if kind == "swapped" else "rope"
    return b.op(op, q, cos, sin), (k if kind == "q-only" else b.op(op, k, cos, sin))


def _block_mlp(b: _Builder, x: str, d: int) -> str:
    """``down(act(up x))``, or gated ``down(act(gate x) ⊙ up x)`` (SwiGLU, GeGLU), gate and up separate or packed
    in one linear and split by ``chunk``."""
    rng, h = b.rng, b.width()
    kind = rng.choice(["plain", "gated", "packed"])
    bias = rng.random() < 0.5
    if kind == "plain":
        b.variant.append("mlp")
        return b.linear(b.act(b.linear(x, d, h, bias)), h, d, bias)
    act = rng.choice(["silu", "gelu", "relu", "sigmoid"])
    b.variant.append(f"{kind}-{act}")
    if kind == "packed":
        gate, up = b.ops("chunk", b.linear(x, d, 2 * h, bias), n=2, outs=2)
    else:
        gate, up = b.linear(x, d, h, bias), b.linear(x, d, h, bias)
    return b.linear(b.op("mul", b.act(gate, [act]), up), h, d, bias)


def _block(b: _Builder) -> _Drawn:
    """Transformer blocks on ``(B, T, d)``: an input projection or token embedding, an optional learned absolute
    position table, 1-2 blocks (pre-norm, post-norm, parallel or without norms; attention by
    :func:`_block_attention`, MLP by :func:`_block_mlp`; two blocks may share their modules), a final norm
    and a head (tied to the embedding or not), returning the attention maps too, at times."""
    rng, batch, t, d = b.rng, 2, b.rng.randint(2, 4), b.width()
    shape: tuple[int, ...]   # (B, T) token ids or (B, T, n) features
    if rng.random() < 0.25:
        vocab, shape = b.width(2), (batch, t)
        embedding = b.add("Embedding", vocab, d)
        x = b.call(embedding, "x")
    else:
        vocab, embedding, shape = 0, None, (batch, t, b.width())
        x = b.linear("x", shape[-1], d)
    if rng.random() < 0.25:
        b.variant.append("abs-pos")
        x = b.op("add", x, b.op("param", layer=b.add("Parameter", t, d)))
    stream, maps = (batch, t, d), []

    def block(x: str) -> str:
        placement = rng.choice(["pre", "pre", "post", "parallel", "none"])
        b.variant.append(placement)
        norm = (lambda z: _block_norm(b, z, stream)) if placement != "none" else (lambda z: z)
        if placement == "parallel":  # GPT-J: x + attn(n(x)) + mlp(n(x))
            y = norm(x)
            a, attention_map = _block_attention(b, y, stream)
            maps.append(attention_map)
            return b.op("add", b.op("add", x, a), _block_mlp(b, y, d))
        a, attention_map = _block_attention(b, x if placement == "post" else norm(x), stream)
        maps.append(attention_map)
        x = b.op("add", x, a)
        x = norm(x) if placement == "post" else x
        if rng.random() < 0.8:
            x = b.op("add", x, _block_mlp(b, x if placement == "post" else norm(x), d))
            x = norm(x) if placement == "post" else x
        return x

    if rng.random() < 0.3:
        b.variant.append("shared")
        x = b.twice(block, x)
    else:
        for _ in range(rng.choice([1, 1, 2])):
            x = block(x)
    if rng.random() < 0.5:
        x = _block_norm(b, x, stream)
    if embedding and rng.random() < 0.4:
        b.variant.append("tied")
        y = b.op("linear_w", x, layer=embedding)
    else:
        y = b.linear(x, d, b.width())
    returned = [_read_map(b, m, batch, t) for m in maps if m is not None and rng.random() < 0.4]
    if returned:
        b.variant.append("maps")
    return shape, vocab, (y, *returned) if returned else y


def _read_map(b: _Builder, attention_map: _Map, batch: int, t: int) -> str:
    """What a block returns of an attention map: the map, its sum over the keys, or (per head) its mean over the
    heads (the only reader a head permutation leaves unchanged), head 0, or the map scaled per head; a merged
    ``(B·H, T, T)`` map is viewed as ``(B, H, T, T)`` first, at times."""
    rng = b.extra
    name, heads, merged = attention_map
    if merged and rng.random() < 0.5:
        name, merged = b.op("reshape", name, shape=(batch, heads, t, t)), False
    kinds = ["returned", "sum-keys"] + (["mean-heads", "head0", "head-scale"] if heads and not merged else [])
    kind = rng.choice(kinds)
    b.variant.append(f"map-{kind}" + ("-merged" if merged else ""))
    if kind == "sum-keys":
        return b.op("sum", name, dim=-1)
    if kind == "mean-heads":
        return b.op("mean", name, dim=1)
    if kind == "head0":
        return b.op("token0", name)
    if kind == "head-scale":
        return b.op("weight_mul", name, layer=b.add("Conv1d", 1, heads, 1, bias=False))
    return name


def _layers(b: _Builder) -> _Drawn:
    """Layers as real models write them, on ``(B, T, n)``: GPT-2's ``addmm`` dense layer (a linear's weight
    transposed) or a linear, an activation (tanh GELU among them), ``F.layer_norm`` with a module's weights or RMS
    norm written out (gain or none, over the features or, after a transpose, over the tokens), then the first
    token ``x[:, 0]``, the first feature ``x.select(-1, 0)`` (which must block the sites) or all tokens; sometimes a
    learned first token (``expand`` of a parameter, ViT's CLS token) is put before the tokens."""
    rng = b.rng
    n, d, batch, t = b.width(), b.width(), rng.randint(2, 3), b.width(2)
    if rng.random() < 0.5:
        b.variant.append("addmm")
        x = b.op("addmm", "x", layer=b.add("Linear", n, d), n=n, shape=(batch, t, d))
    else:
        x = b.linear("x", n, d)
    x = b.op("gelu_tanh", x) if rng.random() < 0.3 else b.act(x, ("relu", "tanh", "gelu", "silu", "identity"))
    norm = rng.choice(["layer_norm_fn", "rms", "rms_gain", "rms_tokens", "none"])
    b.variant.append(norm)
    if norm == "layer_norm_fn":
        x = b.op("layer_norm_fn", x, layer=b.add("LayerNorm", d, bias=rng.random() < 0.7), d=d)
    elif norm != "none":
        eps = rng.choice([1e-6, 1e-5])  # eps = 0 after a ReLU: an all-zero row is 0/0
        if norm == "rms_tokens":
            x = b.op("transpose", b.op("rms_written", b.op("transpose", x, a=1, b=-1), eps=eps), a=1, b=-1)
        else:
            x = b.op("rms_written", x, eps=eps)
        if norm == "rms_gain":
            x = b.op("gain", x, layer=b.add("RMSNorm", d))
    if rng.random() < 0.3:
        b.variant.append("cls")
        x = b.op("prepend", x, layer=b.add("Embedding", 1, d), batch=batch, d=d)
    pick = rng.choice(["token0", "feature0", "all"])
    b.variant.append(pick)
    if pick == "token0":
        x = b.op("token0", b.act(x))
    elif pick == "feature0":
        tokens = t + ("cls" in b.variant)
        return (batch, t, n), 0, b.linear(b.op("select", x, dim=-1, index=0), tokens, b.width())
    return (batch, t, n), 0, b.linear(x, d, b.width())


def _swish(b: _Builder) -> _Drawn:
    """Swish with a trainable per-neuron ``β``, ``lin(z ⊙ σ(β ⊙ z))``, ``z = lin(x)``, on ``(B, n)`` or ``(B, T, n)``,
    with the products spelled ``*``, ``torch.mul`` or ``.mul`` in either order and the sigmoid as ``torch.sigmoid``,
    ``F.sigmoid`` or ``.sigmoid()``, or another pointwise gate (``tanh``, ``gelu``, ``relu``, …); one ``β`` shared
    by two such layers; and near misses that must claim no scaling of ``β``: a scalar ``β`` (shape ``()`` or
    ``(1,)``), ``β`` along the time axis (``(T, 1)``), a number instead of ``β``, ``σ(β z + c)``, ``σ(β z z)``,
    ``σ(β z')`` of another layer's ``z'``, ``softmax`` or ``cumsum`` (not pointwise; ``z ⊙ g(β ⊙ z)`` keeps the
    scalings for any ``g``, since its argument does not move, but the permutations only for a ``g`` that commutes
    with them, which ``cumsum`` does not) for the sigmoid, ``β`` also added to the output, the product ``β z`` also
    read outside the sigmoid."""
    rng = b.rng
    n, h, m = b.width(), b.width(), b.width()
    shape = (rng.randint(2, 5), n) if rng.random() < 0.6 else (2, b.width(2), n)
    variant = rng.choice(["plain"] * 4 + ["shared", "scalar", "time_axis", "constant", "shifted", "squared", "other",
                          "gate", "gate", "softmax", "cumsum", "beta_read", "product_read"])
    if variant == "time_axis" and len(shape) == 2:
        variant = "scalar"
    spell = rng.choice(["mul", "mul_fn", "mul_method"])
    sigmoid = rng.choice(["sigmoid", "sigmoid_method", "act"])
    b.variant += [variant, spell, sigmoid]
    beta_shape = {"scalar": rng.choice([(), (1,)]), "time_axis": (shape[1], 1)}.get(variant, (h,))
    beta = None if variant == "constant" else b.op("param", layer=b.add("Parameter", *beta_shape))

    def product(u: str, v: str) -> str:
        return b.op(spell, u, v) if rng.random() < 0.5 else b.op(spell, v, u)

    def swish(z: str, x: str, n_in: int) -> str:
        if beta is None:
            argument = b.op("scale", z, c=1.5)
        else:
            argument = product(beta, b.linear(x, n_in, h) if variant == "other" else z)
        if variant == "shifted":
            argument = b.op("shift", argument, c=0.5)
        elif variant == "squared":
            argument = product(argument, z)
        if variant == "gate":
            name = b.extra.choice(["tanh", "gelu", "relu", "softplus", "elu", "leaky_relu", "hardtanh", "mish", "selu"])
            b.variant.append(name)
            gate = b.op("act", argument, name=name)
        elif variant in ("softmax", "cumsum"):
            gate = b.op("softmax", argument, dim=-1) if variant == "softmax" else b.op("cumsum", argument)
        else:
            gate = b.op("act", argument, name="sigmoid") if sigmoid == "act" else b.op(sigmoid, argument)
        out = product(z, gate)
        if variant == "product_read":
            out = b.op("add", out, argument)
        return b.op("add", out, beta) if variant == "beta_read" and beta is not None else out

    a = swish(b.linear("x", n, h), "x", n)
    if variant == "shared":
        a = swish(b.linear(a, h, h), a, h)
    return shape, 0, b.linear(a, h, m)
BRANCH_ACTIVATIONS = ("relu", "leaky_relu", "tanh", "sigmoid", "gelu", "silu", "hardtanh", "softplus", "elu")
BRANCH_NAMES = {">": "gt", ">=": "ge", "<": "lt", "<=": "le", "==": "eq", "!=": "ne"}


def _branch(b: _Builder) -> _Drawn:
    """``lin(F.a(z) if x.shape[axis] cmp k else F.b(z))``, ``z = lin(x)``: an activation chosen by an input size (fx
    cannot trace the branch; ``torch.export`` specialises the graph to the example's sizes), on the batch axis of
    ``(B, n)`` or the batch or sequence axis of ``(B, T, n)``, the threshold next to the example's size so that the
    sizes certification tries (a batch of one and of ``B + 1``, ``T ∓ 1``) take the other branch. Near misses that
    keep their claims: the same activation both ways, ReLU and leaky ReLU (the same groups)."""
    rng = b.rng
    n, h, m = b.width(), b.width(2), b.width()
    shape = (rng.randint(2, 5), n) if rng.random() < 0.5 else (rng.randint(2, 3), rng.randint(2, 5), n)
    axis = rng.choice([0] if len(shape) == 2 else [0, 1])
    size, cmp = shape[axis], rng.choice(list(COMPARISONS))
    k = {">": size - 1, ">=": size, "<": size + 1, "<=": size, "==": size, "!=": size + 1}[cmp]
    kind = rng.choice(["two"] * 4 + ["same", "homogeneous"])
    first = "relu" if kind == "homogeneous" else rng.choice(BRANCH_ACTIVATIONS)
    second = {"same": first, "homogeneous": "leaky_relu"}.get(kind) or rng.choice(BRANCH_ACTIVATIONS)
    b.variant += [f"axis{axis}", BRANCH_NAMES[cmp], first, second]
    z = b.op("branch", b.linear("x", n, h), a=first, b=second, axis=axis, cmp=cmp, k=k)
    return shape, 0, b.linear(z, h, m)


SPECIALISED_FAMILIES = frozenset({"branch"})
"""Families whose trace holds for the example's sizes only: their raw claims (``certify=False``) are the rules' on the
branch traced and are checked at those sizes; certified claims at every size certification tries."""

SPECIAL_BASES = ("mlp", "swish", "gated", "residual", "shear", "norm", "even", "power")
SPECIAL_VALUES = (1.0, 1.0, 0.0, 0.0, 1e-6, 0.5)
"""Values :func:`generate` sets parameters of the ``special`` family to: equal entries (the usual initialisation of
gains and of swish's ``β``), zeros (a zero-initialised head or bias), a tiny layer scale, a shared constant."""


def _special(b: _Builder) -> _Drawn:
    """A model of one of :data:`SPECIAL_BASES` whose parameters :func:`generate` partly sets to special values
    (:data:`SPECIAL_VALUES`), where a false claim can leave the outputs unchanged: certification must check the
    claims at a generic point as well."""
    base = b.rng.choice(SPECIAL_BASES)
    b.variant.append(base)
    return FAMILIES[base](b)


EVEN_OPS = ("abs", "abs", "abs_method", "absolute", "abs_plus", "abs_times", "abs_shifted", "abs_sigmoid", "tanh_abs")
"""What the ``even`` family draws in place of an activation: ``|z|`` in its three spellings, and near misses where its
input-side sign flips must go (``|z| + z`` reads the input again, ``z ⊙ |z|`` is odd, ``|z − ½|`` is not even in
``z``) or where only they hold (``σ(|z|)``: no scaling; ``|tanh z|``, which the rules need not find)."""


def _zero_sum(b: _Builder) -> _Drawn:
    """lin → [act] → a norm → [an op] → a reader → [act → lin]: a linear map reading the whole output of a gain-free
    LayerNorm (``nn.LayerNorm(d, elementwise_affine=False)``, ``F.layer_norm(x, (d,))``) may add ``c 1ᵀ`` to its
    weight. Near misses: a gain, a bias alone, RMSNorm, a LayerNorm over ``(T, d)``; an activation, dropout (train or
    eval), a residual sum, a concatenation, a slice or a transpose between; a reader whose weight another call shares
    or that reads the norm through ``F.linear`` without a bias."""
    rng = b.rng
    n, d, m = b.width(), b.width(2), b.width()
    shape = (rng.randint(2, 4), n) if rng.random() < 0.4 else (2, b.width(2), n)
    x = b.linear("x", n, d)
    x = b.act(x) if rng.random() < 0.3 else x
    norm = rng.choice(["plain", "plain", "bare", "bias", "gain", "rms", "two_axes"])
    norm = "plain" if norm == "two_axes" and len(shape) == 2 else norm
    between = rng.choice(["none", "none", "none", "relu", "dropout", "dropout-eval", "add", "cat", "slice",
                          "transpose"])
    between = "none" if between == "transpose" and len(shape) == 2 else between
    b.variant += [norm, between]
    if norm in ("plain", "gain", "rms", "two_axes"):
        cls, size = ("RMSNorm" if norm == "rms" else "LayerNorm"), ((shape[1], d) if norm == "two_axes" else d)
        bias: dict[str, Any] = {"bias": rng.random() < 0.5} if norm == "gain" else {}
        y = b.call(b.add(cls, size, elementwise_affine=norm == "gain", **bias), x)
    else:
        y = b.op("layer_norm_bare", x, d=d) if norm == "bare" else \
            b.op("layer_norm_bias", x, d=d, bias=b.add("Parameter", d))
    width = {"cat": 2 * d, "slice": d - 1, "transpose": shape[1]}.get(between, d)
    if between == "relu":
        y = b.act(y, ["relu"])
    elif between.startswith("dropout"):
        y = b.call(b.add("Dropout", 0.5, train=between == "dropout"), y)
    elif between in ("add", "cat"):
        y = b.op("add", y, x) if between == "add" else b.op("cat", y, x, dim=-1)
    elif between == "slice":
        y = b.ops("split", y, sizes=[d - 1, 1], outs=2)[0]
    elif between == "transpose":
        y = b.op("transpose", y, a=1, b=-1)
    reader = rng.choice(["module", "module", "linear_w", "shared"])
    b.variant.append(reader)
    if reader == "linear_w":
        out = b.op("linear_w", y, layer=b.add("Linear", width, m, bias=False))
    elif reader == "shared":
        layer = b.add("Linear", width, m, bias=rng.random() < 0.7)
        other = b.act(b.linear("x", n, width))
        out = b.op("add", b.call(layer, y), b.call(layer, other))
    else:
        out = b.linear(y, width, m)
    return shape, 0, b.linear(b.act(out), m, b.width()) if rng.random() < 0.5 else out


def _even(b: _Builder) -> _Drawn:
    """A model of another family (MLP, residual, norm, conv, pooling, gated, shared, outputs) whose activations are,
    70 % of the time, ``|z|`` or a near miss of it (:data:`EVEN_OPS`, drawn from their own stream)."""
    base = b.rng.choice(["mlp", "mlp", "residual", "norm", "conv", "pooling", "gated", "shared", "concat"])
    b.evens = random.Random(b.rng.random())
    b.variant.append(base)
    return FAMILIES[base](b)


POWER_EXPONENTS = ("abs1", "abs1", "softplus", "softplus", "exp", "exp", "bare", "scalar", "time_axis", "number",
                   "data", "p_read", "step_read", "bias", "two_params", "cumsum", "flip", "shared")
"""The exponents the ``power`` family draws (see :func:`_power`)."""


def _power(b: _Builder) -> _Drawn:
    """``lin(g(z) ** e)``, ``z = lin(x)``, on ``(B, n)`` or ``(B, T, n)``, a positive base ``g`` (``relu``,
    ``softplus``, ``sigmoid``, ``|·|``), the power spelled ``**``, ``.pow`` or ``torch.pow``, and an exponent
    computed from a per-unit parameter ``p`` (``|p| + 1``, ``softplus(p)``, ``exp(p)``, ``p`` itself: the sites'
    permutations must move ``p``, no scaling may be claimed) or a near miss: a scalar ``p`` or one along the time
    axis (``(T, 1)``: permutations hold without moving it), a number, the input (``|x| + 1``, one entry per unit),
    ``p`` or ``e`` also read elsewhere, the layer's own bias, two parameters, ``cumsum`` or ``flip`` (not
    pointwise: moving ``p`` does not move ``e``), one ``p`` shared by two such layers."""
    rng = b.rng
    n, h, m = b.width(), b.width(), b.width()
    exponent = rng.choice(POWER_EXPONENTS)
    shape = (rng.randint(2, 5), n) if rng.random() < 0.6 else (2, b.width(2), n)
    if exponent == "time_axis" and len(shape) == 2:
        exponent = "scalar"
    if exponent == "data":
        h = n
    base = rng.choice(["softplus", "sigmoid"] if exponent == "bare" else ["relu", "softplus", "sigmoid", "abs"])
    spell = rng.choice(["pow", "pow_method", "pow_fn"])
    b.variant += [exponent, base, spell]
    p_shape = {"scalar": rng.choice([(), (1,)]), "time_axis": (shape[1], 1)}.get(exponent, (h,))
    p = b.op("param", layer=b.add("Parameter", *p_shape))

    def positive(u: str) -> str:
        return b.op("shift", b.op("abs_method", u), c=1.0)

    def power(z: str) -> str:
        g = b.op("abs_method", z) if base == "abs" else b.op("act", z, name=base)
        if exponent == "number":
            return b.op("pow_number", g, c=rng.choice([2, 3, 0.5, 1.5, 0.1]))
        e = {"softplus": lambda: b.op("act", p, name="softplus"), "exp": lambda: b.op("exp", p),
             "bare": lambda: p, "data": lambda: positive("x"), "bias": lambda: positive(b.op("bias", layer=first)),
             "two_params": lambda: b.op("add", b.op("abs_method", p), b.op("act", other, name="softplus")),
             "cumsum": lambda: positive(b.op("cumsum", p)), "flip": lambda: positive(b.op("flip", p)),
             }.get(exponent, lambda: positive(p))()
        a = b.op(spell, g, e)
        if exponent == "step_read":
            a = b.op("add", a, e)   # |p| + 1 read again, outside the power
        return b.op("add", a, p) if exponent == "p_read" else a

    other = b.op("param", layer=b.add("Parameter", h)) if exponent == "two_params" else ""
    first = b.add("Linear", n, h)
    a = power(b.call(first, "x"))
    if exponent == "shared":
        a = power(b.linear(a, h, h))
    return shape, 0, b.linear(a, h, m)


def _weight_norm_family(b: _Builder) -> _Drawn:
    """An MLP on ``(B, n)`` or ``(B, T, n)`` whose linear layers are (at least one, each other with probability 1/2)
    reparametrised by the hook-based ``nn.utils.weight_norm`` (``weight = g v / ‖v‖`` per row, per column or over
    the whole weight) or, in eval mode, ``nn.utils.spectral_norm``: the forward pre-hook computes ``weight`` before
    every call, and the tracer must see it."""
    rng, n, m = b.rng, b.width(), b.width()
    shape = (rng.randint(2, 5), n) if rng.random() < 0.7 else (rng.randint(2, 3), b.width(), n)
    depth = rng.randint(2, 4)
    widths = [n] + [b.width() for _ in range(depth - 1)] + [m]
    forced = rng.randrange(depth)
    x = "x"
    for i, (a, c) in enumerate(zip(widths, widths[1:])):
        wrap = rng.choice(["weight_norm", "weight_norm", "weight_norm_all", "weight_norm_in", "spectral_norm"]) \
            if i == forced or rng.random() < 0.5 else ""
        b.variant.append(wrap or "plain")
        x = b.call(b.add("Linear", a, c, bias=rng.random() < 0.8, train=wrap != "spectral_norm", wrap=wrap), x)
        x = b.act(x) if i < depth - 1 else x
    return shape, 0, x


def _scripted(b: _Builder) -> _Drawn:
    """An MLP one of whose modules (the first or the last linear layer, the activation module, a LayerNorm) is
    ``torch.jit.script``-ed: compiled code neither tracer reads, so every model is a refusal naming the module."""
    rng, n, h, m = b.rng, b.width(), b.width(), b.width()
    shape = (rng.randint(2, 5), n)
    which = rng.choice(["first", "activation", "norm", "last"])
    b.variant.append(which)
    x = b.call(b.add("Linear", n, h, wrap="script" if which == "first" else ""), "x")
    if which == "norm":
        x = b.call(b.add("LayerNorm", h, wrap="script"), x)
    x = b.call(b.add(rng.choice(["ReLU", "Tanh", "GELU", "SiLU"]), wrap="script" if which == "activation" else ""), x)
    return shape, 0, b.call(b.add("Linear", h, m, wrap="script" if which == "last" else ""), x)


def _complex(b: _Builder) -> _Drawn:
    """Complex values: a complex linear layer (``dtype=torch.complex128``) on the input made complex, its real part
    read on (a refusal naming the parameter); or a real model with an FFT inside (``|fft(h)|``, ``rfft`` read as
    real pairs) or returning one (``fft(h)``, a complex output): the FFT is an unknown op, the rest must hold."""
    rng, n, h, m = b.rng, b.width(), b.width(2), b.width()
    shape = (rng.randint(2, 5), n) if rng.random() < 0.7 else (rng.randint(2, 3), b.width(), n)
    kind = rng.choice(["param", "fft_abs", "rfft", "fft_out"])
    b.variant.append(kind)
    if kind == "param":
        z = b.call(b.add("Linear", n, h, dtype=torch.complex128), b.op("to_complex", "x"))
        return shape, 0, b.linear(b.act(b.op("real", z)), h, m)
    x = b.act(b.mlp("x", n, h, rng.randint(2, 3)))
    if kind == "fft_abs":
        return shape, 0, b.linear(b.op("fft_abs", x), h, m)
    if kind == "rfft":
        return shape, 0, b.linear(b.op("rfft_real", x), 2 * (h // 2 + 1), m)
    return shape, 0, b.op("fft", b.linear(x, h, m))


CONTRACTIONS = ("x_wt", "x_wt", "x_w", "w_x", "bias", "shared", "tokens")
"""What the ``contraction`` family draws: a value times a weight matrix read as a dense map,
``x @ W.transpose(-2, -1)``, ``x @ W`` (``W`` stored ``(in, out)``), ``W @ xᵀ`` transposed back, with a bias added,
one ``W`` read twice; the near miss ``W @ x`` over the tokens (the sites run along the features)."""


def _contraction_family(b: _Builder) -> _Drawn:
    """Dense maps written as products with a weight matrix (Falcon's ``x @ W.T``), between activations and a
    ``Linear`` (:data:`CONTRACTIONS`)."""
    rng, n, d, m = b.rng, b.width(), b.width(2), b.width()
    kind = rng.choice(CONTRACTIONS)
    b.variant.append(kind)
    t = rng.randint(2, 4)
    shape = (rng.randint(2, 4), t, n) if kind == "tokens" or rng.random() < 0.4 else (rng.randint(2, 5), n)

    def weight(*size: int) -> str:
        return b.op("param", layer=b.add("Parameter", *size))

    x = b.act(b.linear("x", n, n))
    if kind in ("x_wt", "bias", "shared"):
        w = weight(d, n)
        h = b.op("matmul_t", x, w)
        if kind == "bias":
            h = b.op("add", h, weight(d))
        if kind == "shared" and d == n:   # the same W twice: x W^T W^T
            h = b.op("matmul_t", b.act(h), w)
    elif kind == "x_w":
        h = b.op("matmul", x, weight(n, d))
    elif kind == "w_x":
        h = b.op("transpose", b.op("matmul", weight(d, n), b.op("transpose", x, a=-2, b=-1)), a=-2, b=-1)
    else:
        h, d = b.op("matmul", weight(t, t), x), n
    return shape, 0, b.linear(b.act(h), d, m)


LAYER_SCALES = ("vector", "vector", "keepdim", "conv", "residual", "scalar", "per_position", "twice")
"""What the ``layer_scale`` family draws: a per-feature ``γ`` of shape ``(d,)``, ``(1, …, d)``, ``(C, 1)`` after a
convolution, in a residual branch (CaiT), and the near misses: one ``γ`` for every feature (``(1,)``), a ``γ`` per
position and feature (``(T, d)``), ``γ`` applied twice."""


def _layer_scale(b: _Builder) -> _Drawn:
    """A learnable layer scale ``h ⊙ γ`` (ConvNeXt, CaiT) between dense layers (:data:`LAYER_SCALES`), written
    ``h * γ`` or ``γ * h``."""
    rng, n, d, m = b.rng, b.width(), b.width(2), b.width()
    kind = rng.choice(LAYER_SCALES)
    b.variant.append(kind)
    t = rng.randint(2, 4)
    shape = (rng.randint(2, 4), t, n) if kind in ("keepdim", "per_position") or rng.random() < 0.3 else \
        (rng.randint(2, 5), n)
    gamma = {"vector": (d,), "keepdim": (1,) * (len(shape) - 1) + (d,), "residual": (d,), "scalar": (1,),
             "per_position": (t, d), "twice": (d,), "conv": (d, 1)}[kind]

    def scale(x: str) -> str:
        p = b.op("param", layer=b.add("Parameter", *gamma))
        return b.op("mul", x, p) if rng.random() < 0.5 else b.op("mul", p, x)

    if kind == "conv":
        shape = (shape[0], n, t)
        h = scale(b.act(b.call(b.add("Conv1d", n, d, 1), "x")))
        return shape, 0, b.call(b.add("Conv1d", d, m, 1), h)
    h = b.linear("x", n, d)
    if kind == "residual":
        y = b.op("add", h, scale(b.mlp(b.act(h), d, d, 2)))
    else:
        y = scale(b.act(h))
        y = scale(y) if kind == "twice" else y
    return shape, 0, b.linear(y, d, m)


CENTRING = ("pre_ln", "post_ln", "minus", "alpha", "plus_parameter", "plus_input", "rms", "linear_reader", "returned",
            "two_axes")
"""What the ``centring`` family draws: a residual stream written by an embedding or a linear map and by 1-3 blocks,
read by LayerNorms (``LN(x + a 1) = LN(x)``: every writer may move its output along ``1``), its sums spelled ``+``,
``-`` and ``torch.add(·, ·, alpha=c)``, with a parameter or the model input added; and the near misses: an RMSNorm
(no mean subtracted), a linear map or the model output reading the stream, a LayerNorm over two axes."""


def _centring(b: _Builder) -> _Drawn:
    """A LayerNorm-read residual stream (:data:`CENTRING`) on ``(B, T, ·)``, token ids or features."""
    rng, d = b.rng, b.width(2)
    kind = rng.choice(CENTRING)
    b.variant.append(kind)
    tokens = rng.random() < 0.5
    vocab, n, t = (b.width(2), 0, rng.randint(2, 4)) if tokens else (0, b.width(), rng.randint(2, 4))
    x = b.call(b.add("Embedding", vocab, d), "x") if tokens else b.linear("x", n, d)

    def read(h: str) -> str:
        if kind == "rms":
            return b.call(b.add("RMSNorm", d), h)
        if kind == "two_axes":
            return b.call(b.add("LayerNorm", (t, d)), h)
        return b.call(b.add("LayerNorm", d, elementwise_affine=rng.random() < 0.8, bias=rng.random() < 0.7), h)

    for _ in range(rng.randint(1, 3)):
        branch = b.mlp(b.act(b.linear(x if kind == "post_ln" else read(x), d, d)), d, d, rng.randint(1, 2))
        op = {"minus": "sub", "alpha": "add_alpha"}.get(kind, "add")
        x = b.op(op, x, branch, **({"alpha": 0.5} if op == "add_alpha" else {}))
        if kind == "post_ln":
            x = read(x)
    if kind == "plus_parameter":
        x = b.op("add", x, b.op("param", layer=b.add("Parameter", d)))
    if kind == "plus_input" and not tokens and n == d:
        x = b.op("add", x, "x")
    head = b.linear(x if kind == "linear_reader" else read(x), d, b.width())
    if kind == "returned":
        return (2, t) if tokens else (2, t, n), vocab, b.op("cat", head, x, dim=-1)
    return ((2, t) if tokens else (2, t, n)), vocab, head
VISION = ("resnet", "resnet", "mobilenet", "mobilenet", "viewed", "view_written", "train", "no_gain")
"""What the ``vision`` family draws: a ResNet block (conv → BN → ReLU, conv → BN, ``out += shortcut``, in-place ReLU),
a MobileNet block (1×1 expansion, depthwise conv, each with BN and ReLU6 or hardtanh, 1×1 projection with BN), and
the near misses: a slice of the residual taken before the in-place add and returned (it sees the write), an in-place
write to a slice (it writes its base), batch norm in training mode, batch norm without a gain."""


def _vision(b: _Builder) -> _Drawn:
    """Convolutional blocks of vision models (:data:`VISION`): bias-free convolutions, eval-mode batch norm,
    in-place residual adds and activations; traced by fx or by export alone (:data:`EXPORTED`)."""
    rng, c_in, c = b.rng, b.width(), b.width(2)
    kind = rng.choice(VISION)
    b.variant.append(kind)
    size = rng.randint(3, 6)
    shape = (rng.randint(2, 3), c_in, size, size)

    def conv_bn(x: str, n_in: int, n_out: int, kernel: int, groups: int = 1) -> str:
        eps = rng.choice([1e-5, 1e-3, 0.0])
        x = b.call(b.add("Conv2d", n_in, n_out, kernel, padding=kernel // 2, groups=groups,
                         bias=rng.random() < 0.3), x)
        return b.call(b.add("BatchNorm2d", n_out, eps=eps, affine=kind != "no_gain",
                            train=kind == "train"), x)

    def activate(x: str) -> str:
        return b.op("relu_", x) if rng.random() < 0.5 else b.act(x, ("relu", "relu6", "hardtanh", "silu", "tanh"))

    h = activate(conv_bn("x", c_in, c, rng.choice([1, 3])))
    views: tuple[str, ...] = ()
    if kind == "mobilenet":
        wide = c * rng.randint(1, 2)
        y = activate(conv_bn(h, c, wide, 1))
        y = activate(conv_bn(y, wide, wide, 3, groups=wide))
        y = conv_bn(y, wide, c, 1)
        h = b.op("add", h, y) if rng.random() < 0.5 else b.op("iadd", y, h)
    else:
        y = conv_bn(activate(conv_bn(h, c, c, 3)), c, c, rng.choice([1, 3]))
        if kind == "viewed":
            views = (b.op("channels", y, k=rng.randint(1, c)),)
        if kind == "view_written":
            b.op("mul_", b.op("channels", y, k=rng.randint(1, c)), c=rng.choice([2.0, -1.0]))
        h = b.op("add_" if rng.random() < 0.5 else "iadd", y, h)
        h = b.op("relu_", h)
    head = b.call(b.add("Conv2d", c, b.width(), 1), h)
    out = b.op("mean", head, dim=(-2, -1)) if rng.random() < 0.6 else b.op("flatten", head)
    return shape, 0, (out, *views) if views else out


def registered_models() -> list[tuple[str, int]]:
    """Every ``(op, k)`` the ``rules`` family draws, from the op-rule registry (:mod:`symalg.catalogue.rules`):
    ``k = 0`` the op's example, ``k ≥ 1`` its near miss ``k − 1``. A rule registered with its example and near misses is
    fuzzed with no change here.

    >>> ("linear", 0) in registered_models()
    True
    """
    return [(op, k) for op, registration in sorted(REGISTRY.items()) if registration.example is not None
            for k in range(1 + len(registration.near_misses))]


def build_registered(op: str, k: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The registered model ``(op, k)`` (:func:`registered_models`) in float64 with the fuzzer's values
    (:func:`randomize`), floating inputs in float64, drawn from the global torch seed."""
    registration = REGISTRY[op]
    factory = registration.example if k == 0 else registration.near_misses[k - 1]
    if factory is None:
        raise SpecError(f"build_registered: op {op!r} registers no example")
    model, inputs = factory()
    return randomize(model.double()), tuple(i.double() if i.is_floating_point() else i for i in inputs)


def _rules(b: _Builder) -> _Drawn:
    """A registered op's example or one of its near misses (:func:`registered_models`), traced by fx or, for a share,
    by ``torch.export`` (:data:`EXPORTED`), which reads the ops' ATen spellings."""
    b.registered = b.rng.choice(registered_models())
    op, k = b.registered
    b.variant.append(op if k == 0 else f"{op}~{k}")
    return (), 0, "x"


def _torch_layers(b: _Builder) -> _Drawn:
    """torch's own composite layers nested in a model (fx traces through them, or the automatic tracer exports the
    model): ``nn.TransformerEncoderLayer`` or ``nn.TransformerDecoderLayer`` (memory the target itself or another
    projection), batch or sequence first, post- or pre-norm, ReLU or GELU, with or without biases, in eval or
    training mode (dropout on the attention weights and the feed-forward units then, drawn at times); near misses:
    a causal mask, and a mask per head (``(B·H, L, L)``, which must remove the head permutation)."""
    rng = b.rng
    heads = rng.randint(1, 3)
    d, ff, n, t = heads * rng.randint(1, 3), b.width(), b.width(), b.width(2)
    kind, mask = rng.choice(["encoder", "encoder", "decoder"]), rng.choice(["", "", "causal", "per-head"])
    mask = "" if kind == "decoder" and mask == "per-head" else mask
    batch_first, norm_first, bias = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.8
    activation, train = rng.choice(["relu", "gelu"]), rng.random() < 0.3
    dropout = 0.25 if train and rng.random() < 0.5 else 0.0
    b.variant += [kind, f"heads{heads}", activation] + ["seq-first"] * (not batch_first) + ["pre-norm"] * norm_first \
        + ["no-bias"] * (not bias) + ["train"] * train + ["dropout"] * bool(dropout) + [mask] * bool(mask)
    x = b.linear("x", n, d)
    cls = "TransformerEncoderLayer" if kind == "encoder" else "TransformerDecoderLayer"
    layer = b.add(cls, d, heads, ff, dropout=dropout, activation=activation, batch_first=batch_first,
                  norm_first=norm_first, bias=bias, train=train)
    if kind == "decoder":
        memory = b.linear("x", n, d) if rng.random() < 0.5 else x
        y = b.op("decoder_layer_causal", x, memory, layer=layer, t=t) if mask == "causal" else \
            b.op("decoder_layer", x, memory, layer=layer)
    elif mask == "causal":
        y = b.op("torch_layer_causal", x, layer=layer, t=t)
    elif mask == "per-head":   # (2·H, T, T): one mask per head and batch row
        y = b.op("torch_layer_mask", x, layer=layer, mask=b.add("Conv1d", t, 2 * heads, t, bias=False))
    else:
        y = b.call(layer, x)
    return ((2, t, n) if batch_first else (t, 2, n)), 0, b.linear(b.act(y), d, b.width())


def _bilinear(b: _Builder) -> _Drawn:
    """``nn.Bilinear(x₁, x₂)`` between hidden layers: each input from its own dense layer (through an activation at
    times), or both the same value; near misses: an input read raw (data, which pins its axis), an input from a
    LayerNorm or a shifted activation (``x + 1``: a translation that no bias of a bilinear map gives back)."""
    rng = b.rng
    n, m = b.width(), b.width()
    sides = []
    shared = rng.random() < 0.25
    for side in range(1 if shared else 2):
        kind = rng.choice(["linear", "linear", "act", "raw", "norm", "shifted"])
        b.variant.append(kind)
        if kind == "raw":
            sides.append(("x", n))
            continue
        width = b.width()
        h = b.linear("x", n, width)
        if kind == "act":
            h = b.act(h)
        elif kind == "norm":
            h = b.call(b.add("LayerNorm", width), h)
        elif kind == "shifted":
            h = b.op("shift", b.act(h, ("relu", "tanh", "sigmoid")), c=1.0)
        sides.append((h, width))
    if shared:
        b.variant.append("shared")
        sides.append(sides[0])
    (x1, n1), (x2, n2) = sides
    bias = rng.random() < 0.8
    b.variant += ["no-bias"] * (not bias)
    y = b.op("bilinear", x1, x2, layer=b.add("Bilinear", n1, n2, m, bias=bias))
    return (b.width(2), n), 0, b.linear(b.act(y), m, b.width())


def _conv_transpose(b: _Builder) -> _Drawn:
    """``nn.ConvTranspose1d/2d`` (stride 1-2, padding 0-1, output padding, dilation, bias or none) after a convolution
    (through an activation at times) and before a convolution reading its channels; near misses: the raw input
    (pinned), an eval BatchNorm before it (a shift of its input changes the borders), two groups (refused)."""
    rng = b.rng
    dims, c, h, m = rng.choice([1, 1, 2]), b.width(), b.width(), b.width()
    conv, transposed = ("Conv1d", "ConvTranspose1d") if dims == 1 else ("Conv2d", "ConvTranspose2d")
    source = rng.choice(["conv", "conv", "act", "raw", "norm"])
    groups = 2 if source != "raw" and rng.random() < 0.15 else 1
    b.variant += [transposed, source] + ["groups2"] * (groups == 2)
    if source == "raw":
        x, width = "x", c
    else:
        width = b.width() * groups
        x = b.call(b.add(conv, c, width, rng.choice([1, 2]), bias=rng.random() < 0.8), "x")
        if source == "act":
            x = b.act(x)
        elif source == "norm":
            x = b.call(b.add(f"BatchNorm{dims}d", width, train=False), b.act(x))
    stride, padding = rng.choice([1, 2]), rng.choice([0, 1])
    y = b.call(b.add(transposed, width, h * groups, rng.choice([1, 2, 3]), stride=stride, padding=padding,
                     output_padding=rng.choice([0, stride - 1]), dilation=rng.choice([1, 1, 2]), groups=groups,
                     bias=rng.random() < 0.8), x)
    y = b.call(b.add(conv, h * groups, m, 1), b.act(y))
    return (2, c, *(5,) * dims), 0, y


EINSUMS = {   # kind: (equation, operands (x a value, w a weight), weight shape in widths n (in), d (out), t, h)
    "mlp": ("bi,oi->bo", "xw", "dn"), "tokens_mlp": ("bti,oi->bto", "xw", "dn"), "in_out": ("bi,io->bo", "xw", "nd"),
    "weight_first": ("oi,bi->bo", "wx", "dn"), "implicit": ("bi,oi", "xw", "dn"),
    "heads": ("bti,hdi->bthd", "xw", "hdn"), "per_head": ("bhi,hoi->bho", "xw", "hdn"),
    "token_mix": ("bti,ts->bsi", "xw", "tt"), "axes": ("bti->tbi", "x", ""), "token_sum": ("bti->bi", "x", ""),
    # near misses: the sites kept as a batch index of the weight, summed alone, on a diagonal, broadcast, paired
    # with another value, or the output's axes swapped by the implicit (ASCII) order
    "batch_index": ("bi,oi->bi", "xw", "dn"), "sites_sum": ("bi,o->bo", "xw", "d"), "diagonal": ("bii->bi", "x", ""),
    "ellipsis": ("...i,oi->...o", "xw", "dn"), "two_values": ("bi,bj->bij", "xx", ""),
    "implicit_swap": ("zi,oi", "xw", "dn")}
"""What the ``einsum`` family draws: ``torch.einsum`` with a weight (dense maps, head projections, a weight mixing
tokens), of one value (axes moved, a sum over tokens), and the near misses (the last six)."""


def _einsum_family(b: _Builder) -> _Drawn:
    """A ReLU-like or other activation, ``torch.einsum`` (:data:`EINSUMS`), an activation and a ``Linear`` reading
    the result's last axis (heads merged by ``flatten``, tokens or swapped axes moved back by ``transpose``)."""
    rng, n, d, m = b.rng, b.width(), b.width(2), b.width()
    kind = rng.choice(sorted(EINSUMS))
    equation, operands, sizes = EINSUMS[kind]
    b.variant.append(kind)
    t, heads = rng.randint(2, 4), rng.randint(2, 3)
    tokens = any(c in kind for c in ("token", "heads", "axes")) or kind == "diagonal"
    shape = (rng.randint(2, 4), heads if kind == "per_head" else n if kind == "diagonal" else t, n) if tokens or \
        kind == "per_head" else (rng.randint(2, 5), n)
    x = b.act(b.linear("x", n, n))
    if operands == "xx":
        h = b.op("flatten", b.op("einsum2", x, b.act(b.linear("x", n, n)), equation=equation))
        return shape, 0, b.linear(b.act(h), n * n, m)
    if "w" in operands:
        values = {"x": x, "w": b.op("param", layer=b.add("Parameter", *({"n": n, "d": d, "t": t, "h": heads}[c]
                                                                            for c in sizes)))}
        h = b.op("einsum2", *(values[c] for c in operands), equation=equation)
    else:
        h = b.op("einsum", x, equation=equation)
    width = heads * d if kind == "heads" else n if kind in ("token_mix", "axes", "token_sum", "batch_index",
                                                            "diagonal") else d
    if kind == "heads":
        h = b.op("flatten_from", b.act(h), start=-2)
    elif kind in ("axes", "implicit_swap"):
        h = b.op("transpose", b.act(h), a=0, b=1)
    return shape, 0, b.linear(b.act(h), width, m)
PARTIAL_KINDS = ("partial", "partial", "full", "mismatched", "passed-first", "trailing", "q-only", "learned")
"""The rotary embeddings :func:`_rotary` draws: GPT-NeoX's partial rotation twice as often as each near miss."""


def _rotary(b: _Builder) -> _Drawn:
    """One attention (biased ``q, k, v, o`` maps at times, grouped-query at times) with partial rotary embeddings
    (:data:`PARTIAL_KINDS`: ``cat((rope(x[…, :r]), x[…, r:]))`` on queries and keys; the near misses rotate the keys
    on other coordinates than the queries, put the passed coordinates first or rotate the trailing ones, rotate the
    queries alone or use learned tables) and scores through a soft cap ``c·tanh(S/c)`` at times (the key bias must
    not translate); a near miss applies ``tanh`` to the queries before the product (no attention to fold)."""
    rng = b.rng
    heads, dk, t, batch = rng.randint(1, 3), rng.choice([4, 6, 8]), b.width(2), 2
    groups = rng.choice([g for g in range(1, heads) if heads % g == 0] or [heads]) if rng.random() < 0.3 else heads
    n, bias, kind = b.width(), rng.random() < 0.7, rng.choice(PARTIAL_KINDS)
    r = rng.choice([r for r in range(2, dk, 2)])
    b.variant.append(f"{kind}{r}of{dk}-h{heads}-g{groups}")
    q, k, v = b.linear("x", n, heads * dk, bias), b.linear("x", n, groups * dk, bias), b.linear("x", n, groups * dk,
                                                                                                 bias)
    q = b.op("transpose", b.op("reshape", q, shape=(batch, t, heads, dk)), a=1, b=2)
    k, v = (b.op("transpose", b.op("reshape", z, shape=(batch, t, groups, dk)), a=1, b=2) for z in (k, v))
    if kind == "learned":
        cos, sin = (b.op("param", layer=b.add("Parameter", t, r)) for _ in range(2))
    else:
        cos, sin = b.ops("rope_tables", q, dim=dk if kind == "full" else r, outs=2)
    if kind == "full":
        q, k = (b.op("rope", z, cos, sin) for z in (q, k))
    elif kind in ("passed-first", "trailing"):
        op, at = ("partial_passed_first", r) if kind == "passed-first" else ("partial_trailing", dk - r)
        q, k = (b.op(op, z, cos, sin, r=at) for z in (q, k))
    else:
        q = b.op("rope_partial", q, cos, sin, r=r)
        if kind == "mismatched":   # the keys rotated on the first dk - 2 coordinates
            key_cos, key_sin = b.ops("rope_tables", k, dim=dk - 2 if r != dk - 2 else 2, outs=2)
            k = b.op("rope_partial", k, key_cos, key_sin, r=dk - 2 if r != dk - 2 else 2)
        elif kind != "q-only":
            k = b.op("rope_partial", k, cos, sin, r=r)
    if groups != heads:
        k, v = (b.op("repeat_interleave", z, r=heads // groups) for z in (k, v))
    if rng.random() < 0.15:
        b.variant.append("tanh-q")
        q = b.op("tanh", q)
    scores = b.op("scale", b.op("matmul_t", q, k), c=dk ** -0.5)
    if rng.random() < 0.5:
        b.variant.append("softcap")
        scores = b.op("softcap", scores, c=rng.choice([2.0, 5.0]))
    if rng.random() < 0.4:
        b.variant.append("causal")
        scores = b.op("causal_fill", scores, t=t)
    o = b.op("matmul", b.op("softmax", scores, dim=-1), v)
    o = b.op("reshape", b.op("transpose", o, a=1, b=2), shape=(batch, t, heads * dk))
    return (batch, t, n), 0, b.linear(o, heads * dk, b.width(), bias)
def _recurrent(b: _Builder) -> _Drawn:
    """``nn.RNN`` (tanh or ReLU), ``nn.GRU`` or ``nn.LSTM`` (1-3 layers, bidirectional, batch or sequence first, with
    or without biases) between a dense layer (through an activation at times) or the raw input and a readout of its
    output sequence (through an activation at times); near misses: an initial state computed from the input (the
    units cannot move), dropout between layers in training mode, the final state ``h_n`` (``c_n``) read by a map
    (one layer and direction: it moves with the units; several: stacked, blocked) or returned, a projection
    (``proj_size``, refused)."""
    rng = b.rng
    cell = rng.choice(["RNN", "RNN", "GRU", "LSTM"])
    layers, bidirectional, batch_first = rng.choice([1, 1, 2, 3]), rng.random() < 0.3, rng.random() < 0.5
    n, hidden, t = b.width(), b.width(), b.width(2)
    options: dict[str, Any] = dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first,
                                   bias=rng.random() < 0.8)
    if cell == "RNN":
        options["nonlinearity"] = rng.choice(["tanh", "relu"])
    near = rng.choice(["", "", "", "h0", "dropout", "final", "returned", "proj"])
    if near == "proj" and (cell != "LSTM" or hidden == 1) or near == "dropout" and layers == 1:
        near = ""
    if near == "proj":
        options["proj_size"] = rng.randint(1, hidden - 1)
    train = near == "dropout"
    if train:
        options["dropout"] = 0.5
    b.variant += [cell, f"layers{layers}"] + [options.get("nonlinearity", "")] * (cell == "RNN") + \
        ["bidirectional"] * bidirectional + ["seq-first"] * (not batch_first) + \
        ["no-bias"] * (not options["bias"]) + [near] * bool(near)
    source = rng.choice(["linear", "act", "raw"])
    width = n if source == "raw" else b.width()
    x = "x" if source == "raw" else b.linear("x", n, width)
    x = b.act(x) if source == "act" else x
    layer = b.add(cell, width, hidden, train=train, **options)
    directions = 1 + bidirectional
    out = options.get("proj_size") or hidden
    final = None
    if near == "h0":
        h = b.linear(b.op("select", "x", dim=1 if batch_first else 0, index=0), n, hidden)
        y = b.op("recurrent_lstm_h0" if cell == "LSTM" else "recurrent_h0", x, h, layer=layer, k=layers * directions)
    elif near in ("final", "returned"):   # one call: (output, h_n), an LSTM's h_n or c_n
        y, final = b.ops("recurrent_lstm_final", x, layer=layer, which=rng.choice([0, 1]), outs=2) \
            if cell == "LSTM" else b.ops("recurrent_final", x, layer=layer, outs=2)
    else:
        y = b.op("recurrent", x, layer=layer)
    readout = b.linear(b.act(y) if rng.random() < 0.5 else y, directions * out, b.width())
    shape = (2, t, n) if batch_first else (t, 2, n)
    if final is None:
        return shape, 0, readout
    return shape, 0, (readout, b.linear(final, out, b.width())
                      if near == "final" else final)
MOE_VARIANTS = ("plain", "plain", "shared", "unnormalised", "top1", "jitter", "jitter_eval", "logits", "widths",
                "swapped")
"""The ``moe`` family's blocks: recognised ones (Mixtral-like, Qwen2-MoE's sigmoid-gated shared expert, weights not
renormalised, top-1, router noise in eval mode) and near misses (router noise in training mode, the router logits
returned as an output, experts of different widths, the up rows before the gate rows)."""


def _moe(b: _Builder) -> _Drawn:
    """A sparse mixture-of-experts block (:class:`~symalg.catalogue.rules.moe.SparseMoE`, :data:`MOE_VARIANTS`) on a
    stream from a dense layer, through an activation or a norm at times, in a residual branch at times, read by a dense
    layer."""
    rng = b.rng
    n, d, inter, experts, m = b.width(), b.width(2), b.width(), rng.randint(2, 5), b.width()
    kind = rng.choice(MOE_VARIANTS)
    source = rng.choice(["linear", "act", "norm"])
    residual = rng.random() < 0.4
    b.variant += [kind, source, f"E{experts}"] + ["residual"] * residual
    options: dict[str, Any] = {"experts": experts, "top_k": 1 if kind == "top1" else rng.randint(1, experts)}
    variants: dict[str, dict[str, Any]] = {
        "shared": {"shared": b.width()}, "unnormalised": {"normalise": False}, "jitter": {"jitter": 0.2},
        "jitter_eval": {"jitter": 0.2}, "logits": {"logits": True},
        "widths": {"widths": tuple(rng.randint(1, inter) for _ in range(experts))}, "swapped": {"swapped": True}}
    options.update(variants.get(kind, {}))
    h = b.linear("x", n, d)
    h = b.act(h) if source == "act" else b.call(b.add("RMSNorm", d), h) if source == "norm" else h
    block = b.add("SparseMoE", d, inter, train=kind == "jitter", **options)
    if kind == "logits":
        y, logits = b.ops("layer", h, outs=2, layer=block)
    else:
        y, logits = b.call(block, h), ""
    y = b.op("add", h, y) if residual else y
    out = b.linear(y, d, m)
    return (rng.randint(1, 3), rng.randint(1, 4), n), 0, (out, logits) if logits else out


FAMILIES: dict[str, Callable[[_Builder], _Drawn]] = {
    "mlp": _mlp, "gated": _gated, "residual": _residual, "norm": _norm, "conv": _conv, "pooling": _pooling,
    "mha": _mha, "attention": _attention, "scores": _scores, "embedding": _embedding, "concat": _concat,
    "shared": _shared, "albert": _albert, "block": _block, "layers": _layers, "shear": _shear,
    "outputs": _mlp,  # an MLP that generate() always makes return a dict or tuple, hidden values included
    "swish": _swish,
    "even": _even,
    "zero_sum": _zero_sum,
    "power": _power,
    "branch": _branch,
    "special": _special,
    "weight_norm": _weight_norm_family,
    "scripted": _scripted,
    "complex": _complex,
    "rules": _rules,
    "layer_scale": _layer_scale,
    "contraction": _contraction_family,
    "torch_layers": _torch_layers,
    "bilinear": _bilinear,
    "conv_transpose": _conv_transpose,
    "einsum": _einsum_family,
    "centring": _centring,
    "rotary": _rotary,
    "recurrent": _recurrent,
    "moe": _moe,
    "layouts": _layouts,
    "vision": _vision,
}
"""Model families by name; :func:`generate` draws from them in turn."""

EXPORTED = {"mha": 0.3, "attention": 0.3, "scores": 0.3, "block": 0.3, "rules": 0.3, "torch_layers": 0.3,
            "bilinear": 0.3, "conv_transpose": 0.3, "einsum": 0.3, "rotary": 0.3, "recurrent": 0.3, "moe": 0.3,
            "layouts": 0.3, "vision": 0.5}
"""Families some of whose models are traced by ``torch.export`` alone (with this probability, drawn apart from the
model), since fx traces every generated model and export decomposes ``nn.MultiheadAttention`` and spells attention
with ATen ops (``bmm``, ``baddbmm``, ``select``, ``squeeze``) that attention folding must read exactly (fx traces
through torch's unmasked Transformer layers too)."""


def generate(seed: int, index: int, family: str | None = None) -> Case:
    """The model number ``index`` of ``seed`` (family ``family``, by default the ``index``-th in turn).

    The same arguments give the same model, values included.
    """
    names = list(FAMILIES)
    family = names[index % len(names)] if family is None else family
    if family not in FAMILIES:
        raise SpecError(f"generate: unknown family {family!r}; known: {', '.join(names)}")
    rng = random.Random(f"{seed}:{index}:{family}")
    b = _Builder(rng, random.Random(f"{seed}:{index}:{family}:extra"))
    shape, vocab, result = FAMILIES[family](b)
    outputs = result if isinstance(result, tuple) else (result,)
    kind = "tuple" if len(outputs) > 1 else "tensor"
    # dicts and tuples, hidden values exposed (a registered model returns what its example returns)
    if b.registered is None and (family == "outputs" or rng.random() < 0.15):
        hidden = [s.out for s in b.steps if isinstance(s.out, str) and s.out not in outputs]
        outputs += tuple(rng.sample(hidden, min(len(hidden), rng.randint(0, 2))))
        kind = rng.choice(["dict", "tuple"])
    tracer = "export" if random.Random(f"{seed}:{index}:{family}:tracer").random() < EXPORTED.get(family, 0) \
        else "auto"
    special = _special_values(b, random.Random(f"{seed}:{index}:{family}:special")) if family == "special" else ()
    variant = "-".join(b.variant + ([kind] if kind != "tensor" else []) + (["export"] if tracer == "export" else [])
                       + [f"{name}={value:g}" for name, value in special]) or "plain"
    return Case(seed, index, family, variant, tuple(b.layers), tuple(b.steps), (kind, outputs), shape, vocab,
                rng.randrange(2 ** 31), tracer, special, b.registered)


def _special_values(b: _Builder, rng: random.Random) -> tuple[tuple[str, float], ...]:
    """One or two floating parameters of the drawn model and the special values they get (:data:`SPECIAL_VALUES`)."""
    names = [name for name, _ in FuzzModel(b.layers, b.steps, ("tensor", ("x",))).named_parameters()]
    return tuple((name, rng.choice(SPECIAL_VALUES)) for name in rng.sample(names, min(len(names), rng.randint(1, 2))))


# ---------------------------------------------------------------------------------------------------
# Running and checking.

def derive_claims(graph: ModelGraph, certify: bool,
                  catalogue: Mapping[str, CatalogueEntry] | None = None) -> Analysis:
    """``symalg.derive(graph, certify=certify)``: raw inferred claims with ``certify=False`` (the inference
    rules' own error rate), the claims derive reports with ``certify=True``."""
    return derive(graph, catalogue, certify=certify)


class _Hang(BaseException):
    """A model ran past the fuzzer's time limit (a ``BaseException``, like ``KeyboardInterrupt``, so that
    the ``except Exception`` of fallbacks inside symalg and torch cannot swallow it)."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`_Hang` after ``seconds`` of this process's CPU time (``SIGPROF``, main thread only):
    CPU time, not wall time, so that a loaded machine does not turn slow models into hangs. The timer
    repeats every ``seconds``: a library that catches every exception may swallow one signal, not all."""
    def alarm(signum: int, frame: FrameType | None) -> NoReturn:
        raise _Hang(f"over {seconds} CPU seconds")

    previous = signal.signal(signal.SIGPROF, alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@dataclass(frozen=True)
class FalseClaim:
    """A claim that changed an output: ``error`` (relative) on ``output`` under ``element``."""

    case: str
    family: str
    claim: str
    error: float
    element: str
    output: str


@dataclass(frozen=True)
class Failure:
    """A crash (``error`` not a documented refusal, with the innermost frames) or a hang."""

    case: str
    family: str
    error: str
    where: str = ""


@dataclass
class FamilyFigures:
    """One family's counts; ``seconds`` is CPU time (build, trace, derive, check)."""

    models: int = 0
    claims: int = 0
    false_claims: int = 0
    refusals: int = 0
    crashes: int = 0
    hangs: int = 0
    seconds: float = 0.0


@dataclass
class FuzzReport:
    """What :func:`run` found; ``certified`` says whether ``derive`` certified the claims it made."""

    seed: int
    certified: bool = False
    models: int = 0
    claims: int = 0
    refusals: int = 0
    false_claims: list[FalseClaim] = field(default_factory=list)
    crashes: list[Failure] = field(default_factory=list)
    hangs: list[Failure] = field(default_factory=list)
    families: dict[str, FamilyFigures] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, outcome: "_Outcome") -> None:
        figures = self.families.setdefault(outcome.family, FamilyFigures())
        figures.models += 1
        figures.claims += outcome.claims
        figures.false_claims += len(outcome.false_claims)
        figures.refusals += outcome.refused
        figures.crashes += outcome.crash is not None
        figures.hangs += outcome.hang is not None
        figures.seconds += outcome.seconds
        self.models += 1
        self.claims += outcome.claims
        self.refusals += outcome.refused
        self.certified = self.certified or outcome.certified
        self.false_claims += outcome.false_claims
        self.crashes += [outcome.crash] if outcome.crash else []
        self.hangs += [outcome.hang] if outcome.hang else []

    def summary(self) -> str:
        """A table of the figures by family, then every false claim, crash and hang."""
        lines = [f"seed {self.seed}: {self.models} models, {self.claims} claims "
                 f"({'certified by derive' if self.certified else 'raw: derive did not certify'}), "
                 f"{len(self.false_claims)} false, {self.refusals} refusals, {len(self.crashes)} crashes, "
                 f"{len(self.hangs)} hangs, {self.seconds:.1f} s wall",
                 f"{'family':<10} {'models':>6} {'claims':>6} {'false':>5} {'refused':>7} {'crash':>5} {'hang':>4} "
                 f"{'CPU ms/model':>12}"]
        for name, f in sorted(self.families.items()):
            lines.append(f"{name:<10} {f.models:>6} {f.claims:>6} {f.false_claims:>5} {f.refusals:>7} {f.crashes:>5} "
                         f"{f.hangs:>4} {1000 * f.seconds / max(f.models, 1):>12.1f}")
        lines += [f"FALSE {c.case}: {c.claim}: {c.error:.2e} on {c.output!r} under {c.element}"
                  for c in self.false_claims]
        lines += [f"CRASH {c.case}: {c.error} at {c.where}" for c in self.crashes]
        lines += [f"HANG {c.case}: {c.error}" for c in self.hangs]
        return "\n".join(lines)


@dataclass
class _Outcome:
    family: str
    claims: int = 0
    certified: bool = False
    refused: bool = False
    false_claims: list[FalseClaim] = field(default_factory=list)
    crash: Failure | None = None
    hang: Failure | None = None
    seconds: float = 0.0


def _claim_errors(analysis: Analysis, draws: int, seed: int) -> list[tuple[str, float, str, str]]:
    """``(label, error, element, output)`` per claim; a claim whose action cannot even be applied (its
    ``apply`` raises) is false with an infinite error, the exception as its element."""
    try:
        errors = claim_errors(analysis, draws=draws, seed=seed)
    except Exception:  # find the claims that cannot be applied, and check the others
        errors = []
        for symmetry in analysis.symmetries:
            try:
                errors += claim_errors(analysis, draws=draws, seed=seed, symmetries=[symmetry])
            except Exception as error:
                errors.append(ClaimError(symmetry, math.inf, f"apply raised {type(error).__name__}: {error}"))
    return [(e.symmetry.label, e.error, e.element, e.output) for e in errors]


def check_case(case: Case, certify: bool = True, time_limit: float = 20.0, draws: int = 2,
               catalogue: Mapping[str, CatalogueEntry] | None = None, tracer: str | None = None) -> _Outcome:
    """Trace (by ``tracer`` when given, else as the case says), derive (with ``catalogue`` when given) and check one
    case; never raises (refusals, crashes and hangs are outcomes)."""
    outcome, start = _Outcome(case.family), time.process_time()
    try:
        with _time_limit(time_limit):
            model, inputs = case.build()
            graph = trace(model, inputs, tracer=tracer or case.tracer)
            analysis, outcome.certified = derive_claims(graph, certify, catalogue), certify
            # seeded apart from derive's own certification, so the check draws other elements and inputs; raw claims of
            # a shape-branching model are the rules' on the branch the trace took, so they are checked at its shapes
            raw_branch = not certify and case.family in SPECIALISED_FAMILIES
            errors = _claim_errors(analysis, 1 if raw_branch else draws, 1 + case.index)
        outcome.claims = len(errors)
        outcome.false_claims = [FalseClaim(case.description, case.family, *e) for e in errors
                                if not e[1] <= CERTIFICATION_TOLERANCE]
    except _Hang as error:
        outcome.hang = Failure(case.description, case.family, str(error))
    except SpecError:
        outcome.refused = True
    except Exception as error:  # anything else is a crash: reported, never raised
        frames = traceback.extract_tb(error.__traceback__)[-3:]
        where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(frames))
        outcome.crash = Failure(case.description, case.family, f"{type(error).__name__}: {error}", where)
    outcome.seconds = time.process_time() - start
    return outcome


def _check_index(arguments: tuple[int, int, list[str] | None, bool, float, int, str | None]) -> _Outcome:
    seed, index, families, certify, time_limit, draws, tracer = arguments
    family = families[index % len(families)] if families else None
    return check_case(generate(seed, index, family), certify, time_limit, draws, tracer=tracer)


def run(n_models: int, seed: int = 0, families: Sequence[str] | None = None, time_limit: float = 20.0,
        certify: bool = True, draws: int = 2, workers: int = 1, start: int = 0,
        tracer: str | None = None, progress: Progress | None = None) -> FuzzReport:
    """Generate ``n_models`` models (indices ``start … start + n_models − 1`` of ``seed``, families in turn)
    and check every claim of each; see the module docstring. ``workers > 1`` checks them in that many
    processes; ``tracer`` (``"auto"``, ``"fx"``, ``"export"``) traces every model so, instead of as each says;
    ``progress(done, n_models, case)`` after each model (:mod:`symalg.progress`)."""
    families = list(families) if families else None
    unknown = [f for f in families or () if f not in FAMILIES]
    if unknown:
        raise SpecError(f"run: unknown families {unknown}; known: {', '.join(FAMILIES)}")
    report, began = FuzzReport(seed), time.perf_counter()
    jobs = [(seed, i, families, certify, time_limit, draws, tracer) for i in range(start, start + n_models)]
    if workers > 1:
        # spawn, not fork: a forked child inherits torch's intra-op thread pool from a parent that already ran
        # models, and can hang in its first matrix product
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for done, outcome in enumerate(pool.imap(_check_index, jobs, chunksize=8), start=1):
                report.add(outcome)
                report_progress(progress, done, n_models, f"model {start + done - 1}")
    else:
        for done, job in enumerate(jobs, start=1):
            report.add(_check_index(job))
            report_progress(progress, done, n_models, f"model {job[1]}")
    report.seconds = time.perf_counter() - began
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m symalg.verification.fuzz``: print the figures; exit status 1 when a claim was false or a model
    crashed or hung."""
    parser = argparse.ArgumentParser(prog="python -m symalg.verification.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="index of the first model")
    parser.add_argument("--families", default="", help=f"comma-separated, of: {', '.join(FAMILIES)}")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=20.0, help="CPU seconds per model")
    parser.add_argument("--draws", type=int, default=2, help="fresh inputs per claim check")
    parser.add_argument("--raw", action="store_true", help="check derive's raw claims (no certification)")
    parser.add_argument("--tracer", choices=("auto", "fx", "export"),
                        help="trace every model so (default: as each model says: fx first, torch.export for the "
                             "attention families' export-forced cases)")
    parser.add_argument("--show", nargs="+", metavar="SEED INDEX [FAMILY]",
                        help="print the source of one model (generate(SEED, INDEX, FAMILY)) and exit")
    args = parser.parse_args(argv)
    if args.show:
        if len(args.show) not in (2, 3) or not all(a.isdigit() for a in args.show[:2]):
            parser.error("--show takes SEED INDEX [FAMILY] (two integers, then a family name)")
    try:
        if args.show:
            print(generate(int(args.show[0]), int(args.show[1]), *args.show[2:]).source())
            return 0
        families = [f for f in args.families.split(",") if f] or None
        torch.set_default_dtype(torch.float64)
        report = run(args.models, args.seed, families, args.time_limit, not args.raw, args.draws, args.workers,
                     args.start, args.tracer)
    except SpecError as error:
        parser.error(str(error))
    print(report.summary())
    return int(bool(report.false_claims or report.crashes or report.hangs))


if __name__ == "__main__":
    sys.exit(main())
