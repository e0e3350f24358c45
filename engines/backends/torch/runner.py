"""torch on CUDA or the CPU: one runner for every model's native network (open_nsfw, the MiniLM
and CLIP towers, the SD nets), which it gets from the spec's :class:`~engines.spec.NativeNet`.

On CUDA: fp16 or IEEE fp32, one CUDA graph per static (batch size, item shape) and in-flight
slot, so several batches of one shape can be in flight without sharing buffers. ``infer``
copies the batch into pinned host memory, enqueues H2D copy, graph replay and D2H copy and
records an event; the handle's ``result()`` waits for that event only. A batch runs in the
smallest graph of its item shape that holds it (rows padded); other shapes (range profiles)
run eagerly on the same stream, as do static shapes left out of ``graph_batches`` when it is
set. Graphs are captured at ``activate``, each into its own memory pool and replayed on the
caller's stream; a network that asks for a shared pool (large ones:
SD) has its graphs captured at first use (``warm_up`` captures them all) into one pool and
replayed in order on the runner's own stream. A shape whose capture fails (the network syncs
with the host somewhere) runs eagerly from then on, with a warning.
``device="cpu"``: fp32, eager, on a single-thread executor; the same plumbing, the reference the
other backends are checked against. torch is imported lazily, in ``activate``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.backends.base import EventHandle, FutureHandle, InferHandle, Outputs, Runner
from engines.backends.torch.artifact import DTYPES, in_engine_form, load_native, native_net
from engines.backends.torch.graphs import (
    GraphSlot,
    as_torch_stream,
    capture_graph,
    cuda_module,
    sample_input,
)
from engines.cache import CacheEntry
from engines.exceptions import BackendUnavailable, EngineError, InferenceFailed, RunnerStateError
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec

compile_log = logging.getLogger("engines")

if TYPE_CHECKING:
    from engines.assembly import DeferredLoader, EnginePlan

GraphKey = tuple[int, tuple[int, ...]]  # (batch size, the first input's item shape)


def graph_shapes(spec: EngineSpec, key: GraphKey) -> list[tuple[int, ...]]:
    """Every input's shape in the graph for ``key``: the first input carries the profile's item;
    the others their spec's shape, or the same item where the spec leaves it open (a mask)."""
    batch, item = key
    rest = [(batch, *(t.shape[1:] if -1 not in t.shape[1:] else item)) for t in spec.inputs[1:]]
    return [(batch, *item), *rest]


def make_torch_runner(plan: EnginePlan, engine: DeferredLoader | None) -> TorchRunner:
    """The registry's runner factory. A network without a skeleton is always built from its
    weights (nothing to cache); torch.compile's cache sits next to the cached weights."""
    p = plan.params
    if native_net(plan.spec).skeleton is None:
        engine = None
    compile_cache = None
    if engine is not None and p.compile:
        cached = engine.resolve()
        compile_cache = (cached.cache.entry_dir(cached.recipe).parent /
                         f"inductor-{cached.recipe.key}.bin")
    return TorchRunner(plan.spec, profiles=plan.profiles, precision=p.precision, engine=engine,
                       device=p.device, slots=p.slots, cuda_graphs=p.cuda_graphs,
                       compile=p.compile, compile_cache=compile_cache)


def read_verified(path: Path | None) -> bytes | None:
    """torch.compile's cache artifacts (generated code) if their SHA-256 matches the digest
    written beside them; None (compile from scratch) when either is missing or they differ."""
    if path is None or not path.is_file():
        return None
    digest = path.with_name(path.name + ".sha256")
    data = path.read_bytes()
    if not digest.is_file() or digest.read_text().strip() != hashlib.sha256(data).hexdigest():
        compile_log.error("compile cache %s does not match its digest: not loaded", path)
        return None
    return data


def write_verified(path: Path, data: bytes) -> None:
    """Write ``data`` and its digest, each by an atomic rename (a second worker never reads
    half a file; the digest lands last, so a reader sees both or no match)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)
    digest = path.with_name(path.name + ".sha256")
    tmp_digest = digest.with_suffix(".tmp")
    tmp_digest.write_text(hashlib.sha256(data).hexdigest())
    tmp_digest.rename(digest)


class TorchRunner(Runner):
    backend = "torch"

    def __init__(self, spec: EngineSpec, *, profiles: tuple[Profile, ...] = (),
                 precision: str = "fp16", engine: Callable[[], CacheEntry] | None = None,
                 device: int | str = 0, slots: int = 2, cuda_graphs: bool = True,
                 compile: bool = False, compile_cache: Path | None = None) -> None:
        super().__init__()
        if precision not in DTYPES:
            raise BackendUnavailable(f"torch backend supports {sorted(DTYPES)}, not {precision}")
        self.spec, self.profiles, self.precision = spec, profiles, precision
        self.device = f"cuda:{device}" if isinstance(device, int) else device
        self._engine, self._slots_per_key, self._graphs = engine, slots, cuda_graphs
        self._compile, self._compile_cache = compile, compile_cache
        self._static: set[GraphKey] = {(b, p.item_shape) for p in profiles
                                       if isinstance(p, StaticProfile) for b in p.batch_sizes}
        self._max_batch = max((p.max_batch for p in profiles), default=0)
        self._slots: dict[GraphKey, list[GraphSlot]] = {}
        self._next: dict[GraphKey, int] = {}
        self._lock = threading.Lock()
        self.compile_cache_error: str | None = None
        self.graph_errors: dict[GraphKey, str] = {}
        # None: every static shape gets graphs. A set of batch sizes: only those shapes do,
        # the others run eagerly (for a runner only some jobs reach, the GPU pipeline task's
        # fallback path: no graphs to capture at start for it, and none captured while serving).
        self.graph_batches: frozenset[int] | None = None
        self._net: Any = None
        self._fn: Any = None  # the network, or its torch.compile
        self._stream: Any = None
        # SMs this runner's kernels leave free (leave_sms_free), or, with _on_free_sms, the
        # SMs such a partition leaves that it runs on (use_free_sms); the partition it runs in
        # once active (its stream is then self._stream), or why the driver refused one.
        self._free_sms = 0
        self._on_free_sms = False
        self._partition: Any = None
        self.partition_error: str | None = None
        self._pool: Any = None  # the graphs' shared memory pool, where the network wants one
        self._cpu: ThreadPoolExecutor | None = None

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def net(self) -> Any:
        """The active network (for pipelines that capture their own graphs around it)."""
        return self._net

    @property
    def default_stream(self) -> Any:
        return self._stream

    @property
    def sm_partition(self) -> tuple[int, int] | None:
        """(SMs it runs on, the device's SMs) while it runs in a partition."""
        part = self._partition
        return None if part is None else (part.sms, part.total)

    @property
    def _capture_on(self) -> Any:
        """Where its graphs are captured: its partition's stream (a graph keeps the partition
        it was captured in), else None (graphs.capture's own streams)."""
        return self._stream if self._partition is not None else None

    @property
    def graph_keys(self) -> list[GraphKey]:
        return sorted(self._slots)

    def graph_count(self) -> int:
        return sum(len(v) for v in self._slots.values())

    def leave_sms_free(self, sms: int) -> bool:
        """Run this runner's kernels, eager and captured, in a partition of the device that
        leaves at least ``sms`` SMs free (engines.gpu_partition); before activation only.
        False on the CPU, where there is nothing to partition."""
        return self._partition_request(sms, on_free=False)

    def use_free_sms(self, sms: int) -> bool:
        """Run this runner's kernels, eager and captured, only on the SMs a partition leaving
        ``sms`` free leaves (engines.gpu_partition.shared_rest): never on an SM of the engines
        that left them; before activation only. False on the CPU."""
        return self._partition_request(sms, on_free=True)

    def _partition_request(self, sms: int, *, on_free: bool) -> bool:
        if self.active:
            raise RunnerStateError(f"{self.spec.model_id}: SMs are partitioned before "
                                   "activation, not after (its streams and graphs exist)")
        if not self.cuda:
            return False
        self._free_sms, self._on_free_sms = max(0, sms), on_free
        return True

    def _activate(self) -> None:
        t0 = time.monotonic()
        torch = self._torch_for_device()
        t1 = time.monotonic()
        native = native_net(self.spec)
        module, self._hash = load_native(native, self.device, self.precision, self._engine)
        self._net = self._fn = in_engine_form(module, native, self.device, self.precision)
        if self._compile:
            artifacts = read_verified(self._compile_cache)
            if artifacts is not None:
                torch.compiler.load_cache_artifacts(artifacts)
            self._fn = torch.compile(self._net, dynamic=False)
        t2 = time.monotonic()
        self._start()
        # Where a start's seconds go, per engine (bench/start/warm_start.py reads these lines).
        compile_log.info("engine_activated: %s on %s, %s", self.spec.model_id, self.device,
                         {"import_s": round(t1 - t0, 3), "load_s": round(t2 - t1, 3),
                          "graphs_s": round(time.monotonic() - t2, 3)})

    def _torch_for_device(self) -> Any:
        """torch, once the device and precision are known to work (fp32 set to IEEE fp32)."""
        try:
            import torch
        except ImportError as exc:
            raise BackendUnavailable("torch does not import") from exc
        if self.cuda and not torch.cuda.is_available():
            raise BackendUnavailable(f"{self.backend} backend needs CUDA; none is available")
        if not self.cuda and self.precision != "fp32":
            raise BackendUnavailable(f"the {self.backend} runner on CPU runs fp32 only")
        if self.cuda and self.precision == "fp32":
            # torch lets cuDNN and cuBLAS use TF32 (10-bit mantissa) for "float32" by default,
            # which is off from a float32 reference by ~2e-3. fp32 here means IEEE fp32.
            # These flags are process-wide; an fp16 engine in the same process is unaffected.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        return torch

    def _start(self) -> None:
        """The CPU executor, or the CUDA stream and the static shapes' graphs."""
        import torch

        if not self.cuda:
            self._cpu = ThreadPoolExecutor(1, thread_name_prefix=f"torch-{self.spec.model_id}")
            return
        self._stream = self._partition_stream(torch) or cuda_module().Stream(self.device)
        if native_net(self.spec).shared_graph_pool:
            self._pool = torch.cuda.graph_pool_handle()  # graphs come at first use
        elif self._graphs:
            for key in sorted(self._static):
                if self._graphed(key):
                    self._capture(key)

    def _partition_stream(self, torch: Any) -> Any:
        """With SMs to leave free: a stream in the process's partition (graphs are captured
        on it too). None without, or where the driver refuses a partition (a driver older
        than CUDA 12.4, say): the engine then runs on every SM, which costs latency beside
        another task, never the start."""
        if not self._free_sms:
            return None
        from engines import gpu_partition

        device = torch.device(self.device)
        make = gpu_partition.shared_rest if self._on_free_sms else gpu_partition.shared_partition
        try:
            part = make(self._free_sms, device=device.index or 0)
            stream = cuda_module().ExternalStream(part.stream(), device=device)
        except EngineError as exc:
            self.partition_error = str(exc)
            compile_log.warning("engine_partition_refused: %s runs on every SM: %s",
                                self.spec.model_id, exc)
            return None
        self._partition = part
        compile_log.info("engine_partitioned: %s runs on %d of %d SMs", self.spec.model_id,
                         part.sms, part.total)
        return stream

    def _graphed(self, key: GraphKey) -> bool:
        return self.graph_batches is None or key[0] in self.graph_batches

    def warm_up(self) -> None:
        """Run (capturing on CUDA) every static shape once; save torch.compile's cache."""
        for key in sorted(self._static):
            feeds = {t.name: sample_input(t.dtype, s)
                     for t, s in zip(self.spec.inputs, graph_shapes(self.spec, key), strict=True)}
            self.infer(feeds).result()
        self._save_compile_cache()

    def _save_compile_cache(self) -> None:
        cache = self._compile_cache
        if not self._compile or cache is None or cache.is_file():
            return
        import torch

        try:
            saved = torch.compiler.save_cache_artifacts()
        except (RuntimeError, AttributeError) as exc:  # a cache miss later costs time only
            self.compile_cache_error = str(exc)
            return
        if saved is not None:
            try:
                write_verified(cache, saved[0])
            except OSError as exc:  # a cache mounted read-only (the chart's worker): time only
                self.compile_cache_error = str(exc)

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        try:
            arrays = [np.ascontiguousarray(feeds[t.name], dtype=t.dtype) for t in self.spec.inputs]
        except KeyError as exc:
            raise InferenceFailed(f"{self.spec.model_id}: missing input {exc}") from exc
        n = int(arrays[0].shape[0])
        if self.profiles and n > self._max_batch:
            raise InferenceFailed(f"batch of {n} exceeds every profile of {self.spec.model_id}")
        if self._cpu is not None:
            return FutureHandle(self._cpu.submit(self._run_cpu, arrays))
        caller = as_torch_stream(stream) if stream is not None else self._stream
        try:
            with self._lock:
                slot = self._slot_for(arrays)
                if slot is not None:
                    # A shared pool is safe only while replays never overlap: its graphs all
                    # replay in order on the runner's stream.
                    return slot.launch(arrays, self._stream if self._pool is not None else caller)
                return self._eager(arrays, caller)
        except RuntimeError as exc:
            raise InferenceFailed(f"torch inference failed: {exc}") from exc

    def _slot_for(self, arrays: list[np.ndarray]) -> GraphSlot | None:
        """The next slot of the smallest graph holding the batch (captured now if it is not
        yet), or None: no graph for this shape (it runs eagerly)."""
        if not self._graphs:
            return None
        n, item = arrays[0].shape[0], tuple(arrays[0].shape[1:])
        key = min(((b, i) for b, i in self._static if i == item and b >= n
                   and self._graphed((b, i))), default=None)
        if key is None or (key not in self._slots and not self._capture(key)):
            return None
        ring = self._slots[key]
        i = self._next[key]
        self._next[key] = (i + 1) % len(ring)
        return ring[i] if ring[i].fits(arrays) else None

    def _capture(self, key: GraphKey) -> bool:
        """Capture ``slots`` graphs for ``key``; on failure the shape runs eagerly from now on."""
        import torch

        name = self.spec.outputs[0].name
        shapes = graph_shapes(self.spec, key)
        try:
            # One sample per key, copied into each slot's own input (drawing it per slot cost
            # ~0.3 s per batch-128 slot of a start-up: bench/NOTES.md).
            samples = [torch.from_numpy(sample_input(t.dtype, s)).to(self.device)
                       for t, s in zip(self.spec.inputs, shapes, strict=True)]
            ring = []
            for i in range(self._slots_per_key):
                dev_in = samples if i == 0 else [x.clone() for x in samples]
                # Kernels are chosen (and compiled) by the first slot's warm-up runs already.
                # One eager run initialises what a capture cannot; torch.compile gets three
                # (its first calls compile and may recompile).
                ring.append(capture_graph(self._fn, dev_in, name, pool=self._pool,
                                          warmup=(3 if self._compile else 1) if i == 0 else 0,
                                          stream=self._capture_on))
            # Inputs and capture done before any replay: the device's current stream (the
            # copies; the capture's side stream joined it). Never the whole device: a
            # device-wide sync while another thread captures (the other task of a two-task
            # process) is refused by CUDA and invalidates that capture.
            torch.cuda.current_stream(self.device).synchronize()
        except RuntimeError as exc:
            self._static.discard(key)
            self.graph_errors[key] = str(exc)
            warnings.warn(f"{self.spec.model_id}: CUDA graph capture failed for {shapes}, "
                          f"running it eagerly: {exc}", RuntimeWarning, stacklevel=2)
            return False
        self._slots[key], self._next[key] = ring, 0
        return True

    def _eager(self, arrays: list[np.ndarray], stream: Any) -> EventHandle:
        import torch

        hosts = [torch.from_numpy(a).pin_memory() for a in arrays]
        with torch.no_grad(), torch.cuda.stream(stream):
            out = self._fn(*[h.to(self.device, non_blocking=True) for h in hosts])
            host_out = torch.empty(tuple(out.shape), dtype=out.dtype, pin_memory=True)
            host_out.copy_(out, non_blocking=True)
            event = cuda_module().Event()
            event.record(stream)
        # The host inputs stay alive until their asynchronous copies are done.
        return EventHandle(event, host_out, self.spec.outputs[0].name, keepalive=hosts)

    def _run_cpu(self, arrays: list[np.ndarray]) -> Outputs:
        import torch

        with torch.no_grad():
            out = self._fn(*[torch.from_numpy(a) for a in arrays])
        return {self.spec.outputs[0].name: out.numpy()}

    def _deactivate(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        if self._cpu is not None:
            self._cpu.shutdown(wait=True)
        self._slots.clear()
        if self._partition is not None and self._stream is not None:
            self._partition.release(int(self._stream.cuda_stream))
        self._net = self._fn = self._stream = self._pool = self._cpu = self._partition = None
