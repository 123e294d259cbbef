"""Run the Modal control-plane emulator as a subprocess: for tests, benchmarks and scripts.

`EmulatorProcess` starts `python -m emulator serve` on free loopback ports (the emulator binds
port 0 and reports the real ports in its ready line, so there is no port race), waits for the
ready line, and gives tests what they need to drive it:

    emu = EmulatorProcess().start()
    env = {**os.environ, **emu.client_env()}          # for a `modal` CLI subprocess
    subprocess.run([".venv/bin/modal", "secret", "list"], env=env, check=True)
    emu.rpc_counts()       # {"SecretList": 1, ...} since the last reset
    emu.set_usage("main", 12.5)
    emu.reset()
    emu.stop()

With `state_path=...` the emulator persists to that SQLite file; `kill()` (SIGKILL) followed by
`start()` restarts it on the same file, which is how persistence is tested. The pytest fixtures
built on this live in `tests/harness/fixtures.py` (tests import it as
`tests.harness.emulator`, which re-exports this module).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any, Final

# The repository (Pulumi.yaml, serving/, the stack files): dev/emulator/process.py is two
# folders down. The dev tools are installed editable from it (`make setup`).
PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: Credentials the emulator enforces by default when started through this helper.
DEFAULT_TOKEN_ID = "ak-emulatortest0000000000"  # noqa: S105 (a throwaway local token)
DEFAULT_TOKEN_SECRET = "as-emulatortest0000000000"  # noqa: S105
DEFAULT_WORKSPACE = "emu-workspace"


class _Default(Enum):
    """Sentinel type for `client_env()` arguments: 'use the emulator's own credentials'."""

    TOKEN = "default"  # noqa: S105 (a sentinel, not a credential)


#: Default for `client_env(token_id=..., token_secret=...)`: hand out the emulator's token.
DEFAULT: Final = _Default.TOKEN

_READY_RE = re.compile(r"^MODAL EMULATOR READY grpc=(?P<grpc>\S+) http=(?P<http>\S+)")


class EmulatorError(RuntimeError):
    """The emulator process failed to start, died, or its control surface answered an error."""


class EmulatorProcess:
    """One emulator subprocess: start/stop/kill/restart plus its HTTP control surface.

    Args:
        state_path: SQLite file to persist to (`--state`); None runs with `--memory`.
        workspace: workspace name the emulator reports (it appears in web URLs).
        token_id / token_secret: credentials the emulator requires; `client_env()` hands them
            out. Pass `token_id=None` to start an emulator that accepts any token.
        rbac: emulate a workspace with RBAC (`--rbac`): proxy tokens are scoped to the
            environments of their allowlist. On by default here, because the project's
            `ProxyAuthToken` resource is built on those allowlists; the emulator's own
            default (and real Modal's default workspace) is RBAC off.
        heartbeat_timeout: seconds without AppHeartbeat after which an initializing or
            ephemeral app is stopped (`--heartbeat-timeout`); None keeps the emulator's 60.
        port / http_port: fixed ports; 0 (default) lets the emulator pick free ones.
        cwd: working directory of the process (defaults to the project root).
        python: interpreter to run (defaults to the one running the tests).
        extra_args: more `serve` flags, appended as given (e.g. the `--edge-*` limits).
        env: variables added to the process's environment (e.g. `TMPDIR`).
    """

    def __init__(
        self,
        *,
        state_path: str | os.PathLike[str] | None = None,
        workspace: str = DEFAULT_WORKSPACE,
        token_id: str | None = DEFAULT_TOKEN_ID,
        token_secret: str | None = DEFAULT_TOKEN_SECRET,
        rbac: bool = True,
        heartbeat_timeout: float | None = None,
        port: int = 0,
        http_port: int = 0,
        cwd: str | os.PathLike[str] | None = None,
        python: str = sys.executable,
        runtime: bool = True,
        max_containers: int | None = None,
        webhook_timeout: float | None = None,
        container_network: str | None = None,
        stop_grace: float | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.state_path = Path(state_path) if state_path is not None else None
        self.workspace = workspace
        self.token_id = token_id
        self.token_secret = token_secret
        self.rbac = rbac
        self.heartbeat_timeout = heartbeat_timeout
        self._req_port = port
        self._req_http_port = http_port
        self.cwd = Path(cwd) if cwd is not None else PROJECT_ROOT
        self.python = python
        self.runtime = runtime
        self.max_containers = max_containers
        self.webhook_timeout = webhook_timeout
        self.container_network = container_network
        self.stop_grace = stop_grace
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self._tmp = tempfile.TemporaryDirectory(prefix="modal-emulator-")
        self.home = Path(self._tmp.name) / "home"
        self.home.mkdir()
        self._proc: subprocess.Popen[bytes] | None = None
        self._starts = 0
        self.url = ""
        self.control_url = ""
        self.port = 0
        self.http_port = 0
        self.stdout_path = Path(self._tmp.name) / "stdout.log"
        self.stderr_path = Path(self._tmp.name) / "stderr.log"

    # ---- lifecycle -------------------------------------------------------------------
    def command(self) -> list[str]:
        """The exact command line used to start the emulator."""
        port = self.port if self._starts and self._req_port == 0 and self.port else self._req_port
        http_port = (
            self.http_port
            if self._starts and self._req_http_port == 0 and self.http_port
            else self._req_http_port
        )
        cmd = [self.python, "-m", "emulator", "serve", "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--http-port", str(http_port)]
        cmd += ["--workspace", self.workspace]
        if self.state_path is not None:
            cmd += ["--state", str(self.state_path)]
        else:
            cmd += ["--memory"]
        if self.token_id is not None and self.token_secret is not None:
            cmd += ["--token-id", self.token_id, "--token-secret", self.token_secret]
        if self.rbac:
            cmd += ["--rbac"]
        if self.heartbeat_timeout is not None:
            cmd += ["--heartbeat-timeout", str(self.heartbeat_timeout)]
        if not self.runtime:
            cmd += ["--no-runtime"]
        if self.max_containers is not None:
            cmd += ["--max-containers", str(self.max_containers)]
        if self.webhook_timeout is not None:
            cmd += ["--webhook-timeout-s", str(self.webhook_timeout)]
        if self.container_network is not None:
            cmd += ["--container-network", self.container_network]
        if self.stop_grace is not None:
            cmd += ["--stop-grace-s", str(self.stop_grace)]
        return cmd + self.extra_args

    def start(self, timeout: float = 30.0) -> EmulatorProcess:
        """Start the process and block until it printed its ready line.

        A restart (after `stop()` or `kill()`) reuses the previous ports when they were picked
        automatically, so URLs handed out before stay valid; if that port is taken meanwhile,
        it falls back to fresh ports.
        """
        if self.alive:
            raise EmulatorError(f"emulator already running (pid {self.pid}) at {self.url}")
        try:
            self._spawn(timeout)
        except EmulatorError:
            if not self._starts or self._req_port != 0:
                raise
            # The old auto-picked port may be taken now: retry with fresh ports.
            self.port = self.http_port = 0
            self._spawn(timeout)
        return self

    def _spawn(self, timeout: float) -> None:
        cmd = self.command()
        env = dict(os.environ)
        env.update(self.extra_env)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "ab") as err:
            self._proc = subprocess.Popen(
                cmd, cwd=self.cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )
        self._starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stdout_path.read_text(errors="replace")
            for line in text.splitlines():
                m = _READY_RE.match(line)
                if m:
                    self.url = m.group("grpc")
                    self.control_url = m.group("http")
                    self.port = int(self.url.rsplit(":", 1)[1])
                    self.http_port = int(self.control_url.rsplit(":", 1)[1])
                    return
            if self._proc.poll() is not None:
                raise EmulatorError(
                    f"emulator exited with code {self._proc.returncode} before becoming ready;"
                    f" command: {' '.join(cmd)}\nstderr tail:\n{self.stderr_tail()}"
                )
            time.sleep(0.05)
        self.kill()
        raise EmulatorError(
            f"emulator did not print its ready line within {timeout:.0f}s;"
            f" command: {' '.join(cmd)}\nstderr tail:\n{self.stderr_tail()}"
        )

    @property
    def alive(self) -> bool:
        """True while the subprocess is running."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self, timeout: float = 40.0) -> int:
        """SIGTERM and wait; returns the exit code (0 on a clean shutdown).

        The emulator first stops its containers (each gets `--stop-grace-s`, default 10 s, to
        run `@modal.exit`), hence the generous default timeout.
        """
        if self._proc is None:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
                raise EmulatorError(
                    f"emulator pid {self._proc.pid} ignored SIGTERM for {timeout}s; killed it."
                    f" Its log ends:\n{self.stderr_tail(30)}"
                ) from None
        return self._proc.returncode

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap: simulates a crash."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def restart(self, timeout: float = 30.0) -> EmulatorProcess:
        """Stop cleanly (if running) and start again with the same arguments and state file."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop the process and remove the temporary HOME and logs."""
        try:
            self.stop()
        finally:
            self._tmp.cleanup()

    def __enter__(self) -> EmulatorProcess:
        if not self.alive:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def stderr_tail(self, lines: int = 40) -> str:
        """Last lines of the emulator's log (stderr), for failure messages."""
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ---- pointing the modal client at it ----------------------------------------------
    def client_env(
        self,
        *,
        token_id: str | _Default | None = DEFAULT,
        token_secret: str | _Default | None = DEFAULT,
    ) -> dict[str, str]:
        """Env vars that point the `modal` SDK/CLI at this emulator.

        MODAL_SERVER_URL, MODAL_TOKEN_ID, MODAL_TOKEN_SECRET, plus HOME and MODAL_CONFIG_PATH
        pointing into an empty temp dir so no `~/.modal.toml` interferes. Merge it over
        os.environ for subprocesses: `{**os.environ, **emu.client_env()}`; note that
        MODAL_ENVIRONMENT / MODAL_PROFILE from the outer environment would still apply
        (`subprocess_env()` removes them). Override the token to test auth failures: a string
        (even "") is handed out as is, None leaves the variable out (a missing token).
        """
        env = {
            "MODAL_SERVER_URL": self.url,
            "HOME": str(self.home),
            "MODAL_CONFIG_PATH": str(self.home / ".modal.toml"),
        }
        own_id = self.token_id if self.token_id is not None else DEFAULT_TOKEN_ID
        own_secret = self.token_secret if self.token_secret is not None else DEFAULT_TOKEN_SECRET
        chosen_id = own_id if token_id is DEFAULT else token_id
        chosen_secret = own_secret if token_secret is DEFAULT else token_secret
        if isinstance(chosen_id, str):
            env["MODAL_TOKEN_ID"] = chosen_id
        if isinstance(chosen_secret, str):
            env["MODAL_TOKEN_SECRET"] = chosen_secret
        return env

    def subprocess_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """os.environ + client_env() (+ extra), without MODAL_ENVIRONMENT/MODAL_PROFILE.

        MODAL_TOKEN_ID/MODAL_TOKEN_SECRET of the outer environment are dropped too, so only
        the token `client_env()` hands out (or `extra` sets) reaches the subprocess.
        """
        dropped = ("MODAL_ENVIRONMENT", "MODAL_PROFILE", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        env.update(self.client_env())
        env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        if extra:
            env.update(extra)
        return env

    # ---- control surface ----------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if not self.control_url:
            raise EmulatorError("emulator not started: call start() first")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310 (control_url is http://, set by start())
            self.control_url + path,
            data=data,
            method=method,
            headers={
                **self.control_headers(),
                **({"Content-Type": "application/json"} if data is not None else {}),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
                payload = resp.read()
        except urllib.error.HTTPError as e:
            raise EmulatorError(
                f"{method} {path} on the emulator answered {e.code}: {e.read().decode()[:500]}"
            ) from None
        except OSError as e:
            raise EmulatorError(
                f"{method} {path}: emulator at {self.control_url} unreachable ({e});"
                f" alive={self.alive}\nstderr tail:\n{self.stderr_tail()}"
            ) from None
        return json.loads(payload) if payload else None

    def control_headers(self) -> dict[str, str]:
        """Headers the control surface (`/_emulator/*`) needs: the emulator's own token."""
        if self.token_id is None or self.token_secret is None:
            return {}
        return {"Authorization": f"Bearer {self.token_id}:{self.token_secret}"}

    def reset(self) -> None:
        """Drop every resource (default environment "main" is recreated) and zero rpc counts."""
        self._request("POST", "/_emulator/reset", {})

    def state(self) -> dict[str, Any]:
        """JSON dump of the state: environments, secrets (key names only), volumes, apps, ..."""
        result: dict[str, Any] = self._request("GET", "/_emulator/state")
        return result

    def set_usage(self, environment: str, usd: float) -> None:
        """Set an environment's current-cycle usage in dollars (drives EnvironmentGetBudget)."""
        self._request("POST", "/_emulator/usage", {"environment": environment, "usd": usd})

    def containers(self) -> list[dict[str, Any]]:
        """Every container the runtime started: task_id, state, pid, app/function ids, ..."""
        result: list[dict[str, Any]] = self._request("GET", "/_emulator/containers")["containers"]
        return result

    def live_containers(self, app_id: str | None = None) -> list[dict[str, Any]]:
        """Containers starting, ready or stopping (optionally of one app)."""
        return [
            c
            for c in self.containers()
            if c["state"] in ("starting", "ready", "stopping")
            and (app_id is None or c["app_id"] == app_id)
        ]

    def edge_ports(self) -> dict[str, int]:
        """Endpoint label (`<workspace>[-<env>]--<label>`, Modal's host name) -> edge port."""
        result: dict[str, int] = self._request("GET", "/_emulator/edge")["ports"]
        return result

    def edge_url(self, label: str) -> str:
        """The local URL the emulator gives the endpoint Modal would call `https://LABEL.modal.run`."""
        ports = self.edge_ports()
        if label not in ports:
            raise EmulatorError(f"no edge port for endpoint {label!r}; known: {sorted(ports)}")
        return f"http://127.0.0.1:{ports[label]}"

    def run_schedule(self, app: str, function: str, environment: str = "") -> str:
        """Fire a scheduled function now (`POST /_emulator/schedules/run`); its call id."""
        result = self._request(
            "POST",
            "/_emulator/schedules/run",
            {"app": app, "function": function, "environment": environment},
        )
        return str(result["function_call_id"])

    def pause_schedule(
        self, app: str, function: str, environment: str = "", *, paused: bool = True
    ) -> None:
        """Stop (`paused=False`: restart) a scheduled function's automatic runs
        (`POST /_emulator/schedules/pause`), by name: also before its app is deployed;
        `run_schedule` still fires it."""
        self._request(
            "POST",
            "/_emulator/schedules/pause",
            {"app": app, "function": function, "environment": environment, "paused": paused},
        )

    def rpc_counts(self) -> dict[str, int]:
        """Per-method count of RPCs received since the last reset (or start)."""
        result: dict[str, int] = self._request("GET", "/_emulator/rpc-counts")
        return result
