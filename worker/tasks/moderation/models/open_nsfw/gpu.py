"""open_nsfw on the GPU pipeline: decoded pixels go into pipeline slots, not Python arrays.

CPU preprocessing decodes straight into the slot's pinned host rows (one pool task per image);
GPU preprocessing decodes with nvJPEG into the slot's device rows on a per-thread stream. Either
way the slot then runs H2D (CPU path only), the captured graph and D2H on the pipeline's
streams, while other batch threads prepare the next slots. Bad images are answered as
rejections; their rows are left as they were and their outputs ignored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import structlog

from engines.backends.base import Runner
from engines.backends.torch.pipeline import TorchPipeline
from engines.backends.torch.runner import TorchRunner
from engines.cudart import Event
from engines.exceptions import RunnerStateError
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec
from worker.config import WorkerConfig
from worker.exceptions import ConfigError, JobRejected, one_line
from worker.tasks.batcher import Batch
from worker.tasks.moderation.images.cpu import decode_image, jpeg_plain
from worker.tasks.moderation.models.base import Finished
from worker.tasks.moderation.models.open_nsfw.model import OpenNsfwModel
from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels
from worker.tasks.moderation.parts import Part
from worker.tasks.moderation.results import no_image

log = structlog.get_logger("worker")

DECODER_ATTEMPTS = 3  # nvJPEG's warm-up, when the GPU is out of memory
DECODER_JOIN_S = 30.0


class OpenNsfwGpuModel(OpenNsfwModel):
    """``runner``: a pipelined backend's (:meth:`OpenNsfwModel.create` picks this model by its
    backend's registry record, ``pipelined``: torch); its captured graphs are what the pipeline
    runs."""

    def __init__(self, cfg: WorkerConfig, runner: Runner, spec: EngineSpec,
                 profiles: tuple[Profile, ...], *, own_runner: bool = False) -> None:
        super().__init__(cfg, runner, spec, profiles, own_runner=own_runner)
        torch_runner = cast(TorchRunner, runner)
        sizes = sorted({b for p in profiles if isinstance(p, StaticProfile)
                        for b in p.batch_sizes})
        if not sizes:
            raise ConfigError("the GPU pipeline needs static profiles (batch sizes)")
        self.pipeline = TorchPipeline(torch_runner, tuple(sizes),
                                      slots=cfg.batch.max_in_flight_batches + 1,
                                      pixels=True, overlap=cfg.model.pipeline_overlap)
        self._gpu_decode = cfg.model.preprocess == "gpu"
        # Set once nvJPEG has decoded its first image (see warm_up); until then, and for good
        # if it cannot start, batches are prepared on the CPU.
        self._decoder_ready = threading.Event()
        self._decoder_warming: threading.Thread | None = None
        self._closing = threading.Event()  # ends the decoder's retries
        self._local = threading.local()
        self._warm = False
        # The runner's own graphs serve only images the pipeline does not take (PNG, WebP,
        # rotated or CMYK JPEGs): a graph for the smallest batch size only; larger batches of
        # such images run eagerly. Graphs for every size cost ~1 s of a cached start on the
        # H200, and capturing them on demand would stall the batches in flight (a capture
        # synchronises the device). A runner shared with the caller is left as it is.
        self._smallest = sizes[0]
        if own_runner:
            torch_runner.graph_batches = frozenset({self._smallest})

    def _streams_made(self, ignored: str) -> bool:
        """Whether the pipeline's streams exist already, too late for a setting of where or
        how they run: a performance preference, so a warning (``ignored``), never a stop."""
        if self.pipeline.h2d is None:
            return False
        log.warning(ignored, reason="the pipeline's streams exist already")
        return True

    def prefer_gpu(self) -> None:
        if not self._streams_made("gpu_priority_ignored"):
            self.pipeline.urgent = True

    def use_free_sms(self, sms: int) -> bool:
        if self._streams_made("gpu_free_sms_ignored"):
            return False
        try:
            # Its own graphs (the images the pipeline does not take) go there too; a runner
            # shared with the caller and active already stays where it is.
            self.runner.use_free_sms(sms)
        except RunnerStateError:
            log.warning("gpu_free_sms_ignored", model=self.name,
                        reason="its plain runner is active already; the pipeline keeps to them")
        self.pipeline.on_free_sms = sms
        return True

    def warm_up(self, profiles: tuple[Profile, ...] | None = None) -> None:
        # Each step's seconds go to the log: the warm start's budget is spent here.
        steps: dict[str, float] = {}
        t = time.monotonic()

        def lap(name: str) -> None:
            nonlocal t
            steps[name] = round(time.monotonic() - t, 3)
            t = time.monotonic()

        self.runner.activate()
        lap("runner")
        self.pipeline.activate()
        lap("pipeline")
        if profiles is None:
            # The plain runner path at its smallest batch (its one graph, see __init__): cuDNN
            # and the allocator warm.
            profiles = tuple(StaticProfile(p.name, p.item_shape, (self._smallest,))
                             if isinstance(p, StaticProfile) else p for p in self._profiles)
        super().warm_up(profiles)
        lap("plain_batches")
        if self._gpu_decode and self._decoder_warming is None:
            # nvJPEG's first decode (its handles, the decode and resize kernels) took 0.66-0.69 s
            # of a 3.8 s cached start on the H200. A thread pays for it while the
            # worker joins its group and serves: until it is done the pipeline's rows are
            # decoded on the CPU, which accepts and rejects the same images (scores within
            # 3e-2: libjpeg's IDCT, not nvJPEG's).
            self._decoder_warming = threading.Thread(target=self._warm_decoder,
                                                     name="gpu-decoder-warm-up", daemon=True)
            self._decoder_warming.start()
        row = crop_pixels(decode_image(self._sample_bytes(), self._limits),
                          jpeg_roundtrip=self.cfg.model.jpeg_roundtrip)
        for size in self.pipeline.sizes:
            if size <= self.cfg.batch.max_batch_size or size == self.pipeline.sizes[0]:
                self._warm_graph(row, size)
                lap(f"batch_{size}")
        self._warm = True
        log.info("task_warmed", steps_s=steps)

    def _warm_graph(self, row: np.ndarray, size: int) -> None:
        """One batch of ``size`` copies of ``row`` through the pipeline (host rows, H2D)."""
        slot = self.pipeline.acquire(size)
        slot.host_in.array[:size] = row
        self.pipeline.launch(slot, size).result()

    def _warm_decoder(self) -> None:
        import torch

        from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import warm_decoder

        t = time.monotonic()
        sample = self._sample_bytes()
        for attempt in range(1, DECODER_ATTEMPTS + 1):
            try:
                stream = self._prep_stream()
                with torch.cuda.stream(stream):
                    warm_decoder(sample, torch.device(self.pipeline.runner.device),
                                 self._limits, self.cfg.model.gpu_jpeg_decoder)
                stream.synchronize()
            except torch.cuda.OutOfMemoryError as exc:
                # Other processes may still be loading on this GPU: a little later there can
                # be room. The CPU decodes meanwhile.
                log.warning("gpu_decoder_out_of_memory", attempt=attempt,
                            error=one_line(exc, 200))
                if self._closing.wait(2.0 * attempt):
                    return
                continue
            except Exception as exc:  # noqa: BLE001  (the CPU path serves whatever this was)
                # nvJPEG missing or refusing to start. A CUDA error that poisons the device
                # fails the next batch's graph too, which stops the worker as before.
                log.error("gpu_decoder_unavailable", error=one_line(exc, 300),
                          fallback="every batch is decoded on the CPU")
                return
            self._decoder_ready.set()
            log.info("gpu_decoder_ready", seconds=round(time.monotonic() - t, 3))
            return
        log.error("gpu_decoder_unavailable", error=f"out of memory {DECODER_ATTEMPTS} times",
                  fallback="every batch is decoded on the CPU")

    def wait_for_gpu_decoder(self, timeout: float | None = None) -> bool:
        """True once batches are decoded with nvJPEG (False: still warming up, or it failed
        and the CPU decodes; always False with CPU preprocessing)."""
        if self._decoder_warming is not None:
            self._decoder_warming.join(timeout)
        return self._decoder_ready.is_set()

    def ready(self) -> bool:
        # The worker serves before nvJPEG is warm (the CPU decodes meanwhile); full speed, what
        # ready() promises, once the decoder is warm or known not to start.
        warming = self._decoder_warming is not None and self._decoder_warming.is_alive()
        return self.pipeline.compute is not None and self._warm and not warming

    def _sample_bytes(self) -> bytes:
        from worker.bundled import samples_dir

        return (samples_dir() / "astronaut.jpg").read_bytes()

    def _stop(self) -> None:
        super()._stop()
        self._closing.set()
        if self._decoder_warming is not None:
            # Before the pipeline goes: the thread decodes on the device the pipeline's
            # runner holds. A decoder stuck for this long is left behind (a daemon thread).
            self._decoder_warming.join(DECODER_JOIN_S)
            if self._decoder_warming.is_alive():
                log.warning("gpu_decoder_warm_up_still_running", waited_s=DECODER_JOIN_S)
        self.pipeline.deactivate()

    def _prep_stream(self) -> Any:
        import torch

        stream = getattr(self._local, "stream", None)
        if stream is None:
            from engines.cudart import greatest_stream_priority

            # Its prep stream goes with the pipeline's: urgent (prefer_gpu), and on its SMs
            # (use_free_sms; kept for the thread's life, as torch's own streams are).
            priority = greatest_stream_priority() if self.pipeline.urgent else 0
            part = self.pipeline.partition
            if part is not None:
                stream = torch.cuda.ExternalStream(part.stream(priority))
            else:
                stream = torch.cuda.Stream(priority=priority)
            self._local.stream = stream
            self._local.ready = Event()
        return stream

    def _infer_rows(self, images: list[bytes]) -> tuple[np.ndarray | None,
                                                         list[JobRejected | None], float]:
        """Preprocess ``images`` (JPEGs that passed ``jpeg_plain``) into a slot and run it;
        (scores, rejections, prep seconds)."""
        n = len(images)
        slot = self.pipeline.acquire(n)
        t0 = time.monotonic()
        ready: Event | None = None
        if self._gpu_decode and self._decoder_ready.is_set():
            import torch

            from engines.backends.torch.graphs import empty_cache
            from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import prepare_batch

            stream = self._prep_stream()
            try:
                with torch.cuda.stream(stream):
                    rejects = prepare_batch(images, slot.dev_in[:n], self._limits,
                                            self.cfg.model.gpu_jpeg_decoder, plain=True)
                event: Event = self._local.ready
                event.record_on(stream.cuda_stream)
                ready = event
            except torch.cuda.OutOfMemoryError as exc:
                # Large images decoded on the GPU at once: this batch is prepared on the CPU
                # instead (the engine's own memory is preallocated in its graphs). Any other
                # CUDA error propagates and stops the worker, nothing committed past it.
                stream.synchronize()
                empty_cache()  # (not during another engine's graph capture)
                log.warning("gpu_preprocess_out_of_memory", images=n,
                            error=one_line(exc, 200), fallback="cpu")
                rejects = self._fill_host_rows(slot, images)
        else:
            rejects = self._fill_host_rows(slot, images)
        prep = time.monotonic() - t0
        if all(r is not None for r in rejects):
            if ready is not None:
                ready.synchronize()
            self.pipeline.release(slot)
            return None, rejects, prep
        handle = self.pipeline.launch(slot, n, input_ready=ready)
        return handle.result(), rejects, prep

    def score_pixels(self, policy: str, pixels: Any, captions: Sequence[str]
                     ) -> list[dict[str, float]]:
        """Generated images resized and cropped on the pipeline's device, written into its
        slot's device rows and scored by its graph: pixels already on a CUDA device (the VAE's
        output) never go through the host; host pixels are uploaded once, as uint8. Without
        the pipeline (not activated) the plain runner's path."""
        if self.pipeline.compute is None:
            return super().score_pixels(policy, pixels, captions)
        import torch

        from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import crop_generated

        stream = self._prep_stream()
        out: list[dict[str, float]] = []
        step = self.pipeline.sizes[-1]
        for lo in range(0, len(pixels), step):
            part = pixels[lo:lo + step]
            n = len(part)
            slot = self.pipeline.acquire(n)
            if part.is_cuda:  # written on their producer's stream: this one waits for it
                stream.wait_stream(torch.cuda.current_stream(part.device))
            with torch.cuda.stream(stream):
                slot.dev_in[:n] = crop_generated(part.to(self.pipeline.runner.device,
                                                         non_blocking=True))
            ready: Event = self._local.ready
            ready.record_on(stream.cuda_stream)
            scores = self.pipeline.launch(slot, n, input_ready=ready).result()
            out += [self.named(scores[i]) for i in range(n)]
        return out

    def _fill_host_rows(self, slot: Any, images: list[bytes]) -> list[JobRejected | None]:
        """CPU preprocessing into the slot's pinned host rows (one pool task per image)."""
        rows = slot.host_in.array
        jpeg_roundtrip = self.cfg.model.jpeg_roundtrip

        def fill(i: int) -> JobRejected | None:
            try:
                rows[i] = crop_pixels(decode_image(images[i], self._limits),
                                      jpeg_roundtrip=jpeg_roundtrip)
            except JobRejected as exc:
                return exc
            return None

        return list(self._decode_pool.map(fill, range(len(images))))

    def _run(self, batch: Batch[Part]) -> list[Finished]:
        """One value per part, in the batch's order."""
        order = {id(p): k for k, p in enumerate(batch.items)}
        done = self._run_split(batch)
        done.sort(key=lambda d: order[id(d[0])])
        return done

    def _run_split(self, batch: Batch[Part]) -> list[Finished]:
        # feeds() keeps image-less jobs out; never crash on one that got here.
        done: list[Finished] = [(p, no_image(p.job)) for p in batch.items if p.job.image is None]
        # What the GPU decoder would not show as a person sees it (PNG/WebP: alpha, animation,
        # bit depth; JPEGs that are CMYK or EXIF-rotated) takes the views path on the CPU
        # (decode_views, worst view scored) through the plain runner; the rest the pipeline.
        imaged: list[tuple[Part, bytes]] = []
        viewed: list[Part] = []
        for p in batch.items:
            image = p.job.image
            if image is not None:
                if jpeg_plain(image):
                    imaged.append((p, image))
                else:
                    viewed.append(p)
        if viewed:
            done += super()._run(Batch(batch.profile, viewed, len(viewed)))
        if not imaged:
            return done
        scores, rejects, prep = self._infer_rows([image for _, image in imaged])
        for i, ((p, _), rej) in enumerate(zip(imaged, rejects, strict=True)):
            if rej is not None or scores is None:
                done.append((p, rej))
                continue
            p.decoded(prep)
            done.append((p, self.named(scores[i])))
        return done
