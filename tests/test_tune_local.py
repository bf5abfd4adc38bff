"""Studies run end to end by local worker processes, with the stand-in trainer
(armorlab.tune.synthetic_trainer: the run-dir contract with a closed-form val curve of known optimum)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
from optuna.trial import TrialState  # noqa: E402
from tune_support import STANDIN, spec, standin  # noqa: E402, F401 (fixture)

from armorlab.core.runs import RunDir  # noqa: E402
from armorlab.tune.study import load_study, prepare_study, run_local, study_status, write_study_plots  # noqa: E402

pytestmark = pytest.mark.usefixtures("standin")


def train_headers(study_dir: Path, run_id: str) -> list[str]:
    """One header line per training attempt the workers started for this run."""
    log = study_dir / ".tune" / "logs" / f"{run_id}.log"
    return [ln for ln in log.read_text().splitlines() if ln.startswith("--- trial")] if log.exists() else []


def trials(study_dir: Path):
    return load_study(study_dir)[1].get_trials(deepcopy=False)


# --------------------------------------------------------------------------- the main study
def test_six_trial_study_finds_the_optimum_with_two_workers(tmp_path):
    p = spec(tmp_path, "grid6", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7, 0.9]}
          ref_reset_steps: {type: categorical, choices: [0, 80]}
        objective: {metric: val/acc, summary: auc}
        sampler: {type: grid, seed: 3}
        n_trials: 6
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    result = run_local(ctx, 2, poll_s=0.2, worker_poll_s=0.1)
    assert result["worker_exit_codes"] == [0, 0]
    ts = trials(ctx.study_dir)
    assert len(ts) == 6 and all(t.state == TrialState.COMPLETE for t in ts)
    # the synthetic optimum: alpha 0.7, tau 80 (see armorlab.tune.synthetic_trainer.OPTIMUM)
    status = study_status(ctx.study_dir)
    assert status["best"][0]["params"] == {"alpha": 0.7, "ref_reset_steps": 80}
    assert status["counts"]["finished"] == 6
    # no trial ran twice: six distinct points, six runs, each trained once by one worker
    runs = [t.user_attrs["runs"][0] for t in ts]
    assert len(set(runs)) == 6
    assert len({tuple(sorted(t.params.items())) for t in ts}) == 6
    for t in ts:
        assert len(train_headers(ctx.study_dir, t.user_attrs["runs"][0])) == 1
        rd = RunDir(ctx.study_dir / t.user_attrs["runs"][0])
        assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == 1
        assert rd.read_config()["alpha"] == t.params["alpha"]
    assert {t.user_attrs["worker"]["index"] for t in ts} <= {0, 1}

    # --status prints the best-trials table; the report helper writes Optuna's plots
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "tune", str(p), "--status", "--root",
                          str(tmp_path / "runs")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "6/6 finished" in out.stdout and "auc(val/acc)" in out.stdout
    best_line = next(ln for ln in out.stdout.splitlines() if f"│ {status['best'][0]['number']} " in ln)
    assert "0.7" in best_line and "80" in best_line
    # running it again resumes the study, which has nothing left to do
    again = subprocess.run([sys.executable, "-m", "armorlab.cli", "tune", str(p), "--root", str(tmp_path / "runs")],
                           capture_output=True, text=True)
    assert again.returncode == 0 and "already has 6 finished trials" in again.stdout
    assert len(trials(ctx.study_dir)) == 6
    import matplotlib

    def style():  # the backend is chosen on purpose (Agg, headless) and stays
        return {k: v for k, v in matplotlib.rcParams.items() if not k.startswith("backend")}

    before = style()
    plots = write_study_plots(ctx.study_dir, tmp_path / "plots")
    assert style() == before  # Optuna's ggplot style does not leak into later report figures
    names = {q.name for q in plots}
    assert {"optuna_history.png", "optuna_importances.png", "optuna_slice.png", "optuna_contour.png"} <= names
    assert all(q.stat().st_size > 1000 for q in plots)


def test_repeated_points_reuse_runs_and_a_second_start_resumes(tmp_path):
    search = """
        space:
          ref_reset_steps: {{type: categorical, choices: [0, 80]}}
        sampler: {{type: random, seed: 1}}
        n_trials: {n}
    """
    p = spec(tmp_path, "reuse", search.format(n=4))
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 2, poll_s=0.2, worker_poll_s=0.1)
    first = {t.number: t.values for t in trials(ctx.study_dir)}
    assert len(first) == 4
    # resume the same study with a larger budget
    p = spec(tmp_path, "reuse", search.format(n=7))
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 2, poll_s=0.2, worker_poll_s=0.1)
    ts = trials(ctx.study_dir)
    assert len(ts) == 7 and all(t.state == TrialState.COMPLETE for t in ts)
    assert {t.number: t.values for t in ts if t.number in first} == first
    # 7 trials over 2 points: every run dir trained exactly once, the repeats reused it
    by_run = Counter(t.user_attrs["runs"][0] for t in ts)
    assert len(by_run) <= 2
    for rid in by_run:
        assert len(train_headers(ctx.study_dir, rid)) == 1
    assert sum(t.user_attrs["outcome"] == "reused" for t in ts) == 7 - len(by_run)
    # same params ⇒ same value
    values = {}
    for t in ts:
        values.setdefault(t.params["ref_reset_steps"], set()).add(t.values[0])
    assert all(len(v) == 1 for v in values.values())


# --------------------------------------------------------------------------- pruning
def expected_collapse_prune_step(cfg, delta=0.05, patience=3):
    """The eval step at which the collapse rule (armorlab.stats.collapse, tested on its own)
    first fires on the stand-in's curve as the evals arrive, with the whole trial's threshold:
    the worker must prune exactly there."""
    from armorlab.stats.collapse import collapse_step
    from armorlab.tune.synthetic_trainer import val_acc

    steps = list(range(0, cfg["max_steps"] + 1, cfg["val_every"]))
    values = [val_acc(cfg, s) for s in steps]
    for k in range(1, len(steps) + 1):
        if collapse_step(steps[:k], values[:k], delta, patience, horizon=len(steps)) is not None:
            return steps[k - 1]
    return None


def test_collapse_pruner_stops_a_collapsing_run_and_divergence_counts_as_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_SYNTHETIC_STEP_S", "0.04")
    # max_steps leaves the trainer ~2 s after the prune step to notice the stop request
    base = "{objective: armor, max_steps: 100, val_every: 5, alpha: 0.7, ref_reset_steps: 80, epsilon_high: 0.3}"
    p = spec(tmp_path, "collapse", """
        space:
          learning_rate: {type: categorical, choices: [1.0e-4, 1.0e-3, 1.0e-2]}
        sampler: {type: grid}
        pruner: {type: collapse, delta: 0.05, patience: 3}
    """, base=base)
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.05)
    by_lr = {t.params["learning_rate"]: t for t in trials(ctx.study_dir)}
    assert len(by_lr) == 3
    assert by_lr[1e-4].state == TrialState.COMPLETE

    collapsing = by_lr[1e-3]
    rd = RunDir(ctx.study_dir / collapsing.user_attrs["runs"][0])
    expected = expected_collapse_prune_step(rd.read_config())
    assert expected is not None and expected < 60
    assert collapsing.state == TrialState.PRUNED and collapsing.user_attrs["outcome"] == "pruned"
    assert collapsing.last_step == expected
    status = rd.read_status()
    assert status["state"] == "completed"
    assert status["reason"].endswith(f"pruned by optuna at step {expected}")
    assert rd.last_step() < 100  # the trainer stopped early instead of finishing the run

    diverged = by_lr[1e-2]
    assert diverged.state == TrialState.PRUNED and diverged.user_attrs["outcome"] == "diverged"
    assert "non-finite loss" in diverged.user_attrs["prune_reason"]


# --------------------------------------------------------------------------- crash safety
def test_killed_worker_leaves_a_consistent_study_and_its_trial_is_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_SYNTHETIC_STEP_S", "0.05")
    p = spec(tmp_path, "kill", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7, 0.9]}
        sampler: {type: grid}
    """, base="{objective: armor, max_steps: 40, val_every: 5}")
    ctx = prepare_study(p, root=tmp_path / "runs")
    logs = ctx.tune_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    workers = [subprocess.Popen([sys.executable, "-m", "armorlab.tune.worker", str(ctx.study_dir), "--index", str(i),
                                 "--poll", "0.1"], stdout=open(logs / f"w{i}.log", "ab"),  # noqa: SIM115
                                stderr=subprocess.STDOUT)
               for i in range(2)]
    victim = workers[0]
    try:
        # wait until worker 0 is mid-trial: its run has logged a few steps
        deadline = time.monotonic() + 60
        killed_trial = None
        while killed_trial is None:
            assert time.monotonic() < deadline, "worker 0 never started a trial"
            for t in trials(ctx.study_dir):
                if t.state == TrialState.RUNNING and t.user_attrs.get("worker", {}).get("pid") == victim.pid \
                        and t.user_attrs.get("runs"):
                    rd = RunDir(ctx.study_dir / t.user_attrs["runs"][0])
                    if (rd.last_step() or 0) >= 10:
                        killed_trial = t
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        assert workers[1].wait(timeout=90) == 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()

    ts = trials(ctx.study_dir)
    counts = Counter(t.state for t in ts)
    assert counts[TrialState.COMPLETE] == 3 and counts[TrialState.FAIL] == 1 and counts[TrialState.RUNNING] == 0
    dead = next(t for t in ts if t.number == killed_trial.number)
    assert dead.state == TrialState.FAIL and "worker died" in dead.user_attrs["fail_reason"]
    retry = next(t for t in ts if t.user_attrs.get("retry_of") == dead.number)
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params
    assert retry.user_attrs["worker"]["index"] == 1
    # the run was resumed in place: second attempt, every step logged exactly once (the killed
    # worker's trainer stopped when its worker died, so nothing wrote the run twice)
    rd = RunDir(ctx.study_dir / dead.user_attrs["runs"][0])
    assert retry.user_attrs["runs"] == dead.user_attrs["runs"]
    status = rd.read_status()
    assert status["state"] == "completed" and status["attempt"] == 2
    steps = Counter(row["step"] for row in rd.iter_metrics())
    assert sorted(steps) == list(range(41)) and set(steps.values()) == {1}
    assert len(train_headers(ctx.study_dir, rd.id)) == 2


def _sigterm_worker_when(ctx, ready) -> None:
    """Start one worker, wait until ``ready()`` holds, SIGTERM it: it must exit 75 (preempted)."""
    w = subprocess.Popen([sys.executable, "-m", "armorlab.tune.worker", str(ctx.study_dir), "--poll", "0.1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ready():
        assert time.monotonic() < deadline and w.poll() is None
        time.sleep(0.05)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 75


def test_sigterm_requeues_the_running_trial_without_counting_a_retry(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_SYNTHETIC_STEP_S", "0.05")
    p = spec(tmp_path, "term", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
    """, base="{objective: armor, max_steps: 40, val_every: 5}")
    ctx = prepare_study(p, root=tmp_path / "runs")
    # Synchronise on what the stand-in does, not on time: its first metrics line comes after its
    # SIGTERM handler is installed, so the signal lands mid-training (a busy machine once made a
    # fixed sleep too short: the trainer died of SIGTERM while starting, counted as a crash).
    _sigterm_worker_when(ctx, lambda: any(m.stat().st_size for m in ctx.study_dir.glob("*/metrics.jsonl")))
    ts = trials(ctx.study_dir)
    failed = [t for t in ts if t.state == TrialState.FAIL]
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    assert len(failed) == 1 and len(waiting) == 1 and waiting[0].system_attrs["fixed_params"] == failed[0].params
    assert waiting[0].user_attrs["retries"] == 0  # preemption is not the trial's fault
    rd = RunDir(ctx.study_dir / failed[0].user_attrs["runs"][0])
    assert rd.read_status()["state"] == "pending" and "preempted" in rd.read_status()["reason"]
    # the next start picks the queued trial up and resumes the run
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    ts = trials(ctx.study_dir)
    assert Counter(t.state for t in ts)[TrialState.COMPLETE] == 2
    assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == 2


def test_sigterm_while_the_trainer_starts_is_a_preemption_not_a_crash(tmp_path, monkeypatch):
    """Issue 13 §5, the race itself, made deterministic: the trainer is alive but has no SIGTERM
    handler yet (still importing), so the worker's forwarded SIGTERM kills it. That is still the
    worker's interruption: re-queued without counting a retry, the run pending, not failed."""
    slow_start = ("import pathlib, sys, time; pathlib.Path(sys.argv[-1], 'started').write_text('1'); "
                  "time.sleep(120)")
    monkeypatch.setenv("ARMORLAB_TRAIN_COMMAND", json.dumps([sys.executable, "-c", slow_start]))
    p = spec(tmp_path, "early", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    _sigterm_worker_when(ctx, lambda: bool(list(ctx.study_dir.glob("*/started"))))
    ts = trials(ctx.study_dir)
    failed = [t for t in ts if t.state == TrialState.FAIL]
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    assert len(failed) == 1 and len(waiting) == 1 and waiting[0].user_attrs["retries"] == 0
    status = RunDir(ctx.study_dir / failed[0].user_attrs["runs"][0]).read_status()
    assert status["state"] == "pending" and "preempted" in status["reason"]


def test_reconcile_fails_dead_owners_only_and_respects_max_retries(tmp_path):
    from armorlab.tune.backend import open_storage, reconcile, study_lock, worker_identity

    p = spec(tmp_path, "rec", """
        space:
          alpha: {type: float, low: 0.5, high: 1.0}
        n_trials: 5
        max_retries: 1
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    study = optuna.load_study(study_name="rec", storage=open_storage(ctx.study_dir, None))
    me = worker_identity()
    dead_proc = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_proc.wait()
    dead = {**me, "pid": dead_proc.pid, "start": 1}
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        from armorlab.tune.backend import process_start_time

        alive = {**me, "pid": live.pid, "start": process_start_time(live.pid)}
        t_dead = study.ask({"alpha": optuna.distributions.FloatDistribution(0.5, 1.0)})
        t_dead.set_user_attr("worker", dead)
        t_live = study.ask({"alpha": optuna.distributions.FloatDistribution(0.5, 1.0)})
        t_live.set_user_attr("worker", alive)
        t_spent = study.ask({"alpha": optuna.distributions.FloatDistribution(0.5, 1.0)})
        t_spent.set_user_attr("worker", dead)
        t_spent.set_user_attr("retries", 1)
        with study_lock(ctx.study_dir):
            failed = reconcile(study, me, max_retries=1)
        assert sorted(failed) == sorted([t_dead.number, t_spent.number])
        by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
        assert by_number[t_live.number].state == TrialState.RUNNING
        assert by_number[t_dead.number].state == TrialState.FAIL
        waiting = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
        assert len(waiting) == 1  # t_spent had used its one retry
        assert waiting[0].system_attrs["fixed_params"] == t_dead.params and waiting[0].user_attrs == {"retry_of": t_dead.number, "retries": 1}
    finally:
        live.kill()
        live.wait()


def test_unverifiable_owner_is_judged_by_its_beat_file(tmp_path):
    from armorlab.tune.backend import (
        beat_path,
        open_storage,
        reconcile,
        study_lock,
        touch_beat,
        worker_identity,
    )

    p = spec(tmp_path, "beat", """
        space:
          alpha: {type: float, low: 0.5, high: 1.0}
        n_trials: 5
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    study = optuna.load_study(study_name="beat", storage=open_storage(ctx.study_dir, None))
    me = worker_identity()
    elsewhere = {"host": "node-17", "pid": 4242, "start": 1, "job": None, "index": 0}
    dist = {"alpha": optuna.distributions.FloatDistribution(0.5, 1.0)}
    silent, beating = study.ask(dist), study.ask(dist)
    for t in (silent, beating):
        t.set_user_attr("worker", elsewhere)
        touch_beat(ctx.study_dir, t.number)
    old = time.time() - 700
    os.utime(beat_path(ctx.study_dir, silent.number), (old, old))
    with study_lock(ctx.study_dir):
        assert reconcile(study, me, 2) == []  # without beat files: cannot tell, leave both alone
        assert reconcile(study, me, 2, study_dir=ctx.study_dir, beat_grace_s=600) == [silent.number]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[silent.number] == TrialState.FAIL and states[beating.number] == TrialState.RUNNING
    assert "silent" in study.trials[silent.number].user_attrs["fail_reason"]


def test_rdb_storage_runs_a_study_and_heartbeats_retry_stale_trials(tmp_path):
    from armorlab.tune.backend import open_storage, quiet_optuna, reconcile, worker_identity

    url = f"sqlite:///{tmp_path / 'study.db'}"
    p = spec(tmp_path, "rdb", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
    """)
    ctx = prepare_study(p, root=tmp_path / "runs", storage=url)
    assert not (ctx.tune_dir / "journal.log").exists()
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    assert study_status(ctx.study_dir)["counts"]["complete"] == 2
    assert json.loads((ctx.tune_dir / "study.json").read_text())["storage"] == url

    # a trial whose worker stops beating is failed and re-queued by Optuna's heartbeat machinery
    storage = open_storage(ctx.study_dir, url, max_retries=2, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="beats", storage=storage)
    with quiet_optuna():  # Optuna warns about heartbeats outside study.optimize
        trial = study.ask({"alpha": optuna.distributions.FloatDistribution(0.5, 1.0)})
    storage.record_heartbeat(trial._trial_id)
    time.sleep(2.5)
    reconcile(study, worker_identity(), max_retries=2)
    states = Counter(t.state for t in study.get_trials(deepcopy=False))
    assert states[TrialState.FAIL] == 1 and states[TrialState.WAITING] == 1


def test_spec_storage_precedence_and_resume_keeps_the_storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    p = spec(tmp_path, "prec", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
    """)
    ctx = prepare_study(p, root=tmp_path / "runs", storage=url)
    assert ctx.storage_url == url
    again = prepare_study(p, root=tmp_path / "runs")  # no --storage: keep the study's own
    assert again.storage_url == url


def test_worker_env_is_not_polluted():
    # the stand-in hook is the sweep layer's; the tune worker honours it through train_argv
    from armorlab.sweeps.jobs import ENV_COMMAND, train_argv

    assert json.loads(os.environ[ENV_COMMAND]) == STANDIN
    assert train_argv("/x")[-2:] == ["--run-dir", "/x"]


def test_crashing_trainer_is_retried_then_the_worker_gives_up(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_TRAIN_COMMAND", json.dumps([sys.executable, "-c", "raise SystemExit(1)"]))
    p = spec(tmp_path, "crash", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
        max_retries: 1
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    result = run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    assert result["counts"]["finished"] == 0
    ts = trials(ctx.study_dir)
    # three failures in a row stop the worker: trial 0, its one retry, then the next point
    failed = [t for t in ts if t.state == TrialState.FAIL]
    assert len(failed) == 3
    assert failed[1].user_attrs["retry_of"] == failed[0].number and failed[1].params == failed[0].params
    assert all("exit code 1" in t.user_attrs["fail_reason"] for t in failed)
    # the run dir says why, as a sweep job would
    rd = RunDir(ctx.study_dir / failed[0].user_attrs["runs"][0])
    assert rd.read_status()["state"] == "failed" and "exit code 1" in rd.read_status()["reason"]
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "tune", str(p), "--root", str(tmp_path / "runs")],
                         capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 1 and "stopped before 2 trials finished" in out.stdout.replace("\n", " ")


def test_slurm_checkpoint_requeues_the_trial_and_the_worker(tmp_path, monkeypatch):
    """What submitit does on the preemption signal, without a cluster: call checkpoint() while
    the worker's trial trains; the trial is re-queued (no retry counted) and the worker resubmitted."""
    import pickle
    import threading

    from armorlab.tune.study import TuneWorkerJob

    monkeypatch.setenv("ARMORLAB_SYNTHETIC_STEP_S", "0.05")
    p = spec(tmp_path, "ckpt", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
    """, base="{objective: armor, max_steps: 40, val_every: 5}")
    ctx = prepare_study(p, root=tmp_path / "runs")
    job = TuneWorkerJob(ctx.study_dir, 1, {"launcher": "python"}, poll_s=0.1)
    box = {}

    def preempt():
        wait_for_running(ctx.study_dir)
        box["resubmission"] = job.checkpoint()

    helper = threading.Thread(target=preempt)
    helper.start()
    old = signal.getsignal(signal.SIGTERM)
    try:
        summary = job()
    finally:
        signal.signal(signal.SIGTERM, old)
    helper.join(timeout=60)
    assert summary["stop_reason"] == "interrupted"
    ts = trials(ctx.study_dir)
    failed = [t for t in ts if t.state == TrialState.FAIL]
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    # (checkpoint() runs in a helper thread here, so the worker may see its trainer exit first)
    assert len(failed) == 1 and "preempted" in failed[0].user_attrs["fail_reason"]
    assert len(waiting) == 1 and waiting[0].user_attrs["retries"] == 0
    rd = RunDir(ctx.study_dir / failed[0].user_attrs["runs"][0])
    assert rd.read_status()["state"] == "pending"  # the trainer checkpointed before the worker left
    again = pickle.loads(pickle.dumps(box["resubmission"].function))
    assert isinstance(again, TuneWorkerJob) and again.study_dir == job.study_dir and again.index == 1


def wait_for_running(study_dir, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        for t in trials(study_dir):
            if t.state == TrialState.RUNNING and t.user_attrs.get("runs"):
                rd = RunDir(study_dir / t.user_attrs["runs"][0])
                if (rd.last_step() or 0) >= 3:
                    return t
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.05)


def test_multi_objective_study_reports_a_pareto_front_and_young_studies_plot(tmp_path):
    p = spec(tmp_path, "multi", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7, 0.9]}
        objective:
          - {metric: val/acc, summary: test-at-val-best}
          - {metric: train/reward, summary: final}
        direction: [maximize, minimize]
        sampler: {type: grid}
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    status = study_status(ctx.study_dir)
    assert status["objectives"] == ["test/acc@best(val/acc)", "final(train/reward)"]
    assert status["counts"]["complete"] == 3
    # the stand-in's train reward rises with quality, like val: no point dominates another
    assert {r["number"] for r in status["best"]} == {0, 1, 2}
    for r in status["best"]:
        rd = RunDir(ctx.study_dir / r["runs"][0])
        rows = rd.read_metrics()
        evals = [row for row in rows if "val/acc" in row]  # sorted by step
        best_val = max(row["val/acc"] for row in evals)
        at_best = next(row for row in evals if row["val/acc"] == best_val)  # earliest on ties
        assert r["values"][0] == pytest.approx(at_best["test/acc"])
        assert r["values"][1] == pytest.approx(rows[-1]["train/reward"])
    plots = {q.name for q in write_study_plots(ctx.study_dir, tmp_path / "plots")}
    assert {"optuna_history_obj0.png", "optuna_history_obj1.png"} <= plots

    # a study with a single complete trial still plots what it can, without error
    p = spec(tmp_path, "young", """
        space:
          alpha: {type: categorical, choices: [0.5, 0.7]}
        sampler: {type: grid}
        n_trials: 1
    """)
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    plots = {q.name for q in write_study_plots(ctx.study_dir, tmp_path / "plots_young")}
    assert "optuna_history.png" in plots and "optuna_importances.png" not in plots


def test_a_trial_trains_every_seed_and_scores_their_mean(tmp_path):
    import numpy as np

    p = spec(tmp_path, "seeds", """
        space:
          alpha: {type: categorical, choices: [0.6, 0.8]}
        sampler: {type: grid}
    """, seeds="[0, 1]")
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    for t in trials(ctx.study_dir):
        assert t.state == TrialState.COMPLETE and len(t.user_attrs["runs"]) == 2
        aucs = []
        for rid, seed in zip(t.user_attrs["runs"], (0, 1), strict=True):
            rd = RunDir(ctx.study_dir / rid)
            assert rd.read_config()["seed"] == seed and rd.read_config()["alpha"] == t.params["alpha"]
            pts = [(r["step"], r["val/acc"]) for r in rd.read_metrics() if "val/acc" in r]
            s, v = np.array(pts).T
            aucs.append(np.sum((v[1:] + v[:-1]) / 2 * np.diff(s)) / (s[-1] - s[0]))
        assert aucs[0] != aucs[1]  # the seeds' noise differs, so the mean is a real average
        assert t.values[0] == pytest.approx(np.mean(aucs))
        # pruning follows the first seed: its curve is the one reported
        first = RunDir(ctx.study_dir / t.user_attrs["runs"][0])
        assert t.intermediate_values == pytest.approx(
            {r["step"]: r["val/acc"] for r in first.read_metrics() if "val/acc" in r})
