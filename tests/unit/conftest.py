"""Shared fixtures for the unit suite (no broker, no network).

- ``contract``: the JSON Schema files in ``schemas/`` as validators of both sides of the wire
  (the JSON view, and the msgpack side through it: :mod:`tests.contract`).
- ``sample_path``: any test asking for it runs once per image in ``worker/samples``.
- The environment is scrubbed of ``KTW_*`` and ``KAFKA_BOOTSTRAP_SERVERS`` per module, so a
  developer's shell cannot change what ``load_config()`` returns in these tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import worker
from tests.contract import SCHEMAS, Contract

SAMPLES_DIR = Path(worker.__file__).parent / "samples"
SAMPLES = sorted(p for p in SAMPLES_DIR.iterdir() if p.suffix.lower() != ".md")


@pytest.fixture(scope="module", autouse=True)
def _hermetic_env() -> Iterator[None]:
    # Module scope (not session): autouse fixtures run before the module's other fixtures, and
    # the environment is restored after each module, so integration tests run later in the same
    # session still see the caller's KAFKA_BOOTSTRAP_SERVERS.
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("KTW_") or name == "KAFKA_BOOTSTRAP_SERVERS":
                mp.delenv(name)
        yield


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sample_path" in metafunc.fixturenames:
        metafunc.parametrize("sample_path", SAMPLES, ids=[p.name for p in SAMPLES])


@pytest.fixture(scope="session")
def sample_paths() -> list[Path]:
    assert len(SAMPLES) >= 8, f"expected the bundled sample images in {SAMPLES_DIR}"
    return SAMPLES


# --- the wire contract ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def contract() -> Contract:
    return Contract(SCHEMAS)
