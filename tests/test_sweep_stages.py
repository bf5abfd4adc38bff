"""Stages (the continual protocol) and controls in sweep specs: validation, expansion, the order
runs start in on this machine, failure propagation, status and the dry run (stand-in trainer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from model_dirs import fake_model_dir
from sweep_support import run_cli, standin_command, write_spec

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir, run_id
from armorlab.errors import ArmorLabError
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.manifest import Manifest, load_manifest, parent_failed_reason
from armorlab.sweeps.spec import control_pairs, count_points, expand, parse_spec
from armorlab.sweeps.status import collect
from armorlab.sweeps.submit import ACTIVE, BLOCKED, SUBMIT, WAIT, classify, plan_sweep


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.01")


def _two_stage(**second) -> dict:
    return {"name": "proto", "base": {"max_steps": 3, "val_every": 1}, "seeds": [0, 1],
            "stages": [{"name": "dapo", "base": {"objective": "dapo"}},
                       {"name": "continue", "from": {"stage": "dapo"}, "include": [{"objective": "dapo"},
                                                                                   {"objective": "up"}], **second}]}


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("change, key, said", [
    (lambda s: s["stages"][1].update(grd={}), "stages[1].grd", "unknown stage key"),
    (lambda s: s["stages"][1].update({"from": {"stage": "continue"}}), "stages[1].from.stage", "earlier stage"),
    (lambda s: s["stages"][0].update({"from": {"stage": "nosuch"}}), "stages[0].from.stage", "earlier stage"),
    (lambda s: s["stages"][1]["from"].update(rule="max"), "stages[1].from.rule", "unknown key"),
    (lambda s: s["stages"][1]["from"].update(select={"metric": "val/acc", "mode": "best"}),
     "stages[1].from.select", "max or min"),
    (lambda s: s["stages"][1]["from"].update(seeds="all"), "stages[1].from.seeds", "mapping"),
    (lambda s: s["stages"][1].update(name="dapo"), "stages[1].name", "unique"),
    (lambda s: s["stages"][1].update(base={"init_from": {"run": "x/0123456789ab"}}), "stages[1].init_from",
     "through `from:`"),
    (lambda s: s.update(grid={"alpha": [0.9]}), "grid", "each stage has its own"),
    (lambda s: s["stages"][1].update(include=[{"alhpa": 0.9}]), "stages[1].include.alhpa", "unknown config key"),
    (lambda s: s.update(stages=[]), "stages", "non-empty list"),
])
def test_stage_errors_name_the_key_and_the_file(change, key, said, tmp_path):
    raw = _two_stage()
    change(raw)
    with pytest.raises(ArmorLabError) as exc:
        parse_spec(raw, path=tmp_path / "proto.yaml")
    assert exc.value.key == key and said in str(exc.value)
    assert str(tmp_path / "proto.yaml") in str(exc.value)


# --------------------------------------------------------------------------- expansion
def test_a_later_stage_continues_from_the_run_of_its_seed_and_its_id_follows_the_parent():
    spec = parse_spec(_two_stage())
    plans = expand(spec)
    first = [p for p in plans if p.stage == "dapo"]
    later = [p for p in plans if p.stage == "continue"]
    assert [p.config["seed"] for p in first] == [0, 1] and len(later) == 4
    # before dedup: stage 1, 1 point × 2 seeds; stage 2, the base point (= dapo) + 2 includes × 2 seeds
    assert count_points(spec) == 2 + 3 * 2
    by_seed = {p.config["seed"]: p.run_id for p in first}
    for p in later:
        parent = by_seed[p.config["seed"]]
        assert p.parent == parent
        assert p.config["init_from"] == {"run": f"proto/{parent}", "select": {"metric": "val/acc", "mode": "max"}}
        assert p.run_id == run_id(p.config) == run_id(resolve(p.config))
    # a stage-1 change moves the continuing runs too (their parent is another run)
    raw = _two_stage()
    raw["stages"][0]["base"]["learning_rate"] = 1e-5
    assert {p.run_id for p in expand(parse_spec(raw))}.isdisjoint(p.run_id for p in later)


def test_seed_mappings_one_shared_parent_or_a_table():
    raw = _two_stage()
    raw["stages"][0]["seeds"] = [7]
    raw["stages"][1]["from"]["seeds"] = 7  # one stage 1 shared by every seed of stage 2
    plans = expand(parse_spec(raw))
    parent = next(p.run_id for p in plans if p.stage == "dapo")
    assert {p.parent for p in plans if p.stage == "continue"} == {parent}
    assert sorted(p.config["seed"] for p in plans if p.stage == "continue") == [0, 0, 1, 1]
    raw["stages"][1]["from"]["seeds"] = {0: 7}  # seed 1 has no parent
    with pytest.raises(ArmorLabError, match=r"maps no parent seed to seed 1 \(that stage's seeds: \[7\]\)") as exc:
        expand(parse_spec(raw))
    assert exc.value.key == "stages[1].from.seeds"


def test_a_grid_of_parents_gives_each_continuing_point_one_run_per_parent():
    raw = _two_stage()
    raw["stages"][0]["grid"] = {"learning_rate": [1e-5, 2e-5]}
    plans = expand(parse_spec(raw))
    later = [p for p in plans if p.stage == "continue"]
    assert len(later) == 8
    # before dedup: 2 × 2 parents; 3 points × 2 seeds × 2 parents of each seed
    assert count_points(parse_spec(raw)) == 4 + 3 * 2 * 2
    assert len({(p.config["seed"], p.parent) for p in later}) == 4


def test_unstaged_specs_keep_their_run_ids():
    raw = {"name": "t", "base": {"objective": "armor", "max_steps": 4}, "grid": {"alpha": [0.9, 0.8]}, "seeds": [0, 1]}
    got = [p.run_id for p in expand(parse_spec(raw))]
    want = [run_id(resolve({**raw["base"], "alpha": a, "seed": s})) for a in (0.9, 0.8) for s in (0, 1)]
    assert got == want and all(p.stage is None and p.parent is None for p in expand(parse_spec(raw)))


# --------------------------------------------------------------------------- controls
def _controls(**arms) -> dict:
    raw = _two_stage()
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up"}, {"objective": "up", "dynamic_sampling": True}]
    raw["stages"][1]["controls"] = {"baseline": {"objective": "dapo"},
                                    "arms": [{"name": "UP", "select": {"objective": "up"}, "factor": ["objective"],
                                              **arms}]}
    return raw


def test_a_control_arm_that_differs_in_more_than_its_factor_is_refused():
    raw = _controls()
    # up without dynamic sampling (dapo's preset turns it on) differs in two things
    with pytest.raises(ArmorLabError, match=r"also differs in dynamic_sampling \(true -> false\)") as exc:
        control_pairs(parse_spec(raw), expand(parse_spec(raw)))
    assert exc.value.key == "stages[1].controls.arms[0]"
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up", "dynamic_sampling": True}]
    [(stage, pairs)] = control_pairs(parse_spec(raw), expand(parse_spec(raw)))
    assert stage == "continue" and [p.counted for p in pairs] == [["objective"]]
    assert pairs[0].differs["objective"] == ("dapo", "up")


def test_inert_consequences_are_shown_not_counted_and_a_factor_must_differ():
    raw = _two_stage()
    raw["stages"][1]["include"] = [{"objective": "dapo", "beta": 0.0}, {"objective": "dapo", "beta": 0.01}]
    raw["stages"][1]["controls"] = {"baseline": {"beta": 0.0}, "arms": [{"select": {"beta": 0.01}, "factor": "beta"}]}
    [(_, [pair])] = control_pairs(parse_spec(raw), expand(parse_spec(raw)))
    assert pair.counted == ["beta"] and pair.follows == ["kl_estimator"]  # k3 at β > 0, null (inert) at 0
    raw["stages"][1]["controls"]["arms"][0]["factor"] = ["beta", "epsilon"]
    with pytest.raises(ArmorLabError, match="does not differ in epsilon"):
        control_pairs(parse_spec(raw), expand(parse_spec(raw)))
    raw["stages"][1]["controls"]["arms"][0]["select"] = {"beta": 0.5}
    with pytest.raises(ArmorLabError, match="selects no arm"):
        control_pairs(parse_spec(raw), expand(parse_spec(raw)))


def test_every_arm_of_a_controlled_stage_must_be_named():
    raw = _controls()
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up", "dynamic_sampling": True},
                                   {"objective": "grpo"}]
    with pytest.raises(ArmorLabError, match="arms that no control group names"):
        control_pairs(parse_spec(raw), expand(parse_spec(raw)))


# --------------------------------------------------------------------------- classify and status
def _sweep_dir(tmp_path, raw):
    spec_path = write_spec(tmp_path / "proto.yaml", raw)
    plan = plan_sweep(spec_path, root=tmp_path / "runs")
    sweep_dir = tmp_path / "runs" / "proto"
    sweep_dir.mkdir(parents=True)
    return plan, sweep_dir


def test_children_of_a_failed_parent_are_blocked_and_status_says_why(tmp_path):
    plan, sweep_dir = _sweep_dir(tmp_path, _two_stage())
    first = [r for r in plan.runs if r.stage == "dapo"]
    bad = RunDir.create(sweep_dir, first[1].config)
    bad.write_status("failed", reason="non-finite loss at step 2")
    manifest = Manifest(sweep_dir=sweep_dir, name="proto", runs=[r.run_id for r in plan.runs],
                        parents={r.run_id: r.parent for r in plan.runs if r.parent})
    manifest.save()
    actions = classify(sweep_dir, plan.runs, retry_failed=False, executor="local")
    for r in plan.runs:
        if r.parent == bad.id:
            assert actions[r.run_id] == BLOCKED
        elif r.run_id != bad.id:
            assert actions[r.run_id] == SUBMIT
    retried = classify(sweep_dir, plan.runs, retry_failed=True, executor="local")
    assert all(a == SUBMIT for a in retried.values())
    # on Slurm nobody marks the children (their jobs were cancelled): status derives it
    rows = {r.run_id: r for r in collect(sweep_dir).rows}
    for r in plan.runs:
        if r.parent == bad.id:
            assert rows[r.run_id].state == "failed"
            assert rows[r.run_id].reason == parent_failed_reason(bad.id, "non-finite loss at step 2")
            assert "not started: the run it continues from" in rows[r.run_id].reason


def test_a_parent_running_outside_slurm_makes_its_children_wait(tmp_path, monkeypatch):
    import armorlab.sweeps.submit as submit

    plan, sweep_dir = _sweep_dir(tmp_path, _two_stage())
    parent = plan.runs[0]
    Manifest(sweep_dir=sweep_dir, name="proto", jobs={parent.run_id: ["local:host:1:0"]}).save()
    monkeypatch.setattr(submit, "_active_jobs", lambda ids, executor: {"local:host:1:0"})
    actions = classify(sweep_dir, plan.runs, retry_failed=False, executor="slurm")
    assert actions[parent.run_id] == ACTIVE
    assert [actions[r.run_id] for r in plan.runs if r.parent == parent.run_id] == [WAIT, WAIT]


# --------------------------------------------------------------------------- end to end, locally
def test_local_stages_start_after_their_parent_and_a_failed_parent_fails_its_children(tmp_path, standin):
    broken = fake_model_dir(tmp_path / "broken-model")  # well-formed on disk; the stand-in cannot load it
    raw = _two_stage()
    raw["seeds"] = [0]
    raw["stages"][0]["include"] = [{"model": str(broken)}]  # stage 1: the base point and a broken one
    raw["stages"][1]["include"] = [{"objective": "up"}]  # stage 2: the base point (dapo) and up, per parent
    spec = write_spec(tmp_path / "proto.yaml", raw)
    root = tmp_path / "runs"
    dry = run_cli("sweep", str(spec), "--root", str(root), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would train 6 run(s)" in dry.stdout
    assert "4 of them once the run they continue from has completed" in dry.stdout
    out = run_cli("sweep", str(spec), "--root", str(root), "--workers", "2")
    assert out.returncode == 1, out.stdout + out.stderr  # the broken parent failed
    sweep_dir = root / "proto"
    manifest = load_manifest(sweep_dir)
    rows = {r.run_id: r for r in collect(sweep_dir).rows}
    good, bad = [rid for rid in manifest.runs if manifest.stages[rid] == "dapo"]
    assert rows[bad].state == "failed" and rows[good].state == "completed"
    for child, parent in manifest.parents.items():
        rd = RunDir(sweep_dir / child)
        if parent == good:
            seen = json.loads((rd.path / "standin_parent.json").read_text())
            assert seen["state"] == "completed"  # it started once its parent had completed
            assert rows[child].state == "completed"
        else:
            assert not (rd.path / "standin_parent.json").exists()  # never started
            assert rows[child].state == "failed" and rd.read_status()["state"] == "failed"
            assert rows[child].reason.startswith(f"not started: the run it continues from ({bad}) failed: ")
            assert str(broken) in rows[child].reason
    status = run_cli("status", str(sweep_dir), env={"COLUMNS": "300"})
    assert "not started: the run it continues from" in status.stdout
    again = run_cli("sweep", str(spec), "--root", str(root), env={"COLUMNS": "300"})
    assert again.returncode == 0 and "nothing to run" in again.stderr and "3 failed" in again.stderr
    # --retry failed retries the parent and its children; the parent fails again, so do they
    retry = run_cli("sweep", str(spec), "--root", str(root), "--retry", "failed", env={"COLUMNS": "300"})
    assert retry.returncode == 1 and "3 to run" in retry.stderr
    assert collect(sweep_dir).counts == {"completed": 3, "failed": 3}


def test_dry_run_prints_stages_parents_and_control_pairs(tmp_path, standin):
    raw = _controls()
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up", "dynamic_sampling": True}]
    spec = write_spec(tmp_path / "proto.yaml", raw)
    out = run_cli("sweep", str(spec), "--root", str(tmp_path / "runs"), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "controls of stage continue" in out.stdout
    assert "UP [factor: objective]: objective dapo -> up" in out.stdout
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line[:12].isalnum() and "  " in line}
    for p in expand(parse_spec(raw)):
        line = lines[p.run_id]
        assert f" {p.stage}: " in line and f"seed={p.config['seed']}" in line
        assert line.endswith(f" <- {p.parent}") if p.parent else "<-" not in line
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up"}]
    bad = run_cli("sweep", str(write_spec(tmp_path / "proto.yaml", raw)), "--dry-run",
                  "--root", str(tmp_path / "runs"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "stages[1].controls.arms[0]" in bad.stderr and "dynamic_sampling" in bad.stderr
    assert not (tmp_path / "runs").exists() or not list(Path(tmp_path / "runs").rglob("config.yaml"))


def test_a_parent_queued_on_slurm_gives_its_children_a_dependency_on_its_job(tmp_path, monkeypatch):
    import armorlab.sweeps.submit as submit

    plan, sweep_dir = _sweep_dir(tmp_path, _two_stage())
    first, second = [r for r in plan.runs if r.stage == "dapo"]
    Manifest(sweep_dir=sweep_dir, name="proto", jobs={first.run_id: ["812_0"], second.run_id: ["812_1"]}).save()
    monkeypatch.setattr(submit, "_active_jobs", lambda ids, executor: {"812_0"})  # 812_1 has ended
    plan.actions = classify(sweep_dir, plan.runs, retry_failed=False, executor="slurm")
    assert plan.actions[first.run_id] == ACTIVE and plan.actions[second.run_id] == SUBMIT
    todo = [(str(sweep_dir / r.run_id), None) for r in plan.to_submit]
    groups = dict(submit.dependency_groups(plan, todo))
    # children of the queued parent wait for its job; the resubmitted parent's children for its new one
    assert [len(groups[None]), len(groups[first.run_id]), len(groups[second.run_id])] == [1, 2, 2]
    assert groups[None][0][0].endswith(second.run_id)


@pytest.mark.parametrize("sbatch", [{}, {"constraint": "a100", "dependency": "singleton"}])
def test_the_dependency_reaches_the_script_both_renderings_write(tmp_path, sbatch):
    pytest.importorskip("submitit")
    from armorlab.sweeps.executors import SlurmSubmitter
    from armorlab.sweeps.profile import parse_profile
    from armorlab.sweeps.sbatch import check_script

    sub = SlurmSubmitter(tmp_path / "sweep", parse_profile({"sbatch": sbatch}), job_name="proto")
    sub.dependency = "812_3"
    for n in (1, 4):
        ours = sub._rendered(n)
        assert "#SBATCH --dependency=afterok:812_3\n" in ours and "#SBATCH --kill-on-invalid-dep=yes\n" in ours
        assert ours == sub._submitit_text(sub._executor(dry_run=True), n)  # what submitit queues too
        check_script(ours)
    sub.dependency = None
    assert "--dependency=afterok" not in sub._rendered(4)


def test_status_and_dry_run_of_a_staged_sweep_with_controls_start_light(tmp_path, standin):
    import subprocess
    import sys

    from test_sweep_local import IMPORT_CHECK

    raw = _controls()
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up", "dynamic_sampling": True}]
    spec = write_spec(tmp_path / "proto.yaml", raw)
    root = tmp_path / "runs"
    assert run_cli("sweep", str(spec), "--root", str(root)).returncode == 0
    for args in (["status", str(root / "proto")], ["sweep", str(spec), "--root", str(root), "--dry-run", "-e", "slurm"]):
        out = subprocess.run([sys.executable, "-c", IMPORT_CHECK.format(args=args)], capture_output=True, text=True,
                             check=True)
        assert out.stdout.rsplit("MODULES:", 1)[1].strip() == "", (args, out.stdout[-300:])


def test_the_sweep_dirs_spec_copy_expands_to_the_same_runs():
    raw = _controls()
    raw["stages"][1]["include"] = [{"objective": "dapo"}, {"objective": "up", "dynamic_sampling": True}]
    raw["stages"][1]["from"]["seeds"] = {0: 1, 1: 1}
    spec = parse_spec(raw)
    again = parse_spec(yaml.safe_load(yaml.safe_dump(spec.to_dict())))
    assert [(p.run_id, p.stage, p.parent) for p in expand(again)] == [(p.run_id, p.stage, p.parent) for p in expand(spec)]
    assert [(c.baseline, c.arms) for c in again.stages[1].controls] == [(c.baseline, c.arms) for c in spec.stages[1].controls]
