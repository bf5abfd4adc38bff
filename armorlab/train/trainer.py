"""``ArmorLabTrainer(GRPOTrainer)``: thin glue on TRL's hooks (its config, ``ArmorLabConfig``, lives
in trainer_config.py and is re-exported here).

TRL does the generation, rewards, advantages, batching and optimisation; this subclass only

- ``_generate``: swaps one on-policy completion per group for a reference *anchor* (anchors.py)
  before TRL scores it, so rewards and advantages see G−1 on-policy samples + 1 anchor;
- ``_calculate_rewards``: remembers the rewards it returns (per-step ``train/reward``);
- ``_generate_and_score_completions``: adds per-row tensors (first dim B, so they survive TRL's
  shuffle/split over ``steps_per_generation``): ``ref_per_token_logps`` also at β = 0,
  ``armorlab_is_anchor``, ``armorlab_keep`` (the gate and dynamic sampling), ``armorlab_group``,
  rewards, lengths, and per-generation metrics as 0-d tensors: ``kl/forward_*`` on the
  unconditioned reference draws behind the anchors (``anchors.forward_kl_rows``), the gate's
  kept/dropped success rates and ``train/zero_var_frac``; with ``dynamic_sampling_factor`` > 1 it
  over-generates and keeps the first groups that train — reward spread and past the gate (verl's
  filter_groups; ARMOR's Alg. 1 samples until the batch is full) — and logs the rows it could not
  fill (``train/refill_shortfall``);
- ``_prepare_inputs``: after TRL's split, π_old of a generation's later micro-batches (the first
  one's π_old is π_θ: no forward);
- ``_compute_loss``: ``armorlab.algos.loss.policy_loss`` (+ TRL's β·k3 KL term when β ≠ 0) and
  the per-step telemetry;
- ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: π_ref, the anchor cache and TRL's
  generation buffer, so a resumed run continues exactly;
- ``_get_train_sampler``: TRL's RepeatSampler with an epoch-seeded shuffle (exact resume in any epoch);
  it, the vLLM server client swap and the per-step callback live in trainer_hooks.py.

Anchor rows and the importance ratio (``anchor_ratio``): on-policy rows keep the objective's own
ratio (r_mix for ``armor``, π_θ/π_old otherwise); anchor rows use r_mix with α (``mixed``, the
paper), π_θ/π_ref (``behavior``) or π_θ/π_old (``current``); see ``anchors.anchor_ratio_inputs``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import is_peft_model
from torch import nn
from transformers import GenerationConfig
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation
from trl.trainer.utils import add_fused_lm_head, is_async_callable, nanmax, nanmin

from armorlab.algos import dynamic_sampling as dyn
from armorlab.algos import kl
from armorlab.algos.advantages import group_advantages
from armorlab.algos.entropy import applied_entropy_coef, entropy_bonus, next_entropy_coef
from armorlab.algos.loss import (
    AGGREGATION_UNIT,
    LossOutput,
    capacity_summary,
    objective_params,
    policy_loss,
    probability_capacity,
    vllm_corrected_loss,
    vllm_is_ratio,
)
from armorlab.algos.objectives import objective_spec
from armorlab.core.config import default_anchor_cache
from armorlab.core.schedule import rollout_horizon, updates_per_rollout
from armorlab.errors import ArmorLabError
from armorlab.train import anchors as anc
from armorlab.train.evaluation import Validator
from armorlab.train.hooks import ArmorLabCallback, EpochSeededRepeatSampler, policy_server_client
from armorlab.train.mechanism_telemetry import gradient_shares, rollout_diversity, share_sums, token_gradient
from armorlab.train.reference import (
    ReferencePolicy,
    build_reference_model,
    fsdp2_reference_kwargs,
    reference_needed,
    reference_scored,
    reference_trains,
    shard_per_layer,
    telemetry_generation,
)
from armorlab.train.telemetry import StepStats, TokenDump, sequence_kl_estimates
from armorlab.train.trainer_config import ArmorLabConfig

STATE_FILE = "armorlab_state.json"
# Per-generation metrics ride in the batch as 0-d tensors "<prefix><name>:total" / ":count", which
# TRL's shuffle/split hands unchanged to every step of the generation.
GENERATION_STAT = "armorlab_gen:"
# TRL's statistics of its vLLM importance-sampling correction, recomputed on the rows that train
VLLM_IS_METRICS = ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                   "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                   "sampling/importance_sampling_ratio/max")


@dataclass(frozen=True)
class StepRecord:
    """What one micro-batch's loss computation hands to the telemetry (``_record``)."""

    inputs: dict[str, Any]       # the micro-batch as TRL prepared it, with armorlab's per-row tensors
    out: LossOutput              # policy_loss's loss, per-token loss and metrics
    logp: torch.Tensor           # (B, T) log π_θ
    old: torch.Tensor            # (B, T) log π_old
    ratio_old: torch.Tensor      # (B, T) the denominator the objective used (π_ref on behaviour-ratio anchor rows)
    ref: torch.Tensor | None     # (B, T) log π_ref
    adv: torch.Tensor            # (B,) advantages
    mask: torch.Tensor           # (B, T) tokens that train (gated and dropped rows excluded)
    token_mask: torch.Tensor     # (B, T) completion tokens
    entropy: torch.Tensor        # (B, T)
    is_anchor: torch.Tensor      # (B,) bool
    alpha: Any                   # α as policy_loss got it (a float or per-row (B, 1))


class NonFiniteLossError(RuntimeError):
    """The loss became NaN/inf; raised before the backward pass so the weights stay finite."""

    def __init__(self, step: int) -> None:
        super().__init__(f"non-finite loss at step {step}")
        self.step = step


# --------------------------------------------------------------------------- trainer
class ArmorLabTrainer(GRPOTrainer):
    """GRPOTrainer training any armorlab objective, with anchors, reference resets and telemetry.

    Extra keyword arguments: ``val_dataset`` / ``test_dataset`` (columns ``prompt`` + reward
    kwargs) for ``val/*`` and ``test/*``; ``eval_sets`` (name → tasks.mathfile.EvalSet) for the named
    held-out sets' ``val/<name>/*`` / ``test/<name>/*``; ``data_metrics`` logged once at step 0
    (``data/dedup_dropped``); ``reference_sampler`` to replace the transformers
    sampler of π_ref (the vLLM seam); ``tokens_dir`` for the token dump (default
    ``<output_dir>/tokens``).
    """

    _tag_names = ["trl", "grpo", "armorlab"]
    # generations whose fresh reference draws are scored for kl/forward_* (two no-grad forwards, policy
    # and π_ref, on each fresh prompt's first draw): every (1/share)-th, the first included; 0 = off
    forward_kl_share = 0.125
    # share of the rows whose π_ref log-probs are computed for kl/reverse_* alone (dapo/grpo/up at
    # β = 0 without anchors: nothing else reads them), as whole generations (_reference_scored); 0 = off.
    # Whole generations rather than a share of each: one forward in 8 instead of 8 small ones, so the
    # fixed cost of a forward (under FSDP: gathering every parameter) is paid 8× less
    reverse_kl_share = 0.125
    # with over-generation (dynamic_sampling_factor > 1), π_old's and π_ref's log-probs are computed
    # after the filter, on the rows that train (verl's order), not on every row drawn; False: before
    score_after_filter = True

    def __init__(self, model: Any, reward_funcs: Any, args: ArmorLabConfig, *, val_dataset: Any = None,
                 test_dataset: Any = None, reference_sampler: anc.ReferenceSampler | None = None,
                 tokens_dir: str | os.PathLike | None = None, reference_from: str | None = None,
                 eval_sets: Any = None, data_metrics: dict[str, float] | None = None, **kwargs: Any) -> None:
        if not isinstance(args, ArmorLabConfig):
            raise TypeError("ArmorLabTrainer needs an ArmorLabConfig")
        # before TRL patches the policy's forward; none when nothing reads π_ref (reference_needed);
        # ``reference_from``: weights of π_ref's own (config ref_from) instead of the policy's
        ref_model = build_reference_model(model if reference_from is None else reference_from, args) \
            if reference_needed(args, val_dataset is not None) else None
        # With β ≠ 0 TRL would load a reference of its own, which this one replaces: a third model
        # in memory. TRL decides from args.beta alone (PEFT aside: it then uses a "ref" adapter).
        beta = args.beta
        own_reference_only = beta != 0.0 and kwargs.get("peft_config") is None and not is_peft_model(model)
        if own_reference_only:
            args.beta = 0.0
        try:
            with policy_server_client(args):
                super().__init__(model, reward_funcs, args=args, **kwargs)
        finally:
            args.beta = beta
        self.beta = beta
        if self.use_vllm and self.vllm_mode == "colocate" and self.accelerator.device.type == "cpu":
            from armorlab.train.vllm_reference import reload_policy_sync

            reload_policy_sync(self.vllm_generation)
        # optimizer steps per rollout: what step_unit: rollout counts in (armorlab.core.schedule)
        self.per_rollout = updates_per_rollout(args.steps_per_generation, args.num_iterations,
                                               args.gradient_accumulation_steps)
        self._check_supported(val_dataset is not None or test_dataset is not None)
        self.reference = ReferencePolicy(None if ref_model is None else self._prepare_reference(ref_model),
                                         ref_reset_steps=args.ref_reset_steps, schedule=args.ref_reset_schedule)
        self.ref_model = self.reference.model  # TRL's β·KL path uses it too
        self.reference_from = reference_from  # π_ref's own start (config ref_from), else None
        self.armorlab_generation_config = self._generation_config()
        self.max_over_processes, self.collective_sync = self._process_syncs()
        if reference_sampler is None and args.ref_vllm_mode == "colocate":
            from armorlab.train.vllm_reference import build_for_trainer

            reference_sampler = build_for_trainer(self)
        elif reference_sampler is None and args.ref_vllm_mode == "server":
            from armorlab.train.vllm_reference import build_server_sampler

            reference_sampler = build_server_sampler(self)
        if reference_sampler is None and self.ref_model is not None:
            reference_sampler = anc.TransformersSampler(
                self.ref_model, self._tokenizer, self.armorlab_generation_config, self.eos_token_ids,
                batch_size=args.per_device_eval_batch_size, sync=self.collective_sync,
                per_prompt=args.anchor_rounds != "adaptive")
        self.reference_sampler = reference_sampler
        self.anchor_rollout = None
        # off: every rollout draws afresh; window: draws are reused until π_ref resets
        self.anchor_cache = args.anchor_cache or default_anchor_cache(args.ref_reset_steps, args.ref_reset_schedule)
        if args.anchor or args.anchor_gate:
            collective = getattr(self.reference_sampler, "collective", False)
            self.anchor_rollout = anc.AnchorRollout(
                self.reference_sampler, self._score_groups, k=args.anchor_samples,
                anchor_filter=args.anchor_filter, threshold=args.anchor_reward_threshold,
                sync=self.max_over_processes if collective else None, adaptive=args.anchor_rounds == "adaptive",
                # a sampler running beside the policy's generation runs in a side thread: no collectives there
                share=anc.all_processes if self.accelerator.num_processes > 1
                and not getattr(self.reference_sampler, "concurrent", False) else None)
        self._anchor_thread = None  # anchors drawn beside the policy's generation (a server sampler)
        self.validator = Validator(self, {"val": val_dataset, "test": test_dataset}, k=args.val_samples,
                                   temperature=args.val_temperature, greedy=args.val_greedy,
                                   threshold=args.anchor_reward_threshold,
                                   probe_prompts=args.kl_probe_prompts, score=self._reward_values,
                                   eval_sets=eval_sets)
        self.data_metrics = dict(data_metrics or {})
        self.token_dump = TokenDump(tokens_dir or Path(args.output_dir) / "tokens", args.token_sample_rate,
                                    seed=args.seed, process_index=self.accelerator.process_index)
        self._rollout_inputs: list[dict] | None = None
        self._rollout_marks: dict[str, Any] | None = None
        self._rewards_gathered: torch.Tensor | None = None
        self._deferred: list[str] | None = None  # log-probs put off until the filter (_score_kept)
        self._old_pending = False  # π_old put off until TRL has split the generation (_prepare_inputs)
        self._defer_ref = False  # π_ref too is put off until the filter (an over-generated rollout)
        self._ref_samples_pending = 0.0
        self._last_logged_step = 0
        self._share_sums: torch.Tensor | None = None  # the gradient shares' sums over a step's micro-batches
        self.add_callback(ArmorLabCallback(self))

    # ------------------------------------------------------------------ set-up helpers
    def _check_supported(self, validating: bool) -> None:
        for f in self.reward_funcs if (self.args.anchor or self.args.anchor_gate or validating) else ():
            if isinstance(f, nn.Module) or is_async_callable(f):
                raise ArmorLabError("anchors and validation score with plain (sync) reward functions; "
                                    "reward models and async reward functions are not supported",
                                    key="reward_funcs", value=getattr(f, "__name__", type(f).__name__))
        resets = self.args.ref_reset_steps or self.args.ref_reset_schedule
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if resets and self.is_deepspeed_enabled and getattr(plugin, "zero_stage", 0) == 3:
            # not gathered by reference.full_state_dict, and DeepSpeed is untested here
            raise ArmorLabError("reference resets are not supported with DeepSpeed ZeRO-3 (use FSDP)",
                                key="ref_reset_steps", value=self.args.ref_reset_steps)
        if resets and is_peft_model(self.model):
            # π_ref is the base model; copying an adapter-wrapped state into it is not defined
            raise ArmorLabError("reference resets are not supported with a PEFT adapter",
                                key="ref_reset_steps", value=self.args.ref_reset_steps)
        self._check_units()
        objective_params(self.args.objective, {k: getattr(self.args, k, None)  # dro_beta unset: fail now
                                               for k in objective_spec(self.args.objective).params})
        if self.args.objective == "vespo" and self._vllm_corrects:
            # TRL folds the sampler's ratio into VESPO's sequence weight instead of scaling the loss
            raise ArmorLabError("vespo with vLLM's importance-sampling correction is not supported: set "
                                "vllm_importance_sampling_correction: false", key="objective", value="vespo")
        custom_rollout = self.tools or self.rollout_func is not None or self.environment_factories is not None
        if self.args.dynamic_sampling or self.args.anchor_gate:
            dyn.check_refill_fits(self.args.per_device_train_batch_size * self.args.steps_per_generation,
                                  self.num_generations, self.args.dynamic_sampling_factor,
                                  self.args.max_num_gen_batches or 1)
        if custom_rollout and (self.args.anchor or self.args.anchor_gate):
            raise ArmorLabError("anchors are not supported with tools, rollout_func or environments",
                                key="anchor", value=self.args.anchor)

    def _process_syncs(self) -> tuple[anc.Sync | None, anc.Sync | None]:
        """(max over processes, the same where π_ref's and the policy's forwards are collectives)."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        sharded = self.is_fsdp_enabled or (self.is_deepspeed_enabled and getattr(plugin, "zero_stage", 0) == 3)
        return anc.process_syncs(self.accelerator.num_processes, self.accelerator.device, sharded)

    def _check_units(self) -> None:
        """Rollout-counted settings need a whole U; ``max_rollouts`` sets max_steps (config.resolve
        does the same for run configs; this covers Python users of ArmorLabConfig)."""
        args = self.args
        steps = rollout_horizon(args.step_unit, args.max_rollouts, args.max_steps, self.per_rollout,
                                max_steps_given=args.max_steps > 0)
        if steps is not None:
            args.max_steps = steps

    def sync_reference_engine(self) -> None:
        """A sampler with its own copy of π_ref (vLLM) gets the reference's current weights."""
        sync = getattr(self.reference_sampler, "sync_from", None)
        if sync is not None and self.reference.model is not None:
            sync(self.accelerator.unwrap_model(self.reference.model))

    def _prepare_reference(self, ref: nn.Module) -> nn.Module:
        """What TRL does to its own reference model: fused LM head, then device placement/sharding."""
        from trl.models.utils import prepare_deepspeed, prepare_fsdp

        add_fused_lm_head(ref, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled and self.accelerator.state.fsdp_plugin.fsdp_version == 2:
            return shard_per_layer(ref, **fsdp2_reference_kwargs(self.accelerator, ref)).eval()
        if self.is_fsdp_enabled:
            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def _generation_config(self) -> GenerationConfig:
        existing = getattr(self, "generation_config", None)
        if existing is not None:
            return existing
        return GenerationConfig(max_new_tokens=self.max_completion_length, do_sample=True,
                                pad_token_id=self._tokenizer.pad_token_id, eos_token_id=self.eos_token_ids,
                                temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                                repetition_penalty=self.repetition_penalty, disable_compile=True)

    @contextlib.contextmanager
    def unwrapped_policy(self):
        """The policy ready for ``generate`` and plain forwards (ZeRO-3 params gathered)."""
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                         gather_deepspeed3_params=self.args.ds3_gather_for_generation) as model:
            yield model

    def _get_train_sampler(self, dataset: Any = None) -> EpochSeededRepeatSampler:
        dataset = self.train_dataset if dataset is None else dataset
        return EpochSeededRepeatSampler(
            data_source=dataset, mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset, seed=self.args.seed)

    # ------------------------------------------------------------------ rewards
    def _as_completion(self, text: str, prompt: Any) -> Any:
        return [{"role": "assistant", "content": text}] if is_conversational({"prompt": prompt}) else text

    def _reward_values(self, prompts: list, completions: list[str], completion_ids: list[list[int]],
                       rows: list[dict]) -> list[float]:
        """Σ_i w_i·f_i over the (plain) reward functions, as TRL weighs them; unscorable → NaN.
        Anchors and validation judge correctness: length shaping (``shapes_length``) is left out."""
        comps = [self._as_completion(c, p) for c, p in zip(completions, prompts, strict=True)]
        keys = [k for k in (rows[0] if rows else {}) if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [r[k] for r in rows] for k in keys}
        total = torch.zeros(len(prompts))
        scored = torch.zeros(len(prompts), dtype=torch.bool)
        for weight, func in zip(self.reward_weights.tolist(), self.reward_funcs, strict=True):
            if getattr(func, "shapes_length", False):  # correctness only: no overlong punishment
                continue
            out = func(prompts=prompts, completions=comps, completion_ids=completion_ids,
                       trainer_state=self.state, log_extra=lambda *a, **k: None,
                       log_metric=lambda *a, **k: None, **kwargs)
            vals = torch.tensor([math.nan if v is None else float(v) for v in out])
            scored |= ~vals.isnan()
            total += weight * torch.nan_to_num(vals, nan=0.0)
        return torch.where(scored, total, torch.tensor(math.nan)).tolist()

    def _score_groups(self, requests, samples) -> list[list[float]]:
        prompts, texts, ids, rows = [], [], [], []
        for req, group in zip(requests, samples, strict=True):
            for c in group:
                prompts.append(req.prompt)
                texts.append(c.text)
                ids.append(list(c.ids))
                rows.append(req.row)
        flat = [0.0 if math.isnan(v) else v for v in self._reward_values(prompts, texts, ids, rows)]
        out, i = [], 0
        for group in samples:
            out.append(flat[i:i + len(group)])
            i += len(group)
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_gathered = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        self._rewards_gathered[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return rewards_per_func

    # ------------------------------------------------------------------ rollout
    def _generate(self, prompts: list):
        anchoring = self.model.training and self.anchor_rollout is not None
        idx = anc.anchor_rows(len(prompts), self.accelerator.process_index, self.num_generations) if anchoring else []
        if anchoring and self.anchor_cache == "off":
            self.anchor_rollout.cache.clear()
        beside = self._start_anchors_beside(prompts, idx) if anchoring else None
        out = super()._generate(prompts)
        if not self.model.training:
            return out
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images = out
        n = len(prompts)
        is_anchor = torch.zeros(n, dtype=torch.bool)
        solvable = torch.full((n,), math.nan)
        marks = {"groups": 0, "cached": 0, "generated": 0, "injected": 0, "sampled": 0, "skipped": 0}
        if self.anchor_rollout is not None:
            if beside is not None:
                reqs, future = beside
                outcomes, generated = future.result()
            else:
                solved = self._solved_groups(idx, prompts, completions, completion_ids)
                for i in solved:  # the policy solved it: solvable, whatever π_ref would draw
                    solvable[i] = 1.0
                idx = [i for i in idx if i not in solved]
                reqs = [anc.GroupRequest(prompts[i], prompt_ids[i], self._reward_row(self._rollout_inputs[i]))
                        for i in idx]
                outcomes, generated = self.anchor_rollout.run(reqs, seed=self.args.seed, step=self.state.global_step)
                marks["skipped"] = len(solved)
            marks.update(groups=len(idx), cached=sum(o.cached for o in outcomes), generated=generated,
                         sampled=sum(not o.cached for o in outcomes))
            if self._telemetry_generation(self.forward_kl_share) and self.args.kl_telemetry:
                rng = random.Random(f"{self.args.seed}:{self.state.global_step}:{self.accelerator.process_index}")
                marks["forward_rows"] = anc.forward_kl_rows(reqs, outcomes, n, rng)
            for i, o in zip(idx, outcomes, strict=True):
                solvable[i] = float(o.solvable)
                if self.args.anchor and o.anchor is not None:
                    completion_ids[i] = list(o.anchor.ids)
                    completions[i] = self._as_completion(o.anchor.text, prompts[i])
                    if logprobs is not None:  # the sampler's log-probs do not describe π_ref's sample
                        logprobs[i] = [None] * len(o.anchor.ids)
                    is_anchor[i] = True
                    marks["injected"] += 1
        eos_and_pad = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        marks.update(
            is_anchor=is_anchor, solvable=solvable,
            lengths=torch.tensor([float(len(ids)) for ids in completion_ids]),
            truncated=torch.tensor([float(not ids or ids[-1] not in eos_and_pad) for ids in completion_ids]),
        )
        self._rollout_marks = marks
        return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images

    def _solved_groups(self, idx: list[int], prompts: list, completions: list, completion_ids: list) -> set[int]:
        """The anchor rows (``idx``) whose group's on-policy samples all reach the reward threshold,
        with ``anchor_skip_solved`` (else none): dynamic sampling drops such a group, anchor or not.
        A collective (a group may straddle processes): every anchoring process calls it. A sampler
        drawing beside the policy's generation (``concurrent``) has drawn before the rewards exist."""
        if not self.args.anchor_skip_solved or getattr(self.reference_sampler, "concurrent", False):
            return set()
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        rewards = torch.tensor(self._reward_values(prompts, texts, completion_ids,
                                                   [self._reward_row(r) for r in self._rollout_inputs]))
        correct = torch.nan_to_num(rewards, nan=-math.inf) >= self.args.anchor_reward_threshold
        solved = self.accelerator.gather(correct.float().to(self.accelerator.device)).view(-1, self.num_generations)
        start = self.accelerator.process_index * len(prompts)
        return {i for i in idx if bool(solved[(start + i) // self.num_generations].all())}

    def _start_anchors_beside(self, prompts: list, idx: list[int]):
        """Start the anchor rollout in a worker thread, beside the policy's generation: (requests, future).

        Only for a sampler that says it runs ``concurrent`` ly (a vLLM server: HTTP requests to
        another process's GPU). None otherwise: a colocated engine or ``generate`` shares the
        trainer's device and thread, and a sampler whose forwards are collectives must not run
        them in a side thread (their order across processes would no longer be fixed).
        """
        if not getattr(self.reference_sampler, "concurrent", False) or not idx:
            return None
        from concurrent.futures import ThreadPoolExecutor

        if self._anchor_thread is None:
            self._anchor_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="armorlab-anchors")
        prompt_ids = self._tokenize_prompts([prompts[i] for i in idx])[0]
        reqs = [anc.GroupRequest(prompts[i], ids, self._reward_row(self._rollout_inputs[i]))
                for i, ids in zip(idx, prompt_ids, strict=True)]
        return reqs, self._anchor_thread.submit(self.anchor_rollout.run, reqs, seed=self.args.seed,
                                                step=self.state.global_step)

    @staticmethod
    def _reward_row(row: dict) -> dict:
        return {k: v for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}

    def _generate_and_score_completions(self, inputs):
        target = len(inputs)
        filters = self.args.dynamic_sampling or self.args.anchor_gate  # what the refill refills
        if not (self.model.training and filters):
            output, later = self._generation_round(inputs, 0, defer=False)
            if not self.model.training:
                return output
            self._score_kept(output, later)
            return self._loss_counts(output)
        # verl's filter_groups: generation batches of f× the prompts until the groups that train
        # fill the batch on every process, at most max_num_gen_batches of them (DAPO §3.2, Algorithm 1)
        factor, bound, groups = self.args.dynamic_sampling_factor or 1, self.args.max_num_gen_batches or 1, \
            target // self.num_generations
        rounds: list[dict] = []
        deferred: set[str] = set()
        logged = {name: len(self._metrics["train"].get(name, ())) for name in VLLM_IS_METRICS}
        while True:
            seed = (self.args.seed * 1_000_003 + self.state.global_step) * 1009 + self.accelerator.process_index
            seed = seed * 131 + len(rounds) if rounds else seed  # round 0 draws what the single refill drew
            extra = (factor - 1) * groups if not rounds else factor * groups
            fresh = dyn.extra_prompt_rows(self.train_dataset, extra, self.num_generations, seed) if extra else []
            drawn = (list(inputs) if not rounds else []) + fresh
            # a round drawing more rows than train has π_old and π_ref scored after the filter (verl's order)
            output, later = self._generation_round(drawn, len(rounds),
                                                   defer=(len(drawn) > target or bool(rounds)) and self.score_after_filter)
            rounds.append(output)
            deferred.update(later)
            if len(rounds) >= bound:
                break
            # whole groups per process here (check_refill_fits): the fewest that train on any process
            training = sum(float(r["armorlab_keep"].view(-1, self.num_generations)[:, 0].sum()) for r in rounds)
            fewest = self.accelerator.gather(torch.tensor([training], device=self.accelerator.device)).min()
            if float(fewest) >= groups:
                break
        output = dyn.merge_rounds(rounds, self._tokenizer.pad_token_id) if len(rounds) > 1 else rounds[0]
        if "old_per_token_logps" in deferred and self._vllm_corrects:
            for name, count in logged.items():  # TRL's, from the NaN stand-ins: _correct_kept logs the real ones
                del self._metrics["train"].get(name, [])[count:]
        device, n = self.accelerator.device, output["completion_ids"].size(0)
        output[f"{GENERATION_STAT}train/gen_batches:total"] = torch.tensor(float(len(rounds)), device=device)
        output[f"{GENERATION_STAT}train/gen_batches:count"] = torch.tensor(1.0, device=device)
        if n > target:  # over-generated: train on the first groups that train (spread, and past the gate)
            rows = dyn.refill_rows(output["armorlab_keep"], self.num_generations, groups)
            output = {k: v[rows] if torch.is_tensor(v) and v.dim() and v.size(0) == n else v for k, v in output.items()}
            mask = output["completion_mask"] * output.get("tool_mask", 1)
            output["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        self._score_kept(output, deferred)
        # rows of the batch the filters left without a training group, refill included
        output[f"{GENERATION_STAT}train/refill_shortfall:total"] = target - output["armorlab_keep"].sum()
        output[f"{GENERATION_STAT}train/refill_shortfall:count"] = torch.tensor(float(target), device=device)
        return self._loss_counts(output)

    def _generation_round(self, inputs, round_index: int, *, defer: bool):
        """One generation batch (TRL's generation and scoring, anchors, gate, dynamic sampling's
        keep mask): round ``round_index`` of a refill; group ids stay unique across rounds. With
        ``defer`` the no-grad π_old/π_ref scoring is put off (:meth:`_score_kept`): returns the
        output and the names of the log-probs left to score."""
        self._rollout_inputs, self._rollout_marks = inputs, None
        self._deferred = [] if defer or (self.model.training and self._old_after_split) else None
        self._defer_ref = defer
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._rollout_inputs = None
            deferred, self._deferred = self._deferred or [], None
        if not self.model.training:  # TRL's own evaluation: no anchors, no gate, no telemetry
            if "ref_per_token_logps" not in output:  # TRL computes them only when beta != 0
                self._add_reference_logps(output)
            return output, deferred
        device = self.accelerator.device
        marks, self._rollout_marks = self._rollout_marks, None
        n = output["completion_ids"].size(0)
        start = self.accelerator.process_index * n
        output["armorlab_reward"] = self._rewards_gathered[start:start + n].to(device)
        if self.args.advantage_estimator == "quantile":  # QAE: same rewards, K-quantile baseline
            adv = group_advantages(self._rewards_gathered.float().cpu(), self.num_generations,
                                   estimator="quantile", quantile_k=self.args.quantile_k, scale=self.scale_rewards)
            output["advantages"] = adv[start:start + n].to(device=device, dtype=output["advantages"].dtype)
        self._diversity(output, start, n)
        output["armorlab_length"] = marks["lengths"].to(device)
        output["armorlab_truncated"] = marks["truncated"].to(device)
        output["armorlab_is_anchor"] = marks["is_anchor"].to(device)
        # unique over the run: generation index × groups per generation + group within the batch.
        # TRL generates when its micro-step counter _step (saved with checkpoints) reaches a
        # multiple of steps_per_generation·num_iterations; global_step would repeat with GA > 1.
        generation = self._step // (self.args.steps_per_generation * self.num_iterations)
        # global rows generated, over-generation included; each refill round its own block of ids
        first = (generation * (self.args.max_num_gen_batches or 1) + round_index) * self._rewards_gathered.numel()
        output["armorlab_group"] = torch.div(torch.arange(first + start, first + start + n, device=device),
                                             self.num_generations, rounding_mode="floor")
        keep = torch.ones(n, device=device)
        if self.anchor_rollout is not None:
            counts = torch.tensor([marks["groups"], marks["injected"], marks["cached"], marks["generated"],
                                   marks["sampled"], marks["skipped"]], dtype=torch.float32, device=device)
            if self.accelerator.num_processes > 1:
                counts = self.accelerator.reduce(counts, reduction="sum")
            groups, injected, cached, generated, sampled, skipped = counts.tolist()
            dropped = 0.0
            solvable = self.accelerator.gather(marks["solvable"].to(device))
            if self.args.anchor_gate:
                keep_all = anc.group_keep(solvable, self.num_generations)
                keep = keep_all[start:start + n]
                dropped = float((1.0 - keep_all).sum()) / self.num_generations
            per_generation = anc.gate_success(
                self._rewards_gathered.to(device), self.accelerator.gather(marks["is_anchor"].float().to(device)),
                solvable, self.num_generations, self.args.anchor_reward_threshold)
            if "forward_rows" in marks:  # the same generations on every process: _forward_kl is a collective
                per_generation.update(self._forward_kl(marks["forward_rows"]))
            # reference draws per prompt sampled now (each asks for one anchor): adaptive rejection's cost
            per_generation["anchor/draws_per_anchor"] = (generated, sampled)
            if self.args.anchor_skip_solved:  # groups the policy solved: no draws (anchor_skip_solved)
                per_generation["anchor/skipped_solved"] = (skipped, skipped + groups)
            for name, (total, count) in per_generation.items():
                output[f"{GENERATION_STAT}{name}:total"] = torch.as_tensor(total, dtype=torch.float32, device=device)
                output[f"{GENERATION_STAT}{name}:count"] = torch.as_tensor(count, dtype=torch.float32, device=device)
            groups = max(groups, 1.0)
            # 0-d tensors pass unchanged through TRL's shuffle/split: every step of this generation sees them
            output["armorlab_anchor_rate"] = torch.tensor(injected / groups, device=device)
            output["armorlab_gate_drop"] = torch.tensor(dropped / groups, device=device)
            self._metrics["train"]["anchor/cache_hit"].append(cached / groups)
            self._ref_samples_pending += generated
        if self.args.dynamic_sampling:  # DAPO: groups with equal rewards leave the loss and its normaliser
            spread = dyn.group_has_spread(self._rewards_gathered.to(device), self.num_generations)
            keep = keep * spread[start:start + n]
            groups_all = spread.numel() / self.num_generations
            output[f"{GENERATION_STAT}train/zero_var_frac:total"] = torch.tensor(
                float((1.0 - spread).sum()) / self.num_generations, device=device)
            output[f"{GENERATION_STAT}train/zero_var_frac:count"] = torch.tensor(groups_all, device=device)
        output["armorlab_keep"] = keep
        return output, deferred

    def _loss_counts(self, output: dict) -> dict:
        # the loss normaliser's counts: the rows that train, over every process (gated, zero-spread
        # and refill-dropped rows excluded); 0-d, so every micro-batch of this generation gets them
        loss_mask = output["completion_mask"].float() * output["armorlab_keep"].unsqueeze(1)
        if output.get("tool_mask") is not None:
            loss_mask = loss_mask * output["tool_mask"]
        row_tokens = loss_mask.sum(1)
        totals = torch.stack([row_tokens.sum(), (row_tokens > 0).sum().float()])
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        output["armorlab_gen_tokens"], output["armorlab_gen_rows"] = totals.unbind(0)
        return output

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, **kwargs):
        """TRL's, except inside an over-generated rollout (``_deferred`` a list): its no-grad π_old
        and π_ref scoring of every drawn row is put off — NaN stands in, the model is noted — and
        :meth:`_score_kept` runs it on the rows the filter keeps; π_old is put off in every rollout
        that :attr:`_old_after_split` allows, to :meth:`_prepare_inputs`. Not where the forward takes
        more than token ids. With vLLM's importance-sampling correction TRL's ratio is then 1 (NaN
        differences count 0) until :meth:`_correct_kept` computes it."""
        later = self._deferred is not None and not compute_entropy and not torch.is_grad_enabled() \
            and not any(v is not None for v in kwargs.values()) and (self._defer_ref or model is not self.ref_model)
        if not later:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size=batch_size, compute_entropy=compute_entropy,
                                                              **kwargs)
        self._deferred.append("ref_per_token_logps" if model is self.ref_model else "old_per_token_logps")
        return torch.full((input_ids.size(0), logits_to_keep), math.nan, device=input_ids.device), None, None

    @torch.no_grad()
    def _score_kept(self, output: dict, deferred: Any) -> None:
        """π_old's and π_ref's log-probs of the rows that train: those put off during the rollout
        (``_get_per_token_logps_and_entropies``) and π_ref's where armorlab reads it at β = 0."""
        self._old_pending = "old_per_token_logps" in deferred and self._old_after_split
        if "old_per_token_logps" in deferred and not self._old_pending:
            self._score_old(output)
            if self._vllm_corrects:
                self._correct_kept(output)
        if "ref_per_token_logps" in deferred:
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            att = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            output["ref_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                self.ref_model, ids, att, output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size)
        elif "ref_per_token_logps" not in output:  # TRL computes them only when beta != 0
            self._add_reference_logps(output)

    @property
    def _old_after_split(self) -> bool:
        """π_old is scored after TRL splits the generation into micro-batches (:meth:`_prepare_inputs`):
        the one trained first was generated by the very weights it trains with, so its π_old is π_θ
        (TRL's own rule where the steps align) and costs no forward. Not with several passes over a
        generation (π_old outlives the first update) nor with vLLM's correction (its ratio reads π_old
        at scoring)."""
        return self.num_iterations == 1 and not self._vllm_corrects

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if self._old_pending:  # a fresh generation, split: π_old of the micro-batches after this one
            self._old_pending = False
            first = self._step % self.args.steps_per_generation
            for later in self._buffered_inputs[first + 1:]:
                self._score_old(later)
            inputs.pop("old_per_token_logps", None)  # π_θ itself (_compute_loss: logp.detach())
        return inputs

    @torch.no_grad()
    def _score_old(self, batch: dict) -> None:
        """π_old's log-probs of a batch's rows (the policy as it is now), in ``old_per_token_logps``."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            batch["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, att, batch["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size)

    @property
    def _vllm_corrects(self) -> bool:
        """TRL applies its vLLM importance-sampling correction (its own condition)."""
        return self.use_vllm and self.vllm_importance_sampling_correction

    def _correct_kept(self, output: dict) -> None:
        """TRL's vLLM importance-sampling ratio and its ``sampling/*`` metrics (TRL's statistics) on
        the rows that train, π_old scored after the filter."""
        mask = output["completion_mask"] * output.get("tool_mask", 1)
        old, sampled = output["old_per_token_logps"], output["sampling_per_token_logps"]
        ratio = vllm_is_ratio(old, sampled, mask, self.vllm_importance_sampling_mode,
                              self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max)
        output["importance_sampling_ratio"] = ratio
        delta = (old - sampled).abs()[mask.bool()]
        delta = delta[~delta.isnan()]
        flat = ratio.flatten() if ratio.size(1) == 1 else ratio[mask.bool()]

        def gathered(values: torch.Tensor, stat: Any) -> torch.Tensor:
            return self.accelerator.gather(stat(values) if values.numel() else torch.zeros((), device=values.device))

        stats = (gathered(delta, torch.mean).mean(), gathered(delta, torch.max).max(), nanmin(gathered(flat, torch.min)),
                 gathered(flat, torch.mean).nanmean(), nanmax(gathered(flat, torch.max)))
        for name, value in zip(VLLM_IS_METRICS, stats, strict=True):
            self._metrics["train"][name].append(value.item())

    def _diversity(self, output: dict, start: int, n: int) -> None:
        """``train/correct_distinct`` and ``train/correct_entropy`` of this process's whole groups
        (``mechanisms.rollout_diversity``), as per-generation (total, count)."""
        totals = rollout_diversity(output["completion_ids"].tolist(), output["completion_mask"].sum(1).long().tolist(),
                                   self._rewards_gathered[start:start + n].tolist(), start, self.num_generations,
                                   self.args.anchor_reward_threshold)
        device = self.accelerator.device
        for name, total in (("train/correct_distinct", totals[0]), ("train/correct_entropy", totals[1])):
            output[f"{GENERATION_STAT}{name}:total"] = torch.tensor(total, device=device)
            output[f"{GENERATION_STAT}{name}:count"] = torch.tensor(totals[2], device=device)

    @torch.no_grad()
    def _forward_kl(self, rows: list) -> dict[str, tuple[Any, Any]]:
        """KL(π_ref‖π_θ) estimates (k1, k3) on unconditioned reference draws: (sum, sequences).

        π_θ is the policy that generated this batch, scored teacher-forced like TRL's rows. Every
        process scores the same number of rows (the fewest any has), so the forwards of a
        wrapped or sharded model stay collective.
        """
        count = len(rows)
        if self.accelerator.num_processes > 1:
            count = int(self.accelerator.gather(torch.tensor([count], device=self.accelerator.device)).min())
        if count == 0:
            return {}
        ids, att, mask = anc.pack_rows(rows[:count], self._tokenizer.pad_token_id, self.accelerator.device)
        width, batch = mask.size(1), self.args.per_device_train_batch_size
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logp, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, att, width, batch_size=batch)
        ref, _, _ = self._get_per_token_logps_and_entropies(self.ref_model, ids, att, width, batch_size=batch)
        totals, sequences = sequence_kl_estimates(ref, logp, mask, names=("k1", "k3"))
        return {"kl/forward_k1": (totals[0], sequences), "kl/forward_k3": (totals[1], sequences)}

    def _reference_scored(self) -> bool:
        """Whether this generation's rows get π_ref's log-probs (``reference.reference_scored``)."""
        return reference_scored(self.args, beta=self.beta, has_reference=self.ref_model is not None,
                                telemetry_now=self._telemetry_generation(self.reverse_kl_share))

    def _telemetry_generation(self, share: float) -> bool:
        """Whether this generation (TRL's micro-step counter ``_step`` says which) is one telemetry scores."""
        return telemetry_generation(self._step // (self.args.steps_per_generation * self.num_iterations), share)

    @torch.no_grad()
    def _add_reference_logps(self, output: dict) -> None:
        """``ref_per_token_logps`` of every row, on the generations that are scored (``_reference_scored``)."""
        if not self._reference_scored():
            return
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        att = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        batch = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        # telemetry alone reads them: one micro-batch of rows (the same count on every process), NaN elsewhere
        rows = ids.size(0) if reference_trains(self.args, beta=self.beta) else min(ids.size(0), batch)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            self.ref_model, ids[:rows], att[:rows], output["completion_ids"].size(1), batch_size=batch)
        if rows < ids.size(0):
            logps = torch.cat([logps, logps.new_full((ids.size(0) - rows, logps.size(1)), math.nan)])
        output["ref_per_token_logps"] = logps

    # ------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        args = self.args
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        att = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logp, entropy, aux_loss = self._get_per_token_logps_and_entropies(
            model, ids, att, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled)
        token_mask = completion_mask.float()
        if "tool_mask" in inputs:
            token_mask = token_mask * inputs["tool_mask"]
        n = completion_ids.size(0)
        keep = inputs.get("armorlab_keep", torch.ones(n, device=logp.device)).float()
        mask = token_mask * keep.unsqueeze(1)
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps")
        is_anchor = inputs.get("armorlab_is_anchor", torch.zeros(n, dtype=torch.bool, device=logp.device))
        adv = inputs["advantages"]
        adv = adv.squeeze(1) if adv.dim() == 2 and adv.size(1) == 1 else adv
        lp, olp, alpha = anc.anchor_ratio_inputs(args.objective, args.anchor_ratio if args.anchor else None,
                                                 logp, old, ref, is_anchor, args.alpha)
        training = self.model.training
        spec = objective_spec(args.objective)
        aggregation = args.aggregation or spec.aggregation
        tokens_norm, rows_norm = self._loss_normalizers(inputs) if training else (None, None)
        normalizer = tokens_norm if AGGREGATION_UNIT[aggregation] == "tokens" else rows_norm
        out = policy_loss(args.objective, lp, olp, adv, mask, ref_logp=ref if spec.uses_reference else None,
                          alpha=alpha, eps_low=self.epsilon_low, eps_high=self.epsilon_high,
                          dual_clip=args.dual_clip, aggregation=aggregation, max_len=self.max_completion_length,
                          normalizer=normalizer, params={k: getattr(args, k, None) for k in spec.params})
        loss = out.loss
        # TRL's top_entropy_quantile: only the highest-entropy tokens (quantile over every process) train
        entropy_mask = None if args.top_entropy_quantile >= 1.0 else \
            self.get_high_entropy_mask(entropy, mask, 1 - args.top_entropy_quantile).to(mask.dtype)
        is_ratio = inputs.get("importance_sampling_ratio")
        weight = is_ratio if entropy_mask is None else (
            entropy_mask if is_ratio is None else is_ratio * entropy_mask)
        if weight is not None:  # TRL's vLLM correction and entropy mask, as TRL applies them: per-token loss × weight
            loss = vllm_corrected_loss(out.per_token, weight, mask, aggregation, self.max_completion_length,
                                       normalizer)
        stats = StepStats()
        # In training, each term is this micro-batch's share of the optimiser step's global
        # aggregate: summed over accumulation steps and processes it is the aggregate itself.
        # ``to_sum`` undoes DDP's (and FSDP's, DeepSpeed's) mean over processes; telemetry logs
        # the step's aggregate (TRL averages the micro-steps, StepStats the processes).
        to_sum = float(self.accelerator.num_processes) if training else 1.0
        to_aggregate = to_sum * (self.current_gradient_accumulation_steps if training else 1.0)
        beta_kl, policy_part = None, loss
        if self.beta != 0.0:
            per_token_kl = kl.estimator(args.kl_estimator or "k3")(ref - logp)  # samples of π_θ: reverse
            if args.use_bias_correction_kl:  # as TRL: π_old's samples reweighted to π_θ by the plain ratio
                per_token_kl = per_token_kl * torch.exp(logp - old)
            beta_kl = (per_token_kl * mask).sum() / (mask.sum().clamp(min=1.0) if tokens_norm is None else tokens_norm)
            loss = loss + self.beta * beta_kl
            stats.mean("obj/beta_kl", beta_kl * to_aggregate)
        if training and self._grad_share_due():
            self._grad_shares(logp, policy_part, is_anchor, None if beta_kl is None else self.beta * beta_kl)
        loss = loss * to_sum
        if self._entropy_bonus_enabled:  # after to_sum: averaged over processes, as in TRL
            loss = loss - self._entropy_term(entropy, mask if entropy_mask is None else mask * entropy_mask, training)
        if aux_loss is not None:  # a mean per micro-batch, averaged over them all
            loss = loss + self.router_aux_loss_coef * aux_loss / (
                self.current_gradient_accumulation_steps if training else 1.0)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(self.state.global_step + 1)
        if training:
            stats.mean("obj/policy_loss", out.loss * to_aggregate)
            self._record(stats, StepRecord(inputs=inputs, out=out, logp=logp, old=old, ratio_old=olp, ref=ref,
                                           adv=adv, mask=mask, token_mask=token_mask, entropy=entropy,
                                           is_anchor=is_anchor, alpha=alpha))
        return loss

    def _entropy_term(self, entropy: torch.Tensor, mask: torch.Tensor, training: bool) -> torch.Tensor:
        """TRL 1.16's entropy bonus c·H (armorlab.algos.entropy) and, in training, its adaptive
        controller: the window's entropy summed over micro-batches and processes, c updated at each
        optimiser step; ``obj/entropy_coef`` logged then. The state lives in TRL's attributes
        (``entropy_coef``, ``_last_world_entropy``), which TRL's checkpoint code saves."""
        args = self.args
        term = entropy_bonus(entropy, mask, self.current_gradient_accumulation_steps if training else 1.0)
        coef = applied_entropy_coef(self.entropy_coef, self._last_world_entropy, adaptive=self.use_adaptive_entropy,
                                    target=args.entropy_target)
        if training and self.use_adaptive_entropy:
            window = torch.stack([(entropy * mask).sum(), mask.sum()]).detach()
            self._entropy_window_stats = window if self._entropy_window_stats is None else \
                self._entropy_window_stats + window
            if self.accelerator.sync_gradients:
                total = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                self._last_world_entropy = (total[0] / total[1].clamp(min=1.0)).item()
                self.entropy_coef = next_entropy_coef(self.entropy_coef, self._last_world_entropy,
                                                      target=args.entropy_target, delta=args.entropy_coef_delta,
                                                      lo=args.entropy_coef_min, hi=args.entropy_coef_max)
                self._entropy_window_stats = None
        if training and self.accelerator.sync_gradients:
            self._metrics["train"]["obj/entropy_coef"].append(self.entropy_coef)
        return coef * term

    def _grad_share_due(self) -> bool:
        """The gradient shares are taken on every micro-batch of every ``grad_share_every``-th optimizer step."""
        every = self.args.grad_share_every
        return bool(every) and (self.state.global_step + 1) % every == 0

    def _grad_shares(self, logp: torch.Tensor, policy_loss: torch.Tensor, is_anchor: torch.Tensor,
                     kl_term: torch.Tensor | None) -> None:
        """``mechanism_telemetry.share_sums`` of this micro-batch, summed over the optimizer step's
        micro-batches and then over processes (one collective, at the step's last micro-batch),
        where ``gradient_shares`` turns them into the step's shares."""
        sums = share_sums(token_gradient(policy_loss, logp),
                          None if kl_term is None else token_gradient(kl_term, logp), is_anchor)
        self._share_sums = sums if self._share_sums is None else self._share_sums + sums
        if not self.accelerator.sync_gradients:
            return
        totals, self._share_sums = self._share_sums, None
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        for name, value in gradient_shares(totals.tolist(), anchor=self.args.anchor, kl=kl_term is not None).items():
            self._metrics["train"][name].append(value)

    def _loss_normalizers(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, non-empty rows) that one optimiser step's loss is divided by: the counts of the
        whole generation batch over all processes (gated rows excluded), times the share of it one
        optimiser step sees, GA/steps_per_generation — TRL's rule for ``loss_type="dapo"``.
        With steps_per_generation = GA (TRL's default) that share is 1: DAPO's token mean over the
        generation batch. A batch with nothing to learn from is divided by 1 (its sum is 0)."""
        share = self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return (inputs["armorlab_gen_tokens"].clamp(min=1.0) * share,
                inputs["armorlab_gen_rows"].clamp(min=1.0) * share)

    @torch.no_grad()
    def _record(self, stats: StepStats, r: StepRecord) -> None:
        """Per-step telemetry, reduced over processes in one collective and handed to TRL's logger."""
        args = self.args
        inputs, out, logp, old, olp, ref, adv = r.inputs, r.out, r.logp, r.old, r.ratio_old, r.ref, r.adv
        mask, token_mask, entropy, is_anchor, alpha = r.mask, r.token_mask, r.entropy, r.is_anchor, r.alpha
        on = (~is_anchor.bool()).float()
        on_tok = token_mask * on.unsqueeze(1)
        rewards = inputs["armorlab_reward"]
        valid = on * (~rewards.isnan()).float()
        stats.add("train/reward", torch.nan_to_num(rewards) @ valid, valid.sum())
        stats.add("train/length", inputs["armorlab_length"] @ on, on.sum())
        stats.add("train/truncated", inputs["armorlab_truncated"] @ on, on.sum())
        stats.add("train/entropy", (entropy * on_tok).sum(), on_tok.sum())
        obj_names = []
        for name, value in out.metrics.items():
            name = name if name.startswith("obj/") else f"obj/{name}"
            obj_names.append(name)
            defined = math.isfinite(value)  # NaN: every token masked on this process
            stats.add(name, value if defined else 0.0, 1.0 if defined else 0.0)
        if ref is not None:  # rows π_ref did not score (the telemetry's micro-batch aside) are NaN: left out
            scored = on_tok * ref.isfinite().all(1, keepdim=True).float()
            totals, count = sequence_kl_estimates(logp, torch.nan_to_num(ref), scored)  # samples of π_θ: KL(π_θ‖π_ref)
            for i, name in enumerate(("k1", "k2", "k3")):
                stats.add(f"kl/reverse_{name}", totals[i], count)
            if self.args.anchor:  # reward-filtered π_ref samples: neither direction, logged as such
                anchor_tok = token_mask * is_anchor.float().unsqueeze(1)
                totals, count = sequence_kl_estimates(ref, logp, anchor_tok, names=("k1", "k3"))
                stats.add("anchor/kl_k1", totals[0], count)
                stats.add("anchor/kl_k3", totals[1], count)
        cap = probability_capacity(args.objective, olp.detach(), adv, mask, ref_logp=ref, alpha=alpha,
                                   eps_low=self.epsilon_low, eps_high=self.epsilon_high)
        for name, value in capacity_summary(cap, olp.detach(), adv, mask).items():
            stats.mean(f"cap/{name}", value)
        if self.anchor_rollout is not None:
            stats.mean("anchor/rate", inputs["armorlab_anchor_rate"])
            stats.mean("anchor/gate_drop", inputs["armorlab_gate_drop"])
            anchors = is_anchor.float()
            stats.add("anchor/reward", torch.nan_to_num(rewards) @ anchors, anchors.sum())
            stats.add("anchor/adv_mean", (adv if adv.dim() == 1 else adv.mean(1)) @ anchors, anchors.sum())
            stats.add("anchor/share", (mask * anchors.unsqueeze(1)).sum(), mask.sum())
        for key in inputs:  # per-generation (total, count): equal on every step and micro-batch
            if key.startswith(GENERATION_STAT) and key.endswith(":total"):
                name = key[len(GENERATION_STAT):-len(":total")]
                stats.add(name, inputs[key], inputs[f"{GENERATION_STAT}{name}:count"])
        stats.mean("ref/resets", float(self.reference.resets))
        reduced = stats.reduce(self.accelerator)
        for name in obj_names:  # undefined on every process: logged, as null
            reduced.setdefault(name, math.nan)
        for name, value in reduced.items():
            self._metrics["train"][name].append(value)
        self.token_dump.record(self.state.global_step + 1, token_ids=inputs["completion_ids"], logp=logp,
                               old_logp=old, ref_logp=ref, advantages=adv, is_anchor=is_anchor, mask=mask,
                               groups=inputs.get("armorlab_group"))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and self.anchor_rollout is not None and "loss" in logs:
            steps = max(1, self.state.global_step - self._last_logged_step)
            logs["anchor/ref_samples"] = self._ref_samples_pending / steps
            self._ref_samples_pending, self._last_logged_step = 0.0, self.state.global_step
        super().log(logs, start_time)

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):
        # armorlab's state goes in FIRST: transformers writes trainer_state.json last, so a checkpoint
        # with trainer_state.json is complete (launch resumes only from complete ones).
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        rank = self.accelerator.process_index
        torch.save({"step": self._step, "buffer": self._buffered_inputs}, folder / f"armorlab_buffer_r{rank}.pt")
        if self.anchor_rollout is not None:
            from armorlab.core.fsutil import atomic_write_json

            atomic_write_json(folder / f"anchor_cache_r{rank}.json", self.anchor_rollout.cache.state_dict())
        self.reference.save(folder, write=self.args.should_save)  # gathers π_ref on every process
        if self.args.should_save:
            from armorlab.core.fsutil import atomic_write_json

            atomic_write_json(folder / STATE_FILE, {"global_step": self.state.global_step,
                                                    "world_size": self.accelerator.num_processes})
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        folder, rank = Path(checkpoint), self.accelerator.process_index
        self.reference.load(folder)
        if self.reference.resets:
            self.sync_reference_engine()
        buffer = folder / f"armorlab_buffer_r{rank}.pt"
        if buffer.is_file():
            device = self.accelerator.device  # "cpu:<rank>" in a multi-process CPU run: torch.load wants "cpu"
            state = torch.load(buffer, map_location="cpu" if device.type == "cpu" else device, weights_only=True)
            self._step, self._buffered_inputs = int(state["step"]), state["buffer"]
        cache = folder / f"anchor_cache_r{rank}.json"
        if self.anchor_rollout is not None and cache.is_file():
            self.anchor_rollout.cache.load_state_dict(json.loads(cache.read_text(encoding="utf-8")))
