"""ArmorLabTrainer's smaller hooks into TRL and transformers, kept apart from the trainer's loss
and generation glue (armorlab.train.trainer): the epoch-seeded sampler, the vLLM server client swap
and the per-step callback (validation, reference resets, token-dump flushes)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from transformers import TrainerCallback
from trl.trainer.utils import RepeatSampler

from armorlab.core.schedule import every_due, unit_count
from armorlab.train.trainer_config import ArmorLabConfig


# --------------------------------------------------------------------------- sampler
class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler whose shuffle depends only on (seed, epoch).

    Stock RepeatSampler advances one generator across epochs, so a run resumed in epoch e
    (which skips iterating epochs < e) would see another order; transformers calls
    ``set_epoch`` on the sampler before each epoch.
    """

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle:
            self.generator = torch.Generator().manual_seed((self.seed or 0) + 7919 * self.epoch)
        return super().__iter__()


def policy_server_client(args: ArmorLabConfig) -> contextlib.AbstractContextManager:
    """TRL's server mode builds armorlab's ``VLLMClient`` (TRL's own on CUDA; a file sync off it)."""
    if not (args.use_vllm and args.vllm_mode == "server"):
        return contextlib.nullcontext()
    from armorlab.vllm.env import require_vllm

    require_vllm("vllm_mode", args.vllm_mode)
    from armorlab.train.vllm_client import trl_builds_weight_sync_clients

    return trl_builds_weight_sync_clients(args)


def validation_due(trainer: Any, args: ArmorLabConfig, step: int) -> bool:
    """Whether the trainer validates at the end of optimizer step ``step`` (> 0): every ``val_every``
    units of ``step_unit`` (armorlab.core.schedule), when it has something to validate on."""
    return trainer.validator.enabled and every_due(step, args.val_every, args.step_unit, trainer.per_rollout)


class ArmorLabCallback(TrainerCallback):
    """Step-0 and periodic validation (before any reset, so the probe sees the step's π_ref),
    reference resets, token-dump flushes."""

    def __init__(self, trainer: Any) -> None:  # the ArmorLabTrainer it belongs to
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        tr = self.trainer
        tr._last_logged_step = state.global_step
        if state.global_step > 0:
            return
        logs = dict(tr.data_metrics)  # facts about the data (data/dedup_dropped), once
        if args.val_every > 0 and tr.validator.enabled:
            logs.update(tr.validator.run(0))
            if "val/acc" in logs:  # the initial π_ref is the initial policy
                logs["ref/val_acc"] = logs["val/acc"]
        if logs:
            # transformers' own log: TRL's would fold in (and clear) pending training metrics
            from transformers import Trainer

            Trainer.log(tr, logs)

    def on_step_end(self, args, state, control, **kwargs):
        tr, step = self.trainer, state.global_step
        validated: dict[str, float] = {}
        if validation_due(tr, args, step):
            validated = tr.validator.run(step)
            for name, value in validated.items():
                tr._metrics["train"][name].append(value)
            control.should_log = True
        count = unit_count(step, args.step_unit, tr.per_rollout)  # None inside a rollout (step_unit: rollout)
        if count is not None and tr.reference.due(count):
            tr.reference.reset_from(tr.accelerator.unwrap_model(tr.model), step)
            tr.sync_reference_engine()
            if tr.anchor_rollout is not None:
                tr.anchor_rollout.cache.clear()
            acc = reference_val_acc(tr, step, validated)
            if acc is not None:
                tr._metrics["train"]["ref/val_acc"].append(acc)
                control.should_log = True
        tr.token_dump.flush(step)
        return control


def reference_val_acc(trainer: Any, step: int, validated: dict[str, float]) -> float | None:
    """``ref/val_acc`` at a reset of ``step``: the new π_ref is this step's policy, so on an
    evaluation step it is the step's ``val/acc`` (same weights, same seeded samples); between
    evaluation steps a validation pass of π_ref runs only with ``ref_validate_resets``."""
    if trainer.args.val_every <= 0:
        return None
    if "val/acc" in validated:
        return validated["val/acc"]
    return trainer.validator.reference_accuracy(step) if trainer.args.ref_validate_resets else None
