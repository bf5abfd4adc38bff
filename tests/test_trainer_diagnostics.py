"""The trainer's KL labels and anchor diagnostics: forward KL on unconditioned reference draws,
the gate's dropped-vs-kept success rates, anchor share/advantage, ref/val_acc at resets, val/n."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import TrainerCallback

from armorlab.train import anchors as anc
from armorlab.train.trainer import ArmorLabTrainer
from tests.trainer_support import AnswerSampler, answer_table, build, resolved, tokenizer_for

TASK = {"name": "arithmetic", "train_size": 8, "val_size": 8, "test_size": 8}


def _logged(trainer, name):
    return {h["step"]: h[name] for h in trainer.state.log_history if name in h}


# --------------------------------------------------------------------------- pure parts
def test_forward_kl_rows_take_all_k_fresh_draws_and_subsample_uniformly():
    c = [anc.Completion((i, 1), str(i)) for i in range(6)]
    reqs = [anc.GroupRequest("a", [7]), anc.GroupRequest("b", [8, 9]), anc.GroupRequest("c", [5])]
    outs = [anc.GroupOutcome(c[0], 1.0, True, False, fresh=(c[0], c[1], c[2])),
            anc.GroupOutcome(c[3], 1.0, True, True),                     # cached: never scored
            anc.GroupOutcome(None, None, False, False, fresh=(c[4], c[5], anc.Completion((), "")))]
    rows = anc.forward_kl_rows(reqs, outs, 100, random.Random(0))
    assert rows == [([7], [0, 1]), ([7], [1, 1]), ([7], [2, 1]), ([5], [4, 1]), ([5], [5, 1])]
    picked = [tuple(r[1]) for _ in range(2000) for r in anc.forward_kl_rows(reqs, outs, 2, random.Random(_))]
    assert len(picked) == 4000
    shares = [picked.count((i, 1)) / 4000 for i in (0, 1, 2, 4, 5)]
    assert all(abs(s - 0.2) < 0.03 for s in shares), shares  # each of the 5 draws w.p. 2/5 → share 1/5


def test_gate_success_splits_policy_rows_by_reference_solvability():
    nan = float("nan")
    # 2 groups of 4; the last row of each is the anchor row; group 0 solvable, group 1 not
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, nan, 0.0])
    is_anchor = torch.tensor([0, 0, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    solvable = torch.tensor([nan, nan, nan, 1.0, nan, nan, nan, 0.0])
    out = anc.gate_success(rewards, is_anchor, solvable, 4, threshold=1.0)
    assert out["anchor/gate_keep_success"] == (2.0, 3.0)   # the anchor row is not the policy's
    assert out["anchor/gate_drop_success"] == (1.0, 3.0)   # the unscored row does not count


# --------------------------------------------------------------------------- forward KL in training
class ForwardCheck(ArmorLabTrainer):
    """Recomputes each generation's forward-KL sums with plain forwards on the same rows."""

    forward_kl_share = 1.0

    def _forward_kl(self, rows):
        out = super()._forward_kl(rows)
        with torch.no_grad():
            ids, att, mask = anc.pack_rows(rows, self._tokenizer.pad_token_id)
            width = mask.size(1)

            def logps(model):
                logits = model(input_ids=ids, attention_mask=att).logits[:, -width - 1:-1] / self.args.temperature
                lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -width:].unsqueeze(-1)).squeeze(-1)
                return lp * mask

            log_r = logps(self.accelerator.unwrap_model(self.model)) - logps(self.ref_model)  # log π_θ/π_ref
            k1 = float(-log_r.sum()) / len(rows)
            k3 = float(((log_r.exp() - 1 - log_r) * mask).sum()) / len(rows)
        self.checks.append((list(rows), k1, k3, {k: float(v[0]) / float(v[1]) for k, v in out.items()}))
        return out


class Recording:
    def __init__(self, inner):
        self.inner, self.draws = inner, []

    def sample(self, prompt_ids, k):
        out = self.inner.sample(prompt_ids, k)
        self.draws.append([(list(p), [list(c.ids) for c in group]) for p, group in zip(prompt_ids, out, strict=True)])
        return out


def test_forward_kl_is_estimated_on_every_unconditioned_reference_draw(tmp_path):
    cfg = resolved(objective="armor", max_steps=4, task=TASK)
    trainer = build(tmp_path, cfg, trainer_cls=ForwardCheck)
    trainer.checks = []
    recording = trainer.anchor_rollout.sampler = Recording(trainer.anchor_rollout.sampler)
    run = trainer.anchor_rollout.run
    generations = []  # where each generation's sampler calls start in recording.draws

    def marking(*args, **kwargs):
        generations.append(len(recording.draws))
        return run(*args, **kwargs)

    trainer.anchor_rollout.run = marking
    torch.manual_seed(1)
    with torch.no_grad():  # a reference that differs from the policy, so the KL is not 0
        for w in trainer.ref_model.parameters():
            w.add_(0.005 * torch.randn_like(w))
    trainer.train()
    assert len(trainer.checks) == 2 == len(generations)  # one per generation (4 steps, 2 per generation)
    fwd1, fwd3 = _logged(trainer, "kl/forward_k1"), _logged(trainer, "kl/forward_k3")
    for g, (rows, k1, k3, logged) in enumerate(trainer.checks):
        # the first draw of every fresh group, whatever its reward (the one round draws k = 4 samples
        # for each of the 4 groups; the first of each): unconditioned samples of π_ref
        first_round = recording.draws[generations[g]]
        assert [len(group) for _, group in first_round] == [4] * 4
        assert rows == [(p, group[0]) for p, group in first_round if group[0]]
        assert len(rows) == 4
        assert logged["kl/forward_k1"] == pytest.approx(k1, rel=1e-4, abs=1e-5)
        assert logged["kl/forward_k3"] == pytest.approx(k3, rel=1e-4, abs=1e-5)
        for step in (2 * g + 1, 2 * g + 2):  # logged on both steps of the generation
            assert fwd1[step] == pytest.approx(k1, rel=1e-4, abs=1e-5)
            assert fwd3[step] == pytest.approx(k3, rel=1e-4, abs=1e-5)
    assert trainer.checks[0][2] > 1e-3  # the check is not vacuous
    # the reward-filtered anchors are logged under their own name (on steps whose rows hold anchors)
    assert _logged(trainer, "anchor/kl_k1")


# --------------------------------------------------------------------------- gate and anchor diagnostics
class Capture(ArmorLabTrainer):
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.generations.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()})
        return out

    def _compute_loss(self, model, inputs):
        self.batches.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
        return super()._compute_loss(model, inputs)


def test_gate_success_anchor_share_and_advantage_are_logged_per_step(tmp_path):
    # the gate alone decides armorlab_keep here: dapo's preset dynamic sampling would mask groups too
    cfg = resolved(objective="dapo", anchor=True, anchor_gate=True, dynamic_sampling=False, max_steps=4, task=TASK)
    table = answer_table(cfg)
    solvable = sorted(table)[::2]  # the reference answers every other prompt right
    sampler = AnswerSampler(tokenizer_for(cfg), lambda p: table[p] if p in solvable else "xx")
    trainer = build(tmp_path, cfg, trainer_cls=Capture, sampler=sampler)
    trainer.generations, trainer.batches = [], []
    trainer.train()
    keep_s, drop_s = _logged(trainer, "anchor/gate_keep_success"), _logged(trainer, "anchor/gate_drop_success")
    share, adv_mean = _logged(trainer, "anchor/share"), _logged(trainer, "anchor/adv_mean")
    both_kinds = 0
    for g, out in enumerate(trainer.generations):
        policy = ~out["armorlab_is_anchor"]
        success = out["armorlab_reward"] >= 1.0
        kept = out["armorlab_keep"] == 1
        both_kinds += bool(kept.any()) and bool((~kept).any())
        for step in (2 * g + 1, 2 * g + 2):
            if (policy & kept).any():
                assert keep_s[step] == pytest.approx(float((success & policy & kept).sum() / (policy & kept).sum()))
            if (policy & ~kept).any():
                assert drop_s[step] == pytest.approx(float((success & policy & ~kept).sum() / (policy & ~kept).sum()))
    assert both_kinds, "no generation had both solvable and unsolvable groups: the split is untested"
    for step, batch in enumerate(trainer.batches, start=1):
        anchor = batch["armorlab_is_anchor"]
        tokens = batch["completion_mask"].float() * batch["armorlab_keep"].unsqueeze(1)
        if anchor.any():
            assert adv_mean[step] == pytest.approx(float(batch["advantages"][anchor].mean()), rel=1e-5)
            assert share[step] == pytest.approx(float(tokens[anchor].sum() / tokens.sum()), rel=1e-5)


# --------------------------------------------------------------------------- evaluation sizes and ref/val_acc
class PolicyAccuracy(TrainerCallback):
    """After armorlab's callback (so after a reset): the policy's own val/acc at each reset step."""

    def __init__(self, trainer):
        self.trainer, self.acc = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer.reference.last_reset_step == state.global_step:
            self.acc[state.global_step] = self.trainer.validator.run(state.global_step)["val/acc"]


def test_eval_rows_say_their_size_and_resets_log_the_reference_accuracy(tmp_path):
    # resets at 2 (τ = 2 up to step 2, the boundary included) and 3 (τ = 3); validation at 0, 2, 4:
    # step 2 resets where a validation runs, step 3 where none does
    # (ref_validate_resets: π_ref is validated at the reset between evaluations too; without it only
    # resets on evaluation steps log ref/val_acc, tests/test_trainer_reference.py)
    cfg = resolved(objective="dapo", max_steps=4, val_every=2, ref_reset_steps=3, ref_reset_schedule=[[2, 2]],
                   kl_probe_prompts=0, learning_rate=1e-3, task=TASK, ref_validate_resets=True)
    trainer = build(tmp_path, cfg, with_eval=True)
    probe = PolicyAccuracy(trainer)
    trainer.add_callback(probe)
    trainer.train()
    n = cfg["task"]["val_size"] * cfg["val_samples"]
    assert _logged(trainer, "val/n") == {0: n, 2: n, 4: n}
    assert _logged(trainer, "test/n") == {s: cfg["task"]["test_size"] * cfg["val_samples"] for s in (0, 2, 4)}
    ref_acc, val_acc = _logged(trainer, "ref/val_acc"), _logged(trainer, "val/acc")
    assert set(ref_acc) == {0, 2, 3}  # the initial reference and each reset, not step 4
    assert ref_acc[0] == val_acc[0] and ref_acc[2] == val_acc[2]
    # a reset π_ref is the policy of that step: a pass of π_ref gives the policy's val/acc
    assert probe.acc.keys() == {2, 3}
    for step in (2, 3):
        assert ref_acc[step] == pytest.approx(probe.acc[step])
    assert len(set(ref_acc.values())) > 1 or len(set(probe.acc.values())) > 1  # not one constant
