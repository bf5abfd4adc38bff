"""What every importer shares: the imported run, source → armorlab name mapping (unmapped names kept as
``src/<name>``) and the step-aligned table, merged as metrics.jsonl is (the later value wins per step, a
missing one never erases a number). Nothing here writes a file: importing is read-only.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.core.fsutil import read_regular

SRC = "src/"
# how a run ended, where the source says (an armorlab run's status.json states, plus "unknown")
STATES = ("completed", "running", "failed", "unknown")


@dataclass(frozen=True)
class Rule:
    """``pattern`` (a regex matched against the whole source name) → ``target`` (``{group}`` fills a named group)."""
    pattern: str
    target: str
    note: str = ""

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


class NameMap:
    """Source name → armorlab name by the first rule matching its ``normalise``d spelling, else ``src/<name>``
    (the logged spelling); ``None`` drops it."""

    def __init__(self, rules: Iterable[Rule], *, drop: Iterable[str] = (),
                 normalise: Callable[[str], str] = str) -> None:
        self.rules = tuple(rules)
        self.drop = frozenset(drop)
        self.normalise = normalise
        self._cache: dict[str, str | None] = {}

    def __call__(self, name: str) -> str | None:
        if name not in self._cache:
            self._cache[name] = self._target(name)
        return self._cache[name]

    def _target(self, name: str) -> str | None:
        key = self.normalise(name)
        if name in self.drop or key in self.drop:
            return None
        for rule in self.rules:
            m = rule.regex.fullmatch(key)
            if m:
                return rule.target.format(**m.groupdict())
        return SRC + name


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
    origin: dict[str, list[str]] = field(default_factory=dict)

    @property
    def metrics(self) -> list[str]:
        return [c for c in self.table.column_names if c != "step"]


# --------------------------------------------------------------------------- values
def as_float(value: Any) -> float:
    """A logged value as float (numbers, booleans, JSON writers' non-finite strings); anything else NaN."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an int past float's range
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity", "nan", "inf", "-inf"):
        return float(value.replace("Infinity", "inf"))
    return math.nan


def is_metric_value(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) or (
        isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"))


def json_lines(lines: Iterable[str | bytes], source: str, warnings: list[str], bad: str = "unreadable"
               ) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank JSON line; one json cannot parse (torn, or nested past its
    recursion limit) is skipped with a warning."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            warnings.append(f"skipped {bad} line {lineno} of {source}")
            continue
        yield lineno, row


# --------------------------------------------------------------------------- series → table
def dedupe(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One value per step: the last non-NaN one logged (metrics.jsonl's merge rule)."""
    keep = ~np.isnan(values)
    if not keep.all():
        steps, values = steps[keep], values[keep]
    if steps.size < 2 or bool(np.all(steps[1:] > steps[:-1])):
        return steps, values
    order = np.argsort(steps, kind="stable")
    s, v = steps[order], values[order]
    last = np.r_[s[1:] != s[:-1], True]
    return s[last], v[last]


def build_table(series: Mapping[str, tuple[np.ndarray, np.ndarray]], names: NameMap,
                extra: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None):
    """Per-metric source series (+ ``extra`` already named) → (Table on the union of steps, origin); two
    source names of one target coalesce, the first read winning per step."""
    import pyarrow as pa

    grouped: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {}
    for src, (steps, values) in series.items():
        target = names(src)
        if target is None:
            continue
        s, v = dedupe(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
        if s.size:
            grouped.setdefault(target, []).append((src, s, v))
    for target, (steps, values) in (extra or {}).items():
        s, v = dedupe(np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))
        if s.size:
            grouped.setdefault(target, []).insert(0, ("(computed)", s, v))
    if not grouped:
        return pa.table({"step": pa.array([], pa.int64())}), {}
    step_arrays = [s for parts in grouped.values() for _, s, _ in parts]
    first = step_arrays[0]
    if all(s is first or (s.size == first.size and np.array_equal(s, first)) for s in step_arrays):
        all_steps = first  # every metric at every step (the common case): no union to sort
    else:
        all_steps = np.unique(np.concatenate(step_arrays))
    cols, origin = {}, {}
    for target in sorted(grouped):
        parts = grouped[target]
        if len(parts) == 1 and parts[0][1] is all_steps:
            cols[target] = parts[0][2]
            origin[target] = [parts[0][0]]
            continue
        col = np.full(all_steps.size, np.nan)
        # the first part written last wins: rules earlier in the table take precedence
        for _, s, v in reversed(parts):
            col[np.searchsorted(all_steps, s)] = v
        cols[target] = col
        origin[target] = [src for src, _, _ in parts]
    arrays = [pa.array(all_steps, pa.int64())] + [pa.array(c, pa.float64(), from_pandas=True) for c in cols.values()]
    return pa.Table.from_arrays(arrays, names=["step", *cols]), origin


def rows_to_series(rows: Iterable[tuple[int, Mapping[str, Any]]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(step, {name: value}) rows → per-name (steps, values), non-numbers left out (pandas builds columns)."""
    import pandas as pd

    rows = list(rows)
    if not rows:
        return {}
    frame = pd.DataFrame.from_records([r for _, r in rows])
    steps = np.fromiter((s for s, _ in rows), dtype=np.int64, count=len(rows))
    out = {}
    for name in frame.columns:
        col = frame[name]
        if pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col):
            values = col.to_numpy(dtype=np.float64, na_value=np.nan)
        elif col.dtype == object:
            values = np.fromiter((as_float(v) for v in col.tolist()), dtype=np.float64, count=len(col))
        else:
            continue
        keep = ~np.isnan(values)
        if keep.any():
            out[str(name)] = (steps[keep], values[keep]) if not keep.all() else (steps, values)
    return out


MAX_FAST_DEPTH = 64  # metrics lines are flat objects (depth 1); pyarrow segfaults near 100,000


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


# what one imported file may hold (far above a real metrics log, event file or dump; far below what a
# sparse file or a link to a device would fill memory with)
MAX_SOURCE_BYTES = 4 << 30
MAX_STEP = 2**63  # steps are int64 on the curve


def read_source(path: str | Path) -> bytes:
    """An imported file's bytes through the regular-file reader: a FIFO, device or directory, or more
    than MAX_SOURCE_BYTES, raise NotRegularFile (an OSError) instead of blocking or filling memory."""
    return read_regular(path, limit=MAX_SOURCE_BYTES)


def good_steps(steps: np.ndarray) -> np.ndarray:
    """Which float steps an int64 curve holds as they are: finite, whole and in [0, 2**63)."""
    steps = np.asarray(steps, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.isfinite(steps) & (steps >= 0) & (steps < MAX_STEP) & (np.floor(steps) == steps)


def read_json_bytes(data: bytes, block_size: int = 1 << 24):
    """JSON lines → pyarrow Table, parsed in C++ on one thread."""
    import pyarrow.json as pj

    return pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False, block_size=block_size))


def json_lines_columns(data: bytes, n_rows: int) -> dict[str, np.ndarray] | None:
    """JSON lines of flat objects → float64 arrays per numeric key, by pyarrow; None when it cannot."""
    import pyarrow as pa

    if not data.strip() or not shallow(data):
        return None
    try:
        table = read_json_bytes(data, max(1 << 20, len(data) + 1))
    except Exception:  # ArrowInvalid
        return None
    if table.num_rows != n_rows:
        return None
    out = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) and col.null_count < len(col):
            out[name] = col.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    return out


# --------------------------------------------------------------------------- configs
def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config → flat dotted keys; lists become JSON text (groupable)."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = value
    return out


SEED_RE = re.compile(r"(^|[._])(data_loader_|data_|)seed$")


def seed_and_config(flat: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, Any]:
    """Config columns of an imported run: identity keys (paths, names) dropped — no experimental factor —
    and seed keys folded into one ``seed`` (``seed`` itself, else ``key=value`` text of those set)."""
    drop = set(drop)
    out = {k: v for k, v in flat.items() if k not in drop and not any(k.startswith(d + ".") for d in drop)}
    seeds = {k: out.pop(k) for k in [k for k in out if SEED_RE.search(k)]}
    if "seed" in seeds:
        out["seed"] = seeds["seed"]
    elif seeds:
        set_ = {k: v for k, v in seeds.items() if v is not None}
        if set_:
            out["seed"] = ", ".join(f"{k}={v}" for k, v in sorted(set_.items()))
    return out


# --------------------------------------------------------------------------- protobuf
def derived_message(name: str, source: Any, retype: dict[str, int], repeat: tuple[str, ...] = (),
                    message: dict[str, Any] | None = None) -> Any:
    """A class with ``source``'s protobuf layout but some fields as raw bytes (``retype``), repeated
    (``repeat``: concatenated messages then collect every occurrence) or another class (``message``);
    built once per process in protobuf's default pool."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.Default()
    full = f"armorlab_lite.{name}"
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
    except KeyError:
        pass
    msg = descriptor_pb2.DescriptorProto()
    source.DESCRIPTOR.CopyToProto(msg)
    msg.name = name
    del msg.nested_type[:]  # the fields keep wandb's fully qualified type names
    for f in msg.field:
        if f.name in retype:
            f.type = retype[f.name]
            f.ClearField("type_name")
        if f.name in repeat:
            f.label = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
            f.ClearField("oneof_index")
            f.ClearField("proto3_optional")
        if message and f.name in message:
            f.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
            f.type_name = "." + message[f.name].DESCRIPTOR.full_name
            f.label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    keep_oneofs = {f.oneof_index for f in msg.field if f.HasField("oneof_index")}
    if not keep_oneofs:
        del msg.oneof_decl[:]
    file = descriptor_pb2.FileDescriptorProto(name=f"armorlab_lite_{name}.proto", package="armorlab_lite",
                                              syntax="proto3")
    home = source.DESCRIPTOR.file
    file.dependency.extend([home.name, *(d.name for d in home.dependencies),
                            *(c.DESCRIPTOR.file.name for c in (message or {}).values())])
    file.message_type.add().CopyFrom(msg)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
