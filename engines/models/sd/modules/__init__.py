"""SD 1.5's three networks as plain torch modules with the reference libraries' parameter names
(transformers' ``CLIPTextModel``, diffusers' ``UNet2DConditionModel`` and the decoding half of
``AutoencoderKL``), built from the same ``config.json`` dicts, so those libraries' checkpoints
load with ``load_state_dict(strict=True)``. Serving imports neither library (they cost seconds
of start-up); the tests build them as the reference these modules are checked against.

Only the SD 1.5 layout is built (its block types and options); a config asking for anything
else is a ``ValueError`` naming the key (:mod:`.config`). Imports torch.
"""

from __future__ import annotations

from engines.models.sd.modules.text import ClipTextModel, text_state
from engines.models.sd.modules.unet import UNet2DCondition
from engines.models.sd.modules.vae import VaeDecoder, decoder_state

__all__ = ["ClipTextModel", "UNet2DCondition", "VaeDecoder", "decoder_state", "text_state"]
