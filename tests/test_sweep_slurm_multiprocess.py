"""A sweep on the local Slurm cluster whose runs each train in 2 processes (the shipped
slurm/local-2proc.yaml: ``launcher: accelerate``), one of them preempted and requeued.

Skipped without a cluster, like tests/test_sweep_slurm.py (which this reuses).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_support import preempt_after_first_step, run_cli, slurm_cluster, wait_finished, write_spec  # noqa: F401 - fixture

from armorlab.core.runs import RunDir

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

PROFILE = Path(__file__).resolve().parents[1] / "slurm" / "local-2proc.yaml"
# 8 steps: with 4, a run on a busy machine could train its last step before the checkpoint signal
# sent after its first step reached both processes (then nothing is requeued)
TINY = {"max_steps": 8, "val_every": 2, "save_steps": 100, "val_samples": 2, "kl_probe_prompts": 0,
        "objective": "armor", "ref_reset_steps": 2, "per_device_train_batch_size": 6, "num_generations": 4,
        "steps_per_generation": 1,
        "task": {"name": "arithmetic", "digits": 1, "train_size": 32, "val_size": 8, "test_size": 8},
        "model": {"name": "tiny", "hidden_size": 64, "num_layers": 1, "num_heads": 2, "warm_start_steps": 30}}


def test_two_process_job_is_preempted_requeued_and_ends_like_an_uninterrupted_one(tmp_path):
    root = tmp_path / "runs"
    cache = str(tmp_path / "cache")
    for name in ("interrupted", "reference"):
        out = run_cli("sweep", str(write_spec(tmp_path / f"{name}.yaml", {"name": name, "base": TINY})),
                      "--root", str(root), "--profile", str(PROFILE), env={"ARMORLAB_CACHE": cache})
        assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "interrupted"
    # the job forwards the checkpoint signal's stop to the accelerate launcher, which passes it to both trainers
    rd = preempt_after_first_step(sweep_dir, 900)
    run_id = rd.path.name
    wait_finished(sweep_dir, 900)
    wait_finished(root / "reference", 900)
    status = rd.read_status()
    assert (status["state"], status["attempt"], status["world_size"]) == ("completed", 2, 2), status
    ref = RunDir(root / "reference" / run_id)
    assert ref.read_status()["world_size"] == 2
    got, want = rd.read_metrics(), ref.read_metrics()
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(TINY["max_steps"] + 1))
    for g, w in zip(got, want, strict=True):
        keys = [k for k in ("train/reward", "train/loss", "obj/policy_loss", "val/acc", "ref/resets",
                            "anchor/rate", "kl/reverse_k3") if w.get(k) is not None]
        assert {k: g[k] for k in keys} == pytest.approx({k: w[k] for k in keys}, rel=1e-5, abs=1e-6)
    st = run_cli("status", str(sweep_dir), env={"COLUMNS": "220"})
    assert st.returncode == 0 and "completed" in st.stdout
