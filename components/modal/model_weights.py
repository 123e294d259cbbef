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
- Delete stops the weights app; the volume and its files stay (the Volume resource owns them
  and decides: protected/retained in prod).
- This package never imports `serving/`: the app file is deployed by path and the function
  called by name; the source map is validated by the stack config (serving/weights.py
  `source_problems`), here only its shape.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    UpdateResult,
)

from . import _rpc
from ._base import (
    ModalProvider,
    ModalProviderError,
    ModalUnavailableError,
    canonical_json,
    check_environment,
    check_name,
    environment_name,
    is_unknown,
    redact,
)

TYPE_TOKEN = "pulumi-python:dynamic/modal:ModelWeights"  # noqa: S105 (a Pulumi type token)
DEFAULT_APP_FILE = "serving/weights_app.py"
FUNCTION_NAME = "provision"
#: A large model over a slow link; the function's own Modal timeout is 4 h.
PROVISION_TIMEOUT_S = 5 * 3600.0
LOG_TAIL_LINES = 20
_KINDS = ("hf", "s3")
_RESULT_KEYS = ("revision", "path", "file_count", "bytes", "digest", "downloaded_bytes")


@dataclass
class ModelWeightsArgs:
    """Inputs of a `ModelWeights`."""

    #: The weights app's name on Modal (e.g. `<service>-weights`).
    app_name: pulumi.Input[str]
    environment: pulumi.Input[str]
    #: The Modal volume to fill (it must exist: a Volume resource owns it).
    volume: pulumi.Input[str]
    #: `{"kind": "hf", "repo", "revision", "endpoint"?}` or
    #: `{"kind": "s3", "bucket", "prefix", "revision", "endpoint_url"?, "region"?}`.
    source: pulumi.Input[Mapping[str, Any]]
    #: Modal secrets the function mounts (HF token, S3 credentials).
    secrets: pulumi.Input[list[str]] = field(default_factory=list)
    app_file: pulumi.Input[str] = DEFAULT_APP_FILE


def _source(props: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in (props.get("source") or {}).items()}


def _secrets(props: Mapping[str, Any]) -> list[str]:
    return [str(s) for s in (props.get("secrets") or [])]


class ModelWeightsProvider(ModalProvider):
    kind = "ModelWeights"
    type_token = TYPE_TOKEN

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_name(news, "app_name", "App") + check_name(news, "volume", "Volume")
        failures += check_environment(news)
        source = news.get("source")
        if not is_unknown(source):
            if not isinstance(source, Mapping) or source.get("kind") not in _KINDS:
                failures.append(
                    CheckFailure("source", "source must be a map with kind `hf` or `s3`")
                )
            elif not isinstance(source.get("revision"), str) or not source.get("revision"):
                failures.append(
                    CheckFailure("source", "source.revision must name the pinned revision")
                )
        secrets = news.get("secrets")
        if (
            secrets is not None
            and not is_unknown(secrets)
            and not (isinstance(secrets, list) and all(isinstance(s, str) for s in secrets))
        ):
            failures.append(CheckFailure("secrets", "secrets must be a list of secret names"))
        app_file = news.get("app_file")
        if app_file is None:
            news = {**news, "app_file": DEFAULT_APP_FILE}
        elif not is_unknown(app_file) and not (
            isinstance(app_file, str) and app_file.endswith(".py") and Path(app_file).is_file()
        ):
            failures.append(
                CheckFailure(
                    "app_file",
                    f"app_file {app_file!r} must be a .py file relative to {Path.cwd()}",
                )
            )
        if news.get("secrets") is None:
            news = {**news, "secrets": []}
        return CheckResult(news, failures)

    @staticmethod
    def _source_digest(props: Mapping[str, Any]) -> str:
        from ._source import source_digest

        return source_digest(str(props.get("app_file") or DEFAULT_APP_FILE))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        env = news.get("environment")
        replaces = ["environment"] if is_unknown(env) or env != olds.get("environment") else []
        keys = ("app_name", "volume", "source", "secrets", "app_file")
        changed = any(is_unknown(news.get(k)) for k in keys)
        changed = changed or any(
            canonical_json(news.get(k)) != canonical_json(olds.get(k)) for k in keys
        )
        if not changed:
            try:
                changed = self._source_digest(news) != olds.get("source_digest")
            except (OSError, SyntaxError):
                changed = True  # check() reports the problem; never hide a change
        return DiffResult(
            changes=bool(replaces) or changed, replaces=replaces, delete_before_replace=False
        )

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

    def _provision(self, props: Mapping[str, Any], action: str) -> dict[str, Any]:
        """Deploy the weights app and run `provision`, relaying its progress; the result."""
        creds = self.credentials()
        app_file = str(props.get("app_file") or DEFAULT_APP_FILE)
        name, env = str(props["app_name"]), environment_name(props)
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MODAL_") or k in ("MODAL_CONFIG_PATH", "MODAL_PROFILE")
        }
        child_env.update(
            {
                "MODAL_TOKEN_ID": creds.token_id,
                "MODAL_TOKEN_SECRET": creds.token_secret,
                "MODAL_SERVER_URL": creds.server_url,
                "WEIGHTS_APP_NAME": name,
                "WEIGHTS_VOLUME": str(props["volume"]),
                "WEIGHTS_SECRETS": json.dumps(_secrets(props)),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if env:
            child_env["MODAL_ENVIRONMENT"] = env
        with tempfile.TemporaryDirectory(prefix="modal-weights-") as tmp:
            request = Path(tmp) / "source.json"
            request.write_text(json.dumps(_source(props)))
            cmd = [sys.executable, "-m", "components.modal.model_weights", "--app-file", app_file]
            cmd += ["--name", name, "--environment", env, "--source", str(request)]
            last, tail = self._run_streaming(cmd, child_env, props)
        if last.get("ok"):
            return last
        secrets = [creds.token_secret]
        log_tail = "\n".join(f"  | {line}" for line in [*last.get("log_tail", []), *tail][-20:])
        answer = (
            f"the weights function failed with {last.get('error')}"
            if last.get("in_function")
            else f"Modal at {creds.server_url} answered {last.get('error')}"
        )
        message = redact(
            f"ModelWeights {self._target(props)}: {action} failed: {answer}."
            + (f"\nLast lines of the function's log:\n{log_tail}\n" if log_tail else " ")
            + (
                "Modal is unreachable or failing: check MODAL_SERVER_URL/network and rerun"
                " `pulumi up` (a finished revision is not downloaded again)."
                if last.get("transient")
                else "Fix the source (revision, bucket/prefix, credentials in the stack's secrets:"
                f" `modal app logs {name}` shows the whole log), then rerun `pulumi up`."
            ),
            secrets,
        )
        if last.get("transient"):
            raise ModalUnavailableError(message)
        raise ModalProviderError(message)

    def _run_streaming(
        self, cmd: list[str], env: dict[str, str], props: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """Run the runner, log each progress line as it arrives; (last JSON result, stderr
        tail)."""
        tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        last: dict[str, Any] = {}
        with subprocess.Popen(
            cmd,
            env=env,
            cwd=os.getcwd(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            stderr: list[str] = []

            def drain() -> None:
                assert proc.stderr is not None
                stderr.extend(proc.stderr)

            import threading

            reader = threading.Thread(target=drain, daemon=True)
            reader.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(item, dict):
                    continue
                if "progress" in item:
                    pulumi.log.info(f"ModelWeights '{props.get('app_name')}': {item['progress']}")
                elif "ok" in item:
                    last = item
            try:
                proc.wait(timeout=PROVISION_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise ModalUnavailableError(
                    f"ModelWeights {self._target(props)}: provisioning did not finish within"
                    f" {PROVISION_TIMEOUT_S:.0f}s and was stopped. Check `modal app logs"
                    f" {props.get('app_name')}`, then rerun `pulumi up`."
                ) from None
            reader.join(timeout=5)
            tail.extend(line.rstrip() for line in stderr if line.strip())
        if not last:
            last = {
                "ok": False,
                "error": f"the weights runner exited with {proc.returncode} and no result",
                "transient": False,
            }
        return last, list(tail) if not last.get("ok") else []

    def _outputs(self, props: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "app_name": props.get("app_name"),
            "environment": props.get("environment"),
            "volume": props.get("volume"),
            "source": _source(props),
            "secrets": _secrets(props),
            "app_file": props.get("app_file") or DEFAULT_APP_FILE,
            "app_id": result.get("app_id") or "",
            "source_digest": self._source_digest(props),
        }
        for key in _RESULT_KEYS:
            out[key] = result.get(key)
        return out

    @staticmethod
    def _id(props: Mapping[str, Any]) -> str:
        return f"{environment_name(props) or 'main'}/{props.get('volume')}"

    def create(self, props: dict[str, Any]) -> CreateResult:
        result = self._provision(props, "create")
        return CreateResult(self._id(props), self._outputs(props, result))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        result = self._provision(news, "update")
        if olds.get("app_name") and olds.get("app_name") != news.get("app_name"):
            self._stop_app(olds)  # the weights app under its old name is no longer ours
        return UpdateResult(self._outputs(news, result))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        env = environment_name(props)
        volume = str(props.get("volume") or "")

        async def go(client: Any) -> str | None:
            return await _rpc.volume_lookup(client, volume, env)

        if self.run("read", f"{id_} ({self._target(props)})", go) is None:
            return ReadResult("", {})
        return ReadResult(id_, {k: v for k, v in props.items() if k != "__provider"})

    def _stop_app(self, props: Mapping[str, Any]) -> None:
        from modal import exception as mexc

        name, env = str(props.get("app_name") or ""), environment_name(props)

        async def go(client: Any) -> None:
            try:
                app_id = await _rpc.app_by_name(client, name, env)
            except mexc.NotFoundError:
                return  # the environment is gone, and the app with it
            if app_id:
                await _rpc.app_stop(client, app_id)

        self.run("stop the weights app of", self._target(props), go)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        # The files stay on the volume: the Volume resource owns them.
        self._stop_app(props)


class ModelWeights(pulumi.dynamic.Resource, module="modal", name="ModelWeights"):
    """A weights volume filled with one pinned revision. Outputs: `revision`, `path`,
    `file_count`, `bytes`, `digest`."""

    app_name: pulumi.Output[str]
    environment: pulumi.Output[str]
    volume: pulumi.Output[str]
    source: pulumi.Output[dict[str, Any]]
    secrets: pulumi.Output[list[str]]
    app_file: pulumi.Output[str]
    app_id: pulumi.Output[str]
    source_digest: pulumi.Output[str]
    revision: pulumi.Output[str]
    path: pulumi.Output[str]
    file_count: pulumi.Output[int]
    bytes: pulumi.Output[int]
    digest: pulumi.Output[str]
    downloaded_bytes: pulumi.Output[int]

    def __init__(
        self,
        resource_name: str,
        args: ModelWeightsArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props: dict[str, Any] = {
            "app_name": args.app_name,
            "environment": args.environment,
            "volume": args.volume,
            "source": args.source,
            "secrets": args.secrets,
            "app_file": args.app_file,
            **{k: None for k in ("app_id", "source_digest", *_RESULT_KEYS)},
        }
        super().__init__(ModelWeightsProvider(), resource_name, props, opts)


# ---- the runner: `python -m components.modal.model_weights ...` ------------------------------


def _emit(item: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(item) + "\n")
    sys.stdout.flush()


FOLLOW_EVERY_S = 2.0  # how often the runner asks for new log lines while the call runs


async def _log_lines(app_id: str, function_id: str, since: float) -> list[tuple[float, str]]:
    """(timestamp, line) of the function's log since `since` (what `modal app logs` reads)."""
    import time

    from modal.client import _Client

    client = await _Client.from_env()
    return await _rpc.app_log_lines(client, app_id, function_id, since, time.time() + 60)


def main(argv: list[str] | None = None) -> int:
    """Deploy the weights app, spawn `provision` with the source, follow its log and print
    JSON lines: `{"progress": "..."}` per log line, then `{"ok": true, "app_id", <result>}`
    or `{"ok": false, "error", "transient", "log_tail": [...]}`."""
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--app-file", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--environment", default="")
    parser.add_argument("--source", required=True, help="a JSON file holding the source map")
    args = parser.parse_args(argv)
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    try:
        import modal
        from modal._utils.async_utils import synchronizer
        from modal.cli.import_refs import import_app_from_ref, parse_import_ref
        from modal.config import config
        from modal.runner import deploy_app

        from ._deploy_runner import _error, _transient
    except Exception as e:  # pragma: no cover (a broken install)
        _emit({"ok": False, "error": f"{type(e).__name__}: {e}", "transient": False})
        return 1
    source = json.loads(Path(args.source).read_text())
    env = args.environment or config.get("environment") or ""
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
        ref = parse_import_ref(args.app_file, command="modal deploy")
        app = import_app_from_ref(ref, base_cmd="modal deploy")
        deployed = deploy_app(app, name=args.name, environment_name=env)
        fn = modal.Function.from_name(args.name, FUNCTION_NAME, environment_name=env)
        started = time.time() - 1.0
        phase = "call"
        call = fn.spawn(source)
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
