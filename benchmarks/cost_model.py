"""Per-rollout cost of DAPO and ARMOR at 7B × 8 H100 (issue 38 §5): a model, not a measurement.

    .venv/bin/python benchmarks/cost_model.py [--beyond-reference 1.05] [--armorlab-dapo 1.01]

One rollout of ``sweeps/paper/base.yaml`` on ``slurm/gpu-8x-fsdp.yaml``: 512 prompts × 16 responses
kept from 3× over-generation (dynamic sampling), 2,048-token responses on average, the policy's
rollouts from a colocated vLLM engine, FSDP2 training with gradient checkpointing. Each phase's time
is FLOPs / (peak × utilisation) or bytes / (bandwidth × efficiency); every input is printed with
its source, and those marked ``assumed`` are the ones to replace with a GPU measurement
(benchmarks/gpu/acceptance.py). Read the result as an order of magnitude: the ratios, not the
minutes, are what the shipped settings are judged by.

ARMOR adds to DAPO: π_ref's forward on the rows that train (filtered first), the anchors (k
reference draws per fresh group in one sampler call, or adaptive rounds of 1, 1, 2), the forward-KL
telemetry (2 forwards of the fresh first draws on 1 generation in 8), and per reset the weight push
to a π_ref engine. As shipped (``sweeps/paper/base.yaml``) the anchors come from a colocated π_ref
vLLM engine that sleeps like the policy's (``ref_vllm_mode: colocate``, ``ref_vllm_memory: 0.4``),
drawn afresh for every group (``anchor_cache: off``, Algorithm 1), one call of k. That engine holds
other weights than the policy's, so its draws cannot join the policy engine's generate call; and
both awake at once do not fit the GPU (two 0.4 shares beside training), so the anchors are a wave of
their own after the policy's, its time the larger of its tokens over the engine's throughput and
its longest response decoded one token per step (the latency floor of a round). The older paths are
printed beside it: HF ``generate`` on the FSDP π_ref (``ref_vllm_mode: none``, shipped before).
Both sides pay armorlab's own per-step bookkeeping, the CPU benchmark's measured excess
(``benchmarks/step_overhead.py``), applied to the trainer's phases.
Last line: ``armor_over_dapo_shipped=<x>``.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Input:
    value: float
    unit: str
    source: str


def inputs(opts: argparse.Namespace) -> dict[str, Input]:
    qwen = "Qwen2.5-Math-7B config.json"
    base = "sweeps/paper/base.yaml"
    sheet = "NVIDIA H100 SXM datasheet"
    return {
        "params": Input(7.62e9, "parameters", qwen + " (7.62 B)"),
        "layers": Input(28, "layers", qwen),
        "hidden": Input(3584, "", qwen),
        "kv_bytes": Input(2 * 28 * 4 * 128 * 2, "B/token", qwen + ": K+V × 28 layers × 4 KV heads × 128 × bf16"),
        "gpus": Input(8, "GPUs", "slurm/gpu-8x-fsdp.yaml"),
        "gpu_gb": Input(80e9 * 1.0737, "B", "slurm/gpu-8x-fsdp.yaml: 80 GiB"),
        "peak": Input(989e12, "FLOP/s", sheet + ": dense bf16"),
        "hbm": Input(3.35e12, "B/s", sheet + ": HBM3"),
        "mfu_train": Input(0.40, "", "assumed: FSDP2 bf16 7B forward+backward"),
        "mfu_score": Input(0.45, "", "assumed: no-grad forward, 16 rows × 2.3k tokens"),
        "hbm_eff": Input(0.80, "", "assumed: share of HBM bandwidth a decode step reaches"),
        "hf_token_s": Input(0.025, "s/token", "assumed: HF generate, eager, 28 layers, ≤ 8 rows, one H100"),
        "prompts": Input(512, "prompts", base + ": 512 prompts × 16 per rollout"),
        "group": Input(16, "responses", base + ": num_generations"),
        "over": Input(3, "×", base + ": dynamic_sampling_factor"),
        "prompt_tokens": Input(256, "tokens", "assumed: DAPO-Math prompt + template"),
        "response_tokens": Input(2048, "tokens", "issue 38: mean response length"),
        "vllm_share": Input(0.4, "", base + ": vllm_gpu_memory_utilization"),
        "ref_share": Input(0.4, "", base + ": ref_vllm_memory (armorlab plan: ≤ 0.69 fits, the engine sleeping)"),
        "ref_share_awake": Input(0.23, "", "armorlab plan: largest ref_vllm_memory that fits an engine never asleep"),
        "max_response": Input(3072, "tokens", base + ": max_completion_length (a round's longest response)"),
        "p_ref": Input(0.5, "", "assumed: π_ref's per-draw success rate (adaptive rounds only)"),
        "engine_other": Input(2e9, "B", "assumed: an engine's activations and CUDA graphs"),
        "k": Input(4, "draws", "config: anchor_samples"),
        "eval_rows": Input(8, "rows", "TRL default per_device_eval_batch_size: HF generate chunk"),
        "hit_shared": Input(0.93, "", "issue 38: anchor-cache hit rate, cache shared over 8 processes"),
        "hit_per_rank": Input(0.54, "", "issue 38: the same, one cache per process"),
        "tau": Input(10, "rollouts", "sweeps/paper/armor_table1.yaml: ref_reset_steps 160 optimizer steps / 16 per rollout"),
        "push_s": Input(5.0, "s", "assumed: stream 15 GB of π_ref into its engine"),
        "bookkeeping_dapo": Input(opts.armorlab_dapo - 1, "", "benchmarks/step_overhead.py: armorlab dapo ratio − 1 (CPU)"),
        "bookkeeping_armor": Input(opts.beyond_reference - 1, "",
                                   "benchmarks/step_overhead.py: armor beyond-reference ratio − 1 (CPU)"),
    }


def forward_flops(p: dict[str, Input], tokens: float) -> float:
    """One sequence's forward: 2·N per token plus causal attention, 2·L·T²·d."""
    return 2 * p["params"].value * tokens + 2 * p["layers"].value * tokens ** 2 * p["hidden"].value


def vllm_tokens_per_s(p: dict[str, Input], share: float) -> float:
    """Decode throughput of one engine (TP 1): each step reads the weights and the KV cache of the
    sequences in flight, as many as the engine's KV budget holds at the mean context."""
    weights = 2 * p["params"].value
    kv_budget = share * p["gpu_gb"].value - weights - p["engine_other"].value
    context = p["prompt_tokens"].value + p["response_tokens"].value / 2
    seqs = max(1.0, kv_budget / (context * p["kv_bytes"].value))
    memory_s = (weights + seqs * context * p["kv_bytes"].value) / (p["hbm"].value * p["hbm_eff"].value)
    compute_s = seqs * 2 * p["params"].value / (p["peak"].value * p["mfu_score"].value)
    return seqs / max(memory_s, compute_s)


def vllm_wave_s(p: dict[str, Input], seqs_per_gpu: float, share: float) -> float:
    """One generate call's wall time on one GPU: its tokens over the engine's throughput, at least
    its longest response decoded one step at a time (a step reads all the weights)."""
    v = {k: x.value for k, x in p.items()}
    floor = v["max_response"] * 2 * v["params"] / (v["hbm"] * v["hbm_eff"])
    return max(seqs_per_gpu * v["response_tokens"] / vllm_tokens_per_s(p, share), floor)


def adaptive_rounds(k: int, p_success: float) -> list[float]:
    """Draws per prompt in each adaptive round (1, 1, 2, … up to k in all), weighted by the chance
    the prompt is still without a correct draw when the round starts."""
    sizes, left = [], k
    while left > 0:
        sizes.append(min(left, max(1, sum(sizes))))
        left -= sizes[-1]
    out, drawn = [], 0
    for size in sizes:
        out.append(size * (1 - p_success) ** drawn)
        drawn += size
    return out


def phases(p: dict[str, Input], *, armor: bool, engine: str = "hf", hit: float = 0.93,
           rounds: str = "one") -> dict[str, float]:
    """Seconds per rollout of each phase (the 8 GPUs work in parallel: per-GPU shares)."""
    v = {k: x.value for k, x in p.items()}
    kept = v["prompts"] * v["group"]
    drawn = kept * v["over"]
    seq = v["prompt_tokens"] + v["response_tokens"]
    fleet = v["gpus"] * v["peak"]
    score = forward_flops(p, seq) / (fleet * v["mfu_score"])  # seconds per scored row
    out = {
        "policy generation (vLLM)": drawn * v["response_tokens"] / v["gpus"] / vllm_tokens_per_s(p, v["vllm_share"]),
        # TRL scores π_old itself on every drawn row (vLLM importance-sampling correction)
        "π_old forward (all drawn rows)": drawn * score,
        "training (fwd + bwd + recompute)": kept * 4 * forward_flops(p, seq) / (fleet * v["mfu_train"]),
    }
    out["armorlab bookkeeping"] = v["bookkeeping_armor" if armor else "bookkeeping_dapo"] * (
        out["π_old forward (all drawn rows)"] + out["training (fwd + bwd + recompute)"])
    if not armor:
        return out
    out["π_ref forward (kept rows)"] = kept * score
    groups = drawn / v["group"]
    fresh_rows = groups * (1 - hit) * v["k"]  # one call of k draws per fresh group
    if engine == "hf":  # each process its share, in chunks of eval_rows, every token latency-bound
        calls = math.ceil(fresh_rows / v["gpus"] / v["eval_rows"])
        out["anchors (HF generate, FSDP π_ref)"] = calls * v["response_tokens"] * v["hf_token_s"]
    else:
        share = v["ref_share"] if engine == "colocate" else v["ref_share_awake"]
        fresh = groups * (1 - hit) / v["gpus"]
        per_round = [v["k"]] if rounds == "one" else adaptive_rounds(int(v["k"]), v["p_ref"])
        out[f"anchors (π_ref vLLM engine, {len(per_round)} wave(s) after the policy's)"] = sum(
            vllm_wave_s(p, fresh * d, share) for d in per_round) if fresh else 0.0
        out["π_ref engine push (per reset / τ)"] = v["push_s"] / v["tau"]
    out["forward KL (1 generation in 8)"] = 2 * groups * (1 - hit) / 8 * score
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--armorlab-dapo", type=float, default=1.01,
                        help="armorlab dapo / stock TRL cycle on CPU (benchmarks/step_overhead.py)")
    parser.add_argument("--beyond-reference", type=float, default=1.05,
                        help="armor's cycle less its π_ref work / stock TRL's on CPU (step_overhead.py)")
    opts = parser.parse_args()
    p = inputs(opts)
    print("# inputs")
    for name, x in p.items():
        print(f"#   {name} = {x.value:g} {x.unit}  ({x.source})")
    dapo = phases(p, armor=False)
    shared = p["hit_shared"].value
    shipped_case = "ARMOR as shipped (colocated π_ref engine asleep between uses, anchor_cache: off)"
    cases = {
        shipped_case: phases(p, armor=True, engine="colocate", hit=0.0),
        "the same, anchor_rounds: adaptive": phases(p, armor=True, engine="colocate", hit=0.0, rounds="adaptive"),
        "the same, anchor_cache: window (armor_controls' arm; shared cache)": phases(
            p, armor=True, engine="colocate", hit=shared),
        "π_ref engine never asleep (share 0.23), anchor_cache: off": phases(p, armor=True, engine="awake", hit=0.0),
        "HF generate on the FSDP π_ref (ref_vllm_mode: none), anchor_cache: window, shared": phases(
            p, armor=True, hit=shared),
        "HF generate, anchor_cache: window, one cache per process": phases(p, armor=True,
                                                                         hit=p["hit_per_rank"].value),
        "HF generate, anchor_cache: off": phases(p, armor=True, hit=0.0),
    }
    total = sum(dapo.values())
    print(f"# DAPO per rollout: {total / 60:.1f} min")
    for name, s in dapo.items():
        print(f"#   {name}: {s / 60:.2f} min")
    ratios = {}
    for case, parts in cases.items():
        mine = sum(parts.values())
        ratios[case] = mine / total
        print(f"# {case}: {mine / 60:.1f} min = {ratios[case]:.2f}× DAPO")
        for name, s in parts.items():
            if name not in dapo or s != dapo[name]:
                print(f"#   {name}: {s / 60:.2f} min")
    print(f"armor_over_dapo_shipped={ratios[shipped_case]:.3f}  # target ≤ 1.15")


if __name__ == "__main__":
    main()
