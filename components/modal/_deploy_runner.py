"""Deploy one Modal app file in a fresh process and print one JSON line about the result.

Run by the App provider as `python -m components.modal._deploy_runner --app-file F --name N
[--environment E] [--tag T] [--app-tags JSON]` (T: the release's digests, as `modal deploy
--tag`; JSON: the App tags to publish with, the release records), with MODAL_*
credentials and SERVING_SPEC (+ the App's extra env) in the environment. A fresh process per
deploy keeps modal's module-level state (imported app modules, the cached client, the
environment cache) from leaking between deploys.

It does what `modal deploy F --name N -e E` does (same import path, `modal.runner.deploy_app`),
then reads back what the provider needs and prints, as the LAST stdout line:

    {"ok": true, "app_id": "ap-...", "web_url": "https://..." | "", "version": 3}
    {"ok": true, "app_id": "ap-...", "web_url": "", "version": 0, "read_back_error": "..."}
    {"ok": false, "error": "<type>: <message>", "transient": false}

Once `deploy_app` returned, the deploy is done: the read-back is retried (READ_BACK_ATTEMPTS)
and, if it still fails, reported in `read_back_error` with `ok: true`, never as a failed
deploy (issue 11 item 5: a create that Modal completed must not fail).

`web_url`: the first flash URL of an `@app.server` (what `modal.Server.from_name(...).get_url()`
returns), else the first web endpoint URL (`Function.get_web_url()`), by function tag order.
`version`: the highest version in `AppDeploymentHistory` for the app.

The parent side lives here too, one for the App and the ModelWeights runner
(`components.modal.model_weights`): `child_env` (the provider's Modal credentials, nothing of
its own MODAL_* settings), `handover_file` (a 0600 file in a temp directory the runner
removes if the parent dies) and `run_runner` (start it, hand each JSON line of its stdout to
the caller as it comes, kill it at the deadline, keep its stderr tail).

Dies with its parent (issue 32 item 11): the runner holds the Modal token in its environment,
so it must not outlive whatever started it (a kill -9 of the engine, the stand-in or the
provider server). `die_with_parent` (also used by the weights runner in model_weights.py)
asks Linux for SIGTERM when the parent dies (`prctl(PR_SET_PDEATHSIG)`), watches the parent
pid as a fallback, and on either removes the files the parent handed over (SERVING_SPEC, the
weights source) with their temp directory, then exits at once.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import ctypes.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The parent may name itself (its pid) so a parent that died before the child got to
#: `die_with_parent` is still noticed; without it the parent is whoever it is at that point.
PARENT_PID_ENV = "MODAL_LLM_PARENT_PID"
#: Temp directories the providers hand files over in (tempfile.TemporaryDirectory prefixes):
#: only such a directory, directly under the temp dir, is removed with its file.
HANDOVER_DIR_PREFIXES = ("modal-app-spec-", "modal-weights-")
#: linux/prctl.h: `#define PR_SET_PDEATHSIG 1`.
PR_SET_PDEATHSIG = 1
#: How often the fallback watchdog looks at the parent pid.
WATCH_EVERY_S = 0.2
#: How long a SIGTERM waits to see the parent gone before it exits without removing files.
TERM_GRACE_S = 1.0


def _remove_handover(paths: Iterable[str]) -> None:
    """Remove each handed-over file, and its directory when it is one of our temp dirs."""
    tmp = Path(tempfile.gettempdir()).resolve()
    for raw in paths:
        if not raw:
            continue
        path = Path(raw)
        with contextlib.suppress(OSError):
            path.unlink()
        parent = path.parent
        with contextlib.suppress(OSError):
            if parent.resolve().parent == tmp and parent.name.startswith(HANDOVER_DIR_PREFIXES):
                shutil.rmtree(parent, ignore_errors=True)


def _set_pdeathsig(sig: int) -> bool:
    """`prctl(PR_SET_PDEATHSIG, sig)`: man 2 prctl, "Set the parent-death signal of the calling
    process to arg2 ... This is the signal that the calling process will get when its parent
    dies." Linux only; False where it is unavailable (the watchdog still runs)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _parent_gone(expected: int) -> bool:
    """We were re-parented, or the parent is dead (a zombie, or no such process)."""
    if os.getppid() != expected:
        return True
    try:
        stat = Path(f"/proc/{expected}/stat").read_text()
    except OSError:
        return Path("/proc/self").exists()  # no /proc (not Linux): getppid() alone decides
    return stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X")


def die_with_parent(paths: Iterable[str]) -> None:
    """End this process (after removing `paths`) as soon as its parent is gone.

    1. `prctl(PR_SET_PDEATHSIG, SIGTERM)`; SIGTERM's handler removes the files and `_exit`s.
       SIGTERM rather than SIGKILL so the files can be removed (a SIGKILLed child cannot).
       man 2 prctl: the setting is cleared on fork, kept across execve of a non-setuid
       binary, and the "parent" is the *thread* that created this process: the providers
       start the runner from the thread that then waits for it, so that thread lives as long
       as the parent does.
    2. man 2 prctl also warns that a parent dead before the call is not signalled: the parent
       pid is compared right after the call (PARENT_PID_ENV when the parent set it).
    3. A watchdog thread compares `os.getppid()` with the parent every WATCH_EVERY_S (where
       prctl is missing, or the signal could not be delivered).
    """
    files = [str(p) for p in paths if p]
    expected = int(os.environ.get(PARENT_PID_ENV) or 0) or os.getppid()

    def die(code: int) -> None:
        _remove_handover(files)
        os._exit(code)

    def on_term(_signum: int, _frame: Any) -> None:
        # The parent-death signal comes when the *thread* that started us exits, which in a
        # SIGKILLed parent is before the process is gone (we are handed to a sibling thread
        # first: `getppid()` still names it). Wait for the parent to be gone; a SIGTERM from
        # anyone else while the parent lives leaves the files to the parent.
        until = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < until:
            if _parent_gone(expected):
                die(128 + signal.SIGTERM)
            time.sleep(0.02)
        os._exit(128 + signal.SIGTERM)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
        _set_pdeathsig(signal.SIGTERM)
    if _parent_gone(expected):
        die(1)

    def watch() -> None:
        while True:
            time.sleep(WATCH_EVERY_S)
            if _parent_gone(expected):
                die(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


# ---- the parent's side: start a runner, follow it, end it ------------------------------------


def child_env(
    token_id: str, token_secret: str, server_url: str, environment: str, own: Mapping[str, str]
) -> dict[str, str]:
    """The runner's environment: ours without our MODAL_* settings (but the config file and
    profile), then `own` (what the runner is told), then the provider's Modal credentials."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MODAL_") or k in ("MODAL_CONFIG_PATH", "MODAL_PROFILE")
    }
    env.update(own)
    env.update(
        {
            "MODAL_TOKEN_ID": token_id,
            "MODAL_TOKEN_SECRET": token_secret,
            "MODAL_SERVER_URL": server_url,
            "PYTHONUNBUFFERED": "1",
            # The runner checks it right after PR_SET_PDEATHSIG (a parent that died before
            # that call sends no signal: man 2 prctl).
            PARENT_PID_ENV: str(os.getpid()),
        }
    )
    if environment:
        env["MODAL_ENVIRONMENT"] = environment
    return env


@contextlib.contextmanager
def handover_file(prefix: str, name: str, text: str) -> Iterator[Path]:
    """A file only this user can read, holding `text`, in a fresh temp directory named
    `prefix...` (one of HANDOVER_DIR_PREFIXES). The runner removes it with its directory if
    this process dies first (`die_with_parent`): the directory may be gone at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        path = Path(tmp) / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield path


@dataclass
class RunnerRun:
    """What one runner run said and how it ended."""

    result: dict[str, Any] = field(default_factory=dict)  # the last `{"ok": ...}` line
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    returncode: int | None = None
    timed_out: bool = False


def _item(line: str) -> dict[str, Any] | None:
    try:
        item = json.loads(line)
    except ValueError:
        return None
    return item if isinstance(item, dict) else None


def run_runner(
    cmd: list[str],
    env: Mapping[str, str],
    deadline_s: float,
    on_item: Callable[[dict[str, Any]], None] | None = None,
    into: RunnerRun | None = None,
) -> RunnerRun:
    """Run a runner until it exits or `deadline_s` passes (then it is killed). Each JSON
    object it prints goes to `on_item` as it arrives; the last one holding "ok" is the
    result. `into`: the record to fill (a caller's subclass), else a new one."""
    run = into if into is not None else RunnerRun()
    lines: queue.Queue[str | None] = queue.Queue()
    deadline = time.monotonic() + deadline_s

    def take(line: str) -> None:
        item = _item(line)
        if item is None:
            return
        if on_item is not None:
            on_item(item)
        if "ok" in item and "progress" not in item:
            run.result = item

    with subprocess.Popen(
        cmd,
        env=dict(env),
        cwd=os.getcwd(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        out, err = proc.stdout, proc.stderr
        assert out is not None and err is not None

        def pump_stdout() -> None:
            for line in out:
                lines.put(line)
            lines.put(None)

        def pump_stderr() -> None:
            run.stderr.extend(err)

        pumps = [threading.Thread(target=f, daemon=True) for f in (pump_stdout, pump_stderr)]
        for pump in pumps:
            pump.start()
        # Reading stdout to its end before a deadline is checked made the deadline dead
        # code: lines are read with the time left, and the runner is killed when none is.
        ended = False
        while not ended:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                ended = True
            else:
                take(line)
        if ended:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                ended = False
        if not ended:
            proc.kill()
            proc.wait()
        for pump in pumps:
            pump.join(timeout=5)
        while not lines.empty():  # what arrived with the deadline still counts
            line = lines.get_nowait()
            if line is not None:
                take(line)
        run.returncode = proc.returncode
    run.timed_out = not ended and not run.result.get("ok")
    return run


# ---- the runner's side ---------------------------------------------------------------------


def _transient(exc: BaseException) -> bool:
    import asyncio

    from modal import exception as mexc

    return isinstance(
        exc,
        OSError
        | asyncio.TimeoutError
        | mexc.ConnectionError
        | mexc.InternalError
        | mexc.ServiceError
        | mexc.TimeoutError,
    )


READ_BACK_ATTEMPTS = 3


async def _read_back(app: Any, app_id: str) -> dict[str, Any]:
    """Web URL and deployed version, from the hydrated app and the control plane."""
    from modal.client import _Client

    from components.modal import _rpc

    flash: list[str] = []
    web: list[str] = []
    for _tag, fn in sorted(app._local_state.functions.items()):
        urls = await fn._experimental_get_flash_urls()
        if urls:
            flash.extend(urls)
        url = await fn.get_web_url()
        if url:
            web.append(url)
    client = await _Client.from_env()
    return {
        "web_url": (flash or web or [""])[0],
        "version": await _rpc.app_version(client, app_id),
    }


def _error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def _read_back_retried(app: Any, app_id: str) -> dict[str, Any]:
    import time

    from modal._utils.async_utils import synchronizer

    read_back = synchronizer.create_blocking(_read_back)
    error = ""
    for attempt in range(READ_BACK_ATTEMPTS):
        try:
            return dict(read_back(app, app_id))
        except Exception as e:  # reported, never a failed deploy
            error = _error(e)
            time.sleep(0.5 * 2**attempt)
    return {"web_url": "", "version": 0, "read_back_error": error}


def runner_parser(description: str | None, **optional: str) -> argparse.ArgumentParser:
    """The options of every runner (this one and the weights runner in model_weights.py):
    the app file to deploy, the name to deploy it as and the environment; then `optional`
    ({option: its help}: a string option, "" when not given)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--app-file", required=True)
    parser.add_argument("--name", required=True)
    for option, help_text in {"environment": "", **optional}.items():
        parser.add_argument("--" + option.replace("_", "-"), default="", help=help_text or None)
    return parser


def import_app(args: argparse.Namespace) -> tuple[Any, str]:
    """The app of `--app-file`, imported as `modal deploy` imports it, and the environment
    to deploy it in (`--environment`, else modal's configured one)."""
    from modal.cli.import_refs import import_app_from_ref, parse_import_ref
    from modal.config import config

    ref = parse_import_ref(args.app_file, command="modal deploy")
    app = import_app_from_ref(ref, base_cmd="modal deploy")
    return app, args.environment or config.get("environment") or ""


def main(argv: list[str] | None = None) -> int:
    args = runner_parser(
        __doc__,
        tag="as `modal deploy --tag` (the release's digests)",
        app_tags="JSON object of App tags to publish with (the release records the app holds)",
    ).parse_args(argv)
    die_with_parent([os.environ.get("SERVING_SPEC", "")])
    try:
        from modal.runner import deploy_app

        app, env = import_app(args)
        # AppPublish carries the app's tags (modal 1.6.4 runner.py `_publish_app`:
        # `tags=app_local_state.tags`): the release records go along, so a publish keeps
        # them however Modal treats tags it does not receive. The app file's own tags win.
        records = json.loads(args.app_tags or "{}")
        app._local_state.tags = {**records, **app._local_state.tags}
        result = deploy_app(app, name=args.name, environment_name=env, tag=args.tag)
        out = {"ok": True, "app_id": result.app_id, **_read_back_retried(app, result.app_id)}
    except SystemExit as e:
        out = {"ok": False, "error": f"app import exited with {e.code}", "transient": False}
    except Exception as e:  # reported to the provider, which raises a clear error
        out = {"ok": False, "error": _error(e), "transient": _transient(e)}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
