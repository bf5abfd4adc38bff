"""What every part of the GPU acceptance script shares: the model and tokenizer built in code, the
task, the reward, the trainer config, and how a part reports (one JSON file under $OUT).

No network anywhere: the tokenizer is a byte-level BPE trained here over made-up words, the model a
random-init Qwen2 (≈ 0.5 B parameters on GPU; tiny shapes with ``--cpu``), the prompts random words.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

CPU = os.environ.get("ARMORLAB_ACCEPT_CPU") == "1"
OUT = Path(os.environ.get("ARMORLAB_ACCEPT_OUT", "/tmp/armorlab-accept"))  # small files only: what comes back
# the model (≈ 1 GB on GPU), the trainers' output dirs, carried wheels' site and full logs: never under OUT
WORK = Path(os.environ.get("ARMORLAB_ACCEPT_WORK", "/tmp/armorlab-accept-work"))
MODEL_DIR = WORK / "model"
ROOT = Path(__file__).resolve().parents[2]  # the project checkout: armorlab runs from its source tree

# ≈ 0.49 B parameters: embeddings and untied head 2 × 32 000 × 1 536, 16 layers of 24.4 M
SHAPES = {
    "gpu": {"vocab": 32_000, "hidden": 1536, "layers": 16, "heads": 12, "kv_heads": 2, "intermediate": 4096,
            "words": 128_000},
    "cpu": {"vocab": 600, "hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128,
            "words": 2_000},
}
SIZES = {  # per part: rows per step, group size, completion length
    "gpu": {"batch": 32, "generations": 8, "completion": 64, "throughput_completion": 256},
    "cpu": {"batch": 8, "generations": 4, "completion": 8, "throughput_completion": 8},
}
EOS = "<|endoftext|>"


def shapes() -> dict[str, int]:
    return SHAPES["cpu" if CPU else "gpu"]


def sizes() -> dict[str, int]:
    return SIZES["cpu" if CPU else "gpu"]


def build_model(path: Path = MODEL_DIR) -> dict[str, Any]:
    """Train the tokenizer, build the random-init Qwen2 and save both to ``path`` (bf16 weights).

    transformers 5 reads every ``qwen2`` checkpoint's tokenizer as ``Qwen2Tokenizer`` (vocab +
    merges): a byte-level BPE round-trips through it, a word-level one would encode to ``[]``.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    s = shapes()
    started = time.perf_counter()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = [f"w{i}" for i in range(s["words"])]
    trainer = trainers.BpeTrainer(vocab_size=s["vocab"], special_tokens=[EOS, "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((" ".join(words[i:i + 64]) for i in range(0, len(words), 64)), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=1024, tie_word_embeddings=False,
                         eos_token_id=fast.eos_token_id, bos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, dtype="bfloat16")
    device = "cpu" if CPU or not torch.cuda.is_available() else "cuda"
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # peaked next-token distributions, like a trained LM's (not a uniform soup)
        model.lm_head.weight.mul_(8.0)
    model.to(torch.bfloat16).save_pretrained(path)
    fast.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "vocab": tok.get_vocab_size(), "build_s": round(time.perf_counter() - started, 1)}


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` prompts of 6 random made-up words (≈ 24 tokens on the GPU shapes)."""
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(shapes()['words'])}" for _ in range(6)) for _ in range(n)]


def even_first_token(completion_ids=None, **kwargs) -> list[float]:
    """1 when the completion's first token id is even: p ≈ ½, so groups have reward spread."""
    return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


def dataset(n: int, seed: int = 0) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": prompts(n, seed)})


def device_kwargs() -> dict[str, Any]:
    """Precision and memory settings of the run: bf16 mixed precision and gradient checkpointing on GPU."""
    if CPU:
        return {"use_cpu": True, "bf16": False, "gradient_checkpointing": False}
    return {"bf16": True, "gradient_checkpointing": True}


def armorlab_config(name: str, **overrides: Any) -> Any:
    """An ``ArmorLabConfig`` for a part (output under WORK/runs/<name>)."""
    from armorlab.train.trainer import ArmorLabConfig

    s = sizes()
    kwargs = {"output_dir": str(WORK / "runs" / name), "report_to": [], "save_strategy": "no", "logging_steps": 1,
              "disable_tqdm": True, "seed": 0, "learning_rate": 1e-5, "lr_scheduler_type": "constant",
              "per_device_train_batch_size": s["batch"], "num_generations": s["generations"],
              "steps_per_generation": 2, "max_completion_length": s["completion"], "val_every": 0,
              "kl_probe_prompts": 0, "per_device_eval_batch_size": s["batch"], **device_kwargs()}
    kwargs.update(overrides)
    return ArmorLabConfig(**kwargs)


def planned_peak(run: dict[str, Any], prompt_tokens: int) -> dict[str, Any]:
    """What ``armorlab plan`` says this run's peak is on this GPU (one process), less the plan's
    allowances that ``torch.cuda.max_memory_allocated`` cannot see (the CUDA context, allocator
    fragmentation, a sleeping engine's leftovers): the figure the measured peak is compared with."""
    import torch

    from armorlab.core.config import resolve
    from armorlab.core.plan_inputs import parallelism_from_env, plan_config

    cfg = resolve({"model": str(MODEL_DIR), "task": {"name": "arithmetic"}, "val_every": 0, "kl_probe_prompts": 0,
                   **{k: v for k, v in run.items() if k not in ("report_to", "save_strategy", "logging_steps",
                                                                 "disable_tqdm", "use_cpu", "output_dir")}})
    gpu = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() and not CPU else None
    plan = plan_config(cfg, parallelism_from_env(), gpu, prompt_tokens=prompt_tokens)
    unseen = sum(line.bytes for line in plan.resident if line.key in ("context", "frag", "sleep", "ref_sleep"))
    return {"plan_peak_gib": round((plan.peak_bytes - unseen) / 2**30, 3),
            "plan_peak_phase": plan.peak_phase.label if plan.peak_phase else None}


def prompt_tokens(texts: list[str]) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    return max(len(tok(t).input_ids) for t in texts)


def peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def report(part: str, result: dict[str, Any]) -> None:
    """Write the part's result (a flat dict; ``status`` PASS, FAIL or SKIP) and print it."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{part}.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, default=str))


def quiet() -> None:
    import logging

    import transformers

    transformers.logging.set_verbosity_error()
    logging.getLogger("armorlab").setLevel(logging.WARNING)
    sys.path.insert(0, str(ROOT))
