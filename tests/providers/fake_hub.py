"""A local stand-in for the Hugging Face hub's file API, enough for `huggingface_hub` 2.4.0.

What the client asks (read in huggingface_hub 2.4.0: `_snapshot_download.py`,
`hf_api.list_repo_tree`, `file_download.get_hf_file_metadata` / `hf_hub_download`):
- `GET /api/models/<repo>/tree/<revision>[/<path>]?recursive=...` → JSON list of
  `{"type": "file", "path", "size", "oid"}`;
- `GET /api/models/<repo>/revision/<revision>` → `{"id", "sha", "siblings"}` (branch names);
- `HEAD` / `GET /<repo>/resolve/<revision>/<path>` → the file, with `X-Repo-Commit`, `ETag`
  and `Content-Length` (what `get_hf_file_metadata` reads).
Clients are pointed at it with `HF_ENDPOINT` or `endpoint=`. With `token` set, a request
without `Authorization: Bearer <token>` gets 401 (a gated/private repo). Every file byte sent
in a GET body is counted in `bytes_served` (per repo too): what a cold start downloaded.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


class FakeHub:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        #: repo → commit sha → {path: bytes}
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}
        self.bytes_served = 0
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def add(self, repo: str, commit: str, files: dict[str, bytes]) -> None:
        self.repos.setdefault(repo, {})[commit] = dict(files)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # ---- serving -------------------------------------------------------------------------
    def _reply(
        self,
        h: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        head: bool = False,
        count: bool = False,
    ) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)
            if count:
                with self._lock:
                    self.bytes_served += len(body)

    def _json(self, h: BaseHTTPRequestHandler, status: int, value: Any, head: bool) -> None:
        body = json.dumps(value).encode()
        self._reply(h, status, body, {"Content-Type": "application/json"}, head)

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append(("HEAD" if head else "GET", path))
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._json(h, 401, {"error": "Invalid credentials in Authorization header"}, head)
            return
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("tree", "revision"):
            repo, kind, rev = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
            files = self.repos.get(repo, {}).get(rev)
            if files is None:
                self._json(h, 404, {"error": f"Revision Not Found for {repo}@{rev}"}, head)
                return
            if kind == "revision":
                siblings = [{"rfilename": p} for p in sorted(files)]
                self._json(h, 200, {"id": repo, "sha": rev, "siblings": siblings}, head)
                return
            entries = [
                {
                    "type": "file",
                    "path": p,
                    "size": len(data),
                    "oid": hashlib.sha1(data).hexdigest(),
                }
                for p, data in sorted(files.items())
            ]
            self._json(h, 200, entries, head)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, rev, file_path = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
            data = self.repos.get(repo, {}).get(rev, {}).get(file_path)
            if data is None:
                self._json(h, 404, {"error": f"Entry Not Found: {file_path}"}, head)
                return
            headers = {
                "X-Repo-Commit": rev,
                "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                "Content-Type": "application/octet-stream",
            }
            self._reply(h, 200, data, headers, head, count=True)
            return
        self._json(h, 404, {"error": f"not served by the fake hub: {path}"}, head)
