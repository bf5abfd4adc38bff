"""stop_on_collapse (issue 39 §5): the config key, the online rule (armorlab.stats.stopping), a stopped
run in the sweep layer (stand-in trainer, local executor) and in reports (the carried-forward level)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sweep_support import run_cli, standin_command, write_spec

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir, run_id
from armorlab.errors import ArmorLabError
from armorlab.stats.collapse import null_threshold
from armorlab.stats.stopping import CollapseWatch, carry_forward
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.status import collect
from armorlab.sweeps.submit import DONE, plan_sweep

# run ids computed by main before the key existed (1557cc3)
OLD_IDS = {
    "b17e074c5262": {},
    "a52b59b99024": {"objective": "armor"},
    "d42dc46dd21d": {"objective": "cispo"},
    "54462ec59d12": {"objective": "up", "step_unit": "rollout", "val_every": 5, "max_rollouts": 40},
    "16e2fd082c9a": {"objective": "dapo", "max_steps": 500, "val_every": 20},
}


@pytest.mark.parametrize("expected", sorted(OLD_IDS))
def test_off_is_the_run_it_was(expected):
    raw = OLD_IDS[expected]
    assert run_id(resolve(raw)) == expected
    assert run_id(resolve({**raw, "stop_on_collapse": None})) == expected
    assert run_id(resolve({**raw, "stop_on_collapse": False})) == expected
    assert run_id(resolve({**raw, "stop_on_collapse": True})) != expected


def test_true_fills_three_evals_of_patience_in_rollouts():
    cfg = resolve({"step_unit": "rollout", "val_every": 5, "max_rollouts": 100, "stop_on_collapse": True})
    assert cfg["stop_on_collapse"] == {"patience": 15, "delta": 0.03, "alpha": 0.04}  # 3 evals × 5 rollouts
    # the filled form is the same run as the short one
    assert run_id(resolve({**cfg, "stop_on_collapse": cfg["stop_on_collapse"]})) == run_id(cfg)


@pytest.mark.parametrize("value, key, words", [
    ({"patience": -3}, "stop_on_collapse", "patience must be ≥ 1"),
    ({"patience": "ten"}, "stop_on_collapse", "patience must be an integer"),
    ({"patience": 10 ** 12}, "stop_on_collapse", "patience must be ≤"),
    ({"patience": 90}, "stop_on_collapse.patience", "over half the run"),  # 21 evals, 5 rollouts apart
    ({"patience": 10, "alpha": 0.9}, "stop_on_collapse", "alpha must be ≤ 0.5"),
    ({"patience": 10, "delta": 0}, "stop_on_collapse", "delta must be >"),
    ({"patience": 10, "wait": 3}, "stop_on_collapse", "unknown key 'wait'"),
    ("yes", "stop_on_collapse", "must be true, false or"),
])
def test_hostile_values_name_key_and_value(value, key, words):
    with pytest.raises(ArmorLabError) as err:
        resolve({"step_unit": "rollout", "val_every": 5, "max_rollouts": 100, "stop_on_collapse": value},
                file="run.yaml")
    assert err.value.key == key and words in str(err.value) and "run.yaml" in str(err.value)
    shown = value["patience"] if key.endswith("patience") else value
    assert repr(shown) in str(err.value) or str(shown) in str(err.value)


def test_a_run_that_never_validates_cannot_stop():
    with pytest.raises(ArmorLabError, match="never validates") as err:
        resolve({"val_every": 0, "stop_on_collapse": True})
    assert err.value.key == "stop_on_collapse"


# --------------------------------------------------------------------------- the online rule (S1)
def test_a_fall_stops_once_it_has_lasted_the_patience():
    watch = CollapseWatch(patience=2, horizon=13)
    curve = [0.5, 0.6, 0.8, 0.8, 0.8, 0.2, 0.2, 0.2]  # one eval per rollout
    stops = [watch.observe(r, v, 400) for r, v in enumerate(curve)]
    # at rollout 5 the last window (0.8, 0.2) still holds an eval nearer the peak: no stop yet
    assert stops[:6] == [None] * 6 and stops[6] is not None
    # peak level 0.8 (rollouts 3-4), level 0.2: pooled p = 0.5, SE = sqrt(0.25 · 2/800) = 0.025
    assert (stops[6].onset, stops[6].at) == (5, 6)
    assert stops[6].z == pytest.approx(0.6 / 0.025)
    assert stops[6].reason == "collapse at rollout 5, level fell 24.0 SE"
    assert watch.observe(7, 0.9, 400) is stops[6]  # decided: it stays decided


def test_a_one_eval_dip_and_a_fall_smaller_than_delta_never_stop():
    dip = CollapseWatch(patience=3, horizon=30)
    assert all(dip.observe(r, v, 400) is None for r, v in enumerate([0.6] * 10 + [0.2] + [0.6] * 10))
    small = CollapseWatch(patience=3, horizon=30, delta=0.05)
    # a fall of 0.04 at n = 10^6: far beyond the noise, below δ
    assert all(small.observe(r, v, 10 ** 6) is None for r, v in enumerate([0.60] * 10 + [0.56] * 10))


def test_flat_binomial_curves_stop_at_most_alpha_of_the_time():
    rng = np.random.default_rng(7)
    stops = 0
    for _ in range(200):
        watch = CollapseWatch(patience=3, horizon=25)
        for r, v in enumerate(rng.binomial(256, 0.5, size=25) / 256):
            if watch.observe(r, v, 256) is not None:
                stops += 1
                break
    # α = 0.04: 8 of 200 expected at most; 16 is beyond 3 binomial SDs (√(200·0.04·0.96) = 2.8)
    assert stops <= 16, stops


def test_the_threshold_is_the_whole_runs():
    watch = CollapseWatch(patience=2, horizon=40)
    watch.observe(0, 0.8, 400)
    # the rule is no looser than the whole curve's test: z* at 40 evals ≥ z* at the 8 evals seen
    assert null_threshold(40, 2, 0.04) >= null_threshold(8, 2, 0.04)


# --------------------------------------------------------------------------- carried forward (S2)
def test_carry_forward_extends_at_the_level_at_stop():
    s, v = carry_forward([0, 5, 10, 15, 20, 25, 30], [0.6, 0.6, 0.6, 0.6, 0.2, 0.2, 0.2], 50, patience=3)
    assert s.tolist() == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50]
    assert v[7:].tolist() == pytest.approx([0.2] * 4)
    s, v = carry_forward([0, 4, 8], [0.6, 0.4, 0.5], 10, patience=2)  # a horizon off the spacing
    assert s.tolist() == [0, 4, 8, 10] and v[-1] == pytest.approx(0.45)
    s, v = carry_forward([0, 4, 8], [0.6, 0.4, 0.5], 8)
    assert s.tolist() == [0, 4, 8]


def _hand_run(root, seed, val, *, state, reason=None):
    rd = RunDir.create(root, resolve({"objective": "dapo", "seed": seed, "max_steps": 50}))
    for step, value in val.items():
        rd.append_metrics(step, {"val/acc": value, "test/acc": value - 0.1, "val/n": 1000, "test/n": 1000})
    rd.write_status(state, reason=reason)
    return rd


def test_a_stopped_run_counts_as_collapsed_in_final_auc_and_matched_steps(tmp_path):
    from armorlab.analysis.recipe import Select
    from armorlab.analysis.until_resolved_scores import score_runs

    root = tmp_path / "sw"
    steps = range(0, 55, 5)
    done = _hand_run(root, 0, {s: 0.6 for s in steps}, state="completed")
    stopped = _hand_run(root, 1, {s: 0.6 if s < 20 else 0.2 for s in steps if s <= 30}, state="stopped",
                        reason="collapse at rollout 10, level fell 12.6 SE")
    scores = score_runs({done.id: done.path, stopped.id: stopped.path}, {done.id: "a", stopped.id: "a"},
                        "final", Select(), matched_steps=[50], cache=False)
    row = scores.per_run.set_index("run_id").loc[stopped.id]
    assert row["state"] == "stopped"
    assert row["final"] == pytest.approx(0.2) and row["val@50"] == pytest.approx(0.2)
    assert row["test@50"] == pytest.approx(0.1)
    # trapezoid over 0-50 of 0.6 to step 15, down to 0.2 at 20, 0.2 to 50: (9 + 2 + 6) / 50
    assert row["auc"] == pytest.approx(17 / 50)
    other = scores.per_run.set_index("run_id").loc[done.id]
    assert other["auc"] == pytest.approx(0.6) and other["val@50"] == pytest.approx(0.6)
    assert row["selected_val"] == pytest.approx(0.6)  # the kept peak is its own curve's


def test_reports_mark_stopped_runs(tmp_path):
    from armorlab.analysis import report as R
    from armorlab.analysis.recipe import Recipe

    root = tmp_path / "sw"
    _hand_run(root, 0, {s: 0.6 for s in range(0, 55, 5)}, state="completed")
    stopped = _hand_run(root, 1, {s: 0.6 if s < 20 else 0.2 for s in range(0, 35, 5)}, state="stopped",
                        reason="collapse at rollout 10, level fell 12.6 SE")
    result = R.build_report(Recipe(runs=[str(root)], title="stops"), tmp_path / "out")
    text = "\n".join(result.warnings)
    assert f"run {stopped.id} stopped itself (collapse at rollout 10, level fell 12.6 SE)" in text
    assert "did not reach matched step" not in text  # carried forward, not missing


# --------------------------------------------------------------------------- a sweep arm (local executor)
# val/acc of every stand-in run: rises to a peak at steps 4-8, collapses at step 10
VAL_STEPS = [[0, 0.5], [2, 0.6], [4, 0.8], [10, 0.2]]
# two optimizer steps per rollout, one eval per rollout (every 2 steps), 13 evals planned
STANDIN_BASE = {"max_steps": 24, "val_every": 2, "save_steps": 2, "steps_per_generation": 2,
                "gradient_accumulation_steps": 1}


def _collapsing_standins(monkeypatch):
    """Sweeps train with the stand-in trainer, whose val/acc follows VAL_STEPS."""
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.01")
    monkeypatch.setenv("ARMORLAB_STANDIN_VAL_STEPS", json.dumps(VAL_STEPS))


def test_a_collapsing_sweep_arm_stops_keeps_its_peak_and_is_not_restarted(tmp_path, monkeypatch):
    _collapsing_standins(monkeypatch)
    spec = write_spec(tmp_path / "s.yaml", {"name": "s", "base": STANDIN_BASE, "grid": {
        "stop_on_collapse": [None, {"patience": 2}]}})
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root), "--workers", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    st = collect(root / "s")
    assert st.counts == {"completed": 1, "stopped": 1}
    stopped = next(r for r in st.rows if r.state == "stopped")
    rd = RunDir(root / "s" / stopped.run_id)
    # evals at steps 10 and 12 (rollouts 5, 6) are low: it stops at step 12, 24.0 SE below the peak
    status = rd.read_status()
    assert status["reason"] == "collapse at rollout 5, level fell 24.0 SE" and status["ended"]
    assert rd.last_step() == 12 and stopped.last_step == 12
    # the peak level: evals 0.8 at steps 4, 6, 8; the window's middle eval is step 6
    selected = rd.read_selected()
    assert (selected["step"], selected["value"]) == (6, pytest.approx(0.8))
    assert (rd.path / selected["checkpoint"]).is_dir()
    said = [line for line in (out.stdout + out.stderr).splitlines() if stopped.run_id in line]
    assert any("stopped: collapse at rollout 5" in line for line in said), said
    # a rerun plans nothing for it, and runs nothing
    plan = plan_sweep(spec, root=root)
    assert plan.actions[stopped.run_id] == DONE
    again = run_cli("sweep", str(spec), "--root", str(root))
    assert again.returncode == 0, again.stderr
    assert rd.read_status() == status and rd.last_step() == 12


def test_a_stopped_parent_is_final_for_a_continuation(tmp_path):
    from armorlab.train.init_from import find_start

    rd = _hand_run(tmp_path / "p", 0, {0: 0.5, 5: 0.6}, state="stopped",
                   reason="collapse at rollout 1, level fell 5.0 SE")
    ck = rd.checkpoints_dir / "checkpoint-5"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text("{}")
    (ck / "config.json").write_text("{}")
    (rd.path / "selected.json").write_text(json.dumps({
        "rule": "r", "metric": "val/acc", "mode": "max", "step": 5, "rollout": 1, "value": 0.6,
        "checkpoint": "checkpoints/checkpoint-5"}))
    child = RunDir.create(tmp_path / "c", resolve({"seed": 3}))
    start = find_start(child, {"run": f"p/{rd.id}", "select": {"metric": "val/acc", "mode": "max"}})
    assert (start.step, start.checkpoint) == (5, ck.resolve())


# --------------------------------------------------------------------------- the trainer itself
def test_the_trainer_stops_on_a_collapsing_eval_stream_and_keeps_its_peak(tmp_path, monkeypatch):
    """A real tiny run whose evals are a stand-in stream (the VAL_STEPS curve, n = 400)."""
    from armorlab.train.evaluation import Validator
    from armorlab.train.launch import train_run_dir
    from tests.trainer_support import model_cache, resolved

    monkeypatch.setenv("ARMORLAB_CACHE", model_cache())
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "ARMORLAB_JOB_ID"):
        monkeypatch.delenv(var, raising=False)

    def stream(self, step):
        return {"val/acc": [v for at, v in VAL_STEPS if at <= step][-1], "val/n": 400.0}

    monkeypatch.setattr(Validator, "run", stream)
    # SMALL: steps_per_generation 2 at GA 1 = two optimizer steps per rollout; one eval per rollout
    rd = RunDir.create(tmp_path, resolved(objective="dapo", max_steps=24, val_every=2, stop_on_collapse={"patience": 2}))
    outcome = train_run_dir(rd.path)
    assert (outcome.state, outcome.exit_code) == ("stopped", 0)
    assert outcome.reason == "collapse at rollout 5, level fell 24.0 SE"
    status = rd.read_status()
    assert (status["state"], status["reason"]) == ("stopped", outcome.reason) and status["ended"]
    rows = rd.read_metrics()
    assert rows[-1]["step"] == 12 and rows[-1]["rollout"] == 6
    selected = rd.read_selected()
    assert (selected["step"], selected["rollout"], selected["value"]) == (6, 3, pytest.approx(0.8))
    assert (rd.path / selected["checkpoint"] / "trainer_state.json").is_file()
    # the keeper kept the peak; a second start trains nothing
    again = train_run_dir(rd.path)
    assert (again.state, again.already_completed) == ("stopped", True) and rd.read_metrics() == rows


def test_a_later_stage_starts_from_a_stopped_parent_on_the_local_executor(tmp_path, monkeypatch):
    _collapsing_standins(monkeypatch)
    spec = write_spec(tmp_path / "st.yaml", {"name": "st", "base": STANDIN_BASE, "stages": [
        {"name": "dapo", "base": {"stop_on_collapse": {"patience": 2}}},
        {"name": "continue", "from": {"stage": "dapo", "select": {"metric": "val/acc", "mode": "max"}}}]})
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    st = collect(root / "st")
    assert sorted(st.counts.items()) == [("completed", 1), ("stopped", 1)]
    child = next(r for r in st.rows if r.state == "completed")
    # the stand-in records its parent's status when it started: the stopped, final one
    seen = json.loads((root / "st" / child.run_id / "standin_parent.json").read_text())
    assert seen["state"] == "stopped" and seen["reason"] == "collapse at rollout 5, level fell 24.0 SE"
