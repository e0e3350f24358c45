"""Blob stores for images too large to travel inside a result record.

Keys are content-addressed under the job id (``<job>/<index>-<seed>-<sha256[:16]>.png``), so a
redelivered or replayed job rewrites the same object with the same bytes: idempotent, and a
result never points at an object another attempt could change.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Protocol

from worker.config.generation import BlobSettings
from worker.exceptions import ConfigError
from worker.files import write_atomic
from worker.wire.generation_jobs import BlobRef

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def blob_key(job_id: str, index: int, seed: int, data: bytes) -> str:
    # Ids may hold any character: keep a readable prefix plus a hash that keeps ids distinct.
    safe = _UNSAFE.sub("_", job_id)[:64].strip(".") or "job"
    tag = hashlib.sha256(job_id.encode()).hexdigest()[:8]
    digest = hashlib.sha256(data).hexdigest()[:16]
    return f"{safe}-{tag}/{index:03d}-{seed}-{digest}.png"


class BlobStore(Protocol):
    def put(self, key: str, data: bytes, content_type: str) -> BlobRef: ...


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, key: str, data: bytes, content_type: str) -> BlobRef:
        path = self.root / key
        # A reader never sees a partial image, and concurrent writers of the same key (a
        # redelivered job) both leave the complete, identical file.
        write_atomic(path, data)
        return BlobRef(path.resolve().as_uri(), hashlib.sha256(data).hexdigest(), len(data),
                       content_type)


class S3BlobStore:
    """Any S3-compatible store through boto3 (credentials from boto3's usual chain)."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None, **client_args: Any
                 ) -> None:
        if client is None:
            try:
                import boto3
            except ImportError as exc:
                raise ConfigError("generation.blob.kind = 's3' needs boto3, which is not "
                                  "installed: pip install boto3") from exc
            client = boto3.client("s3", **{k: v for k, v in client_args.items() if v})
        self.bucket, self.prefix, self._client = bucket, prefix, client

    def put(self, key: str, data: bytes, content_type: str) -> BlobRef:
        full = f"{self.prefix}{key}"
        self._client.put_object(Bucket=self.bucket, Key=full, Body=data, ContentType=content_type)
        return BlobRef(f"s3://{self.bucket}/{full}", hashlib.sha256(data).hexdigest(), len(data),
                       content_type)


def make_blob_store(cfg: BlobSettings) -> BlobStore:
    if cfg.kind == "local":
        return LocalBlobStore(cfg.local_dir)
    assert cfg.s3_bucket is not None  # enforced by BlobSettings
    return S3BlobStore(cfg.s3_bucket, cfg.s3_prefix, endpoint_url=cfg.s3_endpoint_url,
                       region_name=cfg.s3_region)
