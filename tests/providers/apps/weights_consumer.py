"""A cold start that loads a model the way the engines do, for the zero-download check.

`load(spec_json)` renders the serving spec's own engine command line and environment
(serving/spec.py `engine_command`, `engine_env`) in a fresh container and resolves the
model argument as vLLM does (a local directory is loaded from disk; anything else is a hub id,
fetched with `huggingface_hub.snapshot_download`: vllm/transformers_utils, `maybe_download_
from_modelscope`/`snapshot_download` when the path is not a directory). It reads every file
and answers where they came from and how many bytes were read. The weights volume is mounted
where serving/app.py mounts it (the spec's `volume_mounts`); `WEIGHTS_CONSUMER_VOLUME` and
`WEIGHTS_CONSUMER_SECRET` name it and the secret carrying HF_ENDPOINT/HF_TOKEN (the test's
fake hub) at deploy time.
"""

import os

import modal

VOLUME = os.environ.get("WEIGHTS_CONSUMER_VOLUME", "tiny-weights")
SECRET = os.environ.get("WEIGHTS_CONSUMER_SECRET", "hub-access")

image = (
    modal.Image.debian_slim()
    .env({"WEIGHTS_CONSUMER_VOLUME": VOLUME, "WEIGHTS_CONSUMER_SECRET": SECRET})
    .add_local_python_source("serving")
)
app = modal.App("weights-consumer", image=image)


@app.function(
    volumes={"/weights": modal.Volume.from_name(VOLUME)},
    secrets=[modal.Secret.from_name(SECRET)],
)
def load(spec_json: str) -> dict[str, object]:
    from pathlib import Path

    from serving import render
    from serving.spec import ServingSpec

    spec = ServingSpec.from_json(spec_json)
    os.environ.update(render.engine_env(spec))
    model = render.engine_command(spec)[2]  # `vllm serve MODEL ...`
    local = Path(model).is_dir()
    if not local:
        import tempfile

        from huggingface_hub import snapshot_download

        # A fresh cache, as in a new container (with the host network the emulator's
        # containers share this machine's /tmp).
        cache = tempfile.mkdtemp(prefix="consumer-hf-")
        model = snapshot_download(model, revision=spec.revision, cache_dir=cache)
    files = sorted(p for p in Path(model).rglob("*") if p.is_file() and ".cache" not in p.parts)
    return {
        "model": model,
        "from_volume": local,
        "files": len(files),
        "bytes_read": sum(len(p.read_bytes()) for p in files),
    }
