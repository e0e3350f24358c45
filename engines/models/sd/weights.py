"""Where an SD engine's weights come from: a local diffusers folder, or a seeded random init.

Both answer the same questions: the shapes (:class:`SdDims`), a stable identity per component
(the engine cache keys on it in place of ONNX bytes, since every artifact is derived from these
weights), the network with its weights, and the tokenizer. Nothing here downloads anything:
``from_pretrained`` is always called on a local path with ``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engines.exceptions import ModelNotFound
from engines.models.sd import COMPONENTS
from engines.models.sd.arch import SdArch, SdDims
from engines.models.sd.tokenizer import ClipTokenizer, HashTokenizer, Tokenizer

WEIGHT_SUFFIXES = (".safetensors", ".bin")
_EDGE = 1 << 20  # bytes hashed at each end of a weight file


class SdWeights(Protocol):
    random: bool

    @property
    def name(self) -> str: ...

    def dims(self) -> SdDims: ...

    def config(self, component: str) -> dict[str, Any]: ...

    def identity(self, component: str) -> str: ...

    def load(self, component: str, device: str = "cpu") -> Any: ...

    def tokenizer(self) -> Tokenizer: ...


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _torch_version() -> str:
    try:
        return ".".join(importlib.metadata.version("torch").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:  # identities still compare; loads fail
        return "absent"


@dataclass(frozen=True)
class RandomSdWeights:
    """The architecture ``arch`` initialised from ``seed`` (per component): benchmarks and tests.

    Never zeros: every layer gets its library's default initialisation, so kernels see the
    value ranges (and denormals, overflow) real weights would give a random input.
    """

    arch: SdArch
    seed: int = 0
    random = True

    @property
    def name(self) -> str:
        return f"{self.arch.name}-random-s{self.seed}"

    def dims(self) -> SdDims:
        return self.arch.dims()

    def config(self, component: str) -> dict[str, Any]:
        return dict(getattr(self.arch, {"text_encoder": "text"}.get(component, component)))

    def identity(self, component: str) -> str:
        # The init's RNG stream belongs to torch's version; the cached artifact pins the values.
        return _digest({"random": self.config(component), "seed": self.seed,
                        "component": component, "torch": _torch_version()})

    def load(self, component: str, device: str = "cpu") -> Any:
        import torch

        from engines.models.sd.nets import skeleton

        cuda = [torch.device(device).index or 0] if device.startswith("cuda") else []
        with torch.random.fork_rng(devices=cuda):  # leave the caller's RNG state alone
            torch.manual_seed(self.seed * 1000 + COMPONENTS.index(component))
            return skeleton(component, self.config(component), device)

    def tokenizer(self) -> Tokenizer:
        return HashTokenizer(self.arch.dims().vocab_size)


@dataclass(frozen=True)
class LocalSdWeights:
    """A diffusers-format folder: text_encoder/, tokenizer/, unet/, vae/ (SD 1.5 layout)."""

    path: Path
    random = False

    def __post_init__(self) -> None:
        missing = [c for c in (*COMPONENTS, "tokenizer") if not (self.path / c).is_dir()]
        if not self.path.is_dir() or missing:
            raise ModelNotFound(
                f"{self.path} is not a Stable Diffusion folder (missing {missing or 'folder'}); "
                "expected the diffusers layout text_encoder/, tokenizer/, unet/, vae/ with "
                "config.json and weights in each; weights are never downloaded")
        for c in COMPONENTS:
            if not (self.path / c / "config.json").is_file():
                raise ModelNotFound(f"{self.path / c} has no config.json")
            if not self._weight_files(c):
                raise ModelNotFound(f"{self.path / c} has no weights (*.safetensors or *.bin)")

    @property
    def name(self) -> str:
        return self.path.name

    def _weight_files(self, component: str) -> list[Path]:
        return sorted(p for p in (self.path / component).iterdir()
                      if p.suffix in WEIGHT_SUFFIXES and p.is_file())

    def config(self, component: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.path / component / "config.json").read_text())
        return data

    def dims(self) -> SdDims:
        text, vae = self.config("text_encoder"), self.config("vae")
        return SdDims(text_hidden=int(text["hidden_size"]), vocab_size=int(text["vocab_size"]),
                      latent_channels=int(vae.get("latent_channels", 4)),
                      vae_factor=2 ** (len(vae["block_out_channels"]) - 1),
                      scaling_factor=float(vae.get("scaling_factor", 0.18215)))

    def identity(self, component: str) -> str:
        """config.json plus each weight file's name, size and first/last MiB: a content
        fingerprint that costs milliseconds instead of hashing gigabytes at every start."""
        parts: list[object] = [self.config(component)]
        for f in self._weight_files(component):
            size = f.stat().st_size
            with f.open("rb") as fh:
                head = fh.read(_EDGE)
                fh.seek(max(0, size - _EDGE))
                tail = fh.read(_EDGE)
            parts.append([f.name, size, hashlib.sha256(head + tail).hexdigest()])
        return _digest(parts)

    def load(self, component: str, device: str = "cpu") -> Any:
        from engines.models.sd import nets

        folder = str(self.path / component)
        if component == "text_encoder":
            from transformers import CLIPTextModel

            net: Any = nets.TextEncoderNet(CLIPTextModel.from_pretrained(
                folder, local_files_only=True))
        elif component == "unet":
            from diffusers import UNet2DConditionModel

            net = nets.UNetNet(UNet2DConditionModel.from_pretrained(folder, local_files_only=True))
        else:
            from diffusers import AutoencoderKL

            vae = AutoencoderKL.from_pretrained(folder, local_files_only=True)
            net = nets.VaeDecoderNet(vae, float(vae.config.scaling_factor))
        return net.to(device).eval()

    def tokenizer(self) -> Tokenizer:
        return ClipTokenizer(self.path / "tokenizer")
