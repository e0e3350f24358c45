"""Sampler maths against an independent float64 reference (and diffusers where installed).

The reference below is written from the papers' formulas, step by step in plain Python floats:
DDIM (Song et al. 2020, eq. 12 with sigma = 0) through the predicted x0, and Euler / Euler
ancestral as in k-diffusion (Karras et al. 2022): denoised = x - sigma * eps, derivative
d = (x - denoised) / sigma. It shares no code with worker.tasks.generation.schedulers.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from worker.tasks.generation.schedulers import SCHEDULERS, alphas_cumprod, make_schedule

STEPS = (1, 2, 7, 20, 30, 50)


def ref_alpha_bars() -> list[float]:
    lo, hi = math.sqrt(0.00085), math.sqrt(0.012)
    out, a = [], 1.0
    for i in range(1000):
        beta = (lo + (hi - lo) * i / 999) ** 2
        a *= 1.0 - beta
        out.append(a)
    return out


AB = ref_alpha_bars()


def ref_ddim_timesteps(n: int) -> list[int]:
    ratio = 1000 // n
    return [i * ratio + 1 for i in reversed(range(n))]


def ref_ddim_step(x: float, eps: float, t: int, n: int) -> float:
    t_prev = t - 1000 // n
    a_t, a_prev = AB[t], (AB[t_prev] if t_prev >= 0 else AB[0])
    x0 = (x - math.sqrt(1 - a_t) * eps) / math.sqrt(a_t)
    return math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps


def ref_sigma_at(t: float) -> float:
    lo = math.floor(t)
    hi = min(lo + 1, 999)
    s_lo, s_hi = (math.sqrt((1 - AB[i]) / AB[i]) for i in (lo, hi))
    return s_lo + (s_hi - s_lo) * (t - lo)


def ref_euler_ts(n: int) -> list[float]:
    return [999.0 * i / (n - 1) for i in reversed(range(n))] if n > 1 else [0.0]


def ref_euler_step(x: float, eps: float, s: float, s_next: float, z: float,
                   ancestral: bool) -> float:
    denoised = x - s * eps
    d = (x - denoised) / s
    if not ancestral:
        return x + d * (s_next - s)
    s_up = min(s_next, math.sqrt(s_next**2 * (s**2 - s_next**2) / s**2))
    s_down = math.sqrt(s_next**2 - s_up**2)
    return x + d * (s_down - s) + z * s_up


def test_noise_schedule_is_sd15() -> None:
    np.testing.assert_allclose(alphas_cumprod(), AB, rtol=1e-12)
    assert alphas_cumprod()[0] == pytest.approx(1 - 0.00085)


@pytest.mark.parametrize("n", STEPS)
def test_ddim_timesteps_and_step(n: int) -> None:
    sch = make_schedule("ddim", n)
    assert list(sch.timesteps) == ref_ddim_timesteps(n)
    assert sch.init_sigma == 1.0 and not sch.stochastic
    rng = np.random.default_rng(n)
    for k, t in enumerate(ref_ddim_timesteps(n)):
        assert sch.in_scale[k] == 1.0  # DDIM feeds the UNet the latents unscaled
        for x, eps in rng.standard_normal((5, 2)):
            ours = sch.c_x[k] * x + sch.c_eps[k] * eps
            assert ours == pytest.approx(ref_ddim_step(x, eps, t, n), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("ancestral", [False, True], ids=["euler", "euler_a"])
@pytest.mark.parametrize("n", STEPS)
def test_euler_timesteps_sigmas_and_step(n: int, ancestral: bool) -> None:
    sch = make_schedule("euler_a" if ancestral else "euler", n)
    ts = ref_euler_ts(n)
    np.testing.assert_allclose(sch.timesteps, ts, rtol=1e-12)
    sigmas = [ref_sigma_at(t) for t in ts] + [0.0]
    assert sch.init_sigma == pytest.approx(max(sigmas), rel=1e-12)
    rng = np.random.default_rng(n)
    for k in range(n):
        assert sch.in_scale[k] == pytest.approx(1 / math.sqrt(sigmas[k] ** 2 + 1), rel=1e-12)
        for x, eps, z in rng.standard_normal((5, 3)):
            ours = sch.c_x[k] * x + sch.c_eps[k] * eps + sch.c_noise[k] * z
            ref = ref_euler_step(x, eps, sigmas[k], sigmas[k + 1], z, ancestral)
            assert ours == pytest.approx(ref, rel=1e-10, abs=1e-10)
    # The last step lands on sigma 0: no noise is added after it.
    assert sch.c_noise[-1] == 0.0


def test_unknown_scheduler_and_bad_steps_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheduler"):
        make_schedule("pndm", 20)
    with pytest.raises(ValueError, match="steps"):
        make_schedule("ddim", 0)
    assert set(SCHEDULERS) == {"ddim", "euler", "euler_a"}


# --- diffusers, where installed -----------------------------------------------------------------

# diffusers' schedulers compute in torch, which the dev extra alone does not bring.
needs_diffusers = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None or importlib.util.find_spec("torch") is None,
    reason="diffusers (the dev extra) or torch (the gpu extra) not installed: cross-check skipped")
SD15 = {"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
        "num_train_timesteps": 1000}


def _diffusers(name: str) -> object:
    import diffusers

    if name == "ddim":
        # SD 1.5's scheduler_config.json: steps_offset 1, set_alpha_to_one false, no clipping.
        return diffusers.DDIMScheduler(**SD15, clip_sample=False, set_alpha_to_one=False,
                                       steps_offset=1)
    cls = (diffusers.EulerAncestralDiscreteScheduler if name == "euler_a"
           else diffusers.EulerDiscreteScheduler)
    return cls(**SD15, timestep_spacing="linspace", steps_offset=1)


@needs_diffusers
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # diffusers' own numpy 2 notice
@pytest.mark.parametrize("n", (7, 20, 30))
@pytest.mark.parametrize("name", SCHEDULERS)
def test_trajectory_matches_diffusers(name: str, n: int) -> None:
    import torch

    ref: object = _diffusers(name)
    ref.set_timesteps(n)  # type: ignore[attr-defined]
    sch = make_schedule(name, n)
    np.testing.assert_allclose(ref.timesteps.numpy(), sch.timesteps, rtol=1e-6)  # type: ignore[attr-defined]
    assert float(ref.init_noise_sigma) == pytest.approx(sch.init_sigma, rel=1e-5)  # type: ignore[attr-defined]
    gen = torch.Generator().manual_seed(0)
    ours_gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)) * sch.init_sigma
    x_ref, x_ours = x0.clone(), x0.numpy().astype(np.float64)
    for k, t in enumerate(ref.timesteps):  # type: ignore[attr-defined]
        inp_ref = ref.scale_model_input(x_ref, t)  # type: ignore[attr-defined]
        np.testing.assert_allclose(inp_ref.numpy(), x_ours * sch.in_scale[k], rtol=2e-4,
                                   atol=2e-5)
        eps = torch.tanh(inp_ref) * 0.5 + 1e-4 * float(t)  # a smooth stand-in for the UNet
        x_ref = ref.step(eps, t, x_ref, generator=gen).prev_sample  # type: ignore[attr-defined]
        z = torch.randn(x_ref.shape, generator=ours_gen).numpy() if sch.c_noise[k] else 0.0
        x_ours = sch.c_x[k] * x_ours + sch.c_eps[k] * eps.double().numpy() + sch.c_noise[k] * z
        np.testing.assert_allclose(x_ref.numpy(), x_ours, rtol=2e-4, atol=2e-4)
