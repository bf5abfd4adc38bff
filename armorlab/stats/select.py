"""Two ways to read a number off a run, shown side by side in every report:

    (R1) best on val, reported on test: pick the eval step where the selection metric (val/acc)
         is best and report the test metric at that step. This is what "best checkpoint" numbers
         in papers do; across seeds it is optimistic, because val noise picks the lucky step.
    (R2) at matched steps: report val and test at the same, pre-declared steps for every run
         (e.g. 100, 200, 400). No selection, no selection bias; a collapse after the peak shows.

The gap between (R1)'s val value and the matched-step values is the best-checkpoint selection
bias the ARMOR review names.

A run's *kept* checkpoint (selected.json, written by the trainer) is chosen by a noise-aware level
instead (``select_checkpoints``, S1): the best mean of several evals around a checkpoint, not (R1)'s
raw maximum, so a lucky eval does not decide which weights a later stage continues from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from armorlab.core.eval_sets import VAL_METRIC
from armorlab.stats.collapse import PATIENCE, as_step, clean_curve


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
    if report_steps is None or report_values is None:
        return Selection(as_step(s[i]), float(v[i]), math.nan, False)
    at = value_at(report_steps, report_values, s[i])
    return Selection(as_step(s[i]), float(v[i]), at.value, at.exact)


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


# --------------------------------------------------------------------------- the kept checkpoint
@dataclass(frozen=True)
class Pick:
    """A checkpoint chosen by :func:`select_checkpoints`: its ``step``, the ``level`` that chose it
    and the eval steps that level averages (``window``)."""
    step: int | float
    level: float
    window: tuple[int | float, ...]


def level_rule(patience: int = PATIENCE, metric: str = VAL_METRIC, mode: str = "max") -> str:
    """selected.json's ``rule``: how :func:`select_checkpoints` chose, in words."""
    best = "highest" if mode == "max" else "lowest"
    return (f"level: each checkpoint scored by the mean of the {patience} {metric} evals around it, fewer at "
            f"either end of the curve (the last by the evals up to it); the {best} level's checkpoint")


def select_checkpoints(steps, values, *, eligible=None, patience: int = PATIENCE, mode: str = "max",
                       top: int = 1, settled: bool = False) -> list[Pick]:
    """The ``top`` checkpoints by noise-aware level (S1), best first; a raw maximum of a noisy eval
    picks a lucky step.

    (S1) Of K evals and m = min(patience, K), eval j scores the mean of the evals j − h … j − h + m − 1
    (h = (m − 1)//2) that exist: the report's peak window (C1) inside the curve, fewer evals at its
    ends, since the centred window alone (C2's peak_step) never picks the last checkpoint of a
    still-rising curve (benchmarks/selection.py measures the extra noise on flat curves). Only
    ``eligible`` steps compete (those with a checkpoint; default every step > 0, step 0 being the
    initial model); ties go to the earlier step; each step is picked once. ``settled``: only evals
    whose level no later eval can change compete (see :func:`pending_steps`).
    """
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
    k = v.size
    m = min(patience, k)
    j = np.arange(k)
    lo = np.maximum(j - (m - 1) // 2, 0)
    hi = np.minimum(j - (m - 1) // 2 + m, k)           # exclusive
    c = np.concatenate([[0.0], np.cumsum(v)])
    levels = (c[hi] - c[lo]) / (hi - lo)               # (S1)
    if settled:
        levels = levels[j - (m - 1) // 2 + m <= k]     # a prefix: no later eval extends these windows
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
    """Eval steps whose level (S1) a later eval may still change (their checkpoints must stay until
    then): with K evals so far, the windows of evals K − ⌈(m − 1)/2⌉ … K − 1 (0-based) reach past
    the last eval (also while K < m, where m shrinks to K)."""
    s = np.unique(np.asarray(steps, dtype=np.float64))
    first = max(0, s.size - math.ceil((patience - 1) / 2))
    return [as_step(x) for x in s[first:]]
