"""The range a score can take, so that no interval is printed outside it: the true value lies inside,
so the cut interval keeps its coverage (R1); why and examples: docs/reports.md. A metric is a proportion
([0, 1]; a difference of two: [−1, 1]) by its name (accuracy, avg@n, pass@k) while every value seen lies
in [0, 1]."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import numpy as np

Bounds = tuple[float, float]

# the last part of a metric name that is a share of scored completions: acc, acc_greedy, pass@8, avg@4
_PROPORTION = re.compile(r"(acc(_\w+)?|accuracy|pass@\d+|avg@\d+)")


def metric_range(metric: str) -> Bounds | None:
    """[0, 1] for a proportion by its name, else None (unbounded as far as we know)."""
    return (0.0, 1.0) if _PROPORTION.fullmatch(metric.rsplit("/", 1)[-1]) else None


def difference_range(bounds: Bounds | None) -> Bounds | None:
    """The range of a difference of two values in ``bounds``: ±(high − low)."""
    return None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])


def score_range(score: str, val_metric: str, test_metric: str) -> Bounds | None:
    """The range of a per-run score of analysis.groups (``drop``: peak − final level), or None."""
    if score in ("peak", "final", "auc", "selected_val") or score.startswith("val@"):
        return metric_range(val_metric)
    if score == "selected_test" or score.startswith("test@"):
        return metric_range(test_metric)
    return difference_range(metric_range(val_metric)) if score == "drop" else None


def score_ranges(scores: Iterable[str], val_metric: str, test_metric: str,
                 values: Mapping[str, Iterable[float]] | None = None) -> dict[str, Bounds]:
    """Each score's range, for the scores that have one and whose ``values`` all lie inside it (a value
    outside, e.g. rewards outside [0, 1] logged as acc: the name promised too much)."""
    values = {} if values is None else values
    bounds = {s: score_range(s, val_metric, test_metric) for s in scores}
    return {s: b for s, b in bounds.items()
            if b is not None and not any(v < b[0] or v > b[1] for v in np.asarray(list(values.get(s, ())), float))}


def clip_interval(low: float, high: float, bounds: Bounds | None) -> tuple[float, float]:
    """(R1) [low, high] ∩ bounds; a missing interval (NaN) stays missing."""
    if bounds is None or not (math.isfinite(low) and math.isfinite(high)):
        return low, high
    return min(max(low, bounds[0]), bounds[1]), min(max(high, bounds[0]), bounds[1])
