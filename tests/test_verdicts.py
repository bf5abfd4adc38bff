"""armorlab.stats.verdicts: Welch, Holm, equivalence, power, and the plain sentences."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as sps

from armorlab.stats import margins as M
from armorlab.stats import verdicts as V


def test_welch_matches_scipy():
    x = [0.61, 0.64, 0.60, 0.66]
    y = [0.70, 0.69, 0.74]
    w = V.welch(x, y)
    ref = sps.ttest_ind(x, y, equal_var=False)
    assert w.diff == pytest.approx(np.mean(x) - np.mean(y))
    assert w.diff / w.se == pytest.approx(ref.statistic)
    assert w.df == pytest.approx(ref.df)
    assert V.welch_p(w) == pytest.approx(ref.pvalue)
    lo, hi = V.welch_interval(w, 0.05)
    ci = ref.confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ci.low, ci.high))


def test_welch_edge_cases():
    one = V.welch([0.5], [0.4, 0.6])
    assert one.diff == pytest.approx(0.0) and math.isnan(one.se) and math.isnan(V.welch_p(one))
    flat = V.welch([0.5, 0.5], [0.4, 0.4, float("nan")])   # NaN (a missing run) dropped
    assert flat.se == 0 and flat.df == 2 and V.welch_interval(flat, 0.05) == (pytest.approx(0.1), pytest.approx(0.1))
    assert V.welch_p(flat) == 0.0


def test_holm_by_hand():
    # sorted: 0.01 ≤ 0.05/3 rejects; 0.03 > 0.05/2 stops: the two left are tested at 0.025
    rejected, levels = V.holm([0.01, 0.04, 0.03], 0.05)
    assert rejected == [True, False, False]
    assert levels == pytest.approx([0.05 / 3, 0.025, 0.025])
    rejected, levels = V.holm([0.012, 0.02, 0.04], 0.05)   # 0.012 ≤ 0.0167, 0.02 ≤ 0.025, 0.04 ≤ 0.05
    assert rejected == [True, True, True] and levels == pytest.approx([0.05 / 3, 0.025, 0.05])
    rejected, levels = V.holm([float("nan"), 0.001], 0.05)
    assert rejected == [False, True] and levels == pytest.approx([0.05, 0.025])


@pytest.mark.parametrize("d, n", [(0.5, 64), (0.8, 26), (1.0, 17), (1.3, 11)])
def test_seeds_for_power_match_cohens_table(d, n):
    # two-sided α = 0.05, power 0.80, per group (Cohen 1988; the MRC CBU statistics wiki's table, whose
    # d = 1.2 row says 13 where the exact noncentral t gives 0.802 at 12)
    assert V.seeds_for_power(d, 1.0, 0.05, 0.8) == n
    assert V.seeds_for_power(2 * d, 2.0, 0.05, 0.8) == n   # only δ/σ matters


def test_power_is_scipys_noncentral_t():
    n, d = 12, 1.2
    c = sps.t.ppf(0.975, 2 * n - 2)
    ncp = d / math.sqrt(2 / n)
    want = sps.nct.sf(c, 2 * n - 2, ncp) + sps.nct.cdf(-c, 2 * n - 2, ncp)
    assert V.t_test_power(n, d, 1.0, 0.05) == pytest.approx(want, rel=1e-9)


def test_power_agrees_with_simulation():
    rng = np.random.default_rng(3)
    n, delta, sd, reps = 6, 1.2, 1.0, 40_000
    x = rng.normal(delta, sd, (reps, n))
    y = rng.normal(0, sd, (reps, n))
    p = sps.ttest_ind(x, y, axis=1).pvalue
    simulated = float(np.mean(p < 0.05))
    assert V.t_test_power(n, delta, sd, 0.05) == pytest.approx(simulated, abs=0.01)


def test_seeds_for_power_limits():
    assert V.seeds_for_power(0.05, float("nan")) is None
    assert V.seeds_for_power(0.05, 0.0) == 2
    assert V.seeds_for_power(0.001, 1.0, n_max=50) is None


def test_no_noise_unit_margin_is_left():
    # the margin was twice one evaluation's standard error; it is gone, not renamed
    assert not hasattr(V, "default_delta")


def test_without_a_margin_nothing_is_equivalent():
    same = {"a": [0.600, 0.601, 0.602, 0.600], "b": [0.601, 0.600, 0.601, 0.602]}
    assert V.compare(same, [("a", "b")], "final", delta=0.02)[0].verdict == V.EQUIVALENT
    none = V.compare(same, [("a", "b")], "final")[0]
    assert none.verdict == V.UNRESOLVED and not none.within_delta and none.seeds_needed is None
    assert V.sentence(none, "final val/acc").endswith(
        "— not resolved with 4 seeds per arm: no margin declared (compare.delta or --delta) for equivalence or a seed plan")


def test_baseline_fell_is_a_binomial_test_over_its_seeds():
    # P(Bin(n, 0.04) ≥ k) by hand
    assert M.fell_p(0, 3, 0.04) == pytest.approx(1.0)
    assert M.fell_p(1, 3, 0.04) == pytest.approx(1 - 0.96 ** 3)                    # 0.115: not enough
    assert M.fell_p(2, 3, 0.04) == pytest.approx(3 * 0.04 ** 2 * 0.96 + 0.04 ** 3)  # 0.0047
    assert M.baseline_fell(1, 3, 0.04) is False and M.baseline_fell(2, 3, 0.04) is True
    assert M.baseline_fell(1, 1, 0.04) is True and M.baseline_fell(0, 0, 0.04) is None
    record = M.prevention("dapo", 0, 3, 0.04)
    assert M.caveat(record, "final") == "dapo did not fall here (0 of 3 seeds collapsed): this cannot show prevention"
    assert M.caveat(record, "drop", "DAPO").startswith("DAPO did not fall")
    assert M.caveat(record, "selected_test") == "" and M.caveat(M.prevention("dapo", 3, 3, 0.04), "final") == ""


def test_a_verdict_against_a_baseline_that_did_not_fall_says_so():
    eq = V.Verdict("kl", "dapo", "final", 5, 5, 0.6, 0.6, 0.001, -0.01, 0.012, 0.05, 0.8, V.EQUIVALENT,
                   True, 0.047, 0.01, None, True)
    why = M.caveat(M.prevention("dapo", 0, 5, 0.04), "final")
    no = V.with_caveat(eq, why)
    assert no.verdict == V.NO_PREVENTION and "equivalent" not in V.sentence(no, "final val/acc")
    assert V.sentence(no, "final val/acc") == (
        "kl vs dapo: +0.001 [−0.010, +0.012] final val/acc — within ±0.047 with 5 seeds per arm, but dapo did not "
        "fall here (0 of 5 seeds collapsed): this cannot show prevention")
    better = V.with_caveat(dataclasses.replace(eq, verdict=V.BETTER), why)
    assert better.verdict == V.BETTER and V.sentence(better, "final val/acc").endswith(
        "resolved with 5 seeds per arm; " + why)
    assert V.with_caveat(eq, "") is eq


def test_compare_gives_each_verdict_and_holm_levels():
    rng = np.random.default_rng(0)
    base = 0.60 + 0.01 * rng.standard_normal(8)
    values = {"base": base,
              "worse": base - 0.05 + 0.001 * rng.standard_normal(8),
              "same": base + 0.001 * rng.standard_normal(8),
              "noisy": 0.60 + 0.08 * rng.standard_normal(3)}
    out = {v.arm: v for v in V.compare(values, [("worse", "base"), ("same", "base"), ("noisy", "base")],
                                       "final", delta=0.02)}
    assert out["worse"].verdict == V.WORSE and out["worse"].high < 0
    assert out["worse"].level == pytest.approx(0.05 / 3)
    assert out["same"].verdict == V.EQUIVALENT and out["same"].low > -0.02 and out["same"].high < 0.02
    assert out["same"].level == pytest.approx(0.05 / 2)   # one rejection: the rest at α/2
    noisy = out["noisy"]
    assert noisy.verdict == V.UNRESOLVED and noisy.low < 0 < noisy.high
    # planned at the first Holm level α/3 with the pooled spread
    assert noisy.seeds_needed == V.seeds_for_power(0.02, noisy.sd, 0.05 / 3)
    assert noisy.sd == pytest.approx(math.sqrt((np.var(values["noisy"], ddof=1) + np.var(base, ddof=1)) / 2))
    # lower is better for the drop: a smaller drop than the baseline is "better"
    drop = V.compare({"a": [0.05, 0.06, 0.05], "b": [0.15, 0.16, 0.15]}, [("a", "b")], "drop", delta=0.03)[0]
    assert drop.verdict == V.BETTER and not drop.higher_is_better
    tiny = V.compare({"a": [0.501, 0.5011, 0.5012], "b": [0.5, 0.5001, 0.5002]}, [("a", "b")], "final",
                     delta=0.03)[0]
    assert tiny.verdict == V.BETTER and tiny.within_delta   # significant, but smaller than δ


def test_sentences_read_plainly():
    v = V.Verdict("armor", "dapo", "final", 7, 7, 0.6, 0.63, -0.031, -0.052, -0.010, 0.05, 0.004, V.WORSE,
                  False, 0.047, 0.02, None, True)
    assert V.sentence(v, "final val/acc", names={"armor": "ARMOR", "dapo": "DAPO"}) == (
        "ARMOR vs DAPO: −0.031 [−0.052, −0.010] final val/acc — worse, resolved with 7 seeds per arm")
    open_ = V.Verdict("up", "dapo", "final", 3, 3, 0.64, 0.67, -0.03, -0.09, 0.03, 0.05, 0.2, V.UNRESOLVED,
                      False, 0.047, 0.03, 9, True)
    assert V.sentence(open_, "final val/acc", hours=1.25) == (
        "up vs dapo: −0.030 [−0.090, +0.030] final val/acc — not resolved with 3 seeds per arm; 80% power "
        "at δ = 0.047 needs 9 seeds per arm (12 more runs, ≈ 1.2 h of runs)")
    eq = V.Verdict("kl", "dapo", "final", 5, 4, 0.6, 0.6, 0.001, -0.01, 0.012, 0.05, 0.8, V.EQUIVALENT,
                   True, 0.047, 0.01, None, True)
    assert V.sentence(eq, "final val/acc").endswith("— equivalent within ±0.047, resolved with 5 vs 4 seeds")
    assert V.signed(-0.0001) == "+0.000" and V.signed(float("nan")) == "—"


def test_seeds_for_power_where_power_is_near_one_at_two_seeds():
    # δ = 0.2 at σ = 0.029 is 6.9 sds. Level 0.05/3 two-sided: at 2 seeds a side (df 2) |t| must reach
    # t_{0.9917, 2} ≈ 7.65, past the noncentrality 6.9·√(2/2): rejected about half the time (< 0.8); at 3
    # (df 4, |t| ≥ 3.96, noncentrality 8.45) nearly always. statsmodels' solver returned NaN here (a
    # ValueError from rounding it) and its power at 3 seeds was NaN (scipy's far tail): both by simulation.
    rng = np.random.default_rng(11)
    rates = {n: float(np.mean(sps.ttest_ind(rng.normal(0.2, 0.029, (20_000, n)), rng.normal(0, 0.029, (20_000, n)),
                                            axis=1).pvalue < 0.05 / 3)) for n in (2, 3)}
    assert rates[2] < 0.6 and rates[3] > 0.99
    assert V.seeds_for_power(0.2, 0.029, 0.05 / 3) == 3
    assert V.t_test_power(3, 0.2, 0.029, 0.05 / 3) == pytest.approx(rates[3], abs=0.003)
    assert V.t_test_power(2, 0.2, 0.029, 0.05 / 3) == pytest.approx(rates[2], abs=0.01)
