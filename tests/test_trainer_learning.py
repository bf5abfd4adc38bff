"""Learning is real: 120 steps of dapo, up and armor raise val/acc above the warm-started base model's."""

from __future__ import annotations

import pytest

from armorlab.core.config import load_config
from armorlab.core.runs import RunDir
from armorlab.train.launch import train_run_dir
from tests.trainer_support import model_cache


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["dapo", "up", "armor"])
def test_rl_raises_validation_accuracy(tmp_path, monkeypatch, objective):
    monkeypatch.setenv("ARMORLAB_CACHE", model_cache())
    # the shipped defaults (tiny model, 2-digit addition, 4 prompts × 8 samples per step)
    cfg = load_config(None, [f"objective={objective}", "max_steps=120", "val_every=40", "kl_probe_prompts=0",
                             "save_steps=100000"])
    run_dir = RunDir.create(tmp_path, cfg)
    assert train_run_dir(run_dir.path).exit_code == 0
    val = {row["step"]: row["val/acc"] for row in run_dir.read_metrics() if row.get("val/acc") is not None}
    assert sorted(val) == [0, 40, 80, 120]
    # two late evaluations (4 × 64 samples each) against the base model at step 0
    assert (val[80] + val[120]) / 2 > val[0] + 0.02, val
