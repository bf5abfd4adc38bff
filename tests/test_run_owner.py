"""One owner per run dir (issue 13 §2): the training process holds the run dir's lock for its
life; a second trainer exits 73 without touching it; status tells a live run from a dead one;
local trainers die with their sweep (they checkpoint) unless ``--detach``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from sweep_support import run_cli, standin_command, standin_metric, wait_for, write_spec

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.status import collect
from armorlab.sweeps.submit import ACTIVE, plan_sweep

HOLD = ("import sys, time; from armorlab.core.runs import RunDir; fd = RunDir(sys.argv[1]).acquire_owner(); "
        "print('held' if fd is not None else 'busy', flush=True); time.sleep(120)")


def _holder(path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_has_one_owner_and_dies_with_it(tmp_path):
    rd = RunDir.create(tmp_path, resolve({}))
    assert rd.owner() is None
    proc = _holder(rd.path)
    try:
        owner = rd.owner()
        assert owner is not None and owner["pid"] == proc.pid
        assert rd.acquire_owner(wait_s=0.2) is None  # a second owner is refused
    finally:
        proc.kill()  # kill -9: no cleanup runs, the kernel drops the lock with the process
        proc.wait()
    assert rd.owner() is None
    fd = rd.acquire_owner(wait_s=0.2)
    assert fd is not None
    os.close(fd)


def test_a_second_trainer_exits_73_and_touches_nothing(tmp_path):
    rd = RunDir.create(tmp_path, resolve({"max_steps": 2}))
    rd.write_status("running", job_id="first")
    before = rd.status_path.read_bytes()
    proc = _holder(rd.path)
    try:
        out = run_cli("train", "--run-dir", str(rd.path), timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 73, out.stderr
    assert f"owned by PID {proc.pid} on" in out.stderr
    assert rd.status_path.read_bytes() == before and not rd.metrics_path.exists()


def test_status_tells_a_live_run_from_a_dead_one(tmp_path):
    cfg = resolve({"max_steps": 5})
    live, dead = (RunDir.create(tmp_path / "sw", {**cfg, "seed": s}) for s in (0, 1))
    for rd in (live, dead):
        rd.write_status("running")  # no job recorded: e.g. `armorlab train --run-dir` by hand
    proc = _holder(live.path)
    try:
        states = {r.run_id: r.state for r in collect(tmp_path / "sw").rows}
    finally:
        proc.kill()
        proc.wait()
    assert states == {live.id: "running", dead.id: "lost"}  # killed runs no longer "running" forever


def _slow_spec(tmp_path, name):
    return write_spec(tmp_path / f"{name}.yaml", {"name": name, "base": {"max_steps": 30, "val_every": 5,
                                                                          "save_steps": 100},
                                                  "seeds": [3]})


def _start_sweep(spec, root, *extra, hold_at=-1):
    env = {**os.environ, "ARMORLAB_STANDIN_STEP_S": "0.1", "ARMORLAB_STANDIN_HOLD_AT": str(hold_at)}
    return subprocess.Popen([sys.executable, "-m", "armorlab.cli", "sweep", str(spec), "--root", str(root),
                             "-w", "1", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _check_metrics(rd, seed=3):
    rows = rd.read_metrics()
    assert [r["step"] for r in rows] == list(range(31))  # no step lost, none twice
    assert [r["train/reward"] for r in rows[1:]] == [standin_metric(seed, s, 0) for s in range(1, 31)]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP])
def test_local_trainers_die_with_their_sweep_and_a_rerun_trains_once(tmp_path, monkeypatch, how):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    spec, root = _slow_spec(tmp_path, "die"), tmp_path / "runs"
    rd = RunDir(root / "die" / plan_sweep(spec, root=root).runs[0].run_id)
    sweep = _start_sweep(spec, root, hold_at=3)  # the run parks at step 3 until its stop signal
    try:
        wait_for(lambda: (rd.last_step() or 0) >= 3, 60, "the run to reach step 3")
        sweep.send_signal(how)  # kill -9 of the sweep, or its ssh session closing
        sweep.wait(timeout=60)
        wait_for(lambda: rd.owner() is None, 60, "the trainer to checkpoint and exit")
    finally:
        if sweep.poll() is None:
            sweep.kill()
    status = rd.read_status()
    assert status["state"] == "pending" and status["reason"] == "preempted at step 3", status
    out = run_cli("sweep", str(spec), "--root", str(root), env={"ARMORLAB_STANDIN_STEP_S": "0.005"})
    assert out.returncode == 0, out.stderr
    assert rd.read_status()["state"] == "completed" and rd.read_status()["attempt"] == 2
    _check_metrics(rd)


def test_detached_trainers_outlive_their_sweep_and_are_never_doubled(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())
    spec, root = _slow_spec(tmp_path, "det"), tmp_path / "runs"
    rd = RunDir(root / "det" / plan_sweep(spec, root=root).runs[0].run_id)
    sweep = _start_sweep(spec, root, "--detach")
    try:
        wait_for(lambda: (rd.last_step() or 0) >= 3, 60, "the run to reach step 3")
        sweep.kill()
        sweep.wait(timeout=60)
        orphan = rd.owner()
        assert orphan is not None and orphan["pid"] != sweep.pid  # the orphan trains on
        assert collect(root / "det").rows[0].state == "running"
        assert plan_sweep(spec, root=root).actions[rd.id] == ACTIVE  # a re-run starts no second trainer
        out = run_cli("sweep", str(spec), "--root", str(root))
        assert out.returncode == 0 and "nothing to run" in out.stderr, out.stderr
        wait_for(lambda: rd.read_status()["state"] == "completed", 120, "the orphan to finish")
    finally:
        if sweep.poll() is None:
            sweep.kill()
        left = rd.owner()
        if left is not None:
            os.kill(left["pid"], signal.SIGKILL)
    assert rd.read_status()["attempt"] == 1  # trained once, by one process
    _check_metrics(rd)
    assert json.loads(rd.owner_path.read_text())["pid"] == orphan["pid"]
