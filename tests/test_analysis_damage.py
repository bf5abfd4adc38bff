"""Damaged analysis inputs (issue 30 §2): deep nesting in metrics.jsonl never reaches pyarrow's JSON
reader (it crashes the process), and a damaged or edited metrics.arrow cache is noticed and rebuilt
— never read as other values than the files hold (`--no-cache`)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from armorlab.analysis import load as L
from armorlab.analysis.groups import run_groups
from armorlab.core.config import resolve
from armorlab.core.runs import RunDir


@pytest.fixture
def sweep(tmp_path):
    """Three runs with different curves and the same steps (a shift by one run's rows keeps the
    step column as it was: only the values tell)."""
    cfg = resolve({"max_steps": 20, "val_every": 10})
    d = tmp_path / "sw"
    for seed, top in ((0, 0.5), (1, 0.9), (2, 0.2)):
        rd = RunDir.create(d, {**cfg, "seed": seed})
        for step in (0, 10, 20):
            rd.append_metrics(step, {"val/acc": top * (1 + step / 20) / 2, "train/reward": seed + step / 20})
        rd.write_status("completed")
    return d


def _values(rs: L.RunSet) -> pd.DataFrame:
    wide = rs.wide.copy()
    wide["run_id"] = wide["run_id"].astype(str)
    return wide.sort_values(["run_id", "step"]).reset_index(drop=True)


def _rewrite_cache(sweep_dir, change):
    """Rewrite metrics.arrow with ``change(table, meta) -> (table, meta)`` applied."""
    path = sweep_dir / L.CACHE_DIR / L.CACHE_FILE
    table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()  # a copy: the file is rewritten
    meta = json.loads(table.schema.metadata[L._META_KEY])
    table, meta = change(table.replace_schema_metadata(None), meta)
    table = table.replace_schema_metadata({L._META_KEY: json.dumps(meta).encode()})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)


def _shift_rows(table, meta):
    """Every run's row range moved by one run's length, the layout still well-formed: each run
    reads its neighbour's rows (same steps, other values)."""
    names = list(meta["runs"])
    ranges = [meta["runs"][n]["rows"] for n in names]
    rotated = names[-1:] + names[:-1]
    meta["runs"] = {n: {**meta["runs"][n], "rows": r} for n, r in zip(rotated, ranges, strict=True)}
    return table, meta


def _shift_one(table, meta):
    """A row range shifted by one row (the last run reads past its end into nothing: the layout
    breaks), with the table otherwise as written."""
    first = next(iter(meta["runs"].values()))
    first["rows"] = [first["rows"][0] + 1, first["rows"][1] + 1]
    return table, meta


def _swap_values(table, meta):
    """Same layout, same steps, two runs' val/acc swapped in the table: only the digest tells."""
    col = table.column("val/acc").to_numpy().copy()
    col[:3], col[3:6] = col[3:6].copy(), col[:3].copy()
    return table.set_column(table.column_names.index("val/acc"), "val/acc", pa.array(col)), meta


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "garbage": lambda p: p.write_bytes(b"\x00garbage" * 100),
    "empty": lambda p: p.write_bytes(b""),
    "a directory": lambda p: (p.unlink(), p.mkdir()),
    "meta not json": lambda p: _rewrite_cache(p.parent.parent, lambda t, m: (t, "not json")),
    "meta without runs": lambda p: _rewrite_cache(p.parent.parent, lambda t, m: (t, {"version": m["version"]})),
    "rows out of range": lambda p: _rewrite_cache(p.parent.parent, lambda t, m: (
        t, {**m, "runs": {k: {**v, "rows": [0, 10**6]} for k, v in m["runs"].items()}})),
    "entries of the wrong type": lambda p: _rewrite_cache(p.parent.parent, lambda t, m: (
        t, {**m, "runs": {k: {**v, "metrics_key": "x", "warnings": 3} for k, v in m["runs"].items()}})),
    "rows shifted by a run": lambda p: _rewrite_cache(p.parent.parent, _shift_rows),
    "rows shifted by one": lambda p: _rewrite_cache(p.parent.parent, _shift_one),
    "values swapped": lambda p: _rewrite_cache(p.parent.parent, _swap_values),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_rebuilt_and_gives_the_files_values(sweep, damage):
    truth = _values(L.load([sweep], cache=False))
    assert _values(L.load([sweep])) .equals(truth)  # writes the cache
    path = sweep / L.CACHE_DIR / L.CACHE_FILE
    DAMAGE[damage](path)
    assert _values(L.load([sweep])).equals(truth), damage
    if path.is_file():  # rewritten whole: read back as written
        assert _values(L.load([sweep])).equals(truth)


def test_the_shift_the_campaign_found_would_have_changed_the_peaks(sweep):
    """Without the digest the shifted cache is well-formed: each run would get another run's curve."""
    L.load([sweep])
    _rewrite_cache(sweep, _shift_rows)
    path = sweep / L.CACHE_DIR / L.CACHE_FILE
    table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
    meta = json.loads(table.schema.metadata[L._META_KEY])
    assert L._contiguous([tuple(i["rows"]) for i in meta["runs"].values()], table.num_rows)
    digests = L._digests(table, [tuple(i["rows"]) for i in meta["runs"].values()])
    assert [i["digest"] for i in meta["runs"].values()] != digests


@pytest.mark.parametrize("depth, steps", [(100, "[1, 2, 3]"), (200_000, "[1, 3]")])
def test_deep_nesting_in_metrics_never_reaches_pyarrow(tmp_path, depth, steps):
    rd = RunDir.create(tmp_path / "sw", resolve({"max_steps": 5}))
    rd.append_metrics(1, {"train/reward": 0.5})
    with open(rd.metrics_path, "ab") as fh:
        fh.write(b'{"step": 2, "x": ' + b"[" * depth + b"]" * depth + b"}\n")
    rd.append_metrics(3, {"train/reward": 0.7})
    assert not L.shallow(rd.metrics_path.read_bytes())
    # in a child: pyarrow's crash would take the test process with it
    code = ("import sys; from armorlab.analysis.load import load; rs = load([sys.argv[1]], cache=False); "
            "print(sorted(rs.wide['step'].tolist()), len(rs.warnings))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sw")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # json reads 100 levels (the value is no metric, the step stays); 200,000 is a skipped line
    assert out.stdout.startswith(steps), out.stdout


def test_shallow_accepts_metrics_lines_fast_and_counts_otherwise():
    flat = b"".join(json.dumps({"step": i, "val/acc": 0.5}).encode() + b"\n" for i in range(1000))
    assert L.shallow(flat)
    assert L.shallow(b'{"step": 1, "x": [[1, 2], [3]]}\n')
    assert not L.shallow(b'{"step": 1, "x": ' + b"[" * 65 + b"]" * 65 + b"}\n")
    assert L.shallow(b'{"step": 1, "x": ' + b"[" * 63 + b"]" * 63 + b"}\n")
    # counted per line: a run of brackets is deep whatever the lines before it held
    assert not L.shallow(b'{"a": "' + b"}" * 100 + b'"}\n' + b"[" * 100)


def test_load_exposes_the_reports_group_labels(sweep, tmp_path):
    rs = L.load([sweep])
    # one config, three seeds: one group (seeds never split groups)
    assert set(run_groups(rs)) == {"all runs"}
    labels = run_groups(rs, ["seed"])
    assert sorted(labels) == ["seed=0", "seed=1", "seed=2"] and labels.index.name == "run_id"
    long = rs.long.assign(group=rs.long["run_id"].map(run_groups(rs, ["seed"])))
    assert long["group"].notna().all() and np.isin(long["group"], labels.to_numpy()).all()
