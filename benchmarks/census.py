"""Census of full-size Hugging Face architectures on the ``meta`` device (a script, not a test).

Each model is built from its published configuration under ``torch.device("meta")``: parameters have shapes and
no storage, so a Llama-3-8B-shaped model costs no 32 GB. Its example inputs are on ``meta`` too; ``torch.export``
traces meta tensors (fake tensors underneath), and ``symalg.derive(graph, certify=False)`` infers the groups from
shapes alone. Certification runs the model numerically, which meta cannot: the claims at full size are the same
rules certified at small size (``tests/test_census.py`` checks that the meta route and real weights give the same
labels and orbit dimension). Every model runs in a fresh Python process, so ``peak RSS`` is that model's alone.

Columns: parameters (millions, and their float32 size), groups found per class, the generic orbit dimension
(``Analysis.orbit_dimension()``: the structured rank at generic parameters, no values read), blocked notes,
time of ``symalg.trace`` and of ``derive`` + orbit dimension, and the process's peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) with its growth over the RSS right after the model was built.
Baselines from the same process: ``torch.export.export`` alone, run first (``trace / export``; export's caches are
then warm for ``symalg.trace``, which exports again), and the float32 size of the weights (``growth / weights``).

Usage::

    python benchmarks/census.py                      # every full-size model
    python benchmarks/census.py --quick              # the same families at small widths (seconds)
    python benchmarks/census.py --models gpt2 bert-base --json census.json
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from collections import Counter

MODELS = ("gpt2", "gpt2-medium", "llama-3-8b", "mistral-7b", "bert-base", "vit-b16", "t5-base")


def _config(name: str, quick: bool):
    """``(model class, config, example-input builder)`` of ``name``: the published sizes, or (``quick``) two
    layers at width 64. Every config has ``use_cache=False`` where it has the option (no cache in the outputs)."""
    import torch
    from transformers import (BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel, MistralConfig,
                              MistralModel, T5Config, T5Model, ViTConfig, ViTModel)

    small = dict(layers=2, width=64, heads=4, ffn=128, vocab=128) if quick else None

    def ids(batch=1, seq=8):
        return lambda: (torch.zeros(batch, seq, dtype=torch.long),)

    if name in ("gpt2", "gpt2-medium"):
        layers, width, heads = (12, 768, 12) if name == "gpt2" else (24, 1024, 16)
        if small:
            layers, width, heads = small["layers"], small["width"], small["heads"]
        return GPT2Model, GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024,
                                     vocab_size=small["vocab"] if small else 50257, use_cache=False), ids()
    if name in ("llama-3-8b", "mistral-7b"):
        cls, config = (LlamaModel, LlamaConfig) if name == "llama-3-8b" else (MistralModel, MistralConfig)
        sizes = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256 if name == "llama-3-8b" else 32000)
        if small:
            sizes = dict(hidden_size=small["width"], intermediate_size=small["ffn"], num_hidden_layers=small["layers"],
                         num_attention_heads=small["heads"], num_key_value_heads=2, vocab_size=small["vocab"])
        return cls, config(**sizes, use_cache=False), ids()
    if name == "bert-base":
        sizes = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        if small:
            sizes = dict(hidden_size=small["width"], num_hidden_layers=small["layers"],
                         num_attention_heads=small["heads"], intermediate_size=small["ffn"], vocab_size=small["vocab"])
        return BertModel, BertConfig(**sizes), ids()
    if name == "vit-b16":
        sizes = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                     image_size=224, patch_size=16)
        if small:
            sizes = dict(hidden_size=small["width"], num_hidden_layers=small["layers"],
                         num_attention_heads=small["heads"], intermediate_size=small["ffn"], image_size=32,
                         patch_size=8)
        size = sizes["image_size"]
        return ViTModel, ViTConfig(**sizes), lambda: (torch.zeros(1, 3, size, size),)
    if name == "t5-base":
        sizes = dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_heads=12)
        if small:
            sizes = dict(d_model=small["width"], d_ff=small["ffn"], d_kv=16, num_layers=small["layers"],
                         num_heads=small["heads"], vocab_size=small["vocab"])
        make = ids()
        return T5Model, T5Config(**sizes, use_cache=False), lambda: (make()[0], None, make()[0])
    raise ValueError(f"unknown model {name!r}; choose from {MODELS}")


def census_one(name: str, quick: bool) -> dict:
    """Build ``name`` on meta, trace and derive it; the row of the table (run in a fresh process)."""
    import torch
    import transformers

    import symalg

    transformers.logging.set_verbosity_error()
    cls, config, inputs = _config(name, quick)
    with torch.device("meta"):
        model = cls(config).eval()
        example = inputs()
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    count = sum(p.numel() for p in model.parameters())
    row = {"model": name + (" (quick)" if quick else ""), "parameters": count,
           "weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 30}
    start = time.perf_counter()
    try:
        torch.export.export(model, example, strict=False)   # the baseline: torch's own tracer alone
        row["export_s"] = time.perf_counter() - start
        start = time.perf_counter()
        graph = symalg.trace(model, example)
        row["tracer"] = graph.tracer
        row["trace_s"] = time.perf_counter() - start
        start = time.perf_counter()
        analysis = symalg.derive(graph, certify=False)
        try:
            row["orbit"] = int(analysis.orbit_dimension())
        except NotImplementedError:  # coupled sites (a head's GL with its key-bias translations): numeric only
            row["orbit"] = "no closed form"
        row["derive_s"] = time.perf_counter() - start
        row["groups"] = dict(Counter(type(s.group).__name__ for s in analysis.symmetries))
        row["blocked"] = len(analysis.blocked)
    except Exception as error:  # a row saying why, not a crashed census
        row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row["rss_growth_mib"] = row["peak_rss_mib"] - rss_start / 1024
    return row


def _format(rows: list[dict]) -> str:
    lines = ["| model | parameters | groups | orbit dim | blocked | export s | trace s (/ export) | derive s | "
             "peak RSS MiB | growth MiB (/ weights) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        params = f"{r['parameters'] / 1e6:.1f} M ({r['weights_gib']:.2f} GiB fp32)"
        if "error" in r:
            lines.append(f"| {r['model']} | {params} | error: {r['error']} | | | | | {r['peak_rss_mib']:.0f} |")
            continue
        groups = ", ".join(f"{k} {v}" for k, v in sorted(r["groups"].items())) or "none"
        weights = r["rss_growth_mib"] / (r["weights_gib"] * 1024)
        lines.append(f"| {r['model']} | {params} | {groups} | {r['orbit']} | {r['blocked']} | {r['export_s']:.1f} | "
                     f"{r['trace_s']:.1f} ({r['trace_s'] / r['export_s']:.2f}) | {r['derive_s']:.2f} | "
                     f"{r['peak_rss_mib']:.0f} | {r['rss_growth_mib']:.0f} ({weights:.3f}) |")
    return "\n".join(lines)


def figures(quick: bool = False) -> dict:
    """Every model's row, each in a fresh process; ``quick``: GPT-2 at two layers of width 64, in this process."""
    if quick:
        return {"rows": [census_one("gpt2", True)]}
    rows = []
    for name in MODELS:
        child = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=True)
        rows.append(json.loads(child.stdout))
    return {"rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="two layers at width 64 instead of the full sizes")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--one", choices=MODELS, help=argparse.SUPPRESS)  # the child process: one model, JSON out
    args = parser.parse_args(argv)
    if args.one:
        json.dump(census_one(args.one, args.quick), sys.stdout)
        return
    rows = []
    for name in args.models:
        child = subprocess.run([sys.executable, __file__, "--one", name] + ["--quick"] * args.quick,
                               capture_output=True, text=True, check=False)
        if child.returncode:
            rows.append({"model": name, "parameters": 0, "weights_gib": 0.0, "peak_rss_mib": 0.0,
                         "error": child.stderr.strip().splitlines()[-1] if child.stderr.strip() else "crashed"})
        else:
            rows.append(json.loads(child.stdout))
    print(f"# {platform.platform()}, {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(_format(rows))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
