"""Student-t and normal quantiles in numpy and the standard library, for the report's confidence
intervals and collapse tests: importing scipy.special for them cost a tenth of a second of every
cold report, more than all the quantiles it computed (tests/test_analysis_tdist.py compares them
with scipy.special.stdtrit and ndtri).

    (T1) Student-t CDF for integer ν (Abramowitz & Stegun 26.7.3–4), θ = atan(t/√ν), c = cos²θ:
         ν odd:  F(t) = ½ + (θ + sinθ·cosθ·Σ_{k=0}^{(ν−3)/2} a_k c^k)/π,  a_0 = 1, a_{k+1} = a_k·(2k+2)/(2k+3)
         ν even: F(t) = ½ + ½·sinθ·Σ_{k=0}^{ν/2−1} b_k c^k,               b_0 = 1, b_{k+1} = b_k·(2k+1)/(2k+2)
         (every term is positive: the sums carry no cancellation).
    (T2) Student-t density: f(t) = Γ((ν+1)/2) / (√(νπ)·Γ(ν/2)) · (1 + t²/ν)^(−(ν+1)/2).
    (T3) Quantile for ν < T_EXPANSION_NU: Newton's method on F(t) = q from the normal quantile z_q.
         For q > ½, z_q ≤ t_q and F is concave on t ≥ 0, so every step stays left of the root and
         the iteration rises to it monotonically (no overshoot, no bracketing needed). q < ½ by
         symmetry, t_q = −t_{1−q}.
    (T4) Quantile for ν ≥ T_EXPANSION_NU: the Cornish–Fisher expansion (A&S 26.7.5),
         t_q = z + g1/ν + g2/ν² + g3/ν³ + g4/ν⁴ with z = z_q and
         g1 = (z³ + z)/4, g2 = (5z⁵ + 16z³ + 3z)/96, g3 = (3z⁷ + 19z⁵ + 17z³ − 15z)/384,
         g4 = (79z⁹ + 776z⁷ + 1482z⁵ − 1920z³ − 945z)/92160; its error is O(ν⁻⁵): within 4·10⁻¹¹
         of the quantile (relative) from ν = 300 for q up to 0.9999.
    (T5) Normal quantile z_q: statistics.NormalDist.inv_cdf (Wichura's AS 241, full double precision).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

T_EXPANSION_NU = 300
_TABLES: dict[float, np.ndarray] = {}   # q → t_q for ν = 0, 1, 2, … (NaN where not computed yet)


def normal_ppf(q: float) -> float:
    """(T5) The standard normal quantile."""
    return NormalDist().inv_cdf(q)


def t_cdf(t: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """(T1) Student-t CDF at ``t`` for integer degrees of freedom ``nu`` ≥ 1 (arrays of one shape)."""
    t = np.asarray(t, dtype=np.float64)
    nu = np.asarray(nu, dtype=np.int64)
    theta = np.arctan(t / np.sqrt(nu))
    s, c = np.sin(theta), np.cos(theta)
    c2 = c * c
    odd = nu % 2 == 1
    terms = np.where(odd, (nu - 1) // 2, nu // 2)
    total = np.zeros_like(t)
    term = np.ones_like(t)
    for k in range(int(terms.max(initial=0))):
        total += np.where(k < terms, term, 0.0)
        term = term * c2 * np.where(odd, (2 * k + 2) / (2 * k + 3), (2 * k + 1) / (2 * k + 2))
    return np.where(odd, 0.5 + (theta + s * c * total) / math.pi, 0.5 + 0.5 * s * total)


def t_pdf(t: np.ndarray, nu: np.ndarray) -> np.ndarray:
    """(T2) Student-t density."""
    t = np.asarray(t, dtype=np.float64)
    nu = np.asarray(nu, dtype=np.float64)
    log_norm = np.array([math.lgamma((n + 1) / 2) - math.lgamma(n / 2) for n in nu.ravel()]).reshape(nu.shape)
    return np.exp(log_norm - 0.5 * np.log(nu * math.pi) - (nu + 1) / 2 * np.log1p(t * t / nu))


def _newton_upper(q: float, nu: np.ndarray) -> np.ndarray:
    """(T3) t_q for q > ½ and integer ν, by Newton's method from z_q (rising monotonically)."""
    t = np.full(nu.shape, normal_ppf(q))
    active = np.arange(nu.size)
    for _ in range(200):
        if active.size == 0:
            break
        ta, na = t[active], nu[active]
        step = (q - t_cdf(ta, na)) / t_pdf(ta, na)
        # at the root, rounding may make the step ≤ 0 or negligibly small: that entry is done
        moving = step > 4 * np.finfo(np.float64).eps * np.abs(ta)
        t[active[moving]] = ta[moving] + step[moving]
        active = active[moving]
    return t


def _expansion(q: float, nu: np.ndarray) -> np.ndarray:
    """(T4) Cornish–Fisher expansion of t_q in 1/ν."""
    z = normal_ppf(q)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    n = nu.astype(np.float64)
    return z + g1 / n + g2 / n**2 + g3 / n**3 + g4 / n**4


def _upper_table(q: float, max_nu: int) -> np.ndarray:
    """t_q (q > ½) for ν = 0 … ≥ max_nu, index ν (ν = 0 is NaN); grown on demand and kept per q."""
    table = _TABLES.get(q)
    if table is not None and table.size > max_nu:
        return table
    size = max(max_nu + 1, 2 * (table.size if table is not None else 0), 64)
    nu = np.arange(size)
    out = np.full(size, np.nan)
    small = (nu >= 1) & (nu < T_EXPANSION_NU)
    out[small] = _newton_upper(q, nu[small])
    large = nu >= T_EXPANSION_NU
    out[large] = _expansion(q, nu[large])
    _TABLES[q] = out
    return out


def t_quantiles(q: float, nu) -> np.ndarray:
    """Student-t quantiles t_q for an array of integer degrees of freedom ≥ 1 ((T3), (T4))."""
    nu = np.asarray(nu)
    if nu.size and (np.any(nu < 1) or np.any(nu != np.round(nu))):
        raise ValueError(f"degrees of freedom must be integers ≥ 1, got {nu.ravel()[:5]!r}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q!r}")
    idx = nu.astype(np.int64)
    if q == 0.5:
        return np.zeros(idx.shape)
    upper = q if q > 0.5 else 1.0 - q
    values = _upper_table(upper, int(idx.max(initial=1)))[idx]
    return values if q > 0.5 else -values


def t_quantile(q: float, nu: int) -> float:
    """One Student-t quantile t_q for integer ν ≥ 1."""
    return float(t_quantiles(q, np.array([nu]))[0])
