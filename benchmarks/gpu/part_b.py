"""(b) Both colocated vLLM engines (the policy's, TRL's, and π_ref's) with a push at every reset.

Right before each reset the π_ref engine still holds the old π_ref: against the policy (π_ref to
be) its log-probs are stale; right after the push they must match the new π_ref's HF log-probs
(the bf16 engine's noise). Records the engines' dtypes and the memory with both up. Skipped,
with a message, where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import math
import time

import common


def engine_logps(sampler, rows):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    with sampler.awake():
        outs = sampler.llm.generate([{"prompt_token_ids": r} for r in rows], sampling_params=params, use_tqdm=False)
    return [[d[t].logprob for d, t in zip(o.prompt_logprobs[1:], r[1:], strict=True)] for o, r in zip(outs, rows, strict=True)]


def hf_logps(model, rows):
    import torch

    out = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for r in rows:
            logits = model(input_ids=torch.tensor([r], device=device)).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r[1:], device=device).unsqueeze(-1))
            out.append(lp.squeeze(-1).cpu().tolist())
    return out


def gap(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def main() -> None:
    if importlib.util.find_spec("vllm") is None:
        common.report("b", {"status": "SKIP", "why": "vLLM is not installed here (a CUDA vLLM wheel and its "
                                                      "dependencies are far larger than a carried folder)"})
        return
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    common.quiet()
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    from armorlab.train.trainer import ArmorLabTrainer
    from armorlab.train.vllm_reference import VLLMReferenceSampler

    tok = AutoTokenizer.from_pretrained(common.MODEL_DIR)
    gpu = torch.cuda.is_available() and not common.CPU
    cfg = common.armorlab_config(
        "b", objective="armor", anchor=True, anchor_samples=2, ref_reset_steps=2, max_steps=4, learning_rate=1e-4,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.25 if gpu else 0.5,
        vllm_enable_sleep_mode=gpu, vllm_max_model_length=256, ref_vllm_mode="colocate",
        ref_vllm_memory=0.15 if gpu else 0.5, gradient_checkpointing=gpu)
    started = time.perf_counter()
    trainer = ArmorLabTrainer(str(common.MODEL_DIR), [common.even_first_token], cfg, train_dataset=common.dataset(64))
    init_s = time.perf_counter() - started
    sampler = trainer.reference_sampler
    assert isinstance(sampler, VLLMReferenceSampler)
    memory_both_up = common.peak_gib()
    rows = [tok(" ".join(common.prompts(1, seed=200 + i)))["input_ids"] for i in range(4)]
    checks: list[dict] = []

    class BeforeReset(TrainerCallback):  # inserted before armorlab's callback
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.reference.due(state.global_step):
                policy = trainer.accelerator.unwrap_model(trainer.model)
                checks.append({"step": state.global_step, "stale": gap(engine_logps(sampler, rows), hf_logps(policy, rows))})

    class AfterReset(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if trainer.reference.last_reset_step == state.global_step and checks:
                t = time.perf_counter()
                pushed = gap(engine_logps(sampler, rows), hf_logps(trainer.ref_model, rows))
                checks[-1].update(pushed=pushed, score_s=round(time.perf_counter() - t, 2))

    from armorlab.train.hooks import ArmorLabCallback

    callbacks = trainer.callback_handler.callbacks
    at = next(i for i, c in enumerate(callbacks) if isinstance(c, ArmorLabCallback))
    callbacks.insert(at, BeforeReset())
    trainer.add_callback(AfterReset())
    t = time.perf_counter()
    trainer.train()
    common.sync()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    ok = (len(losses) == 4 and all(math.isfinite(x) for x in losses) and trainer.reference.resets == 2
          and len(checks) == 2 and all("pushed" in c and c["pushed"] < 0.1 and c["stale"] > 10 * c["pushed"]
                                       for c in checks))
    result = {"status": "PASS" if ok else "FAIL", "init_s": round(init_s, 1), "train_s": round(time.perf_counter() - t, 1),
              "memory_both_engines_gib": memory_both_up, "peak_gib": common.peak_gib(),
              "policy_engine_dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype),
              "ref_engine_dtype": str(sampler.llm.llm_engine.model_config.dtype), "ref_engine_sleeps": sampler.sleeps,
              "ref_pushes": sampler.weight_pushes, "ref_generate_calls": sampler.generate_calls}
    for c in checks:
        result.update({f"reset{c['step']}_{k}": v for k, v in c.items() if k != "step"})
    common.report("b", result)


if __name__ == "__main__":
    main()
