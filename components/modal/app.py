"""`App`: a deployed Modal app (`app_file` deployed as `name` in `environment`).

- Create/update deploy through the real `modal` deploy path in a subprocess
  (`python -m components.modal._deploy_runner`, see that module), with SERVING_SPEC naming a
  temp file that holds `spec_json`, plus `extra_env` and the provider's Modal credentials.
  A transient failure (Modal unreachable) is retried once; deploys are idempotent.
- The spec is opaque here: the App takes the rendered `spec_json` and its `spec_digest`
  (sha256 of `spec_json`, which is `ServingSpec.digest()` for `ServingSpec.to_json()`; when
  not given it is computed so). The caller (`LLMService`) validates the spec; this package
  never imports `serving/` (issue 9 item 4).
- Create never deploys over an app that is already deployed under that name: it refuses,
  naming the app, unless `adopt=True`; then it deploys over it, records `adopted`, and
  destroy leaves the app deployed (it existed before Pulumi).
- Create and update are one release transaction (`_release.py` `execute`): publish tagged
  with the digests, verify with the health gate (`_gate.py`, a collaborator returning an
  outcome), then commit or roll back to the last version recorded `passed` on the app (its
  tags) and re-check it; a failed create stops what it made. What to do is decided without
  I/O (`_decide.py`); `_effects.py` does it, handed data by `_release` below (never this
  provider). docs/providers.md has the diagram.
- Read-back after a successful deploy (web URL, version) is best effort: the runner retries
  it, then the provider retries it; if it still fails, the create/update succeeds anyway
  (Modal completed the deploy) with `read_back_error` saying what failed, and the next
  refresh fills `web_url`/`version` in (issue 11 item 5).
- Outputs: `app_id` (also the resource id), `web_url`, `version` (the live version),
  `spec_digest`, `source_digest` (sha256 over every file the app ships: the app file plus
  what it adds with `add_local_python_source(...)`, `add_local_dir(...)`,
  `add_local_file(...)` given as string literals; `.py` files only for python sources, like
  modal's default `ignore`), `adopted`, `read_back_error`, and the release's
  `previous_version`, `known_good_version`, `deployment_tag`, `commit`, `gate_result`,
  `gate_seconds`, `rollback_command`.
- Diff: spec, source, app file or extra env changed → update (redeploy); name or environment
  changed → replace; nothing changed → no change, so no deploy at all. Diff reads the local
  files (side-effect free), so an edit to serving/ shows up in `pulumi preview`.
- The resource id is the app id of the first deploy; if the app was stopped behind Pulumi's
  back and an update redeployed it, Modal made a new app and the output `app_id` holds that
  live id (the engine keeps the resource id). Read and delete therefore act on
  `app_id`; delete also stops the resource id when it differs, so destroy never leaves a
  deployed app (GPU spend) behind.
- Delete stops the app (`AppStop`), unless it was adopted. Read (refresh) tells what is live,
  from Modal: the app under the name, its live version, the digests its deployment tag
  carries (a version rolled back or deployed by hand shows as `live vN: ...` digests, so the
  next `up` redeploys the state's release) and the release records. An app stopped by hand or
  not found stays the resource, with `version` 0, no URL and `live: none (...)` digests, so
  the next Diff plans an update that deploys it again (issue 32 item 12); only a missing
  environment makes it gone. The output `drift` says in words what differs ("live app
  stopped by hand: ...", "live app rolled back by hand: ...", "live app deployed by hand:
  ..."; "" when the live app runs the state's release), and the refresh warns with it.
- Both digests are computed before the deploy, from the files that were shipped; what an App
  ships, and its digest, is `_source.py`'s.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import (
    ADOPT_HOWTO,
    ModalAlreadyExistsError,
    ModalProvider,
    ModalProviderError,
    environment_name,
    environment_problems,
    is_unknown,
    object_name,
    sha256_hex,
)
from ._decide import (
    Policy,
    Releases,
    Verdict,
    deployment_tag,
    gate_result,
    parse_deployment_tag,
    policy,
    rollback_command,
)
from ._effects import Deploy, Effects
from ._gate import GateTarget
from ._release import execute
from ._schema import (
    Schema,
    SchemaResource,
    computed,
    flag,
    output,
    records,
    replaces,
)
from ._source import shipped_files, source_digest
from .defaults import GATE_TASK, GATE_TASKS, GATE_TIMEOUT_MAX_S, GATE_TIMEOUT_S

_ENV_KEY_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


# ---- digests -------------------------------------------------------------------------------


def spec_digest(spec_json: str) -> str:
    """The digest of a rendered spec: sha256 of the JSON text as given (for
    `ServingSpec.to_json()`, which is canonical, this is `ServingSpec.digest()`)."""
    return sha256_hex(spec_json)


# ---- the schema ------------------------------------------------------------------------------


def _app_file_problems(app_file: Any) -> list[str]:
    if not isinstance(app_file, str) or not app_file.endswith(".py"):
        return [f"app_file {app_file!r} must be a .py file"]
    if not Path(app_file).is_file():
        return [
            f"app_file {app_file!r} not found (relative to {Path.cwd()}, the program directory)"
        ]
    return []


def _spec_problems(spec: Any) -> list[str]:
    """The spec is the caller's to validate (LLMService); here only its shape."""
    if not isinstance(spec, str):
        return ["spec_json must be a JSON string (rendered spec)"]
    try:
        parsed = json.loads(spec)
    except ValueError as e:
        return [f"spec_json is not valid JSON: {e}"]
    return [] if isinstance(parsed, dict) else ["spec_json must be a JSON object"]


def _extra_env_problems(env: Any) -> list[str]:
    if not isinstance(env, Mapping):
        return ["extra_env must be a map of NAME → string"]
    return [
        f"{k!r} is not a valid environment variable name"
        for k in env
        if not k or not set(str(k)) <= _ENV_KEY_CHARS or str(k)[0].isdigit()
    ]


def _timeout_problems(timeout: Any) -> list[str]:
    ok = isinstance(timeout, int | float) and not isinstance(timeout, bool)
    if ok and 0 < float(timeout) <= GATE_TIMEOUT_MAX_S:
        return []
    return [
        f"health_gate_timeout_s {timeout!r} must be seconds in (0, {GATE_TIMEOUT_MAX_S:.0f}]"
        " (the service's startup timeout + request timeout)"
    ]


def _task_problems(task: Any) -> list[str]:
    if task in GATE_TASKS:
        return []
    return [
        f"gate_task {task!r} must be one of {', '.join(GATE_TASKS)} (the served model's task: it"
        " picks the gate's smoke request)"
    ]


def _custom_timeouts_problems(timeouts: Any) -> list[str]:
    bad = not isinstance(timeouts, Mapping) or any(
        k not in ("create", "update", "delete")
        or isinstance(v, bool)
        or not isinstance(v, int | float)
        or v < 0
        for k, v in (timeouts.items() if isinstance(timeouts, Mapping) else [])
    )
    return [f"custom_timeouts {timeouts!r} must map create/update/delete to seconds"] if bad else []


def _source_parses(news: Mapping[str, Any]) -> list[tuple[str, str]]:
    """With the spec known, a module the spec's manifest entry names but that is missing is
    found here, at preview, not in the container."""
    app_file, spec = news.get("app_file"), news.get("spec_json")
    if is_unknown(app_file) or _app_file_problems(app_file):
        return []
    try:
        shipped_files(str(app_file), spec_json=spec if isinstance(spec, str) else None)
    except SyntaxError as e:
        return [("app_file", f"app_file does not parse: {e}")]
    except ValueError:
        pass  # spec_json that is no JSON object: its own check names it
    return []


def _digest_matches(news: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The digest given belongs to the spec."""
    spec, digest = news.get("spec_json"), news.get("spec_digest")
    if is_unknown(spec) or _spec_problems(spec) or digest is None or is_unknown(digest):
        return []
    if digest == spec_digest(str(spec)):
        return []
    return [
        (
            "spec_digest",
            f"spec_digest {digest!r} is not the sha256 of spec_json: pass the digest of the spec"
            " you render (ServingSpec.digest() of that spec), or leave it unset",
        )
    ]


def _gate_can_call(news: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A gate needs what it sends (unknown in a preview is fine)."""
    if news.get("health_gate") is not True:
        return []
    return [
        (
            key,
            f"health_gate is on but {key} is not set: the gate calls the endpoint as a gateway"
            " does (proxy token id/secret and one API key); pass them, or set health_gate=False",
        )
        for key in ("gate_token_id", "gate_token_secret", "gate_api_key")
        if not is_unknown(news.get(key)) and not (isinstance(news.get(key), str) and news[key])
    ]


def _extra_env(props: Mapping[str, Any]) -> dict[str, str]:
    """The extra env as the deploy and the outputs hold it: NAME -> string."""
    return {str(k): str(v) for k, v in (props.get("extra_env") or {}).items()}


def _custom_timeouts(
    _type_token: str, _resource_name: str, opts: pulumi.ResourceOptions | None
) -> dict[str, float]:
    """customTimeouts bound the release (the dynamic-provider server does not hand the
    engine's `timeout` to create/update: pulumi/dynamic/__main__.py), so they travel as an
    input, in seconds."""
    return custom_timeouts_s(opts.custom_timeouts if opts else None)


def _seconds_changed(old: Any, new: Any) -> bool:
    """The gate's timeout, as seconds (a state without one: no change)."""
    return old is not None and new is not None and float(old) != float(new)


def _task_changed(old: Any, new: Any) -> bool:
    return str(new or GATE_TASK) != str(old or GATE_TASK)


def _seconds_by_op(timeouts: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in dict(timeouts or {}).items()}


def _timeouts_changed(old: Any, new: Any) -> bool:
    return _seconds_by_op(new) != _seconds_by_op(old)


class AppArgs(Schema):
    """Inputs of an `App` (keywords), then what it outputs. A changed name or environment
    replaces; a changed spec, app source or extra env redeploys (`redeploys`), a changed
    `noted` input is recorded without a deploy (`extra_changes`)."""

    RULES = (_source_parses, _digest_matches, _gate_can_call)

    name: pulumi.Input[str] = replaces(check=object_name("App"))
    environment: pulumi.Input[str] = replaces(check=environment_problems)
    app_file: pulumi.Input[str] = records(check=_app_file_problems, redeploys=True)
    spec_json: pulumi.Input[str] = records(check=_spec_problems, redeploys=True)
    extra_env: pulumi.Input[Mapping[str, pulumi.Input[str]]] = records(
        default_factory=dict, check=_extra_env_problems, redeploys=True, echo=_extra_env
    )
    #: sha256 of `spec_json` (`ServingSpec.digest()`); computed from `spec_json` when None.
    spec_digest: pulumi.Input[str] | None = records(
        default=None,
        redeploys=True,
        fill=lambda news: (
            spec_digest(news["spec_json"]) if isinstance(news.get("spec_json"), str) else None
        ),
    )
    # The noted inputs, each compared as what it means (a new task or timeout alone is a
    # change); none of them redeploys.
    adopt: pulumi.Input[bool] = flag(default=False, noted=True)
    #: Health gate (issue 11): after a deploy, wait until the endpoint answers through the edge
    #: (`/ready` 200, then a one-token completion), else roll back (update) or stop (create).
    health_gate: pulumi.Input[bool] = flag(default=False, noted=True)
    #: How long the gate waits (the service's startup timeout + request timeout).
    health_gate_timeout_s: pulumi.Input[float] = records(
        default=GATE_TIMEOUT_S, check=_timeout_problems, noted=_seconds_changed
    )
    #: What the gate sends: the stack's proxy token (Modal-Key/Modal-Secret), one API key and
    #: the served model name. Secrets: never in outputs, logs or errors.
    gate_token_id: pulumi.Input[str] | None = records(default=None, in_outputs=False)
    gate_token_secret: pulumi.Input[str] | None = records(
        default=None, secret=True, in_outputs=False
    )
    gate_api_key: pulumi.Input[str] | None = records(default=None, secret=True, in_outputs=False)
    gate_model: pulumi.Input[str] | None = records(default=None, in_outputs=False)
    #: The served model's task, which picks the smoke request: chat, completion, embedding.
    gate_task: pulumi.Input[str] = records(
        default=GATE_TASK, check=_task_problems, noted=_task_changed
    )
    #: The resource's customTimeouts option, in seconds (bounds the release).
    custom_timeouts: dict[str, float] = computed(
        initial=_custom_timeouts, check=_custom_timeouts_problems, noted=_timeouts_changed
    )
    # What is live:
    app_id: str = output()
    web_url: str = output()
    version: int = output()
    #: Live runtime autoscaler overrides a refresh found ({tag: {field: value}}).
    autoscaler_override: dict[str, dict[str, int]] = output()
    #: What a refresh found live that is not the state's release ("" after a release).
    drift: str = output()
    # What was deployed, and how:
    source_digest: str = output()
    adopted: bool = output()
    read_back_error: str = output()
    # What a release says about itself, with the value an older state lacks:
    previous_version: int = output(default=0)
    known_good_version: int = output(default=0)
    deployment_tag: str = output(default="")
    commit: str = output(default="")
    gate_result: str = output(default="")
    gate_seconds: float = output(default=0.0)
    rollback_command: str = output(default="")


# ---- the provider ----------------------------------------------------------------------------


class AppProvider(ModalProvider):
    SCHEMA = AppArgs.SCHEMA

    @staticmethod
    def _inputs_changed(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """True when a redeploy is due: spec, shipped source, app file or extra env changed."""
        if any(is_unknown(news.get(k)) for k in AppArgs.SCHEMA.redeploys):
            return True
        try:
            return _ships_changed(olds, news, AppProvider._digests(news))
        except (OSError, ValueError, SyntaxError):
            return True  # check() reports the problem; never hide a change

    def extra_changes(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """A redeploy (`_inputs_changed`) or a noted input's record is due."""
        return self._inputs_changed(olds, news) or self.SCHEMA.noted_changed(olds, news)

    def _release(
        self, props: Mapping[str, Any], action: str, digests: Mapping[str, str], url: str = ""
    ) -> tuple[Policy, Effects]:
        """The release of `props` (its knobs) and its effects, handed what they need as data:
        what to deploy, the Modal credentials, the gate's target, the values no message may
        show (`url`: the URL the app had, where the gate knocks if the read-back fails)."""
        creds = self.credentials()
        extra = _extra_env(props)
        pol = policy(props, action, digests)
        deploy = Deploy(
            app_file=str(props["app_file"]),
            name=pol.name,
            env=pol.env,
            spec_json=str(props["spec_json"]),
            extra_env=extra,
            token_id=creds.token_id,
            token_secret=creds.token_secret,
            server_url=creds.server_url,
            fallback_url=url,
            # The secrets the gate sends too (its proxy token secret and API key).
            secrets=(
                creds.token_secret,
                *extra.values(),
                *(str(props[k]) for k in ("gate_token_secret", "gate_api_key") if props.get(k)),
            ),
        )
        gate = GateTarget(
            url="",
            token_id=str(props.get("gate_token_id") or ""),
            token_secret=str(props.get("gate_token_secret") or ""),
            api_key=str(props.get("gate_api_key") or ""),
            model=str(props.get("gate_model") or ""),
            task=pol.task,
        )
        return pol, Effects(self.run, deploy, gate, pol)

    @staticmethod
    def _digests(props: Mapping[str, Any]) -> dict[str, str]:
        """spec and source digests of what is about to be deployed (taken before the deploy,
        so an edit made while it runs is seen by the next Diff)."""
        return {
            "spec_digest": str(props.get("spec_digest") or spec_digest(str(props["spec_json"]))),
            "source_digest": source_digest(
                str(props["app_file"]), spec_json=str(props["spec_json"])
            ),
        }

    def _outputs(
        self,
        props: Mapping[str, Any],
        result: Mapping[str, Any],
        digests: Mapping[str, str],
        adopted: bool,
    ) -> dict[str, Any]:
        """Inputs, what is live (`result`: a release's outputs, or the recorded ones, each read
        as declared: a deploy resets runtime overrides, an update without one keeps them) and
        the release record."""
        timeouts = dict(props.get("custom_timeouts") or {})
        return self.SCHEMA.outputs(
            props, result, **digests, adopted=adopted, custom_timeouts=timeouts
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        adopt = bool(props.get("adopt") or False)
        digests = self._digests(props)
        pol, fx = self._release(props, "create", digests)
        found = fx.lookup("look up before deploy")
        own = bool(found) and not adopt and fx.runs_release(found)
        if own:
            # An earlier run of this very create was interrupted after Modal published (the
            # provider or Modal killed): the app runs this create's own release (its deployment
            # tag carries the same digests) and no state knows it. It is this create's lost
            # result: gate it and record it, never refuse it (issue 22 item 6).
            fx.warn(
                f"{found} runs this create's own release (tag {pol.tag}), left by an"
                " interrupted run; verifying it as this create's"
            )
        elif found and not adopt:
            raise ModalAlreadyExistsError(
                f"App {pol.label}: create refused: an app is already deployed under"
                f" this name ({found}) and Pulumi does not manage it; deploying would take it"
                f" over and destroy would stop it. To manage it, {ADOPT_HOWTO} (the serving"
                " stack: `adopt: true` on the service); or stop it (`modal app stop"
                f" {pol.name} -e {pol.env or '<env>'}`), or choose another name."
            )
        # An adopted app existed before: a failed release is rolled back, never stopped.
        adopted = bool(found) and not own
        out = execute(replace(pol, keep_on_failure=adopted), fx, found).outputs()
        return CreateResult(str(out["app_id"]), self._outputs(props, out, digests, adopted))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        adopted = bool(olds.get("adopted") or False)
        digests = self._digests(news)
        if olds.get("app_id") and _record_only(olds, news, digests):
            # Only `adopt`, the gate policy or timeouts changed: nothing to deploy.
            return UpdateResult(self._outputs(news, olds, digests, adopted))
        pol, fx = self._release(news, "update", digests, str(olds.get("web_url") or ""))
        # What serves under the name now, read from Modal (not the state): an app stopped by
        # hand leaves none (the release is then a create: a failure stops what it made).
        live = fx.lookup("look up before deploy")
        out = execute(replace(pol, keep_on_failure=bool(live)), fx, live).outputs()
        if out.get("app_id") != _live_id(id_, olds):
            # The app was stopped (or replaced) behind Pulumi's back and the deploy made a
            # new one: the output app_id follows it (read/delete use it).
            print(
                f"App {self._target(news)}: {_live_id(id_, olds)} was gone; deployed as"
                f" {out.get('app_id')}",
                file=sys.stderr,
            )
        return UpdateResult(self._outputs(news, out, digests, adopted))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        """What is live, read from Modal: the app deployed under the name (stopped or gone:
        the resource is gone), its live version and what that version runs (its deployment
        tag's digests, following a rollback to the version it went back to), and the release
        records. A version rolled back or deployed by hand shows as other digests, so the
        next `preview` plans an update and `up` deploys the state's release again."""
        from modal import exception as mexc

        name, env = str(props.get("name") or ""), environment_name(props)

        recorded_id = _live_id(id_, props)

        async def go(client: Any) -> tuple[Releases, str] | str | None:
            app_id = await _rpc.app_id_by_name(client, name, env)
            if app_id is None:  # e.g. the environment itself was deleted
                return None
            if not app_id:
                # Nothing deployed under the name: stopped (Modal still knows the state's app
                # and its history) or not found at all.
                try:
                    await _rpc.app_deployments(client, recorded_id)
                except mexc.NotFoundError:
                    return "missing"
                return "stopped"
            rows = await _rpc.app_deployments(client, app_id)
            tags = await _rpc.app_tags(client, app_id)
            url = await _rpc.app_web_url(client, app_id, name, env)
            return Releases(app_id, tuple(rows), tags), url

        found = self.run("read", f"{id_} ({self._target(props)})", go)
        if found is None:
            return ReadResult("", {})
        outs: dict[str, Any] = {k: v for k, v in props.items() if k != "__provider"}
        if isinstance(found, str):
            # Still the resource (its name, environment and release are Pulumi's), with
            # nothing live: outputs that say so, so the next Diff plans a redeploy (an update,
            # which deploys under the name again) with the reason in `drift`.
            outs.update(_gone_outputs(found, recorded_id, outs, name, env))
            pulumi.log.warn(f"App {self._target(props)}: drift: {outs['drift']}")
            return ReadResult(id_, outs)
        releases, url = found
        outs.setdefault("extra_env", _extra_env(props))
        outs.setdefault("adopted", False)
        if "spec_digest" not in outs and isinstance(props.get("spec_json"), str):
            outs["spec_digest"] = spec_digest(props["spec_json"])
        if "source_digest" not in outs and isinstance(props.get("app_file"), str):
            spec = props.get("spec_json")
            outs["source_digest"] = source_digest(
                props["app_file"], spec_json=spec if isinstance(spec, str) else None
            )
        outs.update(_live_outputs(releases, url, outs, name, env))
        outs["autoscaler_override"] = self._read_overrides(props, releases.app_id)
        return ReadResult(id_, outs)

    def _read_overrides(self, props: Mapping[str, Any], app_id: str) -> dict[str, Any]:
        """Drift that a refresh reports but no deploy plans for: live autoscaler overrides
        (`modal` / `Function.update_autoscaler` by hand, or the pre-warm function inside a
        window), {tag: {field: value}}; {} when none or when the app has no function/server.
        Only an output: Diff never compares it, so a no-op `up` stays a no-op; the next
        deploy resets the overrides ("Subsequent deployments of the App containing this
        Function will reset the autoscaler back to its static configuration", modal 1.6.4
        `Function.update_autoscaler` docstring). If Modal cannot answer, the refresh still
        succeeds: the recorded value is kept and a warning says so."""
        try:
            live = self.run(
                "read autoscaler overrides",
                f"{app_id} ({self._target(props)})",
                lambda client: _rpc.autoscaler_overrides(client, app_id),
            )
        except ModalProviderError as e:
            pulumi.log.warn(
                f"App {self._target(props)}: could not read its live autoscaler overrides"
                f" (kept the recorded autoscaler_override): {e}"
            )
            recorded = props.get("autoscaler_override")
            return dict(recorded) if isinstance(recorded, Mapping) else {}
        for tag, o in live.items():
            fields = ", ".join(
                f"{k}={v} (deployed: {_or_default(o['static'].get(k))})"
                for k, v in o["override"].items()
            )
            pulumi.log.warn(
                f"App {self._target(props)}: {tag} runs with a runtime autoscaler override:"
                f" {fields}, set outside Pulumi (`update_autoscaler`, e.g. by hand or the"
                " pre-warm function inside a window). The next deploy of this app resets it to"
                " the deployed settings."
            )
        return {tag: o["override"] for tag, o in live.items()}

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        if props.get("adopted"):
            # It was deployed before Pulumi adopted it: left deployed (stop it by hand with
            # `modal app stop` if it should go).
            print(
                f"App {self._target(props)}: adopted, so left deployed ({_live_id(id_, props)})",
                file=sys.stderr,
            )
            return
        # The live app (output app_id) and, if an update redeployed, the original id too.
        ids = list(dict.fromkeys([_live_id(id_, props), id_]))

        async def go(client: Any) -> None:
            for app_id in ids:
                await _rpc.app_stop(client, app_id)

        self.run("stop", f"{' and '.join(ids)} ({self._target(props)})", go)


def _record_only(
    olds: Mapping[str, Any], news: Mapping[str, Any], digests: Mapping[str, str]
) -> bool:
    """An update that only records (nothing to deploy): a noted input changed and
    what ships did not (the digests taken for this update, the app file, the extra env)."""
    return not _ships_changed(olds, news, digests) and AppArgs.SCHEMA.noted_changed(olds, news)


def _ships_changed(
    olds: Mapping[str, Any], news: Mapping[str, Any], digests: Mapping[str, str]
) -> bool:
    """What ships differs from the state's: the digests taken for this change (`_digests`:
    spec and shipped source), the app file or the extra env."""
    return (
        digests["spec_digest"] != olds.get("spec_digest")
        or digests["source_digest"] != olds.get("source_digest")
        or news.get("app_file") != olds.get("app_file")
        or _extra_env(news) != _extra_env(olds)
    )


def _or_default(value: Any) -> str:
    return "default" if value is None else str(value)


def _live_id(id_: str, props: Mapping[str, Any]) -> str:
    """The app id Modal serves this resource under: output `app_id`, else the resource id."""
    live = props.get("app_id")
    return str(live) if isinstance(live, str) and live else id_


def _live_outputs(
    releases: Releases, url: str, recorded: Mapping[str, Any], name: str, env: str
) -> dict[str, Any]:
    """The outputs a refresh reads from Modal: the live app and version, and, when that
    version runs another release than the state's (rolled back or deployed by hand), digests
    that say so (the next Diff then plans a redeploy of the state's release)."""
    live = releases.live()
    version = live.version if live else 0
    tag = releases.effective_tag(version)
    parsed = parse_deployment_tag(tag)
    spec, src = str(recorded.get("spec_digest") or ""), str(recorded.get("source_digest") or "")
    outcome = releases.outcome(version)
    out: dict[str, Any] = {
        "app_id": releases.app_id,
        "version": version,
        "web_url": url,
        "read_back_error": "",
        "known_good_version": releases.known_good(),
        "deployment_tag": tag,
        "commit": (live.commit if live else "") or str(recorded.get("commit") or ""),
    }
    same = parsed is not None and spec.startswith(parsed[0]) and src.startswith(parsed[1])
    out["drift"] = "" if same else drift_reason(releases, recorded)
    if not same:
        runs = f"deployment tag {tag}" if tag else "no deployment tag (deployed outside Pulumi)"
        out["spec_digest"] = f"live v{version}: " + (parsed[0] if parsed else runs)
        out["source_digest"] = f"live v{version}: " + (parsed[1] if parsed else runs)
        pulumi.log.warn(
            f"App '{name}' in environment '{env or '<default>'}': drift: {out['drift']}:"
            " `pulumi up` deploys the state's release again (through the health gate)."
        )
    if not same or int(recorded.get("version") or 0) != version:
        verdict = Verdict(outcome or "unrecorded", version, read_by_refresh=True)
        out["gate_result"] = gate_result(verdict)
        good = releases.known_good()
        out["rollback_command"] = rollback_command(name, env, good if good != version else 0)
    return out


def drift_reason(releases: Releases, recorded: Mapping[str, Any]) -> str:
    """Why the live app is not the state's release, in words (pure): rolled back by hand,
    deployed by hand (no deployment tag of ours), or another release of ours."""
    live = releases.live()
    if live is None:
        return f"live app {releases.app_id} has no deployed version"
    tag = releases.effective_tag(live.version)
    ours = deployment_tag(
        str(recorded.get("spec_digest") or ""), str(recorded.get("source_digest") or "")
    )
    if live.rollback_version:
        return (
            f"live app rolled back by hand: v{live.version} runs v{live.rollback_version}"
            f" ({tag or 'no deployment tag'}), not the state's release ({ours})"
        )
    if parse_deployment_tag(tag) is None:
        return (
            f"live app deployed by hand: v{live.version} has no deployment tag of this stack"
            f" ({tag or 'none'}: deployed outside Pulumi), not the state's release ({ours})"
        )
    return (
        f"live app runs another release: v{live.version} is {tag}, not the state's release"
        f" ({ours}; deployed outside this stack's state, by hand or from another checkout)"
    )


#: What a refresh reports when nothing is deployed under the name (`read()`), by what Modal
#: said of the state's app: "stopped" (it still knows it) or "missing" (it does not).
GONE_WORDS = {
    "stopped": "live app stopped by hand: {app_id} is stopped and nothing serves '{name}' in"
    " environment '{env}' (`modal app stop` or the dashboard, outside Pulumi)",
    "missing": "live app not found: Modal knows no app {app_id} and nothing is deployed as"
    " '{name}' in environment '{env}' (deleted outside Pulumi)",
}


def _gone_outputs(
    how: str, app_id: str, recorded: Mapping[str, Any], name: str, env: str
) -> dict[str, Any]:
    """The outputs a refresh reports for an App with nothing live (pure): no version, no URL,
    digests that differ from every release (so Diff plans the redeploy) and the reason."""
    reason = GONE_WORDS[how].format(app_id=app_id, name=name, env=env or "<default>")
    return {
        "app_id": app_id,
        "version": 0,
        "web_url": "",
        "read_back_error": "",
        "spec_digest": f"live: none ({how})",
        "source_digest": f"live: none ({how})",
        "gate_result": gate_result(Verdict(how, read_by_refresh=True)),
        "rollback_command": "",
        "autoscaler_override": {},
        "drift": reason,
        "previous_version": int(recorded.get("version") or 0),
    }


class App(SchemaResource[AppArgs], module="modal", name="App"):
    """A deployed Modal app. Outputs: every field of `AppArgs` but what the gate sends
    (`app_id`, `web_url`, `version`, `spec_digest`, `source_digest`, `autoscaler_override`:
    live runtime overrides a refresh found, ...)."""

    PROVIDER = AppProvider


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(text: str) -> float:
    """A Pulumi customTimeouts duration ("30m", "1h30m", "45s": Go's time.ParseDuration
    units, which the engine parses them with) in seconds; ValueError for anything else."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 30m, 1h30m or 45s")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def custom_timeouts_s(timeouts: pulumi.CustomTimeouts | None) -> dict[str, float]:
    """Pulumi's CustomTimeouts resource option as {create|update|delete: seconds}."""
    if timeouts is None:
        return {}
    out: dict[str, float] = {}
    for key in ("create", "update", "delete"):
        value = getattr(timeouts, key, None)
        if value:
            out[key] = duration_s(str(value))
    return out


__all__ = [
    "App",
    "AppArgs",
    "AppProvider",
    "custom_timeouts_s",
    "duration_s",
    "shipped_files",
    "source_digest",
    "spec_digest",
]
