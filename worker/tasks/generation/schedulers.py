"""DDIM, Euler and Euler-ancestral samplers on Stable Diffusion 1.5's noise schedule.

SD 1.5 was trained with 1000 steps of "scaled_linear" betas (sqrt-linear from 0.00085 to
0.012). Timestep spacing follows what diffusers does with SD 1.5's scheduler config: DDIM uses
"leading" spacing with steps_offset 1 (t = 951, 901, ..., 1 at 20 steps) and, at the last step,
alpha_prev = alphas_cumprod[0] (set_alpha_to_one false); Euler and Euler-a use "linspace"
spacing (t from 999 to 0, fractional) with sigmas interpolated linearly in t, then 0.

Every sampler here reduces one step to per-step coefficients, computed in float64:

    model input  = in_scale * x
    x_next       = c_x * x + c_eps * eps + c_noise * z      (z ~ N(0, 1), ancestral only)

so rows of one UNet batch may use different samplers, and applying a step is three fused
multiply-adds, on numpy or device arrays alike.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

TRAIN_STEPS = 1000
BETA_START, BETA_END = 0.00085, 0.012
SCHEDULERS = ("ddim", "euler", "euler_a")


@functools.cache
def alphas_cumprod() -> np.ndarray:
    betas = np.linspace(BETA_START**0.5, BETA_END**0.5, TRAIN_STEPS, dtype=np.float64) ** 2
    return np.cumprod(1.0 - betas)


@dataclass(frozen=True)
class Schedule:
    name: str
    steps: int
    timesteps: np.ndarray  # what the UNet is told, per step
    in_scale: np.ndarray
    c_x: np.ndarray
    c_eps: np.ndarray
    c_noise: np.ndarray
    init_sigma: float  # initial latents = init_sigma * N(0, 1)

    @property
    def stochastic(self) -> bool:
        return bool(np.any(self.c_noise))


def _ddim(steps: int) -> Schedule:
    ac = alphas_cumprod()
    ratio = TRAIN_STEPS // steps
    t = np.arange(steps)[::-1] * ratio + 1  # "leading" spacing, steps_offset 1
    prev = t - ratio
    a_t = ac[t]
    a_prev = np.where(prev >= 0, ac[np.maximum(prev, 0)], ac[0])
    # eta = 0: x_prev = sqrt(a_prev) * x0_hat + sqrt(1 - a_prev) * eps,
    # with x0_hat = (x - sqrt(1 - a_t) * eps) / sqrt(a_t).
    c_x = np.sqrt(a_prev / a_t)
    c_eps = np.sqrt(1 - a_prev) - np.sqrt(a_prev) * np.sqrt(1 - a_t) / np.sqrt(a_t)
    return Schedule("ddim", steps, t.astype(np.float64), np.ones(steps), c_x, c_eps,
                    np.zeros(steps), 1.0)


def _sigmas(steps: int) -> tuple[np.ndarray, np.ndarray]:
    ac = alphas_cumprod()
    t = np.linspace(0, TRAIN_STEPS - 1, steps)[::-1]
    all_sigmas = np.sqrt((1 - ac) / ac)
    sigmas = np.interp(t, np.arange(TRAIN_STEPS), all_sigmas)
    return t, np.append(sigmas, 0.0)


def _euler(steps: int, ancestral: bool) -> Schedule:
    t, s = _sigmas(steps)
    s_from, s_to = s[:-1], s[1:]
    if ancestral:
        s_up = np.sqrt(s_to**2 * (s_from**2 - s_to**2) / s_from**2)
        s_down = np.sqrt(s_to**2 - s_up**2)
    else:
        s_up, s_down = np.zeros(steps), s_to
    # x0_hat = x - sigma * eps; d = (x - x0_hat) / sigma = eps; x_next = x + d * (s_down - sigma)
    return Schedule("euler_a" if ancestral else "euler", steps, t, 1 / np.sqrt(s_from**2 + 1),
                    np.ones(steps), s_down - s_from, s_up, float(s.max()))


@functools.cache
def make_schedule(name: str, steps: int) -> Schedule:
    if steps < 1 or steps > TRAIN_STEPS:
        raise ValueError(f"steps must be in 1..{TRAIN_STEPS}, got {steps}")
    if name == "ddim":
        return _ddim(steps)
    if name in ("euler", "euler_a"):
        return _euler(steps, ancestral=name == "euler_a")
    raise ValueError(f"unknown scheduler {name!r} (known: {', '.join(SCHEDULERS)})")
