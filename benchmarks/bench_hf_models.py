"""Hugging Face models through the torch front end: time of each stage (a script, not a test).

The models of ``tests/test_hf_models.py`` (GPT-2, Llama, Mistral, Qwen2, BERT, ViT, T5 encoder), built from
their small configs (hidden 16, 2 heads, FFN 32, one layer) or, with ``--base``, at the width of the public
base models (hidden 768, 12 heads, FFN 3072, ``--layers`` layers, vocabulary 1000) with random weights.
Inputs: token ids ``(2, 7)`` (pixels ``(2, 3, 8, 8)`` for ViT, ``(2, 3, 32, 32)`` with ``--base``). Stages,
each timed with ``time.perf_counter`` in one process (imports and model construction not timed; the first
model also pays torch.export's warm-up):

* ``forward``  the baseline: one forward pass (``torch.no_grad``; median of 10 after 2 warm-up passes)
* ``trace``    ``symalg.from_torch(model, (ids,))``: the example run, fx's attempt, ``torch.export``
* ``derive``   ``symalg.derive(graph)``, certification of every claim included
* ``verify``   ``symalg.verify(analysis)`` (skipped with ``--base``)

Ratios are against ``forward`` of the same model in the same run. Usage::

    python benchmarks/bench_hf_models.py                 # small configs, one thread
    python benchmarks/bench_hf_models.py --base --layers 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import symalg


def _configs(base: bool, layers: int) -> dict:
    import transformers as tf

    d, heads, ffn, vocab = (768, 12, 3072, 1000) if base else (16, 2, 32, 50)
    decoder = dict(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=max(1, heads // 4), max_position_embeddings=16)
    image = 32 if base else 8
    return {
        "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(vocab_size=vocab, n_positions=16, n_embd=d, n_layer=layers,
                                                   n_head=heads, n_inner=ffn)),
        "llama": lambda: tf.LlamaModel(tf.LlamaConfig(**decoder)),
        "mistral": lambda: tf.MistralModel(tf.MistralConfig(**decoder)),
        "qwen2": lambda: tf.Qwen2Model(tf.Qwen2Config(**decoder)),
        "bert": lambda: tf.BertModel(tf.BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                                   num_attention_heads=heads, intermediate_size=ffn,
                                                   max_position_embeddings=16)),
        "vit": lambda: tf.ViTModel(tf.ViTConfig(image_size=image, patch_size=4, num_channels=3, hidden_size=d,
                                                num_hidden_layers=layers, num_attention_heads=heads,
                                                intermediate_size=ffn)),
        "t5": lambda: tf.T5EncoderModel(tf.T5Config(vocab_size=vocab, d_model=d, d_kv=d // heads, d_ff=ffn,
                                                    num_layers=layers, num_heads=heads)),
    }, vocab, image


def _seconds(call) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def measure(base: bool, layers: int, names: tuple[str, ...] | None = None) -> list[dict]:
    """One row per model (all of :func:`_configs`, or ``names``), printed as it is measured."""
    configs, vocab, image = _configs(base, layers)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2, 7), generator=generator)
    pixels = torch.randn(2, 3, image, image, generator=generator)
    print(f"{'model':8} {'params':>10} {'forward':>9} {'trace':>8} {'derive':>8} {'verify':>8}  "
          f"{'trace/fwd':>9} {'derive/fwd':>10}  claims")
    rows = []
    for name, build in configs.items():
        if names is not None and name not in names:
            continue
        torch.manual_seed(0)
        model = build().eval()
        x = pixels if name == "vit" else ids
        with torch.no_grad():
            for _ in range(2):
                model(x)
            forward = statistics.median(_seconds(lambda: model(x))[0] for _ in range(10))
        trace, graph = _seconds(lambda: symalg.from_torch(model, (x,)))
        derive, analysis = _seconds(lambda: symalg.derive(graph))
        verify = float("nan") if base else _seconds(lambda: symalg.verify(analysis))[0]
        params = sum(p.numel() for p in model.parameters())
        print(f"{name:8} {params:>10,} {forward * 1e3:>7.1f}ms {trace:>7.2f}s {derive:>7.2f}s {verify:>7.2f}s  "
              f"{trace / forward:>9.0f} {derive / forward:>10.0f}  {len(analysis.symmetries)}", flush=True)
        rows.append({"model": name, "params": params, "forward_ms": 1e3 * forward, "trace_s": trace,
                     "derive_s": derive, "verify_s": None if base else verify, "claims": len(analysis.symmetries)})
    return rows


def figures(quick: bool = False) -> dict:
    """The small configs (``quick``: GPT-2 only) and, in full, the base widths at two layers."""
    torch.set_num_threads(1)
    if quick:
        return {"small": measure(False, 1, ("gpt2",))}
    return {"small": measure(False, 1), "base_2_layers": measure(True, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", action="store_true", help="base-model widths (768, 12 heads, FFN 3072)")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    measure(options.base, options.layers)


if __name__ == "__main__":
    main()
