"""Jobs for the fault drills: good ones on real photos, and the malformed-job corpus (one
class per way a record can be wrong, each with the one-line reason its DLQ record must carry)."""

from __future__ import annotations

import functools
import io
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from PIL import Image

from worker.bundled import samples_dir
from worker.tools.produce import encode_job

# --- jobs ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def small_images() -> tuple[bytes, ...]:
    """The bundled samples re-encoded at 128x128 (JPEG, one PNG): cheap to decode, so the
    2-core test machine spends its time on the model and the faults, not on Pillow."""
    out: list[bytes] = []
    for i, path in enumerate(sorted(p for p in samples_dir().iterdir() if p.suffix != ".md")):
        img = Image.open(path).convert("RGB").resize((128, 128))
        buf = io.BytesIO()
        img.save(buf, format="PNG" if i == 0 else "JPEG", quality=85)
        out.append(buf.getvalue())
    return tuple(out)


def good_job(job_id: str) -> bytes:
    images = small_images()
    return encode_job(job_id, images[hash(job_id) % len(images)])


# --- malformed corpus ---------------------------------------------------------------------------


def _png(width: int, height: int, idat: bytes, color_type: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


@functools.lru_cache(maxsize=1)
def png_bomb() -> bytes:
    """A real decompression bomb: a 5000x5000 grayscale PNG whose zlib stream (~25 KB) inflates
    to 25 MB of pixels. Refused by the pixel budget (limits.max_image_pixels) from the header."""
    side = 5000
    raw = (b"\x00" + b"\x00" * side) * side  # filter byte + one row, per row
    return _png(side, side, zlib.compress(raw, 9), color_type=0)


def header_50k() -> bytes:
    """A tiny PNG whose header declares 50,000 x 50,000 pixels (refused by max_image_side)."""
    return _png(50_000, 50_000, zlib.compress(b"\x00" * 1024))


# Limits the flood's worker runs with (the corpus is sized against them).
FLOOD_LIMITS = {"max_message_bytes": 64 * 1024, "max_image_bytes": 48 * 1024,
                "max_image_pixels": 4_000_000, "max_text_chars": 20_000}


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


Builder = Callable[[str, random.Random], bytes | None]


def _class_builders(jpeg: bytes) -> dict[str, tuple[str, Builder]]:
    """class -> (expected DLQ reason, builder(job_id, rng) -> record value)."""

    def truncated_msgpack(i: str, r: random.Random) -> bytes:
        whole = encode_job(i, jpeg)
        return whole[: r.randrange(1, len(whole) - 1)]

    def invalid_utf8(i: str, r: random.Random) -> bytes:
        # map{v: 1, id: <str with invalid UTF-8>, image: bin}
        bad = bytes([0xFF, 0xFE, 0xC3, 0x28])[: r.randrange(1, 5)]
        return (b"\x83\xa1v\x01\xa2id" + bytes([0xA0 | len(bad)]) + bad
                + b"\xa5image\xc4\x01x")

    return {
        "not_msgpack": ("not_msgpack", lambda i, r: b"\xc1" + r.randbytes(r.randrange(0, 64))),
        "truncated_msgpack": ("not_msgpack", truncated_msgpack),
        "not_a_map": ("not_msgpack", lambda i, r: _pack([1, i, b"img"])),
        "invalid_utf8": ("not_msgpack", invalid_utf8),
        "wrong_types": ("schema", lambda i, r: _pack(
            r.choice([{"v": 1, "id": 123, "image": jpeg}, {"v": 1, "id": i, "image": "text"},
                      {"v": 1, "id": i, "image": jpeg, "deadline_ms": "soon"}]))),
        "missing_fields": ("schema", lambda i, r: _pack(
            r.choice([{"v": 1, "id": i}, {"v": 1, "image": jpeg}, {"id": i, "image": jpeg}]))),
        "unknown_v": ("unsupported_version", lambda i, r: _pack(
            {"v": r.choice([0, 3, 4, 99]), "id": i, "image": jpeg})),
        "unknown_field": ("schema", lambda i, r: _pack(
            {"v": 1, "id": i, "image": jpeg, "colour": "red"})),
        "zero_byte_image": ("schema", lambda i, r: _pack({"v": 1, "id": i, "image": b""})),
        "huge_text": ("text_too_long", lambda i, r: encode_job(i, jpeg, text="x" * 30_000)),
        "unknown_policy": ("unknown_policy", lambda i, r: encode_job(i, jpeg, policy="nope")),
        "tombstone": ("schema", lambda i, r: None),
        "oversized_message": ("oversized", lambda i, r: b"\x00" * (70 * 1024)),
        "oversized_image_field": ("schema", lambda i, r: encode_job(i, b"\xff" * (50 * 1024))),
        "truncated_jpeg": ("bad_image", lambda i, r: encode_job(
            i, jpeg[: r.randrange(len(jpeg) // 4, len(jpeg) * 3 // 4)])),
        "garbage_image": ("bad_image", lambda i, r: encode_job(i, r.randbytes(200))),
        "png_bomb": ("bad_image", lambda i, r: encode_job(i, png_bomb())),
        "header_50k_x_50k": ("bad_image", lambda i, r: encode_job(i, header_50k())),
    }


CLASS_WEIGHTS = {"oversized_message": 0.2, "oversized_image_field": 0.2, "huge_text": 0.2,
                 "png_bomb": 0.5}  # the large ones (25-70 KB each), fewer of them


@dataclass(frozen=True)
class BadJob:
    key: str
    value: bytes | None
    klass: str
    reason: str


def malformed_corpus(n: int, seed: int = 6) -> list[BadJob]:
    """``n`` malformed jobs over every class (keys ``bad-<class>-<i>``), shuffled."""
    rng = random.Random(seed)
    jpeg = small_images()[1]
    builders = _class_builders(jpeg)
    weights = {k: CLASS_WEIGHTS.get(k, 1.0) for k in builders}
    total = sum(weights.values())
    counts = {k: max(1, int(n * w / total)) for k, w in weights.items()}
    counts["not_msgpack"] += n - sum(counts.values())
    jobs = []
    for klass, count in counts.items():
        reason, build = builders[klass]
        for j in range(count):
            key = f"bad-{klass}-{j:05d}"
            jobs.append(BadJob(key, build(key, rng), klass, reason))
    rng.shuffle(jobs)
    return jobs
