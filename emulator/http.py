"""HTTP/1.1 side port: blob upload/download (what S3 does for Modal) and the control surface.

Routes:
- `PUT /blobs/<blob id>`: raw bytes of a blob reserved by BlobCreate; answers 200 with
  `ETag: "<md5 hex>"` like S3 (the client checks it).
- `GET /blobs/<blob id>`: the bytes back (BlobGet hands out this URL).
- `GET /_emulator/state`: JSON dump of the state (no secret values, no file bytes).
- `POST /_emulator/reset`: empty the state (default environment re-created), zero RPC counts.
- `POST /_emulator/usage` with `{"environment": NAME, "usd": FLOAT}`: set current-cycle usage.
- `GET /_emulator/rpc-counts`: `{"Method": count, ...}` since the last reset.
- `POST /_emulator/proxy-auth` with `{"token_id", "token_secret", "environment"}`: what
  Modal's edge decides for `Modal-Key`/`Modal-Secret` headers: 200 `{"allowed": true}`, or 401.
- `GET /_emulator/health`: `{"ok": true}`.

A deliberately small server on asyncio streams (stdlib only), sharing the gRPC event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from emulator.errors import EmulatorError
from emulator.handlers.base import RpcCounter
from emulator.models import State

log = logging.getLogger("emulator.http")

MAX_BODY_BYTES = 1 << 30
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


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(status: int, obj: Any) -> Response:
    return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()


class ControlServer:
    """Serves the routes above on (host, port); port 0 picks a free one."""

    def __init__(self, state: State, counter: RpcCounter, host: str, port: int) -> None:
        self.state = state
        self.counter = counter
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

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
                body = await self._read_body(reader, headers)
                response = self._respond(method, target, body)
                keep_alive = (
                    version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                )
                await self._write(writer, response, keep_alive)
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, HttpError):
            pass
        except Exception:
            log.exception("HTTP connection handler crashed")
        finally:
            writer.close()

    @staticmethod
    async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            total = 0
            while True:
                size_line = await reader.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    raise HttpError(413, "body too large")
                chunks.append(await reader.readexactly(size))
                await reader.readline()
        length = int(headers.get("content-length", "0") or "0")
        if length > MAX_BODY_BYTES:
            raise HttpError(413, "body too large")
        return await reader.readexactly(length) if length else b""

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
        try:
            return self._route(method, path, body)
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
            if method == "PUT":
                md5_hex = self.state.blobs.put(blob_id, body)
                log.info("blob %s uploaded (%d bytes)", blob_id, len(body))
                return 200, {"ETag": f'"{md5_hex}"'}, b""
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
        handler = routes.get((method, path))
        if handler is None:
            raise HttpError(404, f"no route for {method} {path}; see emulator/http.py")
        return handler()

    def _state(self) -> Response:
        dump: dict[str, Any] = {"workspace": self.state.workspace}
        dump.update(self.state.store.dump())
        return _json(200, dump)

    def _reset(self) -> Response:
        self.state.reset()
        self.counter.reset()
        log.info("state reset")
        return _json(200, {"ok": True})

    def _usage(self, body: bytes) -> Response:
        try:
            payload = json.loads(body or b"{}")
            environment = str(payload["environment"])
            usd = float(payload["usd"])
        except (ValueError, KeyError, TypeError):
            raise HttpError(400, 'expected JSON {"environment": NAME, "usd": FLOAT}') from None
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
