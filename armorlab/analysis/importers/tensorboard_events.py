"""TensorBoard event files (``events.out.tfevents.*``), read with the ``tensorboard`` package's own
protobuf definitions (``tensorboard.compat.proto.event_pb2``) and no TensorFlow: ``pip install
armorlab[tensorboard]``.

Every point is read — TensorBoard's EventAccumulator keeps at most 10,000 scalars per tag by
default (reservoir sampling); this reader never subsamples. Scalars come from ``simple_value``
(torch's, tensorboardX's and transformers' SummaryWriter) and from scalar tensor summaries of a
numeric dtype (``tf.summary.scalar`` in TF2). Text summaries are kept apart (transformers logs the
training arguments as ``args/text_summary``).

Record framing (TFRecord): uint64 length, uint32 masked CRC-32C of the length, the data, uint32
masked CRC-32C of the data, little-endian. Records are framed by their length; a last record cut
short (a writer killed mid-write) is skipped with a warning. The CRCs are not checked: the
standard library has no CRC-32C, and a pure-Python one would cost more than the parse; a
corrupted record that does not parse is reported and the rest of the file skipped.

One directory of event files is one run (as TensorBoard shows runs); files of one directory
(a restarted writer) are read in name order, a later value winning per (tag, step).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.analysis.importers import flavours as F
from armorlab.analysis.importers.base import ImportedRun, flatten, seed_and_config, unavailable
from armorlab.errors import ArmorLabError

PATTERN = "events.out.tfevents.*"
_LEN = struct.Struct("<Q")
# tensorflow's DataType enum values read from scalar tensors
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_BOOL, _DT_HALF, _DT_STRING = 1, 2, 3, 9, 10, 19, 7


def available() -> bool:
    try:
        from tensorboard.compat.proto import event_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def _event_class():
    try:
        from tensorboard.compat.proto.event_pb2 import Event
    except ImportError as exc:
        raise ArmorLabError("reading TensorBoard event files needs the tensorboard package: pip install "
                            "'armorlab[tensorboard]'", key="format", value="tensorboard") from exc
    return Event


def event_files(logdir: Path) -> list[Path]:
    return sorted(p for p in Path(logdir).glob(PATTERN) if p.is_file())


def records(data: bytes, source: str, warnings: list[str]) -> Iterable[bytes]:
    """The data of each TFRecord in ``data``; a torn last record is left out with a warning."""
    pos, end = 0, len(data)
    unpack = _LEN.unpack_from
    while pos < end:
        if pos + 12 > end:
            warnings.append(f"{source}: torn last record (header of {end - pos} bytes) ignored")
            return
        (n,) = unpack(data, pos)
        start = pos + 12
        stop = start + n
        if stop + 4 > end:
            warnings.append(f"{source}: torn last record ({end - start} of {n + 4} bytes) ignored")
            return
        yield data[start:stop]
        pos = stop + 4


def _tensor_scalar(t: Any) -> float | None:
    if any(d.size != 1 for d in t.tensor_shape.dim):
        return None
    dt = t.dtype
    if dt == _DT_FLOAT:
        if t.float_val:
            return float(t.float_val[0])
        return float(np.frombuffer(t.tensor_content, "<f4")[0]) if len(t.tensor_content) == 4 else None
    if dt == _DT_DOUBLE:
        if t.double_val:
            return float(t.double_val[0])
        return float(np.frombuffer(t.tensor_content, "<f8")[0]) if len(t.tensor_content) == 8 else None
    if dt == _DT_INT32 and t.int_val:
        return float(t.int_val[0])
    if dt == _DT_INT64 and t.int64_val:
        return float(t.int64_val[0])
    if dt == _DT_BOOL and t.bool_val:
        return float(t.bool_val[0])
    if dt == _DT_HALF and t.half_val:
        return float(np.array([t.half_val[0]], dtype=np.uint16).view(np.float16)[0])
    return None


def read_dir(logdir: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, str], list[str]]:
    """A run's event files → (per-tag (steps, values), text summaries by tag, warnings)."""
    Event = _event_class()
    parse = Event.FromString
    acc: dict[str, list[float]] = {}
    texts: dict[str, str] = {}
    warnings: list[str] = []
    for path in event_files(logdir):
        try:
            data = path.read_bytes()
        except OSError as exc:
            warnings.append(f"cannot read {path}: {exc.strerror or exc}")
            continue
        for raw in records(data, str(path), warnings):
            try:
                ev = parse(raw)
            except Exception as exc:  # DecodeError: a corrupted record; what follows is not trusted
                warnings.append(f"{path}: unreadable record ({type(exc).__name__}); the rest of the file skipped")
                break
            if ev.WhichOneof("what") != "summary":
                continue
            step = ev.step
            for v in ev.summary.value:
                kind = v.WhichOneof("value")
                if kind == "simple_value":
                    value = v.simple_value
                elif kind == "tensor":
                    t = v.tensor
                    if t.dtype == _DT_STRING:
                        if t.string_val:
                            texts[v.tag] = t.string_val[0].decode("utf-8", errors="replace")
                        continue
                    value = _tensor_scalar(t)
                    if value is None:
                        continue
                else:
                    continue
                lst = acc.get(v.tag)
                if lst is None:
                    lst = acc[v.tag] = []
                lst.append(step)
                lst.append(value)
    series = {}
    for tag, lst in acc.items():
        arr = np.asarray(lst, dtype=np.float64)
        series[tag] = (arr[0::2].astype(np.int64), arr[1::2])
    return series, texts, warnings


def read_texts(logdir: Path) -> dict[str, str]:
    return read_dir(logdir)[1]


def run_dirs(root: Path) -> list[Path]:
    """Directories below ``root`` (itself included) that hold event files: one run each."""
    root = Path(root)
    found = {p.parent for p in root.rglob(PATTERN) if p.is_file()}
    return sorted(found)


def read(logdir: Path, *, name: str | None = None, flavour: str | None = None) -> ImportedRun:
    """One TensorBoard run dir → ImportedRun (the trainer recognised from the ``args`` text
    transformers writes, else from its tag names)."""
    logdir = Path(logdir)
    series, texts, warnings = read_dir(logdir)
    config: dict[str, Any] = {}
    for tag in ("args/text_summary", "config/text_summary", "hparams/text_summary"):
        if tag in texts:
            try:
                loaded = json.loads(texts[tag])
            except ValueError:
                continue
            if isinstance(loaded, dict):
                config = flatten(loaded)
                break
    fl = F.FLAVOURS[flavour] if flavour else F.detect(config, series)
    table, origin = F.mapped_table(series, fl, config, warnings)
    return ImportedRun(name=name or logdir.name, path=logdir, format="tensorboard", table=table,
                       config=seed_and_config(config, fl.identity), flavour=fl.name,
                       project=logdir.parent.name or None, state="unknown",
                       reason="TensorBoard logs do not record whether a run finished", warnings=warnings,
                       unavailable=unavailable(table.column_names, fl.cannot), origin=origin)
