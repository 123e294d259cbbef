"""The Modal emulator as a subprocess for the providers benchmark (no dependency on tests/).

`python -m emulator serve --memory` on ports it picks itself (it reports them in its ready
line), with a token it enforces; `subprocess_env()` points the `modal` SDK/CLI and the provider
server at it with an empty HOME, so no `~/.modal.toml` interferes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from pulumi_standin import PROJECT_ROOT

TOKEN_ID = "ak-benchproviders000000000"
TOKEN_SECRET = "as-benchproviders000000000"
_READY = re.compile(r"^MODAL EMULATOR READY grpc=(?P<grpc>\S+) http=(?P<http>\S+)", re.M)


class BenchEmulator:
    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-emulator-")
        self.home = Path(self._tmp.name) / "home"
        self.home.mkdir()
        self.log = Path(self._tmp.name) / "emulator.log"
        self.url = ""
        self.control_url = ""  # the HTTP side (`/_emulator/*` control routes, blobs)
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BenchEmulator:
        cmd = [sys.executable, "-m", "emulator", "serve", "--host", "127.0.0.1"]
        cmd += ["--port", "0", "--http-port", "0", "--memory", "--rbac"]
        cmd += ["--token-id", TOKEN_ID, "--token-secret", TOKEN_SECRET]
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(
                cmd, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = _READY.search(self.log.read_text(errors="replace"))
            if m:
                self.url = m.group("grpc")
                self.control_url = m.group("http")
                return self
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError(f"emulator did not start: {self.log.read_text(errors='replace')}")

    def subprocess_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        drop = ("MODAL_ENVIRONMENT", "MODAL_PROFILE", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET")
        env = {k: v for k, v in os.environ.items() if k not in drop}
        env.update(
            MODAL_SERVER_URL=self.url,
            MODAL_TOKEN_ID=TOKEN_ID,
            MODAL_TOKEN_SECRET=TOKEN_SECRET,
            HOME=str(self.home),
            MODAL_CONFIG_PATH=str(self.home / ".modal.toml"),
        )
        env.update(extra or {})
        return env

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._tmp.cleanup()
