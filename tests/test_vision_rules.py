"""Convolutional / vision patterns (issue 30): eval-mode batch norm after a convolution, export's in-place ops.

Eval-mode batch norm with a gain is the diagonal map ``y = γ (x − μ)/√(σ² + ε) + β`` of its input: a scaling
``x ↦ d x`` of the convolution's output channels (any invertible diagonal ``d``) is given back by ``μ ↦ d μ`` and
``γ ↦ γ/d`` whatever ``ε``, with ``σ²`` and ``β`` kept. ``torch.export`` writes ``out += r`` and ``relu(inplace=True)``
as ``aten.add_``/``aten.relu_``: read as their functional ops unless the written tensor is aliased.

Every case derives raw claims (no certification) through fx and torch.export, which must agree, and moves the
parameters *and buffers* at a generic point by each claim's group elements on other batch and image sizes.
"""
import pytest
import torch
from torch import nn

import symalg


class ConvBN(nn.Module):
    """``head(relu(bn(conv(x))))``: ResNet's stem, RegNet's and MobileNet's conv-BN-activation unit."""

    def __init__(self, bias=False, affine=True):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(4, affine=affine)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))))


class Residual(nn.Module):
    """A ResNet basic block written as Hugging Face's: ``h = relu(bn(conv(x))); out = bn(conv(h)); out += h;
    relu_(out)``; with ``viewed``, a slice of ``out`` taken before the in-place add is returned too (it sees the
    write)."""

    def __init__(self, viewed=False):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(4)
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Conv2d(4, 2, 1)
        self.viewed = viewed

    def forward(self, x):
        h = self.act(self.stem_bn(self.stem(x)))
        out = self.bn(self.conv(h))
        view = out[:, :2] if self.viewed else None
        out += h
        y = self.head(self.act(out))
        return y if view is None else (y, view)


def generic(model, seed=0):
    """The model's parameters and buffers at a generic point: Gaussian noise on parameters and running means,
    running variances in ``[0.5, 2]``."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not tensor.is_floating_point():
            state[name] = tensor.detach().clone()
        elif name.endswith("running_var"):
            state[name] = 0.5 + 1.5 * torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype)
        else:
            state[name] = tensor.detach() + torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
    return state


def outputs(model, state, x):
    result = torch.func.functional_call(model, state, (x,))
    return result if isinstance(result, tuple) else (result,)


def worst_error(model, analysis, sizes=((1, 6), (3, 9))):
    """The largest relative change of any output under any claim's sampled elements, at a generic point (parameters
    and buffers), on inputs of other batch and image sizes."""
    state = generic(model)
    generator = torch.Generator().manual_seed(1)
    worst = 0.0
    for symmetry in analysis.symmetries:
        for _, g in symmetry.group.sample(generator):
            moved = {**state, **symmetry.apply(state, g)}
            for batch, size in sizes:
                x = torch.randn(batch, 3, size, size, generator=generator, dtype=torch.float64)
                for before, after in zip(outputs(model, state, x), outputs(model, moved, x)):
                    worst = max(worst, float((after - before).abs().max() / before.abs().max()))
    return worst


def derive_both(model, x=None):
    """Raw claims through fx and export (the same labels), and the fx analysis."""
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64) if x is None else x
    analyses = [symalg.derive(symalg.trace(model, (x,), tracer=tracer), certify=False) for tracer in ("fx", "export")]
    fx, exported = ([s.label for s in sorted(a.symmetries, key=lambda s: s.label)] for a in analyses)
    assert fx == exported
    return analyses


def labels(analysis):
    return sorted(s.label for s in analysis.symmetries)


@pytest.mark.parametrize("bias", [False, True])
def test_eval_batch_norm_absorbs_the_convolutions_scalings(bias):
    """Before: the conv's channels had permutations only (``eps > 0`` blocked the scaling). Now ``PS`` and ``SF`` on
    the conv's output (``μ ↦ dμ``, ``γ ↦ γ/d``), with a conv bias also its translation moving ``μ``."""
    model = ConvBN(bias).double().eval()
    fx, exported = derive_both(model)
    expected = ["PositiveScaling(4, alpha=1) on bn", "PositiveScaling(4, alpha=1) on conv", "S(4) on conv",
                "SignFlips(4) on conv"] + (["Translations(4, bias) on conv"] if bias else [])
    assert labels(fx) == sorted(expected)
    assert not fx.blocked
    for analysis in (fx, exported):
        assert worst_error(model, analysis) < 1e-9


def test_the_scaling_keeps_the_variance_and_divides_the_gain():
    model = ConvBN().double().eval()
    fx, _ = derive_both(model)
    flips = next(s for s in fx.symmetries if s.label == "SignFlips(4) on conv")
    state = generic(model)
    g = torch.diag(torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=torch.float64))
    moved = flips.apply(state, g)
    assert "bn.running_var" not in moved or torch.equal(moved["bn.running_var"], state["bn.running_var"])
    assert torch.equal(moved["bn.running_mean"], state["bn.running_mean"] * g.diagonal())
    assert torch.equal(moved["bn.weight"], state["bn.weight"] * g.diagonal())


def test_batch_norm_in_training_mode_keeps_no_scaling():
    """Near miss: batch statistics with ``eps > 0`` (``BN(d·x)`` is BN with ``eps/d²``): no scaling, a blocked note."""
    model = ConvBN().double().train()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(2, 3, 8, 8, dtype=torch.float64),)), certify=False)
    assert not any(s.label.endswith("on conv") and s.group.kind in ("PS", "SF") for s in analysis.symmetries)
    assert any("eps = 1e-05 breaks its scale invariance" in b.reason for b in analysis.blocked)


def test_batch_norm_without_gain_keeps_no_scaling():
    """Near miss: no ``γ`` to absorb ``d``; ``σ² ↦ d²σ²`` is exact only for ``eps = 0``."""
    model = ConvBN(affine=False).double().eval()
    fx, exported = derive_both(model)
    assert not any(s.label.endswith("on conv") and s.group.kind in ("PS", "SF") for s in fx.symmetries)
    assert any("eps = 1e-05 breaks its scale invariance" in b.reason for b in fx.blocked)
    assert worst_error(model, fx) < 1e-9


def test_in_place_residual_add_is_an_add_under_export():
    """Before: export's ``aten.add_`` was an unknown op blocking both summands' sites (ResNet)."""
    model = Residual().double().eval()
    fx, exported = derive_both(model)
    graph = symalg.trace(model, (torch.randn(2, 3, 8, 8, dtype=torch.float64),), tracer="export")
    ops = {data["op"] for _, data in graph.graph.nodes(data=True)}
    assert "add" in ops and not any(op.startswith("aten.") for op in ops)
    # each conv's scalings and flips through its batch norm; the residual's scaling (both gains, both shifts)
    assert labels(fx) == ["PositiveScaling(4, alpha=1) on conv", "PositiveScaling(4, alpha=1) on stem",
                          "PositiveScaling(4, alpha=1) on stem_bn", "S(4) on stem", "SignFlips(4) on conv",
                          "SignFlips(4) on stem"]
    assert not exported.blocked
    for analysis in (fx, exported):
        assert worst_error(model, analysis) < 1e-9


def test_in_place_add_on_a_viewed_tensor_is_not_read_as_an_add():
    """Near miss: a slice of ``out`` taken before ``out += h`` sees the write; the functional reading would give the
    slice the old values. Export's ``aten.add_`` stays an in-place op nobody reads, with the reason."""
    model = Residual(viewed=True).double().eval()
    graph = symalg.trace(model, (torch.randn(2, 3, 8, 8, dtype=torch.float64),), tracer="export")
    ops = [data["op"] for _, data in graph.graph.nodes(data=True)]
    assert "aten.add_ in place (node 'slice_1' is a view of the tensor it writes)" in ops
    analysis = symalg.derive(graph, certify=False)
    assert any("aten.add_ in place" in b.reason for b in analysis.blocked)
    assert worst_error(model, analysis) < 1e-9


def test_in_place_add_on_a_view_or_a_parameter_is_not_read_as_an_add():
    """Near misses: writing a view writes its base; writing a parameter changes the model."""
    class WritesView(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 2, 1)

        def forward(self, x):
            h = torch.relu(self.conv(x))
            h[:, :2].add_(1.0)
            return self.head(h)

    class WritesParameter(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.conv(x) + self.conv.bias.detach().view(1, 4, 1, 1).mul_(1.0)

    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    for model, reason in ((WritesView(), "a view of another tensor"), (WritesParameter(), "a view of another")):
        for tracer in ("fx", "export"):
            graph = symalg.trace(model.double().eval(), (x,), tracer=tracer)
            assert any(reason in data["op"] for _, data in graph.graph.nodes(data=True)), tracer
            analysis = symalg.derive(graph, certify=False)
            assert worst_error(model, analysis) < 1e-9


@pytest.mark.slow
def test_tiny_hf_resnet():
    """Hugging Face's ResNet at the census's tiny config (export): every conv's ``PS``/``SF`` through its batch
    norm, the residual adds read; every claim holds at a generic point."""
    transformers = pytest.importorskip("transformers")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from zoo import hf_builder
    model, make_inputs, _ = hf_builder("resnet")()
    assert isinstance(model, transformers.ResNetModel)
    graph = symalg.trace(model, **make_inputs(2, None))
    analysis = symalg.derive(graph)
    assert not [b for b in analysis.blocked if "add_" in b.reason or "eps" in b.reason]
    kinds = [s.group.kind for s in analysis.symmetries]
    assert kinds.count("SF") >= 17 and kinds.count("PS") >= 26
