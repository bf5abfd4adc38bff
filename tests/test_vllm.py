"""A real vLLM engine as π_ref (``ref_vllm_mode: colocate``) on the tiny model: `make test-vllm`.

One trainer (and so one in-process engine, ~20 s to start on CPU) is shared by the module.
"""

from __future__ import annotations

import gc
import math
import os

import pytest
import torch

from tests.trainer_support import build, capturing, hf_logps, max_gap, perturbed_copy, resolved

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: ~20 s startup instead of ~50 s


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """ARMOR, anchors from the vLLM reference, π_ref reset every step, 2 steps."""
    Capture = capturing("armorlab_is_anchor", "completion_ids", "completion_mask")

    cfg = resolved(objective="armor", max_steps=2, ref_reset_steps=1, ref_vllm_mode="colocate")
    trainer = build(tmp_path_factory.mktemp("vllm"), cfg, trainer_cls=Capture)
    trainer.captured = []
    trainer.train()
    # the engine's counters as training left them: other tests of this module call it too, in any order
    trainer.trained_counts = (trainer.reference_sampler.generate_calls, trainer.reference_sampler.prompts_sent,
                              trainer.anchor_rollout.rounds)
    yield trainer
    trainer.reference_sampler.llm = None  # free the engine: the policy-engine tests start their own
    gc.collect()


def test_armor_trains_with_anchors_from_the_vllm_reference(trained):
    from armorlab.train.vllm_reference import VLLMReferenceSampler

    sampler = trained.reference_sampler
    assert isinstance(sampler, VLLMReferenceSampler)
    assert trained.state.global_step == 2
    assert trained.reference.resets == 2
    # one batched generate per sampling round of the one generation batch (steps_per_generation = 2:
    # one batch in 2 steps); adaptive rejection: rounds of 1, 1, 2 samples at k = 4, later rounds
    # only for the prompts still without a correct sample
    generate_calls, prompts_sent, rounds = trained.trained_counts
    assert 1 <= generate_calls == rounds <= 3
    groups = 16 * 2 // 8  # per_device_train_batch_size × steps_per_generation / num_generations
    assert prompts_sent <= groups * rounds
    anchors = sum(int(c["armorlab_is_anchor"].sum()) for c in trained.captured)
    assert anchors > 0, "the warm-started reference found no correct sample: nothing was anchored"
    for c in trained.captured:
        for row in c["armorlab_is_anchor"].nonzero().flatten().tolist():
            n = int(c["completion_mask"][row].sum())
            assert 0 < n <= trained.args.max_completion_length
    losses = [h["loss"] for h in trained.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def _engine_logps(llm, rows):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
    outs = llm.generate([{"prompt_token_ids": ids} for ids in rows], sampling_params=params, use_tqdm=False)
    return [torch.tensor([d[t].logprob for d, t in zip(o.prompt_logprobs[1:], ids[1:], strict=True)])
            for o, ids in zip(outs, rows, strict=True)]


def test_after_a_reset_the_engine_scores_like_the_policy(trained):
    tok = trained._tokenizer
    rows = [tok(p + a)["input_ids"] for p, a in (("12+7=", "19"), ("3*4=", "12"), ("40-8=", "32"))]
    policy = trained.accelerator.unwrap_model(trained.model)
    llm = trained.reference_sampler.llm
    # the last step's reset pushed the policy's weights into the engine
    gap_trained = max_gap(_engine_logps(llm, rows), hf_logps(policy, rows))
    moved = perturbed_copy(policy)
    gap_stale = max_gap(_engine_logps(llm, rows), hf_logps(moved, rows))
    trained.reference_sampler.sync_from(moved)
    gap_pushed = max_gap(_engine_logps(llm, rows), hf_logps(moved, rows))
    trained.reference_sampler.sync_from(policy)  # leave the engine as the trainer had it
    print(f"logp gaps: trained={gap_trained:.2e} stale={gap_stale:.2e} pushed={gap_pushed:.2e}")
    assert gap_stale > 1e-2, "the perturbation did not change the log-probs: the check would be vacuous"
    assert gap_trained <= 1e-4
    assert gap_pushed <= 1e-4


def test_the_engine_runs_in_the_training_dtype(trained):
    # on CPU: fp32 training (bf16 off), so an fp32 engine; vLLM's "auto" would have run it in bf16
    assert trained.reference_sampler.llm.llm_engine.model_config.dtype == torch.float32


def test_a_sharded_reference_pushes_whole_tensors_into_the_engine(trained):
    """FSDP 2 on the engine's own 1-process group: π_ref's parameters are DTensors; sync_from gathers
    each one whole and streams it into the engine, which then scores like the pushed model."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    assert dist.is_initialized()  # vLLM's external launcher set up the default group (world size 1)
    tok = trained._tokenizer
    rows = [tok(p + a)["input_ids"] for p, a in (("12+7=", "19"), ("3*4=", "12"), ("40-8=", "32"))]
    policy = trained.accelerator.unwrap_model(trained.model)
    moved = perturbed_copy(policy, seed=1)
    want = hf_logps(moved, rows)
    fully_shard(moved, mesh=init_device_mesh("cpu", (1,)))
    assert all(isinstance(p, DTensor) for p in moved.parameters())
    sampler, llm = trained.reference_sampler, trained.reference_sampler.llm
    # (the push before issue 25, load_weights(moved.state_dict().items()), raises "mixed torch.Tensor
    # and DTensor" in vLLM's loader and leaves its layer-wise reload holding DTensors, which breaks the
    # engine's next reload: tests/test_fsdp.py shows that error without an engine)
    sampler.sync_from(moved)
    gap_pushed = max_gap(_engine_logps(llm, rows), want)
    sampler.sync_from(policy)  # leave the engine as the trainer had it
    gap_back = max_gap(_engine_logps(llm, rows), hf_logps(policy, rows))
    print(f"logp gaps: pushed={gap_pushed:.2e} back={gap_back:.2e}")
    assert gap_pushed <= 1e-4 and gap_back <= 1e-4


def test_cached_prompts_are_not_sent_to_the_engine(trained):
    from armorlab.train.anchors import AnchorCache, AnchorRollout, GroupRequest

    sampler = trained.reference_sampler
    tok = trained._tokenizer

    def req(text):
        return GroupRequest(text, tok(text)["input_ids"])

    def score(requests, samples):
        return [[1.0] * len(s) for s in samples]

    rollout = AnchorRollout(sampler, score, k=3, anchor_filter="correct", threshold=1.0, cache=AnchorCache(),
                            adaptive=True)  # anchor_rounds: adaptive, so each call sends what the cache lacks
    calls, sent = sampler.generate_calls, sampler.prompts_sent
    # every sample scores 1: adaptive rejection stops after each prompt's first draw (one generate call)
    outcomes, generated = rollout.run([req("1+1="), req("2+2="), req("1+1=")], seed=0, step=0)
    assert (sampler.generate_calls - calls, sampler.prompts_sent - sent, generated) == (1, 2, 2)
    assert [o.cached for o in outcomes] == [False, False, True]
    assert all(len(o.fresh) == 1 for o in outcomes[:2])
    outcomes, generated = rollout.run([req("2+2="), req("5+5="), req("1+1=")], seed=0, step=1)
    assert (sampler.generate_calls - calls, sampler.prompts_sent - sent, generated) == (2, 3, 1)
    assert [o.cached for o in outcomes] == [True, False, True]
    outcomes, generated = rollout.run([req("2+2="), req("1+1=")], seed=0, step=2)
    assert (sampler.generate_calls - calls, sampler.prompts_sent - sent, generated) == (2, 3, 0)
