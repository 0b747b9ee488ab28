"""Symmetry ensembles (symalg.ensembles): exactness at the anchors, baselines, accuracy and attacks."""
from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from symalg.applications.ensembles import (Ensemble, accuracy, evaluate_robustness, fgsm, parameter_distance,
                                           per_input_symmetry_ensemble, perturbation_ensemble, pgd, symmetry_ensemble)


@pytest.fixture(scope="module")
def trained():
    """A small LeakyReLU MLP trained briefly on 600 digits (float64, seeded)."""
    data = load_digits()
    x = torch.tensor(data.data[:600] / 16.0, dtype=torch.float64)
    y = torch.tensor(data.target[:600])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.LeakyReLU(0.1), nn.Linear(16, 10)).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, x, y


def test_symmetry_members_reproduce_base_at_anchors_and_differ_elsewhere(trained):
    model, x, _ = trained
    anchors = x[:8]
    ens = symmetry_ensemble(model, anchors, size=3, scale=1.0, generator=torch.Generator().manual_seed(0),
                            anchor_size=8)
    with torch.no_grad():
        for member, d in zip(ens.members, ens.distances):
            assert (member(anchors) - model(anchors)).abs().max() < 1e-10
            assert (member(x[8:]) - model(x[8:])).abs().max() > 1e-2  # a different function off the anchors
            assert d > 1.0


def test_perturbation_at_same_distance_breaks_anchor_outputs(trained):
    model, x, _ = trained
    sym = symmetry_ensemble(model, x[:8], size=2, scale=1.0, generator=torch.Generator().manual_seed(0))
    pert = perturbation_ensemble(model, sym.distances, generator=torch.Generator().manual_seed(1))
    base = {k: v.detach() for k, v in model.named_parameters()}
    with torch.no_grad():
        for member, d in zip(pert.members, sym.distances):
            assert parameter_distance(member.args[0], base) == pytest.approx(d, rel=1e-12)
            assert (member(x[:8]) - model(x[:8])).abs().max() > 1e-2


def test_per_input_members_match_base_everywhere_but_not_in_gradient(trained):
    model, x, y = trained
    ens = per_input_symmetry_ensemble(model, size=2, scale=0.5, generator=torch.Generator().manual_seed(0))
    member = ens.members[0]
    assert (member(x) - model(x)).abs().max() < 1e-9
    xs = x[:20].clone().requires_grad_(True)
    g_member = torch.autograd.grad(nn.functional.cross_entropy(member(xs), y[:20]), xs)[0]
    g_base = torch.autograd.grad(nn.functional.cross_entropy(model(xs), y[:20]), xs)[0]
    assert (g_member - g_base).abs().max() > 1e-3 * g_base.abs().max()  # masked: the anchor is detached


def test_accuracy_and_ensemble_average_by_hand():
    x = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0], [5.0, 4.0]])
    y = torch.tensor([0, 1, 0, 1])
    assert accuracy(lambda t: t, x, y) == 0.5  # argmax: 0, 1, 1, 0
    # softmax average of identity and swap: p = (1/2, 1/2) everywhere, argmax ties go to class 0
    ens = Ensemble("pair", (lambda t: t, lambda t: t.flip(-1)))
    assert torch.allclose(ens.log_probs(x).exp(), torch.full((4, 2), 0.5))
    assert accuracy(ens, x, y) == 0.5
    with pytest.raises(ValueError, match="x has 4 rows but y has 3"):
        accuracy(ens, x, y[:3])
    with pytest.raises(ValueError, match="members is empty"):
        Ensemble("none", ())


def test_fgsm_increases_loss_and_pgd_is_at_least_as_strong(trained):
    model, x, y = trained
    loss = nn.functional.cross_entropy
    adv_f = fgsm(model, x, y, 0.05)
    adv_p = pgd(model, x, y, 0.05, steps=10, step_size=0.01)
    with torch.no_grad():
        clean = loss(model(x), y)
        assert (adv_f - x).abs().max() <= 0.05 + 1e-12 and (adv_p - x).abs().max() <= 0.05 + 1e-12
        assert adv_p.min() >= 0 and adv_p.max() <= 1
        assert loss(model(adv_f), y) > clean + 0.05
        assert loss(model(adv_p), y) >= loss(model(adv_f), y)
    assert accuracy(model, adv_p, y) <= accuracy(model, adv_f, y) < accuracy(model, x, y)
    with pytest.raises(ValueError, match="steps"):
        pgd(model, x, y, 0.05, steps=0, step_size=0.01)


def test_evaluate_robustness_table(trained):
    model, x, y = trained
    table = evaluate_robustness({"base": model}, x[:50], y[:50], [0.05], 0.05, 3, 0.02, source=model)
    row = table.rows["base"]
    assert table.columns == ["clean", "fgsm@0.05", "pgd@0.05", "transfer_fgsm@0.05", "transfer_pgd@0.05"]
    assert row["fgsm@0.05"] == row["transfer_fgsm@0.05"]  # the source is the model itself
    assert row["pgd@0.05"] <= row["clean"]
    assert "base_clean=" in table.tokens() and table.format().startswith("| model | clean |")


def test_symmetry_ensemble_rejects_too_many_anchors(trained):
    model, x, _ = trained
    with pytest.raises(ValueError, match="anchor_size = 17"):
        symmetry_ensemble(model, x, size=1, scale=0.5, anchor_size=17)
