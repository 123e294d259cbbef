"""A small serving-shaped Modal app for the App health-gate tests (test_app_gate.py).

Stands in for serving/app.py until that runs on the emulator: an `@app.server` on port 8000
behind Modal's proxy auth whose tiny HTTP server (tests/providers/apps/gate_web.py) answers
`GET /ready` and `POST /v1/completions` like our serving proxy does (serving/proxy/app.py):
API keys are checked against the sha256 digests in the Modal secret's `SERVING_API_KEYS`
(401 without a key, 403 for an unknown one), read when the container starts.

The "spec" (JSON file named by SERVING_SPEC at deploy time, the App resource's `spec_json`):
  {"keys_secret": NAME, "fail": "" | "start" | "never-ready", "min_containers": 1,
   "startup_s": 30, "message": TEXT}
`fail: start` = the engine crashes at start (the container's start fails, with a log line);
`fail: never-ready` = the server listens but /ready answers 503 forever. Like serving/app.py,
the spec and the key-digest version (env SERVING_API_KEYS_SHA256, the App's extra env) go into
the image ENV, so changing either changes the deployed definition and Modal replaces the
containers.
"""

import json
import os
import pathlib

import modal

HERE = pathlib.Path(__file__).parent
_spec_path = os.environ.get("SERVING_SPEC", "")
# At deploy time the spec file; in the container the image ENV (the same JSON), so both sides
# define the same objects (the secret list must match what was deployed).
SPEC = json.loads(
    pathlib.Path(_spec_path).read_text() if _spec_path else os.environ.get("GATE_SPEC", "{}")
)
APP_NAME = os.environ.get("SERVING_APP_NAME", "gate-app")

image = (
    modal.Image.debian_slim()
    .env(
        {
            "GATE_SPEC": json.dumps(SPEC, sort_keys=True),
            "SERVING_API_KEYS_SHA256": os.environ.get("SERVING_API_KEYS_SHA256", ""),
        }
    )
    .add_local_file(HERE / "gate_web.py", "/root/gate_web.py")
)
app = modal.App(APP_NAME, image=image)
secrets = [modal.Secret.from_name(SPEC["keys_secret"])] if SPEC.get("keys_secret") else []


@app.server(
    port=8000,
    min_containers=int(SPEC.get("min_containers", 1)),
    startup_timeout=int(SPEC.get("startup_s", 30)),
    secrets=secrets,
)
class Engine:
    @modal.enter()
    def start(self) -> None:
        import subprocess
        import sys

        spec = json.loads(os.environ.get("GATE_SPEC", "{}"))
        if spec.get("fail") == "start":
            print("engine: loading weights", flush=True)
            print("engine: CUDA out of memory while loading the model (on purpose)", flush=True)
            raise RuntimeError("engine failed to start (on purpose)")
        web = pathlib.Path(__file__).with_name("gate_web.py")  # /root/gate_web.py in a container
        self.proc = subprocess.Popen([sys.executable, str(web)])

    @modal.exit()
    def stop(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None:
            proc.terminate()
            proc.wait(5)
