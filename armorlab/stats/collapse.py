"""Collapse metrics of one learning curve: pure functions of (steps, values[, n]); NaN points dropped,
sorted by step. Every decision is a test against the eval noise, calibrated to a false-alarm rate α on flat
curves (benchmarks/collapse_calibration.py; the reasoning is in docs/reports.md#collapse-metrics).
    (N1) binomial SE² = p(1 − p)/n when the eval size n (``val/n``) is known
    (N2) σ̂² = mean of the ⌈0.9·N⌉ smallest (Δ²v_i)² / (6·c(k/N)), c(f) = 1 − 2qφ(q)/f, q = Φ⁻¹(½ + f/2)
         (the MAD was tried first: too noisy on short curves, 74 % of 4-SE falls found instead of 88 %)
    (C1) level L_i = mean(v_i, …, v_{i+m−1}), m = patience
    (C2) peak = max_i L_i, final = L_{K−m}, drop = peak − final, drop_z = drop / SE(peak − final)
    (C3) z_j = (P_j − L_j) / SE(L_a − L_j), P_j = L_a the highest level of windows ending before j
    (C4) z*_α(K, m) = (1 − α) quantile of max_j z_j on K evals of Gaussian noise (seeded Monte Carlo)
    (C5) collapse: first j with z_j ≥ z*_α and P_j − L_j ≥ δ; online, the threshold of the ``horizon``
    (C6) auc = ∫ v d(step) / (last step − first step)
    (C7) divergence: a collapse (C5) over whose span the train reward's slope is > 0 (one-sided t, level α)
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import ndtri, stdtrit

from armorlab.core.fsutil import SMALL_FILE_BYTES, atomic_write_json, cache_root, read_regular_text
from armorlab.stats.seeds import clean_curve, t_ppf

DELTA = 0.03
PATIENCE = 3
ALPHA = 0.04
ENTROPY_FRAC = 0.1
NULL_DRAWS = 20_000
NULL_BUDGET = 1_000_000  # simulated evals per threshold: long curves get fewer draws (≥ MIN_DRAWS)
ONLINE_CURVE_MIN_EVALS = 10  # online with σ̂ (N2): no decision before this many evals
MIN_DRAWS = 2_000        # the 96 % quantile of 2,000 draws is within ±0.5 % of its false-alarm rate
NOISE_KEEP = 0.9  # (N2) share of second differences kept (the smallest)

log = logging.getLogger(__name__)


def _clean_with_n(steps, values, n) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """clean_curve that keeps an eval-size array (or scalar) aligned with the points."""
    if n is None:
        return (*clean_curve(steps, values), None)
    v, n = (np.asarray(a, dtype=np.float64).ravel() for a in (values, n))
    if n.size not in (1, v.size):
        raise ValueError(f"eval sizes and values differ in length: {n.size} vs {v.size}")
    s, at = clean_curve(steps, np.where(np.isfinite(v), np.arange(v.size), np.nan))  # kept points, in order
    v, n = v[at.astype(np.int64)], np.broadcast_to(n, v.shape)[at.astype(np.int64)]
    if np.any(~np.isfinite(n) | (n <= 0)):
        raise ValueError("eval sizes n must be finite and > 0")
    if np.any((v < 0) | (v > 1)):
        raise ValueError("binomial noise (eval sizes given) needs values in [0, 1]")
    return s, v, n


def as_step(x: float) -> int | float:
    """A step as logged: an int when whole."""
    return int(x) if float(x).is_integer() else float(x)


# --------------------------------------------------------------------------- noise
def binomial_se(values, n) -> np.ndarray:
    """(N1) SE of each eval, with v clipped to [½/n, 1 − ½/n] so an eval at 0 or 1 keeps its noise."""
    n = np.asarray(n, dtype=np.float64)
    p = np.clip(np.asarray(values, dtype=np.float64), 0.5 / n, 1 - 0.5 / n)
    return np.sqrt(p * (1 - p) / n)


def curve_noise(values) -> float:
    """(N2) σ̂ of a curve; NaN with fewer than 5 evals."""
    v = np.asarray(values, dtype=np.float64)
    return float(_curve_noise_rows(v[None, :])[0]) if v.size >= 5 else math.nan


@functools.lru_cache(maxsize=1024)
def _trim_consistency(kept: int, total: int) -> float:
    """(N2) c(f): variance of a standard normal kept within its central fraction f = kept/total."""
    f = kept / total
    if f >= 1:
        return 1.0
    q = float(ndtri(0.5 + f / 2))
    return 1.0 - 2.0 * q * math.exp(-q * q / 2) / math.sqrt(2 * math.pi) / f


def _curve_noise_rows(x: np.ndarray) -> np.ndarray:
    d2 = np.abs(np.diff(x, 2, axis=-1))
    total = d2.shape[-1]
    kept = max(1, math.ceil(NOISE_KEEP * total))
    small = np.sort(d2, axis=-1)[..., :kept] if kept < total else d2
    return np.sqrt(np.mean(small * small, axis=-1) / (6.0 * _trim_consistency(kept, total)))


def eval_se(values, n=None) -> np.ndarray:
    """Per-eval SE for a noise band: (N1) when eval sizes are given, else (N2) for every eval."""
    v = np.asarray(values, dtype=np.float64)
    if n is not None:
        return binomial_se(v, np.broadcast_to(np.asarray(n, dtype=np.float64), v.shape))
    return np.full(v.shape, curve_noise(v))


# --------------------------------------------------------------------------- levels and the fall test
def _levels(v: np.ndarray, m: int) -> np.ndarray:
    """(C1) means of m consecutive evals (along the last axis)."""
    c = np.concatenate([np.zeros(v.shape[:-1] + (1,)), np.cumsum(v, axis=-1)], axis=-1)
    return (c[..., m:] - c[..., :-m]) / m


@dataclass(frozen=True)
class FallTest:
    """(C3) per window j = m … K−m: peak P_j, its window a, level L_j, z_j; z_star (C4); noise kind."""
    window: np.ndarray
    peak: np.ndarray
    peak_at: np.ndarray
    level: np.ndarray
    z: np.ndarray
    z_star: float
    noise: str


def fall_test(values, n=None, *, patience: int = PATIENCE, alpha: float = ALPHA,
              horizon: int | None = None, sigma: float | None = None) -> FallTest | None:
    """(C3)/(C4) on a clean curve; None without a window pair (K < 2m) or, for (N2), under 5 evals
    (10 online: a σ̂ from a handful of evals would force a 7-SE threshold on every later decision)."""
    v = np.asarray(values, dtype=np.float64)
    m, k = patience, v.size
    if k < 2 * m or (n is None and k < (ONLINE_CURVE_MIN_EVALS if horizon else 5)):
        return None
    L = _levels(v, m)
    peak = np.maximum.accumulate(L)  # and a: the first window where each running maximum was set
    new = np.concatenate([[True], L[1:] > peak[:-1]])
    j = np.arange(m, L.size)
    a = np.maximum.accumulate(np.where(new, np.arange(L.size), 0))[j - m]
    if n is None:  # SE of L_a − L_j: (N2) σ̂·sqrt(2/m), or (N1) pooled two-proportion
        sigma = curve_noise(v) if sigma is None else sigma
        se, noise = np.full(j.shape, sigma * math.sqrt(2.0 / m)), "curve"
    else:
        N = _levels(np.broadcast_to(np.asarray(n, dtype=np.float64), v.shape), m) * m
        pbar = (N[a] * L[a] + N[j] * L[j]) / (N[a] + N[j])
        se, noise = np.sqrt(pbar * (1 - pbar) * (1 / N[a] + 1 / N[j])), "binomial"
    gap = peak[j - m] - L[j]
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, gap / se, np.where(gap > 0, np.inf, 0.0))
    z_star = null_threshold(max(k, horizon or k), m, alpha, noise, sequential=bool(horizon) and noise == "curve")
    return FallTest(j, peak[j - m], a, L[j], z, z_star, noise)


@functools.lru_cache(maxsize=512)
def null_threshold(n_evals: int, patience: int, alpha: float, noise: str = "binomial", *,
                   sequential: bool = False) -> float:
    """(C4) z*_α, kept on disk (``cache_root()/null_threshold``) keyed by the arguments, constants,
    numpy's version and this source: every cold report needs it once and the simulation is seeded."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_evals < 2 * patience:
        return math.inf
    key = hashlib.sha256(Path(__file__).read_bytes())
    key.update(repr((n_evals, patience, float(alpha), noise, bool(sequential), NULL_DRAWS, NULL_BUDGET,
                     MIN_DRAWS, ONLINE_CURVE_MIN_EVALS, np.__version__)).encode())
    path = cache_root() / "null_threshold" / f"{key.hexdigest()[:32]}.json"
    try:
        return float(json.loads(read_regular_text(path, limit=SMALL_FILE_BYTES))["z_star"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    z_star = _simulate_null_threshold(n_evals, patience, alpha, noise, sequential=sequential)
    try:
        atomic_write_json(path, {"z_star": z_star, "n_evals": n_evals, "patience": patience, "alpha": alpha,
                                 "noise": noise, "sequential": sequential}, durable=False)
    except OSError as exc:
        log.debug("could not keep the null threshold in %s: %s", path, exc)
    return z_star


def _simulate_null_threshold(n_evals: int, patience: int, alpha: float, noise: str = "binomial", *,
                             sequential: bool = False) -> float:
    """(C4) seeded Monte Carlo in chunks; ``sequential``: the maximum over every prefix of ≥ max(2m, 10)
    evals, as the pruner re-estimates σ̂ after each eval (an early σ̂ is noisy and needs its own threshold)."""
    m, k = patience, n_evals
    rng = np.random.default_rng(20_261_130)
    draws = min(NULL_DRAWS, max(MIN_DRAWS, NULL_BUDGET // k))
    if sequential and noise == "curve":
        draws = min(draws, 2 * MIN_DRAWS)  # σ̂ of every prefix: cost grows as K², keep it small
    chunk = max(1, min(draws, 1_000_000 // k))
    out = []
    for start in range(0, draws, chunk):
        x = rng.standard_normal((min(chunk, draws - start), k), dtype=np.float32)
        L = _levels(x, m)
        # gap of window j (evals j..j+m−1) below the best window ending before it; running max over j
        gaps = np.maximum.accumulate(np.maximum.accumulate(L, axis=1)[:, :-m] - L[:, m:], axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            if noise != "curve":
                stat = gaps[:, -1] / math.sqrt(2.0 / m)
            else:  # σ̂ of the whole curve, or the largest z over prefixes of `end` evals (last window at end − m)
                ends = _prefix_ends(max(2 * m, ONLINE_CURVE_MIN_EVALS), k) if sequential else [k]
                z = (gaps[:, end - 2 * m] / (_curve_noise_rows(x[:, :end]) * math.sqrt(2.0 / m)) for end in ends)
                stat = functools.reduce(np.fmax, z, np.full(x.shape[0], -np.inf))
        out.append(stat)
    return float(np.quantile(np.concatenate(out), 1 - alpha))


def _prefix_ends(first: int, last: int) -> list[int]:
    """Prefix lengths checked: each up to 40 evals, then 5 % steps (σ̂ barely moves) and the last."""
    ends = list(range(first, min(last, 40) + 1))
    end = max(41, first)
    while end < last:
        ends.append(end)
        end += max(1, end // 20)
    return [*ends, last] if last > 40 else ends


def _check(delta: float, patience: int) -> None:
    if not delta > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    if patience < 1:
        raise ValueError(f"patience must be ≥ 1, got {patience}")


def _onsets(v: np.ndarray, t: FallTest, delta: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(C5) passing windows and the onset of each: the first eval at or below the midpoint."""
    ok = np.flatnonzero((t.z >= t.z_star) & (t.peak - t.level >= delta))
    mid = (t.peak[ok] + t.level[ok]) / 2
    start = t.window[ok]
    below = v[start[:, None] + np.arange(m)] <= mid[:, None]
    return ok, (start + np.argmax(below, axis=1)).astype(np.int64)


def collapse_step(steps, values, delta: float = DELTA, patience: int = PATIENCE, *, n=None,
                  alpha: float = ALPHA, horizon: int | None = None) -> int | None:
    """(C5) onset step of the first significant fall below the earlier peak; None if never."""
    _check(delta, patience)
    s, v, n = _clean_with_n(steps, values, n)
    return _first_fall(s, v, fall_test(v, n, patience=patience, alpha=alpha, horizon=horizon), delta, patience)[0]


def _first_fall(s: np.ndarray, v: np.ndarray, t: FallTest | None, delta: float, patience: int
                ) -> tuple[int | float | None, float]:
    """(C5) onset step and z of the first window that passes, from a clean curve's fall test."""
    ok, onset = _onsets(v, t, delta, patience) if t is not None else ((), ())
    return (as_step(s[onset[0]]), float(t.z[ok[0]])) if len(ok) else (None, math.nan)


def curve_auc(steps, values) -> float:
    """(C6) trapezoid area / step span; one point gives its value, none gives NaN."""
    s, v = clean_curve(steps, values)
    if v.size < 2 or s[-1] == s[0]:
        return float(v.mean()) if v.size else math.nan
    return float(np.trapezoid(v, s) / (s[-1] - s[0]))


def _train_rises(ts: np.ndarray, tv: np.ndarray, lo: float, hi: float, alpha: float) -> bool:
    """(C7) one-sided t-test of the train reward's slope on [lo, hi], linregress's formulas written out
    (its overhead was most of a report's time)."""
    a, b = np.searchsorted(ts, lo, "left"), np.searchsorted(ts, hi, "right")
    x, y = ts[a:b], tv[a:b]
    if x.size < 3 or x[-1] == x[0]:
        return False
    dx, dy = x - x.mean(), y - y.mean()
    sxx = float(dx @ dx)
    slope = float(dx @ dy) / sxx
    if not slope > 0:
        return False
    resid = dy - slope * dx
    stderr = math.sqrt(max(float(resid @ resid), 0.0) / (x.size - 2) / sxx)
    return stderr == 0 or slope / stderr >= t_ppf(1 - alpha, x.size - 2)


def _rises_screen(ts: np.ndarray, tv: np.ndarray, lo: np.ndarray, hi: np.ndarray, alpha: float) -> np.ndarray:
    """Spans that may pass _train_rises, all at once from prefix sums; each sum is widened by its
    worst-case rounding error so a span is dropped only when it surely fails."""
    a, b = np.searchsorted(ts, lo, "left"), np.searchsorted(ts, hi, "right")
    n = (b - a).astype(np.float64)
    x, y = ts - ts.mean(), tv - tv.mean()
    sums = np.cumsum([x, y, x * x, x * y, y * y], axis=1)
    cx, cy, cxx, cxy, cyy = np.concatenate([np.zeros((5, 1)), sums], axis=1)
    usable = (n >= 3) & (ts[np.maximum(b - 1, 0)] > ts[np.minimum(a, ts.size - 1)])
    e = 4 * (ts.size + 2) * np.finfo(np.float64).eps
    x1, y1 = float(np.abs(x).sum()), float(np.abs(y).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        sx, sy = cx[b] - cx[a], cy[b] - cy[a]
        sxx = (cxx[b] - cxx[a]) - sx * sx / n
        syy = (cyy[b] - cyy[a]) - sy * sy / n
        sxy = (cxy[b] - cxy[a]) - sx * sy / n
        sxx_lo = sxx - e * (cxx[-1] + 3 * x1 * x1 / n)
        syy_lo = syy - e * (cyy[-1] + 3 * y1 * y1 / n)
        sxy_hi = sxy + e * (float(np.abs(x * y).sum()) + 3 * x1 * y1 / n)
        den = sxx_lo * syy_lo - sxy_hi * sxy_hi
        t_hi = np.sqrt(n - 2) * sxy_hi / np.sqrt(den)
        t_crit = stdtrit(np.maximum(n - 2, 1), 1 - alpha)
        bounded = (sxx_lo > 0) & (syy_lo > 0)
        fails = bounded & ((sxy_hi <= 0) | ((den > 0) & (t_hi < t_crit * (1 - 1e-9))))
    return usable & ~fails


def divergence_step(steps, values, train_steps, train_values, delta: float = DELTA,
                    patience: int = PATIENCE, *, n=None, alpha: float = ALPHA,
                    horizon: int | None = None) -> int | None:
    """(C7) onset of the first significant val fall while the train reward rose; None if never."""
    _check(delta, patience)
    s, v, n = _clean_with_n(steps, values, n)
    return _divergence(s, v, fall_test(v, n, patience=patience, alpha=alpha, horizon=horizon),
                       *clean_curve(train_steps, train_values), delta, patience, alpha)


def _divergence(s: np.ndarray, v: np.ndarray, t: FallTest | None, ts: np.ndarray, tv: np.ndarray,
                delta: float, patience: int, alpha: float) -> int | float | None:
    """(C7) on clean curves, from the val curve's fall test."""
    if t is None or ts.size < 3:
        return None
    ok, onset = _onsets(v, t, delta, patience)
    lo, hi = s[t.peak_at[ok]], s[t.window[ok] + patience - 1]
    maybe = _rises_screen(ts, tv, lo, hi, alpha) if ok.size else np.zeros(0, dtype=bool)
    return next((as_step(s[onset[k]]) for k in np.flatnonzero(maybe) if _train_rises(ts, tv, lo[k], hi[k], alpha)),
                None)


def peak_and_drop(steps, values, n=None, patience: int = PATIENCE) -> dict[str, Any]:
    """(C2) peak, peak_step, final, drop, drop_rel, drop_z; under m evals the level is their mean."""
    s, v, n = _clean_with_n(steps, values, n)
    return _peak_and_drop(s, v, eval_se(v, n), patience)


def _peak_and_drop(s: np.ndarray, v: np.ndarray, se: np.ndarray, patience: int) -> dict[str, Any]:
    """(C2) on a clean curve with its per-eval SEs (eval_se)."""
    if v.size == 0:
        return dict(peak=math.nan, peak_step=None, final=math.nan, drop=math.nan, drop_rel=math.nan,
                    drop_z=math.nan)
    m = min(patience, v.size)
    L = _levels(v, m)
    i, last = int(np.argmax(L)), L.size - 1
    peak, final = float(L[i]), float(L[last])
    drop = peak - final
    # SE of L_i − L_last from the evals the two windows do not share (they may overlap)
    var = float(np.sum(se[sorted({*range(i, i + m)} ^ {*range(last, last + m)})] ** 2)) / m ** 2
    if not math.isfinite(var):
        drop_z = math.nan
    else:  # one window (i = last): no unshared eval, var 0 and drop 0
        drop_z = drop / math.sqrt(var) if var > 0 else (math.inf if drop > 0 else 0.0)
    return dict(peak=peak, peak_step=as_step(s[i + (m - 1) // 2]), final=final, drop=drop,
                drop_rel=drop / abs(peak) if peak != 0 else math.nan, drop_z=drop_z)


def entropy_collapse_step(steps, entropy, threshold: float | None = None,
                          frac: float = ENTROPY_FRAC) -> int | None:
    """First step whose entropy is below ``threshold`` (default ``frac`` × the first entropy)."""
    s, e = clean_curve(steps, entropy)
    hits = np.flatnonzero(e < (frac * e[0] if threshold is None else threshold)) if e.size else []
    return as_step(s[hits[0]]) if len(hits) else None


def length_blowup(steps, lengths) -> float:
    """Max length over the first length (NaN when empty or the first length is ≤ 0)."""
    _, n = clean_curve(steps, lengths)
    return float(n.max() / n[0]) if n.size and n[0] > 0 else float("nan")


def collapse_metrics(steps, values, *, n=None, train_steps=None, train_values=None, entropy_steps=None,
                     entropy_values=None, length_steps=None, length_values=None, delta: float = DELTA,
                     patience: int = PATIENCE, alpha: float = ALPHA,
                     entropy_threshold: float | None = None,
                     entropy_frac: float = ENTROPY_FRAC) -> dict[str, Any]:
    """All collapse metrics of a val curve (and train reward / entropy / length curves; missing → None/NaN),
    from one cleaning, noise estimate and fall test of the curve."""
    _check(delta, patience)
    s, v, n = _clean_with_n(steps, values, n)
    se = eval_se(v, n)
    t = fall_test(v, n, patience=patience, alpha=alpha, sigma=float(se[0]) if n is None and se.size else None)
    step, z = _first_fall(s, v, t, delta, patience)
    return {"n_evals": int(v.size), **_peak_and_drop(s, v, se, patience), "collapse_step": step,
            "collapse_z": z, "noise": "binomial" if n is not None else "curve",
            "noise_se": float(np.median(se)) if se.size and np.isfinite(se).any() else math.nan,
            "auc": curve_auc(s, v),
            "divergence_step": None if train_steps is None or train_values is None else _divergence(
                s, v, t, *clean_curve(train_steps, train_values), delta, patience, alpha),
            "entropy_collapse_step": None if entropy_steps is None or entropy_values is None else
            entropy_collapse_step(entropy_steps, entropy_values, entropy_threshold, entropy_frac),
            "length_blowup": math.nan if length_steps is None or length_values is None else
            length_blowup(length_steps, length_values)}
