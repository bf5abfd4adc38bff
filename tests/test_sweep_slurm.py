"""The sweep layer against a real one-node Slurm cluster (slurm/local/start.sh).

Skipped when no cluster is reachable; with ARMORLAB_REQUIRE_SLURM=1 (.ci/run) that fails instead.
The acceptance tests run real `armorlab train` jobs on a tiny model; the others use the stand-in
trainer (tests/sweep_standin.py) to test the layer itself: arrays, chunking, safety, cancel.
"""

from __future__ import annotations

import math
import os

import pytest
from model_dirs import fake_model_dir
from sweep_support import (
    preempt_after_first_step,
    run_cli,
    slurm_cluster,  # noqa: F401 - a fixture
    standin_command,
    standin_metric,
    wait_finished,
    wait_for,
    write_spec,
)

from armorlab.core.runs import RunDir, run_id
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.manifest import load_manifest
from armorlab.sweeps.status import collect
from armorlab.sweeps.submit import ACTIVE, plan_sweep

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# Small enough to train in seconds on a CPU, big enough to exercise the trainer's whole loop.
TINY = {"max_steps": 4, "val_every": 2, "save_steps": 2, "val_samples": 2, "kl_probe_prompts": 0,
        "per_device_train_batch_size": 8, "num_generations": 4,
        "task": {"name": "arithmetic", "digits": 1, "train_size": 32, "val_size": 8, "test_size": 8},
        "model": {"name": "tiny", "hidden_size": 64, "num_layers": 1, "num_heads": 2, "warm_start_steps": 30}}


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text("executor: slurm\ncpus_per_task: 1\ntime_min: 20\narray_parallelism: 2\n")
    return path


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())  # sbatch passes the environment to the jobs
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.01")


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("armorlab-cache"))


def _sweep(*args, **env):
    out = run_cli("sweep", *args, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def _submitted_arrays(sweep_dir):
    return [s["slurm_job_ids"] for s in load_manifest(sweep_dir).submissions]


# --------------------------------------------------------------------------- the layer (stand-in)
def test_arrays_are_chunked_and_a_rerun_submits_nothing(tmp_path, profile, standin, monkeypatch):
    profile.write_text(profile.read_text() + "max_array_size: 2\n")
    spec = write_spec(tmp_path / "chunks.yaml", {"name": "chunks", "base": {"max_steps": 3, "val_every": 1},
                                                 "grid": {"seed": [0, 1, 2, 3, 4]}})
    root = tmp_path / "runs"
    _sweep(str(spec), "--root", str(root), "--profile", str(profile))
    sweep_dir = root / "chunks"
    arrays = _submitted_arrays(sweep_dir)
    assert len(arrays) == 3 and len({a[0] for a in arrays}) == 3  # 5 runs, arrays of ≤ 2: three sbatch calls
    jobs = load_manifest(sweep_dir).jobs
    assert sorted(len(v) for v in jobs.values()) == [1] * 5
    # while they are queued or running, the same sweep submits nothing
    plan = plan_sweep(spec, root=root, profile=profile)
    assert set(plan.actions.values()) <= {ACTIVE, "completed"}
    again = _sweep(str(spec), "--root", str(root), "--profile", str(profile))
    assert "nothing to submit" in again.stdout
    st = wait_finished(sweep_dir, 120)
    assert [r.state for r in st.rows] == ["completed"] * 5
    # accounting may lag the controller by a moment
    wait_for(lambda: {r.slurm_state for r in collect(sweep_dir).rows} == {"COMPLETED"}, 30, "sacct")
    for r in st.rows:
        seed = RunDir(sweep_dir / r.run_id).read_config()["seed"]
        assert r.val_acc == standin_metric(seed, 3, 1) and r.last_step == 3
    again = _sweep(str(spec), "--root", str(root), "--profile", str(profile))
    assert "nothing to submit" in again.stdout and len(_submitted_arrays(sweep_dir)) == 3

    # without accounting (no sacct), status falls back to squeue + status.json
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\n"
                                "exit 1\n")
    (fake / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    st = collect(sweep_dir)
    assert [r.state for r in st.rows] == ["completed"] * 5 and st.warning is None
    assert {r.slurm_state for r in st.rows} == {"ENDED"}


def test_an_array_is_one_pickle_file_whatever_its_size(tmp_path, profile, standin):
    from armorlab.sweeps import slurmctl

    profile.write_text(profile.read_text() + "sbatch: {hold: true}\n")  # held: no task writes its files
    spec = write_spec(tmp_path / "many.yaml", {"name": "many", "base": {"max_steps": 1}, "seeds": list(range(50))})
    _sweep(str(spec), "--root", str(tmp_path / "runs"), "--profile", str(profile))
    sweep_dir = tmp_path / "runs" / "many"
    ((array,),) = [{j.split("_")[0] for j in s["slurm_job_ids"]} for s in load_manifest(sweep_dir).submissions]
    try:
        files = sorted(p.name for p in (sweep_dir / ".submitit").iterdir())
        # the tasks' pickles, the sbatch script, and submitit's link to it under its first name
        assert files[1:] == [f"{array}_array.pkl", f"{array}_submission.sh"]
        assert files[0].startswith(".submission_file_")
    finally:
        slurmctl.scancel([array])


def test_values_never_reach_a_shell_on_slurm(tmp_path, profile, standin):
    marks = [tmp_path / f"pwned{i}" for i in range(3)]
    evil = [f"$(touch {marks[0]})", f"`touch {marks[1]}`", f"'\"; touch {marks[2]}\n"]
    # a free-text GRPOConfig field (model names and paths are checked when the sweep is planned)
    spec = write_spec(tmp_path / "evil.yaml", {"name": "evil", "base": {"max_steps": 2},
                                               "grid": {"hub_model_id": evil}})
    root = tmp_path / "runs"
    out = _sweep(str(spec), "--root", str(root), "--profile", str(profile), "--wait")
    assert "finished" in out.stdout  # --wait stayed with a progress view until the jobs ended
    st = wait_finished(root / "evil", 120)
    assert [r.state for r in st.rows] == ["completed"] * 3
    assert {RunDir(root / "evil" / r.run_id).read_config()["hub_model_id"] for r in st.rows} == set(evil)
    for script in (root / "evil" / ".submitit").glob("*submission*.sh"):
        assert "touch" not in script.read_text()
    assert not any(m.exists() for m in marks)


CRASHING_SWEEP = """
import os, sys
from armorlab.sweeps import manifest as M
from armorlab.sweeps.jobs import TrainJob
where, args = sys.argv[1], sys.argv[2:]
if where == "pickles":  # the array's jobs are being pickled (before sbatch): die at the 3rd
    real, made = TrainJob.__getstate__, []
    def getstate(self):
        made.append(self)
        if len(made) == 3:
            os._exit(9)
        return real(self)
    TrainJob.__getstate__ = getstate
else:  # sbatch has queued the array and its file is published: die before the record
    M.Manifest.record = lambda self, *a, **kw: os._exit(9)
sys.argv = ["armorlab", "sweep", *args]
from armorlab.cli import main
main()
"""


def test_a_crash_mid_submit_is_completed_by_the_next_sweep_without_duplicates(tmp_path, profile, standin):
    import subprocess
    import sys

    spec = write_spec(tmp_path / "crash.yaml", {"name": "crash", "base": {"max_steps": 3, "val_every": 1},
                                                "grid": {"seed": [0, 1, 2, 3]}})
    root = tmp_path / "runs"
    args = [str(spec), "--root", str(root), "--profile", str(profile)]
    sweep_dir = root / "crash"

    def crash(where):
        out = subprocess.run([sys.executable, "-c", CRASHING_SWEEP, where, *args], capture_output=True, text=True)
        assert out.returncode == 9, out.stdout + out.stderr

    crash("pickles")           # killed while the jobs were pickled: nothing queued
    manifest = load_manifest(sweep_dir)
    assert len(manifest.runs) == 4 and manifest.jobs == {}
    assert sorted(manifest.pending) == sorted(manifest.runs)  # saved before sbatch, never recorded
    assert not [p for p in (sweep_dir / ".submitit").glob("*") if p.suffix in (".pkl", ".sh")]
    assert not any((sweep_dir / rid).exists() for rid in manifest.runs)  # fresh runs' dirs: the jobs write them
    crash("record")            # killed after sbatch, before the job ids reached the manifest
    manifest = load_manifest(sweep_dir)
    assert manifest.jobs == {} and sorted(manifest.pending) == sorted(manifest.runs)
    (array_file,) = (sweep_dir / ".submitit").glob("*_array.pkl")  # one file for the array's 4 tasks
    array = array_file.name.split("_")[0]
    again = _sweep(*args)      # finds the queued array instead of queueing a second one
    assert "nothing to submit" in again.stdout
    manifest = load_manifest(sweep_dir)
    assert manifest.pending == [] and sorted(len(v) for v in manifest.jobs.values()) == [1] * 4
    assert {j.split("_")[0] for v in manifest.jobs.values() for j in v} == {array}
    assert [s.get("recovered") for s in manifest.submissions] == [True]
    st = wait_finished(sweep_dir, 120)
    assert [(r.state, r.attempts) for r in st.rows] == [("completed", 1)] * 4
    # each job wrote its run dir from the config it carried: the dir's name is that config's hash
    assert sorted(RunDir(sweep_dir / rid).read_config()["seed"] for rid in manifest.runs) == [0, 1, 2, 3]
    assert all(run_id(RunDir(sweep_dir / rid).read_config()) == rid for rid in manifest.runs)
    assert "nothing to submit" in _sweep(*args).stdout


def test_dry_run_shows_the_script_the_submission_queues(tmp_path, profile, standin):
    spec = write_spec(tmp_path / "d.yaml", {"name": "d", "base": {"max_steps": 2}, "grid": {"seed": [0, 1, 2]},
                                            "include": [{"hub_model_id": "$(touch x)'\""}]})
    args = [str(spec), "--root", str(tmp_path / "runs"), "--profile", str(profile)]
    shown = _sweep(*args, "--dry-run").stdout.split("# sbatch script of the first array:\n", 1)[1]
    _sweep(*args)
    sweep_dir = tmp_path / "runs" / "d"
    (array,) = {j.split("_")[0] for ids in load_manifest(sweep_dir).jobs.values() for j in ids}
    submitted = (sweep_dir / ".submitit" / f"{array}_submission.sh").read_text()
    script, _, launch = shown.partition("\neach run is trained by: ")
    assert script.rstrip("\n") == submitted.rstrip("\n")  # the script as queued, then the launch line
    assert launch.endswith("--run-dir '<run dir>'\n")
    assert wait_finished(sweep_dir, 120).counts == {"completed": 4}


def test_preempted_job_requeues_and_resumes(tmp_path, profile, monkeypatch):
    import pickle

    import submitit

    monkeypatch.setenv(ENV_COMMAND, standin_command())
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.2")
    monkeypatch.setenv("ARMORLAB_STANDIN_HOLD_AT", "3")  # parked at step 3 until the preemption lands
    spec = write_spec(tmp_path / "pre.yaml", {"name": "pre", "base": {"max_steps": 20, "val_every": 5,
                                                                       "save_steps": 100}, "seeds": [7, 8]})
    root = tmp_path / "runs"
    _sweep(str(spec), "--root", str(root), "--profile", str(profile))
    sweep_dir = root / "pre"
    manifest = load_manifest(sweep_dir)
    for rid in manifest.runs:  # two tasks of one array, preempted one after the other
        rd = RunDir(sweep_dir / rid)
        wait_for(lambda rd=rd: (rd.last_step() or 0) >= 3, 90, "the job to train 3 steps")
        job_id = manifest.last_job(rid)
        # preemption as submitit simulates it: SIGTERM, then the checkpoint signal (USR2)
        submitit.SlurmJob(folder=sweep_dir / ".submitit", job_id=job_id)._interrupt()
        wait_for(lambda rd=rd: rd.read_status()["attempt"] == 2, 90, "the requeued job to start")
        # the requeued task ran submitit's checkpoint (a TrainJob without the config the array
        # file carries), not the array file's entry again
        pickled = pickle.loads((sweep_dir / ".submitit" / f"{job_id}_submitted.pkl").read_bytes())
        assert pickled.function.config is None
    st = wait_finished(sweep_dir, 120)
    assert [(r.state, r.attempts) for r in st.rows] == [("completed", 2)] * 2
    assert load_manifest(sweep_dir).jobs == manifest.jobs  # requeued in place, not resubmitted
    for rid in manifest.runs:
        rd = RunDir(sweep_dir / rid)
        seed = rd.read_config()["seed"]
        rows = rd.read_metrics()
        assert [r["step"] for r in rows] == list(range(21))
        assert [r["train/reward"] for r in rows[1:]] == [standin_metric(seed, s, 0) for s in range(1, 21)]


def test_cancel_checkpoints_running_jobs_and_the_sweep_resumes(tmp_path, profile, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    spec = write_spec(tmp_path / "c.yaml", {"name": "c", "base": {"max_steps": 200, "save_steps": 1000},
                                            "grid": {"seed": [0, 1, 2]}})
    root = tmp_path / "runs"
    _sweep(str(spec), "--root", str(root), "--profile", str(profile), ARMORLAB_STANDIN_STEP_S="0.2")
    sweep_dir = root / "c"
    rds = [RunDir(sweep_dir / r) for r in load_manifest(sweep_dir).runs]
    wait_for(lambda: sum((rd.last_step() or 0) >= 2 for rd in rds) == 2, 90, "two jobs to be training")
    out = run_cli("cancel", str(sweep_dir))
    assert out.returncode == 0 and "cancelled 3 job(s)" in out.stdout
    st = wait_finished(sweep_dir, 90)
    states = sorted((r.state, (r.reason or "").split(" at ")[0]) for r in st.rows)
    assert states == [("pending", ""), ("pending", "preempted"), ("pending", "preempted")]  # one never started
    assert {r.slurm_state for r in st.rows} == {"CANCELLED"}
    _sweep(str(spec), "--root", str(root), "--profile", str(profile), ARMORLAB_STANDIN_STEP_S="0.001")
    st = wait_finished(sweep_dir, 120)
    assert [r.state for r in st.rows] == ["completed"] * 3
    for rd in rds:
        assert [r["step"] for r in rd.read_metrics()] == list(range(201))


# --------------------------------------------------------------------------- acceptance (real trainer)
def test_real_sweep_of_six_runs_completes_and_a_rerun_submits_nothing(tmp_path, profile, model_cache):
    spec = write_spec(tmp_path / "six.yaml", {"name": "six", "base": TINY, "grid": {"objective": ["dapo", "up"]},
                                              "seeds": [0, 1, 2]})
    root = tmp_path / "runs"
    _sweep(str(spec), "--root", str(root), "--profile", str(profile), ARMORLAB_CACHE=model_cache)
    sweep_dir = root / "six"
    st = wait_finished(sweep_dir, 900)
    assert [r.state for r in st.rows] == ["completed"] * 6, [(r.state, r.reason) for r in st.rows]
    for r in st.rows:
        rows = RunDir(sweep_dir / r.run_id).read_metrics()
        assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]
        assert all(0.0 <= row["val/acc"] <= 1.0 for row in rows if row["step"] % 2 == 0)
        assert all(math.isfinite(row["train/reward"]) for row in rows[1:])
        assert r.attempts == 1
    wait_for(lambda: {r.slurm_state for r in collect(sweep_dir).rows} == {"COMPLETED"}, 30, "sacct")
    n_arrays = len(_submitted_arrays(sweep_dir))
    again = _sweep(str(spec), "--root", str(root), "--profile", str(profile))
    assert "nothing to submit" in again.stdout and "6 completed" in again.stdout
    assert len(_submitted_arrays(sweep_dir)) == n_arrays
    status = run_cli("status", str(sweep_dir), env={"COLUMNS": "200"})
    assert status.returncode == 0 and status.stdout.count("completed") >= 6


def test_real_failed_run_is_reported_with_its_reason(tmp_path, profile, model_cache):
    broken = tmp_path / "broken-model"  # a model dir transformers cannot load: the job fails
    fake_model_dir(broken, model_type="no_such_architecture")
    spec = write_spec(tmp_path / "bad.yaml", {"name": "bad", "base": {**TINY, "model": str(broken)}})
    root = tmp_path / "runs"
    _sweep(str(spec), "--root", str(root), "--profile", str(profile), ARMORLAB_CACHE=model_cache)
    st = wait_finished(root / "bad", 300)
    row = st.rows[0]
    assert row.state == "failed"
    wait_for(lambda: collect(root / "bad").rows[0].slurm_state == "FAILED", 30, "sacct")
    assert row.reason and str(broken) in row.reason
    out = run_cli("status", str(root / "bad"), env={"COLUMNS": "400"})
    assert "failed" in out.stdout and "broken-model" in out.stdout
    again = _sweep(str(spec), "--root", str(root), "--profile", str(profile))
    assert "1 failed (use --retry failed)" in again.stdout and "nothing to submit" in again.stdout


def test_real_preempted_run_ends_with_the_metrics_of_an_uninterrupted_one(tmp_path, profile, model_cache):
    base = {**TINY, "max_steps": 6, "save_steps": 100, "objective": "up"}
    root = tmp_path / "runs"
    for name in ("interrupted", "reference"):  # same config, two sweep dirs
        _sweep(str(write_spec(tmp_path / f"{name}.yaml", {"name": name, "base": base})), "--root", str(root),
               "--profile", str(profile), ARMORLAB_CACHE=model_cache)
    sweep_dir = root / "interrupted"
    rd = preempt_after_first_step(sweep_dir, 600)
    run_id = rd.path.name
    wait_finished(sweep_dir, 600)
    wait_finished(root / "reference", 600)
    status = rd.read_status()
    assert status["state"] == "completed" and status["attempt"] == 2
    assert rd.last_checkpoint() is not None
    got, want = rd.read_metrics(), RunDir(root / "reference" / run_id).read_metrics()
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(7))  # no line lost
    for g, w in zip(got, want, strict=True):
        keys = {k for k in w if not any(t in k for t in ("time", "runtime", "per_second"))}
        assert keys <= set(g)
        assert {k for k in keys if g[k] is None} == {k for k in keys if w[k] is None}  # non-finite → null
        finite = [k for k in keys if w[k] is not None]
        assert {k: g[k] for k in finite} == pytest.approx({k: w[k] for k in finite}, rel=1e-5, abs=1e-6)
