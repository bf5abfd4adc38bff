"""TensorBoard event files, read with the ``tensorboard`` package's protobufs and no TensorFlow
(``armorlab[tensorboard]``); every point is read (EventAccumulator subsamples to 10,000 per tag) and both
TFRecord CRC-32Cs checked (google-crc32c); format and recovery rules: docs/importers.md#tensorboard.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.analysis.importers import flavours as F
from armorlab.analysis.importers.base import (
    ImportedRun,
    derived_message,
    flatten,
    read_source,
)
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


def masked(crc):
    """TFRecord's masked CRC-32C: rotated right by 15 bits plus 0xa282ead8 (mod 2³²)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _u32(raw: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each offset of the byte array ``raw``."""
    return raw[offsets[:, None] + np.arange(4, dtype=np.uint64)].view("<u4").ravel().astype(np.uint64)


def records(data: bytes, source: str, warnings: list[str]) -> list[bytes]:
    """The data of each TFRecord whose CRCs hold (torn, failing or unframable records left out with a
    warning); CRCs checked all at once: one by one they cost a third of an import (benchmarks/README.md)."""
    try:
        from google_crc32c import value as crc32c
    except ImportError as exc:
        raise ArmorLabError("checking TensorBoard records needs the google-crc32c package: pip install "
                            "'armorlab[tensorboard]'", key="format", value="tensorboard") from exc
    pos, end = 0, len(data)
    unpack = _LEN.unpack_from
    payloads: list[bytes] = []
    torn, tail = "", []   # tail: a torn record's (offset, length) when its header is whole
    while pos < end:
        if pos + 12 > end:
            torn = f"header of {end - pos} bytes"
            break
        (size,) = unpack(data, pos)
        if pos + 16 + size > end:
            torn, tail = f"{end - pos - 12} of {size + 4} bytes", [(pos, size)]
            break
        payloads.append(data[pos + 12:pos + 12 + size])
        pos += 16 + size
    raw = np.frombuffer(data, np.uint8)
    n = np.fromiter(map(len, payloads), np.uint64, count=len(payloads))   # uint64: a damaged length is any
    at = np.cumsum(n + 16) - (n + 16)
    if tail:
        at, n = np.append(at, np.uint64(tail[0][0])), np.append(n, np.uint64(tail[0][1]))
    distinct, which = np.unique(n, return_inverse=True)
    want = np.asarray([masked(crc32c(_LEN.pack(int(u)))) for u in distinct], np.uint64)[which.ravel()]
    bad_length = np.flatnonzero(_u32(raw, at + 8) != want)
    if bad_length.size:
        keep = int(bad_length[0])
        warnings.append(f"{source}: the length of the record at byte {at[keep]} fails its CRC; the rest of "
                        "the file skipped")
        payloads = payloads[:keep]
    elif torn:
        warnings.append(f"{source}: torn last record ({torn}) ignored")
    if not payloads:
        return []
    k = len(payloads)
    crc = np.fromiter(map(crc32c, payloads), np.uint64, count=k)
    bad = np.flatnonzero(_u32(raw, at[:k] + 12 + n[:k]) != masked(crc))
    for i in bad.tolist():
        warnings.append(f"{source}: the record at byte {at[i]} fails its CRC; skipped")
    if bad.size:
        drop = set(bad.tolist())
        payloads = [p for i, p in enumerate(payloads) if i not in drop]
    return payloads


_SCALARS = {_DT_FLOAT: ("float_val", "<f4"), _DT_DOUBLE: ("double_val", "<f8"), _DT_INT32: ("int_val", None),
            _DT_INT64: ("int64_val", None), _DT_BOOL: ("bool_val", None)}  # dtype → (field, packed layout)


def _tensor_scalar(t: Any) -> float | None:
    if any(d.size != 1 for d in t.tensor_shape.dim):
        return None
    if t.dtype == _DT_HALF:  # an int32 field holding 16 bits
        ok = t.half_val and 0 <= t.half_val[0] <= 0xFFFF
        return float(np.array([t.half_val[0]], dtype=np.uint16).view(np.float16)[0]) if ok else None
    field, packed = _SCALARS.get(t.dtype, ("", None))
    if field and getattr(t, field):
        return float(getattr(t, field)[0])
    if packed and len(t.tensor_content) == np.dtype(packed).itemsize:
        return float(np.frombuffer(t.tensor_content, packed)[0])
    return None


MARK = "\x00armorlab-event\x01"   # a tag no writer uses
SENT_STEP = -(2**62) + 7            # a step no writer uses
SENT_VALUE = -1.2345678e38          # a float32 no scalar is (checked: the counts must agree)


def _lite_classes():
    """Event parsed as one merged message over concatenated events: steps and summary values repeated."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as FDP
    from tensorboard.compat.proto import event_pb2, summary_pb2

    value_cls = summary_pb2.Summary.Value
    value = derived_message("TbValueAll", value_cls,
                            {f.name: FDP.TYPE_BYTES for f in value_cls.DESCRIPTOR.fields if f.message_type is not None},
                            repeat=tuple(f.name for f in value_cls.DESCRIPTOR.fields))
    summary = derived_message("TbSummaryAll", summary_pb2.Summary, {}, message={"value": value})
    event_fields = event_pb2.Event.DESCRIPTOR.fields
    event = derived_message("TbEventAll", event_pb2.Event,
                            {f.name: FDP.TYPE_BYTES for f in event_fields
                             if f.message_type is not None and f.name != "summary"},
                            repeat=tuple(f.name for f in event_fields if f.name != "summary"),
                            message={"summary": summary})
    return event_pb2, summary_pb2, event


def _marker() -> bytes:
    event_pb2, summary_pb2, _ = _lite_classes()
    return event_pb2.Event(step=SENT_STEP, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=MARK, simple_value=SENT_VALUE)])).SerializeToString()


def _fast(payloads: list[bytes]):
    """Per-scalar tag codes, tags, values, steps and the events to read one by one (non-simple values),
    from one parse of all events; None when the markers do not line up."""
    import pandas as pd

    _, _, event_all = _lite_classes()
    n = len(payloads)
    marker = _marker()
    merged = event_all.FromString(marker.join(payloads) + marker)
    steps = np.asarray(merged.step, dtype=np.int64)
    values = merged.summary.value
    codes, tags = pd.factorize(np.asarray(values.tag, dtype=object))
    simple = np.asarray(values.simple_value, dtype=np.float64)
    at = np.flatnonzero(tags == MARK)
    m_step = np.flatnonzero(steps == SENT_STEP)
    m_tag = np.flatnonzero(codes == at[0]) if at.size == 1 else np.empty(0, np.int64)
    m_val = np.flatnonzero(simple == float(np.float32(SENT_VALUE)))
    if not (m_step.size == m_tag.size == m_val.size == n):
        return None
    gaps = np.diff(np.concatenate([[-1], m_step]))
    if np.any(gaps > 2):
        return None
    event_step = np.where(gaps == 2, steps[np.maximum(m_step - 1, 0)], 0)
    n_tags = np.diff(np.concatenate([[-1], m_tag])) - 1
    n_vals = np.diff(np.concatenate([[-1], m_val])) - 1
    pure = n_tags == n_vals
    tag_event = np.repeat(np.arange(n), n_tags + 1)      # markers included, to be dropped
    val_event = np.repeat(np.arange(n), n_vals + 1)
    keep_t = pure[tag_event]
    keep_t[m_tag] = False
    keep_v = pure[val_event]
    keep_v[m_val] = False
    return (codes[keep_t], list(tags), simple[keep_v], event_step[tag_event[keep_t]],
            np.flatnonzero(~pure))


def read_dir(logdir: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, str], list[str]]:
    """A run's event files → (per-tag (steps, values), text summaries by tag, warnings)."""
    Event = _event_class()
    parse = Event.FromString
    texts: dict[str, str] = {}
    warnings: list[str] = []
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (tag, step, value) per scalar
    for path in sorted(p for p in Path(logdir).glob(PATTERN) if p.is_file()):
        try:
            data = read_source(path)
        except OSError as exc:
            warnings.append(f"cannot read {path}: {exc.strerror or exc}")
            continue
        payloads = list(records(data, str(path), warnings))
        try:
            fast = _fast(payloads)
        except Exception:  # DecodeError: a damaged record; the event-by-event path finds it
            fast = None
        if fast is not None:
            codes, tags, values, steps, slow = fast
            parts.append((np.asarray(tags, dtype=object)[codes], steps, values))
            one_by_one = [payloads[i] for i in slow.tolist()]
        else:
            one_by_one = payloads
        scalars = []  # (tag, step, value)
        for raw in one_by_one:
            try:
                ev = parse(raw)
            except Exception as exc:  # DecodeError: a corrupted record; what follows is not trusted
                warnings.append(f"{path}: unreadable record ({type(exc).__name__}); the rest of the file skipped")
                break
            if ev.WhichOneof("what") != "summary":
                continue
            for v in ev.summary.value:
                kind = v.WhichOneof("value")
                if kind == "tensor" and v.tensor.dtype == _DT_STRING:
                    if v.tensor.string_val:
                        texts[v.tag] = v.tensor.string_val[0].decode("utf-8", errors="replace")
                    continue
                value = v.simple_value if kind == "simple_value" else _tensor_scalar(v.tensor) if kind == "tensor" \
                    else None
                if value is not None:
                    scalars.append((v.tag, ev.step, value))
        if scalars:
            tags, steps, values = zip(*scalars, strict=True)
            parts.append((np.asarray(tags, dtype=object), np.asarray(steps, dtype=np.int64),
                          np.asarray(values, dtype=np.float64)))
    return _by_tag(parts), texts, warnings


def _by_tag(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Scalars in file order → per tag (steps, values) in that order (later files after earlier)."""
    import pandas as pd

    if not parts:
        return {}
    tags = np.concatenate([p[0] for p in parts])
    steps = np.concatenate([p[1] for p in parts])
    values = np.concatenate([p[2] for p in parts])
    codes, uniques = pd.factorize(tags)
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(uniques)))])
    return {str(tag): (steps[order[bounds[i]:bounds[i + 1]]], values[order[bounds[i]:bounds[i + 1]]])
            for i, tag in enumerate(uniques)}


def read_texts(logdir: Path) -> dict[str, str]:
    return read_dir(logdir)[1]


def run_dirs(root: Path) -> list[Path]:
    """Directories below ``root`` (itself included) that hold event files: one run each."""
    root = Path(root)
    found = {p.parent for p in root.rglob(PATTERN) if p.is_file()}
    return sorted(found)


def json_text(texts: dict[str, str], tags: tuple[str, ...]) -> dict[str, Any]:
    """The first of ``tags`` whose text is a JSON object (transformers logs its arguments so), else {}."""
    for tag in tags:
        try:
            loaded = json.loads(texts[tag]) if tag in texts else None
        except (ValueError, RecursionError):
            continue
        if isinstance(loaded, dict):
            return loaded
    return {}


def read(logdir: Path, *, name: str | None = None, flavour: str | None = None) -> ImportedRun:
    """One TensorBoard run dir → ImportedRun (trainer from transformers' ``args`` text, else tag names)."""
    logdir = Path(logdir)
    series, texts, warnings = read_dir(logdir)
    config = flatten(json_text(texts, ("args/text_summary", "config/text_summary", "hparams/text_summary")))
    fl = F.pick(flavour, config, series)
    return F.imported_run(series, fl, config, warnings, name=name or logdir.name, path=logdir, format="tensorboard",
                          project=logdir.parent.name or None, state="unknown",
                          reason="TensorBoard logs do not record whether a run finished")
