"""Two real training processes on CPU (torchrun, gloo) through the `armorlab train` command.

One ARMOR config exercises everything a cluster run relies on at once: anchors with a local batch
(12 rows) that G = 8 does not divide, so a group straddles the processes; the gate and the
solved-group check (``anchor_skip_solved``); reference
resets; validation and the exact-KL probe; the token dump; checkpoints. One run goes through
uninterrupted; a second one is killed (SIGKILL, no checkpoint on the way out) after its step-2
checkpoint and started again: it must end with the uninterrupted run's metrics.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from armorlab.core.runs import RunDir
from tests.test_equivalence import torchrun
from tests.trainer_support import model_cache

CONFIG = {
    "objective": "armor", "anchor_gate": True, "ref_reset_steps": 2, "max_steps": 4, "seed": 0,
    # the solved-group check gathers every process's rewards: a straddling group needs both
    "dynamic_sampling": True, "anchor_skip_solved": True,
    "per_device_train_batch_size": 12, "num_generations": 8, "steps_per_generation": 1,
    "val_every": 2, "val_samples": 2, "kl_probe_prompts": 2, "token_sample_rate": 0.5, "save_steps": 2,
    "task": {"name": "arithmetic", "train_size": 8, "val_size": 8, "test_size": 8},
}
COMPARED = ("train/reward", "train/loss", "obj/policy_loss", "kl/reverse_k3", "kl/forward_k3", "cap/pos_mean",
            "anchor/rate", "anchor/gate_drop", "ref/resets", "val/acc", "test/acc", "kl/exact_reverse",
            "kl/exact_forward")


def _train_argv(cfg_path: Path, out: Path) -> list[str]:
    return ["-m", "armorlab", "train", str(cfg_path), "--out", str(out)]


def _env() -> dict[str, str]:
    return {"ARMORLAB_CACHE": model_cache()}


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its workers (each of which torchrun starts in a session of its own)."""
    import psutil

    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGKILL)
    for w in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            w.kill()
    proc.wait()
    psutil.wait_procs(workers, timeout=30)


def _last_per_step(rd: RunDir) -> dict[int, dict]:
    return {row["step"]: row for row in rd.read_metrics()}


def test_two_processes_train_armor_and_resume_after_a_kill(tmp_path):
    cfg_path = tmp_path / "armor.yaml"
    cfg_path.write_text(yaml.safe_dump(CONFIG))
    os.environ.update(_env())

    # ---- uninterrupted
    done = torchrun(2, *_train_argv(cfg_path, tmp_path / "a"))
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "a").iterdir()
    assert done.stdout.split() == [str(run)]  # printed once, by the main process
    ref = RunDir(run)
    status = ref.read_status()
    assert (status["state"], status["attempt"], status["world_size"]) == ("completed", 1, 2)
    steps = [row["step"] for row in ref.read_metrics()]
    assert steps == [0, 1, 2, 3, 4]  # one line per step: only the main process writes
    want = _last_per_step(ref)
    for s in (0, 2, 4):
        assert 0.0 <= want[s]["val/acc"] <= 1.0 and want[s]["kl/exact_reverse"] >= 0.0
    assert want[4]["kl/exact_reverse"] > 0.0  # π_ref (reset at 2) differs from π_θ after step 4's update
    assert [want[s]["ref/resets"] for s in (1, 2, 3, 4)] == [0.0, 0.0, 1.0, 1.0]
    assert all(0.0 <= want[s]["anchor/rate"] <= 1.0 for s in (1, 2, 3, 4))
    dumps = sorted(p.name for p in ref.tokens_dir.iterdir())
    assert {n.rsplit("-", 1)[1] for n in dumps} == {"r0.parquet", "r1.parquet"}  # each process its own file

    # ---- killed after its step-2 checkpoint, then started again
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             *_train_argv(cfg_path, tmp_path / "b")], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = None
    deadline = time.monotonic() + 600
    while marker is None and time.monotonic() < deadline and proc.poll() is None:
        found = list((tmp_path / "b").glob("*/checkpoints/checkpoint-2/trainer_state.json"))
        marker = found[0] if found else None
        time.sleep(0.05)
    _kill_tree(proc)
    assert marker is not None, "no step-2 checkpoint before the deadline"
    killed = RunDir(marker.parents[2])
    if killed.read_status()["state"] == "completed":
        pytest.fail("the run finished before the kill: nothing was tested")
    assert killed.read_status()["state"] == "running"  # killed: nobody recorded anything
    again = torchrun(2, *_train_argv(cfg_path, tmp_path / "b"))
    assert again.returncode == 0, again.stderr[-3000:]
    status = killed.read_status()
    assert (status["state"], status["attempt"], status["world_size"]) == ("completed", 2, 2)
    got = _last_per_step(killed)
    assert sorted(got) == [0, 1, 2, 3, 4]
    # one selection, by the main process, the same after the kill; its checkpoint kept
    # (an evaluated step, 2 or 4: the one the level around it puts first, armorlab.stats.select)
    assert killed.read_selected() == ref.read_selected() and ref.read_selected()["step"] in (2, 4)
    assert (killed.path / killed.read_selected()["checkpoint"] / "trainer_state.json").is_file()
    assert [got[s]["rollout"] for s in sorted(got)] == [0, 1, 2, 3, 4]   # one update per rollout
    assert all(0.0 <= got[s]["train/refill_shortfall"] <= 1.0 for s in (1, 2, 3, 4))   # the gate is on
    for s, row in want.items():
        keys = [k for k in COMPARED if k in row and row[k] is not None]
        assert {k: got[s].get(k) for k in keys} == pytest.approx({k: row[k] for k in keys}, rel=1e-5, abs=1e-6), s
    # the dump of the resumed steps has the same group ids as the uninterrupted run's
    import pyarrow.parquet as pq

    for name in dumps:
        a, b = pq.read_table(ref.tokens_dir / name), pq.read_table(killed.tokens_dir / name)
        assert a.column("group").to_pylist() == b.column("group").to_pylist()
