"""Stored run ids do not change: configs and run dirs as armorlab 0.2.0 (main at e45e485) wrote them
give the same ids with this code. The ids were computed by that release's ``run_id(resolve(raw))``
and its ``RunDir.create``; none is copied from the code under test."""

from __future__ import annotations

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir, run_id

# raw config (as a user or a sweep point gives it) → the id 0.2.0 made of it
IDS = [
    ({}, "b17e074c5262"),
    ({"objective": "armor"}, "a52b59b99024"),
    ({"objective": "armor", "alpha": 0.8}, "72181cfaac27"),
    ({"objective": "dapo", "alpha": 0.7}, "b17e074c5262"),  # α is inert for dapo: one run
    ({"objective": "armor", "num_generations": 4, "seed": 3}, "09b0a90fc4f0"),
    ({"objective": "up"}, "2a8c798a5b6d"),
    ({"objective": "dapo", "anchor": True, "anchor_ratio": "mixed", "alpha": 0.7}, "3b8150f36220"),
    ({"objective": "grpo", "anchor": True}, "c04e2a70b2c4"),
]

# config.yaml of two run dirs as 0.2.0 wrote them (RunDir.create of resolve({}) and of resolve({"objective": "armor"}))
STORED = {
    "b17e074c5262": """\
advantage_estimator: group_mean
aggregation: null
alpha: null
anchor: false
anchor_filter: null
anchor_gate: false
anchor_ratio: null
anchor_reward_threshold: null
anchor_samples: null
beta: 0.0
dual_clip: null
dynamic_sampling: true
dynamic_sampling_factor: 1
epsilon: 0.2
epsilon_high: 0.28
gradient_accumulation_steps: 1
gradient_checkpointing: false
kl_estimator: null
kl_probe_prompts: 8
learning_rate: 5.0e-05
logging_steps: 1.0
lr_scheduler_type: constant
max_completion_length: 8
max_steps: 60
model:
  hidden_size: 128
  name: tiny
  num_heads: 4
  num_layers: 3
  warm_start_seed: 0
  warm_start_steps: 1000
  warm_start_target: 0.75
num_generations: 8
objective: dapo
per_device_train_batch_size: 32
quantile_k: null
ref_reset_schedule: null
ref_reset_steps: 0
save_steps: 20.0
save_total_limit: 2
seed: 0
steps_per_generation: 2
task:
  digits: 2
  name: arithmetic
  operands: 2
  operators: +
  split_seed: 0
  test_size: 64
  train_size: 256
  val_size: 64
temperature: 1.0
token_sample_rate: 0.0
val_every: 10
val_samples: 4
val_temperature: 1.0
warmup_steps: 0.0
""",
    "a52b59b99024": """\
advantage_estimator: group_mean
aggregation: null
alpha: 0.875
anchor: true
anchor_filter: correct
anchor_gate: true
anchor_ratio: mixed
anchor_reward_threshold: 1.0
anchor_samples: 4
beta: 0.0
dual_clip: null
dynamic_sampling: false
dynamic_sampling_factor: null
epsilon: 0.2
epsilon_high: 0.28
gradient_accumulation_steps: 1
gradient_checkpointing: false
kl_estimator: null
kl_probe_prompts: 8
learning_rate: 5.0e-05
logging_steps: 1.0
lr_scheduler_type: constant
max_completion_length: 8
max_steps: 60
model:
  hidden_size: 128
  name: tiny
  num_heads: 4
  num_layers: 3
  warm_start_seed: 0
  warm_start_steps: 1000
  warm_start_target: 0.75
num_generations: 8
objective: armor
per_device_train_batch_size: 32
quantile_k: null
ref_reset_schedule: null
ref_reset_steps: 160
save_steps: 20.0
save_total_limit: 2
seed: 0
steps_per_generation: 2
task:
  digits: 2
  name: arithmetic
  operands: 2
  operators: +
  split_seed: 0
  test_size: 64
  train_size: 256
  val_size: 64
temperature: 1.0
token_sample_rate: 0.0
val_every: 10
val_samples: 4
val_temperature: 1.0
warmup_steps: 0.0
""",
}


@pytest.mark.parametrize(("raw", "expected"), IDS, ids=[e for _, e in IDS])
def test_a_config_keeps_its_run_id(raw, expected):
    assert run_id(resolve(raw)) == expected


@pytest.mark.parametrize("stored_id", STORED)
def test_a_stored_run_dir_keeps_its_id_and_resumes(stored_id, tmp_path):
    old = tmp_path / stored_id
    old.mkdir()
    (old / "config.yaml").write_text(STORED[stored_id], encoding="utf-8")
    cfg = RunDir(old).read_config()
    assert run_id(cfg) == stored_id and run_id(resolve(cfg)) == stored_id
    # the same config given again finds the old dir (resumed, not a new run, not a hash-mismatch error)
    raw = {} if cfg["objective"] == "dapo" else {"objective": "armor"}
    assert RunDir.create(tmp_path, resolve(raw)).path == old
