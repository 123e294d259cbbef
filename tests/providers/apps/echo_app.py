"""A small Modal app the App provider tests deploy against the emulator.

It reads the serving spec the way serving/app.py does at deploy time (file named by env
SERVING_SPEC), bakes it into the image environment (so a spec change changes what is
deployed), ships a local package (`echo_helpers`, part of the source digest) and exposes one
web endpoint (the App resource's `web_url`). Deployed with `modal deploy` or the provider.
"""

import json
import os

import modal

_spec_path = os.environ.get("SERVING_SPEC", "")
SPEC_JSON = open(_spec_path).read() if _spec_path else "{}"  # noqa: SIM115
EXTRA = os.environ.get("ECHO_EXTRA", "")

image = (
    modal.Image.debian_slim()
    .env({"ECHO_SPEC": SPEC_JSON, "ECHO_EXTRA": EXTRA})
    .add_local_python_source("echo_helpers")
)
app = modal.App("echo-app", image=image)


@app.function()
@modal.fastapi_endpoint()
def echo() -> dict[str, object]:
    from echo_helpers import describe

    return describe(json.loads(os.environ.get("ECHO_SPEC", "{}")))
