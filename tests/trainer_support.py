"""Shared set-up for the trainer and launch tests: one cached tiny model, small configs, fake references."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

# Tests share the 2 cores with whatever else runs; one thread also makes runs bit-reproducible.
import torch

torch.set_num_threads(1)

# Same as the demo's: the default task sections (only train_size varies, which the model key
# ignores), so the tiny model is built once per cache and shared by every test.
TASK = {"name": "arithmetic", "train_size": 8}
SMALL = {
    "max_steps": 2, "val_every": 0, "kl_probe_prompts": 0, "save_steps": 1000, "seed": 0,
    "per_device_train_batch_size": 16, "num_generations": 8, "steps_per_generation": 2,
    # armorlab's own generation runs in chunks of this many rows: TRL's default 8 costs the tiny
    # model 4× the CPU time of one call per validation split (the chunking has its own tests)
    "per_device_eval_batch_size": 64,
}


def model_cache() -> str:
    """The tiny-model cache: $ARMORLAB_CACHE, else a per-machine temp dir reused across sessions."""
    return os.environ.get("ARMORLAB_CACHE") or str(Path(tempfile.gettempdir()) / "armorlab-test-cache")


def resolved(**overrides: Any) -> dict[str, Any]:
    from armorlab.core.config import resolve

    raw = {**SMALL, "task": dict(TASK), **overrides}
    return resolve(raw)


def build(tmp_path: Path, cfg: dict[str, Any], *, trainer_cls: Any = None, sampler: Any = None,
          with_eval: bool = False, callbacks: tuple = ()) -> Any:
    """An ArmorLabTrainer for a resolved config (the same path launch takes, plus test seams)."""
    from armorlab.core.runs import RunDir
    from armorlab.tasks import build_task
    from armorlab.train.launch import make_args
    from armorlab.train.models import prepare_model
    from armorlab.train.trainer import ArmorLabTrainer

    run_dir = RunDir.create(tmp_path / "runs", cfg)
    args = make_args(cfg, run_dir)
    task = build_task(cfg["task"])
    path = prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache())
    cls = trainer_cls or ArmorLabTrainer
    return cls(str(path), task.reward_funcs, args, train_dataset=task.train,
               val_dataset=task.val if with_eval else None, test_dataset=task.test if with_eval else None,
               reference_sampler=sampler, tokens_dir=run_dir.tokens_dir, callbacks=list(callbacks))


class AnswerSampler:
    """A fake reference that answers each prompt with ``answer_of(prompt_text)`` + eos, k times.

    ``answer_of`` returns the text; counting the prompts it was asked for lets the cache tests
    see every reference call.
    """

    def __init__(self, tokenizer: Any, answer_of: Any) -> None:
        from armorlab.train.anchors import Completion

        self._completion = Completion
        self.tokenizer = tokenizer
        self.answer_of = answer_of
        self.asked: list[str] = []

    def sample(self, prompt_ids, k):
        out = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids, skip_special_tokens=True)
            self.asked.append(prompt)
            text = self.answer_of(prompt)
            comp_ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + (
                self.tokenizer.eos_token_id,)
            out.append([self._completion(comp_ids, text) for _ in range(k)])
        return out


def answer_table(cfg: dict[str, Any]) -> dict[str, str]:
    from armorlab.tasks import build_task

    task = build_task(cfg["task"])
    return {row["prompt"]: row["answer"] for split in (task.train, task.val, task.test) for row in split}


def tokenizer_for(cfg: dict[str, Any]) -> Any:
    from transformers import AutoTokenizer

    from armorlab.train.models import prepare_model

    return AutoTokenizer.from_pretrained(str(prepare_model(cfg["model"], cfg["task"], cache_dir=model_cache())))


def capturing(*keys: str) -> Any:
    """An ArmorLabTrainer subclass that keeps, per training generation, a detached copy of the
    named entries of what `_generate_and_score_completions` returns (in `trainer.captured`)."""
    from armorlab.train.trainer import ArmorLabTrainer

    class Capture(ArmorLabTrainer):
        captured: list[dict[str, torch.Tensor]]

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if self.model.training:
                self.captured.append({k: v.detach().clone() for k, v in out.items() if k in keys})
            return out

    return Capture


def hf_logps(model: Any, rows: list[list[int]]) -> list[torch.Tensor]:
    """Each token's log-prob after the first under an HF causal LM (temperature 1), row by row."""
    out = []
    with torch.no_grad():
        for ids in rows:
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1))
    return out


def max_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def perturbed_copy(policy: Any, scale: float = 0.05, seed: int = 0) -> Any:
    """A separate copy of ``policy`` with seeded Gaussian noise on every weight (deepcopy would
    share TRL's patched forward, which calls the original model)."""
    from transformers import AutoModelForCausalLM

    moved = AutoModelForCausalLM.from_pretrained(policy.config._name_or_path, dtype=policy.dtype)
    moved.load_state_dict(policy.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return moved
