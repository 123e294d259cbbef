"""`@app.function` + `@modal.asgi_app` with GPU fallbacks (sent as FunctionData) and a label."""

import modal

image = modal.Image.debian_slim().uv_pip_install("fastapi")
app = modal.App("asgi-demo", image=image)
data = modal.Volume.from_name("asgi-data", create_if_missing=True)


@app.function(
    volumes={"/data": data},
    secrets=[modal.Secret.from_name("hf-secret")],
    gpu=["H100", "A100"],
    scaledown_window=120,
)
@modal.concurrent(max_inputs=10)
@modal.asgi_app(requires_proxy_auth=True, label="my-custom-label")
def web() -> object:
    from fastapi import FastAPI

    return FastAPI()
