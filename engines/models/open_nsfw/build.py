"""open_nsfw's native network for the torch backend: built from the ONNX's weights (a fresh
engine, or the torch artifact's build), or as a skeleton for the cached artifact; and the
pixel transform the GPU pipeline captures in front of it. torch is imported when called."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engines.loaders import OnnxModel
from engines.spec import NativeNet

# Yahoo's reference preprocessing subtracts these BGR channel means from 0..255 pixels.
PIXEL_MEAN_BGR = (104.0, 117.0, 123.0)


def native_open_nsfw(onnx: Callable[[], OnnxModel]) -> NativeNet:
    def fresh(device: str) -> tuple[Any, str]:
        from engines.models.open_nsfw.net import build_module

        model = onnx()
        return build_module(model.data), model.sha256

    def skeleton(device: str) -> Any:
        from engines.models.open_nsfw.net import OpenNsfwNet

        return OpenNsfwNet()

    # NHWC input: the convolutions run in channels-last memory, which that layout already is.
    return NativeNet(fresh, skeleton, channels_last=True, pixel_input=pixels_to_input)


def pixels_to_input(device: Any) -> Callable[[Any], Any]:
    """uint8 RGB NHWC pixels -> float BGR minus the channel means, on ``device``."""
    import torch

    mean = torch.tensor(PIXEL_MEAN_BGR, device=device, dtype=torch.float32)

    def convert(x: Any) -> Any:
        return x.flip(-1).float() - mean

    return convert
