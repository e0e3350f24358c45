"""Does waiting on a CUDA event hold the GIL? A thread waits for a ~1 s kernel through
engines.cudart.Event.synchronize (cuda-bindings) and, for comparison, torch's Event; the main
thread counts Python loop iterations meanwhile. A wait that holds the GIL starves the count.

python bench/gil_probe.py   (GPU machine)
"""

from __future__ import annotations

import json
import threading
import time


def main() -> None:
    import torch

    from engines.cudart import Event

    torch.cuda.init()
    stream = torch.cuda.Stream()

    def count_while(wait: object) -> float:
        done = threading.Event()

        def waiter() -> None:
            wait()  # type: ignore[operator]
            done.set()

        t = threading.Thread(target=waiter)
        n, t0 = 0, time.perf_counter()
        t.start()
        while not done.is_set():
            n += 1
        t.join()
        return n / (time.perf_counter() - t0)

    def kernel() -> None:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)  # ~1 s at H200 clocks

    out = {}
    kernel()
    ours = Event()
    ours.record_on(stream.cuda_stream)
    out["cudart_event_sync_iters_per_s"] = count_while(ours.synchronize)
    kernel()
    theirs = torch.cuda.Event()
    theirs.record(stream)
    out["torch_event_sync_iters_per_s"] = count_while(theirs.synchronize)
    out["idle_iters_per_s"] = count_while(lambda: time.sleep(1.0))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
