"""A profile's ``vllm_servers``: the section's checks, the GPU split, the runs' consistency, the dry
run, and a job's servers for real on this machine (stand-in servers, tests/vllm_server_standin.py).
The same jobs through the local Slurm cluster: tests/test_sweep_slurm_vllm.py."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest
import yaml
from sweep_support import SERVED, STANDIN_SERVER, alive, by_port, records, standin_servers

from armorlab.core.exits import EXIT_FAILED, EXIT_PREEMPTED
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.sweeps.jobs import TrainJob
from armorlab.sweeps.profile import load_profile, parse_profile
from armorlab.vllm.endpoints import ENV as ENDPOINTS_ENV
from armorlab.vllm.endpoints import read_endpoints
from armorlab.vllm.server_checks import check_runs
from armorlab.vllm.servers import ServerError, split_devices, visible_devices

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def profile(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error(data: dict, tmp_path: Path) -> ArmorLabError:
    path = profile(tmp_path, yaml.safe_dump(data), "bad.yaml")
    with pytest.raises(ArmorLabError) as exc:
        load_profile(path)
    assert str(path) in str(exc.value)
    return exc.value


# --------------------------------------------------------------------------- the profile section
def test_shipped_vllm_profiles_split_the_node():
    gpu = load_profile(REPO / "slurm" / "gpu-8x-vllm.yaml")
    assert gpu.vllm_servers.roles() == ("policy", "ref")
    split, rest = split_devices(gpu.vllm_servers, visible_devices({}, gpu.gpus_per_node))
    assert split == {"policy": ["0"], "ref": ["1"]} and rest == ["2", "3", "4", "5", "6", "7"]
    assert yaml.safe_load(Path(gpu.accelerate_config).read_text())["num_processes"] == 6
    cpu = load_profile(REPO / "slurm" / "local-vllm.yaml")
    assert [s.gpus for s in cpu.vllm_servers.servers] == [0, 0] and cpu.gpus_per_node == 0
    assert cpu.vllm_servers.servers[0].args == ("--dtype", "float32")  # the CPU trainer's


@pytest.mark.parametrize("section, key, value, words", [
    ({"policy": {"gpus": 2}, "ref": {"gpus": 2}}, "vllm_servers.ref.gpus", 2, "ask for 4 GPU(s) (policy 2 + ref 2)"),
    ({"policy": {"gpus": 4}}, "vllm_servers.policy.gpus", 4, "the trainer needs at least one"),
    ({"policy": {"gpus": 1, "port": 80}}, "vllm_servers.policy.port", 80, "≥ 1024"),
    ({"policy": {"gpus": 1, "port": "any"}}, "vllm_servers.policy.port", "any", "(or auto)"),
    ({"policy": {"gpus": 1, "args": ["--port", "9"]}}, "vllm_servers.policy.args", ["--port", "9"], "set by the job"),
    ({"policy": {"gpus": 1, "args": "--host=0.0.0.0"}}, "vllm_servers.policy.args", "--host=0.0.0.0", "set by the job"),
    ({"ref": {"env": {"CUDA_VISIBLE_DEVICES": "0"}}}, "vllm_servers.ref.env", {"CUDA_VISIBLE_DEVICES": "0"},
     "set by the job"),
    ({"ref": {"gpus": 1, "startup_timeout_s": 0}}, "vllm_servers.ref.startup_timeout_s", 0, "> 0"),
    ({"reference": {}}, "vllm_servers.reference", {}, "known: command, policy, ref"),
    ({"policy": {"gpu": 1}}, "vllm_servers.policy.gpu", 1, "unknown key"),
    ({"command": "serve 'x"}, "vllm_servers.command", "serve 'x", "not a command line"),
    ({"command": []}, "vllm_servers.command", [], "list of argv words"),
    ({"policy": {"gpus": 1, "port": 9000}, "ref": {"gpus": 1, "port": 9000}}, "vllm_servers.ref.port", 9000,
     "different ports"),
    ({"policy": {"gpus": 1}, "nodes": 2}, "nodes", 2, "runs on one node"),
])
def test_section_errors_name_key_value_and_file(tmp_path, section, key, value, words):
    section = dict(section)
    nodes = {"nodes": section.pop("nodes")} if "nodes" in section else {}
    exc = error({"gpus_per_node": 4, **nodes, "vllm_servers": section}, tmp_path)
    assert (exc.key, exc.value) == (key, value) and words in str(exc)


def test_gpus_on_a_cpu_profile_and_the_accelerate_process_count(tmp_path):
    exc = error({"vllm_servers": {"policy": {"gpus": 1}}}, tmp_path)  # gpus_per_node defaults to 0
    assert exc.key == "vllm_servers.policy.gpus" and "gpus_per_node: 0" in str(exc)
    acc = tmp_path / "acc.yaml"
    acc.write_text("num_processes: 8\n")
    exc = error({"gpus_per_node": 8, "launcher": "accelerate", "accelerate_config": str(acc),
                 "vllm_servers": {"policy": {"gpus": 1}, "ref": {"gpus": 1}}}, tmp_path)
    assert (exc.key, exc.value, exc.file) == ("accelerate_config: num_processes", 8, str(acc))
    assert "the trainer gets 6 GPU(s)" in str(exc)
    acc.write_text("num_processes: 6\n")
    prof = parse_profile({"gpus_per_node": 8, "launcher": "accelerate", "accelerate_config": str(acc),
                          "vllm_servers": {"policy": {"gpus": 1}, "ref": {"gpus": 1}}})
    assert prof.launch_options()["vllm_servers"] is prof.vllm_servers


def test_devices_are_split_from_the_jobs_own():
    prof = parse_profile({"gpus_per_node": 4, "vllm_servers": {"ref": {"gpus": 2}, "policy": {"gpus": 1}}})
    # Slurm hands a job its GPUs as CUDA_VISIBLE_DEVICES; servers first, policy before ref
    devices = visible_devices({"CUDA_VISIBLE_DEVICES": "3,5,6,7"}, 4)
    assert split_devices(prof.vllm_servers, devices) == ({"policy": ["3"], "ref": ["5", "6"]}, ["7"])
    with pytest.raises(ServerError, match="sees 3 GPU"):
        split_devices(prof.vllm_servers, ["0", "1", "2"])


def test_runs_must_use_exactly_the_servers_the_profile_starts(tmp_path):
    both = parse_profile({"gpus_per_node": 3, "vllm_servers": {"policy": {"gpus": 1}, "ref": {"gpus": 1}}}).vllm_servers
    check_runs(both, [SERVED], profile_file="p.yaml", spec_file="s.yaml")
    with pytest.raises(ArmorLabError) as exc:
        check_runs(both, [{"use_vllm": True, "ref_vllm_mode": "server"}], profile_file="p.yaml", spec_file="s.yaml")
    assert (exc.value.key, exc.value.file) == ("vllm_servers.policy", "p.yaml")  # colocate: the server would idle
    with pytest.raises(ArmorLabError) as exc:
        check_runs(None, [SERVED], profile_file="p.yaml", spec_file="s.yaml")
    assert (exc.value.key, exc.value.value, exc.value.file) == ("vllm_mode", "server", "s.yaml")
    assert "does not start" in str(exc.value)
    # on the local executor: a server the user started here, at TRL's default address
    check_runs(None, [SERVED], profile_file="p.yaml", spec_file="s.yaml", executor="local")
    # defaults in a resolved config are not "where it listens"
    with pytest.raises(ArmorLabError, match="does not start"):
        check_runs(None, [{**SERVED, "vllm_server_host": "0.0.0.0", "vllm_server_port": 8000}],
                   profile_file="p.yaml", spec_file="s.yaml")
    check_runs(both, [{**SERVED, "vllm_server_host": "0.0.0.0", "vllm_server_base_url": None}],
               profile_file="p.yaml", spec_file="s.yaml")
    with pytest.raises(ArmorLabError) as exc:  # the job sets where its server listens
        check_runs(both, [{**SERVED, "ref_vllm_server_port": 8101}], profile_file="p.yaml", spec_file="s.yaml")
    assert (exc.value.key, exc.value.value) == ("ref_vllm_server_port", 8101)  # 8001 is the key's default
    # a run that names its own server needs none from the profile
    check_runs(None, [{**SERVED, "vllm_server_host": "10.0.0.5", "ref_vllm_server_host": "10.0.0.6"}],
               profile_file="p.yaml", spec_file="s.yaml")


def test_endpoints_reach_the_trainer_as_config_keys_only():
    env = {ENDPOINTS_ENV: json.dumps({"vllm_server_host": "127.0.0.1", "vllm_server_port": 41000})}
    assert read_endpoints(env) == {"vllm_server_host": "127.0.0.1", "vllm_server_port": 41000}
    assert read_endpoints({}) == {}
    for bad, key in (({"learning_rate": 1.0}, "learning_rate"), ({"vllm_server_port": 0}, "vllm_server_port"),
                     ({"ref_vllm_server_host": 5}, "ref_vllm_server_host")):
        with pytest.raises(ArmorLabError) as exc:
            read_endpoints({ENDPOINTS_ENV: json.dumps(bad)})
        assert exc.value.key == f"{ENDPOINTS_ENV}.{key}"


def test_tune_refuses_a_profile_with_servers(tmp_path):
    prof = load_profile(REPO / "slurm" / "local-vllm.yaml")
    with pytest.raises(ArmorLabError) as exc:
        prof.refuse_vllm_servers("armorlab tune")
    assert exc.value.key == "vllm_servers" and exc.value.file.endswith("local-vllm.yaml")


def test_dry_run_shows_the_server_and_trainer_commands(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from armorlab import cli
    from armorlab.sweeps import submit

    # server mode itself is the trainer's to accept; this checks what a job would run
    monkeypatch.setattr(submit, "check_runs", lambda *a, **k: None)
    prof = profile(tmp_path, "executor: local\ngpus_per_node: 4\nvllm_servers:\n  command: serve-it --fast\n"
                   "  policy: {gpus: 1, args: [--max-model-len, '64']}\n  ref: {gpus: 2, port: 9100}\n")
    spec = profile(tmp_path, yaml.safe_dump({"name": "d", "base": {"max_steps": 2}}), "spec.yaml")
    out = CliRunner().invoke(cli.app, ["sweep", str(spec), "--profile", str(prof), "--root", str(tmp_path / "r"),
                                       "--dry-run"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert ("CUDA_VISIBLE_DEVICES=0 serve-it --fast --model '<run'\"'\"'s model>' --port '<free port>' --host "
            "127.0.0.1 --max-model-len 64 \\") in lines
    assert "CUDA_VISIBLE_DEVICES=1,2 serve-it --fast --model '<run'\"'\"'s model>' --port 9100 --host 127.0.0.1 \\" in lines
    trainer = next(ln for ln in lines if ln.startswith("CUDA_VISIBLE_DEVICES=3 "))
    assert "ref_vllm_server_port=9100" in trainer and "vllm_server_port=<its port>" in trainer
    assert trainer.endswith("-m armorlab.cli train --run-dir '<run dir>'")
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- a job's servers, for real
@pytest.fixture
def job_env(tmp_path, monkeypatch):
    """Stand-in trainer and servers; returns (record dir, model dir)."""
    return standin_servers(tmp_path, monkeypatch, step_s=0.01)


def servers_profile(tmp_path, gpus_per_node=0, **roles):
    return parse_profile({"gpus_per_node": gpus_per_node, "vllm_servers": {"command": STANDIN_SERVER, **roles}},
                         path=tmp_path / "p.yaml")


def run_dir(tmp_path, model, **cfg):
    return RunDir.create(tmp_path / "runs", {"model": {"name": str(model)}, "seed": 0, "max_steps": 3,
                                             "val_every": 1, **SERVED, **cfg})


def test_job_splits_gpus_and_hands_ports_to_the_trainer(tmp_path, job_env, monkeypatch):
    rec, model = job_env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")  # what Slurm gives a job on a shared node
    prof = servers_profile(tmp_path, 4, policy={"gpus": 1, "args": ["--max-model-len", "64"]},
                           ref={"gpus": 2, "env": {"STANDIN_SERVER_MODE": "ready-after:0.5"}})
    rd = run_dir(tmp_path, model)
    outcome = TrainJob(rd.path, **prof.launch_options()).run()
    assert (outcome.returncode, outcome.state) == (0, "completed"), outcome
    seen = json.loads((rd.path / "standin_trainer.json").read_text())
    ports = {"policy": seen["endpoints"]["vllm_server_port"], "ref": seen["endpoints"]["ref_vllm_server_port"]}
    assert seen["endpoints"]["vllm_server_host"] == seen["endpoints"]["ref_vllm_server_host"] == "127.0.0.1"
    assert seen["cuda"] == "7" and all(seen["answering"].values())  # both answered before the trainer began
    servers = by_port(rec)
    assert set(servers) == set(ports.values()) and ports["policy"] != ports["ref"]
    pol, ref = servers[ports["policy"]], servers[ports["ref"]]
    assert pol["argv"] == ["--model", str(model), "--port", str(ports["policy"]), "--host", "127.0.0.1",
                           "--max-model-len", "64"]
    assert (pol["cuda"], ref["cuda"]) == ("3", "5,6") and pol["endpoints_env"] is None
    for s in (pol, ref):
        assert s["sigterm_blocked"] and s["usr2_ignored"] and s["stopped"] == "SIGINT" and not alive(s["pid"])
    written = json.loads((rd.path / "vllm" / "servers.json").read_text())
    assert written["servers"]["ref"]["port"] == ports["ref"] and written["trainer_cuda_visible_devices"] == "7"
    assert "stand-in server for" in (rd.path / "vllm" / "policy.log").read_text()


def test_a_job_started_with_sigint_ignored_still_stops_its_servers_with_it(tmp_path, job_env):
    # a background job of a non-interactive shell (`nohup armorlab sweep ... &`, a CI runner) starts
    # with SIGINT ignored; inherited, the servers would sit out the grace period until SIGKILL
    rec, model = job_env
    prof = servers_profile(tmp_path, policy={"gpus": 0})
    rd = run_dir(tmp_path, model, ref_vllm_mode="none")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        outcome = TrainJob(rd.path, **prof.launch_options()).run()
    finally:
        signal.signal(signal.SIGINT, before)
    assert (outcome.returncode, outcome.state) == (0, "completed"), outcome
    (server,) = records(rec)
    assert server["stopped"] == "SIGINT" and not alive(server["pid"])  # not the SIGKILL after the grace period


@pytest.mark.parametrize("mode, timeout, words", [
    ("fail", 60, "vLLM ref server exited with exit code 3 before it was ready; its last line: ValueError: cannot "
                 "load the model (stand-in failure)"),
    ("hang", 1.5, "vLLM ref server was not ready after 1.5 s (GET http://127.0.0.1:"),
])
def test_a_server_that_never_answers_fails_the_run_with_its_log(tmp_path, job_env, mode, timeout, words):
    rec, model = job_env
    prof = servers_profile(tmp_path, policy={"gpus": 0},
                           ref={"gpus": 0, "startup_timeout_s": timeout, "env": {"STANDIN_SERVER_MODE": mode}})
    rd = run_dir(tmp_path, model)
    outcome = TrainJob(rd.path, **prof.launch_options()).run()
    assert (outcome.returncode, outcome.state) == (EXIT_FAILED, "failed")
    assert words in outcome.reason and f"log: {rd.path / 'vllm' / 'ref.log'}" in outcome.reason
    assert rd.read_status()["reason"] == outcome.reason
    assert not (rd.path / "standin_trainer.json").exists()  # never trained without its servers
    assert len(records(rec)) == 2 and not any(alive(s["pid"]) for s in records(rec))


def test_a_server_dying_under_the_trainer_fails_the_run(tmp_path, job_env, monkeypatch):
    rec, model = job_env
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.05")
    monkeypatch.setenv("ARMORLAB_STANDIN_HOLD_AT", "2")  # parked until stopped: only the death ends it
    prof = servers_profile(tmp_path, policy={"gpus": 0, "env": {"STANDIN_SERVER_MODE": "die-after:1.5"}})
    rd = run_dir(tmp_path, model, max_steps=50, ref_vllm_mode="none")
    outcome = TrainJob(rd.path, **prof.launch_options()).run()
    assert (outcome.returncode, outcome.state) == (EXIT_FAILED, "failed")
    assert outcome.reason.startswith("vLLM policy server exited with exit code 1 while the trainer ran; its last "
                                     "line: RuntimeError: engine core died")
    assert (rd.last_step() or 0) >= 2  # it trained, then was stopped (it checkpointed first)
    assert len(records(rec)) == 1 and not any(alive(s["pid"]) for s in records(rec))


def test_a_stop_while_servers_start_leaves_the_run_pending(tmp_path, job_env):
    rec, model = job_env
    prof = servers_profile(tmp_path, policy={"gpus": 0, "env": {"STANDIN_SERVER_MODE": "ready-after:60"}})
    rd = run_dir(tmp_path, model, ref_vllm_mode="none")
    job = TrainJob(rd.path, **prof.launch_options())
    box = {}
    thread = threading.Thread(target=lambda: box.update(outcome=job.run()))
    thread.start()
    deadline = time.monotonic() + 30
    while not records(rec) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.interrupt(signal.SIGTERM)  # Ctrl-C of a local sweep, while the server loads
    thread.join(30)
    outcome = box["outcome"]
    assert (outcome.returncode, outcome.state) == (EXIT_PREEMPTED, "pending")
    assert outcome.reason == "preempted while its vLLM servers started"
    (server,) = records(rec)
    assert server["stopped"] == "SIGINT" and not alive(server["pid"])
    assert not (rd.path / "standin_trainer.json").exists()


def test_the_trainer_reads_the_jobs_endpoints_before_anything_else(tmp_path, monkeypatch):
    from armorlab.train.launch import train_run_dir

    rd = RunDir.create(tmp_path / "runs", {"max_steps": 1})
    monkeypatch.setenv(ENDPOINTS_ENV, json.dumps({"learning_rate": 1.0}))  # only host/port keys may come this way
    with pytest.raises(ArmorLabError) as exc:
        train_run_dir(rd.path)
    assert exc.value.key == f"{ENDPOINTS_ENV}.learning_rate"
    assert rd.read_status()["state"] == "failed" and ENDPOINTS_ENV in rd.read_status()["reason"]
