"""Two ways to read a number off a run, shown side by side in every report:

    (R1) best on val, reported on test: pick the eval step where the selection metric (val/acc)
         is best and report the test metric at that step. This is what "best checkpoint" numbers
         in papers do; across seeds it is optimistic, because val noise picks the lucky step.
    (R2) at matched steps: report val and test at the same, pre-declared steps for every run
         (e.g. 100, 200, 400). No selection, no selection bias; a collapse after the peak shows.

    (R3) noise-aware selection (``select_level``): the step whose level — the mean of several
         consecutive evals around it — is best. What a run keeps as its selected checkpoint
         (selected.json) and what a later stage of a sweep continues from.

The gap between (R1)'s val value and the matched-step values is the best-checkpoint selection
bias the ARMOR review names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from armorlab.analysis.collapse import PATIENCE, clean_curve


@dataclass(frozen=True)
class ValueAt:
    """A curve's value at a step: ``exact`` when the step was logged, else linearly interpolated
    between the neighbouring logged steps; NaN (exact=False) outside the curve's range."""
    value: float
    exact: bool


def value_at(steps, values, step: float) -> ValueAt:
    """The curve's value at ``step`` (see ValueAt)."""
    s, v = clean_curve(steps, values)
    if v.size == 0 or step < s[0] or step > s[-1]:
        return ValueAt(math.nan, False)
    i = int(np.searchsorted(s, step))
    if i < s.size and s[i] == step:
        return ValueAt(float(v[i]), True)
    return ValueAt(float(np.interp(step, s, v)), False)


@dataclass(frozen=True)
class Selection:
    """(R1) for one run: the selected step, the selection metric there, the reported metric there."""
    step: int | float | None
    selected_value: float
    reported_value: float
    reported_exact: bool


def select_best(steps, values, report_steps=None, report_values=None, *, mode: str = "max") -> Selection:
    """(R1) Step with the best ``values`` (first one on ties), and ``report_values`` at that step.

    ``mode`` is "max" (accuracy) or "min" (loss). Without a report curve the reported value is NaN.
    """
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    s, v = clean_curve(steps, values)
    if v.size == 0:
        return Selection(None, math.nan, math.nan, False)
    i = int(np.argmax(v) if mode == "max" else np.argmin(v))
    step = s[i]
    step_out = int(step) if float(step).is_integer() else float(step)
    if report_steps is None or report_values is None:
        return Selection(step_out, float(v[i]), math.nan, False)
    at = value_at(report_steps, report_values, step)
    return Selection(step_out, float(v[i]), at.value, at.exact)


def matched_values(steps, values, matched_steps) -> list[ValueAt]:
    """(R2) The curve at each of ``matched_steps``."""
    return [value_at(steps, values, m) for m in matched_steps]


def default_matched_steps(eval_steps_per_run: list[np.ndarray],
                          fractions: tuple[float, ...] = (0.25, 0.5, 1.0)) -> list[int]:
    """Matched steps when a recipe names none: ¼, ½ and all of the last step every run reached,
    each snapped to the nearest logged eval step (the earlier one on a tie)."""
    finals = [np.max(s) for s in eval_steps_per_run if len(s)]
    if not finals:
        return []
    last_common = min(finals)
    logged = np.unique(np.concatenate([np.asarray(s, dtype=np.float64) for s in eval_steps_per_run
                                       if len(s)]))
    logged = logged[(logged > 0) & (logged <= last_common)]
    if logged.size == 0:
        return [int(last_common)]
    targets = [last_common * f for f in fractions]
    picked = sorted({int(logged[np.argmin(np.abs(logged - t))]) for t in targets})
    return picked


@dataclass(frozen=True)
class LevelPick:
    """(R3) for one run: the selected eval step, its level (the mean of ``m`` consecutive evals
    around it) and the steps that level averages; ``step`` is None when nothing could be picked."""
    step: int | float | None
    value: float
    window: tuple[int | float, ...]
    m: int


def level_window(k: int, i: int, m: int) -> tuple[int, int]:
    """The ``m`` consecutive evals (of ``k``) whose level stands for eval ``i``: centred on ``i``
    (one more after than before when ``m`` is even), shifted inwards at the ends of the curve,
    all ``k`` evals when there are fewer than ``m``. Returns [lo, hi) indices."""
    if k <= m:
        return 0, k
    lo = min(max(i - (m - 1) // 2, 0), k - m)
    return lo, lo + m


def select_level(steps, values, *, mode: str = "max", m: int = PATIENCE, eligible=None) -> LevelPick:
    """(R3) Noise-aware selection: the eval step whose *level* — the mean of the ``m`` consecutive
    evals around it (``level_window``; collapse.py's (C1) level, m = ``PATIENCE``) — is best (first
    on ties). Averaging m evals shrinks the upward bias a single noisy maximum carries (R1's) by
    about √m. ``eligible``: the steps that may be picked (e.g. those with a saved checkpoint); the
    level still averages the evals around each. ``mode`` "max" or "min"."""
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    if m < 1:
        raise ValueError(f"m must be ≥ 1, got {m}")
    s, v = clean_curve(steps, values)
    allowed = None if eligible is None else {float(e) for e in eligible}
    best, best_i, best_win = math.nan, None, (0, 0)
    for i in range(s.size):
        if allowed is not None and float(s[i]) not in allowed:
            continue
        lo, hi = level_window(s.size, i, m)
        level = float(np.mean(v[lo:hi]))
        if best_i is None or (level > best if mode == "max" else level < best):
            best, best_i, best_win = level, i, (lo, hi)
    if best_i is None:
        return LevelPick(None, math.nan, (), m)
    as_step = [int(x) if float(x).is_integer() else float(x) for x in s[best_win[0]:best_win[1]]]
    step = s[best_i]
    return LevelPick(int(step) if float(step).is_integer() else float(step), best, tuple(as_step), m)
