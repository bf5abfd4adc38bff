"""Collapse metrics of one learning curve: pure functions over 1-D arrays (steps, values).

A curve is two equal-length arrays; NaN values are dropped and points are sorted by step, so a
curve read straight from a metrics table (NaN where a metric was not logged) can be passed as is.
Step-valued results are ``int`` or ``None`` (undefined / never happened); value results are floats
(NaN when undefined, e.g. on an empty curve).

Definitions (defaults chosen for accuracies in [0, 1] evaluated every few steps):

    peak, peak_step   max value and the first step reaching it
    final             last value;  drop = peak − final;  drop_rel = drop / |peak|
    collapse_step     (C1) first eval step i (after the running peak was set) with
                      v_j ≤ max(v_0..v_j) − δ for all j in i..i+m−1: the value stays at least δ
                      below the running peak for m consecutive evals. Defaults δ = 0.05 (five
                      accuracy points: about 1.5 standard errors of avg@4 on 64 prompts) and
                      m = 3 evals, so one unlucky eval is not a collapse. A dip that is still
                      open at the last eval (< m evals) is not (yet) a collapse.
    auc               (C2) ∫ v d(step) / (last step − first step), trapezoid rule: the curve's
                      mean level, comparable across runs of different length
    divergence_step   (C3) first val eval step s where the least-squares slope of the train reward
                      over the window's step span is > 0 while val's slope over the last w evals
                      (w = 5) is < 0: the over-optimisation signature
    entropy_collapse_step  first step with entropy < threshold (default: 10 % of its first value)
    length_blowup     max length / first length
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

DELTA = 0.05
PATIENCE = 3
WINDOW = 5
ENTROPY_FRAC = 0.1


def clean_curve(steps, values) -> tuple[np.ndarray, np.ndarray]:
    """Drop NaN/inf points, sort by step; returns float64 steps and values."""
    steps = np.asarray(steps, dtype=np.float64).ravel()
    values = np.asarray(values, dtype=np.float64).ravel()
    if steps.shape != values.shape:
        raise ValueError(f"steps and values differ in length: {steps.size} vs {values.size}")
    keep = np.isfinite(steps) & np.isfinite(values)
    steps, values = steps[keep], values[keep]
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order]


def _step(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def curve_auc(steps, values) -> float:
    """(C2) Trapezoid area under the curve divided by the step span: the curve's mean level.

    One point gives its value; an empty curve gives NaN.
    """
    s, v = clean_curve(steps, values)
    if v.size == 0:
        return float("nan")
    if v.size == 1 or s[-1] == s[0]:
        return float(v.mean())
    return float(np.trapezoid(v, s) / (s[-1] - s[0]))


def collapse_step(steps, values, delta: float = DELTA, patience: int = PATIENCE) -> int | None:
    """(C1) First eval step from which the value stays ≥ ``delta`` below the running peak for
    ``patience`` consecutive evals; None if that never happens."""
    if delta <= 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    if patience < 1:
        raise ValueError(f"patience must be ≥ 1, got {patience}")
    s, v = clean_curve(steps, values)
    if v.size < patience:
        return None
    below = v <= np.maximum.accumulate(v) - delta
    # runs of `patience` consecutive Trues: a sliding-window sum equal to patience
    windows = np.convolve(below.astype(np.int64), np.ones(patience, dtype=np.int64), mode="valid")
    hits = np.flatnonzero(windows == patience)
    return _step(s[hits[0]]) if hits.size else None


def _windowed_slopes(x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Least-squares slope of y on x over index ranges [lo, hi) (vectorised via prefix sums)."""
    def prefix(a):
        return np.concatenate([[0.0], np.cumsum(a)])
    n = (hi - lo).astype(np.float64)
    sx, sy = prefix(x), prefix(y)
    sxx, sxy = prefix(x * x), prefix(x * y)
    Sx, Sy = sx[hi] - sx[lo], sy[hi] - sy[lo]
    Sxx, Sxy = sxx[hi] - sxx[lo], sxy[hi] - sxy[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        den = n * Sxx - Sx * Sx
        slope = (n * Sxy - Sx * Sy) / den
    return np.where((n >= 2) & (den > 0), slope, np.nan)


def divergence_step(steps, values, train_steps, train_values, window: int = WINDOW) -> int | None:
    """(C3) First val eval step where train reward rises (slope > 0) while val falls (slope < 0).

    Val's slope is fitted over the last ``window`` evals ending at that step; the train reward's
    slope over the train points in the same step span. None if never (or if either curve is
    too short).
    """
    if window < 2:
        raise ValueError(f"window must be ≥ 2, got {window}")
    s, v = clean_curve(steps, values)
    ts, tv = clean_curve(train_steps, train_values)
    if v.size < window or tv.size < 2:
        return None
    # centre x before the prefix sums: keeps the sums well conditioned for long runs
    centre = float(np.median(s))
    ends = np.arange(window, v.size + 1)
    starts = ends - window
    val_slope = _windowed_slopes(s - centre, v, starts, ends)
    t_lo = np.searchsorted(ts, s[starts], side="left")
    t_hi = np.searchsorted(ts, s[ends - 1], side="right")
    train_slope = _windowed_slopes(ts - centre, tv, t_lo, t_hi)
    hits = np.flatnonzero((train_slope > 0) & (val_slope < 0))
    return _step(s[ends[hits[0]] - 1]) if hits.size else None


def entropy_collapse_step(steps, entropy, threshold: float | None = None,
                          frac: float = ENTROPY_FRAC) -> int | None:
    """First step whose entropy is below ``threshold`` (default ``frac`` × the first entropy)."""
    s, e = clean_curve(steps, entropy)
    if e.size == 0:
        return None
    limit = frac * e[0] if threshold is None else threshold
    hits = np.flatnonzero(e < limit)
    return _step(s[hits[0]]) if hits.size else None


def length_blowup(steps, lengths) -> float:
    """Max length over the first length (NaN when empty or the first length is ≤ 0)."""
    _, n = clean_curve(steps, lengths)
    if n.size == 0 or n[0] <= 0:
        return float("nan")
    return float(n.max() / n[0])


def collapse_metrics(steps, values, *, train_steps=None, train_values=None, entropy_steps=None,
                     entropy_values=None, length_steps=None, length_values=None, delta: float = DELTA,
                     patience: int = PATIENCE, window: int = WINDOW,
                     entropy_threshold: float | None = None,
                     entropy_frac: float = ENTROPY_FRAC) -> dict[str, Any]:
    """All collapse metrics of a validation curve (plus train reward / entropy / length curves).

    Returns peak, peak_step, final, drop, drop_rel, collapse_step, auc, divergence_step,
    entropy_collapse_step, length_blowup, n_evals. Curves that are not given yield None/NaN.
    """
    s, v = clean_curve(steps, values)
    out: dict[str, Any] = {"n_evals": int(v.size)}
    if v.size:
        i = int(np.argmax(v))
        peak, final = float(v[i]), float(v[-1])
        out.update(peak=peak, peak_step=_step(s[i]), final=final, drop=peak - final,
                   drop_rel=(peak - final) / abs(peak) if peak != 0 else math.nan)
    else:
        out.update(peak=math.nan, peak_step=None, final=math.nan, drop=math.nan, drop_rel=math.nan)
    out["collapse_step"] = collapse_step(s, v, delta, patience)
    out["auc"] = curve_auc(s, v)
    out["divergence_step"] = (divergence_step(s, v, train_steps, train_values, window)
                              if train_steps is not None and train_values is not None else None)
    out["entropy_collapse_step"] = (
        entropy_collapse_step(entropy_steps, entropy_values, entropy_threshold, entropy_frac)
        if entropy_steps is not None and entropy_values is not None else None)
    out["length_blowup"] = (length_blowup(length_steps, length_values)
                            if length_steps is not None and length_values is not None else math.nan)
    return out
