"""Seed statistics the RL field trusts (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical
Precipice") and the alignment of learning curves whose eval steps differ; why each, with coverage
measured: docs/reports.md. rliable does not run with pandas 3: resampling is scipy.stats.bootstrap's
(seeded: reports are reproducible), the exact Mann–Whitney p-value scipy.stats.mannwhitneyu's.
    (S1) IQM(x) = scipy.stats.trim_mean(x, 0.25): ⌊n/4⌋ seeds dropped at each end (none at n ≤ 3).
    (S2) P(X > Y) = (1/(n·m)) Σ_i Σ_j [x_i > y_j] + ½ [x_i = y_j] (Mann–Whitney U over n·m).
    (S3) CI of the mean: Student-t x̄ ± t_{(1+c)/2, n−1} · s/√n below T_MIN_BOOTSTRAP seeds (the percentile
         bootstrap covers the mean 72–74 % of the time at 3 seeds, t ≥ 90 %), BCa bootstrap from there.
    (S4) n vs m seeds cannot resolve P(X > Y) when the smallest exact two-sided Mann–Whitney p-value,
         2 / C(n + m, n), exceeds 1 − c (3 vs 3: 0.10; 4 vs 4: 0.029): every resample would separate too.
    (S5) Percentile bootstrap CI: the (1 − c)/2 and (1 + c)/2 quantiles of resampled statistics.
    (S6) Exact Mann–Whitney p = min(1, 2·P(U' ≥ max(U, nm − U))) over all C(n + m, n) orderings.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from armorlab.core.lazy import Lazy

# scipy.stats takes half a second to import: most reports and the commands reading run dirs never need it
sps = Lazy("scipy.stats")

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0
T_MIN_BOOTSTRAP = 30   # (S3) below this many seeds the mean's CI is Student-t
LOW_POWER_N = 3        # groups with n ≤ this are flagged low-powered in reports
MW_EXACT_MAX = 10      # seeds a side up to which mann_whitney_p is exact
CI_METHOD_NAMES = {"t": "Student-t", "bca": "BCa bootstrap", "": "none"}


@functools.lru_cache(maxsize=1024)
def t_ppf(q: float, df: float) -> float:
    """Student-t quantile, kept per (q, df): the same few are asked for often."""
    from scipy.special import stdtrit  # lazy: a quarter second that `sweep --dry-run` would pay for nothing

    return float(stdtrit(df, q))


def iqm(x, axis: int = -1) -> np.ndarray | float:
    """(S1) scipy.stats.trim_mean(x, 0.25)'s arithmetic (NaN propagates) without its per-call argument
    handling, which cost more than the rest of a group's summary."""
    a = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    n = a.shape[-1]
    if n == 0:
        return math.nan if a.ndim == 1 else np.full(a.shape[:-1], np.nan)
    cut = int(0.25 * n)
    kept = np.partition(a, (cut, n - cut - 1), axis=-1)[..., cut:n - cut]
    out = np.where(np.isnan(a).any(axis=-1), np.nan, kept.mean(axis=-1))
    return float(out) if out.ndim == 0 else out


def _poi_vectorised(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x, y = (np.moveaxis(np.asarray(a, dtype=np.float64), axis, -1) for a in (x, y))
    diff = x[..., :, None] - y[..., None, :]
    return (diff > 0).mean(axis=(-2, -1)) + 0.5 * (diff == 0).mean(axis=(-2, -1))


def probability_of_improvement(x, y) -> float:
    """(S2) over all pairs of runs of X and Y (NaNs dropped)."""
    x, y = finite(x), finite(y)
    return float(_poi_vectorised(x, y)) if x.size and y.size else math.nan


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
    """(S3) The mean's CI method for n seeds: "t", "bca", or "" (none) below 2."""
    return "" if n < 2 else ("t" if n < T_MIN_BOOTSTRAP else "bca")


def t_ci(x, *, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(S3) Student-t CI of the mean (NaN below 2 values)."""
    x = finite(x)
    if x.size < 2:
        return math.nan, math.nan
    half = t_ppf((1 + confidence) / 2, x.size - 1) * (float(x.std(ddof=1)) / math.sqrt(x.size))
    return float(x.mean()) - half, float(x.mean()) + half


def mean_ci(x, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
            seed: int = SEED) -> tuple[float, float, str]:
    """(S3) CI of the mean by the method that keeps its coverage at this n: (low, high, method)."""
    x = finite(x)
    method = ci_method(int(x.size))
    low, high = (bootstrap_ci(x, confidence=confidence, n_resamples=n_resamples, seed=seed, method="BCa")
                 if method == "bca" else t_ci(x, confidence=confidence))  # NaN below 2 values
    return low, high, method


def summarise(values, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
              seed: int = SEED) -> Summary:
    """Aggregate one score over seeds (NaNs, i.e. missing runs, dropped); one seed has no spread, no CI."""
    x = finite(values)
    if x.size < 2:
        mean = float(x.mean()) if x.size else math.nan
        return Summary(int(x.size), mean, math.nan, math.nan, math.nan, mean)
    lo, hi, method = mean_ci(x, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Summary(int(x.size), float(x.mean()), float(x.std(ddof=1)), lo, hi, float(iqm(x)), method)


def bootstrap_ci(x, *, statistic=np.mean, confidence: float = CONFIDENCE,
                 n_resamples: int = N_RESAMPLES, seed: int = SEED,
                 method: str = "percentile") -> tuple[float, float]:
    """Seeded scipy.stats.bootstrap CI of ``statistic`` (vectorised: takes ``axis``) over the 1-D sample
    ``x``, ``method`` "percentile" (S5) or "BCa" (percentile where BCa's acceleration is degenerate)."""
    x = finite(x)
    if x.size < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap((x,), statistic, vectorized=True, method=method, n_resamples=n_resamples,
                        confidence_level=confidence, rng=np.random.default_rng(seed))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if method == "BCa" and not (math.isfinite(lo) and math.isfinite(hi)):
        return bootstrap_ci(x, statistic=statistic, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return lo, hi


def poi_resolvable(n_x: int, n_y: int, *, confidence: float = CONFIDENCE) -> bool:
    """(S4) Whether n_x vs n_y seeds can resolve P(X > Y) at all."""
    return n_x >= 1 and n_y >= 1 and 2 / math.comb(n_x + n_y, n_x) <= 1 - confidence


def mann_whitney_p(x, y) -> float:
    """Two-sided Mann–Whitney U p-value: exact (S6) up to MW_EXACT_MAX seeds a side, where scipy's "auto"
    would approximate (at 3 seeds p = 0.064 for an exact 0.1); beyond, scipy's "auto"."""
    x, y = finite(x), finite(y)
    if x.size == 0 or y.size == 0:
        return math.nan
    method = "exact" if max(x.size, y.size) <= MW_EXACT_MAX else "auto"
    return float(sps.mannwhitneyu(x, y, alternative="two-sided", method=method).pvalue)


def poi_with_ci(x, y, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                seed: int = SEED) -> tuple[float, float, float]:
    """(S2) with a percentile-bootstrap CI (S5), X and Y resampled apart; no CI (NaN) where (S4) says so."""
    x, y = finite(x), finite(y)
    p = probability_of_improvement(x, y)
    if x.size < 2 or y.size < 2 or not poi_resolvable(x.size, y.size, confidence=confidence):
        return p, math.nan, math.nan
    res = sps.bootstrap((x, y), _poi_vectorised, vectorized=True, paired=False, method="percentile",
                        n_resamples=n_resamples, confidence_level=confidence, rng=np.random.default_rng(seed))
    return p, float(res.confidence_interval.low), float(res.confidence_interval.high)


# --------------------------------------------------------------------------- curves
def clean_curve(steps, values) -> tuple[np.ndarray, np.ndarray]:
    """Drop NaN/inf points, sort by step; returns float64 steps and values."""
    steps, values = (np.asarray(a, dtype=np.float64).ravel() for a in (steps, values))
    if steps.shape != values.shape:
        raise ValueError(f"steps and values differ in length: {steps.size} vs {values.size}")
    keep = np.isfinite(steps) & np.isfinite(values)
    if not keep.all():
        steps, values = steps[keep], values[keep]
    if steps.size < 2 or bool(np.all(steps[1:] >= steps[:-1])):
        return steps, values  # already in order (the stable sort would keep it): no copies
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order]


@dataclass(frozen=True)
class AlignedCurves:
    """``values[r, j]``: run r at ``grid[j]``; ``interpolated``: some run was, onto steps it did not log."""
    grid: np.ndarray
    values: np.ndarray
    interpolated: bool


def align_curves(curves: list[tuple[np.ndarray, np.ndarray]]) -> AlignedCurves:
    """Curves on the union of their steps, interpolated inside each run's range, NaN outside it."""
    cleaned = [clean_curve(steps, values) for steps, values in curves]
    nonempty = [s for s, _ in cleaned if s.size]
    if not nonempty:
        return AlignedCurves(np.empty(0), np.empty((len(curves), 0)), False)
    first = nonempty[0]
    if (len(nonempty) == len(cleaned) and np.all(first[1:] > first[:-1])
            and all(np.array_equal(s, first) for s in nonempty[1:])):
        return AlignedCurves(first, np.stack([v for _, v in cleaned]), False)  # the usual sweep
    grid = np.unique(np.concatenate(nonempty))
    out = np.full((len(cleaned), grid.size), np.nan)
    interpolated = False
    for r, (s, v) in enumerate(cleaned):
        if s.size:
            inside = (grid >= s[0]) & (grid <= s[-1])
            out[r, inside] = np.interp(grid[inside], s, v)
            interpolated |= bool(np.count_nonzero(inside) != s.size)
    return AlignedCurves(grid, out, interpolated)


@dataclass(frozen=True)
class CurveBand:
    """Across-seed mean curve with a 95 % CI band (S3); ``n[j]`` = seeds present at ``steps[j]``."""
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray


def minmax_indices(y: np.ndarray, max_points: int) -> np.ndarray:
    """Indices that keep a curve's shape at ``max_points`` points: max_points // 2 buckets of consecutive
    steps each keep their first lowest and first highest value (a NaN-only bucket its first step), plus
    the first and last step; unlike every k-th step, a one-step spike or collapse survives."""
    size = y.size
    if size <= max_points:
        return np.arange(size)
    bucket = (np.arange(size) * max(1, max_points // 2)) // size
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    # lexsort is stable: each bucket's first lowest value (NaN as +inf) lands on the bucket's start
    low = np.lexsort((np.where(np.isnan(y), np.inf, y), bucket))[starts]
    high = np.lexsort((np.where(np.isnan(y), np.inf, -y), bucket))[starts]
    return np.unique(np.concatenate([[0, size - 1], low, high]))


def curve_band(aligned: AlignedCurves, *, max_points: int = 200, confidence: float = CONFIDENCE,
               n_resamples: int = 500, seed: int = SEED) -> CurveBand:
    """Mean and CI band (S3) per grid step (NaN under two seeds; 500 resamples: edges within a line width of
    their limit), at about ``max_points`` steps of the mean's minmax_indices (each costs a bootstrap)."""
    grid, values = aligned.grid, aligned.values
    n = np.isfinite(values).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
    if grid.size > max_points:
        idx = minmax_indices(mean, max_points)
        grid, values, mean, n = grid[idx], values[:, idx], mean[idx], n[idx]
    low, high = np.full(grid.size, np.nan), np.full(grid.size, np.nan)
    if values.shape[0] < 2 or not grid.size:
        return CurveBand(grid, mean, low, high, n)
    # one vectorised bootstrap per pattern of present seeds (usually one or two patterns)
    patterns, inverse = np.unique(np.isfinite(values).T, axis=0, return_inverse=True)
    for k, pattern in enumerate(patterns):
        seeds = int(pattern.sum())
        if seeds < 2:
            continue
        cols = np.flatnonzero(inverse.ravel() == k)
        sub = values[np.ix_(pattern, cols)]
        constant = np.all(sub == sub[:1], axis=0)
        low[cols[constant]] = high[cols[constant]] = sub[0, constant]
        cols, sub = cols[~constant], sub[:, ~constant]
        if ci_method(seeds) == "t":
            half = t_ppf((1 + confidence) / 2, seeds - 1) * sub.std(axis=0, ddof=1) / math.sqrt(seeds)
            low[cols], high[cols] = sub.mean(axis=0) - half, sub.mean(axis=0) + half
        elif cols.size:
            low[cols], high[cols] = sps.bootstrap((sub,), np.mean, axis=0, vectorized=True, method="BCa",
                                                  n_resamples=n_resamples, confidence_level=confidence,
                                                  rng=np.random.default_rng(seed)).confidence_interval
    return CurveBand(grid, mean, low, high, n)
