import hashlib
import json

import pytest

from armorlab.core.config import resolve
from armorlab.core.runs import RunDir, find_run_dirs, run_id
from armorlab.errors import ArmorLabError


def test_run_id_is_sha256_prefix_of_canonical_json():
    cfg = {"b": 1, "a": {"y": [1, 2], "x": "é"}}
    text = '{"a":{"x":"é","y":[1,2]},"b":1}'
    assert run_id(cfg) == hashlib.sha256(text.encode()).hexdigest()[:12]
    assert run_id({"a": {"x": "é", "y": [1, 2]}, "b": 1}) == run_id(cfg)  # key order is irrelevant


def test_create_writes_config_then_pending_and_is_idempotent(tmp_path):
    cfg = resolve({"objective": "armor", "seed": 3})
    rd = RunDir.create(tmp_path / "sweep", cfg)
    assert rd.path.name == run_id(cfg)
    assert rd.read_config() == cfg
    assert rd.read_status()["state"] == "pending"
    rd.write_status("running", job_id="42")
    again = RunDir.create(tmp_path / "sweep", cfg)
    assert again.read_status()["state"] == "running"  # existing status is kept


def test_status_lifecycle(tmp_path):
    rd = RunDir.create(tmp_path, resolve({}))
    s = rd.write_status("running", job_id="7")
    assert s["attempt"] == 1 and s["started"] and s["ended"] is None
    s = rd.write_status("failed", reason="loss is nan at step 3")
    assert s["attempt"] == 1 and s["job_id"] == "7" and s["ended"] and s["reason"].startswith("loss")
    assert rd.write_status("running")["attempt"] == 2
    assert not list(rd.path.glob(".status.json.*"))  # no temp files left behind
    with pytest.raises(ValueError):
        rd.write_status("exploded")


def test_metrics_torn_line_and_duplicate_steps(tmp_path):
    rd = RunDir.create(tmp_path, resolve({}))
    rd.append_metrics(0, {"val/acc": 0.25})
    rd.append_metrics(1, {"train/reward": 0.5, "obj/clip_frac": float("nan")})
    rd.append_metrics(1, {"train/reward": 0.75})  # resumed run re-logs step 1
    with open(rd.metrics_path, "a") as fh:
        fh.write('{"step": 2, "train/rew')  # torn by a crash
    rows = rd.read_metrics()
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["train/reward"] == 0.75 and rows[1]["obj/clip_frac"] is None
    assert rd.last_step() == 1
    first = json.loads(rd.metrics_path.read_text().splitlines()[0])
    assert first == {"step": 0, "val/acc": 0.25}


def test_checkpoints_sorted_numerically(tmp_path):
    rd = RunDir.create(tmp_path, resolve({}))
    for n in (5, 40, 100):
        (rd.checkpoints_dir / f"checkpoint-{n}").mkdir(parents=True)
    assert rd.last_checkpoint().name == "checkpoint-100"


def test_config_mismatch_is_refused(tmp_path):
    cfg = resolve({})
    rd = RunDir.create(tmp_path, cfg)
    rd.config_path.write_text("objective: up\n")
    with pytest.raises(ArmorLabError, match="different config"):
        RunDir.create(tmp_path, cfg)


def test_find_run_dirs(tmp_path):
    a = RunDir.create(tmp_path / "s1", resolve({"seed": 1}))
    b = RunDir.create(tmp_path / "s2", resolve({"seed": 2}))
    assert {r.id for r in find_run_dirs([tmp_path])} == {a.id, b.id}
    assert [r.id for r in find_run_dirs([a.path])] == [a.id]
    with pytest.raises(ArmorLabError, match="not a run or sweep"):
        find_run_dirs([tmp_path / "nope"])


def test_atomic_writes_get_normal_file_permissions(tmp_path):
    import os

    from armorlab.core.fsutil import atomic_write_text

    mask = os.umask(0o022)
    os.umask(mask)
    target = tmp_path / "x.json"
    atomic_write_text(target, "{}")
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_atomic_file_replaces_on_success_and_leaves_the_old_file_on_failure(tmp_path):
    from armorlab.core.fsutil import atomic_file

    target = tmp_path / "t.parquet"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer crashed")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    with atomic_file(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]


def _rows(steps):
    # 45 keys per step like a real trainer line, non-ASCII included (a cut may split a UTF-8 char)
    return [{"step": s, "val/acc": 0.5 + s / 100, "note/π": s, **{f"train/k{i}": s * i + 0.25 for i in range(42)}}
            for s in steps]


def test_a_torn_last_line_is_never_glued_to_the_resumed_one(tmp_path):
    """Issue 13 §3: a crash mid-write of step 3's line at every cut position, then a resume that
    re-logs from step 3: the run ends with exactly the uninterrupted metrics, every line parses."""
    want = _rows(range(6))
    full = tmp_path / "full"
    full.mkdir()
    ref = RunDir(full)
    for row in want:
        ref.append_metrics(row["step"], {k: v for k, v in row.items() if k != "step"})
    lines = ref.metrics_path.read_bytes().splitlines(keepends=True)
    head, torn = b"".join(lines[:3]), lines[3]
    for cut in range(len(torn) + 1):
        rd = RunDir(tmp_path / f"cut{cut}")
        rd.path.mkdir()
        rd.metrics_path.write_bytes(head + torn[:cut])
        for row in want[3:]:  # the resumed attempt logs step 3 again (its checkpoint is older)
            rd.append_metrics(row["step"], {k: v for k, v in row.items() if k != "step"})
        text = rd.metrics_path.read_text(encoding="utf-8")
        assert all(isinstance(json.loads(line), dict) for line in text.splitlines()), cut
        assert rd.read_metrics() == want, cut
        # only the cut that lost just the newline keeps the (complete) torn line, terminated
        assert text.count('"step":3,') == (2 if cut == len(torn) - 1 or cut == len(torn) else 1), cut
