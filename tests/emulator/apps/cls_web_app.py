"""`@app.cls` web server deployed by the emulator tests (`modal deploy` and in-process).

Two volumes, one secret, a local file copied into the image and, when EMU_BIG_FILE names a
file (the tests generate a >= 4 MiB one in tmp), that file copied too (uploaded as a blob).
EMU_APP_NAME overrides the app name; EMU_VARIANT changes the image (a real code change).
"""

import os
import pathlib

import modal

HERE = pathlib.Path(__file__).parent
APP_NAME = os.environ.get("EMU_APP_NAME", "llm-server")

image = modal.Image.debian_slim().uv_pip_install("fastapi")
if os.environ.get("EMU_VARIANT"):
    image = image.env({"EMU_VARIANT": os.environ["EMU_VARIANT"]})
image = image.add_local_file(HERE / "server_config.json", "/root/server_config.json", copy=True)
if os.environ.get("EMU_BIG_FILE"):
    image = image.add_local_file(os.environ["EMU_BIG_FILE"], "/root/big_weights.bin", copy=True)

app = modal.App(APP_NAME, image=image)
models = modal.Volume.from_name("llm-models", create_if_missing=True)
cache = modal.Volume.from_name("llm-cache", create_if_missing=True)


@app.cls(
    gpu="H100",
    volumes={"/models": models, "/cache": cache},
    secrets=[modal.Secret.from_name("hf-secret")],
    scaledown_window=300,
    timeout=3600,
)
@modal.concurrent(max_inputs=32)
class LLM:
    @modal.web_server(port=8000, startup_timeout=600, requires_proxy_auth=True)
    def serve(self) -> None:
        import subprocess

        subprocess.Popen(["python", "-m", "http.server", "8000"])
