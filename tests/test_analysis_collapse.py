"""Collapse metrics on curves with answers worked out by hand: noisy, flat, monotone, empty."""

import math

import numpy as np
import pytest

from armorlab.analysis import collapse, select


def test_auc_is_trapezoid_over_step_span():
    # (0+1)/2·10 + (1+1)/2·10 = 15 over a span of 20
    assert collapse.curve_auc([0, 10, 20], [0.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert collapse.curve_auc([20, 0, 10], [1.0, 0.0, 1.0]) == pytest.approx(0.75)  # unsorted input
    assert collapse.curve_auc([0, 10, 20, 30], [0.0, 1.0, np.nan, 1.0]) == pytest.approx(  # NaN dropped
        (5 + 20) / 30)
    assert collapse.curve_auc([5], [0.4]) == 0.4
    assert math.isnan(collapse.curve_auc([], []))


def test_collapse_step_needs_m_consecutive_evals_below_running_peak():
    steps = np.arange(0, 100, 10)
    # running peak 1.0 at step 30; δ = 0.25: step 40 is 0.75 (≤ 0.75, counts), 50 recovers to 0.875,
    # then 60, 70, 80 stay at or below 0.75 → collapse at 60 with m = 3
    values = [0.25, 0.5, 0.75, 1.0, 0.75, 0.875, 0.5, 0.625, 0.75, 0.5]
    assert collapse.collapse_step(steps, values, delta=0.25, patience=3) == 60
    assert collapse.collapse_step(steps, values, delta=0.25, patience=1) == 40
    assert collapse.collapse_step(steps, values, delta=0.5, patience=1) == 60   # 0.5 ≤ 1.0 − 0.5
    assert collapse.collapse_step(steps, values, delta=0.625, patience=1) is None


def test_collapse_step_monotone_flat_empty_short():
    steps = [0, 10, 20, 30, 40]
    assert collapse.collapse_step(steps, [0.1, 0.2, 0.3, 0.4, 0.5]) is None          # rising
    assert collapse.collapse_step(steps, [0.4] * 5) is None                          # flat
    assert collapse.collapse_step(steps, [1.0, 0.9, 0.8, 0.7, 0.6], 0.05, 3) == 10   # falling from the start
    assert collapse.collapse_step([], []) is None
    assert collapse.collapse_step([0, 10], [1.0, 0.0], 0.05, 3) is None              # fewer than m evals
    # a dip still open at the end (2 < m evals) is not (yet) a collapse
    assert collapse.collapse_step(steps, [0.5, 0.6, 0.7, 0.1, 0.1], 0.05, 3) is None
    with pytest.raises(ValueError):
        collapse.collapse_step(steps, [0.1] * 5, delta=0.0)


def test_collapse_step_on_noisy_plateau_then_drop():
    rng = np.random.default_rng(0)
    steps = np.arange(0, 200, 10)
    values = np.where(steps < 100, 0.5, 0.3) + rng.normal(0, 0.005, steps.size)
    assert collapse.collapse_step(steps, values, delta=0.05, patience=3) == 100


def test_divergence_step_train_up_val_down():
    steps = np.arange(0, 110, 10)
    val = np.where(steps <= 50, steps, 100 - steps).astype(float)   # peak at 50
    train_steps = np.arange(0, 101)
    train = train_steps / 100.0
    # windows of 3 evals: [40,50,60] has slope 0; [50,60,70] is the first with a negative slope
    assert collapse.divergence_step(steps, val, train_steps, train, window=3) == 70
    assert collapse.divergence_step(steps, val, train_steps, np.full(101, 0.5), window=3) is None  # flat train
    assert collapse.divergence_step(steps, val, train_steps, 1 - train, window=3) is None          # both fall
    assert collapse.divergence_step(steps[:2], val[:2], train_steps, train, window=3) is None


def test_entropy_collapse_and_length_blowup():
    steps = [0, 10, 20, 30, 40, 50]
    entropy = [2.0, 1.5, 1.0, 0.5, 0.15, 0.1]
    assert collapse.entropy_collapse_step(steps, entropy) == 40              # below 10% of 2.0
    assert collapse.entropy_collapse_step(steps, entropy, threshold=0.12) == 50
    assert collapse.entropy_collapse_step(steps, [1.0] * 6) is None
    assert collapse.length_blowup([0, 1, 2, 3], [10, 12, 30, 25]) == 3.0
    assert math.isnan(collapse.length_blowup([], []))


def test_collapse_metrics_full_dict():
    steps = [0, 10, 20, 30, 40, 50]
    values = [0.25, 0.5, 1.0, 0.5, 0.5, 0.5]
    m = collapse.collapse_metrics(steps, values, train_steps=steps, train_values=[0, 1, 2, 3, 4, 5],
                                  entropy_steps=steps, entropy_values=[1, 1, 1, 1, 1, 0.05],
                                  length_steps=steps, length_values=[4, 4, 8, 8, 8, 8],
                                  delta=0.25, patience=3, window=3)
    assert m["peak"] == 1.0 and m["peak_step"] == 20
    assert m["final"] == 0.5 and m["drop"] == 0.5 and m["drop_rel"] == 0.5
    assert m["collapse_step"] == 30
    # trapezoid: (0.25+0.5)/2·10 + (0.5+1)/2·10 + (1+0.5)/2·10 + 0.5·10 + 0.5·10 = 3.75+7.5+7.5+5+5 = 28.75
    assert m["auc"] == pytest.approx(28.75 / 50)
    assert m["divergence_step"] == 40      # window [20,30,40]: val slope −0.025 < 0, train slope 0.1 > 0
    assert m["entropy_collapse_step"] == 50
    assert m["length_blowup"] == 2.0
    assert m["n_evals"] == 6


def test_collapse_metrics_on_empty_curve():
    m = collapse.collapse_metrics([], [])
    assert math.isnan(m["peak"]) and m["peak_step"] is None and m["collapse_step"] is None
    assert math.isnan(m["auc"]) and m["divergence_step"] is None and m["n_evals"] == 0


def test_select_best_on_val_reported_on_test():
    steps = [0, 10, 20, 30]
    val = [0.2, 0.5, 0.5, 0.3]
    test = [0.1, 0.4, 0.45, 0.2]
    s = select.select_best(steps, val, steps, test)
    assert (s.step, s.selected_value, s.reported_value, s.reported_exact) == (10, 0.5, 0.4, True)  # first max
    assert select.select_best(steps, val, steps, test, mode="min").step == 0
    # test logged at other steps: linear interpolation, flagged
    s = select.select_best(steps, val, [0, 20], [0.0, 1.0])
    assert s.reported_value == pytest.approx(0.5) and not s.reported_exact
    assert select.select_best([], [], steps, test).step is None


def test_value_at_and_default_matched_steps():
    assert select.value_at([0, 10], [0.0, 1.0], 10).value == 1.0
    assert select.value_at([0, 10], [0.0, 1.0], 5) == select.ValueAt(0.5, False)
    assert math.isnan(select.value_at([0, 10], [0.0, 1.0], 20).value)
    runs = [np.arange(0, 201, 10), np.arange(0, 181, 10)]
    # last common step 180: targets 45 (→ 40, the first of the two nearest), 90, 180
    assert select.default_matched_steps(runs) == [40, 90, 180]
    assert select.default_matched_steps([]) == []
