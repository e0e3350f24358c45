"""Blob stores and the size rule that sends a result's images to them."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.config.generation import BlobSettings
from worker.exceptions import ConfigError
from worker.tasks.generation.blobs import LocalBlobStore, S3BlobStore, blob_key, make_blob_store
from worker.tasks.generation.results import fit_result
from worker.wire.generation_codec import encode_generation_result
from worker.wire.generation_jobs import GeneratedImage, GenerationResult
from worker.wire.moderation_jobs import Status

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8


def result(n: int = 2) -> GenerationResult:
    images = tuple(GeneratedImage(i, 10 + i, 64, 64, png=PNG + bytes([i])) for i in range(n))
    return GenerationResult("job/1 ü", Status.OK, "m", {"text_encoder": "a", "unet": "b",
                                                        "vae": "c"}, True, images,
                            {"total": 5.0})


def test_blob_key_is_safe_distinct_and_content_addressed() -> None:
    k = blob_key("../etc/passwd", 3, 99, b"x")
    assert "/" in k and ".." not in k.split("/")[0] and k.endswith(".png")
    assert k.split("/")[1].startswith("003-99-")
    assert blob_key("a/b", 0, 1, b"x") != blob_key("a_b", 0, 1, b"x")  # same safe prefix
    assert blob_key("j", 0, 1, b"x") != blob_key("j", 0, 1, b"y")


def test_local_store_writes_atomically_and_idempotently(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    ref = store.put("j/000.png", PNG, "image/png")
    again = store.put("j/000.png", PNG, "image/png")
    assert ref == again and ref.uri == (tmp_path / "j/000.png").resolve().as_uri()
    assert ref.sha256 == hashlib.sha256(PNG).hexdigest() and ref.bytes == len(PNG)
    assert (tmp_path / "j/000.png").read_bytes() == PNG
    assert [p.name for p in (tmp_path / "j").iterdir()] == ["000.png"]  # no temp files left


def test_small_results_stay_inline() -> None:
    r = result()
    assert fit_result(r, 1_000_000, _NoStore(), lambda: 0.0) is r


def test_large_results_move_every_image_to_the_store(tmp_path: Path) -> None:
    r = result(3)
    clock = iter([1.0, 1.25])
    fitted = fit_result(r, len(encode_generation_result(r)) - 1, LocalBlobStore(tmp_path),
                        lambda: next(clock))
    assert all(im.png is None and im.blob is not None for im in fitted.images)
    assert [im.index for im in fitted.images] == [0, 1, 2]
    assert fitted.timings_ms["blob"] == 250.0 and fitted.timings_ms["total"] == 255.0
    for im, orig in zip(fitted.images, r.images, strict=True):
        assert im.blob is not None
        assert Path(im.blob.uri.removeprefix("file://")).read_bytes() == orig.png


class _NoStore:
    def put(self, key: str, data: bytes, content_type: str) -> Any:
        raise AssertionError("nothing should be stored")


class FakeS3:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], tuple[bytes, str]] = {}

    def put_object(self, *, Bucket: str, Key: str, Body: bytes, ContentType: str) -> None:
        self.objects[(Bucket, Key)] = (Body, ContentType)


def test_s3_store_puts_under_the_prefix() -> None:
    client = FakeS3()
    ref = S3BlobStore("ads", "gen/", client=client).put("j/0.png", PNG, "image/png")
    assert ref.uri == "s3://ads/gen/j/0.png"
    assert client.objects[("ads", "gen/j/0.png")] == (PNG, "image/png")


def test_s3_without_boto3_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` fail
    with pytest.raises(ConfigError, match="needs boto3"):
        make_blob_store(BlobSettings(kind="s3", s3_bucket="ads"))


def test_s3_settings_need_a_bucket() -> None:
    with pytest.raises(ValueError, match="s3_bucket"):
        BlobSettings(kind="s3")


def test_default_store_is_a_local_directory(tmp_path: Path) -> None:
    store = make_blob_store(BlobSettings(local_dir=tmp_path))
    assert isinstance(store, LocalBlobStore) and store.root == tmp_path
