"""Seed statistics the RL field trusts (Agarwal et al. 2021, "Deep RL at the Edge of the
Statistical Precipice"): mean, std, n, percentile-bootstrap 95% CI, IQM, probability of
improvement, plus the alignment of learning curves whose eval steps differ.

rliable itself does not run with pandas 3, so the resampling is scipy.stats.bootstrap (percentile
method, as rliable's default; seeded, so reports are reproducible) and the two statistics are
small pure functions:

    (S1) IQM(x) = mean of the middle 50 % of x (scipy.stats.trim_mean(x, 0.25)); robust to one
         lucky or crashed seed, less noisy than the median.
    (S2) P(X > Y) = (1/(n·m)) Σ_i Σ_j [x_i > y_j] + ½ [x_i = y_j]: the chance that a run of X beats
         a run of Y (the Mann–Whitney U statistic over n·m), 0.5 = no difference.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

log = logging.getLogger(__name__)

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0


def iqm(x, axis: int = -1) -> np.ndarray | float:
    """(S1) Interquartile mean: trim 25 % at each end, average the rest."""
    return sps.trim_mean(np.asarray(x, dtype=np.float64), 0.25, axis=axis)


def _poi_vectorised(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    y = np.moveaxis(np.asarray(y, dtype=np.float64), axis, -1)
    diff = x[..., :, None] - y[..., None, :]
    return (diff > 0).mean(axis=(-2, -1)) + 0.5 * (diff == 0).mean(axis=(-2, -1))


def probability_of_improvement(x, y) -> float:
    """(S2) P(X > Y) + ½ P(X = Y) over all pairs of runs of X and Y (NaNs dropped)."""
    x = _finite(x)
    y = _finite(y)
    if x.size == 0 or y.size == 0:
        return math.nan
    return float(_poi_vectorised(x, y))


def _finite(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


@dataclass(frozen=True)
class Summary:
    """Seed aggregate of one score: n finite values, mean, std (ddof 1), 95 % CI, IQM."""
    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float
    iqm: float

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}{k}": getattr(self, k) for k in ("mean", "ci_low", "ci_high", "std", "iqm", "n")}


def summarise(values, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
              seed: int = SEED) -> Summary:
    """Aggregate one score over seeds (NaNs, i.e. missing runs, are dropped).

    The CI is NaN for fewer than two values: one seed has no spread to resample.
    """
    x = _finite(values)
    n = int(x.size)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if n == 1:
        return Summary(1, mean, math.nan, math.nan, math.nan, mean)
    lo, hi = bootstrap_ci(x, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Summary(n, mean, float(x.std(ddof=1)), lo, hi, float(iqm(x)))


def bootstrap_ci(x, *, statistic=np.mean, confidence: float = CONFIDENCE,
                 n_resamples: int = N_RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``statistic`` over the 1-D sample ``x`` (scipy.stats.bootstrap)."""
    x = _finite(x)
    if x.size < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap((x,), statistic, vectorized=True, method="percentile", n_resamples=n_resamples,
                        confidence_level=confidence, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def poi_with_ci(x, y, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                seed: int = SEED) -> tuple[float, float, float]:
    """(S2) with a percentile-bootstrap CI, resampling the runs of X and Y independently."""
    x, y = _finite(x), _finite(y)
    p = probability_of_improvement(x, y)
    if x.size < 2 or y.size < 2:
        return p, math.nan, math.nan
    res = sps.bootstrap((x, y), _poi_vectorised, vectorized=True, paired=False, method="percentile",
                        n_resamples=n_resamples, confidence_level=confidence,
                        rng=np.random.default_rng(seed))
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
    """Across-seed mean curve with a bootstrap CI band; ``n[j]`` = seeds present at ``steps[j]``."""
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray


def curve_band(aligned: AlignedCurves, *, max_points: int = 200, confidence: float = CONFIDENCE,
               n_resamples: int = 500, seed: int = SEED) -> CurveBand:
    """Mean and percentile-bootstrap band per grid step (at most ``max_points`` evenly spaced
    steps: a plot cannot show more, and the band costs a bootstrap per step; 500 resamples put
    the band's edges within a line width of their limit). The band is NaN where fewer than two
    seeds are present."""
    grid, values = aligned.grid, aligned.values
    if grid.size > max_points:
        idx = np.unique(np.linspace(0, grid.size - 1, max_points).round().astype(int))
        grid, values = grid[idx], values[:, idx]
    present = np.isfinite(values)
    n = present.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(values, axis=0) / np.maximum(n, 1), np.nan)
    low = np.full(grid.size, np.nan)
    high = np.full(grid.size, np.nan)
    if values.shape[0] >= 2 and grid.size:
        # one vectorised bootstrap per pattern of present seeds (usually one or two patterns)
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
            res = sps.bootstrap((sub,), np.mean, axis=0, vectorized=True, method="percentile",
                                n_resamples=n_resamples, confidence_level=confidence,
                                rng=np.random.default_rng(seed))
            low[cols] = res.confidence_interval.low
            high[cols] = res.confidence_interval.high
    return CurveBand(grid, mean, low, high, n)
