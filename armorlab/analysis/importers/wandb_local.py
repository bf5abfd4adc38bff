"""W&B local run folders read without a server (``armorlab[wandb]``): the ``.wandb`` transaction log is
LevelDB's log format (wandb's ``core/pkg/leveldb/record.go``, IEEE CRC) of wandb_internal_pb2 Records,
parsed here rather than through wandb's internal reader APIs, which change between versions; a chunk whose
CRC fails skips to the next block, as LevelDB recovers (docs/importers.md#wb-local-run-folders).
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.analysis.importers import flavours as F
from armorlab.analysis.importers.base import (
    ImportedRun,
    as_float,
    derived_message,
    flatten,
    good_steps,
    read_source,
)
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
    ident, magic, version = HEADER.unpack_from(data, 0)
    if ident != IDENT or magic != MAGIC or version != VERSION:
        raise ArmorLabError("not a W&B transaction log (bad header)", key="path", value=source)
    pos, end = HEADER.size, len(data)
    parts: list[bytes] | None = None
    unpack, crc32 = CHUNK.unpack_from, zlib.crc32
    while True:
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a header is zero padding
            pos += left
        if pos + CHUNK.size > end:
            if pos < end and data[pos:end].strip(b"\0"):
                warnings.append(f"{source}: torn last record ignored")
            return
        checksum, length, kind = unpack(data, pos)
        start = pos + CHUNK.size
        stop = start + length
        if checksum == 0 and length == 0 and kind == 0:  # a zeroed block (preallocated): skip it
            pos += BLOCK - pos % BLOCK
            parts = None
            continue
        if stop > end:
            warnings.append(f"{source}: torn last record ({end - start} of {length} bytes) ignored")
            return
        chunk = data[start:stop]
        if kind not in _TYPE_CRC or crc32(chunk, _TYPE_CRC[kind]) != checksum:
            warnings.append(f"{source}: bad chunk at byte {pos}; skipped to the next block")
            pos += BLOCK - pos % BLOCK
            parts = None
            continue
        pos = stop
        if kind == FULL:
            parts = None
            yield chunk
        elif kind == FIRST:
            parts = [chunk]
        elif parts is not None:
            parts.append(chunk)
            if kind == LAST:
                yield b"".join(parts)
                parts = None


def _lite_classes():
    """(Record with every field repeated, messages as raw bytes; HistoryRecord whose items merge into one
    HistoryItem with repeated key, nested_key, value_json; that HistoryItem): a whole log parses at once."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as FDP

    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError as exc:
        raise ArmorLabError("reading W&B run folders needs the wandb package: pip install 'armorlab[wandb]'",
                            key="format", value="wandb") from exc
    fields = pb.Record.DESCRIPTOR.fields
    record = derived_message("RecordAll", pb.Record, {f.name: FDP.TYPE_BYTES for f in fields if f.message_type is not None},
                      repeat=tuple(f.name for f in fields))
    items = derived_message("ItemsFlat", pb.HistoryItem, {}, repeat=("key", "value_json"))
    history = derived_message("HistoryMerged", pb.HistoryRecord, {}, repeat=("step",), message={"item": items})
    return pb, record, history, items


MARK = "\x00armorlab-row\x01"  # a name no wandb metric has (numpy would strip a trailing NUL)


class _History:
    """A run's raw history records, decoded at the end in one C parse (a marker item after each record
    delimits them); runs whose items do not line up are read item by item with wandb's HistoryRecord."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.skipped = 0  # records that are no HistoryRecord (another message type's bytes)
        self.bad_steps = 0  # rows whose trainer step an int64 curve cannot hold (1e300, -1, 0.5)
        self._decoded: tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray] | None = None

    def _items(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(name code per item, names by code, float value per item, items per record, step per record)."""
        if self._decoded is None:
            self._decoded = self._decode_fast() or self._decode_slow()
        return self._decoded

    def _decode_fast(self):
        import pandas as pd

        pb, _, merged_cls, _ = _lite_classes()
        n = len(self.raw)
        item = pb.HistoryItem(nested_key=[MARK], value_json="0").SerializeToString()
        marker = b"\x0a" + _varint(len(item)) + item  # HistoryRecord field 1 (item), length-delimited
        try:
            merged = merged_cls.FromString(marker.join(self.raw) + marker)
        except Exception:  # DecodeError: a record of another type; the record-by-record path skips it
            return None
        items = merged.item
        if len(merged.step) != n or len(items.key) or len(items.nested_key) != len(items.value_json):
            return None
        codes, uniques = pd.factorize(np.asarray(items.nested_key, dtype=object))
        at = np.flatnonzero(uniques == MARK)
        if at.size != 1:
            return None
        is_mark = codes == at[0]
        marks = np.flatnonzero(is_mark)
        if marks.size != n:
            return None
        counts = np.diff(np.concatenate([[-1], marks])) - 1
        steps = np.fromiter((s.num for s in merged.step), dtype=np.int64, count=n)
        keep = ~is_mark
        values = _floats(items.value_json)[keep]
        return codes[keep], list(uniques), values, counts, steps

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
            for it in h.item:
                names.append(_item_key(it))
                values.append(as_float(_item_value(it)))
        codes, uniques = pd.factorize(np.asarray(names, dtype=object)) if names else (np.empty(0, np.int64), [])
        return codes, list(uniques), np.asarray(values, dtype=np.float64), np.asarray(counts, dtype=np.int64), \
            np.asarray(steps, dtype=np.int64)

    def names(self) -> set[str]:
        return set(self._items()[1]) if self.raw else set()

    def series(self, step_keys: tuple[str, ...], drop: set[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per metric (steps, values), grouped by name: wandb writes a row's items in no fixed order."""
        if not self.raw:
            return {}
        codes, uniques, values, counts, rec_steps = self._items()
        record = np.repeat(np.arange(counts.size), counts)
        position = {name: i for i, name in enumerate(uniques)}
        trainer = np.full(counts.size, np.nan)
        for k in step_keys:  # the trainer's own step where its rows log one (the first key that a row has)
            if k in position:
                at = codes == position[k]
                own = np.full(counts.size, np.nan)
                own[record[at]] = values[at]
                trainer = np.where(np.isnan(trainer), own, trainer)
        own = good_steps(trainer)
        bad = np.isfinite(trainer) & ~own
        self.bad_steps = int(bad.sum())
        rec_steps = np.where(own, trainer, rec_steps).astype(np.int64)
        item_steps = rec_steps[record]
        values = np.where(bad[record], np.nan, values)  # NaN is no value: those rows are left out
        order = np.argsort(codes, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(uniques)))])
        out = {}
        for i, name in enumerate(uniques):
            if name in drop or name.startswith("_") or name == MARK:
                continue
            sl = order[bounds[i]:bounds[i + 1]]
            if sl.size:
                out[name] = (item_steps[sl], values[sl])
        return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _floats(raw: Any) -> np.ndarray:
    """JSON value texts as float64 (Arrow, else json.loads one by one; non-numbers → NaN)."""
    import pyarrow as pa

    texts = list(raw)
    try:
        return pa.array(texts, pa.string()).cast(pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        out = np.empty(len(texts))
        for i, v in enumerate(texts):
            try:
                out[i] = as_float(json.loads(v))
            except (ValueError, RecursionError):
                out[i] = np.nan
        return out


def _item_key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _item_value(item: Any) -> Any:
    """A history item's value: value_json, else the typed fields newer wandb may write."""
    if item.value_json:
        try:
            return json.loads(item.value_json)
        except (ValueError, RecursionError):
            return None
    for field in ("number", "integer", "boolean"):
        try:
            if item.HasField(field):
                return getattr(item, field)
        except ValueError:  # a plain proto3 scalar (no presence) in this wandb version
            continue
    return None


def _config_update(config: dict[str, Any], items: Any) -> None:
    for item in items:
        try:
            config[_item_key(item)] = json.loads(item.value_json)
        except (ValueError, RecursionError):
            config[_item_key(item)] = item.value_json


def read_file(path: Path, history: _History, info: dict[str, Any], warnings: list[str]) -> None:
    """Add one .wandb file's history rows to ``history`` and its run facts to ``info``."""
    pb, all_cls, _, _ = _lite_classes()
    try:
        data = read_source(path)
    except OSError as exc:
        warnings.append(f"cannot read {path}: {exc.strerror or exc}")
        return
    payloads = list(records(data, str(path), warnings))
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
    from google.protobuf import message_factory

    by_name = pb.Record.DESCRIPTOR.fields_by_name
    cls = {k: message_factory.GetMessageClass(by_name[k].message_type) for k in ("run", "config", "exit")}
    config = info.setdefault("config", {})
    for run in _messages(cls["run"], merged.run, path, warnings):
        info.update(run_id=run.run_id or info.get("run_id"), name=run.display_name or info.get("name"),
                    project=run.project or info.get("project"), group=run.run_group or info.get("group"))
        _config_update(config, run.config.update)
    for update in _messages(cls["config"], merged.config, path, warnings):
        _config_update(config, update.update)
        for item in update.remove:
            config.pop(_item_key(item), None)
    for exit_ in _messages(cls["exit"], merged.exit, path, warnings):
        info["exit_code"] = exit_.exit_code


def _messages(cls: Any, raws: Iterable[bytes], path: Path, warnings: list[str]) -> Iterator[Any]:
    """Each record's message; a warning for each whose bytes are not that message."""
    for raw in raws:
        try:
            yield cls.FromString(raw)
        except Exception as exc:  # DecodeError
            warnings.append(f"{path}: {cls.DESCRIPTOR.name} record skipped ({type(exc).__name__})")


def wandb_file(run_dir: Path) -> Path | None:
    found = sorted(Path(run_dir).glob("run-*.wandb"))
    return found[-1] if found else None


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and wandb_file(path) is not None


def run_dirs(root: Path) -> list[Path]:
    """W&B run folders at or below ``root`` (``latest-run``, a link, skipped)."""
    root = Path(root)
    if is_run_dir(root):
        return [root]
    out = []
    for base in (root, root / "wandb"):
        if base.is_dir():
            out += [p for p in sorted(base.iterdir()) if RUN_DIR.match(p.name) and is_run_dir(p)]
    return sorted(set(out))


def read(folders: list[Path], *, name: str | None = None, flavour: str | None = None) -> ImportedRun:
    """One W&B run (its folders: one, or several for a resumed run, oldest first)."""
    history = _History()
    info: dict[str, Any] = {}
    warnings: list[str] = []
    for folder in folders:
        f = folder if folder.is_file() else wandb_file(folder)
        if f is None:
            warnings.append(f"{folder}: no .wandb file")
            continue
        read_file(f, history, info, warnings)
    raw_config = {k: v for k, v in info.get("config", {}).items() if not k.startswith("_wandb")}
    flat = flatten(raw_config)
    fl = F.pick(flavour, flat, history.names())
    series = history.series(fl.step_keys, set(fl.drop))
    if history.skipped:
        warnings.append(f"skipped {history.skipped} history records that are not W&B history rows")
    if history.bad_steps:
        warnings.append(f"skipped {history.bad_steps} history rows whose trainer step is not a whole number "
                        "in [0, 2**63)")
    code = info.get("exit_code")
    if code is None:
        state, reason = "unknown", "no exit record: the run is still going, or its process was killed"
    else:
        state, reason = ("completed", None) if code == 0 else ("failed", f"exit code {code}")
    last = folders[-1]
    return F.imported_run(series, fl, flat, warnings, config={"wandb.group": info["group"]} if info.get("group") else None,
                          name=name or info.get("name") or info.get("run_id") or last.name, path=last,
                          format="wandb", project=info.get("project"), state=state, reason=reason)
