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

Passed on one H100 in docs/gpu.md runs U, Y, AC and AE.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.gpu import device
from tests.gpu.conftest import results_dir
from tests.gpu.support import Served, check_embeddings_through

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


def test_warm_up_falls_back_to_embeddings(embedder: Served, results: dict[str, Any]) -> None:
    done = embedder.matching("warm-up done")
    results["embeddings"]["warm_up"] = done
    assert done and "via /v1/embeddings" in done[-1], done


def test_embeddings_through_the_proxy(embedder: Served, results: dict[str, Any]) -> None:
    results["embeddings"]["answer"] = check_embeddings_through(PROXY)
