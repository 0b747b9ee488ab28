"""The zoo census: symalg on the architectures people use, every claim checked by the census's own code.

Architectures: every base model of the pinned ``transformers`` release (``MODEL_MAPPING_NAMES``: text, vision,
audio; ``AutoModel.from_config`` on a tiny config, :func:`tiny_config`), torch's own layers in a user's module
(:data:`TORCH_LAYERS`) and peft LoRA on a small Llama. Each runs in its own forked process with a timeout: a hang or
a segfault is a row, not the end of the census. Per architecture:

* **status**: ``not built`` (transformers cannot build or run the tiny model on the census's inputs: not symalg's
  doing), ``refused`` (``symalg.SpecError``, a named refusal), ``crash`` (any other exception, a segfault or a
  timeout while tracing or deriving), ``unchecked`` (the census's own check timed out, or the model is not tiny),
  else ``ok``;
* **families found / expected** where a hand derivation exists (:data:`EXPECTED`, :func:`completeness`);
* the tracer, trace and derive seconds (``symalg.derive(certify=False)``: the rules' own claims, not filtered by
  symalg's certification), claims by group class, blocked notes;
* **false claims** (:func:`check_claim`, independent of ``symalg.verification``): at generic parameters
  (:func:`generic_state`: noise on every parameter and floating buffer) and on inputs of other shapes, each claim
  on its own moves the parameters by group elements near and far from the identity (``Symmetry.apply``) and the
  worst relative change of any output must stay under :data:`TOLERANCE`; a claim whose moved tensors the outputs
  ignore (a random perturbation of them, not in the group, changes no output) is ``vacuous``, not verified;
* **attention coverage** (:func:`attention_coverage`): of the modules that own query and key projections (class name
  with ``Attention``, or ``nn.MultiheadAttention``), those whose query or key weights a per-head group (``GL``,
  ``O``, ``C``: on ``Q Kᵀ``, rotary) moves; :data:`PINNED` gives the documented reason where mathematics pins it.

Usage::

    python benchmarks/zoo.py --quick                       # 21 representative architectures
    python benchmarks/zoo.py                               # every architecture, QUICK and POPULAR first (hours)
    python benchmarks/zoo.py --models gpt2 llama torch-lstm --timeout 120 --json zoo.json --jobs 2
    python benchmarks/zoo.py --table zoo.json              # the table of an earlier run
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import resource
import signal
import sys
import time
import traceback
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn

TOLERANCE = 1e-7
"""Largest relative change of any output (float64) a group element may cause; false claims change outputs by far
more (``10⁻³`` near the identity, order one far from it)."""

IMPRECISE = 1e-5
"""Errors between :data:`TOLERANCE` and this are ``imprecise``, not false: the rounding of a model that computes
parts in float32 whatever its dtype (an upcast norm cast back); a false claim changes the outputs by ``10⁻³`` and more
at some element drawn (its far elements: order one)."""

SENSITIVITY = 1e-4
"""Smallest relative output change a random relative perturbation of size :data:`PERTURBATION` of the moved tensors
must cause for a check to say anything (``1000 ×`` :data:`TOLERANCE`)."""
PERTURBATION = 0.1

WALL_FACTOR = 6
"""Wall-time limit of an architecture, in multiples of its CPU-time limit (``--timeout``)."""

MAX_PARAMETERS = 2_000_000
"""A model larger than this missed the tiny config (its size attributes have other names): traced and derived, its
claims are not checked (``unchecked``), which would take the census's time for nothing tiny."""

PER_HEAD = ("GL", "O", "C")
"""Group kinds that act per head on a query/key space: ``GL(d_k)`` on ``Q Kᵀ``, ``O``, rotary's complex scaling."""

QK_NAME = re.compile(r"^(q|k|query|key|wq|wk|to_q|to_k|q_lin|k_lin|q_proj|k_proj|query_proj|key_proj|linear_q|"
                     r"linear_k|q_linear|k_linear|query_net|key_net)$", re.IGNORECASE)
PACKED_NAME = re.compile(r"^(qkv|c_attn|query_key_value|wqkv|w_pack|qkv_proj|to_qkv|in_proj|qkv_linear|"
                         r"in_proj_weight)$", re.IGNORECASE)

_QK_NORM = ("QK-norm: each head's query and key pass an RMSNorm with a learned gain before the scores (and rotary); "
            "the normalisation admits only orthogonal maps (eps rules out a scale), and a generic gain then only "
            "discrete ones (sign flips of rotary planes): no continuous group moves the query/key weights (the two "
            "gains keep a scalar trade q ↦ c q, k ↦ k / c)")
PINNED: dict[str, str] = {"Gemma3Attention": _QK_NORM, "Qwen3Attention": _QK_NORM, "Qwen3MoeAttention": _QK_NORM,
                          "Olmo2Attention": _QK_NORM.replace("each head's query and key pass", "the queries and keys "
                                                             "of all heads together pass")}
"""Attention classes whose query/key space carries no per-head group, with the mathematical reason (class name:
reason; derived by hand, see docs/zoo.md); every other uncovered module is a gap."""

QUICK = ("gpt2", "llama", "mistral", "qwen2", "bert", "t5", "gpt_neox", "falcon", "phi3", "gemma2", "mixtral",
         "vit", "resnet", "convnext", "swin", "torch-encoder-layer", "torch-mha", "torch-lstm", "torch-bilinear",
         "torch-einsum", "peft-lora-llama")

POPULAR = ("albert", "bart", "bloom", "codegen", "deberta", "deberta-v2", "distilbert", "efficientnet", "electra",
           "gemma", "gemma3_text", "gpt_neo", "gptj", "mobilenet_v1", "mobilenet_v2", "mobilevit", "opt", "phi",
           "qwen3", "qwen3_moe", "olmo", "olmo2", "regnet", "roberta", "whisper", "xlm-roberta", "mpt", "stablelm",
           "starcoder2", "granite", "cohere", "mbart", "pegasus", "marian", "deit", "beit", "dinov2", "levit",
           "poolformer", "segformer", "wav2vec2", "hubert", "bit", "yolos", "cvt", "focalnet", "convnextv2",
           "qwen2_moe", "mamba", "rwkv", "gpt_bigcode", "persimmon", "nemotron", "glm", "helium", "smollm3", "mt5",
           "longformer", "funnel", "squeezebert", "mpnet", "ernie", "xlnet", "reformer", "canine", "perceiver",
           "vit_mae", "swinv2", "dinat", "clip", "siglip", "llava", "phimoe", "dbrx", "jamba")
"""Widely used architectures the full census runs right after :data:`QUICK` (then every other one, alphabetically),
so that an interrupted run has measured these."""

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 64, "vocab_size": 99, "max_position_embeddings": 64, "head_dim": 16,
        "n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": 64, "n_positions": 64, "d_model": 32, "d_ff": 64,
        "d_kv": 16, "num_layers": 2, "num_heads": 2, "num_decoder_layers": 2, "encoder_layers": 2,
        "decoder_layers": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "ffn_dim": 64, "embed_dim": 32, "embedding_size": 32, "image_size": 32,
        "patch_size": 4, "num_channels": 3, "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 16, "projection_dim": 32, "text_embed_dim": 32,
        "max_source_positions": 64, "max_target_positions": 64, "num_mel_bins": 16, "sliding_window": 16,
        "window_size": 4, "rotary_dim": 8, "width_coefficient": 0.25,
        "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64, "d_inner": 64, "depth_coefficient": 0.5,
        "use_cache": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 0}
"""Attribute values of a tiny config, set wherever the architecture's config has the attribute (width 32, two
layers, two heads of 16, one key/value group, vocabulary 99, images 32², patches 4², windows 4², special tokens in the
vocabulary)."""

TINY_LISTS: dict[str, Callable[[int], int]] = {
    "depths": lambda i: 1, "hidden_sizes": lambda i: 16 * (i + 1), "embed_dims": lambda i: 16 * (i + 1),
    "neck_hidden_sizes": lambda i: 16 * (i + 1), "num_heads": lambda i: 2, "num_attention_heads": lambda i: 2,
    "mlp_ratios": lambda i: 2, "num_block_repeats": lambda i: 1}
"""List-valued attributes (stages of hierarchical vision models): each entry ``i`` set to ``f(i)``, the length kept
(other lists of the config, and counts such as ``num_encoder_blocks``, are per stage too)."""

OVERRIDES: dict[str, dict[str, Any]] = {
    "swin": {"depths": [1, 1], "num_heads": [2, 2], "num_layers": 2},
    "swinv2": {"depths": [1, 1], "num_heads": [2, 2], "num_layers": 2},
    "efficientnet": {"hidden_dim": 320},   # round_filters(1280) at width 0.25
}
"""Per-architecture fallbacks, set after :data:`TINY`: two Swin stages (four leave a window larger than the last
stage at 32²), EfficientNet's head width matching its last convolution."""

BATCH, LENGTH, IMAGE, AUDIO = 2, 7, 32, 400

EXPECTED: dict[str, dict[str, int]] = {
    "gpt2": {"GL": 8, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "vit": {"GL": 8, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "bert": {"GL": 8, "T": 13, "S": 4},
    "gpt_neox": {"GL": 8, "C": 4, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "llama": {"C": 2, "GL": 2, "PS": 6, "SF": 7, "S": 4},
    "mistral": {"C": 2, "GL": 2, "PS": 6, "SF": 7, "S": 4},
    "qwen2": {"C": 2, "GL": 2, "PS": 6, "SF": 7, "S": 4},
    "peft-lora-llama": {"C": 2, "GL": 10, "PS": 6, "SF": 7, "S": 4},
    "torch-encoder-layer": {"GL": 8, "T": 13, "S": 5, "PS": 3, "SF": 1},
    "torch-mha": {"GL": 11, "T": 11, "S": 2},
    "torch-rnn": {"GL": 1, "T": 3, "S": 2, "SF": 2},
    "torch-lstm": {"GL": 1, "T": 3, "S": 2, "SF": 2},
    "torch-gru": {"GL": 1, "T": 3, "S": 2, "SF": 2},
    "torch-bilinear": {"PS": 2, "S": 3, "SF": 1},
    "torch-einsum": {"GL": 5, "PS": 1, "S": 2},
    "torch-convtranspose1d": {"PS": 2, "S": 2},
    "torch-convtranspose2d": {"PS": 2, "S": 2},
    "roberta": {"GL": 8, "T": 13, "S": 4},
    "xlm-roberta": {"GL": 8, "T": 13, "S": 4},
    "camembert": {"GL": 8, "T": 13, "S": 4},
    "ernie": {"GL": 8, "T": 13, "S": 4},
    "electra": {"GL": 8, "T": 13, "S": 4},
    "distilbert": {"GL": 8, "T": 13, "S": 4},
    "deit": {"GL": 8, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "yolos": {"GL": 8, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "vit_mae": {"GL": 8, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "dinov2": {"GL": 8, "T": 13, "PS": 8, "SF": 8, "S": 4},
    "beit": {"GL": 8, "T": 8, "PS": 8, "SF": 8, "S": 4},
    "data2vec-vision": {"GL": 8, "T": 8, "PS": 8, "SF": 8, "S": 4},
    "opt": {"GL": 9, "T": 13, "PS": 7, "SF": 5, "S": 5},
    "biogpt": {"GL": 8, "T": 13, "PS": 4, "SF": 4, "S": 4},
    "gpt_neo": {"GL": 8, "T": 3, "PS": 4, "SF": 4, "S": 4},
    "gpt_bigcode": {"GL": 4, "T": 9, "PS": 4, "SF": 4, "S": 4},
    "bloom": {"GL": 8, "T": 14, "PS": 4, "SF": 4, "S": 2},
    "mpt": {"GL": 8, "T": 1, "PS": 4, "SF": 4, "S": 2},
    "codegen": {"C": 4, "GL": 8, "T": 1, "PS": 2, "SF": 2, "S": 4},
    "gptj": {"C": 4, "GL": 8, "T": 1, "PS": 2, "SF": 2, "S": 4},
    "phi": {"C": 2, "GL": 4, "T": 7, "PS": 2, "SF": 2, "S": 4},
    "stablelm": {"C": 2, "GL": 4, "T": 1, "PS": 6, "SF": 6, "S": 4},
    "starcoder2": {"C": 2, "GL": 2, "T": 7, "PS": 4, "SF": 4, "S": 4},
    "olmo": {"C": 2, "GL": 2, "T": 1, "PS": 2, "SF": 2, "S": 4},
    "granite": {"C": 2, "GL": 2, "PS": 6, "SF": 7, "S": 4},
    "gemma": {"C": 2, "GL": 2, "PS": 6, "SF": 7, "S": 4},
    "bart": {"GL": 24, "T": 36, "S": 10},
    "marian": {"GL": 24, "T": 34, "S": 10},
    "qwen3": {"GL": 2, "PS": 8, "SF": 13, "S": 6},
    "persimmon": {"GL": 4, "T": 19, "PS": 8, "SF": 6, "S": 6},
}
"""Symmetry families a hand derivation gives at the tiny config, counted by group kind (derivations layer by layer in
docs/zoo.md, "Completeness against hand derivations"; never read off symalg's output). A census row reports
``found / expected`` = ``Σ_kind min(claims of the kind, expected)`` over ``Σ expected``: a proxy that counts kinds,
not sites (a claim of the right kind on the wrong site would count), and ``extra`` where symalg claims more of a
kind than the derivation has (a derivation to recheck, or a false claim: the checker says which)."""


# -- architectures ---------------------------------------------------------------------------------------------------
def tiny_config(config: Any) -> Any:
    """``config`` with :data:`TINY` / :data:`TINY_LISTS` set wherever it has the attribute, recursively into its
    sub-configs (``text_config``, ``vision_config``, ...)."""
    from transformers import PretrainedConfig

    for key, value in list(vars(config).items()):
        if isinstance(value, PretrainedConfig):
            tiny_config(value)
        elif isinstance(value, (list, tuple)) and key in TINY_LISTS and all(isinstance(v, int) for v in value):
            setattr(config, key, type(value)(TINY_LISTS[key](i) for i in range(len(value))))
        elif key in TINY and not isinstance(value, (list, tuple, dict)) and value is not None:
            setattr(config, key, TINY[key])
    config._experts_implementation = "eager"   # the default grouped_mm kernel refuses float64
    if isinstance(getattr(config, "layer_types", None), (list, tuple)):
        config.layer_types = config.layer_types[:2]
    depths = getattr(config, "depths", None)
    if isinstance(depths, (list, tuple)) and isinstance(getattr(config, "num_layers", None), int):
        config.num_layers = len(depths)   # Swin's stage count (TINY set it to 2)
    return config


def hf_inputs(model: nn.Module, batch: int, size: int | None) -> dict[str, torch.Tensor]:
    """Keyword inputs for a Hugging Face model by its ``main_input_name``: token ids ``(batch, size)``, pixels
    ``(batch, C, size, size)``, raw audio ``(batch, size)`` or features ``(batch, mel, size)``; encoder-decoder
    models also get ``decoder_input_ids``. Integer inputs are drawn from a fixed seed."""
    config = model.config
    name = getattr(model, "main_input_name", "input_ids")
    generator = torch.Generator().manual_seed(batch * 1000 + (size or 0))
    vocab = int(getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size",
                                                               None) or 99)
    inputs: dict[str, torch.Tensor] = {}
    if name == "pixel_values":
        channels = int(getattr(config, "num_channels", 3) or 3)
        side = size or IMAGE
        inputs[name] = torch.randn(batch, channels, side, side, generator=generator, dtype=torch.float64)
    elif name == "input_values":
        inputs[name] = torch.randn(batch, size or AUDIO, generator=generator, dtype=torch.float64)
    elif name == "input_features":
        mel = int(getattr(config, "num_mel_bins", 16) or 16)
        inputs[name] = torch.randn(batch, mel, size or 2 * LENGTH, generator=generator, dtype=torch.float64)
    else:
        inputs[name] = torch.randint(3, vocab, (batch, size or LENGTH), generator=generator)
    if getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(3, vocab, (batch, size or LENGTH), generator=generator)
    return inputs


def hf_variants(model: nn.Module) -> list[tuple[int, int | None]]:
    """``(batch, size)`` of the example and of the two other shapes the claims are checked on."""
    name = getattr(model, "main_input_name", "input_ids")
    base = {"pixel_values": IMAGE, "input_values": AUDIO, "input_features": 2 * LENGTH}.get(name, LENGTH)
    other = {"pixel_values": 2 * IMAGE, "input_values": AUDIO + 80, "input_features": 2 * LENGTH + 4}.get(name,
                                                                                                       LENGTH + 3)
    return [(BATCH, base), (3, base), (1, other)]


Inputs = Callable[[int, Any], dict[str, torch.Tensor]]
Built = tuple[nn.Module, Inputs, list[tuple[int, Any]]]
Builder = Callable[[], Built]
"""Builds ``(model, inputs(batch, size) -> keyword inputs, [(batch, size) of the example, then other shapes])``."""


def hf_builder(model_type: str) -> Builder:
    """Build the base model of ``model_type`` from its tiny config, in float64 and eval mode."""
    def build() -> Built:
        import transformers
        from transformers import AutoModel

        transformers.logging.set_verbosity_error()
        config = tiny_config(transformers.CONFIG_MAPPING[model_type]())
        for key, value in OVERRIDES.get(model_type, {}).items():
            setattr(config, key, value)
        model = AutoModel.from_config(config).double().eval()
        return model, lambda batch, size: hf_inputs(model, batch, size), hf_variants(model)
    return build


def peft_builder() -> Built:
    """LoRA (rank 4 on every query, key, value and output projection) on a two-layer Llama."""
    import peft
    import transformers

    transformers.logging.set_verbosity_error()
    base = transformers.LlamaModel(tiny_config(transformers.LlamaConfig())).double()
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = peft.get_peft_model(base, lora).double().eval()
    return model, lambda batch, size: hf_inputs(base, batch, size), hf_variants(base)


class _Stack(nn.Module):
    """A user's module around torch layers: an input projection, the layers, a readout."""

    def __init__(self, layers: nn.ModuleList, width: int = 32, features: int = 8, memory: bool = False):
        super().__init__()
        self.embed, self.layers, self.memory = nn.Linear(features, width), layers, memory
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, h) if self.memory else layer(h)
        return self.head(h)


class _SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` used as self-attention (two heads)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.attention = nn.MultiheadAttention(width, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


class _Recurrent(nn.Module):
    """A two-layer recurrent net (``nn.LSTM``, ``GRU`` or ``RNN``) between an input projection and a readout."""

    def __init__(self, cell: Callable[..., nn.Module]):
        super().__init__()
        self.embed, self.rnn = nn.Linear(8, 16), cell(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(x))[0])


class _Bilinear(nn.Module):
    """Two branches (ReLU and tanh) joined by ``nn.Bilinear``, then a ReLU and a readout."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(8, 12)
        self.bilinear, self.head = nn.Bilinear(16, 12, 10), nn.Linear(10, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bilinear(torch.relu(self.a(x)), torch.tanh(self.b(x)))))


class _Einsum(nn.Module):
    """A ReLU MLP and a two-head attention written with ``torch.einsum``."""

    def __init__(self, width: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.w_in, self.b_in = nn.Parameter(torch.randn(32, 8)), nn.Parameter(torch.randn(32))
        self.w_out = nn.Parameter(torch.randn(width, 32))
        self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(width, width)) for _ in range(3))
        self.wo = nn.Parameter(torch.randn(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("bti,oi->bto", torch.relu(torch.einsum("bti,hi->bth", x, self.w_in) + self.b_in), self.w_out)
        b, t, d = h.shape
        q, k, v = (torch.einsum("bti,oi->bto", h, w).reshape(b, t, self.heads, -1) for w in (self.wq, self.wk, self.wv))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k).softmax(-1)
        return torch.einsum("od,btd->bto", self.wo, torch.einsum("bhqk,bkhd->bqhd", scores, v).reshape(b, t, d))


class _Transposed(nn.Module):
    """A convolution, then two transposed convolutions (stride 2, then 1) with ReLUs between."""

    def __init__(self, dims: int):
        super().__init__()
        conv, transposed = (nn.Conv1d, nn.ConvTranspose1d) if dims == 1 else (nn.Conv2d, nn.ConvTranspose2d)
        self.body = nn.Sequential(conv(3, 8, 3), nn.ReLU(), transposed(8, 6, 3, stride=2), nn.ReLU(),
                                  transposed(6, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _torch_builder(make: Callable[[], nn.Module], shape: Callable[[int, int], tuple[int, ...]],
                   sizes: tuple[int, int] = (LENGTH, LENGTH + 3)) -> Builder:
    def build() -> Built:
        torch.manual_seed(0)
        model = make().double().eval()

        def inputs(batch: int, size: int) -> dict[str, torch.Tensor]:
            generator = torch.Generator().manual_seed(batch * 1000 + size)
            return {"x": torch.randn(*shape(batch, size), generator=generator, dtype=torch.float64)}
        return model, inputs, [(BATCH, sizes[0]), (3, sizes[0]), (1, sizes[1])]
    return build


def _layers(layer: Callable[[], nn.Module]) -> nn.ModuleList:
    return nn.ModuleList([layer(), layer()])


TORCH_LAYERS: dict[str, Builder] = {
    "torch-encoder-layer": _torch_builder(lambda: _Stack(_layers(lambda: nn.TransformerEncoderLayer(
        32, 2, 64, dropout=0.0, batch_first=True))), lambda b, t: (b, t, 8)),
    "torch-decoder-layer": _torch_builder(lambda: _Stack(_layers(lambda: nn.TransformerDecoderLayer(
        32, 2, 64, dropout=0.0, batch_first=True)), memory=True), lambda b, t: (b, t, 8)),
    "torch-mha": _torch_builder(lambda: _Stack(_layers(_SelfAttention)), lambda b, t: (b, t, 8)),
    "torch-lstm": _torch_builder(lambda: _Recurrent(nn.LSTM), lambda b, t: (b, t, 8)),
    "torch-gru": _torch_builder(lambda: _Recurrent(nn.GRU), lambda b, t: (b, t, 8)),
    "torch-rnn": _torch_builder(lambda: _Recurrent(nn.RNN), lambda b, t: (b, t, 8)),
    "torch-convtranspose1d": _torch_builder(lambda: _Transposed(1), lambda b, t: (b, 3, t), (12, 15)),
    "torch-convtranspose2d": _torch_builder(lambda: _Transposed(2), lambda b, t: (b, 3, t, t), (8, 11)),
    "torch-bilinear": _torch_builder(_Bilinear, lambda b, t: (b, 8)),
    "torch-einsum": _torch_builder(_Einsum, lambda b, t: (b, t, 8)),
    "peft-lora-llama": peft_builder,
}


def architectures() -> dict[str, Builder]:
    """Every architecture of the census by name: the ``transformers`` base models, then :data:`TORCH_LAYERS`."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return {**{name: hf_builder(name) for name in MODEL_MAPPING_NAMES}, **TORCH_LAYERS}


# -- the independent checker -----------------------------------------------------------------------------------------
def flat_outputs(output: object) -> list[torch.Tensor]:
    """Every floating tensor ``output`` holds (tuples, lists, mappings such as ``ModelOutput``, dataclass-like
    objects), in a fixed order."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() or output.is_complex() else []
    if isinstance(output, dict):
        return [t for value in output.values() for t in flat_outputs(value)]
    if isinstance(output, (tuple, list)):
        return [t for value in output for t in flat_outputs(value)]
    if hasattr(output, "__dict__") and not isinstance(output, nn.Module):
        return [t for key, value in vars(output).items() if not key.startswith("_") for t in flat_outputs(value)]
    return []


def relative_change(reference: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    """``max_i ‖a_i − b_i‖_∞ / max(‖a_i‖_∞, tiny)`` over the outputs; ``inf`` where the outputs differ in number,
    shape, or finiteness."""
    if len(reference) != len(other):
        return float("inf")
    worst = 0.0
    for a, b in zip(reference, other):
        if a.shape != b.shape or not torch.equal(torch.isfinite(a), torch.isfinite(b)):
            return float("inf")
        finite = torch.isfinite(a)
        if not finite.any():
            continue
        scale = a[finite].abs().max().item()
        worst = max(worst, (a[finite] - b[finite]).abs().max().item() / max(scale, 1e-300))
    return worst


def generic_state(model: nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every parameter and floating buffer of ``model`` moved off special values: parameters get Gaussian noise of
    size ``0.5 (rms + 0.1)`` (zero-initialised LoRA factors, unit norm gains and zero biases become generic);
    floating buffers, that may hold variances or frequencies, are scaled entry by entry by ``1 + U(−0.1, 0.1)``."""
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    done: dict[int, torch.Tensor] = {}   # tied tensors (one tensor under several names) get one noise
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in done:
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            done[id(p)] = p.detach() + 0.5 * (p.detach().pow(2).mean().sqrt() + 0.1) * noise
        state[name] = done[id(p)]
    for name, b in model.named_buffers(remove_duplicate=False):
        if id(b) not in done:
            moves = b.is_floating_point() and b.numel() > 0 and bool(torch.isfinite(b).all())
            scale = 1 + 0.1 * (2 * torch.rand(b.shape, generator=generator, dtype=b.dtype) - 1) if moves else 1
            done[id(b)] = b * scale if moves else b
        state[name] = done[id(b)]
    return state


def _run(model: nn.Module, state: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The model's outputs at ``state``; every run draws the same random numbers (ViT-MAE's random masking, any
    stochastic op), so that a moved run differs from the reference only by the move."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return flat_outputs(torch.func.functional_call(model, state, (), inputs, tie_weights=False))


def _aliases(state: dict[str, torch.Tensor], moved: dict[str, torch.Tensor], model: nn.Module) -> dict:
    """``moved`` with every tied name of a moved tensor moved too (``named_parameters(remove_duplicate=False)``)."""
    ids: dict[int, list[str]] = {}
    for name, p in list(model.named_parameters(remove_duplicate=False)) + list(
            model.named_buffers(remove_duplicate=False)):
        ids.setdefault(id(p), []).append(name)
    out = dict(state)
    for names in ids.values():
        new = next((moved[n] for n in names if n in moved and moved[n] is not state.get(n)), None)
        if new is not None:
            for n in names:
                out[n] = new
    return out


def elements_to_check(group: Any, generator: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    """Group elements to check a claim with: ``exp(M)`` with ``‖M‖ = 10⁻³`` and ``1`` (near and far from the
    identity), up to two discrete generators (or random sign patterns), and a discrete generator times a far
    ``exp(M)`` (another component): the group's own ``sample``, thinned."""
    elements = group.sample(generator, torch.float64, "cpu", (1e-3, 1.0))
    continuous = [e for e in elements if e[0].startswith("exp") or "times" in e[0]]
    discrete = [e for e in elements if e not in continuous]
    picks = torch.randperm(len(discrete), generator=generator)[:2].tolist()
    return continuous + [discrete[i] for i in picks]


def check_claim(model: nn.Module, symmetry: Any, points: list[tuple[str, dict, dict, list]],
                generator: torch.Generator) -> dict:
    """Check one claim on ``points`` (``(label, state, inputs, outputs)``): its worst relative output change over
    :func:`elements_to_check` (``error``, and where), and whether the outputs react to its moved tensors at all
    (``sensitivity``: the relative output change under a random relative perturbation :data:`PERTURBATION` of
    them). Verdict: ``false`` (error above :data:`IMPRECISE`), ``imprecise`` (above :data:`TOLERANCE`),
    ``vacuous`` (sensitivity under :data:`SENSITIVITY`), else ``verified``."""
    worst, where, sensitivity = 0.0, "", 0.0
    for label, state, inputs, reference in points:
        for name, g in elements_to_check(symmetry.group, generator):
            moved = symmetry.apply(state, g)
            error = relative_change(reference, _run(model, _aliases(state, moved, model), inputs))
            if error > worst:
                worst, where = error, f"{name} at {label}"
        perturbed = dict(state)
        for tensor in symmetry.tensors:
            t = state[tensor]
            noise = torch.randn(t.shape, generator=generator, dtype=t.dtype)
            perturbed[tensor] = t + PERTURBATION * t.pow(2).mean().sqrt() * noise
        sensitivity = max(sensitivity, relative_change(reference, _run(model, _aliases(state, perturbed, model),
                                                                       inputs)))
    verdict = "false" if not worst <= IMPRECISE else "imprecise" if worst > TOLERANCE else \
        "vacuous" if sensitivity < SENSITIVITY else "verified"
    return {"claim": symmetry.label, "kind": symmetry.group.kind, "verdict": verdict, "error": worst, "where": where,
            "sensitivity": sensitivity}


def check_points(model: nn.Module, make_inputs: Callable, variants: list[tuple[int, Any]]) -> tuple[list, list]:
    """The points claims are checked at: generic parameters (:func:`generic_state`) on the example's shape and the
    other shapes of ``variants``; a shape the model refuses is listed, not checked."""
    state = generic_state(model)
    points, refused = [], []
    for batch, size in variants:
        inputs = make_inputs(batch, size)
        label = "generic, " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in inputs.items())
        try:
            points.append((label, state, inputs, _run(model, state, inputs)))
        except Exception as error:  # the model's own refusal of a shape: recorded
            refused.append(f"{label}: {type(error).__name__}")
    return points, refused


# -- attention coverage ----------------------------------------------------------------------------------------------
def attention_modules(model: nn.Module) -> dict[str, tuple[str, list[str], list[str]]]:
    """``{module path: (class name, query/key weights, packed projection weights)}`` for every module whose class
    name contains ``Attention`` and that owns query and key projections (children named ``q_proj``, ``query``,
    ``k``, ... or a packed ``qkv``/``c_attn``/``query_key_value``), and every ``nn.MultiheadAttention``."""
    found = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for path, module in model.named_modules():
        cls = type(module).__name__
        if not ("Attention" in cls or isinstance(module, nn.MultiheadAttention)):
            continue
        qk, packed = [], []
        for child_name, child in module.named_children():
            weight = getattr(child, "weight", None)
            base = child_name.split(".")[-1]
            if isinstance(weight, torch.Tensor) and id(weight) in names:
                if QK_NAME.match(base):
                    qk.append(names[id(weight)])
                elif PACKED_NAME.match(base):
                    packed.append(names[id(weight)])
            inner = getattr(child, "base_layer", None)   # peft's LoRA wrapper keeps the projection as base_layer
            if inner is not None and isinstance(getattr(inner, "weight", None), torch.Tensor) and QK_NAME.match(base):
                qk.append(names[id(inner.weight)])
        for param_name, p in module.named_parameters(recurse=False):
            if PACKED_NAME.match(param_name) and id(p) in names:
                packed.append(names[id(p)])
        if len(qk) >= 2 or packed:
            found[path] = (cls, qk, packed)
    return found


def covers(symmetry: Any, qk: list[str], packed: list[str]) -> bool:
    """A per-head group (:data:`PER_HEAD`) moving a query or key weight, or two regions of one packed projection
    (the query and key rows of a head; the value-output group moves one region of it and the output projection)."""
    if symmetry.group.kind not in PER_HEAD:
        return False
    moved = set(symmetry.tensors)
    if moved & set(qk):
        return True
    for tensor in packed:
        regions = {(b.axis, b.start) for b in symmetry.moving_bindings() if b.tensor == tensor}
        if len(regions) >= 2:
            return True
    return False


def attention_coverage(model: nn.Module, symmetries: list) -> list[dict]:
    """One row per attention module: covered or not, and the documented reason (:data:`PINNED`) where not."""
    rows = []
    for path, (cls, qk, packed) in attention_modules(model).items():
        covered = any(covers(s, qk, packed) for s in symmetries)
        rows.append({"module": path, "class": cls, "covered": covered,
                     "reason": "" if covered else PINNED.get(cls, "")})
    return rows


def completeness(claims: dict[str, int], expected: dict[str, int]) -> dict[str, Any]:
    """``found`` (claims matching an expected family, kind by kind), ``expected``, and the ``extra`` claims per kind
    beyond the hand derivation (:data:`EXPECTED`).

    >>> completeness({"GL": 3, "S": 1}, {"GL": 2, "T": 2, "S": 1})
    {'found': 3, 'expected': 5, 'extra': {'GL': 1}}
    """
    found = sum(min(claims.get(kind, 0), count) for kind, count in expected.items())
    extra = {kind: n - expected.get(kind, 0) for kind, n in claims.items() if n > expected.get(kind, 0)}
    return {"found": found, "expected": sum(expected.values()), "extra": extra}


# -- one architecture ------------------------------------------------------------------------------------------------
def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())[:240]}"


def census_one(name: str, build: Builder, check: bool = True,
               report: Callable[[str, dict], None] | None = None) -> dict:
    """The census row of one architecture (run in its own process by :func:`run_census`); ``report(stage, row)`` is
    told each stage as it starts (``build``, ``trace``, ``derive``, ``check``) with the row so far."""
    import symalg

    torch.manual_seed(0)
    row: dict[str, Any] = {"model": name, "status": "not built"}

    def enter(stage: str) -> str:
        if report is not None:
            report(stage, dict(row))
        return stage
    enter("build")
    try:
        model, make_inputs, variants = build()
        example = make_inputs(*variants[0])
        with torch.no_grad():
            model(**example)
    except Exception as error:  # transformers (or peft) cannot build or run the tiny model: not symalg's doing
        row["error"] = _error(error)
        return row
    row["parameters"] = sum(p.numel() for p in model.parameters())
    stage = enter("trace")
    try:
        start = time.perf_counter()
        graph = symalg.trace(model, (), **example)  # type: ignore[arg-type]  # keyword inputs, not options
        row["tracer"], row["trace_s"] = graph.tracer, time.perf_counter() - start
        stage = enter("derive")
        start = time.perf_counter()
        analysis = symalg.derive(graph, certify=False)
        row["derive_s"] = time.perf_counter() - start
        symmetries = list(analysis.symmetries)
        row["claims"] = dict(sorted(Counter(s.group.kind for s in symmetries).items()))
        row["blocked"] = len(analysis.blocked)
        if name in EXPECTED:
            row["families"] = completeness(row["claims"], EXPECTED[name])
        row["attention"] = attention_coverage(model, symmetries)
        if check and row["parameters"] > MAX_PARAMETERS:
            row["status"], row["error"] = "unchecked", f"not tiny: {row['parameters']:,} parameters"
            return row
        if check:
            stage = enter("check")
            generator = torch.Generator().manual_seed(1)
            points, row["shapes_refused"] = check_points(model, make_inputs, variants)
            row["checks"] = [check_claim(model, s, points, generator) for s in symmetries]
        row["status"] = "ok"
    except symalg.SpecError as error:
        row["status"], row["error"] = "refused", f"{stage}: {_error(error)}"
    except Exception as error:
        row["status"], row["error"] = "crash", f"{stage}: {_error(error)}"
        row["traceback"] = traceback.format_exc(limit=-4)
    return row


def _child(name: str, check: bool, send: Any, seconds: float) -> None:
    torch.set_num_threads(1)
    resource.setrlimit(resource.RLIMIT_CPU, (int(seconds), int(seconds) + 5))   # SIGXCPU past that much CPU time
    row = census_one(name, architectures()[name], check, lambda stage, partial: send.send((stage, partial)))
    send.send(("done", row))
    send.close()


def _stopped(stage: str, partial: dict, why: str) -> dict:
    """The row of an architecture whose process was stopped (a timeout) or died (a segfault) in ``stage``: building
    or running the model is transformers' doing (``not built``), tracing or deriving symalg's (``crash``), checking
    the census's own (``unchecked``: the claims stand, not checked)."""
    status = {"build": "not built", "check": "unchecked"}.get(stage, "crash")
    return {**partial, "status": status, "error": f"{stage}: {why}"}


def run_census(names: list[str], timeout: float, jobs: int = 1, check: bool = True,
               progress: Callable[[dict], None] | None = None) -> list[dict]:
    """The rows of ``names``, each built and analysed in a forked process with ``timeout`` seconds of CPU time
    (``RLIMIT_CPU``: on a shared machine wall time says more about the neighbours than about the model) and
    :data:`WALL_FACTOR` times as much wall time (a process that hangs without computing); a process stopped or dead
    (segfault) is a row (:func:`_stopped`). ``progress`` is called with each row as it arrives."""
    context = multiprocessing.get_context("fork")
    pending, rows = list(names), {}
    running: dict[str, tuple[Any, Any, float]] = {}
    last: dict[str, tuple[str, dict]] = {}   # the stage each child is in, with its row so far
    while pending or running:
        while pending and len(running) < jobs:
            name = pending.pop(0)
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_child, args=(name, check, send, timeout), daemon=True)
            process.start()
            send.close()
            running[name] = (process, receive, time.monotonic())
            last[name] = ("build", {"model": name})
        time.sleep(0.05)
        for name, (process, receive, started) in list(running.items()):
            row = None
            try:
                while row is None and receive.poll():
                    stage, partial = receive.recv()
                    row = partial if stage == "done" else None
                    last[name] = (stage, partial)
            except EOFError:
                process.join(5)
            if row is None and not process.is_alive():
                process.join()
                why = f"timeout after {timeout:.0f} s of CPU time" if process.exitcode == -signal.SIGXCPU else \
                    f"process died (exit {process.exitcode})"
                row = _stopped(*last[name], why)
            elif row is None and time.monotonic() - started > WALL_FACTOR * timeout:
                process.kill()
                row = _stopped(*last[name], f"timeout after {WALL_FACTOR * timeout:.0f} s of wall time")
            if row is not None:
                process.join(5)
                del running[name]
                rows[name] = row
                if progress:
                    progress(row)
    return [rows[name] for name in names]


# -- totals and the table --------------------------------------------------------------------------------------------
def totals(rows: list[dict]) -> dict:
    """Architectures tried / built / traced / refused / crashes, claims checked / false / vacuous, attention
    modules covered / total."""
    built = [r for r in rows if r["status"] != "not built"]
    checks = [c for r in rows for c in r.get("checks", [])]
    attention = [a for r in rows for a in r.get("attention", [])]
    return {"tried": len(rows), "built": len(built), "traced": sum("tracer" in r for r in rows),
            "derived": sum(r["status"] in ("ok", "unchecked") for r in rows),
            "refused": sum(r["status"] == "refused" for r in rows),
            "crashes": sum(r["status"] == "crash" for r in rows), "claims": len(checks),
            "unchecked": sum(r["status"] == "unchecked" for r in rows),
            "false_claims": sum(c["verdict"] == "false" for c in checks),
            "vacuous": sum(c["verdict"] == "vacuous" for c in checks),
            "imprecise": sum(c["verdict"] == "imprecise" for c in checks),
            "attention_covered": sum(a["covered"] for a in attention),
            "attention_pinned": sum(bool(a["reason"]) for a in attention), "attention_total": len(attention),
            "families_found": sum(r["families"]["found"] for r in rows if "families" in r),
            "families_expected": sum(r["families"]["expected"] for r in rows if "families" in r),
            "derived_by_hand": sum("families" in r for r in rows)}


def table(rows: list[dict]) -> str:
    """The Markdown table: one line per architecture built, then the totals."""
    lines = ["| architecture | status | tracer | trace s | derive s | claims by kind | blocked | false / vacuous / "
             "checked | attention covered | families found / expected | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "not built":
            continue
        claims = ", ".join(f"{k} {v}" for k, v in r.get("claims", {}).items()) or ("none" if "claims" in r else "")
        checks = r.get("checks", [])
        false = sum(c["verdict"] == "false" for c in checks)
        vacuous = sum(c["verdict"] == "vacuous" for c in checks)
        attention = r.get("attention", [])
        covered = f"{sum(a['covered'] for a in attention)} / {len(attention)}" if attention else ""
        note = r.get("error", "")[:120].replace("|", "\\|")
        timing = [f"{r[k]:.2f}" if k in r else "" for k in ("trace_s", "derive_s")]
        families = r.get("families")
        found = "" if families is None else f"{families['found']} / {families['expected']}" + (
            f" (extra {families['extra']})" if families["extra"] else "")
        lines.append(f"| {r['model']} | {r['status']} | {r.get('tracer', '')} | {timing[0]} | {timing[1]} | {claims} |"
                     f" {r.get('blocked', '')} | {false} / {vacuous} / {len(checks)} | {covered} | {found} | {note} |")
    t = totals(rows)
    lines += ["", f"**Totals**: {t['tried']} architectures tried, {t['built']} built, {t['traced']} traced, "
              f"{t['derived']} derived, {t['refused']} refused, **{t['crashes']} crashes**, {t['unchecked']} unchecked "
              f"(not tiny, or the check timed out); {t['claims']} claims "
              f"checked, **{t['false_claims']} false**, {t['imprecise']} imprecise, {t['vacuous']} vacuous; attention "
              f"coverage "
              f"**{t['attention_covered']} / {t['attention_total']}** ({t['attention_pinned']} pinned with a reason); "
              f"families found / expected by hand: **{t['families_found']} / {t['families_expected']}** on "
              f"{t['derived_by_hand']} architectures."]
    return "\n".join(lines)


def _vacuous(row: dict) -> str:
    vacuous = [c for c in row["checks"] if c["verdict"] == "vacuous"]
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(c["kind"] for c in vacuous).items()))
    worst = max(c["sensitivity"] for c in vacuous)
    return f"- {row['model']}: {len(vacuous)} ({kinds}; sensitivity at most {worst:.1g}), e.g. {vacuous[0]['claim']}"


def findings(rows: list[dict]) -> str:
    """Markdown lists under the table: crashes, false claims, vacuous claims, uncovered attention modules (by class),
    refusals, unchecked rows, and the architectures not built (by the first words of their error)."""
    def item(row: dict) -> str:
        return f"- {row['model']}: {row.get('error', '')[:300]}"
    sections = [("Crashes", [item(r) for r in rows if r["status"] == "crash"]),
                ("False claims", [f"- {r['model']}: {c['claim']}: error {c['error']:.2g} ({c['where']})"
                                  for r in rows for c in r.get("checks", []) if c["verdict"] == "false"]),
                ("Imprecise claims (error between 1e-7 and 1e-5)",
                 [f"- {r['model']}: {c['claim']}: error {c['error']:.2g} ({c['where']})"
                  for r in rows for c in r.get("checks", []) if c["verdict"] == "imprecise"]),
                ("Architectures with vacuous claims", [_vacuous(r) for r in rows if any(
                    c["verdict"] == "vacuous" for c in r.get("checks", []))])]
    for pinned, title in ((False, "Attention modules without a per-head group on queries/keys: gaps (class: "
                                  "architectures)"), (True, "Attention modules the mathematics pins (class: reason)")):
        uncovered: dict[str, list[str]] = {}
        for r in rows:
            for a in r.get("attention", []):
                if not a["covered"] and bool(a["reason"]) == pinned:
                    uncovered.setdefault(a["class"], []).append(r["model"])
        sections.append((title, [f"- {cls}: {', '.join(dict.fromkeys(models))} ({len(models)} modules)"
                                 + (f": {PINNED[cls]}" if pinned else "")
                                 for cls, models in sorted(uncovered.items())]))
    sections += [("Refused (SpecError)", [item(r) for r in rows if r["status"] == "refused"]),
                 ("Unchecked (not tiny, or the census's check timed out)",
                  [item(r) for r in rows if r["status"] == "unchecked"])]
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if r["status"] == "not built":
            reasons.setdefault(" ".join(r.get("error", "").split()[:6]), []).append(r["model"])
    sections.append(("Not built (transformers on the tiny config and inputs; by error)",
                     [f"- {why} ({len(models)}): {', '.join(models)}" for why, models in
                      sorted(reasons.items(), key=lambda kv: -len(kv[1]))]))
    return "\n\n".join(f"**{title}** ({len(lines)})\n\n" + ("\n".join(lines) if lines else "none")
                       for title, lines in sections)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"the {len(QUICK)} architectures of QUICK only")
    parser.add_argument("--models", nargs="+", help="these architectures (model types or torch-*/peft-* names)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help=f"CPU seconds per architecture (default 300; wall time {WALL_FACTOR}×)")
    parser.add_argument("--jobs", type=int, default=1, help="architectures analysed at once (default 1)")
    parser.add_argument("--json", help="write the rows and totals to this file (rewritten after every row)")
    parser.add_argument("--no-check", action="store_true", help="skip the independent check of the claims")
    parser.add_argument("--table", metavar="JSON", nargs="+", help="print the table of earlier runs' --json files "
                        "(a later file's row of an architecture replaces an earlier one's; families recounted against "
                        "the current EXPECTED) and run nothing")
    args = parser.parse_args(argv)
    if args.table:
        merged: dict[str, dict] = {}
        for path in args.table:
            with open(path) as handle:
                merged.update((row["model"], row) for row in json.load(handle)["rows"])
        rows = list(merged.values())
        for row in rows:
            for module in row.get("attention", []):
                module["reason"] = "" if module["covered"] else PINNED.get(module["class"], "")
            row.pop("families", None)
            if row["model"] in EXPECTED and "claims" in row:
                row["families"] = completeness(row["claims"], EXPECTED[row["model"]])
        print(table(rows))
        print()
        print(findings(rows))
        return
    known = architectures()
    names = list(args.models or (QUICK if args.quick else dict.fromkeys([*QUICK, *POPULAR, *known])))
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown architectures {unknown}; see transformers' MODEL_MAPPING_NAMES and {list(TORCH_LAYERS)}")
    done: list[dict] = []

    def progress(row: dict) -> None:
        done.append(row)
        print(f"[{len(done)}/{len(names)}] {row['model']}: {row['status']} {row.get('error', '')[:100]}",
              file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"machine": platform.platform(), "rows": done, "totals": totals(done)}, handle, indent=1)

    start = time.perf_counter()
    rows = run_census(names, args.timeout, args.jobs, not args.no_check, progress)
    print(f"# {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}, torch "
          f"{torch.__version__}; {time.perf_counter() - start:.0f} s")
    print(table(rows))
    print()
    print(findings(rows))


if __name__ == "__main__":
    main()
