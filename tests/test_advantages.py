"""QAE's K-quantile baseline and the group advantages, computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from armorlab.algos.advantages import empirical_cdf, group_advantages, quantile_baseline

EPS = 1e-4


def _t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_empirical_cdf_by_hand():
    # rewards 0.1 0.3 0.5 0.7: F(0.3) = 2/4, F(0.29) = 1/4, F(0.7) = 1, F(0) = 0
    f = empirical_cdf(_t([0.3, 0.1, 0.7, 0.5]), _t([0.3, 0.29, 0.7, 0.0]))
    assert f.tolist() == [[0.5, 0.25, 1.0, 0.0]]


def test_binary_rewards_baseline_is_0_up_to_1_minus_k_then_1():
    # G = 8, K = 0.4: b = 0 for p ≤ 0.6 (≤ 4 correct), b = 1 for p > 0.6 (≥ 5 correct)
    groups = _t(*[[1.0] * c + [0.0] * (8 - c) for c in range(9)])
    assert quantile_baseline(groups, 0.4).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]


def test_right_continuous_quantile_is_not_linear_interpolation():
    # G = 8, K = 0.4, 5 correct: sorted 0 0 0 1 1 1 1 1; F(0) = 3/8 < 0.4, F(1) = 1 → b = 1.
    # torch.quantile interpolates at position 0.4·7 = 2.8 between 0 and 1 → 0.8.
    group = _t([1, 0, 1, 1, 0, 1, 0, 1])
    assert quantile_baseline(group, 0.4).item() == 1.0
    assert torch.quantile(group[0], 0.4).item() == pytest.approx(0.8)


def test_k_times_g_an_integer_takes_that_rank_not_the_next():
    # G = 5, K = 0.4: K·G = 2 (2.0000000000000004 in floats); 3 correct = p 0.6 ≤ 1 − K → b = 0
    assert quantile_baseline(_t([1, 0, 1, 0, 1]), 0.4).item() == 0.0
    # non-binary: sorted 0.1 0.3 0.5 0.7, K = 0.5 → F(0.3) = 0.5 ≥ 0.5 → b = 0.3 (interpolation: 0.4)
    assert quantile_baseline(_t([0.3, 0.1, 0.7, 0.5]), 0.5).item() == pytest.approx(0.3)
    # K = 1 is the maximum; K → 0 the minimum
    assert quantile_baseline(_t([0.3, 0.1, 0.7, 0.5]), 1.0).item() == pytest.approx(0.7)
    assert quantile_baseline(_t([0.3, 0.1, 0.7, 0.5]), 1e-6).item() == pytest.approx(0.1)


def test_binary_advantages_by_hand():
    # 5 of 8 correct: mean 0.625, sample var = (5·0.375² + 3·0.625²)/7 = 1.875/7; b = 1
    std5 = math.sqrt(1.875 / 7)
    # 4 of 8 correct: sample var = 8·0.25/7; b = 0
    std4 = math.sqrt(2 / 7)
    rewards = _t([1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0])[0]
    adv = group_advantages(rewards, 8, estimator="quantile", quantile_k=0.4)
    expected = [0.0] * 5 + [-1 / (std5 + EPS)] * 3 + [1 / (std4 + EPS)] * 4 + [0.0] * 4
    assert adv.tolist() == pytest.approx(expected, rel=1e-9)
    # the mean baseline on the same rewards: (R − mean)/(std + eps)
    mean = group_advantages(rewards, 8, estimator="group_mean")
    expected_mean = [0.375 / (std5 + EPS)] * 5 + [-0.625 / (std5 + EPS)] * 3 + \
                    [0.5 / (std4 + EPS)] * 4 + [-0.5 / (std4 + EPS)] * 4
    assert mean.tolist() == pytest.approx(expected_mean, rel=1e-9)


def test_anchor_reward_is_part_of_its_group():
    # ARMOR's group: 7 on-policy samples, all wrong, + 1 correct anchor (last row).
    # p = 1/8 ≤ 0.6 → b = 0: only the anchor gets an advantage, 1/std with std = sqrt(8·(1/8)(7/8)/7)
    std = math.sqrt(1 / 8)
    group = _t([0, 0, 0, 0, 0, 0, 0, 1])[0]
    adv = group_advantages(group, 8, estimator="quantile", quantile_k=0.4)
    assert adv.tolist() == pytest.approx([0.0] * 7 + [1 / (std + EPS)], rel=1e-9)
    # 5 on-policy correct + the correct anchor = 6 of 8 > 0.6·8 → b = 1: the two failures alone are pushed down
    std6 = math.sqrt(8 * 0.75 * 0.25 / 7)
    group = _t([1, 0, 1, 1, 0, 1, 1, 1])[0]
    adv = group_advantages(group, 8, estimator="quantile", quantile_k=0.4)
    assert adv.tolist() == pytest.approx([0, -1 / (std6 + EPS), 0, 0, -1 / (std6 + EPS), 0, 0, 0], rel=1e-9)


def test_unscorable_rows_are_left_out_and_get_zero():
    # [nan, 1, 0, 0]: n = 3, ⌈0.4·3⌉ = 2nd smallest of 0 0 1 = 0; std of (1, 0, 0) = sqrt(1/3)
    adv = group_advantages(_t([math.nan, 1, 0, 0])[0], 4, estimator="quantile", quantile_k=0.4)
    s = math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([0.0, 1 / (s + EPS), 0.0, 0.0], rel=1e-9)
    assert math.isnan(quantile_baseline(_t([math.nan, math.nan]), 0.4).item())


def test_scale_none_and_batch():
    rewards = _t([1, 0, 0, 0, 1, 1, 1, 0])[0]
    # K = 0.4, G = 4: ⌈1.6⌉ = 2nd smallest: group 1 → 0, group 2 (0 1 1 1) → 1
    assert group_advantages(rewards, 4, estimator="quantile", scale="none").tolist() == [1, 0, 0, 0, 0, 0, 0, -1]
    batch_std = math.sqrt(8 * 0.5 * 0.5 / 7)
    out = group_advantages(rewards, 4, estimator="quantile", scale="batch")
    assert out.tolist() == pytest.approx([1 / (batch_std + EPS), 0, 0, 0, 0, 0, 0, -1 / (batch_std + EPS)])


@pytest.mark.parametrize("kwargs, match", [
    ({"estimator": "median"}, "advantage_estimator"),
    ({"estimator": "quantile", "quantile_k": 0.0}, "quantile_k"),
    ({"scale": "row"}, "scale"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(_t([1, 0, 0, 0])[0], 4, **kwargs)
    with pytest.raises(ValueError, match="whole groups"):
        group_advantages(_t([1, 0, 0])[0], 4)


def test_config_nulls_quantile_k_unless_quantile():
    from armorlab.core.config import resolve

    assert resolve({})["quantile_k"] is None
    cfg = resolve({"advantage_estimator": "quantile"})
    assert cfg["quantile_k"] == 0.4
    assert resolve({"advantage_estimator": "quantile", "quantile_k": 0.2})["quantile_k"] == 0.2
    assert resolve({"beta": 0.1, "kl_estimator": "k2"})["kl_estimator"] == "k2"
    assert resolve({"kl_estimator": "k2"})["kl_estimator"] is None  # β = 0: no penalty to estimate
