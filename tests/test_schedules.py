"""Steps in the papers' unit (rollouts), the kept checkpoint's rule and retention, and the run ids of
configs that do not use these fields — all without a model (issue 26 §1, §3, §4)."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir, run_id
from armorlab.core.schedule import (
    config_val_every_steps,
    every_due,
    optimizer_steps,
    rollout_at,
    unit_count,
    updates_per_rollout,
)
from armorlab.errors import ArmorLabError
from armorlab.stats.select import pending_steps, select_checkpoints
from armorlab.train.keep import retention
from armorlab.train.reference import reset_due


def resets(last_step: int, unit: str, per_rollout, tau: int, schedule=None) -> list[int]:
    """Optimizer steps after which π_ref is reset, as the trainer's callback decides (hooks.py)."""
    out = []
    for step in range(1, last_step + 1):
        count = unit_count(step, unit, per_rollout)
        if count is not None and reset_due(count, tau, schedule):
            out.append(step)
    return out


# --------------------------------------------------------------------------- units
def test_paper_base_has_16_updates_per_rollout():
    # sweeps/paper/base.yaml: 64 micro-steps per generation, 4 accumulation steps
    assert updates_per_rollout(64, 1, 4) == 16
    assert updates_per_rollout(2, 1, 1) == 2 and updates_per_rollout(4, 2, 8) == 1
    assert updates_per_rollout(2, 1, 4) == Fraction(1, 2)   # one update spans two rollouts


def test_tau_of_10_rollouts_resets_after_optimizer_steps_160_320():
    assert resets(700, "rollout", 16, 10) == [160, 320, 480, 640]
    assert resets(700, "optimizer", 16, 160) == [160, 320, 480, 640]   # the same, said in steps
    assert resets(700, "optimizer", 16, 10)[:3] == [10, 20, 30]        # τ = 10 steps is 16× as often


def test_schedule_in_rollouts_resets_after_each_of_the_first_180_rollouts_and_never_after():
    sched = [[180, 1], [None, 0]]
    got = resets(16 * 400, "rollout", 16, 160, sched)
    assert got == [16 * r for r in range(1, 181)]
    assert got[-1] == 2880 and len(got) == 180
    # the same schedule in optimizer steps would cover only 180 / 16 = 11¼ rollouts
    assert resets(16 * 400, "optimizer", 16, 160, sched) == list(range(1, 181))


def test_rollout_counter_and_unit_boundaries():
    assert [rollout_at(s, 16) for s in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
    assert [rollout_at(s, Fraction(1, 2)) for s in (1, 2, 3)] == [2, 4, 6]   # an update trains on two rollouts
    assert [unit_count(s, "rollout", 16) for s in (15, 16, 17, 32)] == [None, 1, None, 2]
    assert [unit_count(s, "optimizer", 16) for s in (15, 16)] == [15, 16]
    assert [s for s in range(1, 100) if every_due(s, 2, "rollout", 16)] == [32, 64, 96]
    assert not every_due(32, 0, "rollout", 16)
    assert optimizer_steps(500, "rollout", 16) == 8000 and optimizer_steps(500, "optimizer", 16) == 500
    with pytest.raises(ValueError):
        unit_count(3, "epochs", 16)


# --------------------------------------------------------------------------- config
PAPER = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4, "steps_per_generation": 64,
         "num_generations": 16}


def test_max_rollouts_sets_max_steps_and_the_resolved_config_resolves_to_itself():
    cfg = resolve({**PAPER, "step_unit": "rollout", "max_rollouts": 500, "ref_reset_steps": 10, "val_every": 10})
    assert cfg["max_steps"] == 8000 and cfg["max_rollouts"] == 500 and cfg["step_unit"] == "rollout"
    assert config_val_every_steps(cfg) == 160
    assert resolve(cfg) == cfg   # launch re-resolves config.yaml: max_steps given, and equal


def test_max_steps_and_max_rollouts_together_is_an_error_naming_both():
    with pytest.raises(ArmorLabError) as err:
        resolve({**PAPER, "max_rollouts": 500, "max_steps": 500}, file="run.yaml")
    assert err.value.key == "max_steps" and "max_rollouts" in str(err.value) and "8000" in str(err.value)


@pytest.mark.parametrize("raw, key", [
    ({"step_unit": "rollout", "steps_per_generation": 2, "gradient_accumulation_steps": 4}, "step_unit"),
    ({"max_rollouts": 3, "steps_per_generation": 3, "gradient_accumulation_steps": 2}, "max_rollouts"),
    ({"step_unit": "rollout", "steps_per_generation": None, "generation_batch_size": 64}, "step_unit"),
    ({"step_unit": "epochs"}, "step_unit"),
    ({"anchor_cache": "sometimes", "anchor": True}, "anchor_cache"),
    ({"keep_checkpoints": -1}, "keep_checkpoints"),
])
def test_bad_unit_settings_name_their_key(raw, key):
    with pytest.raises(ArmorLabError) as err:
        resolve(raw, file="run.yaml")
    assert err.value.key == key


# ids computed by the code before these fields existed (commit bc51ae1), for configs that do not use them
OLD_IDS = {
    "b17e074c5262": {},
    "a52b59b99024": {"objective": "armor"},
    "4cb176557824": {"objective": "armor", "ref_reset_steps": 0, "val_every": 5, "max_steps": 40},
    "3928fe836a8f": {"objective": "dapo", "anchor_gate": True},
    "ba8378fca175": {"objective": "dapo", "dynamic_sampling_factor": 2},
    "340ec834d570": {"objective": "grpo", "ref_reset_schedule": [[180, 1], [None, 0]], "save_total_limit": 3},
}


@pytest.mark.parametrize("expected", sorted(OLD_IDS))
def test_configs_without_the_new_fields_keep_their_run_ids(expected):
    raw = OLD_IDS[expected]
    assert run_id(resolve(raw)) == expected
    # the new fields at their defaults are the same run
    defaults = {"step_unit": "optimizer", "max_rollouts": None, "keep_checkpoints": 1, "anchor_cache": None}
    assert run_id(resolve({**raw, **defaults})) == expected


def test_anchor_cache_null_means_window_with_resets_and_off_when_static():
    # the explicit value null stands for is the same run (one id), the other one is a new run
    armor = {"objective": "armor"}                      # preset τ = 160: π_ref resets
    assert resolve({**armor, "anchor_cache": "window"}) == resolve(armor)
    assert resolve({**armor, "anchor_cache": "off"})["anchor_cache"] == "off"
    static = {"objective": "armor", "ref_reset_steps": 0}
    assert resolve({**static, "anchor_cache": "off"}) == resolve(static)
    assert resolve({**static, "anchor_cache": "window"})["anchor_cache"] == "window"
    # without anchors and gate nothing is sampled from π_ref: the key is inert
    assert resolve({"objective": "dapo", "anchor_cache": "window"}) == resolve({"objective": "dapo"})


def test_refill_factor_now_also_serves_the_gate():
    gate = {"objective": "grpo", "anchor_gate": True}
    assert resolve({**gate, "dynamic_sampling_factor": 2})["dynamic_sampling_factor"] == 2
    assert resolve({**gate, "dynamic_sampling_factor": 1}) == resolve(gate)   # 1 = no refill: as before
    assert resolve({"objective": "grpo", "dynamic_sampling_factor": 2})["dynamic_sampling_factor"] is None


# --------------------------------------------------------------------------- the selected checkpoint
def test_selection_is_a_level_not_the_raw_maximum():
    steps = [0, 10, 20, 30, 40, 50, 60]
    values = [0.50, 0.52, 0.90, 0.50, 0.70, 0.72, 0.80]   # one lucky eval at 20
    # levels: 10: 0.64, 20: 0.64, 30: 0.70, 40: 0.64, 50: 0.74, and 60: (0.72 + 0.80)/2 = 0.76
    (pick,) = select_checkpoints(steps, values)
    assert pick.step == 60 and pick.level == pytest.approx(0.76) and pick.window == (50, 60)
    values[-1] = 0.71  # 50: (0.70 + 0.72 + 0.71)/3 = 0.71 (the centred rule's pick), 60: 0.715
    assert select_checkpoints(steps, values)[0].step == 60
    values[-1] = 0.60  # 50: 0.673, 60: 0.66: 30 (0.70) is best
    assert select_checkpoints(steps, values)[0].step == 30
    assert select_checkpoints(steps, values, settled=True)[0].step == 30
    # mode min (a loss): the lowest level, 10 (0.64) before 20 (0.64) and 40 (0.64) on the tie
    assert select_checkpoints(steps, values, mode="min")[0].step == 10


def test_selection_picks_the_last_checkpoint_of_a_rising_curve():
    # the issue's case: 0.59 at step 5 was chosen over 0.635 at step 10 by the window's middle
    steps, values = [0, 5, 10], [0.50, 0.59, 0.635]
    (pick,) = select_checkpoints(steps, values)
    assert pick.step == 10 and pick.level == pytest.approx((0.59 + 0.635) / 2)
    # settled levels leave the last one out: a later eval may still lower it
    assert select_checkpoints(steps, values, settled=True)[0].step == 5


def test_top_k_picks_distinct_eligible_steps_best_first():
    steps = [0, 1, 2, 3, 4, 5, 6]
    values = [0.1, 0.2, 0.9, 0.8, 0.3, 0.2, 0.1]
    # levels: 0.4 (mid 1), 0.633 (mid 2), 0.667 (mid 3), 0.433 (mid 4), 0.2 (mid 5)
    assert [p.step for p in select_checkpoints(steps, values, top=3)] == [3, 2, 4]
    # a middle without a checkpoint does not compete
    assert [p.step for p in select_checkpoints(steps, values, top=2, eligible=[1, 2, 4, 5])] == [2, 4]


def test_two_evals_fall_back_to_the_checkpointed_one_and_step_0_is_never_picked():
    assert select_checkpoints([0, 10], [0.9, 0.1])[0].step == 10
    assert select_checkpoints([0], [0.9]) == []


def test_pending_steps_are_the_evals_a_later_window_can_centre_on():
    assert pending_steps([0, 10, 20, 30]) == [30]             # m = 3: only the newest
    assert pending_steps([0, 10, 20, 30], patience=5) == [20, 30]
    assert pending_steps([0]) == [0]


def test_retention_keeps_last_selected_and_pending_and_drops_the_rest():
    evals = [(0, 0.1), (2, 0.2), (4, 0.9), (6, 0.8), (8, 0.7), (10, 0.1), (12, 0.1)]
    plan = retention([2, 4, 6, 8, 10, 12], evals, keep=1, last=1)
    # levels: 0.4 (mid 2), 0.633 (mid 4), 0.8 (mid 6), 0.533 (mid 8), 0.3 (mid 10): the peak is 6
    assert plan.picks[0].step == 6
    assert plan.keep == {6, 12} and plan.drop == (2, 4, 8, 10)
    plan = retention([2, 4, 6, 8, 10, 12], evals, keep=2, last=2)
    assert plan.keep == {4, 6, 10, 12}
    # keep 0: only TRL-like rotation (the last ones and the pending eval)
    assert retention([2, 4, 6], evals[:4], keep=0, last=1).keep == {6}
    # no limit: nothing is deleted
    assert retention([2, 4, 6], evals[:4], keep=1, last=None).drop == ()


def test_a_window_outside_the_top_k_never_comes_back():
    # online: pruning at every eval and selecting again at the end keeps what offline selection picks
    import random

    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 15)
        evals = [(2 * i, rng.random()) for i in range(n)]
        keep = rng.randint(1, 3)
        on_disk: set[int] = set()
        for i in range(n):
            if evals[i][0] > 0:
                on_disk.add(evals[i][0])
            plan = retention(on_disk, evals[:i + 1], keep=keep, last=1)
            on_disk = set(plan.keep)
        offline = select_checkpoints([s for s, _ in evals], [v for _, v in evals], top=keep)
        assert [p.step for p in offline] == [p.step for p in plan.picks]
        assert {p.step for p in offline} <= on_disk
        assert len(on_disk) <= 1 + keep + 1


# --------------------------------------------------------------------------- reading rollouts
def _run(root, seed, lines):
    from armorlab.core.runs import RunDir

    rd = RunDir.create(root, resolve({"seed": seed, "max_steps": 4}))
    for step, rollout, metrics in lines:
        rd.append_metrics(step, metrics, rollout=rollout)
    rd.write_status("completed")
    return rd


def test_curves_in_rollouts_average_each_rollouts_lines_and_skip_runs_without_the_counter(tmp_path):
    from armorlab.analysis.load import load
    from armorlab.analysis.recipe import parse_recipe

    new = _run(tmp_path / "s", 0, [(0, 0, {"val/acc": 0.5}), (1, 1, {"train/reward": 0.2}),
                                   (2, 1, {"train/reward": 0.4, "val/acc": 0.6}), (3, 2, {"train/reward": 0.7}),
                                   (4, 2, {"train/reward": 0.9, "val/acc": 0.8})])
    old = _run(tmp_path / "s", 1, [(1, None, {"train/reward": 0.1})])          # written before the counter
    rs = load([tmp_path / "s"], cache=False)
    assert "rollout" not in rs.metrics
    steps, values = rs.curve(new.id, "train/reward")
    assert steps.tolist() == [1, 2, 3, 4] and values.tolist() == [0.2, 0.4, 0.7, 0.9]
    rs.counter = "rollout"
    rollouts, values = rs.curve(new.id, "train/reward")
    assert rollouts.tolist() == [1, 2] and values == pytest.approx([0.3, 0.8])
    assert rs.curve(new.id, "val/acc")[0].tolist() == [0, 1, 2] and rs.last_step(new.id) == 2
    assert rs.curve(old.id, "train/reward")[0].size == 0 and rs.last_step(old.id) is None
    assert parse_recipe({"runs": ["x"], "x": "rollout"}).x == "rollout"
    assert parse_recipe({"runs": ["x"]}).x == "step"
    with pytest.raises(ArmorLabError) as err:
        parse_recipe({"runs": ["x"], "x": "epoch"}, file="r.yaml")
    assert err.value.key == "x"


def test_a_report_that_reads_another_unit_than_its_sweep_says_so_naming_both_files(tmp_path):
    from armorlab.analysis import report as R
    from armorlab.analysis.recipe import load_recipe, unit_disagreement

    root = tmp_path / "runs" / "paper"
    for seed in (0, 1):
        rd = RunDir.create(root, resolve({"seed": seed, "max_steps": 4, "step_unit": "rollout", "val_every": 1}))
        for step in range(5):   # 2 optimizer steps per rollout
            rd.append_metrics(step, {"val/acc": 0.5 + 0.01 * step, "val/n": 100}, rollout=step // 2)
        rd.write_status("completed")
    (root / "sweep.json").write_text(json.dumps({"name": "paper", "source": "sweeps/paper/x.yaml"}))
    for x, warned in (("step", True), ("rollout", False)):
        recipe_file = tmp_path / f"read_{x}.yaml"
        recipe_file.write_text(f"runs: [{root}]\nx: {x}\n")
        result = R.build_report(load_recipe(recipe_file), tmp_path / f"out_{x}")
        said = [w for w in result.warnings if "UNIT MISMATCH" in w]
        assert bool(said) is warned, result.warnings
        if warned:
            assert str(recipe_file) in said[0] and "sweeps/paper/x.yaml counts in step_unit: rollout" in said[0]
            assert "set x: rollout" in said[0]
    # a sweep counted in optimizer steps (no step_unit in its configs) read in rollouts: the other way
    assert "set x: step" in unit_disagreement("rollout", "r.yaml", {"runs/a": "optimizer"})
    assert unit_disagreement("step", "r.yaml", {"runs/a": "optimizer", "runs/b": "optimizer"}) is None


def test_the_collapse_pruner_plans_its_evals_in_optimizer_steps():
    from armorlab.tune.pruners import planned_evals

    # val_every 10 rollouts of 16 updates over 100 rollouts: every 160 steps, 1600 steps → 11 evals
    cfg = resolve({**PAPER, "step_unit": "rollout", "max_rollouts": 100, "val_every": 10})
    assert planned_evals(cfg) == 11
    assert planned_evals({"max_steps": 200, "val_every": 10}) == 21
