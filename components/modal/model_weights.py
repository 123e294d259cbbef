"""`ModelWeights`: a service's weights volume filled with one pinned revision, at `pulumi up`.

- Create/update deploy the weights app (`app_file`, default `serving/weights_app.py`, as
  `app_name` in `environment`, with the volume and secret names it mounts) and call its
  one-shot function `provision` with the `source` map, in a fresh process
  (`python -m components.modal.model_weights`, the runner at the bottom of this file: modal's
  module state never leaks between runs, like the App's deploy runner). The runner spawns the
  call and follows the function's log while it runs (AppFetchLogs every 2 s, as `modal app
  logs` asks): each line is shown as it comes (`pulumi.log.info`). The provider waits for
  the result; a failure raises with the function's error and the last lines of its log (the
  log tail), and nothing is recorded.
- The deadline (`PROVISION_TIMEOUT_S`, 5 h; env `MODAL_WEIGHTS_PROVISION_TIMEOUT_S` seconds,
  read at call time) covers deploy and call: the provider reads the runner's lines with the
  time left (progress keeps flowing) and kills the runner when none is left.
- Transactional: a failed create/update never leaves a weights app deployed. Whatever failed
  after the deploy began (the function, the deadline, the runner dying, Modal failing, the
  deploy's answer lost), the spawned call is cancelled if it may still run
  (`FunctionCallCancel`, a private raw RPC below) and the app is stopped again, found by name
  (a lost deploy answer left no id). An update also stops the app of the last successful
  run: it is one-shot, nothing needs it between runs, the next `up` deploys it again; the
  state keeps the last good run (its revision is still on the volume), so read and delete
  still work. A clean-up that fails is in the error, with the `modal app stop` command.
- Outputs: the inputs, `revision`, `path` (the revision's directory on the volume, what the
  serving spec's `weights.path` names), `file_count`, `bytes`, `digest` (sha256 over every
  file's path, size and sha256: serving/weights.py `manifest_of`), `downloaded_bytes` of the
  last run, `app_id` of the weights app and `source_digest` of the files it ships.
- Diff: source, volume, secrets, app file/name or the shipped source changed → update (runs
  the function again: a revision already on the volume is re-hashed, not downloaded); the
  environment changed → replace; nothing changed → no change, so a no-op `up` touches
  nothing (no deploy, no call, no RPC at all: Diff never calls Modal).
- Read (refresh): the volume must still exist in the environment, else the resource reads as
  gone and the next `up` provisions again. The files themselves are not listed (Modal's
  volume listing is not implemented by the emulator): the digest is the one recorded.
- Delete stops the weights app (nothing to do after a failed update stopped it); the volume
  and its files stay (the Volume resource owns them and decides: protected/retained in prod).
- This package never imports `serving/`: the app file is deployed by path and the function
  called by name; the source map is validated by the stack config (serving/weights.py
  `source_problems`), here only its shape.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import (
    ModalProvider,
    ModalProviderError,
    ModalUnavailableError,
    environment_name,
    environment_problems,
    json_view,
    object_name,
    redact,
)
from ._deploy_runner import (
    RunnerRun,
    die_with_parent,
    handover_file,
    import_app,
    run_runner,
    runner_parser,
)
from ._deploy_runner import child_env as runner_env
from ._schema import Schema, SchemaResource, output, replaces, updates

DEFAULT_APP_FILE = "serving/weights_app.py"
FUNCTION_NAME = "provision"
#: The deadline of one provisioning (deploy + call), in seconds: a large model over a slow
#: link; the function's own Modal timeout is 4 h. Env TIMEOUT_ENV (read at call time) sets
#: another (tests shorten it); it is no input, so changing it never makes a diff.
PROVISION_TIMEOUT_S = 5 * 3600.0
TIMEOUT_ENV = "MODAL_WEIGHTS_PROVISION_TIMEOUT_S"
LOG_TAIL_LINES = 20
STDERR_TAIL_LINES = 10
_KINDS = ("hf", "s3")
RESULT = "provision"  # the outputs' group that `provision` returns


def _source_problems(source: Any) -> list[str]:
    if not isinstance(source, Mapping) or source.get("kind") not in _KINDS:
        return ["source must be a map with kind `hf` or `s3`"]
    if not isinstance(source.get("revision"), str) or not source.get("revision"):
        return ["source.revision must name the pinned revision"]
    return []


def _secrets_problems(secrets: Any) -> list[str]:
    if isinstance(secrets, list) and all(isinstance(s, str) for s in secrets):
        return []
    return ["secrets must be a list of secret names"]


def _app_file_problems(app_file: Any) -> list[str]:
    if isinstance(app_file, str) and app_file.endswith(".py") and Path(app_file).is_file():
        return []
    return [f"app_file {app_file!r} must be a .py file relative to {Path.cwd()}"]


class ModelWeightsArgs(Schema):
    """Inputs of a `ModelWeights` (keywords), then what it outputs. A changed environment
    replaces; any other changed input (compared as canonical JSON) or weights app source
    reprovisions."""

    #: The weights app's name on Modal (e.g. `<service>-weights`).
    app_name: pulumi.Input[str] = updates(view=json_view("app_name"), check=object_name("App"))
    environment: pulumi.Input[str] = replaces(check=environment_problems)
    #: The Modal volume to fill (it must exist: a Volume resource owns it).
    volume: pulumi.Input[str] = updates(view=json_view("volume"), check=object_name("Volume"))
    #: `{"kind": "hf", "repo", "revision", "endpoint"?}` or
    #: `{"kind": "s3", "bucket", "prefix", "revision", "endpoint_url"?, "region"?}`.
    source: pulumi.Input[Mapping[str, Any]] = updates(
        view=json_view("source"), check=_source_problems
    )
    #: Modal secrets the function mounts (HF token, S3 credentials).
    secrets: pulumi.Input[list[str]] = updates(
        default_factory=list, view=json_view("secrets"), check=_secrets_problems
    )
    app_file: pulumi.Input[str] = updates(
        default=DEFAULT_APP_FILE, view=json_view("app_file"), check=_app_file_problems
    )
    app_id: str = output()  # the weights app of the last successful run
    source_digest: str = output()  # of the weights app, compared by `extra_changes`
    # What `provision` returned (the group RESULT):
    revision: str = output(group=RESULT)
    path: str = output(group=RESULT)  # the revision's directory on the volume
    file_count: int = output(group=RESULT)
    bytes: int = output(group=RESULT)
    digest: str = output(group=RESULT)
    downloaded_bytes: int = output(group=RESULT)


_RESULT_KEYS = ModelWeightsArgs.SCHEMA.group(RESULT)


def _source(props: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in (props.get("source") or {}).items()}


def _secrets(props: Mapping[str, Any]) -> list[str]:
    return [str(s) for s in (props.get("secrets") or [])]


def provision_timeout_s() -> float:
    """The provisioning deadline: env TIMEOUT_ENV (seconds) or PROVISION_TIMEOUT_S."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return PROVISION_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ModalProviderError(
            f"ModelWeights: {TIMEOUT_ENV}={raw!r} is not a positive number of seconds: unset it"
            f" (the deadline is then {PROVISION_TIMEOUT_S:g}s) or set one, e.g. 36000, and rerun."
        )
    return value


def stop_command(name: str, env: str) -> str:
    """The `modal app stop` command that stops the weights app by hand (no prompt)."""
    where = f" -e {shlex.quote(env)}" if env else ""
    return f"modal app stop {shlex.quote(name)}{where} --yes"


def _answer_of(error: BaseException) -> str:
    """A provider error without its "<kind> <target>: <action> failed." head (the failure
    it is quoted in already names them): from "Modal at ..." on."""
    text = str(error)
    at = text.find("Modal at ")
    return text[at:] if at >= 0 else text


@dataclass
class _Run(RunnerRun):
    """What one weights runner run said (its JSON lines) and how it ended."""

    deploy_started: bool = False  # the runner began deploying the weights app
    app_id: str = ""  # the weights app, once its deploy answered
    call_id: str = ""  # the spawned `provision` call
    progress: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES)
    )


class ModelWeightsProvider(ModalProvider):
    SCHEMA = ModelWeightsArgs.SCHEMA

    @staticmethod
    def _source_digest(props: Mapping[str, Any]) -> str:
        from ._source import source_digest

        return source_digest(str(props.get("app_file") or DEFAULT_APP_FILE))

    def extra_changes(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """The shipped weights app changed (its source digest)."""
        try:
            return bool(self._source_digest(news) != olds.get("source_digest"))
        except (OSError, SyntaxError):
            return True  # check() reports the problem; never hide a change

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        source = _source(props)
        what = (
            f"hf://{source.get('repo')}@{source.get('revision')}"
            if source.get("kind") == "hf"
            else f"s3://{source.get('bucket')}/{source.get('prefix', '')}"
            f" (revision {source.get('revision')})"
        )
        return (
            f"{what} into volume '{props.get('volume')}' in environment"
            f" '{environment_name(props) or '<default>'}'"
        )

    def _provision(
        self, props: Mapping[str, Any], action: str, olds: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Deploy the weights app and run `provision`, relaying its progress; the result.

        Transactional: on any failure (the function failing, the deadline, the runner dying,
        a Modal error, a lost deploy answer) the call is cancelled and the weights app stopped
        again (`_undo`) before the error is raised; `olds` (an update) names the app of the
        last successful run, stopped too."""
        creds = self.credentials()
        deadline_s = provision_timeout_s()
        app_file = str(props.get("app_file") or DEFAULT_APP_FILE)
        name, env = str(props["app_name"]), environment_name(props)
        own = {
            "WEIGHTS_APP_NAME": name,
            "WEIGHTS_VOLUME": str(props["volume"]),
            "WEIGHTS_SECRETS": json.dumps(_secrets(props)),
        }
        child_env = runner_env(creds.token_id, creds.token_secret, creds.server_url, env, own)
        # The runner removes the file once read, and with its directory if this process dies
        # first (issue 32 item 11).
        with handover_file("modal-weights-", "source.json", json.dumps(_source(props))) as path:
            cmd = [sys.executable, "-m", "components.modal.model_weights", "--app-file", app_file]
            cmd += ["--name", name, "--environment", env, "--source", str(path)]
            run = _Run()
            take = self._taker(run, props, [creds.token_secret])
            run_runner(cmd, child_env, deadline_s, take, run)
        if run.result.get("ok"):
            return run.result
        undo, undo_failed = self._undo(props, olds, run)
        last = run.result
        logs_of = run.app_id or name
        if run.timed_out:
            answer = (
                f"it did not finish within its deadline of {deadline_s:g}s ({TIMEOUT_ENV},"
                f" default {PROVISION_TIMEOUT_S:g}s): the runner was killed at the deadline"
            )
            what_next = (
                f"A larger model or a slower link needs more time: set {TIMEOUT_ENV} (seconds)"
                " in the environment of `pulumi up`. Check that the source answers from Modal"
                f" (`modal app logs {logs_of}` shows the whole log), then rerun `pulumi up`"
                " (an unfinished download starts over)."
            )
        elif not last:
            answer = (
                "its runner (`python -m components.modal.model_weights`) exited with"
                f" {run.returncode} and no result"
            )
            what_next = (
                "Its stderr is below; rerun `pulumi up` (a finished revision is not downloaded"
                " again)."
            )
        else:
            answer = (
                f"the weights function failed with {last.get('error')}"
                if last.get("in_function")
                else f"Modal at {creds.server_url} answered {last.get('error')}"
            )
            what_next = (
                "Modal is unreachable or failing: check MODAL_SERVER_URL/network and rerun"
                " `pulumi up` (a finished revision is not downloaded again)."
                if last.get("transient")
                else "Fix the source (revision, bucket/prefix, credentials in the stack's secrets:"
                f" `modal app logs {logs_of}` shows the whole log), then rerun `pulumi up`."
            )
        function_log = [*(last.get("log_tail") or run.progress)][-LOG_TAIL_LINES:]
        parts = [f"ModelWeights {self._target(props)}: {action} failed: {answer}."]
        if function_log:
            parts.append("Last lines of the function's log:")
            parts += [f"  | {line}" for line in function_log]
        stderr = [line.rstrip() for line in run.stderr if line.strip()][-STDERR_TAIL_LINES:]
        if stderr and not last.get("in_function"):
            parts.append("Last lines of the runner's stderr:")
            parts += [f"  | {line}" for line in stderr]
        if undo:
            parts.append(("Clean-up FAILED: " if undo_failed else "Clean-up: ") + " ".join(undo))
        parts.append(what_next)
        message = redact("\n".join(parts), [creds.token_secret])
        if last.get("transient") or undo_failed:
            raise ModalUnavailableError(message)
        raise ModalProviderError(message)

    def _undo(
        self, props: Mapping[str, Any], olds: Mapping[str, Any] | None, run: _Run
    ) -> tuple[list[str], bool]:
        """After a failed provisioning: cancel the call if it may still run, then stop every
        weights app of this resource that is deployed: the one this run deployed (or began
        to: a lost deploy answer still deployed it) and, on an update, the one of the last
        successful run (one-shot: nothing needs it between runs; the next `up` deploys it
        again). (sentences for the error, whether a step failed)."""
        notes: list[str] = []
        failed = False
        target = self._target(props)
        if run.call_id and not run.result.get("in_function"):  # it may still be running
            call_id = run.call_id

            async def cancel(client: Any) -> None:
                await _rpc.function_call_cancel(client, call_id)

            try:
                self.run("undo: cancel the provisioning call", target, cancel)
                notes.append(f"The function call {call_id} was cancelled.")
            except Exception as e:  # stopping the app below ends the call anyway
                notes.append(
                    f"Cancelling the function call {call_id} failed ({_answer_of(e)});"
                    " stopping its app ends it."
                )
        env = environment_name(props)
        names: list[tuple[str, str, str]] = []  # (name, whose, what was done)
        if run.deploy_started:
            names.append((str(props.get("app_name")), "this run deployed", "stopped again"))
        old = str((olds or {}).get("app_name") or "")
        if old and old not in [n for n, _, _ in names]:
            names.append((old, "of the last successful run", "stopped (a one-shot app)"))
        for name, whose, done in names:
            try:
                app_id = self._stop_app(name, env, target, "undo", "up")
            except Exception as e:
                failed = True
                notes.append(f"Stopping the weights app '{name}' {whose} failed: {_answer_of(e)}")
                continue
            if app_id:
                notes.append(f"The weights app '{name}' ({app_id}) {whose} was {done}.")
        return notes, failed

    @staticmethod
    def _taker(
        run: _Run, props: Mapping[str, Any], secrets: list[str]
    ) -> Callable[[dict[str, Any]], None]:
        """What each JSON line of the runner (see `main`) records; progress goes to Pulumi's
        log as it comes."""

        def take(item: dict[str, Any]) -> None:
            if "progress" in item:
                text = redact(str(item["progress"]), secrets)
                run.progress.append(text)
                pulumi.log.info(f"ModelWeights '{props.get('app_name')}': {text}")
            elif item.get("phase") == "deploy":
                run.deploy_started = True
            elif "deployed" in item:
                run.app_id = str(item["deployed"])
            elif "call_id" in item:
                run.call_id = str(item["call_id"])

        return take

    def _outputs(self, props: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
        """The inputs, the weights app and what `provision` returned (`result`, each output
        read as declared)."""
        return self.SCHEMA.outputs(props, result, source_digest=self._source_digest(props))

    @staticmethod
    def _id(props: Mapping[str, Any]) -> str:
        return f"{environment_name(props) or 'main'}/{props.get('volume')}"

    def create(self, props: dict[str, Any]) -> CreateResult:
        result = self._provision(props, "create")
        return CreateResult(self._id(props), self._outputs(props, result))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        result = self._provision(news, "update", olds)
        old = str(olds.get("app_name") or "")
        if old and old != news.get("app_name"):
            # The weights app under its old name is no longer ours.
            self._stop_app(old, environment_name(olds), self._target(news), "update", "up")
        return UpdateResult(self._outputs(news, result))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        env = environment_name(props)
        volume = str(props.get("volume") or "")

        async def go(client: Any) -> str | None:
            return await _rpc.volume_lookup(client, volume, env)

        if self.run("read", f"{id_} ({self._target(props)})", go) is None:
            return ReadResult("", {})
        return ReadResult(id_, {k: v for k, v in props.items() if k != "__provider"})

    def _stop_app(self, name: str, env: str, target: str, step: str, rerun: str) -> str:
        """Stop the app deployed as `name` in `env` (for `step`: undo, update, delete): its id,
        "" when none is deployed (or the environment is gone). A failure raises an error
        holding the `modal app stop` command that finishes the job by hand (`rerun`: the
        pulumi command that retries it)."""

        async def go(client: Any) -> str:
            return await _rpc.app_stop_by_name(client, name, env)

        hint = (
            f"The weights app '{name}' is left deployed: stop it with `{stop_command(name, env)}`"
            f" (or rerun `pulumi {rerun}`)."
        )
        action = f"{step}: stop the weights app '{name}'"
        return self.run(action, target, go, hints={Exception: hint})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        # The files stay on the volume: the Volume resource owns them. After a failed update
        # the app is already stopped: nothing to do then.
        name = str(props.get("app_name") or "")
        self._stop_app(name, environment_name(props), self._target(props), "delete", "destroy")


class ModelWeights(SchemaResource[ModelWeightsArgs], module="modal", name="ModelWeights"):
    """A weights volume filled with one pinned revision. Outputs: every field of
    `ModelWeightsArgs` (`revision`, `path`, `file_count`, `bytes`, `digest`, ...)."""

    PROVIDER = ModelWeightsProvider


# ---- the runner: `python -m components.modal.model_weights ...` ------------------------------


def _emit(item: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(item) + "\n")
    sys.stdout.flush()


FOLLOW_EVERY_S = 2.0  # how often the runner asks for new log lines while the call runs


async def _log_lines(app_id: str, function_id: str, since: float) -> list[tuple[float, str]]:
    """(timestamp, line) of the function's log since `since` (what `modal app logs` reads)."""
    from modal.client import _Client

    client = await _Client.from_env()
    return await _rpc.app_log_lines(client, app_id, function_id, since, time.time() + 60)


def main(argv: list[str] | None = None) -> int:
    """Deploy the weights app, spawn `provision` with the source, follow its log and print
    JSON lines: `{"progress": "..."}` per log line, then `{"ok": true, "app_id", <result>}`
    or `{"ok": false, "error", "transient", "log_tail": [...]}`. On the way it says where it
    is, for the provider's undo: `{"phase": "deploy"}` just before deploying,
    `{"deployed": app_id}` once deployed, `{"call_id": ...}` once `provision` is spawned."""
    parser = runner_parser(main.__doc__)
    parser.add_argument("--source", required=True, help="a JSON file holding the source map")
    args = parser.parse_args(argv)
    die_with_parent([args.source])  # it holds the Modal token: never outlive the provider
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    try:
        import modal
        from modal._utils.async_utils import synchronizer
        from modal.runner import deploy_app

        from ._deploy_runner import _error, _transient
    except Exception as e:  # pragma: no cover (a broken install)
        _emit({"ok": False, "error": f"{type(e).__name__}: {e}", "transient": False})
        return 1
    try:
        source = json.loads(Path(args.source).read_text())
    finally:
        with contextlib.suppress(OSError):
            Path(args.source).unlink()  # read once; nothing of it stays behind on any exit
    log_lines = synchronizer.create_blocking(_log_lines)
    seen: set[tuple[float, str]] = set()

    def follow(app_id: str, function_id: str, since: float) -> None:
        try:
            lines = log_lines(app_id, function_id, since)
        except Exception:  # progress is best effort; the result decides
            return
        for entry in lines:
            if entry not in seen:
                seen.add(entry)
                tail.append(entry[1])
                _emit({"progress": entry[1]})

    phase = "deploy"
    try:
        app, env = import_app(args)
        _emit({"phase": "deploy"})  # from here on the app may be deployed (the answer lost)
        deployed = deploy_app(app, name=args.name, environment_name=env)
        _emit({"deployed": deployed.app_id})
        fn = modal.Function.from_name(args.name, FUNCTION_NAME, environment_name=env)
        started = time.time() - 1.0
        phase = "call"
        call = fn.spawn(source)
        _emit({"call_id": call.object_id})
        function_id = fn.object_id
        result: Any = None
        try:
            while True:
                try:
                    result = call.get(timeout=FOLLOW_EVERY_S)
                    break
                except (TimeoutError, modal.exception.TimeoutError):
                    follow(deployed.app_id, function_id, started)
        finally:
            follow(deployed.app_id, function_id, started)
        if not isinstance(result, dict) or not all(k in result for k in _RESULT_KEYS):
            raise RuntimeError(f"{FUNCTION_NAME} returned no result (got {result!r})")
        _emit({"ok": True, "app_id": deployed.app_id, **result})
        return 0
    except SystemExit as e:
        _emit({"ok": False, "error": f"app import exited with {e.code}", "transient": False})
    except Exception as e:  # reported to the provider, which raises a clear error
        # An exception the function raised comes back as itself (e.g. the hub client's HTTP
        # error, an OSError subclass): only Modal's own errors can be Modal being unreachable.
        from_modal = phase == "deploy" or isinstance(e, modal.exception.Error)
        _emit(
            {
                "ok": False,
                "error": _error(e),
                "transient": from_modal and _transient(e),
                "in_function": not from_modal,
                "log_tail": list(tail),
            }
        )
    return 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ModelWeights", "ModelWeightsArgs", "ModelWeightsProvider"]
