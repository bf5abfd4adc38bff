"""The training process contract (C3): run dir, status, exit codes, resume, preemption, stop, NaN."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError
from armorlab.train.launch import (
    EXIT_FAILED,
    EXIT_PREEMPTED,
    complete_checkpoint,
    job_id_from_env,
    make_args,
    read_stop_request,
    train_run_dir,
)
from tests.trainer_support import model_cache, resolved

# names design.md promises (analysis reads them)
TRAIN_EVERY_STEP = ("train/reward", "train/length", "train/entropy", "train/truncated", "train/loss",
                    "obj/clip_frac", "obj/approx_kl", "obj/ratio_mean", "kl/reverse_k1", "kl/reverse_k2",
                    "kl/reverse_k3", "cap/pos_mean", "cap/pos_bound_frac", "cap/neg_mean", "anchor/rate",
                    "anchor/gate_drop", "anchor/ref_samples", "ref/resets")
VALIDATION = ("val/acc", "val/pass@k", "val/length", "test/acc", "test/pass@k", "test/length",
              "kl/exact_reverse", "kl/exact_forward")


@pytest.fixture(autouse=True)
def _cache(monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", model_cache())
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "ARMORLAB_JOB_ID"):
        monkeypatch.delenv(var, raising=False)


def _metrics_without_timing(run_dir):
    return [{k: v for k, v in row.items() if "time" not in k and "per_second" not in k}
            for row in run_dir.read_metrics()]


class At(TrainerCallback):
    """Run ``action(trainer_state)`` at the end of one optimizer step."""

    def __init__(self, step, action):
        self.step, self.action = step, action

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.action(kwargs)


# --------------------------------------------------------------------------- a whole run
def test_run_dir_status_metrics_tokens_and_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "812")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    cfg = resolved(objective="armor", max_steps=4, val_every=2, kl_probe_prompts=2, save_steps=2,
                   token_sample_rate=0.5)
    rd = RunDir.create(tmp_path, cfg)
    outcome = train_run_dir(rd.path)
    assert (outcome.state, outcome.exit_code) == ("completed", 0)
    status = rd.read_status()
    assert status["state"] == "completed" and status["attempt"] == 1 and status["job_id"] == "812_3"
    assert status["reason"] is None and status["ended"]
    rows = rd.read_metrics()
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert len(list(rd.iter_metrics())) == 5  # one line per logged step
    for row in rows[1:]:
        missing = [k for k in TRAIN_EVERY_STEP if k not in row]
        assert not missing, (row["step"], missing)
    for step in (0, 2, 4):
        assert all(k in rows[step] for k in VALIDATION), rows[step]
    assert not any(k in rows[1] for k in VALIDATION)
    assert 0.0 <= rows[0]["val/acc"] <= 1.0 and rows[0]["val/pass@k"] >= rows[0]["val/acc"]
    assert rows[0]["kl/exact_reverse"] == pytest.approx(0.0, abs=1e-6)  # π_θ = π_ref at step 0
    assert rows[4]["kl/exact_reverse"] > 0.0
    assert sorted(p.name for p in rd.tokens_dir.iterdir()) == [f"step-{s:06d}-r0.parquet" for s in (1, 2, 3, 4)]
    import pyarrow.parquet as pq

    tokens = pq.read_table(rd.tokens_dir / "step-000003-r0.parquet").to_pydict()
    assert set(tokens) == {"step", "group", "position", "token_id", "logp", "old_logp", "ref_logp", "advantage",
                           "is_anchor"}
    n = len(tokens["step"])
    assert 0 < n < 16 * 8 and set(tokens["step"]) == {3}
    assert all(x <= 0 for x in tokens["logp"] + tokens["old_logp"] + tokens["ref_logp"])
    # a generation = 2 steps × 16 rows = 4 groups of 8; step 3 trains on the second one (groups 4-7)
    assert set(tokens["group"]) <= {4, 5, 6, 7}
    assert [p.name for p in rd.checkpoints()] == ["checkpoint-2", "checkpoint-4"]
    # started again: a completed run is not trained twice
    again = train_run_dir(rd.path)
    assert again.state == "completed" and rd.read_status()["attempt"] == 1


# --------------------------------------------------------------------------- resume
def test_preempted_run_resumes_to_the_same_metrics_as_an_uninterrupted_one(tmp_path):
    # 8 prompts = 2 generations per epoch = 4 steps: the preemption lands mid-generation in epoch 2
    cfg = resolved(objective="armor", max_steps=7, val_every=3, kl_probe_prompts=2, ref_reset_steps=2,
                   token_sample_rate=0.25)
    straight = RunDir.create(tmp_path / "a", cfg)
    assert train_run_dir(straight.path).exit_code == 0

    split = RunDir.create(tmp_path / "b", cfg)
    first = train_run_dir(split.path, callbacks=[At(4, lambda kw: os.kill(os.getpid(), signal.SIGUSR1))])
    # the signal is seen at the next step end: finish step 5, checkpoint, exit 75
    assert (first.state, first.reason, first.exit_code) == ("pending", "preempted at step 5", EXIT_PREEMPTED)
    assert split.read_status()["state"] == "pending"
    # step 3 validated, so it was saved too (a validation step's checkpoint may be the selected one)
    assert [p.name for p in split.checkpoints()] == ["checkpoint-3", "checkpoint-5"]
    second = train_run_dir(split.path)
    assert second.exit_code == 0 and split.read_status()["attempt"] == 2
    assert _metrics_without_timing(split) == _metrics_without_timing(straight)
    # the resumed run read its evals back and selected what the uninterrupted one did
    # (a validated step: 3 or 6, whichever the level around it puts first — armorlab.stats.select)
    assert split.read_selected() == straight.read_selected() and split.read_selected()["step"] in (3, 6)
    assert [p.name for p in split.checkpoints()] == [p.name for p in straight.checkpoints()]


def _wait_for_step(run_dir, step, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early: {proc.returncode}\n{proc.stderr.read()}")
        last = run_dir.last_step()
        if last is not None and last >= step:
            return
        time.sleep(0.05)
    raise AssertionError("trainer too slow")


def _start(run_dir):
    env = {**os.environ, "ARMORLAB_JOB_ID": "local-1"}
    return subprocess.Popen([sys.executable, "-m", "armorlab.cli", "train", "--run-dir", str(run_dir.path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_killed_run_resumes_from_the_last_checkpoint_and_supersedes_its_lines(tmp_path):
    cfg = resolved(objective="up", max_steps=6, save_steps=2, val_every=2)
    straight = RunDir.create(tmp_path / "a", cfg)
    assert train_run_dir(straight.path).exit_code == 0

    killed = RunDir.create(tmp_path / "b", cfg)
    proc = _start(killed)
    try:
        _wait_for_step(killed, 3, proc)  # checkpoint-2 is complete once step 3 is logged
    finally:
        proc.kill()
        proc.communicate()
    assert killed.read_status()["state"] == "running" and killed.read_status()["job_id"] == "local-1"
    assert train_run_dir(killed.path).exit_code == 0
    steps = [row["step"] for row in killed.iter_metrics()]
    assert steps.count(3) == 2 and max(steps) == 6  # the killed attempt's step 3 line was superseded
    assert _metrics_without_timing(killed) == _metrics_without_timing(straight)


def test_sigusr1_to_the_cli_exits_75_with_a_checkpoint(tmp_path):
    cfg = resolved(objective="dapo", max_steps=50)
    rd = RunDir.create(tmp_path, cfg)
    proc = _start(rd)
    try:
        _wait_for_step(rd, 1, proc)
        proc.send_signal(signal.SIGUSR1)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, err
    status = rd.read_status()
    assert status["state"] == "pending" and status["reason"].startswith("preempted at step ")
    step = int(status["reason"].rsplit(" ", 1)[1])
    assert [p.name for p in rd.checkpoints()] == [f"checkpoint-{step}"]
    assert complete_checkpoint(rd) == rd.checkpoints()[-1]
    assert "Traceback" not in err


def test_sigterm_during_the_warm_start_stops_within_seconds_and_leaves_no_build(tmp_path):
    # issue 40 §1: the signal used to be answered "checkpointing after the current step" while the
    # build went on for minutes; before the first step there is no step to finish
    cache = tmp_path / "cache"
    cfg = resolved(objective="dapo", max_steps=5)
    cfg["model"] = {**cfg["model"], "warm_start_steps": 100_000, "warm_start_target": None, "warm_start_seed": 7}
    rd = RunDir.create(tmp_path / "runs", cfg)
    env = {**os.environ, "ARMORLAB_CACHE": str(cache), "ARMORLAB_JOB_ID": "local-1"}
    proc = subprocess.Popen([sys.executable, "-m", "armorlab.cli", "train", "--run-dir", str(rd.path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 300
        while not list((cache / "models").glob(".tiny-*")):  # the build's temp dir: the warm start runs
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, err
    print(f"exited {waited:.1f} s after SIGTERM")
    assert waited < 15, waited  # a warm-start step is ~0.1 s; the interpreter's exit the rest
    status = rd.read_status()
    assert status["state"] == "pending" and status["reason"] == "preempted before the first step (signal 15)"
    left = [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")]
    assert left == [], left  # neither a half-built model nor its temp dir
    assert "Traceback" not in err


# --------------------------------------------------------------------------- stop, failures
def test_stop_request_completes_after_the_current_step(tmp_path):
    rd = RunDir.create(tmp_path, resolved(objective="dapo", max_steps=20))
    (rd.path / "stop_request").write_text(json.dumps({"reason": "pruned by optuna at step 0"}))
    outcome = train_run_dir(rd.path)
    assert (outcome.state, outcome.exit_code) == ("completed", 0)
    assert rd.read_status()["reason"] == "stopped at step 1: pruned by optuna at step 0"
    assert rd.last_step() == 1


def test_non_finite_loss_fails_the_run_with_its_step(tmp_path):
    def poison(kwargs):
        with torch.no_grad():
            for p in kwargs["model"].parameters():
                p.fill_(math.nan)

    rd = RunDir.create(tmp_path, resolved(objective="dapo", max_steps=5))
    outcome = train_run_dir(rd.path, callbacks=[At(1, poison)])
    assert (outcome.state, outcome.exit_code) == ("failed", EXIT_FAILED)
    assert rd.read_status()["reason"] == "non-finite loss at step 2"
    assert rd.last_step() == 1


def test_bad_trl_value_fails_as_a_user_error(tmp_path):
    # generation batch 16 × 2 is not divisible by 3 generations: GRPOConfig rejects it at job start
    rd = RunDir.create(tmp_path, resolved(num_generations=3))
    with pytest.raises(ArmorLabError, match="GRPOConfig rejected") as err:
        train_run_dir(rd.path)
    assert "config.yaml" in str(err.value)
    status = rd.read_status()
    assert status["state"] == "failed" and "num_generations" in status["reason"]


def test_cli_user_error_in_a_run_dir_exits_2(tmp_path):
    rd = RunDir.create(tmp_path, resolved(num_generations=3))
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "train", "--run-dir", str(rd.path)],
                         capture_output=True, text=True, env={**os.environ, "ARMORLAB_CACHE": model_cache()})
    assert out.returncode == 2 and "Traceback" not in out.stderr and "GRPOConfig rejected" in out.stderr
    assert rd.read_status()["state"] == "failed"


def test_unknown_trl_key_is_named(tmp_path):
    cfg = {**resolved(), "not_a_grpo_field": 1}
    rd = RunDir(tmp_path)
    with pytest.raises(ArmorLabError) as err:
        make_args(cfg, rd)
    assert "'not_a_grpo_field'" in str(err.value)


def test_resolved_exponent_strings_reach_grpo_config_as_numbers(tmp_path):
    # YAML 1.1 reads "1e-5" (no dot) as a string; resolve() turns it into a number, so
    # TrainingArguments (which would crash in the optimizer on a string) gets a float
    from armorlab.core.config import resolve

    cfg = resolve({"learning_rate": "1e-5", "warmup_steps": "3", "lr_scheduler_type": "cosine"})
    args = make_args(cfg, RunDir(tmp_path))
    assert args.learning_rate == 1e-5 and args.warmup_steps == 3 and args.lr_scheduler_type == "cosine"


def test_not_a_run_dir_is_a_user_error(tmp_path):
    with pytest.raises(ArmorLabError, match="no config.yaml"):
        train_run_dir(tmp_path)


# --------------------------------------------------------------------------- helpers
def test_job_id_from_env_precedence():
    assert job_id_from_env({"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "9"}) == "7_2"
    assert job_id_from_env({"SLURM_JOB_ID": "9", "ARMORLAB_JOB_ID": "x"}) == "9"
    assert job_id_from_env({"ARMORLAB_JOB_ID": "x"}) == "x"
    assert job_id_from_env({}) is None


def test_stop_request_reasons(tmp_path):
    rd = RunDir(tmp_path)
    assert read_stop_request(rd) is None
    (tmp_path / "stop_request").write_text('{"reason": "enough"}')
    assert read_stop_request(rd) == "enough"
    (tmp_path / "stop_request").write_text("")
    assert read_stop_request(rd) == "stop requested"
    (tmp_path / "stop_request").write_text("plain words")
    assert read_stop_request(rd) == "plain words"


def test_incomplete_checkpoints_are_skipped(tmp_path):
    rd = RunDir(tmp_path)
    for step, state in ((2, "{}"), (4, '{"global_step": 4'), (6, None)):
        d = Path(tmp_path, "checkpoints", f"checkpoint-{step}")
        d.mkdir(parents=True)
        if state is not None:
            (d / "trainer_state.json").write_text(state)
    assert complete_checkpoint(rd).name == "checkpoint-2"
