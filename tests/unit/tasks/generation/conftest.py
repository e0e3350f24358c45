"""Session fixtures for the generation tests (helpers in gen_support.py): the tiny engines are
built once per session through a temporary engine cache and shared by every test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.cache import EngineCache
from engines.models.sd.engines import SdEngines
from tests.unit.tasks.generation.gen_support import MISSING, make_engines


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> EngineCache:
    return EngineCache(tmp_path_factory.mktemp("sd-engines"))


@pytest.fixture(scope="session")
def torch_engines(engine_cache: EngineCache) -> Iterator[SdEngines]:
    if MISSING:
        pytest.skip(f"needs the gen extra ({', '.join(MISSING)} missing)")
    engines = make_engines("torch", engine_cache)
    engines.activate()
    yield engines
    engines.deactivate()


@pytest.fixture(scope="session")
def ort_engines(engine_cache: EngineCache) -> Iterator[SdEngines]:
    if MISSING:
        pytest.skip(f"needs the gen extra ({', '.join(MISSING)} missing)")
    engines = make_engines("onnxruntime", engine_cache)
    engines.activate()
    yield engines
    engines.deactivate()


@pytest.fixture()
def blob_dir(tmp_path: Path) -> Path:
    return tmp_path / "blobs"
