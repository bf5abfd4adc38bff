"""Reference samples per second for anchor rollout: transformers ``generate`` vs a vLLM engine.

    .venv-vllm/bin/python benchmarks/anchor_sampling.py [--prompts 64] [--k 4] [--rounds 3]

k = 4 reference samples for each of 64 prompts, from the same tiny model with the same sampling
settings (temperature 1, top-p 1, no top-k, the tiny preset's 8 completion tokens): armorlab's
``TransformersSampler`` (one left-padded batch of 256 rows) against ``VLLMReferenceSampler`` on
an in-process vLLM engine in fp32. The two alternate, ``--rounds`` times each; rates use the
median wall time of a round. Then the same through ``AnchorRollout`` with its cache, each prompt
recurring 4 times per reference window (the cache is cleared at the start of each window, as a
reset does): samples served per second, a quarter of them generated. No sample is ever correct
there, so every prompt takes all k draws, over the adaptive rejection's rounds (1, 1, 2 at k = 4).

Needs vLLM (``make test-vllm`` builds ``.venv-vllm``); without it the script says so and exits 0.
Last line: ``vllm_speedup=<x>`` = vLLM samples/s ÷ transformers samples/s, no cache.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

REPEATS = 4  # each prompt recurs this many times per reference window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        print("anchor_sampling: skipped, vLLM is not installed (run it with .venv-vllm/bin/python after "
              "`make test-vllm`)")
        return

    import logging

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from armorlab.core.config import resolve
    from armorlab.tasks import build_task
    from armorlab.train.anchors import AnchorCache, AnchorRollout, GroupRequest, TransformersSampler
    from armorlab.train.models import prepare_model
    from armorlab.train.vllm_reference import VLLMReferenceSampler, colocate_engine, sampling_kwargs

    logging.getLogger("vllm").setLevel(logging.WARNING)
    cfg = resolve({"task": {"name": "arithmetic", "train_size": max(opts.prompts, 8)}})
    path = str(prepare_model(cfg["model"], cfg["task"]))
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [row["prompt"] for row in build_task(cfg["task"]).train][:opts.prompts]
    ids = [tok(p)["input_ids"] for p in prompts]
    eos = [tok.eos_token_id]
    max_new = cfg["max_completion_length"]

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    gen = GenerationConfig(max_new_tokens=max_new, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                           pad_token_id=tok.pad_token_id, eos_token_id=eos, disable_compile=True)
    hf = TransformersSampler(model, tok, gen, eos, batch_size=opts.prompts * opts.k)
    llm = colocate_engine(path, memory_share=0.2, seed=0, dtype="float32")
    vl = VLLMReferenceSampler(llm, tok, sampling_kwargs(k=opts.k, max_tokens=max_new, temperature=1.0, top_p=1.0,
                                                        top_k=0, min_p=None, repetition_penalty=1.0), eos)
    samplers = {"hf": hf, "vllm": vl}
    for s in samplers.values():  # warm-up: first-call allocations and kernel selection
        s.sample(ids[:2], opts.k)

    def plain(s):
        t = time.perf_counter()
        out = s.sample(ids, opts.k)
        assert len(out) == len(ids) and all(len(group) == opts.k for group in out)
        return time.perf_counter() - t

    def cached(s):
        # never correct: every prompt takes all k draws (the adaptive rejection's rounds 1, 1, 2, ...)
        rollout = AnchorRollout(s, lambda reqs, samples: [[0.0] * len(g) for g in samples], k=opts.k,
                                anchor_filter="correct", threshold=1.0, cache=AnchorCache())
        reqs = [GroupRequest(p, i) for p, i in zip(prompts, ids, strict=True)]
        t, generated = time.perf_counter(), 0
        for step in range(REPEATS):
            generated += rollout.run(reqs, seed=0, step=step)[1]
        assert generated == len(ids) * opts.k
        return time.perf_counter() - t

    times: dict[str, list[float]] = {f"{n}{c}": [] for n in samplers for c in ("", "_cached")}
    for _ in range(opts.rounds):
        for name, s in samplers.items():
            times[name].append(plain(s))
            times[f"{name}_cached"].append(cached(s))
    served = len(ids) * opts.k
    rate = {name: served * (REPEATS if name.endswith("_cached") else 1) / statistics.median(t)
            for name, t in times.items()}
    print(f"prompts={len(ids)} k={opts.k} max_new_tokens={max_new} rounds={opts.rounds}")
    for name, r in rate.items():
        print(f"{name}_samples_per_s={r:.1f}")
    print(f"hf_cache_speedup={rate['hf_cached'] / rate['hf']:.2f}")
    print(f"vllm_cache_speedup={rate['vllm_cached'] / rate['vllm']:.2f}")
    print(f"vllm_cached_vs_hf={rate['vllm_cached'] / rate['hf']:.2f}")
    print(f"vllm_speedup={rate['vllm'] / rate['hf']:.2f}")


if __name__ == "__main__":
    main()
