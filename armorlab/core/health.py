"""Warnings about runs that train on nothing: pure functions of the logged metrics (no I/O).

A run can end "completed" having learned nothing: every completion cut at
``max_completion_length`` (all scored 0), ARMOR's gate dropping every group, or a loss without
gradient. The trainer writes these warnings into status.json as it goes (``armorlab status``
shows them) and the report recomputes them from metrics.jsonl.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

TRUNCATION_STEPS = 5       # the first training steps the truncation check averages over
TRUNCATION_SHARE = 0.9     # warn above this share of truncated completions
GATE_WINDOW = 10           # consecutive steps the gate check averages over
GATE_SHARE = 0.9           # warn at or above this share of dropped groups
NO_GRADIENT_STEPS = 10     # consecutive steps with a zero gradient norm


def _series(rows: Sequence[Mapping[str, Any]], name: str) -> list[tuple[int, float]]:
    """(step, value) of the training steps (step ≥ 1) where ``name`` has a finite value."""
    out = []
    for row in rows:
        value = row.get(name)
        step = row.get("step")
        if isinstance(step, int) and step >= 1 and isinstance(value, (int, float)) and math.isfinite(value):
            out.append((step, float(value)))
    return out


Series = Sequence[tuple[int, float]]  # (step, value) of the training steps, finite values only
TRUNCATED, GATE_DROP, GRAD_NORM = "train/truncated", "anchor/gate_drop", "train/grad_norm"
WATCHED = (TRUNCATED, GATE_DROP, GRAD_NORM)


def truncation_warning(truncated: Series, *, final: bool = False) -> str | None:
    """Mean ``train/truncated`` over the first TRUNCATION_STEPS steps above TRUNCATION_SHARE
    (over all steps when a finished run logged fewer)."""
    series = list(truncated)[:TRUNCATION_STEPS]
    if not series or (len(series) < TRUNCATION_STEPS and not final):
        return None
    share = sum(v for _, v in series) / len(series)
    if share <= TRUNCATION_SHARE:
        return None
    return (f"{share:.0%} of completions hit max_completion_length over steps {series[0][0]}–{series[-1][0]}: "
            "they score as unfinished answers; raise max_completion_length")


def gate_warning(gate_drop: Series, *, final: bool = False) -> str | None:
    """Mean ``anchor/gate_drop`` ≥ GATE_SHARE over some GATE_WINDOW consecutive steps (the whole
    run when a finished run logged fewer); names the first such window."""
    series = list(gate_drop)
    values = [v for _, v in series]
    width = GATE_WINDOW if len(values) >= GATE_WINDOW else len(values)
    if not values or (width < GATE_WINDOW and not final):
        return None
    # Prefix sums (itertools.accumulate, C speed) find the candidate windows in one pass (a
    # report checks every run's 2,000 steps); each candidate is then checked with the exact sum.
    # Shares lie in [0, 1], so the prefix sums drift by far less than the margin; larger values
    # make every window a candidate.
    margin = 1e-6 if max(map(abs, values)) <= 1.0 else math.inf
    prefix = [0.0, *itertools.accumulate(values)]
    low = (GATE_SHARE - margin) * width
    sums = map(operator.sub, prefix[width:], prefix)  # window i's sum: prefix[i + width] − prefix[i]
    for i in (i for i, total in enumerate(sums) if total >= low):
        win = series[i:i + width]
        share = sum(v for _, v in win) / len(win)
        if share >= GATE_SHARE:
            return (f"ARMOR's gate dropped {share:.0%} of groups over steps {win[0][0]}–{win[-1][0]}: the "
                    "reference solves almost none of these prompts, so they give no gradient (a stronger "
                    "reference, easier prompts, or anchor_gate: false)")
    return None


def no_gradient_warning(grad_norm: Series, *, final: bool = False) -> str | None:
    """``train/grad_norm`` exactly 0 for NO_GRADIENT_STEPS consecutive steps (every step of a
    finished run that logged fewer)."""
    series = list(grad_norm)
    run: list[tuple[int, float]] = []
    for point in series:
        run = [*run, point] if point[1] == 0.0 else []
        if len(run) >= NO_GRADIENT_STEPS:
            break
    if len(run) < NO_GRADIENT_STEPS and not (final and run and len(run) == len(series)):
        return None
    return (f"the loss had no gradient (grad norm 0) for steps {run[0][0]}–{run[-1][0]}: every group has "
            "equal rewards or is masked, so nothing was learned")


def run_warnings(rows: Sequence[Mapping[str, Any]], *, final: bool = False) -> list[str]:
    """All warnings for a run's metric rows (``{"step": N, "<metric>": value, ...}``); ``final``
    when the run has ended, so windows may be shorter than their size."""
    return series_warnings({name: _series(rows, name) for name in WATCHED}, final=final)


def series_warnings(series: Mapping[str, Series], *, final: bool = False) -> list[str]:
    """All warnings from the WATCHED metrics' (step, value) series."""
    found = (truncation_warning(series.get(TRUNCATED, ()), final=final),
             gate_warning(series.get(GATE_DROP, ()), final=final),
             no_gradient_warning(series.get(GRAD_NORM, ()), final=final))
    return [w for w in found if w]
