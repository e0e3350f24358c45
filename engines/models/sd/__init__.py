"""Stable-Diffusion-1.5-layout generation engines: CLIP text encoder, UNet and VAE decoder.

Each is an engine of its own (spec, static profiles, cache recipe, runner). Weights come from
a local diffusers-format folder the user names (:class:`~engines.models.sd.weights.LocalSdWeights`)
or, for tests, demos and benchmarks, from a seeded random initialisation of the same
architecture (:class:`~engines.models.sd.weights.RandomSdWeights`). Nothing is downloaded.
torch is imported lazily, only where a network is built; the networks are the in-house modules
of :mod:`engines.models.sd.modules` (diffusers and transformers are test references only).
"""

from __future__ import annotations

COMPONENTS = ("text_encoder", "unet", "vae")
