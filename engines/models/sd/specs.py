"""EngineSpecs and static profiles of the three SD engines.

Profiles are static buckets (one CUDA graph each on the torch backend):
- text encoder: token length 77, batch sizes for prompt + negative-prompt rows;
- UNet: one profile per resolution, item = latent [4, h/8, w/8]; batch sizes are even because
  every image occupies a classifier-free-guidance pair (unconditional + conditional rows);
- VAE decoder: one profile per resolution, item = latent, batch = images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.models.sd.arch import SdDims
from engines.models.sd.export import OnnxFromNet
from engines.models.sd.weights import SdWeights
from engines.profiles import Profile, StaticProfile
from engines.spec import EngineSpec, NativeNet, TensorSpec

TEXT_SIZES = (2, 4, 8, 16)
UNET_SIZES = (2, 4, 8, 16)
VAE_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class Resolution:
    width: int
    height: int

    @property
    def name(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class SdProfiles:
    text: StaticProfile
    unet: dict[Resolution, StaticProfile]
    vae: dict[Resolution, StaticProfile]

    def of(self, component: str) -> tuple[Profile, ...]:
        if component == "text_encoder":
            return (self.text,)
        return tuple((self.unet if component == "unet" else self.vae).values())


def sd_profiles(dims: SdDims, resolutions: tuple[Resolution, ...], *,
                text_sizes: tuple[int, ...] = TEXT_SIZES, unet_sizes: tuple[int, ...] = UNET_SIZES,
                vae_sizes: tuple[int, ...] = VAE_SIZES) -> SdProfiles:
    if any(b % 2 for b in unet_sizes):
        raise ValueError(f"UNet batch sizes must be even (CFG pairs), got {unet_sizes}")
    for r in resolutions:
        # The UNet halves the latent once per down block after the first: 3 times in SD 1.5.
        if r.width % (dims.vae_factor * 8) or r.height % (dims.vae_factor * 8):
            raise ValueError(f"resolution {r.name} is not a multiple of {dims.vae_factor * 8}")
    latent = {r: dims.latent_shape(r.width, r.height) for r in resolutions}
    return SdProfiles(
        text=StaticProfile(f"text-{dims.max_tokens}", (dims.max_tokens,), text_sizes),
        unet={r: StaticProfile(f"unet-{r.name}", latent[r], unet_sizes) for r in resolutions},
        vae={r: StaticProfile(f"vae-{r.name}", latent[r], vae_sizes) for r in resolutions},
    )


def io_specs(component: str, dims: SdDims) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    c, t, d = dims.latent_channels, dims.max_tokens, dims.text_hidden
    if component == "text_encoder":
        return ((TensorSpec("input_ids", (-1, t), "int64"),),
                (TensorSpec("text_embeddings", (-1, t, d)),))
    if component == "unet":
        return ((TensorSpec("sample", (-1, c, -1, -1)), TensorSpec("timestep", (-1,)),
                 TensorSpec("encoder_hidden_states", (-1, t, d))),
                (TensorSpec("noise_pred", (-1, c, -1, -1)),))
    return ((TensorSpec("latents", (-1, c, -1, -1)),),
            (TensorSpec("image", (-1, -1, -1, 3), "uint8"),))


def sd_spec(weights: SdWeights, component: str, precision: str = "fp16") -> EngineSpec:
    dims = weights.dims()
    inputs, outputs = io_specs(component, dims)
    return EngineSpec(model_id=f"{weights.name}.{component}",
                      onnx=OnnxFromNet(weights, component), inputs=inputs, outputs=outputs,
                      precision=precision, native=_native(weights, component))


def _native(weights: SdWeights, component: str) -> NativeNet:
    """The network from the weights (built on the device it runs on), or its skeleton for the
    cached state dict. Its graphs are large: captured at first use into one shared pool."""

    def skeleton(device: str) -> Any:
        from engines.models.sd import nets

        # Every parameter is overwritten by the cached state dict: none is initialised first.
        return nets.skeleton(component, weights.config(component), device, initialised=False)

    return NativeNet(lambda device: (weights.load(component, device),
                                     weights.identity(component)),
                     skeleton, build_on_target=weights.random, shared_graph_pool=True)
