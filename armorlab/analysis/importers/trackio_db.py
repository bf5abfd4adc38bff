"""trackio projects (one SQLite file each), read with sqlite3 (docs/importers.md#trackio). Read-only: a file
without a ``-wal`` beside it is opened ``immutable`` (no lock, no file created), else ``mode=ro``, which
reads the log's pages but never checkpoints it."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from functools import reduce
from pathlib import Path
from urllib.parse import quote

import numpy as np

from armorlab.analysis.importers import base as B
from armorlab.analysis.importers import flavours as F
from armorlab.core.fsutil import open_regular
from armorlab.errors import ArmorLabError


def connect(path: Path) -> sqlite3.Connection:
    path = Path(path).resolve()
    mode = "mode=ro" if path.with_name(path.name + "-wal").exists() else "immutable=1"
    con = sqlite3.connect(f"file:{quote(str(path))}?{mode}", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", errors="replace")  # run names are labels; metrics read as BLOB
    return con


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _id_column(con: sqlite3.Connection, table: str) -> str:
    """How ``table`` names a run: ``run_id``, or ``run_name`` in older trackio."""
    return "run_id" if "run_id" in {r[1] for r in con.execute(f"PRAGMA table_info({table})")} else "run_name"


def is_project_db(path: Path) -> bool:
    if not path.is_file() or path.suffix not in (".db", ".sqlite", ".sqlite3"):
        return False
    try:
        with os.fdopen(open_regular(path), "rb") as fh:
            if fh.read(16) != b"SQLite format 3\0":
                return False
        with closing(connect(path)) as con:
            return "metrics" in _tables(con)
    except (OSError, sqlite3.Error):
        return False


def read_project(path: Path, *, flavour: str | None = None, only: set[str] | None = None
                 ) -> list[B.ImportedRun]:
    """Every run of a trackio project file (or those whose run id or name is in ``only``)."""
    path = Path(path)
    try:
        with closing(connect(path)) as con:
            rows = con.execute(f"SELECT {_id_column(con, 'metrics')}, run_name, step, CAST(metrics AS BLOB) "
                               "FROM metrics ORDER BY id").fetchall()
            configs = {} if "configs" not in _tables(con) else {  # configs: TEXT in older trackio, orjson bytes now
                rid: B.parsed_json(blob.decode("utf-8", "replace") if isinstance(blob, bytes) else str(blob))
                for rid, blob in con.execute(f"SELECT {_id_column(con, 'configs')}, config FROM configs")}
    except sqlite3.Error as exc:
        raise ArmorLabError(f"cannot read trackio database: {exc}", key="path", value=str(path)) from None
    by_run: dict[str, tuple[str, list[int], list[bytes]]] = {}
    for rid, run_name, step, blob in rows:
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if isinstance(step, int) and 0 <= step < B.MAX_STEP:  # NULL, text, 1e300: no step to plot at
            name = run_name if isinstance(run_name, str) and run_name else str(rid if rid is not None else path.stem)
            entry = by_run.setdefault(rid, (name, [], []))
            entry[1].append(step)
            entry[2].append(b"null" if blob is None else blob)
    bad_steps = len(rows) - sum(len(steps) for _, steps, _ in by_run.values())
    names = [name for name, _, _ in by_run.values()]
    out = []
    for rid, (run_name, steps, blobs) in by_run.items():
        if only and rid not in only and run_name not in only:
            continue
        warnings = [f"skipped {bad_steps} rows of {path} whose step is not a whole number in [0, 2**63)"] \
            if bad_steps else []
        config = configs.get(rid)
        if config is not None and not isinstance(config, dict):
            warnings.append(f"{path}: the config of run {run_name} is not a JSON object; left out")
        flat = B.flatten({k: v for k, v in (config if isinstance(config, dict) else {}).items()
                          if not k.startswith("_")})
        cols = _columns(blobs, warnings, path)
        fl, steps = F.pick(flavour, flat, cols), np.asarray(steps, dtype=np.int64)
        if own := [cols[k] for k in fl.step_keys if k in cols]:  # the trainer's step where rows carry it
            trainer_step = reduce(lambda a, b: np.where(np.isnan(a), b, a), own)  # the first key a row has
            keep = B.good_steps(trainer_step)
            if not keep.all():  # rows without it are left out
                warnings.append(f"{int((~keep).sum())} rows without the trainer's step as a whole number in "
                                f"[0, 2**63) ({', '.join(k for k in fl.step_keys if k in cols)}) left out (their "
                                "trackio step counts log calls)")
            steps = trainer_step[keep].astype(np.int64)
            cols = {name: col[keep] for name, col in cols.items()}
        out.append(F.imported_run({name: (steps, col) for name, col in cols.items()}, fl, flat, warnings,
                                  name=run_name if names.count(run_name) == 1 else f"{run_name}-{str(rid)[:8]}",
                                  path=path, format="trackio", project=path.stem, state="unknown",
                                  reason="trackio does not record whether a run finished"))
    return out


def _columns(blobs: list[bytes], warnings: list[str], path: Path) -> dict[str, np.ndarray]:
    """The rows' metrics as float64 arrays: pyarrow's JSON reader, else json.loads row by row."""
    data = b"\n".join(b.replace(b"\n", b" ") for b in blobs)
    if data.strip() and B.shallow(data):
        try:
            table = B.read_json_bytes(data, max(1 << 20, len(data) + 1))
            if table.num_rows == len(blobs):
                return B.float_columns(table.column_names, table.columns)
        except Exception:  # ArrowInvalid: the row-by-row reading below
            pass
    decoded = [row if isinstance(row := B.parsed_json(b), dict) else None for b in blobs]
    bad = sum(row is None for row in decoded)
    if bad:
        warnings.append(f"skipped {bad} rows of {path} whose metrics are not a JSON object")
    out = {}
    rows = ((i, row) for i, row in enumerate(decoded) if row is not None)
    for name, (idx, values) in B.rows_to_series(rows).items():
        out[name] = np.full(len(blobs), np.nan)
        out[name][idx] = values
    return out

