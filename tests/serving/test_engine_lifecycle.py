"""Container lifecycle (serving/engine.py) with the stub engine as the "engine" process.

Everything is real: the stub engine (tests/harness/stub_engine.py) runs as the engine command
on a loopback port, the real auth proxy (`python -m serving.proxy`) in front of it, and the
lifecycle polls, warms up, sleeps, wakes and watches them over HTTP and process state.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving import render
from serving.engine import (
    ENGINE_DIED_EXIT_CODE,
    Container,
    Engine,
    EngineError,
    ManagedProcess,
    ProcessDied,
)
from serving.proxy.keys import digest_of
from serving.spec import ServingSpec

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-lifecycle-key"
KEYS_ENV = {"SERVING_API_KEYS": json.dumps({"ci": digest_of(KEY)})}
PROMPTS = ["Hello", "Say something short"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_spec(engine: str = "vllm", snapshot: bool = True, **kw: Any) -> ServingSpec:
    return ServingSpec.model_validate(
        {
            "engine": engine,
            "model": "Qwen/Qwen3-8B",
            "served_model_name": "qwen3-8b",
            "snapshot": snapshot,
            "context_length": 4096,
            "warmup_prompts": PROMPTS,
            "timeouts": {"startup_s": 60, "request_s": 30},
            **kw,
        }
    )


def stub_cmd(port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tests.harness.stub_engine",
        "--port", str(port), "--model", "qwen3-8b", *extra,
    ]  # fmt: skip


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def stub_log(port: int) -> dict[str, Any]:
    status, body = http("GET", f"http://127.0.0.1:{port}/_stub/log")
    assert status == 200
    return dict(body)


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Deaths:
    """Records on_death calls instead of exiting the test process."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, list[str]]] = []
        self.event = threading.Event()

    def __call__(self, proc: ManagedProcess, returncode: int) -> None:
        self.calls.append((proc.name, returncode, proc.tail()))
        self.event.set()


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
def container_factory() -> Iterator[Any]:
    made: list[Container] = []

    def make(spec: ServingSpec, engine_port: int, proxy_port: int, *stub_extra: str) -> Container:
        deaths = Deaths()
        c = Container(
            spec,
            proxy_port=proxy_port,
            engine_port=engine_port,
            engine_argv=stub_cmd(engine_port, *stub_extra),
            proxy_env=KEYS_ENV,
            on_death=deaths,
        )
        c.deaths = deaths  # type: ignore[attr-defined]
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


@pytest.mark.parametrize(
    ("engine", "sleep_path", "sleep_query", "wake_path"),
    [
        ("vllm", "/sleep", "level=1", "/wake_up"),
        ("sglang", "/release_memory_occupation", "", "/resume_memory_occupation"),
    ],
)
def test_full_lifecycle_through_the_real_proxy(
    container_factory: Any,
    ports: tuple[int, int],
    engine: str,
    sleep_path: str,
    sleep_query: str,
    wake_path: str,
) -> None:
    engine_port, proxy_port = ports
    spec = make_spec(engine)
    c = container_factory(spec, engine_port, proxy_port, "--startup-delay-s", "1.0")
    c.start()
    # the proxy is up at once and says "not ready" while the engine loads
    wait_for(lambda: _answers(f"http://127.0.0.1:{proxy_port}/health"), "proxy /health")
    c.ready()
    log = stub_log(engine_port)
    assert log["health_hits"] >= 2  # polled through the 503 phase until 200
    warmups = [r for r in log["requests"] if r["path"] == "/v1/chat/completions"]
    assert [json.loads(r["body"])["messages"][0]["content"] for r in warmups] == PROMPTS
    assert all(json.loads(r["body"])["model"] == "qwen3-8b" for r in warmups)
    assert all(r["status"] == 200 and r["completed"] for r in warmups)

    c.before_snapshot()
    c.after_restore()
    calls = [(r["method"], r["path"], r["query"]) for r in stub_log(engine_port)["requests"]]
    assert ("POST", sleep_path, sleep_query) in calls and ("POST", wake_path, "") in calls
    assert calls.index(("POST", sleep_path, sleep_query)) < calls.index(("POST", wake_path, ""))
    other = {"/sleep", "/wake_up", "/release_memory_occupation", "/resume_memory_occupation"}
    other -= {sleep_path, wake_path}
    assert not [c for c in calls if c[1] in other]  # the other engine's routes never hit

    # a client request through the proxy, with a key, reaches the engine
    status, _ = http("GET", f"http://127.0.0.1:{proxy_port}/ready")
    assert status == 200
    status, body = http(
        "POST",
        f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}]},
        {"Authorization": f"Bearer {KEY}"},
    )
    assert status == 200 and body["choices"]
    # the engine's dev routes stay unreachable from outside
    status, _ = http("POST", f"http://127.0.0.1:{proxy_port}{sleep_path}", {}, {})
    assert status == 404

    c.stop()
    assert c.engine.process.poll() is not None and c.proxy is not None
    assert c.proxy.poll() is not None
    assert c.deaths.calls == []  # a requested stop is not a death


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer means it listens
    except OSError:
        return False


def test_engine_death_after_ready_is_reported_with_last_lines(
    container_factory: Any, ports: tuple[int, int]
) -> None:
    engine_port, proxy_port = ports
    c = container_factory(make_spec(snapshot=False), engine_port, proxy_port)
    c.start()
    c.ready()
    pid = c.engine.process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert c.deaths.event.wait(20), "the watcher did not notice the engine died"
    name, rc, tail = c.deaths.calls[0]
    assert (name, rc) == ("vllm", -signal.SIGKILL)
    assert any("stub engine ready" in line for line in tail)
    assert c.proxy is not None and c.proxy.poll() is not None  # the proxy was stopped too


def test_proxy_death_ends_the_container_too(container_factory: Any, ports: tuple[int, int]) -> None:
    engine_port, proxy_port = ports
    c = container_factory(make_spec(snapshot=False), engine_port, proxy_port)
    c.start()
    c.ready()
    assert c.proxy is not None and c.proxy.pid is not None
    os.kill(c.proxy.pid, signal.SIGKILL)
    assert c.deaths.event.wait(20), "the watcher did not notice the proxy died"
    assert c.deaths.calls[0][:2] == ("proxy", -signal.SIGKILL)
    assert any("proxy_starting" in line for line in c.deaths.calls[0][2])
    assert c.engine.process.poll() is not None  # the engine was stopped with it


def test_wait_ready_raises_with_the_last_lines_when_the_engine_exits() -> None:
    spec = make_spec(snapshot=False)
    script = "echo loading weights; echo 'CUDA error: out of memory' >&2; exit 3"
    engine = Engine(spec, port=free_port(), argv=["sh", "-c", script])
    engine.start()
    with pytest.raises(ProcessDied) as info:
        engine.wait_ready(timeout_s=30, interval_s=0.05)
    assert info.value.returncode == 3
    assert info.value.tail == ["loading weights", "CUDA error: out of memory"]
    assert "exited unexpectedly with code 3" in str(info.value)


def test_wait_ready_times_out_naming_health_and_last_answer() -> None:
    port = free_port()
    engine = Engine(make_spec(), port=port, argv=stub_cmd(port, "--health-status", "503"))
    engine.start()
    try:
        with pytest.raises(EngineError) as info:
            engine.wait_ready(timeout_s=1.0, interval_s=0.1)
        text = str(info.value)
        assert f"127.0.0.1:{port}/health" in text and "HTTP 503" in text
        assert "timeouts.startup_s" in text
    finally:
        engine.process.stop()


def test_warm_up_failure_names_the_status() -> None:
    port = free_port()
    engine = Engine(make_spec(), port=port, argv=stub_cmd(port, "--fail", "500"))
    engine.start()
    try:
        engine.wait_ready(timeout_s=30, interval_s=0.05)
        with pytest.raises(EngineError, match=r"warm-up prompt 0 .* HTTP 500"):
            engine.warm_up()
    finally:
        engine.process.stop()


def test_sleep_failure_hints_at_dev_mode() -> None:
    """A vLLM without dev mode answers 404 on /sleep: the error says what to check."""
    port = free_port()
    # the stub's /sleep answers 200, so point sleep at a route the stub does not have
    engine = Engine(make_spec(), port=port, argv=stub_cmd(port))
    engine.start()
    try:
        engine.wait_ready(timeout_s=30, interval_s=0.05)
        with pytest.raises(EngineError, match=r"HTTP 404.*VLLM_SERVER_DEV_MODE"):
            engine._call_route("sleep", ("/no-such-sleep-route", None))
    finally:
        engine.process.stop()


def test_stop_kills_the_whole_process_group() -> None:
    """Children of the engine (TP workers) go too: SIGTERM reaches the group."""
    port = free_port()
    script = f"{shlex.join(stub_cmd(port))} & wait"
    engine = Engine(make_spec(), port=port, argv=["sh", "-c", script])
    engine.start()
    engine.wait_ready(timeout_s=30, interval_s=0.05)
    rc = engine.process.stop(grace_s=10)
    assert rc is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


def test_orphans_of_a_dead_engine_are_killed() -> None:
    """The engine's main process dies, its worker lives on: stop() still clears the group."""
    port = free_port()
    script = f"{shlex.join(stub_cmd(port))} & sleep 600"
    engine = Engine(make_spec(), port=port, argv=["sh", "-c", script])
    engine.start()
    engine.wait_ready(timeout_s=30, interval_s=0.05)
    assert engine.process.pid is not None
    os.kill(engine.process.pid, signal.SIGKILL)  # the leader only
    engine.process.wait(10)
    assert _answers(f"http://127.0.0.1:{port}/health")  # the "worker" survived its parent
    engine.process.stop(grace_s=5)
    wait_for(lambda: not _answers(f"http://127.0.0.1:{port}/health"), "the orphan to die")


def test_proxy_command_carries_the_spec_settings() -> None:
    spec = make_spec(proxy={"max_in_flight": 300, "max_body_bytes": 2048, "keepalive_s": 5})
    cmd = render.proxy_command(spec, port=8000, engine_port=8001, python="python3")
    assert cmd[:3] == ["python3", "-m", "serving.proxy"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert args == {
        "--upstream": "http://127.0.0.1:8001",
        "--port": "8000",
        "--max-in-flight": "300",
        "--max-body-bytes": "2048",
        "--keepalive-s": "5.0",
        "--upstream-timeout-s": "30",
    }
    # and the real proxy CLI accepts every one of them
    from serving.proxy.__main__ import build_parser

    parsed = build_parser().parse_args(cmd[3:])
    assert parsed.max_in_flight == 300 and parsed.keepalive_s == 5.0


def test_proxy_workers_one_unless_set() -> None:
    four = make_spec(snapshot=False)  # 4 vLLM API servers, still one proxy process
    assert render.sizing(four).api_servers == 4 and render.proxy_workers(four) == 1
    assert "--workers" not in render.proxy_command(four)
    cmd = render.proxy_command(make_spec(snapshot=False, proxy={"workers": 4}))
    assert cmd[cmd.index("--workers") + 1] == "4"
    from serving.proxy.__main__ import build_parser

    assert build_parser().parse_args(cmd[3:]).workers == 4  # the real proxy CLI takes it
    assert "--workers" not in render.proxy_command(make_spec(proxy={"workers": 1}))
    assert '"workers"' not in make_spec().to_json()  # unset: the digest of older specs holds


# ---- the CLI runner: what the container does, as a process ------------------------------------


def run_cli(spec: ServingSpec, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    return subprocess.Popen(
        [sys.executable, "-m", "serving.engine", "--spec", str(path), *args],
        cwd=ROOT,
        env={**os.environ, **KEYS_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_cli_exits_non_zero_with_last_lines_when_engine_dies_at_start(tmp_path: Path) -> None:
    script = "echo step one; echo 'RuntimeError: no GPU found'; exit 1"
    proc = run_cli(
        make_spec(snapshot=False), tmp_path, "--no-proxy", "--engine-cmd", f"sh -c {script!r}"
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ENGINE_DIED_EXIT_CODE, err
    assert "exited unexpectedly with code 1" in err
    assert "  | RuntimeError: no GPU found" in err and "  | step one" in err


def test_cli_exits_non_zero_when_engine_dies_after_ready(tmp_path: Path) -> None:
    engine_port, proxy_port = free_port(), free_port()
    proc = run_cli(
        make_spec("sglang"),
        tmp_path,
        "--engine-port", str(engine_port),
        "--proxy-port", str(proxy_port),
        "--engine-cmd", shlex.join(stub_cmd(engine_port)),
        "--snapshot-cycle",
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "SERVING READY" in line:
                break
        assert any("SERVING READY" in line for line in lines), lines
        calls = [r["path"] for r in stub_log(engine_port)["requests"]]
        assert "/release_memory_occupation" in calls and "/resume_memory_occupation" in calls
        pid_line = re.search(r"sglang started \(pid (\d+)\)", _read_available(proc))
        assert pid_line, "the runner logs the engine pid"
        os.kill(int(pid_line.group(1)), signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ENGINE_DIED_EXIT_CODE
    assert "sglang exited unexpectedly with code -9" in err
    assert "stub engine ready" in err  # the engine's own last lines are in the report


def _read_available(proc: subprocess.Popen[str]) -> str:
    """stderr so far (the runner logs there); non-blocking read of what is buffered."""
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    chunks = []
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline:
        chunk = proc.stderr.read()
        if chunk:
            chunks.append(chunk)
            text = "".join(chunks)
            if "started (pid" in text:
                break
        time.sleep(0.05)
    os.set_blocking(proc.stderr.fileno(), True)
    return text


def test_cli_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    engine_port, proxy_port = free_port(), free_port()
    proc = run_cli(
        make_spec(snapshot=False),
        tmp_path,
        "--engine-port", str(engine_port),
        "--proxy-port", str(proxy_port),
        "--engine-cmd", shlex.join(stub_cmd(engine_port)),
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "SERVING READY" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "exited unexpectedly" not in err
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{engine_port}/health", timeout=2)
