"""Issue 9 §1, the test of record: one optimiser step means the same in every launch.

One plain-SGD step on the same generation batch of 2B rows must give the same weights for
``one_batch`` (1 process, GA 1, batch 2B), ``accumulated`` (1 process, GA 2, batch B) and
``two_procs`` (2 processes, GA 1, batch B; run as ``torchrun --nproc_per_node 2 THIS_FILE OUT``).

What makes it a real test:
- completions have lengths 1..8 that differ within and across groups (a deterministic
  "generation" keyed by the prompt and the row's place in its group), so every normalisation
  rule gives a different step;
- G = 4 does not divide B = 6: the middle group straddles the two processes;
- anchors and the gate are on (one of the three prompts is unsolvable for the reference, so its
  group leaves the loss and every count), and π_ref is perturbed so that armor's r_mix and the
  β·KL term (β ≠ 0) both carry gradient.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # under torchrun: make `tests.` importable like pytest does
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from armorlab.train.trainer import ArmorLabTrainer
from tests.trainer_support import AnswerSampler, answer_table, build, resolved, tokenizer_for

OBJECTIVES = ("dapo", "grpo", "dr_grpo", "gspo", "up", "armor",
              # the field's objectives (issue 39); clip_cov and kl_cov pick tokens by the statistics of
              # each micro-batch, as verl does, so their step depends on the split by design
              "cispo", "cispo_verl", "sapo", "gmpo", "dppo_tv", "dppo_kl", "gpg", "dro", "bnpo", "luspo", "vespo")
G, B, MAX_LEN = 4, 6, 8
LAYOUTS = {"one_batch": (2 * B, 1), "accumulated": (B, 2), "two_procs": (B, 1)}  # per-device batch, GA
TASK = {"name": "arithmetic", "train_size": 3}  # one generation batch = all 3 prompts


def config(objective: str, layout: str) -> dict[str, Any]:
    per_device, ga = LAYOUTS[layout]
    return resolved(objective=objective, task=dict(TASK), anchor=True, anchor_gate=True, anchor_ratio="mixed",
                    alpha=0.8 if objective == "armor" else None, beta=0.01, max_steps=1,
                    optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=0.0,
                    weight_decay=0.0, save_strategy="no", per_device_train_batch_size=per_device, gradient_accumulation_steps=ga,
                    steps_per_generation=ga, num_generations=G, max_completion_length=MAX_LEN, seed=3,
                    dro_beta=0.3)  # read by dro only (dropped from the others' configs)


def _key(prompt: str) -> int:
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)


def completion_ids(tokenizer: Any, prompt: str, answer: str, j: int) -> list[int]:
    """Row j of the prompt's group: the right answer on one row, else wrong digits of a length
    in 1..MAX_LEN (no eos at MAX_LEN: truncated)."""
    h = _key(prompt)
    if j == h % G:
        return tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    length = 1 + (h // 7 + 3 * j) % MAX_LEN
    ids = tokenizer(str(h + j)[:length].rjust(length, "9"), add_special_tokens=False)["input_ids"]
    return ids + ([tokenizer.eos_token_id] if length < MAX_LEN else [])


class FixedRolloutTrainer(ArmorLabTrainer):
    """Deterministic "generation" from the GLOBAL row index; perturbed π_ref; records each batch."""

    def __init__(self, *args: Any, answers: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers = answers
        self.captured: list[dict[str, Any]] = []
        gen = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for p in self.ref_model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=gen).to(p.device, p.dtype))

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        first = self.accelerator.process_index * len(prompt_ids)  # rows are global groups of G in order
        out = []
        for i, ids in enumerate(prompt_ids):
            prompt = self._tokenizer.decode(ids, skip_special_tokens=True)
            out.append(completion_ids(self._tokenizer, prompt, self.answers[prompt], (first + i) % G))
        return out, None

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self.captured.append({k: out[k].tolist() for k in (
                "armorlab_group", "armorlab_is_anchor", "armorlab_keep", "armorlab_gen_tokens", "armorlab_gen_rows")}
                | {"lengths": out["completion_mask"].sum(1).tolist()})
        return out


def one_step(tmp: Path, objective: str, layout: str) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Weights after one step minus before, and what the generation looked like on this process."""
    cfg = config(objective, layout)
    answers = answer_table(cfg)
    from armorlab.tasks import build_task

    unsolvable = sorted(build_task(cfg["task"]).train["prompt"])[0]  # the gate drops this prompt's group
    sampler = AnswerSampler(tokenizer_for(cfg), lambda p: "xx" if p == unsolvable else answers[p])
    trainer = build(tmp / f"{objective}-{layout}", cfg, trainer_cls=_with_answers(answers), sampler=sampler)
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer.train()
    after = model.state_dict()
    return {k: (after[k] - before[k]).cpu() for k in before}, trainer.captured


def _with_answers(answers: dict[str, str]) -> type:
    class _Bound(FixedRolloutTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, answers=answers, **kwargs)

    return _Bound


def residual(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max |Δa − Δb| / max |Δa| over all weights."""
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    scale = max(float(a[k].abs().max()) for k in a)
    return diff / scale


def main(out: str) -> None:
    """The two_procs layout for every objective; rank 0 writes the steps, every rank its batches."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    out_dir = Path(out)
    rank = None
    for objective in OBJECTIVES:
        delta, captured = one_step(out_dir / "runs", objective, "two_procs")
        rank = dist.get_rank()
        if rank == 0:
            torch.save(delta, out_dir / f"{objective}.pt")
        (out_dir / f"{objective}-r{rank}.json").write_text(json.dumps(captured))


if __name__ == "__main__":
    main(sys.argv[1])
