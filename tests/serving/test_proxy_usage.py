"""Stream token accounting when the engine forces usage, and the usage-only chunk filter.

The spec starts vLLM with ``--enable-force-include-usage`` and SGLang with
``--stream-response-default-include-usage``: every stream ends with a usage-only chunk
(``choices: []``), and vLLM also puts running usage on every chunk. The stub mimics both
(``force_include_usage``, ``continuous_usage``). The proxy counts the tokens either way and
passes the usage-only chunk only to clients that asked for it (``stream_options``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from serving.proxy.sse import UsageChunkFilter, is_usage_only_event
from tests.harness.stub_engine import PROJECT_ROOT, StubEngine, StubEngineProcess
from tests.serving.conftest import AUTH, CHAT, RunningProxy

STREAM = {**CHAT, "stream": True}
PROMPT_TOKENS = 3  # "say three words"

# What the engines send, per the pinned sources: SGLang's flag adds the final chunk only;
# vLLM's also adds running usage to every chunk.
ENGINE_MODES = {
    "sglang-like": {"force_include_usage": True},
    "vllm-like": {"force_include_usage": True, "continuous_usage": True},
}


def data_events(raw: bytes) -> list[dict[str, object]]:
    return [json.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


@pytest.mark.parametrize("mode", list(ENGINE_MODES))
def test_forced_usage_is_counted_and_hidden_from_clients_that_did_not_ask(
    proxy: RunningProxy, stub_engine: StubEngine, mode: str
) -> None:
    stub_engine.configure(**ENGINE_MODES[mode])
    with proxy.client(headers=AUTH) as c:
        plain = c.post("/v1/chat/completions", json={**STREAM, "stub": {"tokens": 6}}).content
        text = c.post(
            "/v1/completions", json={"model": "m", "prompt": "a b", "stream": True}
        ).content
    tokens = proxy.app.metrics.tokens
    # counted: 6 + 4 (the stub's default) completion tokens, final totals not running sums
    assert tokens[("alice", "completion")] == 6 + 4
    assert tokens[("alice", "prompt")] == PROMPT_TOKENS + 2
    # what `chunk.choices[0]` client code needs: no chunk without a choice
    for raw, n in ((plain, 6), (text, 4)):
        chunks = data_events(raw)
        assert len(chunks) == n and all(chunk["choices"] for chunk in chunks)
        assert raw.endswith(b"data: [DONE]\n\n")
    # the engine did send the usage chunk (so the proxy removed it), unasked
    first = stub_engine.requests()[0]
    assert first["completed"] and "stream_options" not in json.loads(first["body"])
    assert proxy.app.metrics.requests[("chat_completions", "200", "alice")] == 1


@pytest.mark.parametrize("mode", list(ENGINE_MODES))
def test_clients_that_asked_for_usage_still_get_the_usage_chunk(
    proxy: RunningProxy, stub_engine: StubEngine, mode: str
) -> None:
    stub_engine.configure(**ENGINE_MODES[mode])
    asked = {**STREAM, "stream_options": {"include_usage": True}, "stub": {"tokens": 5}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=asked).content
    chunks = data_events(raw)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": PROMPT_TOKENS, "completion_tokens": 5, "total_tokens": PROMPT_TOKENS + 5,
    }  # fmt: skip
    assert len(chunks) == 6
    assert proxy.app.metrics.tokens[("alice", "completion")] == 5


def test_include_usage_false_is_not_asking(proxy: RunningProxy, stub_engine: StubEngine) -> None:
    stub_engine.configure(force_include_usage=True)
    body = {**STREAM, "stream_options": {"include_usage": False}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=body).content
    assert all(chunk["choices"] for chunk in data_events(raw))
    assert proxy.app.metrics.tokens[("alice", "completion")] == 4


def test_without_forced_usage_unasked_streams_are_not_counted(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    """The control: the count above comes from the engine's forced chunk, nothing else."""
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=STREAM).content
    assert len(data_events(raw)) == 4
    assert proxy.app.metrics.tokens[("alice", "completion")] == 0


def test_stub_process_forces_usage_from_its_cli_flags() -> None:
    """The subprocess stub gets the switches as CLI flags (what the benchmark starts)."""
    engine = StubEngineProcess(tokens=2, force_include_usage=True, continuous_usage=True)
    assert "--force-include-usage" in engine.command()
    with engine:
        import httpx

        raw = httpx.post(f"{engine.url}/v1/chat/completions", json=STREAM, timeout=10).content
    chunks = data_events(raw)
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 2, 2]  # type: ignore[index]
    assert chunks[-1]["choices"] == []
    help_text = subprocess.run(
        [sys.executable, "-m", "tests.harness.stub_engine", "--help"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert "--continuous-usage" in help_text and "--health-fail-next" in help_text


# ---- the filter on its own ------------------------------------------------------------------

USAGE_EVENT = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
)
TOKEN_EVENTS = [
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"[]"}}]}',
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"\\"choices\\":[]"}}]}',
]


def run_filter(pieces: list[bytes]) -> tuple[bytes, int]:
    f = UsageChunkFilter()
    out = b"".join(f.feed(p) for p in pieces) + f.flush()
    return out, f.dropped


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
def test_filter_drops_only_the_usage_event_at_every_split_point(sep: bytes) -> None:
    kept = sep.join(TOKEN_EVENTS) + sep
    stream = kept + USAGE_EVENT + sep + b"data: [DONE]" + sep
    want = kept + b"data: [DONE]" + sep
    assert run_filter([stream]) == (want, 1)
    for cut in range(1, len(stream)):
        assert run_filter([stream[:cut], stream[cut:]]) == (want, 1), cut
    assert run_filter([bytes([b]) for b in stream]) == (want, 1)


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
def test_filter_looks_at_every_event_with_empty_choices_in_one_read(sep: bytes) -> None:
    # Two usage-only events, and between them one whose choices are empty but that carries no
    # usage (kept: only usage-only chunks are the engine's addition). The filter searches from
    # one empty choices list to the next: each must be judged, whatever its place in the read.
    empty_no_usage = b'data: {"id":"c1","choices":[],"system_fingerprint":"x"}'
    events = [TOKEN_EVENTS[0], USAGE_EVENT, TOKEN_EVENTS[2], empty_no_usage, USAGE_EVENT]
    stream = sep.join([*events, b"data: [DONE]"]) + sep
    want = sep.join([TOKEN_EVENTS[0], TOKEN_EVENTS[2], empty_no_usage, b"data: [DONE]"]) + sep
    assert run_filter([stream]) == (want, 2)
    for cut in range(1, len(stream), 7):
        assert run_filter([stream[:cut], stream[cut:]]) == (want, 2), cut


def test_filter_passes_whole_events_untouched_and_holds_half_ones() -> None:
    f = UsageChunkFilter()
    whole = TOKEN_EVENTS[0] + b"\n\n"
    assert f.feed(whole) is whole  # the fast path: no copy
    half = TOKEN_EVENTS[1][:20]
    assert f.feed(half) == b""
    assert f.feed(TOKEN_EVENTS[1][20:] + b"\n\n") == TOKEN_EVENTS[1] + b"\n\n"
    assert f.flush() == b""  # nothing held back
    # a usage-only chunk at the very end without its blank line is still dropped
    assert run_filter([USAGE_EVENT]) == (b"", 1)
    # an event that never ends is not held forever
    huge = b"data: " + b"x" * (300 * 1024)
    assert run_filter([huge[: len(huge) // 2], huge[len(huge) // 2 :]])[0] == huge


@pytest.mark.parametrize(
    ("event", "usage_only"),
    [
        (USAGE_EVENT, True),
        (b'data: {"choices": [ ], "usage": {"prompt_tokens": 1}}', True),
        (b'event: x\ndata:{"choices":[],"usage":{}}', True),
        (b'data: {"choices":[],"usage":null}', False),  # nothing to count: not a usage chunk
        (b'data: {"choices":[]}', False),
        (b'data: {"choices":[{"index":0}],"usage":{"prompt_tokens":1}}', False),
        (b'data: {"choices":[],"usage":{"prompt_tokens":1}', False),  # broken JSON
        (b": comment", False),
        (b"data: [DONE]", False),
    ],
)
def test_what_counts_as_a_usage_only_event(event: bytes, usage_only: bool) -> None:
    assert is_usage_only_event(event) is usage_only


def test_stream_counting_survives_a_usage_chunk_split_across_reads(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    """The engine pauses half-way through its last token event; the usage chunk follows."""
    stub_engine.configure(force_include_usage=True)
    proxy = start_proxy()
    split = {**STREAM, "stub": {"fail": "pause_mid_event", "fail_after_tokens": 3,
                                "pause_s": 0.1}}  # fmt: skip
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=split).content
    assert [c["choices"][0]["delta"]["content"] for c in data_events(raw)] == [  # type: ignore[index]
        "tok0 ", "tok1 ", "tok2 ", "tok3 ",
    ]  # fmt: skip
    assert proxy.app.metrics.tokens[("alice", "completion")] == 4


@pytest.mark.parametrize("mode", list(ENGINE_MODES))
@pytest.mark.parametrize("asks_usage", [True, False], ids=["asked", "not-asked"])
def test_usage_chunk_cut_inside_a_number_is_counted_whole(
    proxy: RunningProxy, stub_engine: StubEngine, mode: str, asks_usage: bool
) -> None:
    """The engine's usage chunk arrives in two reads, split inside "completion_tokens": 12."""
    stub_engine.configure(**ENGINE_MODES[mode])
    cut = {"tokens": 12, "fail": "pause_mid_event", "fail_after_tokens": 12, "pause_s": 0.1}
    body = {**STREAM, "stub": cut}
    if asks_usage:
        body["stream_options"] = {"include_usage": True}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=body).content
    chunks = data_events(raw)
    assert len(chunks) == 12 + asks_usage
    assert (chunks[-1]["choices"] == []) is asks_usage
    assert proxy.app.metrics.tokens[("alice", "completion")] == 12
    assert proxy.app.metrics.tokens[("alice", "prompt")] == PROMPT_TOKENS
