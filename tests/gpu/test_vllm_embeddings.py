"""An embedding model through the container's lifecycle and the proxy (issue 24 item 3).

vLLM serves the project's Llama-shaped model as an embedding model when told to
(`--runner pooling --convert embed`, both in 0.26.0's recorded parser: vLLM wraps the
decoder and pools the last token). The spec carries them as `extra_args`, as a stack would.
`serving.engine`'s warm-up must find that chat answers 400/404 there and fall back to
`/v1/embeddings` (serving/engine.py `warm_up`), and the proxy must pass `/v1/embeddings`
with its usage (serving/proxy/app.py routes).

Its own start (ports 18000/18001, 0.3 of the card's memory), stopped at the end of this
module: it runs before test_vllm_serving.py's `served` (files run in name order), which holds
0.92 of the card; run alone, or first, it has the card to itself.

Not yet run on a GPU (written after the last device time of the session that added it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.gpu import device
from tests.gpu.conftest import results_dir
from tests.gpu.support import AUTH, Served

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
EMBED_ARGS = ["--runner", "pooling", "--convert", "embed"]
PROXY = "http://127.0.0.1:18000"


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory, results: dict[str, Any]) -> Iterator[Served]:
    spec = {**device.spec_dict(extra_args=EMBED_ARGS), "gpu_memory_fraction": 0.3}
    spec_file = device.write_spec(tmp_path_factory.mktemp("embed") / "spec.json", spec)
    log_file = results_dir(tmp_path_factory) / "checks-embed-engine.log"
    with Served.start(spec_file, log_file, ports=(18000, 18001)) as srv:
        results["embeddings"] = {"spec": spec, "ready_s": srv.ready_s}
        yield srv


def hidden_size() -> int:
    config = json.loads((Path(device.MODEL_DIR) / "config.json").read_text())
    return int(config["hidden_size"])


def test_warm_up_falls_back_to_embeddings(embedder: Served, results: dict[str, Any]) -> None:
    done = embedder.matching("warm-up done")
    results["embeddings"]["warm_up"] = done
    assert done and "via /v1/embeddings" in done[-1], done


def test_embeddings_through_the_proxy(embedder: Served, results: dict[str, Any]) -> None:
    body = {"model": device.SERVED_NAME, "input": ["The sea is calm.", "A storm is coming."]}
    with httpx.Client(timeout=60) as client:
        refused = client.post(f"{PROXY}/v1/embeddings", json=body)
        answer = client.post(f"{PROXY}/v1/embeddings", json=body, headers=AUTH)
    assert refused.status_code == 401, refused.text[:300]
    assert answer.status_code == 200, answer.text[:500]
    data = answer.json()
    vectors = [row["embedding"] for row in sorted(data["data"], key=lambda r: r["index"])]
    results["embeddings"]["answer"] = {
        "dimensions": [len(v) for v in vectors],
        "norms": [round(math.sqrt(sum(x * x for x in v)), 4) for v in vectors],
        "usage": data.get("usage"),
    }
    assert [row["index"] for row in data["data"]] == [0, 1]
    assert all(len(v) == hidden_size() for v in vectors)  # the last token's hidden state
    assert all(math.isfinite(x) for v in vectors for x in v)
    assert vectors[0] != vectors[1]
    assert data["usage"]["prompt_tokens"] > 0
