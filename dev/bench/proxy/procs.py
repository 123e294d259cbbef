"""Processes under benchmark and how to read their cost: the proxy, nginx, RSS and CPU time."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from serving.proxy.keys import digest_of
from standin_engine import PROJECT_ROOT

BENCH_KEY = "sk-bench-0123456789"  # what dev/bench/proxy/loadgen.py sends


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within {timeout} s")
        time.sleep(0.05)


def proc_tree(pid: int) -> list[int]:
    """pid and its children (nginx master + workers)."""
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for child in children:
        pids += proc_tree(int(child))
    return pids


def rss_bytes(pid: int) -> int:
    total = 0
    for p in proc_tree(pid):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def cpu_seconds(pid: int) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in proc_tree(pid):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])
    return total - idle, total


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Fraction of all CPUs busy between two ``machine_cpu()`` readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else float("nan")


class Nginx:
    """nginx as a plain reverse proxy in front of the stub (config in a temp dir)."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
        conf = f"""
worker_processes 1;
daemon off;
user root;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
worker_rlimit_nofile 20000;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {self.dir}/body;
  proxy_temp_path {self.dir}/proxy;
  fastcgi_temp_path {self.dir}/fastcgi;
  uwsgi_temp_path {self.dir}/uwsgi;
  scgi_temp_path {self.dir}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream_port}; keepalive 1024; }}
  server {{
    listen 127.0.0.1:{self.port} backlog=4096;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""
        (self.dir / "nginx.conf").write_text(conf)
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen(
            [binary, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        wait_http(self.url + "/health")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Proxy:
    """``python -m serving.proxy`` in front of ``upstream``; ``root``: run the ``serving``
    package found there instead of this checkout's (an older version, ``--baseline-ref``)."""

    def __init__(self, upstream: str, *extra: str, root: Path | None = None) -> None:
        self.port = free_port()
        env = {**os.environ, "SERVING_API_KEYS": json.dumps({"bench": digest_of(BENCH_KEY)})}
        if root is not None:
            env["PYTHONPATH"] = str(root)
        cmd = [
            sys.executable,
            "-m",
            "serving.proxy",
            "--upstream",
            upstream,
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            "--max-in-flight",
            "100000",
            *extra,
        ]
        self.proc = subprocess.Popen(
            cmd,
            cwd=root or PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        wait_http(self.url + "/ready")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def hold_streams(url: str, n: int, pid: int) -> float:
    """Open n streams through url; return RSS growth of pid's process tree per stream.

    A short warm-up first, so one-time allocations (code paths, caches) are not counted."""
    warmup = {"kind": "latency", "targets": {"warmup": url}, "n": 50, "block": 50, "warmup": 50}
    subprocess.run(
        [sys.executable, "-m", "bench.proxy.loadgen", json.dumps(warmup)],
        cwd=PROJECT_ROOT, capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    before = rss_bytes(pid)
    job = json.dumps({"kind": "hold", "url": url, "streams": n})
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.proxy.loadgen", job],
        cwd=PROJECT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if not line.startswith('{"open"'):
        proc.kill()
        raise RuntimeError(f"could not hold {n} streams open through {url}: {line!r}")
    time.sleep(0.5)
    during = rss_bytes(pid)
    proc.stdin.write("close\n")
    proc.stdin.flush()
    proc.communicate(timeout=60)
    return (during - before) / n


def machine() -> dict[str, str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_avg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
