"""Issue 30 §1–§2 at the unit level: each error names its key, its value and its file (the CLI cases
of the same inputs are in tests/fuzz_surfaces.py)."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
import yaml
from model_dirs import fake_model_dir

from armorlab.core.config import load_config, load_yaml_mapping, resolve
from armorlab.core.runs import OWNER, RunDir
from armorlab.errors import ArmorLabError
from armorlab.sweeps.profile import load_profile


def _err(fn, *args, **kwargs) -> ArmorLabError:
    with pytest.raises(ArmorLabError) as info:
        fn(*args, **kwargs)
    return info.value


def _cfg_file(tmp_path: Path, data) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


# --------------------------------------------------------------------------- owner.lock
@pytest.fixture
def run(tmp_path) -> RunDir:
    rd = RunDir.create(tmp_path / "sw", resolve({"max_steps": 3}))
    rd.write_status("completed")
    return rd


def test_a_symlinked_owner_lock_is_refused_and_its_target_untouched(run, tmp_path):
    target = tmp_path / "precious"
    target.write_text("ORIGINAL")
    os.symlink(target, run.owner_path)
    err = _err(run.acquire_owner)
    assert (err.key, err.file) == (OWNER, str(run.owner_path)) and "symlink" in str(err)
    assert target.read_text() == "ORIGINAL"
    assert run.owner() is None


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_an_owner_lock_that_is_no_regular_file_is_an_error_and_never_blocks(run, kind):
    if kind == "directory":
        run.owner_path.mkdir()
    else:
        os.mkfifo(run.owner_path)
    err = _err(run.acquire_owner)
    assert err.key == OWNER and err.file == str(run.owner_path)
    assert ("FIFO" if kind == "fifo" else "directory") in str(err)
    box = {}
    t = threading.Thread(target=lambda: box.update(owner=run.owner()), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and box["owner"] is None  # status asks, and is answered at once


# --------------------------------------------------------------------------- profiles
@pytest.mark.parametrize("export, hook", [("ALL,BASH_ENV=/tmp/x.sh", "BASH_ENV"), ("NONE,ENV=/x", "ENV"),
                                          ("ALL,BASH_FUNC_ls%%=() { id; }", "BASH_FUNC_ls%%"),
                                          ("ALL,'LD_PRELOAD=/x.so'", "LD_PRELOAD")])
def test_sbatch_export_may_not_set_a_start_up_hook(tmp_path, export, hook):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"executor": "slurm", "sbatch": {"export": export}}))
    err = _err(load_profile, p)
    assert err.key == "sbatch" and err.value == {"export": export} and err.file == str(p)
    assert hook in str(err)
    p.write_text(yaml.safe_dump({"executor": "slurm", "sbatch": {"export": "ALL,OMP_NUM_THREADS=4,ENVIRONMENT=x"}}))
    assert load_profile(p).sbatch["export"] == "ALL,OMP_NUM_THREADS=4,ENVIRONMENT=x"  # near names pass


@pytest.mark.parametrize("option", ["export-file", "export_file", "export-fil", "export-f", "export-"])
def test_every_prefix_sbatch_reads_as_export_file_is_refused(tmp_path, option):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"executor": "slurm", "sbatch": {option: "/tmp/env"}}))
    err = _err(load_profile, p)
    assert err.key == "sbatch" and err.file == str(p) and "export-file" in str(err) and option in str(err)
    p.write_text(yaml.safe_dump({"executor": "slurm", "sbatch": {"exclusive": "user", "export": "ALL"}}))
    assert load_profile(p).sbatch == {"exclusive": "user", "export": "ALL"}


@pytest.mark.parametrize("name", ["PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PERL5OPT",
                                  "LD_LIBRARY_PATH", "BASH_ENV", "ENV"])
def test_sbatch_export_may_not_choose_the_code_a_job_runs_unless_allowed(tmp_path, name):
    p = tmp_path / "p.yaml"
    prof = {"executor": "slurm", "sbatch": {"export": f"ALL,OMP_NUM_THREADS=2,{name}=/tmp/evil"}}
    p.write_text(yaml.safe_dump(prof))
    err = _err(load_profile, p)
    assert err.key == "sbatch" and err.file == str(p) and name in str(err) and "allow_exports" in str(err)
    p.write_text(yaml.safe_dump({**prof, "allow_exports": [name]}))
    assert load_profile(p).allow_exports == (name,)
    p.write_text(yaml.safe_dump({**prof, "allow_exports": [f"{name}=x"]}))
    assert _err(load_profile, p).key == "allow_exports"


@pytest.mark.parametrize("server, key", [
    ({"env": {"BASH_ENV": "/x"}}, "vllm_servers.policy.env"),
    ({"env": {"X": "a\x00b"}}, "vllm_servers.policy.env"),
    ({"args": ["--dtype", "bf\x0016"]}, "vllm_servers.policy.args"),
    ({"args": "--dtype bf\x0016"}, "vllm_servers.policy.args"),
])
def test_vllm_servers_refuse_hooks_and_nul_bytes(tmp_path, server, key):
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"vllm_servers": {"policy": {"gpus": 0, **server}}}))
    err = _err(load_profile, p)
    assert err.key == key and err.file == str(p) and err.value == next(iter(server.values()))


# --------------------------------------------------------------------------- configs
def test_all_problems_of_a_file_at_once_each_with_key_value_file(tmp_path):
    p = _cfg_file(tmp_path, {"optim": "adamw_trch", "lr_scheduler_type": "cosinus", "learnign_rate": 1e-5,
                             "scale_rewards": "bogus", "model": {"name": "tiny", "hidden_size": 1.0e12}})
    err = _err(load_config, p)
    keys = [e.key for e in err.problems]
    assert sorted(keys) == sorted(["learnign_rate", "optim", "scale_rewards", "lr_scheduler_type", "model.hidden_size"])
    assert all(e.file == str(p) for e in err.problems)
    text = str(err)
    assert text.startswith(f"5 problems in {p}")
    assert "did you mean 'learning_rate'?" in text and "did you mean 'adamw_torch'?" in text
    assert "did you mean 'cosine'?" in text and "group, batch, none" in text and "≤ 8192" in text
    assert "value 'adamw_trch'" in text and "value 'cosinus'" in text


def test_scale_rewards_takes_bools_as_trl_documents():
    assert resolve({"scale_rewards": True})["scale_rewards"] == "group"
    assert resolve({"scale_rewards": False})["scale_rewards"] == "none"
    assert resolve({"scale_rewards": "batch"})["scale_rewards"] == "batch"


def test_report_to_names_the_known_backends(tmp_path):
    err = _err(load_config, _cfg_file(tmp_path, {"report_to": ["tensorboard", "nonexistent_tracker"]}))
    assert err.key == "report_to" and err.value == ["tensorboard", "nonexistent_tracker"]
    assert "'nonexistent_tracker'" in str(err) and "wandb" in str(err)


def test_a_5000_digit_int_is_named_with_its_key_and_file(tmp_path):
    p = _cfg_file(tmp_path, "max_steps: " + "7" * 5000 + "\n")
    err = _err(load_config, p)
    assert (err.key, err.value, err.file) == ("max_steps", "<5,000 digits>", str(p))
    assert "line 1" in str(err)
    p.write_text("grid:\n  x: [1, " + "7" * 5000 + "]\n")  # in a list: the line says where
    err = _err(load_yaml_mapping, p)
    assert "line 2" in str(err) and err.file == str(p)


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000 + "\n",
                                  "".join("  " * i + "a:\n" for i in range(300))])
def test_deep_yaml_nesting_is_an_error_naming_the_file(tmp_path, text):
    p = _cfg_file(tmp_path, text)
    err = _err(load_yaml_mapping, p)
    assert err.file == str(p) and "nested" in str(err)


def _alias_bomb(levels: int, width: int = 10) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, words", [(_alias_bomb(10), "aliases"),  # 10^10 values from 10 lines
                                         (_alias_bomb(7), "aliases"),  # 10^7: the 11 s case of the campaign
                                         ("x: &x [*x]\n", "nested"),  # a list that holds itself
                                         ("a: &a [[[[1]]]]\nb: [" + ", ".join(["*a"] * 30) + "]\n", None)])
def test_alias_bombs_are_refused_at_once_and_shared_aliases_pass(tmp_path, text, words):
    import time

    p = _cfg_file(tmp_path, text)
    t0 = time.perf_counter()
    if words is None:
        assert len(load_yaml_mapping(p)["b"]) == 30
    else:
        err = _err(load_yaml_mapping, p)
        assert err.file == str(p) and words in str(err) and str(err).count(str(p)) == 1
    assert time.perf_counter() - t0 < 1.0


def test_yaml_escapes_past_unicode_are_an_error_not_a_traceback(tmp_path):
    p = _cfg_file(tmp_path, 'model: "\\U0011ffff"\n')
    assert _err(load_yaml_mapping, p).file == str(p)


@pytest.mark.parametrize("raw, key", [
    ({"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 0}, "vllm_server_port"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 65536}, "vllm_server_port"),
    ({"use_vllm": True, "vllm_gpu_memory_utilization": 1.5}, "vllm_gpu_memory_utilization"),
    ({"use_vllm": True, "vllm_tensor_parallel_size": 0}, "vllm_tensor_parallel_size"),
    ({"use_vllm": True, "vllm_mode": "remote"}, "vllm_mode"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "a\tb"}, "vllm_server_host"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_server_port": 9000, "vllm_group_port": 9000}, "vllm_group_port"),
    ({"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "localhost", "vllm_server_port": 8000,
      "objective": "armor", "anchor": True, "ref_vllm_mode": "server", "ref_vllm_server_host": "127.0.0.1",
      "ref_vllm_server_port": 8000}, "ref_vllm_server_port"),
    ({"use_vllm": True, "vllm_gpu_memory_utilization": 0.8, "objective": "armor", "anchor": True,
      "ref_vllm_mode": "colocate", "ref_vllm_memory": 0.3}, "ref_vllm_memory"),
])
def test_trl_vllm_fields_are_checked_up_front(raw, key):
    err = _err(resolve, raw, file="cfg.yaml")
    assert (err.key, err.file) == (key, "cfg.yaml") and err.value == raw[key]


def test_use_vllm_without_vllm_is_an_error_where_this_machine_trains(monkeypatch):
    import importlib.util

    from armorlab.core.vllm_config import check_vllm_installed

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    cfg = resolve({"use_vllm": True})  # a dry run for a cluster may resolve it
    err = _err(check_vllm_installed, cfg, "cfg.yaml")
    assert (err.key, err.value, err.file) == ("use_vllm", True, "cfg.yaml") and "not installed" in str(err)
    check_vllm_installed(resolve({}), "cfg.yaml")  # nothing asked of vLLM: fine


# --------------------------------------------------------------------------- model dirs
def _st(header: dict, payload: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + payload


DAMAGE = {
    "no weights": (lambda m: (m / "model.safetensors").unlink(), "no weights"),
    "config not JSON": (lambda m: (m / "config.json").write_text("{"), "config.json is not valid JSON"),
    "config a list": (lambda m: (m / "config.json").write_text("[]"), "JSON object, not a list"),
    "no model_type": (lambda m: (m / "config.json").write_text("{}"), "no model_type"),
    "empty weights": (lambda m: (m / "model.safetensors").write_bytes(b""), "is empty"),
    "truncated tensor": (lambda m: (m / "model.safetensors").write_bytes(
        _st({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)), "is truncated"),
    "header past the end": (lambda m: (m / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}"),
                            "does not fit"),
    "missing shard": (lambda m: (m / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors"}})), "missing"),
    "no tokenizer": (lambda m: [(m / n).unlink() for n in ("tokenizer.json", "tokenizer_config.json")], "no tokenizer"),
    "tokenizer not JSON": (lambda m: (m / "tokenizer.json").write_text("{"), "tokenizer.json is not valid JSON"),
    "config a directory": (lambda m: ((m / "config.json").unlink(), (m / "config.json").mkdir()), "directory"),
    "a FIFO": (lambda m: os.mkfifo(m / "notes"), "FIFO"),
    "a symlink loop": (lambda m: os.symlink("loop", m / "loop"), "symlink loop"),
    "a dangling link": (lambda m: os.symlink(m / "gone", m / "extra.bin"), "dangling symlink"),
    "vocab_size 1e12": (lambda m: (m / "config.json").write_text(
        '{"model_type": "qwen2", "hidden_size": 64, "vocab_size": 1e12}'), "vocab_size is 1000000000000.0"),
    "-28 layers": (lambda m: (m / "config.json").write_text(
        '{"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": -28}'), "num_hidden_layers is -28"),
    "a chat template that does not parse": (lambda m: (m / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m.content }}"})), "chat template does not parse"),
    "a chat template that raises": (lambda m: (m / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ raise_exception('System role not supported') }}"})), "System role not supported"),
    "a chat_template.jinja that raises": (lambda m: (m / "chat_template.jinja").write_text(
        "{{ messages[0]['content'] / 0 }}"), "chat template raises"),
}


def test_a_working_chat_template_passes(tmp_path):
    model = fake_model_dir(tmp_path / "m")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")}))
    assert resolve({"model": str(model)})["model"]["name"] == str(model)


@pytest.mark.parametrize("field, value", [("num_hidden_layers", -28), ("vocab_size", 1e12), ("num_attention_heads", 0),
                                          ("hidden_size", "64"), ("intermediate_size", True)])
def test_the_memory_plan_refuses_sizes_no_model_has(field, value):
    from armorlab.core.plan_inputs import shape_from_config

    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, field: value}
    err = _err(shape_from_config, cfg, name="m", source="m/config.json")
    assert (err.key, err.value, err.file) == ("model", "m", "m/config.json") and field in str(err)
    assert shape_from_config({**cfg, field: 8 if field != "hidden_size" else 64}, name="m", source="x").num_layers > 0


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_model_dir_is_named_before_anything_loads(tmp_path, damage):
    model = fake_model_dir(tmp_path / "m")
    resolve({"model": str(model)})  # whole: fine
    change, words = DAMAGE[damage]
    change(model)
    err = _err(resolve, {"model": str(model)}, file="cfg.yaml")
    assert (err.key, err.value, err.file) == ("model", str(model), "cfg.yaml")
    assert words in str(err), str(err)


def test_model_and_data_paths_that_are_fifos_or_loops(tmp_path):
    os.mkfifo(tmp_path / "data.jsonl")
    os.symlink("loop", tmp_path / "loop")
    err = _err(resolve, {"task": {"name": "math", "path": str(tmp_path / "data.jsonl")}}, file="cfg.yaml")
    assert (err.key, err.value, err.file) == ("task.path", str(tmp_path / "data.jsonl"), "cfg.yaml")
    assert "FIFO" in str(err) and "not a regular file" in str(err)
    err = _err(resolve, {"model": str(tmp_path / "loop")}, file="cfg.yaml")
    assert err.key == "model" and "symlink loop" in str(err)


def test_a_fifo_inside_a_dataset_dir_never_blocks_the_fingerprint(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "state.json").write_text("{}")
    os.mkfifo(ds / "data-00000-of-00001.arrow")
    box = {}
    t = threading.Thread(target=lambda: box.update(err=_err(resolve, {"task": {"name": "math", "path": str(ds)}},
                                                            file="cfg.yaml")), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    err = box["err"]
    assert (err.key, err.file) == ("task.path", str(ds / "data-00000-of-00001.arrow")) and "FIFO" in str(err)


# --------------------------------------------------------------------------- data
def _rows(path: Path, extra: str, n: int = 12) -> Path:
    path.write_text("".join(json.dumps({"problem": f"q{i}", "answer": str(i)}) + "\n" for i in range(n)) + extra)
    return path


@pytest.mark.parametrize("line, words", [
    ('{"problem": "p", "answer": ' + "9" * 5000 + "}\n", "write it as a string"),
    ('{"problem": "p", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}\n", "nested too deeply"),
])
def test_data_lines_python_cannot_read_are_named(tmp_path, line, words):
    from armorlab.tasks import build_task

    data = _rows(tmp_path / "d.jsonl", line)
    err = _err(build_task, {"name": "math", "path": str(data), "val_size": 2, "test_size": 2})
    assert (err.key, err.value, err.file) == ("task.path", str(data), str(data))
    assert "line 13" in str(err) and words in str(err)


@pytest.mark.parametrize("files", [{"state.json": "{}", "dataset_info.json": "{}"}, {"dataset_dict.json": "{}"}])
def test_a_damaged_save_to_disk_dir_is_named(tmp_path, files):
    from armorlab.tasks import build_task

    ds = tmp_path / "ds"
    ds.mkdir()
    for name, text in files.items():
        (ds / name).write_text(text)
    err = _err(build_task, {"name": "math", "path": str(ds), "val_size": 2, "test_size": 2})
    assert err.key == "task.path" and err.value == str(ds.resolve()) and "damaged save_to_disk" in str(err)
