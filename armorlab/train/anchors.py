"""Anchor rollout (ARMOR Eq. 3, Algorithm 1): reference sampling, rejection, gate and cache.

For each prompt group of G completions the frozen reference π_ref draws up to k samples. With
``anchor_filter="correct"`` the first one whose reward reaches the threshold becomes the group's
*anchor*; with ``"any"`` the first sample does (the unfiltered control). The draws are *adaptive*
rejection sampling: one sample for every prompt that needs an anchor, then more only for the
prompts still without a correct one, in rounds of 1, 1, 2, 4, ... samples (at most k in all, at
most ⌈log2 k⌉ + 1 rounds), so a prompt costs ≈ (1 − (1−p)^k)/p draws at success rate p instead of
k, and the anchor is still the first correct sample of the same sequence of draws. The anchor replaces one
of the G on-policy completions before rewards and advantages are computed, so each group holds
G−1 on-policy samples plus one anchor. The *gate* (Algorithm 1 line 13) removes groups whose
reference found no correct sample from the loss.

Reference draws are cached per prompt (sha256 of the prompt text) for as long as π_ref stays
the same: a prompt that recurs within one reference window costs no new samples; on reuse a
random correct sample (any sample for ``"any"``) is picked. The cache is cleared on reset.

Sampling goes through :class:`ReferenceSampler`, which knows nothing about transformers: it maps
prompt token ids to completions, so a vLLM sampler can replace :class:`TransformersSampler`.

Ranks in step: where π_ref's forward is a collective (FSDP, ZeRO-3: every process must run the same
number of forwards), a ``sync`` function (:func:`max_over_processes`) makes every process run the
same rounds — they continue while ANY process still has a prompt to draw for — and the same
number of ``generate`` calls per round (a process with fewer rows, or none because its prompts
are all cached, generates a one-token dummy batch), so no process waits for one that skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from armorlab.algos.objectives import log_mixture, objective_spec
from armorlab.core.config import ANCHOR_RATIOS

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- sampler seam
@dataclass(frozen=True)
class Completion:
    """One sampled completion: its token ids (up to and including the first eos) and its text."""

    ids: tuple[int, ...]
    text: str


@runtime_checkable
class ReferenceSampler(Protocol):
    """Draws k completions per prompt from the reference policy."""

    def sample(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[Completion]]:
        """``prompt_ids[i]`` → ``k`` completions for prompt i (same generation settings as the policy)."""
        ...


Sync = Callable[[int], int]  # a process's count → the largest count over all processes (a collective)


def max_over_processes(value: int, device: Any = None) -> int:
    """The largest ``value`` over the processes of the default group (an all-reduce; every process
    must call it). Without torch.distributed (one process) it is ``value``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return int(value)
    t = torch.tensor([int(value)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def process_syncs(num_processes: int, device: Any, sharded: bool) -> tuple[Sync | None, Sync | None]:
    """(max over processes, the same where the models' forwards are collectives), for a trainer.

    Under FSDP and ZeRO-3 (``sharded``) a forward gathers parameters from every process, so
    armorlab's own generation and probe forwards must come in equal numbers on every process;
    DDP's forward is local. None in a single process.
    """
    if num_processes == 1:
        return None, None
    import functools

    max_fn = functools.partial(max_over_processes, device=device)
    return max_fn, (max_fn if sharded else None)


class TransformersSampler:
    """:class:`ReferenceSampler` on a transformers model with ``generate``, in chunks of
    ``batch_size`` rows (left-padded), so the KV cache of one call is one chunk's.

    ``model`` is read at every call, so resetting its weights in place takes effect at once.
    With ``sync`` (the model's forward is a collective), every process makes the same number of
    ``generate`` calls: the largest count over processes, padded with a one-row dummy batch.
    """

    def __init__(self, model: Any, tokenizer: Any, generation_config: Any, eos_token_ids: Sequence[int],
                 *, batch_size: int = 8, sync: Sync | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation_config = generation_config
        self.eos_token_ids = list(eos_token_ids)
        self.batch_size = max(1, int(batch_size))
        self.sync = sync
        self.generate_calls = 0

    @property
    def collective(self) -> bool:
        return self.sync is not None

    @torch.no_grad()
    def sample(self, prompt_ids: Sequence[Sequence[int]], k: int) -> list[list[Completion]]:
        rows = [list(p) for p in prompt_ids for _ in range(k)]
        chunks = [rows[start:start + self.batch_size] for start in range(0, len(rows), self.batch_size)]
        calls = len(chunks) if self.sync is None else self.sync(len(chunks))
        out_ids: list[list[int]] = []
        for chunk in chunks:
            out_ids.extend(self._generate(chunk))
        dummy = [[self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]]]
        for _ in range(calls - len(chunks)):  # this process has fewer rows: keep the others' forwards company
            self._generate(dummy)
        if not out_ids:
            return [[] for _ in prompt_ids]
        texts = self.tokenizer.batch_decode(out_ids, skip_special_tokens=True)
        flat = [Completion(tuple(ids), text) for ids, text in zip(out_ids, texts, strict=True)]
        return [flat[i * k:(i + 1) * k] for i in range(len(prompt_ids))]

    def _generate(self, rows: list[list[int]]) -> list[list[int]]:
        device = next(self.model.parameters()).device
        width = max(len(r) for r in rows)
        pad_id = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(input_ids=input_ids, attention_mask=attention,
                                      generation_config=self.generation_config)
        finally:
            self.model.train(was_training)
        self.generate_calls += 1
        return [cut_at_eos(row.tolist(), self.eos_token_ids) for row in out[:, width:].cpu()]


def cut_at_eos(ids: list[int], eos_token_ids: Sequence[int]) -> list[int]:
    """Tokens up to and including the first eos (what TRL keeps of a policy completion)."""
    for i, tok in enumerate(ids):
        if tok in eos_token_ids:
            return ids[:i + 1]
    return ids


def pack_rows(rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int,
              device: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, completion_mask) for (prompt ids, completion ids) pairs.

    Left-padded prompt + right-padded completion: the layout TRL scores log-probs with, so
    teacher-forced passes over reference draws see the same conditionals as the policy's rows.
    The completion occupies the last ``completion_mask.size(1)`` columns.
    """
    width_p = max(len(p) for p, _ in rows)
    width_c = max(len(c) for _, c in rows)
    ids = torch.tensor([[pad_token_id] * (width_p - len(p)) + list(p) + list(c) + [pad_token_id] * (width_c - len(c))
                        for p, c in rows], device=device)
    att = torch.tensor([[0] * (width_p - len(p)) + [1] * (len(p) + len(c)) + [0] * (width_c - len(c))
                        for p, c in rows], device=device)
    comp_mask = torch.tensor([[1] * len(c) + [0] * (width_c - len(c)) for _, c in rows], device=device)
    return ids, att, comp_mask


# --------------------------------------------------------------------------- cache
def prompt_key(prompt: Any) -> str:
    """sha256 of the prompt text (conversational prompts: of their canonical JSON)."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class ReferenceDraw:
    """The k reference samples of one prompt and their rewards."""

    samples: list[Completion]
    rewards: list[float]

    def correct(self, threshold: float) -> list[int]:
        return [i for i, r in enumerate(self.rewards) if r >= threshold]


class AnchorCache:
    """Reference draws per prompt key, valid until the next reference reset."""

    def __init__(self) -> None:
        self._draws: dict[str, ReferenceDraw] = {}

    def __len__(self) -> int:
        return len(self._draws)

    def __contains__(self, key: str) -> bool:
        return key in self._draws

    def get(self, key: str) -> ReferenceDraw | None:
        return self._draws.get(key)

    def put(self, key: str, draw: ReferenceDraw) -> None:
        self._draws[key] = draw

    def clear(self) -> None:
        self._draws.clear()

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: {key: {"ids": [[...]], "texts": [...], "rewards": [...]}}."""
        return {key: {"ids": [list(s.ids) for s in d.samples], "texts": [s.text for s in d.samples],
                      "rewards": list(d.rewards)} for key, d in self._draws.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._draws = {
            key: ReferenceDraw([Completion(tuple(i), t) for i, t in zip(v["ids"], v["texts"], strict=True)],
                               [float(r) for r in v["rewards"]])
            for key, v in state.items()
        }


# --------------------------------------------------------------------------- rollout
def pick_anchor(draw: ReferenceDraw, *, anchor_filter: str, threshold: float, fresh: bool,
                rng: random.Random) -> int | None:
    """Index of the anchor in ``draw``, or None.

    Fresh draws keep the first qualifying sample (rejection sampling stops at the first success);
    a cached draw is reused with a random qualifying sample so repeats do not pin one anchor.
    """
    if anchor_filter == "correct":
        candidates = draw.correct(threshold)
    elif anchor_filter == "any":
        candidates = list(range(len(draw.samples)))
    else:
        raise ValueError(f"anchor_filter must be 'correct' or 'any', got {anchor_filter!r}")
    if not candidates:
        return None
    return candidates[0] if fresh else rng.choice(candidates)


@dataclass(frozen=True)
class GroupRequest:
    """One prompt group to anchor: the prompt, its token ids and its dataset row (reward kwargs)."""

    prompt: Any
    prompt_ids: Sequence[int]
    row: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupOutcome:
    anchor: Completion | None   # the completion to inject, None when there is none
    reward: float | None        # its reward
    solvable: bool              # the reference found at least one correct sample
    cached: bool                # the draw came from the cache
    fresh: tuple[Completion, ...] = ()  # the first draw when sampled now (an unconditioned π_ref sample), else ()


# score(requests, completions) -> rewards, completions[i] holding the k samples of requests[i]
ScoreFn = Callable[[Sequence[GroupRequest], Sequence[Sequence[Completion]]], list[list[float]]]


def round_sizes(k: int) -> list[int]:
    """Samples per pending prompt in each round of adaptive rejection sampling: 1, 1, 2, 4, ...
    (each round doubles what was drawn so far), the last one cut so they sum to k."""
    sizes, drawn = [], 0
    while drawn < k:
        size = min(max(drawn, 1), k - drawn)
        sizes.append(size)
        drawn += size
    return sizes


class AnchorRollout:
    """Draws (or reuses) reference samples for a batch of groups and picks their anchors.

    ``sync`` (see :func:`max_over_processes`): the sampler's forwards are collectives, so every
    process runs the same rounds and calls the sampler in each, also with nothing to draw.
    """

    def __init__(self, sampler: ReferenceSampler, score: ScoreFn, *, k: int, anchor_filter: str,
                 threshold: float, cache: AnchorCache | None = None, sync: Sync | None = None) -> None:
        self.sampler, self.score = sampler, score
        self.k, self.anchor_filter, self.threshold = int(k), anchor_filter, float(threshold)
        self.cache = cache if cache is not None else AnchorCache()
        self.sync = sync
        self.rounds = 0  # sampling rounds run so far (each one sampler call)

    def _done(self, draw: ReferenceDraw) -> bool:
        """Whether a prompt needs no more draws: it has its anchor (any sample for ``"any"``)."""
        return bool(draw.samples) if self.anchor_filter == "any" else bool(draw.correct(self.threshold))

    def draw(self, requests: Sequence[GroupRequest]) -> tuple[list[ReferenceDraw], list[Completion | None]]:
        """Adaptive rejection sampling for ``requests`` (distinct prompts): their draws (up to k
        samples each, stopping at the first that qualifies) and each one's first sample."""
        draws = [ReferenceDraw([], []) for _ in requests]
        pending = list(range(len(requests)))
        sizes = round_sizes(1 if self.anchor_filter == "any" else self.k)
        for size in sizes:
            busy = len(pending) if self.sync is None else self.sync(len(pending))
            if not busy:
                break
            todo = [requests[i] for i in pending]
            samples = self.sampler.sample([r.prompt_ids for r in todo], size)
            rewards = self.score(todo, samples) if todo else []
            self.rounds += 1
            for i, s, r in zip(pending, samples, rewards, strict=True):
                draws[i].samples.extend(s)
                draws[i].rewards.extend(float(x) for x in r)
            pending = [i for i in pending if not self._done(draws[i])]
        return draws, [d.samples[0] if d.samples else None for d in draws]

    def run(self, requests: Sequence[GroupRequest], *, seed: int, step: int) -> tuple[list[GroupOutcome], int]:
        """Outcomes per request and the number of reference samples generated now."""
        keys = [prompt_key(r.prompt) for r in requests]
        first_of: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key not in self.cache and key not in first_of:
                first_of[key] = i
        firsts: dict[str, Completion | None] = {}
        generated = 0
        if first_of or self.sync is not None:  # with sync every process samples, also with nothing to draw
            draws, first = self.draw([requests[i] for i in first_of.values()])
            for key, d, f in zip(first_of, draws, first, strict=True):
                self.cache.put(key, d)
                firsts[key] = f
                generated += len(d.samples)
        outcomes = []
        for i, key in enumerate(keys):
            draw = self.cache.get(key)
            fresh = first_of.get(key) == i
            # A per-(seed, step, prompt) stream: reproducible, resume-safe, independent of batch order.
            rng = random.Random(f"{seed}:{step}:{key}")
            idx = pick_anchor(draw, anchor_filter=self.anchor_filter, threshold=self.threshold,
                              fresh=fresh, rng=rng)
            outcomes.append(GroupOutcome(
                anchor=None if idx is None else draw.samples[idx],
                reward=None if idx is None else draw.rewards[idx],
                solvable=bool(draw.correct(self.threshold)),
                cached=not fresh,
                fresh=(firsts[key],) if fresh and firsts.get(key) is not None else (),
            ))
        return outcomes, generated


def forward_kl_rows(requests: Sequence[GroupRequest], outcomes: Sequence[GroupOutcome], limit: int,
                    rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of reference draws to estimate KL(π_ref‖π_θ) on, at most ``limit``.

    Only FRESH draws, and of each prompt only its FIRST draw: every prompt that is sampled gets
    one, whatever the rewards, so those are unconditioned samples of π_ref, independent of π_θ
    (the later rounds of the adaptive rejection draw only for prompts that failed so far, which
    would weight hard prompts up). A cached draw is not: the policy has since trained on the
    anchor picked from it, which raises log π_θ on exactly that sample and would bias the
    estimate down. Anchors themselves are reward-filtered samples (π_ref | correct), so they
    estimate neither direction. A uniform subsample keeps the estimate unbiased.
    """
    rows = [(list(req.prompt_ids), list(c.ids)) for req, out in zip(requests, outcomes, strict=True)
            for c in out.fresh if c.ids]
    if len(rows) > limit:
        rows = [rows[i] for i in sorted(rng.sample(range(len(rows)), limit))]
    return rows


def gate_success(rewards: torch.Tensor, is_anchor: torch.Tensor, solvable: torch.Tensor, group_size: int,
                 threshold: float) -> dict[str, tuple[float, float]]:
    """How hard the gate's dropped queries are for the policy: (successes, rows) on each side.

    Over the gathered generation batch (N,): the policy's own on-policy rows (anchors excluded,
    unscored rows too) with reward ≥ ``threshold``, split by whether the reference solved the
    group (kept by the gate) or not (dropped, or dropped if the gate were on). ``solvable`` is
    laid out as for :func:`group_keep`.
    """
    keep = group_keep(solvable, group_size)
    scored = (~is_anchor.bool() & ~rewards.isnan()).float()
    success = (torch.nan_to_num(rewards, nan=-math.inf) >= threshold).float()
    return {"anchor/gate_keep_success": (float(success @ (scored * keep)), float(scored @ keep)),
            "anchor/gate_drop_success": (float(success @ (scored * (1 - keep))), float(scored @ (1 - keep)))}


# --------------------------------------------------------------------------- groups across processes
def anchor_rows(num_local_rows: int, process_index: int, group_size: int) -> list[int]:
    """Local row indices that carry their group's anchor: the LAST row of each group.

    Rows are laid out as consecutive groups of G over the concatenation of all processes'
    batches (TRL's RepeatSampler), so a group may straddle two processes; exactly one of them
    owns the group's last row and samples its anchor.
    """
    offset = process_index * num_local_rows
    return [i for i in range(num_local_rows) if (offset + i) % group_size == group_size - 1]


def group_keep(solvable_global: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-row gate mask over the gathered batch: 1 for rows of solvable groups, else 0.

    ``solvable_global`` is (N,) with 1/0 on each group's anchor row and NaN elsewhere.
    """
    grouped = solvable_global.view(-1, group_size)
    ok = torch.nan_to_num(grouped, nan=0.0).amax(dim=1)
    return ok.repeat_interleave(group_size)


# --------------------------------------------------------------------------- ratio on anchor rows
def anchor_ratio_inputs(objective: str, anchor_ratio: str | None, logp: torch.Tensor, old_logp: torch.Tensor,
                        ref_logp: torch.Tensor | None, is_anchor: torch.Tensor | None,
                        alpha: float | None) -> tuple[torch.Tensor, torch.Tensor, float | torch.Tensor]:
    """(logp, old_logp, alpha) to hand to ``policy_loss`` so anchor rows get the configured ratio.

    On-policy rows always keep the objective's own ratio (r_mix for ``armor``, π_θ/π_old for the
    rest). Anchor rows, per ``anchor_ratio``:
    - ``mixed``: r_mix with α. For ``armor`` that is what its other rows use; for the other
      objectives the anchor rows see the mixture α·π + (1−α)·π_ref in place of π_θ and π_old,
      i.e. their ratio becomes r_mix while the objective's surrogate stays the same.
    - ``behavior``: π_θ/π_ref, the importance ratio w.r.t. the policy that really sampled the
      anchor (old_logp := ref_logp and α := 1 on those rows).
    - ``current``: π_θ/π_old, as if π_old had sampled the anchor (α := 1 on those rows).
    """
    armor = objective_spec(objective).uses_reference  # its own rows use r_mix with α
    if is_anchor is None or anchor_ratio is None or not bool(is_anchor.any()):
        return logp, old_logp, alpha if armor else 1.0
    if anchor_ratio not in ANCHOR_RATIOS:
        raise ValueError(f"anchor_ratio must be one of {ANCHOR_RATIOS}, got {anchor_ratio!r}")
    if ref_logp is None:
        raise ValueError("anchor rows need ref_logp")
    rows = is_anchor.to(torch.bool).unsqueeze(1)
    if anchor_ratio == "behavior":
        old_logp = torch.where(rows, ref_logp, old_logp)
    if armor:
        anchor_alpha = alpha if anchor_ratio == "mixed" else 1.0
        per_row = torch.where(rows, torch.tensor(anchor_alpha, dtype=logp.dtype, device=logp.device),
                              torch.tensor(alpha, dtype=logp.dtype, device=logp.device))
        return logp, old_logp, per_row
    if anchor_ratio == "mixed":
        logp = torch.where(rows, log_mixture(logp, ref_logp, alpha), logp)
        old_logp = torch.where(rows, log_mixture(old_logp, ref_logp, alpha), old_logp)
    return logp, old_logp, 1.0
