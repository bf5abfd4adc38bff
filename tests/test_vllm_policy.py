"""Policy rollouts through TRL's vLLM generation (``use_vllm: true``, colocate) with anchors: `make test-vllm`."""

from __future__ import annotations

import math
import os

import pytest
import torch

from tests.trainer_support import AnswerSampler, answer_table, build, capturing, resolved, tokenizer_for

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
for _key, _value in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}.items():
    os.environ.setdefault(_key, _value)


@pytest.mark.vllm
def test_policy_rollouts_from_vllm_train_with_anchors_and_the_correction_skips_them(tmp_path):
    Capture = capturing("armorlab_is_anchor", "importance_sampling_ratio")

    cfg = resolved(objective="armor", max_steps=2, use_vllm=True, vllm_mode="colocate",
                   vllm_importance_sampling_mode="token_truncate", val_every=2, val_temperature=0.0)
    table = answer_table(cfg)
    sampler = AnswerSampler(tokenizer_for(cfg), table.__getitem__)  # always correct: every group is anchored
    trainer = build(tmp_path, cfg, trainer_cls=Capture, sampler=sampler, with_eval=True)
    engine_calls = []
    generate = trainer.vllm_generation.generate
    trainer.vllm_generation.generate = lambda **kw: engine_calls.append(len(kw["prompts"])) or generate(**kw)
    trainer.validator._sampler = None  # validation must not fall back to HF generate (the probe is off)
    assert trainer.use_vllm and trainer.vllm_generation.mode == "colocate"
    trainer.captured = []
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.captured
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    # validation at steps 0 and 2 through the policy's engine: val and test, 64 prompts × k = 4 rows each,
    # beside the one training generation (32 rows)
    assert sorted(engine_calls) == [32] + [64 * 4] * 4
    accs = [h["val/acc"] for h in trainer.state.log_history if "val/acc" in h]
    assert len(accs) == 2 and all(0.0 <= a <= 1.0 for a in accs)
    assert [h["val/n"] for h in trainer.state.log_history if "val/n" in h] == [256.0, 256.0]
    for out in trainer.captured:
        ratio, anchor = out["importance_sampling_ratio"], out["armorlab_is_anchor"]
        assert int(anchor.sum()) == anchor.numel() // trainer.num_generations  # one anchor per group
        # anchor rows: sampled by π_ref's sampler, not the policy's engine → no correction (exactly 1)
        assert torch.equal(ratio[anchor], torch.ones_like(ratio[anchor]))
        # policy rows: corrected by TRL against vLLM's own log-probs (its bf16 engine: near 1, not exactly)
        on = ratio[~anchor]
        assert bool(torch.isfinite(on).all()) and float((on - 1).abs().max()) < 0.25
        assert bool((on != 1).any()), "the policy rows were not corrected: the anchor check would be vacuous"


def test_vllm_corrected_loss_multiplies_each_tokens_loss_and_keeps_the_normaliser():
    from armorlab.algos.loss import vllm_corrected_loss

    per_token = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    ratio = torch.tensor([[0.5], [2.0]])
    # token-mean (armor): (1·0.5 + 2·0.5 + 3·2) / 3 tokens
    assert float(vllm_corrected_loss(per_token, ratio, mask, "token-mean", 3)) == pytest.approx(7.5 / 3)
    # seq-mean-token-mean (grpo): ((0.5 + 1) / 2 + 6 / 1) / 2
    assert float(vllm_corrected_loss(per_token, ratio, mask, "seq-mean-token-mean", 3)) == pytest.approx((0.75 + 6) / 2)
    # a whole batch's normaliser (gradient accumulation): the same sum over 10 tokens
    assert float(vllm_corrected_loss(per_token, ratio, mask, "token-mean", 3, 10.0)) == pytest.approx(7.5 / 10)


def test_vllm_is_ratio_follows_trls_modes_by_hand():
    """TRL's ratio for rows π_old scores after the filter: exp(old − vLLM) per token or per masked
    sequence sum; NaN (a token vLLM did not score) and masked tokens add 0."""
    from armorlab.algos.loss import vllm_is_ratio

    old = torch.tensor([[0.0, -1.0, 0.5], [-2.0, 0.0, 0.0]])
    sampled = torch.tensor([[-0.5, -1.0, math.nan], [-1.0, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    e = math.exp
    assert torch.allclose(vllm_is_ratio(old, sampled, mask, "token_truncate", 0.5, 1.5),
                          torch.tensor([[1.5, 1.0, 1.0], [0.5, 1.0, 1.0]]))         # e^0.5, e^-1 clamped
    assert torch.equal(vllm_is_ratio(old, sampled, mask, "token_mask", 0.5, 1.5),
                       torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]))
    assert torch.allclose(vllm_is_ratio(old, sampled, mask, "sequence_truncate", 0.5, 1.5),
                          torch.tensor([[1.5], [0.5]]))
    assert torch.allclose(vllm_is_ratio(old, sampled, mask, "sequence_mask", None, 2.0),
                          torch.tensor([[e(0.5)], [e(-1.0)]]))


@pytest.mark.vllm
@pytest.mark.parametrize("correct", [True, False])
def test_filter_first_scores_pi_old_on_the_kept_rows_and_corrects_them_as_trl(tmp_path, correct):
    """Issue 38 §3 with vLLM's importance-sampling correction: over-generated rows are scored by
    π_old after the filter, and the kept rows carry TRL's ratio of those log-probs; with the
    correction off, no ratio at all (as TRL)."""
    from armorlab.algos.loss import vllm_is_ratio

    Capture = capturing("old_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio",
                        "completion_mask", "armorlab_keep")

    class Counting(Capture):
        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)
            if not torch.is_grad_enabled() and model is not self.ref_model and not bool(out[0].isnan().all()):
                self.scored.append(input_ids.size(0))
            return out

    cfg = resolved(objective="dapo", max_steps=2, use_vllm=True, vllm_mode="colocate", dynamic_sampling=True,
                   dynamic_sampling_factor=2, vllm_importance_sampling_mode="token_truncate",
                   vllm_importance_sampling_correction=correct)
    trainer = build(tmp_path, cfg, trainer_cls=Counting)
    trainer.captured, trainer.scored = [], []
    trainer.train()
    # not 2 × rows drawn; without the correction not the first micro-batch either (its π_old is π_θ)
    rows = cfg["per_device_train_batch_size"] * (cfg["steps_per_generation"] - (not correct))
    assert trainer.captured and trainer.scored == [rows] * len(trainer.captured)
    means = [h["sampling/importance_sampling_ratio/mean"] for h in trainer.state.log_history
             if "sampling/importance_sampling_ratio/mean" in h]
    if not correct:
        assert not means and not any("importance_sampling_ratio" in out for out in trainer.captured)
        return
    for out in trainer.captured:
        m = out["completion_mask"]
        assert not bool(out["old_per_token_logps"][m.bool()].isnan().any())
        clip = (trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max)
        want = vllm_is_ratio(out["old_per_token_logps"], out["sampling_per_token_logps"], m, "token_truncate", *clip)
        assert torch.equal(out["importance_sampling_ratio"], want)
        assert bool((out["importance_sampling_ratio"][m.bool()] != 1).any()), "an all-ones ratio is TRL's stand-in"
    assert means and all(math.isfinite(v) and v != 1.0 for v in means)


@pytest.mark.vllm
def test_policy_engine_and_reference_engine_together(tmp_path):
    """use_vllm and ref_vllm_mode: colocate at once: two engines in one process, anchors from the second."""
    from armorlab.train.vllm_reference import VLLMReferenceSampler

    cfg = resolved(objective="armor", max_steps=2, ref_reset_steps=1, use_vllm=True, ref_vllm_mode="colocate")
    trainer = build(tmp_path, cfg)
    assert isinstance(trainer.reference_sampler, VLLMReferenceSampler)
    assert trainer.reference_sampler.llm is not trainer.vllm_generation.llm
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.reference.resets == 2
    rounds = trainer.anchor_rollout.rounds  # adaptive rejection: one generate call per sampling round
    assert trainer.reference_sampler.generate_calls == rounds >= 1 and trainer.reference_sampler.prompts_sent > 0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
