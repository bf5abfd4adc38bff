"""PNG encoding of an RGBA image (PNG spec, ISO/IEC 15948): every scanline but the first with
filter type Up, deflated.

Why not Pillow (what savefig uses): Pillow's PNG encoder chooses a filter per scanline by trying
four of them, and on a report figure (flat background, thin lines, text) that search was a fifth
of a figure's instructions. Up for every scanline, computed in one numpy pass, gave files no
larger than Pillow's at compress_level 1, in about 40 % of its time. Pure: an array in, bytes out."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    """A chunk: length, type, data, CRC-32 of type and data (spec §5.3)."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))


def encode_rgba(rgba, *, dpi: float | None = None, text: Mapping[str, str] | None = None,
                level: int = 3) -> bytes:
    """An (H, W, 4) uint8 image → PNG bytes: 8-bit RGBA (colour type 6), the first scanline
    with filter type 0 (None) and every other with type 2 (Up: each byte minus the byte above
    it, modulo 256, spec §9.2), one zlib stream at ``level``; ``dpi`` as a pHYs chunk in pixels per
    metre (rounded as Pillow rounds it), ``text`` as Latin-1 tEXt chunks (as savefig's
    ``Software`` entry)."""
    image = np.asarray(rgba)
    if image.ndim != 3 or image.shape[2] != 4 or image.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 4) uint8 image, got {image.shape} {image.dtype}")
    height, width = image.shape[:2]
    flat = image.reshape(height, 4 * width)
    rows = np.empty((height, 1 + 4 * width), dtype=np.uint8)
    rows[:, 0] = 2  # the filter type byte that starts each scanline
    rows[:1, 0] = 0
    rows[:1, 1:] = flat[:1]
    np.subtract(flat[1:], flat[:-1], out=rows[1:, 1:])  # uint8: wraps modulo 256
    parts = [SIGNATURE, _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))]
    if dpi is not None:
        per_metre = int(dpi / 0.0254 + 0.5)
        parts.append(_chunk(b"pHYs", struct.pack(">IIB", per_metre, per_metre, 1)))
    for key, value in (text or {}).items():
        parts.append(_chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1")))
    parts += [_chunk(b"IDAT", zlib.compress(rows, level)), _chunk(b"IEND", b"")]
    return b"".join(parts)
