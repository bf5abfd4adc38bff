"""Studies on a real PostgreSQL server (slurm/postgres/start.sh): local and Slurm workers, a
worker killed mid-trial, a server restart, two studies in one database; and optuna-dashboard.
The stand-in trainer (armorlab.tune.synthetic_trainer) keeps trials cheap."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from pg_support import REPO, postgres_db, postgres_server  # noqa: F401 (fixtures)
from sweep_support import run_cli, slurm_cluster, wait_for  # noqa: F401 (fixture)

optuna = pytest.importorskip("optuna")
from optuna.trial import TrialState  # noqa: E402
from tune_support import STANDIN, spec, standin  # noqa: E402, F401 (fixture)

from armorlab.core.runs import RunDir  # noqa: E402

pytestmark = pytest.mark.usefixtures("standin")


def pg_trials(url: str, name: str):
    from armorlab.tune.backend import rdb_url

    return optuna.load_study(study_name=name, storage=rdb_url(url)).get_trials(deepcopy=False)


def worker_env(ctx) -> dict[str, str]:
    """The environment `armorlab tune` gives the workers it starts (PGPASSWORD)."""
    from armorlab.tune.secrets import worker_env as env

    return env(ctx.storage_url)


def steps_logged(rd: RunDir) -> Counter:
    return Counter(row["step"] for row in rd.iter_metrics())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- no driver
def test_without_a_driver_a_postgres_storage_is_exit_2_naming_the_extra(tmp_path):
    p = spec(tmp_path, "nodriver", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n")
    blocked = ("import sys; sys.modules['psycopg'] = sys.modules['psycopg2'] = None; "
               "from armorlab.cli import main; main()")
    out = subprocess.run([sys.executable, "-c", blocked, "tune", str(p), "--workers", "3", "--root",
                          str(tmp_path / "runs"), "--storage", "postgresql://me:s3cret@127.0.0.1:1/db"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "armorlab[postgres]" in out.stderr and "psycopg" in out.stderr
    assert "Traceback" not in out.stderr and "s3cret" not in out.stderr
    assert not (tmp_path / "runs" / "nodriver").exists()  # nothing was created, no worker started


def test_driver_naming_and_heartbeat_settings(monkeypatch):
    from armorlab.errors import ArmorLabError
    from armorlab.tune.backend import rdb_url, with_driver
    from armorlab.tune.space import parse_search

    pytest.importorskip("psycopg")
    assert with_driver("postgres://u:${PW}@h/db") == "postgresql+psycopg://u:${PW}@h/db"  # $VARS kept
    monkeypatch.setenv("PW", "pw")
    assert rdb_url("postgresql://u:${PW}@h/db") == "postgresql+psycopg://u:pw@h/db"
    assert with_driver("sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(ArmorLabError, match=r"\(psycopg2\), and none is installed.*armorlab\[postgres\]"):
        with_driver("postgresql+psycopg2://u:pw@h/db")

    base = {"objective": "armor", "max_steps": 30, "val_every": 5}
    space = {"space": {"alpha": [0.5, 0.7]}, "sampler": "grid"}
    s = parse_search({**space, "heartbeat": {"interval": 2, "grace": 4}}, base)
    assert (s.heartbeat_interval, s.heartbeat_grace) == (2, 4)
    assert (parse_search(space, base).heartbeat_interval, parse_search(space, base).heartbeat_grace) == (60, 180)
    for bad, key in (({"interval": 2, "grace": 3}, "search.heartbeat.grace"),
                     ({"interval": 0}, "search.heartbeat.interval"),
                     ({"beat": 1}, "search.heartbeat.beat")):
        with pytest.raises(ArmorLabError, match=key.replace(".", r"\.")):
            parse_search({**space, "heartbeat": bad}, base, file="s.yaml")


# --------------------------------------------------------------------------- local workers
@pytest.mark.postgres
def test_local_workers_share_postgres_two_studies_stay_apart_and_a_rerun_adds_none(tmp_path, postgres_db):  # noqa: F811
    from armorlab.tune.study import prepare_study, run_local, study_status

    a = spec(tmp_path, "pg_a", "space: {alpha: [0.5, 0.6, 0.7, 0.8, 0.9]}\nsampler: {type: grid}\n")
    b = spec(tmp_path, "pg_b", "space: {alpha: [0.55, 0.65]}\nsampler: {type: grid}\n")
    root = tmp_path / "runs"
    ctx_a = prepare_study(a, root=root, storage=postgres_db)
    result = run_local(ctx_a, 3, poll_s=0.2, worker_poll_s=0.1)
    assert result["worker_exit_codes"] == [0, 0, 0]
    ctx_b = prepare_study(b, root=root, storage=postgres_db)
    assert run_local(ctx_b, 2, poll_s=0.2, worker_poll_s=0.1)["worker_exit_codes"] == [0, 0]

    ta, tb = pg_trials(postgres_db, "pg_a"), pg_trials(postgres_db, "pg_b")
    assert len(ta) == 5 and all(t.state == TrialState.COMPLETE for t in ta)
    assert len(tb) == 2 and all(t.state == TrialState.COMPLETE for t in tb)
    # each study sees its own points only, and no point ran twice
    assert sorted(t.params["alpha"] for t in ta) == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert sorted(t.params["alpha"] for t in tb) == [0.55, 0.65]
    assert {t.user_attrs["worker"]["index"] for t in ta} <= {0, 1, 2}
    for t in ta + tb:
        rd = RunDir(root / ("pg_a" if t in ta else "pg_b") / t.user_attrs["runs"][0])
        assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == 1
        assert sorted(steps_logged(rd)) == list(range(31)) and set(steps_logged(rd).values()) == {1}
    summaries = optuna.study.get_all_study_summaries(
        __import__("armorlab.tune.backend", fromlist=["rdb_url"]).rdb_url(postgres_db))
    assert sorted(s.study_name for s in summaries) == ["pg_a", "pg_b"]

    # the same command again: the finished study is only reported
    out = run_cli("tune", str(a), "--root", str(root), "--storage", postgres_db, "--workers", "3", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "already has 5 finished trials" in out.stdout
    assert len(pg_trials(postgres_db, "pg_a")) == 5
    status = study_status(ctx_a.study_dir)
    assert status["counts"]["complete"] == 5 and status["counts"]["running"] == 0
    assert status["dashboard"].startswith("optuna-dashboard 'postgresql+psycopg://")
    # a later process reads the password from the environment (or ~/.pgpass): no file holds it
    password = __import__("armorlab.tune.secrets", fromlist=["x"]).split_password(postgres_db)[1]
    out = run_cli("tune", str(ctx_a.study_dir), "--status", timeout=120, env={"PGPASSWORD": password})
    assert out.returncode == 0 and "dashboard: optuna-dashboard" in out.stdout, out.stdout + out.stderr


@pytest.mark.postgres
def test_a_preempted_worker_requeues_its_trial_on_postgres_without_counting_a_retry(
        tmp_path, monkeypatch, postgres_db):  # noqa: F811
    from armorlab.tune.study import prepare_study, run_local

    monkeypatch.setenv("ARMORLAB_SYNTHETIC_STEP_S", "0.05")
    p = spec(tmp_path, "pg_term", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n",
             base="{objective: armor, max_steps: 40, val_every: 5}")
    ctx = prepare_study(p, root=tmp_path / "runs", storage=postgres_db)
    # a worker started by hand reads the password from the environment (the study stores none)
    w = subprocess.Popen([sys.executable, "-m", "armorlab.tune.worker", str(ctx.study_dir), "--poll", "0.1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **worker_env(ctx)})
    wait_for(lambda: any((RunDir(d).last_step() or 0) >= 3 for d in ctx.study_dir.iterdir()
                         if (d / "metrics.jsonl").is_file()) or w.poll() is not None, 120, "a trial to train")
    w.send_signal(signal.SIGTERM)  # what scancel, a preemption or Ctrl-C deliver
    assert w.wait(timeout=60) == 75
    ts = pg_trials(postgres_db, "pg_term")
    failed = [t for t in ts if t.state == TrialState.FAIL]
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    assert len(failed) == 1 and len(waiting) == 1 and waiting[0].user_attrs["retries"] == 0
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    ts = pg_trials(postgres_db, "pg_term")
    assert Counter(t.state for t in ts) == {TrialState.COMPLETE: 2, TrialState.FAIL: 1}
    rd = RunDir(ctx.study_dir / failed[0].user_attrs["runs"][0])
    assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == 2
    assert sorted(steps_logged(rd)) == list(range(41)) and set(steps_logged(rd).values()) == {1}


# --------------------------------------------------------------------------- server restart
@pytest.mark.postgres
def test_workers_ride_out_a_server_restart(tmp_path, monkeypatch, postgres_server):  # noqa: F811
    """A private server (own dir and port) is stopped while two workers train and started again
    3 s later: the workers retry with back-off, the study completes with exactly n_trials, no trial
    was failed or run twice. Then, with the server down for good, a worker stops with a clear
    error within its retry budget, and the next start completes the study: nothing stays RUNNING."""
    from armorlab.tune.study import prepare_study, run_local

    monkeypatch.setenv("ARMORLAB_SYNTHETIC_STEP_S", "0.1")
    pg_dir, port = Path(f"/tmp/armorlab-pg-restart-{os.getpid()}"), free_port()
    env = {**os.environ, "ARMORLAB_PG_DIR": str(pg_dir), "ARMORLAB_PG_PORT": str(port), "ARMORLAB_PG_FRESH": "1"}
    start = [str(REPO / "slurm" / "postgres" / "start.sh")]
    stop = [str(REPO / "slurm" / "postgres" / "stop.sh")]
    try:
        line = subprocess.run(start, env=env, capture_output=True, text=True, check=True, timeout=180).stdout
        url = line.strip().split("=", 1)[1]
        assert url == f"postgresql://armorlab:armorlab@127.0.0.1:{port}/armorlab"
        p = spec(tmp_path, "restart", "space: {alpha: [0.5, 0.7, 0.9]}\nsampler: {type: grid}\n"
                 "heartbeat: {interval: 1, grace: 30}\n")
        ctx = prepare_study(p, root=tmp_path / "runs", storage=url)

        def mid_trial():
            return any((RunDir(d).last_step() or 0) >= 5 for d in ctx.study_dir.iterdir()
                       if (d / "metrics.jsonl").is_file())

        def restart():  # run_local must own the main thread (it sets a signal handler)
            try:
                wait_for(mid_trial, 120, "a trial half-way")
                subprocess.run(stop, env=env, check=True, timeout=60)
                time.sleep(3)
                subprocess.run(start, env={**env, "ARMORLAB_PG_FRESH": "0"}, capture_output=True, check=True,
                               timeout=120)
                box["restarted"] = True
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                box["restarted"] = exc

        box = {}
        side = threading.Thread(target=restart)
        side.start()
        result = run_local(ctx, 2, poll_s=0.5, worker_poll_s=0.2)
        side.join(timeout=180)
        assert box.get("restarted") is True, box
        assert result["worker_exit_codes"] == [0, 0], result
        logs = "".join(Path(f).read_text() for f in result["logs"])
        assert "database unreachable" in logs  # they did lose it
        ts = pg_trials(url, "restart")
        assert Counter(t.state for t in ts) == {TrialState.COMPLETE: 3}
        assert len({t.user_attrs["runs"][0] for t in ts}) == 3
        for t in ts:
            rd = RunDir(ctx.study_dir / t.user_attrs["runs"][0])
            assert rd.read_status()["attempt"] == 1 and set(steps_logged(rd).values()) == {1}

        # down for good: the worker gives up after its retry budget (3 s here) with a clear error
        p2 = spec(tmp_path, "down", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n"
                  "heartbeat: {interval: 1, grace: 2}\n")
        ctx2 = prepare_study(p2, root=tmp_path / "runs", storage=url)
        w = subprocess.Popen([sys.executable, "-m", "armorlab.tune.worker", str(ctx2.study_dir), "--poll", "0.1"],
                             env={**os.environ, **worker_env(ctx2), "ARMORLAB_DB_RETRY_S": "3"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: any((RunDir(d).last_step() or 0) >= 3 for d in ctx2.study_dir.iterdir()
                             if (d / "metrics.jsonl").is_file()), 120, "the trial to start")
        subprocess.run(stop, env=env, check=True, timeout=60)
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 3, out
        assert "was unreachable for" in out and "armorlab@127.0.0.1" in out and "armorlab:armorlab" not in out
        subprocess.run(start, env={**env, "ARMORLAB_PG_FRESH": "0"}, capture_output=True, check=True, timeout=120)
        time.sleep(2.5)  # past the grace: the dead worker's trial is stale
        assert run_local(ctx2, 1, poll_s=0.2, worker_poll_s=0.1)["worker_exit_codes"] == [0]
        ts = pg_trials(url, "down")
        states = Counter(t.state for t in ts)
        assert states == {TrialState.COMPLETE: 2, TrialState.FAIL: 1}, states
        retry = next(t for t in ts if "retry_of" in t.user_attrs)
        assert "no heartbeat" in retry.user_attrs["retry_reason"] and retry.user_attrs["retries"] == 1
    finally:
        subprocess.run(stop, env={**env, "ARMORLAB_PG_WIPE": "1"}, timeout=60)


# --------------------------------------------------------------------------- Slurm workers
@pytest.mark.postgres
@pytest.mark.slurm
def test_slurm_workers_on_postgres_survive_a_killed_worker(tmp_path, postgres_db, slurm_cluster):  # noqa: F811
    """`armorlab tune --executor slurm --workers 3` on the local cluster: one worker is SIGKILLed
    mid-trial; its heartbeat goes stale, the trial is failed and retried (a counted retry), the
    retry resumes the same run dir, and the study ends with exactly n_trials finished trials."""
    from armorlab.sweeps import slurmctl

    profile = tmp_path / "three.yaml"
    profile.write_text((REPO / "slurm" / "local.yaml").read_text().replace("array_parallelism: 2",
                                                                           "array_parallelism: 3"))
    p = spec(tmp_path, "pg_slurm", "space: {alpha: [0.5, 0.6, 0.7, 0.9]}\nsampler: {type: grid}\n"
             "heartbeat: {interval: 1, grace: 6}\n", base="{objective: armor, max_steps: 40, val_every: 5}")
    root = tmp_path / "runs"
    env = {"ARMORLAB_SYNTHETIC_STEP_S": "0.1", "SLURM_CONF": slurm_cluster}
    out = run_cli("tune", str(p), "--executor", "slurm", "--workers", "3", "--profile", str(profile),
                  "--root", str(root), "--storage", postgres_db, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    study_dir = root / "pg_slurm"
    jobs = json.loads((study_dir / ".tune" / "slurm_jobs.json").read_text())["jobs"]
    assert len(jobs) == 3

    def victim():
        for t in pg_trials(postgres_db, "pg_slurm"):
            if t.state == TrialState.RUNNING and t.user_attrs.get("runs") \
                    and (RunDir(study_dir / t.user_attrs["runs"][0]).last_step() or 0) >= 10:
                return t
        return None

    killed = wait_for(victim, 240, "a Slurm worker half-way through a trial")
    owner = killed.user_attrs["worker"]
    assert owner["host"] == socket.gethostname() and owner["job"] in jobs
    os.kill(owner["pid"], signal.SIGKILL)  # the Slurm task itself: no clean-up, no goodbye

    def ended():
        states = slurmctl.squeue_states(jobs)
        return not any(slurmctl.is_active(states.get(j)) for j in jobs)

    wait_for(ended, 300, "the worker jobs to end", interval=2)
    logs = "\n".join(f.read_text()[-2000:] for f in (study_dir / ".submitit").rglob("*.err"))
    ts = pg_trials(postgres_db, "pg_slurm")
    states = Counter(t.state for t in ts)
    assert states == {TrialState.COMPLETE: 4, TrialState.FAIL: 1}, (states, logs)
    dead = next(t for t in ts if t.number == killed.number)
    assert dead.state == TrialState.FAIL
    retry = next(t for t in ts if t.user_attrs.get("retry_of") == dead.number)
    assert retry.state == TrialState.COMPLETE and retry.params == dead.params
    assert retry.user_attrs["retries"] == 1 and "no heartbeat for over 6s" in retry.user_attrs["retry_reason"]
    assert retry.user_attrs["runs"] == dead.user_attrs["runs"]
    assert retry.user_attrs["worker"]["job"] != owner["job"]
    # every point once; every trial a run dir trained once, except the killed one: resumed in place
    complete = [t for t in ts if t.state == TrialState.COMPLETE]
    assert sorted(t.params["alpha"] for t in complete) == [0.5, 0.6, 0.7, 0.9]
    for t in complete:
        rd = RunDir(study_dir / t.user_attrs["runs"][0])
        status = rd.read_status()
        assert status["state"] == "completed"
        assert status["attempt"] == (2 if t is retry else 1)
        assert sorted(steps_logged(rd)) == list(range(41)) and set(steps_logged(rd).values()) == {1}


# --------------------------------------------------------------------------- dashboard
def test_optuna_dashboard_serves_a_finished_study(tmp_path):
    """The command `armorlab tune --status` prints, started on loopback, serves the study."""
    pytest.importorskip("optuna_dashboard")
    from armorlab.tune.study import prepare_study, run_local, study_status

    p = spec(tmp_path, "dash", "space: {alpha: [0.5, 0.7]}\nsampler: {type: grid}\n")
    ctx = prepare_study(p, root=tmp_path / "runs")
    run_local(ctx, 1, poll_s=0.2, worker_poll_s=0.1)
    cmd = shlex.split(study_status(ctx.study_dir)["dashboard"])
    assert cmd[0] == "optuna-dashboard" and cmd[1] == str((ctx.tune_dir / "journal.log").absolute())
    exe = Path(sys.executable).with_name("optuna-dashboard")
    port = free_port()
    proc = subprocess.Popen([str(exe), *cmd[1:], "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def get(path):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return json.loads(r.read())
            except OSError:
                assert proc.poll() is None, "optuna-dashboard exited"
                return None

        studies = wait_for(lambda: get("/api/studies"), 60, "optuna-dashboard to answer")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["dash"]
        detail = get(f"/api/studies/{studies[0]['study_id']}")
        assert len(detail["trials"]) == 2 and {t["state"] for t in detail["trials"]} == {"Complete"}
        assert sorted((p["name"], p["param_external_value"]) for t in detail["trials"] for p in t["params"]) \
            == [("alpha", "0.5"), ("alpha", "0.7")]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
