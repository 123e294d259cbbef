"""`@app.server` class deployed by the emulator tests; its URL is a flash URL.

Same resources as cls_web_app.py (two volumes, a secret, a copied local file, optionally a
>= 4 MiB file named by EMU_BIG_FILE). EMU_APP_NAME overrides the app name.
"""

import os
import pathlib

import modal

HERE = pathlib.Path(__file__).parent
APP_NAME = os.environ.get("EMU_APP_NAME", "llm-flash")

image = modal.Image.debian_slim().uv_pip_install("fastapi")
image = image.add_local_file(HERE / "server_config.json", "/root/server_config.json", copy=True)
if os.environ.get("EMU_BIG_FILE"):
    image = image.add_local_file(os.environ["EMU_BIG_FILE"], "/root/big_weights.bin", copy=True)

app = modal.App(APP_NAME, image=image)
models = modal.Volume.from_name("llm-models", create_if_missing=True)
cache = modal.Volume.from_name("llm-cache", create_if_missing=True)


@app.server(
    port=8000,
    gpu="H100",
    volumes={"/models": models, "/cache": cache},
    secrets=[modal.Secret.from_name("hf-secret")],
    startup_timeout=600,
    enable_memory_snapshot=True,
)
class Server:
    @modal.enter(snap=True)
    def load(self) -> None:
        pass

    @modal.enter(snap=False)
    def start(self) -> None:
        import subprocess

        subprocess.Popen(["python", "-m", "http.server", "8000"])
