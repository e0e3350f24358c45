"""The denoising loop: CFG pairs in one UNet batch, chunks stepped together, VAE on finish.

Rows are images. Rows of one resolution and step count form chunks of at most half the UNet
profile's largest batch (each row is an unconditional + conditional pair). Every round enqueues
one step of every unfinished chunk before reading any result, so the device computes chunk B
while the host applies chunk A's sampler step; a chunk that finishes has its VAE decode
enqueued at once, on the VAE engine's own stream, overlapping the other chunks' UNet steps
(beside another task with ``generation.vae_yield_ms``, the decodes run one piece at a time
after the loop instead: :func:`decode_paced`).
Each row owns a numpy PCG64 generator seeded with its image seed: its initial latents (and the
ancestral sampler's noise) do not depend on which other rows share its batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engines.backends.base import InferHandle, Runner
from engines.profiles import StaticProfile
from worker.tasks.generation.schedulers import Schedule


def pad_rows(a: np.ndarray, n: int) -> np.ndarray:
    """Pad to ``n`` rows with copies of row 0: finite values, outputs dropped."""
    if len(a) == n:
        return a
    return np.concatenate([a, np.repeat(a[:1], n - len(a), axis=0)])


def encode_texts(runner: Runner, profile: StaticProfile, ids: np.ndarray) -> np.ndarray:
    """Token ids [N, 77] -> embeddings [N, 77, D], in profile-sized pieces."""
    out = []
    for i in range(0, len(ids), profile.max_batch):
        part = ids[i:i + profile.max_batch]
        feeds = {"input_ids": pad_rows(part, profile.padded(len(part)))}
        out.append(runner.infer(feeds).result()["text_embeddings"][: len(part)])
    return np.concatenate(out)


@dataclass(frozen=True)
class RowSpec:
    tag: tuple[int, int]  # (job position in the batch, image index)
    seed: int
    schedule: Schedule
    guidance: float
    cond: np.ndarray  # [77, D]
    uncond: np.ndarray


@dataclass
class DenoiseChunk:
    rows: list[RowSpec]
    latent_shape: tuple[int, ...]
    unet: StaticProfile
    x: np.ndarray = field(init=False)
    k: int = 0
    rngs: list[np.random.Generator] = field(init=False)
    decoded: list[tuple[InferHandle, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rngs = [np.random.Generator(np.random.PCG64(r.seed)) for r in self.rows]
        self.x = np.stack([g.standard_normal(self.latent_shape, dtype=np.float32)
                           * np.float32(r.schedule.init_sigma)
                           for g, r in zip(self.rngs, self.rows, strict=True)])
        n = len(self.rows)
        self._ehs = pad_rows(np.stack([r.uncond for r in self.rows] + [r.cond for r in self.rows]),
                             self.unet.padded(2 * n))
        self._g = np.array([r.guidance for r in self.rows], np.float32)[:, None, None, None]

    @property
    def steps(self) -> int:
        return self.rows[0].schedule.steps

    @property
    def done(self) -> bool:
        return self.k >= self.steps

    def _coef(self, name: str) -> np.ndarray:
        values = [getattr(r.schedule, name)[self.k] for r in self.rows]
        return np.array(values, np.float32)[:, None, None, None]

    def launch(self, unet: Runner) -> InferHandle:
        xin = self.x * self._coef("in_scale")
        t = np.array([r.schedule.timesteps[self.k] for r in self.rows], np.float32)
        size = len(self._ehs)
        feeds = {"sample": pad_rows(np.concatenate([xin, xin]), size),
                 "timestep": pad_rows(np.concatenate([t, t]), size),
                 "encoder_hidden_states": self._ehs}
        return unet.infer(feeds)

    def apply(self, noise_pred: np.ndarray) -> None:
        n = len(self.rows)
        uncond, cond = noise_pred[:n], noise_pred[n:2 * n]
        eps = uncond + self._g * (cond - uncond)
        x = self._coef("c_x") * self.x + self._coef("c_eps") * eps
        c_noise = self._coef("c_noise")
        if np.any(c_noise):
            z = np.stack([g.standard_normal(self.latent_shape, dtype=np.float32)
                          for g in self.rngs])
            x = x + c_noise * z
        self.x = x.astype(np.float32, copy=False)
        self.k += 1


def decode_latents(vae: Runner, profile: StaticProfile, x: np.ndarray
                   ) -> list[tuple[InferHandle, int]]:
    """Enqueue the VAE decode of ``x`` in profile-sized pieces: (handle, real rows) each."""
    handles = []
    for i in range(0, len(x), profile.max_batch):
        part = x[i:i + profile.max_batch]
        feeds = {"latents": pad_rows(part, profile.padded(len(part)))}
        handles.append((vae.infer(feeds), len(part)))
    return handles


def denoise(unet: Runner, vae: Runner, chunks: list[DenoiseChunk],
            vae_profiles: dict[tuple[int, ...], StaticProfile],
            before_step: Callable[[], None] | None = None, *, decode: bool = True) -> None:
    """Run every chunk to its last step; with ``decode``, enqueue each chunk's VAE decode as
    it finishes (else :func:`decode_paced` does, after the loop). ``before_step`` is called
    before each step's UNet launches (another task's batches go first:
    worker.tasks.gpu_share)."""
    active = [c for c in chunks if not c.done]
    while active:
        if before_step is not None:
            before_step()
        launched = [(c, c.launch(unet)) for c in active]
        for c, handle in launched:
            c.apply(handle.result()["noise_pred"])
            if c.done and decode:
                c.decoded = decode_latents(vae, vae_profiles[c.latent_shape], c.x)
        active = [c for c in active if not c.done]


def decode_paced(vae: Runner, chunks: list[DenoiseChunk],
                 vae_profiles: dict[tuple[int, ...], StaticProfile],
                 before_piece: Callable[[], None], piece: int) -> None:
    """Every chunk's VAE decode in pieces of at most ``piece`` rows, one at a time across
    the chunks: each piece waits for the one before it and for ``before_piece`` (another
    task's batches go first), so the other task's kernels run between the pieces instead of
    beside all of them."""
    last: InferHandle | None = None
    for c in chunks:
        profile = vae_profiles[c.latent_shape]
        step = min(piece, profile.max_batch)
        c.decoded = []
        for i in range(0, len(c.x), step):
            if last is not None:
                last.result()
            before_piece()
            c.decoded += decode_latents(vae, profile, c.x[i:i + step])
            last = c.decoded[-1][0]


def images_of(chunk: DenoiseChunk) -> np.ndarray:
    """uint8 [n, H, W, 3] for the chunk's rows (waits for its VAE decode)."""
    return np.concatenate([h.result()["image"][:n] for h, n in chunk.decoded])
