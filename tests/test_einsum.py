"""``torch.einsum`` read as the contraction its equation spells (:mod:`symalg.catalogue.rules.einsum`): with a weight it
is the dense map ``x @ W.T`` is, through fx (``torch.einsum``) and export (``aten.einsum``) alike; what it does not
model (a batch index on the sites, a diagonal, ``...``, two values contracted) blocks with a note naming the node.

Raw claims are checked on the model (:func:`claim_errors`, two draws: the model's parameters and generic ones on
inputs of other shapes)."""
import os
import sys

import pytest
import torch
from torch import nn

import symalg
from symalg.catalogue.rules.einsum import Equation
from symalg.verification.certification import claim_errors

TRACERS = ["fx", "export"]


def analysed(model, inputs, tracer):
    """``(graph, raw claims by label, the worst relative output change any claim makes, analysis)``."""
    torch.manual_seed(0)
    graph = symalg.trace(model.double(), tuple(x.double() for x in inputs), tracer=tracer)
    analysis = symalg.derive(graph, certify=False)
    errors = [e.error for e in claim_errors(analysis, draws=2)]
    return graph, {s.label for s in analysis.symmetries}, max(errors, default=0.0), analysis


class Between(nn.Module):
    """``fc2(act(einsum(equation, act(fc1(x)), w)))`` (``weight_first``: the weight is the first operand)."""

    def __init__(self, equation, weight_shape, act=torch.relu, n=3, h=4, out=4, weight_first=False):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(n, h), nn.Linear(out, 2)
        self.w = nn.Parameter(torch.randn(*weight_shape))
        self.equation, self.act, self.weight_first = equation, act, weight_first

    def forward(self, x):
        h = self.act(self.fc1(x))
        operands = (self.w, h) if self.weight_first else (h, self.w)
        return self.fc2(self.act(torch.einsum(self.equation, *operands)))


class Matmul(Between):
    """The same model with ``h @ w.T`` for the einsum."""

    def forward(self, x):
        return self.fc2(self.act(self.act(self.fc1(x)) @ self.w.T))


def identity(x):
    return x


def test_the_equation_is_parsed_as_data():
    assert Equation.parse("bti, hdi -> bthd") == Equation(("bti", "hdi"), "bthd")
    assert Equation.parse("zi,oi").output == "oz"          # torch's implicit output: letters seen once, ASCII order
    assert Equation.parse("Bi,bi->Bb").operands == ("Bi", "bi")
    assert str(Equation.parse("...i,oi->...o")) == "...i,oi->...o"
    for bad in ("b1,oi->bo", "bi,oi->bo->b", "bi;oi->bo", "__import__('os')", "b....i->bi"):
        with pytest.raises(symalg.SpecError, match="node 'e'"):
            Equation.parse(bad, "node 'e'")
    with pytest.raises(symalg.SpecError, match="must be a string"):
        Equation.parse(3, "node 'e'")


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("equation, shape, weight_first", [
    ("bi,oi->bo", (4, 4), False), ("bi,io->bo", (4, 4), False), ("oi,bi->bo", (4, 4), True), ("bi,oi", (4, 4), False)])
def test_an_einsum_with_a_weight_is_the_dense_map_x_at_w_transposed(tracer, equation, shape, weight_first):
    """``einsum('bi,oi->bo', h, W)`` and its other layouts (``W`` stored ``(in, out)``, the weight first, the implicit
    output) claim what ``h @ W.T`` claims: the ReLU sites scale and permute, on ``fc1`` and on the weight's rows."""
    model = Between(equation, shape, weight_first=weight_first)
    graph, labels, error, _ = analysed(model, (torch.randn(5, 3),), tracer)
    assert "einsum" in [graph.node(v)["op"] for v in graph.nodes]
    expected = {"PositiveScaling(4, alpha=1) on fc1", "S(4) on fc1", "PositiveScaling(4, alpha=1) on w", "S(4) on w"}
    assert labels == expected
    if equation == "bi,oi->bo":
        assert analysed(Matmul(equation, shape), (torch.randn(5, 3),), tracer)[1] == expected
    assert error < 1e-9


@pytest.mark.parametrize("tracer", TRACERS)
def test_the_weight_read_between_identities_carries_general_linear_groups(tracer):
    """With no activation, the einsum's input site (``fc1``'s rows, read by ``W``'s axis 1: ``W ↦ W g⁻¹``) and its
    output site (``W``'s rows, read by ``fc2``) each carry ``GL``; over tokens (``bti,oi->bto``) as well, on a batch
    size the example did not have (the second draw)."""
    _, labels, error, _ = analysed(Between("bti,oi->bto", (5, 4), identity, out=5), (torch.randn(2, 3, 3),), tracer)
    assert labels == {"GL(4) on fc1", "GL(5) on w"}
    assert error < 1e-9


class Heads(nn.Module):
    """Head projections written as einsum: ``einsum('bthd,ohd->bto', relu(einsum('bti,hdi->bthd', tanh(fc1(x)), Wq)),
    Wo)``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(3, 6)
        self.wq, self.wo = nn.Parameter(torch.randn(2, 4, 6)), nn.Parameter(torch.randn(5, 2, 4))

    def forward(self, x):
        h = torch.einsum("bti,hdi->bthd", torch.tanh(self.fc1(x)), self.wq)
        return torch.einsum("bthd,ohd->bto", torch.relu(h), self.wo)


@pytest.mark.parametrize("tracer", TRACERS)
def test_head_projections_move_the_head_coordinate_alike_in_every_head(tracer):
    """``bti,hdi->bthd``: the input's tanh site is read by ``Wq``'s axis 2 (permutations, sign flips); the output site
    is the head coordinate ``d`` (``Wq``'s axis 1, one ``g`` for both heads), read by ``Wo``'s axis 2 through the
    ReLU (scalings, permutations)."""
    _, labels, error, _ = analysed(Heads(), (torch.randn(2, 3, 3),), tracer)
    assert labels == {"S(6) on fc1", "SignFlips(6) on fc1", "PositiveScaling(4, alpha=1) on wq", "S(4) on wq"}
    assert error < 1e-9


class PerHead(nn.Module):
    """``einsum('bhi,hoi->bho', tanh(fc1(x)), W)`` on ``(B, H, n)``: one map per head, the head a batch index."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.out = nn.Linear(3, 6), nn.Linear(4, 2)
        self.w = nn.Parameter(torch.randn(2, 4, 6))

    def forward(self, x):
        return self.out(torch.relu(torch.einsum("bhi,hoi->bho", torch.tanh(self.fc1(x)), self.w)))


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_batch_index_of_the_weight_and_the_value_indexes_one_map_per_head(tracer):
    _, labels, error, _ = analysed(PerHead(), (torch.randn(3, 2, 3),), tracer)
    assert labels == {"S(6) on fc1", "SignFlips(6) on fc1", "PositiveScaling(4, alpha=1) on w", "S(4) on w"}
    assert error < 1e-9


class OneOperand(nn.Module):
    """``out(einsum(equation, act(fc1(x))))``, moved back by ``transpose(0, 1)`` when ``back``."""

    def __init__(self, equation, act=torch.tanh, back=False, mix=False):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.out = nn.Linear(3, 4), nn.Linear(4, 2)
        self.w = nn.Parameter(torch.randn(3, 3)) if mix else None
        self.equation, self.act, self.back = equation, act, back

    def forward(self, x):
        h = self.act(self.fc1(x))
        y = torch.einsum(self.equation, h, self.w) if self.w is not None else torch.einsum(self.equation, h)
        return self.out(y.transpose(0, 1) if self.back else y)


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("equation, back, mix", [("bti->tbi", True, False), ("bti->bi", False, False),
                                                 ("bti,ts->bsi", False, True)],
                         ids=["axes", "token-sum", "token-mix"])
def test_data_axes_moved_summed_or_mixed_by_a_weight_pass_the_sites(tracer, equation, back, mix):
    """A permutation of axes moves the sites with their axis; a sum over tokens, or a weight mixing tokens
    (``bti,ts->bsi``, MLP-Mixer style), is linear along data axes and passes every action on the features."""
    _, labels, error, _ = analysed(OneOperand(equation, back=back, mix=mix), (torch.randn(2, 3, 3),), tracer)
    assert labels == {"S(4) on fc1", "SignFlips(4) on fc1"}
    assert error < 1e-9


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_layer_norm_bias_does_not_translate_through_a_token_mixing_einsum(tracer):
    """``LN(x) → einsum('bti,ts->bsi', ·, W) → Linear``: a shift ``t`` of the norm's bias becomes ``(Σ_t W_ts) t``,
    different per output token, which the linear's bias cannot give back; read by a linear alone it shears."""
    class Mixed(nn.Module):
        def __init__(self, mix):
            super().__init__()
            torch.manual_seed(0)
            self.norm, self.out, self.mix = nn.LayerNorm(4), nn.Linear(4, 2), mix
            self.w = nn.Parameter(torch.randn(3, 3))

        def forward(self, x):
            h = self.norm(x)
            return self.out(torch.einsum("bti,ts->bsi", h, self.w) if self.mix else h)

    _, plain, _, _ = analysed(Mixed(False), (torch.randn(2, 3, 4),), tracer)
    _, mixed, error, _ = analysed(Mixed(True), (torch.randn(2, 3, 4),), tracer)
    assert "Shears(4) on norm" in plain and not any(label.startswith(("Shears", "Translations")) for label in mixed)
    assert error < 1e-9


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_sigmoid_flip_is_not_absorbed_by_an_einsum(tracer):
    """``σ(−z) = 1 − σ(z)``: the shift ``W'(1 − g1)/2`` needs a bias, which an einsum does not have (as for
    ``h @ W.T``); the permutations stay."""
    model = Between("bi,oi->bo", (4, 4), torch.sigmoid)
    _, labels, error, analysis = analysed(model, (torch.randn(5, 3),), tracer)
    assert "S(4) on fc1" in labels and "SignFlips(4) on fc1" not in labels
    assert labels == analysed(Matmul("bi,oi->bo", (4, 4), torch.sigmoid), (torch.randn(5, 3),), tracer)[1]
    assert error < 1e-9


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("equation, shape, weight, note", [
    ("bi,oi->bi", (5, 3), (4, 4), "keeps the sites' index 'i' in the weight 'w' and the output"),
    ("bi,oi->boi", (5, 3), (4, 4), "keeps the sites' index 'i' in the weight 'w' and the output"),
    ("bii->bi", (5, 4, 3), None, "repeats an index"),
    ("...i,oi->...o", (5, 3), (4, 4), "broadcasts with '...'"),
    ("bi,bj->bij", (5, 3), "value", "contractions of values"),
], ids=["batch-index", "output-keeps-contracted", "diagonal", "ellipsis", "two-values"])
def test_near_misses_are_blocked_with_a_note(tracer, equation, shape, weight, note):
    """A contracted index kept in the output (one map per unit), a diagonal, ``...`` or two values contracted: the
    sites the einsum reads keep nothing (no scaling: a careless rule would claim ``GL``), and the note names the node
    and the equation."""
    class Miss(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc1 = nn.Linear(3, 4)
            self.w = nn.Parameter(torch.randn(*weight)) if isinstance(weight, tuple) else None

        def forward(self, x):
            h = self.fc1(x)
            operands = (h,) if weight is None else (h, torch.tanh(h)) if weight == "value" else (h, self.w)
            return torch.einsum(equation, *operands).sum()

    graph, labels, error, analysis = analysed(Miss(), (torch.randn(*shape),), tracer)
    assert not any("fc1" in label for label in labels)
    notes = [b.reason for b in analysis.blocked if "einsum" in b.reason]
    assert any(note in reason and "node 'einsum'" in reason for reason in notes), analysis.blocked
    assert error < 1e-9


@pytest.mark.parametrize("tracer", TRACERS)
def test_the_census_einsum_model_gets_its_mlp_and_blocks_its_attention(tracer):
    """The census model ``torch-einsum`` (a ReLU MLP ``8 → 32 → 16``, then a two-head attention, all einsum): the ReLU
    units scale and permute, the MLP's output (read only by the query/key/value einsums) carries ``GL(16)``; the
    attention is not folded (its heads are split by ``reshape``, which blocks the projections' sites first, and its
    scores are einsums of two values), so its sites are blocked with notes."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from zoo import _Einsum   # benchmarks/ is not a package

    torch.manual_seed(0)
    _, labels, error, analysis = analysed(_Einsum(), (torch.randn(2, 5, 8),), tracer)
    assert labels == {"GL(16) on w_out", "PositiveScaling(32, alpha=1) on w_in", "S(32) on w_in"}
    assert {b.site for b in analysis.blocked if "splitting the sites' axis" in b.reason} >= {"wq", "wk", "wv"}
    assert error < 1e-9


def test_the_fuzzer_draws_every_einsum_pattern_and_its_raw_claims_hold():
    """The ``einsum`` family (:data:`~symalg.verification.fuzz.EINSUMS`) draws every pattern and near miss within 200
    models, and on 24 of them (fx or export) every raw claim holds, with no crash or hang."""
    from symalg.verification import fuzz

    drawn = {fuzz.generate(0, i, "einsum").variant.split("-")[0] for i in range(200)}
    assert drawn == set(fuzz.EINSUMS)
    report = fuzz.run(24, seed=0, families=["einsum"], certify=False, draws=1)
    assert report.models == 24 and not report.crashes and not report.hangs
    assert report.claims > 10 and not report.false_claims, report.summary()
