"""Tiny model: char tokenizer, cached build (reuse, locking, crash safety), warm start, TRL generation."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from model_dirs import fake_model_dir

from armorlab.core.config import resolve
from armorlab.errors import ArmorLabError
from armorlab.tasks import build_task
from armorlab.train import models

DEFAULT = resolve({})
# A model small and short enough to build in about a second, for the cache-mechanics tests.
SMALL = {"name": "tiny", "hidden_size": 64, "num_heads": 2, "num_layers": 1, "warm_start_steps": 20,
         "warm_start_target": None}
SMALL_TASK = {"name": "arithmetic", "digits": 1, "val_size": 8, "test_size": 8, "train_size": 16}


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The default tiny model (2-digit addition), built once in the shared cache and reused."""
    return models.prepare_model(DEFAULT["model"], DEFAULT["task"])


@pytest.fixture(scope="session")
def tokenizer():
    return models.build_tokenizer()


# --------------------------------------------------------------------------- tokenizer
@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(models.CHARS)))
def test_tokenizer_round_trip(tokenizer, text):
    assume(not any(special in text for special in models.SPECIAL_TOKENS))  # those map to their own id
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert len(ids) == len(text) + 1  # one token per char
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_specials_and_unknowns(tokenizer):
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id}
    assert len(ids) == 4 and None not in ids
    assert len(tokenizer) == 4 + 95 + 2  # specials + printable ASCII + \n \t
    assert tokenizer("é")["input_ids"] == [tokenizer.bos_token_id, tokenizer.unk_token_id]
    enc = tokenizer(["07+42=", "1+2="], padding=True)
    assert enc["input_ids"][1][:2] == [tokenizer.pad_token_id] * 2  # left padding for generation
    assert enc["attention_mask"][1] == [0, 0, 1, 1, 1, 1, 1]
    assert tokenizer.decode([*tokenizer("049", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id],
                            skip_special_tokens=True) == "049"


def test_saved_tokenizer_loads_identically(default_model, tokenizer):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(default_model)
    for text in ["07+42=", "a b\n\tc  ~!", "  leading and trailing  ", "x é y", ""]:
        assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"], text
    assert loaded.decode(loaded("a b\n c")["input_ids"], skip_special_tokens=True) == "a b\n c"
    assert (loaded.padding_side, loaded.eos_token, loaded.pad_token, loaded.bos_token) == \
        ("left", models.EOS, models.PAD, models.BOS)


# --------------------------------------------------------------------------- the default model
def test_default_model_layout(default_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(default_model)
    cfg = model.config
    assert cfg.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert cfg.hidden_size // cfg.num_attention_heads >= 32
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 3, 4)
    assert Path(cfg._name_or_path) == default_model
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.4e6 < n_params < 1.2e6


def test_warm_start_accuracy_on_val_at_t1(default_model):
    """Measured here independently: sampling at T=1 (as the RL trainer does), string compare."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task = build_task(DEFAULT["task"])
    model = AutoModelForCausalLM.from_pretrained(default_model).eval()
    tok = AutoTokenizer.from_pretrained(default_model)
    prompts, answers = list(task.val["prompt"]), list(task.val["answer"])
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(123)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=None, top_p=None, max_new_tokens=6,
                             num_return_sequences=4)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    gold = [a for a in answers for _ in range(4)]
    acc = sum(t.strip() == g for t, g in zip(texts, gold, strict=True)) / len(gold)
    assert 0.2 <= acc <= 0.7, acc
    # eos ends the answer: nearly every completion is 3 chars long, right or wrong
    assert sum(len(t) == 3 for t in texts) / len(texts) > 0.9
    meta = json.loads((default_model / models.METADATA).read_text())
    assert 0.2 <= meta["val_acc_t1"] <= 0.7
    assert meta["warm_start"]["steps"] <= DEFAULT["model"]["warm_start_steps"]


# --------------------------------------------------------------------------- the cache
def test_cache_reuse_does_not_rebuild(tmp_path):
    first = models.prepare_model(SMALL, SMALL_TASK, cache_dir=tmp_path)
    weights = first / "model.safetensors"
    mtime, builds = weights.stat().st_mtime_ns, models.builds
    again = models.prepare_model(SMALL, {**SMALL_TASK, "train_size": 4}, cache_dir=tmp_path)
    assert again == first and models.builds == builds and weights.stat().st_mtime_ns == mtime
    other = models.prepare_model({**SMALL, "warm_start_seed": 1}, SMALL_TASK, cache_dir=tmp_path)
    assert other != first and models.builds == builds + 1
    assert [p.name for p in tmp_path.joinpath("models").iterdir() if p.is_dir()] != []
    assert not [p for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".tiny-")]


def test_building_leaves_the_callers_rng_alone(tmp_path):
    import torch

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    models.prepare_model(SMALL, SMALL_TASK, cache_dir=tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_cache_key_covers_warm_start_settings(tmp_path):
    key = models.model_key
    m, t = resolve({"model": SMALL})["model"], resolve({"task": SMALL_TASK})["task"]
    assert key(m, t) == key(m, {**t, "train_size": 999})  # the warm-start pool ignores train_size
    assert key(m, t) == key(m, {**t, "val_size": 4})  # and held-out sizes within the reserve (25 of 100)
    assert key(m, t) != key(m, {**t, "val_size": 30})  # 38 held out > reserve: the pool starts later
    assert key(m, t) != key(m, {**t, "digits": 2})
    assert key(m, t) != key(m, {**t, "split_seed": 1})  # held-out set changes the pool
    assert key(m, t) != key({**m, "hidden_size": 96}, t)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"problem": "1+1", "answer": "2"}\n')
    b.write_text('{"problem": "1+1", "answer": "3"}\n')
    math_cfg = {"name": "math", "path": str(a), "problem_key": "problem", "answer_key": "answer",
                "val_size": 1, "test_size": 1, "train_size": None, "split_seed": 0}
    assert key(m, math_cfg) != key(m, {**math_cfg, "path": str(b)})  # content, not the name


def test_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    a = models.prepare_model(SMALL, SMALL_TASK, cache_dir=tmp_path / "a")
    b = models.prepare_model(SMALL, SMALL_TASK, cache_dir=tmp_path / "b")
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(models, "warm_start", boom)
    with pytest.raises(RuntimeError, match="mid-build"):
        models.prepare_model(SMALL, SMALL_TASK, cache_dir=tmp_path)
    assert not [p for p in (tmp_path / "models").iterdir() if p.is_dir()]
    monkeypatch.undo()
    path = models.prepare_model(SMALL, SMALL_TASK, cache_dir=tmp_path)
    assert (path / models.METADATA).is_file()


_RACER = """
import json, logging, sys, time
from pathlib import Path
from armorlab.train import models
logging.basicConfig(level=logging.INFO)
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()                 # imports done: ready
while not go.exists():
    time.sleep(0.01)
path = models.prepare_model(json.loads(sys.argv[4]), json.loads(sys.argv[5]), cache_dir=sys.argv[1])
print(json.dumps({"path": str(path), "builds": models.builds}))
"""


def test_concurrent_builds_build_once(tmp_path):
    cfg = {**SMALL, "warm_start_steps": 150}  # long enough that the two calls overlap
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path / "cache"), str(go),
                               str(tmp_path / f"ready{i}"), json.dumps(cfg), json.dumps(SMALL_TASK)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()
    outs, errs = [], []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
        errs.append(err)
    assert outs[0]["path"] == outs[1]["path"]
    assert sorted(o["builds"] for o in outs) == [0, 1]
    assert sum("waiting for another process" in e for e in errs) == 1  # they really raced
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(outs[0]["path"])


def test_other_model_names_pass_through(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path / "cache"))
    # a hub id the local HF cache holds (its layout: refs/main → snapshots/<commit>/)
    repo, commit = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B", "a" * 40
    fake_model_dir(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert str(models.prepare_model({"name": "Qwen/Qwen2.5-0.5B"}, {"name": "arithmetic"})) == "Qwen/Qwen2.5-0.5B"
    fake_model_dir(tmp_path / "model")
    assert models.prepare_model(str(tmp_path / "model"), "arithmetic") == tmp_path / "model"
    assert not (tmp_path / "cache").exists()  # nothing built, nothing cached


def test_unusable_cache_dir_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ARMORLAB_CACHE", str(blocker / "cache"))
    with pytest.raises(ArmorLabError, match=r"cannot create the tiny-model cache.*ARMORLAB_CACHE"):
        models.prepare_model(SMALL, SMALL_TASK)


def test_cache_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    monkeypatch.delenv("ARMORLAB_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "armorlab"


# --------------------------------------------------------------------------- TRL generation
def test_grpo_trainer_smoke(default_model, tmp_path):
    """2 DAPO steps with TRL's own GRPOTrainer: prompts left-padded, eos stops generation."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    task = build_task(DEFAULT["task"])
    seen: list[str] = []

    def record(prompts, completions, answer, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False,
                      report_to=[], max_steps=2, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, loss_type="dapo", learning_rate=1e-4, logging_steps=1,
                      save_strategy="no", beta=0.04, seed=0)
    trainer = GRPOTrainer(model=str(default_model), reward_funcs=[*task.reward_funcs, record], args=args,
                          train_dataset=task.train, processing_class=AutoTokenizer.from_pretrained(default_model))
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    assert logs and all(h["completions/mean_length"] < 6 for h in logs)  # 3 chars + eos, not 8
    assert all(isinstance(c, str) for c in seen) and len(seen) >= 16
    assert sum(len(c) == 3 and c.isdigit() for c in seen) / len(seen) > 0.9
    assert sum(h.get("rewards/exact_match_reward/mean", 0.0) for h in logs) > 0  # some are right
