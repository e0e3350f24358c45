"""Where an SD engine's weights come from: a local diffusers folder, or a seeded random init.

Both answer the same questions: the shapes (:class:`SdDims`), a stable identity per component
(the engine cache keys on it in place of ONNX bytes, since every artifact is derived from these
weights), the network with its weights, and the tokenizer. Nothing here downloads anything. The
networks are the in-house modules (:mod:`engines.models.sd.modules`): loading a folder reads
its safetensors (or .bin) files directly and imports neither diffusers nor transformers.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from engines.exceptions import EngineError, ModelNotFound
from engines.models.sd import COMPONENTS
from engines.models.sd.arch import SdArch, SdDims
from engines.models.sd.tokenizer import ClipTokenizer, HashTokenizer, Tokenizer

WEIGHT_SUFFIXES = (".safetensors", ".bin")
_EDGE = 1 << 20  # bytes hashed at each end of a weight file
# The weight files' names as transformers and diffusers save them, preferred first (old
# transformers saved the text encoder as pytorch_model.bin).
_STEMS = {"text_encoder": ("model", "pytorch_model"), "unet": ("diffusion_pytorch_model",),
          "vae": ("diffusion_pytorch_model",)}
# Bumped when the in-house modules change their graph, parameter names or initialisation: part
# of every identity, so cached artifacts built by other code are not reused.
NETS_VERSION = "sd-modules-1"


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
                        "component": component, "torch": _torch_version(),
                        "nets": NETS_VERSION})

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
        # The in-house modules' version too: artifacts derive from the weights and the network
        # code (the torch artifact is the module's state dict, names included).
        parts: list[object] = [self.config(component), NETS_VERSION]
        for f in self._weight_files(component):
            size = f.stat().st_size
            with f.open("rb") as fh:
                head = fh.read(_EDGE)
                fh.seek(max(0, size - _EDGE))
                tail = fh.read(_EDGE)
            parts.append([f.name, size, hashlib.sha256(head + tail).hexdigest()])
        return _digest(parts)

    def checkpoint_files(self, component: str) -> list[Path]:
        """The file(s) :meth:`load` reads: the library's own name (safetensors before .bin),
        the shards an ``*.index.json`` next to it lists, else the only weight file there is
        (a variant such as ``diffusion_pytorch_model.fp16.safetensors``)."""
        folder = self.path / component
        for suffix in WEIGHT_SUFFIXES:
            for stem in _STEMS[component]:
                if (folder / f"{stem}{suffix}").is_file():
                    return [folder / f"{stem}{suffix}"]
                index = folder / f"{stem}{suffix}.index.json"
                if index.is_file():
                    try:
                        shards = set(json.loads(index.read_text())["weight_map"].values())
                    except (ValueError, KeyError, AttributeError) as exc:
                        raise EngineError(f"{index} is not a shard index: {exc!r}") from exc
                    return sorted(folder / s for s in shards)
        found = self._weight_files(component)
        for suffix in WEIGHT_SUFFIXES:
            if len(of := [p for p in found if p.suffix == suffix]) == 1:
                return of
        raise ModelNotFound(
            f"{folder}: cannot tell which weights to load among {[p.name for p in found]}; "
            f"expected {_STEMS[component][0]}.safetensors (or .bin)")

    def load(self, component: str, device: str = "cpu") -> Any:
        """The component's network with the folder's weights, float32 on ``device``. Every
        parameter is loaded strictly: a missing, unexpected or misshapen entry, or a config
        these modules do not build, is an :class:`EngineError`."""
        import torch

        from engines.models.sd import nets
        from engines.models.sd.modules import decoder_state, text_state

        folder = self.path / component
        try:
            # On the meta device: no memory; the checkpoint's tensors become the parameters
            # (assign=True), so a float32 file on the CPU is not held twice.
            net: Any = nets.skeleton(component, self.config(component), "meta",
                                     initialised=False)
        except ValueError as exc:
            raise EngineError(f"{folder / 'config.json'}: {exc}") from exc
        state = self._read_state(component)
        try:
            if component == "text_encoder":
                target, state = net.clip, text_state(state)
            elif component == "unet":
                target = net.unet
            else:
                # Only the decoder half is built (and loaded strictly); the checkpoint's
                # encoder.* and quant_conv.* entries are dropped by decoder_state.
                target, state = net, decoder_state(state)
            # Every parameter is floating point; an fp16 file is widened like from_pretrained.
            state = {k: v.to(device=device, dtype=torch.float32) for k, v in state.items()}
            target.load_state_dict(state, strict=True, assign=True)
        except (RuntimeError, ValueError) as exc:
            raise EngineError(f"{folder}: the weights do not fit its config.json: {exc}") from exc
        return net.eval()

    def _read_state(self, component: str) -> dict[str, Any]:
        import torch

        from engines.weights import load_safetensors

        state: dict[str, Any] = {}
        for f in self.checkpoint_files(component):
            if not f.is_file():
                raise ModelNotFound(f"{f} (listed in its shard index) does not exist")
            try:
                part = (load_safetensors(f) if f.suffix == ".safetensors"
                        else torch.load(f, map_location="cpu", weights_only=True))
            except Exception as exc:  # safetensors, pickle and zip raise many types
                raise EngineError(f"{f} could not be read as weights: {exc!r}") from exc
            if not isinstance(part, dict):
                raise EngineError(f"{f} holds a {type(part).__name__}, not a state dict")
            state.update(part)
        return state

    def tokenizer(self) -> Tokenizer:
        return ClipTokenizer(self.path / "tokenizer")
