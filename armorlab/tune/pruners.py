"""Pruners of a study whose trials are runs: Optuna's median and hyperband, and a collapse pruner.

Imports optuna at module import (loaded by armorlab.tune.backend with the study).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial

from armorlab.tune.space import SearchSpec


class CollapsePruner(BasePruner):
    """Prune a trial once its validation curve has collapsed (armorlab.analysis.collapse_step).

    The reported intermediate values are the objective metric at each validation step; a
    minimised metric is negated first so "collapse" always means a fall from the best value.
    Judged only from ``warmup_steps`` on, so an early dip is not mistaken for a collapse.
    """

    def __init__(self, *, direction: str = "maximize", delta: float | None = None,
                 patience: int | None = None, warmup_steps: int = 0) -> None:
        self.sign = -1.0 if direction == "minimize" else 1.0
        self.kwargs = {k: v for k, v in (("delta", delta), ("patience", patience)) if v is not None}
        self.warmup_steps = warmup_steps

    def collapse_step(self, intermediate: Mapping[int, float]) -> int | None:
        from armorlab.analysis.collapse import collapse_step

        steps = sorted(s for s, v in intermediate.items() if v == v)  # NaN-free
        if not steps or steps[-1] < self.warmup_steps:
            return None
        values = [self.sign * intermediate[s] for s in steps]
        return collapse_step(steps, values, **self.kwargs)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.collapse_step(trial.intermediate_values) is not None


def make_pruner(search: SearchSpec, base_cfg: Mapping[str, Any]) -> BasePruner:
    p = search.pruner
    kind = p["type"]
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.get("n_startup_trials", 5),
                                           n_warmup_steps=p.get("warmup_steps", 0),
                                           interval_steps=p.get("interval_steps", 1),
                                           n_min_trials=p.get("n_min_trials", 1))
    if kind == "hyperband":
        # Resources are training steps; validation happens every val_every steps, so the first
        # rung cannot be earlier than the first validation.
        return optuna.pruners.HyperbandPruner(
            min_resource=p.get("min_resource", max(1, int(base_cfg.get("val_every") or 1))),
            max_resource=p.get("max_resource", int(base_cfg["max_steps"])),
            reduction_factor=p.get("reduction_factor", 3))
    if kind == "collapse":
        return CollapsePruner(direction=search.directions[0], delta=p.get("delta"),
                              patience=p.get("patience"), warmup_steps=p.get("warmup_steps", 0))
    return optuna.pruners.NopPruner()
