"""DecodeRouter: the CPU takes a batch only while the GPU decoder is busy, up to its limit."""

from __future__ import annotations

import threading

from worker.tasks.moderation.images.router import DecodeRouter


def test_a_lone_batch_stays_on_the_gpu() -> None:
    router = DecodeRouter(cpu_batches=2)
    for _ in range(3):
        with router.route() as decoder:
            assert decoder == "gpu"
    assert router.batches == {"gpu": 3, "cpu": 0}


def test_overflow_goes_to_the_cpu_up_to_its_limit() -> None:
    router = DecodeRouter(cpu_batches=2)
    with router.route() as first, router.route() as second, router.route() as third, \
            router.route() as fourth:
        assert (first, second, third, fourth) == ("gpu", "cpu", "cpu", "gpu")
    # Everything released: the next batch finds the GPU decoder free again.
    with router.route() as decoder:
        assert decoder == "gpu"
    assert router.batches == {"gpu": 3, "cpu": 2}


def test_zero_keeps_every_batch_on_the_gpu() -> None:
    router = DecodeRouter(cpu_batches=0)
    with router.route() as a, router.route() as b:
        assert (a, b) == ("gpu", "gpu")


def test_a_failed_batch_gives_its_decoder_back() -> None:
    router = DecodeRouter(cpu_batches=1)
    with router.route():
        try:
            with router.route() as decoder:
                assert decoder == "cpu"
                raise ValueError("bad batch")
        except ValueError:
            pass
        with router.route() as decoder:  # the CPU's place is free again
            assert decoder == "cpu"


def test_threads_never_exceed_the_cpu_limit() -> None:
    router = DecodeRouter(cpu_batches=2)
    lock = threading.Lock()
    on_cpu = peak = 0
    gate = threading.Barrier(8)

    def batch() -> None:
        nonlocal on_cpu, peak
        gate.wait()
        for _ in range(200):
            with router.route() as decoder:
                if decoder == "cpu":
                    with lock:
                        on_cpu += 1
                        peak = max(peak, on_cpu)
                    with lock:
                        on_cpu -= 1

    threads = [threading.Thread(target=batch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak <= 2
    assert sum(router.batches.values()) == 1600
