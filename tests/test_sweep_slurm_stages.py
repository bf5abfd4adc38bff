"""Stages on the real one-node Slurm cluster: a later stage's jobs are queued at once and wait for
their parent's job (afterok), start from the weights of the step the parent selected (policy and
π_ref), and a failed parent fails its children with the reason.

One sweep, two stage-1 runs (one trains the tiny model for 4 steps, one names a model that cannot be
loaded and fails at start-up) and one continuing run of each: four small jobs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time

import pytest
from model_dirs import fake_model_dir
from sweep_support import run_cli, slurm_cluster, wait_finished, write_spec  # noqa: F401 - a fixture

from armorlab.core.runs import RunDir
from armorlab.sweeps.manifest import load_manifest
from tests.trainer_support import model_cache

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]

# The trainer tests' tiny model (built once per machine in their cache, warm-started so that rewards
# vary and a step moves the weights): 4 steps, an eval and a checkpoint at each.
TINY = {"max_steps": 4, "val_every": 1, "save_steps": 1, "val_samples": 2, "kl_probe_prompts": 0,
        "per_device_train_batch_size": 16, "num_generations": 8, "steps_per_generation": 2, "learning_rate": 5e-3,
        "task": {"name": "arithmetic", "train_size": 8, "val_size": 16, "test_size": 16}}


def _hash(checkpoint) -> str:
    """The weights' hash restated (name, dtype, shape, bytes of each tensor in name order), over the
    checkpoint as transformers loads it."""
    import torch
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(str(checkpoint)).state_dict()
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous()
        h.update(name.encode() + b"\0" + str(t.dtype).encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0")
        h.update(bytes(t.reshape(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def _selected_step(parent: RunDir) -> int:
    """The step the parent's trainer selected (selected.json), else the one its metrics give by the
    noise-aware rule among the checkpoints it kept."""
    from armorlab.stats.select import select_checkpoints

    path = parent.path / "selected.json"
    if path.exists():
        return json.loads(path.read_text())["step"]
    rows = [r for r in parent.read_metrics() if "val/acc" in r]
    kept = [int(cp.name.split("-")[1]) for cp in parent.checkpoints()]
    return select_checkpoints([r["step"] for r in rows], [r["val/acc"] for r in rows], eligible=kept)[0].step


def test_a_later_stage_waits_for_its_parents_starts_from_their_selection_and_fails_with_them(tmp_path):
    # well-formed on disk (the checks at resolve time pass), but its weights are not the model's:
    # transformers cannot load it, so that parent fails at start-up
    broken = fake_model_dir(tmp_path / "broken-model")
    profile = tmp_path / "profile.yaml"
    profile.write_text("executor: slurm\ncpus_per_task: 1\ntime_min: 20\narray_parallelism: 2\n")
    spec = write_spec(tmp_path / "proto.yaml", {
        "name": "proto", "base": TINY,
        "stages": [{"name": "first", "include": [{"model": str(broken)}]},
                   {"name": "then", "from": {"stage": "first", "select": {"metric": "val/acc", "mode": "max"}},
                    "base": {"max_steps": 1}}]})
    root = tmp_path / "runs"
    started = time.monotonic()
    out = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile),
                  env={"ARMORLAB_CACHE": model_cache()})
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "proto"
    manifest = load_manifest(sweep_dir)
    parents = manifest.parents
    assert len(parents) == 2 and all(manifest.stages[p] == "first" for p in parents.values())
    # every job is queued at once; the continuing ones wait for their parent's job
    queue = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%E"], capture_output=True, text=True, check=True).stdout
    deps = dict(line.split("|", 1) for line in queue.splitlines())
    for child, parent in parents.items():
        child_job, parent_job = manifest.last_job(child), manifest.last_job(parent)
        assert deps[child_job].startswith(f"afterok:{parent_job}"), (child_job, deps)
    st = wait_finished(sweep_dir, 900)
    elapsed = time.monotonic() - started
    rows = {r.run_id: r for r in st.rows}
    good = next(p for p in parents.values() if rows[p].state == "completed")
    bad = next(p for p in parents.values() if p != good)
    assert rows[bad].state == "failed" and str(broken) in rows[bad].reason
    for child, parent in parents.items():
        if parent == bad:  # never started: Slurm cancelled its job, status says why
            assert rows[child].state == "failed", (rows[child], elapsed)
            assert rows[child].reason.startswith(f"not started: the run it continues from ({bad}) failed")
            assert not (sweep_dir / child / "init.json").exists()
            continue
        assert rows[child].state == "completed", rows[child]
        init = json.loads((sweep_dir / child / "init.json").read_text())
        step = _selected_step(RunDir(sweep_dir / good))
        kept = RunDir(sweep_dir / good).checkpoints()
        hashes = {int(cp.name.split("-")[1]): _hash(cp) for cp in kept}
        assert len(set(hashes.values())) == len(hashes) > 1  # the steps' weights tell them apart
        assert init["step"] == step and init["run"] == f"proto/{good}"
        assert init["params_sha256"] == init["ref_params_sha256"] == hashes[step]
    status = run_cli("status", str(sweep_dir), env={"COLUMNS": "300"})
    assert status.returncode == 0 and "not started: the run it continues from" in status.stdout
    again = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile), env={"COLUMNS": "300"})
    assert "nothing to submit" in again.stdout and "2 completed" in again.stdout, again.stdout
    print(f"two-stage Slurm sweep: {elapsed:.0f} s from submission to the last job's end")


def test_a_continuation_on_slurm_restores_the_parents_optimizer_and_takes_pi_ref_from_another_selection(tmp_path):
    """init_from.optimizer: parent, selection of the last checkpoint and ref_from an earlier selection
    of the same parent, through the real queue: the child waits (afterok) and starts as asked."""
    profile = tmp_path / "profile.yaml"
    profile.write_text("executor: slurm\ncpus_per_task: 1\ntime_min: 20\narray_parallelism: 2\n")
    spec = write_spec(tmp_path / "cont.yaml", {
        "name": "cont", "base": TINY,
        "stages": [{"name": "first", "base": {"save_total_limit": None}},   # every checkpoint stays
                   {"name": "then", "from": {"stage": "first", "select": {"mode": "last"}, "optimizer": "parent"},
                    "ref_from": {"stage": "first", "select": {"step": 2}}, "base": {"max_steps": 1}}]})
    root = tmp_path / "runs"
    out = run_cli("sweep", str(spec), "--root", str(root), "--profile", str(profile),
                  env={"ARMORLAB_CACHE": model_cache()})
    assert out.returncode == 0, out.stdout + out.stderr
    sweep_dir = root / "cont"
    manifest = load_manifest(sweep_dir)
    [(child, parent)] = manifest.parents.items()
    queue = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%E"], capture_output=True, text=True, check=True).stdout
    deps = dict(line.split("|", 1) for line in queue.splitlines())
    assert deps[manifest.last_job(child)].startswith(f"afterok:{manifest.last_job(parent)}"), deps
    st = wait_finished(sweep_dir, 900)
    rows = {r.run_id: r for r in st.rows}
    assert rows[parent].state == rows[child].state == "completed", (rows[parent], rows[child])
    checkpoints = sweep_dir / parent / "checkpoints"
    init = json.loads((sweep_dir / child / "init.json").read_text())
    assert init["step"] == 4 and init["params_sha256"] == _hash(checkpoints / "checkpoint-4")
    assert init["ref_params_sha256"] == _hash(checkpoints / "checkpoint-2") != init["params_sha256"]
    # the parent's constant LR goes on (its scheduler restored, no warm-up) and Adam's step count too
    lrs = [r["train/learning_rate"] for r in RunDir(sweep_dir / child).read_metrics() if "train/learning_rate" in r]
    assert lrs == [TINY["learning_rate"]]
    import torch

    [ckpt] = RunDir(sweep_dir / child).checkpoints()
    state = torch.load(ckpt / "optimizer.pt", weights_only=True)["state"]
    assert {int(s["step"]) for s in state.values()} == {5}  # 4 updates of the parent + 1 of its own
