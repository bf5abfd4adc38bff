"""A user's own checkpoint and data: chat templates, one reference copy, a Qwen2 run end to end."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
import torch

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir, run_id
from tests.checkpoint_support import build as build_checkpoint
from tests.checkpoint_support import tokenizer as chat_tokenizer
from tests.trainer_support import build, resolved

ROWS = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]


def _data(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_chat_prompts_go_through_the_tokenizers_chat_template(tmp_path):
    from trl.data_utils import maybe_apply_chat_template

    from armorlab.tasks import build_task
    from armorlab.train.models import has_chat_template

    task_cfg = {"name": "math", "path": str(_data(tmp_path / "d.jsonl")), "val_size": 2, "test_size": 2,
                "system_prompt": "Reason, then answer in \\boxed{}.",
                "prompt_template": "Problem: {problem}\nAnswer:"}
    chat = build_task(task_cfg, chat=True)
    prompt, answer = chat.train[0]["prompt"], chat.train[0]["answer"]
    problem = next(r["problem"] for r in ROWS if r["answer"] == answer)
    assert prompt == [{"role": "system", "content": "Reason, then answer in \\boxed{}."},
                      {"role": "user", "content": f"Problem: {problem}\nAnswer:"}]
    # what TRL sends the model: the tokenizer's ChatML rendering, ending in the assistant turn
    text = maybe_apply_chat_template({"prompt": prompt}, chat_tokenizer())["prompt"]
    assert text == ("<|im_start|>system\nReason, then answer in \\boxed{}.<|im_end|>\n"
                    f"<|im_start|>user\nProblem: {problem}\nAnswer:<|im_end|>\n<|im_start|>assistant\n")
    plain = build_task({**task_cfg, "chat": False}, chat=True)  # an explicit chat: false wins
    assert plain.train[0]["prompt"] == f"Reason, then answer in \\boxed{{}}.\n\nProblem: {problem}\nAnswer:"
    # a conversational dataset (TRL's format) is taken as it is, with the system prompt put first
    conv = _data(tmp_path / "c.jsonl", [{"problem": [{"role": "user", "content": r["problem"]}], "answer": r["answer"]}
                                         for r in ROWS])
    task = build_task({**task_cfg, "path": str(conv), "prompt_template": None}, chat=True)
    assert task.train[0]["prompt"][0]["role"] == "system" and task.train[0]["prompt"][1]["role"] == "user"
    from armorlab.errors import ArmorLabError

    with pytest.raises(ArmorLabError, match="task.chat"):
        build_task({**task_cfg, "path": str(conv)}, chat=False)
    with pytest.raises(ArmorLabError, match="task.prompt_template"):
        resolve({"task": {**task_cfg, "prompt_template": "no placeholder"}})
    # the default follows the model: a tokenizer saved with a chat template, one without
    chat_tokenizer().save_pretrained(tmp_path / "with")
    chat_tokenizer(chat_template=False).save_pretrained(tmp_path / "without")
    assert has_chat_template(tmp_path / "with") and not has_chat_template(tmp_path / "without")


def _parameters_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is torch.nn.Parameter)


def test_beta_keeps_exactly_one_reference_copy(tmp_path):
    before = _parameters_alive()
    trainer = build(tmp_path, resolved(beta=0.01))
    n_policy = len(list(trainer.model.parameters()))
    assert trainer.beta == 0.01 and trainer.args.beta == 0.01 and trainer.ref_model is trainer.reference.model
    # policy + one reference; TRL's own reference (a third copy) is never loaded
    assert _parameters_alive() - before == 2 * n_policy
    assert [m is trainer.ref_model for m in trainer.accelerator._models] == [True]  # the policy's comes in train()


def test_real_checkpoint_like_model_trains_end_to_end(tmp_path):
    """Qwen2 architecture + byte-level BPE + chat template, saved to a dir; math data; β ≠ 0."""
    model = build_checkpoint(tmp_path / "qwen2")
    data = _data(tmp_path / "math.jsonl")
    cfg_path = tmp_path / "run.yaml"
    cfg = {"model": str(model), "objective": "armor", "beta": 0.01, "max_steps": 2, "num_generations": 4,
           "per_device_train_batch_size": 8, "max_completion_length": 8, "val_every": 2, "val_samples": 2,
           "kl_probe_prompts": 2, "task": {"name": "math", "path": str(data), "val_size": 2, "test_size": 2,
                                           "system_prompt": "Put the final answer in \\boxed{}."}}
    cfg_path.write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def train():
        return subprocess.run([sys.executable, "-m", "armorlab.cli", "train", str(cfg_path), "--out",
                               str(tmp_path / "runs")], capture_output=True, text=True, env=env, timeout=600)

    out = train()
    assert out.returncode == 0, out.stderr[-3000:]
    rd = RunDir(out.stdout.strip().splitlines()[-1])
    status = rd.read_status()
    stored = rd.read_config()
    assert status["state"] == "completed" and stored["learning_rate"] == 1e-6  # the real-model preset
    assert stored["model"]["fingerprint"] and stored["task"]["fingerprint"] and stored["task"]["chat"] is None
    metrics = rd.read_metrics()
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert {"train/reward", "kl/reverse_k3", "obj/beta_kl", "val/acc"} <= set(metrics[-1])
    # a random model never finishes in 8 tokens nor solves anything: the run says so
    assert any("max_completion_length" in w for w in status["warnings"])
    again = train()
    assert again.returncode == 0 and "already completed" in again.stderr
    # check-task: the prompt as the model sees it (ChatML), the gold answer's and a sample's reward
    from armorlab.commands.check_task import check_rows

    shown = check_rows(resolve(cfg), rows=2, split="val", seed=0)
    assert len(shown) == 2
    for row in shown:
        assert row["prompt"].startswith("<|im_start|>system\nPut the final answer in \\boxed{}.<|im_end|>\n")
        assert row["prompt"].endswith("<|im_start|>assistant\n") and row["gold_reward"] == 1.0
        assert row["gold_completion"] == f"\\boxed{{{row['answer']}}}" and row["reward"] in (0.0, 1.0)
    build_checkpoint(model, seed=1)  # new weights in the same place: a new run
    assert run_id(resolve(stored)) != rd.id
