"""The release's effects: the one place an App release talks to Modal.

Publish (the deploy runner, `_deploy_runner.py`), read the history and release records,
record outcomes, roll back, stop, undo a create, and the health gate's looks (`_gate.py`,
through `call`). What it needs is handed over as data (`Deploy`: what to deploy, with which
credentials, which values to keep out of every message; the gate's `GateTarget`), plus
`call`, the retrying Modal call of `_base.ModalProvider.run`; it never calls the provider
back. What to do is decided elsewhere (`_decide.py`); the orchestration is `_release.py`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pulumi

from . import _rpc
from ._base import ModalProviderError, ModalUnavailableError, redact
from ._decide import Policy, Published, Releases, env_flag, is_new, with_records
from ._deploy_runner import child_env, handover_file, run_runner
from ._gate import GateTarget, HealthGate
from .defaults import DEPLOY_ATTEMPTS, DEPLOY_TIMEOUT_S

T = TypeVar("T")


class ModalCall(Protocol):
    """`_base.ModalProvider.run`: `fn(client)` against Modal, retried, errors mapped."""

    def __call__(
        self,
        action: str,
        target: str,
        fn: Callable[[Any], Awaitable[T]],
        *,
        idempotent: bool = True,
    ) -> T: ...


@dataclass(frozen=True)
class Deploy:
    """What one publish deploys, as whom, and what no message may show."""

    app_file: str
    name: str
    env: str
    spec_json: str = field(repr=False)
    extra_env: Mapping[str, str] = field(repr=False)
    token_id: str
    token_secret: str = field(repr=False)
    server_url: str
    #: The URL the app had: the gate knocks there when the read-back failed (a redeploy
    #: keeps its label, so its URL).
    fallback_url: str = ""
    #: Every secret value a message about this release must never show.
    secrets: tuple[str, ...] = field(default=(), repr=False)


class Effects:
    """The release's I/O, bound to one App (see the module docstring)."""

    def __init__(self, call: ModalCall, deploy: Deploy, gate: GateTarget, policy: Policy) -> None:
        self._call = call
        self.deploy = deploy
        self.gate_target = gate
        self.policy = policy
        self.label = policy.label
        #: Release records known in this transaction: read before publish, written since.
        self.records: dict[int, str] = {}

    def _run(self, action: str, fn: Callable[[Any], Awaitable[T]], **kw: Any) -> T:
        return self._call(action, self.label, fn, **kw)

    # ---- words -------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        """A progress line of this release (shown live by the engine)."""
        pulumi.log.info(f"App {self.label}: {line}")

    def warn(self, line: str, *, warning: bool = False) -> None:
        """A line on stderr (shown by the engine as the step's diagnostics)."""
        print(f"{'warning: ' if warning else ''}App {self.label}: {line}", file=sys.stderr)

    def redact(self, text: str) -> str:
        return redact(text, self.deploy.secrets)

    # ---- reading -------------------------------------------------------------------------
    def read(self, app_id: str) -> Releases:
        """History and release records of `app_id` (raises ModalProviderError)."""

        async def go(client: Any) -> Releases:
            rows = await _rpc.app_deployments(client, app_id)
            tags = await _rpc.app_tags(client, app_id)
            return Releases(app_id, tuple(rows), tags)

        return self._run("read the deployment history and release records", go)

    def lookup(self, action: str = "look up the app by name") -> str:
        """The app deployed under the name now ("" when none, or no such environment: the
        deploy reports that)."""
        name, env = self.deploy.name, self.deploy.env
        return str(self._run(action, lambda client: _rpc.app_id_by_name(client, name, env)) or "")

    def runs_release(self, app_id: str) -> bool:
        """Whether `app_id`'s live version runs exactly this release (its deployment tag):
        a lost earlier attempt of it. False when that cannot be read."""
        try:
            return self.read(app_id).runs(self.policy.tag)
        except ModalProviderError:
            return False

    def web_url(self, app_id: str) -> str:
        name, env = self.deploy.name, self.deploy.env
        try:
            return str(
                self._run("read the endpoint URL", lambda c: _rpc.app_web_url(c, app_id, name, env))
            )
        except ModalProviderError:
            return ""

    def published(self, app_id: str, url: str, before: Releases | None) -> Published:
        """What the publish left live, read from Modal's history."""
        after = self.read(app_id)
        live = after.live()
        if live is None:
            raise ModalProviderError(
                f"App {self.label}: the deploy reported {app_id}, whose deployment history is empty"
            )
        new = is_new(before, app_id, live.version)
        return Published(app_id, live.version, live.deployed_at, url, new, live.tag, live.commit)

    def found_after_lost_answer(self, before: Releases | None) -> Published | None:
        """After a failed publish: what is live under the name, if the publish made it (its
        answer lost); None when nothing new is there. Raises when it cannot look."""
        app_id = self.lookup()
        after = self.read(app_id) if app_id else None
        if after is None or not is_new(before, after.app_id, after.version()):
            return None
        live = after.live()
        assert live is not None
        self.warn(
            f"the deploy's answer was lost, but Modal published v{live.version} (tag"
            f" {live.tag or '-'}); verifying it like any release"
        )
        url = self.web_url(after.app_id)
        return Published(
            after.app_id, live.version, live.deployed_at, url, True, live.tag, live.commit
        )

    # ---- publishing ------------------------------------------------------------------------
    def publish(self, app_tags: Mapping[str, str]) -> dict[str, Any]:
        """Deploy with the release's deployment tag, sending `app_tags` along (so Modal keeps
        the release records whatever a publish does to tags); the read-back completed.
        Raises ModalProviderError when the deploy failed."""
        result = self._deploy(app_tags)
        self._complete_read_back(result)
        if not result.get("web_url") and self.deploy.fallback_url:
            # Read-back failed (issue 11.5): the gate knocks at the URL the app had; the
            # output stays as read back.
            result = {**result, "gate_url": self.deploy.fallback_url}
        return result

    def _deploy(self, app_tags: Mapping[str, str]) -> dict[str, Any]:
        d, action = self.deploy, self.policy.action
        with handover_file("modal-app-spec-", "spec.json", d.spec_json) as spec_path:
            # serving/app.py names its App from SERVING_APP_NAME.
            own = {"SERVING_APP_NAME": d.name, **d.extra_env, "SERVING_SPEC": str(spec_path)}
            env = child_env(d.token_id, d.token_secret, d.server_url, d.env, own)
            cmd = [sys.executable, "-m", "components.modal._deploy_runner"]
            cmd += ["--app-file", d.app_file, "--name", d.name, "--environment", d.env]
            cmd += ["--tag", self.policy.tag]
            cmd += ["--app-tags", json.dumps(dict(app_tags), sort_keys=True)]
            last: dict[str, Any] = {}
            for _attempt in range(DEPLOY_ATTEMPTS):
                run = run_runner(cmd, env, DEPLOY_TIMEOUT_S)
                if run.timed_out:
                    raise ModalUnavailableError(
                        f"App {self.label}: {action} (deploy of {d.app_file}) did not"
                        f" finish within {DEPLOY_TIMEOUT_S:.0f}s and was killed. Check Modal's"
                        " status and the image build, then rerun `pulumi up`."
                    )
                last = run.result or {
                    "ok": False,
                    "error": f"deploy runner exited with {run.returncode} and no result;"
                    f" stderr tail: {''.join(run.stderr)[-1500:]}",
                    "transient": False,
                }
                if last.get("ok") or not last.get("transient"):
                    break
        if last.get("ok"):
            return last
        message = self.redact(
            f"App {self.label}: {action} (deploy of {d.app_file}) failed. Modal at"
            f" {d.server_url} answered {last.get('error')}. "
        )
        if last.get("transient"):
            raise ModalUnavailableError(
                message + "Modal is unreachable or failing: check MODAL_SERVER_URL/network and"
                " rerun `pulumi up`."
            )
        if "AuthError" in str(last.get("error")):
            raise ModalProviderError(
                message + "Check modal:tokenId/modal:tokenSecret or MODAL_TOKEN_ID/SECRET."
            )
        raise ModalProviderError(
            message + f"Run `modal deploy {d.app_file} --name {d.name}` with the same"
            " SERVING_SPEC to see the full output, fix the app or spec, then rerun `pulumi up`."
        )

    def _complete_read_back(self, result: dict[str, Any]) -> None:
        """The runner deployed but could not read the URL/version back: try again from here
        (retried); if that fails too, keep the deploy and report it (issue 11 item 5)."""
        if not result.get("read_back_error"):
            return
        name, env, app_id = self.deploy.name, self.deploy.env, str(result["app_id"])

        async def go(client: Any) -> tuple[str, int]:
            url = await _rpc.app_web_url(client, app_id, name, env)
            return url, await _rpc.app_version(client, app_id)

        try:
            result["web_url"], result["version"] = self._call(
                "read back after deploy", f"{app_id} ({self.label})", go
            )
            result["read_back_error"] = ""
        except ModalProviderError as e:
            result["read_back_error"] = (
                f"deployed as {app_id}, but its URL/version could not be read back: {e}"
                " `pulumi refresh` fills them in."
            )
            self.warn(str(result["read_back_error"]), warning=True)

    # ---- recording -------------------------------------------------------------------------
    def record(self, app_id: str, records: Mapping[int, str]) -> str:
        """Add `records` to the app's tags (read, merge, replace), with every record read
        before the publish and written since: a publish or a rollback may have reset the
        tags (modal documents neither way). Returns "" or a warning."""
        self.records.update(records)
        known = dict(self.records)

        async def go(client: Any) -> None:
            current = await _rpc.app_tags(client, app_id)
            await _rpc.app_set_tags(client, app_id, with_records(current, known))

        try:
            self._run("record the release outcome (app tags)", go)
        except ModalProviderError as e:
            what = ", ".join(f"v{v} {o}" for v, o in sorted(records.items()))
            return (
                f"warning: could not record {what} on the app ({e}); the next release falls"
                " back to the version serving before it."
            )
        return ""

    # ---- undoing ---------------------------------------------------------------------------
    def roll_back(self, app_id: str, target: int) -> str:
        """AppRollback to `target`; "" when done, else the error (after an ambiguous failure
        the history says whether it happened)."""
        try:
            self._run(
                f"roll back to v{target}",
                lambda client: _rpc.app_rollback(client, app_id, target),
                idempotent=False,
            )
        except ModalProviderError as e:
            try:
                live = self.read(app_id).live()
            except ModalProviderError:
                return str(e)
            return "" if live is not None and live.rollback_version == target else str(e)
        return ""

    def stop(self, app_id: str) -> str:
        """AppStop; "" when done, else the error."""
        try:
            self._run("stop the app that failed its gate", lambda c: _rpc.app_stop(c, app_id))
        except ModalProviderError as e:
            return str(e)
        return ""

    def undo_create(self) -> str:
        """A failed create must leave nothing behind (it is not in state, so destroy would
        never stop it): a deploy can fail after Modal published the app (the answer was
        lost). No app was deployed under this name before the create, so one there now is
        this create's: stop it. Returns what to add to the error."""
        name, env = self.deploy.name, self.deploy.env
        try:
            stopped = self._run(
                "clean up after a failed create", lambda c: _rpc.app_stop_by_name(c, name, env)
            )
        except ModalProviderError:
            return (
                "The deploy may have reached Modal and the clean-up could not check: look for"
                f" the app with `modal app list -e {env or '<env>'}` and stop it"
                f" (`modal app stop {name} -e {env or '<env>'}`) before rerunning."
            )
        if stopped:
            return f"The app this create had deployed ({stopped}) was stopped again."
        return "Nothing was left deployed."

    # ---- the gate --------------------------------------------------------------------------
    def gate(self, app_id: str, url: str) -> HealthGate:
        return HealthGate(
            lambda action, fn: self._run(action, fn),
            app_id,
            self.deploy.env,
            dataclasses.replace(self.gate_target, url=url),
            self.say,
            list(self.deploy.secrets),
        )

    def stop_hint(self) -> str:
        return f"modal app stop {self.deploy.name}{env_flag(self.deploy.env)}"
