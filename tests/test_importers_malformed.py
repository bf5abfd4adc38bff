"""Malformed records in imported files (issue 41): each becomes a clear ArmorLabError naming the file or a
counted skip, never a traceback, a crash or a wrong number; the crash cases run in a child process, so
pyarrow's segfault fails the test instead of ending the session."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from importer_writers import pb_field, write_trackio_db, write_wandb_records

from armorlab.analysis import importers
from armorlab.analysis.importers import tensorboard_events, trackio_db, verl, wandb_local
from armorlab.analysis.importers.base import shallow
from armorlab.errors import ArmorLabError

REPO = Path(__file__).resolve().parents[1]
DEEP = 200_000  # pyarrow's JSON reader recursed past its stack near 100,000 levels
# ordinary lines whose strings hold closing braces: a running depth over the buffer drops by 10 per line,
# so after 20,000 of them a 200,000-deep line's running depth stays below 0 (the guard this replaced)
BRACES = "}" * 10


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.environ.get("ARMORLAB_TREE", str(REPO))}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env)


def _deep_value() -> str:
    return "[" * DEEP + "]" * DEEP


# --------------------------------------------------------------------------- the nesting guard
def test_shallow_bounds_every_line_whatever_came_before():
    deep = b'{"x": ' + b"[" * 100 + b"]" * 100 + b"}\n"
    # closing braces in earlier lines' strings: the running depth was -1,000 when the deep line began
    assert not shallow(b'{"a": "' + b"}" * 1000 + b'"}\n' + deep)
    # blank lines: one "{" per line on average, no "[" — the old fast path's test
    assert not shallow(b"\n" * 200 + b'{"x": ' + b"{" * 100 + b"}" * 100 + b"}\n")
    # 64 opens on a line pass, 65 do not; flat lines pass whatever their count
    assert shallow(b"{" + b"[" * 63 + b"]" * 63 + b"}\n" + b'{"step": 1, "data": {"a": 1}}\n' * 5000)
    assert not shallow(b"{" + b"[" * 64 + b"]" * 64 + b"}")


@pytest.mark.parametrize("kind", ["verl", "trackio"])
def test_one_deep_line_among_20000_never_reaches_pyarrow(tmp_path, kind):
    n = 20_000
    if kind == "verl":
        path = tmp_path / "exp.jsonl"
        lines = [json.dumps({"step": i, "data": {"loss": 0.5, "note": BRACES}}) for i in range(n)]
        lines.append('{"step": 99999, "data": {"x": ' + _deep_value() + "}}")
        path.write_text("\n".join(lines) + "\n")
        code = ("import sys; from armorlab.analysis.importers import verl; r = verl.read(sys.argv[1]); "
                "print(r.table.num_rows, sum('unreadable' in w for w in r.warnings))")
    else:
        path = tmp_path / "proj.db"
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY, run_name TEXT, step INTEGER, metrics TEXT)")
        rows = [("r", i, json.dumps({"loss": 0.5, "note": BRACES})) for i in range(n)]
        rows.append(("r", n, '{"x": ' + _deep_value() + "}"))
        con.executemany("INSERT INTO metrics (run_name, step, metrics) VALUES (?, ?, ?)", rows)
        con.commit()
        con.close()
        code = ("import sys; from armorlab.analysis.importers import trackio_db; "
                "r, = trackio_db.read_project(sys.argv[1]); "
                "print(r.table.num_rows, sum('not a JSON object' in w for w in r.warnings))")
    out = _child(code, str(path))
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert out.stdout.split() == [str(n), "1"], out.stdout  # every ordinary row, the deep one a counted skip


# --------------------------------------------------------------------------- verl
def test_verl_steps_past_int64_are_counted_skips(tmp_path):
    path = tmp_path / "exp.jsonl"
    path.write_text("".join(json.dumps({"step": s, "data": {"loss": v}}) + "\n"
                            for s, v in ((1, 0.5), (2**63, 9.0), (2**64 + 5, 9.0), (3, 0.25))))
    run = verl.read(path)
    assert run.table.column("step").to_pylist() == [1, 3]
    assert sum("skipped line" in w for w in run.warnings) == 2


def test_verl_dumps_skip_huge_names_and_fifos_and_refuse_a_file(tmp_path):
    log = tmp_path / "exp.jsonl"
    log.write_text(json.dumps({"step": 1, "data": {"loss": 0.5}}) + "\n")
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "2.jsonl").write_text(json.dumps({"input": "q", "score": 1.0}) + "\n")
    (dumps / f"{'9' * 249}.jsonl").write_text(json.dumps({"input": "q", "score": 0.0}) + "\n")
    (dumps / f"{2**63}.jsonl").write_text(json.dumps({"input": "q", "score": 0.0}) + "\n")
    os.mkfifo(dumps / "4.jsonl")  # a planted FIFO: a plain open() would wait for a writer forever
    run = verl.read(log, val_dumps=dumps)
    t = run.table.to_pydict()
    assert [(s, a) for s, a in zip(t["step"], t["val/acc"], strict=True) if a is not None] == [(2, 1.0)]
    assert any("skipped 2 validation dumps" in w for w in run.warnings)
    assert any("4.jsonl" in w and "FIFO" in w for w in run.warnings)
    with pytest.raises(ArmorLabError, match="val_dumps"):
        verl.read(log, val_dumps=dumps / "2.jsonl")
    (tmp_path / "runs.yaml").write_text(f"runs:\n  {log}:\n    val_dumps: {dumps / '2.jsonl'}\n")
    with pytest.raises(ArmorLabError, match="must be a directory") as exc:
        importers.load_mapping(tmp_path / "runs.yaml")
    assert "runs.yaml" in str(exc.value)


def test_verl_log_that_is_a_fifo_is_an_error_naming_it(tmp_path):
    os.mkfifo(tmp_path / "exp.jsonl")
    with pytest.raises(ArmorLabError, match="FIFO") as exc:
        verl.read(tmp_path / "exp.jsonl")
    assert "exp.jsonl" in str(exc.value)


# --------------------------------------------------------------------------- trackio
def test_trackio_malformed_rows_are_counted_skips(tmp_path):
    db = write_trackio_db(tmp_path / "proj.db", [
        ("a", 0, "'{\"loss\": 1.0}'"), ("a", 1, "'{\"loss\": 0.5}'"),
        ("a", None, "'{\"loss\": 7.0}'"), ("a", "abc", "'{\"loss\": 7.0}'"), ("a", 1e300, "'{\"loss\": 7.0}'"),
        ("a", 2, "NULL"), ("a", 3, "CAST(x'ff7b7d' AS TEXT)"),    # no metrics; not UTF-8
        (None, 0, "'{\"loss\": 2.0}'"),                            # a run without a name
    ], configs=[("a", "[1, 2]")])
    runs = {r.name: r for r in trackio_db.read_project(db)}
    assert set(runs) == {"a", "proj"}
    a = runs["a"]
    assert a.table.to_pydict() == {"step": [0, 1], "src/loss": [1.0, 0.5]}
    assert any("skipped 3 rows" in w and "step" in w for w in a.warnings)
    assert any("skipped 2 rows" in w and "not a JSON object" in w for w in a.warnings)
    assert any("config" in w and "not a JSON object" in w for w in a.warnings)
    assert runs["proj"].table.to_pydict() == {"step": [0], "src/loss": [2.0]}


def test_trackio_trainer_step_past_int64_is_left_out_not_wrapped(tmp_path):
    rows = [("a", i, "'" + json.dumps({"train/global_step": g, "train/loss": v}) + "'")
            for i, (g, v) in enumerate(((1, 0.5), (1e300, 9.0), (-3, 9.0), (2.5, 9.0), (2, 0.25)))]
    (run,) = trackio_db.read_project(write_trackio_db(tmp_path / "proj.db", rows))
    steps = run.table.column("step").to_pylist()
    assert steps == [1, 2]  # 1e300 once became -2**63 on the curve
    assert any(w.startswith("3 rows without the trainer's step") for w in run.warnings)


# --------------------------------------------------------------------------- TensorBoard
def test_tensorboard_half_overflow_and_deep_text_are_skipped(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def value(tag: str, **tensor) -> summary_pb2.Summary.Value:
        return summary_pb2.Summary.Value(tag=tag, tensor=tensor_pb2.TensorProto(
            tensor_shape=tensor_shape_pb2.TensorShapeProto(), **tensor))

    w = EventFileWriter(str(tmp_path))
    for step, vals in ((1, [value("loss", dtype=types_pb2.DT_HALF, half_val=[0x3C00])]),   # 1.0 as half
                       (2, [value("loss", dtype=types_pb2.DT_HALF, half_val=[70000])]),   # no 16-bit pattern
                       (3, [value("args/text_summary", dtype=types_pb2.DT_STRING,
                                  string_val=[("[" * DEEP + "]" * DEEP).encode()])])):
        w.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(value=vals)))
    w.close()
    run = tensorboard_events.read(tmp_path)
    assert run.table.to_pydict() == {"step": [1], "src/loss": [1.0]}


# --------------------------------------------------------------------------- W&B
def test_wandb_records_of_the_wrong_type_and_deep_values_are_skipped(tmp_path):
    if not wandb_local.available():
        pytest.skip("armorlab[wandb] not installed")
    from wandb.proto import wandb_internal_pb2 as pb

    def history(step: int, value: str) -> bytes:
        return pb.HistoryRecord(item=[pb.HistoryItem(key="loss", value_json=value)],
                                step=pb.HistoryStep(num=step)).SerializeToString()

    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # a length past the end: no message of any type
    deep = "[" * 5000 + "]" * 5000  # past json's recursion limit, and within one 32 KiB block
    records = [pb_field(2, history(1, "0.5")), pb_field(2, garbage), pb_field(2, history(2, deep)),
               pb_field(2, history(3, "0.25")), pb_field(4, garbage), pb_field(5, garbage),
               pb.Record(config=pb.ConfigRecord(update=[pb.ConfigItem(key="lr", value_json=deep)])).SerializeToString()]
    folder = tmp_path / "wandb" / "offline-run-20260101_000000-abc123"
    write_wandb_records(folder / "run-abc123.wandb", records)
    run = wandb_local.read([folder])
    t = run.table.to_pydict()
    assert [(s, v) for s, v in zip(t["step"], t["src/loss"], strict=True) if v == v] == [(1, 0.5), (3, 0.25)]
    assert any("skipped 1 history records" in w for w in run.warnings), run.warnings
    assert sum("record skipped" in w for w in run.warnings) == 1, run.warnings  # the config record


# --------------------------------------------------------------------------- TRL
def test_trl_state_with_huge_or_text_steps_is_read(tmp_path):
    from armorlab.analysis.importers import trl

    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": "abc", "log_history": [
        {"step": 1, "loss": 0.5}, {"step": 2**63, "loss": 9.0}, {"step": 2, "loss": 0.25}]}))
    run = trl.read(tmp_path)
    assert run.table.column("step").to_pylist() == [1, 2]
