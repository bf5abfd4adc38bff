"""The range a score can take, so that no interval is printed outside it.

A Student-t interval of 2 or 3 seeds is wide (t₀.₉₇₅ with 1 degree of freedom is 12.7): an AUC of
two seeds read ``[0.159, 1.032]`` and a difference of accuracies ``[−1.939, +1.964]``. The true
value lies inside the score's range, so intersecting an interval with that range keeps its coverage
(R1); a proportion's range is [0, 1], a difference of two of them [−1, 1]. A metric is taken as a
proportion by its name (accuracy, avg@n, pass@k) and only while every value seen lies in [0, 1].
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import numpy as np

Bounds = tuple[float, float]

# the last part of a metric name that is a share of scored completions: acc, acc_greedy, pass@8, avg@4
_PROPORTION = re.compile(r"(acc(_\w+)?|accuracy|pass@\d+|avg@\d+)")
# scores (analysis.groups) on the selection metric's scale, and on the reported metric's
_ON_VAL = ("peak", "final", "auc", "selected_val")
_ON_TEST = ("selected_test",)


def metric_range(metric: str) -> Bounds | None:
    """[0, 1] for a proportion (see module docstring), else None (unbounded as far as we know)."""
    return (0.0, 1.0) if _PROPORTION.fullmatch(metric.rsplit("/", 1)[-1]) else None


def difference_range(bounds: Bounds | None) -> Bounds | None:
    """The range of a difference of two values in ``bounds``: ±(high − low)."""
    return None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])


def score_range(score: str, val_metric: str, test_metric: str) -> Bounds | None:
    """The range of a per-run score of analysis.groups, or None."""
    if score in _ON_VAL or score.startswith("val@"):
        return metric_range(val_metric)
    if score in _ON_TEST or score.startswith("test@"):
        return metric_range(test_metric)
    if score == "drop":  # peak − final level
        return difference_range(metric_range(val_metric))
    return None


def score_ranges(scores: Iterable[str], val_metric: str, test_metric: str,
                 values: Mapping[str, Iterable[float]] | None = None) -> dict[str, Bounds]:
    """Each score's range, for the scores that have one and whose ``values`` all lie inside it."""
    values = {} if values is None else values
    bounds = {s: score_range(s, val_metric, test_metric) for s in scores}
    # a value outside (e.g. rewards outside [0, 1] logged as acc): the name promised too much
    return {s: b for s, b in bounds.items()
            if b is not None and not any(v < b[0] or v > b[1] for v in np.asarray(list(values.get(s, ())), float))}


def clip_interval(low: float, high: float, bounds: Bounds | None) -> tuple[float, float]:
    """(R1) [low, high] ∩ bounds; a missing interval (NaN) stays missing."""
    if bounds is None or not (math.isfinite(low) and math.isfinite(high)):
        return low, high
    return min(max(low, bounds[0]), bounds[1]), min(max(high, bounds[0]), bounds[1])
