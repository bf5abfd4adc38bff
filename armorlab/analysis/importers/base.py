"""What every importer shares: the imported run and the step-aligned table, merged as metrics.jsonl is (the
later value wins per step, a missing one never erases a number). Nothing here writes a file: importing is
read-only."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.core.fsutil import read_regular

MAX_STEP = 2**63  # steps are int64 on the curve
# what one imported file may hold (far above a real metrics log, event file or dump; far below what a
# sparse file or a link to a device would fill memory with)
MAX_SOURCE_BYTES = 4 << 30
MAX_FAST_DEPTH = 64  # metrics lines are flat objects (depth 1); pyarrow segfaults near 100,000


@dataclass
class ImportedRun:
    """One run read from another library's files: ``table`` int64 ``step`` + float64 metrics, flat ``config``."""
    name: str
    path: Path
    format: str
    table: Any
    config: dict[str, Any] = field(default_factory=dict)
    flavour: str | None = None          # the trainer that wrote it: trl, verl, openrlhf
    project: str | None = None          # the source's grouping of runs (W&B/trackio project, ...)
    state: str = "unknown"
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> list[str]:
        return [c for c in self.table.column_names if c != "step"]


def as_float(value: Any) -> float:
    """A logged value as float (numbers, booleans, JSON writers' non-finite strings); anything else NaN."""
    if isinstance(value, (bool, int, float)):
        try:
            return float(value)
        except OverflowError:  # an int past float's range
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity", "nan", "inf", "-inf"):
        return float(value.replace("Infinity", "inf"))
    return math.nan


def is_metric_value(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) or value in ("NaN", "Infinity", "-Infinity")


def json_lines(lines: Iterable[str | bytes], source: str, warnings: list[str], bad: str = "unreadable"
               ) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank JSON line; one json cannot parse (torn, or nested past its
    recursion limit) is skipped with a warning."""
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield lineno, json.loads(line)
            except (ValueError, RecursionError):
                warnings.append(f"skipped {bad} line {lineno} of {source}")


def parsed_json(text: str | bytes) -> Any:
    """``text`` parsed, else None (torn, not UTF-8, or nested past json's recursion limit)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def dedupe(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One value per step: the last non-NaN one logged (metrics.jsonl's merge rule)."""
    keep = ~np.isnan(values)
    steps, values = steps[keep], values[keep]
    if steps.size < 2 or bool(np.all(steps[1:] > steps[:-1])):
        return steps, values
    order = np.argsort(steps, kind="stable")
    s, v = steps[order], values[order]
    last = np.r_[s[1:] != s[:-1], True]
    return s[last], v[last]


def build_table(series: Mapping[str, tuple[np.ndarray, np.ndarray]], names: Callable[[str], str | None],
                extra: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None):
    """Per-metric source series (+ ``extra`` already named) → Table on the union of steps; two source
    names of one target coalesce, ``extra`` first, then the first read, winning per step."""
    import pyarrow as pa

    grouped: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for target, (steps, values) in [*(extra or {}).items(), *((names(src), sv) for src, sv in series.items())]:
        if target is not None:
            s, v = dedupe(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
            if s.size:
                grouped.setdefault(target, []).append((s, v))
    all_steps = [s for parts in grouped.values() for s, _ in parts]
    if not all_steps:
        return pa.table({"step": pa.array([], pa.int64())})
    # the common case, every series on the same steps, has no union to sort
    same = all(np.array_equal(s, all_steps[0]) for s in all_steps)
    all_steps = all_steps[0] if same else np.unique(np.concatenate(all_steps))
    cols = {}
    for target in sorted(grouped):
        parts = grouped[target]
        if len(parts) == 1 and parts[0][0].size == all_steps.size:
            cols[target] = parts[0][1]
        else:
            cols[target] = np.full(all_steps.size, np.nan)
            for s, v in reversed(parts):  # the first part written last wins
                cols[target][np.searchsorted(all_steps, s)] = v
    arrays = [pa.array(c, pa.float64(), from_pandas=True) for c in cols.values()]
    return pa.Table.from_arrays([pa.array(all_steps, pa.int64()), *arrays], names=["step", *cols])


def group_series(codes: np.ndarray, names: Any, steps: np.ndarray, values: np.ndarray
                 ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per name (steps, values) in the order logged, from each point's code into ``names``."""
    order = np.argsort(codes, kind="stable")
    cuts = np.cumsum(np.bincount(codes, minlength=len(names)))[:-1]
    split = zip(np.split(steps[order], cuts), np.split(values[order], cuts), strict=True)
    return dict(zip(map(str, names), split, strict=True))


def rows_to_series(rows: Iterable[tuple[int, Mapping[str, Any]]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(step, {name: value}) rows → per-name (steps, values), non-numbers left out (pandas builds columns)."""
    import pandas as pd

    rows = list(rows)
    frame = pd.DataFrame.from_records([r for _, r in rows])
    steps = np.fromiter((s for s, _ in rows), dtype=np.int64, count=len(rows))
    out = {}
    for name, col in frame.items():
        if pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col):
            values = col.to_numpy(dtype=np.float64, na_value=np.nan)
        elif col.dtype == object:
            values = np.fromiter(map(as_float, col.tolist()), dtype=np.float64, count=len(col))
        else:
            continue
        keep = ~np.isnan(values)
        if keep.any():
            out[str(name)] = (steps[keep], values[keep])
    return out


def shallow(data: bytes, limit: int = MAX_FAST_DEPTH) -> bool:
    """Whether no line opens more than ``limit`` brackets, a bound on its nesting that holds whatever the
    line's strings hold (a running depth over the buffer is fooled by a ``}`` in a string or by unbalanced
    lines before a deep one; pyarrow's JSON reader recurses without a bound)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    # b"[" (0x5B) and b"{" (0x7B) are the only bytes that OR 0x20 makes 0x7B: one pass finds both
    opens = np.flatnonzero((arr | 0x20) == ord("{"))
    if opens.size <= limit:
        return True
    ends = np.append(np.flatnonzero(arr == ord("\n")), arr.size)
    return int(np.diff(np.searchsorted(opens, ends), prepend=0).max()) <= limit


# An imported file's bytes through the regular-file reader: a FIFO, device or directory, or more than
# MAX_SOURCE_BYTES, raise NotRegularFile (an OSError) instead of blocking or filling memory.
read_source = partial(read_regular, limit=MAX_SOURCE_BYTES)


def good_steps(steps: np.ndarray) -> np.ndarray:
    """Which float steps an int64 curve holds as they are: finite, whole and in [0, 2**63)."""
    steps = np.asarray(steps, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(steps) & (steps >= 0) & (steps < MAX_STEP) & (np.floor(steps) == steps)


def read_json_bytes(data: bytes, block_size: int = 1 << 24):
    """JSON lines → pyarrow Table, parsed in C++ on one thread."""
    import pyarrow.json as pj

    return pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False, block_size=block_size))


def float_columns(names: Iterable[str], columns: Iterable[Any]) -> dict[str, np.ndarray]:
    """The Arrow columns of numbers or booleans that hold a value, as float64 (null → NaN)."""
    import pyarrow as pa

    return {name: col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
            for name, col in zip(names, columns, strict=True)
            if (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type))
            and col.null_count < len(col)}


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config → flat dotted keys; lists become JSON text (groupable)."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, default=str) if isinstance(value, (list, tuple)) else value
    return out


SEED_RE = re.compile(r"(^|[._])(data_loader_|data_|)seed$")


def seed_and_config(flat: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, Any]:
    """Config columns of an imported run: identity keys (paths, names) dropped — no experimental factor —
    and seed keys folded into one ``seed`` (``seed`` itself, else ``key=value`` text of those set)."""
    drop = set(drop)
    under = tuple(d + "." for d in drop)
    out = {k: v for k, v in flat.items() if k not in drop and not k.startswith(under)}
    seeds = {k: out.pop(k) for k in [k for k in out if SEED_RE.search(k)]}
    if "seed" in seeds:
        out["seed"] = seeds["seed"]
    elif any(v is not None for v in seeds.values()):
        out["seed"] = ", ".join(f"{k}={v}" for k, v in sorted(seeds.items()) if v is not None)
    return out


def derived_message(name: str, source: Any, message: dict[str, Any] | None = None, keep: tuple[str, ...] = ()
                    ) -> Any:
    """A class with ``source``'s protobuf layout but every field repeated (concatenated messages then collect
    every occurrence) and messages as raw bytes, except: a field in ``message`` becomes one field of that
    class (its occurrences merge), one in ``keep`` keeps its message type; built once per process in
    protobuf's default pool."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    FDP = descriptor_pb2.FieldDescriptorProto
    pool, message = descriptor_pool.Default(), message or {}
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"armorlab_lite.{name}"))
    except KeyError:
        pass
    msg = descriptor_pb2.DescriptorProto()
    source.DESCRIPTOR.CopyToProto(msg)
    msg.name = name
    del msg.nested_type[:], msg.oneof_decl[:]  # the fields keep their fully qualified type names
    for f in msg.field:
        f.ClearField("oneof_index")
        f.ClearField("proto3_optional")
        if f.name in message:
            f.type, f.label = FDP.TYPE_MESSAGE, FDP.LABEL_OPTIONAL
            f.type_name = "." + message[f.name].DESCRIPTOR.full_name
            continue
        f.label = FDP.LABEL_REPEATED
        if f.type == FDP.TYPE_MESSAGE and f.name not in keep:
            f.type = FDP.TYPE_BYTES
            f.ClearField("type_name")
    home = source.DESCRIPTOR.file
    file = descriptor_pb2.FileDescriptorProto(
        name=f"armorlab_lite_{name}.proto", package="armorlab_lite", syntax="proto3",
        dependency=[home.name, *(d.name for d in home.dependencies), *(c.DESCRIPTOR.file.name for c in message.values())])
    file.message_type.add().CopyFrom(msg)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"armorlab_lite.{name}"))
