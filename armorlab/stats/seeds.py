"""Seed statistics the RL field trusts (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice"): mean, std, n, a 95% CI of the mean that keeps its coverage at few seeds,
IQM, probability of improvement, plus the alignment of learning curves whose eval steps differ.

rliable itself does not run with pandas 3, so the resampling is scipy.stats.bootstrap's (seeded,
so reports are reproducible), the exact Mann–Whitney p-value scipy.stats.mannwhitneyu's, and the
statistics are small pure functions (benchmarks/README.md, "Library replacements": the numpy
copies of both bought under 20 % of a cold report):
    (S1) IQM(x) = scipy.stats.trim_mean(x, 0.25): drops ⌊n/4⌋ seeds at each end and averages the
         rest (the interquartile mean when 4 divides n; at n ≤ 3 nothing is dropped and it is the
         plain mean, at n = 5 one seed per end). Robust to one lucky or crashed seed.
    (S2) P(X > Y) = (1/(n·m)) Σ_i Σ_j [x_i > y_j] + ½ [x_i = y_j]: the chance that a run of X beats
         a run of Y (the Mann–Whitney U statistic over n·m), 0.5 = no difference.
    (S3) CI of the mean, by n (seeds):
         n < T_MIN_BOOTSTRAP (30): Student-t, x̄ ± t_{(1+c)/2, n−1} · s/√n. The percentile bootstrap
              covers the true mean only 72–74 % of the time at 3 seeds (81–85 % at 5): it resamples
              from 3 values, so it never reaches past [min, max] and ignores that s itself is noisy.
              Student-t pays for both: ≥ 90 % coverage at n = 3 and 5 on normal and gamma scores,
              and it covers at least as well as the bootstrap up to 30 seeds, also on skewed
              scores (benchmarks/ci_coverage.py: gamma(2) at n = 10, t 0.926 vs percentile 0.878).
         n ≥ 30: BCa bootstrap (scipy.stats.bootstrap's default), which corrects for skew.
    (S4) P(X > Y) cannot be resolved with n vs m seeds when even complete separation would not be
         significant: the smallest two-sided exact Mann–Whitney p-value, 2 / C(n + m, n), exceeds
         1 − c (2 vs 2: 0.33; 3 vs 3: 0.10; 4 vs 4: 0.029). Its bootstrap CI would read [1, 1]
         (every resample separates too), so no interval is given. With more seeds the exact
         Mann–Whitney p-value is reported beside the bootstrap CI (``mw_p``).
    (S5) Percentile bootstrap CI: the (1 − c)/2 and (1 + c)/2 quantiles of resampled statistics
         (scipy.stats.bootstrap(method="percentile")).
    (S6) Exact Mann–Whitney p = min(1, 2·P(U' ≥ max(U, nm − U))) over all C(n + m, n) orderings
         (scipy.stats.mannwhitneyu(method="exact")).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import numpy as np

from armorlab.core.lazy import Lazy

log = logging.getLogger(__name__)


# scipy.stats takes half a second to import: most reports and the commands that only read run dirs
# never need it
sps = Lazy("scipy.stats")


@functools.lru_cache(maxsize=1024)
def t_ppf(q: float, df: float) -> float:
    """Student-t quantile (scipy.special.stdtrit), kept per (q, df): the same few are asked for often.
    scipy.special is imported here, at first use: a sweep's dry run reads this module but asks no quantile."""
    from scipy.special import stdtrit  # lazy: a quarter second that `sweep --dry-run` would pay for nothing

    return float(stdtrit(df, q))


CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0
T_MIN_BOOTSTRAP = 30   # (S3) below this many seeds the mean's CI is Student-t
LOW_POWER_N = 3        # groups with n ≤ this are flagged low-powered in reports


def iqm(x, axis: int = -1) -> np.ndarray | float:
    """(S1) Interquartile mean: trim 25 % at each end, average the rest — scipy.stats.trim_mean(x,
    0.25)'s arithmetic (⌊n/4⌋ values cut at each end after a partial sort; NaN propagates),
    without its per-call argument handling, which cost more than the rest of a group's summary."""
    a = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    n = a.shape[-1]
    if n == 0:
        return math.nan if a.ndim == 1 else np.full(a.shape[:-1], np.nan)
    cut = int(0.25 * n)
    kept = np.partition(a, (cut, n - cut - 1), axis=-1)[..., cut:n - cut]
    out = kept.mean(axis=-1)
    out = np.where(np.isnan(a).any(axis=-1), np.nan, out)
    return float(out) if out.ndim == 0 else out


def _poi_vectorised(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    y = np.moveaxis(np.asarray(y, dtype=np.float64), axis, -1)
    diff = x[..., :, None] - y[..., None, :]
    return (diff > 0).mean(axis=(-2, -1)) + 0.5 * (diff == 0).mean(axis=(-2, -1))


def probability_of_improvement(x, y) -> float:
    """(S2) P(X > Y) + ½ P(X = Y) over all pairs of runs of X and Y (NaNs dropped)."""
    x, y = finite(x), finite(y)
    if x.size == 0 or y.size == 0:
        return math.nan
    return float(_poi_vectorised(x, y))


def finite(x) -> np.ndarray:
    """The finite values of ``x``, flattened, as float64 (NaN, ±inf and None dropped)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


@dataclass(frozen=True)
class Summary:
    """Seed aggregate of one score: n finite values, mean, std (ddof 1), 95 % CI, IQM, and the CI's
    method (S3): "t", "bca" or "" (no CI)."""
    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    iqm: float
    ci_method: str = ""

    def as_dict(self, prefix: str = "") -> dict[str, float | str]:
        return {f"{prefix}{k}": getattr(self, k)
                for k in ("mean", "ci_low", "ci_high", "std", "iqm", "n", "ci_method")}


def ci_method(n: int) -> str:
    """(S3) The mean's CI method for n seeds: "t" below T_MIN_BOOTSTRAP, "bca" from there, ""
    (none) below 2."""
    return "" if n < 2 else ("t" if n < T_MIN_BOOTSTRAP else "bca")


CI_METHOD_NAMES = {"t": "Student-t", "bca": "BCa bootstrap", "": "none"}


def t_ci(x, *, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(S3) Student-t CI of the mean: x̄ ± t_{(1+c)/2, n−1} · s/√n (NaN below 2 values)."""
    x = finite(x)
    if x.size < 2:
        return math.nan, math.nan
    sem = float(x.std(ddof=1)) / math.sqrt(x.size)
    half = t_ppf((1 + confidence) / 2, x.size - 1) * sem
    return float(x.mean()) - half, float(x.mean()) + half


def mean_ci(x, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
            seed: int = SEED) -> tuple[float, float, str]:
    """(S3) CI of the mean by the method that keeps its coverage at this n: (low, high, method)."""
    x = finite(x)
    method = ci_method(int(x.size))
    if method == "t":
        return (*t_ci(x, confidence=confidence), method)
    if method == "bca":
        return (*bootstrap_ci(x, confidence=confidence, n_resamples=n_resamples, seed=seed,
                              method="BCa"), method)
    return math.nan, math.nan, method


def summarise(values, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
              seed: int = SEED) -> Summary:
    """Aggregate one score over seeds (NaNs, i.e. missing runs, dropped); one seed has no spread, no CI."""
    x = finite(values)
    n = int(x.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Summary(1, mean, math.nan, math.nan, math.nan, mean)
    lo, hi, method = mean_ci(x, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Summary(n, mean, float(x.std(ddof=1)), lo, hi, float(iqm(x)), method)


def bootstrap_ci(x, *, statistic=np.mean, confidence: float = CONFIDENCE,
                 n_resamples: int = N_RESAMPLES, seed: int = SEED,
                 method: str = "percentile") -> tuple[float, float]:
    """Bootstrap CI of ``statistic`` (vectorised: takes ``axis``) over the 1-D sample ``x``:
    scipy.stats.bootstrap with ``rng=np.random.default_rng(seed)``, ``method`` "percentile" (S5) or
    "BCa" (falling back to percentile where BCa's acceleration is degenerate)."""
    x = finite(x)
    if x.size < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap((x,), statistic, vectorized=True, method=method, n_resamples=n_resamples,
                        confidence_level=confidence, rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if method == "BCa" and not (math.isfinite(lo) and math.isfinite(hi)):  # degenerate acceleration
        return bootstrap_ci(x, statistic=statistic, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return lo, hi


def poi_resolvable(n_x: int, n_y: int, *, confidence: float = CONFIDENCE) -> bool:
    """(S4) Whether n_x vs n_y seeds can resolve P(X > Y) at all: the smallest two-sided exact
    Mann–Whitney p-value 2 / C(n_x + n_y, n_x) must be ≤ 1 − confidence."""
    return n_x >= 1 and n_y >= 1 and 2 / math.comb(n_x + n_y, n_x) <= 1 - confidence


MW_EXACT_MAX = 10  # seeds a side up to which mann_whitney_p is exact


def mann_whitney_p(x, y) -> float:
    """Two-sided Mann–Whitney U p-value; NaN when either side has no finite value. Exact (the
    distribution of U over all orderings, S6) up to 10 seeds a side, also with ties, where
    scipy's "auto" would switch to the normal approximation — at 3 seeds that approximation would claim
    p = 0.064 for a separation whose exact p is 0.1. Beyond, scipy.stats.mannwhitneyu's "auto"."""
    x, y = finite(x), finite(y)
    if x.size == 0 or y.size == 0:
        return math.nan
    method = "exact" if max(x.size, y.size) <= MW_EXACT_MAX else "auto"
    return float(sps.mannwhitneyu(x, y, alternative="two-sided", method=method).pvalue)


def poi_with_ci(x, y, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                seed: int = SEED) -> tuple[float, float, float]:
    """(S2) with a percentile-bootstrap CI (S5: scipy.stats.bootstrap's, paired=False), resampling
    the runs of X and Y independently; no CI (NaN) when the seeds cannot resolve it (S4)."""
    x, y = finite(x), finite(y)
    p = probability_of_improvement(x, y)
    if x.size < 2 or y.size < 2 or not poi_resolvable(x.size, y.size, confidence=confidence):
        return p, math.nan, math.nan
    res = sps.bootstrap((x, y), _poi_vectorised, vectorized=True, paired=False, method="percentile",
                        n_resamples=n_resamples, confidence_level=confidence, rng=np.random.default_rng(seed))
    return p, float(res.confidence_interval.low), float(res.confidence_interval.high)


# --------------------------------------------------------------------------- curves
@dataclass(frozen=True)
class AlignedCurves:
    """Runs' curves on one step grid: ``values[r, j]`` is run r at ``grid[j]`` (NaN outside the
    run's own step range). ``interpolated`` says whether any run was interpolated onto steps it
    did not log (eval steps differed between seeds)."""
    grid: np.ndarray
    values: np.ndarray
    interpolated: bool


def align_curves(curves: list[tuple[np.ndarray, np.ndarray]]) -> AlignedCurves:
    """Put curves (steps, values) on the union of their steps; linear interpolation inside each
    run's range, NaN outside it (a shorter, still running seed just stops contributing)."""
    cleaned = []
    for steps, values in curves:
        steps = np.asarray(steps, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64)
        keep = np.isfinite(steps) & np.isfinite(values)
        order = np.argsort(steps[keep], kind="stable")
        cleaned.append((steps[keep][order], values[keep][order]))
    nonempty = [s for s, _ in cleaned if s.size]
    if not nonempty:
        return AlignedCurves(np.empty(0), np.empty((len(curves), 0)), False)
    first = nonempty[0]
    if (len(nonempty) == len(cleaned) and np.all(first[1:] > first[:-1])
            and all(np.array_equal(s, first) for s in nonempty[1:])):
        # every run logged the same steps (the usual sweep): the grid is theirs, nothing to
        # interpolate (np.interp at its own knots returns the values as they are)
        return AlignedCurves(first, np.stack([v for _, v in cleaned]), False)
    grid = np.unique(np.concatenate(nonempty))
    out = np.full((len(cleaned), grid.size), np.nan)
    interpolated = False
    for r, (s, v) in enumerate(cleaned):
        if s.size == 0:
            continue
        inside = (grid >= s[0]) & (grid <= s[-1])
        out[r, inside] = np.interp(grid[inside], s, v)
        if np.count_nonzero(inside) != s.size:
            interpolated = True
    return AlignedCurves(grid, out, interpolated)


@dataclass(frozen=True)
class CurveBand:
    """Across-seed mean curve with a 95 % CI band (S3: Student-t below 30 seeds, else BCa
    bootstrap); ``n[j]`` = seeds present at ``steps[j]``."""
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray


def minmax_indices(y: np.ndarray, max_points: int) -> np.ndarray:
    """Indices that keep a curve's shape at ``max_points`` points (sorted, unique): the grid is
    cut into max_points // 2 consecutive buckets and each keeps the step of its lowest and of
    its highest value (NaN-only buckets keep their first step, so gaps stay gaps), plus the
    first and last step. Unlike every k-th step, a one-step spike or collapse survives."""
    size = y.size
    if size <= max_points:
        return np.arange(size)
    buckets = max(1, max_points // 2)
    bucket = (np.arange(size) * buckets) // size           # 0 … buckets−1, consecutive
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    # one row per bucket, padded with +inf after its steps; argmin takes the first of equal values,
    # so a bucket whose values are all NaN (as +inf) yields its first step
    lengths = np.diff(np.r_[starts, size])
    cols = np.arange(lengths.max())
    idx = np.minimum(starts[:, None] + cols, size - 1)
    pad = cols >= lengths[:, None]
    nan = np.isnan(y)
    low = np.where(pad, np.inf, np.where(nan, np.inf, y)[idx]).argmin(axis=1)
    high = np.where(pad, np.inf, np.where(nan, np.inf, -y)[idx]).argmin(axis=1)
    return np.unique(np.concatenate([[0, size - 1], starts + low, starts + high]))


def curve_band(aligned: AlignedCurves, *, max_points: int = 200, confidence: float = CONFIDENCE,
               n_resamples: int = 500, seed: int = SEED) -> CurveBand:
    """Mean and CI band per grid step (S3: Student-t where fewer than 30 seeds are present, BCa
    bootstrap from 30; 500 resamples put the band's edges within a line width of their limit).
    The band is NaN where fewer than two seeds are present. A long curve is cut to about
    ``max_points`` steps (a plot cannot show more, and the band costs a bootstrap per step):
    each bucket of steps keeps the step of the lowest and of the highest mean (minmax_indices),
    so a spike or collapse the mean shows stays in the figure."""
    grid, values = aligned.grid, aligned.values
    if grid.size > max_points:
        present = np.isfinite(values)
        with np.errstate(invalid="ignore", divide="ignore"):
            full_mean = np.nansum(values, axis=0) / present.sum(axis=0)
        idx = minmax_indices(np.where(present.any(axis=0), full_mean, np.nan), max_points)
        grid, values = grid[idx], values[:, idx]
    present = np.isfinite(values)
    n = present.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
    low = np.full(grid.size, np.nan)
    high = np.full(grid.size, np.nan)
    if values.shape[0] >= 2 and grid.size:
        # one vectorised bootstrap per pattern of present seeds (usually one or two patterns)
        if present.all():  # every seed at every step: one pattern, without np.unique's row sort
            patterns, inverse = present[:, :1].T, np.zeros(grid.size, dtype=np.int64)
        else:
            patterns, inverse = np.unique(present.T, axis=0, return_inverse=True)
        for k, pattern in enumerate(patterns):
            if pattern.sum() < 2:
                continue
            cols = np.flatnonzero(inverse.ravel() == k)
            sub = values[np.ix_(pattern, cols)]
            constant = np.all(sub == sub[:1], axis=0)
            low[cols[constant]] = high[cols[constant]] = sub[0, constant]
            cols, sub = cols[~constant], sub[:, ~constant]
            if cols.size == 0:
                continue
            k = int(pattern.sum())
            if ci_method(k) == "t":
                half = t_ppf((1 + confidence) / 2, k - 1) * sub.std(axis=0, ddof=1) / math.sqrt(k)
                low[cols], high[cols] = sub.mean(axis=0) - half, sub.mean(axis=0) + half
                continue
            res = sps.bootstrap((sub,), np.mean, axis=0, vectorized=True, method="BCa",
                                n_resamples=n_resamples, confidence_level=confidence,
                                rng=np.random.default_rng(seed))
            low[cols] = res.confidence_interval.low
            high[cols] = res.confidence_interval.high
    return CurveBand(grid, mean, low, high, n)
