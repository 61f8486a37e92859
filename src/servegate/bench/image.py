"""A PNG with known coloured regions, written with zlib alone (no imaging library).

Left half blue, right half yellow, a white outline around the whole: the vision
probe asks the model to name the regions.
"""

from __future__ import annotations

import struct
import zlib

BLUE = (0, 70, 230)
YELLOW = (250, 215, 0)
WHITE = (255, 255, 255)
REGIONS = {"blue": BLUE, "yellow": YELLOW}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def regions_png(size: int, outline: int = 0) -> bytes:
    """An RGB PNG of ``size`` x ``size`` pixels."""
    border = outline or max(2, size // 60)
    rows = []
    for y in range(size):
        if y < border or y >= size - border:
            row = bytes(WHITE) * size
        else:
            inner = size - 2 * border
            left = inner // 2
            row = bytes(WHITE) * border + bytes(BLUE) * left + bytes(YELLOW) * (inner - left)
            row += bytes(WHITE) * border
        rows.append(b"\x00" + row)
    ihdr = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", zlib.compress(b"".join(rows), 6))
        + _chunk(b"IEND", b"")
    )


def read_png_rgb(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows) of an 8-bit RGB PNG with filter 0 rows (what we write)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * width
    return width, height, [raw[i * stride + 1 : (i + 1) * stride] for i in range(height)]
