"""The edge: every web endpoint's URL, reachable from this machine as printed.

Modal gives each endpoint `https://<workspace>[-<env>]--<label>.modal.run`. Those names do not
resolve here, and Python cannot resolve `*.localhost` either (measured), so the emulator gives
each endpoint its own loopback port instead: its URL is `http://127.0.0.1:<port>` and is what
FunctionCreate answers, what `modal deploy` prints and what `Server.get_url()` returns.
curl, httpx and LiteLLM reach it with no DNS or hosts-file setup, and the path is the app's
own (`/v1/chat/completions` stays at the root, as on Modal).

Stability: the label -> port table is kept in `<data dir>/edge-ports.json`. A redeploy keeps
the label and so the port; an emulator restart on the same state re-binds the same ports. If
a port was taken meanwhile by something else, the endpoint gets a new one (logged as a
warning): the trade-off of one port per endpoint instead of a path prefix on one port (which
would have kept one port but moved every app's routes under a prefix).

Per request (HTTP/1.1, keep-alive, chunked or sized bodies, streaming responses, 1xx and
protocol upgrades passed through):
1. no live app serves the URL -> 404 `modal-http: app for invoked web endpoint is stopped`;
2. proxy auth, when the endpoint requires it (`@app.server` unless `unauthenticated=True`;
   `requires_proxy_auth=True` elsewhere): `Modal-Key` + `Modal-Secret` headers, or
   `Authorization: Bearer <token id>.<token secret>` (also `:`), checked like Modal's edge
   (environment-scoped under `--rbac`); otherwise 401 and no container is started. The
   credentials are removed before the request reaches the container;
3. a ready container with a free slot (cold start when none), 429 when every container is at
   `max_concurrency` and `max_containers` is reached, 503 when the container meant for it
   failed to start;
4. if the response has not started after the webhook timeout (150 s, Modal's; a flag), the
   caller gets 303 to the same URL with `__modal_function_call_id=<id>`, which waits (again up
   to the timeout, then 303 again) and answers the result, as modal.com/docs/guide/
   webhook-timeouts describes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from modal_proto import api_pb2

from emulator.ids import new_id
from emulator.runtime import netns
from emulator.runtime.containers import Container
from emulator.runtime.manager import NoCapacity, Pool, Runtime, StartFailed

log = logging.getLogger("emulator.edge")

MAX_HEAD = 64 * 1024
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}
RESULT_PARAM = "__modal_function_call_id"
_REASONS = {
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class _BadRequest(Exception):
    pass


def _label(pattern_url: str) -> str:
    host = urllib.parse.urlsplit(pattern_url).hostname or pattern_url
    return host.removesuffix(".modal.run")


class Head:
    __slots__ = ("first", "headers")

    def __init__(self, first: str, headers: list[tuple[str, str]]) -> None:
        self.first = first
        self.headers = headers

    def get(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def without(self, names: set[str]) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.headers if k.lower() not in names]

    def encode(self, headers: list[tuple[str, str]] | None = None) -> bytes:
        hs = self.headers if headers is None else headers
        lines = [self.first] + [f"{k}: {v}" for k, v in hs]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise _BadRequest("incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise _BadRequest("request head too large") from None
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep:
            raise _BadRequest("malformed header line")
        headers.append((k.strip(), v.strip()))
    return Head(lines[0], headers)


async def _copy_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, head: Head, is_response: bool
) -> bool:
    """Copy a message body as framed (sized or chunked); False when it is close-delimited."""
    te = (head.get("transfer-encoding") or "").lower()
    if "chunked" in te:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            if writer is not None:
                writer.write(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = await reader.readuntil(b"\r\n")
                    if writer is not None:
                        writer.write(line)
                    if line == b"\r\n":
                        break
                if writer is not None:
                    await writer.drain()
                return True
            remaining = size + 2
            while remaining:
                chunk = await reader.read(min(remaining, 1 << 16))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(chunk)
                if writer is not None:
                    writer.write(chunk)
            if writer is not None:
                await writer.drain()
    length = head.get("content-length")
    if length is not None:
        remaining = int(length)
        while remaining:
            chunk = await reader.read(min(remaining, 1 << 16))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(chunk)
            if writer is not None:
                writer.write(chunk)
                if remaining:
                    await writer.drain()
        if writer is not None:
            await writer.drain()
        return True
    if not is_response:
        return True  # a request without length has no body
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            return False
        if writer is not None:
            writer.write(chunk)
            await writer.drain()


async def _body_chunks(reader: asyncio.StreamReader, head: Head) -> AsyncIterator[bytes]:
    """A request body, decoded (sized or chunked), in pieces of at most 64 KiB."""
    te = (head.get("transfer-encoding") or "").lower()
    if "chunked" in te:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return
            remaining = size
            while remaining:
                chunk = await reader.read(min(remaining, 1 << 16))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(chunk)
                yield chunk
            await reader.readuntil(b"\r\n")
    remaining = int(head.get("content-length") or "0")
    while remaining:
        chunk = await reader.read(min(remaining, 1 << 16))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", remaining)
        remaining -= len(chunk)
        yield chunk


def _status_of(head: Head) -> int:
    parts = head.first.split(" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 502


def _no_body(method: str, status: int) -> bool:
    return method == "HEAD" or status in (204, 304) or 100 <= status < 200


def _plain(status: int, text: str, extra: list[tuple[str, str]] | None = None) -> bytes:
    body = (text + "\n").encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "content-type: text/plain; charset=utf-8",
        f"content-length: {len(body)}",
    ]
    head += [f"{k}: {v}" for k, v in extra or []]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Pending:
    """A response that outlived the webhook timeout, read to the end for a later GET."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.data = b""
        self.created = time.monotonic()


class Edge:
    def __init__(self, runtime: Runtime, data_dir: Path, host: str = "127.0.0.1") -> None:
        self.runtime = runtime
        self.host = host
        self.public_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._table_path = data_dir / "edge-ports.json"
        self._ports: dict[str, int] = {}
        self._servers: dict[int, asyncio.base_events.Server | None] = {}
        self._idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._results: dict[str, _Pending] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        if self._table_path.exists():
            with contextlib.suppress(ValueError, OSError):
                self._ports = {
                    str(k): int(v) for k, v in json.loads(self._table_path.read_text()).items()
                }

    # ---- ports ------------------------------------------------------------------------
    async def start(self) -> None:
        for label in list(self._ports):
            self._listen(label)

    def url_for(self, pattern_url: str) -> str:
        """The edge URL for an endpoint (its Modal-pattern URL names it); binds its port."""
        label = _label(pattern_url)
        port = self._ports.get(label)
        if port is None or port not in self._servers:
            port = self._listen(label)
        return f"http://{self.public_host}:{port}"

    def _listen(self, label: str) -> int:
        wanted = self._ports.get(label, 0)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, wanted))
        except OSError as exc:
            if not wanted:
                sock.close()
                raise
            log.warning(
                "edge: port %d of endpoint %s is taken (%s); the endpoint gets a new port and URL",
                wanted,
                label,
                exc,
            )
            sock.bind((self.host, 0))
        sock.listen(512)
        sock.setblocking(False)
        port = int(sock.getsockname()[1])
        self._ports[label] = port
        self._servers[port] = None
        self._save()
        task = asyncio.get_running_loop().create_task(self._serve(port, sock))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return port

    async def _serve(self, port: int, sock: socket.socket) -> None:
        url = f"http://{self.public_host}:{port}"

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._connection(url, reader, writer)

        self._servers[port] = await asyncio.start_server(handle, sock=sock, limit=MAX_HEAD)

    def _save(self) -> None:
        tmp = self._table_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._ports, indent=1, sort_keys=True))
        tmp.replace(self._table_path)

    async def close(self) -> None:
        for server in self._servers.values():
            if server is not None:
                server.close()
        for conns in self._idle.values():
            for _r, w in conns:
                w.close()
        self._idle.clear()
        for task in list(self._bg):
            task.cancel()

    def forget(self, task_id: str) -> None:
        """A container is gone: close the connections kept alive to it."""
        for _r, w in self._idle.pop(task_id, []):
            w.close()

    def ports(self) -> dict[str, int]:
        return dict(self._ports)

    # ---- requests -------------------------------------------------------------------------
    async def _connection(
        self, url: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await _read_head(reader)
                except _BadRequest as exc:
                    writer.write(_plain(400, f"modal-http: {exc}"))
                    await writer.drain()
                    return
                if head is None:
                    return
                keep = await self._request(url, head, reader, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except Exception:
            log.exception("edge: request on %s failed", url)
        finally:
            writer.close()

    def _authorized(self, pool: Pool, head: Head) -> tuple[bool, str]:
        key, secret = head.get("modal-key"), head.get("modal-secret")
        if not (key and secret):
            auth = head.get("authorization") or ""
            scheme, _, token = auth.partition(" ")
            if scheme.lower() == "bearer" and token.startswith("wk-"):
                for sep in (".", ":"):
                    if sep in token:
                        key, _, secret = token.partition(sep)
                        break
        if not (key and secret):
            return False, "modal-http: missing credentials for proxy authorization"
        if self.runtime.state.tokens.verify(key, secret, pool.env_name):
            return True, ""
        return False, "modal-http: invalid credentials for proxy authorization"

    async def _request(
        self, url: str, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        parts = head.first.split(" ")
        if len(parts) != 3:
            writer.write(_plain(400, "modal-http: malformed request line"))
            return False
        method, target, version = parts
        client_keep = version == "HTTP/1.1" and (head.get("connection") or "").lower() != "close"
        pool = self.runtime.route(url)
        if pool is None:
            await _copy_body(reader, None, head, False)
            writer.write(_plain(404, "modal-http: app for invoked web endpoint is stopped"))
            await writer.drain()
            return client_keep
        if pool.settings.requires_auth:
            ok, why = self._authorized(pool, head)
            if not ok:
                await _copy_body(reader, None, head, False)
                writer.write(_plain(401, why))
                await writer.drain()
                return client_keep
        split = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(split.query)
        if RESULT_PARAM in query:
            await _copy_body(reader, None, head, False)
            return await self._answer_pending(query[RESULT_PARAM][0], target, writer, client_keep)
        if pool.settings.kind != "server":
            return await self._web(url, pool, method, target, head, reader, writer, client_keep)
        try:
            container = await self.runtime.acquire(pool, pool.settings.startup_timeout + 5)
        except NoCapacity as exc:
            await _copy_body(reader, None, head, False)
            writer.write(_plain(429, f"modal-http: too many requests: {exc}"))
            await writer.drain()
            return client_keep
        except StartFailed as exc:
            await _copy_body(reader, None, head, False)
            writer.write(_plain(503, f"modal-http: the container failed to start: {exc}"))
            await writer.drain()
            return client_keep
        try:
            return await self._forward(pool, container, method, head, reader, writer, client_keep)
        finally:
            self.runtime.release(pool, container)

    async def _web(
        self,
        url: str,
        pool: Pool,
        method: str,
        target: str,
        head: Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_keep: bool,
    ) -> bool:
        """asgi_app / fastapi_endpoint / wsgi_app / web_server: the request is an input.

        As on Modal, the container gets the ASGI scope as a function input (data format ASGI),
        reads the body as `http.request` messages (FunctionCallGetDataIn) and streams
        `http.response.*` messages back (FunctionCallPutDataOut); modal's own wrapper in the
        container turns them into calls of the app (or a proxy to the web_server's port).
        """
        from modal._serialization import deserialize_data_format, serialize, serialize_data_format

        asgi = api_pb2.DATA_FORMAT_ASGI
        split = urllib.parse.urlsplit(target)
        peer = writer.get_extra_info("peername") or ("127.0.0.1", 0)
        drop = {"modal-key", "modal-secret"}
        if (head.get("authorization") or "").lower().startswith("bearer wk-"):
            drop.add("authorization")
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": urllib.parse.unquote(split.path or "/"),
            "query_string": split.query.encode(),
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in head.without(drop)
            ],
            "client": (str(peer[0]), int(peer[1])),
        }
        # The scope travels pickled as the call's one argument, ((scope,), {}): what the
        # container's ASGI wrapper is called with (modal-labs/modal-client test/conftest.py
        # builds web inputs the same way); the messages after it use the ASGI data format.
        item = api_pb2.FunctionInput(
            args=serialize(((scope,), {})), data_format=api_pb2.DATA_FORMAT_PICKLE
        )
        method_name = pool.method_for(url)
        if method_name:
            item.method_name = method_name
        calls = self.runtime.calls
        call = calls.create(pool.function_id)
        calls.add_input(call, 0, item)
        self.runtime.wake()

        async def feed() -> None:
            index = 0

            def put(body: bytes, more: bool) -> None:
                nonlocal index
                index += 1
                message = {"type": "http.request", "body": body, "more_body": more}
                call.data_in.append((index, asgi, serialize_data_format(message, asgi)))
                call.notify()

            async for body in _body_chunks(reader, head):
                put(body, True)
            put(b"", False)

        feeder = asyncio.get_running_loop().create_task(feed())
        try:
            return await self._web_response(
                call, method, writer, client_keep, deserialize_data_format
            )
        finally:
            if not feeder.done():
                feeder.cancel()
            calls.forget(call.id)

    async def _web_response(
        self, call: Any, method: str, writer: asyncio.StreamWriter, client_keep: bool, decode: Any
    ) -> bool:
        seen = 0
        chunked = False
        started = False
        status = 200
        deadline = time.monotonic() + self.runtime.options.webhook_timeout
        while True:
            fresh = [c for c in call.data_out if c[0] > seen]
            for index, data_format, data in fresh:
                seen = index
                message = decode(data, data_format, None)
                kind = message.get("type")
                if kind == "http.response.start" and not started:
                    started = True
                    status = int(message.get("status", 200))
                    headers = [
                        (bytes(k).decode("latin-1"), bytes(v).decode("latin-1"))
                        for k, v in message.get("headers", [])
                    ]
                    names = {k.lower() for k, _ in headers}
                    chunked = "content-length" not in names and not _no_body(method, status)
                    if chunked:
                        headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
                        headers.append(("transfer-encoding", "chunked"))
                    reason = _REASONS.get(status, "OK" if status < 400 else "Error")
                    writer.write(Head(f"HTTP/1.1 {status} {reason}", headers).encode())
                elif kind == "http.response.body" and started:
                    body = bytes(message.get("body", b""))
                    if body and not _no_body(method, status):
                        if chunked:
                            writer.write(f"{len(body):x}\r\n".encode() + body + b"\r\n")
                        else:
                            writer.write(body)
                    if not message.get("more_body", False):
                        if chunked:
                            writer.write(b"0\r\n\r\n")
                        await writer.drain()
                        return client_keep
                await writer.drain()
            if call.unfinished == 0 and not [c for c in call.data_out if c[0] > seen]:
                # the input finished without (completing) a response
                failure = next(
                    (
                        o.item.result
                        for o in call.outputs
                        if o.item.result.status != api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
                    ),
                    None,
                )
                if started:
                    return False  # cut the response: the client sees a truncated body
                why = failure.exception if failure is not None else "no response"
                writer.write(_plain(500, f"modal-http: internal error: {why}"))
                await writer.drain()
                return client_keep
            if not started and time.monotonic() > deadline:
                writer.write(
                    _plain(504, "modal-http: the response did not start within the timeout")
                )
                await writer.drain()
                return False
            changed = call.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)

    async def _upstream(
        self, container: Container, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """A connection to the container's port: a kept-alive one (reused=True) or a new one."""
        idle = self._idle.get(container.task_id)
        while idle:
            r, w = idle.pop()
            if not w.is_closing() and not r.at_eof():
                return r, w, True
            w.close()
        r, w = await netns.connect(container.pid if container.netns else None, port)
        return r, w, False

    def _park(
        self, container: Container, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        if container.state != "ready":
            conn[1].close()
            return
        self._idle.setdefault(container.task_id, []).append(conn)

    async def _forward(
        self,
        pool: Pool,
        container: Container,
        method: str,
        head: Head,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_keep: bool,
    ) -> bool:
        drop = {"modal-key", "modal-secret"}
        if (head.get("authorization") or "").lower().startswith("bearer wk-"):
            drop.add("authorization")
        # Hop-by-hop headers are the client's connection's, not the container's (RFC 9110
        # 7.6.1): the edge keeps its own connection to the container alive. Forwarding a
        # client's `Connection: close` made the container close right after answering; an
        # early answer (401/403 before the body was read) then met the body still arriving,
        # the container's kernel reset the connection, and the answer's body was lost
        # (IncompleteRead at the client, ~1 request in 70 under load). An upgrade keeps them.
        connection = {t.strip().lower() for t in (head.get("connection") or "").split(",")}
        if not ("upgrade" in connection and head.get("upgrade")):
            drop |= _HOP | connection
        headers = head.without(drop)
        te = (head.get("transfer-encoding") or "").lower()
        bodyless = head.get("content-length") in (None, "0") and "chunked" not in te
        timeout = self.runtime.options.webhook_timeout
        resp: Head | None = None
        for attempt in (0, 1):
            try:
                up_r, up_w, reused = await self._upstream(container, pool.settings.port)
            except OSError as exc:
                if attempt == 0:
                    await _copy_body(reader, None, head, False)
                log.info("edge: container %s refused port: %s", container.task_id, exc)
                writer.write(_plain(502, f"modal-http: the container's port refused: {exc}"))
                await writer.drain()
                return client_keep
            try:
                up_w.write(head.encode(headers))
                if attempt == 0:
                    await _copy_body(reader, up_w, head, False)
                await up_w.drain()
                resp = await asyncio.wait_for(_read_head(up_r), timeout)
            except TimeoutError:
                return await self._detach(up_r, up_w, method, writer, head, client_keep)
            except (_BadRequest, ConnectionError):
                resp = None
            if resp is None and reused and bodyless and attempt == 0:
                up_w.close()  # a kept-alive connection the container had closed: once more
                continue
            break
        while resp is not None and 100 <= _status_of(resp) < 200 and _status_of(resp) != 101:
            writer.write(resp.encode())
            await writer.drain()
            resp = await _read_head(up_r)
        if resp is None:
            up_w.close()
            log.info("edge: container %s closed the connection", container.task_id)
            writer.write(_plain(502, "modal-http: the container closed the connection"))
            await writer.drain()
            return client_keep
        status = _status_of(resp)
        if status == 101:
            writer.write(resp.encode())
            await writer.drain()
            await self._pipe(reader, writer, up_r, up_w)
            return False
        writer.write(resp.encode())
        framed = True
        if not _no_body(method, status):
            framed = await _copy_body(up_r, writer, resp, True)
        await writer.drain()
        up_keep = framed and (resp.get("connection") or "").lower() != "close"
        if up_keep:
            self._park(container, (up_r, up_w))
        else:
            up_w.close()
        return client_keep and framed

    async def _pipe(
        self,
        a_r: asyncio.StreamReader,
        a_w: asyncio.StreamWriter,
        b_r: asyncio.StreamReader,
        b_w: asyncio.StreamWriter,
    ) -> None:
        async def one(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(one(a_r, b_w), one(b_r, a_w))

    async def _detach(
        self,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        method: str,
        writer: asyncio.StreamWriter,
        head: Head,
        client_keep: bool,
    ) -> bool:
        """The response did not start in time: keep reading it in the background, answer 303."""
        call_id = new_id("function_call")
        pending = _Pending()
        self._results[call_id] = pending

        async def finish() -> None:
            try:
                resp = await _read_head(up_r)
                if resp is None:
                    pending.data = _plain(502, "modal-http: the container closed the connection")
                    return
                sink = _Buffer()
                if not _no_body(method, _status_of(resp)):
                    await _copy_body(up_r, sink, resp, True)  # type: ignore[arg-type]
                if "chunked" in (resp.get("transfer-encoding") or "").lower():
                    headers = resp.without({"connection"})  # chunk framing kept as read
                else:
                    headers = resp.without({"content-length", "connection"})
                    headers.append(("content-length", str(len(sink.data))))
                pending.data = resp.encode(headers) + bytes(sink.data)
            except Exception as exc:
                pending.data = _plain(502, f"modal-http: reading the response failed: {exc}")
            finally:
                up_w.close()
                pending.done.set()

        task = asyncio.get_running_loop().create_task(finish())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        target = head.first.split(" ")[1]
        writer.write(
            _plain(
                303,
                "modal-http: the result will be at Location",
                [("location", _with_param(target, call_id))],
            )
        )
        await writer.drain()
        return client_keep

    async def _answer_pending(
        self, call_id: str, target: str, writer: asyncio.StreamWriter, client_keep: bool
    ) -> bool:
        pending = self._results.get(call_id)
        if pending is None:
            writer.write(_plain(404, f"modal-http: no pending result {call_id}"))
            await writer.drain()
            return client_keep
        try:
            await asyncio.wait_for(pending.done.wait(), self.runtime.options.webhook_timeout)
        except TimeoutError:
            writer.write(_plain(303, "modal-http: still running", [("location", target)]))
            await writer.drain()
            return client_keep
        self._results.pop(call_id, None)
        writer.write(pending.data)
        await writer.drain()
        return client_keep


class _Buffer:
    """A writer stand-in that collects bytes (for responses answered after a 303)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


def _with_param(target: str, call_id: str) -> str:
    split = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
    query = [(k, v) for k, v in query if k != RESULT_PARAM] + [(RESULT_PARAM, call_id)]
    return urllib.parse.urlunsplit(("", "", split.path or "/", urllib.parse.urlencode(query), ""))
