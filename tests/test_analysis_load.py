"""Loading run dirs: the vectorised parse follows RunDir's rules (torn lines, resumes), the parquet
cache is used and invalidated per run, and the long/wide views agree."""

import json
import logging

import numpy as np
import pytest

from armorlab.analysis import load as L
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir
from armorlab.errors import ArmorLabError


def make_run(root, *, seed, objective="dapo", steps=range(0, 30, 10), value=lambda s: s / 100):
    rd = RunDir.create(root, resolve({"objective": objective, "seed": seed}))
    for s in steps:
        rd.append_metrics(s, {"val/acc": value(s), "train/reward": 2 * value(s)})
    rd.write_status("completed")
    return rd


def reference_rows(rd):
    """RunDir.read_metrics as {step: {metric: value}} (the reference rule)."""
    return {r["step"]: {k: v for k, v in r.items() if k != "step" and v is not None} for r in rd.read_metrics()}


def loaded_rows(rs, run_id):
    out = {}
    for m in rs.metrics:
        steps, values = rs.curve(run_id, m)
        for s, v in zip(steps, values, strict=True):
            out.setdefault(int(s), {})[m] = v
    return out


def test_torn_lines_and_resume_follow_rundir_rules(tmp_path, caplog):
    sweep = tmp_path / "sw"
    torn = make_run(sweep, seed=0)
    with open(torn.metrics_path, "a") as fh:
        fh.write('{"step": 30, "val/ac')                      # killed mid-line: torn last line
    resumed = make_run(sweep, seed=1, steps=range(0, 40, 10))
    with open(resumed.metrics_path, "a") as fh:
        fh.write('{"step": 40, "val/acc": 0.9, "trai')        # killed mid-line ...
    resumed.append_metrics(20, {"val/acc": 0.77})             # ... and the resumed attempt appends after it
    resumed.append_metrics(30, {"val/acc": 0.88, "train/reward": 0.5})
    rs = L.load([sweep], cache=False)
    for rd in (torn, resumed):
        assert loaded_rows(rs, rd.id) == reference_rows(rd)
    # the resumed attempt's first append removed the fragment (issue 13 §3): its step-20 line is not
    # glued onto it and lost, but supersedes the first attempt's step 20, key by key
    assert loaded_rows(rs, resumed.id)[20] == {"val/acc": 0.77, "train/reward": 0.4}
    assert 40 not in loaded_rows(rs, resumed.id)
    assert loaded_rows(rs, resumed.id)[30] == {"val/acc": 0.88, "train/reward": 0.5}
    assert any("torn line 4" in w and torn.id in w for w in rs.warnings)  # no append after it: skipped
    assert not any(resumed.id in w for w in rs.warnings)


def test_odd_lines_are_ignored_like_rundir(tmp_path):
    rd = make_run(tmp_path / "sw", seed=0)
    with open(rd.metrics_path, "a") as fh:
        fh.write('{"step": 1.5, "val/acc": 9}\n[1, 2]\n\n{"step": 50, "val/acc": 0.5, "note": "text"}\n')
    rs = L.load([tmp_path / "sw"], cache=False)
    rows = loaded_rows(rs, rd.id)
    assert rows == reference_rows(rd) | {50: {"val/acc": 0.5}}
    assert "note" not in rs.metrics


def test_runs_table_and_missing_metrics(tmp_path):
    sweep = tmp_path / "sw"
    a = make_run(sweep, seed=0, objective="armor")
    empty = RunDir.create(sweep, resolve({"seed": 5}))
    empty.write_status("running")
    rs = L.load([sweep], cache=False)
    runs = rs.runs.set_index("run_id")
    assert runs.loc[a.id, "objective"] == "armor" and runs.loc[a.id, "task.digits"] == 2
    assert runs.loc[empty.id, "state"] == "running"
    assert any(empty.id in w and "no metrics" in w for w in rs.warnings)
    assert not rs.has_metric(empty.id, "val/acc") and rs.has_metric(a.id, "val/acc")
    assert rs.last_step(a.id) == 20 and rs.last_step(empty.id) is None
    steps, values = rs.curve(a.id, "val/acc")
    np.testing.assert_array_equal(steps, [0, 10, 20])
    np.testing.assert_allclose(values, [0.0, 0.1, 0.2])


def test_long_view_matches_wide(tmp_path):
    sweep = tmp_path / "sw"
    a = make_run(sweep, seed=0, objective="armor")
    b = make_run(sweep, seed=1, objective="dapo", value=lambda s: 1 - s / 100)
    long = L.load_runs([sweep], cache=False)
    assert {"run_id", "objective", "seed", "step", "metric", "value"} <= set(long.columns)
    assert "task.digits" not in long.columns                  # constant config keys stay in the runs table
    assert len(long) == 2 * 3 * 2
    row = long[(long["run_id"] == b.id) & (long["metric"] == "train/reward") & (long["step"] == 10)]
    assert row["value"].item() == pytest.approx(1.8) and row["objective"].item() == "dapo"
    assert set(long.loc[long["run_id"] == a.id, "objective"]) == {"armor"}


def test_cache_is_used_and_invalidated_per_run(tmp_path, monkeypatch):
    sweep = tmp_path / "sw"
    a = make_run(sweep, seed=0)
    b = make_run(sweep, seed=1)
    with open(b.metrics_path, "a") as fh:
        fh.write('{"step": 99, "val')                          # torn line: its warning must survive caching
    first = L.load([sweep])
    cache = sweep / L.CACHE_DIR / L.CACHE_FILE
    assert cache.is_file()
    parsed = []
    real = L.parse_metrics_file
    monkeypatch.setattr(L, "parse_metrics_file", lambda p: parsed.append(p) or real(p))
    second = L.load([sweep])
    assert parsed == []                                        # everything came from the cache
    assert second.warnings == first.warnings
    for rid in (a.id, b.id):
        assert loaded_rows(second, rid) == loaded_rows(first, rid)
    a.append_metrics(30, {"val/acc": 0.3})                     # a changes, b does not
    third = L.load([sweep])
    assert [p.parent.name for p in parsed] == [a.id]
    assert third.curve(a.id, "val/acc")[0].tolist() == [0, 10, 20, 30]
    assert any("torn line" in w for w in third.warnings)
    # run discovery skips the hidden cache dir
    assert sorted(third.run_ids) == sorted([a.id, b.id])


def test_unwritable_cache_is_only_a_warning(tmp_path, monkeypatch, caplog):
    make_run(tmp_path / "sw", seed=0)

    def boom(*_a, **_k):
        raise OSError("read-only file system")

    monkeypatch.setattr(L, "_write_cache", boom)
    with caplog.at_level(logging.WARNING):
        rs = L.load([tmp_path / "sw"])
    assert len(rs.run_ids) == 1 and "could not write analysis cache" in caplog.text


def test_corrupt_cache_is_ignored(tmp_path):
    rd = make_run(tmp_path / "sw", seed=0)
    L.load([tmp_path / "sw"])
    (tmp_path / "sw" / L.CACHE_DIR / L.CACHE_FILE).write_bytes(b"not parquet")
    rs = L.load([tmp_path / "sw"])
    assert loaded_rows(rs, rd.id) == reference_rows(rd)


def test_globs_and_errors(tmp_path):
    make_run(tmp_path / "sw_a", seed=0)
    make_run(tmp_path / "sw_b", seed=0)                        # same config → same id in two sweeps
    rs = L.load([str(tmp_path / "sw_*")], cache=False)
    assert sorted(rs.run_ids) == sorted(f"{s}/{rs.runs['path'].map(lambda p: p.split('/')[-1]).iloc[0]}"
                                        for s in ("sw_a", "sw_b"))
    with pytest.raises(ArmorLabError, match="glob matches nothing"):
        L.load([str(tmp_path / "nope_*")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArmorLabError, match="'runs'"):
        L.load([tmp_path / "empty"])


def test_flatten_config():
    flat = L.flatten_config({"a": 1, "task": {"name": "x", "d": {"e": 2}}, "s": [[10, 2]]})
    assert flat == {"a": 1, "task.name": "x", "task.d.e": 2, "s": json.dumps([[10, 2]])}


def test_arrow_parse_keeps_numbers_and_booleans_and_merges_resumed_steps():
    # valid JSON throughout (pyarrow's fast path): a resume repeats step 1, booleans count as 0/1,
    # text, lists and all-null columns are no metrics
    data = (b'{"step": 0, "a": 1, "flag": true, "note": "x", "v": [1], "gone": null}\n'
            b'{"step": 1, "a": 2.5, "flag": false, "note": "y", "v": [2], "gone": null}\n'
            b'{"step": 1, "a": null, "flag": true, "note": "z", "v": [3], "gone": null}\n'
            b'{"step": 2, "a": 4, "flag": false, "note": "w", "v": [4], "gone": null}\n')
    table, warnings = L.parse_metrics_table(data)
    assert warnings == [] and table.column_names == ["step", "a", "flag"]
    assert table.column("step").to_pylist() == [0, 1, 2]
    assert table.column("a").to_pylist() == [1.0, 2.5, 4.0]      # the later null does not erase 2.5
    assert table.column("flag").to_pylist() == [1.0, 1.0, 0.0]   # the later line wins at step 1
    assert table.schema.field("a").type == "double" and table.schema.field("step").type == "int64"


def test_gate_screen_drops_only_series_the_exact_check_would_pass():
    from armorlab.analysis.load import _gate_screened_out
    from armorlab.core.health import gate_warning

    rng = np.random.default_rng(0)
    for level in (0.0, 0.5, 0.85, 0.895, 0.899, 0.9, 0.95):
        for n in (5, 9, 10, 40):
            shares = np.clip(level + rng.normal(0, 0.02, n), 0, 1)
            if _gate_screened_out(shares):   # screened out: the exact check finds nothing either
                assert gate_warning(list(enumerate(shares.tolist(), 1)), final=True) is None
    flat = np.full(40, 0.5)
    assert _gate_screened_out(flat) and not _gate_screened_out(np.full(40, 0.8995))   # near: checked exactly
    assert not _gate_screened_out(np.full(9, 0.0))                     # shorter than a window: checked


def test_greedy_accuracy_takes_its_own_count_for_the_binomial_noise(tmp_path):
    from armorlab.analysis.groups import eval_sizes

    rd = RunDir.create(tmp_path / "sw", resolve({"objective": "dapo", "seed": 0}))
    for s in (0, 10):
        rd.append_metrics(s, {"val/acc": 0.5, "val/n": 800.0, "val/acc_greedy": 0.7, "val/n_greedy": 400.0})
    rs = L.load([tmp_path / "sw"], cache=False)
    rid = rs.runs["run_id"].iloc[0]
    assert eval_sizes(rs, rid, "val/acc_greedy", np.array([0, 10])).tolist() == [400.0, 400.0]
    assert eval_sizes(rs, rid, "val/acc", np.array([0, 10])).tolist() == [800.0, 800.0]
    assert eval_sizes(rs, rid, "val/pass@8", np.array([0, 10])) is None


def test_stages_keep_the_runs_their_sweep_json_puts_in_them(tmp_path):
    sweep = tmp_path / "sw"
    runs = [make_run(sweep, seed=s) for s in range(3)]
    (sweep / "sweep.json").write_text(json.dumps({"stages": {runs[0].id: "a", runs[1].id: "b", runs[2].id: "a"}}))
    assert sorted(L.load([sweep], stages=["a"], cache=False).run_ids) == sorted([runs[0].id, runs[2].id])
    assert L.load([sweep], stages=("b",), cache=False).run_ids == [runs[1].id]
    with pytest.raises(ArmorLabError, match="no run of stage"):
        L.load([sweep], stages=["c"], cache=False)
    (sweep / "sweep.json").write_text("[1, 2]")                 # a damaged manifest maps no run to a stage
    with pytest.raises(ArmorLabError, match="no run of stage"):
        L.load([sweep], stages=["a"], cache=False)
