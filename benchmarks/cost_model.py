"""Per-rollout cost of DAPO and ARMOR at 7B × 8 H100 (issue 38 §5): a model, not a measurement.

    .venv/bin/python benchmarks/cost_model.py [--beyond-reference 1.05] [--armorlab-dapo 1.01]

One rollout of ``sweeps/paper/base.yaml`` on ``slurm/gpu-8x-fsdp.yaml``: 512 prompts × 16 responses
kept from 3× over-generation (dynamic sampling), 2,048-token responses on average, the policy's
rollouts from a colocated vLLM engine, FSDP2 training with gradient checkpointing. Each phase's time
is FLOPs / (peak × utilisation) or bytes / (bandwidth × efficiency); every input is printed with
its source, and those marked ``assumed`` are the ones to replace with a GPU measurement
(benchmarks/gpu/acceptance.py). Read the result as an order of magnitude: the ratios, not the
minutes, are what the shipped settings are judged by.

The peer is stock TRL's GRPOTrainer (loss_type dapo, β = 0), which scores π_old on every drawn row
for its vLLM importance-sampling correction; armorlab scores π_old and π_ref after the filter, on
the rows that train (armorlab's own dapo is printed beside it). ARMOR adds π_ref's forward on those
rows, the anchors (k reference draws per fresh group in one sampler call, or adaptive rounds of 1, 1,
2; none for a group the policy solved, ``anchor_skip_solved``, ``--solved`` of the groups drawn), the
forward-KL telemetry (2 forwards of the fresh first draws on 1 generation in 8), and per reset the
weight push to a π_ref engine. As shipped (``sweeps/paper/base.yaml``) the anchors come from a colocated π_ref
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
        "solved": Input(opts.solved, "", "assumed: groups drawn whose 16 samples are all correct (dynamic_sampling_factor"
                        " 3 expects ≈ 2/3 uniform groups; DAPO §3.2: the all-correct share grows in training)"),
        "engine_other": Input(2e9, "B", "assumed: an engine's activations and CUDA graphs"),
        "k": Input(4, "draws", "config: anchor_samples"),
        "eval_rows": Input(8, "rows", "TRL default per_device_eval_batch_size: HF generate chunk"),
        "hit_shared": Input(0.93, "", "issue 38: anchor-cache hit rate, cache shared over 8 processes"),
        "hit_per_rank": Input(0.54, "", "issue 38: the same, one cache per process"),
        "tau": Input(10, "rollouts", "sweeps/paper/armor_table1.yaml: ref_reset_steps 160 optimizer steps / 16 per rollout"),
        "push_s": Input(5.0, "s", "assumed: stream 15 GB of π_ref into its engine"),
        # read at c151af0: since then the CPU ratios also save π_old's forward of the first micro-batch,
        # which vLLM's importance-sampling correction (on in the paper profile) rules out
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


def phases(p: dict[str, Input], *, armor: bool, engine: str = "hf", hit: float = 0.93, rounds: str = "one",
           filter_first: bool = True, skip_solved: bool = True, stock: bool = False) -> dict[str, float]:
    """Seconds per rollout of each phase (the 8 GPUs work in parallel: per-GPU shares). ``stock``:
    TRL's own GRPOTrainer, which scores π_old on every drawn row (its vLLM importance-sampling
    correction) and pays no armorlab bookkeeping; armorlab scores after the filter (``filter_first``)."""
    v = {k: x.value for k, x in p.items()}
    kept = v["prompts"] * v["group"]
    drawn = kept * v["over"]
    seq = v["prompt_tokens"] + v["response_tokens"]
    fleet = v["gpus"] * v["peak"]
    score = forward_flops(p, seq) / (fleet * v["mfu_score"])  # seconds per scored row
    old = "π_old forward (kept rows)" if filter_first and not stock else "π_old forward (all drawn rows)"
    out = {
        "policy generation (vLLM)": drawn * v["response_tokens"] / v["gpus"] / vllm_tokens_per_s(p, v["vllm_share"]),
        old: (kept if filter_first and not stock else drawn) * score,
        "training (fwd + bwd + recompute)": kept * 4 * forward_flops(p, seq) / (fleet * v["mfu_train"]),
    }
    if not stock:
        out["armorlab bookkeeping"] = v["bookkeeping_armor" if armor else "bookkeeping_dapo"] * (
            out[old] + out["training (fwd + bwd + recompute)"])
    if not armor:
        return out
    out["π_ref forward (kept rows)"] = kept * score
    groups = drawn / v["group"] * (1 - v["solved"] if skip_solved else 1)  # groups that ask for an anchor
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
    parser.add_argument("--solved", type=float, default=0.4,
                        help="share of drawn groups whose samples are all correct (no anchor with anchor_skip_solved)")
    parser.add_argument("--beyond-reference", type=float, default=1.05,
                        help="armor's cycle less its π_ref work / stock TRL's on CPU (step_overhead.py)")
    opts = parser.parse_args()
    p = inputs(opts)
    print("# inputs")
    for name, x in p.items():
        print(f"#   {name} = {x.value:g} {x.unit}  ({x.source})")
    dapo = phases(p, armor=False, stock=True)
    shared = p["hit_shared"].value
    shipped_case = ("ARMOR as shipped (colocated π_ref engine asleep between uses, anchor_cache: off, "
                    "anchor_skip_solved, π_old and π_ref scored after the filter)")
    colocate = {"armor": True, "engine": "colocate", "hit": 0.0}
    cases = {
        "armorlab dapo (π_old scored after the filter)": phases(p, armor=False),
        shipped_case: phases(p, **colocate),
        "the same, anchor_skip_solved: false (an anchor for every group drawn)": phases(
            p, **colocate, skip_solved=False),
        "the same, π_old scored on every drawn row (TRL's order)": phases(p, **colocate, filter_first=False),
        "neither (shipped before issue 38's last round)": phases(p, **colocate, filter_first=False,
                                                                 skip_solved=False),
        "the same as shipped, anchor_rounds: adaptive": phases(p, **colocate, rounds="adaptive"),
        "the same as shipped, anchor_cache: window (armor_controls' arm; shared cache)": phases(
            p, armor=True, engine="colocate", hit=shared),
        "π_ref engine never asleep (share 0.23), anchor_cache: off": phases(p, armor=True, engine="awake", hit=0.0),
        "HF generate on the FSDP π_ref (ref_vllm_mode: none), anchor_cache: window, shared": phases(
            p, armor=True, hit=shared),
        "HF generate, anchor_cache: off": phases(p, armor=True, hit=0.0),
    }
    total = sum(dapo.values())
    print(f"# DAPO per rollout (stock TRL GRPOTrainer, loss_type dapo, β = 0, vLLM colocate): {total / 60:.1f} min")
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
    own = ratios[shipped_case] / ratios["armorlab dapo (π_old scored after the filter)"]
    print(f"# ARMOR as shipped over armorlab dapo (both score after the filter): {own:.2f}×")
    for solved in (0.0, 0.2, 0.6):
        q = {**p, "solved": Input(solved, "", "")}
        print(f"# ARMOR as shipped at solved = {solved}: {sum(phases(q, **colocate).values()) / total:.2f}× DAPO")
    print(f"armor_over_dapo_shipped={ratios[shipped_case]:.3f}  # target ≤ 1.15")


if __name__ == "__main__":
    main()
