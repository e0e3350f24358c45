"""Building PNG files chunk by chunk, for the image tests."""

from __future__ import annotations

import struct
import zlib


def png_chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body and its CRC."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
