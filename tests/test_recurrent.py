"""torch's recurrent layers (``symalg/catalogue/rules/recurrent.py``): ``nn.RNN`` (tanh, ReLU), ``nn.GRU``,
``nn.LSTM`` under fx (leaf modules) and ``torch.export`` (``aten.rnn_tanh``/``rnn_relu``/``gru``/``lstm``).

Every claim is applied by hand (:meth:`Symmetry.apply`) at generic parameters and checked on inputs of other batch
and sequence lengths, every output compared; fx and export must give the same claims."""
import pytest
import torch
from torch import nn

import symalg

CELLS = {"rnn": nn.RNN, "relu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k), "gru": nn.GRU,
         "lstm": nn.LSTM}


class Net(nn.Module):
    """``head(cell(embed(x))[0])``; with ``returns`` also ``final(h_n)`` (``"h"``), an LSTM's ``final(c_n)``
    (``"c"``) or ``h_n`` itself (``"raw"``); an initial state ``h0`` may be given as a second input."""

    def __init__(self, cell="lstm", layers=1, bidirectional=False, batch_first=True, returns=None, **options):
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.rnn = CELLS[cell](4, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first,
                               **options)
        self.head = nn.Linear(5 * (1 + bidirectional) if not options.get("proj_size") else options["proj_size"], 2)
        self.final = nn.Linear(5, 2)
        self.returns = returns

    def forward(self, x, h0=None):
        out, state = self.rnn(self.embed(x)) if h0 is None else self.rnn(self.embed(x), h0)
        if not self.returns:
            return self.head(out)
        h_n = state[0] if isinstance(self.rnn, nn.LSTM) else state
        if self.returns == "raw":
            return self.head(out), h_n
        return self.head(out), self.final(state[1] if self.returns == "c" else h_n)


def generic(model):
    """``model`` in float64 and eval mode with standard normal parameters (no accidental structure)."""
    torch.manual_seed(3)
    model = model.double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.7)
    return model


def sequences(batch_first, *shapes):
    generator = torch.Generator().manual_seed(11)
    return [torch.randn(*((b, t, 3) if batch_first else (t, b, 3)), generator=generator, dtype=torch.float64)
            for b, t in shapes]


def outputs(model, params, x, *extra):
    result = torch.func.functional_call(model, params, (x, *extra))
    flat = result if isinstance(result, tuple) else (result,)
    return torch.cat([r.reshape(-1) for r in flat])


def worst_change(model, analysis, inputs, *extra):
    """The largest relative output change any claim makes, over group elements and ``inputs``."""
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(5)
    worst = 0.0
    for symmetry in analysis.symmetries:
        for _, g in symmetry.group.sample(generator):
            moved = symmetry.apply(params, g)
            for x in inputs:
                before, after = outputs(model, params, x, *extra), outputs(model, moved, x, *extra)
                worst = max(worst, float((after - before).norm() / before.norm()))
    return worst


def derived(model, x, tracer, *extra):
    return symalg.derive(symalg.trace(model, (x, *extra), tracer=tracer), certify=False)


def claims(analysis):
    return sorted((s.site, s.group.kind) for s in analysis.symmetries)


def expected(cell, layers, directions):
    names = ["rnn"] if layers * directions == 1 else \
        [f"rnn.l{k}{suffix}" for k in range(layers) for suffix in ("", "_reverse")[:directions]]
    diagonal = "PS" if cell == "relu" else "SF"
    return sorted([("embed", "GL"), ("embed", "T")] + [(n, diagonal) for n in names] +
                  [(f"{n}.units", "S") for n in names] + [(f"{n}.bias", "T") for n in names])


@pytest.mark.parametrize("cell,layers,bidirectional,batch_first", [
    ("rnn", 1, False, True), ("relu", 2, False, False), ("gru", 2, False, True), ("gru", 1, True, False),
    ("lstm", 1, False, False), ("lstm", 2, True, True)])
def test_recurrent_claims_hold_at_generic_parameters_through_fx_and_export(cell, layers, bidirectional, batch_first):
    model = generic(Net(cell, layers, bidirectional, batch_first))
    x, *others = sequences(batch_first, (2, 5), (3, 7), (1, 2))
    fx, exported = derived(model, x, "fx"), derived(model, x, "export")
    assert claims(fx) == claims(exported) == expected(cell, layers, 1 + bidirectional)
    assert not fx.blocked and not exported.blocked
    assert worst_change(model, fx, [x, *others]) < 1e-9
    assert worst_change(model, exported, others[:1]) < 1e-9


def test_each_gate_block_moves_as_derived():
    """LSTM: ``S`` permutes every gate block's rows and ``W_hh``'s columns; ``SF`` flips only the ``g`` rows (and
    every column of ``W_hh``); ``T`` moves ``b_ih`` by ``t`` and ``b_hh`` by ``−t``."""
    model = generic(Net("lstm"))
    analysis = derived(model, sequences(True, (2, 5))[0], "fx")
    by_kind = {s.group.kind: s for s in analysis.symmetries if s.site.startswith("rnn")}
    params = dict(model.named_parameters())
    W = params["rnn.weight_hh_l0"]
    P = torch.eye(5, dtype=torch.float64)[[1, 0, 3, 4, 2]]
    moved = by_kind["S"].apply(params, P)["rnn.weight_hh_l0"]
    for gate in range(4):
        torch.testing.assert_close(moved[gate * 5:(gate + 1) * 5], P @ W[gate * 5:(gate + 1) * 5] @ P.T)
    D = torch.diag(torch.tensor([-1.0, 1, 1, -1, 1], dtype=torch.float64))
    flipped = by_kind["SF"].apply(params, D)["rnn.weight_hh_l0"]
    for gate in range(4):
        left = D if gate == 2 else torch.eye(5, dtype=torch.float64)
        torch.testing.assert_close(flipped[gate * 5:(gate + 1) * 5], left @ W[gate * 5:(gate + 1) * 5] @ D)
    t = torch.arange(20, dtype=torch.float64)
    shifted = next(s for s in analysis.symmetries if s.site == "rnn.bias").apply(params, t)
    torch.testing.assert_close(shifted["rnn.bias_ih_l0"], params["rnn.bias_ih_l0"] + t)
    torch.testing.assert_close(shifted["rnn.bias_hh_l0"], params["rnn.bias_hh_l0"] - t)


def test_gru_translates_only_the_reset_and_update_biases():
    """``b_hn`` sits inside ``r ⊙ (W_hn h + b_hn)``: only the ``r, z`` blocks of ``b_ih + b_hh`` are a sum."""
    model = generic(Net("gru"))
    analysis = derived(model, sequences(True, (2, 5))[0], "fx")
    bias = next(s for s in analysis.symmetries if s.site == "rnn.bias")
    assert [r.width for f in bias.translations for r in f.regions] == [10, 10]
    # a careless rule translating the n block too changes the outputs
    params = dict(model.named_parameters())
    t = torch.zeros(15, dtype=torch.float64)
    t[10:] = 1.0
    moved = dict(params, **{"rnn.bias_ih_l0": params["rnn.bias_ih_l0"] + t,
                            "rnn.bias_hh_l0": params["rnn.bias_hh_l0"] - t})
    x = sequences(True, (2, 5))[0]
    assert (outputs(model, moved, x) - outputs(model, params, x)).abs().max() > 1e-3


def test_relu_rnn_scales_positively_and_does_not_flip():
    model = generic(Net("relu"))
    x = sequences(True, (2, 5))[0]
    analysis = derived(model, x, "fx")
    assert ("rnn", "PS") in claims(analysis) and ("rnn", "SF") not in claims(analysis)
    tanh = derived(generic(Net("rnn")), x, "fx")
    flips = next(s for s in tanh.symmetries if s.group.kind == "SF")
    D = torch.diag(torch.tensor([-1.0, 1, 1, 1, 1], dtype=torch.float64))
    params = dict(model.named_parameters())
    assert (outputs(model, flips.apply(params, D), x) - outputs(model, params, x)).abs().max() > 1e-3


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_given_initial_state_blocks_the_units(tracer):
    model = generic(Net("gru"))
    x = sequences(True, (2, 5))[0]
    h0 = torch.randn(1, 2, 5, dtype=torch.float64)
    analysis = derived(model, x, tracer, h0)
    assert claims(analysis) == [("embed", "GL"), ("embed", "T"), ("rnn.bias", "T")]
    assert any("initial state" in b.reason and b.site == "rnn.units" for b in analysis.blocked)
    assert worst_change(model, analysis, [x], h0) < 1e-9
    # the permutation the zero state allows is indeed false with this state
    free = derived(model, x, "fx")
    permutation = next(s for s in free.symmetries if s.group.kind == "S")
    params = dict(model.named_parameters())
    P = torch.eye(5, dtype=torch.float64)[[1, 0, 2, 3, 4]]
    assert (outputs(model, permutation.apply(params, P), x, h0) - outputs(model, params, x, h0)).abs().max() > 1e-3


@pytest.mark.parametrize("cell,returns", [("rnn", "h"), ("lstm", "h"), ("lstm", "c"), ("gru", "h")])
def test_the_final_state_of_one_layer_moves_with_its_units(cell, returns):
    """``h_n`` (and ``c_n``) of one layer and direction is the last step's units: a map reading it moves too."""
    model = generic(Net(cell, returns=returns))
    x, other = sequences(True, (2, 5), (3, 4))
    fx, exported = derived(model, x, "fx"), derived(model, x, "export")
    assert claims(fx) == claims(exported) == expected(cell, 1, 1)
    assert worst_change(model, fx, [x, other]) < 1e-9


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_returned_final_state_pins_the_units(tracer):
    """Returned as a model output, ``h_n`` must not move: the units carry no group (the bias sum still translates)."""
    model = generic(Net("lstm", returns="raw"))
    x = sequences(True, (2, 5))[0]
    analysis = derived(model, x, tracer)
    assert claims(analysis) == [("embed", "GL"), ("embed", "T"), ("rnn.bias", "T")]
    assert worst_change(model, analysis, [x]) < 1e-9


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_the_stacked_final_state_of_two_layers_blocks_the_units(tracer):
    model = generic(Net("gru", layers=2, returns="h"))
    x = sequences(True, (2, 5))[0]
    analysis = derived(model, x, tracer)
    assert claims(analysis) == [("embed", "GL"), ("embed", "T"), ("rnn.l0.bias", "T"), ("rnn.l1.bias", "T")]
    assert any("stacks the units" in b.reason for b in analysis.blocked)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_projection_is_refused(tracer):
    model = generic(Net("lstm", proj_size=3))
    analysis = derived(model, sequences(True, (2, 5))[0], tracer)
    assert claims(analysis) == []
    assert any("proj_size" in b.reason for b in analysis.blocked)


def test_dropout_between_layers_in_training_mode_blocks_the_lower_layer():
    model = generic(Net("lstm", layers=2, dropout=0.5)).train()
    x = sequences(True, (2, 5))[0]
    analysis = derived(model, x, "fx")
    assert ("rnn.l1", "SF") in claims(analysis) and ("rnn.l0", "SF") not in claims(analysis)
    assert any("dropout" in b.reason and b.site.startswith("rnn.l0") for b in analysis.blocked)


class Unpacked(nn.Module):
    """``out, (h, c) = lstm(x)`` with ``h``, ``c`` left unused (fx keeps their ``getitem`` nodes)."""

    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(3, 4, num_layers=2), nn.Linear(4, 2)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return self.head(out)


def test_an_unused_final_state_does_not_block():
    analysis = derived(generic(Unpacked()), sequences(False, (2, 5))[0], "fx")
    assert ("rnn.l1", "SF") in claims(analysis) and ("rnn.l0.units", "S") in claims(analysis)
    assert not analysis.blocked


def test_the_fuzzer_draws_every_cell_and_near_miss():
    from symalg.verification import fuzz

    variants = [f"-{fuzz.generate(0, i, 'recurrent').variant}-" for i in range(200)]
    expected = {"RNN", "GRU", "LSTM", "tanh", "relu", "layers3", "bidirectional", "seq-first", "no-bias", "h0",
                "dropout", "final", "returned", "proj", "export"}
    missing = {token for token in expected if not any(f"-{token}-" in variant for variant in variants)}
    assert not missing, missing


class ZeroState(nn.Module):
    """A GRU given ``h0 = torch.zeros(...)`` written in ``forward``: the zero state moves with any action."""

    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.GRU(3, 4, batch_first=True), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.rnn(x, torch.zeros(1, x.shape[0], 4, dtype=x.dtype))[0])


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_a_zero_initial_state_written_in_forward_keeps_the_units(tracer):
    model = generic(ZeroState())
    x = sequences(True, (2, 5))[0]
    analysis = derived(model, x, tracer)
    assert claims(analysis) == [("rnn", "SF"), ("rnn.bias", "T"), ("rnn.units", "S")]
    assert worst_change(model, analysis, [x]) < 1e-9


def test_the_bias_sum_conserves_the_difference_of_the_two_biases():
    """``b_ih`` and ``b_hh`` get equal gradients on the summed blocks (so ``b_ih − b_hh`` is conserved by gradient
    flow, the quantity derived), and different ones on the GRU's ``n`` block."""
    model = generic(Net("gru"))
    x = sequences(True, (2, 5))[0]
    bias = next(s for s in derived(model, x, "fx").symmetries if s.site == "rnn.bias")
    assert [str(e) for e in bias.conserved.exprs.values()] == ["-rnn.bias_hh_l0[0:10]_(0) + rnn.bias_ih_l0[0:10]_(0)"]
    model(x).pow(2).sum().backward()
    b_ih, b_hh = model.rnn.bias_ih_l0.grad, model.rnn.bias_hh_l0.grad
    torch.testing.assert_close(b_ih[:10], b_hh[:10])
    assert (b_ih[10:] - b_hh[10:]).abs().max() > 1e-6
