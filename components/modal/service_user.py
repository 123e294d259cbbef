"""`ServiceUser`: a Modal service user (a scoped, non-human identity) and its one token.

What Modal offers (modal 1.6.4 `modal/_workspace.py` `_WorkspaceServiceUserManager`,
`modal workspace service-users`): `ServiceUserCreate{name, scoped, expires_in_seconds}` answers
a token id and secret, the secret shown only this once; a new service user has access to no
environment until it gets an environment role (`EnvironmentRole`); `ServiceUserInfo` reports
`created_at`, `last_used_at` and its roles; `ServiceUserDelete` revokes the token with it.
Creating or deleting one needs an Owner or Manager of the workspace ("To call this function,
you are required to have Manager permissions in the Workspace").

- Create makes a **scoped** service user named `name` and returns `token_id` and `token_secret`
  (a secret output from creation on: wire secret + `additional_secret_outputs`).
- **Rotation** (`rotation` changed, any string such as a date; also a changed
  `expires_in_days`, since Modal cannot change a token's expiry): a service user has exactly
  one token, so a rotation is an update that creates a new service user `<name>-<n>` (n counts
  the rotations: output `generation`) and keeps the one before as `previous_name` /
  `previous_token_id`, so whatever still holds the old token keeps working. `names` lists both
  (the current first): `EnvironmentRole` grants its role to every name in it.
- **Retirement**: `pulumi refresh` (or `up --refresh`) reads `last_used_at` of the current
  service user (`ServiceUserInfo`). Once it was used after its creation, the next `up` plans an
  update that deletes the previous service user (and with it the old token), and Diff says so:
  "retire previous service user <name> (new token in use since <time>)". Until then an `up`
  leaves both in place and says why. Diff never calls Modal: it decides from the state, which
  refresh keeps current. A second rotation before the first finished keeps whichever of the two
  older service users is proven in use (the current one if it was used, else the previous one),
  and deletes the other.
- Changing `name` replaces (create-before-delete): a new identity under the new name.
- Read: the current service user gone (deleted by hand, expired) or holding another token id
  (recreated by hand: the recorded secret is void) → gone; a previous one deleted by hand → no
  longer recorded. Delete deletes the current and the previous one.
- Create is sent once per attempt under one idempotency key (`_rpc.idempotency_key`); if a
  server that did not replay the key answers "already exists" to a retry, the service user that
  an earlier attempt of this create made (created after it started) is deleted and made again,
  since its token secret was lost with that answer. A create whose answer was lost in a run
  that then died (issue 32 item 10) is found by the next one: a service user has no tag
  (modal_proto 1.6.4 `ServiceUserCreateRequest`: name, scoped, expires_in_seconds), so a
  *pending record* (a secret named after the `owner` mark in the workspace's default
  environment, `_rpc.pending_begin`) is written before `ServiceUserCreate` and dropped once it
  answered; a service user of that name created at or after this resource's record is the one
  it made: deleted and made again (its token secret was lost with the answer; a new id). Any
  other of that name is a stranger's and refused as before. There is no `adopt`: Modal never shows a
  token secret again, so an existing service user could not be handed to anyone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import ModalProvider, is_unknown, owner_of, rotation_problems
from ._schema import Schema, SchemaResource, output, owner, records, replaces

#: Modal's rule for service-user names (`service_users.create`: "alphanumeric, '-', or '_'").
#: At most 56 characters, leaving room for the rotation suffix `-<n>` within 64.
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,56}$")
#: Any Modal service-user name (a rotated one included).
MODAL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_EXPIRES_IN_DAYS = 3650
#: A service user found under our name on a retried create counts as made by an earlier
#: attempt of that create when Modal says it was created at most this long before it started
#: (clock skew between this machine and Modal).
CLOCK_SLACK_S = 120.0


def generation_name(name: str, generation: int) -> str:
    """The Modal name of a service user after `generation` rotations: `name`, `name-1`, ..."""
    return name if generation == 0 else f"{name}-{generation}"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else "never"


def _expires(props: Mapping[str, Any]) -> int | None:
    value = props.get("expires_in_days")
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _name_problems(name: Any) -> list[str]:
    if isinstance(name, str) and NAME_RE.match(name):
        return []
    return [
        f"service user name {name!r} is invalid: 1-56 characters from a-z A-Z 0-9 - _ (a"
        " rotation appends -<n>; Modal allows letters, digits, '-' and '_')"
    ]


def _whole(days: Any) -> bool:
    return isinstance(days, int | float) and not isinstance(days, bool) and float(days).is_integer()


def _days_problems(days: Any) -> list[str]:
    if _whole(days) and 1 <= days <= MAX_EXPIRES_IN_DAYS:
        return []
    return [
        f"expires_in_days {days!r} must be a whole number of days from 1 to"
        f" {MAX_EXPIRES_IN_DAYS}, or unset (never expires)"
    ]


class ServiceUserArgs(Schema):
    """Inputs of a `ServiceUser` (keywords), then what it outputs. A changed `rotation` or
    `expires_in_days` rotates (an update: `extra_changes`), a changed `name` replaces."""

    name: pulumi.Input[str] = replaces(check=_name_problems)
    rotation: pulumi.Input[str] = records(default="", check=rotation_problems)
    #: Days until the token stops working (Modal then deletes the service user); None = never.
    expires_in_days: pulumi.Input[int] | None = records(
        default=None, check=_days_problems, normalize=lambda d: int(d) if _whole(d) else d
    )
    owner: str = owner()
    generation: int = output()  # rotations so far: the current Modal name is `<name>-<n>`
    current_name: str = output()
    names: list[str] = output()  # the current service user, then the previous one if any
    service_user_id: str = output()
    token_id: str = output()
    token_secret: str = output(secret=True)  # left out when unknown (an imported one)
    created_at: float = output()
    last_used_at: float = output()
    expires_at: float = output()
    previous_name: str = output()
    previous_token_id: str = output()
    previous_service_user_id: str = output()


def _in_use(recorded: ServiceUserArgs) -> bool:
    """Whether the current token was used after its service user was created (from state)."""
    return bool(recorded.last_used_at) and recorded.last_used_at > recorded.created_at


class ServiceUserProvider(ModalProvider):
    SCHEMA = ServiceUserArgs.SCHEMA  # rotation and retirement: extra_changes

    # ---- diff: from the state only (refresh keeps last_used_at current) ---------------------
    @staticmethod
    def _rotates(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        rotation, days = news.get("rotation"), news.get("expires_in_days")
        return (
            is_unknown(rotation)
            or is_unknown(days)
            or (rotation or "") != (olds.get("rotation") or "")
            or _expires(news) != _expires(olds)
        )

    def extra_changes(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """A rotation is due, or the previous service user can be retired (logged either way
        when a previous one exists)."""
        if self._rotates(olds, news):
            return True
        name, recorded = news.get("name"), ServiceUserArgs.from_props(olds)
        previous = recorded.previous_name
        if not previous:
            return False
        if _in_use(recorded):
            pulumi.log.info(
                f"ServiceUser '{name}': retire previous service user {previous}"
                f" (new token in use since {_when(recorded.last_used_at)}):"
                f" this update deletes it, and its token {recorded.previous_token_id} stops"
                " working"
            )
            return True
        pulumi.log.info(
            f"ServiceUser '{name}': previous service user {previous} kept: the new token"
            f" {recorded.token_id} ({recorded.current_name or name}) has not been used since it"
            f" was created ({_when(recorded.created_at)}), as of the last refresh. Put the"
            " new token where the old one is used; once something used it, `pulumi up"
            " --refresh` retires the previous service user"
        )
        return False

    # ---- outputs -------------------------------------------------------------------------
    @classmethod
    def _outputs(
        cls,
        props: Mapping[str, Any],
        *,
        generation: int,
        current: Any,
        token_secret: str | None,
        previous: Any,
    ) -> dict[str, Any]:
        """`current` / `previous`: `ServiceUser` messages (ServiceUserInfo), previous or None."""
        current_name = str(current.name)
        return cls.SCHEMA.outputs(
            props,
            expires_in_days=_expires(props),
            generation=generation,
            current_name=current_name,
            names=[current_name, *([str(previous.name)] if previous is not None else [])],
            service_user_id=str(current.service_user_id),
            token_id=str(current.token_id),
            token_secret=token_secret or None,
            created_at=float(current.created_at),
            last_used_at=float(current.last_used_at),
            expires_at=float(current.expires_at),
            previous_name=str(previous.name) if previous is not None else "",
            previous_token_id=str(previous.token_id) if previous is not None else "",
            previous_service_user_id=(
                str(previous.service_user_id) if previous is not None else ""
            ),
        )

    def _hints(self, name: str) -> dict[type[BaseException], str]:
        from modal import exception as mexc

        return {
            mexc.AlreadyExistsError: (
                f"A service user named '{name}' already exists in the workspace and is not"
                " managed by this stack (it cannot be adopted: Modal never shows a token secret"
                f" again). If nothing uses it, delete it (`modal workspace service-users delete"
                f" {name}`), or choose another identity name, then rerun `pulumi up`."
            ),
            mexc.PermissionDeniedError: (
                "Service users are created and deleted by a workspace Owner or Manager: run"
                " this stack (the access stack) with your own token (`modal token new`), not"
                " with a service user's token, then rerun."
            ),
        }

    # ---- create --------------------------------------------------------------------------
    @staticmethod
    async def _mint(
        client: Any, name: str, expires_s: int, memo: dict[str, Any], owner: str = ""
    ) -> Any:
        """Create `name` under memo's key; resolves what an earlier attempt may have made,
        and (with `owner`) what an earlier run of this resource made and never heard of."""
        from modal import exception as mexc

        if owner and "swept" not in memo:
            memo["swept"] = True
            live = await _rpc.service_user_info(client, name)
            if live is not None:
                pending = await _rpc.pending_get(client, owner, PENDING_ENV)
                if _rpc.pending_claims(pending, PENDING_KIND, name, float(live.created_at)):
                    # This resource's own create whose answer (the only copy of its token
                    # secret) was lost: of no use to anyone; made again below.
                    await _rpc.service_user_delete(client, name)
                    live = None
            if live is None:
                await _rpc.pending_begin(client, owner, PENDING_ENV, PENDING_KIND, name)
                memo["pending"] = True
        sent_before = bool(memo.get("sent"))
        memo["sent"] = True
        try:
            _, _, memo["secret"] = await _rpc.service_user_create(
                client, name, expires_s, memo["key"]
            )
        except mexc.AlreadyExistsError:
            found = await _rpc.service_user_info(client, name) if sent_before else None
            if found is None or float(found.created_at) < memo["started"] - CLOCK_SLACK_S:
                if memo.get("pending"):  # a stranger's: our record names nothing
                    await _rpc.pending_end(client, owner, PENDING_ENV)
                raise  # it was there before this create: genuinely taken
            # An earlier attempt of this create made it and its answer (the only copy of the
            # token secret) was lost: delete it and make it again under a fresh key.
            await _rpc.service_user_delete(client, name)
            memo["key"] = _rpc.idempotency_key()
            _, _, memo["secret"] = await _rpc.service_user_create(
                client, name, expires_s, memo["key"]
            )
        info = await _rpc.service_user_info(client, name)
        if info is None:
            raise mexc.NotFoundError(f"service user {name!r} vanished right after its creation")
        if memo.get("pending"):
            await _rpc.pending_end(client, owner, PENDING_ENV)
        return info

    def create(self, props: dict[str, Any]) -> CreateResult:
        name, days, owner = str(props["name"]), _expires(props), owner_of(props)
        memo: dict[str, Any] = {"key": _rpc.idempotency_key(), "started": time.time()}
        info = self.run(
            "create",
            f"'{name}'",
            lambda client: self._mint(client, name, (days or 0) * 86400, memo, owner),
            secrets=lambda: [str(memo.get("secret") or "")],
            hints=self._hints(name),
            idempotent=False,
            keyed=True,
            resumable=bool(owner),
        )
        outs = self._outputs(
            props, generation=0, current=info, token_secret=memo["secret"], previous=None
        )
        return CreateResult(name, outs)

    # ---- update: rotate, or retire the previous service user ------------------------------
    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from modal import exception as mexc

        name, recorded = str(news["name"]), ServiceUserArgs.from_props(olds)
        generation, current = recorded.generation, recorded.current_name or name
        previous, old_secret = recorded.previous_name, recorded.token_secret
        rotate = self._rotates(olds, news)
        days = _expires(news)
        new_name = generation_name(name, generation + 1)
        # Lives across the attempts of this call: what was decided is not decided again (an
        # attempt may fail after a delete was applied).
        memo: dict[str, Any] = {"key": _rpc.idempotency_key(), "started": time.time()}

        async def decide(client: Any) -> None:
            live = await _rpc.service_user_info(client, current)
            if live is None or str(live.token_id) != recorded.token_id:
                raise mexc.NotFoundError(
                    f"service user {current!r} (token {recorded.token_id}) is gone or holds"
                    " another token"
                )
            live_prev = await _rpc.service_user_info(client, previous) if previous else None
            if live_prev is not None and str(live_prev.token_id) != recorded.previous_token_id:
                live_prev = None  # recreated by hand under that name: not ours to delete
            used = float(live.last_used_at) > float(live.created_at)
            memo["live"], memo["delete"], memo["notes"] = live, [], []
            if not rotate:  # retire the previous one once the current token is in use
                memo["keep"] = live_prev
                if live_prev is not None and used:
                    memo["keep"] = None
                    memo["delete"] = [previous]
                    memo["notes"].append(
                        f"retired previous service user {previous} (new token in use since"
                        f" {_when(float(live.last_used_at))}): its token"
                        f" {recorded.previous_token_id} no longer works"
                    )
                elif live_prev is not None:
                    memo["notes"].append(
                        f"previous service user {previous} kept: the new token"
                        f" {live.token_id} has not been used yet"
                    )
                return
            # A rotation keeps one older service user: the one proven in use.
            memo["keep"] = live
            if live_prev is not None and used:
                memo["delete"] = [previous]
                memo["notes"].append(f"deleted {previous}: {current} is in use, kept instead")
            elif live_prev is not None:
                memo["keep"], memo["delete"] = live_prev, [current]
                memo["notes"].append(
                    f"deleted {current}: its token was never used; {previous} stays the one kept"
                )

        async def go(client: Any) -> tuple[Any, Any, str | None, int]:
            if "live" not in memo:
                await decide(client)
            for doomed in memo["delete"]:
                await _rpc.service_user_delete(client, doomed)  # already gone: fine
            if not rotate:
                return memo["live"], memo["keep"], old_secret, generation
            new = await self._mint(client, new_name, (days or 0) * 86400, memo, owner_of(news))
            return new, memo["keep"], memo["secret"], generation + 1

        hints = self._hints(new_name)
        hints[mexc.NotFoundError] = (
            f"The service user {current} no longer exists as recorded (deleted, expired or"
            " recreated by hand): run `pulumi refresh` (it drops it from the state), then"
            " `pulumi up` creates the identity again."
        )
        new_current, keep, secret, gen = self.run(
            "rotate" if rotate else "update",
            f"'{name}' ({current})",
            go,
            secrets=lambda: [str(old_secret or ""), str(memo.get("secret") or "")],
            hints=hints,
            idempotent=not rotate,
            keyed=rotate,
        )
        for note in memo.get("notes", []):
            pulumi.log.info(f"ServiceUser '{name}': {note}")
        if rotate:
            pulumi.log.info(
                f"ServiceUser '{name}': rotated: new service user {new_current.name} (token"
                f" {new_current.token_id}); {keep.name} stays until the new token is in use,"
                " then `pulumi up --refresh` retires it"
            )
        outs = self._outputs(
            news, generation=gen, current=new_current, token_secret=secret, previous=keep
        )
        return UpdateResult(outs)

    # ---- read ----------------------------------------------------------------------------
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        recorded = ServiceUserArgs.from_props(props)
        name = str(recorded.name or id_)
        current, previous = recorded.current_name or name, recorded.previous_name

        async def go(client: Any) -> tuple[Any, Any]:
            live = await _rpc.service_user_info(client, current)
            live_prev = await _rpc.service_user_info(client, previous) if previous else None
            return live, live_prev

        secret = recorded.token_secret
        live, live_prev = self.run("read", f"'{name}' ({current})", go, secrets=[str(secret or "")])
        if live is None or str(live.token_id) != recorded.token_id:
            if live_prev is not None:
                pulumi.log.warn(
                    f"ServiceUser '{name}': {current} is gone, but the previous service user"
                    f" {previous} still exists and is no longer tracked: delete it once nothing"
                    f" uses it (`modal workspace service-users delete {previous}`)"
                )
            return ReadResult("", {})
        if live_prev is not None and str(live_prev.token_id) != recorded.previous_token_id:
            live_prev = None  # recreated by hand under that name: not ours
        outs = self._outputs(
            props,
            generation=recorded.generation,
            current=live,
            token_secret=secret,
            previous=live_prev,
        )
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    # ---- delete --------------------------------------------------------------------------
    def delete(self, id_: str, props: dict[str, Any]) -> None:
        recorded = ServiceUserArgs.from_props(props)
        name = str(recorded.name or id_)
        doomed = [n for n in (recorded.current_name or name, recorded.previous_name) if n]
        owner = recorded.owner or ""

        async def go(client: Any) -> None:
            for n in doomed:
                await _rpc.service_user_delete(client, str(n))  # already gone: done
            # a record an interrupted create or rotation left
            await _rpc.pending_end(client, owner, PENDING_ENV)

        self.run(
            "delete",
            f"'{name}' ({' and '.join(map(str, doomed))})",
            go,
            secrets=[str(recorded.token_secret or "")],
            hints=self._hints(name),
        )


#: Where a service user's pending record lives (workspace-level objects: the default
#: environment) and what it names.
PENDING_ENV = ""
PENDING_KIND = "service_user"


class ServiceUser(SchemaResource[ServiceUserArgs], module="modal", name="ServiceUser"):
    """A scoped Modal service user. Outputs: every field of `ServiceUserArgs` (`token_id`,
    `token_secret` as a secret, `names`: current first, then the previous one while a
    rotation is in progress)."""

    PROVIDER = ServiceUserProvider


__all__ = [
    "MODAL_NAME_RE",
    "NAME_RE",
    "ServiceUser",
    "ServiceUserArgs",
    "ServiceUserProvider",
    "generation_name",
]
