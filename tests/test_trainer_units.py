"""Trainer building blocks without a model: schedule, anchors, cache, gate, ratios, telemetry, config."""

from __future__ import annotations

import math
import random

import pytest
import torch

from armorlab.algos import dynamic_sampling as dyn
from armorlab.algos.kl import k1 as kl_k1
from armorlab.algos.kl import k2 as kl_k2
from armorlab.algos.kl import k3 as kl_k3
from armorlab.errors import ArmorLabError
from armorlab.train import anchors as anc
from armorlab.train.reference import reset_due, reset_interval
from armorlab.train.telemetry import (
    StepStats,
    TokenDump,
    design_names,
    logits_kl,
    sequence_sum_mean,
)


# --------------------------------------------------------------------------- reset schedule
def test_static_and_periodic_resets():
    assert [s for s in range(1, 13) if reset_due(s, 0, None)] == []
    assert [s for s in range(1, 13) if reset_due(s, 4, None)] == [4, 8, 12]


def test_two_stage_schedule_tau_1_then_static():
    # "τ = 1 for the first 5 steps, then static": steps 1..5 reset, the boundary step 5 included
    sched = [[5, 1]]
    assert [reset_interval(s, 0, sched) for s in (1, 4, 5, 6, 9)] == [1, 1, 1, 0, 0]
    assert [s for s in range(1, 10) if reset_due(s, 0, sched)] == [1, 2, 3, 4, 5]


def test_paper_schedule_in_one_line_ignores_the_fallback_tau():
    # ARMOR's Qwen3 schedule: reset every step for the first 180 steps, then keep π_ref fixed,
    # even under the armor preset's τ = 160 (the null until_step runs to the end)
    sched = [[180, 1], [None, 0]]
    assert [s for s in range(1, 1000) if reset_due(s, 160, sched)] == list(range(1, 181))


def test_schedule_segments_then_fallback():
    # τ 1 on steps 1-4, τ 3 on 5-10 (multiples of 3: 6, 9), then τ 5 (15; 10 is in the τ-3 segment)
    sched = [[4, 1], [10, 3]]
    assert [s for s in range(1, 20) if reset_due(s, 5, sched)] == [1, 2, 3, 4, 6, 9, 15]


# --------------------------------------------------------------------------- anchors
class CountingSampler:
    """A reference that answers each prompt from a fixed stream of texts: its j-th draw of a prompt
    (over all calls) is ``texts[j % len(texts)]`` with ids (j, 99). Records every prompt asked for."""

    def __init__(self, texts):
        self.texts = texts
        self.prompts = []
        self.drawn: dict[tuple, int] = {}

    def sample(self, prompt_ids, k):
        out = []
        for p in prompt_ids:
            p = tuple(p)
            self.prompts.append(p)
            start = self.drawn.get(p, 0)
            self.drawn[p] = start + k
            out.append([anc.Completion((j, 99), self.texts[j % len(self.texts)]) for j in range(start, start + k)])
        return out


def exact_score(requests, samples):
    return [[1.0 if c.text == r.row["answer"] else 0.0 for c in group] for r, group in zip(requests, samples, strict=True)]


def req(prompt, answer):
    return anc.GroupRequest(prompt, [ord(c) for c in prompt], {"answer": answer})


def test_round_sizes_double_what_was_drawn_and_sum_to_k():
    assert anc.round_sizes(1) == [1]
    assert anc.round_sizes(2) == [1, 1]
    assert anc.round_sizes(4) == [1, 1, 2]
    assert anc.round_sizes(5) == [1, 1, 2, 1]
    assert anc.round_sizes(8) == [1, 1, 2, 4]


def test_fresh_draw_keeps_first_correct_and_draws_only_for_prompts_still_without_one():
    sampler = CountingSampler(["1", "2", "3", "2"])  # draws 1 and 3 of a prompt are "2"
    rollout = anc.AnchorRollout(sampler, exact_score, k=4, anchor_filter="correct", threshold=1.0, adaptive=True)
    outcomes, generated = rollout.run([req("a", "2"), req("b", "7")], seed=0, step=0)
    # round 1: a and b one draw each ("1": both wrong); round 2: one more each (a gets "2", done);
    # round 3: two more for b alone ("3", "2": still wrong) -> a 2 draws, b 4 = k
    assert sampler.prompts == [(97,), (98,), (97,), (98,), (98,)]
    assert generated == 6
    assert outcomes[0].anchor.ids == (1, 99) and outcomes[0].reward == 1.0 and outcomes[0].solvable
    assert outcomes[1].anchor is None and not outcomes[1].solvable
    assert not outcomes[0].cached and not outcomes[1].cached
    # forward-KL rows: only each prompt's first draw (unconditioned), whatever came after
    assert [o.fresh for o in outcomes] == [(anc.Completion((0, 99), "1"),), (anc.Completion((0, 99), "1"),)]


def test_adaptive_rejection_draws_about_the_truncated_geometric_mean_with_the_same_anchor_law():
    """Bernoulli(p) correctness: E[draws] = Σ_r size_r·(1−p)^(drawn before r) and P(anchor) = 1−(1−p)^k,
    the law of plain rejection sampling over k draws."""
    p, k, prompts = 0.3, 4, 3000
    gen = random.Random(0)

    class Bernoulli:
        def sample(self, prompt_ids, m):
            return [[anc.Completion((1,), "ok" if gen.random() < p else "no") for _ in range(m)] for _ in prompt_ids]

    def score(requests, samples):
        return [[1.0 if c.text == "ok" else 0.0 for c in group] for group in samples]

    rollout = anc.AnchorRollout(Bernoulli(), score, k=k, anchor_filter="correct", threshold=1.0, adaptive=True)
    outcomes, generated = rollout.run([req(f"q{i}", "") for i in range(prompts)], seed=0, step=0)
    q = 1 - p
    expected_draws = 1 + q + 2 * q ** 2  # rounds of 1, 1, 2 samples (by hand, for k = 4)
    assert abs(generated / prompts - expected_draws) < 4 * 1.2 / math.sqrt(prompts)  # sd of draws ≤ 1.2
    solved = sum(o.anchor is not None for o in outcomes) / prompts
    assert abs(solved - (1 - q ** k)) < 4 * math.sqrt(0.25 / prompts)
    assert rollout.rounds == 3


def test_one_round_draws_k_per_prompt_in_one_call_and_keeps_the_first_correct():
    """Issue 38 §2 (the default): one sampler call of k draws per prompt, the anchor the first correct
    of them, as adaptive rounds would pick it from the same stream."""
    sampler = CountingSampler(["1", "2", "3", "2"])
    rollout = anc.AnchorRollout(sampler, exact_score, k=4, anchor_filter="correct", threshold=1.0)
    outcomes, generated = rollout.run([req("a", "2"), req("b", "7")], seed=0, step=0)
    assert rollout.rounds == 1 and sampler.prompts == [(97,), (98,)] and generated == 8
    assert outcomes[0].anchor.ids == (1, 99) and outcomes[0].solvable
    assert outcomes[1].anchor is None and not outcomes[1].solvable
    adaptive = anc.AnchorRollout(CountingSampler(["1", "2", "3", "2"]), exact_score, k=4, anchor_filter="correct",
                                 threshold=1.0, adaptive=True)
    same, _ = adaptive.run([req("a", "2"), req("b", "7")], seed=0, step=0)
    assert [o.anchor for o in same] == [o.anchor for o in outcomes] and adaptive.rounds == 3


def test_shared_cache_holds_every_process_new_draws():
    """The cache shared across processes: what ``share`` hands back (every process's new draws, here
    a stand-in for process 1's) becomes cache hits; a key drawn here too keeps this process's draw."""
    other = anc.AnchorCache()
    other.put(anc.prompt_key("b"), anc.ReferenceDraw([anc.Completion((5,), "7")], [1.0]))
    other.put(anc.prompt_key("a"), anc.ReferenceDraw([anc.Completion((6,), "2")], [1.0]))
    handed = []
    rollout = anc.AnchorRollout(CountingSampler(["2"]), exact_score, k=2, anchor_filter="correct", threshold=1.0,
                                share=lambda mine: handed.append(mine) or [mine, other.state_dict()])
    rollout.run([req("a", "2")], seed=0, step=0)
    assert list(handed[0]) == [anc.prompt_key("a")]  # only the new draws travel
    assert rollout.cache.get(anc.prompt_key("a")).samples[0].ids == (0, 99)  # its own draw kept
    (o,), generated = rollout.run([req("b", "7")], seed=0, step=1)
    assert generated == 0 and o.cached and o.anchor.text == "7"


def test_cache_reuse_within_window_and_resample_after_clear():
    sampler = CountingSampler(["1", "2", "3", "2"])
    rollout = anc.AnchorRollout(sampler, exact_score, k=4, anchor_filter="correct", threshold=1.0, adaptive=True)
    rollout.run([req("a", "2")], seed=0, step=0)  # draws "1", "2": asked twice
    # the same prompt twice in one batch and again later: no new samples
    outcomes, generated = rollout.run([req("a", "2"), req("a", "2")], seed=0, step=1)
    assert generated == 0 and all(o.cached for o in outcomes)
    assert all(o.anchor.text == "2" for o in outcomes)  # a random CORRECT one
    assert len(sampler.prompts) == 2
    rollout.cache.clear()  # what a reference reset does
    _, generated = rollout.run([req("a", "2")], seed=0, step=2)  # the stream goes on: "3", then "2"
    assert generated == 2 and len(sampler.prompts) == 4


def test_duplicate_prompts_in_one_batch_are_sampled_once():
    sampler = CountingSampler(["x"])
    rollout = anc.AnchorRollout(sampler, exact_score, k=3, anchor_filter="any", threshold=1.0)
    outcomes, generated = rollout.run([req("a", "1"), req("a", "1")], seed=0, step=0)
    assert generated == 1 and len(sampler.prompts) == 1  # "any": the first draw is the anchor
    assert [o.cached for o in outcomes] == [False, True]


def test_filter_any_injects_the_first_sample_even_when_wrong():
    rollout = anc.AnchorRollout(CountingSampler(["9", "8"]), exact_score, k=2, anchor_filter="any", threshold=1.0)
    (o,), _ = rollout.run([req("a", "1")], seed=0, step=0)
    assert o.anchor.text == "9" and o.reward == 0.0 and not o.solvable


class _Tok:
    pad_token_id = 0

    @staticmethod
    def batch_decode(ids, skip_special_tokens=True):
        return [" ".join(map(str, i)) for i in ids]


class _GenerateRecorder(torch.nn.Module):
    """A 'model' whose generate appends token 7 then eos (2) to each row and records each call's rows."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.calls = []

    def generate(self, input_ids, attention_mask, generation_config):
        self.calls.append(input_ids.size(0))
        tail = torch.tensor([[7, 2]] * input_ids.size(0))
        return torch.cat([input_ids, tail], dim=1)


def test_transformers_sampler_generates_in_chunks_and_pads_calls_to_the_busiest_process():
    model = _GenerateRecorder()
    sampler = anc.TransformersSampler(model, _Tok(), None, [2], batch_size=3)
    out = sampler.sample([[5, 6], [8]], 4)  # 8 rows in chunks of 3: 3 calls
    assert model.calls == [3, 3, 2] and sampler.generate_calls == 3
    assert [[c.ids for c in group] for group in out] == [[(7, 2)] * 4, [(7, 2)] * 4]
    synced = anc.TransformersSampler(model, _Tok(), None, [2], batch_size=3, sync=lambda mine: max(mine, 5))
    model.calls.clear()
    assert synced.sample([[5]], 2) == [[anc.Completion((7, 2), "7 2")] * 2]
    assert model.calls == [2, 1, 1, 1, 1]  # its own chunk, then one-row dummies up to the busiest's 5 calls
    model.calls.clear()
    assert synced.sample([], 4) == [] and model.calls == [1] * 5  # nothing to draw: still 5 calls
    per_prompt = anc.TransformersSampler(model, _Tok(), None, [2], batch_size=2, per_prompt=True)
    model.calls.clear()
    per_prompt.sample([[5], [6], [7]], 4)  # chunks of 2 prompts × their 4 draws: 12 rows in 2 calls
    assert model.calls == [8, 4]


def test_with_sync_every_process_runs_every_round_also_with_nothing_to_draw():
    """The rounds go on while any process has a prompt pending (the sync says how many the busiest
    has): a process whose prompts are all cached still calls the sampler in each round."""
    calls = []

    class Recording:
        def sample(self, prompt_ids, m):
            calls.append((len(prompt_ids), m))
            return [[] for _ in prompt_ids]

    others_pending = iter([3, 2, 1])  # the busiest other process: 3, 2 and 1 prompts pending in rounds 1-3
    rollout = anc.AnchorRollout(Recording(), exact_score, k=4, anchor_filter="correct", threshold=1.0,
                                sync=lambda mine: max(mine, next(others_pending)), adaptive=True)
    rollout.cache.put(anc.prompt_key("a"), anc.ReferenceDraw([anc.Completion((1,), "2")], [1.0]))
    outcomes, generated = rollout.run([req("a", "2")], seed=0, step=0)
    assert calls == [(0, 1), (0, 1), (0, 2)] and generated == 0 and outcomes[0].cached
    alone = anc.AnchorRollout(Recording(), exact_score, k=4, anchor_filter="correct", threshold=1.0)
    alone.cache.put(anc.prompt_key("a"), anc.ReferenceDraw([anc.Completion((1,), "2")], [1.0]))
    calls.clear()
    alone.run([req("a", "2")], seed=0, step=0)
    assert calls == []  # one process: nothing to draw, no call


def test_pick_anchor_on_reuse_chooses_uniformly_among_correct():
    draw = anc.ReferenceDraw([anc.Completion((i,), str(i)) for i in range(4)], [1.0, 0.0, 1.0, 1.0])
    picks = {anc.pick_anchor(draw, anchor_filter="correct", threshold=1.0, fresh=False, rng=random.Random(s))
             for s in range(200)}
    assert picks == {0, 2, 3}
    assert anc.pick_anchor(draw, anchor_filter="correct", threshold=1.0, fresh=True, rng=random.Random(0)) == 0
    assert anc.pick_anchor(draw, anchor_filter="correct", threshold=2.0, fresh=True, rng=random.Random(0)) is None


def test_cache_state_round_trip():
    cache = anc.AnchorCache()
    cache.put(anc.prompt_key("p"), anc.ReferenceDraw([anc.Completion((1, 2), "ab")], [1.0]))
    other = anc.AnchorCache()
    other.load_state_dict(cache.state_dict())
    assert other.get(anc.prompt_key("p")) == cache.get(anc.prompt_key("p"))
    assert anc.prompt_key("p") != anc.prompt_key("q")
    assert anc.prompt_key([{"role": "user", "content": "p"}]) == anc.prompt_key([{"content": "p", "role": "user"}])


def test_anchor_rows_is_the_last_row_of_each_group_across_processes():
    # G = 2, 3 rows per process: global rows 0..5 → groups {0,1} {2,3} {4,5}; last rows 1, 3, 5
    assert anc.anchor_rows(3, 0, 2) == [1]          # global 0,1,2
    assert anc.anchor_rows(3, 1, 2) == [0, 2]       # global 3,4,5
    assert anc.anchor_rows(8, 0, 4) == [3, 7]


def test_group_keep_masks_whole_groups():
    nan = math.nan
    solvable = torch.tensor([nan, 1.0, nan, 0.0, nan, nan, nan, 1.0])  # G = 2 → groups 1, 0, ?, 1
    keep = anc.group_keep(solvable, 2)
    assert keep.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_cut_at_eos_keeps_the_eos():
    assert anc.cut_at_eos([5, 6, 2, 7, 2], [2]) == [5, 6, 2]
    assert anc.cut_at_eos([5, 6], [2]) == [5, 6]


# --------------------------------------------------------------------------- anchor ratio rules
def _probs():
    p = torch.tensor([[0.5, 0.2], [0.3, 0.6]])
    p_old = torch.tensor([[0.4, 0.25], [0.3, 0.5]])
    p_ref = torch.tensor([[0.1, 0.7], [0.2, 0.9]])
    return p, p_old, p_ref


def test_mixed_on_non_armor_gives_r_mix_on_anchor_rows_only():
    p, p_old, p_ref = _probs()
    is_anchor = torch.tensor([False, True])
    lp, olp, alpha = anc.anchor_ratio_inputs("dapo", "mixed", p.log(), p_old.log(), p_ref.log(), is_anchor, 0.7)
    ratio = (lp - olp).exp()
    r_mix = (0.7 * p[1] + 0.3 * p_ref[1]) / (0.7 * p_old[1] + 0.3 * p_ref[1])
    torch.testing.assert_close(ratio[1], r_mix)
    torch.testing.assert_close(ratio[0], p[0] / p_old[0])
    assert alpha == 1.0


def test_behavior_uses_pi_over_pi_ref_and_current_the_plain_ratio():
    p, p_old, p_ref = _probs()
    is_anchor = torch.tensor([True, False])
    lp, olp, _ = anc.anchor_ratio_inputs("up", "behavior", p.log(), p_old.log(), p_ref.log(), is_anchor, 0.7)
    torch.testing.assert_close((lp - olp).exp()[0], p[0] / p_ref[0])
    torch.testing.assert_close((lp - olp).exp()[1], p[1] / p_old[1])
    lp, olp, _ = anc.anchor_ratio_inputs("dapo", "current", p.log(), p_old.log(), p_ref.log(), is_anchor, 0.7)
    torch.testing.assert_close((lp - olp).exp(), p / p_old)


def test_armor_gets_per_row_alpha():
    p, p_old, p_ref = _probs()
    is_anchor = torch.tensor([True, False])
    _, olp, alpha = anc.anchor_ratio_inputs("armor", "behavior", p.log(), p_old.log(), p_ref.log(), is_anchor, 0.6)
    assert alpha.shape == (2, 1) and alpha[:, 0].tolist() == pytest.approx([1.0, 0.6])
    torch.testing.assert_close(olp[0], p_ref[0].log())  # the anchor's behaviour policy
    _, _, alpha = anc.anchor_ratio_inputs("armor", "mixed", p.log(), p_old.log(), p_ref.log(), is_anchor, 0.6)
    assert alpha[:, 0].tolist() == pytest.approx([0.6, 0.6])
    _, _, alpha = anc.anchor_ratio_inputs("armor", "current", p.log(), p_old.log(), p_ref.log(), is_anchor, 0.6)
    assert alpha[:, 0].tolist() == pytest.approx([1.0, 0.6])
    # no anchors in the batch: the scalar α
    _, _, alpha = anc.anchor_ratio_inputs("armor", "mixed", p.log(), p_old.log(), p_ref.log(),
                                          torch.tensor([False, False]), 0.6)
    assert alpha == 0.6


# --------------------------------------------------------------------------- telemetry
def test_kl_estimators_by_hand():
    log_r = torch.tensor([math.log(2.0), 0.0, math.log(0.5)])
    assert kl_k1(log_r).tolist() == pytest.approx([-math.log(2), 0.0, math.log(2)])
    assert kl_k2(log_r).tolist() == pytest.approx([0.5 * math.log(2) ** 2, 0.0, 0.5 * math.log(2) ** 2])
    assert kl_k3(log_r).tolist() == pytest.approx([1.0 - math.log(2), 0.0, -0.5 + math.log(2)])


def test_k_estimators_are_unbiased_where_they_should_be():
    # p = Bernoulli-like over 3 symbols, q another; E_p[k1] = E_p[k3] = KL(p‖q) exactly
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    kl = float((p * (p / q).log()).sum())
    log_r = (q / p).log()
    assert float((p * kl_k1(log_r)).sum()) == pytest.approx(kl)
    assert float((p * kl_k3(log_r)).sum()) == pytest.approx(kl)


def test_exact_kl_matches_hand_computation():
    logits_p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    logits_q = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(logits_kl(logits_p, logits_q)) == pytest.approx(expected)


def test_sequence_sum_mean_ignores_empty_rows():
    per_token = torch.tensor([[1.0, 2.0, 5.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    total, count = sequence_sum_mean(per_token, mask)
    assert float(total) == 6.0 and float(count) == 2.0


def test_step_stats_weighted_means_and_empty_names():
    stats = StepStats()
    stats.add("a", 3.0, 2.0)
    stats.add("a", 1.0, 2.0)
    stats.add("empty", 0.0, 0.0)
    stats.mean("b", torch.tensor(0.25))
    assert stats.reduce() == {"a": 1.0, "b": 0.25}


def test_design_names_maps_and_namespaces():
    out = design_names({"loss": 0.5, "val/acc": 0.1, "reward": 0.2, "completions/mean_length": 4,
                        "cap/pos_mean": None, "epoch": 1.0, "flag": True})
    assert math.isnan(out.pop("cap/pos_mean"))  # undefined this step: written as null
    assert out == {"train/loss": 0.5, "val/acc": 0.1, "trl/reward": 0.2, "trl/completions/mean_length": 4.0,
                   "train/epoch": 1.0}


def test_token_dump_writes_a_share_of_masked_tokens(tmp_path):
    import pyarrow.parquet as pq

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    t = torch.zeros(2, 3)
    dump = TokenDump(tmp_path, 1.0, seed=0)
    dump.record(7, token_ids=torch.ones(2, 3, dtype=torch.long), logp=t - 1, old_logp=t - 2, ref_logp=t - 3,
                advantages=torch.tensor([0.5, -0.5]), is_anchor=torch.tensor([True, False]), mask=mask)
    path = dump.flush(7)
    table = pq.read_table(path).to_pydict()
    assert path.name == "step-000007-r0.parquet"
    assert sorted(zip(table["group"], table["position"], strict=True)) == [(0, 0), (0, 1), (1, 0)]
    assert set(table["logp"]) == {-1.0} and set(table["ref_logp"]) == {-3.0}
    assert [a for r, a in sorted(zip(table["group"], table["is_anchor"], strict=True))] == [True, True, False]
    assert dump.flush(8) is None  # nothing recorded since
    off = TokenDump(tmp_path / "off", 0.0, seed=0)
    off.record(1, token_ids=torch.ones(2, 3, dtype=torch.long), logp=t, old_logp=t, ref_logp=t,
               advantages=torch.zeros(2), is_anchor=None, mask=mask)
    assert off.flush(1) is None and not (tmp_path / "off").exists()


# --------------------------------------------------------------------------- config
def _config(**kw):
    from armorlab.train.trainer import ArmorLabConfig

    base = {"output_dir": "/tmp/unused-armorlab", "use_cpu": True, "bf16": False, "report_to": [],
            "per_device_train_batch_size": 4, "num_generations": 2}
    return ArmorLabConfig(**{**base, **kw})


def test_config_validates_with_the_shared_checks():
    with pytest.raises(ArmorLabError) as err:
        _config(objective="ppo")
    assert "'objective'" in str(err.value) and "'ppo'" in str(err.value)
    with pytest.raises(ArmorLabError, match="'alpha'"):
        _config(objective="armor", alpha=1.5)
    with pytest.raises(ArmorLabError, match="'ref_reset_schedule'"):
        _config(ref_reset_schedule=[[5, 1], [3, 0]])
    with pytest.raises(ArmorLabError, match="'sync_ref_model'"):
        _config(sync_ref_model=True, beta=0.1)


def test_config_inert_nulls_take_defaults_and_gate_only_is_valid():
    args = _config(objective="dapo", alpha=None, anchor=False, anchor_gate=True, anchor_filter=None,
                   anchor_ratio=None)
    assert args.anchor_filter == "correct" and args.anchor_gate and not args.anchor
    # α stays null where the run never reads it (not re-defaulted, then forced to 1 on the way to the
    # loss); where it does, a Python user who left it out gets (G−1)/G = (2−1)/2
    assert args.alpha is None and _config(objective="armor", alpha=None).alpha == 0.5
    assert _config(objective="dapo", alpha=None, anchor=True, anchor_ratio="mixed").alpha == 0.5


def test_group_has_spread_by_hand():
    nan = float("nan")
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0, nan, 1.0, nan, nan, 0.5, 0.5])
    # groups of 3: [1,1,0] spread; [1,1,1] none; [nan,1,nan] one scored → none; [nan,.5,.5] none
    assert dyn.group_has_spread(rewards, 3).tolist() == [1.0] * 3 + [0.0] * 9


def test_refill_rows_takes_training_groups_first_then_fills_in_order():
    keep = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1], dtype=torch.float32)  # groups of 2: kept = 1 and 3
    assert dyn.refill_rows(keep, 2, 2).tolist() == [2, 3, 6, 7]
    assert dyn.refill_rows(keep, 2, 3).tolist() == [2, 3, 6, 7, 0, 1]   # too few: group 0 fills, masked


def test_extra_prompt_rows_repeat_each_prompt_per_group_and_follow_the_seed():
    data = [{"prompt": f"p{i}"} for i in range(50)]
    rows = dyn.extra_prompt_rows(data, 3, 4, seed=7)
    assert len(rows) == 12 and all(rows[i] == rows[i - i % 4] for i in range(12))  # 3 groups of 4
    assert rows == dyn.extra_prompt_rows(data, 3, 4, seed=7)                       # a resume draws the same
    assert rows != dyn.extra_prompt_rows(data, 3, 4, seed=8)


def test_refill_needs_whole_groups_per_process():
    dyn.check_refill_fits(32, 8, 2)
    dyn.check_refill_fits(12, 8, 1)  # no refill: any layout
    with pytest.raises(ArmorLabError) as err:
        dyn.check_refill_fits(12, 8, 2)
    assert err.value.key == "dynamic_sampling_factor" and "12" in str(err.value)


def test_merge_rounds_pads_prompts_left_completions_right_and_adds_generation_stats():
    pad = 9
    a = {"prompt_ids": torch.tensor([[1, 2]]), "prompt_mask": torch.tensor([[1, 1]]),
         "completion_ids": torch.tensor([[3, 4, 5]]), "completion_mask": torch.tensor([[1, 1, 1]]),
         "advantages": torch.tensor([0.5]), "armorlab_gen:x:total": torch.tensor(2.0),
         "armorlab_anchor_rate": torch.tensor(0.25), "num_items_in_batch": torch.tensor(3.0), "meta": "a"}
    b = {"prompt_ids": torch.tensor([[6, 7, 8]]), "prompt_mask": torch.tensor([[1, 1, 1]]),
         "completion_ids": torch.tensor([[3]]), "completion_mask": torch.tensor([[1]]),
         "advantages": torch.tensor([-1.0]), "armorlab_gen:x:total": torch.tensor(5.0),
         "armorlab_anchor_rate": torch.tensor(0.75), "num_items_in_batch": torch.tensor(1.0), "meta": "b"}
    out = dyn.merge_rounds([a, b], pad)
    assert out["prompt_ids"].tolist() == [[pad, 1, 2], [6, 7, 8]]            # TRL left-pads prompts
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[3, 4, 5], [3, pad, pad]]      # completions on the right
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out["advantages"].tolist() == [0.5, -1.0]
    assert float(out["armorlab_gen:x:total"]) == 7.0                         # (total, count) stats add up
    assert float(out["armorlab_anchor_rate"]) == 0.5 and out["meta"] == "a"
