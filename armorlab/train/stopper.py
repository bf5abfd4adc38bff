"""Stop a run once its validation curve has collapsed (config ``stop_on_collapse``;
armorlab.stats.stopping decides, S1). The curve is the ``keep_select`` metric (val/acc), the one the
kept checkpoint is selected on, so the run stops on the curve whose peak selected.json keeps. The
stop ends training after the eval step that fired (its checkpoint is saved first: every eval step
saves one), the keeper then writes selected.json and prunes, and launch records status ``stopped``
with the Stop's reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback

from armorlab.core.eval_sets import DEFAULT_KEEP_SELECT
from armorlab.core.runs import RunDir
from armorlab.core.schedule import planned_evals, rollout_at
from armorlab.core.stop_on_collapse import KEY, level_evals, rollouts_per_eval
from armorlab.stats.stopping import CollapseWatch, Stop


def eval_size_key(metric: str) -> str | None:
    """``<split>/n`` (completions scored) beside an ``<split>/acc`` metric; None for other metrics."""
    ns, _, name = metric.rpartition("/")
    return f"{ns}/n" if name == "acc" and ns else None


class CollapseStopper(TrainerCallback):
    def __init__(self, trainer: Any, run_dir: RunDir, cfg: Mapping[str, Any]) -> None:
        stop, select = cfg[KEY], cfg.get("keep_select") or DEFAULT_KEEP_SELECT
        self.trainer, self.run_dir = trainer, run_dir
        self.metric, self.n_key = select["metric"], eval_size_key(select["metric"])
        self.watch = CollapseWatch(patience=level_evals(stop["patience"], rollouts_per_eval(cfg)),
                                   delta=stop["delta"], alpha=stop["alpha"], horizon=planned_evals(cfg),
                                   mode=select["mode"])

    @property
    def stop(self) -> Stop | None:
        return self.watch.stop

    def _observe(self, step: int, row: Mapping[str, Any]) -> Stop | None:
        value = row.get(self.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        n = row.get(self.n_key) if self.n_key else None
        return self.watch.observe(rollout_at(step, self.trainer.per_rollout), float(value),
                                  float(n) if isinstance(n, (int, float)) else None)

    def on_train_begin(self, args, state, control, **kwargs):
        # a resumed run: the evals up to its checkpoint (a killed attempt's later lines are superseded)
        if state.global_step > 0:
            for row in self.run_dir.read_metrics():
                if row["step"] <= state.global_step:
                    self._observe(row["step"], row)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.metric in (logs or {}) and self._observe(state.global_step, logs) is not None:
            control.should_training_stop = True
        return control


def install(trainer: Any, run_dir: RunDir, cfg: Mapping[str, Any]) -> CollapseStopper | None:
    """A stopper on ``trainer`` when the config asks for one (None otherwise)."""
    if cfg.get(KEY) is None:
        return None
    stopper = CollapseStopper(trainer, run_dir, cfg)
    trainer.add_callback(stopper)
    return stopper
