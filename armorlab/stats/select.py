"""Two ways to read a number off a run, side by side in every report (why: docs/reports.md):
    (R1) best on val, reported on test: the test metric at the eval step where val/acc is best
    (R2) at matched steps: val and test at the same pre-declared steps for every run
A run's *kept* checkpoint (selected.json) is chosen by a noise-aware level (S1): a lucky eval must not
decide which weights a later stage continues from."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from armorlab.core.eval_sets import VAL_METRIC
from armorlab.stats.collapse import PATIENCE, as_step, clean_curve


@dataclass(frozen=True)
class ValueAt:
    """A curve's value at a step, ``exact`` when logged, else interpolated; NaN outside its range."""
    value: float
    exact: bool


def value_at(steps, values, step: float) -> ValueAt:
    s, v = clean_curve(steps, values)
    if v.size == 0 or step < s[0] or step > s[-1]:
        return ValueAt(math.nan, False)
    i = int(np.searchsorted(s, step))
    exact = bool(s[i] == step)
    return ValueAt(float(v[i]) if exact else float(np.interp(step, s, v)), exact)


@dataclass(frozen=True)
class Selection:
    """(R1) for one run: the selected step, the selection metric there, the reported metric there."""
    step: int | float | None
    selected_value: float
    reported_value: float
    reported_exact: bool


def select_best(steps, values, report_steps=None, report_values=None, *, mode: str = "max") -> Selection:
    """(R1) The first step with the best ``values`` (``mode`` max or min) and ``report_values`` there."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    s, v = clean_curve(steps, values)
    if v.size == 0:
        return Selection(None, math.nan, math.nan, False)
    i = int(np.argmax(v) if mode == "max" else np.argmin(v))
    given = report_steps is not None and report_values is not None
    at = value_at(report_steps, report_values, s[i]) if given else ValueAt(math.nan, False)
    return Selection(as_step(s[i]), float(v[i]), at.value, at.exact)


def default_matched_steps(eval_steps_per_run: list[np.ndarray],
                          fractions: tuple[float, ...] = (0.25, 0.5, 1.0)) -> list[int]:
    """Matched steps when a recipe names none: ¼, ½ and all of the last step every run reached,
    each snapped to the nearest logged eval step (the earlier one on a tie)."""
    runs = [np.asarray(s, dtype=np.float64) for s in eval_steps_per_run if len(s)]
    if not runs:
        return []
    last_common = min(r.max() for r in runs)
    logged = np.unique(np.concatenate(runs))
    logged = logged[(logged > 0) & (logged <= last_common)]
    if logged.size == 0:
        return [int(last_common)]
    return sorted({int(logged[np.argmin(np.abs(logged - last_common * f))]) for f in fractions})


# --------------------------------------------------------------------------- the kept checkpoint
@dataclass(frozen=True)
class Pick:
    """A checkpoint chosen by select_checkpoints, the ``level`` that chose it and the evals it averages."""
    step: int | float
    level: float
    window: tuple[int | float, ...]


def level_rule(patience: int = PATIENCE, metric: str = VAL_METRIC, mode: str = "max") -> str:
    """selected.json's ``rule``: how select_checkpoints chose, in words."""
    best = "highest" if mode == "max" else "lowest"
    return (f"level: each checkpoint scored by the mean of the {patience} {metric} evals around it, fewer at "
            f"either end of the curve (the last by the evals up to it); the {best} level's checkpoint")


def select_checkpoints(steps, values, *, eligible=None, patience: int = PATIENCE, mode: str = "max",
                       top: int = 1, settled: bool = False) -> list[Pick]:
    """The ``top`` checkpoints by noise-aware level (S1), best first (a raw maximum picks a lucky eval).
    (S1) Of K evals and m = min(patience, K), eval j scores the mean of the evals j − h … j − h + m − 1
    (h = (m − 1)//2) that exist: the peak window (C1), fewer evals at the curve's ends, since the centred
    window alone never picks the last checkpoint of a still-rising curve (benchmarks/selection.py).
    Only ``eligible`` steps compete (default every step > 0, step 0 being the initial model); ties go to
    the earlier step; ``settled``: only evals whose level no later eval can change (pending_steps)."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    s, v = clean_curve(steps, values)
    ok = (lambda x: x > 0) if eligible is None else (lambda x, e=frozenset(eligible): x in e)
    picks = _ranked(s, v, ok, patience, mode, top, settled)
    if not picks:  # only step 0 has a full window (two evals): the rule on the eligible evals alone
        keep = np.array([ok(x) for x in s], dtype=bool)
        picks = _ranked(s[keep], v[keep], ok, patience, mode, top, settled)
    return picks


def _ranked(s: np.ndarray, v: np.ndarray, ok, patience: int, mode: str, top: int, settled: bool) -> list[Pick]:
    if v.size == 0:
        return []
    m = min(patience, v.size)
    start = np.arange(v.size) - (m - 1) // 2
    lo, hi = np.maximum(start, 0), np.minimum(start + m, v.size)   # hi exclusive
    c = np.concatenate([[0.0], np.cumsum(v)])
    levels = (c[hi] - c[lo]) / (hi - lo)               # (S1)
    if settled:
        levels = levels[start + m <= v.size]     # a prefix: no later eval extends these windows
    order = np.argsort(-levels if mode == "max" else levels, kind="stable")
    picks: list[Pick] = []
    for i in order:
        step = as_step(s[i])
        if ok(step) and all(p.step != step for p in picks):
            picks.append(Pick(step, float(levels[i]), tuple(as_step(x) for x in s[lo[i]:hi[i]])))
            if len(picks) == top:
                break
    return picks


def pending_steps(steps, patience: int = PATIENCE) -> list[int | float]:
    """Eval steps whose level (S1) a later eval may still change, so their checkpoints stay: the last
    ⌈(m − 1)/2⌉ evals, whose windows reach past the last eval."""
    s = np.unique(np.asarray(steps, dtype=np.float64))
    first = max(0, s.size - math.ceil((patience - 1) / 2))
    return [as_step(x) for x in s[first:]]
