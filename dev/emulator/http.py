"""HTTP/1.1 side port: blob upload/download (what S3 does for Modal) and the control surface.

Routes:
- `PUT /blobs/<blob id>`: raw bytes of a blob reserved by BlobCreate; answers 200 with
  `ETag: "<md5 hex>"` like S3 (the client checks it).
- `GET /blobs/<blob id>`: the bytes back (BlobGet hands out this URL).
- `GET /_emulator/state`: JSON dump of the state (no secret values, no file bytes).
- `POST /_emulator/reset`: empty the state (default environment re-created), zero RPC counts.
- `POST /_emulator/usage` with `{"environment": NAME, "usd": FLOAT}`: set current-cycle usage.
- `GET /_emulator/rpc-counts`: `{"Method": count, ...}` since the last reset (calls made by
  running containers as `"container:Method"`).
- `POST /_emulator/proxy-auth` with `{"token_id", "token_secret", "environment"}`: what
  Modal's edge decides for `Modal-Key`/`Modal-Secret` headers: 200 `{"allowed": true}`, or 401.
- `POST /_emulator/faults`: arm an injected RPC failure for tests (dev/emulator/faults.py).
- `GET /_emulator/health`: `{"ok": true}`.

When the emulator was started with `--token-id/--token-secret`, every `/_emulator/*` route
except health requires `Authorization: Bearer <token id>:<token secret>` (401 otherwise):
the control surface can reset all state. Blob URLs stay open, like presigned S3 URLs (their
ids are unguessable and only BlobCreate/BlobGet hand them out).

A deliberately small server on asyncio streams (stdlib only), sharing the gRPC event loop.
Blob bodies (up to MAX_BLOB_BYTES) are streamed to a temporary file while their md5 is
computed, then copied into SQLite in chunks, so a large upload is never held in memory
whole; control-surface bodies are capped at MAX_CONTROL_BODY_BYTES. A body over its cap is
answered 413 (and the connection closed). Only single-PUT uploads exist: Modal's multipart
upload (`upload_urls` with several parts) is not emulated; BlobCreate always hands out one URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import json
import logging
import math
import tempfile
from typing import IO, Any

from emulator.errors import EmulatorError
from emulator.faults import FAULTS
from emulator.handlers.base import RpcCounter
from emulator.models import State

log = logging.getLogger("emulator.http")

MAX_BLOB_BYTES = 1 << 30
MAX_CONTROL_BODY_BYTES = 1 << 20
_CHUNK = 1 << 20
_HTTP_STATUS = {
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 409,
    "INTERNAL": 500,
}
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
_REASONS |= {405: "Method Not Allowed"}
_REASONS |= {409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error"}

Response = tuple[int, dict[str, str], bytes]


def _faults(body: bytes) -> Response:
    """Arm a fault (dev/emulator/faults.py) or, with {"clear": true}, disarm all."""
    try:
        payload = json.loads(body or b"{}")
        if isinstance(payload, dict) and payload.get("clear") is True:
            FAULTS.clear()
            return _json(200, {"ok": True})
        fault = FAULTS.arm(payload)
    except ValueError as exc:  # also malformed JSON
        raise HttpError(400, f"fault: {exc}") from None
    return _json(200, {"armed": fault.__dict__})


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(status: int, obj: Any) -> Response:
    return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()


class ControlServer:
    """Serves the routes above on (host, port); port 0 picks a free one."""

    def __init__(
        self,
        state: State,
        counter: RpcCounter,
        host: str,
        port: int,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.state = state
        self.counter = counter
        self._bearer = f"Bearer {credentials[0]}:{credentials[1]}" if credentials else None
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        #: (method, path) -> handler(body) added by other parts (the runtime's routes).
        self.extra_routes: dict[tuple[str, str], Any] = {}
        #: Called after `/_emulator/reset` emptied the state (the runtime forgets its containers).
        self.reset_hooks: list[Any] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # ---- connection handling ------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                parts = line.decode("latin-1").split()
                if len(parts) != 3:
                    await self._write(
                        writer, _json(400, {"error": "malformed request line"}), False
                    )
                    break
                method, target, version = parts
                headers: dict[str, str] = {}
                while True:
                    hline = await reader.readline()
                    if hline in (b"\r\n", b"\n", b""):
                        break
                    key, _, value = hline.decode("latin-1").partition(":")
                    headers[key.strip().lower()] = value.strip()
                if headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                keep_alive = (
                    version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                )
                try:
                    response = await self._serve_one(method, target, headers, reader)
                except HttpError as exc:  # the body could not be read: answer, then hang up
                    await self._write(writer, _json(exc.status, {"error": str(exc)}), False)
                    break
                await self._write(writer, response, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("HTTP connection handler crashed")
        finally:
            writer.close()

    async def _serve_one(
        self, method: str, target: str, headers: dict[str, str], reader: asyncio.StreamReader
    ) -> Response:
        path = target.split("?", 1)[0]
        if method == "PUT" and path.startswith("/blobs/"):
            with tempfile.TemporaryFile() as spool:
                md5 = hashlib.md5()  # noqa: S324 (S3's ETag is an md5)
                size = await self._read_body(reader, headers, MAX_BLOB_BYTES, spool, md5)
                spool.seek(0)
                return self._guarded(
                    method, path, lambda: self._put_blob(path, spool, size, md5.hexdigest())
                )
        body = io.BytesIO()  # at most MAX_CONTROL_BODY_BYTES
        await self._read_body(reader, headers, MAX_CONTROL_BODY_BYTES, body, None)
        if not self._authorized(path, headers):
            return _json(
                401,
                {
                    "error": f"{method} {path} needs 'Authorization: Bearer <token id>:<token "
                    "secret>' with the credentials the emulator was started with"
                },
            )
        return self._respond(method, target, body.getvalue())

    def _authorized(self, path: str, headers: dict[str, str]) -> bool:
        if self._bearer is None or not path.startswith("/_emulator/"):
            return True
        if path == "/_emulator/health":
            return True
        given = headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), self._bearer.encode())

    @staticmethod
    async def _read_body(
        reader: asyncio.StreamReader,
        headers: dict[str, str],
        limit: int,
        sink: IO[bytes],
        md5: Any,
    ) -> int:
        """Copy the request body into `sink` (updating `md5`); its size. HttpError 413/400."""

        def too_large(size: int) -> HttpError:
            return HttpError(
                413, f"request body of {size} bytes or more exceeds this route's {limit} bytes"
            )

        async def copy(n: int) -> None:
            while n > 0:
                chunk = await reader.readexactly(min(n, _CHUNK))
                sink.write(chunk)
                if md5 is not None:
                    md5.update(chunk)
                n -= len(chunk)

        total = 0
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readline()
                try:
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    raise HttpError(400, "malformed chunk size in a chunked body") from None
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return total
                total += size
                if total > limit:
                    raise too_large(total)
                await copy(size)
                await reader.readline()
        try:
            length = int(headers.get("content-length", "0") or "0")
        except ValueError:
            raise HttpError(400, "malformed Content-Length") from None
        if length > limit:
            raise too_large(length)
        await copy(length)
        return length

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: Response, keep_alive: bool) -> None:
        status, headers, payload = response
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
        headers = {**headers, "Content-Length": str(len(payload))}
        headers["Connection"] = "keep-alive" if keep_alive else "close"
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()

    # ---- routing --------------------------------------------------------------------------
    def _respond(self, method: str, target: str, body: bytes) -> Response:
        path = target.split("?", 1)[0]
        return self._guarded(method, path, lambda: self._route(method, path, body))

    @staticmethod
    def _guarded(method: str, path: str, call: Any) -> Response:
        """Run a route; model errors and crashes become JSON error responses."""
        try:
            result: Response = call()
            return result
        except HttpError as exc:
            return _json(exc.status, {"error": str(exc)})
        except EmulatorError as exc:
            return _json(_HTTP_STATUS[exc.status_name], {"error": str(exc)})
        except Exception as exc:
            log.exception("%s %s failed", method, path)
            return _json(500, {"error": f"{type(exc).__name__}: {exc}"})

    def _route(self, method: str, path: str, body: bytes) -> Response:
        if path.startswith("/blobs/"):
            blob_id = path.removeprefix("/blobs/")
            if method == "GET":
                return (
                    200,
                    {"Content-Type": "application/octet-stream"},
                    self.state.blobs.get(blob_id),
                )
            raise HttpError(405, f"{method} not allowed on {path}")
        routes = {
            ("GET", "/_emulator/health"): lambda: _json(200, {"ok": True}),
            ("GET", "/_emulator/state"): self._state,
            ("POST", "/_emulator/reset"): self._reset,
            ("GET", "/_emulator/rpc-counts"): lambda: _json(200, self.counter.snapshot()),
        }
        if (method, path) == ("POST", "/_emulator/usage"):
            return self._usage(body)
        if (method, path) == ("POST", "/_emulator/proxy-auth"):
            return self._proxy_auth(body)
        if (method, path) == ("POST", "/_emulator/faults"):
            return _faults(body)
        extra = self.extra_routes.get((method, path))
        if extra is not None:
            result: Response = extra(body)
            return result
        handler = routes.get((method, path))
        if handler is None:
            raise HttpError(404, f"no route for {method} {path}; see dev/emulator/http.py")
        return handler()

    def _put_blob(self, path: str, spool: IO[bytes], size: int, md5_hex: str) -> Response:
        blob_id = path.removeprefix("/blobs/")
        self.state.blobs.put_stream(blob_id, spool, size, md5_hex)
        log.info("blob %s uploaded (%d bytes)", blob_id, size)
        return 200, {"ETag": f'"{md5_hex}"'}, b""

    def _state(self) -> Response:
        dump: dict[str, Any] = {"workspace": self.state.workspace}
        dump.update(self.state.store.dump())
        return _json(200, dump)

    def _reset(self) -> Response:
        self.state.reset()
        self.counter.reset()
        FAULTS.clear()
        for hook in self.reset_hooks:
            hook()
        log.info("state reset")
        return _json(200, {"ok": True})

    def _usage(self, body: bytes) -> Response:
        try:
            payload = json.loads(body or b"{}")
            environment = str(payload["environment"])
            usd = float(payload["usd"])
        except (ValueError, KeyError, TypeError):
            raise HttpError(400, 'expected JSON {"environment": NAME, "usd": FLOAT}') from None
        if not math.isfinite(usd):  # json reads NaN/Infinity/1e999, float() reads "inf"
            raise HttpError(400, f"usd must be a finite number of dollars, got {usd!r}")
        env = self.state.environments.set_usage(environment, usd)
        return _json(
            200,
            {
                "environment": env.name,
                "usage_usd": env.usage_usd,
                "budget_usd": env.budget_usd,
                "spend_limit_reached": env.spend_limit_reached,
            },
        )

    def _proxy_auth(self, body: bytes) -> Response:
        try:
            payload = json.loads(body or b"{}")
            token_id = str(payload.get("token_id", ""))
            token_secret = str(payload.get("token_secret", ""))
            environment = str(payload.get("environment", ""))
        except (ValueError, AttributeError):
            raise HttpError(
                400, 'expected JSON {"token_id": ID, "token_secret": SECRET, "environment": NAME}'
            ) from None
        if self.state.tokens.verify(token_id, token_secret, environment):
            return _json(200, {"allowed": True})
        return _json(401, {"allowed": False, "error": "missing or invalid proxy auth token"})
