"""The DALI stage's feed: batches of encoded frames that cycle through the corpus."""

from __future__ import annotations

from bench.moderation.dali_stage import batches


def test_batches_cycle_through_every_frame_in_order() -> None:
    frames = [bytes([k]) * (k + 1) for k in range(5)]
    feed = batches(frames, 3)
    got = [[a.tobytes() for a in next(feed)] for _ in range(4)]
    assert got == [[frames[0], frames[1], frames[2]], [frames[3], frames[4], frames[0]],
                   [frames[1], frames[2], frames[3]], [frames[4], frames[0], frames[1]]]


def test_a_batch_larger_than_the_corpus_repeats_frames() -> None:
    frames = [b"a", b"b"]
    assert [a.tobytes() for a in next(batches(frames, 5))] == [b"a", b"b", b"a", b"b", b"a"]
