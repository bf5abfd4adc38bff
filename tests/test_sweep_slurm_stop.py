"""stop_on_collapse on a real one-node Slurm cluster (slurm/local/start.sh): a collapsing sweep arm
stops, frees its job (COMPLETED, its step count short of the horizon), keeps its peak, and a rerun of
the sweep submits nothing for it. The stand-in trainer (tests/sweep_standin.py) gives the curve."""

from __future__ import annotations

import json

import pytest
from sweep_support import (
    run_cli,
    slurm_cluster,  # noqa: F401 - a fixture
    standin_command,
    wait_finished,
    wait_for,
    write_spec,
)

from armorlab.core.runs import RunDir
from armorlab.sweeps.jobs import ENV_COMMAND
from armorlab.sweeps.manifest import load_manifest
from armorlab.sweeps.status import collect

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# the curve of tests/test_stop_on_collapse.py: a peak at steps 4-8, a collapse from step 10
VAL_STEPS = [[0, 0.5], [2, 0.6], [4, 0.8], [10, 0.2]]


def test_a_collapsing_arm_stops_on_slurm_keeps_its_peak_and_is_not_resubmitted(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_COMMAND, standin_command())  # sbatch passes the environment to the jobs
    monkeypatch.setenv("ARMORLAB_STANDIN_STEP_S", "0.01")
    monkeypatch.setenv("ARMORLAB_STANDIN_VAL_STEPS", json.dumps(VAL_STEPS))
    profile = tmp_path / "profile.yaml"
    profile.write_text("executor: slurm\ncpus_per_task: 1\ntime_min: 20\narray_parallelism: 2\n")
    base = {"max_steps": 24, "val_every": 2, "save_steps": 2, "steps_per_generation": 2,
            "gradient_accumulation_steps": 1}
    spec = write_spec(tmp_path / "s.yaml", {"name": "s", "base": base,
                                            "grid": {"stop_on_collapse": [None, {"patience": 2}]}})
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile))
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "s"
    st = wait_finished(sweep_dir, 180)
    assert st.counts == {"completed": 1, "stopped": 1}
    row = next(r for r in st.rows if r.state == "stopped")
    wait_for(lambda: {r.slurm_state for r in collect(sweep_dir).rows} == {"COMPLETED"}, 30, "sacct")
    rd = RunDir(sweep_dir / row.run_id)
    status = rd.read_status()
    assert status["reason"] == "collapse at rollout 5, level fell 24.0 SE"
    assert rd.last_step() == 12 and row.max_steps == 24
    selected = rd.read_selected()
    assert (selected["step"], selected["value"]) == (6, pytest.approx(0.8))
    assert (rd.path / selected["checkpoint"]).is_dir()
    arrays = len(load_manifest(sweep_dir).submissions)
    again = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile))
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr
    assert len(load_manifest(sweep_dir).submissions) == arrays and rd.read_status() == status
