"""Issue 32 item 14: ``--max-in-flight`` is shared fairly between keys.

Before: one pool for all keys; one key's open streams took every slot and every other key got
429 ``proxy at capacity`` for as long as those streams ran. Now (docs/proxy.md, "Fair share
between keys"): a key may use the whole pool while no other key wants a slot; when the pool
is full, a request from a key below its fair share (``--max-in-flight`` / keys active) waits
up to ``--fair-wait-s`` for the next slot that comes free, and while such a request waits, a
key at or above its share is answered 429 at once (naming the key, never its value), so the
freed slot goes to the waiting key. A key may also have a limit of its own
(``--key-max-in-flight NAME=N``, the spec's ``proxy.key_max_in_flight``).

Over real loopback HTTP against the stub engine; the held streams send one token and then
stay silent (they hold their slot until the client hangs up)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import ALICE, BOB, CHAT, RunningProxy, wait_until
from tests.serving.test_proxy_workers import ProxyProcess

STREAM = {**CHAT, "stream": True}
# One token, then the engine stays silent: a stream that holds its in-flight slot.
HELD = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 30}}


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.body[:300]!r})"


def chat(port: int, key: str, timeout: float = 20) -> Answer:
    """One non-stream chat over a new connection with ``key``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST", "/v1/chat/completions", body=json.dumps(CHAT).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )  # fmt: skip
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def hold_stream(port: int, key: str) -> socket.socket:
    """A stream that holds one slot until the socket is closed (its head and first token read)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = json.dumps(HELD).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + key.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )  # fmt: skip
    head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200 "), head[:300]
    return sock


def waiting(proxy: RunningProxy) -> int:
    """Requests the proxy holds waiting for a slot (0 on a proxy that never waits)."""
    admission = getattr(proxy.app, "admission", None)
    return 0 if admission is None else int(admission.waiting)


def assert_refused_naming(answer: Answer, name: str, secret: str) -> None:
    assert answer.status == 429, answer
    assert answer.headers["retry-after"] == "1"
    error = answer.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert f"'{name}'" in error["message"], error  # the key's name ...
    assert secret not in answer.body.decode()  # ... never its value


def test_a_key_below_its_share_gets_the_next_free_slot_not_429(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(max_in_flight=4)
    # Nobody else wants a slot: alice may take the whole pool.
    held = [hold_stream(proxy.port, ALICE) for _ in range(4)]
    with ThreadPoolExecutor(2) as pool:
        try:
            # alice is at the whole pool: her next request is refused at once, naming her.
            assert_refused_naming(chat(proxy.port, ALICE), "alice", ALICE)
            # bob holds nothing, below his share (4 / 2 keys): he waits for a slot, no 429.
            bob: Future[Answer] = pool.submit(chat, proxy.port, BOB)
            wait_until(lambda: bob.done() or waiting(proxy) == 1, what="bob to wait for a slot")
            assert not bob.done(), f"bob was answered at once: {bob.result()}"
            # While bob waits, alice (above her share) gets 429 at once: the slot that comes
            # free is bob's.
            refused = chat(proxy.port, ALICE)
            assert_refused_naming(refused, "alice", ALICE)
            assert "share" in refused.json()["error"]["message"]
            held.pop().close()  # one of alice's streams ends
            answer = bob.result(timeout=10)
            assert answer.status == 200, answer
            assert answer.json()["usage"]["completion_tokens"] == 4
        finally:
            for sock in held:
                sock.close()
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the slots back")
    assert waiting(proxy) == 0
    assert proxy.app.metrics.requests[("chat_completions", "200", "bob")] == 1
    assert proxy.app.metrics.requests[("chat_completions", "429", "alice")] == 2
    # The refused requests never reached the engine: 4 held streams and bob's.
    assert len(stub_engine.requests("/v1/chat/completions")) == 5


def test_a_waiting_key_gets_429_naming_it_when_no_slot_comes_free(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(max_in_flight=2, fair_wait_s=0.3)
    held = [hold_stream(proxy.port, ALICE) for _ in range(2)]
    try:
        answer = chat(proxy.port, BOB)
        assert_refused_naming(answer, "bob", BOB)
        assert "0.3 s" in answer.json()["error"]["message"]
        assert answer.json()["error"]["code"] == "proxy_at_capacity"
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: proxy.app.metrics.in_flight == 0 and waiting(proxy) == 0, what="idle")
    assert chat(proxy.port, BOB).status == 200


def test_a_client_that_leaves_while_waiting_gives_up_its_place(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(max_in_flight=2)
    held = [hold_stream(proxy.port, ALICE) for _ in range(2)]
    try:
        body = json.dumps(CHAT).encode()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + BOB.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                + b"\r\n\r\n" + body
            )  # fmt: skip
            wait_until(lambda: waiting(proxy) == 1, what="bob to wait for a slot")
        wait_until(lambda: waiting(proxy) == 0, what="bob's place given up")
        held.pop().close()  # the freed slot goes to nobody: it is free
        wait_until(lambda: proxy.app.metrics.in_flight == 1, what="alice's slot back")
        assert chat(proxy.port, BOB).status == 200
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: proxy.app.admission.total == 0, what="every slot back")
    assert proxy.app.metrics.requests[("chat_completions", "499", "bob")] == 1
    assert len(stub_engine.requests("/v1/chat/completions")) == 3  # 2 held streams, bob's 200


def test_a_key_limit_from_the_config_is_honoured(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(max_in_flight=4, key_max_in_flight={"bob": 1})
    held = [hold_stream(proxy.port, BOB)]
    try:
        # The pool has 3 free slots, but bob's own limit is 1: 429 at once, naming bob and it.
        refused = chat(proxy.port, BOB)
        assert_refused_naming(refused, "bob", BOB)
        error = refused.json()["error"]
        assert error["code"] == "key_at_limit" and "limit of 1" in error["message"], error
        # alice has no limit of her own: she takes the rest of the pool.
        held += [hold_stream(proxy.port, ALICE) for _ in range(3)]
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the slots back")
    assert chat(proxy.port, BOB).status == 200


@pytest.mark.parametrize(
    ("limits", "expect"),
    [
        ({"carol": 2}, "key_max_in_flight names key 'carol', which SERVING_API_KEYS lacks"),
        ({"bob": 0}, "key_max_in_flight['bob']=0 is invalid"),
        ({"bob": 5}, "above max_in_flight (4)"),
    ],
)
def test_bad_key_limits_are_refused_at_start(
    start_proxy: Callable[..., RunningProxy], limits: dict[str, int], expect: str
) -> None:
    with pytest.raises(ValueError, match=expect.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):  # fmt: skip
        start_proxy(max_in_flight=4, key_max_in_flight=limits, wait_ready=False)


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="--workers needs SO_REUSEPORT")
def test_fair_share_holds_across_worker_processes(tmp_path: Path, stub_engine: StubEngine) -> None:
    """``--workers 2``: the per-key counts and the waiting requests are shared between the
    processes, so whichever worker holds alice's streams and whichever takes bob's request,
    bob waits for the next free slot and alice is refused while he waits."""
    proxy = ProxyProcess(
        stub_engine.url, tmp_path / "proxy.log", "--workers", "2", "--max-in-flight", "4",
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        proxy.wait_ready(2)
        held += [hold_stream(proxy.port, ALICE) for _ in range(4)]  # over new connections
        with ThreadPoolExecutor(4) as pool:
            # bob's requests land on either worker; each waits for a slot.
            bobs = [pool.submit(chat, proxy.port, BOB) for _ in range(2)]
            wait_until(
                lambda: any(b.done() for b in bobs) or "\nproxy_waiting 2\n" in metrics(proxy),
                what="bob's two requests to wait",
            )  # fmt: skip
            assert not any(b.done() for b in bobs), [b.result() for b in bobs if b.done()]
            # alice, over her share while bob waits, is refused at once by either worker.
            for answer in pool.map(lambda _: chat(proxy.port, ALICE), range(6)):
                assert_refused_naming(answer, "alice", ALICE)
            held.pop().close()
            held.pop().close()  # two of alice's streams end: both slots go to bob
            assert [b.result(timeout=10).status for b in bobs] == [200, 200]
    finally:
        for sock in held:
            sock.close()
        proxy.kill()
    served = [e for e in proxy.access("chat_completions") if e["key"] == "bob"]
    assert [e["status"] for e in served] == [200, 200]


def metrics(proxy: ProxyProcess) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {ALICE}"})
        return conn.getresponse().read().decode()
    finally:
        conn.close()
