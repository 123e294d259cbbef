"""The trivial `@app.server` the emulator bench deploys: a stdlib HTTP server on port 8000."""

import os

import modal

app = modal.App("bench-edge", image=modal.Image.debian_slim())
# BENCH_WARM=1: one container kept up (latency phase); else it scales to zero after 2 s idle.
WARM = os.environ.get("BENCH_WARM") == "1"


@app.server(port=8000, unauthenticated=True, scaledown_window=2, min_containers=1 if WARM else None)
class Tiny:
    @modal.enter()
    def start(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else head and body wait on delayed ACKs (40 ms)

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        server = ThreadingHTTPServer(("127.0.0.1", 8000), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
