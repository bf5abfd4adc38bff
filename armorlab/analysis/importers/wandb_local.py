"""W&B local run folders read without a server (``armorlab[wandb]``): the ``.wandb`` transaction log is
LevelDB's log format (wandb's ``core/pkg/leveldb/record.go``, IEEE CRC) of wandb_internal_pb2 Records,
parsed here rather than through wandb's internal reader APIs, which change between versions; a chunk whose
CRC fails skips to the next block, as LevelDB recovers (docs/importers.md#wb-local-run-folders)."""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.analysis.importers import base as B
from armorlab.analysis.importers import flavours as F
from armorlab.errors import ArmorLabError

HEADER = struct.Struct("<4sHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
CHUNK = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes((t,))) for t in (FULL, FIRST, MIDDLE, LAST)}
RUN_DIR = re.compile(r"^(offline-)?run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)$")


def available() -> bool:
    try:
        from wandb.proto import wandb_internal_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def records(data: bytes, source: str, warnings: list[str]) -> Iterator[bytes]:
    """The records of a .wandb file (LevelDB log chunks reassembled, CRCs checked)."""
    if len(data) < HEADER.size:
        warnings.append(f"{source}: no W&B header ({len(data)} bytes)")
        return
    if HEADER.unpack_from(data, 0) != (IDENT, MAGIC, VERSION):
        raise ArmorLabError("not a W&B transaction log (bad header)", key="path", value=source)
    pos, end = HEADER.size, len(data)
    parts: list[bytes] | None = None
    while True:
        if BLOCK - pos % BLOCK < CHUNK.size:  # a block's tail too short for a header is zero padding
            pos += BLOCK - pos % BLOCK
        if pos + CHUNK.size > end:
            if data[pos:end].strip(b"\0"):
                warnings.append(f"{source}: torn last record ignored")
            return
        checksum, length, kind = CHUNK.unpack_from(data, pos)
        start = pos + CHUNK.size
        if start + length > end:
            warnings.append(f"{source}: torn last record ({end - start} of {length} bytes) ignored")
            return
        chunk = data[start:start + length]
        zeroed = checksum == length == kind == 0  # a zeroed block (preallocated): skipped, no warning
        if zeroed or kind not in _TYPE_CRC or zlib.crc32(chunk, _TYPE_CRC[kind]) != checksum:
            if not zeroed:
                warnings.append(f"{source}: bad chunk at byte {pos}; skipped to the next block")
            pos += BLOCK - pos % BLOCK
            parts = None
            continue
        pos = start + length
        if kind in (FULL, FIRST):
            parts = [chunk]
        elif parts is not None:
            parts.append(chunk)
        if kind in (FULL, LAST) and parts is not None:
            yield b"".join(parts)
            parts = None


def _lite_classes():
    """(wandb's protobufs, Record with every field repeated and messages as raw bytes, HistoryRecord whose
    items merge into one HistoryItem with repeated key, nested_key, value_json): a whole log parses at once."""
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as exc:
        raise ArmorLabError("reading W&B run folders needs the wandb package: pip install 'armorlab[wandb]'",
                            key="format", value="wandb") from exc
    items = B.derived_message("ItemsFlat", pb.HistoryItem)
    history = B.derived_message("HistoryMerged", pb.HistoryRecord, {"item": items}, keep=("step",))
    return pb, B.derived_message("RecordAll", pb.Record), history


MARK = "\x00armorlab-row\x01"  # a name no wandb metric has (numpy would strip a trailing NUL)


class _History:
    """A run's raw history records, decoded at the end in one C parse (a marker item after each record
    delimits them); runs whose items do not line up are read item by item with wandb's HistoryRecord."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.skipped = 0  # records that are no HistoryRecord (another message type's bytes)
        self.bad_steps = 0  # rows whose trainer step an int64 curve cannot hold (1e300, -1, 0.5)

    @cached_property
    def decoded(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(name code per item, names by code, float value per item, items per record, step per record)."""
        return self._decode_fast() or self._decode_slow()

    def _decode_fast(self):
        import pandas as pd

        pb, _, merged_cls = _lite_classes()
        n = len(self.raw)
        marker = pb.HistoryRecord(item=[pb.HistoryItem(nested_key=[MARK], value_json="0")]).SerializeToString()
        try:
            merged = merged_cls.FromString(marker.join(self.raw) + marker)
        except Exception:  # DecodeError: a record of another type; the record-by-record path skips it
            return None
        items = merged.item
        if len(merged.step) != n or len(items.key) or len(items.nested_key) != len(items.value_json):
            return None
        codes, uniques = pd.factorize(np.asarray(items.nested_key, dtype=object))
        at = np.flatnonzero(uniques == MARK)
        is_mark = codes == (at[0] if at.size == 1 else -1)
        if np.count_nonzero(is_mark) != n:
            return None
        counts = np.diff(np.flatnonzero(is_mark), prepend=-1) - 1
        steps = np.fromiter((s.num for s in merged.step), dtype=np.int64, count=n)
        return codes[~is_mark], list(uniques), _floats(items.value_json)[~is_mark], counts, steps

    def _decode_slow(self):
        import pandas as pd

        pb = _lite_classes()[0]
        names, values, counts, steps = [], [], [], []
        for raw in self.raw:
            try:
                h = pb.HistoryRecord.FromString(raw)
            except Exception:  # DecodeError
                self.skipped += 1
                continue
            steps.append(h.step.num)
            counts.append(len(h.item))
            names += map(_item_key, h.item)
            values += (B.as_float(_item_value(it)) for it in h.item)
        codes, uniques = pd.factorize(np.asarray(names, dtype=object)) if names else (np.empty(0, np.int64), [])
        return codes, list(uniques), np.asarray(values, dtype=np.float64), np.asarray(counts, dtype=np.int64), \
            np.asarray(steps, dtype=np.int64)

    def series(self, step_keys: tuple[str, ...], drop: set[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per metric (steps, values), grouped by name: wandb writes a row's items in no fixed order; the
        step is the trainer's own where its rows log one (the first of ``step_keys`` a row has)."""
        if not self.raw:
            return {}
        codes, names, values, counts, steps = self.decoded
        record = np.repeat(np.arange(counts.size), counts)
        trainer = np.full(counts.size, np.nan)
        for k in (k for k in step_keys if k in names):
            at = codes == names.index(k)
            own = np.full(counts.size, np.nan)
            own[record[at]] = values[at]
            trainer = np.where(np.isnan(trainer), own, trainer)
        own = B.good_steps(trainer)
        bad = np.isfinite(trainer) & ~own
        self.bad_steps = int(bad.sum())
        steps = np.where(own, trainer, steps).astype(np.int64)
        values = np.where(bad[record], np.nan, values)  # NaN is no value: those rows are left out
        return {name: sv for name, sv in B.group_series(codes, names, steps[record], values).items()
                if sv[0].size and name not in drop and not name.startswith("_")}


def _floats(raw: Any) -> np.ndarray:
    """JSON value texts as float64 (Arrow, else json.loads one by one; non-numbers → NaN)."""
    import pyarrow as pa

    texts = list(raw)
    try:
        return pa.array(texts, pa.string()).cast(pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return np.fromiter((B.as_float(B.parsed_json(v)) for v in texts), np.float64, count=len(texts))


def _item_key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _item_value(item: Any) -> Any:
    """A history item's value: value_json, else the typed fields newer wandb may write."""
    if item.value_json:
        return B.parsed_json(item.value_json)
    for field in ("number", "integer", "boolean"):
        try:
            if item.HasField(field):
                return getattr(item, field)
        except ValueError:  # a plain proto3 scalar (no presence) in this wandb version
            continue
    return None


def read_file(path: Path, history: _History, info: dict[str, Any], warnings: list[str]) -> None:
    """Add one .wandb file's history rows to ``history`` and its run facts to ``info``."""
    pb, all_cls, _ = _lite_classes()
    try:
        payloads = list(records(B.read_source(path), str(path), warnings))
    except OSError as exc:
        warnings.append(f"cannot read {path}: {exc.strerror or exc}")
        return
    try:
        merged = all_cls.FromString(b"".join(payloads))
    except Exception:  # DecodeError: a damaged record among them; find and skip it record by record
        ok = []
        for raw in payloads:
            try:
                all_cls.FromString(raw)
                ok.append(raw)
            except Exception as exc:
                warnings.append(f"{path}: unreadable record skipped ({type(exc).__name__})")
        merged = all_cls.FromString(b"".join(ok))
    history.raw.extend(merged.history)
    config = info.setdefault("config", {})

    def update(items: Any) -> None:
        for item in items:
            try:
                config[_item_key(item)] = json.loads(item.value_json)
            except (ValueError, RecursionError):
                config[_item_key(item)] = item.value_json

    for run in _messages(pb.RunRecord, merged.run, path, warnings):
        info.update(run_id=run.run_id or info.get("run_id"), name=run.display_name or info.get("name"),
                    project=run.project or info.get("project"), group=run.run_group or info.get("group"))
        update(run.config.update)
    for change in _messages(pb.ConfigRecord, merged.config, path, warnings):
        update(change.update)
        for item in change.remove:
            config.pop(_item_key(item), None)
    for exit_ in _messages(pb.RunExitRecord, merged.exit, path, warnings):
        info["exit_code"] = exit_.exit_code


def _messages(cls: Any, raws: Iterable[bytes], path: Path, warnings: list[str]) -> Iterator[Any]:
    """Each record's message; a warning for each whose bytes are not that message."""
    for raw in raws:
        try:
            yield cls.FromString(raw)
        except Exception as exc:  # DecodeError
            warnings.append(f"{path}: {cls.DESCRIPTOR.name} record skipped ({type(exc).__name__})")


def wandb_file(run_dir: Path) -> Path | None:
    return max(Path(run_dir).glob("run-*.wandb"), default=None)


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and wandb_file(path) is not None


def run_dirs(root: Path) -> list[Path]:
    """W&B run folders at or below ``root`` (``latest-run``, a link, skipped)."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    return sorted({p for base in (root, root / "wandb") if base.is_dir() for p in base.iterdir()
                   if RUN_DIR.match(p.name) and is_run_dir(p)})


def read(folders: list[Path], *, name: str | None = None, flavour: str | None = None) -> B.ImportedRun:
    """One W&B run (its folders: one, or several for a resumed run, oldest first)."""
    history, info, warnings = _History(), {}, []
    for folder in folders:
        f = folder if folder.is_file() else wandb_file(folder)
        if f is None:
            warnings.append(f"{folder}: no .wandb file")
            continue
        read_file(f, history, info, warnings)
    flat = B.flatten({k: v for k, v in info.get("config", {}).items() if not k.startswith("_wandb")})
    fl = F.pick(flavour, flat, set(history.decoded[1]) if history.raw else ())
    series = history.series(fl.step_keys, set(fl.drop))
    if history.skipped:
        warnings.append(f"skipped {history.skipped} history records that are not W&B history rows")
    if history.bad_steps:
        warnings.append(f"skipped {history.bad_steps} history rows whose trainer step is not a whole number "
                        "in [0, 2**63)")
    code = info.get("exit_code")
    state, reason = {None: ("unknown", "no exit record: the run is still going, or its process was killed"),
                     0: ("completed", None)}.get(code, ("failed", f"exit code {code}"))
    last = folders[-1]
    return F.imported_run(series, fl, flat, warnings, config={"wandb.group": info["group"]} if info.get("group") else None,
                          name=name or info.get("name") or info.get("run_id") or last.name, path=last,
                          format="wandb", project=info.get("project"), state=state, reason=reason)
