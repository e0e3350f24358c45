"""Small files that cost a decoder CPU time and memory rather than bytes (issue 36, finding 9),
built at test time: Pillow encodes a real image, the hostile part is written chunk by chunk."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

from tests.unit.tasks.moderation.images.png_support import png_chunk
from worker.tasks.moderation.images.png_rows import SIGNATURE


def progressive_jpeg(width: int, height: int, mode: str = "L") -> bytes:
    """A progressive JPEG as Pillow (libjpeg-turbo's standard script) writes it."""
    buf = io.BytesIO()
    Image.new(mode, (width, height), 128 if mode == "L" else (90, 120, 150)).save(
        buf, format="JPEG", progressive=True, quality=90)
    return buf.getvalue()


def empty_scans(width: int, height: int) -> tuple[bytes, bytes]:
    """(a Huffman table segment, one scan) for a one-component progressive image: an AC scan of
    band 1-63 whose data is end-of-band runs only, a few bytes that libjpeg still walks every
    block of the component for. The table (AC, index 1) codes the run of 2^r blocks, r = 0..14,
    as the 4-bit code r, followed by r extra bits."""
    counts = bytes([0, 0, 0, 15] + [0] * 12)
    body = bytes([0x11]) + counts + bytes(r << 4 for r in range(15))
    dht = b"\xff\xc4" + struct.pack(">H", 2 + len(body)) + body
    bits, left = "", ((width + 7) // 8) * ((height + 7) // 8)
    while left > 0:
        run = min(left, (1 << 15) - 1)
        r = run.bit_length() - 1
        bits += format(r, "04b") + (format(run - (1 << r), f"0{r}b") if r else "")
        left -= run
    bits += "1" * (-len(bits) % 8)  # padding with ones, as the standard says
    data = int(bits, 2).to_bytes(len(bits) // 8, "big").replace(b"\xff", b"\xff\x00")
    header = bytes([1, 1, 0x01, 1, 63, 0x00])  # component 1, AC table 1, Ss 1, Se 63, Ah Al 0
    return dht, b"\xff\xda" + struct.pack(">H", 2 + len(header)) + header + data


def many_scan_jpeg(width: int, height: int, extra_scans: int) -> bytes:
    """A grey progressive JPEG with ``extra_scans`` empty AC scans before its end marker (the
    finding's first job: 3,000 tiny AC scans)."""
    data = progressive_jpeg(width, height)
    assert data.endswith(b"\xff\xd9")
    dht, scan = empty_scans(width, height)
    return data[:-2] + dht + scan * extra_scans + b"\xff\xd9"


def apng(width: int, height: int, frames: int, *, actl: bool = True) -> bytes:
    """An RGBA PNG of ``frames`` frames (one fcTL each: the default image is frame 0), every
    frame all transparent zeros, compressed as far as zlib goes (about 1,000 to 1). Without
    ``actl`` it is a plain PNG to Pillow, carrying ``frames`` - 1 frames (fcTL/fdAT) after its
    image data (the finding's second job); with it, an APNG (its third)."""
    raw = zlib.compress(bytes(height * (1 + 4 * width)), 9)
    seq = 0

    def fctl() -> bytes:
        nonlocal seq
        seq += 1
        return png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", seq - 1, width, height, 0, 0, 1,
                                              10, 0, 0))

    out = SIGNATURE + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
    if actl:
        out += png_chunk(b"acTL", struct.pack(">II", frames, 0))
    out += fctl() + png_chunk(b"IDAT", raw)
    for _ in range(frames - 1):
        out += fctl()
        out += png_chunk(b"fdAT", struct.pack(">I", seq) + raw)
        seq += 1
    return out + png_chunk(b"IEND", b"")
