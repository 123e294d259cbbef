"""The HTTP server gate_app.py starts inside its container (stdlib only).

GET /ready -> 200 {"status": "ready"} (503 with `fail: never-ready`). POST /v1/completions,
/v1/chat/completions and /v1/embeddings (the routes our serving proxy relays) -> 401 without
`Authorization: Bearer <key>`, 403 for a key whose sha256 is not in SERVING_API_KEYS (a JSON
object name -> "sha256:<hex>", from the Modal secret), else 200 with one token (500 with
`fail: smoke-5xx`: ready, but every request fails, as an engine whose model does not load its
weights right would). Every request is logged on stdout (what the gate shows as the latest
log line).
"""

import hashlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPEC = json.loads(os.environ.get("GATE_SPEC", "{}"))
DIGESTS = {
    str(v).removeprefix("sha256:")
    for v in json.loads(os.environ.get("SERVING_API_KEYS", "{}") or "{}").values()
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        print("web:", format % args, flush=True)

    def _json(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/ready":
            self._json(404, {"error": "not found"})
        elif SPEC.get("fail") == "never-ready":
            self._json(503, {"status": "not ready", "reason": "engine is still loading"})
        else:
            self._json(200, {"status": "ready"})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings"):
            self._json(404, {"error": "not found"})
            return
        auth = self.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            self._json(401, {"error": {"message": "Authorization header missing"}})
            return
        digest = hashlib.sha256(auth.removeprefix("Bearer ").encode()).hexdigest()
        if digest not in DIGESTS:
            self._json(403, {"error": {"message": "API key not recognised"}})
            return
        if SPEC.get("fail") == "never-ready":
            self._json(503, {"error": {"message": "engine not ready"}})
            return
        if SPEC.get("fail") == "smoke-5xx":
            self._json(500, {"error": {"message": "engine error: NaN in logits"}})
            return
        text = SPEC.get("message", "pong")
        if self.path == "/v1/embeddings":
            self._json(
                200,
                {
                    "object": "list",
                    "model": body.get("model"),
                    "data": [{"index": 0, "object": "embedding", "embedding": [0.5]}],
                },
            )
            return
        if self.path == "/v1/chat/completions":
            self._json(
                200,
                {
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "length",
                        }
                    ],
                },
            )
            return
        self._json(
            200,
            {"object": "text_completion", "model": body.get("model"),
             "choices": [{"index": 0, "text": text, "finish_reason": "length"}]},
        )  # fmt: skip


if __name__ == "__main__":
    print(f"engine: listening on 8000 ({len(DIGESTS)} key(s))", flush=True)
    ThreadingHTTPServer(("127.0.0.1", 8000), Handler).serve_forever()
