"""(d) Tokens/s of armorlab dapo and armor (anchors + gate, k = 4) against stock TRL
``GRPOTrainer(loss_type="dapo", beta=0)``, the peer a user would run instead.

Same model, batch, seed and bf16 load; every completion is forced to the full length
(``min_new_tokens``) so all trainers generate the same number of tokens. One generation warms up,
two are timed (CUDA-synchronised wall time). Each trainer's time is split into policy generation,
reference draws, scoring and training (benchmarks/lockstep.py's ``Split``), as step_overhead.py does on CPU.
Each trainer runs alone on the GPU (the one before is deleted first); its peak allocated memory is
compared with ``armorlab plan``'s peak for the same config, less the allowances the allocator's
counter cannot see (``common.planned_peak``): within 15 % on GPU, or the part fails.
"""

from __future__ import annotations

import gc
import time

import common

PLAN_TOLERANCE = 0.15


def main() -> None:
    common.quiet()
    import sys

    sys.path.insert(0, str(common.ROOT / "benchmarks"))
    import lockstep
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from armorlab.train.trainer import ArmorLabTrainer

    s = common.sizes()
    # one warm-up generation, then two timed (one on CPU, where the figures mean nothing anyway)
    length, spg, generations = s["throughput_completion"], (1 if common.CPU else 2), (2 if common.CPU else 3)
    steps = spg * generations
    shared = {"per_device_train_batch_size": s["batch"], "num_generations": s["generations"], "steps_per_generation": spg,
              "max_completion_length": length, "generation_kwargs": {"min_new_tokens": length}, "max_steps": steps,
              "learning_rate": 1e-6, "seed": 0, "report_to": [], "save_strategy": "no", "logging_steps": 1,
              "disable_tqdm": True, **common.device_kwargs()}
    if not common.CPU:  # bf16 weights on the GPU; on the CPU bf16 matmuls only slow the smoke run down
        shared["model_init_kwargs"] = {"dtype": "bfloat16"}
    data = common.dataset(s["batch"] * steps)

    def clock() -> float:
        common.sync()
        return time.perf_counter()

    class Timer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(clock())

    def measure(name: str, trainer) -> dict:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        timer = Timer()
        trainer.add_callback(timer)
        parts = {"policy": (trainer, "_generate_single_turn"), "score": (trainer, "_generate_and_score_completions")}
        if getattr(trainer, "anchor_rollout", None) is not None:
            parts["draws"] = (trainer.reference_sampler, "sample")
        split = lockstep.Split(trainer, parts, spg, clock)
        trainer.train()
        timed = range(1, generations)  # cycles 1..: the first generation warms up
        seconds = timer.ends[-1] - timer.ends[spg - 1]
        policy, score = split.mean("policy", timed), split.mean("score", timed)
        draws = split.mean("draws", timed) if "draws" in split.spent else 0.0
        cycle = seconds / len(timed)
        tokens = s["batch"] * spg * length  # per generation: every completion forced to the full length
        return {f"{name}_peak_gib": common.peak_gib(), f"{name}_tokens_per_s": round(tokens / cycle, 1), f"{name}_policy_generation_s": round(policy, 3),
                f"{name}_reference_draws_s": round(draws, 3), f"{name}_scoring_s": round(score - policy - draws, 3),
                f"{name}_training_s": round(cycle - score, 3)}

    result: dict = {"completion_tokens": length, "rows_per_step": s["batch"]}
    stock_args = GRPOConfig(output_dir=str(common.WORK / "runs" / "d_stock"), loss_type="dapo", beta=0.0, **shared)
    result.update(measure("stock_dapo", GRPOTrainer(str(common.MODEL_DIR), [common.even_first_token], args=stock_args,
                                                    train_dataset=data)))
    gc.collect()
    prompt_tokens = common.prompt_tokens(data["prompt"])
    for name, extra in (("armorlab_dapo", {"objective": "dapo"}),
                        ("armorlab_armor", {"objective": "armor", "anchor": True, "anchor_gate": True,
                                            "anchor_samples": 4})):
        cfg = common.armorlab_config(f"d_{name}", **shared, **extra)
        trainer = ArmorLabTrainer(str(common.MODEL_DIR), [common.even_first_token], cfg, train_dataset=data)
        result.update(measure(name, trainer))
        del trainer
        gc.collect()
        plan = common.planned_peak({**shared, **extra}, prompt_tokens)
        result.update({f"{name}_{k}": v for k, v in plan.items()})
        if result[f"{name}_peak_gib"] is not None:
            result[f"{name}_peak_over_plan"] = round(result[f"{name}_peak_gib"] / plan["plan_peak_gib"], 3)
    base = result["stock_dapo_tokens_per_s"]
    for name in ("armorlab_dapo", "armorlab_armor"):
        result[f"{name}_ratio_vs_stock_dapo"] = round(result[f"{name}_tokens_per_s"] / base, 3)
        trainer_side = (result[f"{name}_scoring_s"] + result[f"{name}_training_s"]) / max(
            result["stock_dapo_scoring_s"] + result["stock_dapo_training_s"], 1e-9)
        result[f"{name}_trainer_side_time_ratio"] = round(trainer_side, 3)  # what remains when generation is cheap
    fast = all(result[f"{n}_tokens_per_s"] > 0 for n in ("stock_dapo", "armorlab_dapo", "armorlab_armor"))
    planned = all(abs(result.get(f"{n}_peak_over_plan", 1.0) - 1) <= PLAN_TOLERANCE
                  for n in ("armorlab_dapo", "armorlab_armor"))  # no peak on CPU: nothing to compare
    result["peak_within_plan_tolerance"] = planned
    result["status"] = "PASS" if fast and planned else "FAIL"
    common.report("d", result)


if __name__ == "__main__":
    main()
