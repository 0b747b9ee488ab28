"""Hostile models (issue 29): modules that used to crash ``trace`` or ``derive`` give a certified analysis or a
:class:`symalg.SpecError` naming the module, parameter or input and why (docs/soundness.md, "Hostile models")."""
import warnings

import pytest
import torch
from torch import nn

import symalg
from symalg.errors import SpecError
from symalg.verification.certification import claim_errors


def _x(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype)


def _certified(analysis: symalg.Analysis) -> list[str]:
    """The labels of the claims, after asserting that every one keeps every output (checked apart from derive)."""
    errors = claim_errors(analysis, seed=7)
    assert len(errors) == len(analysis.symmetries) and all(e.holds for e in errors), errors
    return sorted(s.label for s in analysis.symmetries)


# -- the hook-based weight_norm: weight = g v / ‖v‖, computed in a forward pre-hook -------------------------------

class _Deep(nn.Module):
    def __init__(self, reparametrise):
        super().__init__()
        self.fc, self.mid, self.out = nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(5, 2)
        reparametrise(self.fc)

    def forward(self, x):
        return self.out(torch.tanh(self.mid(torch.relu(self.fc(x)))))


def _old_weight_norm(module: nn.Module) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # deprecated in favour of parametrizations.weight_norm
        nn.utils.weight_norm(module)


@pytest.mark.parametrize("tracer", ["auto", "fx", "export"])
@pytest.mark.parametrize("reparametrise", [_old_weight_norm, nn.utils.parametrizations.weight_norm],
                         ids=["hook", "parametrization"])
def test_weight_norm_is_traced_with_its_hook_and_its_claims_hold(reparametrise, tracer):
    """The hook-based form used to raise ``KeyError: 'weight'`` in the linear rule (fx kept ``fc`` as one node with
    no ``weight``), and fx kept the parametrized form as an unknown node with no note. Both are now traced into:
    ``_weight_norm(v, g, 0) = g v/‖v‖`` moves its rows with ``g`` and ``v`` by scalings and permutations (a sign flip
    of both leaves it as it is). The raw claims hold, and ``fc.weight`` is a tensor again after the trace."""
    torch.manual_seed(0)
    model = _Deep(reparametrise).double()
    analysis = symalg.derive(symalg.trace(model, (_x(5, 3),), tracer=tracer), certify=False)
    assert _certified(analysis) == ["PositiveScaling(4, alpha=1) on fc", "S(4) on fc", "S(5) on mid",
                                    "SignFlips(5) on mid"]
    scaling = next(s for s in analysis.symmetries if s.label == "PositiveScaling(4, alpha=1) on fc")
    assert {"fc.weight_g", "fc.weight_v"} <= set(scaling.tensors) or \
        {"fc.parametrizations.weight.original0", "fc.parametrizations.weight.original1"} <= set(scaling.tensors)
    assert any("SF removed" in b.reason and "weight norm per row" in b.reason for b in analysis.sites.restrictions)
    assert type(model.fc.weight) is torch.Tensor


def test_the_columns_of_a_weight_normalised_layer_keep_the_orthogonal_group():
    """``v ↦ v Oᵀ`` keeps every row's norm: a plain linear layer feeding a weight-normalised one keeps ``O(4)``
    (not ``GL(4)``, which would change the norms)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).double()
    _old_weight_norm(model[1])
    analysis = symalg.derive(symalg.trace(model, (_x(5, 3),)), certify=False)
    assert "O(4) on 0" in _certified(analysis)


@pytest.mark.parametrize("dim", [None, 1])
def test_weight_norm_over_the_whole_weight_or_the_columns_is_unknown_and_named(dim):
    """Only the norm per row (``dim=0``, the default) is modelled: another ``dim`` is an unknown op naming ``g``."""
    torch.manual_seed(0)
    model = _Deep(lambda m: nn.utils.parametrizations.weight_norm(m, dim=dim)).double()
    analysis = symalg.derive(symalg.trace(model, (_x(5, 3),)), certify=False)
    assert _certified(analysis) == ["S(5) on mid", "SignFlips(5) on mid"]
    notes = [str(b) for b in analysis.blocked]
    assert any(n.startswith("fc.parametrizations.weight.original0 (node _weight_norm)") for n in notes), notes


def test_a_forward_hook_on_a_torch_module_is_part_of_the_analysis():
    """A forward hook scaling ``tanh``'s output per unit: fx used to skip it (``S`` claimed, then removed by
    certification as false); now the product is in the graph and ``S`` is never proposed."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    model[1].register_forward_hook(lambda module, inputs, output: output * torch.arange(1.0, 5.0, dtype=output.dtype))
    analysis = symalg.derive(symalg.trace(model, (_x(5, 3),)))
    assert _certified(analysis) == ["SignFlips(4) on 0"]
    assert all(e.holds for e in analysis.certification)


# -- TorchScript submodules ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("tracer", ["auto", "fx", "export"])
@pytest.mark.parametrize("where, scripted, message", [
    ("activation", lambda: nn.Sequential(nn.Linear(3, 4), torch.jit.script(nn.ReLU()), nn.Linear(4, 2)),
     r"module '1' \(ReLU\) is a TorchScript module"),
    ("linear", lambda: nn.Sequential(torch.jit.script(nn.Linear(3, 4)), nn.ReLU(), nn.Linear(4, 2)),
     r"module '0' \(Linear\) is a TorchScript module"),
    ("nested", lambda: nn.Sequential(nn.Linear(3, 4), nn.Sequential(torch.jit.script(nn.Tanh()))),
     r"module '1\.0' \(Tanh\) is a TorchScript module"),
    ("model", lambda: torch.jit.script(nn.Sequential(nn.Linear(3, 4), nn.ReLU())),
     r"the model \(Sequential\) is a TorchScript module")])
def test_a_scripted_module_is_refused_naming_it(where, scripted, message, tracer):
    """Used to raise torch's ``register_forward_pre_hook is not supported on ScriptModules``."""
    with pytest.raises(SpecError, match=message + r".*opaque to torch\.fx and torch\.export.*original nn\.Module"):
        symalg.trace(scripted().double(), (_x(5, 3),), tracer=tracer)


# -- complex parameters and inputs ---------------------------------------------------------------------------------

def test_a_complex_parameter_is_refused_naming_it():
    """Used to crash certification's input sampler (``"min_all" not implemented for 'ComplexDouble'``) and, with
    ``certify=False``, to claim a ``GL(4)`` that ``apply`` cannot apply to complex weights."""
    model = nn.Sequential(nn.Linear(4, 4, dtype=torch.complex128), nn.Linear(4, 2, dtype=torch.complex128))
    for inputs in ((_x(5, 4, dtype=torch.complex128),), None):
        with pytest.raises(SpecError, match=r"parameter '0\.weight' of module '0' \(Linear\) is complex "
                                            r"\(torch\.complex128\): complex parameters are not supported"):
            symalg.trace(model, inputs)


def test_a_complex_example_input_is_refused_naming_it():
    class Real(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 2)

        def forward(self, z):
            return self.fc(torch.view_as_real(z).flatten(-2))

    with pytest.raises(SpecError, match=r"example input 0 is complex \(torch\.complex128\): complex inputs are not"):
        symalg.trace(Real().double(), (_x(5, 4, dtype=torch.complex128),))


def test_complex_values_inside_a_real_model_are_analysed_soundly():
    """Real parameters and inputs with a complex intermediate (an FFT) and a complex output: the FFT is an unknown op
    that blocks the site it reads, the rest certifies (complex outputs compared as such)."""
    class Spectral(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.mid = nn.Linear(3, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.mid(torch.relu(self.fc(x)))
            return torch.fft.fft(h), torch.fft.fft(h).abs()

    analysis = symalg.derive(symalg.trace(Spectral().double(), (_x(5, 3),)))
    assert _certified(analysis) == ["PositiveScaling(4, alpha=1) on fc", "S(4) on fc"]
    assert any(b.node == "fft_fft" for b in analysis.blocked), analysis.blocked


# -- dropout in training mode ----------------------------------------------------------------------------------------

class _Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop, self.out = nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.drop(torch.tanh(self.fc(x))))


def test_dropout_in_training_mode_is_named_in_a_blocked_note():
    """The permutations a training-mode dropout removes used to be noted only as a restriction; the blocked note now
    names the dropout node and why (its mask is drawn per unit), and what is left certifies."""
    trained = symalg.derive(symalg.trace(_Dropped().double().train(), (_x(5, 3),)))
    assert _certified(trained) == ["SignFlips(4) on fc"]
    (note,) = [b for b in trained.blocked if b.node == "drop"]
    assert note.site == "fc" and note.reason.startswith("S removed: node 'drop' (call_module drop): dropout in "
                                                        "training mode: its random mask drops units independently")
    assert "model.eval()" in note.reason
    evaluated = symalg.derive(symalg.trace(_Dropped().double().eval(), (_x(5, 3),)))
    assert _certified(evaluated) == ["S(4) on fc", "SignFlips(4) on fc"]
    assert not any("dropout" in str(b) for b in evaluated.blocked)


def test_functional_dropout_in_training_mode_is_named_under_both_tracers():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.out(nn.functional.dropout(torch.relu(self.fc(x)), 0.25, training=True))

    for tracer in ("fx", "export"):
        analysis = symalg.derive(symalg.trace(Functional().double(), (_x(5, 3),), tracer=tracer))
        assert _certified(analysis) == ["PositiveScaling(4, alpha=1) on fc"]
        assert any("dropout in training mode" in b.reason and b.site == "fc" for b in analysis.blocked), tracer


def test_attention_dropout_in_training_mode_is_named_in_a_blocked_note():
    """``nn.MultiheadAttention(dropout=0.25)`` in training mode: its head permutations go, and the blocked note says
    that the dropout on each head's attention weights is why (it used to be a restriction naming masks, biases,
    temperatures or dropout alike)."""
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    analysis = symalg.derive(symalg.trace(Attention().double().train(), (_x(2, 5, 8),)))
    assert "S(2) on attn.heads" not in _certified(analysis)
    (note,) = [str(b) for b in analysis.blocked if b.site == "attn.heads"]
    assert "dropout in training mode (p=0.25) draws a random mask on each head's attention weights" in note
