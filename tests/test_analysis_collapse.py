"""Collapse metrics on curves with answers worked out by hand (and the null threshold against the
normal quantile): noisy, flat, monotone, empty."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armorlab.stats import collapse, select


def test_auc_is_trapezoid_over_step_span():
    # (0+1)/2·10 + (1+1)/2·10 = 15 over a span of 20
    assert collapse.curve_auc([0, 10, 20], [0.0, 1.0, 1.0]) == pytest.approx(0.75)
    assert collapse.curve_auc([20, 0, 10], [1.0, 0.0, 1.0]) == pytest.approx(0.75)  # unsorted input
    assert collapse.curve_auc([0, 10, 20, 30], [0.0, 1.0, np.nan, 1.0]) == pytest.approx(  # NaN dropped
        (5 + 20) / 30)
    assert collapse.curve_auc([5], [0.4]) == 0.4
    assert math.isnan(collapse.curve_auc([], []))


def test_null_threshold_matches_the_normal_quantile_where_it_has_one():
    # m = 1, K = 2: the statistic is (x0 − x1)/√2 ~ N(0, 1), so z*_α = Φ⁻¹(1 − α)
    from scipy.stats import norm
    for alpha in (0.05, 0.2):
        assert collapse.null_threshold(2, 1, alpha) == pytest.approx(norm.ppf(1 - alpha), abs=0.04)
    # more evals = more chances for noise: the threshold grows; unknown σ costs more
    assert collapse.null_threshold(40, 3, 0.05) > collapse.null_threshold(10, 3, 0.05)
    assert collapse.null_threshold(10, 3, 0.05, "curve") > collapse.null_threshold(10, 3, 0.05)
    assert collapse.null_threshold(5, 3, 0.05) == math.inf          # no two disjoint windows


def test_fall_z_is_the_pooled_two_proportion_test_of_levels():
    # m = 2: levels 0.5, 0.4, 0.3; window 2 (0.3) against the peak window 0 (0.5), 200 completions
    # each, pooled p̄ = 0.4: SE = sqrt(0.4·0.6·(1/200 + 1/200)) = 0.04899, z = 0.2/0.04899 = 4.0825
    t = collapse.fall_test([0.5, 0.5, 0.3, 0.3], 100, patience=2)
    assert t.window.tolist() == [2] and t.peak_at.tolist() == [0]
    assert t.z[0] == pytest.approx(4.0825, abs=1e-4) and t.noise == "binomial"


def test_noise_estimates_by_hand():
    # second differences of 0,1,0,1,0,1 are ±2 (4 of them, ⌈0.9·4⌉ = 4 kept) → σ̂ = sqrt(4/6)
    assert collapse.curve_noise([0, 1, 0, 1, 0, 1]) == pytest.approx(math.sqrt(4 / 6))
    # 12 evals, 10 second differences: the largest (1.8, at the spike) is dropped, ⌈0.9·10⌉ = 9 kept; a
    # normal kept within its central 90 % has variance c = 1 − 2qφ(q)/0.9, q = 1.644854, φ(q) = 0.103136
    kinked = [0.0, 0.1] * 3 + [0.0, 0.9, 0.0] + [0.1, 0.0, 0.1]
    c = 1 - 2 * 1.644854 * 0.103136 / 0.9
    d2 = np.sort(np.abs(np.diff(kinked, 2)))
    assert d2[-1] == pytest.approx(1.8) and collapse.curve_noise(kinked) == pytest.approx(
        math.sqrt(np.mean(d2[:9] ** 2) / (6 * c)), rel=1e-4)
    # all 10 second differences ±0.2: 9 kept, mean square 0.04, scaled by the same c
    assert collapse.curve_noise([0.0, 0.1] * 6) == pytest.approx(math.sqrt(0.04 / (6 * c)), rel=1e-4)
    assert collapse.curve_noise([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == pytest.approx(0.0)   # a trend is no noise
    assert math.isnan(collapse.curve_noise([0.1, 0.2, 0.3]))
    assert collapse.binomial_se([0.5, 0.0], 100) == pytest.approx([0.05, math.sqrt(0.005 * 0.995 / 100)])


def test_collapse_step_reports_the_onset_of_a_clear_fall():
    steps = np.arange(0, 120, 10)
    values = [0.5] * 6 + [0.2] * 6
    # window 4 (evals 4, 5, 6; mean 0.4) is the first below the peak; its first eval nearer 0.4 than
    # 0.5 is eval 6 (0.2), the onset
    assert collapse.collapse_step(steps, values, n=1000) == 60
    assert collapse.collapse_step(steps, values) == 60                                 # noise from the curve
    assert collapse.collapse_step(steps, values, n=1000, delta=0.35) is None          # the fall is < δ
    assert collapse.collapse_step(steps, [0.5] * 12, n=1000) is None                   # flat
    assert collapse.collapse_step(steps, np.linspace(0.1, 0.6, 12), n=1000) is None   # rising
    assert collapse.collapse_step(steps[:5], values[:5], n=1000) is None              # < 2m evals
    # 0.03 below the peak is within the noise of 64 completions (SE 0.0625), not of 100 000
    dip = [0.5] * 6 + [0.47] * 6
    assert collapse.collapse_step(steps, dip, n=64) is None
    assert collapse.collapse_step(steps, dip, n=100_000, delta=0.01) == 60
    with pytest.raises(ValueError):
        collapse.collapse_step(steps, values, delta=0.0)
    with pytest.raises(ValueError):
        collapse.collapse_step(steps, [1.5] * 12, n=100)                               # not a proportion


def test_collapse_step_false_alarm_rate_on_flat_binomial_curves():
    # the legacy rule fired on about half of these; the calibrated one on ≈ α = 4 % (benchmark: 3 %)
    rng = np.random.default_rng(7)
    steps = np.arange(21) * 10
    alarms = sum(collapse.collapse_step(steps, rng.binomial(256, 0.5, 21) / 256, n=256) is not None
                 for _ in range(400))
    assert alarms / 400 < 0.09
    fall = np.r_[np.full(10, 0.5), np.full(11, 0.5 - 4 * math.sqrt(0.25 / 256))]
    hits = sum(collapse.collapse_step(steps, rng.binomial(256, fall) / 256, n=256) is not None
               for _ in range(100))
    assert hits / 100 > 0.85


def test_peak_and_drop_are_levels():
    steps = [0, 10, 20, 30, 40, 50]
    # m = 2: levels 0.3, 0.5, 0.6, 0.45, 0.3 → peak 0.6 (window 2, middle eval 2), final 0.3;
    # drop_z: the windows share nothing; per-eval variances 0.6·0.4/100 (×2) and 0.3·0.7/100 (×2)
    # → SE = sqrt((0.48 + 0.42)/100)/2 = 0.047434, drop_z = 0.3/0.047434 = 6.3246
    d = collapse.peak_and_drop(steps, [0.2, 0.4, 0.6, 0.6, 0.3, 0.3], n=100, patience=2)
    assert d["peak"] == pytest.approx(0.6) and d["peak_step"] == 20 and d["final"] == pytest.approx(0.3)
    assert d["drop"] == pytest.approx(0.3) and d["drop_rel"] == pytest.approx(0.5)
    assert d["drop_z"] == pytest.approx(6.3246, abs=1e-4)
    short = collapse.peak_and_drop([0, 10], [0.2, 0.4])           # fewer than m evals: one level
    assert short["peak"] == pytest.approx(0.3) and short["drop"] == 0 and short["drop_z"] == 0


def test_divergence_needs_a_significant_fall_while_train_rises():
    steps = np.arange(0, 120, 10)
    val = [0.5] * 6 + [0.2] * 6
    ts = np.arange(0, 111)
    rng = np.random.default_rng(0)
    rising = ts / 110 + rng.normal(0, 0.01, ts.size)
    assert collapse.divergence_step(steps, val, ts, rising, n=1000) == 60
    assert collapse.divergence_step(steps, val, ts, 1 - rising, n=1000) is None      # both fall
    assert collapse.divergence_step(steps, val, ts, np.full(ts.size, 0.5), n=1000) is None   # flat train
    assert collapse.divergence_step(steps, [0.5] * 12, ts, rising, n=1000) is None   # val flat
    assert collapse.divergence_step(steps[:4], val[:4], ts, rising, n=1000) is None


def test_entropy_collapse_and_length_blowup():
    steps = [0, 10, 20, 30, 40, 50]
    entropy = [2.0, 1.5, 1.0, 0.5, 0.15, 0.1]
    assert collapse.entropy_collapse_step(steps, entropy) == 40              # below 10% of 2.0
    assert collapse.entropy_collapse_step(steps, entropy, threshold=0.12) == 50
    assert collapse.entropy_collapse_step(steps, [1.0] * 6) is None
    assert collapse.length_blowup([0, 1, 2, 3], [10, 12, 30, 25]) == 3.0
    assert math.isnan(collapse.length_blowup([], []))


def test_collapse_metrics_full_dict():
    steps = np.arange(0, 120, 10)
    values = [0.5] * 6 + [0.2] * 6
    m = collapse.collapse_metrics(steps, values, n=1000, train_steps=steps, train_values=np.arange(12.0),
                                  entropy_steps=steps, entropy_values=[1] * 11 + [0.05],
                                  length_steps=steps, length_values=[4] * 6 + [8] * 6)
    assert m["peak"] == pytest.approx(0.5) and m["peak_step"] == 10 and m["final"] == pytest.approx(0.2)
    assert m["drop"] == pytest.approx(0.3) and m["collapse_step"] == 60 and m["collapse_z"] > 5
    assert m["noise"] == "binomial" and m["noise_se"] == pytest.approx(  # median of 6 SEs at 0.5, 6 at 0.2
        (math.sqrt(0.25 / 1000) + math.sqrt(0.16 / 1000)) / 2)
    # trapezoid: 0.5 over [0, 50], 0.35 on [50, 60], 0.2 over [60, 110] → (25 + 3.5 + 10)/110
    assert m["auc"] == pytest.approx(38.5 / 110)
    assert m["divergence_step"] == 60
    assert m["entropy_collapse_step"] == 110 and m["length_blowup"] == 2.0 and m["n_evals"] == 12


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


def test_null_threshold_is_kept_on_disk_between_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path))
    collapse.null_threshold.cache_clear()
    want = collapse._simulate_null_threshold(30, 3, 0.05, "curve")
    assert collapse.null_threshold(30, 3, 0.05, "curve") == want            # computed, then written
    (path,) = (tmp_path / "null_threshold").glob("*.json")
    path.write_text('{"z_star": 123.5}')                                     # a planted value is read back
    collapse.null_threshold.cache_clear()
    assert collapse.null_threshold(30, 3, 0.05, "curve") == 123.5
    path.write_text("{torn")                                                 # a damaged file is recomputed
    collapse.null_threshold.cache_clear()
    assert collapse.null_threshold(30, 3, 0.05, "curve") == want
    assert collapse.null_threshold(30, 3, 0.04, "curve") != want             # other arguments, other file
    assert len(list((tmp_path / "null_threshold").glob("*.json"))) == 2
    collapse.null_threshold.cache_clear()


def _rises_by_linregress(ts, tv, lo, hi, alpha):
    """The (C7) verdict from scipy.stats.linregress, independent of collapse's own arithmetic."""
    from scipy import stats as sps

    keep = (ts >= lo) & (ts <= hi)
    x, y = ts[keep], tv[keep]
    if x.size < 3 or x[-1] == x[0]:
        return False
    fit = sps.linregress(x, y)
    if not fit.slope > 0:
        return False
    return fit.stderr == 0 or fit.slope / fit.stderr >= sps.t.ppf(1 - alpha, x.size - 2)


@pytest.mark.parametrize("offset", [0.0, 1e9])
def test_rises_screen_never_drops_a_span_that_passes(offset):
    # the many-spans screen may keep spans that fail (the exact test decides them) but must keep
    # every span whose slope test passes, even where prefix sums cancel most digits (steps ~ 1e9)
    rng = np.random.default_rng(3)
    ts = offset + np.arange(0.0, 400.0)
    tv = 0.3 * np.sin(ts / 40) + rng.normal(0, 0.05, ts.size)   # rises and falls in turns
    lo = offset + rng.integers(0, 380, 300).astype(np.float64)
    hi = lo + rng.integers(0, 60, 300)
    keep = collapse._rises_screen(ts, tv, lo, hi, 0.04)
    truth = np.array([_rises_by_linregress(ts, tv, a, b, 0.04) for a, b in zip(lo, hi, strict=True)])
    exact = np.array([collapse._train_rises(ts, tv, a, b, 0.04) for a, b in zip(lo, hi, strict=True)])
    assert np.array_equal(exact, truth)
    assert truth.any() and not truth.all()
    assert np.all(keep[truth])                  # no passing span dropped
    if offset == 0:                              # well conditioned: the screen decides (almost) alone
        assert keep.sum() <= truth.sum() + 3


def test_rises_screen_hand_cases():
    ts = np.arange(0.0, 10.0)
    # a perfect line up: SSE = 0, the slope is certain (linregress: stderr 0) → kept; down → dropped
    keep = collapse._rises_screen(ts, 2 * ts, np.array([0.0, 3.0, 5.0]), np.array([9.0, 5.0, 6.0]), 0.05)
    assert keep.tolist() == [True, True, False]   # [5, 6] holds 2 points: no test
    assert not collapse._rises_screen(ts, -ts, np.array([0.0]), np.array([9.0]), 0.05).any()
    # y = 0, 1, 0, 1, ... over 0..3: slope 0.2, SSE 0.8 (by hand) → t = 0.2/sqrt(0.8/2/5) = 0.707,
    # below t_0.95(2) = 2.92 → dropped
    assert not collapse._rises_screen(ts, ts % 2, np.array([0.0]), np.array([3.0]), 0.05).any()


def test_divergence_step_takes_the_first_window_whose_train_rises():
    # val falls twice (steps 40 and 100); train falls over the first span and rises over the second
    steps = np.arange(0, 160, 10)
    val = [0.5] * 4 + [0.3] * 3 + [0.6] * 3 + [0.1] * 6
    ts = np.arange(0, 151)
    train = np.where(ts < 70, 1 - ts / 70, (ts - 70) / 80)
    assert collapse.collapse_step(steps, val, n=1000) == 40
    assert collapse.divergence_step(steps, val, ts, train, n=1000) == 100


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(0, 60), binomial=st.booleans(), holes=st.booleans())
def test_collapse_metrics_is_each_metric_on_its_own(seed, k, binomial, holes):
    # collapse_metrics cleans the curve, estimates its noise and runs the fall test once for all
    # its metrics: the numbers are those of the one-metric functions, each on the raw input
    rng = np.random.default_rng(seed)
    steps = rng.permutation(np.arange(k) * 10.0)
    values = np.clip(0.5 + np.cumsum(rng.normal(0, 0.05, k)), 0, 1)
    if holes and k:
        values[rng.integers(0, k, max(1, k // 8))] = np.nan
    n = 400 if binomial else None
    ts = np.arange(0.0, 10.0 * k + 1)
    tv = np.sin(ts / (7 + seed % 30)) + rng.normal(0, 0.1, ts.size)
    m = collapse.collapse_metrics(steps, values, n=n, train_steps=ts, train_values=tv, patience=3, delta=0.02)
    assert m["collapse_step"] == collapse.collapse_step(steps, values, 0.02, 3, n=n)
    assert m["divergence_step"] == collapse.divergence_step(steps, values, ts, tv, 0.02, 3, n=n)
    alone = collapse.peak_and_drop(steps, values, n, 3)
    assert {key: m[key] for key in alone} == pytest.approx(alone, nan_ok=True)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(0, 40), order=st.sampled_from(["sorted", "ties", "shuffled"]),
       bad=st.sampled_from([0.0, 0.2]))
def test_clean_curve_drops_non_finite_points_and_sorts_stably(seed, k, order, bad):
    rng = np.random.default_rng(seed)
    steps = np.sort(rng.integers(0, 30, k)).astype(float) if order == "ties" else np.arange(k) * 5.0
    if order == "shuffled":
        steps = rng.permutation(steps)
    values = rng.normal(0, 1, k)
    values[rng.random(k) < bad] = np.nan
    steps[rng.random(k) < bad / 2] = np.inf
    s, v = collapse.clean_curve(steps, values)
    # the definition: keep the finite (step, value) pairs, in step order, ties in input order
    want = sorted(((a, i, b) for i, (a, b) in enumerate(zip(steps, values, strict=True))
                   if math.isfinite(a) and math.isfinite(b)))
    assert s.tolist() == [a for a, _, _ in want] and v.tolist() == [b for _, _, b in want]
    assert s.dtype == v.dtype == np.float64
