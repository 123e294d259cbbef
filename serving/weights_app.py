"""The Modal app that fills a service's weights volume: one one-shot function, `provision`.

Deployed and called by the `ModelWeights` resource (components/modal/model_weights.py) at
`pulumi up`; by hand:

    WEIGHTS_APP_NAME=tiny-weights WEIGHTS_VOLUME=tiny-weights \\
        WEIGHTS_SECRETS='["huggingface-token"]' modal deploy serving/weights_app.py
    python -c "import modal; f = modal.Function.from_name('tiny-weights', 'provision'); \\
        print(f.remote({'kind': 'hf', 'repo': 'org/name', 'revision': '<sha>'}))"

The volume and the secrets must exist (the Volume/Secret resources own them; never created
here). The names are read from the environment at deploy time and baked into the image ENV,
so the container imports this file with the same names (modal hydrates the objects from the
deployed app's layout by those names). `provision` prints one progress line per step (what
`modal app logs` shows; the ModelWeights runner follows them while the call runs) and returns
the result dict (serving/weights.py `provision`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import modal

from serving.weights import WEIGHTS_MOUNT

APP_NAME = os.environ.get("WEIGHTS_APP_NAME") or "model-weights"
VOLUME = os.environ.get("WEIGHTS_VOLUME") or "model-weights"
SECRETS: list[str] = json.loads(os.environ.get("WEIGHTS_SECRETS") or "[]")
# Modal runs this file as /root/weights_app.py; beside it ship these modules and nothing else
# of serving/ (a literal: components/modal/_source.py digests exactly what ships without
# importing this file; serving/app.py says how a module name is found).
SHIPPED_MODULES = ("serving.__init__", "serving.weights")
TIMEOUT_S = 4 * 3600  # a large model over a slow link; Modal allows up to 24 h
# The clients the function uses, pinned like the project's dev dependencies (tested there).
REQUIREMENTS = ["huggingface-hub==2.4.0", "boto3==1.44.5"]

image = (
    modal.Image.debian_slim(python_version="3.11")
    .uv_pip_install(*REQUIREMENTS)
    .env(
        {
            "WEIGHTS_APP_NAME": APP_NAME,
            "WEIGHTS_VOLUME": VOLUME,
            "WEIGHTS_SECRETS": json.dumps(SECRETS),
            "HF_XET_HIGH_PERFORMANCE": "1",  # saturate the link on xet-backed repos
        }
    )
    .add_local_python_source(*SHIPPED_MODULES)
)
volume = modal.Volume.from_name(VOLUME)
app = modal.App(APP_NAME)


@app.function(
    image=image,
    volumes={WEIGHTS_MOUNT: volume},
    secrets=[modal.Secret.from_name(name) for name in SECRETS],
    timeout=TIMEOUT_S,
    max_containers=1,  # one writer per volume
)
def provision(source: dict[str, Any]) -> dict[str, Any]:
    """Fill the volume with the source's pinned revision and commit it; returns revision,
    path, file_count, bytes, digest, downloaded_bytes, seconds. Progress goes to the log
    (one line per file), where the caller follows it."""
    from serving import weights

    result = weights.provision(source, Path(WEIGHTS_MOUNT), lambda line: print(line, flush=True))
    volume.commit()  # make the files visible to the serving containers
    return result
