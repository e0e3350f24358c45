"""Images that cost CPU and memory, not bytes: counts from the headers before decoding, the
decoded-pixel budget shared by the decode threads, the decode time limit
(worker/tasks/moderation/images/budgets.py). The same files through Kafka:
tests/integration/bad_input/test_costly_images.py."""

from __future__ import annotations

import io
import struct
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from tests.unit.tasks.moderation.images.hostile_images import (
    apng,
    empty_scans,
    many_scan_jpeg,
    progressive_jpeg,
)
from tests.unit.tasks.moderation.images.png_support import png_chunk
from worker.config.moderation import ModerationSettings
from worker.exceptions import ImageRejected
from worker.tasks.moderation.images.budgets import (
    DecodeGuard,
    PixelBudget,
    check_time,
    shared_guard,
)
from worker.tasks.moderation.images.cpu import ImageLimits, decode_views, jpeg_plain
from worker.tasks.moderation.images.jpeg_tables import (
    MAX_COUNTED_SEGMENTS,
    MAX_SCANS,
    count_scans,
    too_many_scans,
)
from worker.tasks.moderation.images.png_rows import SIGNATURE, count_frames, short_image_data

# --- JPEG scans, counted from the markers --------------------------------------------------


@pytest.mark.parametrize(("mode", "scans"), [("L", 6), ("RGB", 10), ("CMYK", 18)])
def test_libjpeg_s_progressive_script_is_counted_and_passes(mode: str, scans: int) -> None:
    # libjpeg's jpeg_simple_progression: 6 scans for grey, 10 for YCbCr, 2 + 4 * 4 for CMYK.
    data = progressive_jpeg(64, 48, mode)
    assert count_scans(data) == scans
    assert too_many_scans(data) is None
    assert decode_views(data)


def test_a_baseline_jpeg_has_one_scan() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (1, 2, 3)).save(buf, format="JPEG")
    assert count_scans(buf.getvalue()) == 1


def test_scan_marker_bytes_inside_a_segment_are_not_scans() -> None:
    # An APP segment full of FF DA (a thumbnail's, a maker note's): the fast count sees them,
    # the walk skips the segment and finds the file's own 6 scans.
    data = progressive_jpeg(64, 48)
    app = b"\xff\xe5" + struct.pack(">H", 2 + 2 * 300) + b"\xff\xda" * 300
    data = data[:2] + app + data[2:]
    assert data.count(b"\xff\xda") > MAX_SCANS
    assert count_scans(data) == 6
    assert too_many_scans(data) is None
    assert decode_views(data)


def test_garbage_between_segments_is_skipped_as_libjpeg_skips_it() -> None:
    data = progressive_jpeg(64, 48)
    dht, scan = empty_scans(64, 48)
    hidden = data[:-2] + dht + (b"junk" + scan) * (MAX_SCANS + 5) + b"\xff\xd9"
    assert count_scans(hidden) == MAX_SCANS + 1  # stops counting past the limit


def test_a_flood_of_marker_segments_is_refused_not_walked_for_ever() -> None:
    data = progressive_jpeg(64, 48)
    comments = b"\xff\xfe\x00\x02" * (MAX_COUNTED_SEGMENTS + 1)
    _dht, scan = empty_scans(64, 48)
    flooded = data[:-2] + comments + scan * (MAX_SCANS + 1) + b"\xff\xd9"
    reason = too_many_scans(flooded)
    assert reason is not None and "marker segments" in reason


def test_a_jpeg_of_thousands_of_empty_scans_is_refused_before_decoding() -> None:
    data = many_scan_jpeg(1024, 1024, 3000)
    assert len(data) < 64 * 1024
    assert count_scans(data) == MAX_SCANS + 1
    started = time.perf_counter()
    with pytest.raises(ImageRejected, match=f"over {MAX_SCANS} scans"):
        decode_views(data)
    assert time.perf_counter() - started < 0.5


def test_one_scan_over_the_limit_is_refused_on_both_paths_and_one_under_is_not() -> None:
    base = count_scans(progressive_jpeg(256, 256))
    over = many_scan_jpeg(256, 256, MAX_SCANS - base + 1)
    under = many_scan_jpeg(256, 256, MAX_SCANS - base)
    assert count_scans(over) == MAX_SCANS + 1 and count_scans(under) == MAX_SCANS
    assert decode_views(under)
    with pytest.raises(ImageRejected, match="scans"):
        decode_views(over)
    # The GPU path's plain check must not hand nvJPEG what the CPU refuses.
    assert jpeg_plain(under)
    assert not jpeg_plain(over)


def test_the_gpu_batch_refuses_what_the_cpu_refuses() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch

    good = progressive_jpeg(256, 256)
    over = many_scan_jpeg(256, 256, MAX_SCANS)
    out = torch.zeros((2, 224, 224, 3), dtype=torch.uint8)
    ok, refused = prepare_batch([good, over], out)  # the CPU device stands in for nvJPEG
    assert ok is None
    assert isinstance(refused, ImageRejected) and "scans" in str(refused)


def test_jpegs_the_plain_walk_passed_are_not_searched_for_scans_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The video-frame path: jpeg_plain's walk refuses more than MAX_SCANS scans, so the GPU
    # batch of plain JPEGs skips the byte search (with the GIL held, as long as the other
    # header checks together); a batch not known to be plain still searches each JPEG.
    torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    from worker.tasks.moderation.images import budgets
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch

    searched: list[int] = []

    def counting(data: bytes, most: int = MAX_SCANS) -> str | None:
        searched.append(len(data))
        return too_many_scans(data, most)

    monkeypatch.setattr(budgets, "too_many_scans", counting)
    frames = [progressive_jpeg(256, 256), many_scan_jpeg(256, 256, 20)]
    assert all(jpeg_plain(f) for f in frames)
    out = torch.zeros((2, 224, 224, 3), dtype=torch.uint8)
    assert prepare_batch(frames, out, plain=True) == [None, None]
    assert searched == []
    assert prepare_batch(frames, out) == [None, None]
    assert searched == [len(f) for f in frames]


# --- PNG frames: fcTL chunks, with or without acTL -------------------------------------------


def test_frames_are_counted_from_fctl_chunks_with_or_without_actl() -> None:
    frames = [Image.new("RGB", (8, 6), (i, 0, 0)) for i in range(5)]
    buf = io.BytesIO()
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:], duration=50)
    assert count_frames(buf.getvalue(), 100) == 5  # Pillow's APNG: one fcTL a frame
    assert count_frames(apng(8, 6, 7, actl=False), 100) == 7
    assert count_frames(apng(8, 6, 7, actl=False), 3) == 4  # stops past ``most``
    plain = io.BytesIO()
    frames[0].save(plain, format="PNG")
    assert count_frames(plain.getvalue(), 100) == 0


def test_frames_without_actl_count_against_the_frame_pixel_budget() -> None:
    # Pillow sees one frame; the 80 after it are what a reader that animates may decode.
    data = apng(1000, 1000, 80, actl=False)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 1
    started = time.perf_counter()
    with pytest.raises(ImageRejected, match="80 frame controls"):
        decode_views(data, ImageLimits(max_pixels=10_000_000))
    assert time.perf_counter() - started < 0.5


def test_frames_without_actl_are_not_inflated_by_the_rows_check() -> None:
    # Pillow never decodes the frames of a PNG without acTL: a short one is no reason to
    # refuse it, and inflating them (80 of 80 MB each in the finding) is wasted work.
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 2, 8, 0, 0, 0, 0))
    fctl = png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, 4, 2, 0, 0, 1, 10, 0, 0))
    short = png_chunk(b"fdAT", struct.pack(">I", 1) + zlib.compress(b"\x00\x01"))
    data = (SIGNATURE + ihdr + png_chunk(b"IDAT", zlib.compress(bytes(2 * 5))) + fctl + short
            + png_chunk(b"IEND", b""))
    assert short_image_data(data) is None
    assert len(decode_views(data)) == 1


# --- the decoded-pixel budget ----------------------------------------------------------------


def _guard(pixels: int, seconds: float = 30.0) -> DecodeGuard:
    return DecodeGuard(PixelBudget(pixels), seconds)


def test_an_animation_needing_more_than_the_whole_budget_is_refused_before_decoding() -> None:
    # The finding's third job, scaled down: 8 RGBA frames, each within the size limits, all
    # eight kept as views plus the canvas (9 frames' pixels) over the budget.
    data = apng(500, 400, 8)
    limits = ImageLimits(guard=_guard(9 * 500 * 400 - 1))
    with pytest.raises(ImageRejected, match="over the decode budget"):
        decode_views(data, limits)
    assert len(decode_views(data, ImageLimits(guard=_guard(9 * 500 * 400)))) == 16


def test_the_default_budget_refuses_the_finding_s_animation() -> None:
    data = apng(5000, 4000, 8)
    started = time.perf_counter()
    with pytest.raises(ImageRejected, match="decode budget"):
        decode_views(data)
    assert time.perf_counter() - started < 0.5


def test_holders_never_exceed_the_budget_and_waiters_are_served_in_order() -> None:
    budget = PixelBudget(100)
    rng = np.random.default_rng(3)
    sizes = [int(s) for s in rng.integers(1, 101, 60)]
    over: list[int] = []

    def job(pixels: int) -> None:
        with budget.hold(pixels):
            if budget.held > budget.capacity:
                over.append(budget.held)
            time.sleep(0.002)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(job, sizes))
    assert not over
    assert budget.peak <= 100 and budget.held == 0

    # Jobs that fit together hold at once: a second one does not wait for the first.
    inside, leave = threading.Event(), threading.Event()

    def beside() -> None:
        with budget.hold(60):
            inside.set()
            leave.wait(5)

    with budget.hold(40):
        t = threading.Thread(target=beside)
        t.start()
        assert inside.wait(5) and budget.held == 100
        leave.set()
        t.join(5)
    assert budget.held == 0

    # First come, first served: a small job does not pass a large one waiting for room.
    order: list[str] = []
    first = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with budget.hold(60):
            first.set()
            release.wait(5)

    def waiter(name: str, pixels: int) -> None:
        with budget.hold(pixels):
            order.append(name)

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    first.wait(5)
    for name, pixels in (("large", 80), ("small", 10)):
        threads.append(threading.Thread(target=waiter, args=(name, pixels)))
        threads[-1].start()
        time.sleep(0.05)  # in line in this order
    assert order == []  # the small one would fit beside the holder, but the large one is first
    release.set()
    for t in threads:
        t.join(5)
    assert order == ["large", "small"]


def test_a_job_larger_than_the_budget_is_refused_at_once_not_queued() -> None:
    budget = PixelBudget(100)
    with pytest.raises(ImageRejected, match="over the decode budget of 100"), \
            budget.hold(101):
        pass
    assert budget.held == 0


def test_decodes_wait_for_the_budget_and_never_hold_more_together() -> None:
    # Each image alone takes 60% of the budget: two at once would exceed it, so the pool's
    # threads take turns, and every image is still scored.
    buf = io.BytesIO()
    Image.new("RGB", (600, 500), (10, 200, 30)).save(buf, format="PNG")
    data = buf.getvalue()
    guard = _guard(int(600 * 500 / 0.6))
    limits = ImageLimits(guard=guard)
    with ThreadPoolExecutor(4) as pool:
        views = list(pool.map(lambda _: decode_views(data, limits), range(8)))
    assert all(len(v) == 1 for v in views)
    assert guard.budget.peak == 600 * 500 and guard.budget.held == 0


def test_the_budget_is_released_when_the_decode_fails() -> None:
    guard = _guard(1_000_000)
    truncated = progressive_jpeg(400, 300)[:-200]
    with pytest.raises(ImageRejected):
        decode_views(truncated, ImageLimits(guard=guard))
    assert guard.budget.peak == 400 * 300 and guard.budget.held == 0


# --- the decode time limit -------------------------------------------------------------------


def test_the_time_limit_stops_an_animation_between_frames() -> None:
    data = apng(400, 300, 40)
    started = time.perf_counter()
    assert decode_views(data, ImageLimits(guard=_guard(10_000_000)))
    whole = time.perf_counter() - started
    started = time.perf_counter()
    with pytest.raises(ImageRejected, match=r"decoding took over its 0\.001 s limit"):
        decode_views(data, ImageLimits(guard=_guard(10_000_000, 0.001)))
    assert time.perf_counter() - started < whole / 2


def test_the_time_limit_is_checked_while_pillow_reads_the_image_data() -> None:
    # A still JPEG of many 64 KiB reads: libjpeg comes back for input between them (a JPEG
    # has no rows check before it, so only these reads can see the limit).
    rng = np.random.default_rng(5)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (800, 1000, 3), dtype=np.uint8)).save(
        buf, format="JPEG", quality=95)
    data = buf.getvalue()
    assert len(data) > 10 * 65536
    guard = _guard(10_000_000, 0.002)
    with pytest.raises(ImageRejected, match="limit"):
        decode_views(data, ImageLimits(guard=guard))
    assert guard.budget.held == 0


def test_the_time_limit_applies_only_while_decoding() -> None:
    check_time()  # outside a decode: nothing to check
    guard = _guard(100, 0.0)
    with pytest.raises(ImageRejected, match="limit"), guard.decoding(10):
        time.sleep(0.001)
        check_time()
    check_time()  # the deadline went with the decode
    assert guard.budget.held == 0


# --- configuration ---------------------------------------------------------------------------


def test_settings_and_one_shared_guard_per_setting() -> None:
    m = ModerationSettings()
    assert m.decode_pixel_budget >= 40_000_000  # limits.max_image_pixels' default fits
    assert m.decode_time_limit_s > 0
    with pytest.raises(ValueError, match="decode_pixel_budget"):
        ModerationSettings(decode_pixel_budget=0)
    with pytest.raises(ValueError, match="decode_time_limit_s"):
        ModerationSettings(decode_time_limit_s=0)
    a = shared_guard(m.decode_pixel_budget, m.decode_time_limit_s)
    assert shared_guard(m.decode_pixel_budget, m.decode_time_limit_s) is a
    assert shared_guard(m.decode_pixel_budget + 1, m.decode_time_limit_s) is not a
