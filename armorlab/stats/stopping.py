"""Stop on collapse (docs/training.md#stop-on-collapse): the calibrated collapse test (stats.collapse) online.
(S1) stop     after each eval, the whole run's fall test (C3; threshold C4 at ``horizon``): stop when it
              passes C5 and each of the last m evals is at or below (P + L)/2, so a one-eval dip never
              stops a run (≤ α false alarms on a flat run: benchmarks/stop_on_collapse.py)
(S2) carried  a stopped run's curve goes on at its level at stop (C1) at its own eval spacing up to the
              report's horizon: left out, exactly the collapsed runs would drop from final and val@S.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from armorlab.stats.collapse import ALPHA, DELTA, PATIENCE, as_step, clean_curve, fall_test


@dataclass(frozen=True)
class Stop:
    """(S1) a run's decision to stop: the collapse onset and its z, and the eval it was decided at."""
    onset: int | float
    z: float
    at: int | float

    @property
    def reason(self) -> str:
        return f"collapse at rollout {self.onset}, level fell {self.z:.1f} SE"


class CollapseWatch:
    """(S1) fed one eval at a time; ``horizon``: evals of the whole run; ``mode`` min: a rise collapses.
    Binomial noise (N1) when every eval says how many completions it scored and lies in [0, 1]; else (N2)."""

    def __init__(self, *, patience: int = PATIENCE, delta: float = DELTA, alpha: float = ALPHA,
                 horizon: int | None = None, mode: str = "max") -> None:
        self.patience, self.delta, self.alpha, self.horizon = patience, delta, alpha, horizon
        self.sign = -1.0 if mode == "min" else 1.0
        self.x, self.values, self.n = [], [], []  # eval steps, values (sign-corrected), eval sizes
        self.stop: Stop | None = None

    def observe(self, x: float, value: float, n: float | None = None) -> Stop | None:
        if self.stop is not None or not math.isfinite(value):
            return self.stop
        if self.x and x <= self.x[-1]:  # a resumed run's evals again: the later one supersedes
            keep = int(np.searchsorted(self.x, x))
            del self.x[keep:], self.values[keep:], self.n[keep:]
        self.x.append(float(x))
        self.values.append(self.sign * float(value))
        self.n.append(math.nan if n is None else float(n))
        sizes, values = np.asarray(self.n), np.asarray(self.values)
        binomial = self.sign > 0 and bool(np.all(np.isfinite(sizes) & (sizes > 0)
                                                 & (values >= 0) & (values <= 1)))
        t = fall_test(values, sizes if binomial else None, patience=self.patience, alpha=self.alpha,
                      horizon=max(self.horizon or 0, len(self.x)))
        if t is None:
            return None
        z, peak, level = float(t.z[-1]), float(t.peak[-1]), float(t.level[-1])
        below = values <= (peak + level) / 2
        if not (z >= t.z_star and peak - level >= self.delta and below[-self.patience:].all()):
            return None
        start = values.size - int(np.argmin(below[::-1])) if not below.all() else 0  # the trailing lows
        self.stop = Stop(as_step(self.x[start]), z, as_step(self.x[-1]))
        return self.stop


def carry_forward(steps, values, until: float, patience: int = PATIENCE) -> tuple[np.ndarray, np.ndarray]:
    """(S2) the curve, then its level at stop at every step of its median eval spacing after its last
    eval, up to and including ``until``."""
    s, v = clean_curve(steps, values)
    every = float(np.median(np.diff(s))) if v.size >= 2 else math.nan
    if not (every > 0 and until > s[-1]):
        return s, v
    extra = np.arange(s[-1] + every, until, every)
    extra = np.append(extra, until) if not extra.size or extra[-1] < until else extra
    return np.concatenate([s, extra]), np.concatenate([v, np.full(extra.size, float(v[-patience:].mean()))])
