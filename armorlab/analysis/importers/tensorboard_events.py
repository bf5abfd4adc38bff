"""TensorBoard event files, read with the ``tensorboard`` package's protobufs and no TensorFlow
(``armorlab[tensorboard]``); every point is read (EventAccumulator subsamples to 10,000 per tag) and both
TFRecord CRC-32Cs checked (google-crc32c); format and recovery rules: docs/importers.md#tensorboard."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from armorlab.analysis.importers import base as B
from armorlab.analysis.importers import flavours as F
from armorlab.errors import ArmorLabError

PATTERN = "events.out.tfevents.*"
_LEN = struct.Struct("<Q")
# tensorflow's DataType enum values read from scalar tensors
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_BOOL, _DT_HALF, _DT_STRING = 1, 2, 3, 9, 10, 19, 7
_SCALARS = {_DT_FLOAT: ("float_val", "<f4"), _DT_DOUBLE: ("double_val", "<f8"), _DT_INT32: ("int_val", None),
            _DT_INT64: ("int64_val", None), _DT_BOOL: ("bool_val", None)}  # dtype → (field, packed layout)
MARK = "\x00armorlab-event\x01"   # a tag no writer uses
SENT_STEP = -(2**62) + 7            # a step no writer uses
SENT_VALUE = -1.2345678e38          # a float32 no scalar is (checked: the counts must agree)


def available() -> bool:
    try:
        from tensorboard.compat.proto import event_pb2  # noqa: F401
    except ImportError:
        return False
    return True


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
    pos, end, payloads, torn, tail = 0, len(data), [], "", []
    while pos < end:
        if pos + 12 > end:
            torn = f"header of {end - pos} bytes"
            break
        (size,) = _LEN.unpack_from(data, pos)
        if pos + 16 + size > end:  # torn, its header whole: its length's CRC still says if it is one
            torn, tail = f"{end - pos - 12} of {size + 4} bytes", [pos, size]
            break
        payloads.append(data[pos + 12:pos + 12 + size])
        pos += 16 + size
    raw = np.frombuffer(data, np.uint8)
    n = np.fromiter(map(len, payloads), np.uint64, count=len(payloads))   # uint64: a damaged length is any
    at = np.cumsum(n + 16) - (n + 16)
    if tail:
        at, n = np.append(at, np.uint64(tail[0])), np.append(n, np.uint64(tail[1]))
    distinct, which = np.unique(n, return_inverse=True)
    want = np.asarray([masked(crc32c(_LEN.pack(int(u)))) for u in distinct], np.uint64)[which.ravel()]
    bad_length = np.flatnonzero(_u32(raw, at + 8) != want)
    if bad_length.size:
        payloads = payloads[:int(bad_length[0])]
        warnings.append(f"{source}: the length of the record at byte {at[bad_length[0]]} fails its CRC; the rest "
                        "of the file skipped")
    elif torn:
        warnings.append(f"{source}: torn last record ({torn}) ignored")
    k = len(payloads)
    crc = np.fromiter(map(crc32c, payloads), np.uint64, count=k)
    bad = set(np.flatnonzero(_u32(raw, at[:k] + 12 + n[:k]) != masked(crc)).tolist())
    warnings.extend(f"{source}: the record at byte {at[i]} fails its CRC; skipped" for i in sorted(bad))
    return [p for i, p in enumerate(payloads) if i not in bad] if bad else payloads


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


def _protos():
    """(event_pb2, summary_pb2, Event parsed as one merged message over concatenated events: steps and
    summary values repeated)."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
    except ImportError as exc:
        raise ArmorLabError("reading TensorBoard event files needs the tensorboard package: pip install "
                            "'armorlab[tensorboard]'", key="format", value="tensorboard") from exc
    summary = B.derived_message("TbSummaryAll", summary_pb2.Summary,
                                {"value": B.derived_message("TbValueAll", summary_pb2.Summary.Value)})
    return event_pb2, summary_pb2, B.derived_message("TbEventAll", event_pb2.Event, {"summary": summary})


def _fast(payloads: list[bytes]):
    """(Per-scalar tags, steps, values, the events to read one by one: non-simple values) from one parse of
    all events with a marker event after each; None when the markers do not line up."""
    import pandas as pd

    event_pb2, summary_pb2, event_all = _protos()
    n = len(payloads)
    marker = event_pb2.Event(step=SENT_STEP, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=MARK, simple_value=SENT_VALUE)])).SerializeToString()
    merged = event_all.FromString(marker.join(payloads) + marker)
    steps = np.asarray(merged.step, dtype=np.int64)
    codes, tags = pd.factorize(np.asarray(merged.summary.value.tag, dtype=object))
    simple = np.asarray(merged.summary.value.simple_value, dtype=np.float64)
    at = np.flatnonzero(tags == MARK)
    m_step = np.flatnonzero(steps == SENT_STEP)
    m_tag = np.flatnonzero(codes == at[0]) if at.size == 1 else np.empty(0, np.int64)
    m_val = np.flatnonzero(simple == float(np.float32(SENT_VALUE)))
    if not (m_step.size == m_tag.size == m_val.size == n):
        return None
    gaps = np.diff(m_step, prepend=-1)
    if np.any(gaps > 2):
        return None
    event_step = np.where(gaps == 2, steps[np.maximum(m_step - 1, 0)], 0)
    n_tags, n_vals = np.diff(m_tag, prepend=-1) - 1, np.diff(m_val, prepend=-1) - 1
    pure = n_tags == n_vals
    tag_event = np.repeat(np.arange(n), n_tags + 1)      # markers included, to be dropped
    keep_t, keep_v = pure[tag_event], pure[np.repeat(np.arange(n), n_vals + 1)]
    keep_t[m_tag] = keep_v[m_val] = False
    return np.asarray(tags, dtype=object)[codes[keep_t]], event_step[tag_event[keep_t]], simple[keep_v], \
        np.flatnonzero(~pure)


def _scalars(raw: bytes, parse, texts: dict[str, str]) -> list[tuple[str, int, float]]:
    """One event's (tag, step, value) scalars; its text summaries go to ``texts``."""
    ev = parse(raw)
    out = []
    for v in ev.summary.value if ev.WhichOneof("what") == "summary" else ():
        kind = v.WhichOneof("value")
        if kind == "tensor" and v.tensor.dtype == _DT_STRING:
            if v.tensor.string_val:
                texts[v.tag] = v.tensor.string_val[0].decode("utf-8", errors="replace")
            continue
        value = v.simple_value if kind == "simple_value" else _tensor_scalar(v.tensor) if kind == "tensor" else None
        if value is not None:
            out.append((v.tag, ev.step, value))
    return out


def read_dir(logdir: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, str], list[str]]:
    """A run's event files → (per-tag (steps, values) in file order, text summaries by tag, warnings)."""
    parse = _protos()[0].Event.FromString
    texts, warnings, parts = {}, [], []   # parts: (tag, step, value) arrays per scalar
    for path in sorted(p for p in Path(logdir).glob(PATTERN) if p.is_file()):
        try:
            payloads = list(records(B.read_source(path), str(path), warnings))
        except OSError as exc:
            warnings.append(f"cannot read {path}: {exc.strerror or exc}")
            continue
        try:
            fast = _fast(payloads)
        except Exception:  # DecodeError: a damaged record; the event-by-event path finds it
            fast = None
        if fast is not None:
            parts.append(fast[:3])
            payloads = [payloads[i] for i in fast[3].tolist()]
        scalars = []
        for raw in payloads:
            try:
                scalars += _scalars(raw, parse, texts)
            except Exception as exc:  # DecodeError: a corrupted record; what follows is not trusted
                warnings.append(f"{path}: unreadable record ({type(exc).__name__}); the rest of the file skipped")
                break
        if scalars:
            tags, steps, values = zip(*scalars, strict=True)
            parts.append((np.asarray(tags, dtype=object), np.asarray(steps, dtype=np.int64),
                          np.asarray(values, dtype=np.float64)))
    if not parts:
        return {}, texts, warnings
    import pandas as pd

    tags, steps, values = (np.concatenate(a) for a in zip(*parts, strict=True))
    codes, names = pd.factorize(tags)
    return B.group_series(codes, names, steps, values), texts, warnings


def read_texts(logdir: Path) -> dict[str, str]:
    return read_dir(logdir)[1]


def run_dirs(root: Path) -> list[Path]:
    """Directories below ``root`` (itself included) that hold event files: one run each."""
    return sorted({p.parent for p in Path(root).rglob(PATTERN) if p.is_file()})


def json_text(texts: dict[str, str], tags: tuple[str, ...]) -> dict[str, Any]:
    """The first of ``tags`` whose text is a JSON object (transformers logs its arguments so), else {}."""
    return next((d for t in tags if t in texts and isinstance(d := B.parsed_json(texts[t]), dict)), {})


def read(logdir: Path, *, name: str | None = None, flavour: str | None = None) -> B.ImportedRun:
    """One TensorBoard run dir → B.ImportedRun (trainer from transformers' ``args`` text, else tag names)."""
    logdir = Path(logdir)
    series, texts, warnings = read_dir(logdir)
    config = B.flatten(json_text(texts, ("args/text_summary", "config/text_summary", "hparams/text_summary")))
    fl = F.pick(flavour, config, series)
    return F.imported_run(series, fl, config, warnings, name=name or logdir.name, path=logdir, format="tensorboard",
                          project=logdir.parent.name or None, state="unknown",
                          reason="TensorBoard logs do not record whether a run finished")
