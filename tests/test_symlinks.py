"""Issue 41 §1: nothing armorlab writes or deletes in a run dir, sweep dir, cache or report dir goes
through a planted symbolic link; and §4's readers of small run/sweep files never hang on a FIFO nor
fill memory from a device. Each test plants a link to a canary and checks the canary unchanged."""

from __future__ import annotations

import os
import threading
import types
from pathlib import Path

import pytest

from armorlab.core import fsutil
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError

KEY_FILE = b"ssh-ed25519 AAAA first\nssh-ed25519 BBBB second-without-newline"


@pytest.fixture
def run(tmp_path) -> RunDir:
    rd = RunDir.create(tmp_path / "sw", resolve({"max_steps": 3}))
    rd.append_metrics(0, {"val/acc": 0.5})
    return rd


@pytest.fixture
def canary(tmp_path) -> Path:
    """A file outside every run dir, with an unterminated last line (what a torn-tail mender cuts)."""
    p = tmp_path / "outside" / "authorized_keys"
    p.parent.mkdir()
    p.write_bytes(KEY_FILE)
    return p


@pytest.fixture
def canary_dir(tmp_path) -> Path:
    """A directory outside every run dir holding what armorlab would delete by those names."""
    d = tmp_path / "elsewhere"
    for name in ("checkpoint-1", "checkpoint-2", ".deleting-checkpoint-3"):
        (d / name).mkdir(parents=True)
        (d / name / "weights.bin").write_bytes(b"precious")
    (d / "metrics.parquet").write_bytes(b"precious")
    (d / ".armorlab-report.json").write_bytes(b"precious")
    return d


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(d.rglob("*"))}


def _refused(fn, *args, link: Path, **kwargs) -> ArmorLabError:
    with pytest.raises(ArmorLabError) as info:
        fn(*args, **kwargs)
    assert info.value.file == str(link) and "symbolic link" in str(info.value), str(info.value)
    return info.value


def test_metrics_jsonl_linked_is_refused_and_its_target_keeps_every_byte(run, canary):
    run.metrics_path.unlink()
    run.metrics_path.symlink_to(canary)
    _refused(run.append_metrics, 1, {"val/acc": 0.6}, link=run.metrics_path)
    assert canary.read_bytes() == KEY_FILE


def test_a_link_swapped_in_after_the_check_is_still_not_followed(run, canary, monkeypatch):
    # the O_NOFOLLOW open, not only the lstat before it: the check is skipped, the link is there
    run.metrics_path.unlink()
    run.metrics_path.symlink_to(canary)
    monkeypatch.setattr(fsutil, "refuse_symlinks", lambda p, within=None: Path(p))
    with pytest.raises(OSError):
        fsutil.append_line(run.metrics_path, "{}")
    assert canary.read_bytes() == KEY_FILE


@pytest.mark.parametrize("name", ["status.json", "selected.json", "config.yaml"])
def test_atomically_replaced_files_refuse_a_planted_link(run, canary, name):
    link = run.path / name
    link.unlink(missing_ok=True)
    link.symlink_to(canary)
    if name == "status.json":
        _refused(run.write_status, "running", link=link)
    elif name == "config.yaml":
        _refused(fsutil.atomic_write_yaml, link, {"max_steps": 3}, within=run.path, link=link)
    else:
        from armorlab.train.keep import CheckpointKeeper

        keeper = CheckpointKeeper.__new__(CheckpointKeeper)
        keeper.run_dir, keeper.metric, keeper.mode, keeper.patience = run, "val/acc", "max", 1
        keeper.trainer = types.SimpleNamespace(per_rollout=1)
        _refused(keeper.write_selected, types.SimpleNamespace(step=0, level=0.5, window=[0]), link=link)
    assert link.is_symlink() and canary.read_bytes() == KEY_FILE


def test_a_linked_checkpoints_dir_loses_nothing(run, canary_dir):
    from armorlab.train import keep, launch

    before = _tree(canary_dir)
    run.checkpoints_dir.symlink_to(canary_dir, target_is_directory=True)
    _refused(launch._remove_partial_checkpoints, run, link=run.checkpoints_dir)
    _refused(keep._remove, run.checkpoints_dir / "checkpoint-1", run.path, link=run.checkpoints_dir)
    # and training refuses to start in it (transformers would save checkpoints through the link)
    _refused(launch.train_run_dir, run.path, link=run.checkpoints_dir)
    assert _tree(canary_dir) == before


def test_a_linked_checkpoint_is_refused_not_deleted(run, canary_dir):
    from armorlab.train import keep

    run.checkpoints_dir.mkdir()
    link = run.checkpoints_dir / "checkpoint-2"
    link.symlink_to(canary_dir / "checkpoint-2", target_is_directory=True)
    before = _tree(canary_dir)
    _refused(keep._remove, link, run.path, link=link)
    _refused(fsutil.remove_tree, link, within=run.path, link=link)
    assert _tree(canary_dir) == before


@pytest.mark.parametrize("planted", ["file", "dir"])
def test_the_decision_jobs_script_never_lands_in_a_links_target(tmp_path, canary, canary_dir, planted):
    from sweep_support import write_spec

    from armorlab.sweeps.manifest import LOGS_DIR
    from armorlab.sweeps.profile import parse_profile
    from armorlab.sweeps.submit import load_sweep
    from armorlab.sweeps.until_resolved import Chain

    spec_path = write_spec(tmp_path / "s.yaml", {
        "name": "ur", "base": {"max_steps": 3, "val_every": 1}, "grid": {"objective": ["dapo", "armor"]},
        "seeds": [0, 1], "compare": {"baseline": {"objective": "dapo"}, "delta": 0.05}})
    spec, _, _ = load_sweep(spec_path, executor="slurm")
    chain = Chain(spec, parse_profile({"executor": "slurm", "time_min": 60}), "slurm", root=tmp_path / "runs")
    logs = chain.sweep_dir / LOGS_DIR
    before = _tree(canary_dir)
    if planted == "dir":
        chain.sweep_dir.mkdir(parents=True, exist_ok=True)
        logs.symlink_to(canary_dir, target_is_directory=True)
        _refused(chain.submit_decision, types.SimpleNamespace(look=1), ["1"], link=logs)
    else:
        logs.mkdir(parents=True)
        (logs / "decision-look1.sh").symlink_to(canary)
        _refused(chain.submit_decision, types.SimpleNamespace(look=1), ["1"], link=logs / "decision-look1.sh")
    assert canary.read_bytes() == KEY_FILE and _tree(canary_dir) == before


def test_a_linked_analysis_cache_dir_is_neither_written_nor_emptied(run, canary_dir, caplog):
    from armorlab.analysis.load import CACHE_DIR, load

    before = _tree(canary_dir)
    sweep = run.path.parent
    (sweep / CACHE_DIR).symlink_to(canary_dir, target_is_directory=True)
    rs = load([str(sweep)], cache=True)
    assert len(rs.runs) == 1 and "symbolic link" in caplog.text  # read; the cache is skipped with a warning
    assert _tree(canary_dir) == before


@pytest.mark.filterwarnings("ignore:armorlab.analysis:DeprecationWarning")  # report.py imports old paths
def test_a_linked_report_dir_is_refused_before_anything_is_written(run, canary_dir, capsys):
    from armorlab.cli import main

    before = _tree(canary_dir)
    run.report_dir.symlink_to(canary_dir, target_is_directory=True)
    with pytest.raises(SystemExit) as info:
        main(["report", str(run.path)])
    assert info.value.code == 2 and "symbolic link" in capsys.readouterr().err
    assert _tree(canary_dir) == before


def test_a_report_files_link_is_refused_and_the_stamp_link_removed_not_followed(canary, tmp_path):
    from armorlab.analysis import freshness

    out = tmp_path / "rep"
    out.mkdir()
    (out / "groups.md").symlink_to(canary)
    (out / freshness.STAMP).symlink_to(canary)
    _refused(fsutil.atomic_write_text, out / "groups.md", "x", durable=False, link=out / "groups.md")
    freshness.forget(out)
    assert not (out / freshness.STAMP).exists() and canary.read_bytes() == KEY_FILE


# --------------------------------------------------------------------------- §4: small-file readers
def _reads_of(tmp_path: Path) -> dict[str, tuple[Path, object]]:
    from armorlab.analysis import freshness
    from armorlab.sweeps.until_resolved_looks import read_looks
    from armorlab.train.init_from import _from_selected

    sweep = tmp_path / "sw"
    rd = RunDir.create(sweep, resolve({"max_steps": 3}))
    init = {"run": str(rd.path), "select": {"metric": "val/acc", "mode": "max"}}
    return {
        "looks.json": (sweep / "looks.json", lambda: read_looks(sweep)),
        ".armorlab-report.json": (tmp_path / "rep" / freshness.STAMP,
                                  lambda: freshness.fresh_summary(types.SimpleNamespace(), tmp_path / "rep")),
        "a parent's selected.json": (rd.selected_path, lambda: _from_selected(rd, init, "spec.yaml")),
        "selected.json": (rd.selected_path, rd.read_selected),
    }


@pytest.mark.parametrize("which", ["looks.json", ".armorlab-report.json", "a parent's selected.json",
                                   "selected.json"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_small_run_and_sweep_files_never_hang_nor_fill_memory(tmp_path, which, kind):
    path, read = _reads_of(tmp_path)[which]
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    outcome: list = []

    def attempt():
        try:
            outcome.append(read())
        except ArmorLabError as exc:
            outcome.append(exc)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{which} ({kind}) blocked"
    # an error naming the file, or (the stamp) "no fresh report": never a value read from it
    assert outcome and (outcome[0] is None or isinstance(outcome[0], ArmorLabError)), outcome


def test_read_regular_caps_the_size(tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"x" * 101)
    assert fsutil.read_regular(p, limit=101) == b"x" * 101
    with pytest.raises(fsutil.NotRegularFile, match="larger than 100 bytes"):
        fsutil.read_regular(p, limit=100)


# --------------------------------------------------------------------------- §4: selected.json stays in its run
@pytest.mark.parametrize("checkpoint", ["../../other/abc/checkpoints/checkpoint-3", "/elsewhere/checkpoint-3",
                                        "checkpoints/checkpoint-2", "checkpoints/../../x/checkpoints/checkpoint-3",
                                        "checkpoints/checkpoint-3 (linked)"])
def test_a_selected_json_pointing_outside_its_run_is_refused(tmp_path, checkpoint):
    from armorlab.train.init_from import _from_selected

    rd = RunDir.create(tmp_path / "sw", resolve({"max_steps": 3}))
    (rd.checkpoints_dir / "checkpoint-3").mkdir(parents=True) if "linked" not in checkpoint else None
    if "linked" in checkpoint:
        (tmp_path / "foreign").mkdir()
        rd.checkpoints_dir.mkdir()
        (rd.checkpoints_dir / "checkpoint-3").symlink_to(tmp_path / "foreign", target_is_directory=True)
        checkpoint = "checkpoints/checkpoint-3"
    record = {"rule": "r", "metric": "val/acc", "mode": "max", "step": 3, "value": 0.5, "checkpoint": checkpoint}
    fsutil.atomic_write_json(rd.selected_path, record)
    init = {"run": "sw/" + rd.id, "select": {"metric": "val/acc", "mode": "max"}}
    with pytest.raises(ArmorLabError) as info:
        _from_selected(rd, init, "spec.yaml")
    assert (info.value.key, info.value.value, info.value.file) == ("checkpoint", checkpoint, str(rd.selected_path))
    assert "own run" in str(info.value)


def test_a_selected_json_naming_its_own_checkpoint_is_used(tmp_path):
    from armorlab.train.init_from import _from_selected

    rd = RunDir.create(tmp_path / "sw", resolve({"max_steps": 3}))
    (rd.checkpoints_dir / "checkpoint-3").mkdir(parents=True)
    fsutil.atomic_write_json(rd.selected_path, {"rule": "r", "metric": "val/acc", "mode": "max", "step": 3,
                                                "value": 0.5, "checkpoint": "checkpoints/checkpoint-3"})
    start = _from_selected(rd, {"run": "sw/" + rd.id, "select": {"metric": "val/acc", "mode": "max"}}, "s.yaml")
    assert start.checkpoint == (rd.checkpoints_dir / "checkpoint-3").absolute() and start.step == 3


def test_a_report_path_that_exists_is_literal_not_a_glob(tmp_path):
    from armorlab.core.runs import expand_globs, find_run_dirs

    literal = RunDir.create(tmp_path / "exp[1]", resolve({"max_steps": 3}))
    decoy = RunDir.create(tmp_path / "exp1", resolve({"max_steps": 4}))  # what exp[1] matches as a glob
    assert expand_globs([str(tmp_path / "exp[1]")]) == [tmp_path / "exp[1]"]
    assert [rd.id for rd in find_run_dirs(expand_globs([str(tmp_path / "exp[1]")]))] == [literal.id]
    # a pattern that names no path is still one
    assert expand_globs([str(tmp_path / "exp[0-9]")]) == [tmp_path / "exp1"] and decoy.id


def test_logs_and_the_sweep_lock_are_never_appended_through_a_link(tmp_path, canary):
    from armorlab.sweeps.manifest import LOCK, locked

    sweep = tmp_path / "sw"
    (sweep / ".logs").mkdir(parents=True)
    (sweep / ".logs" / "abc.log").symlink_to(canary)
    _refused(fsutil.open_append, sweep / ".logs" / "abc.log", link=sweep / ".logs" / "abc.log")
    (sweep / LOCK).symlink_to(canary)
    with pytest.raises(ArmorLabError), locked(sweep):
        pass
    assert canary.read_bytes() == KEY_FILE
    with fsutil.open_append(sweep / ".logs" / "new.log") as fh:
        fh.write(b"line\n")
    assert (sweep / ".logs" / "new.log").read_bytes() == b"line\n"
