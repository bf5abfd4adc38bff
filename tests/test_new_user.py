"""What a new user tripped on (issue 30 §4), each as the user met it: through the CLI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from sweep_support import run_cli

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir


def _yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- status of one run dir
def test_status_takes_the_run_dir_train_prints(tmp_path):
    cfg = resolve({"max_steps": 5, "learning_rate": 3.1622776601683794e-06})
    rd = RunDir.create(tmp_path / "runs" / "train", cfg)
    rd.append_metrics(3, {"val/acc": 0.123456789})
    rd.write_status("failed", reason="boom")
    RunDir.create(tmp_path / "runs" / "train", {**cfg, "seed": 1})  # a sibling run: not shown
    out = run_cli("status", str(rd.path), env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert rd.id in out.stdout and "failed: 1" in out.stdout and "pending" not in out.stdout
    assert "3/5" in out.stdout and "0.123" in out.stdout and "0.1234567" not in out.stdout


def test_status_rounds_long_floats_in_the_config_column(tmp_path):
    base = resolve({"max_steps": 5})
    for lr in (3.1622776601683794e-06, 1e-05):
        RunDir.create(tmp_path / "sw", {**base, "learning_rate": lr})
    out = run_cli("status", str(tmp_path / "sw"), env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "learning_rate=3.162e-06" in out.stdout and "3.1622776601683794e-06" not in out.stdout
    assert "learning_rate=1e-05" in out.stdout


def test_a_100_kb_reason_does_not_make_status_slow(tmp_path):
    """Rich laid out all 100,000 characters in a folded table cell: 59 s. The peer: the same
    status with a 100-character reason, timed in the same run."""
    cfg = resolve({"max_steps": 5})
    times = {}
    for size in (100, 100_000):
        rd = RunDir.create(tmp_path / f"sw{size}", cfg)
        rd.write_status("failed", reason="x[red]y " * (size // 8))
        t0 = time.perf_counter()
        out = run_cli("status", str(tmp_path / f"sw{size}"), env={"COLUMNS": "120"})
        times[size] = time.perf_counter() - t0
        assert out.returncode == 0, out.stderr
        assert "x[red]y" in out.stdout  # shown as text, not as rich markup
    assert f"{100_000 // 8 * 8:,} characters; all in status.json" in out.stdout
    assert times[100_000] < 3 * times[100] + 1.0, times


# --------------------------------------------------------------------------- sweep --set and --dry-run
def test_the_set_example_of_sweep_help_works(tmp_path):
    help_text = run_cli("sweep", "--help", env={"COLUMNS": "200"}).stdout
    example = help_text.split("e.g.", 1)[1].split("(changes", 1)[0].split()
    assert example[0] == "--set" and example.count("--set") >= 2
    spec = _yaml(tmp_path / "s.yaml", {"name": "s", "base": {"max_steps": 3}})
    out = run_cli("sweep", str(spec), "--dry-run", "--root", str(tmp_path / "runs"), *example)
    assert out.returncode == 0, out.stderr
    # two pairs after one --set: not silently dropped, and the error says how
    out = run_cli("sweep", str(spec), "--dry-run", "--set", "model=tiny", "task=arithmetic")
    assert out.returncode == 2 and "--set once per key" in out.stderr


def test_a_local_dry_run_never_asks_slurm(tmp_path):
    """A scontrol that hangs 9 s (no controller) and records that it was asked."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\nsleep 9\n")
    (bin_dir / "scontrol").chmod(0o755)
    spec = _yaml(tmp_path / "s.yaml", {"name": "s", "base": {"max_steps": 3}, "grid": {"seed": [0, 1]}})
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    t0 = time.perf_counter()
    out = run_cli("sweep", str(spec), "--dry-run", "--root", str(tmp_path / "runs"), env=env)
    assert out.returncode == 0, out.stderr
    assert time.perf_counter() - t0 < 9 and not calls.exists()
    assert "MaxArraySize" not in out.stdout + out.stderr
    # a Slurm dry run still asks (the array size depends on it)
    profile = _yaml(tmp_path / "p.yaml", {"executor": "slurm"})
    out = run_cli("sweep", str(spec), "--dry-run", "--root", str(tmp_path / "runs"), "--profile", str(profile),
                  env=env, timeout=120)
    assert out.returncode == 0 and calls.exists(), out.stderr


# --------------------------------------------------------------------------- config messages
def test_a_top_level_typo_gets_did_you_mean(tmp_path):
    cfg = _yaml(tmp_path / "c.yaml", {"learnign_rate": 1e-5, "max_step": 10})
    spec = _yaml(tmp_path / "s.yaml", {"name": "s", "base": str(cfg)})
    out = run_cli("sweep", str(spec), "--dry-run")
    assert out.returncode == 2
    assert "did you mean 'learning_rate'?" in out.stderr and "did you mean 'max_steps'?" in out.stderr
    assert "2 problems" in out.stderr  # both at once
    spec = _yaml(tmp_path / "t.yaml", {"name": "s", "gird": {"alpha": [0.5]}})
    out = run_cli("sweep", str(spec), "--dry-run")
    assert out.returncode == 2 and "did you mean 'grid'?" in out.stderr


def test_max_completion_length_beyond_the_models_positions_is_refused_up_front(tmp_path):
    from model_dirs import fake_model_dir

    model = fake_model_dir(tmp_path / "m", config={"model_type": "qwen2", "max_position_embeddings": 512})
    for model_name, length, limit in (("tiny", 2048, 1024), (str(model), 600, 512)):
        spec = _yaml(tmp_path / "s.yaml", {"name": "s", "base": {"model": model_name, "max_completion_length": length}})
        out = run_cli("sweep", str(spec), "--dry-run")
        assert out.returncode == 2, out.stderr
        assert "key 'max_completion_length'" in out.stderr and f"{limit} positions" in out.stderr
        assert str(spec) in out.stderr


def test_small_data_names_the_config_and_the_fix(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(40)))
    cfg = _yaml(tmp_path / "cfg.yaml", {"task": {"name": "math", "path": str(data)}})
    out = run_cli("train", str(cfg), "--out", str(tmp_path / "runs"))
    assert out.returncode == 2, out.stderr
    assert f"in {cfg}" in out.stderr and "key 'task.val_size'" in out.stderr
    assert "the defaults, 64 + 64" in out.stderr and "holds 40" in out.stderr and "val_size: 4" in out.stderr
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- train
@pytest.mark.slow
def test_a_logging_key_change_says_logging_keys_are_not_the_run_id(tmp_path):
    from trainer_support import SMALL, TASK, model_cache

    cfg = _yaml(tmp_path / "c.yaml", {**SMALL, "max_steps": 1, "task": TASK})
    env = {"ARMORLAB_CACHE": model_cache()}
    first = run_cli("train", str(cfg), "--out", str(tmp_path / "runs"), env=env, timeout=1200)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli("train", str(cfg), "--out", str(tmp_path / "runs"), "--set", "logging_steps=5",
                    "--set", "run_name=mine", env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already completed" in again.stderr
    assert "logging_steps, run_name" in again.stderr and "not part of the run id" in again.stderr
    assert first.stdout.strip() == again.stdout.strip()  # the same run dir


@pytest.mark.slow
def test_a_run_that_cannot_take_a_step_is_an_error(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(80)))
    cfg = _yaml(tmp_path / "c.yaml", {"task": {"name": "math", "path": str(data), "val_size": 8, "test_size": 8},
                                      "per_device_train_batch_size": 4096, "num_generations": 8,
                                      "max_steps": 2, "val_every": 0})
    out = run_cli("train", str(cfg), "--out", str(tmp_path / "runs"), timeout=600)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "no step could be taken" in out.stderr and "key 'per_device_train_batch_size'" in out.stderr
    rd = RunDir(next((tmp_path / "runs").iterdir()))
    assert rd.read_status()["state"] == "failed"  # not "completed" with zero steps


@pytest.mark.slow
def test_check_task_never_trains_the_tiny_model(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(30)))
    cfg = _yaml(tmp_path / "c.yaml", {"task": {"name": "math", "path": str(data), "val_size": 4, "test_size": 4}})
    env = {"ARMORLAB_CACHE": str(tmp_path / "cache")}  # an empty cache: the tiny model is not built
    out = run_cli("check-task", str(cfg), "--rows", "2", env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("─── row") == 2 and "scores 1.0" in out.stdout
    assert "check-task does not train" in out.stderr
    assert not (tmp_path / "cache" / "models").exists()  # nothing built


# --------------------------------------------------------------------------- health warnings, trackers
def test_trackers_get_no_null_metrics():
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    from armorlab.train.launch import _without_nulls_for_trackers

    class FakeWriter:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, k, v, step):
            self.scalars.append(k)

        def add_text(self, *a):
            pass

        def flush(self):
            pass

    writer = FakeWriter()
    tb = TensorBoardCallback(tb_writer=writer)
    trainer = type("T", (), {"callback_handler": type("H", (), {"callbacks": [tb]})()})()
    args, state = TrainingArguments(output_dir="/tmp/unused", use_cpu=True), TrainerState()
    logs = {"obj/clip_low": None, "train/reward": 0.5, "obj/neg_frac": None}
    import logging

    from transformers.utils import logging as hf_logging

    # transformers' own stderr handler may be bound to a stream an earlier test captured: listen
    # on its logger directly
    heard: list[str] = []
    listener = logging.Handler(logging.WARNING)
    listener.emit = lambda record: heard.append(record.getMessage())
    hf_logger, verbosity = hf_logging.get_logger("transformers"), hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # transformers' default; an earlier test may have quietened it
    hf_logger.addHandler(listener)
    try:
        tb.on_log(args, state, TrainerControl(), logs=dict(logs))
        assert any("attempting to log a value of" in m for m in heard)  # what users saw, ~9 lines a step
        heard.clear()
        _without_nulls_for_trackers(trainer)
        tb.on_log(args, state, TrainerControl(), logs=dict(logs))
        assert not any("attempting to log" in m for m in heard)
    finally:
        hf_logger.removeHandler(listener)
        hf_logging.set_verbosity(verbosity)
    assert writer.scalars == ["train/train/reward"] * 2  # the number still goes through (rewrite_logs' prefix)


def test_health_warnings_are_shown_once(tmp_path):
    from armorlab.train.launch import HealthMonitor

    rd = RunDir.create(tmp_path, resolve({"max_steps": 40}))
    monitor = HealthMonitor(rd)
    rows = [{"step": s, "train/truncated": 1.0, "train/grad_norm": 1.0} for s in range(1, 6)]
    rows += [{"step": s, "train/truncated": 0.0, "train/grad_norm": 0.0} for s in range(6, 20)]
    monitor.rows = rows[:5]
    mid = monitor.update(final=False)  # every completion truncated: logged as it happens
    monitor.rows = rows
    final = monitor.update(final=True)  # and then no gradient for 14 steps
    assert len(mid) == 1 and len(final) == 2 and set(mid) < set(final)
    # what train prints at the end: only those the log has not shown already
    assert set(monitor.unannounced()) == set(final) - set(mid)
    assert rd.read_status()["warnings"] == final


# --------------------------------------------------------------------------- tune report groups
def test_a_study_report_groups_by_every_searched_key(tmp_path):
    pytest.importorskip("optuna")
    from tune_support import spec, standin_env

    p = spec(tmp_path, "two", """
        space:
          alpha: {type: float, low: 0.5, high: 0.9}
          learning_rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
        sampler: {type: random, seed: 0}
        n_trials: 3
    """)
    env = standin_env()
    out = run_cli("tune", str(p), "--root", str(tmp_path / "runs"), env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rep = run_cli("report", str(tmp_path / "runs" / "two"), "--out", str(tmp_path / "rep"), env=env, timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    written = yaml.safe_load((tmp_path / "rep" / "recipe.yaml").read_text())
    assert written["group_by"] == ["alpha", "learning_rate"]


def test_searched_keys_read_the_study_file_alone(tmp_path):
    from armorlab.commands.report import _study_keys

    (tmp_path / "st" / ".tune").mkdir(parents=True)
    (tmp_path / "st" / ".tune" / "study.json").write_text(json.dumps(
        {"search": {"space": {"alpha": [0.5], "learning_rate": {"type": "float"}, "task.digits": [2, 3]}}}))
    assert _study_keys([str(tmp_path / "st")]) == ["alpha", "learning_rate", "task.digits"]
    assert _study_keys([str(tmp_path)]) is None
