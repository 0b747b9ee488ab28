"""``z ** e`` with an exponent computed from parameters (issue 29, item 2): a per-unit exponent ``f(p)`` moves with
the sites' permutations, a shared one is held fixed, any other exponent varying along the sites blocks them."""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import symalg
from symalg.verification import fuzz
from symalg.verification.certification import claim_errors

SPELLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "abs+1": lambda z, p: torch.relu(z).pow(p.abs() + 1),
    "softplus": lambda z, p: z ** F.softplus(p),
    "exp": lambda z, p: z ** p.exp(),
}


class PowerNet(torch.nn.Module):
    """``fc2(body(fc1(x), p))`` with ``p`` a trainable vector of ``p_shape``."""

    def __init__(self, body: Callable[..., torch.Tensor], p: torch.Tensor, h: int = 4) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(3, h), torch.nn.Linear(h, 2)
        self.p = torch.nn.Parameter(p)
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.body(self.fc1(x), self.p))


def _analysis(body: Callable[..., torch.Tensor], p: torch.Tensor, tracer: str = "fx",
              x: torch.Tensor | None = None) -> symalg.Analysis:
    torch.manual_seed(0)
    model = PowerNet(body, p).double()
    x = torch.rand(6, 3, dtype=torch.float64) if x is None else x
    return symalg.derive(symalg.trace(model, (x,), tracer=tracer), certify=False)


def _perturbed_errors(analysis: symalg.Analysis) -> list[float]:
    """The claims' errors after moving ``p`` to a generic point (``p = 1`` hides a false permutation)."""
    model = analysis.model_graph.model
    with torch.no_grad():
        model.p.copy_(torch.randn(model.p.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    return [e.error for e in claim_errors(analysis)]


def _moved(analysis: symalg.Analysis) -> set[str]:
    return {b.tensor for s in analysis.symmetries for b in s.bindings}


@pytest.mark.parametrize("at_ones", [False, True], ids=["generic", "ones"])
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_per_unit_parameter_exponent_permutes_with_the_sites(spelling, at_ones):
    """``(P z)^{f(P p)} = P z^{f(p)}``: the permutation is claimed and moves ``p`` (main claimed it without ``p``:
    errors 0.17 to 0.23 at generic ``p``, and at ``p = 1`` a claim that fails as soon as ``p`` moves off 1)."""
    analysis = _analysis(SPELLINGS[spelling], torch.ones(4) if at_ones else torch.randn(4))
    assert [type(s.group).__name__ for s in analysis.symmetries] == ["Permutations"]
    assert "p" in _moved(analysis)
    assert max(_perturbed_errors(analysis)) < 1e-8


def test_per_unit_exponent_through_export():
    analysis = _analysis(SPELLINGS["softplus"], torch.randn(4), tracer="export")
    assert "p" in _moved(analysis) and max(_perturbed_errors(analysis)) < 1e-8


def test_per_unit_exponent_keeps_no_scaling_and_says_why():
    """``(d_j z_j)^{e_j} = d_j^{e_j} z_j^{e_j}``: a power depending on ``p``, which no binding models."""
    analysis = _analysis(SPELLINGS["abs+1"], torch.randn(4))
    (note,) = [b for b in analysis.blocked if b.node == "pow_1"]
    assert "PS removed" in note.reason and "computed from p" in note.reason


def test_bare_parameter_exponent_moves_with_the_sites():
    """``z.pow(p)``, which main blocked as an unknown op on a parameter, is the identity ``f``."""
    analysis = _analysis(lambda z, p: torch.relu(z).pow(p), torch.rand(4) + 0.5)
    assert "p" in _moved(analysis) and max(_perturbed_errors(analysis)) < 1e-8


def test_shared_scalar_exponent_keeps_permutations_without_moving_it():
    analysis = _analysis(lambda z, p: torch.relu(z) ** (p.abs() + 1), torch.randn(()))
    assert [type(s.group).__name__ for s in analysis.symmetries] == ["Permutations"]
    assert "p" not in _moved(analysis) and max(_perturbed_errors(analysis)) < 1e-8


@pytest.mark.parametrize("exponent, alpha", [(2, Fraction(2)), (3, Fraction(3)), (0.5, Fraction(1, 2)),
                                             (1.5, Fraction(3, 2)), (0.1, None)])
def test_number_exponent_keeps_permutations_and_positive_scaling_of_power_alpha(exponent, alpha):
    """``(d z)^α = d^α z^α`` for ``d > 0``: the readers absorb ``d^{-α}`` (as ``relu_pow(α)``); a float that is no
    small fraction (``0.1``) keeps the permutations only."""
    analysis = _analysis(lambda z, p: torch.relu(z) ** exponent, torch.randn(4))
    groups = {type(s.group).__name__: s.group for s in analysis.symmetries}
    assert "Permutations" in groups
    assert (groups["PositiveScaling"].alpha if "PositiveScaling" in groups else None) == alpha
    assert max(e.error for e in claim_errors(analysis)) < 1e-8


def test_parameter_exponent_with_another_reader_blocks_the_sites_naming_node_and_parameter():
    """``p`` also read outside the exponent cannot be moved for it: main claimed the permutation (false)."""
    analysis = _analysis(lambda z, p: torch.relu(z).pow(p.abs() + 1) + p.sum(), torch.ones(4))
    assert not analysis.symmetries or max(_perturbed_errors(analysis)) < 1e-8
    (note,) = [b for b in analysis.blocked if b.node == "pow_1"]
    assert "'pow_1'" in note.reason and "computed from p" in note.reason and "varies along" in note.reason


def test_data_exponent_varying_along_the_sites_blocks_them():
    """An exponent read from the input, one entry per unit: nothing moves it with the sites (main: error 0.23)."""
    x = torch.rand(6, 3, dtype=torch.float64)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.fc1(x)) ** (torch.sin(x) + 1))

    torch.manual_seed(0)
    analysis = symalg.derive(symalg.trace(Net().double(), (x,)), certify=False)
    assert all(e.error < 1e-8 for e in claim_errors(analysis))
    assert any(b.node == "pow_1" and "varies along the sites' axis" in b.reason for b in analysis.blocked)


def test_power_of_an_even_activation_keeps_the_readers_unmoved_by_its_sign_flips():
    """``|z|³`` is unchanged by the sign flips of ``z``, so ``fc2`` must not move for them (main flipped its
    columns: error 2)."""
    analysis = _analysis(lambda z, p: z.abs() ** 3, torch.randn(4))
    assert "EvenFlips" in [type(s.group).__name__ for s in analysis.symmetries]
    assert max(e.error for e in claim_errors(analysis)) < 1e-8


def test_pointwise_function_of_a_batch_norm_keeps_its_translations_invariant():
    """``sin(bn(fc1 x))`` (training batch norm) is unchanged by translations of ``fc1``'s bias: no shear of ``fc2``
    (main claimed one: error 0.38)."""
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.bn, self.fc2 = torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, affine=False), \
                torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.sin(self.bn(self.fc1(x))))

    torch.manual_seed(0)
    analysis = symalg.derive(symalg.trace(Net().double(), (torch.randn(6, 3),)), certify=False)
    assert "Translations" in [type(s.group).__name__ for s in analysis.symmetries]
    assert max(e.error for e in claim_errors(analysis)) < 1e-8


def test_bare_scalar_exponent_is_held_fixed_with_a_note_naming_the_node():
    analysis = _analysis(lambda z, p: torch.relu(z) ** p, torch.tensor(2.0))
    assert [type(s.group).__name__ for s in analysis.symmetries] == ["Permutations"]
    assert max(_perturbed_errors(analysis)) < 1e-8
    (note,) = [b for b in analysis.blocked if b.site == "p"]
    assert note.node == "pow_1" and "exponent is computed from it and held fixed" in note.reason


def test_power_family_raw_models_make_no_false_claim_and_move_p():
    """60 raw models of the fuzzer's ``power`` family: every claim holds, and some permutations move ``p``."""
    report = fuzz.run(60, seed=0, families=["power"], certify=False, draws=1)
    assert not report.false_claims and not report.crashes and not report.hangs
    moved = 0
    for index in range(60):
        case = fuzz.generate(0, index, "power")
        if case.variant.split("-")[0] in ("abs1", "softplus", "exp", "bare"):
            model, inputs = case.build()
            analysis = symalg.derive(symalg.trace(model, inputs), certify=False)
            moved += any(b.tensor == "m0" for s in analysis.symmetries for b in s.bindings)
    assert moved >= 10
