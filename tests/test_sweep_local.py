"""The sweep layer on this machine (local executor), driven by the stand-in trainer
(tests/sweep_standin.py), which follows the trainer's process contract without torch."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading

import pytest
from model_dirs import fake_model_dir
from sweep_support import run_cli, standin_command, standin_metric, wait_for, write_spec

from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.sweeps.jobs import ENV_COMMAND, TrainJob
from armorlab.sweeps.manifest import load_manifest
from armorlab.sweeps.status import collect
from armorlab.sweeps.submit import ACTIVE, DONE, FAILED, SUBMIT, plan_sweep


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.01")


def _spec(tmp_path, name="s", **extra):
    spec = {"name": name, "base": {"max_steps": 4, "val_every": 2, "save_steps": 2},
            "grid": {"objective": ["dapo", "up"]}, "seeds": [0, 1], **extra}
    return write_spec(tmp_path / f"{name}.yaml", spec)


def test_local_sweep_runs_reruns_nothing_and_retries_failed(tmp_path, standin):
    broken = tmp_path / "broken-model"  # a directory the trainer cannot load: the run fails
    fake_model_dir(broken, model_type="no_such_architecture")
    spec = _spec(tmp_path, include=[{"objective": "dapo", "model": str(broken)}])
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root), "--workers", "2")
    assert out.returncode == 1, out.stderr  # one run failed
    sweep_dir = root / "s"
    st = collect(sweep_dir)
    assert len(st.rows) == 6 and st.counts == {"completed": 4, "failed": 2}
    for row in st.rows:
        cfg = RunDir(sweep_dir / row.run_id).read_config()
        if row.state == "completed":
            assert (row.last_step, row.max_steps) == (4, 4)
            assert row.val_acc == standin_metric(cfg["seed"], 4, 1)
            steps = [r["step"] for r in RunDir(sweep_dir / row.run_id).iter_metrics()]
            assert steps == [0, 1, 2, 3, 4]  # every line once
        else:
            assert row.reason == f"cannot load model '{broken}'"
    jobs_before = load_manifest(sweep_dir).jobs
    assert all(len(v) == 1 for v in jobs_before.values())

    watch = run_cli("status", str(sweep_dir), "--watch", "--interval", "0.2", timeout=30)
    assert watch.returncode == 0 and "6/6" in watch.stdout  # all finished: the watch ends at once
    again = run_cli("sweep", str(spec), "--root", str(root))
    assert again.returncode == 0 and "nothing to run" in again.stderr
    assert "2 failed (use --retry failed)" in again.stderr
    assert load_manifest(sweep_dir).jobs == jobs_before

    retry = run_cli("sweep", str(spec), "--root", str(root), "--retry", "failed")
    assert retry.returncode == 1
    manifest = load_manifest(sweep_dir)
    failed = [r.run_id for r in st.rows if r.state == "failed"]
    assert [len(manifest.jobs[r]) for r in failed] == [2, 2]
    assert all(len(manifest.jobs[r.run_id]) == 1 for r in st.rows if r.state == "completed")
    assert [RunDir(sweep_dir / r).read_status()["attempt"] for r in failed] == [2, 2]


def test_dry_run_lists_runs_and_writes_nothing(tmp_path, standin):
    spec = _spec(tmp_path)
    out = run_cli("sweep", str(spec), "--root", str(tmp_path / "runs"), "--dry-run")
    assert out.returncode == 0, out.stderr
    plan = plan_sweep(spec, root=tmp_path / "runs")
    for r in plan.runs:
        assert r.run_id in out.stdout
    assert "would train 4 run(s)" in out.stdout
    assert not (tmp_path / "runs").exists()


def test_search_spec_is_sent_to_tune(tmp_path):
    spec = write_spec(tmp_path / "t.yaml", {"name": "t", "search": {"space": {}}})
    out = run_cli("sweep", str(spec), "--dry-run")
    assert out.returncode == 2 and "armorlab tune" in out.stderr and "Traceback" not in out.stderr


def test_values_never_reach_a_shell(tmp_path, standin):
    marks = [tmp_path / f"pwned{i}" for i in range(4)]
    evil = [f"$(touch {marks[0]})", f"`touch {marks[1]}`", f"'; touch {marks[2]}; echo '",
            f"x\"\ntouch {marks[3]}\n"]
    # a free-text GRPOConfig field (model names and paths are checked when the sweep is planned)
    spec = write_spec(tmp_path / "evil.yaml", {"name": "evil", "base": {"max_steps": 2},
                                               "grid": {"hub_model_id": evil}})
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root))
    assert out.returncode == 0, out.stderr
    st = collect(root / "evil")
    assert [r.state for r in st.rows] == ["completed"] * 4
    assert {RunDir(root / "evil" / r.run_id).read_config()["hub_model_id"] for r in st.rows} == set(evil)
    bad_model = write_spec(tmp_path / "evil2.yaml", {"name": "evil2", "grid": {"model": evil}})
    out = run_cli("sweep", str(bad_model), "--root", str(root))
    assert out.returncode == 2 and "'model'" in out.stderr and "Traceback" not in out.stderr
    assert not (root / "evil2").exists()
    dry = run_cli("sweep", str(spec), "--root", str(tmp_path / "dry"), "--executor", "slurm", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    script = dry.stdout.split("# sbatch script of the first array:", 1)[1]
    assert "touch" not in script and "pwned" not in script
    assert not any(m.exists() for m in marks)


def test_interrupted_local_sweep_checkpoints_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    spec = write_spec(tmp_path / "slow.yaml", {"name": "slow", "base": {"max_steps": 30, "val_every": 5,
                                                                          "save_steps": 100},
                                               "grid": {"seed": [3, 4]}})
    root = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "armorlab.cli", "sweep", str(spec), "--root", str(root)],
                            env={**os.environ, "ARMORLAB_STANDIN_STEP_S": "0.1", "ARMORLAB_STANDIN_HOLD_AT": "3"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        plan = plan_sweep(spec, root=root)
        first = RunDir(root / "slow" / plan.runs[0].run_id)
        wait_for(lambda: (first.last_step() or 0) >= 3, 60, "the first run to reach step 3")
        # a second `armorlab sweep` sees the live local job and submits nothing for it
        assert plan_sweep(spec, root=root).actions[first.id] == ACTIVE
        cancel = run_cli("cancel", str(root / "slow"))
        assert cancel.returncode == 0 and f"local pid {proc.pid}" in cancel.stdout
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    status = first.read_status()
    assert status["state"] == "pending" and status["reason"].startswith("preempted at step")
    assert status["reason"] == "preempted at step 3"  # parked there until the cancel reached it
    assert first.last_checkpoint().name == "checkpoint-3"
    second = RunDir(root / "slow" / plan.runs[1].run_id)
    assert second.read_status()["attempt"] == 0  # never started: the pool stopped before it

    out = run_cli("sweep", str(spec), "--root", str(root), env={"ARMORLAB_STANDIN_STEP_S": "0.005"})
    assert out.returncode == 0, out.stderr
    for rd, seed, attempts in ((first, 3, 2), (second, 4, 1)):
        assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == attempts
        rows = rd.read_metrics()
        assert [r["step"] for r in rows] == list(range(31))  # no step lost, none twice
        assert [r["train/reward"] for r in rows[1:]] == [standin_metric(seed, s, 0) for s in range(1, 31)]
        assert [r["val/acc"] for r in rows if "val/acc" in r] == [standin_metric(seed, s, 1)
                                                                 for s in range(0, 31, 5)]


def test_trainjob_pickles_only_the_run_dir_and_forwards_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.05")
    plan = plan_sweep(write_spec(tmp_path / "c.yaml", {"name": "c", "base": {"max_steps": 40}}),
                      root=tmp_path / "runs")
    rd = RunDir.create(tmp_path / "runs" / "c", plan.runs[0].config)
    job = TrainJob(rd.path)
    assert pickle.loads(pickle.dumps(job)).__getstate__() == {
        "run_dir": str(rd.path.absolute()), "launcher": "python", "accelerate_config": None}
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("o", job.run()))
    worker.start()
    wait_for(lambda: (rd.last_step() or 0) >= 2, 30, "training to start")
    delayed = job.checkpoint()  # what submitit calls on the requeue signal
    worker.join(10)
    assert outcome["o"].returncode == 75 and outcome["o"].state == "pending"
    assert isinstance(delayed.function, TrainJob) and delayed.function.run_dir == job.run_dir
    assert delayed.args == () and delayed.kwargs == {}
    # a completed run is not requeued, and a job for it does nothing
    rd.write_status("completed")
    assert job.checkpoint() is None
    assert TrainJob(rd.path).run().reason is None


def test_a_trainer_killed_without_a_word_is_marked_failed(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, json.dumps([sys.executable, "-c",
                                                "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]))
    plan = plan_sweep(write_spec(tmp_path / "k.yaml", {"name": "k"}), root=tmp_path / "runs")
    rd = RunDir.create(tmp_path / "runs" / "k", plan.runs[0].config)
    rd.write_status("running")
    outcome = TrainJob(rd.path).run()
    assert outcome.returncode == -signal.SIGKILL
    assert rd.read_status()["state"] == "failed"
    assert rd.read_status()["reason"] == "training process ended with signal SIGKILL"


def test_a_stop_signal_during_trainer_start_up_is_a_preemption(tmp_path, monkeypatch):
    """Issue 13 §5: Ctrl-C / cancel lands before the trainer installed its handler (it dies of the
    SIGTERM we sent): the run is pending (resumable), not failed."""
    slow_start = ("import pathlib, sys, time; pathlib.Path(sys.argv[-1], 'started').write_text('1'); "
                  "time.sleep(120)")
    monkeypatch.setenv(ENV_COMMAND, json.dumps([sys.executable, "-c", slow_start]))
    plan = plan_sweep(write_spec(tmp_path / "e.yaml", {"name": "e"}), root=tmp_path / "runs")
    rd = RunDir.create(tmp_path / "runs" / "e", plan.runs[0].config)
    job, result = TrainJob(rd.path), {}
    t = threading.Thread(target=lambda: result.update(outcome=job.run()))
    t.start()
    wait_for(lambda: (rd.path / "started").exists(), 60, "the trainer to start")
    assert job.interrupt(signal.SIGTERM)
    t.join(60)
    assert result["outcome"].returncode == 75 and result["outcome"].state == "pending"
    assert rd.read_status()["state"] == "pending" and "preempted" in rd.read_status()["reason"]


def test_lost_runs_are_shown_and_resubmitted(tmp_path, standin):
    spec = _spec(tmp_path, grid={"objective": ["dapo"]}, seeds=[0])
    root = tmp_path / "runs"
    assert run_cli("sweep", str(spec), "--root", str(root)).returncode == 0
    sweep_dir = root / "s"
    rid = collect(sweep_dir).rows[0].run_id
    rd = RunDir(sweep_dir / rid)
    rd.write_status("running")  # as if the machine died mid-run (attempt 2): its job is gone
    assert collect(sweep_dir).rows[0].state == "lost"
    assert plan_sweep(spec, root=root).actions[rid] == SUBMIT
    assert run_cli("sweep", str(spec), "--root", str(root)).returncode == 0
    assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == 3
    assert plan_sweep(spec, root=root).actions[rid] == DONE


def test_status_and_cancel_errors(tmp_path):
    out = run_cli("status", str(tmp_path / "nope"))
    assert out.returncode == 2 and "not a sweep or run directory" in out.stderr
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArmorLabError):
        collect(tmp_path / "empty")
    out = run_cli("cancel", str(tmp_path / "empty"))
    assert out.returncode == 2 and "nothing was submitted" in out.stderr
    assert FAILED == "failed"


IMPORT_CHECK = """
import sys
from armorlab.cli import app
try:
    app({args!r}, standalone_mode=False)
except SystemExit:
    pass
print("MODULES:" + ",".join(m for m in ("torch", "trl", "transformers", "pandas", "optuna", "matplotlib", "submitit",
                                     "armorlab.vllm.servers") if m in sys.modules))
"""


def test_status_and_dry_run_start_light(tmp_path, standin):
    spec = _spec(tmp_path)
    root = tmp_path / "runs"
    assert run_cli("sweep", str(spec), "--root", str(root)).returncode == 0
    for args, allowed in ((["status", str(root / "s")], set()),
                          (["sweep", str(spec), "--root", str(root), "--dry-run", "-e", "slurm"], set())):
        out = subprocess.run([sys.executable, "-c", IMPORT_CHECK.format(args=args)], capture_output=True,
                             text=True, check=True)
        loaded = set(filter(None, out.stdout.rsplit("MODULES:", 1)[1].strip().split(",")))
        assert loaded <= allowed, (args, loaded)


def test_local_workers_share_the_cores_unless_the_user_set_threads(monkeypatch, tmp_path):
    import os

    from armorlab.sweeps.executors import LocalExecutor
    from armorlab.sweeps.profile import load_profile

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an idle machine (a loaded one: T1)
    profile = load_profile(None)
    assert LocalExecutor(tmp_path, profile, workers=2).thread_env() == {"OMP_NUM_THREADS": "4"}
    assert LocalExecutor(tmp_path, profile, workers=16).thread_env() == {"OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert LocalExecutor(tmp_path, profile, workers=2).thread_env() == {}
