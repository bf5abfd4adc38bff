"""The report's PNG encoder: Pillow (an independent decoder, which checks every chunk's CRC)
reads back exactly the pixels, resolution and text written; the bytes of a tiny image match the
PNG spec worked by hand; and a report figure saved with it has savefig's pixels."""

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from armorlab.analysis import plots
from armorlab.analysis.png import encode_rgba


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        (size,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + size]
        assert struct.unpack(">I", data[at + 8 + size:at + 12 + size])[0] == zlib.crc32(kind + body)
        out.append((kind, body))
        at += 12 + size
    return out


@settings(max_examples=60, deadline=None)
@given(arrays(np.uint8, st.tuples(st.integers(1, 24), st.integers(1, 24), st.just(4))),
       st.integers(1, 9))
def test_pillow_reads_back_the_very_pixels(image, level):
    im = Image.open(io.BytesIO(encode_rgba(image, level=level)))
    assert im.mode == "RGBA" and im.size == (image.shape[1], image.shape[0])
    assert np.array_equal(np.asarray(im), image)


def test_a_two_by_one_image_byte_by_byte():
    # row 0: (10, 20, 30, 40); row 1: (5, 250, 30, 0)
    image = np.array([[[10, 20, 30, 40]], [[5, 250, 30, 0]]], dtype=np.uint8)
    chunks = _chunks(encode_rgba(image, dpi=100, text={"Software": "x"}))
    assert [k for k, _ in chunks] == [b"IHDR", b"pHYs", b"tEXt", b"IDAT", b"IEND"]
    # width 1, height 2, bit depth 8, colour type 6 (RGBA), deflate, adaptive filtering, no interlace
    assert chunks[0][1] == bytes([0, 0, 0, 1, 0, 0, 0, 2, 8, 6, 0, 0, 0])
    # 100 dpi = 3937.007... px/m → 3937 = 0x0F61, unit 1 (metre)
    assert chunks[1][1] == bytes([0, 0, 0x0F, 0x61, 0, 0, 0x0F, 0x61, 1])
    assert chunks[2][1] == b"Software\0x"
    # row 0 unfiltered; row 1 Up: 5-10, 250-20, 30-30, 0-40 modulo 256
    assert zlib.decompress(chunks[3][1]) == bytes([0, 10, 20, 30, 40, 2, 251, 230, 0, 216])
    assert chunks[4][1] == b""


def test_dpi_and_text_as_pillow_reads_them():
    im = Image.open(io.BytesIO(encode_rgba(np.zeros((3, 5, 4), np.uint8), dpi=110, text={"Software": "ab c"})))
    assert im.info["Software"] == "ab c"
    assert im.info["dpi"] == pytest.approx((110, 110), abs=0.01)


@pytest.mark.parametrize("bad", [np.zeros((2, 2, 3), np.uint8), np.zeros((2, 2, 4), np.float32),
                                 np.zeros((8, 4), np.uint8)])
def test_other_images_are_refused(bad):
    with pytest.raises(ValueError, match="uint8"):
        encode_rgba(bad)


def test_a_saved_figure_has_savefigs_pixels(tmp_path):
    fig, ax = plots.plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [0, 1, 0.5], label="a line")
    ax.fill_between([0, 1, 2], [0, 0.2, 0.1], [0.3, 0.5, 0.4], alpha=0.3)
    ax.set_title("title")
    ax.set_xlabel("step")
    ax.legend()
    plots._save(fig, tmp_path / "f.png")
    ref = io.BytesIO()
    fig.savefig(ref, format="png", dpi=plots.DPI)
    ours = Image.open(tmp_path / "f.png")
    assert np.array_equal(np.asarray(ours), np.asarray(Image.open(ref)))
    assert ours.info["Software"].startswith("Matplotlib version")
