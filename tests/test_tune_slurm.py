"""A study whose workers are a Slurm job array, on the real local cluster (slurm/local/start.sh)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sweep_support import REPO, run_cli, slurm_cluster  # noqa: F401 (fixture)
from tune_support import standin_env

pytestmark = pytest.mark.slurm


def test_four_trial_study_with_two_array_workers(tmp_path, slurm_cluster, monkeypatch):  # noqa: F811
    from optuna.trial import TrialState

    from armorlab.core.runs import RunDir
    from armorlab.tune.study import load_study

    spec = tmp_path / "slurm_study.yaml"
    spec.write_text(
        "name: slurm_study\n"
        "base: {objective: armor, max_steps: 30, val_every: 5, learning_rate: 1.0e-4}\n"
        "seeds: [0]\n"
        "search:\n"
        "  space: {alpha: {type: categorical, choices: [0.5, 0.6, 0.7, 0.9]}}\n"
        "  sampler: {type: grid}\n"
        "  n_trials: 4\n")
    env = {**standin_env(step_s=0.05), "SLURM_CONF": slurm_cluster}
    root = tmp_path / "runs"
    out = run_cli("tune", str(spec), "--executor", "slurm", "--workers", "2", "--profile",
                  str(REPO / "slurm" / "local.yaml"), "--root", str(root), "--wait", env=env, timeout=600)
    study_dir = root / "slurm_study"
    logs = "\n".join(p.read_text()[-3000:] for p in (study_dir / ".submitit").rglob("*.out")) \
        if (study_dir / ".submitit").exists() else ""
    assert out.returncode == 0, out.stdout + out.stderr + logs
    assert "4/4 finished" in out.stdout

    _, study = load_study(study_dir)
    ts = study.get_trials(deepcopy=False)
    assert len(ts) == 4 and all(t.state == TrialState.COMPLETE for t in ts)
    # the trials ran in the two array tasks of one job, each trial in exactly one of them
    jobs = Counter(t.user_attrs["worker"]["job"] for t in ts)
    array_ids = {j.split("_")[0] for j in jobs}
    assert len(array_ids) == 1 and all("_" in j for j in jobs)
    assert set(jobs) <= {f"{next(iter(array_ids))}_0", f"{next(iter(array_ids))}_1"}
    assert len({t.user_attrs["runs"][0] for t in ts}) == 4
    for t in ts:
        rd = RunDir(study_dir / t.user_attrs["runs"][0])
        st = rd.read_status()
        assert st["state"] == "completed" and st["attempt"] == 1
        assert st["job_id"] == t.user_attrs["worker"]["job"]  # the trainer ran inside the worker's job
    best = max(ts, key=lambda t: t.values[0])
    assert best.params == {"alpha": 0.7}  # the stand-in's optimum
    assert Path(study_dir / ".tune" / "slurm_jobs.json").is_file()
