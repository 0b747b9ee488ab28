"""LayerNorm centring (issue 30): ``LN(x + a 1) = LN(x)``, the mean is subtracted before the variance, so ``eps``
does not break it. Where every reader of a sum is a LayerNorm, each writer of the sum may move its output along
``1``: a linear writer ``W ↦ W + 1 vᵀ``, ``b ↦ b + c 1``, an embedding row ``E_i ↦ E_i + a_i 1``; the shift passes
sums whatever their sign or factor (``a − b``, ``torch.add(a, b, alpha=c)``) and a parameter or the input added.
Claims are derived raw (no certification) through fx and torch.export, which must agree, and checked on the model
at generic parameters and on inputs of other shapes (``assert_claims_hold``).
"""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import assert_claims_hold


class Stream(nn.Module):
    """A pre-LN residual stream written by ``emb`` (tokens) or ``inp`` (features) and one block, read by ``ln``s.

    ``reader``: ``"layer_norm"`` (centring), ``"rms"`` (an RMSNorm reads the stream: no mean subtracted),
    ``"linear"`` (the head reads the stream directly), ``"returned"`` (the stream is also an output), ``"two_axes"``
    (the final LayerNorm normalises tokens and features together);
    ``sum``: ``"add"``, ``"sub"`` or ``"alpha"`` (``torch.add(·, ·, alpha=0.5)``)."""

    def __init__(self, tokens=False, reader="layer_norm", sum="add", d=4):
        super().__init__()
        self.tokens, self.reader, self.sum = tokens, reader, sum
        self.emb = nn.Embedding(5, d) if tokens else nn.Linear(3, d)
        norm = (lambda: nn.RMSNorm(d)) if reader == "rms" else (lambda: nn.LayerNorm(d))
        self.ln1, self.ln2 = norm(), norm()
        self.fc, self.proj, self.head = nn.Linear(d, 6), nn.Linear(6, d), nn.Linear(d, 2)
        self.ln_all = nn.LayerNorm((3, d), elementwise_affine=False)

    def forward(self, x):
        h = self.emb(x)
        branch = self.proj(torch.relu(self.fc(self.ln1(h))))
        h = {"add": lambda: h + branch, "sub": lambda: h - branch,
             "alpha": lambda: torch.add(h, branch, alpha=0.5)}[self.sum]()
        if self.reader in ("two_axes", "computed_shape"):
            h = h + (self.ln_all(h) if self.reader == "two_axes" else nn.functional.layer_norm(h, h.shape[-2:]))
        out = self.head(h if self.reader == "linear" else self.ln2(h))
        return (out, h) if self.reader == "returned" else out


def derive(model, x, tracer):
    torch.manual_seed(0)
    return symalg.derive(symalg.trace(model, (x,), tracer=tracer), certify=False)


def centring(analysis):
    return [s for s in analysis.symmetries if s.group.name.endswith("along 1)")]


def inputs(tokens):
    return torch.randint(0, 5, (2, 3)) if tokens else torch.randn(2, 3, 3)


@pytest.mark.parametrize("sum", ["add", "sub", "alpha"])
@pytest.mark.parametrize("tokens", [False, True])
def test_the_writers_of_a_layer_norm_read_stream_move_along_ones(tokens, sum):
    """One family moving every writer: the input map (3 + 1 directions) or the 5 embedding rows, and ``proj``
    (6 + 1). Before: ``T1 removed: a sum does not absorb translations``."""
    torch.manual_seed(0)
    model = Stream(tokens, sum=sum).double()
    x = inputs(tokens)
    fx, exported = derive(model, x, "fx"), derive(model, x, "export")
    expected = [f"Translations({(5 if tokens else 4) + 7}, along 1) on emb"]
    assert [s.label for s in centring(fx)] == [s.label for s in centring(exported)] == expected
    writers = {"emb.weight", "proj.weight", "proj.bias"} | (set() if tokens else {"emb.bias"})
    assert set(centring(fx)[0].tensors) == set(centring(exported)[0].tensors) == writers
    assert_claims_hold(fx, draws=2)
    assert_claims_hold(exported, draws=2)


@pytest.mark.parametrize("reader", ["rms", "linear", "returned"])
def test_no_centring_where_a_reader_of_the_stream_sees_a_shift_along_ones(reader):
    """An RMSNorm divides by the root mean square without subtracting the mean; a linear head and a returned stream
    see the shift: no writer may move along ``1``."""
    torch.manual_seed(0)
    model = Stream(reader=reader).double()
    analysis = derive(model, inputs(False), "fx")
    assert centring(analysis) == []
    assert_claims_hold(analysis, draws=2)


def test_a_translation_along_ones_of_the_stream_changes_an_rms_normed_output():
    """The check above is not vacuous: the same move that the LayerNorm model ignores changes the RMSNorm model."""
    torch.manual_seed(0)
    for reader, changes in (("layer_norm", False), ("rms", True)):
        model, x = Stream(reader=reader).double(), inputs(False).double()
        before = model(x)
        with torch.no_grad():
            model.proj.bias += 0.7
        assert (model(x) - before).abs().max().item() > 1e-3 if changes else \
            torch.allclose(model(x), before, atol=1e-12)


def test_a_layer_norm_over_tokens_and_features_keeps_only_shifts_alike_at_every_position():
    """``LN`` over ``(T, d)`` ignores one number added to every entry, not a shift ``(vᵀx_t) 1`` that varies with the
    position: the writers' weights may no longer move by ``1 vᵀ``, for every writer of the tied stream (a sum ties
    them; the fuzzer's ``centring`` family found this false once when only the first summand's site was told), and
    the biases ``b ↦ b + c 1`` still may."""
    torch.manual_seed(0)
    for tracer in ("fx", "export"):
        analysis = derive(Stream(reader="two_axes").double(), inputs(False), tracer)
        assert [s.label for s in centring(analysis)] == ["Translations(2, along 1) on emb"]
        assert set(centring(analysis)[0].tensors) == {"emb.bias", "proj.bias"}
        assert_claims_hold(analysis, draws=2)


def test_a_normalized_shape_computed_in_forward_is_not_read_as_one_axis():
    """``F.layer_norm(h, h.shape[-2:])`` under fx records the shape as a node: it was read as one axis, and the
    stream's row shifts were claimed (error 2.6e-5). Now the norm is an unknown op there, with a note; export records
    the numbers and agrees with the module's claims above."""
    torch.manual_seed(0)
    analysis = derive(Stream(reader="computed_shape").double(), inputs(False), "fx")
    assert centring(analysis) == []
    assert any(b.node == "layer_norm" and "T1" in b.reason for b in analysis.blocked), analysis.blocked
    assert_claims_hold(analysis, draws=2)
    exported = derive(Stream(reader="computed_shape").double(), inputs(False), "export")
    assert [s.label for s in centring(exported)] == ["Translations(2, along 1) on emb"]
