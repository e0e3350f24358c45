"""The job encoder (`encode_generation_job`) against the schema and its examples, and the
`trt-worker generate` helpers that need no broker (ids, seeds, saving images)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from typer.testing import CliRunner

from worker.exceptions import JobRejected, SchemaViolation
from worker.tools.cli import app
from worker.tools.generate import (
    GenerateRequest,
    build_jobs,
    image_bytes,
    job_ids,
    save_images,
)
from worker.wire.generation_codec import decode_generation_job, encode_generation_job

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "schemas" / "examples")
                  .glob("generation-job.*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_encoder_reproduces_every_job_example(contract: Any, path: Path) -> None:
    name = contract.name_for_example(path)
    wire = contract.to_wire(name, json.loads(path.read_text()))
    fields = {k: v for k, v in wire.items() if k not in ("v", "id", "prompt")}
    payload = encode_generation_job(wire["id"], wire["prompt"], version=wire["v"], **fields)
    assert msgpack.unpackb(payload, raw=False) == wire
    assert contract.errors(name, msgpack.unpackb(payload, raw=False)) == []


def test_build_jobs_writes_the_requested_version() -> None:
    (_, v1), = build_jobs(GenerateRequest("a cat", job_id="j"))
    (_, v2), = build_jobs(GenerateRequest("a cat", job_id="j", version=2))
    assert decode_generation_job(v1).schema_version == 1
    assert decode_generation_job(v2).schema_version == 2


def test_encoder_leaves_out_unset_fields_and_takes_the_defaults(contract: Any) -> None:
    payload = encode_generation_job("j", "a cat", num_images=2)
    doc = msgpack.unpackb(payload, raw=False)
    assert doc == {"v": 1, "id": "j", "prompt": "a cat", "num_images": 2}
    assert contract.errors("generation-job", doc) == []
    job = decode_generation_job(payload)
    assert (job.width, job.height, job.steps, job.scheduler, job.num_images) == (
        512, 512, 30, "ddim", 2)


@pytest.mark.parametrize("bad", [{"scheduler": "pndm"}, {"width": 500}, {"steps": 0},
                                 {"seed": 2**32}, {"num_images": 65}, {"guidance_scale": 31.0}])
def test_encoder_refuses_what_the_contract_refuses(contract: Any, bad: dict[str, Any]) -> None:
    with pytest.raises(SchemaViolation):
        encode_generation_job("j", "a cat", **bad)
    doc = msgpack.unpackb(encode_generation_job("j", "a cat", validate=False, **bad), raw=False)
    assert contract.errors("generation-job", doc) != []


def test_encoder_refuses_a_blank_prompt() -> None:
    with pytest.raises(JobRejected):
        encode_generation_job("j", "   ")


def test_several_jobs_get_distinct_ids_and_non_overlapping_seeds() -> None:
    req = GenerateRequest("a cat", num_images=4, seed=2**32 - 2, jobs=3, job_id="batch")
    jobs = build_jobs(req)
    assert [i for i, _ in jobs] == ["batch-0000", "batch-0001", "batch-0002"]
    decoded = [decode_generation_job(p) for _, p in jobs]
    assert [j.seed for j in decoded] == [2**32 - 2, 2, 6]
    assert len({j.image_seed(i) for j in decoded for i in range(4)}) == 12


def test_one_job_keeps_its_id_and_random_ids_are_unique() -> None:
    assert job_ids(GenerateRequest("p", job_id="mine")) == ["mine"]
    assert job_ids(GenerateRequest("p")) != job_ids(GenerateRequest("p"))


def test_deadline_is_relative_to_now() -> None:
    ((_, payload),) = build_jobs(GenerateRequest("p", deadline_in_ms=500), now_ms=1_000)
    assert decode_generation_job(payload).deadline_ms == 1_500


def test_save_images_writes_inline_and_local_blob_pngs(tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n blob"
    blob = tmp_path / "store" / "x y.png"
    blob.parent.mkdir()
    blob.write_bytes(png)
    result = {"id": "job/1", "images": [
        {"index": 0, "seed": 5, "png": b"\x89PNG inline"},
        {"index": 1, "seed": 6, "blob": {"uri": blob.resolve().as_uri()}},
        {"index": 2, "seed": 7, "blob": {"uri": "s3://bucket/k.png"}}]}
    lines = save_images(result, tmp_path / "out", tmp_path / "store")
    assert (tmp_path / "out" / "job_1-0-5.png").read_bytes() == b"\x89PNG inline"
    assert (tmp_path / "out" / "job_1-1-6.png").read_bytes() == png
    assert "s3://bucket/k.png" in lines[2]
    assert image_bytes({"blob": {"uri": "s3://b/k"}}, tmp_path / "store") is None


def test_a_result_cannot_make_generate_copy_files_outside_the_blob_store(
        tmp_path: Path) -> None:
    """A result on the topic names a file:// URI: only PNGs inside generation.blob.local_dir
    are copied (before: any file the user could read, e.g. a private key)."""
    store = tmp_path / "store"
    store.mkdir()
    secret = tmp_path / "id_rsa"
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    (store / "link.png").symlink_to(secret)
    (store / "not-a.png").write_bytes(b"plain text with a .png name")
    for uri in (secret.as_uri(), (store / "link.png").as_uri(), (store / "not-a.png").as_uri(),
                f"file://{store}/../id_rsa"):
        assert image_bytes({"blob": {"uri": uri}}, store) is None, uri


def test_generate_refuses_an_invalid_job_before_connecting() -> None:
    res = CliRunner().invoke(app, ["generate", "a cat", "-b", "127.0.0.1:1", "--width", "500"])
    assert res.exit_code != 0
    assert "invalid generation job" in str(res.exception)
