"""ArmorLabTrainer end to end on the tiny model: objectives, anchors, gate, cache, reference resets."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import TrainerCallback

from armorlab.algos.loss import AGGREGATION_UNIT, policy_loss
from armorlab.algos.objectives import objective_spec
from armorlab.core.config import objective_choices
from armorlab.train.trainer import ArmorLabTrainer
from tests.trainer_support import AnswerSampler, answer_table, build, capturing, resolved, tokenizer_for


def _plain_logps(model, inputs, temperature):
    """log π(completion token) from a plain forward + log_softmax: independent of TRL's fused head."""
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    p, t = prompt_ids.size(1), completion_ids.size(1)
    logits = model(input_ids=ids, attention_mask=att).logits[:, p - 1:p + t - 1] / temperature
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


class LossCheckTrainer(ArmorLabTrainer):
    """Recomputes every step's loss with policy_loss on independently computed log-probs, divided
    by the count of the whole generation batch (one process) times the share of it one step sees."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        mask = out["completion_mask"].float() * out["armorlab_keep"].unsqueeze(1)
        self.gen_counts = {"tokens": float(mask.sum()), "rows": float((mask.sum(1) > 0).sum())}
        return out

    def _compute_loss(self, model, inputs):
        rng = torch.get_rng_state()  # clip_cov draws its tokens from the global RNG: draw the same again
        loss = super()._compute_loss(model, inputs)
        torch.set_rng_state(rng)
        with torch.no_grad():
            args = self.args
            logp = _plain_logps(self.accelerator.unwrap_model(model), inputs, args.temperature)
            ref = _plain_logps(self.ref_model, inputs, args.temperature)
            old = inputs.get("old_per_token_logps")
            old = logp if old is None else old
            mask = inputs["completion_mask"].float() * inputs["armorlab_keep"].unsqueeze(1)
            armor = args.objective == "armor"
            spec = objective_spec(args.objective)
            unit = AGGREGATION_UNIT[spec.aggregation]  # the default aggregation's
            share = args.gradient_accumulation_steps / args.steps_per_generation
            expected = policy_loss(args.objective, logp, old, inputs["advantages"], mask,
                                   ref_logp=ref if armor else None, alpha=args.alpha if armor else 1.0,
                                   eps_low=args.epsilon, eps_high=args.epsilon_high,
                                   max_len=args.max_completion_length,
                                   normalizer=self.gen_counts[unit] * share,
                                   params={k: getattr(args, k) for k in spec.params}).loss
        self.checks.append((float(loss.detach()), float(expected), float(inputs["advantages"].abs().sum())))
        return loss


@pytest.mark.parametrize("objective", objective_choices())
def test_each_objective_trains_and_its_loss_is_policy_loss(tmp_path, objective):
    cfg = resolved(objective=objective, max_steps=3, dro_beta=0.3)  # dro_beta: read by dro only
    trainer = build(tmp_path, cfg, trainer_cls=LossCheckTrainer)
    trainer.checks = []
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 3
    assert len(trainer.checks) == 3
    for loss, expected, _ in trainer.checks:
        assert loss == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert sum(a for _, _, a in trainer.checks) > 0, "no learning signal: the check would be vacuous"
    moved = any(not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert moved


class CaptureTrainer(ArmorLabTrainer):
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.captured.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()})
        return out


def _groups(out):
    """Per group id: (is_anchor rows, rewards, keep) of one generation batch."""
    groups = {}
    for g, a, r, k in zip(out["armorlab_group"].tolist(), out["armorlab_is_anchor"].tolist(),
                          out["armorlab_reward"].tolist(), out["armorlab_keep"].tolist(), strict=True):
        groups.setdefault(g, []).append((a, r, k))
    return groups


def _run_with_reference(tmp_path, answer_of, **overrides):
    # the gate alone: dapo's preset dynamic sampling would mask groups too
    cfg = resolved(**{"objective": "dapo", "max_steps": 2, "dynamic_sampling": False, **overrides})
    sampler = AnswerSampler(tokenizer_for(cfg), answer_of)
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer, sampler=sampler)
    trainer.captured = []
    trainer.train()
    assert trainer.captured, "no generation happened"
    return trainer, sampler


def test_always_correct_reference_gives_one_rewarded_anchor_per_group(tmp_path):
    table = answer_table(resolved())
    trainer, sampler = _run_with_reference(tmp_path, table.__getitem__, anchor=True, anchor_gate=True)
    for out in trainer.captured:
        groups = _groups(out)
        assert len(groups) == out["armorlab_group"].numel() // trainer.num_generations
        for rows in groups.values():
            anchors = [r for a, r, _ in rows if a]
            assert anchors == [1.0]                       # exactly one anchor, rewarded 1
            assert all(k == 1.0 for _, _, k in rows)      # solvable → kept
    assert sampler.asked
    logged = [h for h in trainer.state.log_history if "anchor/rate" in h]
    assert logged and all(h["anchor/rate"] == 1.0 and h["anchor/gate_drop"] == 0.0 for h in logged)


def test_never_correct_reference_gate_on_drops_every_group(tmp_path):
    trainer, _ = _run_with_reference(tmp_path, lambda p: "xx", anchor=True, anchor_gate=True)
    for out in trainer.captured:
        assert not out["armorlab_is_anchor"].any()
        assert out["armorlab_keep"].sum() == 0
    logged = [h for h in trainer.state.log_history if "anchor/gate_drop" in h]
    assert logged and all(h["anchor/gate_drop"] == 1.0 and h["loss"] == 0.0 for h in logged)
    # every token masked: the token means are undefined (null in metrics.jsonl), not 0
    undefined = [h[k] for h in logged for k in ("obj/ratio_mean", "obj/clip_frac")]
    assert all(v is None or math.isnan(v) for v in undefined)


def test_never_correct_reference_gate_off_injects_nothing(tmp_path):
    trainer, _ = _run_with_reference(tmp_path, lambda p: "xx", anchor=True, anchor_gate=False)
    for out in trainer.captured:
        assert not out["armorlab_is_anchor"].any()
        assert bool((out["armorlab_keep"] == 1).all())


def test_filter_any_injects_one_anchor_per_group_regardless(tmp_path):
    trainer, _ = _run_with_reference(tmp_path, lambda p: "xx", anchor=True, anchor_filter="any")
    for out in trainer.captured:
        for rows in _groups(out).values():
            assert [r for a, r, _ in rows if a] == [0.0]


def test_gate_only_control_samples_the_reference_but_injects_nothing(tmp_path):
    table = answer_table(resolved())
    trainer, sampler = _run_with_reference(tmp_path, table.__getitem__, anchor=False, anchor_gate=True)
    assert sampler.asked
    for out in trainer.captured:
        assert not out["armorlab_is_anchor"].any() and bool((out["armorlab_keep"] == 1).all())


def test_cache_reuses_reference_samples_until_a_reset(tmp_path):
    table = answer_table(resolved())
    # 4 training prompts = exactly one generation batch (16 rows / 8 per prompt × 2 steps)
    # a static π_ref with the window cache asked for (null = off when static: tests/test_protocol_runs.py)
    static, s_static = _run_with_reference(tmp_path / "a", table.__getitem__, anchor=True, max_steps=6,
                                           anchor_cache="window", task={"name": "arithmetic", "train_size": 4})
    assert len(s_static.asked) == 4                       # 3 generations, only the first samples
    hits = [h["anchor/cache_hit"] for h in static.state.log_history if "anchor/cache_hit" in h]
    assert hits == [0.0, 1.0, 1.0]
    ref_samples = [h["anchor/ref_samples"] for h in static.state.log_history if "anchor/ref_samples" in h]
    # 4 prompts × k = 4 draws (anchor_rounds: one, a single round of k per prompt), at step 1 only
    assert ref_samples == [16.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    draws = [h["anchor/draws_per_anchor"] for h in static.state.log_history if "anchor/draws_per_anchor" in h]
    assert draws == [4.0, 4.0]  # logged on both steps of the one generation that sampled
    reset, s_reset = _run_with_reference(tmp_path / "b", table.__getitem__, anchor=True, ref_reset_steps=2,
                                         max_steps=6, task={"name": "arithmetic", "train_size": 4})
    assert len(s_reset.asked) == 12                       # resets at 2 and 4 → every generation samples
    assert sorted(set(s_reset.asked)) == sorted(set(s_static.asked))


def _skip_solved_run(tmp_path, skip: bool):
    """armor with anchors and dynamic sampling; the policy "solves" every prompt whose answer is even
    (its reward function calls any completion of those prompts correct), π_ref answers every prompt."""
    cfg = resolved(objective="armor", anchor=True, dynamic_sampling=True, max_steps=4, anchor_skip_solved=skip)
    table = answer_table(cfg)
    solved = {p for p, a in table.items() if int(a) % 2 == 0}
    sampler = AnswerSampler(tokenizer_for(cfg), table.__getitem__)
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer, sampler=sampler)
    exact = trainer.reward_funcs[0]

    def lenient(prompts, completions, **kwargs):
        rewards = exact(prompts=prompts, completions=completions, **kwargs)
        return [1.0 if p in solved else r for p, r in zip(prompts, rewards, strict=True)]

    lenient.__name__ = exact.__name__
    trainer.reward_funcs = [lenient]
    trainer.captured = []
    trainer.train()
    return trainer, sampler, solved


def test_skip_solved_draws_no_anchor_for_solved_groups_and_trains_the_same_rows(tmp_path):
    skip, s_skip, solved = _skip_solved_run(tmp_path / "skip", True)
    full, s_full, _ = _skip_solved_run(tmp_path / "full", False)
    assert solved & set(s_full.asked) and set(s_full.asked) - solved  # both kinds in the batches
    assert set(s_skip.asked) == set(s_full.asked) - solved            # π_ref asked for the unsolved only
    shares = []
    for a, b in zip(skip.captured, full.captured, strict=True):
        groups = _groups(a).values()
        solved_groups = [rows for rows in groups if all(r == 1.0 for _, r, _ in rows)]
        assert all(not any(x for x, _, _ in rows) for rows in solved_groups)  # no anchor drawn or injected
        shares.append(len(solved_groups) / len(groups))
        assert torch.equal(a["armorlab_keep"], b["armorlab_keep"])      # the filter drops them either way
        kept = a["armorlab_keep"].bool()
        assert kept.any()
        for key in ("completion_ids", "advantages", "armorlab_is_anchor"):
            assert torch.equal(a[key][kept], b[key][kept]), key
        assert int(b["armorlab_is_anchor"].sum()) - int(a["armorlab_is_anchor"].sum()) == round(
            shares[-1] * len(groups))                                    # full ARMOR anchored them too
    assert min(shares) > 0 and max(shares) < 1
    logged = [h["anchor/skipped_solved"] for h in skip.state.log_history if "anchor/skipped_solved" in h]
    assert logged == pytest.approx([s for s in shares for _ in range(2)])  # 2 steps per generation


class _WeightsProbe(TrainerCallback):
    def __init__(self, trainer):
        self.trainer, self.equal = trainer, {}

    def on_step_end(self, args, state, control, **kwargs):
        ref = self.trainer.ref_model.state_dict()
        pol = self.trainer.accelerator.unwrap_model(self.trainer.model).state_dict()
        self.equal[state.global_step] = all(torch.equal(ref[k], pol[k]) for k in pol)


def test_reference_is_reset_to_the_policy_every_tau_steps(tmp_path):
    cfg = resolved(objective="dapo", ref_reset_steps=2, max_steps=4)
    trainer = build(tmp_path, cfg)
    probe = _WeightsProbe(trainer)
    trainer.add_callback(probe)  # after armorlab's own callback: sees the state after a reset
    trainer.train()
    assert probe.equal == {1: False, 2: True, 3: False, 4: True}
    assert trainer.reference.resets == 2
    assert [h["ref/resets"] for h in trainer.state.log_history if "ref/resets" in h] == [0.0, 0.0, 1.0, 1.0]


def test_dynamic_sampling_masks_groups_with_equal_rewards_and_logs_their_share(tmp_path):
    cfg = resolved(objective="dapo", max_steps=4)  # the dapo preset turns dynamic sampling on
    assert cfg["dynamic_sampling"] is True
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer)
    trainer.captured = []
    trainer.train()
    kept = dropped = 0
    for out in trainer.captured:
        shares = []
        for rows in _groups(out).values():
            rewards = [r for _, r, _ in rows]
            spread = max(rewards) > min(rewards)           # by hand, from the rewards TRL scored
            assert all(k == float(spread) for _, _, k in rows)
            kept, dropped = kept + spread, dropped + (not spread)
            shares.append(not spread)
        zero_var = out["armorlab_gen:train/zero_var_frac:total"] / out["armorlab_gen:train/zero_var_frac:count"]
        assert float(zero_var) == pytest.approx(sum(shares) / len(shares))
    assert kept and dropped, "the check would be vacuous"
    logged = [h for h in trainer.state.log_history if "train/zero_var_frac" in h and "frac_reward_zero_std" in h]
    assert logged  # TRL's own count of zero-std groups is the independent reference
    assert all(h["train/zero_var_frac"] == pytest.approx(h["frac_reward_zero_std"]) for h in logged)


def test_dynamic_sampling_factor_refills_the_batch_with_groups_that_have_spread(tmp_path):
    cfg = resolved(objective="dapo", max_steps=4, dynamic_sampling_factor=2)
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer)
    trainer.captured = []
    trainer.train()
    rows = cfg["per_device_train_batch_size"] * cfg["steps_per_generation"]  # one generation batch
    groups = rows // cfg["num_generations"]
    for out in trainer.captured:
        assert out["completion_ids"].size(0) == rows                 # the batch keeps its shape
        generated = 2 * groups                                        # factor 2 over-generates
        assert float(out["armorlab_gen:train/zero_var_frac:count"]) == generated
        with_spread = round(generated - float(out["armorlab_gen:train/zero_var_frac:total"]))
        kept = 0
        for g_rows in _groups(out).values():
            rewards = [r for _, r, _ in g_rows]
            spread = max(rewards) > min(rewards)
            assert all(k == float(spread) for _, _, k in g_rows)
            kept += spread
        assert kept == min(groups, with_spread)                       # spread groups first, then masked fill
        assert float(out["num_items_in_batch"]) == float(out["completion_mask"].sum())


def _filter_first_run(tmp_path, after: bool):
    """armor with β·KL, factor 2, π_old scored (GA 1 < steps_per_generation 2): the captured batches,
    the policy losses logged, and the rows each no-grad π_old / π_ref forward really scored."""
    cfg = resolved(objective="armor", anchor=False, anchor_gate=False, beta=0.04, max_steps=4,
                   dynamic_sampling=True, dynamic_sampling_factor=2, learning_rate=0.0)

    class Counting(capturing("old_per_token_logps", "ref_per_token_logps", "completion_mask", "armorlab_keep")):
        score_after_filter = after

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)
            if not torch.is_grad_enabled() and not bool(out[0].isnan().all()):  # NaN: put off until the filter
                self.scored.append(("ref" if model is self.ref_model else "old", input_ids.size(0)))
            return out

    trainer = build(tmp_path / str(after), cfg, trainer_cls=Counting)
    trainer.captured, trainer.scored = [], []
    trainer.train()
    losses = [h["obj/policy_loss"] for h in trainer.state.log_history if "obj/policy_loss" in h]
    # vLLM's correction statistics (sampling/*) belong to vLLM runs only
    assert not [k for h in trainer.state.log_history for k in h if k.startswith("sampling/")]
    return cfg, trainer.captured, losses, trainer.scored


def test_filter_first_scores_only_the_kept_rows_and_their_losses_are_unchanged(tmp_path):
    """Issue 38 §3: with over-generation π_old and π_ref score the rows that train (verl filters
    first), and those rows' log-probs and losses equal the score-everything path's exactly."""
    cfg, first, loss_first, scored_first = _filter_first_run(tmp_path, after=True)
    _, every, loss_every, scored_every = _filter_first_run(tmp_path, after=False)
    rows = cfg["per_device_train_batch_size"] * cfg["steps_per_generation"]  # one generation batch: 32 rows
    generations = len(first)
    assert generations == len(every) >= 2
    # score everything: 2 × 32 rows drawn, each scored by π_ref (TRL's β·KL); π_old either way only on
    # the second micro-batch of the 32 that train (test_old_logps_of_the_first_micro_batch_...)
    half = cfg["per_device_train_batch_size"]
    assert sorted(scored_every) == sorted([("old", half), ("ref", 2 * rows)] * generations)
    assert sorted(scored_first) == sorted([("old", half), ("ref", rows)] * generations)
    for a, b in zip(first, every, strict=True):
        assert torch.equal(a["armorlab_keep"], b["armorlab_keep"])
        m = a["completion_mask"].bool()
        assert torch.equal(a["ref_per_token_logps"][m], b["ref_per_token_logps"][m])
    assert loss_first == loss_every and len(loss_first) == cfg["max_steps"]


def test_old_logps_of_the_first_micro_batch_cost_no_forward(tmp_path):
    """π_old of the micro-batch trained first after a generation is π_θ itself (TRL's rule where steps
    align): no forward; the later micro-batch's is scored before the first update, by the weights that
    generated it, checked against a plain forward of them before that update."""
    cfg = resolved(objective="dapo", max_steps=4, learning_rate=1e-4)  # 2 micro-batches per generation, GA 1
    seen, scored = [], []

    class Probe(ArmorLabTrainer):
        def _prepare_inputs(self, generation_batch):
            fresh = self._step % self.args.steps_per_generation == 0
            inputs = super()._prepare_inputs(generation_batch)
            if fresh:  # nothing updated yet: the weights that generated the batch
                with torch.no_grad():
                    want = _plain_logps(self.accelerator.unwrap_model(self.model), self._buffered_inputs[1],
                                        self.args.temperature)
                seen.append((want, [dict(b) for b in self._buffered_inputs]))
            return inputs

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            out = super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)
            if not torch.is_grad_enabled() and model is self.model and not bool(out[0].isnan().all()):
                scored.append(input_ids.size(0))  # NaN: put off
            return out

    trainer = build(tmp_path, cfg, trainer_cls=Probe)
    trainer.train()
    assert len(seen) == 2 and scored == [cfg["per_device_train_batch_size"]] * 2
    for want, (first, later) in seen:
        assert "old_per_token_logps" not in first
        m = later["completion_mask"].bool()
        assert torch.allclose(later["old_per_token_logps"][m], want[m], atol=1e-5)
    ratios = [h["obj/ratio_mean"] for h in trainer.state.log_history if "obj/ratio_mean" in h]
    # π_θ/π_old: exactly 1 on each generation's first step, moved by the update on its second
    assert ratios[0] == ratios[2] == 1.0 and ratios[1] != 1.0 and ratios[3] != 1.0


class BiasCorrectionProbe(ArmorLabTrainer):
    """Runs each micro-batch with π_old := π_θ·e^−δ and the β·KL term with and without TRL's correction."""

    delta = 0.5

    def _compute_loss(self, model, inputs):
        with torch.no_grad():
            logp = _plain_logps(self.accelerator.unwrap_model(model), inputs, self.args.temperature)
        inputs = {**inputs, "old_per_token_logps": logp - self.delta}
        pair = []
        for corrected in (False, True):
            self.args.use_bias_correction_kl = corrected
            loss = super()._compute_loss(model, inputs)
            pair.append(self._metrics["train"]["obj/beta_kl"][-1])
        self.pairs.append(tuple(pair))
        return loss


def test_beta_kl_follows_use_bias_correction_kl(tmp_path):
    # TRL multiplies the k3 term by π_θ/π_old when use_bias_correction_kl (its default): with
    # π_old = π_θ·e^−δ on every token that factor is e^δ, whatever the aggregation
    cfg = resolved(objective="dapo", dynamic_sampling=False, beta=0.1, max_steps=2)
    trainer = build(tmp_path, cfg, trainer_cls=BiasCorrectionProbe)
    trainer.pairs = []
    trainer.train()
    assert trainer.pairs
    for plain, corrected in trainer.pairs[1:]:  # step 1 has π_ref = π_θ: both are 0
        assert plain > 0 and corrected == pytest.approx(math.exp(BiasCorrectionProbe.delta) * plain, rel=1e-4)


def test_quantile_advantages_zero_the_rows_at_the_baseline_anchor_included(tmp_path):
    # QAE with K = 0.4 on binary rewards: a group with ≤ 60 % correct (anchor counted) has b = 0, so
    # its wrong rows get exactly 0 and its correct rows > 0; above 60 % b = 1, correct rows get 0.
    table = answer_table(resolved())
    trainer, _ = _run_with_reference(tmp_path, table.__getitem__, anchor=True, anchor_gate=False,
                                     advantage_estimator="quantile", max_steps=2)
    informative = 0
    for out in trainer.captured:
        g = trainer.num_generations
        for rewards, adv, anchor in zip(out["armorlab_reward"].view(-1, g), out["advantages"].view(-1, g),
                                        out["armorlab_is_anchor"].view(-1, g), strict=True):
            assert anchor.sum() == 1 and rewards[anchor].item() == 1.0   # the anchor is in the group
            p = rewards.mean().item()
            at_baseline = rewards == (1.0 if p > 0.6 else 0.0)
            assert bool((adv[at_baseline] == 0).all())
            others = adv[~at_baseline]
            assert bool((others > 0).all()) if p <= 0.6 else bool((others < 0).all())
            informative += others.numel() > 0
    assert informative, "no group with a non-zero advantage: the check would be vacuous"


class KlEstimatorProbe(ArmorLabTrainer):
    """Records obj/beta_kl next to the k2 and k3 means of log(π_ref/π_θ) computed from plain log-probs."""

    def _compute_loss(self, model, inputs):
        rng = torch.get_rng_state()  # clip_cov draws its tokens from the global RNG: draw the same again
        loss = super()._compute_loss(model, inputs)
        torch.set_rng_state(rng)
        with torch.no_grad():
            logp = _plain_logps(self.accelerator.unwrap_model(model), inputs, self.args.temperature)
            ref = _plain_logps(self.ref_model, inputs, self.args.temperature)
            mask = inputs["completion_mask"].float() * inputs["armorlab_keep"].unsqueeze(1)
            # π_old = π_θ here (one step per generation), so TRL's bias correction is a factor 1
            log_r = ref - logp
            k2 = float(((0.5 * log_r ** 2) * mask).sum() / mask.sum())
            k3 = float(((torch.exp(log_r) - 1 - log_r) * mask).sum() / mask.sum())
        self.seen.append((self._metrics["train"]["obj/beta_kl"][-1], k2, k3))
        return loss


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_estimator_picks_the_penalty_term(tmp_path, estimator):
    cfg = resolved(objective="dapo", dynamic_sampling=False, beta=0.1, kl_estimator=estimator, max_steps=3,
                   steps_per_generation=1, per_device_train_batch_size=16)
    trainer = build(tmp_path, cfg, trainer_cls=KlEstimatorProbe)
    trainer.seen = []
    trainer.train()
    moved = [(b, k2, k3) for b, k2, k3 in trainer.seen if k2 > 0]  # step 1: π_ref = π_θ, all zero
    assert moved, "the policy never left the reference: the check would be vacuous"
    for logged, k2, k3 in moved:
        assert logged == pytest.approx(k2 if estimator == "k2" else k3, rel=1e-3, abs=1e-7)
        assert k2 != pytest.approx(k3, rel=1e-3)  # the two estimators differ, so the check can fail


def test_group_ids_count_generations_with_gradient_accumulation(tmp_path):
    """GA 2, steps_per_generation 2: TRL generates once per optimiser step (every 2 micro-steps),
    so 3 steps are 3 generations of 32 rows = 4 groups each; their ids must not repeat."""
    cfg = resolved(objective="dapo", max_steps=3, gradient_accumulation_steps=2, token_sample_rate=1.0,
                   dynamic_sampling=False)  # every group trains, so every group is in the dump
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer)
    trainer.captured = []
    trainer.train()
    ids = [sorted(set(out["armorlab_group"].tolist())) for out in trainer.captured]
    assert ids == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    import pyarrow.parquet as pq

    dumped = {s: sorted(set(pq.read_table(p).column("group").to_pylist()))
              for s, p in ((int(p.name[5:11]), p) for p in sorted(trainer.token_dump.directory.iterdir()))}
    assert dumped == {1: [0, 1, 2, 3], 2: [4, 5, 6, 7], 3: [8, 9, 10, 11]}


def test_group_ids_stay_unique_when_dynamic_sampling_over_generates(tmp_path):
    """factor 2: each generation draws 8 groups (64 rows) and trains on 4 of them; ids come from
    the 8 drawn, so generation g owns ids 8g…8g+7 and no id is reused by a later generation
    (counting generations by the 32 rows that train would hand generation 1 the ids 4…11)."""
    cfg = resolved(objective="dapo", max_steps=4, dynamic_sampling_factor=2)
    trainer = build(tmp_path, cfg, trainer_cls=CaptureTrainer)
    trainer.captured = []
    trainer.train()
    ids = [set(out["armorlab_group"].tolist()) for out in trainer.captured]
    assert len(ids) >= 2 and all(len(g) == 4 for g in ids)
    for gen, g in enumerate(ids):
        assert g <= set(range(8 * gen, 8 * gen + 8)), (gen, sorted(g))
