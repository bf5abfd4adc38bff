"""A full disk says so (issue 30 §3): the trainer's failure is recorded as "no space left on device
(checkpoint at step N)" even though the disk has no room for an atomic status write, the process
exits EXIT_NO_SPACE, the half-written checkpoint is gone, and a run started again once there is
space resumes and completes with every step logged once.

The end-to-end test trains on a small tmpfs (it needs `mount`: root with CAP_SYS_ADMIN, else it is
skipped); the others inject ENOSPC where the disk would raise it."""

from __future__ import annotations

import collections
import errno
import json
import os
import subprocess
import sys
import uuid

import pytest
from trainer_support import SMALL, TASK, model_cache

from armorlab.core.config import resolve
from armorlab.core.exits import EXIT_NO_SPACE, EXIT_OK
from armorlab.core.runs import RunDir
from armorlab.train.launch import no_space_left


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_the_failure_status_is_written_in_place_when_no_temp_file_fits(tmp_path, monkeypatch):
    rd = RunDir.create(tmp_path, resolve({"max_steps": 3}))
    rd.write_status("running")
    monkeypatch.setattr("armorlab.core.runs.atomic_write_json", _enospc)
    rd.write_status("failed", reason="no space left on device (checkpoint at step 2)")
    status = json.loads(rd.status_path.read_text())
    assert status["state"] == "failed" and status["reason"].startswith("no space left on device")
    assert status["attempt"] == 1 and status["ended"] is not None
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_other_write_errors_still_raise(tmp_path, monkeypatch):
    rd = RunDir.create(tmp_path, resolve({"max_steps": 3}))

    def eio(*_a, **_k):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("armorlab.core.runs.atomic_write_json", eio)
    with pytest.raises(OSError, match="Input/output"):
        rd.write_status("failed", reason="x")


def test_what_counts_as_a_full_disk(tmp_path, monkeypatch):
    assert no_space_left(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert no_space_left(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "x")
    assert no_space_left(wrapped, tmp_path)
    # safetensors' Rust error and torch's C++ writer carry no errno
    assert no_space_left(Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull })'), tmp_path)
    torch_text = RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0; "
                              "basic_ios::clear: iostream error")
    assert not no_space_left(torch_text, tmp_path)  # plenty of space here: some other write failure
    full = collections.namedtuple("usage", "total used free")(10 << 20, 10 << 20, 0)
    monkeypatch.setattr("shutil.disk_usage", lambda _path: full)
    assert no_space_left(torch_text, tmp_path)  # the same failure on a full disk
    assert not no_space_left(ValueError("shapes do not match"), tmp_path)


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    size = "6m"  # config, status and metrics fit; the tiny model's first checkpoint (~10 MB) does not
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"armorlab-{uuid.uuid4().hex[:6]}",
                          str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({out.stderr.strip()}): the injected-ENOSPC tests cover it")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
def test_training_onto_a_full_disk_fails_cleanly_and_resumes_when_there_is_room(small_tmpfs, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({**SMALL, "max_steps": 4, "save_steps": 2, "save_total_limit": 2, "task": TASK}))
    env = {**os.environ, "ARMORLAB_CACHE": model_cache()}
    train = [sys.executable, "-m", "armorlab.cli", "train"]
    first = subprocess.run([*train, str(cfg), "--out", str(small_tmpfs / "runs")], capture_output=True,
                           text=True, env=env, timeout=1800)
    assert first.returncode == EXIT_NO_SPACE, first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    run_dir = RunDir(next((small_tmpfs / "runs").iterdir()))
    status = run_dir.read_status()
    assert status["state"] == "failed", status
    assert status["reason"].startswith("no space left on device (checkpoint at step 2)"), status["reason"]
    assert "no space left on device (checkpoint at step 2)" in first.stderr
    assert run_dir.checkpoints() == []  # the half-written one was removed
    assert [r["step"] for r in run_dir.read_metrics()] == [1, 2]  # the steps it took are kept

    subprocess.run(["mount", "-o", "remount,size=200m", str(small_tmpfs)], check=True)
    again = subprocess.run([*train, "--run-dir", str(run_dir.path)], capture_output=True, text=True, env=env,
                           timeout=1800)
    assert again.returncode == EXIT_OK, again.stderr[-3000:]
    assert run_dir.read_status()["state"] == "completed"
    steps = [r["step"] for r in run_dir.iter_metrics()]
    assert sorted(set(steps)) == [1, 2, 3, 4]  # nothing lost; a re-logged step supersedes (last line wins)
    assert [r["step"] for r in run_dir.read_metrics()] == [1, 2, 3, 4]


def test_exit_codes_are_distinct():
    from armorlab.core import exits

    codes = {v for k, v in vars(exits).items() if k.startswith("EXIT_")}
    assert len(codes) == len([k for k in vars(exits) if k.startswith("EXIT_")])
    assert exits.EXIT_NO_SPACE not in (exits.EXIT_OK, exits.EXIT_FAILED, exits.EXIT_USER_ERROR)
