"""jpeg_plain sends a JPEG to nvJPEG only when libjpeg (the CPU path) would accept its tables
and scan headers, so the GPU and CPU paths accept and reject the same files."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.harness.conformance_inputs import mutated_jpegs, synthetic_photo
from worker.exceptions import JobRejected
from worker.tasks.moderation.images.cpu import (
    ImageLimits,
    check_dimensions,
    decode_views,
    jpeg_components,
    jpeg_dimensions,
    jpeg_plain,
)
from worker.tasks.moderation.images.jpeg_tables import tables_sound


def _jpeg(img: Image.Image | None = None, **kw: object) -> bytes:
    buf = io.BytesIO()
    (img or synthetic_photo()).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _cpu_accepts(data: bytes) -> bool:
    try:
        decode_views(data)
    except JobRejected:
        return False
    return True


def _judged_apart(data: bytes) -> bool:
    """Whether the CPU path refuses a file the GPU path would score: plain (nvJPEG) and within
    the size limits the GPU path checks before decoding."""
    if not jpeg_plain(data) or _cpu_accepts(data):
        return False
    dims = jpeg_dimensions(data)
    assert dims is not None
    try:
        check_dimensions(*dims, ImageLimits())
    except JobRejected:
        return False
    return True


@pytest.mark.parametrize("kw", [{}, {"progressive": True}, {"optimize": True},
                                {"subsampling": 0}, {"subsampling": 1},
                                {"progressive": True, "optimize": True}],
                         ids=lambda kw: ",".join(kw) or "baseline")
def test_ordinary_jpegs_stay_plain(kw: dict[str, object]) -> None:
    data = _jpeg(**kw)
    assert tables_sound(data) and jpeg_plain(data)


def test_grey_and_restart_interval_jpegs_stay_plain() -> None:
    assert jpeg_plain(_jpeg(synthetic_photo().convert("L")))
    with_dri = _jpeg()
    sof = with_dri.find(b"\xff\xc0")
    with_dri = with_dri[:sof] + b"\xff\xdd\x00\x04\x00\x00" + with_dri[sof:]  # interval 0
    assert _cpu_accepts(with_dri) and jpeg_plain(with_dri)


def _dht(data: bytes) -> int:
    """Position of the first DHT's first table (its class/index byte)."""
    return data.find(b"\xff\xc4") + 4


def test_a_dc_symbol_over_15_is_not_plain() -> None:
    # What nvJPEG decoded on an H200 and libjpeg refuses ("Bogus Huffman table definition").
    data = bytearray(_jpeg())
    at = _dht(bytes(data))
    assert data[at] == 0x00  # DC table 0
    data[at + 17] = 108  # its first symbol
    assert not _cpu_accepts(bytes(data))
    assert not jpeg_plain(bytes(data))


def test_an_overfull_huffman_code_is_not_plain() -> None:
    data = bytearray(_jpeg())
    at = _dht(bytes(data))
    data[at + 1] = 2  # two codes of length 1: every 1-bit code used, which libjpeg refuses
    assert not _cpu_accepts(bytes(data))
    assert not tables_sound(bytes(data))


def test_a_frame_naming_an_undefined_quantisation_table_is_not_plain() -> None:
    data = bytearray(_jpeg())
    sof = data.find(b"\xff\xc0")
    data[sof + 12] = 3  # the first component's quantisation table: 3 is never defined
    assert not _cpu_accepts(bytes(data))
    assert not jpeg_plain(bytes(data))


def test_an_unknown_marker_is_not_plain() -> None:
    data = bytearray(_jpeg())
    data[3] = 0xAB  # the APP0 marker becomes one Pillow's parser does not know
    assert not _cpu_accepts(bytes(data))
    assert not jpeg_plain(bytes(data))


def test_a_scan_naming_an_unknown_component_is_not_plain() -> None:
    data = bytearray(_jpeg())
    sos = data.find(b"\xff\xda")
    data[sos + 5] = 9  # the scan's first component id
    assert not tables_sound(bytes(data))


def test_no_file_the_cpu_decoder_refuses_counts_as_plain() -> None:
    # Over 300 complete JPEGs with bytes changed, every one the CPU path refuses either goes
    # to the CPU decoder on the GPU path too (not plain) or fails the size limits the GPU path
    # checks before decoding. On the old jpeg_plain (walk to the frame header only) 79 of the
    # 82 refused counted as plain; nvJPEG decoded two of the 14 such files in the GPU test.
    cases = mutated_jpegs(300, seed=7)
    slipped = [name for name, data in cases.items() if _judged_apart(data)]
    assert not slipped
    assert sum(not _cpu_accepts(d) for d in cases.values()) > 60  # the corpus has refusals


def test_an_adobe_segment_is_not_plain() -> None:
    # Pillow writes one for CMYK; in a 3-component file it can declare RGB rather than YCbCr
    # (libjpeg then skips the colour conversion), so the CPU decoder judges such files.
    data = _jpeg()
    adobe = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
    data = data[:2] + adobe + data[2:]
    assert _cpu_accepts(data) and jpeg_components(data) == 3
    assert not jpeg_plain(data)


def test_a_second_scan_of_a_baseline_image_is_not_plain() -> None:
    # libjpeg stops at a scan after a sequential image's last one (the CPU path dead-letters
    # the file); nvJPEG may decode it. The walk to the end of the image saw it as sound.
    data = _jpeg()
    sos = data.find(b"\xff\xda")
    twice = data[:-2] + data[sos:-2] + data[-2:]  # the scan, header and data, once more
    assert not _cpu_accepts(twice)
    assert jpeg_plain(data) and not jpeg_plain(twice)


def test_an_end_of_image_before_any_scan_is_not_plain() -> None:
    # Found by fuzzing: a changed byte made an end-of-image marker right after the tables, so
    # the walk stopped there and the file counted as plain; libjpeg finds no image in it.
    data = _jpeg(progressive=True)
    sos = data.find(b"\xff\xda")
    early = data[:sos] + b"\xff\xd9" + data[sos:]
    assert not _cpu_accepts(early)
    assert not jpeg_plain(early)


def test_a_second_start_of_image_is_not_plain() -> None:
    # Found by fuzzing: the APP0 marker changed into a start-of-image marker was walked as a
    # segment of unknown kind; libjpeg refuses a second one.
    data = bytearray(_jpeg())
    data[3] = 0xD8
    assert not _cpu_accepts(bytes(data))
    assert not jpeg_plain(bytes(data))


def _fuzzed(n: int, seed: int) -> list[bytes]:
    """Baseline, progressive, optimised, 4:4:4 and grey JPEGs with 1-4 bytes changed, cut or
    inserted, mostly near a marker (where the tables and headers are)."""
    import random
    import re

    grey = io.BytesIO()
    synthetic_photo().convert("L").save(grey, "JPEG")  # Pillow's default quality
    bases = [_jpeg(**kw) for kw in ({}, {"progressive": True}, {"optimize": True},
                                    {"subsampling": 0})] + [grey.getvalue()]
    heads = {b: [m.start() for m in re.finditer(rb"\xff[\xc0-\xfe]", b)] for b in bases}
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        base = rnd.choice(bases)
        data = bytearray(base)
        for _ in range(rnd.randint(1, 4)):
            op = rnd.random()
            at = min(len(data) - 3, rnd.choice(heads[base]) + rnd.randrange(20)) \
                if rnd.random() < 0.7 else rnd.randrange(2, len(data) - 2)
            if op < 0.7:
                data[at] = rnd.randrange(256)
            elif op < 0.85:
                del data[at:at + rnd.randint(1, 8)]
            else:
                data[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        out.append(bytes(data))
    return out


def test_fuzzed_jpegs_the_cpu_refuses_never_count_as_plain() -> None:
    # The fuzzing that found the second start-of-image case: this seed's 12,000 files hold
    # it (so this test fails on the check before that fix); 24,000 more passed after it.
    fuzzed = _fuzzed(12_000, seed=4)
    slipped = [data[:400].hex() for data in fuzzed if _judged_apart(data)]
    assert not slipped
    assert sum(map(jpeg_plain, fuzzed)) > 2000  # the sample keeps files both paths decode


def test_a_walk_resumed_after_a_known_header_judges_like_a_fresh_one() -> None:
    # Frames from one encoder share their bytes up to the first scan; the walk resumes there
    # from the state a file with the same prefix left (most fuzzed files keep their base's).
    from worker.tasks.moderation.images import jpeg_tables

    fuzzed = _fuzzed(3_000, seed=7)
    fresh = []
    for data in fuzzed:
        jpeg_tables._RESUME_AT.clear()
        fresh.append(tables_sound(data))
    jpeg_tables._RESUME_AT.clear()
    resumed = [tables_sound(data) for data in fuzzed]
    assert jpeg_tables._RESUME_AT  # the second pass had states to resume from
    assert resumed == fresh
    assert 500 < sum(fresh) < len(fuzzed)


def test_the_numpy_searches_for_large_files_find_what_the_byte_searches_find() -> None:
    """Files from 32 KB on are searched with numpy; the answers must be the regex's and
    bytes.count's, including markers at the very end and runs of fill bytes."""
    import random

    import numpy as np

    from worker.tasks.moderation.images.jpeg_tables import (
        _NEXT_MARKER,
        _count_sos,
        _marker_positions,
    )

    rng = random.Random(7)
    for _ in range(60):
        n = rng.randrange(33_000, 70_000)
        data = bytes(rng.choice((0xFF, 0xDA, 0x00, 0xD3, 0xD9, rng.randrange(256)))
                     for _ in range(n))
        assert _count_sos(data) == data.count(b"\xff\xda")
        ends = _marker_positions(data)
        for start in (0, 1, n // 3, n - 3, n - 2, n - 1):
            k = int(np.searchsorted(ends, start))
            found = _NEXT_MARKER.search(data, start)
            assert (int(ends[k]) if k < len(ends) else None) == (
                found.start() if found else None)
