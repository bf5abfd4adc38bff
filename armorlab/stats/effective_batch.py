"""Whether two compared arms trained on the same effective batch (issue 36): with dynamic sampling
or ARMOR's gate, the share of a batch's rows that train is 1 − ``train/refill_shortfall``; arms that
filter differently (ARMOR keeps all-wrong groups, which DAPO drops) can end up with different batch
sizes and loss normalisers, a confound no config key shows. Pure Python, no I/O."""

from __future__ import annotations

from collections.abc import Sequence

# paired arms whose effective batches differ by more than this are flagged; our choice: 0.05 of the
# batch, well above the step-to-step noise of a full refill
EFFECTIVE_BATCH_TOLERANCE = 0.05


def effective_batch_gap(baseline: Sequence[float], arm: Sequence[float],
                        tolerance: float = EFFECTIVE_BATCH_TOLERANCE) -> tuple[float, float] | None:
    """(baseline's, arm's) mean effective batch, 1 − mean train/refill_shortfall over its runs (NaN: not
    logged, left out), when they differ by more than ``tolerance``; else, or with a side empty, None."""
    sides = [[float(v) for v in side if v == v] for side in (baseline, arm)]
    if not all(sides):
        return None
    base, mine = (1.0 - sum(values) / len(values) for values in sides)
    return (base, mine) if abs(mine - base) > tolerance else None
