"""``python -m serving.proxy --workers N`` (serving/proxy/workers.py), as real processes on a
real port: connections spread over the workers, one in-flight limit for all of them, one
/metrics summing all of them, SIGTERM drains every worker, a dead worker stops the proxy,
``--workers 1`` stays one process. The engine is the in-process stub (tests/harness)."""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.proxy.workers import BOARD_PREFIX, PUBLISH_S, boards_parent, sweep_stale_boards
from tests.harness.stub_engine import PROJECT_ROOT, StubEngine
from tests.serving.conftest import ALICE, AUTH, CHAT, KEYS, wait_until

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "SO_REUSEPORT"),
    reason="--workers needs SO_REUSEPORT (Linux, BSDs, macOS), which this platform lacks",
)

STREAM = {**CHAT, "stream": True}
# One token, then the engine stays silent: a stream that holds its in-flight slot.
HELD = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 30}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyProcess:
    """``python -m serving.proxy`` in a subprocess; its stderr (JSON lines) goes to a file."""

    def __init__(self, upstream: str, log: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "SERVING_API_KEYS": json.dumps(KEYS)}
        cmd = [sys.executable, "-m", "serving.proxy", "--upstream", upstream,
               "--port", str(self.port), "--host", "127.0.0.1", "--health-interval-s", "0.05",
               *flags]  # fmt: skip
        with log.open("w") as err:
            self.proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stderr=err)

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines written so far (whole lines: a process may be writing the last)."""
        text = self.log.read_text()
        whole = text[: text.rfind("\n") + 1].splitlines()
        return [json.loads(x) for x in whole if x.startswith("{")]

    def access(self, route: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.lines() if "route" in e and route in (None, e["route"])]

    def worker_pids(self) -> dict[int, int]:
        return {e["worker"]: e["pid"] for e in self.lines()
                if e.get("event") == "proxy_worker_started"}  # fmt: skip

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    def metrics(self) -> tuple[str, str]:
        """/metrics over a new connection: (text, the answering process's request-id prefix)."""
        r = request(self.port, "GET", "/metrics")
        assert r.status == 200
        return r.body.decode(), r.headers["x-request-id"][:16]

    def wait_ready(self, workers: int) -> None:
        """Every worker sees the engine ready (/metrics: ``proxy_engine_ready 1`` only then)."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the proxy exited: {self.log.read_text()[-2000:]}")
            try:
                return "proxy_engine_ready 1\n" in self.metrics()[0]
            except OSError:
                return False

        wait_until(ready, timeout=20, what="every worker to see the engine ready")
        assert len(self.worker_pids()) == workers

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.worker_pids().values():  # PR_SET_PDEATHSIG stops them (SIGTERM)
            wait_until(functools.partial(gone, pid), timeout=10, what=f"worker {pid} to exit")


@pytest.fixture
def start(tmp_path: Path, stub_engine: StubEngine) -> Iterator[Any]:
    started: list[ProxyProcess] = []

    def make(*flags: str, workers: int = 3) -> ProxyProcess:
        proxy = ProxyProcess(
            stub_engine.url, tmp_path / f"proxy-{len(started)}.log", "--workers", str(workers),
            *flags,
        )  # fmt: skip
        started.append(proxy)
        proxy.wait_ready(workers if workers > 1 else 0)
        return proxy

    yield make
    for proxy in started:
        proxy.kill()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
    """One request over a new connection (http.client: cheaper than an httpx client each)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={**AUTH, "Content-Type": "application/json"})
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def chat(proxy: ProxyProcess) -> Answer:
    return request(proxy.port, "POST", "/v1/chat/completions", CHAT)


def sample(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (any labels) in Prometheus text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def gone(pid: int) -> bool:
    return not alive(pid)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_connections_spread_over_the_workers(start: Any) -> None:
    proxy = start()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: chat(proxy), range(40)))
    assert [r.status for r in answers] == [200] * 40
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in answers)
    # Each worker's request ids carry its own random prefix.
    assert len({r.headers["x-request-id"][:16] for r in answers}) > 1
    wait_until(lambda: len(proxy.access("chat_completions")) == 40, what="the access lines")
    served_by = {e["worker"] for e in proxy.access("chat_completions")}
    assert len(served_by) > 1 and served_by <= {0, 1, 2}
    pids = proxy.worker_pids()
    assert sorted(pids) == [0, 1, 2] and set(pids.values()) <= set(proxy.children())
    assert proxy.stop() == 0


def test_the_in_flight_limit_is_one_for_all_workers(start: Any) -> None:
    proxy = start("--max-in-flight", "4")
    held = []
    try:
        for _ in range(4):  # each on a new connection: they land on any worker
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            body = json.dumps(HELD).encode()
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + ALICE.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body
            )  # fmt: skip
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            held.append(sock)
        assert "\nproxy_in_flight 4\n" in proxy.metrics()[0]
        # Over new connections: on whichever worker they land, all four slots are taken.
        with ThreadPoolExecutor(6) as pool:
            refused = list(pool.map(lambda _: chat(proxy), range(12)))
        assert [r.status for r in refused] == [429] * 12
        assert {r.json()["error"]["code"] for r in refused} == {"proxy_at_capacity"}
        assert len({r.headers["x-request-id"][:16] for r in refused}) > 1  # several workers
    finally:
        for sock in held:  # the client hangs up: the slots are given back
            sock.close()
    wait_until(lambda: "\nproxy_in_flight 0\n" in proxy.metrics()[0], what="the slots back")
    assert [chat(proxy).status for _ in range(6)] == [200] * 6
    assert proxy.stop() == 0


def test_metrics_from_any_worker_count_every_workers_requests(start: Any) -> None:
    proxy = start()
    k = 30
    with ThreadPoolExecutor(8) as pool:
        assert [r.status for r in pool.map(lambda _: chat(proxy), range(k))] == [200] * k
    time.sleep(PUBLISH_S + 1.0)  # every worker has published its last state
    answered_by = set()
    for _ in range(12):  # new connections: answered by one worker or another
        text, prefix = proxy.metrics()
        answered_by.add(prefix)
        chats = 'route="chat_completions"'
        assert sample(text, f'proxy_requests_total{{{chats},status="200",key="alice"}}') == k
        assert sample(text, f"proxy_request_duration_seconds_count{{{chats}}}") == k
        assert f'proxy_request_duration_seconds_bucket{{{chats},le="+Inf"}} {k}\n' in text
        assert f'proxy_tokens_total{{key="alice",kind="completion"}} {4 * k}\n' in text
        assert "\nproxy_engine_ready 1\n" in text and "\nproxy_in_flight 0\n" in text
    assert len(answered_by) > 1
    assert proxy.stop() == 0


def test_sigterm_drains_every_worker_and_all_exit_0(start: Any) -> None:
    proxy = start(workers=2)
    pids = list(proxy.worker_pids().values())
    slow = {**STREAM, "stub": {"tokens": 10, "token_delay_ms": 60}}
    with (
        httpx.Client(timeout=10) as client,
        client.stream("POST", proxy.url + "/v1/chat/completions", json=slow, headers=AUTH) as r,
    ):
        assert r.status_code == 200
        chunks = r.iter_raw()
        first = next(chunks)
        proxy.proc.send_signal(signal.SIGTERM)  # mid-stream
        rest = b"".join(chunks)
    body = first + rest
    assert body.count(b'"content"') == 10 and body.endswith(b"data: [DONE]\n\n")
    assert proxy.proc.wait(timeout=20) == 0
    assert not any(alive(pid) for pid in pids)
    stopped = [e for e in proxy.lines() if e.get("event") == "proxy_stopped"]
    assert stopped and stopped[-1]["exit_codes"] == {"0": 0, "1": 0}


def test_a_killed_worker_stops_the_proxy_non_zero(start: Any) -> None:
    proxy = start(workers=2)
    pids = proxy.worker_pids()
    os.kill(pids[1], signal.SIGKILL)
    assert proxy.proc.wait(timeout=20) != 0
    assert not alive(pids[0])  # the other one was stopped too
    died = [e for e in proxy.lines() if e.get("event") == "proxy_worker_died"]
    assert len(died) == 1
    assert (died[0]["worker"], died[0]["pid"], died[0]["exit_code"]) == (1, pids[1], -9)
    assert "SIGKILL" in died[0]["why"] and "restarts" in died[0]["action"]


def test_one_worker_is_one_process(start: Any) -> None:
    proxy = start(workers=1)
    assert chat(proxy).status == 200
    assert proxy.children() == []
    assert proxy.stop() == 0
    lines = proxy.lines()
    assert not any(e.get("event") == "proxy_worker_started" for e in lines)
    assert [e for e in lines if "route" in e and "worker" in e] == []


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (["--workers", "0"], "--workers 0 is invalid"),
        (["--workers", "4", "--max-buffered-bytes", "8000000", "--max-body-bytes", "4000000"],
         "--max-buffered-bytes 8000000 is split over --workers 4: 2000000 bytes each, less "
         "than --max-body-bytes 4000000"),
    ],
)  # fmt: skip
def test_refuses_settings_the_workers_cannot_keep(flags: list[str], expect: str) -> None:
    env = {**os.environ, "SERVING_API_KEYS": json.dumps(KEYS)}
    done = subprocess.run(
        [sys.executable, "-m", "serving.proxy", "--upstream", "http://127.0.0.1:9",
         "--port", str(free_port()), *flags],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "refusing to start" in done.stderr and expect in done.stderr


def boards_of(pid: int) -> list[Path]:
    """The metrics directories of the `--workers` main process `pid` (serving/proxy/workers.py
    BOARD_PREFIX, in boards_parent())."""
    return sorted(Path(boards_parent()).glob(f"{BOARD_PREFIX}{pid}-*"))


def test_a_sigkilled_proxys_metrics_directory_is_removed_by_the_next(start: Any) -> None:
    """A main process killed by SIGKILL cannot remove its metrics directory; the next proxy
    started on the machine removes it (its pid is gone), and keeps its own."""
    first = start(workers=2)
    assert len(boards_of(first.proc.pid)) == 1
    first.proc.kill()
    first.kill()  # reaped; its workers stopped by PR_SET_PDEATHSIG
    assert len(boards_of(first.proc.pid)) == 1  # left behind
    second = start(workers=2)
    assert boards_of(first.proc.pid) == []
    assert len(boards_of(second.proc.pid)) == 1
    assert chat(second).status == 200


def test_sweep_leaves_live_foreign_and_unnamed_directories(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(dead.stdout)
    (tmp_path / f"{BOARD_PREFIX}{dead_pid}-abc").mkdir()
    (tmp_path / f"{BOARD_PREFIX}{os.getpid()}-def").mkdir()  # alive: this test
    (tmp_path / f"{BOARD_PREFIX}notapid-x").mkdir()
    (tmp_path / f"{BOARD_PREFIX}{dead_pid}-file").write_text("")  # not a directory
    (tmp_path / "other").mkdir()
    if alive(dead_pid):
        pytest.skip(f"pid {dead_pid} was reused already")
    assert sweep_stale_boards(str(tmp_path)) == [f"{BOARD_PREFIX}{dead_pid}-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{BOARD_PREFIX}{os.getpid()}-def", f"{BOARD_PREFIX}notapid-x",
         f"{BOARD_PREFIX}{dead_pid}-file", "other"]
    )  # fmt: skip
