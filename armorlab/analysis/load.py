"""Run directories (and other libraries' logs) → a RunSet: one row per run, one wide table of metrics.
metrics.jsonl is parsed by pyarrow in one call per file (a file it rejects is re-read line by line, as
armorlab.core.runs reads it) and cached in ``<sweep>/.armorlab-cache/metrics.arrow``
(docs/reports.md#loading)."""

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
from armorlab.analysis.freshness import file_stat
from armorlab.analysis.importers.base import as_float, json_lines, read_json_bytes, shallow
from armorlab.analysis.importers.base import flatten as flatten_config  # nested config → dotted keys
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
ENDED = ("completed", "stopped", "failed")  # states after which a run's health is final
_META_KEY = b"armorlab_cache"
# a sweep dir's manifest (the run-dir contract in docs/design; written by armorlab.sweeps.manifest)
MANIFEST = "sweep.json"


# --------------------------------------------------------------------------- parsing one file
def _empty_table():
    import pyarrow as pa

    return pa.table({"step": pa.array([], pa.int64())})


def _fast_parse(data: bytes):
    """pyarrow's one-call parse → int64 ``step`` + float64 numeric/boolean metrics; None where the
    line-by-line rules must decide (a torn or odd line, a step that is not an integer ≥ 0)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:  # pyarrow's JSON reader crashes the process on deep nesting: such files go line by line
        table = read_json_bytes(data) if shallow(data) else None
    except Exception:  # ArrowInvalid on a torn/odd line
        return None
    step = table.column("step") if table is not None and "step" in table.column_names else None
    if (step is None or not pa.types.is_signed_integer(step.type) or step.null_count
            or (len(step) and pc.min(step).as_py() < 0)):
        return None
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return pa.table({"step": step.cast(pa.int64()),
                     **{name: col.cast(pa.float64(), safe=False)  # as astype: ints past 2^53 round
                        for name, col in zip(table.column_names, table.columns, strict=True)
                        if name != "step" and any(is_type(col.type) for is_type in numeric)}})


def _parse_lines(data: bytes, source: str):
    """Line by line, exactly like RunDir.iter_metrics (the slow path for damaged files)."""
    import pyarrow as pa

    warnings, rows = [], []
    for lineno, row in json_lines(data.decode("utf-8", errors="replace").splitlines(), source, warnings, "torn"):
        if isinstance(row, dict) and valid_step(row.get("step")):
            rows.append({"step": row["step"], **{k: as_float(v) for k, v in row.items()
                                                 if k != "step" and isinstance(v, (int, float))}})
        elif isinstance(row, dict) and "step" in row:
            warnings.append(f"skipped line {lineno} of {source}: step {row['step']!r:.40} is not an "
                            "integer in [0, 2^63)")
    if not rows:
        return _empty_table(), warnings
    return pa.Table.from_pandas(pd.DataFrame.from_records(rows), preserve_index=False), warnings


def parse_metrics_table(data: bytes, source: str = "metrics.jsonl"):
    """metrics.jsonl content → (Table: int64 ``step`` + float64 metrics, steps increasing; warnings)."""
    import pyarrow as pa

    table, warnings = _fast_parse(data), []
    if table is None:
        table, warnings = _parse_lines(data, source)
    steps = table.column("step").to_numpy()
    if not np.all(steps[1:] > steps[:-1]):
        # a resume repeats steps: the stable sort keeps file order inside a step, last() takes the last
        # non-null per column
        frame = table.to_pandas().groupby("step", sort=True).last().reset_index()
        table = pa.Table.from_pandas(frame, preserve_index=False)
    # no pandas metadata: tables of many runs are concatenated and converted at once
    return table.replace_schema_metadata(None), warnings


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
        entries: dict[str, _Entry] = {}
        for (name, info), (a, b), digest in zip(runs.items(), bounds, _digests(table, bounds), strict=True):
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
    if not all(len(b) == 2 and all(type(x) is int for x in b) and b[1] >= b[0] for b in bounds):
        return False
    return bounds == _ranges([b - a for a, b in bounds]) and sum(b - a for a, b in bounds) == n_rows


def _ranges(lengths: list[int]) -> list[tuple[int, int]]:
    """The [a, b) rows of tables of these lengths laid end to end."""
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    return [(end - n, end) for n, end in zip(lengths, ends, strict=True)]


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
            values = np.asarray(table.column(name).to_numpy())
            bits = np.ascontiguousarray(values).view(np.uint64) if values.dtype.itemsize == 8 else \
                values.astype(np.float64).view(np.uint64)
            salt = np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") | 1)
            total += np.add.reduceat(bits * weights, starts) * salt
    it = iter(total.tolist())
    return [f"{next(it):016x}" if b > a else "empty" for a, b in bounds]


def _write_cache(sweep_dir: Path, entries: dict[str, _Entry]) -> None:
    import pyarrow as pa

    live = {name: e for name, e in entries.items() if (sweep_dir / name).is_dir()}  # deleted runs: forgotten
    bounds = _ranges([len(e.frame) for e in live.values()])
    frames = [e.frame for e in live.values() if len(e.frame)]
    table = pa.concat_tables(frames, promote_options="default") if frames else _empty_table()
    digests = _digests(table, bounds)
    meta_runs = {name: {"metrics_key": e.metrics_key, "config_key": e.config_key, "config": e.config,
                        "warnings": e.warnings, "rows": list(rows), "digest": digest}
                 for (name, e), rows, digest in zip(live.items(), bounds, digests, strict=True)}
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
    slices: dict[str, tuple[int, int]]  # run_id → its rows of ``wide`` (runs that logged metrics)
    warnings: list[str] = field(default_factory=list)
    counter: str = "step"  # the x of curve() and last_step(): "step" or "rollout" (recipe ``x``)

    @property
    def run_ids(self) -> list[str]:
        return self.runs["run_id"].tolist()

    @property
    def metrics(self) -> list[str]:
        """Metric names present in at least one run (the counters ``step`` and ``rollout`` are not)."""
        return [c for c in self.wide.columns if c not in ("run_id", *COUNTERS)]

    def has_metric(self, run_id: str, metric: str) -> bool:
        return self.curve(run_id, metric)[0].size > 0

    @cached_property
    def _columns(self) -> dict[str, np.ndarray]:
        # one numpy view per column: curve() is called thousands of times per report
        return {c: self.wide[c].to_numpy() for c in self.wide.columns if c != "run_id"}

    def curve(self, run_id: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric, NaN dropped, in ``counter``; in rollouts one averaged point per rollout."""
        cols = self._columns
        if metric not in cols or metric in COUNTERS or run_id not in self.slices or self.counter not in cols:
            return np.empty(0, dtype=np.int64), np.empty(0)
        a, b = self.slices[run_id]
        x, values = cols[self.counter][a:b], cols[metric][a:b]
        keep = ~np.isnan(values)
        if self.counter == "step":
            return x[keep], values[keep]
        keep &= ~np.isnan(x)
        x, values = x[keep].astype(np.int64), values[keep]
        if x.size < 2 or np.all(x[1:] > x[:-1]):
            return x, values
        first, counts = np.unique(x, return_index=True, return_counts=True)[1:]
        return x[first], np.add.reduceat(values, first) / counts

    def last_step(self, run_id: str) -> int | None:
        """The last logged step (in ``counter``) of a run (None when it logged nothing)."""
        a, b = self.slices.get(run_id, (0, 0))
        x = self._columns.get(self.counter, np.empty(0))[a:b]
        x = x[~np.isnan(x)] if x.dtype.kind == "f" else x
        return int(x[-1]) if x.size else None

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
        # wide's categories are the runs that logged metrics: recoded to every run, in table order
        run_codes = self.wide["run_id"].cat.set_categories(self.run_ids).array[rows]
        keys = self.config_columns(varying_only=True)
        config = self.runs.set_index("run_id")[keys].reindex(self.run_ids)
        # categorical: millions of rows share a handful of values
        config = config.astype({k: "category" for k in keys if pd.api.types.is_bool_dtype(config[k])
                                or not pd.api.types.is_numeric_dtype(config[k])})
        out = config.iloc[run_codes.codes].reset_index(drop=True)
        out.insert(0, "run_id", run_codes)
        metric = pd.Categorical.from_codes(cols, categories=metric_cols)
        return out.assign(step=self.wide["step"].to_numpy()[rows], metric=metric, value=values[rows, cols])


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
        stages, maps = list(stages), {}
        for sweep in dict.fromkeys(rd.path.parent for rd in plan.native):
            try:  # the sweep's manifest maps its run ids to their stages
                maps[sweep] = dict(json.loads(read_regular_text(sweep / MANIFEST)).get("stages") or {})
            except (OSError, ValueError, AttributeError):
                maps[sweep] = {}
        plan.native = [rd for rd in plan.native if maps[rd.path.parent].get(rd.id) in stages]
        if not plan.native and not plan.sources:
            raise ArmorLabError(f"no run of stage(s) {', '.join(stages)} found (a sweep's sweep.json lists its "
                                f"runs' stages)", key="stages", value=stages)
    if not plan.native and not plan.sources:
        raise ArmorLabError("no run directories found (nor TRL, W&B, TensorBoard, verl or trackio runs)",
                            key="runs", value=[str(p) for p in paths])
    imported = importers.read(plan, val_n=val_n if val_n is not None else (runs_map.val_n if runs_map else None))
    return _load_native(plan.native, imported, cache=cache, progress=progress)


_Run = tuple[dict[str, Any], Any, list[str]]  # a run's row of the runs table, its metrics Table, its warnings


def _load_native(run_dirs: list[RunDir], imported: list[importers.ImportedRun], *, cache: bool,
                 progress: Callable[[int, int], None] | None) -> RunSet:
    by_sweep = {s: _read_cache(s) if cache else {} for s in dict.fromkeys(rd.path.parent for rd in run_dirs)}
    cached = [by_sweep[rd.path.parent].get(rd.path.name) for rd in run_dirs]
    count = Counter(rd.id for rd in run_dirs)
    # the same config in two sweeps has the same id: tell them apart by sweep name
    ids = [f"{rd.path.parent.name}/{rd.id}" if count[rd.id] > 1 else rd.id for rd in run_dirs]

    def read(i: int) -> tuple[_Entry | None, _Run]:
        """The run's entry if parsed now (None: the cached one holds), and the run described."""
        rd, e = run_dirs[i], cached[i]
        # key first: a file growing while we read it is re-parsed next time
        mkey, ckey = (list(file_stat(p) or (-1, -1)) for p in (rd.metrics_path, rd.config_path))
        if e is not None and [e.metrics_key, e.config_key] == [mkey, ckey]:
            return None, _native_run(ids[i], rd, e)
        frame, warns = parse_metrics_file(rd.metrics_path)
        try:
            config = rd.read_config()
        except ArmorLabError as exc:
            config, warns = None, [*warns, f"unreadable config: {exc}"]
        e = _Entry(frame, mkey, ckey, config, warns)
        return e, _native_run(ids[i], rd, e)

    runs, changed = [], {}  # changed: the sweeps whose cache is rewritten
    # pyarrow releases the GIL while parsing: a few threads overlap parsing with file and status reads
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for rd, (entry, run) in zip(run_dirs, pool.map(read, range(len(run_dirs))), strict=True):
            if entry is not None:
                by_sweep[rd.path.parent][rd.path.name] = entry
                changed[rd.path.parent] = None
            runs.append(run)
            if progress:
                progress(len(runs), len(run_dirs))
        # written while the run set is assembled (Arrow writes without the GIL)
        writes = {s: pool.submit(_write_cache, s, by_sweep[s]) for s in changed} if cache else {}
        result = _run_set(runs, imported)
        for s, w in writes.items():
            if w.exception() is not None:  # read-only sweep dir, full disk: analysis still works
                log.warning("could not write analysis cache in %s: %s", s, w.exception())
    return result


def _health(table, state: str | None) -> list[str]:
    """armorlab.core.health's warnings (runs that trained on nothing) from a run's metrics table."""
    steps = table.column("step").to_numpy()
    series = {}
    for name in [n for n in WATCHED if n in table.column_names]:
        values = table.column(name).to_numpy()  # float64; nulls → NaN
        keep = np.isfinite(values) & (steps >= 1)
        if not (name == GATE_DROP and _gate_screened_out(values[keep])):
            series[name] = list(zip(steps[keep].tolist(), values[keep].tolist(), strict=True))
    return series_warnings(series, final=state in ENDED)


def _gate_screened_out(shares: np.ndarray) -> bool:
    """Whether health.gate_warning cannot fire (no window mean within 10⁻³ of GATE_SHARE): then the
    per-step series is not built — it cost a tenth of a second over 200 runs."""
    if shares.size < GATE_WINDOW or np.abs(shares).max() > 1.0:
        return False
    prefix = np.concatenate([[0.0], np.cumsum(shares)])
    return float((prefix[GATE_WINDOW:] - prefix[:-GATE_WINDOW]).max()) < (GATE_SHARE - 1e-3) * GATE_WINDOW


def _native_run(rid: str, rd: RunDir, e: _Entry) -> _Run:
    status = rd.read_status()  # read at every load: a cached run may have finished
    # how a run was logged is not an experimental factor
    config = {k: v for k, v in flatten_config(e.config or {}).items()
              if k not in META_COLUMNS and k not in LOGGING_KEYS}
    row = {"run_id": rid, "sweep": rd.path.parent.name, "path": str(rd.path), "state": status.get("state"),
           "reason": status.get("reason"), "world_size": status.get("world_size"), **config}
    notes = _health(e.frame, row["state"]) if len(e.frame) else [f"no metrics logged yet ({rd.metrics_path})"]
    return row, e.frame, [f"run {rid}: {w}" for w in [*e.warnings, *notes]]


def _imported_runs(imported: list[importers.ImportedRun], taken: set[str]) -> tuple[list[_Run], list[str]]:
    """Other libraries' runs, named apart from ``taken`` and each other, and the warnings about them all."""
    out, unknown_n, warnings = [], [], []
    cannot: dict[tuple[str, str | None, tuple[str, ...]], list[str]] = {}
    # a name two runs share is prefixed with the folder (project) in every run that has it: collapse/seed0
    # beside flat/seed0, not seed0 beside flat/seed0
    shared = {n for n, c in Counter(r.name for r in imported).items() if c > 1 or n in taken}
    for run in imported:
        rid = f"{run.project}/{run.name}" if run.name in shared and run.project else run.name
        folder = run.config.get("wandb.group") or run.project
        if folder and importers.GROUP_KEY not in run.config:  # grouped by its folder unless a runs.yaml says
            run.config[importers.GROUP_KEY] = str(folder)
        i = 2
        while rid in taken:
            rid, i = f"{run.name}#{i}", i + 1
        taken.add(rid)
        row = {"run_id": rid, "sweep": run.project, "path": str(run.path), "state": run.state,
               "reason": run.reason, "world_size": None, "format": run.format,
               "unavailable": ", ".join(run.unavailable), **run.config}
        if run.unavailable:
            cannot.setdefault((run.format, run.flavour, tuple(run.unavailable)), []).append(rid)
        if "val/acc" in run.metrics and "val/n" not in run.metrics:
            unknown_n.append(rid)
        notes = _health(run.table, run.state) if len(run.table) else [f"no metrics in {run.path}"]
        out.append((row, run.table, [f"run {rid}: {w}" for w in [*run.warnings, *notes]]))
    for (fmt, flavour, metrics), rids in cannot.items():
        source = f"{fmt} ({flavour})" if flavour and flavour != fmt else fmt
        warnings.append(f"{len(rids)} run(s) imported from {source} cannot give {', '.join(metrics)}: "
                        "their source does not log them")
    if unknown_n:
        warnings.append(f"val/n unknown for {len(unknown_n)} imported run(s) ({', '.join(unknown_n[:6])}"
                        + (" …" if len(unknown_n) > 6 else "") + "): their sources do not log how many completions "
                        "each validation scored, so the collapse test estimates the noise from the curve; give it "
                        "with --val-n N or val_n in a runs.yaml")
    return out, warnings


def _run_set(native: list[_Run], imported: list[importers.ImportedRun]) -> RunSet:
    """One RunSet of the native runs and then the imported ones; ``wide`` from one Arrow concatenation
    and one conversion (not a frame per run)."""
    import pyarrow as pa

    others, warnings = _imported_runs(imported, {row["run_id"] for row, _, _ in native})
    runs = native + others
    logged = [(row["run_id"], table) for row, table, _ in runs if len(table)]
    lengths = np.array([len(t) for _, t in logged], dtype=np.int64)
    slices = dict(zip([rid for rid, _ in logged], _ranges(lengths.tolist()), strict=True))
    table = pa.concat_tables([t for _, t in logged] or [_empty_table()], promote_options="default")
    wide = table.select(["step", *sorted(c for c in table.column_names if c != "step")]).to_pandas()
    codes = np.repeat(np.arange(len(logged)), lengths)
    wide.insert(0, "run_id", pd.Categorical.from_codes(codes, categories=list(slices)))
    return RunSet(runs=pd.DataFrame([row for row, _, _ in runs]), wide=wide, slices=slices,
                  warnings=[w for _, _, notes in runs for w in notes] + warnings)


def load_runs(paths: Iterable[str | os.PathLike], *, cache: bool = True) -> pd.DataFrame:
    """Contract C5: the long table (run_id, varying config columns, step, metric, value)."""
    return load(paths, cache=cache).long
