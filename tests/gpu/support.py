"""Helpers of the GPU tests: the served container, SSE parsing, the engine's metrics."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from bench.gpu import device

PROXY = "http://127.0.0.1:8000"
ENGINE = "http://127.0.0.1:8001"
AUTH = {"Authorization": f"Bearer {device.API_KEY}"}
READY_TIMEOUT_S = 600.0


@dataclass
class Served:
    """`python -m serving.engine` running; `lines` are (seconds since launch, line)."""

    proc: subprocess.Popen[str]
    t0: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    ready_s: float | None = None
    exit_code: int | None = None
    # SGLang: why the start with `snapshot: true` failed, when the fixture fell back to one
    # without (None: the snapshot start served)
    snapshot_error: str | None = None

    @classmethod
    @contextlib.contextmanager
    def start(
        cls,
        spec_file: Path,
        log_file: Path,
        *,
        snapshot_cycle: bool = False,
        ports: tuple[int, int] = (8000, 8001),
        wait: bool = True,
        env: dict[str, str] | None = None,
    ) -> Iterator[Served]:
        cmd = [
            sys.executable, "-m", "serving.engine", "--spec", str(spec_file),
            "--proxy-port", str(ports[0]), "--engine-port", str(ports[1]),
        ]  # fmt: skip
        if snapshot_cycle:
            cmd.append("--snapshot-cycle")
        proc = subprocess.Popen(
            cmd,
            cwd=device.ROOT,
            env=env if env is not None else device.run_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        srv = cls(proc, time.monotonic())
        assert proc.stdout is not None
        reader = threading.Thread(target=srv._pump, args=(proc.stdout, log_file), daemon=True)
        reader.start()
        try:
            if wait:
                srv.wait_ready()
            yield srv
        finally:
            srv.stop()
            reader.join(5)

    def _pump(self, stream: IO[str], log_file: Path) -> None:
        with log_file.open("a") as log:
            for line in stream:
                stamp = time.monotonic() - self.t0
                self.lines.append((stamp, line.rstrip("\n")))
                log.write(f"{stamp:8.2f} {line}")
                log.flush()

    def wait_ready(self) -> None:
        while True:
            if any("SERVING READY" in line for _, line in self.lines):
                self.ready_s = round(self.first("SERVING READY"), 1)
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)  # let the last lines arrive
                raise AssertionError(
                    f"serving.engine exited {self.proc.returncode} before ready:\n"
                    + "\n".join(line for _, line in self.lines[-40:])
                )
            if time.monotonic() - self.t0 > READY_TIMEOUT_S:
                raise AssertionError(f"not ready after {READY_TIMEOUT_S} s")
            time.sleep(0.25)

    def wait_exit(self, timeout: float) -> int:
        self.exit_code = self.proc.wait(timeout)
        time.sleep(0.3)  # the reader drains the pipe
        return self.exit_code

    def first(self, text: str) -> float:
        """Seconds since launch of the first line containing `text` (AssertionError if none)."""
        for stamp, line in self.lines:
            if text in line:
                return stamp
        raise AssertionError(f"no line with {text!r} in serving.engine's output")

    def matching(self, *texts: str) -> list[str]:
        return [f"{s:.2f} {line}"[:300] for s, line in self.lines if any(t in line for t in texts)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.exit_code = self.proc.returncode


def chat(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": device.SERVED_NAME,
        "messages": [{"role": "user", "content": "Say something about GPUs."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def sse_data(lines: list[str]) -> list[str]:
    """The `data:` values of an SSE body's lines, in order (`[DONE]` included)."""
    return [line[5:].strip() for line in lines if line.startswith("data:")]


def running_requests(client: httpx.Client) -> float:
    """The engine's own gauge of requests in its running batch (summed over its labels)."""
    text = client.get(f"{ENGINE}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(device.RUNNING_METRIC + "{") or line.startswith(
            device.RUNNING_METRIC + " "
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sglang_running(client: httpx.Client) -> float:
    """SGLang's own count of requests in its running batch, from its load report (GET
    /v1/loads: num_running_reqs per scheduler, published after every batch and when it goes
    idle; its Prometheus gauge lags: bench.gpu.device.SGLANG_RUNNING_METRIC)."""
    r = client.get(f"{ENGINE}{device.SGLANG_LOADS_PATH}", timeout=5)
    r.raise_for_status()
    loads = r.json().get("loads") or []
    if not loads:
        raise AssertionError(f"{device.SGLANG_LOADS_PATH} reported no scheduler: {r.text[:300]}")
    return float(sum(load.get("num_running_reqs", 0) for load in loads))


def metric_value(client: httpx.Client, name: str) -> float | None:
    """A Prometheus metric of the engine's /metrics summed over its labels (None: absent)."""
    text = client.get(f"{ENGINE}/metrics", timeout=5).text
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]
    return sum(found) if found else None


def wait_running(
    client: httpx.Client,
    want_zero: bool,
    timeout: float,
    read: Callable[[httpx.Client], float] = running_requests,
) -> tuple[float, float]:
    """Poll every 20 ms until the gauge is 0 (or > 0); (seconds waited, last value)."""
    t0 = time.monotonic()
    while True:
        value = read(client)
        if (value == 0) == want_zero or time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, value
        time.sleep(0.02)


def model_hidden_size() -> int:
    """The served model's hidden size (mkmodel's config): an embedding's length."""
    config = json.loads((Path(device.MODEL_DIR) / "config.json").read_text())
    return int(config["hidden_size"])


def check_embeddings_through(proxy: str) -> dict[str, Any]:
    """POST /v1/embeddings with two inputs through the proxy at `proxy`: refused (401) without
    a key; with it, one finite vector per input, in order, of the model's hidden size, the two
    different, and the engine's usage. Returns what it measured."""
    body = {"model": device.SERVED_NAME, "input": ["The sea is calm.", "A storm is coming."]}
    with httpx.Client(timeout=60) as client:
        refused = client.post(f"{proxy}/v1/embeddings", json=body)
        answer = client.post(f"{proxy}/v1/embeddings", json=body, headers=AUTH)
    assert refused.status_code == 401, refused.text[:300]
    assert answer.status_code == 200, answer.text[:500]
    data = answer.json()
    vectors = [row["embedding"] for row in sorted(data["data"], key=lambda r: r["index"])]
    measured = {
        "dimensions": [len(v) for v in vectors],
        "norms": [round(math.sqrt(sum(x * x for x in v)), 4) for v in vectors],
        "usage": data.get("usage"),
    }
    assert [row["index"] for row in data["data"]] == [0, 1], measured
    assert all(len(v) == model_hidden_size() for v in vectors), measured  # last token pooled
    assert all(math.isfinite(x) for v in vectors for x in v)
    assert vectors[0] != vectors[1]
    assert data["usage"]["prompt_tokens"] > 0, measured
    return measured


def read_events(lines: Iterator[str], n: int) -> int:
    """Read SSE lines from `lines` (a live `r.iter_lines()`) until `n` content events came;
    the count read (fewer only where the stream ended first).

    The caller must hold `lines` until it means the client to leave. A
    `for line in r.iter_lines(): ... break` leaves at the break: the loop's generator is
    finalised there, and httpcore closes the connection on that GeneratorExit (httpcore
    _sync/connection_pool.py `PoolByteStream.__iter__`, `except BaseException: self.close()`).
    Measured with httpx 0.28.1 (tests/bench/test_gpu_support.py): the server saw the close at
    the break, before `r.close()`. Runs U-Y's disconnect checks read the engine's gauge after
    that break, so what they took for a gauge reading 0 mid-stream was the abort."""
    count = 0
    for line in lines:
        if line.startswith("data:") and "[DONE]" not in line:
            count += 1
            if count >= n:
                break  # `lines` itself stays open: its owner still holds it
    return count


def gauge_reads(
    client: httpx.Client,
    seconds: float,
    read: Callable[[httpx.Client], float] = running_requests,
) -> list[float]:
    """The gauge read every 20 ms for `seconds` (at least one read)."""
    end, reads = time.monotonic() + seconds, [read(client)]
    while time.monotonic() < end:
        time.sleep(0.02)
        reads.append(read(client))
    return reads


def wait_stable_zero(
    client: httpx.Client,
    hold_s: float,
    timeout: float,
    read: Callable[[httpx.Client], float] = running_requests,
) -> tuple[float | None, float]:
    """Poll every 20 ms until the gauge has read 0 at every poll for `hold_s`: (seconds from
    the call to the first 0 of that run, or None if none held within `timeout`; last value).
    A held 0, not one read: the check's claim is that the slot stays free, and one read of 0
    would also pass a gauge that went back to 1 (vLLM 0.26.0 sets it per output batch:
    async_llm.py `output_handler` -> loggers.py `record`)."""
    t0 = time.monotonic()
    zero_since: float | None = None
    while True:
        now, value = time.monotonic(), read(client)
        if value != 0:
            zero_since = None
        elif zero_since is None:
            zero_since = now
        if zero_since is not None and now - zero_since >= hold_s:
            return zero_since - t0, value
        if now - t0 > timeout:
            return None, value
        time.sleep(0.02)


def usage_only(events: list[str]) -> list[dict[str, Any]]:
    found = []
    for data in events:
        if data == "[DONE]" or not data.startswith("{"):
            continue
        chunk = json.loads(data)
        if chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict):
            found.append(chunk)
    return found
