"""π_ref only where a run reads it (issue 25 §2): how many rows its forward sees, whether it is built
at all, its load options after a reset, its validation at resets, and anchors drawn beside the
policy's generation. Tiny model, one process."""

from __future__ import annotations

import math
import threading

import torch
from transformers import TrainerCallback

from armorlab.train.trainer import ArmorLabTrainer
from tests.trainer_support import AnswerSampler, answer_table, build, resolved, tokenizer_for

ROWS = 16 * 2  # per_device_train_batch_size × steps_per_generation: one generation's rows


def _count_reference_rows(trainer) -> list[int]:
    """Rows of every forward π_ref runs from now on (the fused-head forward TRL's scoring calls)."""
    rows: list[int] = []
    ref = trainer.ref_model
    forward = ref.forward

    def counting(*args, **kwargs):
        if kwargs.get("fused_lm_head"):  # scoring, not a generate step
            rows.append(int(kwargs["input_ids"].size(0)))
        return forward(*args, **kwargs)

    ref.forward = counting
    return rows


def _logged(trainer, name):
    return [h[name] for h in trainer.state.log_history if name in h]


def test_dapo_at_beta_0_scores_only_the_telemetry_generations_with_the_reference(tmp_path):
    """kl/reverse_* on one generation in 8 (the 1st, 9th, ...; 2 steps each), and of it one
    micro-batch of rows (issue 38 §3: never a forward of the whole batch that dapo does not pay)."""
    trainer = build(tmp_path, resolved(objective="dapo", max_steps=18))
    rows = _count_reference_rows(trainer)
    trainer.train()
    assert rows == [16, 16]  # generations 0 and 8 of 9: per_device_train_batch_size rows of 32 each
    steps = [h["step"] for h in trainer.state.log_history if "kl/reverse_k3" in h]
    assert steps == [1, 2, 17, 18]  # logged on the steps that train on a scored generation
    assert all(math.isfinite(x) and x >= 0 for x in _logged(trainer, "kl/reverse_k3"))


def test_armor_scores_every_row_with_the_reference(tmp_path):
    trainer = build(tmp_path, resolved(objective="armor", max_steps=2, anchor=False, anchor_gate=False))
    rows = _count_reference_rows(trainer)
    trainer.train()
    assert sum(rows) == ROWS  # r_mix reads π_ref on every token


def test_without_telemetry_nothing_builds_or_runs_the_reference(tmp_path):
    for objective in ("dapo", "grpo", "up"):
        trainer = build(tmp_path / objective, resolved(objective=objective, max_steps=2, kl_telemetry=False))
        assert trainer.ref_model is None and trainer.reference.model is None and trainer.reference_sampler is None
        trainer.train()
        assert trainer.state.global_step == 2
        assert not any(k.startswith("kl/") for h in trainer.state.log_history for k in h)
    # a reader brings it back: the exact-KL probe at validation
    probed = build(tmp_path / "probe", resolved(objective="dapo", kl_telemetry=False, kl_probe_prompts=2,
                                                val_every=1), with_eval=True)
    assert probed.ref_model is not None


def test_cast_lm_head_to_fp32_applies_to_the_reference_as_to_the_policy(tmp_path):
    """bf16 weights with an fp32 LM head: after a reset π_ref's log-probs on a fixed batch equal the
    policy's exactly (before: its head stayed bf16 and the reset rounded the trained head, 3.5e-4)."""
    cfg = resolved(objective="dapo", max_steps=1, ref_reset_steps=1, learning_rate=5e-3,
                   model_init_kwargs={"dtype": "bfloat16"}, cast_lm_head_to_fp32=True)
    trainer = build(tmp_path, cfg)
    trainer.train()
    assert trainer.reference.resets == 1
    policy = trainer.accelerator.unwrap_model(trainer.model)
    ref = trainer.ref_model
    assert policy.lm_head.weight.dtype == ref.lm_head.weight.dtype == torch.float32
    assert policy.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    pol_sd, ref_sd = policy.state_dict(), ref.state_dict()
    assert all(torch.equal(pol_sd[k], ref_sd[k]) for k in pol_sd)
    tok = tokenizer_for(cfg)
    enc = tok(["12+34=46", "7+8=15", "50+50=100"], padding=True, padding_side="left", return_tensors="pt")
    policy.eval()
    with torch.no_grad():
        mine, _, _ = trainer._get_per_token_logps_and_entropies(policy, enc["input_ids"], enc["attention_mask"], 4)
        theirs, _, _ = trainer._get_per_token_logps_and_entropies(ref, enc["input_ids"], enc["attention_mask"], 4)
    assert torch.equal(mine, theirs)


class _ValidationCalls(TrainerCallback):
    pass


def test_reference_validation_at_a_reset_only_on_evaluation_steps_unless_asked(tmp_path):
    def run(name, **extra):
        cfg = resolved(objective="armor", max_steps=2, ref_reset_steps=1, val_every=2, **extra)
        trainer = build(tmp_path / name, cfg, with_eval=True)
        calls = []
        original = trainer.validator.reference_accuracy
        trainer.validator.reference_accuracy = lambda step: calls.append(step) or original(step)
        trainer.train()
        return trainer, calls

    trainer, calls = run("default")
    assert calls == []  # the reset at step 1 falls between evaluations (0 and 2)
    # step 0: the initial π_ref is the policy; step 2: the new π_ref is the policy just validated
    assert _logged(trainer, "ref/val_acc") == _logged(trainer, "val/acc")
    assert len(_logged(trainer, "ref/val_acc")) == 2
    asked, calls = run("asked", ref_validate_resets=True)
    assert calls == [1] and len(_logged(asked, "ref/val_acc")) == 3


class _BesideSampler(AnswerSampler):
    """A sampler that says it runs beside the policy's generation (as a vLLM server does) and
    records whether the policy was generating when it was asked."""

    concurrent = True

    def __init__(self, *args, started: threading.Event, done: threading.Event):
        super().__init__(*args)
        self.started, self.done, self.overlapped = started, done, []

    def sample(self, prompt_ids, k):
        self.overlapped.append(self.started.wait(timeout=60) and not self.done.is_set())
        return super().sample(prompt_ids, k)


class _MarkPolicyGeneration(ArmorLabTrainer):
    def _generate_single_turn(self, *args, **kwargs):
        self.policy_started.set()
        try:
            out = super()._generate_single_turn(*args, **kwargs)
            # hold the policy's generation open until the anchor thread has been asked (or 60 s)
            deadline = threading.Event()
            for _ in range(600):
                if self.reference_sampler.overlapped:
                    break
                deadline.wait(0.1)
            return out
        finally:
            self.policy_done.set()


def test_anchors_from_a_concurrent_sampler_are_drawn_while_the_policy_generates(tmp_path):
    cfg = resolved(objective="armor", anchor=True, max_steps=1)
    started, done = threading.Event(), threading.Event()
    sampler = _BesideSampler(tokenizer_for(cfg), answer_table(cfg).__getitem__, started=started, done=done)
    _MarkPolicyGeneration.policy_started, _MarkPolicyGeneration.policy_done = started, done
    trainer = build(tmp_path, cfg, trainer_cls=_MarkPolicyGeneration, sampler=sampler)
    trainer.train()
    assert sampler.overlapped and all(sampler.overlapped)
    assert _logged(trainer, "anchor/rate") == [1.0]  # the anchors drawn beside it were injected


def test_a_token_dump_never_makes_a_baseline_score_pi_ref():
    # issue 38 §3: sweeps/paper/base.yaml dumps 0.1 % of the tokens; a dapo run must not pay a π_ref
    # forward on every generation for it (only the KL telemetry's generations, as without the dump)
    from types import SimpleNamespace

    from armorlab.train.reference import reference_scored

    dapo = SimpleNamespace(objective="dapo", anchor=False, kl_telemetry=True, token_sample_rate=0.001)
    assert not reference_scored(dapo, beta=0.0, has_reference=True, telemetry_now=False)
    assert reference_scored(dapo, beta=0.0, has_reference=True, telemetry_now=True)
    assert reference_scored(SimpleNamespace(**{**vars(dapo), "objective": "armor"}), beta=0.0,
                            has_reference=True, telemetry_now=False)  # r_mix reads it: always
    assert reference_scored(dapo, beta=0.01, has_reference=True, telemetry_now=False)  # β·KL reads it
