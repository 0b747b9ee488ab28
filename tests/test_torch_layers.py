"""torch's own composite layers (``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``, ``nn.Transformer``)
nested in a user's module: fx traces through them into the layers they are made of, with their eval-mode fast path
switched off (:func:`symalg.frontend.tracing._decomposed_layers`); where fx cannot (a mask makes their forward
branch on a traced value), the automatic tracer takes ``torch.export``'s graph, and fx alone keeps the layer one
opaque node whose blocked note says why. ``nn.MultiheadAttention`` keeps its own rule (one node under fx).

Raw claims are checked on the model itself (:func:`claim_errors`); one model per layer is certified and verified."""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import claim_errors

E, H, FF = 8, 2, 6


def per_head(attention):
    """The per-head ``GL(d)`` labels of one attention module (queries/keys and values/outputs)."""
    return {f"GL({E // H}) on layer.{attention}.head{h}.{p}" for h in range(H) for p in ("qk", "vo")}


class Encoder(nn.Module):
    """``out(layer(inp(x)))`` with ``nn.TransformerEncoderLayer``, a causal ``src_mask`` passed when ``masked``."""

    def __init__(self, batch_first=True, norm_first=False, masked=False):
        super().__init__()
        self.inp, self.out = nn.Linear(3, E), nn.Linear(E, 2)
        self.layer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
        self.masked = masked

    def forward(self, x):
        h = self.inp(x)
        if self.masked:
            mask = nn.Transformer.generate_square_subsequent_mask(5, dtype=x.dtype)
            return self.out(self.layer(h, src_mask=mask, is_causal=True))
        return self.out(self.layer(h))


class Decoder(nn.Module):
    """``out(layer(inp(x), inp(x)))`` with ``nn.TransformerDecoderLayer`` (the memory is the target)."""

    def __init__(self, batch_first=True, norm_first=False):
        super().__init__()
        self.inp, self.out = nn.Linear(3, E), nn.Linear(E, 2)
        self.layer = nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.layer(h, h))


class Attention(nn.Module):
    """``out(layer(h, h, h)[0] + h)``, ``h = inp(x)``, with ``nn.MultiheadAttention`` alone."""

    def __init__(self, batch_first=True):
        super().__init__()
        self.inp, self.out = nn.Linear(3, E), nn.Linear(E, 2)
        self.layer = nn.MultiheadAttention(E, H, batch_first=batch_first)

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.layer(h, h, h, need_weights=False)[0] + h)


def example(batch_first=True):
    torch.manual_seed(1)
    return (torch.randn(2, 5, 3, dtype=torch.float64) if batch_first else torch.randn(5, 2, 3, dtype=torch.float64),)


def built(cls, **options):
    torch.manual_seed(0)
    return cls(**options).double().eval()


def raw(model, inputs, tracer):
    """``(graph, raw claims by label, the worst relative output change any claim makes)``."""
    torch.manual_seed(0)
    graph = symalg.trace(model, inputs, tracer=tracer)
    analysis = symalg.derive(graph, certify=False)
    errors = [e.error for e in claim_errors(analysis, draws=1)]
    return graph, {s.label for s in analysis.symmetries}, max(errors, default=0.0)


ENCODER = {"S(8) on inp", "S(2) on layer.self_attn.heads", f"S({FF}) on layer.linear1",
           f"PositiveScaling({FF}, alpha=1) on layer.linear1"} | per_head("self_attn") \
    | {f"Translations(4, bias) on layer.self_attn.head{h}.qk" for h in range(H)} \
    | {f"Shears(4) on layer.self_attn.head{h}.vo" for h in range(H)}
"""What the encoder layer gives whatever its layout: the residual stream permutes, the heads permute, each head's
``GL`` on queries/keys and values/outputs, key biases translate, value biases shear into the output projection's
bias, and the ReLU units permute and scale."""


def norm_groups(norm):
    return {f"{g}(8{', alpha=1' if g == 'PositiveScaling' else ''}) on layer.{norm}"
            for g in ("PositiveScaling", "SignFlips", "Shears")}


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "sequence-first"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_fx_traces_through_the_encoder_layer(batch_first, norm_first):
    """fx opens the layer (no ``TransformerEncoderLayer`` node): one ``multihead_attention`` node and the layers
    around it. The last LayerNorm before the output map (``norm2``, and ``norm1`` too in the pre-norm layout, where
    it feeds the attention only) scales, flips and shears its gain and bias; every claim leaves the output alone."""
    model = built(Encoder, batch_first=batch_first, norm_first=norm_first)
    graph, labels, error = raw(model, example(batch_first), "fx")
    ops = [graph.node(v)["op"] for v in graph.nodes]
    assert graph.tracer == "fx" and graph.tracer_note == "" and "TransformerEncoderLayer" not in ops
    assert ops.count("multihead_attention") == 1 and ops.count("layer_norm") == 2
    assert labels == ENCODER | norm_groups("norm2") | (norm_groups("norm1") if norm_first else set())
    assert error < 1e-10
    auto = symalg.trace(model, example(batch_first))
    assert auto.tracer == "fx" and [auto.node(v)["op"] for v in auto.nodes] == ops


@pytest.mark.parametrize("batch_first, norm_first", [
    (True, False), pytest.param(False, True, marks=pytest.mark.slow), pytest.param(True, True, marks=pytest.mark.slow),
    pytest.param(False, False, marks=pytest.mark.slow)])
def test_export_gives_the_encoder_layer_the_claims_fx_gives(batch_first, norm_first):
    model = built(Encoder, batch_first=batch_first, norm_first=norm_first)
    _, fx, _ = raw(model, example(batch_first), "fx")
    graph, exported, error = raw(model, example(batch_first), "export")
    assert graph.tracer == "export" and exported == fx and error < 1e-10


def test_the_encoder_layer_certifies_and_verifies():
    """Every claim on the pre-norm, sequence-first layer certifies at generic parameters and passes
    :func:`symalg.verify`; the per-head ``GL`` count is ``2 × heads``."""
    analysis = symalg.derive(symalg.trace(built(Encoder, batch_first=False, norm_first=True), example(False)))
    assert sum(s.label.startswith("GL(4) on layer.self_attn.head") for s in analysis.symmetries) == 2 * H
    assert analysis.certification and all(e.holds for e in analysis.certification)
    assert symalg.verify(analysis).passed


def test_a_masked_encoder_layer_is_exported_where_fx_cannot_trace_through_it():
    """A float ``src_mask`` sends the layer's ``F._canonical_mask`` through a check fx cannot trace: fx alone keeps
    the layer one opaque node (nothing claimed, and the blocked note says why), the automatic tracer exports the
    model and finds the layer's groups (the causal mask is the same for every head: the heads still permute)."""
    model = built(Encoder, masked=True)
    graph, labels, _ = raw(model, example(), "fx")
    ops = [graph.node(v)["op"] for v in graph.nodes]
    assert ops.count("TransformerEncoderLayer") == 1 and labels == set()  # (the mask's ops, and nothing inside it)
    assert not {"multihead_attention", "layer_norm", "getitem", "param"} & set(ops)
    reason = "torch.fx cannot trace through module 'layer' (TransformerEncoderLayer: RuntimeError: "
    assert graph.tracer_note.startswith(reason) and "tracer='export' lets torch.export see inside" in \
        graph.tracer_note
    blocked = symalg.derive(graph, certify=False).blocked
    assert any("torch.fx cannot trace through TransformerEncoderLayer" in b.reason and
               "not in the equivariance catalogue" in b.reason for b in blocked)
    auto, found, error = raw(model, example(), "auto")
    assert auto.tracer == "export" and auto.tracer_note.startswith(reason)
    assert found == ENCODER | norm_groups("norm2") and error < 1e-10


def test_without_example_inputs_the_closed_layer_names_what_would_open_it():
    graph = symalg.trace(built(Encoder, masked=True))
    assert graph.tracer == "fx" and graph.tracer_note.endswith("(example inputs let torch.export see inside it)")


def test_the_fused_fast_path_is_never_traced_and_its_switch_is_restored():
    """Under ``torch.no_grad`` with frozen weights the eval-mode layer would run
    ``torch._transformer_encoder_layer_fwd`` (one fused call no rule reads): both tracers see the decomposed path,
    and torch's fast-path switch is left as it was."""
    model = built(Encoder)
    model.requires_grad_(False)
    with torch.no_grad():
        graph = symalg.trace(model, example(), tracer="fx")
    assert torch.backends.mha.get_fastpath_enabled()
    assert "multihead_attention" in [graph.node(v)["op"] for v in graph.nodes]
    assert not any("transformer_encoder_layer" in str(graph.node(v)["op"]) for v in graph.nodes)


def test_the_decoder_layer_gets_both_attentions_per_head_groups():
    """Self- and cross-attention each get ``2 × heads`` ``GL`` groups on both routes, and every raw claim holds.
    The routes differ by what each attention rule models: fx's ``multihead_attention`` rule does not model distinct
    query and key/value inputs to a packed in-projection (a named refusal of the residual stream's permutation),
    export's cut in-projection does not move the cross-attention's key- and value-bias pieces (read through a split
    of ``in_proj_bias``)."""
    model = built(Decoder, norm_first=True)
    _, fx, fx_error = raw(model, example(), "fx")
    graph, exported, export_error = raw(model, example(), "export")
    gl = per_head("self_attn") | per_head("multihead_attn")
    assert gl <= fx and gl <= exported and max(fx_error, export_error) < 1e-10
    cross_biases = {f"Translations(4, bias) on layer.multihead_attn.head{h}.qk" for h in range(H)} | \
        {f"Shears(4) on layer.multihead_attn.head{h}.vo" for h in range(H)}
    assert exported - fx == {"S(8) on inp"} and fx - exported == cross_biases
    blocked = symalg.derive(symalg.trace(model, example(), tracer="fx"), certify=False).blocked
    assert any(b.site == "inp" and "distinct query/key/value inputs to a packed in-projection" in b.reason
               for b in blocked)


@pytest.mark.slow
def test_the_decoder_layer_certifies_and_verifies_on_both_routes():
    model = built(Decoder, batch_first=False)
    for tracer in ("fx", "export"):
        analysis = symalg.derive(symalg.trace(model, example(False), tracer=tracer))
        assert sum(s.label.startswith("GL(4) on layer.") for s in analysis.symmetries) == 4 * H
        assert all(e.holds for e in analysis.certification) and symalg.verify(analysis).passed


def test_multihead_attention_alone_keeps_its_rule_on_every_route():
    """One ``multihead_attention`` node under fx and the automatic tracer, folded into one ``attention`` node under
    export: the same claims, among them the per-head ``GL`` groups and the head permutation."""
    model = built(Attention)
    graph, fx, error = raw(model, example(), "fx")
    assert graph.tracer == "fx" and "multihead_attention" in [graph.node(v)["op"] for v in graph.nodes]
    _, auto, _ = raw(model, example(), "auto")
    _, exported, export_error = raw(model, example(), "export")
    assert fx == auto == exported
    assert {f"GL(4) on layer.head{h}.{p}" for h in range(H) for p in ("qk", "vo")} | {"S(2) on layer.heads"} <= fx
    assert max(error, export_error) < 1e-10


@pytest.mark.slow
def test_multihead_attention_alone_certifies_and_verifies():
    analysis = symalg.derive(symalg.trace(built(Attention, batch_first=False), example(False)))
    assert sum(s.label.startswith("GL(4) on layer.head") for s in analysis.symmetries) == 2 * H
    assert all(e.holds for e in analysis.certification) and symalg.verify(analysis).passed


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["encoder", "transformer"])
def test_the_automatic_tracer_exports_torch_transformer_stacks(stack):
    """``nn.TransformerEncoder`` and ``nn.Transformer`` branch on their input (``src.is_nested``, ``src.dim()``):
    fx keeps them closed, the automatic tracer exports the model and finds every attention's heads."""

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Linear(3, E), nn.Linear(E, 2)
            self.layer = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, 0.0, batch_first=True), 2,
                                               enable_nested_tensor=False) if stack == "encoder" else \
                nn.Transformer(E, H, 1, 1, FF, 0.0, batch_first=True)

        def forward(self, x):
            h = self.inp(x)
            return self.out(self.layer(h) if stack == "encoder" else self.layer(h, h))

    graph, labels, error = raw(built(Stack), example(), "auto")
    name = "TransformerEncoder" if stack == "encoder" else "Transformer"
    assert graph.tracer == "export" and f"module 'layer' ({name}:" in graph.tracer_note
    heads = [label for label in labels if label.startswith("S(2) on layer.") and label.endswith(".heads")]
    assert len(heads) == (2 if stack == "encoder" else 3) and "S(8) on inp" in labels and error < 1e-10


class Bilinear(nn.Module):
    """``out(relu(bilinear(x1, x2)))``: ``x1 = a(x)`` (through a LayerNorm when ``norm``), ``x2 = b(x)``, or
    ``x2 = x1`` when ``shared``."""

    def __init__(self, shared=False, norm=False):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(3, 4), nn.Linear(3, 5), nn.Linear(6, 2)
        self.norm = nn.LayerNorm(4) if norm else nn.Identity()
        self.bilinear = nn.Bilinear(4, 4 if shared else 5, 6)
        self.shared = shared

    def forward(self, x):
        x1 = self.norm(self.a(x))
        return self.out(torch.relu(self.bilinear(x1, x1 if self.shared else self.b(x))))


def test_bilinear_gives_each_input_its_general_linear_group_on_both_routes():
    """``y_k = x₁ᵀ W_k x₂ + b_k``: ``GL`` on each input's site (``W``'s axes 1 and 2), scalings and permutations of
    its outputs through the ReLU; fx's module node and export's ``aten.bilinear`` (both op ``bilinear``) give the same
    claims."""
    model = built(Bilinear)
    graph, fx, error = raw(model, example(), "fx")
    assert "bilinear" in [graph.node(v)["op"] for v in graph.nodes]
    exported_graph, exported, export_error = raw(model, example(), "export")
    assert "bilinear" in [exported_graph.node(v)["op"] for v in exported_graph.nodes]
    assert fx == exported == {"GL(4) on a", "GL(5) on b", "PositiveScaling(6, alpha=1) on bilinear",
                              "S(6) on bilinear"}
    assert max(error, export_error) < 1e-10


def test_bilinear_certifies_and_verifies_with_one_input_on_both_sides():
    """``bilinear(x₁, x₁)``: one ``GL(4)`` acting on both of ``W``'s input axes, ``W_k ↦ g⁻ᵀ W_k g⁻¹``."""
    analysis = symalg.derive(symalg.trace(built(Bilinear, shared=True), example()))
    assert {s.label for s in analysis.symmetries} >= {"GL(4) on a"}
    assert all(e.holds for e in analysis.certification) and symalg.verify(analysis).passed


def test_bilinear_refuses_the_translation_of_its_input():
    """A LayerNorm's bias before a bilinear map would shift ``x₁`` by ``t``, changing ``y_k`` by ``tᵀ W_k x₂``: no
    bias gives that back, so the norm's shear is not claimed (before a linear map it is); its gain still scales and
    flips, and the translation along ``1`` of ``a``'s rows (which the norm removes) stays."""
    _, labels, error = raw(built(Bilinear, norm=True), example(), "fx")
    assert labels == {"Translations(4, along 1) on a", "GL(5) on b", "PositiveScaling(4, alpha=1) on norm",
                      "SignFlips(4) on norm", "PositiveScaling(6, alpha=1) on bilinear", "S(4) on a",
                      "S(6) on bilinear"}
    assert error < 1e-10


class Transposed(nn.Module):
    """``up(relu(convT(down(x))))`` on ``(B, 2, 6)``: ``down`` (a convolution) read linearly by the transposed one."""

    def __init__(self, groups=1):
        super().__init__()
        self.down, self.up = nn.Conv1d(2, 4, 3), nn.Conv1d(6, 2, 1)
        self.convT = nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=groups)

    def forward(self, x):
        return self.up(torch.relu(self.convT(self.down(x))))


def transposed_example():
    torch.manual_seed(1)
    return (torch.randn(2, 2, 6, dtype=torch.float64),)


def test_conv_transpose_moves_its_input_and_output_channels_on_both_routes():
    """``W`` of shape ``(in, out, k)``: ``GL(4)`` on ``down``'s channels (``W``'s axis 0 reads them linearly), the
    output channels (axis 1 and the bias) scale and permute through the ReLU; fx's module node and export's
    ``aten.conv_transpose1d`` (both op ``conv_transpose1d``) give the same claims, which certify and verify."""
    model = built(Transposed)
    _, fx, error = raw(model, transposed_example(), "fx")
    _, exported, export_error = raw(model, transposed_example(), "export")
    assert fx == exported == {"GL(4) on down", "PositiveScaling(6, alpha=1) on convT", "S(6) on convT"}
    assert max(error, export_error) < 1e-10
    analysis = symalg.derive(symalg.trace(model, transposed_example()))
    assert all(e.holds for e in analysis.certification) and symalg.verify(analysis).passed


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_grouped_conv_transpose_is_blocked_with_a_note(tracer):
    model = built(Transposed, groups=2)
    graph, labels, _ = raw(model, transposed_example(), tracer)
    assert labels == set()
    blocked = symalg.derive(graph, certify=False).blocked
    assert any("a grouped transposed convolution (groups=2) is not modelled" in b.reason for b in blocked), blocked


@pytest.mark.parametrize("family, expected", [
    ("torch_layers", {"encoder", "decoder", "seq-first", "pre-norm", "no-bias", "train", "dropout", "gelu", "causal",
                      "per-head", "export"}),
    ("bilinear", {"linear", "act", "raw", "norm", "shifted", "shared", "no-bias", "export"}),
    ("conv_transpose", {"ConvTranspose1d", "ConvTranspose2d", "conv", "act", "raw", "norm", "groups2", "export"}),
])
def test_the_fuzzer_draws_these_layers_and_their_near_misses(family, expected):
    """The families the quick fuzz tiers run (``tests/test_fuzz.py``) draw every variant and near miss."""
    from symalg.verification import fuzz

    variants = [f"-{fuzz.generate(0, i, family).variant}-" for i in range(200)]
    missing = {token for token in expected if not any(f"-{token}-" in variant for variant in variants)}
    assert not missing, missing


@pytest.mark.parametrize("tracer", ["fx", "export"])
@pytest.mark.parametrize("op", ["bilinear", "conv_transpose1d", "conv_transpose2d"])
def test_the_functional_spelling_is_the_same_op_with_the_same_claims(tracer, op):
    """``F.bilinear`` and ``F.conv_transpose{1,2}d`` on a layer's weights trace to the canonical op the module does
    (``bilinear``, ``conv_transpose1d/2d``) and give its claims, which hold at generic parameters."""
    from symalg.catalogue.rules.torch_layers import BilinearExample, TransposedExample

    def build(functional):
        torch.manual_seed(0)
        model = BilinearExample(functional) if op == "bilinear" else TransposedExample(int(op[-2]), functional)
        return model.double().eval()

    inputs = (torch.randn(5, 3, dtype=torch.float64),) if op == "bilinear" else \
        (torch.randn(5, 2, *(8,) * int(op[-2]), dtype=torch.float64),)
    graph, labels, error = raw(build(True), inputs, tracer)
    assert op in [graph.node(v)["op"] for v in graph.nodes]
    assert labels == raw(build(False), inputs, tracer)[1] and labels
    assert error < 1e-10
