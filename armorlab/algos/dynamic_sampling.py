"""DAPO's dynamic sampling (Yu et al. 2025, §3.2) and verl's ``filter_groups`` refill, as pure functions.

A group whose rewards are all equal has zero advantage on every row: it contributes nothing but
a larger denominator, so dynamic sampling masks it (the trainer multiplies it into the same
per-row keep mask as the anchor gate). With an over-generation factor f the trainer samples f×
the prompt groups and keeps the first groups that train — with reward spread and, with ARMOR's
gate on, solvable by the reference — so the batch keeps its size: DAPO (§3.2) and ARMOR's
Algorithm 1 keep sampling until the batch is full. As verl's DAPO trainer, the trainer generates
batches of f× the prompts (gen_prompt_bsz) until the groups that train fill the batch on every
process, at most ``max_num_gen_batches`` of them (``merge_rounds`` joins their outputs). What they
could not fill stays in the batch, masked, and is logged as ``train/refill_shortfall`` (verl
raises instead); the batches used per step are ``train/gen_batches``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from armorlab.errors import ArmorLabError


def group_has_spread(rewards_global: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-row 1/0 over the gathered batch: 1 for rows of groups whose rewards are not all equal.

    DAPO's dynamic sampling keeps only these groups (a group with equal rewards has zero
    advantage everywhere and only dilutes the loss). NaN rewards (unscorable) are ignored; a
    group with fewer than two scored rewards has no spread.
    """
    grouped = rewards_global.view(-1, group_size)
    hi = torch.nan_to_num(grouped, nan=-math.inf).amax(dim=1)
    lo = torch.nan_to_num(grouped, nan=math.inf).amin(dim=1)
    return (hi > lo).to(rewards_global.dtype).repeat_interleave(group_size)


def refill_rows(keep_local: torch.Tensor, group_size: int, groups: int) -> torch.Tensor:
    """Row indices of ``groups`` local groups out of an over-generated batch (verl's filter_groups):
    the groups that train (``keep_local`` = 1: reward spread, past the gate) first, in generation
    order, then masked ones if too few train, so the batch keeps its shape."""
    per_group = keep_local.view(-1, group_size)[:, 0].bool()
    order = torch.cat([torch.nonzero(per_group).flatten(), torch.nonzero(~per_group).flatten()])[:groups]
    return (order.unsqueeze(1) * group_size + torch.arange(group_size, device=order.device)).flatten()


def merge_rounds(rounds: list[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """One generation output from several refill rounds (TRL's ``_generate_and_score_completions``
    dicts), rows in round order. Per-row tensors are concatenated, their token dimension padded to
    the widest round: prompts on the left (TRL left-pads them), everything else on the right, ids with
    ``pad_id``, masks and per-token values with 0 (masked out). Per-generation (total, count) stats
    (``armorlab_gen:*``) add up; other 0-d tensors are averaged over the rounds; anything else is the
    first round's."""
    out: dict[str, Any] = {}
    sizes = [r["completion_ids"].size(0) for r in rounds]
    for key, first in rounds[0].items():
        values = [r[key] for r in rounds]
        if not torch.is_tensor(first):
            out[key] = first
        elif first.dim() == 0:
            total = torch.stack(values).sum(0)
            out[key] = total if key.startswith("armorlab_gen:") else total / len(values)
        elif all(v.size(0) == n for v, n in zip(values, sizes, strict=True)):
            width = max(v.size(1) for v in values) if first.dim() == 2 else None
            fill = pad_id if key.endswith("_ids") else 0
            left = key.startswith("prompt_")
            padded = [v if width is None or v.size(1) == width else torch.nn.functional.pad(
                v, (width - v.size(1), 0) if left else (0, width - v.size(1)), value=fill) for v in values]
            out[key] = torch.cat(padded)
        else:
            out[key] = first
    return out


def extra_prompt_rows(dataset: Any, groups: int, group_size: int, seed: int) -> list[dict]:
    """``groups`` more prompts from ``dataset`` (map-style), each repeated ``group_size`` times as
    TRL's RepeatSampler lays them out, drawn by a generator seeded with ``seed`` alone: the same
    seed (run seed, step, process) draws the same prompts after a resume."""
    picks = torch.randint(len(dataset), (groups,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [dataset[i] for i in picks for _ in range(group_size)]


def check_refill_fits(local_rows: int, group_size: int, factor: int, batches: int = 1) -> None:
    """The refill selects whole groups on each process: its generation batch must hold whole groups."""
    if (factor > 1 or batches > 1) and local_rows % group_size:
        key, value = ("dynamic_sampling_factor", factor) if factor > 1 else ("max_num_gen_batches", batches)
        raise ArmorLabError(f"the refill selects whole groups per process: per_device_train_batch_size × "
                            f"steps_per_generation ({local_rows}) must be a multiple of num_generations "
                            f"({group_size})", key=key, value=value)
