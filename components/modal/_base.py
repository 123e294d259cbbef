"""Shared machinery of the Modal dynamic providers: credentials, the client, retries, errors.

Every provider in this package subclasses `ModalProvider`. What it gives them:

- Credentials read at call time, never captured: stack config `modal:tokenId`,
  `modal:tokenSecret`, `modal:serverUrl` (handed to `configure()` by the provider server)
  win over env `MODAL_TOKEN_ID`, `MODAL_TOKEN_SECRET`, `MODAL_SERVER_URL`. Nothing of this
  is pickled: `__getstate__` drops the runtime state, so the `__provider` blob holds only the
  class reference (see tests/providers/test_serialization.py).
- `run(...)`: runs an async function against a real `modal` client (`modal.client._Client`,
  one per credential set, cached per process and built inside modal's own event loop through
  `synchronizer.create_blocking`, which is how raw RPCs are safely called from sync code).
  Transient failures (connection refused/reset, UNAVAILABLE, INTERNAL, timeouts) are retried
  with exponential backoff on top of modal's own three quick retries, but a call marked
  `idempotent=False` (a create that must not happen twice) is first preceded by a `ClientHello`
  probe and retried only when that probe failed (nothing was sent) or the connection was
  refused; an ambiguous failure after sending is reported as "may have been applied".
  Everything else is mapped to a `ModalProviderError` whose message names the resource, what
  was asked, what Modal answered and what to do next, with every secret value redacted
  (secrets may be given as a live collection or a callable, read when the error is built).
- Small helpers for the field checks `_schema` runs (Modal's name rules, unknown values) and
  for secret outputs.
- One declarative diff: a provider declares its fields once (`SCHEMA`, see `_schema.py`),
  which gives `DIFF = DiffSpec(...)` (which inputs replace, which update, how a value is
  normalised before comparing) and `check`; it inherits `diff`, which runs `partial_diff`;
  specific logic (a digest of files or values) goes in `extra_changes`.

Tuning (env, read at call time): `MODAL_PROVIDER_RETRY_ATTEMPTS` (default 3),
`MODAL_PROVIDER_RETRY_BASE_DELAY` seconds (default 1.0, doubled per attempt, capped at 4 s) and
`MODAL_PROVIDER_ATTEMPT_TIMEOUT` seconds per attempt (default 90: modal's client itself keeps
reconnecting for up to ~63 s inside one attempt).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pulumi.dynamic import (
    CheckResult,
    ConfigureRequest,
    DiffResult,
    ReadResult,
    ResourceProvider,
)
from pulumi.output import Unknown
from pulumi.runtime import rpc

from ._decide import describe_target
from ._rpc import OWNER_RE  # the marks themselves: _rpc (issue 32 item 10)

if TYPE_CHECKING:
    from ._schema import ResourceSchema

T = TypeVar("T")

#: Stack config keys (namespace "modal") the providers read in `configure()`.
CONFIG_TOKEN_ID = "modal:tokenId"  # noqa: S105 (a config key name)
CONFIG_TOKEN_SECRET = "modal:tokenSecret"  # noqa: S105 (a config key name, not a secret)
CONFIG_SERVER_URL = "modal:serverUrl"


@dataclass(frozen=True)
class Credentials:
    """Where and as whom to talk to Modal. `repr` never shows the token secret."""

    token_id: str
    token_secret: str
    server_url: str
    source: str  # "stack config" or "environment", for error messages

    def __repr__(self) -> str:
        return (
            f"Credentials(token_id={self.token_id!r}, token_secret=<redacted>,"
            f" server_url={self.server_url!r}, source={self.source!r})"
        )


class ModalProviderError(Exception):
    """A Modal call made by a provider failed; the message says what to do about it."""


class CredentialsMissingError(ModalProviderError):
    """Neither stack config nor environment holds Modal credentials (or only half a pair)."""


class NoCredentialsError(CredentialsMissingError):
    """No Modal credential is set at all: neither half of a pair, in config or environment."""


# ---- helpers for check/diff ------------------------------------------------------------------


def is_unknown(value: Any) -> bool:
    """True for a value the engine does not know yet (preview), anywhere inside `value`."""
    if isinstance(value, Unknown) or value == rpc.UNKNOWN:
        return True
    if isinstance(value, Mapping):
        return any(is_unknown(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(is_unknown(v) for v in value)
    return False


def object_name(kind: str) -> Callable[[Any], list[str]]:
    """A schema check (`_schema`): `kind`'s object name follows Modal's own rule for
    secret/volume/app names (modal._utils.name_utils)."""

    def problems(value: Any) -> list[str]:
        from modal._utils.name_utils import is_valid_object_name

        if isinstance(value, str) and value and is_valid_object_name(value):
            return []
        return [
            f"{kind} name {value!r} is invalid: use 1-64 characters from a-z A-Z 0-9 - _ ."
            " (and not an app id like ap-...)"
        ]

    return problems


def environment_problems(value: Any) -> list[str]:
    """A schema check (`_schema`): an environment name follows Modal's rule for new ones (no
    periods, no `en-` prefix, <= 64 chars)."""
    from modal._utils.name_utils import is_valid_environment_name

    if isinstance(value, str) and value and is_valid_environment_name(value, allow_periods=False):
        return []
    return [
        f"environment name {value!r} is invalid: start with a letter or digit, then"
        " a-z A-Z 0-9 - _ only, at most 64 characters, not starting with 'en-'"
    ]


def rotation_problems(rotation: Any) -> list[str]:
    """A schema check: a rotation is any string (e.g. a date); its change rotates."""
    return [] if isinstance(rotation, str) else ["rotation must be a string (e.g. a date)"]


#: How a key's value is compared: a function of the whole props mapping (it may read more than
#: its own key, e.g. a list with a fallback) whose results are compared with `!=`.
View = Callable[[Mapping[str, Any]], Any]


def flag_view(key: str) -> View:
    """A true/false input: absent, None and False compare equal."""
    return lambda props: bool(props.get(key) or False)


def text_view(key: str) -> View:
    """An optional string input: absent, None and "" compare equal."""
    return lambda props: props.get(key) or ""


def plain_view(key: str) -> View:
    """An input that may arrive as a wire secret: compared unwrapped."""
    return lambda props: plain(props.get(key))


def json_view(key: str) -> View:
    """A structured input: compared as canonical JSON (key order does not matter)."""
    return lambda props: canonical_json(props.get(key))


@dataclass(frozen=True)
class DiffSpec:
    """What a provider's diff compares (see `partial_diff`).

    `replace_on`: inputs whose change replaces the object (reported in this order).
    `update_on`: inputs whose change updates it in place.
    `views`: per key (of either kind), how its value is read before comparing; a key without
    one is compared raw (`news[key] != olds[key]`, absent = None).
    `unset_keeps`: update keys that are left alone when the new value is None (absent): the
    object keeps what it has, so no change is reported.
    """

    replace_on: tuple[str, ...] = ()
    update_on: tuple[str, ...] = ()
    views: Mapping[str, View] = field(default_factory=dict)
    unset_keeps: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        keys = [*self.replace_on, *self.update_on]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"DiffSpec: keys {twice} declared twice")
        stray = sorted({*self.views, *self.unset_keeps} - set(keys))
        if stray:
            raise ValueError(f"DiffSpec: keys {stray} are neither in replace_on nor in update_on")


def key_changed(olds: Mapping[str, Any], news: Mapping[str, Any], key: str, spec: DiffSpec) -> bool:
    """Whether `key` changed under `spec`. An unknown new value (preview) always counts as a
    change: it is tested on the raw value, before any view, so no view can hide it."""
    new = news.get(key)
    if is_unknown(new):
        return True
    if new is None and key in spec.unset_keeps:
        return False
    view = spec.views.get(key)
    if view is None:
        return bool(new != olds.get(key))
    return bool(view(news) != view(olds))


def partial_diff(olds: Mapping[str, Any], news: Mapping[str, Any], spec: DiffSpec) -> DiffResult:
    """The DiffResult `spec` gives for `olds` -> `news`: `replaces` lists the changed
    `replace_on` keys in declared order; `changes` is True when any declared key changed;
    `delete_before_replace` is always False (the new object is made first). Every key is
    compared, none skipped, so a bad value fails the same way whatever else changed."""
    replaces = [k for k in spec.replace_on if key_changed(olds, news, k, spec)]
    updated = [k for k in spec.update_on if key_changed(olds, news, k, spec)]
    return DiffResult(
        changes=bool(replaces) or bool(updated), replaces=replaces, delete_before_replace=False
    )


def canonical_json(value: Any) -> str:
    """Sorted-keys, compact JSON: the form digests are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def secret_output(value: Any) -> Any:
    """Mark an output secret on the wire, so the engine stores it encrypted."""
    return rpc.wrap_rpc_secret(value)


def plain(value: Any) -> Any:
    """Strip a wire secret marker (inputs arrive stripped; this is for values we built)."""
    return rpc.unwrap_rpc_secret(value)


#: Shorter values are not redacted: replacing a 1-3 character value everywhere mangles ids and
#: words in the message, and a value that short is no secret worth the name (issue 14.5).
MIN_REDACTED_LENGTH = 8


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret value of at least MIN_REDACTED_LENGTH
    characters, whole (longest first, so a value containing another is replaced entire)."""
    values = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_REDACTED_LENGTH}
    for s in sorted(values, key=len, reverse=True):
        text = text.replace(s, "[secret]")
    return text


# ---- the client --------------------------------------------------------------------------

_CLIENTS: dict[tuple[str, str, str], Any] = {}  # touched only inside modal's event loop


async def _call_with_client(
    creds: Credentials, fn: Callable[[Any], Awaitable[T]], timeout: float
) -> T:
    import asyncio

    from modal.client import _Client
    from modal_proto import api_pb2

    async def attempt() -> T:
        key = (creds.server_url, creds.token_id, creds.token_secret)
        client = _CLIENTS.get(key)
        if client is None or client.is_closed():
            client = _Client(
                creds.server_url, api_pb2.CLIENT_TYPE_CLIENT, (creds.token_id, creds.token_secret)
            )
            try:
                await client._open()
            except BaseException:  # incl. the cancellation of a timed-out attempt
                with contextlib.suppress(Exception):
                    await client.close()
                raise
            # Cached only once fully open: a half-opened client (an open cancelled by the
            # attempt timeout during an outage) answered every later call with AssertionError.
            _CLIENTS[key] = client
        return await fn(client)

    # modal itself keeps reconnecting for ~63 s; bound one attempt so our backoff takes over.
    return await asyncio.wait_for(attempt(), timeout)


async def _drop_client(creds: Credentials) -> None:
    client = _CLIENTS.pop((creds.server_url, creds.token_id, creds.token_secret), None)
    if client is not None:
        with contextlib.suppress(Exception):  # a broken client is being thrown away anyway
            await client.close()


def _blocking(fn: Callable[..., Awaitable[T]]) -> Callable[..., T]:
    from modal._utils.async_utils import synchronizer

    return synchronizer.create_blocking(fn)


def _is_transient(exc: BaseException) -> bool:
    import asyncio

    from grpclib import GRPCError, Status
    from grpclib.exceptions import StreamTerminatedError
    from modal import exception as mexc

    if isinstance(exc, mexc.AuthError | mexc.NotFoundError | mexc.AlreadyExistsError):
        return False
    if isinstance(exc, mexc.InvalidError | mexc.PermissionDeniedError):
        return False
    if isinstance(
        exc,
        OSError
        | asyncio.TimeoutError
        | StreamTerminatedError
        | mexc.ConnectionError
        | mexc.InternalError
        | mexc.ServiceError
        | mexc.TimeoutError,
    ):
        return True
    if isinstance(exc, GRPCError):
        return exc.status in (
            Status.UNAVAILABLE,
            Status.INTERNAL,
            Status.UNKNOWN,
            Status.DEADLINE_EXCEEDED,
            Status.CANCELLED,
            Status.RESOURCE_EXHAUSTED,
        )
    return False


def _answer(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


class ModalProvider(ResourceProvider):
    """Base of every Modal dynamic provider: credentials at call time, retries, error mapping.

    A subclass named `<Name>Provider` has the type token `pulumi-python:dynamic/modal:<Name>`
    (its resource's; `type_token` set on the class wins) and the `kind` <Name>; it implements
    the ResourceProvider methods, calling Modal only through `self.run(...)`.
    """

    kind: ClassVar[str] = "Modal resource"
    #: `pulumi-python:dynamic/modal:<Name>`; the harness reads it to build URNs.
    type_token: ClassVar[str] = ""
    serialize_as_secret_always = True
    #: Has an `adopt` input (an existing object can be taken over): named in error hints. From
    #: the `SCHEMA`.
    adoptable: ClassVar[bool] = False

    #: What `diff` compares; every provider declares its own (see `DiffSpec`), or a `SCHEMA`
    #: (`_schema.ResourceSchema`) that gives it, with `check`.
    DIFF: ClassVar[DiffSpec]
    SCHEMA: ClassVar[ResourceSchema]

    #: How messages name the object: `'<name>' in environment '<environment>'` (a provider of
    #: objects named otherwise has its own).
    _target = staticmethod(describe_target)

    # Providers are pickled into the `__provider` blob: never carry runtime state.
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every provider's `read` keeps the recorded state, with a warning, where no Modal
        credentials are set at all: Pulumi.yaml's `options: refresh: always` makes every
        preview refresh (pulumi/pulumi pkg/cmd/pulumi/operations/io.go getRefreshOption: only
        an explicit `--refresh=false` overrides it, which pulumi/actions never passes), and
        the PR preview job holds no Modal token by design (.github/workflows/preview.yml).
        Half a pair of credentials, or a wrong one, still fails as before."""
        super().__init_subclass__(**kwargs)
        if cls.__name__.endswith("Provider") and "type_token" not in cls.__dict__:
            # The type its resource registers: `module="modal", name=<this name less
            # "Provider">` (e.g. VolumeProvider: `Volume(..., module="modal", name="Volume")`).
            name = cls.__name__.removesuffix("Provider")
            cls.type_token = f"pulumi-python:dynamic/modal:{name}"
        if "type_token" in cls.__dict__ and "kind" not in cls.__dict__:
            cls.kind = cls.type_token.rpartition(":")[2]
        if "SCHEMA" in cls.__dict__:
            cls.DIFF = cls.SCHEMA.diff
            cls.adoptable = "adopt" in cls.SCHEMA.by_name
        read = cls.__dict__.get("read")
        if read is None or getattr(read, "_keeps_state_without_credentials", False):
            return

        @functools.wraps(read)
        def guarded(self: ModalProvider, id_: str, props: dict[str, Any]) -> Any:
            try:
                self.credentials()
            except NoCredentialsError:
                import pulumi

                pulumi.log.warn(
                    f"{self.kind} {id_}: not refreshed: no Modal credentials in this run (a"
                    " preview job without a Modal token); the state as last recorded is used."
                    " Export MODAL_TOKEN_ID/MODAL_TOKEN_SECRET to read what is live."
                )
                return ReadResult(id_, props)
            return read(self, id_, props)

        guarded._keeps_state_without_credentials = True  # type: ignore[attr-defined]
        setattr(cls, "read", guarded)  # noqa: B010 (a method replaced on the class)

    def configure(self, req: ConfigureRequest) -> None:
        cfg: dict[str, str] = {}
        for key in (CONFIG_TOKEN_ID, CONFIG_TOKEN_SECRET, CONFIG_SERVER_URL):
            value = req.config.get(key)
            if value:
                cfg[key] = str(plain(value))
        self._stack_config = cfg

    # ---- check and diff ----------------------------------------------------------------------
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        """The declared fields' checks (`SCHEMA.check`); never calls Modal."""
        schema = getattr(type(self), "SCHEMA", None)
        if schema is None:
            raise NotImplementedError(f"{type(self).__name__} declares no SCHEMA")
        result: CheckResult = schema.check(news)
        return result

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """`partial_diff` over `DIFF`; when no declared key changed, `extra_changes` decides
        whether an update is due. Never calls Modal."""
        spec = getattr(type(self), "DIFF", None)
        if spec is None:
            raise NotImplementedError(f"{type(self).__name__} declares no DIFF = DiffSpec(...)")
        result = partial_diff(olds, news, spec)
        if result.changes or not self.extra_changes(olds, news):
            return result
        return DiffResult(changes=True, replaces=[], delete_before_replace=False)

    def extra_changes(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """Provider-specific change (a digest of files or values, a due rotation) not
        expressible in `DIFF`: an update when True. Asked only when no declared key changed,
        so it may assume those are known and equal. Default: none."""
        return False

    # ---- credentials ---------------------------------------------------------------------
    def credentials(self) -> Credentials:
        """Credentials for this call: stack config first, then env; read now, never cached."""
        from modal.config import DEFAULT_SERVER_URL  # api.modal.com plus its fail-over URL

        cfg: dict[str, str] = getattr(self, "_stack_config", {})
        server_url = (
            cfg.get(CONFIG_SERVER_URL) or os.environ.get("MODAL_SERVER_URL") or DEFAULT_SERVER_URL
        )
        # (source, where its values are, the keys of the pair, how to fix half a pair)
        sources = (
            (
                "stack config",
                cfg,
                CONFIG_TOKEN_ID,
                CONFIG_TOKEN_SECRET,
                "stack config: set the missing key with"
                " `pulumi config set [--secret] <key> <value>`",
            ),
            (
                "environment",
                os.environ,
                "MODAL_TOKEN_ID",
                "MODAL_TOKEN_SECRET",
                "the environment: export the missing variable (or set both in stack config)",
            ),
        )
        for source, values, id_key, secret_key, where in sources:
            token_id, token_secret = values.get(id_key, ""), values.get(secret_key, "")
            _require_pair(self.kind, (id_key, token_id), (secret_key, token_secret), where)
            if token_id and token_secret:
                return Credentials(token_id, token_secret, server_url, source)
        raise NoCredentialsError(
            f"{self.kind}: no Modal credentials. Set stack config `pulumi config set modal:tokenId"
            " <id>` and `pulumi config set --secret modal:tokenSecret <secret>`, or export"
            " MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (and MODAL_SERVER_URL for a non-default"
            " server) before running pulumi."
        )

    # ---- calling Modal ---------------------------------------------------------------------
    def run(
        self,
        action: str,
        target: str,
        fn: Callable[[Any], Awaitable[T]],
        *,
        secrets: Iterable[str] | Callable[[], Iterable[str]] = (),
        hints: Mapping[type[BaseException], str] | None = None,
        idempotent: bool = True,
        keyed: bool = False,
        resumable: bool = False,
    ) -> T:
        """Run `fn(client)` against Modal, retrying transient failures.

        `action` says what was asked ("create", "read", ...), `target` names the object
        (e.g. "secret 'api-keys' in environment 'dev'"), `secrets` are values to redact from
        any error (iterated only when an error is built, so a live view or a callable sees
        values `fn` produced), `hints` map modal exception types to what the user should do.

        `idempotent=False` marks a call that must not simply be repeated once Modal may have
        applied it (a create). A `ClientHello` probe goes first, so an attempt that failed
        before the probe answered certainly sent nothing and is retried. Once an attempt got
        past the probe, the call is repeated only when it is `keyed`: `fn` sends the same
        `x-idempotency-key` on every attempt (see `_rpc.idempotency_key`) and resolves what an
        earlier attempt may have applied (e.g. "already exists" for the object it made). An
        unkeyed sent call is never repeated; the error then says it may have been applied.
        `resumable`: the next create of this resource finds what this one may have applied
        and takes it as its own (its ownership mark, issue 32 item 10): the error says so.
        """
        from modal import exception as mexc

        creds = self.credentials()
        attempts = max(1, int(os.environ.get("MODAL_PROVIDER_RETRY_ATTEMPTS", "3")))
        delay = float(os.environ.get("MODAL_PROVIDER_RETRY_BASE_DELAY", "1.0"))
        timeout = float(os.environ.get("MODAL_PROVIDER_ATTEMPT_TIMEOUT", "90"))
        started = time.monotonic()
        call = _blocking(_call_with_client)
        ever_sent = False  # any attempt got past the probe: Modal may have applied it
        for attempt in range(1, attempts + 1):
            sent: list[bool] = []  # set by the probe once the real call is about to go out
            try:
                return call(creds, fn if idempotent else _probed(fn, sent), timeout)
            except ModalProviderError:
                raise
            except Exception as exc:
                ever_sent = ever_sent or bool(sent)
                transient = _is_transient(exc)
                if transient or not isinstance(exc, mexc.Error):
                    # The connection may be half-broken (an attempt cancelled mid-call): never
                    # reuse it, also after the last attempt (the next resource's call needs a
                    # working client once Modal is back).
                    _blocking(_drop_client)(creds)
                may_repeat = idempotent or keyed or not sent
                if transient and attempt < attempts and may_repeat:
                    time.sleep(min(delay * 2 ** (attempt - 1), 4.0))
                    continue
                hint = self._hint(exc, creds, hints or {}, attempt, time.monotonic() - started)
                if not idempotent and transient:
                    if ever_sent and resumable:
                        hint = (
                            f"The request was sent (in {attempt} attempt(s)) and may have been"
                            " applied by Modal. Rerun `pulumi up` once Modal answers: the next"
                            f" create of this resource finds the {self.kind.lower()} this one"
                            " made (by its ownership mark) and takes it as its own; nothing to"
                            " delete by hand."
                        )
                    elif ever_sent:
                        way_out = (
                            f"set adopt on the resource ({ADOPT_HOWTO}) or delete it"
                            if self.adoptable
                            else "delete it (it cannot be adopted)"
                        )
                        hint = (
                            f"The request was sent (in {attempt} attempt(s)) and may have been"
                            f" applied by Modal. Check whether the {self.kind.lower()} exists"
                            " (`modal` CLI list) before rerunning `pulumi up`: if it does,"
                            f" {way_out}, then rerun."
                        )
                    else:
                        hint += " (This call never reached Modal: nothing was changed.)"
                import asyncio

                answer = (
                    f"did not answer within {timeout:g}s"
                    if isinstance(exc, asyncio.TimeoutError)
                    else f"answered {_answer(exc)}"
                )
                message = (
                    f"{self.kind} {target}: {action} failed. Modal at {creds.server_url}"
                    f" {answer}. {hint}"
                )
                err_type: type[ModalProviderError] = ModalProviderError
                if isinstance(exc, mexc.AuthError):
                    err_type = ModalAuthError
                elif isinstance(exc, mexc.AlreadyExistsError):
                    err_type = ModalAlreadyExistsError
                elif isinstance(exc, mexc.NotFoundError):
                    err_type = ModalNotFoundError
                elif transient:
                    err_type = ModalUnavailableError
                secret_values = [*(secrets() if callable(secrets) else secrets)]
                raise err_type(redact(message, [*secret_values, creds.token_secret])) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _hint(
        self,
        exc: BaseException,
        creds: Credentials,
        hints: Mapping[type[BaseException], str],
        attempts: int,
        elapsed: float,
    ) -> str:
        from modal import exception as mexc

        for etype, text in hints.items():
            if isinstance(exc, etype):
                return text
        if isinstance(exc, mexc.AuthError):
            return (
                f"The token {creds.token_id!r} (from {creds.source}) was rejected: check"
                " modal:tokenId/modal:tokenSecret or MODAL_TOKEN_ID/MODAL_TOKEN_SECRET belong to"
                " this workspace and server, then rerun."
            )
        if isinstance(exc, mexc.PermissionDeniedError):
            return (
                f"The token {creds.token_id!r} (from {creds.source}) has no role that allows this"
                " here: a CI identity may act only in its own environment (contributor to deploy,"
                " viewer to read). Use the stack's own `<env>-deploy` token, or grant the role in"
                ' the access stack (`pulumi -C access up`; docs/program.md, "Access").'
            )
        if isinstance(exc, mexc.NotFoundError):
            return (
                "It does not exist (any more): run `pulumi refresh` to forget it, then `pulumi up`."
            )
        if isinstance(exc, mexc.AlreadyExistsError):
            return f"It already exists: adopt it ({ADOPT_HOWTO}) or choose another name."
        if isinstance(exc, mexc.InvalidError):
            return "Modal rejected the request: fix the input named above and rerun."
        if _is_transient(exc):
            return (
                f"Gave up after {attempts} attempts over {elapsed:.1f}s: Modal is unreachable or"
                " failing. Check MODAL_SERVER_URL/network and Modal's status, then rerun"
                " `pulumi up`; if the call was sent it may have been applied, so run"
                " `pulumi refresh` first."
            )
        return "Check the inputs and Modal's status, then rerun."


class ModalAuthError(ModalProviderError):
    """Modal rejected the credentials."""


class ModalAlreadyExistsError(ModalProviderError):
    """The object to create already exists."""


class ModalNotFoundError(ModalProviderError):
    """The object is gone."""


class ModalUnavailableError(ModalProviderError):
    """Modal stayed unreachable/failing through every retry."""


#: How to take over an object that already exists. `import_` cannot work for dynamic
#: resources under the real engine: its import calls Read with the id only, without the
#: `__provider` the SDK's dynamic-provider server needs (pulumi/pulumi
#: pkg/resource/deploy/step.go, ImportStep.Apply; docs/providers.md "Adopting").
ADOPT_HOWTO = (
    "set the resource's `adopt=True` input (stack config: see docs/providers.md, 'Adopting"
    " existing objects'), then `pulumi up`: the existing object is validated, claimed, and"
    " left in place on destroy"
)


def _require_pair(kind: str, first: tuple[str, str], second: tuple[str, str], where: str) -> None:
    """Fail when exactly one of a token id/secret pair is set: never mix credential sources."""
    (k1, v1), (k2, v2) = first, second
    if bool(v1) != bool(v2):
        missing, present = (k2, k1) if v1 else (k1, k2)
        raise CredentialsMissingError(
            f"{kind}: Modal credentials are half set: {present} is set but {missing} is not, in"
            f" {where}. Set both (they must belong together) and rerun."
        )


def _probed(fn: Callable[[Any], Awaitable[T]], sent: list[bool]) -> Callable[[Any], Awaitable[T]]:
    """`fn` preceded by a ClientHello probe: Modal answered just now, so a failure before
    `sent` is filled means the real call never went out (safe to retry)."""

    async def go(client: Any) -> T:
        from . import _rpc

        await _rpc.hello(client)
        sent.append(True)
        return await fn(client)

    return go


# ---- ownership marks (issue 32 item 10: a create whose answer was lost) ---------------------
# The mark's shape and its secret key live in `_rpc` (no pulumi there); imported at the top.


def owner_mark(type_token: str, resource_name: str) -> str:
    """The mark of one resource of this stack: sha256 of `<project>/<stack>` (12 hex), `_`,
    sha256 of `<project>/<stack>/<type token>/<resource name>` (12 hex). Not a secret: it only
    tells this stack's objects from a stranger's. Computed in the program (the provider never
    learns the stack or URN: the SDK's Create carries only the inputs)."""
    import pulumi

    project, stack = pulumi.get_project(), pulumi.get_stack()
    return (
        sha256_hex(f"{project}/{stack}")[:12]
        + "_"
        + sha256_hex(f"{project}/{stack}/{type_token}/{resource_name}")[:12]
    )


def owner_of(props: Mapping[str, Any]) -> str:
    """The `owner` input when it is a mark ("" when absent: nothing is adopted as our own)."""
    value = props.get("owner")
    return value if isinstance(value, str) and OWNER_RE.match(value) else ""


def owner_problems(value: Any) -> list[str]:
    """A schema check (`_schema.owner`): the `owner` input is a mark made by `owner_mark`."""
    if owner_of({"owner": value}):
        return []
    return [
        f"owner {value!r} is not a mark made by owner_mark() (12 hex, '_', 12 hex): leave"
        " it to the resource class"
    ]


def environment_name(props: Mapping[str, Any], key: str = "environment") -> str:
    """The environment input as the wire wants it ("" = the workspace default)."""
    value = props.get(key)
    return str(value) if value else ""
