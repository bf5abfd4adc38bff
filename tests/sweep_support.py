"""Helpers shared by tests/test_sweep*.py: the stand-in trainer, the Slurm cluster fixture, waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

STANDIN = Path(__file__).with_name("sweep_standin.py")
# a stand-in for `armorlab vllm-serve`, and what a run config says to generate through servers
STANDIN_SERVER = [sys.executable, str(Path(__file__).with_name("vllm_server_standin.py"))]
SERVED = {"use_vllm": True, "vllm_mode": "server", "ref_vllm_mode": "server"}
REPO = Path(__file__).resolve().parents[1]
DEFAULT_SLURM_CONF = Path(os.environ.get("ARMORLAB_SLURM_DIR", "/tmp/armorlab-slurm")) / "etc" / "slurm.conf"


def standin_command() -> str:
    return json.dumps([sys.executable, str(STANDIN)])


def standin_metric(seed: int, step: int, salt: int) -> float:
    """The stand-in's metric formula, restated here so tests do not trust the script's output."""
    return ((seed * 7919 + step * 104729 + salt * 31) % 1000) / 1000.0


# flat val/acc levels of the stand-in (ARMORLAB_STANDIN_VAL_LEVELS) for tests of `--until-resolved`:
# armor is resolved against dapo at the first look (seeds 0-2), up at the second (seeds 0-4)
VAL_LEVELS = {"dapo": [0.5, 0.02], "armor": [0.9, 0.02], "up": [0.55, 0.02]}


def standin_val_level(seed: int, level: float, spread: float) -> float:
    """The stand-in's flat val/acc under ARMORLAB_STANDIN_VAL_LEVELS, restated."""
    return level + spread * (((seed * 7919 + 31) % 1000) / 1000.0 - 0.5)


def records(path: Path) -> list[dict]:
    """What the stand-in servers recorded in ``path`` ($STANDIN_SERVER_DIR), in start order."""
    found = [json.loads(p.read_text()) for p in path.glob("*.json")]
    return sorted(found, key=lambda r: r["pid"])


def by_port(path: Path) -> dict[int, dict]:
    return {int(r["argv"][r["argv"].index("--port") + 1]): r for r in records(path)}


def alive(pid: int) -> bool:
    """A live process (not a zombie left for its parent to reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "armorlab.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=timeout)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_finished(sweep_dir: Path, timeout: float):
    """Wait until no run of the sweep is queued or running and its Slurm jobs have ended too;
    returns the final SweepStatus."""
    from armorlab.sweeps import slurmctl
    from armorlab.sweeps.status import collect

    box = {}

    def done():
        box["st"] = st = collect(sweep_dir)
        return st.finished and not any(slurmctl.is_active(r.slurm_state) for r in st.rows)

    wait_for(done, timeout, f"sweep {sweep_dir} to finish", interval=1.0)
    return box["st"]


def preempt_after_first_step(sweep_dir: Path, timeout: float):
    """Send the sweep's first run what Slurm sends before a time limit (--signal=USR2@...: the
    checkpoint signal only) once it has trained a step, and wait for its requeued attempt to start.
    Returns the run's RunDir."""
    import submitit

    from armorlab.core.runs import RunDir
    from armorlab.sweeps.manifest import load_manifest

    run_id = load_manifest(sweep_dir).runs[0]
    rd = RunDir(sweep_dir / run_id)
    wait_for(lambda: (rd.last_step() or 0) >= 1, timeout, "the job to train a step")
    submitit.SlurmJob(folder=sweep_dir / ".submitit", job_id=load_manifest(sweep_dir).last_job(run_id)) \
        ._interrupt(timeout=True)

    def requeued() -> bool:
        status = rd.read_status()
        if status["attempt"] == 2:
            return True
        # the signal came too late (the run trained its last step first): nothing will requeue,
        # so say so now instead of waiting out the timeout
        assert status["state"] not in ("completed", "failed"), \
            f"run {run_id} ended ({status}) before the checkpoint signal reached it: give it more steps"
        return False

    wait_for(requeued, timeout, "the requeued job to start")
    return rd


def standin_servers(tmp_path: Path, monkeypatch, step_s: float) -> tuple[Path, Path]:
    """Point jobs at the stand-in trainer and stand-in vLLM servers (which record themselves in
    ``tmp_path/servers``), with a model dir the stand-in trainer accepts; returns (record dir, model dir)."""
    from armorlab.sweeps.jobs import ENV_COMMAND

    records_dir, model = tmp_path / "servers", tmp_path / "model"
    records_dir.mkdir()
    model.mkdir()
    (model / "standin-model").touch()
    monkeypatch.setenv(ENV_COMMAND, json.dumps([sys.executable, str(STANDIN)]))
    monkeypatch.setenv("STANDIN_SERVER_DIR", str(records_dir))
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", str(step_s))
    return records_dir, model


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local cluster of slurm/local/start.sh. Skips when unreachable, unless
    ARMORLAB_REQUIRE_SLURM=1 (set by .ci/run), where an unreachable cluster fails the test."""
    from armorlab.sweeps import slurmctl

    if not os.environ.get("SLURM_CONF") and DEFAULT_SLURM_CONF.is_file():
        os.environ["SLURM_CONF"] = str(DEFAULT_SLURM_CONF)
    if not slurmctl.reachable():
        msg = "no Slurm cluster reachable (start one with: eval \"$(slurm/local/start.sh)\")"
        if os.environ.get("ARMORLAB_REQUIRE_SLURM") == "1":
            pytest.fail(msg + " but ARMORLAB_REQUIRE_SLURM=1")
        pytest.skip(msg)
    return os.environ["SLURM_CONF"]
