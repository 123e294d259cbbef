"""The release transaction of an App: publish (tagged), verify, then commit or roll back.

```
            read what Modal holds (history + release records)
                               │ (a read error here: nothing published, nothing changed)
                               ▼
   publish ──(answer lost)──► look again: published? ──no──► undo a create / "vN keeps serving"
      │ ok                              │ yes (or unknown → rollback with the exact command)
      ▼                                 ▼
   verify (HealthGate: containers, crash loop, /ready, smoke by task, bounded deadline)
      │ passed                          │ anything else (timeout, crash loop, 5xx, Modal error,
      ▼                                 ▼  an exception, Ctrl-C)
   commit: record "passed",          abort: record "failed"; roll back to the last known-good
   outputs say what is live          version (an update) or stop the app (a create), re-check
                                     that it answers the smoke request, record that; raise the
                                     reason, the rollback line and the log tail
```

Everything the next release needs is kept in Modal, not in Pulumi's state:
- each deploy's deployment `tag` (modal 1.6.4 `deploy_app(tag=...)`, <= 50 chars, shown by
  `modal app history`) carries its spec and source digests: `spec.<12 hex>.src.<12 hex>`;
- each version's gate outcome is an App tag (`AppSetTags`/`AppGetTags`, modal 1.6.4
  `App.set_tags`/`get_tags`, keys and values <= 63 chars of `[A-Za-z0-9._-]`):
  `llm-iac.gate.v<N>` = `passed` | `failed` | `unverified`. The deploy sends the tags it
  read (modal/runner.py `_publish_app` sends the app's `tags` with AppPublish), and every
  step that may reset them (a publish, a rollback) is followed by writing them again, so
  they survive whichever way Modal treats tags on publish and rollback.
The last known-good version is the newest version recorded `passed`; a rollback never goes
to a version recorded `failed`. With no `passed` record (the gate was off, or records were
lost) the version that served before the release is the fallback, unless it failed its gate.

`execute()` is the one place the transaction runs; after publish no exception escapes it
without the rollback having been tried (and said).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import pulumi

from . import _rpc
from ._base import ModalProviderError, environment_name, redact
from ._gate import DEFAULT_GATE_TIMEOUT_S, GateOutcome, GateTarget, HealthGate, smoke_words

T = TypeVar("T")

RECORD_PREFIX = "llm-iac.gate.v"
PASSED, FAILED, UNVERIFIED = "passed", "failed", "unverified"
#: Release records kept on the app (older ones are dropped, the newest `passed` always kept).
MAX_RECORDS = 32
_TAG_RE = re.compile(r"^spec\.([0-9a-f]{12})\.src\.([0-9a-f]{12})$")


def deployment_tag(spec_digest: str, source_digest: str) -> str:
    """The deploy's `--tag`: what it ships, as digests (34 characters)."""
    return f"spec.{spec_digest[:12]}.src.{source_digest[:12]}"


def parse_deployment_tag(tag: str) -> tuple[str, str] | None:
    """(spec, source) digest prefixes of a tag we wrote; None for any other tag."""
    m = _TAG_RE.match(tag or "")
    return (m.group(1), m.group(2)) if m else None


def rollback_command(name: str, env: str, version: int) -> str:
    """`modal app rollback` to `version`, ready to paste ("" without one)."""
    if not version:
        return ""
    return f"modal app rollback {name} v{version}" + (f" -e {env}" if env else "")


#: The rollback margin: how long a refused release may spend rolling back (AppRollback, the
#: release records, and the re-check that the known-good version answers again) after the gate
#: refused it. Fixed and printed (issue 32 item 13): a release that never gets ready is refused
#: within its start-up budget (`timeouts.startup_s`) plus this margin (plus the publish
#: itself); customTimeouts may only shorten it. A re-check that runs out of margin says so and
#: records the version `unverified`, never `failed`.
ROLLBACK_MARGIN_S = 60.0


def startup_budget(props: Mapping[str, Any]) -> float:
    """The service's start-up budget in seconds, `timeouts.startup_s` of the rendered spec
    (0: the spec has none). Read from the JSON only: this package never imports serving/."""
    try:
        spec = json.loads(str(props.get("spec_json") or ""))
        value = spec["timeouts"]["startup_s"]
    except (ValueError, KeyError, TypeError):
        return 0.0
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else 0.0


@dataclass
class Timeline:
    """Where a release's time went (monotonic seconds), for the progress lines and the error."""

    started: float
    published: float = 0.0
    gate: float = 0.0
    ready_s: float = 0.0
    stage: str = ""
    rollback: float = 0.0
    margin: float = 0.0
    rollback_what: str = ""

    def line(self, ended: float) -> str:
        """`Timeline: publish 1.2 s | waiting for ready 20.1 s (...) | refused | rollback ...`."""
        parts = [f"publish {self.published:.1f} s"]
        ready = f" (start-up budget {self.ready_s:g} s: timeouts.startup_s)" if self.ready_s else ""
        parts.append(f"waiting for ready {self.gate:.1f} s{ready}")
        parts.append(f"refused ({self.stage})" if self.stage else "passed")
        if self.rollback_what:
            parts.append(
                f"{self.rollback_what} {self.rollback:.1f} s (rollback margin {self.margin:g} s)"
            )
        return f"Timeline: {' | '.join(parts)} | {ended - self.started:.1f} s in all."


@dataclass(frozen=True)
class Releases:
    """What Modal holds about an app's releases: its deployment history and tags."""

    app_id: str
    deployments: tuple[_rpc.Deployment, ...]
    tags: Mapping[str, str]

    def live(self) -> _rpc.Deployment | None:
        """The version serving now: the newest deployment (a rollback is a new one)."""
        return self.deployments[-1] if self.deployments else None

    def version(self) -> int:
        live = self.live()
        return live.version if live else 0

    def get(self, version: int) -> _rpc.Deployment | None:
        return next((d for d in self.deployments if d.version == version), None)

    def outcome(self, version: int) -> str:
        return str(self.tags.get(f"{RECORD_PREFIX}{version}", ""))

    def effective_tag(self, version: int) -> str:
        """The tag of what `version` runs: a rollback runs the version it went back to."""
        seen: set[int] = set()
        d = self.get(version)
        while d is not None and d.rollback_version and d.version not in seen:
            seen.add(d.version)
            if parse_deployment_tag(d.tag):
                return d.tag
            d = self.get(d.rollback_version)
        return d.tag if d is not None else ""

    def records(self) -> dict[int, str]:
        """{version: outcome} of every release record on the app."""
        return {
            int(key[len(RECORD_PREFIX) :]): str(value)
            for key, value in self.tags.items()
            if _is_record_key(key)
        }

    def known_good(self) -> int:
        """The newest version recorded as having passed its gate (0: none)."""
        good = [d.version for d in self.deployments if self.outcome(d.version) == PASSED]
        return max(good) if good else 0

    def rollback_target(self) -> int:
        """Where a failed release goes back to: the last known-good version, else the one
        serving now unless it failed its gate (0: nowhere)."""
        good = self.known_good()
        if good:
            return good
        live = self.version()
        return live if live and self.outcome(live) != FAILED else 0

    def with_records(
        self, current: Mapping[str, str], records: Mapping[int, str]
    ) -> dict[str, str]:
        """`current` tags with `records` added, ours bounded to MAX_RECORDS (+ the newest
        passed); tags that are not ours pass through untouched."""
        ours = Releases(self.app_id, (), current).records()
        others = {k: str(v) for k, v in current.items() if not _is_record_key(k)}
        ours.update(records)
        keep = sorted(ours, reverse=True)[:MAX_RECORDS]
        passed = [v for v in sorted(ours, reverse=True) if ours[v] == PASSED][:1]
        return {**others, **{f"{RECORD_PREFIX}{v}": ours[v] for v in {*keep, *passed}}}


@dataclass(frozen=True)
class Published:
    """What a publish left live: the app, its newest version, and whether it is new."""

    app_id: str
    version: int
    deployed_at: float
    web_url: str
    new: bool
    tag: str
    commit: str


class Host(Protocol):
    """What the transaction needs from the App provider."""

    def run(
        self,
        action: str,
        target: str,
        fn: Callable[[Any], Awaitable[T]],
        *,
        secrets: Any = (),
        hints: Any = None,
        idempotent: bool = True,
        keyed: bool = False,
    ) -> T: ...

    def deploy(
        self, props: Mapping[str, Any], action: str, tag: str, app_tags: Mapping[str, str]
    ) -> dict[str, Any]: ...

    def undo_create(self, props: Mapping[str, Any]) -> str: ...

    def secrets(self, props: Mapping[str, Any]) -> list[str]: ...


def describe_target(props: Mapping[str, Any]) -> str:
    return f"'{props.get('name')}' in environment '{environment_name(props) or '<default>'}'"


class Release:
    """One create or update of an App, as a transaction (see the module docstring)."""

    def __init__(
        self,
        host: Host,
        props: Mapping[str, Any],
        action: str,
        digests: Mapping[str, str],
        app_id_before: str,
        keep_on_failure: bool,
    ) -> None:
        """`app_id_before`: the app serving under this name before ("" for a create of a new
        app); `keep_on_failure`: it existed before this resource managed it (adopted), or an
        update of it, so a failed release is rolled back, never stopped."""
        self.host = host
        self.props = props
        self.action = action
        self.name = str(props["name"])
        self.env = environment_name(props)
        self.digests = dict(digests)
        self.tag = deployment_tag(digests["spec_digest"], digests["source_digest"])
        self.app_id_before = app_id_before
        self.keep_on_failure = keep_on_failure and bool(app_id_before)
        self.label = describe_target(props)
        self.gate_on = bool(props.get("health_gate"))
        self.task = str(props.get("gate_task") or "chat")
        budget = float(props.get("health_gate_timeout_s") or DEFAULT_GATE_TIMEOUT_S)
        # customTimeouts (Pulumi's resource option) bound the whole step: half for the gate,
        # the rest for a rollback and its re-check, so the step ends within the limit.
        limit = _custom_timeout(props, action)
        self.gate_deadline = min(budget, limit / 2) if limit else budget
        # A version that never gets ready is refused once its start-up budget is spent (the
        # budget above is start-up + request: it bounds a version that got ready).
        startup = startup_budget(props)
        self.ready_s = min(startup, self.gate_deadline) if startup else self.gate_deadline
        # The rollback (AppRollback, records, re-check of the known-good version) gets the
        # fixed margin, printed when the gate starts, whatever the gate's own budget.
        margin = min(ROLLBACK_MARGIN_S, limit / 2 - 5.0) if limit else ROLLBACK_MARGIN_S
        self.rollback_margin = max(margin, 5.0)
        self.timeline = Timeline(
            time.monotonic(), ready_s=self.ready_s, margin=self.rollback_margin
        )
        #: Release records known in this transaction: read before publish, written since.
        self.records: dict[int, str] = {}
        self._abort_started = time.monotonic()

    # ---- reading Modal ---------------------------------------------------------------------
    def _call(self, action: str, fn: Callable[[Any], Awaitable[T]], **kw: Any) -> T:
        return self.host.run(action, self.label, fn, **kw)

    def read(self, app_id: str) -> Releases:
        """History and release records of `app_id` (raises ModalProviderError)."""

        async def go(client: Any) -> Releases:
            rows = await _rpc.app_deployments(client, app_id)
            tags = await _rpc.app_tags(client, app_id)
            return Releases(app_id, tuple(rows), tags)

        return self._call("read the deployment history and release records", go)

    def _write(self, app_id: str, records: Mapping[int, str]) -> str:
        """Add `records` to the app's tags (read, merge, replace), with every record read
        before the publish and written since: a publish or a rollback may have reset the
        tags (modal documents neither way). Returns "" or a warning."""
        self.records.update(records)
        known = dict(self.records)

        async def go(client: Any) -> None:
            current = await _rpc.app_tags(client, app_id)
            merged = Releases(app_id, (), {}).with_records(current, known)
            await _rpc.app_set_tags(client, app_id, merged)

        try:
            self._call("record the release outcome (app tags)", go)
        except ModalProviderError as e:
            what = ", ".join(f"v{v} {o}" for v, o in sorted(records.items()))
            return (
                f"warning: could not record {what} on the app ({e}); the next release falls"
                " back to the version serving before it."
            )
        return ""

    def _lookup(self) -> str:
        from modal import exception as mexc

        name, env = self.name, self.env

        async def go(client: Any) -> str:
            try:
                return await _rpc.app_by_name(client, name, env)
            except mexc.NotFoundError:
                return ""

        return str(self._call("look up the app by name", go))

    # ---- the transaction -------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        """Publish, verify, commit or roll back. Returns the release outputs; raises a
        ModalProviderError saying what failed, what was undone and what to do next."""
        try:
            before = self.read(self.app_id_before) if self.app_id_before else None
        except ModalProviderError as e:
            raise type(e)(
                f"{e} Nothing was published (the release reads what is live first); what"
                " served before keeps serving."
            ) from None
        if before is not None:
            self.records.update(before.records())
        pre = before.version() if before else 0
        target = before.rollback_target() if before else 0
        self.timeline.started = time.monotonic()
        try:
            result = self.host.deploy(
                self.props, self.action, self.tag, before.tags if before else {}
            )
        except ModalProviderError as e:
            published = self._after_lost_answer(e, before, pre, target)
        else:
            try:
                published = self._published(str(result["app_id"]), result, before, pre)
            except ModalProviderError as e:
                if not self.gate_on:
                    # Nothing is verified anyway: Modal completed the deploy, so the release
                    # stands; `read_back_error` says what is unknown (issue 11.5).
                    return self._unread(result, pre, target, e)
                # Modal took the deploy but cannot say what is live: roll back blind.
                lost = Published(str(result["app_id"]), 0, 0.0, "", True, self.tag, "")
                raise self._abort(
                    lost, before, pre, target, GateOutcome(False, "error", str(e), 0.0)
                ) from None
        self.timeline.published = time.monotonic() - self.timeline.started
        try:
            outcome = self._verify(published, before)
        except BaseException as e:  # an interrupt too: roll back, then stop
            outcome = GateOutcome(False, "error", f"{type(e).__name__}: {e}", 0.0)
            if not isinstance(e, Exception):
                print(str(self._abort(published, before, pre, target, outcome)), file=sys.stderr)
                raise
        if outcome.ok:
            return self._commit(published, before, pre, target, outcome)
        raise self._abort(published, before, pre, target, outcome)

    def _published(
        self, app_id: str, result: Mapping[str, Any], before: Releases | None, pre: int
    ) -> Published:
        """What the publish left live, read from Modal's history."""
        after = self.read(app_id)
        live = after.live()
        if live is None:
            raise ModalProviderError(
                f"App {self.label}: the deploy reported {app_id}, whose deployment history is empty"
            )
        new = before is None or app_id != before.app_id or live.version > pre
        url = str(result.get("web_url") or result.get("gate_url") or "")
        return Published(app_id, live.version, live.deployed_at, url, new, live.tag, live.commit)

    def _after_lost_answer(
        self, error: ModalProviderError, before: Releases | None, pre: int, target: int
    ) -> Published:
        """The deploy failed; it may still have published (its answer lost). Look: if it did,
        the release goes on to the gate like any other; if not, say what is live."""
        try:
            app_id = self._lookup()
            after = self.read(app_id) if app_id else None
        except ModalProviderError as e:
            if before is None:
                raise ModalProviderError(
                    f"{error} Whether it reached Modal could not be checked ({e}): look for it"
                    f" with `modal app list{_env_flag(self.env)}` and stop it"
                    f" (`modal app stop {self.name}{_env_flag(self.env)}`) before rerunning."
                ) from None
            undo = rollback_command(self.name, self.env, target) or f"modal app stop {self.name}"
            raise ModalProviderError(
                f"{error} Whether it published a new version could not be checked ({e}): run"
                f" `modal app history {self.name}{_env_flag(self.env)}`; if a version newer"
                f" than v{pre} is there, it passed no gate: `{undo}`."
            ) from None
        published_new = after is not None and (
            before is None or after.app_id != before.app_id or after.version() > pre
        )
        if after is not None and published_new:
            live = after.live()
            assert live is not None
            print(
                f"App {self.label}: the deploy's answer was lost, but Modal published"
                f" v{live.version} (tag {live.tag or '-'}); verifying it like any release",
                file=sys.stderr,
            )
            url = self._web_url(after.app_id)
            return Published(
                after.app_id, live.version, live.deployed_at, url, True, live.tag, live.commit
            )
        if before is None:
            raise type(error)(f"{error} {self.host.undo_create(self.props)}") from None
        raise type(error)(
            f"{error} Nothing was published: v{pre} (checked in Modal's history just now)"
            " keeps serving."
        ) from None

    def _web_url(self, app_id: str) -> str:
        name, env = self.name, self.env
        try:
            return str(
                self._call(
                    "read the endpoint URL", lambda c: _rpc.app_web_url(c, app_id, name, env)
                )
            )
        except ModalProviderError:
            return ""

    def _gate(self, app_id: str, url: str) -> HealthGate:
        props = self.props
        target = GateTarget(
            url=url,
            token_id=str(props.get("gate_token_id") or ""),
            token_secret=str(props.get("gate_token_secret") or ""),
            api_key=str(props.get("gate_api_key") or ""),
            model=str(props.get("gate_model") or ""),
            task=self.task,
        )

        def progress(line: str) -> None:
            pulumi.log.info(f"App {self.label}: {line}")

        return HealthGate(
            lambda action, fn: self._call(action, fn),
            app_id,
            self.env,
            target,
            progress,
            self.host.secrets(props),
        )

    def _verify(self, published: Published, before: Releases | None) -> GateOutcome:
        if not self.gate_on:
            return GateOutcome(True, "off", "health_gate is off: not verified", 0.0)
        if not published.new and before is not None and before.outcome(published.version) == PASSED:
            return GateOutcome(
                True, "unchanged", f"v{published.version} already passed its gate", 0.0
            )
        if not published.version:
            return GateOutcome(False, "error", "the published version could not be read", 0.0)
        gate = self._gate(published.app_id, published.web_url)
        words = smoke_words(self.task)
        self._say(
            f"published v{published.version} in {self.timeline.published:.1f} s; health gate:"
            f" GET /ready within {self.ready_s:g} s (start-up budget, timeouts.startup_s), then"
            f" {words}, {self.gate_deadline:g} s in all; if refused, the rollback gets at most"
            f" {self.rollback_margin:g} s (rollback margin)"
        )
        outcome = gate.verify(
            f"v{published.version}",
            since=published.deployed_at,
            deadline_s=self.gate_deadline,
            must_leave=(0.0, published.deployed_at),
            ready_s=self.ready_s,
        )
        self.timeline.gate = outcome.seconds
        return outcome

    def _say(self, line: str) -> None:
        """A progress line of this release (shown live by the engine)."""
        pulumi.log.info(f"App {self.label}: {line}")

    # ---- commit ----------------------------------------------------------------------------
    def _commit(
        self,
        published: Published,
        before: Releases | None,
        pre: int,
        target: int,
        outcome: GateOutcome,
    ) -> dict[str, Any]:
        v = published.version
        record = PASSED if self.gate_on else UNVERIFIED
        if outcome.stage == "unchanged":
            record = PASSED
        warning = self._write(published.app_id, {v: record})
        if warning:
            print(f"App {self.label}: {warning}", file=sys.stderr)
        if outcome.stage == "off":
            result = f"off: health_gate is false, v{v} not verified"
        elif outcome.stage == "unchanged":
            result = f"unchanged: v{v} (nothing new to publish) had passed its gate"
        else:
            words = smoke_words(self.task)
            result = f"passed: v{v} answered /ready and {words} in {outcome.seconds:.1f} s"
        good = v if record == PASSED else (before.known_good() if before else 0)
        return {
            "version": v,
            "previous_version": pre,
            "known_good_version": good,
            "deployment_tag": published.tag or self.tag,
            "commit": published.commit,
            "gate_result": result,
            "gate_seconds": round(outcome.seconds, 3),
            "rollback_command": rollback_command(self.name, self.env, target if target != v else 0),
            "web_url": published.web_url,
            "app_id": published.app_id,
            "read_back_error": (
                ""
                if published.web_url
                else "the endpoint URL could not be read back; `pulumi refresh` fills it in"
            ),
        }

    def _unread(
        self, result: Mapping[str, Any], pre: int, target: int, error: ModalProviderError
    ) -> dict[str, Any]:
        """An ungated release whose history could not be read back: it stands, unknown."""
        app_id = str(result["app_id"])
        why = (
            f"deployed as {app_id}, but what is live could not be read back: {error}"
            " `pulumi refresh` fills it in."
        )
        print(f"warning: App {self.label}: {why}", file=sys.stderr)
        return {
            "version": int(result.get("version") or 0),
            "previous_version": pre,
            "known_good_version": 0,
            "deployment_tag": self.tag,
            "commit": "",
            "gate_result": "off: health_gate is false, not verified",
            "gate_seconds": 0.0,
            "rollback_command": rollback_command(self.name, self.env, target),
            "web_url": str(result.get("web_url") or ""),
            "app_id": app_id,
            "read_back_error": str(result.get("read_back_error") or why),
        }

    # ---- abort -----------------------------------------------------------------------------
    def _abort(
        self,
        published: Published,
        before: Releases | None,
        pre: int,
        target: int,
        outcome: GateOutcome,
    ) -> ModalProviderError:
        """Undo what the release made live; never raises. Returns the error to raise."""
        v = published.version
        what = f"v{v}" if v else "the new version"
        self._abort_started = time.monotonic()
        self.timeline.stage = outcome.stage
        self._say(
            f"{what} refused after {outcome.seconds:.1f} s ({outcome.stage}); undoing it within"
            f" the rollback margin of {self.rollback_margin:g} s"
        )
        try:
            gate = self._gate(published.app_id, published.web_url)
            tail = gate.log_tail(published.deployed_at) if published.deployed_at else []
        except Exception:  # a log tail is context, never decisive
            gate, tail = None, []
        head = (
            f"App {self.label}: {self.action} failed: {what} (tag {self.tag}) did not pass the"
            f" health gate: {outcome.reason or outcome.stage} (after {outcome.seconds:.1f} s)."
        )
        if v:
            note = self._write(published.app_id, {v: FAILED})
            head += f" {note}" if note else ""
        if not published.new:
            done = (
                f"Nothing new was published: v{v} is what served before this release; left"
                " as it is (now recorded as failed, so no rollback goes to it)."
            )
            todo = "Find out why it no longer serves (see the log below), then rerun `pulumi up`."
            undo = "nothing to undo"
        elif not self.keep_on_failure or (before is not None and published.app_id != before.app_id):
            done = self._stop_new(published)
            todo = "Fix the release (see the log below), then rerun `pulumi up`."
            undo = "stop of the new app"
        elif target and target != v:
            done = self._roll_back(published, target, gate)
            todo = (
                "Fix the release (see the log below), then rerun `pulumi up` (Pulumi's state"
                " keeps the inputs of the last release that passed)."
            )
            undo = f"rollback to v{target}"
        else:
            done = self._stop_new(published, why=f"no earlier version passed its gate (v{pre})")
            todo = "Fix the release (see the log below), then rerun `pulumi up`."
            undo = "stop of the new app"
        ended = time.monotonic()
        self.timeline.rollback = ended - self._abort_started
        self.timeline.rollback_what = undo
        timeline = self.timeline.line(ended)
        self._say(timeline)
        logs = "\n".join(f"  | {line}" for line in tail) or "  (no log lines)"
        message = f"{head}\n{done}\n{timeline}\n{todo}\nThe container's last log lines:\n{logs}"
        return ModalProviderError(redact(message, self.host.secrets(self.props)))

    def _stop_new(self, published: Published, why: str = "") -> str:
        """A create's app (or one with nothing to roll back to) is stopped: no failing
        version keeps taking traffic."""
        app_id = published.app_id

        async def go(client: Any) -> None:
            await _rpc.app_stop(client, app_id)

        reason = f" ({why})" if why else ""
        try:
            self._call("stop the app that failed its gate", go)
        except ModalProviderError as e:
            return (
                f"Stopping {app_id}{reason} FAILED ({e}): it may still take traffic. Finish it"
                f" with `modal app stop {self.name}{_env_flag(self.env)}`."
            )
        return f"Stopped {app_id}{reason}: nothing of this release is left serving."

    def _roll_back(self, published: Published, target: int, gate: HealthGate | None) -> str:
        """AppRollback to `target`, record, then re-check it answers the smoke request once
        the failed version's containers are gone."""
        app_id = published.app_id
        command = rollback_command(self.name, self.env, target)

        async def go(client: Any) -> None:
            await _rpc.app_rollback(client, app_id, target)

        try:
            self._call(f"roll back to v{target}", go, idempotent=False)
        except ModalProviderError as e:
            if not self._rolled_back_to(app_id, target):
                return (
                    f"The rollback to v{target} (last known good) FAILED ({e}): the failed"
                    f" version may still be serving. Finish it with `{command}`."
                )
        try:
            after = self.read(app_id)
        except ModalProviderError as e:
            return (
                f"Rolled back to v{target} (last known good), but its new version could not be"
                f" read back ({e}); check `modal app history {self.name}{_env_flag(self.env)}`."
            )
        live = after.live()
        assert live is not None
        records = {published.version: FAILED} if published.version else {}
        self._write(app_id, records)  # a rollback may reset the app's tags: write them again
        if gate is None or not self.gate_on:
            return f"Rolled back to v{target} (last known good), live as v{live.version}."
        # What is left of the rollback margin (the RPC and the records took some of it).
        left = self.rollback_margin - (time.monotonic() - self._abort_started)
        check = gate.verify(
            f"v{live.version} (v{target} again)",
            since=live.deployed_at,
            deadline_s=max(left, 5.0),
            must_leave=(published.deployed_at or live.deployed_at, live.deployed_at),
        )
        record = PASSED if check.ok else (UNVERIFIED if check.timed_out else FAILED)
        self._write(app_id, {live.version: record})
        words = smoke_words(self.task)
        if check.ok:
            return (
                f"Rolled back to v{target} (last known good), live as v{live.version}, which"
                f" answered {words} again ({check.seconds:.1f} s) once the failed version's"
                " containers were gone."
            )
        if check.timed_out:
            return (
                f"Rolled back to v{target} (last known good), live as v{live.version}; it did"
                f" not answer {words} within the rollback margin ({self.rollback_margin:g} s):"
                f" {check.reason}. A cold start may take up to its start-up budget: check"
                f" `modal app logs {self.name}{_env_flag(self.env)}` (recorded unverified)."
            )
        return (
            f"Rolled back to v{target} (last known good), live as v{live.version}, but it did"
            f" NOT answer {words}: {check.reason}. Check"
            f" `modal app logs {self.name}{_env_flag(self.env)}`."
        )

    def _rolled_back_to(self, app_id: str, target: int) -> bool:
        """After an ambiguous AppRollback failure: did the rollback happen?"""
        try:
            live = self.read(app_id).live()
        except ModalProviderError:
            return False
        return live is not None and live.rollback_version == target


def _is_record_key(key: str) -> bool:
    return key.startswith(RECORD_PREFIX) and key[len(RECORD_PREFIX) :].isdigit()


def _env_flag(env: str) -> str:
    return f" -e {env}" if env else ""


def _custom_timeout(props: Mapping[str, Any], action: str) -> float:
    """The resource's customTimeouts for `action` in seconds (0: not set)."""
    timeouts = props.get("custom_timeouts")
    if not isinstance(timeouts, Mapping):
        return 0.0
    value = timeouts.get(action)
    try:
        return max(float(value), 0.0) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
