"""`armorlab sweep --until-resolved` on the real one-node Slurm cluster, with the stand-in trainer:
after each look's array a decision job waits (afterany) on it, decides the look and queues the
next look and its own successor; a re-run resumes a chain whose decision job died; `armorlab
cancel` stops the decision job too. The stand-in's flat val/acc levels (tests/sweep_support.py VAL_LEVELS;
tests/test_sweep_until_resolved.py works the numbers out) resolve armor against dapo at the first look and up at the second."""

from __future__ import annotations

import json
import subprocess

import pytest
from sweep_support import (
    VAL_LEVELS,
    run_cli,
    slurm_cluster,  # noqa: F401 - a fixture
    standin_command,
    wait_finished,
    wait_for,
    write_spec,
)

from armorlab.sweeps import slurmctl
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.manifest import LOOKS, load_manifest

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())  # sbatch passes the environment to the jobs
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.2")
    monkeypatch.setenv("ARMORLAB_STANDIN_VAL_LEVELS", json.dumps(VAL_LEVELS))
    profile = tmp_path / "profile.yaml"
    profile.write_text("executor: slurm\ncpus_per_task: 1\ntime_min: 20\narray_parallelism: 2\n")
    spec = write_spec(tmp_path / "seq.yaml", {
        "name": "seq", "base": {"max_steps": 3, "val_every": 1, "save_steps": 3},
        "grid": {"objective": ["dapo", "armor", "up"]}, "seeds": [0, 1, 2],
        "compare": {"baseline": {"objective": "dapo"}, "delta": 0.05}})
    return spec, profile, tmp_path / "runs"


def _record(sweep_dir):
    return json.loads((sweep_dir / LOOKS).read_text())


def _decision(sweep_dir, look):
    jobs = [d for d in _record(sweep_dir)["chain"].get("decision_jobs", []) if d["look"] == look]
    return jobs[-1] if jobs else None


def _dependency(job_id: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%E", "-j", job_id], capture_output=True, text=True).stdout
    lines = [line.split("|", 1) for line in out.splitlines() if "|" in line]
    return lines[0][1] if lines else None


def test_each_look_is_decided_by_a_job_that_queues_the_next_and_a_rerun_resumes_a_dead_chain(setup):
    spec, profile, root = setup
    out = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile), "--until-resolved")
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "seq"
    manifest = load_manifest(sweep_dir)
    look1_arrays = sorted({slurmctl.base_id(manifest.last_job(r)) for r in manifest.runs})
    first = _decision(sweep_dir, 1)
    assert first is not None and first["after"] == look1_arrays and len(manifest.runs) == 9
    # queued at once with the look's arrays, it waits for them: squeue shows the dependency
    dep = _dependency(first["job_id"])
    assert dep is not None and dep.startswith(f"afterany:{look1_arrays[0]}"), dep
    assert f"decision job {first['job_id']}" in out.stdout

    # the first decision job decides look 1 and queues look 2 (dapo and up, seeds 3 and 4) and its successor
    second = wait_for(lambda: _decision(sweep_dir, 2), 600, "the first decision job to queue look 2")
    record = _record(sweep_dir)
    look = record["looks"][0]
    assert look["by"] == f"slurm job {first['job_id']}" and look["next"] == {"objective=up": 5, "objective=dapo": 5}
    assert {c["arm"]: c["verdict"] for c in look["comparisons"]} == {"objective=armor": "better",
                                                                      "objective=up": "continue"}
    manifest = load_manifest(sweep_dir)
    new = [r for r in manifest.runs[9:]]
    assert len(new) == 4 and {slurmctl.base_id(manifest.last_job(r)) for r in new} == set(second["after"])
    script = (sweep_dir / ".logs" / "decision-look2.sh").read_text()
    assert f"#SBATCH --dependency=afterany:{second['after'][0]}" in script
    dep = _dependency(second["job_id"])  # still waiting: look 2's runs take a few seconds each
    assert dep is None or dep.startswith(f"afterany:{second['after'][0]}"), dep

    # the second decision job dies before its look ends: the chain stops until the command runs again
    slurmctl.scancel([second["job_id"]])
    wait_finished(sweep_dir, 600)
    assert len(_record(sweep_dir)["looks"]) == 1
    again = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile), "--until-resolved")
    assert again.returncode == 0, again.stdout + again.stderr
    record = _record(sweep_dir)
    assert len(record["looks"]) == 2 and record["looks"][1]["done"] and record["looks"][1]["by"] == "armorlab sweep"
    last = {c["arm"]: c for c in record["looks"][1]["comparisons"]}
    assert last["objective=up"]["verdict"] == "better" and last["objective=up"]["n"] == [5, 5]
    assert "better at look 1, resolved with 3 seeds per arm" in again.stdout
    assert "better at look 2, resolved with 5 seeds per arm" in again.stdout
    assert len(load_manifest(sweep_dir).runs) == 13


def test_cancel_stops_the_decision_job_with_the_runs(setup):
    spec, profile, root = setup
    out = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile), "--until-resolved")
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "seq"
    job = _decision(sweep_dir, 1)["job_id"]
    cancelled = run_cli("cancel", str(sweep_dir))
    assert cancelled.returncode == 0 and job in cancelled.stdout.split(), cancelled.stdout
    wait_for(lambda: not slurmctl.is_active(slurmctl.squeue_states([job]).get(job)), 60, "the decision job to go")
    assert _record(sweep_dir)["looks"] == []
