"""Blobs through the SDK's own upload/download code: BlobCreate, HTTP PUT (md5 ETag), BlobGet."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import urllib.error
import urllib.request

import pytest
from modal.exception import InvalidError
from modal_proto import api_pb2

from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess


def test_blob_round_trip_through_the_client(modal_env: EmulatorProcess) -> None:
    from modal._utils.async_utils import synchronizer
    from modal._utils.blob_utils import blob_download, blob_upload
    from modal.client import _Client

    payload = os.urandom(4 * 1024 * 1024 + 17)

    async def round_trip() -> tuple[str, bytes]:
        client = await _Client.from_env()
        blob_id = await blob_upload(payload, client._stub)  # checks the ETag against its md5
        return blob_id, await blob_download(blob_id, client._stub)

    blob_id, back = synchronizer.create_blocking(round_trip)()
    assert blob_id.startswith("bl-") and back == payload
    (blob,) = modal_env.state()["blobs"]
    assert (blob["id"], blob["content_length"]) == (blob_id, len(payload))
    counts = modal_env.rpc_counts()
    assert (counts["BlobCreate"], counts["BlobGet"]) == (1, 1)


def test_blob_put_rejects_bytes_that_do_not_match_the_announced_md5(
    modal_env: EmulatorProcess,
) -> None:
    good = b"x" * 1000
    resp = raw_rpc(
        "BlobCreate",
        api_pb2.BlobCreateRequest(
            content_md5=base64.b64encode(hashlib.md5(good).digest()).decode(),
            content_sha256_base64=base64.b64encode(hashlib.sha256(good).digest()).decode(),
            content_length=len(good),
        ),
    )
    url = resp.upload_urls.items[0]
    assert url.startswith(modal_env.control_url + "/blobs/bl-")
    bad = urllib.request.Request(url, data=b"y" * 1000, method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=5)
    assert info.value.code == 400
    assert b"Content-MD5 you specified did not match" in info.value.read()
    ok = urllib.request.Request(url, data=good, method="PUT")
    with urllib.request.urlopen(ok, timeout=5) as answer:
        assert answer.status == 200
        assert answer.headers["ETag"] == f'"{hashlib.md5(good).hexdigest()}"'


def test_oversized_bodies_are_answered_413(modal_env: EmulatorProcess) -> None:
    blob_id = raw_rpc("BlobCreate", api_pb2.BlobCreateRequest(content_length=1)).blob_id
    host, port = modal_env.control_url.removeprefix("http://").split(":")
    for target, length in ((f"/blobs/{blob_id}", 2 << 30), ("/_emulator/usage", 2 << 20)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                f"PUT {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()
                if target.startswith("/blobs")
                else f"POST {target} HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode()
            )
            answer = sock.makefile("rb").read()  # the server answers, then closes
        assert answer.startswith(b"HTTP/1.1 413 Payload Too Large"), answer[:200]
        assert b"exceeds this route's" in answer


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (api_pb2.BlobCreateRequest(content_md5="not base64!", content_length=1), "content_md5"),
        (
            api_pb2.BlobCreateRequest(content_sha256_base64="YWJj", content_length=1),
            "32-byte digest",
        ),
    ],
)
def test_blob_create_checks_digests(
    modal_env: EmulatorProcess, request_: api_pb2.BlobCreateRequest, message: str
) -> None:
    with pytest.raises(InvalidError, match=message):
        raw_rpc("BlobCreate", request_)
    assert modal_env.state()["blobs"] == []


def test_mount_put_file_checks_the_hash_is_hex(modal_env: EmulatorProcess) -> None:
    with pytest.raises(InvalidError, match="64 lowercase hex digits"):
        raw_rpc("MountPutFile", api_pb2.MountPutFileRequest(sha256_hex="z" * 64, data=b"x"))
