"""Is a JPEG's coding structure one the CPU decoder (libjpeg, under Pillow) accepts?

The GPU path hands "plain" JPEGs to nvJPEG and everything else to the CPU decoder, so both
paths accept and reject the same images only if nothing the CPU decoder refuses counts as plain.
libjpeg checks the tables and scan headers when a scan starts and refuses the whole image where
one is unsound; nvJPEG checks less. On an H200 nvJPEG decoded baseline JPEGs whose
DC Huffman table held a symbol over 15, which libjpeg refuses ("broken data stream"); those
images were scored on the GPU path and dead-lettered on the CPU path.

:func:`tables_sound` walks every marker segment from the start to the end of the image,
skipping entropy-coded data, and answers False on anything libjpeg refuses there or that it
does not recognise as ordinary: quantisation and Huffman tables with a wrong index, count or
length, a DC table with a symbol over 11 (8-bit data never needs more), a Huffman code that
overflows its lengths, a scan naming a component, a table or parameters the frame does not
support, a frame that is not 8-bit Huffman (baseline, extended or progressive) with 1 or 3
components and sampling factors 1-4, a sequential frame whose components are not each coded
by exactly one scan (or an image with no scan at all), any marker outside the ones a plain
JPEG has (a second start-of-image, DNL, extensions, markers Pillow's parser does not know),
and an Adobe segment (which can declare three components RGB rather than YCbCr). False only
sends the image to the CPU decoder, which then judges it, so this check errs towards False.
Written here rather than taken from a library: no maintained Python package validates JPEG
tables without decoding the pixels, which is the cost this check exists to avoid (13 us for a
16 KB baseline JPEG, 36 us progressive, on the 2-core VM; the search over the entropy-coded
data is 5-7 us of it). A file whose bytes up to its first scan repeat an earlier file's (frames
of one encoder) resumes the walk there: 8-9 us for the same JPEG.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

# Huffman-coded frames nvJPEG and libjpeg both decode: baseline, extended, progressive.
HUFFMAN_FRAMES = frozenset({0xC0, 0xC1, 0xC2})
# Segments (and fill bytes) walked at most: real files have a few dozen (APPn, DQT, DHT, ...);
# a record of millions of tiny segments would otherwise hold a thread for seconds. Past it the
# file is not "plain" and Pillow judges it. (cpu._segments' header walk has the same bound.)
MAX_SEGMENTS = 1024
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # after entropy-coded data
# From this size on the byte searches run in numpy: bytes.count and a regex go through an HD
# frame (235 KB) at ~1.4 and ~3.5 GB/s, numpy's comparisons at several times that (the two
# searches took 235 us of a 1080p frame's CPU work on the GPU path on the 2-core VM, ~60 us
# after). Below it their set-up costs more than it saves.
_NUMPY_FROM = 32 * 1024
# Scans a JPEG may have, counted from its markers before it is decoded. Each scan of a
# progressive JPEG is a pass over every block of the components it codes, however few bytes it
# takes: 3,000 scans that code nothing (end-of-band runs) made a 357 KB 6000x6000 grey JPEG
# hold a decode thread 5.8 s on the 2-core VM. Real encoders write few: libjpeg-turbo's
# progressive script (what Pillow's progressive=True and cjpeg -progressive write) has 6 scans
# for grey, 10 for YCbCr and 18 for CMYK, hand-tuned scripts (jpegtran -scans, mozjpeg's scan
# search) a few dozen at most, and a sequential JPEG one per component. 100 is over five times
# the largest standard script; 100 empty scans of a 40M-pixel image cost about 0.2 s.
MAX_SCANS = 100
# Marker segments the exact count walks (restart markers and fill bytes are not segments): real
# files have dozens (APPn, tables, a DHT per scan), a few hundred with an ICC profile split
# over APP2 segments. More is refused: the walk is a Python loop, a flood of tiny segments
# would hold the thread for seconds.
MAX_COUNTED_SEGMENTS = 10_000
_MARKER = re.compile(rb"\xff+([^\x00\xd0-\xd7\xff])")  # a marker, its fill bytes skipped
# Markers a plain JPEG may have between its start and end: frames and tables (0xC0-0xCF),
# scans, restart intervals, APPn, comments.
_KNOWN = frozenset([*range(0xC0, 0xD0), 0xD9, 0xDA, 0xDB, 0xDD, *range(0xE0, 0xF0), 0xFE])


# Frames from one encoder (a video's, a camera's) repeat the same bytes up to their first scan.
# The walk's state after that scan's header is kept per distinct prefix (its exact bytes), so
# such a frame's walk starts at its scan data: the state at a position depends only on the
# bytes before it. Bounded: prefixes up to 4 KB (a camera's EXIF block differs per photo
# anyway), 256 of them, then the table starts again.
_RESUME_AT: dict[bytes, dict[str, Any]] = {}
_RESUME_ENTRIES, _RESUME_BYTES = 256, 4096


class _Unsound(Exception):
    """Internal: the walk stops; the image is not plain."""


def _count_sos(data: bytes) -> int:
    """How often the bytes of a start-of-scan marker (FF DA) occur in ``data``."""
    if len(data) < _NUMPY_FROM:
        return data.count(b"\xff\xda")
    a = np.frombuffer(data, np.uint8)
    at = np.flatnonzero(a[1:] == 0xDA)  # where a DA follows: is the byte before it FF?
    return int(np.count_nonzero(a[at] == 0xFF))


def _marker_positions(data: bytes) -> Any:
    """Every position where ``_NEXT_MARKER`` could match, ascending (numpy int64)."""
    a = np.frombuffer(data, np.uint8)
    ff = np.flatnonzero(a[:-1] == 0xFF)
    nxt = a[ff + 1]
    return ff[(nxt != 0x00) & (nxt != 0xFF) & ((nxt < 0xD0) | (nxt > 0xD7))]


def count_scans(data: bytes, most: int = MAX_SCANS) -> int:
    """The start-of-scan markers libjpeg reads in ``data`` up to its end-of-image (or a second
    start-of-image, where libjpeg stops), counted up to ``most`` + 1. Bytes between segments
    that are not a marker are skipped to the next marker, as libjpeg skips them (with a
    warning), and so is each scan's entropy-coded data. Raises ValueError past
    :data:`MAX_COUNTED_SEGMENTS` segments; 0 for data that does not start a JPEG."""
    if data[:2] != b"\xff\xd8":
        return 0
    i, scans, segments, n = 2, 0, 0, len(data)
    while scans <= most:
        found = _MARKER.search(data, i)
        if found is None:
            break
        marker, i = found.group(1)[0], found.end()
        if marker in (0xD8, 0xD9):
            break
        segments += 1
        if segments > MAX_COUNTED_SEGMENTS:
            raise ValueError(f"JPEG with over {MAX_COUNTED_SEGMENTS} marker segments")
        if marker == 0x01:  # TEM: no length
            continue
        if i + 2 > n:
            break
        scans += marker == 0xDA
        i += (data[i] << 8) | data[i + 1]
    return scans


def too_many_scans(data: bytes, most: int = MAX_SCANS) -> str | None:
    """A one-line reason when the JPEG has more than ``most`` scans (:func:`count_scans`), else
    None. The bytes of a start-of-scan marker occurring at most ``most`` times anywhere is
    answer enough (a search at memory speed: 3-7 ms for a 10 MB photo); only more are walked."""
    if _count_sos(data) <= most:
        return None
    try:
        scans = count_scans(data, most)
    except ValueError as exc:
        return str(exc)
    if scans > most:
        return f"JPEG with over {most} scans (each a pass over the whole image)"
    return None


@dataclass(frozen=True, slots=True)
class SoundLayout:
    """What the GPU path still asks of a JPEG whose structure libjpeg accepts, found on the
    same walk."""

    exif: tuple[bytes, ...]  # the TIFF blocks of the APP1 "Exif" segments before the frame


def sound_layout(data: bytes) -> SoundLayout | None:
    """The layout when every table, frame and scan header from the start-of-image to the
    end-of-image marker is one libjpeg accepts (see the module's note), else None."""
    walk = _Walk(data)
    try:
        walk.run()
    except _Unsound:
        return None
    return SoundLayout(tuple(walk.exif))


def tables_sound(data: bytes) -> bool:
    """Whether libjpeg accepts every table, frame and scan header (:func:`sound_layout`)."""
    return sound_layout(data) is not None


class _Walk:
    def __init__(self, data: bytes) -> None:
        self.data = data
        # Frozen sets (``|=`` makes a new one), so a remembered state is never changed by a
        # later walk that resumed from it.
        self.quant: frozenset[int] = frozenset()
        self.huff: frozenset[tuple[int, int]] = frozenset()  # (class 0 DC / 1 AC, index)
        self.components: dict[int, int] = {}  # component id -> quantisation table
        self.blocks = 0  # blocks per MCU of an interleaved scan
        self.frame = 0
        self.scanned: frozenset[int] = frozenset()  # components some scan has coded
        self.scans = 0  # over MAX_SCANS: the CPU path refuses it, so it is not plain
        self.exif: list[bytes] = []
        self._ends: Any = None  # _marker_positions(data), found once per walk of a large file

    def _resume(self) -> int:
        """Where the walk starts: after the first scan header where a file with the same bytes
        up to there was walked before (its state restored), else after the start-of-image."""
        data = self.data
        j = data.find(b"\xff\xda", 2)  # the first scan header, or bytes inside a segment
        if j < 0 or j + 4 > len(data):
            return 2
        end = j + 2 + ((data[j + 2] << 8) | data[j + 3])
        state = _RESUME_AT.get(data[:end]) if end <= _RESUME_BYTES else None
        if state is None:
            return 2
        vars(self).update(state)
        return self._scan_end(end)

    def _remember(self, prefix: bytes) -> None:
        """Keep the state after the first scan header. Shared, not copied: the sets are frozen,
        and the components and EXIF blocks are complete once a frame exists (a second frame is
        refused before it changes them; EXIF is only read before the frame)."""
        if len(prefix) > _RESUME_BYTES:
            return
        if len(_RESUME_AT) >= _RESUME_ENTRIES:
            _RESUME_AT.clear()  # one call: safe beside other threads walking
        _RESUME_AT[prefix] = {k: v for k, v in vars(self).items()
                              if k not in ("data", "_ends")}  # this file's own

    def _scan_end(self, start: int) -> int:
        """The next marker after a scan's entropy-coded data (restart markers are part of it)."""
        if len(self.data) < _NUMPY_FROM:
            nxt = _NEXT_MARKER.search(self.data, start)
            if nxt is None:
                raise _Unsound
            return nxt.start()
        if self._ends is None:
            self._ends = _marker_positions(self.data)
        k = int(np.searchsorted(self._ends, start))
        if k == len(self._ends):
            raise _Unsound
        return int(self._ends[k])

    def run(self) -> None:
        data = self.data
        if data[:2] != b"\xff\xd8":
            raise _Unsound
        i, seen = self._resume(), 0
        while True:
            seen += 1
            if seen > MAX_SEGMENTS or i + 2 > len(data) or data[i] != 0xFF:
                raise _Unsound
            marker = data[i + 1]
            if marker == 0xFF:
                i += 1
                continue
            if marker == 0xD9:  # end of image: it must have one (libjpeg: "no image"), and
                # every component of a sequential frame coded
                if not self.scanned or (self.frame != 0xC2
                                        and self.scanned != self.components.keys()):
                    raise _Unsound
                return
            if marker not in _KNOWN:
                # A second start-of-image, a restart marker outside scan data, DNL,
                # hierarchical frames, JPEG extensions, markers Pillow's parser does not
                # know ("not a JPEG"): libjpeg refuses or treats them apart, nvJPEG may not.
                raise _Unsound
            if i + 4 > len(data):
                raise _Unsound
            length = (data[i + 2] << 8) | data[i + 3]
            if length < 2 or i + 2 + length > len(data):
                raise _Unsound
            if 0xE0 <= marker <= 0xEF or marker == 0xFE:  # APPn, COM: skipped unread, but
                # an Adobe segment can say three components are RGB, not YCbCr: libjpeg then
                # skips the colour conversion, nvJPEG may not.
                if marker == 0xEE and data[i + 4:i + 9] == b"Adobe":
                    raise _Unsound
                if marker == 0xE1 and not self.frame and data[i + 4:i + 10] == b"Exif\x00\x00":
                    self.exif.append(data[i + 10:i + 2 + length])
                i += 2 + length
                continue
            body = data[i + 4:i + 2 + length]
            if marker == 0xDB:
                self.quant |= _quant_tables(body)
            elif marker == 0xC4:
                self.huff |= _huffman_tables(body)
            elif 0xC0 <= marker <= 0xCF:  # a frame (0xC4 DHT, handled above), DAC, JPG
                self._sof(marker, body)
            elif marker == 0xDA:
                first = not self.scanned
                self._sos(body)
                if first:
                    self._remember(data[:i + 2 + length])
                i = self._scan_end(i + 2 + length)
                continue
            elif marker == 0xDD and length != 4:  # restart interval
                raise _Unsound
            i += 2 + length

    def _sof(self, marker: int, body: bytes) -> None:
        if self.frame or marker not in HUFFMAN_FRAMES or len(body) < 6:
            raise _Unsound
        precision, height, width = body[0], body[1:3], body[3:5]
        n = body[5]
        if precision != 8 or height == b"\0\0" or width == b"\0\0" or n not in (1, 3) \
                or len(body) != 6 + 3 * n:
            raise _Unsound
        for c in range(n):
            cid, sampling, table = body[6 + 3 * c:9 + 3 * c]
            h, v = sampling >> 4, sampling & 15
            if not (1 <= h <= 4 and 1 <= v <= 4) or table > 3 or table not in self.quant \
                    or cid in self.components:
                raise _Unsound
            self.components[cid] = table
            self.blocks += h * v
        self.frame = marker

    def _sos(self, body: bytes) -> None:
        if not self.frame or not body:
            raise _Unsound
        n = body[0]
        if not 1 <= n <= len(self.components) or len(body) != 4 + 2 * n:
            raise _Unsound
        ids: set[int] = set()
        needed: list[tuple[int, int]] = []
        for c in range(n):
            cid, tables = body[1 + 2 * c:3 + 2 * c]
            # A sequential frame codes each component in exactly one scan: libjpeg stops at a
            # scan after the last one ("Didn't expect more than one scan").
            if cid not in self.components or cid in ids or \
                    (self.frame != 0xC2 and cid in self.scanned):
                raise _Unsound
            ids.add(cid)
            needed.append((tables >> 4, tables & 15))
        ss, se, approx = body[1 + 2 * n:4 + 2 * n]
        # The tables the scan decodes with (a progressive scan: DC or AC, refinements of DC
        # none) must be defined: libjpeg would fill in default tables, nvJPEG may not.
        for dc, ac in needed:
            if (self.frame != 0xC2 or (ss == 0 and approx >> 4 == 0)) \
                    and (0, dc) not in self.huff:
                raise _Unsound
            if (self.frame != 0xC2 or ss > 0) and (1, ac) not in self.huff:
                raise _Unsound
        if self.frame != 0xC2 and (ss, se, approx) != (0, 63, 0):
            raise _Unsound
        ah, al = approx >> 4, approx & 15  # successive approximation: libjpeg's limits
        if self.frame == 0xC2 and (ss > se or se > 63 or (ss == 0 and se != 0)
                                   or (ss and n != 1) or (ah and al != ah - 1) or al > 13):
            raise _Unsound
        if n > 1 and self.blocks > 10:  # libjpeg's D_MAX_BLOCKS_IN_MCU
            raise _Unsound
        self.scans += 1
        if self.scans > MAX_SCANS:
            raise _Unsound
        self.scanned |= ids


# Files from one encoder repeat the same table segments: each distinct one is checked once.
@lru_cache(maxsize=512)
def _quant_tables(body: bytes) -> frozenset[int]:
    """The indices a DQT segment defines."""
    k, defined = 0, set()
    while k < len(body):
        precision, index = body[k] >> 4, body[k] & 15
        size = 64 * (1 + precision)
        # 16-bit tables (precision 1) are legal but unusual for 8-bit data: the CPU judges.
        if precision > 0 or index > 3 or k + 1 + size > len(body):
            raise _Unsound
        k += 1 + size
        defined.add(index)
    return frozenset(defined)


@lru_cache(maxsize=512)
def _huffman_tables(body: bytes) -> frozenset[tuple[int, int]]:
    """The (class, index) pairs a DHT segment defines (class 0 DC, 1 AC)."""
    k, defined = 0, set()
    while k < len(body):
        kind, index = body[k] >> 4, body[k] & 15
        counts = body[k + 1:k + 17]
        if kind > 1 or index > 3 or len(counts) != 16:
            raise _Unsound
        total = sum(counts)
        symbols = body[k + 17:k + 17 + total]
        if total == 0 or total > 256 or len(symbols) != total:
            raise _Unsound
        if kind == 0 and max(symbols) > 11:
            raise _Unsound
        _codes_fit(counts)
        k += 17 + total
        defined.add((kind, index))
    return frozenset(defined)


def _codes_fit(counts: bytes) -> None:
    """libjpeg's canonical code assignment: after the codes of each length, the next code must
    still fit in that many bits (an over-full table is refused: "Bogus Huffman table")."""
    code, started = 0, False
    for bits, count in enumerate(counts, start=1):
        started = started or count > 0
        if not started:
            continue
        code += count
        if code >= 1 << bits:
            raise _Unsound
        code <<= 1
