"""Container-side lifecycle: run the auth proxy and the inference engine side by side.

Used by serving/app.py inside the Modal container, and runnable locally (no modal import):

    python -m serving.engine --spec service.json [--engine-cmd "..."] [--snapshot-cycle]

What it does, in order (`Container`):
1. start the proxy at once (`python -m serving.proxy --upstream http://127.0.0.1:ENGINE_PORT`),
   so Modal's port answers while the engine loads (the proxy says 503 + Retry-After until ready);
2. vLLM: copy the model-inspection files the image build baked (serving/bake.py) into the
   engine cache where it lacks them; read the weights into the page cache in the background,
   where they are files already
   (serving/prefetch.py), so that the engine's load finds them there after its imports;
   start the engine beside it on 127.0.0.1 (command and env rendered from the spec by
   serving/render: vLLM or SGLang, or dev/standin_engine.py given their command line when
   the spec has `engine_standin`), in its own process group, its output forwarded line by line
   and the last lines kept;
3. poll the engine's /health until 200, then send the warm-up prompts (chat completions;
   completions for a base model without a chat template; embeddings for an embedding model),
   all within the startup budget: timeouts.startup_s minus a margin, so that a slow start
   fails here, with the engine's last log lines, before Modal's startup_timeout kills the
   container without them;
4. with snapshots: put the engine to sleep before the snapshot (vLLM `POST /sleep?level=1`,
   SGLang `POST /release_memory_occupation`) and wake it after restore (`POST /wake_up`,
   `POST /resume_memory_occupation`); serving/app.py then starts the proxy only after the
   restore (`start(proxy=False)`, `after_restore()`), so the API keys are read then and never
   kept in the snapshot;
5. watch both processes: if one dies unexpectedly, print its last log lines and exit the
   container non-zero so Modal replaces it;
6. on exit, stop both (SIGTERM to the process group, SIGKILL after a grace period).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from serving import render
from serving.bake import seed_modelinfos
from serving.prefetch import WeightsPrefetch, start_prefetch
from serving.spec import ENGINE_PORT, HF_CACHE_PATH, KEY_VERSION_ENV, PROXY_PORT, ServingSpec

log = logging.getLogger("serving.engine")

TAIL_LINES = 60  # engine log lines kept for the death report
WARMUP_MAX_TOKENS = 16  # enough to run prefill and a few decode steps, cheap to repeat
ENGINE_DIED_EXIT_CODE = 70  # EX_SOFTWARE: the container exits with this when a child dies
STOP_GRACE_S = 15.0  # SIGTERM first; SIGKILL the group after this
ENGINE_HIDDEN_ENV = frozenset({"SERVING_API_KEYS"})  # the engine never needs the key digests
# The proxy gets only these from the container env (plus what the caller passes explicitly):
# never HF_TOKEN or anything else a secret mounts. The mirror image of ENGINE_HIDDEN_ENV.
PROXY_ENV_KEYS = frozenset(
    {"SERVING_API_KEYS", "PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME", "TMPDIR", "TZ"}
    | {"LANG", "LC_ALL", "LC_CTYPE"}
)
PROXY_READY_TIMEOUT_S = 120.0  # the proxy polls the engine every 0.5 s; this is generous
# The startup budget ends min(this, 10 % of timeouts.startup_s) before Modal's startup_timeout.
STARTUP_MARGIN_MAX_S = 60.0
# Warm-up routes in order: a model without a chat template answers 400 on chat, an embedding
# model 400/404 on both generation routes; those statuses move on to the next route.
WARMUP_FALLBACK_STATUSES = frozenset({400, 404})
# Where an engine says whether it generates or embeds, before any warm-up prompt: SGLang's
# `GET /model_info` ("is_generation"), which its own launcher reads to pick its warm-up route
# (0.5.15 sglang/srt/entrypoints/http_server.py `model_info` and `_execute_server_warmup`:
# /generate for a generation model, /encode otherwise). Nothing in SGLang refuses a chat
# request to an embedding model up front (tokenizer_manager.py `_validate_one_request` checks
# only an embedding request to a generation model), so its answer is not a 400/404 the route
# order could rely on (what it does answer was never seen: the warm-up no longer asks). On an
# H100 SGLang 0.5.15 with `--is-embedding` answered is_generation=false and the warm-up went
# to /v1/embeddings alone (docs/gpu.md, runs AD and AF). vLLM has no such route; its pooling
# models answer chat 400/404 and the order finds /v1/embeddings (docs/gpu.md, runs Y, AE).
MODEL_KIND_ROUTES: dict[str, str] = {"sglang": "/model_info"}

# (path, JSON body or None) per engine, both POST: where sleep and wake live.
SLEEP_ROUTES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "vllm": ("/sleep?level=1", None),  # level 1: weights to CPU, KV cache dropped
    "sglang": ("/release_memory_occupation", {}),
}
WAKE_ROUTES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "vllm": ("/wake_up", None),
    "sglang": ("/resume_memory_occupation", {}),
}


def startup_budget_s(startup_s: float) -> float:
    """How long start-up may take before we give up: `startup_s` minus min(60 s, 10 %).

    Modal's startup_timeout (= timeouts.startup_s) kills the container without our report;
    ending a little earlier lets the container print the engine's last lines and exit itself.
    """
    return float(startup_s) - min(STARTUP_MARGIN_MAX_S, 0.1 * float(startup_s))


def warmup_requests(served_model_name: str, prompt: str) -> list[tuple[str, dict[str, Any]]]:
    """(route, body) to try in order for one warm-up prompt."""
    return [
        (
            "/v1/chat/completions",
            {
                "model": served_model_name,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": WARMUP_MAX_TOKENS,
            },
        ),
        (
            "/v1/completions",
            {"model": served_model_name, "prompt": prompt, "max_tokens": WARMUP_MAX_TOKENS},
        ),
        ("/v1/embeddings", {"model": served_model_name, "input": prompt}),
    ]


class EngineError(RuntimeError):
    """The engine failed to start, answer, sleep or wake; the message says what and next steps."""


class ProcessDied(EngineError):
    """A managed process exited while it should be running."""

    def __init__(self, name: str, returncode: int | None, tail: list[str]) -> None:
        self.name = name
        self.returncode = returncode
        self.tail = tail
        super().__init__(death_report(name, returncode, tail))


def death_report(name: str, returncode: int | None, tail: list[str]) -> str:
    lines = [f"{name} exited unexpectedly with code {returncode}; its last {len(tail)} lines:"]
    lines += [f"  | {line}" for line in tail] or ["  | (no output)"]
    return "\n".join(lines)


class ManagedProcess:
    """A child in its own process group; output forwarded with a prefix, the last lines kept."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        tail_lines: int = TAIL_LINES,
        out: TextIO | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._out = out
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self.stopping = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> ManagedProcess:
        log.info("starting %s: %s", self.name, shlex.join(self.argv))
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                start_new_session=True,  # own group: stop() reaches TP workers and helpers too
            )
        except OSError as exc:
            raise EngineError(
                f"cannot start {self.name} ({self.argv[0]!r}): {exc}; check the image has it"
            ) from None
        self._reader = threading.Thread(target=self._pump, name=f"{self.name}-log", daemon=True)
        self._reader.start()
        log.info("%s started (pid %d)", self.name, self._proc.pid)
        return self

    def _pump(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        out = self._out or sys.stdout
        for raw in self._proc.stdout:
            line = raw.rstrip("\n")
            self._tail.append(line)
            try:
                out.write(f"[{self.name}] {line}\n")
                out.flush()
            except (OSError, ValueError):  # our stdout closed: keep draining the pipe
                pass

    def poll(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self._proc is not None, f"{self.name} was never started"
        rc = self._proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout=2)  # let the last lines land in the tail
        return rc

    def tail(self) -> list[str]:
        return list(self._tail)

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL it after grace_s; returns the exit code.

        Whatever is left of the group afterwards (e.g. tensor-parallel workers of an engine
        whose main process already died) is killed too.
        """
        self.stopping = True
        if self._proc is None:
            return None
        rc = self._proc.poll()
        if rc is None:
            self._signal_group(signal.SIGTERM)
            try:
                rc = self.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0f s; killing it", self.name, grace_s)
                self._signal_group(signal.SIGKILL)
                rc = self.wait(5)
        self._signal_group(signal.SIGKILL)  # orphans of the group, if any
        return rc

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def watch(self, on_death: Callable[[ManagedProcess, int], None]) -> threading.Thread:
        """Call on_death(self, returncode) from a thread if the process exits unasked."""

        def _wait() -> None:
            rc = self.wait()
            if not self.stopping:
                on_death(self, rc)

        thread = threading.Thread(target=_wait, name=f"{self.name}-watch", daemon=True)
        thread.start()
        return thread


class Engine:
    """The engine process plus the HTTP calls the lifecycle makes to it on localhost."""

    def __init__(
        self,
        spec: ServingSpec,
        *,
        port: int = ENGINE_PORT,
        argv: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        out: TextIO | None = None,
    ) -> None:
        self.spec = spec
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.process = ManagedProcess(
            spec.engine,
            argv if argv is not None else render.launch_command(spec, port, python=sys.executable),
            env={**_engine_base_env(), **render.engine_env(spec), **(env or {})},
            out=out,
        )

    def start(self) -> Engine:
        self.process.start()
        return self

    def _check_alive(self) -> None:
        rc = self.process.poll()
        if rc is not None:
            self.process.wait()
            raise ProcessDied(self.process.name, rc, self.process.tail())

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        url = self.base_url + path  # always http://127.0.0.1:<port>/...
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(
        self, timeout_s: float | None = None, interval_s: float = 0.5, *, budget: str = ""
    ) -> float:
        """Poll GET /health until 200; returns the seconds it took.

        timeout_s defaults to the startup budget (`startup_budget_s`); `budget` explains where
        the timeout came from in the error. Raises ProcessDied (with the last log lines) if the
        engine exits, EngineError on timeout.
        """
        if timeout_s is None:
            timeout_s = startup_budget_s(self.spec.timeouts.startup_s)
            budget = budget or self.budget_note()
        start = time.monotonic()
        last = "no answer yet"
        while True:
            self._check_alive()
            try:
                status, body = self.request("GET", "/health", timeout=5)
                if status == 200:
                    took = time.monotonic() - start
                    log.info("%s healthy after %.1f s", self.spec.engine, took)
                    return took
                last = f"HTTP {status} {body[:200]!r}"
            except OSError as exc:  # refused while loading, reset, timeout
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - start > timeout_s:
                tail = "\n".join(f"  | {line}" for line in self.process.tail()[-20:])
                raise EngineError(
                    f"{self.spec.engine} not healthy at {self.base_url}/health after "
                    f"{timeout_s:.1f} s{budget} (last answer: {last}); raise "
                    f"timeouts.startup_s if the model is still loading. Last log lines:\n{tail}"
                )
            time.sleep(interval_s)

    def budget_note(self) -> str:
        """Where the start-up timeout comes from, for error messages."""
        startup_s = self.spec.timeouts.startup_s
        margin = startup_s - startup_budget_s(startup_s)
        return (
            f" (the startup budget: timeouts.startup_s={startup_s} minus a {margin:g} s margin, "
            "so this report comes before Modal's startup_timeout ends the container)"
        )

    def warm_up(self, deadline: float | None = None) -> str | None:
        """Send each warm-up prompt; returns the route that answered (None without prompts).

        Chat completions first; on 400/404 (no chat template, an embedding model) completions,
        then embeddings; the first route that answers 200 is used for the remaining prompts.
        An engine that says it serves an embedding model (`embeds_only`) gets embeddings only.
        `deadline` (time.monotonic()) bounds the whole warm-up.
        """
        timeout = float(min(self.spec.timeouts.request_s, 300))
        route: str | None = None
        if self.spec.warmup_prompts and self.embeds_only(timeout):
            route = "/v1/embeddings"
        for i, prompt in enumerate(self.spec.warmup_prompts):
            candidates = warmup_requests(self.spec.served_model_name, prompt)
            if route is not None:
                candidates = [c for c in candidates if c[0] == route]
            answers: list[str] = []
            for path, payload in candidates:
                status, body = self._warmup_call(i, path, payload, timeout, deadline)
                if status == 200:
                    route = path
                    break
                answers.append(f"{path}: HTTP {status} {body[:200]!r}")
                if status not in WARMUP_FALLBACK_STATUSES:
                    break  # a server error is not "wrong route": report it
            if status != 200:
                raise EngineError(
                    f"warm-up prompt {i} failed at {self.base_url}: " + "; ".join(answers) + ". "
                    "Check the model and served_model_name (the engine answers 404 for a model "
                    "name it does not serve)"
                )
        log.info("warm-up done: %d prompt(s) via %s", len(self.spec.warmup_prompts), route)
        return route

    def embeds_only(self, timeout: float) -> bool:
        """True when the engine says it serves an embedding model (MODEL_KIND_ROUTES); False
        when it says otherwise, has no such route, or its answer cannot be read: the warm-up
        then tries the routes in order."""
        path = MODEL_KIND_ROUTES.get(self.spec.engine)
        if path is None:
            return False
        self._check_alive()
        try:
            status, body = self.request("GET", path, timeout=min(timeout, 30.0))
            info = json.loads(body) if status == 200 else None
        except (OSError, ValueError):
            return False
        embeds = isinstance(info, dict) and info.get("is_generation") is False
        if embeds:
            log.info("%s says the model embeds (%s is_generation=false)", self.spec.engine, path)
        return embeds

    def _warmup_call(
        self, i: int, path: str, payload: dict[str, Any], timeout: float, deadline: float | None
    ) -> tuple[int, bytes]:
        self._check_alive()
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(
                    f"warm-up prompt {i} not sent: start-up took all of its budget"
                    f"{self.budget_note()}; raise timeouts.startup_s"
                )
            timeout = min(timeout, left)
        try:
            return self.request("POST", path, payload, timeout=timeout)
        except OSError as exc:
            self._check_alive()
            raise EngineError(
                f"warm-up prompt {i} to {self.base_url}{path} failed: {exc}"
            ) from None

    def sleep(self) -> None:
        """Free GPU memory before a snapshot (vLLM sleep mode / SGLang memory saver)."""
        self._call_route("sleep", SLEEP_ROUTES[self.spec.engine])

    def wake(self) -> None:
        """Take GPU memory back after restore."""
        self._call_route("wake", WAKE_ROUTES[self.spec.engine])

    def _call_route(self, what: str, route: tuple[str, dict[str, Any] | None]) -> None:
        self._check_alive()
        path, body = route
        try:
            status, answer = self.request("POST", path, body, timeout=300)
        except OSError as exc:
            self._check_alive()
            raise EngineError(f"{what}: POST {self.base_url}{path} failed: {exc}") from None
        if status != 200:
            hint = (
                "is VLLM_SERVER_DEV_MODE=1 set and --enable-sleep-mode passed?"
                if self.spec.engine == "vllm"
                else "was --enable-memory-saver passed?"
            )
            raise EngineError(
                f"{what}: POST {self.base_url}{path} answered HTTP {status}: "
                f"{answer[:300]!r}; {hint}"
            )
        log.info("%s: POST %s -> 200", what, path)


def _engine_base_env() -> dict[str, str]:
    """The container's env minus what only the proxy needs (the API key digests)."""
    return {k: v for k, v in os.environ.items() if k not in ENGINE_HIDDEN_ENV}


def _proxy_base_env() -> dict[str, str]:
    """The few container env vars the proxy needs (PROXY_ENV_KEYS): no HF_TOKEN, no others."""
    return {k: v for k, v in os.environ.items() if k in PROXY_ENV_KEYS}


def exit_on_death(proc: ManagedProcess, returncode: int) -> None:
    """Default death handler: report, then end the whole container non-zero."""
    sys.stderr.write(death_report(proc.name, returncode, proc.tail()) + "\n")
    sys.stderr.write(
        f"exiting with code {ENGINE_DIED_EXIT_CODE} so Modal replaces this container\n"
    )
    sys.stderr.flush()
    os._exit(ENGINE_DIED_EXIT_CODE)


class Container:
    """Everything one serving container runs: the proxy in front, the engine behind it."""

    def __init__(
        self,
        spec: ServingSpec,
        *,
        proxy_port: int = PROXY_PORT,
        engine_port: int = ENGINE_PORT,
        engine_argv: Sequence[str] | None = None,
        proxy_argv: Sequence[str] | None = None,
        proxy_env: dict[str, str] | None = None,
        engine_env: dict[str, str] | None = None,
        with_proxy: bool = True,
        on_death: Callable[[ManagedProcess, int], None] = exit_on_death,
    ) -> None:
        self.spec = spec
        self.engine = Engine(spec, port=engine_port, argv=engine_argv, env=engine_env)
        self.proxy_url = f"http://127.0.0.1:{proxy_port}"
        self.proxy: ManagedProcess | None = None  # created by start_proxy()
        self._with_proxy = with_proxy
        self._proxy_argv = list(
            proxy_argv or render.proxy_command(spec, port=proxy_port, engine_port=engine_port)
        )
        self._proxy_env = dict(proxy_env or {})
        self._on_death = on_death
        self._died = threading.Event()
        self._started_at: float | None = None
        self.prefetch: WeightsPrefetch | None = None  # started by start()

    def _death(self, proc: ManagedProcess, returncode: int) -> None:
        self._died.set()
        for p in (self.proxy, self.engine.process):
            if p is not None:
                p.stop(grace_s=5)  # the dead one: reap what is left of its process group
        self._on_death(proc, returncode)

    def start(self, *, proxy: bool = True) -> None:
        """Start the proxy at once, then the engine beside it; watch both.

        `proxy=False` starts the engine only; `start_proxy()` (or `after_restore()`) starts the
        proxy later. With memory snapshots the proxy starts after the restore, so it reads the
        API key digests then, never from the snapshot.
        """
        self._started_at = time.monotonic()  # the startup budget counts from here
        self.seed_engine_cache()
        # The weights into the page cache while the engine imports (serving/prefetch.py).
        hf_home = Path(os.environ.get("HF_HOME") or HF_CACHE_PATH)
        self.prefetch = start_prefetch(render.model_source(self.spec), hf_home)
        if proxy:
            self.start_proxy()
        self.engine.start()
        self.engine.process.watch(self._death)

    def seed_engine_cache(self) -> None:
        """vLLM: the model-inspection files the image build baked (serving/bake.py) into the
        engine-cache Volume where it lacks them, so that an empty Volume skips the ~20 s
        inspection. Milliseconds; nothing when the image has none (SGLang images, local runs)."""
        cache_root = (self.engine.process.env or {}).get("VLLM_CACHE_ROOT")
        if cache_root is None:
            return
        try:
            copied = seed_modelinfos(Path(cache_root))
        except OSError as exc:  # vLLM inspects the model itself then: slower, not broken
            log.warning("model-inspection files not copied into %s: %s", cache_root, exc)
            return
        if copied:
            log.info("model-inspection files: %d copied into %s", copied, cache_root)

    def start_proxy(self) -> None:
        """Start the auth proxy; it reads SERVING_API_KEYS from the container env now."""
        if not self._with_proxy or self.proxy is not None:
            return
        env = {**_proxy_base_env(), **self._proxy_env}  # read at this moment, not earlier
        version = os.environ.get(KEY_VERSION_ENV, "")
        log.info("API key digests version %s", version[:12] or "(not set)")
        self.proxy = ManagedProcess("proxy", self._proxy_argv, env=env)
        self.proxy.start().watch(self._death)

    def ready(self) -> None:
        """Block until the engine is healthy and warmed up and the proxy says ready.

        Modal routes requests as soon as the enter methods return, so the proxy must have
        seen the engine healthy by then (it polls /health on its own), or the first clients
        would get 503s. Health and warm-up share the startup budget, counted from start().
        """
        started = self._started_at if self._started_at is not None else time.monotonic()
        deadline = started + startup_budget_s(self.spec.timeouts.startup_s)
        self.engine.wait_ready(
            timeout_s=max(0.0, deadline - time.monotonic()), budget=self.engine.budget_note()
        )
        self.engine.warm_up(deadline=deadline)
        self.wait_proxy_ready()

    def before_snapshot(self) -> None:
        self.engine.sleep()

    def after_restore(self) -> None:
        """Wake the engine; start the proxy if it was not (snapshots: keys read after restore,
        when Modal has updated the env: modal/_runtime/task_lifecycle_manager.py
        memory_restore), then wait until it is ready."""
        self.engine.wake()
        self.engine.wait_ready(timeout_s=PROXY_READY_TIMEOUT_S)
        self.start_proxy()
        self.wait_proxy_ready()

    def wait_proxy_ready(self, timeout_s: float = PROXY_READY_TIMEOUT_S) -> None:
        """Poll the proxy's GET /ready (open route) until 200."""
        if self.proxy is None:
            return
        start = time.monotonic()
        last = "no answer yet"
        while True:
            rc = self.proxy.poll()
            if rc is not None:
                self.proxy.wait()
                raise ProcessDied(self.proxy.name, rc, self.proxy.tail())
            try:
                with urllib.request.urlopen(f"{self.proxy_url}/ready", timeout=5) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code} {exc.read()[:200]!r}"
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - start > timeout_s:
                raise EngineError(
                    f"proxy at {self.proxy_url}/ready not ready after {timeout_s:.0f} s although "
                    f"the engine is healthy (last answer: {last}); check the proxy's log lines"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the engine, then the proxy (both are told they are stopping first)."""
        self.engine.process.stopping = True
        if self.proxy is not None:
            self.proxy.stopping = True
        self.engine.process.stop()
        if self.proxy is not None:
            self.proxy.stop(grace_s=5)

    @property
    def died(self) -> bool:
        return self._died.is_set()


def main(argv: list[str] | None = None) -> int:
    """Run the container lifecycle in the foreground until SIGTERM/SIGINT or a child dies."""
    cli = argparse.ArgumentParser(prog="python -m serving.engine", description=__doc__)
    cli.add_argument("--spec", required=True, help="serving spec JSON file")
    cli.add_argument("--engine-port", type=int, default=ENGINE_PORT)
    cli.add_argument("--proxy-port", type=int, default=PROXY_PORT)
    cli.add_argument("--engine-cmd", help="replace the spec's engine command (shell-quoted)")
    cli.add_argument("--no-proxy", action="store_true", help="run the engine alone")
    cli.add_argument(
        "--snapshot-cycle",
        action="store_true",
        help="after warm-up, sleep and wake the engine as a snapshot + restore would",
    )
    args = cli.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[serving] %(message)s", stream=sys.stderr)
    spec = ServingSpec.load(args.spec)
    container = Container(
        spec,
        proxy_port=args.proxy_port,
        engine_port=args.engine_port,
        engine_argv=shlex.split(args.engine_cmd) if args.engine_cmd else None,
        with_proxy=not args.no_proxy,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    container.start()
    try:
        container.ready()
        if args.snapshot_cycle:
            container.before_snapshot()
            container.after_restore()
        log.info("ready: proxy on :%d, engine on :%d", args.proxy_port, args.engine_port)
        print("SERVING READY", flush=True)
        stop.wait()
    except ProcessDied as exc:
        sys.stderr.write(f"{exc}\n")
        container.stop()
        return ENGINE_DIED_EXIT_CODE
    except EngineError as exc:
        sys.stderr.write(f"{exc}\n")
        container.stop()
        return 1
    container.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
