"""The HTTP server `rt_server.py` starts inside its container (stdlib only).

GET / -> RT_MESSAGE plus the container's task id; GET /sleep?s=N sleeps N seconds first;
GET /env?k=NAME -> that env var; POST /echo -> the body; GET /stream -> 3 chunks;
POST /write?name=N -> writes the body to /tmp/rt-data/N; GET /read?name=N -> reads it;
GET /crash -> the process exits (its container's port dies); POST /v1/chat/completions ->
an OpenAI-shaped answer echoing the last message (for client libraries such as LiteLLM).
"""

import os
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        print("web:", format % args, flush=True)

    def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/sleep":
            time.sleep(float(q.get("s", "1")))
            self._send(200, b"slept")
        elif url.path == "/env":
            self._send(200, os.environ.get(q.get("k", ""), "<unset>").encode())
        elif url.path == "/headers":
            self._send(200, "\n".join(f"{k}: {v}" for k, v in self.headers.items()).encode())
        elif url.path == "/read":
            try:
                with open(f"/tmp/rt-data/{q['name']}", "rb") as f:
                    self._send(200, f.read())
            except FileNotFoundError:
                self._send(404, b"missing")
        elif url.path == "/stream":
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(3):
                data = f"chunk{i}\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        elif url.path == "/crash":
            self._send(200, b"bye")
            os._exit(3)
        else:
            msg = os.environ.get("RT_MESSAGE", "hello")
            self._send(200, f"{msg} from {os.environ.get('MODAL_TASK_ID', '?')}".encode())

    def do_POST(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if url.path == "/write":
            with open(f"/tmp/rt-data/{q['name']}", "wb") as f:
                f.write(body)
            self._send(200, b"written")
        elif url.path == "/v1/chat/completions":  # just enough OpenAI for a client library
            import json

            request = json.loads(body)
            last = request["messages"][-1]["content"]
            answer = {
                "id": "chatcmpl-rt",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": request.get("model", "rt"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"echo: {last}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            }
            self._send(200, json.dumps(answer).encode(), "application/json")
        else:
            self._send(200, body)


if __name__ == "__main__":
    port = int(os.environ.get("RT_PORT", "8000"))  # rt_server.py's RT_PORT knob
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
