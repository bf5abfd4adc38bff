"""Validation, test and the exact-KL probe, run by the trainer at step 0 and every ``val_every`` steps.

- ``val/acc`` is avg@k: the mean reward of k samples per held-out prompt (the accuracy for 0/1
  rewards); ``val/pass@k`` the share of prompts with at least one sample whose reward reaches
  the correctness threshold; ``val/length`` the mean completion length in tokens (eos included,
  as TRL counts it). The same on the test split under ``test/``. Anchors are never injected.
- Each named held-out set (``eval_sets``, tasks/mathfile.py) the same under ``val/<set>/`` or
  ``test/<set>/``, with its own n samples per problem (acc = avg@n) and pass@k's k ≤ n, estimated
  without bias from the n samples (algos/pass_at_k.py).
- ``kl/exact_reverse`` = E_{y~π_θ} Σ_t KL(π_θ(·|y<t) ‖ π_ref(·|y<t)) and ``kl/exact_forward`` =
  E_{y~π_ref} Σ_t KL(π_ref ‖ π_θ): the full-vocabulary per-token KL summed along each sampled
  sequence and averaged over sequences, at the training temperature, on a fixed set of probe
  prompts (the first ``kl_probe_prompts`` validation prompts). The ``kl/reverse_k*`` and
  ``kl/forward_k*`` estimators are logged on the same sequence-sum scale, so the probe checks them.
- ``val/n`` / ``test/n``: how many scored completions stand behind ``acc`` (prompts × k, summed
  over processes), so analysis knows the binomial noise of each eval.
- ``val/acc_greedy`` (and ``val/n_greedy``) with ``val_greedy`` at a sampling ``val_temperature``: one
  greedy completion per prompt besides the k samples, so greedy and sampled accuracy are both logged.
- ``val/correct_distinct`` / ``val/correct_entropy`` with k > 1: among each prompt's correct
  samples, how many differ and the entropy of their distribution (armorlab.algos.diversity), the
  mean over prompts with a correct sample: mode collapse beside validation collapse.

Sampling runs under a forked RNG seeded by (seed, step): validation is reproducible and never
moves the training RNG, so ``val_every`` cannot change a run's training trajectory.

Memory: generation runs in chunks of ``per_device_eval_batch_size`` rows per process and the
probe's full-vocabulary logits in chunks of ``per_device_train_batch_size`` rows, never the
whole split at once. With ``use_vllm`` validation samples come from the policy's vLLM engine
(TRL's ``VLLMGeneration``, synced to the current weights first); the probe stays on the HF
models, whose logits it needs. Where the models' forwards are collectives (FSDP, ZeRO-3),
every process makes the same number of ``generate`` calls and probe forwards (dummy rows fill in).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from armorlab.algos.diversity import correct_diversity
from armorlab.algos.pass_at_k import pass_at_k
from armorlab.train.anchors import Completion, Sync, TransformersSampler, pack_rows
from armorlab.train.telemetry import StepStats, logits_kl

log = logging.getLogger(__name__)


@contextlib.contextmanager
def forked_rng(seed: int):
    """Run a block with its own torch RNG stream, restoring the surrounding one afterwards."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def score_split(samples: Sequence[Sequence[Completion]], rewards: Sequence[Sequence[float]],
                threshold: float, k: int | None = None) -> dict[str, tuple[float, float]]:
    """(sum, count) pairs for acc (avg@n of each prompt's n samples), pass@k (unbiased, from the n
    samples; k = None: k = n) and length over a shard of prompts."""
    n_samples = sum(len(s) for s in samples)
    return {
        "acc": (float(sum(sum(r) for r in rewards)), float(n_samples)),
        "pass@k": (float(sum(pass_at_k(len(r), sum(x >= threshold for x in r), k or len(r)) for r in rewards)),
                   float(len(rewards))),
        "length": (float(sum(len(c.ids) for s in samples for c in s)), float(n_samples)),
    }


@torch.no_grad()
def sequence_exact_kl(model_p: Any, model_q: Any, prompt_ids: Sequence[Sequence[int]],
                      completions: Sequence[Sequence[Completion]], *, temperature: float, pad_token_id: int,
                      batch_size: int = 16, sync: Sync | None = None) -> tuple[float, float]:
    """(Σ over sampled sequences of Σ_t KL(p_t ‖ q_t), number of sequences); y sampled from p.

    Sequences are left-padded prompt + right-padded completion, the layout TRL scores log-probs
    with, so the probe and the per-token estimators see the same conditionals. ``batch_size``
    rows at a time (their full-vocabulary logits are the memory peak); with ``sync`` every process
    runs the same number of chunks, a process with fewer rows scoring a masked dummy row.
    """
    rows = [(list(p), list(c.ids)) for p, cs in zip(prompt_ids, completions, strict=True) for c in cs]
    rows = [(p, c) for p, c in rows if c]
    chunks = [rows[start:start + batch_size] for start in range(0, len(rows), batch_size)]
    calls = len(chunks) if sync is None else sync(len(chunks))
    chunks += [[([pad_token_id], [pad_token_id])]] * (calls - len(chunks))  # weight 0 below
    total = 0.0
    device = next(model_p.parameters()).device
    for i, chunk in enumerate(chunks):
        ids, att, comp_mask = pack_rows(chunk, pad_token_id, device)
        if i * batch_size >= len(rows):
            comp_mask = torch.zeros_like(comp_mask)
        # logits at position i predict token i+1: the T completion tokens by the T positions before
        # the last; only the last T + 1 positions go through the LM head (logits_to_keep)
        keep = comp_mask.size(1) + 1
        logits_p = model_p(input_ids=ids, attention_mask=att, logits_to_keep=keep).logits[:, :-1] / temperature
        logits_q = model_q(input_ids=ids, attention_mask=att, logits_to_keep=keep).logits[:, :-1] / temperature
        total += float((logits_kl(logits_p, logits_q) * comp_mask).sum())
    return total, float(len(rows))


class Validator:
    """Computes val/*, test/* and the exact-KL probe for an ArmorLabTrainer."""

    def __init__(self, trainer: Any, splits: dict[str, Any], *, k: int, temperature: float,
                 threshold: float, probe_prompts: int, score: Callable[..., list[float]],
                 greedy: bool = False, eval_sets: Mapping[str, Any] | None = None) -> None:
        self.trainer = trainer
        self.splits = {name: ds for name, ds in splits.items() if ds is not None and len(ds) > 0}
        # the named held-out sets (tasks.mathfile.EvalSet), each with its own n samples and pass@k's k
        self.sets = {s.prefix: s for s in (eval_sets or {}).values() if len(s.data) > 0}
        self.k, self.temperature, self.threshold = int(k), float(temperature), float(threshold)
        self.greedy = bool(greedy) and self.temperature > 0  # at temperature 0, acc is greedy already
        self.probe_prompts = int(probe_prompts)
        self.score = score  # score(prompts, completions, completion_ids, rows) -> rewards

    @property
    def enabled(self) -> bool:
        return bool(self.splits) or bool(self.sets)

    def run(self, step: int) -> dict[str, float]:
        return self._evaluate(step, probe=True)

    def scores(self, step: int, k: int | None = None) -> dict[str, float]:
        """``val/*`` and ``test/*`` (acc, pass@k, length, n) of the current policy, without the KL
        probe, in the RNG stream of step ``step``: with k = val_samples exactly what the run logged
        at that step from the same weights (``armorlab evaluate`` reads kept checkpoints with it).
        The named held-out sets keep their own n."""
        saved, self.k = self.k, int(k or self.k)
        try:
            return self._evaluate(step, probe=False)
        finally:
            self.k = saved

    def _evaluate(self, step: int, *, probe: bool) -> dict[str, float]:
        """Every split (and the KL probe with ``probe``) in eval mode, in step ``step``'s RNG stream."""
        tr = self.trainer
        stats = StepStats()
        world, rank = tr.accelerator.num_processes, tr.accelerator.process_index
        with forked_rng(tr.args.seed * 100_003 + step), tr.unwrapped_policy() as policy:
            was_training = policy.training
            policy.eval()
            try:
                for name, ds in self.splits.items():
                    self._split(stats, name, ds, rank, world, policy)
                for prefix, held in self.sets.items():
                    self._split(stats, prefix, held.data, rank, world, policy, samples=held.samples, k=held.k)
                if probe and self.probe_prompts > 0 and "val" in self.splits:
                    self._probe(stats, self.splits["val"], rank, world, policy)
            finally:
                policy.train(was_training)
        return stats.reduce(tr.accelerator)

    def reference_accuracy(self, step: int) -> float | None:
        """avg@k of π_ref on the val split (``ref/val_acc``): the quality of the anchor source."""
        if "val" not in self.splits or self.trainer.ref_model is None:
            return None
        tr = self.trainer
        stats = StepStats()
        with forked_rng(tr.args.seed * 100_003 + step):
            self._split(stats, "val", self.splits["val"], tr.accelerator.process_index, tr.accelerator.num_processes,
                        tr.ref_model)
        return stats.reduce(tr.accelerator).get("val/acc")

    def _sampler(self, model: Any, temperature: float) -> TransformersSampler:
        tr = self.trainer
        cfg = copy.deepcopy(tr.armorlab_generation_config)
        if temperature > 0:
            cfg.do_sample, cfg.temperature = True, temperature
            if tr.args.val_top_p is not None:  # verl's val_kwargs.top_p
                cfg.top_p = tr.args.val_top_p
        else:
            cfg.do_sample, cfg.temperature = False, None
            cfg.top_p = cfg.top_k = cfg.min_p = None
        return TransformersSampler(model, tr._tokenizer, cfg, tr.eos_token_ids,
                                   batch_size=tr.args.per_device_eval_batch_size, sync=tr.collective_sync)

    def _samples(self, model: Any, prompt_ids: list[list[int]], temperature: float,
                 k: int | None = None) -> list[list[Completion]]:
        """k (default: val_samples) samples per prompt: from the policy's vLLM engine when the
        trainer has one (and ``model`` is the policy), else ``generate`` in chunks."""
        tr = self.trainer
        k = self.k if k is None else k
        if getattr(tr, "use_vllm", False) and model is not tr.ref_model:
            return vllm_samples(tr, prompt_ids, k, temperature)
        return self._sampler(model, temperature).sample(prompt_ids, k)

    def _split(self, stats: StepStats, name: str, ds: Any, rank: int, world: int, policy: Any, *,
               samples: int | None = None, k: int | None = None) -> None:
        """``name``/acc, pass@k, length, n, … of one split; ``samples`` per prompt (default: val_samples,
        or the k of ``scores``), pass@``k`` (default: all of them)."""
        rows = [ds[i] for i in range(rank, len(ds), world)]
        prompts = [r["prompt"] for r in rows]
        prompt_ids = self.trainer._tokenize_prompts(prompts)[0] if prompts else []
        n = samples or self.k
        # every process samples (also with no rows): the generation may be a collective
        samples = self._samples(policy, prompt_ids, self.temperature, k=n)
        firsts = self._samples(policy, prompt_ids, 0.0, k=1) if self.greedy else None
        # every process adds the same names in the same order (one collective reduces them), with
        # zero counts where it holds no prompt
        parts = {"acc": (0.0, 0.0), "pass@k": (0.0, 0.0), "length": (0.0, 0.0)}
        greedy = diversity = (0.0, 0.0, 0.0)
        if rows:
            rewards = self._rewards(prompts, samples, rows)
            parts = score_split(samples, rewards, self.threshold, k)
            diversity = correct_diversity([[(tuple(c.ids), x >= self.threshold) for c, x in zip(s, r, strict=True)]
                                           for s, r in zip(samples, rewards, strict=True)])
            if firsts is not None:
                first_rewards = self._rewards(prompts, firsts, rows)
                greedy = (float(sum(r[0] for r in first_rewards)), float(len(first_rewards)), 0.0)
        for key, (total, count) in parts.items():
            stats.add(f"{name}/{key}", total, count)
        stats.total(f"{name}/n", parts["acc"][1])
        if n > 1:
            stats.add(f"{name}/correct_distinct", diversity[0], diversity[2])
            stats.add(f"{name}/correct_entropy", diversity[1], diversity[2])
        if self.greedy:
            stats.add(f"{name}/acc_greedy", greedy[0], greedy[1])
            stats.total(f"{name}/n_greedy", greedy[1])

    def _rewards(self, prompts: list, samples: Sequence[Sequence[Completion]], rows: list) -> list[list[float]]:
        return [self.score([p] * len(s), [c.text for c in s], [list(c.ids) for c in s], [r] * len(s))
                for p, s, r in zip(prompts, samples, rows, strict=True)]

    def _probe(self, stats: StepStats, ds: Any, rank: int, world: int, policy: Any) -> None:
        """Exact KL on the HF models (it needs their full logits), every process the same number
        of generate calls and forwards whatever its share of the probe prompts."""
        tr = self.trainer
        n = min(self.probe_prompts, len(ds))
        prompts = [ds[i]["prompt"] for i in range(rank, n, world)]
        prompt_ids = tr._tokenize_prompts(prompts)[0] if prompts else []
        temp, ref, pad = tr.temperature, tr.ref_model, tr._tokenizer.pad_token_id
        exact = {"batch_size": tr.args.per_device_train_batch_size, "sync": tr.collective_sync,
                 "temperature": temp, "pad_token_id": pad}
        own = self._sampler(policy, temp).sample(prompt_ids, self.k)
        rev = sequence_exact_kl(policy, ref, prompt_ids, own, **exact)
        theirs = self._sampler(ref, temp).sample(prompt_ids, self.k)
        fwd = sequence_exact_kl(ref, policy, prompt_ids, theirs, **exact)
        stats.add("kl/exact_reverse", *rev)
        stats.add("kl/exact_forward", *fwd)


def vllm_samples(trainer: Any, prompt_ids: list[list[int]], k: int, temperature: float) -> list[list[Completion]]:
    """k samples per prompt from the trainer's policy engine (TRL's ``VLLMGeneration``) at ``temperature``.

    The engine first gets the current weights (as TRL does before a generation: once per optimizer
    step). TRL's server mode gathers every process's prompts and hands each its slice by position,
    so every process sends as many prompts as the one with the most (repeats of a prompt, or a
    one-token prompt, fill in; their samples are dropped).
    """
    from armorlab.train.vllm_reference import completions

    gen = trainer.vllm_generation
    if trainer.state.global_step != trainer._last_loaded_step:
        gen.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step
    acc = trainer.accelerator
    most = len(prompt_ids)
    if acc.num_processes > 1:
        most = int(acc.gather(torch.tensor([len(prompt_ids)], device=acc.device)).max())
    filler = list(prompt_ids[-1]) if prompt_ids else [trainer._tokenizer.pad_token_id]
    padded = [list(p) for p in prompt_ids] + [filler] * (most - len(prompt_ids))
    rows = [p for p in padded for _ in range(k)]
    saved = gen.temperature, gen.top_p
    gen.temperature = temperature
    if temperature > 0 and trainer.args.val_top_p is not None:  # verl's val_kwargs.top_p
        gen.top_p = trainer.args.val_top_p
    try:
        _, completion_ids, _, _ = gen.generate(prompts=rows, images=None, num_generations=k)
    finally:
        gen.temperature, gen.top_p = saved
    return [completions(trainer._tokenizer, completion_ids[i * k:(i + 1) * k], trainer.eos_token_ids)
            for i in range(len(prompt_ids))]
