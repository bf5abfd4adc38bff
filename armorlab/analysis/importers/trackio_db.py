"""trackio projects: one SQLite file per project (``$TRACKIO_DIR/<project>.db``, by default under
``~/.cache/huggingface/trackio``), read with the standard library's sqlite3.

Tables read: ``metrics(run_id, run_name, step, timestamp, metrics)`` — ``metrics`` is one JSON
object per ``trackio.log`` call, non-finite floats written as the strings "NaN"/"Infinity" —
and ``configs(run_id, run_name, config)``. A run is a ``run_id`` (older files, without that
column: a ``run_name``). trackio's ``step`` counts log calls unless the caller passes one, so the
trainer's own counter is used where its rows carry one (TRL ``train/global_step``); rows without
it (TRL's profiling timers) are then left out, with a count in the run's warnings.

Read-only: a file without a write-ahead log beside it is opened ``immutable`` (SQLite then takes
no lock and creates no file); one with a ``-wal`` file (a writer is live, or was killed) is opened
``mode=ro``, which reads the log's pages but never checkpoints it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from armorlab.analysis.importers import flavours as F
from armorlab.analysis.importers.base import (
    ImportedRun,
    flatten,
    rows_to_series,
    seed_and_config,
    unavailable,
)
from armorlab.errors import ArmorLabError


def connect(path: Path) -> sqlite3.Connection:
    path = Path(path).resolve()
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.exists() else "immutable=1"
    return sqlite3.connect(f"file:{quote(str(path))}?{mode}", uri=True)


def is_project_db(path: Path) -> bool:
    if not path.is_file() or path.suffix not in (".db", ".sqlite", ".sqlite3"):
        return False
    try:
        with open(path, "rb") as fh:
            if fh.read(16) != b"SQLite format 3\0":
                return False
        con = connect(path)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return False
    return "metrics" in tables


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _text(blob: Any) -> str:
    return blob.decode("utf-8", errors="replace") if isinstance(blob, (bytes, bytearray)) else str(blob)


def read_project(path: Path, *, flavour: str | None = None, only: set[str] | None = None) -> list[ImportedRun]:
    """Every run of a trackio project file (or those whose run id or name is in ``only``)."""
    path = Path(path)
    try:
        con = connect(path)
        try:
            has_id = "run_id" in _columns(con, "metrics")
            key = "run_id" if has_id else "run_name"
            rows = con.execute(f"SELECT {key}, run_name, step, metrics FROM metrics ORDER BY id").fetchall()
            configs: dict[str, Any] = {}
            if "configs" in {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}:
                ckey = "run_id" if "run_id" in _columns(con, "configs") else "run_name"
                for rid, blob in con.execute(f"SELECT {ckey}, config FROM configs"):
                    try:
                        configs[rid] = json.loads(_text(blob))
                    except ValueError:
                        continue
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise ArmorLabError(f"cannot read trackio database: {exc}", key="path", value=str(path)) from None
    by_run: dict[str, tuple[str, list[int], list[str]]] = {}
    for rid, run_name, step, blob in rows:
        entry = by_run.setdefault(rid, (run_name, [], []))
        entry[1].append(int(step))
        entry[2].append(_text(blob))
    names = [name for name, _, _ in by_run.values()]
    out = []
    for rid, (run_name, steps, texts) in by_run.items():
        if only and rid not in only and run_name not in only:
            continue
        # one parse for the run's rows: trackio stores one JSON object per row
        decoded = json.loads("[" + ",".join(texts) + "]")
        out.append(_run(path, rid, run_name, steps, decoded, configs.get(rid) or {}, flavour,
                        unique=names.count(run_name) == 1))
    return out


def _run(path: Path, rid: str, run_name: str, steps: list[int], decoded: list[Any], raw_config: dict[str, Any],
         flavour: str | None, unique: bool) -> ImportedRun:
    warnings: list[str] = []
    flat = flatten({k: v for k, v in raw_config.items() if not k.startswith("_")})
    names = {k for row in decoded if isinstance(row, dict) for k in row}
    fl = F.FLAVOURS[flavour] if flavour else F.detect(flat, names)
    step_keys = [k for k in fl.step_keys if k in names]
    rows = []
    skipped = 0
    for step, row in zip(steps, decoded, strict=True):
        if not isinstance(row, dict):
            continue
        if step_keys:
            own = next((row[k] for k in step_keys if isinstance(row.get(k), (int, float))), None)
            if own is None:
                skipped += 1
                continue
            step = int(own)
        rows.append((step, row))
    if skipped:
        warnings.append(f"{skipped} rows without the trainer's step ({', '.join(step_keys)}) left out "
                        "(their trackio step counts log calls)")
    series = rows_to_series(rows)
    table, origin = F.mapped_table(series, fl, flat, warnings)
    return ImportedRun(name=run_name if unique else f"{run_name}-{str(rid)[:8]}", path=path, format="trackio",
                       table=table, config=seed_and_config(flat, fl.identity), flavour=fl.name,
                       project=path.stem, state="unknown",
                       reason="trackio does not record whether a run finished", warnings=warnings,
                       unavailable=unavailable(table.column_names, fl.cannot), origin=origin)
