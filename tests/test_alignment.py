"""Alignment by the derived groups: it keeps the function, undoes hidden scramblings, lowers barriers."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call

import symalg
from symalg.applications import alignment as al
from symalg.errors import SpecError
from symalg.numeric.sampling import network_function, random_params

F64 = torch.float64
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Attention(nn.Module):
    """Two heads with separate q/k/v/o maps on a norm-free residual stream, then a ReLU MLP."""

    def __init__(self, d: int = 8, heads: int = 2, hidden: int = 12, vocab: int = 5) -> None:
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.emb = nn.Embedding(vocab, d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down, self.head = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, self.heads, self.dk).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) / self.dk ** 0.5, -1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(x)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _relative_change(model: nn.Module, before: dict, after: dict, x: torch.Tensor) -> float:
    with torch.no_grad():
        f0, f1 = functional_call(model, before, (x,)), functional_call(model, after, (x,))
    return float((f1 - f0).abs().max() / f0.abs().max())


@pytest.fixture(scope="module")
def mlp_case():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    x = torch.randn(40, 5, dtype=F64)
    return model, x, symalg.derive(symalg.trace(model, (x,)))


def _scrambled(analysis, params, kinds, seed):
    """``g·θ`` for random elements of the analysis' symmetries of the given kinds (the hidden truth)."""
    gen = torch.Generator().manual_seed(seed)
    out = dict(params)
    for sym in analysis.symmetries:
        if sym.group.kind in kinds:
            first = sym.moving_bindings()[0]
            h = first.unfold(out[first.tensor]).shape[0]
            g = torch.eye(h, dtype=F64)[torch.randperm(h, generator=gen)] if sym.group.kind == "S" else \
                torch.exp(torch.randn(h, generator=gen, dtype=F64))
            out = sym.apply(out, g)
    return out


def test_weight_matching_undoes_permutation_and_scaling_traced(mlp_case):
    model, x, analysis = mlp_case
    a = _params(model)
    b = _scrambled(analysis, a, ("S", "PS"), seed=1)
    assert al.weight_distance(a, b) > 1.0
    full = al.weight_matching(analysis, a, b, kinds=("S", "PS"), sweeps=12)   # two coupled sites: linear convergence
    assert al.weight_distance(a, full.params) < 1e-4
    only_perm = al.weight_matching(analysis, a, b, kinds=("S",))
    assert al.weight_distance(a, only_perm.params) > 0.1          # the scalings are left in place
    assert _relative_change(model, b, full.params, x) < 1e-12
    assert _relative_change(model, b, only_perm.params, x) < 1e-12
    assert all(d1 <= d0 + 1e-12 for d0, d1 in zip(full.distances, full.distances[1:]))


def test_activation_matching_undoes_the_scrambling_traced(mlp_case):
    model, x, analysis = mlp_case
    a = _params(model)
    b = _scrambled(analysis, a, ("S", "PS"), seed=2)
    aligned = al.activation_matching(analysis, model, a, b, x, kinds=("S", "PS"))
    assert set(aligned.methods.values()) == {"activations"}
    assert al.weight_distance(a, aligned.params) < 1e-8
    assert _relative_change(model, b, aligned.params, x) < 1e-12


def test_spec_front_end_weight_matching():
    analysis = symalg.derive("linear(4, 6) -> relu -> linear(6, 3)")
    arch = analysis.architecture
    a = random_params(arch, generator=torch.Generator().manual_seed(3))
    b = _scrambled(analysis, a, ("S", "PS"), seed=4)
    aligned = al.weight_matching(analysis, a, b, kinds=("S", "PS"))      # one site: exact after one sweep
    assert al.weight_distance(a, aligned.params) < 1e-7
    f = network_function(arch)
    x = torch.randn(10, 4, dtype=F64)
    assert float((f(aligned.params, x) - f(b, x)).abs().max()) < 1e-12


@pytest.fixture(scope="module")
def attention_case():
    torch.manual_seed(5)
    model = Attention().double()
    tokens = torch.randint(0, 5, (6, 4))
    return model, tokens, symalg.derive(symalg.trace(model, (tokens,)))


def test_attention_groups_are_aligned_and_function_kept(attention_case):
    model, tokens, analysis = attention_case
    kinds = {s.group.kind for s in analysis.symmetries}
    assert {"GL", "S", "PS"} <= kinds
    a = _params(model)
    torch.manual_seed(6)
    b = _params(Attention().double())                 # an unrelated network: alignment can only lower the distance
    for kinds in al.PRESETS.values():
        for aligned in (al.weight_matching(analysis, a, b, kinds),
                        al.activation_matching(analysis, model, a, b, tokens, kinds)):
            assert _relative_change(model, b, aligned.params, tokens) < 1e-10
    weights = al.weight_matching(analysis, a, b)
    assert all(d1 <= d0 + 1e-12 for d0, d1 in zip(weights.distances, weights.distances[1:]))
    assert weights.distances[-1] < 0.9 * weights.distances[0]
    # GL on the stream and the heads' query/key, value/output maps: strictly closer than permutations alone
    assert weights.distances[-1] < al.weight_matching(analysis, a, b, ("S", "PS")).distances[-1]


def test_attention_gl_scrambling_is_undone(attention_case):
    model, tokens, analysis = attention_case
    a = _params(model)
    gen = torch.Generator().manual_seed(7)
    b = dict(a)
    for sym in analysis.symmetries:
        if sym.group.kind == "GL" and sym.site != "emb":       # per-head query/key and value/output maps
            h = sym.moving_bindings()[0].unfold(a[sym.moving_bindings()[0].tensor]).shape[0]
            b = sym.apply(b, torch.eye(h, dtype=F64) + 0.3 * torch.randn(h, h, generator=gen, dtype=F64))
    assert al.weight_distance(a, b) > 0.5
    aligned = al.weight_matching(analysis, a, b, kinds=("GL",), sweeps=10)
    assert al.weight_distance(a, aligned.params) < 1e-4 * al.weight_distance(a, b)
    assert _relative_change(model, b, aligned.params, tokens) < 1e-10


def test_gl_tolerance_is_honoured_on_a_single_gl_site():
    """One ``GL(8)`` site scrambled by a generic element (exact answer: distance 0). With enough L-BFGS steps the
    relative ``gl_tolerance`` decides where the solve stops: ``1e-3`` leaves about 1e-2 of the distance, ``1e-10``
    about 4e-6 (the floor of this solver; coupled sites converge further only linearly in the sweeps)."""
    analysis = symalg.derive("linear(6, 8) -> identity -> linear(8, 5)")
    gen = torch.Generator().manual_seed(3)
    a = random_params(analysis.architecture, gen)
    (sym,) = [s for s in analysis.symmetries if s.group.kind == "GL"]
    b = sym.apply(a, torch.eye(8, dtype=F64) + 0.5 * torch.randn(8, 8, generator=gen, dtype=F64))
    start = al.weight_distance(a, b)
    loose, tight = (al.weight_matching(analysis, a, b, kinds=("GL",), sweeps=1, gl_steps=2000,
                                       gl_tolerance=tol).distances[-1] / start for tol in (1e-3, 1e-10))
    assert loose > 1e-3 and tight < 1e-5
    for bad in (0.0, -1.0, float("nan"), "1e-8"):
        with pytest.raises(SpecError, match="gl_tolerance"):
            al.weight_matching(analysis, a, b, kinds=("GL",), gl_tolerance=bad)
    with pytest.raises(SpecError, match="gl_steps"):
        al.weight_matching(analysis, a, b, kinds=("GL",), gl_steps=0)


class LoRA(nn.Module):
    """``out(relu(base x + B A x))``: the rank-2 adapter has ``GL(2)`` on ``A``'s output."""

    def __init__(self) -> None:
        super().__init__()
        self.base, self.a, self.b = nn.Linear(6, 5), nn.Linear(6, 2, bias=False), nn.Linear(2, 5, bias=False)
        self.out = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.base(x) + self.b(self.a(x))))


def test_lora_rank_gl_is_aligned_by_weights_and_by_activations():
    torch.manual_seed(8)
    model, x = LoRA().double(), torch.randn(30, 6, dtype=F64)
    analysis = symalg.derive(symalg.trace(model, (x,)))
    lora = [s for s in analysis.symmetries if s.group.kind == "GL"]
    assert [s.site for s in lora] == ["a"]
    a = _params(model)
    g = torch.tensor([[1.5, 0.4], [-0.3, 0.7]], dtype=F64)
    b = _scrambled(analysis, lora[0].apply(a, g), ("S", "PS"), seed=9)
    by_weights = al.weight_matching(analysis, a, b, sweeps=12)
    by_activations = al.activation_matching(analysis, model, a, b, x)
    assert by_activations.methods[lora[0].label] == "activations"
    for aligned in (by_weights, by_activations):
        assert al.weight_distance(a, aligned.params) < 1e-4 * al.weight_distance(a, b)
        assert _relative_change(model, b, aligned.params, x) < 1e-12


def test_unknown_kind_is_refused(mlp_case):
    _, _, analysis = mlp_case
    with pytest.raises(ValueError, match="cannot be aligned"):
        al.weight_matching(analysis, {}, {}, kinds=("SF",))


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("alignment")
    result = subprocess.run([sys.executable, str(EXAMPLES / "alignment_barriers.py"), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    return {k: float(v) for k, v in re.findall(r"(\w+)=([-+0-9.eE]+)", result.stdout)}, out


def test_example_barriers_and_soundness(example_run):
    values, out = example_run
    assert (out / "alignment_barriers.png").stat().st_size > 0
    assert values["digits_mlp_worst_relative_output_change"] < 1e-10
    assert values["sort_transformer_worst_relative_output_change"] < 1e-10
    # seeded: permutations lower the MLP's barrier; the transformer needs the derived GL maps
    assert values["digits_mlp_permutation__weights_mean"] < 0.5 * values["digits_mlp_none_mean"]
    assert values["sort_transformer_permutation_scaling_gl_o__weights_mean"] < \
        0.5 * values["sort_transformer_none_mean"]
