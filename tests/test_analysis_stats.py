"""Seed statistics: IQM, probability of improvement, bootstrap CIs, curve alignment and bands."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armorlab.stats import seeds as stats


def test_iqm_by_hand():
    assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)     # mean of 3, 4, 5, 6
    assert stats.iqm([0, 0, 0, 100]) == pytest.approx(0.0)               # one wild seed is trimmed
    assert stats.iqm([1.0, 2.0, 3.0]) == pytest.approx(2.0)              # n < 4: nothing to trim
    assert stats.iqm([0, 1, 2, 3, 100]) == pytest.approx(2.0)            # ⌊5/4⌋ = 1 dropped per end


def test_probability_of_improvement_by_hand():
    assert stats.probability_of_improvement([1, 2, 3], [0, 0, 0]) == 1.0
    assert stats.probability_of_improvement([0, 0], [1, 2, 3]) == 0.0
    assert stats.probability_of_improvement([1, 1], [1, 1]) == 0.5       # ties count ½
    assert stats.probability_of_improvement([1, 3], [2, 2]) == 0.5
    # pairs (1,2) (1,3) (2,2) (2,3): 0 + 0 + ½ + 0 over 4
    assert stats.probability_of_improvement([1, 2], [2, 3]) == 0.125
    assert stats.probability_of_improvement([1, np.nan], [0]) == 1.0     # NaN (missing run) dropped
    assert math.isnan(stats.probability_of_improvement([], [1.0]))


def test_poi_ci_brackets_the_estimate():
    x, y = [0.6, 0.62, 0.58, 0.7], [0.5, 0.61, 0.55, 0.52]
    p, lo, hi = stats.poi_with_ci(x, y)
    # 16 pairs: 0.6 beats 3, 0.62 beats 4, 0.58 beats 3, 0.7 beats 4 → 14/16
    assert p == pytest.approx(14 / 16)
    assert 0.0 <= lo <= p <= hi <= 1.0
    assert stats.poi_with_ci(x, y) == (p, lo, hi)                        # seeded: reproducible
    p1, lo1, hi1 = stats.poi_with_ci([0.5], y)
    assert p1 == pytest.approx(0.125)                                   # ties 0.5 once, loses to the rest
    assert math.isnan(lo1) and math.isnan(hi1)


def test_summarise_by_hand_and_degenerate_cases():
    s = stats.summarise([1.0, 2.0, 3.0, 4.0])
    assert s.n == 4 and s.mean == 2.5
    assert s.std == pytest.approx(math.sqrt(5 / 3))                       # sample std (ddof 1)
    # 4 seeds: Student-t, 2.5 ± t(0.975, 3)·s/√4 = 2.5 ± 3.182446·1.290994/2 (reaches past [min, max])
    assert s.ci_method == "t"
    assert (s.ci_low, s.ci_high) == pytest.approx((2.5 - 2.05426, 2.5 + 2.05426), abs=1e-5)
    one = stats.summarise([0.7])
    assert (one.n, one.mean, one.iqm) == (1, 0.7, 0.7) and math.isnan(one.ci_low) and math.isnan(one.std)
    same = stats.summarise([0.3, 0.3, 0.3])
    assert same.ci_low == same.ci_high == 0.3
    assert stats.summarise([1.0, np.nan, 3.0]).n == 2
    assert stats.summarise([]).n == 0 and math.isnan(stats.summarise([]).mean)


def test_bootstrap_ci_width_matches_normal_theory():
    """For 400 normal draws, the percentile-bootstrap CI of the mean ≈ mean ± 1.96·σ/√n."""
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 2.0, 400)
    lo, hi = stats.bootstrap_ci(x, n_resamples=4000)
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.15)
    assert lo < x.mean() < hi


def test_align_curves_interpolates_and_reports_it():
    a = (np.array([0, 10, 20]), np.array([0.0, 1.0, 2.0]))
    b = (np.array([0, 5, 10]), np.array([0.0, 1.0, 2.0]))
    al = stats.align_curves([a, b])
    np.testing.assert_array_equal(al.grid, [0, 5, 10, 20])
    np.testing.assert_allclose(al.values[0], [0.0, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(al.values[1, :3], [0.0, 1.0, 2.0])
    assert math.isnan(al.values[1, 3])                                  # b never reached step 20
    assert al.interpolated
    same = stats.align_curves([a, (a[0], a[1] + 1)])
    assert not same.interpolated


def test_curve_band_mean_band_and_counts():
    grid = np.array([0.0, 10.0, 20.0])
    values = np.array([[0.0, 1.0, 2.0],
                       [2.0, 1.0, np.nan],
                       [1.0, 1.0, np.nan]])
    band = stats.curve_band(stats.AlignedCurves(grid, values, False))
    np.testing.assert_allclose(band.mean, [1.0, 1.0, 2.0])
    np.testing.assert_array_equal(band.n, [3, 3, 1])
    # 3 seeds (0, 2, 1): Student-t, 1 ± t(0.975, 2)·1/√3 = 1 ± 2.484138
    assert (band.low[0], band.high[0]) == pytest.approx((1 - 2.484138, 1 + 2.484138), abs=1e-6)
    assert band.low[1] == band.high[1] == 1.0                          # identical seeds: no spread
    assert math.isnan(band.low[2])                                      # one seed: no band
    many = stats.curve_band(stats.AlignedCurves(grid[:1], np.arange(30.0)[:, None], False))   # 30 seeds: BCa
    assert many.low[0] < 14.5 < many.high[0] and many.low[0] > 0 and many.high[0] < 29
    long = stats.AlignedCurves(np.arange(5000.0), np.random.default_rng(0).random((4, 5000)), False)
    assert 50 <= stats.curve_band(long, max_points=100).steps.size <= 102


def test_ci_method_by_seed_count():
    assert [stats.ci_method(n) for n in (0, 1, 2, 29, 30, 50)] == ["", "", "t", "t", "bca", "bca"]
    rng = np.random.default_rng(3)
    lo, hi, method = stats.mean_ci(rng.gamma(2.0, size=40))
    assert method == "bca" and lo < hi


def test_mean_ci_coverage_at_three_seeds():
    # the percentile bootstrap covered the true mean ~75 % of the time at 3 seeds; Student-t ≈ 95 %
    rng = np.random.default_rng(11)
    normal = np.mean([lo <= 0 <= hi for lo, hi, _ in (stats.mean_ci(rng.normal(size=3)) for _ in range(600))])
    boot = np.mean([lo <= 0 <= hi for lo, hi in (stats.bootstrap_ci(rng.normal(size=3), n_resamples=200)
                                                 for _ in range(300))])
    assert normal > 0.92 and boot < 0.85


def test_poi_that_few_seeds_cannot_resolve_has_no_interval():
    # complete separation: exact two-sided Mann–Whitney p = 2/C(4, 2) = 1/3 at 2 vs 2, 2/C(6, 3) = 0.1
    # at 3 vs 3, 2/C(8, 4) = 0.0286 at 4 vs 4
    assert not stats.poi_resolvable(2, 2) and not stats.poi_resolvable(3, 3)
    assert stats.poi_resolvable(4, 4) and not stats.poi_resolvable(3, 4)   # 2/35 = 0.057
    p, lo, hi = stats.poi_with_ci([0.9, 0.8], [0.1, 0.2])
    assert p == 1.0 and math.isnan(lo) and math.isnan(hi)
    assert stats.mann_whitney_p([5, 6, 7, 8], [1, 2, 3, 4]) == pytest.approx(2 / 70)
    assert stats.mann_whitney_p([0.9, 0.8], [0.1, 0.2]) == pytest.approx(1 / 3)


def test_minmax_decimation_keeps_each_buckets_extremes_and_a_spike():
    rng = np.random.default_rng(1)
    y = rng.normal(0, 0.01, 2000)
    y[1234] = 1.0                       # a one-step spike
    y[777] = -1.0                       # a one-step collapse
    y[1500:1510] = np.nan               # a gap inside one bucket (its other steps are finite)
    idx = stats.minmax_indices(y, 200)
    assert np.all(np.diff(idx) > 0) and idx[0] == 0 and idx[-1] == 1999 and idx.size <= 202
    assert 1234 in idx and 777 in idx
    # 100 buckets of 20 consecutive steps (2000 · 100 // 2000 = 100): each keeps its min and max
    for b in range(100):
        seg = y[20 * b:20 * b + 20]
        kept = [k for k in idx if 20 * b <= k < 20 * b + 20]
        assert 20 * b + int(np.nanargmin(seg)) in kept and 20 * b + int(np.nanargmax(seg)) in kept
    # every 10th step (the former decimation) would have lost both
    assert 1234 % 10 and 777 % 10
    assert np.array_equal(stats.minmax_indices(y[:150], 200), np.arange(150))   # short: untouched
    gap = np.full(400, np.nan)
    assert stats.minmax_indices(gap, 200).size >= 100                          # all-NaN buckets keep a step


def test_curve_band_keeps_a_one_step_collapse_of_the_mean():
    steps = np.arange(3000.0)
    values = np.tile(np.linspace(0, 1, 3000), (3, 1))
    values[:, 2001] = -0.5              # every seed collapses for one step
    band = stats.curve_band(stats.AlignedCurves(steps, values, False))
    assert band.steps.size <= 202 and 2001.0 in band.steps
    assert band.mean[np.flatnonzero(band.steps == 2001.0)[0]] == pytest.approx(-0.5)


def test_iqm_is_scipys_trim_mean():
    from scipy.stats import trim_mean

    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 30, 31):
        x = rng.normal(size=n) * 10
        assert stats.iqm(x) == pytest.approx(trim_mean(x, 0.25), abs=1e-12)
    grid = rng.normal(size=(6, 11))
    np.testing.assert_allclose(stats.iqm(grid, axis=0), trim_mean(grid, 0.25, axis=0))
    assert math.isnan(stats.iqm([1.0, np.nan, 3.0, 4.0]))                # NaN propagates, as scipy's


def test_exact_mann_whitney_by_hand():
    # 3 vs 3: U over the 20 orderings counts 1 1 2 3 3 3 3 2 1 1 (u = 0…9); complete separation is
    # one ordering a side
    assert stats.mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    # one tie: U_x = 0.5, U = max(0.5, 8.5) → 8 (integer part, no tie correction): p = 2·(1 + 1)/20
    assert stats.mann_whitney_p([1, 2, 3], [3, 4, 5]) == pytest.approx(0.2)
    assert stats.mann_whitney_p([1, 1], [1, 1]) == 1.0                   # p capped at 1
    # U_x = 1 (4 > 3 only) in 3 vs 3: U = max(1, 8) = 8, P(U' ≥ 8) = (1 + 1)/20, p = 0.2; scipy's "auto" would
    # take the normal approximation here
    assert stats.mann_whitney_p([1, 2, 4], [3, 5, 6]) == pytest.approx(0.2)
    # 11 seeds a side leaves the exact range: complete separation by the normal approximation with
    # continuity correction, z = (60.5 − 0.5)/√(11·11·23/12)
    z = (121 / 2 - 0.5) / math.sqrt(11 * 11 * 23 / 12)
    assert stats.mann_whitney_p(range(11, 22), range(11)) == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)


def test_curves_on_the_same_steps_align_as_they_are():
    steps = np.array([0.0, 10.0, 20.0, 30.0])
    rng = np.random.default_rng(4)
    runs = [(steps, rng.normal(size=4)) for _ in range(3)]
    al = stats.align_curves(runs)
    np.testing.assert_array_equal(al.grid, steps)
    assert np.array_equal(al.values, np.stack([v for _, v in runs])) and not al.interpolated
    # one run reversed and NaN at step 30: cleaned first, it stops at 20 → NaN past its range
    messy = stats.align_curves([*runs[:2], (steps[::-1], np.r_[np.nan, runs[2][1][2::-1]])])
    np.testing.assert_array_equal(messy.values[2], [*runs[2][1][:3], np.nan])
    assert messy.interpolated is False and np.array_equal(messy.values[:2], al.values[:2])


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 700), max_points=st.integers(2, 120),
       nan_share=st.sampled_from([0.0, 0.1, 0.9, 1.0]), levels=st.sampled_from([3, 1000]))
def test_minmax_indices_keep_each_buckets_first_min_and_first_max(seed, size, max_points, nan_share, levels):
    # the definition, bucket by bucket in plain Python: bucket b holds the steps i with
    # i·B // size = b (B = max_points // 2); it keeps its first lowest and first highest value
    # (ties: the earlier step; NaN-only: its first step), plus the curve's first and last step
    rng = np.random.default_rng(seed)
    y = rng.integers(0, levels, size).astype(np.float64)   # few levels: many ties
    y[rng.random(size) < nan_share] = np.nan
    got = stats.minmax_indices(y, max_points)
    if size <= max_points:
        assert got.tolist() == list(range(size))
        return
    buckets = max(1, max_points // 2)
    want = {0, size - 1}
    members: dict[int, list[int]] = {}
    for i in range(size):
        members.setdefault(i * buckets // size, []).append(i)
    for steps in members.values():
        finite = [i for i in steps if not math.isnan(y[i])]
        if not finite:
            want.add(steps[0])
            continue
        want.add(min(finite, key=lambda i: (y[i], i)))
        want.add(min(finite, key=lambda i: (-y[i], i)))
    assert got.tolist() == sorted(want)
