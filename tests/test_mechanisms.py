"""Mechanism telemetry (issue 28): which tokens a remedy's ratio decides otherwise than DAPO's plain
clip (obj/widened_frac, obj/narrowed_frac), which part of the loss pushes the trained tokens' log-probs
(obj/anchor_grad_share, obj/kl_grad_share, obj/kl_grad_cos) and the diversity of correct samples.
Every expected number below is worked out by hand from the probabilities in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from armorlab.algos.capacity import freed_share
from armorlab.algos.diversity import correct_diversity, distinct, empirical_entropy
from armorlab.algos.loss import policy_loss
from armorlab.core.config import resolve
from armorlab.core.runs import run_id
from armorlab.train.mechanism_telemetry import gradient_shares, rollout_diversity, share_sums, token_gradient

# Three rows of 5 tokens, α = 0.5, ε = (0.2, 0.28). At α = 0.5, r_mix = w·r + (1 − w) with
# w = π_old/(π_old + π_ref). Per token (π_old, π_ref, π) → r, w, r_mix:
# row 0, A = +1 (the upper bound 1.28 binds):
#   t0 (0.5, 0.5, 0.6)  r 1.2 inside
#   t1 (0.2, 0.6, 0.3)  r 1.5 clipped; w 0.25, r_mix 1.125 inside   → widened
#   t2 (0.5, 0.1, 0.8)  r 1.6 clipped; w 5/6, r_mix 1.5 clipped      → clipped by both
#   t3 (0.1, 0.4, 0.2)  r 2.0 clipped; w 0.2, r_mix 1.2 inside       → widened
#   t4 masked (r 3)
# row 1, A = −1 (the lower bound 0.8 binds):
#   t0 (0.5, 0.5, 0.35) r 0.7 clipped; w 0.5, r_mix 0.85 inside      → widened
#   t1 (0.5, 0.1, 0.25) r 0.5 clipped; w 5/6, r_mix 0.5833 clipped   → clipped by both
#   t2 (0.4, 0.4, 0.44) r 1.1 inside
#   t3 (0.3, 0.1, 0.27) r 0.9 inside
#   t4 (0.2, 0.6, 0.1)  r 0.5 clipped; w 0.25, r_mix 0.875 inside    → widened
# row 2, A = 0: r 0.2 and 3.0 are outside the range, but an A = 0 token has no update to stop.
P_OLD = [[0.5, 0.2, 0.5, 0.1, 0.1], [0.5, 0.5, 0.4, 0.3, 0.2], [0.5, 0.1, 0.5, 0.5, 0.5]]
P_REF = [[0.5, 0.6, 0.1, 0.4, 0.1], [0.5, 0.1, 0.4, 0.1, 0.6], [0.5, 0.1, 0.5, 0.5, 0.5]]
P = [[0.6, 0.3, 0.8, 0.2, 0.3], [0.35, 0.25, 0.44, 0.27, 0.1], [0.1, 0.3, 0.5, 0.5, 0.5]]
MASK = [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
ADV = [1.0, -1.0, 0.0]
WIDENED = {(0, 1), (0, 3), (1, 0), (1, 4)}
N_TOKENS = 11


def hand_batch(objective: str, **kwargs):
    logp = torch.tensor(P, dtype=torch.float64).log().requires_grad_(True)
    out = policy_loss(objective, logp, torch.tensor(P_OLD, dtype=torch.float64).log(),
                      torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK),
                      ref_logp=torch.tensor(P_REF, dtype=torch.float64).log(), alpha=0.5, max_len=5, **kwargs)
    out.loss.backward()
    return out, logp.grad


def test_armor_widened_region_decides_the_known_tokens():
    armor, armor_grad = hand_batch("armor")
    dapo, dapo_grad = hand_batch("dapo")
    assert armor.metrics["widened_frac"] == pytest.approx(len(WIDENED) / N_TOKENS)
    assert armor.metrics["narrowed_frac"] == 0.0  # r_mix lies between 1 and r: it never clips where r does not
    assert armor.metrics["clip_frac_high"] == pytest.approx(1 / N_TOKENS)  # (0, 2)
    assert armor.metrics["clip_frac_low"] == pytest.approx(1 / N_TOKENS)   # (1, 1)
    assert dapo.metrics["clip_frac"] == pytest.approx(6 / N_TOKENS)       # the four widened + the two above
    # "decides": exactly the widened tokens get an update under ARMOR that DAPO's clip stops
    moved = {(i, t) for i in range(3) for t in range(5) if armor_grad[i, t] != 0 and dapo_grad[i, t] == 0}
    assert moved == WIDENED


def test_freed_share_is_the_part_of_the_plain_clip_the_objective_lets_through():
    # DAPO's plain clip stops 6 of the 11 tokens (above); ARMOR frees the 4 in WIDENED: 4/6.
    armor, _ = hand_batch("armor")
    assert armor.metrics["plain_clip_frac"] == pytest.approx(6 / N_TOKENS)
    assert armor.metrics["freed_frac"] == pytest.approx(4 / 6)
    # UP's unbounded A > 0 branch frees row 0's t1, t2, t3 of the same 6
    assert hand_batch("up")[0].metrics["freed_frac"] == pytest.approx(3 / 6)
    dapo, _ = hand_batch("dapo")
    assert dapo.metrics["plain_clip_frac"] == pytest.approx(6 / N_TOKENS) and dapo.metrics["freed_frac"] == 0.0
    assert math.isnan(freed_share(0, 0))  # nothing clipped: nothing to free


def test_plain_ratio_objectives_decide_like_the_plain_clip():
    for objective in ("dapo", "grpo", "dr_grpo"):
        out, _ = hand_batch(objective)
        assert out.metrics["widened_frac"] == 0.0 and out.metrics["narrowed_frac"] == 0.0


def test_up_widens_every_clipped_positive_token():
    # UP's A > 0 branch is unbounded: row 0's t1, t2, t3 (r 1.5, 1.6, 2.0) pass; A < 0 is DAPO's clip
    out, grad = hand_batch("up")
    assert out.metrics["widened_frac"] == pytest.approx(3 / N_TOKENS)
    assert out.metrics["narrowed_frac"] == 0.0
    assert all(grad[0, t] != 0 for t in (1, 2, 3))


def test_sequence_ratio_narrows_and_widens():
    # GSPO, row 0 (A > 0): s = (1.2·1.5·1.6·2.0)^(1/4) = 5.76^(1/4) = 1.5492 > 1.28, so all four tokens
    # are clipped, among them t0 whose own r = 1.2 is inside → 1 narrowed.
    # Row 1 (A < 0): s = (0.7·0.5·1.1·0.9·0.5)^(1/5) = 0.17325^(1/5) = 0.7042 < 0.8: all five clipped;
    # t2 (1.1) and t3 (0.9) are inside on their own → 2 narrowed. Nothing widened.
    out, _ = hand_batch("gspo")
    assert out.metrics["narrowed_frac"] == pytest.approx(3 / N_TOKENS)
    assert out.metrics["widened_frac"] == 0.0


def _shares(policy_loss_fn, kl_loss_fn, logp, is_anchor, *, anchor=True):
    v = token_gradient(policy_loss_fn(logp), logp)
    u = None if kl_loss_fn is None else token_gradient(kl_loss_fn(logp), logp)
    return gradient_shares(share_sums(v, u, is_anchor).tolist(), anchor=anchor, kl=u is not None)


def test_gradient_shares_by_hand():
    # loss parts linear in log π_θ: their token gradients are the coefficient tables
    logp = torch.zeros(2, 2, requires_grad=True)
    v = torch.tensor([[3.0, 4.0], [0.0, 5.0]])  # row 0 is the anchor: ‖v_anchor‖ = ‖v_on‖ = 5
    is_anchor = torch.tensor([True, False])
    shares = _shares(lambda x: (v * x).sum(), lambda x: (-v * x).sum(), logp, is_anchor)
    assert shares["obj/anchor_grad_share"] == pytest.approx(5 / (5 + 5))
    assert shares["obj/kl_grad_share"] == pytest.approx(0.5)                   # u = −v: equal norms √50
    assert shares["obj/kl_grad_cos"] == pytest.approx(-1.0)
    u = torch.tensor([[1.0, 0.0], [0.0, 0.0]])                                  # ‖u‖ = 1, ⟨u, v⟩ = 3
    shares = _shares(lambda x: (v * x).sum(), lambda x: (u * x).sum(), logp, is_anchor)
    assert shares["obj/kl_grad_share"] == pytest.approx(1 / (1 + math.sqrt(50)))
    assert shares["obj/kl_grad_cos"] == pytest.approx(3 / math.sqrt(50))
    # a step's sums are the sums of its micro-batches' (here one row each): the same shares
    halves = [share_sums(v[r:r + 1], u[r:r + 1], is_anchor[r:r + 1]) for r in (0, 1)]
    assert gradient_shares((halves[0] + halves[1]).tolist(), anchor=True, kl=True) == pytest.approx(shares)


def test_token_gradient_keeps_the_graph_and_accumulates_nothing():
    w = torch.tensor([2.0], requires_grad=True)
    logp = w * torch.ones(1, 3)
    loss = (logp * torch.tensor([[1.0, 2.0, 3.0]])).sum()
    assert torch.equal(token_gradient(loss, logp), torch.tensor([[1.0, 2.0, 3.0]]))
    assert w.grad is None  # the trainer's own backward pass is untouched
    loss.backward()  # the graph was kept for it
    assert torch.equal(w.grad, torch.tensor([6.0]))


def test_gradient_shares_without_parts_or_gradient():
    logp = torch.zeros(2, 2, requires_grad=True)
    is_anchor = torch.tensor([True, False])
    assert _shares(lambda x: x.sum(), None, logp, is_anchor, anchor=False) == {}
    # the anchor row without gradient (its tokens all clipped): share 0; no KL term: no KL share
    assert _shares(lambda x: x[1].sum(), None, logp, is_anchor) == {"obj/anchor_grad_share": 0.0}
    # neither part has a gradient (every token masked): nothing logged
    assert _shares(lambda x: x.sum() * 0, lambda x: torch.zeros(()), logp, is_anchor) == {}


def test_diversity_by_hand():
    assert distinct(["a", "b", "a"]) == 2
    assert empirical_entropy(["a"] * 4) == 0.0
    assert empirical_entropy(["a", "b", "a", "b"]) == pytest.approx(math.log(2))
    assert empirical_entropy(["a", "a", "b"]) == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))
    groups = [[("x", True), ("y", True), ("x", True), ("z", False)],   # 2 distinct, H(2/3, 1/3)
              [("x", False), ("y", False)],                            # no correct sample: not counted
              [("q", True), ("q", True)]]                              # 1 distinct, 0 nats
    total_distinct, total_entropy, count = correct_diversity(groups)
    assert (total_distinct, count) == (3, 2)
    assert total_entropy == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))


def test_rollout_diversity_leaves_out_the_anchor_slot_and_split_groups():
    # G = 4; this process holds global rows 2..9: group 0's rows 2, 3 (incomplete: left out),
    # group 1 = rows 4..7, group 2's rows 8, 9 (incomplete). In group 1, row 7 is the anchor slot.
    ids = [[1], [1], [5, 6, 0], [5, 6, 9], [7, 0], [8, 8], [2], [3]]
    lengths = [1, 1, 2, 2, 1, 2, 1, 1]  # global rows 4 and 5 read [5, 6] (padding cut), row 6 reads [7]
    rewards = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    total_distinct, total_entropy, count = rollout_diversity(ids, lengths, rewards, start=2, group_size=4,
                                                             threshold=1.0)
    # group 1 outside the slot: [5, 6], [5, 6], [7] → 2 distinct, H(2/3, 1/3)
    assert (total_distinct, count) == (2, 1)
    assert total_entropy == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))
    rewards[4] = math.nan  # global row 6 unscorable: not correct, leaving [5, 6] twice
    assert rollout_diversity(ids, lengths, rewards, start=2, group_size=4, threshold=1.0)[:2] == (1, 0.0)


# --------------------------------------------------------------------------- in training
TASK = {"name": "arithmetic", "train_size": 8, "val_size": 8, "test_size": 8}


def _logged(trainer, name):
    return {h["step"]: h[name] for h in trainer.state.log_history if name in h}


def test_probe_logs_its_shares_and_leaves_training_unchanged(tmp_path):
    from tests.trainer_support import AnswerSampler, answer_table, build, resolved, tokenizer_for

    params = {}
    for every in (2, 0):
        cfg = resolved(objective="armor", beta=0.1, grad_share_every=every, max_steps=4, learning_rate=1e-3,
                       ref_reset_steps=0, task=TASK)
        table = answer_table(cfg)
        trainer = build(tmp_path / str(every), cfg, sampler=AnswerSampler(tokenizer_for(cfg), table.get))
        trainer.train()
        params[every] = [p.detach().clone() for p in trainer.model.parameters()]
        if every:
            anchor, kl_share, cos = (_logged(trainer, f"obj/{n}") for n in ("anchor_grad_share", "kl_grad_share",
                                                                             "kl_grad_cos"))
            assert set(kl_share) == set(cos) == {2, 4}  # every 2nd optimizer step, nowhere else
            assert set(anchor) <= {2, 4} and anchor, anchor  # a micro-batch may hold no anchor row
            # 0 where the anchor rows' advantages are 0 (a group all correct), never outside [0, 1]
            assert all(0 <= v <= 1 for v in anchor.values()) and max(anchor.values()) > 0
            assert all(0 < v < 1 for v in kl_share.values())
            assert all(-1 <= v <= 1 for v in cos.values())
        else:
            assert not _logged(trainer, "obj/kl_grad_share")
    # the token gradients touch no gradient the optimizer sees: the same weights, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(params[2], params[0], strict=True))


def test_one_correct_answer_per_prompt_has_one_derivation_and_greedy_is_scored(tmp_path):
    from armorlab.tasks import build_task
    from armorlab.train.models import accuracy
    from tests.trainer_support import build, resolved

    cfg = resolved(objective="dapo", max_steps=2, val_every=2, val_samples=2, val_temperature=1.0, val_greedy=True,
                   kl_probe_prompts=0, task=TASK)
    trainer = build(tmp_path, cfg, with_eval=True)
    task = build_task(cfg["task"])
    # step 0's policy is the base model: its greedy accuracy, scored independently
    greedy = accuracy(trainer.model, trainer.processing_class, task, list(task.val["prompt"]), list(task.val["answer"]))
    trainer.train()
    assert _logged(trainer, "val/acc_greedy")[0] == pytest.approx(greedy)
    assert _logged(trainer, "val/n_greedy") == {0: 8.0, 2: 8.0}
    assert _logged(trainer, "val/n") == {0: 16.0, 2: 16.0}
    assert set(_logged(trainer, "test/acc_greedy")) == {0, 2}
    # arithmetic has one correct completion per prompt: whenever a group has one, it has one kind
    distinct = _logged(trainer, "train/correct_distinct")
    assert distinct and set(distinct.values()) == {1.0}
    assert set(_logged(trainer, "train/correct_entropy").values()) == {0.0}
    assert set(_logged(trainer, "val/correct_distinct").values()) <= {1.0}


# --------------------------------------------------------------------------- run ids
@pytest.mark.parametrize("extra", [{}, {"val_greedy": False, "grad_share_every": 10},
                                   {"val_greedy": True, "val_temperature": 0.0}])
def test_mechanism_fields_at_their_defaults_or_inert_leave_the_run_id_as_before(extra):
    """Configs written before val_greedy and grad_share_every existed keep their run ids: their
    defaults are dropped from the resolved config, and so is val_greedy at val_temperature 0 (val/acc
    is the greedy score there)."""

    before = {"objective": "armor", "anchor": True, "ref_reset_steps": 4}
    # ids armorlab gave these configs before the fields existed (tests/test_vllm_config.py holds them too)
    if "val_temperature" not in extra:
        assert run_id(resolve({**before, **extra})) == "434228699340"
        assert run_id(resolve({"objective": "dapo", **extra})) == "b17e074c5262"
    cfg = resolve({**before, **extra})
    assert "val_greedy" not in cfg and "grad_share_every" not in cfg
    assert run_id(cfg) == run_id(resolve({**before, **{k: v for k, v in extra.items() if k == "val_temperature"}}))


def test_mechanism_fields_when_used_are_kept():

    cfg = resolve({"objective": "dapo", "val_greedy": True, "grad_share_every": 0})
    assert (cfg["val_greedy"], cfg["grad_share_every"]) == (True, 0)
    assert resolve(cfg) == cfg
    assert run_id(cfg) != run_id(resolve({"objective": "dapo"}))
