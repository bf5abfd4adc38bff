"""Keep the checkpoints that matter: the validation-selected one (``selected.json``), the next best
``keep_checkpoints − 1`` and the last ``save_total_limit`` for resume; prune the rest as the run goes.

Why not transformers' rotation: ``save_total_limit`` keeps the newest checkpoints (plus one
``best_model_checkpoint`` picked by a raw maximum, which a noisy eval biases up), so after a
validation collapse the peak's weights are gone. The keeper owns the rotation instead
(launch turns transformers' off by handing it ``save_total_limit: None``):

- at every validation step the trainer saves a checkpoint (the peak can only be kept if it was
  saved), and the selection runs on the validation curve so far
  (``armorlab.stats.select.select_checkpoints``: the report's peak level, mean of 3 evals);
- ``selected.json`` is written atomically BEFORE anything is deleted, so it never names a
  checkpoint that is gone; a checkpoint is removed by renaming it out of the ``checkpoint-N``
  namespace first, so a kill mid-delete never leaves a half-deleted checkpoint to resume from;
- protected: the last ``save_total_limit`` checkpoints (all, when it is null), the ``keep``
  best, and the checkpoints of the latest evals that a later eval may still make a window's
  middle (``select.pending_steps``: one at 3 evals per level). A window outside the best
  ``keep`` never re-enters them (later windows only push it down), so pruning loses nothing.

Disk is bounded by ``save_total_limit + keep_checkpoints + 1`` checkpoints at any time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from armorlab.core.eval_sets import DEFAULT_KEEP_SELECT, VAL_METRIC
from armorlab.core.fsutil import atomic_write_json, refuse_symlinks, remove_tree
from armorlab.core.runs import RunDir
from armorlab.core.schedule import rollout_at
from armorlab.stats.collapse import PATIENCE
from armorlab.stats.select import Pick, level_rule, pending_steps, select_checkpoints
from armorlab.train.hooks import validation_due

log = logging.getLogger(__name__)

DELETING = ".deleting-"  # prefix of a checkpoint being removed (outside RunDir.checkpoints()' names)


@dataclass(frozen=True)
class Retention:
    """What to keep, given the checkpoints on disk and the validation curve so far."""
    picks: list[Pick]        # best first; picks[0] is the selected checkpoint
    keep: frozenset[int]     # checkpoint steps to keep
    drop: tuple[int, ...]    # checkpoint steps to delete


def retention(checkpoints: Iterable[int], evals: Sequence[tuple[int, float]], *, keep: int, last: int | None,
              mode: str = "max", patience: int = PATIENCE) -> Retention:
    """The keeper's rule (module docstring), a pure function of the saved steps and the evals."""
    saved = sorted(set(int(s) for s in checkpoints))
    steps = [s for s, _ in evals]
    values = [v for _, v in evals]
    picks = select_checkpoints(steps, values, eligible=saved, patience=patience, mode=mode, top=keep) \
        if keep > 0 and evals else []
    protected = {int(p.step) for p in picks} | {int(s) for s in pending_steps(steps, patience)}
    protected |= set(saved if not last or last <= 0 else saved[-last:])
    kept = frozenset(s for s in saved if s in protected)
    return Retention(picks, kept, tuple(s for s in saved if s not in kept))


class CheckpointKeeper(TrainerCallback):
    """The keeper for one run dir (module docstring). ``last``: the run's ``save_total_limit``."""

    def __init__(self, trainer: Any, run_dir: RunDir, *, keep: int, last: int | None,
                 metric: str = VAL_METRIC, mode: str = "max", patience: int = PATIENCE) -> None:
        self.trainer, self.run_dir = trainer, run_dir
        self.keep, self.last = int(keep), last
        self.metric, self.mode, self.patience = metric, mode, patience
        self.evals: dict[int, float] = {}

    # ------------------------------------------------------------------ callback
    def on_train_begin(self, args, state, control, **kwargs):
        # a resumed run: the evals up to its checkpoint (a killed attempt's later lines are superseded).
        # A fresh run's step-0 eval may already be here: armorlab's callback, before this one, logs it.
        if state.global_step > 0:
            for row in self.run_dir.read_metrics():
                value = row.get(self.metric)
                if row["step"] <= state.global_step and isinstance(value, (int, float)) and math.isfinite(value):
                    self.evals[row["step"]] = float(value)
        if state.is_world_process_zero:
            for leftover in self.run_dir.checkpoints_dir.glob(f"{DELETING}*"):
                remove_tree(leftover, within=self.run_dir.path)

    def on_step_end(self, args, state, control, **kwargs):
        if validation_due(self.trainer, args, state.global_step):
            control.should_save = True  # the peak can only be kept if it was saved
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        value = (logs or {}).get(self.metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.evals[state.global_step] = float(value)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.update(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.update(state.global_step)

    # ------------------------------------------------------------------ work
    def update(self, now: int) -> Retention:
        """Select, write selected.json, then prune the checkpoints up to step ``now``."""
        on_disk = {int(p.name.rsplit("-", 1)[1]): p for p in self.run_dir.checkpoints()}
        saved = {s: p for s, p in on_disk.items() if s <= now}  # a later one is not this attempt's to judge
        evals = sorted((s, v) for s, v in self.evals.items() if s <= now)
        plan = retention(saved, evals, keep=self.keep, last=self.last, mode=self.mode, patience=self.patience)
        if plan.picks:
            self.write_selected(plan.picks[0])
        for step in plan.drop:
            _remove(saved[step], self.run_dir.path)
        return plan

    def write_selected(self, pick: Pick) -> dict[str, Any]:
        step = int(pick.step)
        record = {"rule": level_rule(self.patience, self.metric, self.mode), "metric": self.metric,
                  "mode": self.mode, "step": step, "rollout": rollout_at(step, self.trainer.per_rollout),
                  "value": pick.level, "checkpoint": f"checkpoints/checkpoint-{step}",
                  "window": [int(s) for s in pick.window]}
        atomic_write_json(self.run_dir.selected_path, record, within=self.run_dir.path)
        return record


def _remove(path: Path, run_dir: Path) -> None:
    """Rename out of the checkpoint-N names (atomic), then delete: never a half-deleted checkpoint-N,
    never one through a link (refuse_symlinks)."""
    refuse_symlinks(path, within=run_dir)
    doomed = path.with_name(f"{DELETING}{path.name}")
    try:
        path.rename(doomed)
    except OSError as exc:
        log.warning("could not prune %s: %s", path, exc)
        return
    remove_tree(doomed, within=run_dir)


def install(trainer: Any, run_dir: RunDir, keep: int) -> CheckpointKeeper | None:
    """Let a keeper own the checkpoint rotation of ``trainer`` (launch's); None when ``keep`` is 0,
    which leaves transformers' ``save_total_limit`` rotation as it is."""
    if keep <= 0:
        return None
    select = trainer.args.keep_select or DEFAULT_KEEP_SELECT
    keeper = CheckpointKeeper(trainer, run_dir, keep=keep, last=trainer.args.save_total_limit,
                              metric=select["metric"], mode=select["mode"])
    trainer.args.save_total_limit = None  # transformers rotates nothing: the keeper does
    trainer.add_callback(keeper)
    return keeper

