"""Issue 14 item 12: malformed and oversized gRPC messages.

- A request whose bytes are not the RPC's protobuf (or whose gRPC frame is truncated or
  claims compression) is the caller's fault: INVALID_ARGUMENT naming the RPC, never INTERNAL
  or UNKNOWN (the modal client retries those silently, as if the server were broken).
- A request over the size limit is refused from its 5-byte length prefix, before its body is
  read, the way Modal's front end answers an oversized request: HTTP `:status 413` (the 1.6.4
  client recognises `"status = '413'"` as `RequestSizeError` in modal/dict.py and
  modal/queue.py). The connection stays usable afterwards.

Raw frames go over a real socket with the `h2` library (what grpclib itself is built on), so
the tests can send what no well-behaved client sends.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.encoding.proto import ProtoCodec
from grpclib.server import Server
from modal_proto import api_pb2

from emulator.handlers.base import MAX_MESSAGE_BYTES, RpcCounter, ServerConfig, build_servicer
from emulator.models import State
from emulator.store import Store
from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import reset_modal_client_caches

PATH = "/modal.client.ModalClient/{}"


# ---- a raw HTTP/2 gRPC caller ---------------------------------------------------------------
@dataclass
class RawResponse:
    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    reset: bool = False

    @property
    def grpc_status(self) -> int | None:
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def grpc_message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))


class RawH2:
    """One HTTP/2 connection; `call()` sends one gRPC request body as given."""

    def __init__(self, port: int, metadata: dict[str, str]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.metadata = metadata

    def close(self) -> None:
        self.sock.close()

    def call(self, method: str, body: bytes, *, end_stream: bool = True) -> RawResponse:
        sid = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PATH.format(method)),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc+proto"),
            ("te", "trailers"),
            *self.metadata.items(),
        ]
        self.conn.send_headers(sid, headers)
        sent = 0
        while sent < len(body):  # within the flow-control windows the server grants
            window = min(
                self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                break  # the server stopped granting: it must answer without the rest
            chunk = body[sent : sent + window]
            self.conn.send_data(sid, chunk)
            sent += len(chunk)
            self.sock.sendall(self.conn.data_to_send())
        if end_stream and sent == len(body):
            self.conn.end_stream(sid)
        self.sock.sendall(self.conn.data_to_send())
        return self._read(sid)

    def _read(self, sid: int) -> RawResponse:
        out = RawResponse()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            raw = self.sock.recv(65536)
            if not raw:
                raise AssertionError("the emulator closed the connection")
            for event in self.conn.receive_data(raw):
                if getattr(event, "stream_id", sid) != sid:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    out.headers = {_s(k): _s(v) for k, v in event.headers}
                elif isinstance(event, h2.events.TrailersReceived):
                    out.trailers = {_s(k): _s(v) for k, v in event.headers}
                elif isinstance(event, h2.events.DataReceived):
                    out.data += event.data
                    self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, h2.events.StreamReset):
                    out.reset = True
                    return out
                if isinstance(event, h2.events.StreamEnded):
                    self.sock.sendall(self.conn.data_to_send())
                    return out
            self.sock.sendall(self.conn.data_to_send())
        raise AssertionError(f"no complete answer within 10 s (got {out})")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _frame(message: bytes, *, length: int | None = None, compressed: bool = False) -> bytes:
    size = len(message) if length is None else length
    return struct.pack(">?I", compressed, size) + message


@pytest.fixture
def raw(emulator: EmulatorProcess) -> Iterator[RawH2]:
    conn = RawH2(
        emulator.port,
        {"x-modal-token-id": emulator.token_id or "", "x-modal-token-secret": _secret(emulator)},
    )
    try:
        yield conn
    finally:
        conn.close()


def _secret(emu: EmulatorProcess) -> str:
    return str(emu.client_env()["MODAL_TOKEN_SECRET"])


def _ok(conn: RawH2) -> None:
    """A well-formed SecretList on the same connection still answers OK."""
    resp = conn.call("SecretList", _frame(api_pb2.SecretListRequest().SerializeToString()))
    assert resp.headers.get(":status") == "200" and resp.grpc_status == 0, resp
    api_pb2.SecretListResponse.FromString(resp.data[5:])


# ---- malformed messages ----------------------------------------------------------------------
MALFORMED = {
    "truncated-field": b"\x0a\x05ab",  # field 1, length 5, only 2 bytes follow
    "bad-varint": b"\x08" + b"\xff" * 11,  # a varint longer than 10 bytes
    "wire-type-7": b"\x0f",  # field 1 with a wire type that does not exist
    "bad-utf8-string": b"\x0a\x02\xff\xfe",  # environment_name (string) not UTF-8
}


class _BytesCodec(ProtoCodec):
    """Sends `bytes` as they are (the body of a well-framed but malformed message)."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)


@pytest.mark.parametrize("body", list(MALFORMED.values()), ids=list(MALFORMED))
def test_14_12_malformed_protobuf_is_invalid_argument(
    emulator: EmulatorProcess, body: bytes
) -> None:
    async def call() -> GRPCError:
        channel = Channel("127.0.0.1", emulator.port, codec=_BytesCodec())
        metadata = {
            "x-modal-token-id": emulator.token_id or "",
            "x-modal-token-secret": _secret(emulator),
        }
        try:
            async with channel.request(
                PATH.format("SecretList"),
                Cardinality.UNARY_UNARY,
                bytes,
                api_pb2.SecretListResponse,
                metadata=metadata,
                timeout=10,
            ) as stream:
                await stream.send_message(body, end=True)
                await stream.recv_message()
        except GRPCError as exc:
            return exc
        finally:
            channel.close()
        raise AssertionError("a malformed request was answered OK")

    err = asyncio.run(call())
    assert err.status == Status.INVALID_ARGUMENT, (err.status, err.message)
    assert "SecretList" in (err.message or "") and "protobuf" in (err.message or "")
    assert "Traceback" not in emulator.stderr_tail(200)  # a client fault, not a handler crash


def test_14_12_truncated_grpc_frame_is_invalid_argument(raw: RawH2) -> None:
    resp = raw.call("SecretList", _frame(b"\x0a\x01a", length=100))  # says 100, sends 3
    assert resp.grpc_status == Status.INVALID_ARGUMENT.value, resp
    assert "100" in resp.grpc_message and "SecretList" in resp.grpc_message
    _ok(raw)


def test_14_12_empty_request_is_invalid_argument(raw: RawH2) -> None:
    resp = raw.call("SecretList", b"")  # the stream ends without any message
    assert resp.grpc_status == Status.INVALID_ARGUMENT.value, resp
    resp = raw.call("SecretList", b"\x00\x00")  # ends inside the 5-byte prefix
    assert resp.grpc_status == Status.INVALID_ARGUMENT.value, resp
    _ok(raw)


def test_14_12_compressed_message_is_invalid_argument(raw: RawH2) -> None:
    resp = raw.call("SecretList", _frame(b"", compressed=True))
    assert resp.grpc_status == Status.INVALID_ARGUMENT.value, resp
    assert "compress" in resp.grpc_message
    _ok(raw)


# ---- the size limit --------------------------------------------------------------------------
def test_14_12_oversized_message_is_refused_from_its_prefix(
    raw: RawH2, emulator: EmulatorProcess
) -> None:
    # Claims one byte over the limit and sends 1 KiB of it, without ending the stream: the
    # emulator must answer at once from the prefix (it never waits for or buffers the body).
    started = time.monotonic()
    resp = raw.call(
        "SecretList", _frame(b"\x00" * 1024, length=MAX_MESSAGE_BYTES + 1), end_stream=False
    )
    assert time.monotonic() - started < 5
    assert resp.headers.get(":status") == "413", resp
    assert resp.grpc_status == Status.RESOURCE_EXHAUSTED.value, resp
    assert str(MAX_MESSAGE_BYTES) in resp.grpc_message and "SecretList" in resp.grpc_message
    _ok(raw)  # the same connection keeps working
    assert "Traceback" not in emulator.stderr_tail(200)


def test_14_12_largest_inline_file_the_client_sends_fits(modal_env: EmulatorProcess) -> None:
    # modal/_utils/blob_utils.py: files below LARGE_FILE_LIMIT (4 MiB) travel inline in
    # MountPutFile; the biggest such message must be accepted.
    from modal._utils.blob_utils import LARGE_FILE_LIMIT

    data = b"\x01" * (LARGE_FILE_LIMIT - 1)
    req = api_pb2.MountPutFileRequest(sha256_hex=hashlib.sha256(data).hexdigest(), data=data)
    assert req.ByteSize() < MAX_MESSAGE_BYTES
    assert raw_rpc("MountPutFile", req).exists


class _InProcessEmulator:
    """The gRPC servicer on a real socket in a thread, with a small message limit."""

    def __init__(self, max_message_bytes: int) -> None:
        self.store = Store(None)
        state = State(self.store, "emu-workspace")
        config = ServerConfig(
            workspace="emu-workspace",
            http_url="http://127.0.0.1:1",
            max_message_bytes=max_message_bytes,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> Server:
            server = Server([build_servicer(state, config, RpcCounter())])
            await server.start("127.0.0.1", 0)
            return server

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.port = int(self.server._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self.store.close()


def test_14_12_modal_client_gets_413_and_its_connection_survives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit = 64 * 1024
    emu = _InProcessEmulator(limit)
    try:
        monkeypatch.setenv("MODAL_SERVER_URL", f"http://127.0.0.1:{emu.port}")
        monkeypatch.setenv("MODAL_TOKEN_ID", "ak-anything")
        monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-anything")
        reset_modal_client_caches()
        small = b"\x02" * (limit - 100)
        ok = api_pb2.MountPutFileRequest(sha256_hex=hashlib.sha256(small).hexdigest(), data=small)
        assert raw_rpc("MountPutFile", ok).exists
        # 6 MiB: more than grpclib's default 4 MiB stream and connection windows, three times
        # on one client connection: refused each time, and no flow-control window leaks.
        big = b"\x03" * (6 << 20)
        too_big = api_pb2.MountPutFileRequest(sha256_hex=hashlib.sha256(big).hexdigest(), data=big)
        for _ in range(3):
            with pytest.raises(Exception, match="status = '413'"):
                raw_rpc("MountPutFile", too_big)
        assert raw_rpc("MountPutFile", ok).exists  # the same cached client still works
    finally:
        reset_modal_client_caches()
        emu.close()
