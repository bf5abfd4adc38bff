"""W&B local run folders (``wandb/run-*/``, ``wandb/offline-run-*/``), read without a server or an
account: ``pip install armorlab[wandb]``.

A run folder's ``run-<id>.wandb`` is W&B's transaction log: a 7-byte header (``:W&B``, magic
0xBEE1, version 0) then LevelDB's log format (32 KiB blocks of chunks, each with a CRC-32 of its
type byte and data, a uint16 length and a type: full, first, middle, last; wandb's
``core/pkg/leveldb/record.go``, a fork of golang/leveldb's record package with the IEEE CRC). Each
record is a ``wandb.proto.wandb_internal_pb2.Record`` parsed with wandb's own protobuf
definitions; the reader is this module's, not an internal wandb reader API (those come and go
between wandb versions). A chunk whose CRC fails skips to the next block, as LevelDB's reader
recovers; a torn last record is left out with a warning.

History rows: ``Record.history`` items (key, JSON value). The step of a row is the trainer's
own counter where it logs one (TRL and OpenRLHF ``train/global_step``, OpenRLHF eval rows
``eval/global_step``), else W&B's ``_step`` (verl logs with ``step=global_steps``). The config:
the run record's and every later config record's items. A run resumed into a new folder (same
run id) is merged, the later folder winning per (metric, step).
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.analysis.importers import flavours as F
from armorlab.analysis.importers.base import ImportedRun, as_float, flatten, seed_and_config, unavailable
from armorlab.errors import ArmorLabError

HEADER = struct.Struct("<4sHB")
IDENT, MAGIC, VERSION = b":W&B", 0xBEE1, 0
CHUNK = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_TYPE_CRC = {t: zlib.crc32(bytes((t,))) for t in (FULL, FIRST, MIDDLE, LAST)}
RUN_DIR = re.compile(r"^(offline-)?run-\d{8}_\d{6}-(?P<id>[A-Za-z0-9]+)$")
W_STEP = "_step"


def available() -> bool:
    try:
        from wandb.proto import wandb_internal_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def _record_class():
    try:
        from wandb.proto.wandb_internal_pb2 import Record
    except ImportError as exc:
        raise ArmorLabError("reading W&B run folders needs the wandb package: pip install 'armorlab[wandb]'",
                            key="format", value="wandb") from exc
    return Record


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


class _History:
    """History rows grouped by their key sets: one list of steps and one of JSON value texts per
    key set, decoded at the end in one json.loads per key set (a run logs the same keys each step)."""

    def __init__(self) -> None:
        self.schemas: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def add(self, step: int, keys: tuple[str, ...], values: list[str]) -> None:
        entry = self.schemas.get(keys)
        if entry is None:
            entry = self.schemas[keys] = ([], [])
        entry[0].append(step)
        entry[1].append(",".join(values))

    def names(self) -> set[str]:
        return {k for keys in self.schemas for k in keys}

    def series(self, step_keys: tuple[str, ...], drop: set[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        out: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for keys, (w_steps, texts) in self.schemas.items():
            flat = json.loads("[" + ",".join(texts) + "]")
            try:
                block = np.array(flat, dtype=np.float64)
            except (TypeError, ValueError):  # media, tables, strings among the values
                block = np.array([as_float(v) for v in flat], dtype=np.float64)
            block = block.reshape(len(w_steps), len(keys))
            steps = np.asarray(w_steps, dtype=np.int64)
            for k in step_keys:
                if k in keys:
                    col = block[:, keys.index(k)]
                    ok = np.isfinite(col)
                    steps = np.where(ok, col, steps).astype(np.int64)
                    break
            for j, k in enumerate(keys):
                if k in drop or k.startswith("_"):
                    continue
                out.setdefault(k, []).append((steps, block[:, j]))
        return {k: (np.concatenate([s for s, _ in parts]), np.concatenate([v for _, v in parts]))
                if len(parts) > 1 else parts[0] for k, parts in out.items()}


def _item_key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def _config_update(config: dict[str, Any], items: Any) -> None:
    for item in items:
        try:
            config[_item_key(item)] = json.loads(item.value_json)
        except ValueError:
            config[_item_key(item)] = item.value_json


def read_file(path: Path, history: _History, info: dict[str, Any], warnings: list[str]) -> None:
    """Add one .wandb file's history rows to ``history`` and its run facts to ``info``."""
    Record = _record_class()
    parse = Record.FromString
    try:
        data = path.read_bytes()
    except OSError as exc:
        warnings.append(f"cannot read {path}: {exc.strerror or exc}")
        return
    config = info.setdefault("config", {})
    add = history.add
    for raw in records(data, str(path), warnings):
        try:
            rec = parse(raw)
        except Exception as exc:  # DecodeError on a damaged record: skip it
            warnings.append(f"{path}: unreadable record skipped ({type(exc).__name__})")
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            h = rec.history
            items = h.item
            keys = tuple([it.key or ".".join(it.nested_key) for it in items])
            add(h.step.num, keys, [it.value_json for it in items])
        elif kind == "run":
            run = rec.run
            info.update(run_id=run.run_id or info.get("run_id"), name=run.display_name or info.get("name"),
                        project=run.project or info.get("project"), group=run.run_group or info.get("group"))
            _config_update(config, run.config.update)
        elif kind == "config":
            _config_update(config, rec.config.update)
            for item in rec.config.remove:
                config.pop(_item_key(item), None)
        elif kind == "exit":
            info["exit_code"] = rec.exit.exit_code


def wandb_file(run_dir: Path) -> Path | None:
    found = sorted(Path(run_dir).glob("run-*.wandb"))
    return found[-1] if found else None


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and wandb_file(path) is not None


def run_dirs(root: Path) -> list[Path]:
    """W&B run folders at or below ``root`` (a ``wandb/`` dir, a run folder, or a dir holding
    ``wandb/``); ``latest-run`` (a link to one of them) is skipped."""
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
    fl = F.FLAVOURS[flavour] if flavour else F.detect(flat, history.names())
    series = history.series(fl.step_keys, set(fl.drop))
    table, origin = F.mapped_table(series, fl, flat, warnings)
    config = seed_and_config(flat, fl.identity)
    if info.get("group"):
        config["wandb.group"] = info["group"]
    code = info.get("exit_code")
    if code is None:
        state, reason = "unknown", "no exit record: the run is still going, or its process was killed"
    else:
        state, reason = ("completed", None) if code == 0 else ("failed", f"exit code {code}")
    last = folders[-1]
    return ImportedRun(name=name or info.get("name") or info.get("run_id") or last.name, path=last,
                       format="wandb", table=table, config=config, flavour=fl.name, project=info.get("project"),
                       state=state, reason=reason, warnings=warnings,
                       unavailable=unavailable(table.column_names, fl.cannot), origin=origin)


def runs(root: Path) -> list[list[Path]]:
    """The runs below ``root``: folders grouped by run id (a resumed run), oldest folder first."""
    by_id: dict[str, list[Path]] = {}
    for d in run_dirs(root):
        m = RUN_DIR.match(d.name)
        by_id.setdefault(m.group("id") if m else d.name, []).append(d)
    return [sorted(v, key=lambda p: p.name.removeprefix("offline-")) for v in by_id.values()]
