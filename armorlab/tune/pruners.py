"""Pruners of a study whose trials are runs: Optuna's median and hyperband, and a collapse pruner.

Imports optuna at module import (loaded by armorlab.tune.backend with the study).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial

from armorlab.core.schedule import config_val_every_steps, planned_evals
from armorlab.stats.collapse import collapse_step
from armorlab.tune.space import SearchSpec

EVAL_N_ATTR = "eval_n"  # trial user attr: completions behind each eval of the objective (its val/n)


class CollapsePruner(BasePruner):
    """Prune a trial once its validation curve has collapsed (armorlab.analysis.collapse_step:
    a fall of the level below the earlier peak larger than the eval noise allows, and ≥ δ).

    The reported intermediate values are the objective metric at each validation step; a
    minimised metric is negated first so "collapse" always means a fall from the best value.
    The noise is binomial when the worker recorded the eval size (user attr ``eval_n``, from
    ``<split>/n`` of an ``acc`` objective), else estimated from the curve. ``horizon`` = the
    evals a whole trial will have (max_steps / val_every + 1): the test's threshold is the
    whole curve's, so checking after every report keeps the false-prune rate of a flat trial at
    ``alpha`` instead of compounding it. Judged only from ``warmup_steps`` on.
    """

    def __init__(self, *, direction: str = "maximize", delta: float | None = None,
                 patience: int | None = None, alpha: float | None = None, warmup_steps: int = 0,
                 horizon: int | None = None) -> None:
        self.sign = -1.0 if direction == "minimize" else 1.0
        self.kwargs = {k: v for k, v in (("delta", delta), ("patience", patience), ("alpha", alpha))
                       if v is not None}
        self.warmup_steps = warmup_steps
        self.horizon = horizon

    def collapse_step(self, intermediate: Mapping[int, float], eval_n: float | None = None) -> int | None:
        steps = sorted(s for s, v in intermediate.items() if v == v)  # NaN-free
        if not steps or steps[-1] < self.warmup_steps:
            return None
        values = [self.sign * intermediate[s] for s in steps]
        if eval_n is not None and (self.sign < 0 or not all(0 <= v <= 1 for v in values)):
            eval_n = None  # binomial noise is for accuracies in [0, 1]
        return collapse_step(steps, values, n=eval_n, horizon=self.horizon, **self.kwargs)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.collapse_step(trial.intermediate_values, trial.user_attrs.get(EVAL_N_ATTR)) is not None


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
            min_resource=p.get("min_resource", max(1, config_val_every_steps(base_cfg) or 1)),
            max_resource=p.get("max_resource", int(base_cfg["max_steps"])),
            reduction_factor=p.get("reduction_factor", 3))
    if kind == "collapse":
        return CollapsePruner(direction=search.directions[0], delta=p.get("delta"),
                              patience=p.get("patience"), alpha=p.get("alpha"),
                              warmup_steps=p.get("warmup_steps", 0), horizon=planned_evals(base_cfg))
    return optuna.pruners.NopPruner()
