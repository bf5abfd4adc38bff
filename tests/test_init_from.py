"""Continual training (init_from): a run starts from the checkpoint its parent selected, with π_ref
initialised to it, records the start in init.json, and refuses a parent that cannot give one."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, TrainerCallback

from armorlab.core.config import resolve
from armorlab.core.fsutil import atomic_write_json
from armorlab.core.runs import RunDir, run_id
from armorlab.errors import ArmorLabError
from armorlab.train.init_from import FROM_INIT, FROM_METRICS, FROM_SELECTED, INIT, SELECTED, find_start
from armorlab.train.launch import train_run_dir
from tests.trainer_support import model_cache, resolved


@pytest.fixture(autouse=True)
def _cache(monkeypatch):
    monkeypatch.setenv("ARMORLAB_CACHE", model_cache())
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "ARMORLAB_JOB_ID"):
        monkeypatch.delenv(var, raising=False)


def _hash(state) -> str:
    """The weights' hash restated: name, dtype, shape and bytes of each tensor, in name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode() + b"\0" + str(t.dtype).encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0")
        h.update(bytes(t.reshape(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def _weights(checkpoint) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(str(checkpoint)).state_dict()


class FirstWeights(TrainerCallback):
    """The policy's weights when training begins, before any update."""

    def __init__(self):
        self.state = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A completed 4-step run with an eval and a checkpoint at every step, all kept."""
    import os

    os.environ.setdefault("ARMORLAB_CACHE", model_cache())
    root = tmp_path_factory.mktemp("runs")
    cfg = resolved(max_steps=4, val_every=1, save_steps=1, save_total_limit=None, learning_rate=5e-3)
    rd = RunDir.create(root / "stage1", cfg)
    assert train_run_dir(rd.path).state == "completed"
    assert [cp.name for cp in rd.checkpoints()] == [f"checkpoint-{s}" for s in (1, 2, 3, 4)]
    return rd


def _child(parent_rd, **extra):
    cfg = resolved(max_steps=1, init_from={"run": f"stage1/{parent_rd.id}"}, **extra)
    return RunDir.create(parent_rd.path.parent.parent / "stage2", cfg)


def test_a_continuing_run_starts_from_the_selected_checkpoint_for_policy_and_reference(parent):
    at3, at4 = _weights(parent.path / "checkpoints/checkpoint-3"), _weights(parent.path / "checkpoints/checkpoint-4")
    assert _hash(at3) != _hash(at4)  # else the test could not tell the steps apart
    atomic_write_json(parent.path / SELECTED, {"rule": "test", "metric": "val/acc", "mode": "max", "step": 3,
                                               "rollout": 2, "value": 0.5, "checkpoint": "checkpoints/checkpoint-3"})
    child = _child(parent)
    seen = FirstWeights()
    assert train_run_dir(child.path, callbacks=[seen]).state == "completed"
    assert seen.state.keys() == at3.keys()
    assert all(torch.equal(seen.state[k], at3[k]) for k in at3)  # the policy holds step 3's weights
    init = json.loads((child.path / INIT).read_text())
    assert (init["run"], init["step"], init["rollout"], init["source"]) == (f"stage1/{parent.id}", 3, 2, FROM_SELECTED)
    assert init["checkpoint"] == str((parent.path / "checkpoints/checkpoint-3").absolute())
    assert init["params_sha256"] == init["ref_params_sha256"] == _hash(at3)  # π_ref too
    # the run id follows the parent: another parent, another run
    other = resolve({**child.read_config(), "init_from": {"run": "stage1/0123456789ab"}})
    assert run_id(other) != child.id


def test_without_selected_json_the_start_is_computed_from_the_metrics_among_kept_checkpoints(parent, caplog):
    (parent.path / SELECTED).unlink(missing_ok=True)
    gone = parent.path / "checkpoints" / "checkpoint-2"
    gone.rename(gone.with_name("removed-2"))  # a pruned checkpoint cannot be chosen
    try:
        child = _child(parent, seed=1)
        assert train_run_dir(child.path).state == "completed"
    finally:
        gone.with_name("removed-2").rename(gone)
    init = json.loads((child.path / INIT).read_text())
    # the rule restated: each eval (steps 0..4) is scored by the mean of the evals one before to one
    # after it that exist; the best level whose step still has its checkpoint (1, 3 or 4) wins
    vals = [r["val/acc"] for r in parent.read_metrics() if "val/acc" in r]
    assert len(vals) == 5 and (parent.path / "checkpoints" / "checkpoint-4").is_dir()
    levels = {1: sum(vals[0:3]) / 3, 3: sum(vals[2:5]) / 3, 4: sum(vals[3:5]) / 2}
    best = max(levels, key=lambda mid: (levels[mid], -mid))
    assert (init["step"], init["source"]) == (best, FROM_METRICS)
    assert math.isclose(init["value"], levels[best])
    assert "no selected.json" in caplog.text


def test_a_resumed_child_keeps_its_recorded_start(parent):
    child = _child(parent, seed=2)
    atomic_write_json(child.path / INIT, {"run": f"stage1/{parent.id}", "step": 4, "rollout": None,
                                          "checkpoint": str(parent.path / "checkpoints/checkpoint-4"),
                                          "source": FROM_SELECTED})
    atomic_write_json(parent.path / SELECTED, {"rule": "test", "metric": "val/acc", "mode": "max", "step": 3,
                                               "rollout": 2, "value": 0.5, "checkpoint": "checkpoints/checkpoint-3"})
    start = find_start(child, child.read_config()["init_from"])
    assert (start.step, start.source) == (4, FROM_SELECTED)
    (child.path / INIT).unlink()
    start = find_start(child, child.read_config()["init_from"])
    assert (start.step, start.source) == (3, FROM_SELECTED)
    assert FROM_INIT == "init.json"


def test_a_parent_that_did_not_complete_or_is_missing_fails_the_child_with_the_reason(parent, tmp_path):
    child = _child(parent, seed=3)
    status = parent.read_status()
    try:
        parent.write_status("failed", reason="non-finite loss at step 2")
        with pytest.raises(ArmorLabError, match="is failed: non-finite loss at step 2") as exc:
            train_run_dir(child.path)
        assert exc.value.key == "init_from.run"
        assert child.read_status()["state"] == "failed"
        assert "non-finite loss" in child.read_status()["reason"]
    finally:
        atomic_write_json(parent.status_path, status)
    orphan = RunDir.create(tmp_path / "s2", resolved(max_steps=1, init_from={"run": "nosuch/0123456789ab"}))
    with pytest.raises(ArmorLabError, match="no run to continue from"):
        find_start(orphan, orphan.read_config()["init_from"])


def test_vllm_servers_of_a_continuing_run_serve_the_selected_checkpoint(parent, tmp_path):
    import os

    from armorlab.vllm.servers import ServerError, server_model

    atomic_write_json(parent.path / SELECTED, {"rule": "test", "metric": "val/acc", "mode": "max", "step": 3,
                                               "rollout": 2, "value": 0.5, "checkpoint": "checkpoints/checkpoint-3"})
    child = _child(parent, seed=4)
    assert server_model(child, os.environ) == str((parent.path / "checkpoints/checkpoint-3").absolute())
    orphan = RunDir.create(tmp_path / "s2", resolved(max_steps=1, init_from={"run": "nosuch/0123456789ab"}))
    with pytest.raises(ServerError, match="no run to continue from"):
        server_model(orphan, os.environ)
