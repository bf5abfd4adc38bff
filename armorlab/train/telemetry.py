"""Telemetry: KL on tensors, metric names, the run-dir metrics writer and the token dump.

Every metric the trainer computes goes through TRL's logger (so ``report_to`` backends see it)
and, via :class:`RunDirLogger`, into ``metrics.jsonl`` under the stable names of design.md:
``train/ val/ test/ obj/ anchor/ kl/ cap/ ref/``. TRL's and transformers' own keys are mapped
(``loss`` → ``train/loss``) or kept under ``trl/``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from armorlab.algos import kl
from armorlab.core.fsutil import atomic_file
from armorlab.core.schedule import rollout_at, updates_per_rollout

log = logging.getLogger(__name__)

NAMESPACES = ("train/", "val/", "test/", "obj/", "anchor/", "kl/", "cap/", "ref/", "data/")
# transformers'/TRL's own keys that have a design name; every other TRL key goes to "trl/<key>".
RENAMES = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "learning_rate": "train/learning_rate",
    "epoch": "train/epoch",
    "step_time": "train/step_time",
    "num_tokens": "train/num_tokens",
    "reward_std": "train/reward_std",
    "frac_reward_zero_std": "train/frac_reward_zero_std",
}
# the end-of-training summary transformers logs once; not a step.
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                          "total_flos", "train_loss"})


# --------------------------------------------------------------------------- KL on tensors
def sequence_kl_estimates(sample_logp: torch.Tensor, other_logp: torch.Tensor, mask: torch.Tensor,
                          names: tuple[str, ...] = ("k1", "k2", "k3")) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level KL(p‖q) estimates from sequences y ~ p: (Σ_y Σ_t k(log r_t) per estimator, #sequences).

    log r_t = log q(y_t|y<t) − log p(y_t|y<t), with ``sample_logp`` = log p (the distribution the
    sequences were SAMPLED from) and ``other_logp`` = log q; k is armorlab.algos.kl's K1–K3. By the
    chain rule E_{y~p}[Σ_t k1] = E_{y~p}[Σ_t k3] = KL(p‖q) over whole sequences; k2 is biased.
    Reverse KL KL(π_θ‖π_ref) takes π_θ's samples (sample = π_θ, other = π_ref); forward KL(π_ref‖π_θ)
    takes unconditioned π_ref samples (sample = π_ref, other = π_θ). Returned as totals (E,) and a
    count so callers can reduce across processes before dividing.
    """
    log_r = other_logp.detach().float() - sample_logp.detach().float()
    return sequence_sum_mean(torch.stack([kl.estimator(n)(log_r) for n in names]), mask.float())


def sequence_sum_mean(per_token: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ over sequences of the per-sequence token sum, number of sequences): a sequence-level KL.

    Returned as sum and count so callers can reduce across processes before dividing. Leading
    dimensions of ``per_token`` beyond (B, T) are kept: (E, B, T) gives E sums at once.
    """
    rows = (mask.sum(-1) > 0).to(per_token.dtype)
    return (per_token * mask).sum(-1) @ rows, rows.sum()


def logits_kl(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary KL(p‖q) at each position (K5 of armorlab.algos.kl on the log-softmax) → (B, T)."""
    return kl.exact_kl_from_logprobs(torch.log_softmax(logits_p.float(), dim=-1),
                                     torch.log_softmax(logits_q.float(), dim=-1))


# --------------------------------------------------------------------------- reductions
class StepStats:
    """Collect (name → sum, count) pairs and reduce them across processes in ONE collective.

    Values stay tensors (no device sync) until ``reduce``, which stacks them and reads them back
    once. A name whose global count is 0 is not logged (e.g. ``kl/forward_*`` on a generation
    without fresh reference draws).
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._values: list[Any] = []  # total, count, total, count, ... (tensors or numbers)
        self._sums: set[str] = set()

    def add(self, name: str, total: torch.Tensor | float, count: torch.Tensor | float) -> None:
        self._names.append(name)
        self._values += [total, count]

    def mean(self, name: str, value: torch.Tensor | float) -> None:
        """A value that is already a mean: averaged over processes (count 1 each)."""
        self.add(name, value, 1.0)

    def total(self, name: str, value: torch.Tensor | float) -> None:
        """A count summed over processes and logged as the sum (e.g. ``val/n``), not averaged."""
        self._sums.add(name)
        self.add(name, value, 1.0)

    def reduce(self, accelerator: Any = None) -> dict[str, float]:
        if not self._names:
            return {}
        flat = [None if torch.is_tensor(v) else float(v) for v in self._values]
        tensor_at = [i for i, v in enumerate(flat) if v is None]
        if tensor_at:  # one stack, one read-back
            tensors = [self._values[i] for i in tensor_at]
            try:
                read = torch.stack(tensors).detach().float().tolist()
            except RuntimeError:  # mixed dtypes or shapes: normalise each first
                read = torch.stack([t.detach().reshape(()).float() for t in tensors]).tolist()
            for i, value in zip(tensor_at, read, strict=True):
                flat[i] = value
        if accelerator is not None and getattr(accelerator, "num_processes", 1) > 1:
            flat = accelerator.reduce(torch.tensor(flat, device=accelerator.device), reduction="sum").tolist()
        sums: dict[str, list[float]] = {}
        for i, name in enumerate(self._names):  # a name added twice accumulates
            acc = sums.setdefault(name, [0.0, 0.0])
            acc[0] += flat[2 * i]
            acc[1] += flat[2 * i + 1]
        return {name: total if name in self._sums else total / count
                for name, (total, count) in sums.items() if count > 0}


# --------------------------------------------------------------------------- names
def design_names(logs: Mapping[str, Any]) -> dict[str, float]:
    """Map one transformers/TRL log dict to metrics.jsonl names.

    None (TRL's "no valid value this step", e.g. ``cap/pos_mean`` without positive advantages)
    becomes NaN, which metrics.jsonl stores as null: the key is there, its value undefined.
    Non-numbers are dropped.
    """
    out: dict[str, float] = {}
    for key, value in logs.items():
        if value is None:
            value = math.nan
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.startswith(NAMESPACES):
            name = key
        elif key in RENAMES:
            name = RENAMES[key]
        else:
            name = f"trl/{key}"
        out[name] = float(value)
    return out


class RunDirLogger(TrainerCallback):
    """Writes each log of the main process as one metrics.jsonl line ``{"step": N, "rollout": R, ...}``:
    both counters, optimizer steps and rollouts (armorlab.core.schedule.rollout_at: the rollout
    whose updates the step belongs to; 0 at step 0)."""

    def __init__(self, run_dir: Any) -> None:
        self.run_dir = run_dir

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or SUMMARY_KEYS & set(logs):
            return
        metrics = design_names(logs)
        if metrics:
            per = updates_per_rollout(args.steps_per_generation, args.num_iterations, args.gradient_accumulation_steps)
            self.run_dir.append_metrics(state.global_step, metrics, rollout=rollout_at(state.global_step, per))


# --------------------------------------------------------------------------- token dump
class TokenDump:
    """Samples a share of the loss tokens each step and writes them to ``tokens/`` as parquet.

    One file per optimizer step and process (``step-000012-r0.parquet``), written atomically; a
    resumed run rewrites the files of the steps it repeats instead of duplicating them. The
    sample uses its own generator seeded by (seed, step, micro-batch), so the dump never moves
    the training RNG.
    """

    COLUMNS = ("step", "group", "position", "token_id", "logp", "old_logp", "ref_logp", "advantage", "is_anchor")

    def __init__(self, directory: str | os.PathLike, rate: float, *, seed: int, process_index: int = 0) -> None:
        self.directory = Path(directory)
        self.rate = float(rate)
        self.seed = int(seed)
        self.process_index = int(process_index)
        self._rows: dict[str, list] = {c: [] for c in self.COLUMNS}
        self._micro = 0

    def record(self, step: int, *, token_ids: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor,
               ref_logp: torch.Tensor | None, advantages: torch.Tensor, is_anchor: torch.Tensor | None,
               mask: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """One micro-batch: ``groups`` (B,) are the prompt-group ids (``armorlab_group``); the
        log-probs are the raw π_θ, π_old and π_ref of each token."""
        if self.rate <= 0:
            return
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 1_009 + self._micro)
        self._micro += 1
        keep = (torch.rand(mask.shape, generator=gen) < self.rate) & mask.detach().cpu().bool()
        rows, cols = keep.nonzero(as_tuple=True)
        if rows.numel() == 0:
            return
        adv = advantages.detach().cpu().reshape(advantages.shape[0], -1)
        nan = torch.full(mask.shape, math.nan)
        cols_data = {
            "step": [step] * rows.numel(),
            "group": (rows if groups is None else groups.detach().cpu()[rows]).tolist(),
            "position": cols.tolist(),
            "token_id": token_ids.detach().cpu()[rows, cols].tolist(),
            "logp": logp.detach().float().cpu()[rows, cols].tolist(),
            "old_logp": old_logp.detach().float().cpu()[rows, cols].tolist(),
            "ref_logp": (nan if ref_logp is None else ref_logp.detach().float().cpu())[rows, cols].tolist(),
            "advantage": adv[rows, 0 if adv.shape[1] == 1 else cols].float().tolist(),
            "is_anchor": ([False] * rows.numel() if is_anchor is None
                          else is_anchor.detach().cpu().bool()[rows].tolist()),
        }
        for c in self.COLUMNS:
            self._rows[c].extend(cols_data[c])

    def flush(self, step: int) -> Path | None:
        """Write the rows recorded since the last flush as this step's file."""
        self._micro = 0
        if not self._rows["step"]:
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: self._rows[c] for c in self.COLUMNS})
        self._rows = {c: [] for c in self.COLUMNS}
        path = self.directory / f"step-{step:06d}-r{self.process_index}.parquet"
        with atomic_file(path) as tmp:
            pq.write_table(table, tmp)
        return path
