"""Student-t and normal quantiles without scipy (armorlab.analysis.tdist): closed forms where
they exist, scipy.special where they do not, and the report path no longer imports scipy."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ndtri, stdtr, stdtrit

from armorlab.analysis import tdist

LEVELS = (0.0001, 0.025, 0.3, 0.5, 0.51, 0.6, 0.9, 0.95, 0.96, 0.975, 0.99, 0.999, 0.9999)


def test_cdf_matches_the_closed_forms_for_one_and_two_degrees_of_freedom():
    t = np.array([-7.5, -1.0, -0.2, 0.0, 0.3, 1.0, 2.5, 40.0])
    # ν = 1 is Cauchy: F = ½ + atan(t)/π; ν = 2: F = ½ + t / (2√(2 + t²))
    np.testing.assert_allclose(tdist.t_cdf(t, np.ones(t.size, int)), 0.5 + np.arctan(t) / math.pi, rtol=1e-15,
                               atol=2e-16)  # ½ + a negative number: absolute, not relative, precision
    np.testing.assert_allclose(tdist.t_cdf(t, np.full(t.size, 2)), 0.5 + t / (2 * np.sqrt(2 + t * t)),
                               rtol=1e-15, atol=2e-16)


def test_cdf_and_density_match_scipy():
    nu = np.arange(1, 400)
    for t in (-3.0, -0.5, 0.7, 1.96, 4.0):
        # a lower tail is ½ minus a sum: precise to a few ulps of ½, not of the tail itself
        np.testing.assert_allclose(tdist.t_cdf(np.full(nu.size, t), nu), stdtr(nu, t), rtol=1e-13, atol=4e-15)
    # the density against a central difference of scipy's CDF
    h, t = 1e-5, 1.3
    numeric = (stdtr(nu, t + h) - stdtr(nu, t - h)) / (2 * h)
    np.testing.assert_allclose(tdist.t_pdf(np.full(nu.size, t), nu), numeric, rtol=1e-8)


def test_quantiles_match_the_closed_forms_for_one_and_two_degrees_of_freedom():
    for q in LEVELS:
        # F is known to a few ulps of 1 near the upper end: the quantile to ~eps / tail probability
        rel = 1e-15 / min(q, 1 - q)
        assert tdist.t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=rel, abs=1e-15)
        assert tdist.t_quantile(q, 2) == pytest.approx((2 * q - 1) / math.sqrt(2 * q * (1 - q)), rel=rel,
                                                       abs=1e-15)


def test_quantiles_match_scipy_below_and_above_the_expansion():
    nu = np.arange(1, 3001)
    for q in LEVELS:
        ours = tdist.t_quantiles(q, nu)
        ref = stdtrit(nu.astype(float), q)
        exact = nu < tdist.T_EXPANSION_NU
        np.testing.assert_allclose(ours[exact], ref[exact], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(ours[~exact], ref[~exact], rtol=4e-11)  # (T4): O(ν⁻⁵)


def test_textbook_values():
    # two-sided 95 % and 99 % critical values, to the digits printed in t tables
    for q, nu, printed in ((0.975, 1, 12.706), (0.975, 9, 2.262), (0.975, 29, 2.045), (0.995, 5, 4.032),
                           (0.995, 120, 2.617), (0.975, 1000, 1.962)):
        assert round(tdist.t_quantile(q, nu), 3) == printed


@settings(max_examples=200, deadline=None)
@given(q=st.floats(0.0005, 0.9995), nu=st.integers(1, 5000))
def test_any_level_and_df_agree_with_scipy(q, nu):
    assert tdist.t_quantile(q, nu) == pytest.approx(float(stdtrit(nu, q)), rel=4e-11, abs=1e-13)


@settings(max_examples=200, deadline=None)
@given(q=st.floats(1e-12, 1 - 1e-12))
def test_normal_quantile_is_scipys(q):
    assert tdist.normal_ppf(q) == pytest.approx(float(ndtri(q)), rel=1e-14, abs=1e-15)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"degrees of freedom .*\[0\]"):
        tdist.t_quantiles(0.9, np.array([0]))
    with pytest.raises(ValueError, match=r"degrees of freedom .*\[2\.5\]"):
        tdist.t_quantiles(0.9, np.array([2.5]))
    with pytest.raises(ValueError, match=r"quantile level .*got 1\.0"):
        tdist.t_quantiles(1.0, np.array([3]))


def test_fractional_df_still_goes_to_scipy():
    from armorlab.analysis.stats import t_ppf

    assert t_ppf(0.975, 7.5) == float(stdtrit(7.5, 0.975))
    assert t_ppf(0.975, 7.0) == pytest.approx(float(stdtrit(7, 0.975)), rel=1e-13)


def test_the_statistics_of_a_report_import_no_scipy(tmp_path):
    code = ("import sys, numpy as np\n"
            "from armorlab.analysis import stats, collapse\n"
            "stats.curve_band(stats.align_curves([(np.arange(50), np.random.default_rng(k).random(50)) "
            "for k in range(5)]))\n"
            "stats.t_ci([0.1, 0.4, 0.35])\n"
            "collapse.collapse_metrics(np.arange(0, 400, 10), np.r_[np.linspace(0.2, 0.7, 25), "
            "np.linspace(0.6, 0.1, 15)], train_steps=np.arange(400), train_values=np.linspace(0, 1, 400))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
