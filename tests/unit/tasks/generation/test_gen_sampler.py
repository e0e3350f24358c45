"""The denoising loop with stand-in engines (numpy, no torch): CFG arithmetic, chunking,
padding to profile sizes, per-row independence, pipelining and VAE pieces.

The stand-in UNet is elementwise per row and depends on the text embedding, so guidance matters
and a row's result cannot depend on its neighbours unless the loop mixes rows up.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from engines.backends.base import FutureHandle, InferHandle, Outputs, Runner
from engines.profiles import StaticProfile
from worker.tasks.generation import sampler
from worker.tasks.generation.schedulers import make_schedule

SHAPE = (4, 8, 8)
UNET = StaticProfile("unet", SHAPE, (2, 4, 8))
VAE = StaticProfile("vae", SHAPE, (2,))  # one size: a lone row is padded


def fake_eps(sample: np.ndarray, t: np.ndarray, ehs: np.ndarray) -> np.ndarray:
    cond = ehs.astype(np.float64).mean(axis=(1, 2))[:, None, None, None]
    return np.tanh(sample) * 0.5 + 1e-4 * t[:, None, None, None] + cond


class FakeRunner(Runner):
    backend = "fake"

    def __init__(self, fn: Any, log: list[tuple[str, int]], name: str) -> None:
        super().__init__()
        self.fn, self.log, self.name = fn, log, name

    @property
    def engine_hash(self) -> str:
        return "fake"

    def _activate(self) -> None: ...

    def _deactivate(self) -> None: ...

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        first = next(iter(feeds.values()))
        self.log.append((f"{self.name}.infer", len(first)))
        future: Future[Outputs] = Future()
        future.set_result(self.fn(feeds))
        log = self.log

        class Logged(FutureHandle):
            def result(self, timeout: float | None = None) -> Outputs:
                log.append(("result", len(first)))
                return super().result(timeout)

        return Logged(future)


def unet_runner(log: list[tuple[str, int]]) -> FakeRunner:
    def fn(f: Mapping[str, np.ndarray]) -> Outputs:
        out = fake_eps(f["sample"], f["timestep"], f["encoder_hidden_states"])
        return {"noise_pred": out.astype(np.float32)}
    r = FakeRunner(fn, log, "unet")
    r.activate()
    return r


def vae_runner(log: list[tuple[str, int]]) -> FakeRunner:
    def fn(f: Mapping[str, np.ndarray]) -> Outputs:
        lat = f["latents"]
        tag = np.clip(np.round(lat[:, 0, 0, 0]), 0, 255).astype(np.uint8)
        return {"image": np.broadcast_to(tag[:, None, None, None], (len(lat), 64, 64, 3)).copy()}
    r = FakeRunner(fn, log, "vae")
    r.activate()
    return r


def row(i: int, scheduler: str = "ddim", steps: int = 6, guidance: float = 7.5,
        seed: int | None = None) -> sampler.RowSpec:
    rng = np.random.default_rng(100 + i)
    return sampler.RowSpec((0, i), 1000 + i if seed is None else seed,
                           make_schedule(scheduler, steps), guidance,
                           rng.standard_normal((77, 16)).astype(np.float32),
                           rng.standard_normal((77, 16)).astype(np.float32))


def reference(r: sampler.RowSpec) -> np.ndarray:
    """One row, float64, no batching, no padding: the loop's definition."""
    sch = r.schedule
    g = np.random.Generator(np.random.PCG64(r.seed))
    x = g.standard_normal(SHAPE, dtype=np.float32).astype(np.float64) * sch.init_sigma
    for k in range(sch.steps):
        xin = (x * sch.in_scale[k])[None]
        t = np.array([sch.timesteps[k]])
        eu = fake_eps(xin, t, r.uncond[None])[0]
        ec = fake_eps(xin, t, r.cond[None])[0]
        eps = eu + r.guidance * (ec - eu)
        x = sch.c_x[k] * x + sch.c_eps[k] * eps
        if sch.c_noise[k]:
            x = x + sch.c_noise[k] * g.standard_normal(SHAPE, dtype=np.float32)
    return x


def run(rows: list[sampler.RowSpec], per_chunk: int = 4
        ) -> tuple[list[sampler.DenoiseChunk], list[Any]]:
    log: list[tuple[str, int]] = []
    chunks = [sampler.DenoiseChunk(rows[i:i + per_chunk], SHAPE, UNET)
              for i in range(0, len(rows), per_chunk)]
    sampler.denoise(unet_runner(log), vae_runner(log), chunks, {SHAPE: VAE})
    return chunks, log


@pytest.mark.parametrize("scheduler", ["ddim", "euler", "euler_a"])
def test_cfg_loop_matches_the_per_row_reference(scheduler: str) -> None:
    rows = [row(i, scheduler, guidance=g) for i, g in enumerate((7.5, 1.0, 0.0))]
    chunks, _ = run(rows)
    for r, x in zip(rows, chunks[0].x, strict=True):
        np.testing.assert_allclose(x, reference(r), rtol=1e-4, atol=1e-4)


def test_guidance_changes_the_result() -> None:
    a, b = (run([row(0, guidance=g)])[0][0].x for g in (7.5, 3.0))
    assert not np.allclose(a, b)


def test_a_row_does_not_depend_on_its_batch_neighbours() -> None:
    alone = run([row(2, "euler_a")])[0][0].x[0]
    crowded = run([row(0, "euler_a"), row(1, "euler_a"), row(2, "euler_a")])[0][0].x[2]
    np.testing.assert_array_equal(alone, crowded)


def test_unet_batches_are_cfg_pairs_padded_to_profile_sizes() -> None:
    _, log = run([row(i) for i in range(3)])  # 3 pairs = 6 rows -> padded to 8
    assert {n for what, n in log if what == "unet.infer"} == {8}
    _, log = run([row(0)])
    assert {n for what, n in log if what == "unet.infer"} == {2}


def test_all_chunks_are_launched_before_any_result_is_read() -> None:
    rows = [row(i) for i in range(6)]
    _, log = run(rows, per_chunk=4)  # chunks of 4 and 2 pairs
    first_step = log[:4]
    assert first_step == [("unet.infer", 8), ("unet.infer", 4), ("result", 8), ("result", 4)]


def test_vae_decodes_in_profile_pieces_and_keeps_row_order() -> None:
    rows = [row(i) for i in range(3)]
    chunks, log = run(rows)
    c = chunks[0]
    c.x = np.stack([np.full(SHAPE, v, np.float32) for v in (10, 20, 30)])
    c.decoded = sampler.decode_latents(vae_runner(log), VAE, c.x)
    images = sampler.images_of(c)
    assert [int(im[0, 0, 0]) for im in images] == [10, 20, 30]
    assert [n for what, n in log[-4:] if what == "vae.infer"] == [2, 2]  # 2 + (1 padded to 2)


def test_pad_rows_repeats_the_first_row() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    padded = sampler.pad_rows(a, 4)
    np.testing.assert_array_equal(padded, [[0, 1, 2], [3, 4, 5], [0, 1, 2], [0, 1, 2]])
    assert sampler.pad_rows(a, 2) is a


def test_chunks_of_different_step_counts_finish_independently() -> None:
    log: list[tuple[str, int]] = []
    short = sampler.DenoiseChunk([row(0, steps=2)], SHAPE, UNET)
    long = sampler.DenoiseChunk([row(1, steps=5)], SHAPE, UNET)
    sampler.denoise(unet_runner(log), vae_runner(log), [short, long], {SHAPE: VAE})
    assert (short.k, long.k) == (2, 5)
    assert sum(1 for what, _ in log if what == "unet.infer") == 7
    np.testing.assert_allclose(long.x[0], reference(row(1, steps=5)), rtol=1e-4, atol=1e-4)


def test_before_step_is_called_before_each_steps_unet_launch() -> None:
    log: list[tuple[str, int]] = []
    chunks = [sampler.DenoiseChunk([row(0, steps=3)], SHAPE, UNET)]
    sampler.denoise(unet_runner(log), vae_runner(log), chunks, {SHAPE: VAE},
                    before_step=lambda: log.append(("turn", 0)))
    steps = [what for what, _ in log if what in ("turn", "unet.infer")]
    assert steps == ["turn", "unet.infer"] * 3


def test_paced_decode_launches_each_piece_after_the_last_one_ended_and_its_turn() -> None:
    rows = [row(i) for i in range(5)]
    log: list[tuple[str, int]] = []
    chunks = [sampler.DenoiseChunk(rows[i:i + 4], SHAPE, UNET) for i in (0, 4)]
    sampler.denoise(unet_runner(log), vae_runner(log), chunks, {SHAPE: VAE}, decode=False)
    assert all(not c.decoded for c in chunks), "no decode enqueued by the loop"
    del log[:]
    sampler.decode_paced(vae_runner(log), chunks, {SHAPE: VAE},
                         lambda: log.append(("turn", 0)), piece=8)
    # pieces of 2 (the profile's only size): 4 rows -> 2 + 2, then 1 row -> 1 padded to 2
    assert [w for w, _ in log] == ["turn", "vae.infer", "result", "turn", "vae.infer",
                                   "result", "turn", "vae.infer"]
    paced = [sampler.images_of(c) for c in chunks]
    whole, _ = run(rows)
    for a, b in zip(paced, [sampler.images_of(c) for c in whole], strict=True):
        np.testing.assert_array_equal(a, b)


def test_paced_pieces_are_at_most_the_piece_size_padded_to_a_profile_size() -> None:
    vae = StaticProfile("vae", SHAPE, (1, 2, 4))
    rows = [row(i) for i in range(4)]
    log: list[tuple[str, int]] = []
    chunks = [sampler.DenoiseChunk(rows[:3], SHAPE, UNET), sampler.DenoiseChunk(rows[3:], SHAPE,
                                                                                 UNET)]
    sampler.denoise(unet_runner(log), vae_runner(log), chunks, {SHAPE: vae}, decode=False)
    del log[:]
    turns: list[int] = []
    sampler.decode_paced(vae_runner(log), chunks, {SHAPE: vae}, lambda: turns.append(1),
                         piece=2)
    # 3 rows -> 2 + 1, then 1 row: every launch of at most 2 real rows, one turn each
    assert [n for w, n in log if w == "vae.infer"] == [2, 1, 1]
    assert len(turns) == 3
    paced = [sampler.images_of(c) for c in chunks]
    whole, _ = run(rows, per_chunk=3)
    for a, b in zip(paced, [sampler.images_of(c) for c in whole], strict=True):
        np.testing.assert_array_equal(a, b)
