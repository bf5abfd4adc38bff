"""A run's identity follows its model and data: fingerprints, logging keys, up-front path errors."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from model_dirs import fake_model_dir, safetensors_bytes

from armorlab.core.config import resolve
from armorlab.core.identity import file_fingerprint, tree_fingerprint
from armorlab.core.runs import RunDir, run_id
from armorlab.errors import ArmorLabError

PROBLEMS = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]


def _model_dir(path, weights=b"\0" * 64):
    """What save_pretrained leaves: config, tokenizer files, a weights file (its tensors do not matter here)."""
    return fake_model_dir(path, payload=weights)


def _data(path, rows=PROBLEMS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(model, data, **extra):
    return {"model": str(model), "task": {"name": "math", "path": str(data), "val_size": 2, "test_size": 2},
            **extra}


def test_run_id_follows_model_weights_tokenizer_and_data(tmp_path):
    model, data = _model_dir(tmp_path / "m"), _data(tmp_path / "d.jsonl")
    first = resolve(_cfg(model, data))
    assert first["model"]["name"] == str(model) and first["task"]["path"] == str(data)
    assert first["model"]["fingerprint"] == tree_fingerprint(model, recursive=False)
    assert first["task"]["fingerprint"] == file_fingerprint(data)
    ids = {run_id(first)}
    # rebuilt weights of the same shape and size: the mtime moves
    weights = model / "model.safetensors"
    weights.write_bytes(safetensors_bytes(b"\1" * 64))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    ids.add(run_id(resolve(_cfg(model, data))))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    ids.add(run_id(resolve(_cfg(model, data))))
    _data(data, PROBLEMS[:-1])
    ids.add(run_id(resolve(_cfg(model, data))))
    assert len(ids) == 4
    # what does not change what is trained keeps the id: hidden files, re-writing equal data
    (model / ".cache").mkdir()
    (model / ".cache" / "x").write_text("y")
    again = resolve(_cfg(model, data))
    _data(data, PROBLEMS[:-1])
    assert run_id(resolve(_cfg(model, data))) == run_id(again)


def test_relative_paths_are_stored_absolute(tmp_path, monkeypatch):
    _model_dir(tmp_path / "m")
    _data(tmp_path / "d.jsonl")
    monkeypatch.chdir(tmp_path)
    cfg = resolve(_cfg("./m", "d.jsonl"))
    assert cfg["model"]["name"] == str(tmp_path / "m") and cfg["task"]["path"] == str(tmp_path / "d.jsonl")
    assert resolve(cfg) == cfg  # a stored config resolves to itself


def test_logging_settings_are_not_part_of_the_run_id(tmp_path):
    base = resolve({})
    variants = [{"report_to": "none"}, {"logging_steps": 7}, {"run_name": "nice"}, {"disable_tqdm": True},
                {"log_completions": True, "num_completions_to_print": 2}]
    for extra in variants:
        assert run_id(resolve(extra)) == run_id(base), extra
    assert run_id(resolve({"learning_rate": 1e-4})) != run_id(base)
    first = RunDir.create(tmp_path, resolve({"run_name": "a"}))
    second = RunDir.create(tmp_path, resolve({"run_name": "b"}))
    assert first.path == second.path and second.read_config()["run_name"] == "b"


def test_missing_model_and_backend_are_user_errors_before_anything_starts(tmp_path, monkeypatch):
    for name in ("/no/such/model", "./nope", "not-a-cached/model"):
        with pytest.raises(ArmorLabError) as err:
            resolve({"model": name}, file="cfg.yaml")
        assert err.value.key == "model" and name in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArmorLabError, match="no config.json"):
        resolve({"model": str(tmp_path / "empty")})
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a))
    with pytest.raises(ArmorLabError, match=r"pip install 'armorlab\[tensorboard\]'.*'report_to'"):
        resolve({"report_to": ["tensorboard"]})
    assert resolve({"report_to": "none"})["report_to"] == "none"


def test_cli_missing_model_exits_2_naming_model_and_creates_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "train", "--set", "model=/no/such/model",
                          "--out", str(tmp_path / "runs")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "key 'model'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists()


def test_completed_run_says_so_and_a_changed_model_stops_a_stale_run(tmp_path):
    from armorlab.train.launch import train_run_dir

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({"max_steps": 1}))
    cfg = resolve({"max_steps": 1})
    RunDir.create(tmp_path / "runs", cfg).write_status("completed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "armorlab.cli", "train", str(cfg_path), "--out", str(tmp_path / "runs")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and f"already completed: {tmp_path / 'runs' / run_id(cfg)}" in out.stderr

    model, data = _model_dir(tmp_path / "m"), _data(tmp_path / "d.jsonl")
    stale = RunDir.create(tmp_path / "runs", resolve(_cfg(model, data)))
    _data(data, PROBLEMS[:-1])
    with pytest.raises(ArmorLabError, match=r"the data changed since this run was created.*'task'"):
        train_run_dir(stale.path)
    assert stale.read_status()["state"] == "failed"


def test_save_to_disk_and_cached_hub_datasets(tmp_path, monkeypatch):
    from datasets import Dataset, DatasetDict
    from huggingface_hub import constants

    from armorlab.tasks import build_task

    rows = {"problem": [r["problem"] for r in PROBLEMS], "answer": [r["answer"] for r in PROBLEMS]}
    Dataset.from_dict(rows).save_to_disk(str(tmp_path / "flat"))
    DatasetDict({"train": Dataset.from_dict(rows), "test": Dataset.from_dict(rows).select(range(3))}).save_to_disk(
        str(tmp_path / "dict"))
    for path in ("flat", "dict"):
        task = build_task({"name": "math", "path": str(tmp_path / path), "val_size": 2, "test_size": 2})
        assert len(task.train) + len(task.val) + len(task.test) == len(PROBLEMS)
    with pytest.raises(ArmorLabError, match="no split 'validation'.*task.split"):
        build_task({"name": "math", "path": str(tmp_path / "dict"), "split": "validation"})

    # the hub cache's layout: <cache>/datasets--<org>--<name>/{refs/main, snapshots/<commit>/...}
    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    snapshot = cache / "datasets--me--toy-math" / "snapshots" / commit
    (snapshot / "data").mkdir(parents=True)
    _data(snapshot / "data" / "train.jsonl")
    (cache / "datasets--me--toy-math" / "refs").mkdir()
    (cache / "datasets--me--toy-math" / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    cfg = resolve({"task": {"name": "math", "path": "me/toy-math", "val_size": 2, "test_size": 2}})
    assert cfg["task"]["path"] == "me/toy-math" and cfg["task"]["fingerprint"] == f"rev:{commit}"
    task = build_task(cfg["task"])
    assert sorted([*task.train["prompt"], *task.val["prompt"], *task.test["prompt"]]) == \
        sorted(r["problem"] for r in PROBLEMS)
    with pytest.raises(ArmorLabError, match="not in the local Hugging Face cache"):
        resolve({"task": {"name": "math", "path": "me/other"}})
    # a hub model id: its resolved revision
    model_snap = cache / "models--me--tiny" / "snapshots" / commit
    _model_dir(model_snap)
    (cache / "models--me--tiny" / "refs").mkdir()
    (cache / "models--me--tiny" / "refs" / "main").write_text(commit)
    assert resolve({"model": "me/tiny"})["model"] == {"name": "me/tiny", "fingerprint": f"rev:{commit}"}
