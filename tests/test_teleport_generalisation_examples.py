"""The teleporting-for-generalisation examples in quick mode: ``teleport_generalisation.py`` (sharpness and
curvature teleports, [Zhao2026] Sec. 5.3), ``teleport_optimizers.py`` (Sec. 5.4.1), ``teleport_schedule.py``
(Sec. 4.6.3) and ``teleport_sharpness.py --identical`` (Sec. 5.2.3's protocol)."""
from __future__ import annotations

import math

from test_teleport_reproductions import _run


def test_generalisation_example_teleports_both_ways_and_keeps_the_loss(tmp_path):
    v = _run("teleport_generalisation.py", tmp_path)
    for name in ("SGD", "AdaGrad"):
        for objective in ("sharpness", "curvature"):
            for direction in ("increase", "decrease"):
                tag = f"{name}_{objective}_{direction}"
                assert v[f"{tag}_teleports"] == 1 and v[f"{tag}_accepted"] == 1, tag
                assert v[f"{tag}_right_way"] == v[f"{tag}_accepted"], tag
                assert v[f"{tag}_max_rel_loss_change"] < 1e-12, tag
                assert (v[f"{tag}_ratio_median"] > 1) == (direction == "increase"), tag
                assert math.isfinite(v[f"{tag}_val_loss"]), tag


def test_optimizers_example_momentum_strategies_and_adagrad_objectives(tmp_path):
    v = _run("teleport_optimizers.py", tmp_path)
    for tag in ("momentum_transform", "momentum_keep", "momentum_reset", "AdaGrad_grad", "AdaGrad_metric"):
        assert v[f"{tag}_teleports"] == 2 and v[f"{tag}_accepted"] >= 1, tag
        assert v[f"{tag}_max_rel_loss_change"] < 1e-10, tag           # eq. 4.13 is exact at 4 samples
        assert v[f"{tag}_gain"] >= 1, tag
    for strategy in ("transform", "keep", "reset"):                    # every strategy speeds momentum up here
        assert v[f"momentum_{strategy}_loss_50"] < 0.5 * v["momentum_plain_loss_50"], strategy
    # the momentum teleported with the parameters (J⁻ᵀm) helps most right after the teleport
    assert v["momentum_transform_loss_10"] < v["momentum_keep_loss_10"] < v["momentum_reset_loss_10"]


def test_schedule_example_runs_every_panel(tmp_path):
    v = _run("teleport_schedule.py", tmp_path)
    plain = v["a_no_teleport_train_4"]
    for tag in ("a_epoch_0", "a_epoch_1", "b_interval_1", "c_1_batch", "c_4_batches"):
        assert v[f"{tag}_accepted"] >= 1 and v[f"{tag}_max_rel_loss_change"] < 1e-12, tag
        assert math.isfinite(v[f"{tag}_train_4"]) and v[f"{tag}_train_4"] < plain, tag
    assert v["b_interval_1_teleports"] == 4 and v["c_4_batches_teleports"] == 4


def test_identical_protocol_correlations_are_defined(tmp_path):
    v = _run("teleport_sharpness.py", tmp_path, "--identical", plot="teleport_sharpness_identical.png")
    assert v["models"] == 6
    for key in ("phi_val_loss_pearson", "sharpness_val_loss_pearson", "curvature_k1_val_loss_pearson"):
        assert math.isfinite(v[key]) and -1 <= v[key] <= 1, key
    # Table 5.1's signs on the quick protocol (6 identical runs, fixed seeds; Fisher-z standard error 1/√3 ≈ 0.58,
    # so these are about 1.5 standard errors from 0: the 100-model run in docs/teleport_generalisation.md §5 is the
    # evidence, this guards its direction): eq. 5.1 with the loss (φ) correlates positively, as printed (+0.72);
    # the curvature correlates positively too (+0.69), where the paper prints −0.05…−0.23: not reproduced
    assert v["phi_val_loss_pearson"] > 0.5 and v["curvature_k1_val_loss_pearson"] > 0.5


def test_curvature_intuition_example_finds_both_curves_dip_then_rise(tmp_path):
    v = _run("curvature_intuition.py", tmp_path)
    for curve in ("parabola", "circle"):
        assert v[f"{curve}_min"] < 2 / math.pi - 0.02 and 1 < v[f"{curve}_argmin"] < 2.5, curve
        assert abs(v[f"{curve}_remainder4"]) < 0.03, curve                # the κ² limit is right to fourth order
    assert v["circle_min"] < v["parabola_min"] - 0.05
    assert v["circle_at_100"] > 0.98                                      # → 1: the circle shrinks to w₀
    assert 2 / math.pi < v["parabola_at_100"] < 0.5 + 1 / math.pi         # → 1/2 + 1/π: the parabola to a ray
