"""Read many run directories into pandas: a long table (run_id, config columns, step, metric,
value), a wide per-run table (run_id, step, one column per metric) and a per-run table
(run_id, sweep, path, state, reason, flattened config).

metrics.jsonl follows armorlab.core.runs' rules (torn lines skipped with a warning, non-integer
steps ignored, the later line winning per metric after a resume, non-numbers ignored), parsed by
pyarrow in one call per file; a file it rejects is re-read line by line. The cache
(``<sweep>/.armorlab-cache/metrics.arrow``) and how it stays true: docs/reports.md and
docs/safety-and-errors.md.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from armorlab.analysis import importers
from armorlab.analysis.importers.base import flatten as flatten_config  # nested config → dotted keys
from armorlab.analysis.importers.base import json_lines, read_json_bytes, shallow
from armorlab.core.config import LOGGING_KEYS
from armorlab.core.fsutil import atomic_file, atomic_write_text, read_regular, read_regular_text, remove_file
from armorlab.core.health import GATE_DROP, GATE_SHARE, GATE_WINDOW, WATCHED, series_warnings
from armorlab.core.runs import RunDir, valid_step
from armorlab.errors import ArmorLabError

log = logging.getLogger(__name__)

CACHE_DIR = ".armorlab-cache"
CACHE_FILE = "metrics.arrow"
CACHE_VERSION = 5  # 5: each entry carries a digest of its rows
OLD_CACHE_FILES = ("metrics.parquet",)  # earlier formats, removed when the cache is rewritten
META_COLUMNS = ("run_id", "sweep", "path", "state", "reason", "world_size", "format", "unavailable")
COUNTERS = ("step", "rollout")  # the x axes a metrics line carries: optimizer steps and rollouts
_META_KEY = b"armorlab_cache"


# --------------------------------------------------------------------------- parsing one file
def _numeric_frame(df: pd.DataFrame) -> pd.DataFrame:
    keep = {}
    for col in df.columns:
        if col == "step":
            continue
        s = df[col]
        if pd.api.types.is_bool_dtype(s) or pd.api.types.is_numeric_dtype(s):
            keep[col] = s.astype(np.float64)
        elif s.dtype == object:
            num = pd.to_numeric(s.where(s.map(lambda x: isinstance(x, (int, float)) or x is None)),
                                errors="coerce")
            if num.notna().any():
                keep[col] = num.astype(np.float64)
    out = pd.DataFrame(keep, index=df.index)
    out.insert(0, "step", df["step"].to_numpy(dtype=np.int64))
    return out


def _merge_duplicate_steps(df: pd.DataFrame) -> pd.DataFrame:
    steps = df["step"].to_numpy()
    if steps.size and np.all(steps[1:] > steps[:-1]):
        return df.reset_index(drop=True)
    # stable sort keeps file order inside a step; last() takes the last non-null per column
    return df.groupby("step", sort=True).last().reset_index()


def _numeric_table(table):
    """pyarrow's parse → int64 ``step`` + float64 numeric/boolean metrics, in Arrow (no per-file pandas)."""
    import pyarrow as pa

    cols, names = [table.column("step").cast(pa.int64())], ["step"]
    for name, col in zip(table.column_names, table.columns, strict=True):
        if name == "step":
            continue
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            cols.append(col.cast(pa.float64(), safe=False))  # as astype: ints past 2^53 round
            names.append(name)
    return pa.Table.from_arrays(cols, names=names)


def _empty_table():
    import pyarrow as pa

    return pa.table({"step": pa.array([], pa.int64())})


def parse_metrics_table(data: bytes, source: str = "metrics.jsonl"):
    """metrics.jsonl content → (Table: int64 ``step`` + float64 metrics, steps increasing; warnings)."""
    import pyarrow as pa

    if not data.strip():
        return _empty_table(), []
    try:
        if not shallow(data):  # pyarrow's JSON reader crashes the process on deep nesting
            raise ValueError("nested too deeply for pyarrow: the line-by-line parser reads it")
        import pyarrow.compute as pc

        table = read_json_bytes(data)
        step = table.column("step") if "step" in table.column_names else None
        if (step is not None and pa.types.is_signed_integer(step.type) and step.null_count == 0
                and (len(step) == 0 or pc.min(step).as_py() >= 0)):
            out = _numeric_table(table)
            steps = out.column("step").to_numpy()
            if np.all(steps[1:] > steps[:-1]):
                return out, []
            frame = _merge_duplicate_steps(out.to_pandas())
            return pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None), []
    except Exception:  # ArrowInvalid on a torn/odd line: fall back to the line-by-line rules
        pass
    frame, warnings = _parse_lines(data, source)
    # no pandas metadata: tables of many runs are concatenated and converted at once
    return pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None), warnings


def _parse_lines(data: bytes, source: str) -> tuple[pd.DataFrame, list[str]]:
    """Line by line, exactly like RunDir.iter_metrics (the slow path for damaged files)."""
    warnings: list[str] = []
    rows = []
    for lineno, row in json_lines(data.decode("utf-8", errors="replace").splitlines(), source, warnings, "torn"):
        if isinstance(row, dict) and valid_step(row.get("step")):
            rows.append(row)
        elif isinstance(row, dict) and "step" in row:
            warnings.append(f"skipped line {lineno} of {source}: step {row['step']!r:.40} is not an "
                            "integer in [0, 2^63)")
    df = pd.DataFrame.from_records(rows) if rows else pd.DataFrame({"step": np.empty(0, dtype=np.int64)})
    return _merge_duplicate_steps(_numeric_frame(df)), warnings


def parse_metrics_bytes(data: bytes, source: str = "metrics.jsonl") -> tuple[pd.DataFrame, list[str]]:
    """Parse metrics.jsonl content → (frame with int ``step`` + float metric columns, warnings)."""
    table, warnings = parse_metrics_table(data, source)
    return table.to_pandas(), warnings


def parse_metrics_file(path: str | os.PathLike):
    """Parse one metrics.jsonl (missing file → empty table) → (pyarrow Table, warnings)."""
    path = Path(path)
    try:
        data = read_regular(path)
    except FileNotFoundError:
        data = b""
    except OSError as exc:  # unreadable, or a directory: the rest of the report still gets written
        return _empty_table(), [f"cannot read {path}: {exc.strerror or exc}"]
    return parse_metrics_table(data, str(path))


# --------------------------------------------------------------------------- the cache
def _file_key(path: Path) -> list[int]:
    try:
        st = path.stat()
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [-1, -1]


@dataclass
class _Entry:
    """One run's parsed metrics Table and what they were parsed from."""
    frame: Any
    metrics_key: list[int]
    config_key: list[int]
    config: dict[str, Any] | None
    warnings: list[str]


def _read_cache(sweep_dir: Path) -> dict[str, _Entry]:
    """The cached entries whose rows match their digest: a damaged metrics.arrow costs a re-parse of the
    runs it no longer vouches for, never wrong values."""
    path = sweep_dir / CACHE_DIR / CACHE_FILE
    if not path.is_file():
        return {}
    try:
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
        meta = json.loads((table.schema.metadata or {}).get(_META_KEY, b"{}"))
        if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
            return {}
        table = table.replace_schema_metadata(None)
        runs = meta["runs"]
        bounds = [tuple(info["rows"]) for info in runs.values()]
        if not _contiguous(bounds, table.num_rows) or "step" not in table.column_names:
            raise ValueError("its row ranges do not tile the table")
        digests = _digests(table, bounds)
        entries: dict[str, _Entry] = {}
        for (name, info), (a, b), digest in zip(runs.items(), bounds, digests, strict=True):
            if info.get("digest") != digest:
                log.warning("analysis cache %s: the rows of run %s do not match their digest; re-reading it",
                            path, name)
                continue
            # a zero-copy slice; metrics a run never logged are all-null columns, i.e. absent
            entries[name] = _Entry(table.slice(a, b - a), list(info["metrics_key"]), list(info["config_key"]),
                                   info["config"] if isinstance(info["config"], dict) else None,
                                   [str(w) for w in info["warnings"]])
        return entries
    except Exception as exc:  # noqa: BLE001 - a broken cache is only a missed speed-up
        log.warning("ignoring damaged analysis cache %s (%s: %s); rebuilding it", path, type(exc).__name__, exc)
        return {}


def _contiguous(bounds: list[tuple[Any, ...]], n_rows: int) -> bool:
    """The entries' [a, b) row ranges follow one another from 0 to the table's end."""
    at = 0
    for bound in bounds:
        if len(bound) != 2 or not all(type(x) is int for x in bound) or bound[0] != at or bound[1] < at:
            return False
        at = bound[1]
    return at == n_rows


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _digests(table: Any, bounds: list[tuple[int, int]]) -> list[str]:
    """Per entry, Σ over cells of value bits × (row + 1) × column weight, wrapping: a changed, moved
    or swapped value changes it, at memory speed."""
    import hashlib

    n = table.num_rows
    starts = np.array([a for a, b in bounds if b > a], dtype=np.int64)
    total = np.zeros(starts.size, dtype=np.uint64)
    if n and starts.size:
        weights = (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN) | np.uint64(1)
        for name in sorted(table.column_names):
            col = table.column(name)
            values = np.asarray(col.to_numpy())
            bits = np.ascontiguousarray(values).view(np.uint64) if values.dtype.itemsize == 8 else \
                values.astype(np.float64).view(np.uint64)
            salt = np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") | 1)
            total += np.add.reduceat(bits * weights, starts) * salt
    it = iter(total.tolist())
    return [f"{next(it):016x}" if b > a else "empty" for a, b in bounds]


def _write_cache(sweep_dir: Path, entries: dict[str, _Entry]) -> None:
    import pyarrow as pa

    frames = []
    meta_runs = {}
    row = 0
    for name, e in entries.items():
        if not (sweep_dir / name).is_dir():  # the run dir was deleted: forget it
            continue
        meta_runs[name] = {"metrics_key": e.metrics_key, "config_key": e.config_key,
                           "config": e.config, "warnings": e.warnings, "rows": [row, row + len(e.frame)]}
        row += len(e.frame)
        if len(e.frame):
            frames.append(e.frame)
    table = pa.concat_tables(frames, promote_options="default") if frames else _empty_table()
    for info, digest in zip(meta_runs.values(), _digests(table, [tuple(i["rows"]) for i in meta_runs.values()]),
                            strict=True):
        info["digest"] = digest
    meta = json.dumps({"version": CACHE_VERSION, "runs": meta_runs}).encode()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META_KEY: meta})
    path = sweep_dir / CACHE_DIR / CACHE_FILE
    with atomic_file(path, within=sweep_dir) as tmp, pa.OSFile(str(tmp), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    for old in OLD_CACHE_FILES:
        remove_file(path.parent / old, within=sweep_dir)
    gitignore = path.parent / ".gitignore"
    if not gitignore.exists():
        atomic_write_text(gitignore, "*\n", within=sweep_dir)


# --------------------------------------------------------------------------- the run set
@dataclass
class RunSet:
    """Loaded runs: ``runs`` one row per run, ``wide`` (run_id, step, metrics...), ``warnings``."""
    runs: pd.DataFrame
    wide: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    slices: dict[str, tuple[int, int]] | None = None  # run_id → its rows of ``wide``, when known
    counter: str = "step"  # the x of curve() and last_step(): "step" or "rollout" (recipe ``x``)

    @cached_property
    def _slices(self) -> dict[str, tuple[int, int]]:
        if self.slices is not None:
            return self.slices
        ids = self.wide["run_id"].to_numpy()
        if ids.size == 0:
            return {}
        bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
        return {ids[a]: (a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)}

    @property
    def run_ids(self) -> list[str]:
        return self.runs["run_id"].tolist()

    @property
    def metrics(self) -> list[str]:
        """Metric names present in at least one run (the counters ``step`` and ``rollout`` are not)."""
        return [c for c in self.wide.columns if c not in ("run_id", *COUNTERS)]

    def has_metric(self, run_id: str, metric: str) -> bool:
        steps, _ = self.curve(run_id, metric)
        return steps.size > 0

    @cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        # one numpy view per column: curve() is called thousands of times per report
        return {c: self.wide[c].to_numpy() for c in self.wide.columns if c != "run_id"}

    def curve(self, run_id: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric, NaN dropped, in ``counter``; in rollouts one averaged point per rollout."""
        cols = self._columns
        if metric not in cols or metric in COUNTERS or run_id not in self._slices:
            return np.empty(0, dtype=np.int64), np.empty(0)
        a, b = self._slices[run_id]
        values = cols[metric][a:b]
        keep = ~np.isnan(values)
        if self.counter == "step":
            return cols["step"][a:b][keep], values[keep]
        if self.counter not in cols:
            return np.empty(0, dtype=np.int64), np.empty(0)
        x = cols[self.counter][a:b]
        keep &= ~np.isnan(x)
        x, values = x[keep].astype(np.int64), values[keep]
        if x.size < 2 or np.all(x[1:] > x[:-1]):
            return x, values
        first, counts = np.unique(x, return_index=True, return_counts=True)[1:]
        return x[first], np.add.reduceat(values, first) / counts

    def last_step(self, run_id: str) -> int | None:
        """The last logged step (in ``counter``) of a run (None when it logged nothing)."""
        a_b = self._slices.get(run_id)
        if a_b is None:
            return None
        x = self._columns.get(self.counter)
        if x is None:
            return None
        last = x[a_b[0]:a_b[1]]
        last = last[~np.isnan(last)] if last.dtype.kind == "f" else last
        return int(last[-1]) if last.size else None

    def config_columns(self, varying_only: bool = False) -> list[str]:
        cols = [c for c in self.runs.columns if c not in META_COLUMNS]
        if varying_only:
            cols = [c for c in cols if self.runs[c].astype(str).nunique(dropna=False) > 1]
        return cols

    @cached_property
    def long(self) -> pd.DataFrame:
        """(run_id, <config keys that vary between runs>, step, metric, value), NaNs dropped."""
        metric_cols = self.metrics
        values = self.wide[metric_cols].to_numpy(dtype=np.float64)
        rows, cols = np.nonzero(~np.isnan(values))
        position = {r: i for i, r in enumerate(self.run_ids)}
        col = self.wide["run_id"]
        if isinstance(col.dtype, pd.CategoricalDtype):
            remap = np.array([position[c] for c in col.cat.categories], dtype=np.int64)
            codes = remap[col.cat.codes.to_numpy()[rows]] if remap.size else np.empty(0, dtype=np.int64)
        else:
            codes = np.array([position[r] for r in col.to_numpy()[rows]], dtype=np.int64)
        run_codes = pd.Categorical.from_codes(codes, categories=self.run_ids)
        out = pd.DataFrame({"run_id": run_codes})
        by_run = self.runs.set_index("run_id")
        for key in self.config_columns(varying_only=True):
            per_run = by_run[key].reindex(self.run_ids)
            if pd.api.types.is_numeric_dtype(per_run) and not pd.api.types.is_bool_dtype(per_run):
                out[key] = per_run.to_numpy()[run_codes.codes]
            else:  # categorical: millions of rows share a handful of values
                cat = pd.Categorical(per_run.astype(object).where(per_run.notna(), None))
                out[key] = pd.Categorical.from_codes(cat.codes[run_codes.codes], categories=cat.categories)
        out["step"] = self.wide["step"].to_numpy()[rows]
        out["metric"] = pd.Categorical.from_codes(cols, categories=metric_cols)
        out["value"] = values[rows, cols]
        return out


# a sweep dir's manifest (the run-dir contract in docs/design; written by armorlab.sweeps.manifest)
MANIFEST = "sweep.json"


def in_stages(run_dirs: Iterable[RunDir], stages: Iterable[str]) -> list[RunDir]:
    """The runs their sweep's ``sweep.json`` ``stages`` map puts in one of ``stages``."""
    wanted, maps = set(stages), {}
    out = []
    for rd in run_dirs:
        sweep = rd.path.parent
        if sweep not in maps:
            try:
                maps[sweep] = dict(json.loads(read_regular_text(sweep / MANIFEST)).get("stages") or {})
            except (OSError, ValueError, AttributeError):
                maps[sweep] = {}
        if maps[sweep].get(rd.id) in wanted:
            out.append(rd)
    return out


def load(paths: Iterable[str | os.PathLike], *, cache: bool = True,
         progress: Callable[[int, int], None] | None = None, format: str | None = None,
         mapping: str | os.PathLike | importers.RunsMap | None = None, val_n: int | None = None,
         stages: Iterable[str] | None = None) -> RunSet:
    """Runs (armorlab run/sweep dirs, other libraries' logs, globs) → RunSet; ``format``, ``mapping``,
    ``val_n`` as in armorlab.analysis.importers; ``stages`` keeps those stages' runs. None found: ArmorLabError."""
    paths = list(paths)
    runs_map = importers.load_mapping(mapping) if isinstance(mapping, (str, os.PathLike)) else mapping
    plan = importers.plan(paths, format=format, mapping=runs_map)
    if stages is not None:
        stages = list(stages)
        plan.native = in_stages(plan.native, stages)
        if not plan.native and not plan.sources:
            raise ArmorLabError(f"no run of stage(s) {', '.join(stages)} found (a sweep's sweep.json lists its "
                                f"runs' stages)", key="stages", value=stages)
    if not plan.native and not plan.sources:
        raise ArmorLabError("no run directories found (nor TRL, W&B, TensorBoard, verl or trackio runs)",
                            key="runs", value=[str(p) for p in paths])
    imported = importers.read(plan, val_n=val_n if val_n is not None else (runs_map.val_n if runs_map else None))
    if not plan.native:
        return _with_imported(None, imported)
    rs = _load_native(plan.native, cache=cache, progress=progress)
    return _with_imported(rs, imported) if imported else rs


def _load_native(run_dirs: list[RunDir], *, cache: bool, progress: Callable[[int, int], None] | None) -> RunSet:
    cached_by_sweep = {s: _read_cache(s) if cache else {} for s in dict.fromkeys(rd.path.parent for rd in run_dirs)}
    entries: dict[Path, _Entry] = {}
    todo: list[RunDir] = []
    for rd in run_dirs:
        e = cached_by_sweep[rd.path.parent].get(rd.path.name)
        if e is not None and e.metrics_key == _file_key(rd.metrics_path) and e.config_key == _file_key(rd.config_path):
            entries[rd.path] = e
        else:
            todo.append(rd)

    def parse(rd: RunDir) -> tuple[_Entry, _Facts]:
        # key first: a file growing while we read it is re-parsed next time
        mkey, ckey = _file_key(rd.metrics_path), _file_key(rd.config_path)
        frame, warns = parse_metrics_file(rd.metrics_path)
        try:
            config = rd.read_config()
        except ArmorLabError as exc:
            config, warns = None, [*warns, f"unreadable config: {exc}"]
        entry = _Entry(frame, mkey, ckey, config, warns)
        # here, not in _assemble: on another thread they overlap the parsing of the next file
        return entry, _facts(rd, entry)

    done = len(run_dirs) - len(todo)
    if progress:
        progress(done, len(run_dirs))
    facts: dict[Path, _Facts] = {}
    if todo:
        # pyarrow releases the GIL while parsing: a few threads overlap parsing with file reads
        with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
            for rd, (entry, fact) in zip(todo, pool.map(parse, todo), strict=True):
                entries[rd.path] = cached_by_sweep[rd.path.parent][rd.path.name] = entry
                facts[rd.path] = fact
                done += 1
                if progress:
                    progress(done, len(run_dirs))
            if cache:  # written while the run set is assembled (Arrow writes without the GIL)
                sweeps = dict.fromkeys(rd.path.parent for rd in todo)
                writes = {s: pool.submit(_write_cache, s, cached_by_sweep[s]) for s in sweeps}
                result = _assemble(run_dirs, entries, facts)
                for s, w in writes.items():
                    if w.exception() is not None:  # read-only sweep dir, full disk: analysis still works
                        log.warning("could not write analysis cache in %s: %s", s, w.exception())
                return result
    return _assemble(run_dirs, entries, facts)


def _unique_ids(run_dirs: list[RunDir]) -> list[str]:
    ids = [rd.id for rd in run_dirs]
    dup = {i for i in ids if ids.count(i) > 1}
    # the same config in two sweeps has the same id: tell them apart by sweep name
    return [f"{rd.path.parent.name}/{rd.id}" if rd.id in dup else rd.id for rd in run_dirs]


def _health(table, *, final: bool) -> list[str]:
    """armorlab.core.health's warnings (runs that trained on nothing) from a run's metrics table."""
    steps = None
    series = {}
    for name in WATCHED:
        if name in table.column_names:
            if steps is None:
                steps = table.column("step").to_numpy()
            values = table.column(name).to_numpy()  # float64; nulls → NaN
            keep = np.isfinite(values) & (steps >= 1)
            if name == GATE_DROP and _gate_screened_out(values[keep]):
                continue
            series[name] = list(zip(steps[keep].tolist(), values[keep].tolist(), strict=True))
    return series_warnings(series, final=final)


def _gate_screened_out(shares: np.ndarray) -> bool:
    """Whether health.gate_warning cannot fire (no window mean within 10⁻³ of GATE_SHARE): then the
    per-step series is not built — it cost a tenth of a second over 200 runs."""
    if shares.size < GATE_WINDOW or np.abs(shares).max() > 1.0:
        return False
    prefix = np.concatenate([[0.0], np.cumsum(shares)])
    return float((prefix[GATE_WINDOW:] - prefix[:-GATE_WINDOW]).max()) < (GATE_SHARE - 1e-3) * GATE_WINDOW


@dataclass
class _Facts:
    """One run's status (read at every load: a cached run may have finished), flat config and health warnings."""
    status: dict[str, Any]
    config: dict[str, Any]
    health: list[str]


def _facts(rd: RunDir, e: _Entry) -> _Facts:
    status = rd.read_status()
    # how a run was logged is not an experimental factor
    config = {k: v for k, v in flatten_config(e.config or {}).items()
              if k not in META_COLUMNS and k not in LOGGING_KEYS}
    health = _health(e.frame, final=status.get("state") in ("completed", "stopped", "failed")) if len(e.frame) else []
    return _Facts(status, config, health)


def _assemble(run_dirs: list[RunDir], entries: dict[Path, _Entry], facts: dict[Path, _Facts]) -> RunSet:
    """The run set of these runs; ``facts`` of runs parsed just now (the others' are read here)."""
    warnings: list[str] = []
    rows, frames, ids, slices = [], [], [], {}
    start = 0
    for rid, rd in zip(_unique_ids(run_dirs), run_dirs, strict=True):
        e = entries[rd.path]
        fact = facts.get(rd.path) or _facts(rd, e)
        status = fact.status
        row = {"run_id": rid, "sweep": rd.path.parent.name, "path": str(rd.path),
               "state": status.get("state"), "reason": status.get("reason"),
               "world_size": status.get("world_size"), **fact.config}
        rows.append(row)
        warnings.extend(f"run {rid}: {w}" for w in e.warnings)
        if len(e.frame) == 0:
            warnings.append(f"run {rid}: no metrics logged yet ({rd.metrics_path})")
            continue
        warnings.extend(f"run {rid}: {w}" for w in fact.health)
        frames.append(e.frame)
        ids.append(rid)
        slices[rid] = (start, start + len(e.frame))
        start += len(e.frame)
    wide = _wide(frames, ids, [b - a for a, b in slices.values()])
    return RunSet(runs=pd.DataFrame(rows), wide=wide, warnings=warnings, slices=slices)


def _wide(tables: list[Any], ids: list[str], lengths: list[int]) -> pd.DataFrame:
    """(run_id, step, metrics...) from one Arrow concatenation and one conversion (not a frame per run)."""
    if not tables:
        return pd.DataFrame({"run_id": pd.Series([], dtype=object), "step": pd.Series([], dtype=np.int64)})
    import pyarrow as pa

    table = pa.concat_tables(tables, promote_options="default")
    wide = table.select(["step", *sorted(c for c in table.column_names if c != "step")]).to_pandas()
    wide.insert(0, "run_id", pd.Categorical.from_codes(np.repeat(np.arange(len(ids)), lengths), categories=ids))
    return wide


def load_runs(paths: Iterable[str | os.PathLike], *, cache: bool = True) -> pd.DataFrame:
    """Contract C5: the long table (run_id, varying config columns, step, metric, value)."""
    return load(paths, cache=cache).long


def _with_imported(rs: RunSet | None, imported: list[importers.ImportedRun]) -> RunSet:
    """``rs`` (or None) with the imported runs appended to ``runs`` and ``wide``, and their warnings."""
    import pyarrow as pa

    taken = set(rs.run_ids) if rs is not None else set()
    rows, frames, ids, warnings, unknown_n = [], [], [], [], []
    cannot: dict[tuple[str, str | None, tuple[str, ...]], list[str]] = {}
    # a name two runs share is prefixed with the folder (project) in every run that has it: collapse/seed0
    # beside flat/seed0, not seed0 beside flat/seed0
    count = Counter(r.name for r in imported)
    shared = {n for n, c in count.items() if c > 1 or n in taken}
    for run in imported:
        rid = f"{run.project}/{run.name}" if run.name in shared and run.project else run.name
        folder = run.config.get("wandb.group") or run.project
        if folder and importers.GROUP_KEY not in run.config:  # grouped by its folder unless a runs.yaml says
            run.config[importers.GROUP_KEY] = str(folder)
        i = 2
        while rid in taken:
            rid, i = f"{run.name}#{i}", i + 1
        taken.add(rid)
        rows.append({"run_id": rid, "sweep": run.project, "path": str(run.path), "state": run.state,
                     "reason": run.reason, "world_size": None, "format": run.format,
                     "unavailable": ", ".join(run.unavailable), **run.config})
        if run.unavailable:
            cannot.setdefault((run.format, run.flavour, tuple(run.unavailable)), []).append(rid)
        warnings.extend(f"run {rid}: {w}" for w in run.warnings)
        if "val/acc" in run.metrics and "val/n" not in run.metrics:
            unknown_n.append(rid)
        if len(run.table) == 0:
            warnings.append(f"run {rid}: no metrics in {run.path}")
            continue
        warnings.extend(f"run {rid}: {w}" for w in _health(run.table, final=run.state in ("completed", "stopped", "failed")))
        frames.append(run.table)
        ids.append(rid)
    for (fmt, flavour, metrics), rids in cannot.items():
        warnings.append(f"{len(rids)} run(s) imported from {fmt}" + (f" ({flavour})" if flavour and flavour != fmt else "")
                        + f" cannot give {', '.join(metrics)}: their source does not log them")
    if unknown_n:
        warnings.append(f"val/n unknown for {len(unknown_n)} imported run(s) ({', '.join(unknown_n[:6])}"
                        + (" …" if len(unknown_n) > 6 else "") + "): their sources do not log how many completions "
                        "each validation scored, so the collapse test estimates the noise from the curve; give it "
                        "with --val-n N or val_n in a runs.yaml")
    native_ids = list(rs._slices) if rs is not None else []
    lengths = [b - a for a, b in rs._slices.values()] if rs is not None else []
    tables = []
    if native_ids:
        native = rs.wide.drop(columns=["run_id"])
        tables.append(pa.Table.from_pandas(native, preserve_index=False).replace_schema_metadata(None))
    runs = pd.DataFrame(rows) if rs is None else pd.concat([rs.runs, pd.DataFrame(rows)], ignore_index=True)
    all_ids = native_ids + ids
    lengths += [len(f) for f in frames]
    wide = _wide(tables + frames, all_ids, lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    slices = {r: (int(starts[i]), int(starts[i + 1])) for i, r in enumerate(all_ids)}
    return RunSet(runs=runs, wide=wide, warnings=(list(rs.warnings) if rs is not None else []) + warnings,
                  slices=slices)
