"""An embedding model on SGLang 0.5.15 through the container's lifecycle and the proxy
(issue 24 item 3, as tests/gpu/test_vllm_embeddings.py for vLLM).

SGLang serves the project's Llama-shaped model as an embedding model with `--is-embedding`
(in 0.5.15's recorded parser; its LlamaForCausalLM pools the last token and normalises:
sglang/srt/models/llama.py `Pooler(PoolingType.LAST, normalize=True)`). The spec carries the
flag as `extra_args`, as a stack would. Nothing in SGLang refuses a chat request to such a
model up front, so `serving.engine` asks `GET /model_info` first (serving/engine.py
`MODEL_KIND_ROUTES`) and must warm up through `/v1/embeddings` alone; the proxy must pass
`/v1/embeddings` with its usage.

Its own start (ports 18000/18001, 0.3 of the card's memory), stopped at the end of this
module. `bench.gpu.remote` runs this file first among SGLang's (SGLANG_TESTS), before the
session's `served_sglang` holds the card. Run by `python3 -m bench.gpu.remote run --phases
sglang`; skipped anywhere else. Passed on one H100 in docs/gpu.md runs AD and AF.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.gpu import device
from tests.gpu.conftest import results_dir
from tests.gpu.support import Served, check_embeddings_through

pytestmark = [pytest.mark.gpu, pytest.mark.sglang, pytest.mark.timeout(900)]
PROXY = "http://127.0.0.1:18000"


@pytest.fixture(scope="module")
def sglang_embedder(
    tmp_path_factory: pytest.TempPathFactory, results: dict[str, Any]
) -> Iterator[Served]:
    spec = {**device.sglang_spec_dict(extra_args=["--is-embedding"]), "gpu_memory_fraction": 0.3}
    spec_file = device.write_spec(tmp_path_factory.mktemp("sglang-embed") / "spec.json", spec)
    log_file = results_dir(tmp_path_factory) / "checks-sglang-embed-engine.log"
    with Served.start(
        spec_file, log_file, ports=(18000, 18001), env=device.run_env("sglang")
    ) as srv:
        results["sglang_embeddings"] = {"spec": spec, "ready_s": srv.ready_s}
        yield srv


def test_sglang_says_it_embeds_and_warm_up_uses_embeddings_alone(
    sglang_embedder: Served, results: dict[str, Any]
) -> None:
    said = sglang_embedder.matching("says the model embeds")
    done = sglang_embedder.matching("warm-up done")
    results["sglang_embeddings"]["warm_up"] = said + done
    assert said, "serving.engine never read is_generation=false from SGLang's /model_info"
    assert done and "via /v1/embeddings" in done[-1], done


def test_sglang_embeddings_through_the_proxy(
    sglang_embedder: Served, results: dict[str, Any]
) -> None:
    results["sglang_embeddings"]["answer"] = check_embeddings_through(PROXY)
