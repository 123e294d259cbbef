"""`Environment`: a Modal environment as a Pulumi resource (id and output `environment_id`).

- Create makes a new environment; with `adopt=True` an existing one of that name is taken
  over instead of failing (and created if missing). Create is transactional: if setting the
  web suffix fails (e.g. the suffix is taken), an environment created by this call is deleted
  again before the error is raised, so a rerun is not blocked by "already exists". An adopted
  environment is *released*, not deleted, on destroy: Pulumi did not create it (output
  `adopted` records this).
- `web_suffix` updates in place (`EnvironmentUpdate`); `None` means "leave Modal's value"
  (the live value is reported in the `web_suffix` output). A `name` change replaces: every
  Secret/Volume/App takes the environment *name* as input, and their environment change is a
  replace, which would collide with the objects an in-place rename had moved along.
- Create sends `EnvironmentCreate` with one idempotency key for all attempts (see `_rpc`);
  "already exists" answered to a retry of a create that was sent is the environment it made.
- Update acts on the id: the live name of this `en-...` id is looked up first, so a
  same-named environment someone recreated by hand is never modified (the update fails:
  refresh, then up), and an out-of-band rename is followed.
- Delete refuses while apps are deployed in the environment, or while secrets or volumes
  remain in it (Modal deletes everything scoped to an environment with it, so a retained
  cache volume would die with it), naming them, unless `force_delete=True`.
- A create whose answer was lost (issue 32 item 10) is taken as this resource's own by the
  next create: an environment has no tag (modal_proto 1.6.4 `EnvironmentCreateRequest`:
  name, is_managed, settings, type, default member role), so a *pending record* (a secret
  named after the `owner` mark, in the workspace's default environment; `_rpc.pending_begin`)
  is written before `EnvironmentCreate` and dropped once it answered. An environment of that
  name created at or after this resource's record (`EnvironmentListItem.created_at`) is the
  one it made; any other is a stranger's and refused as before.
- Delete also removes what this stack made in the environment that no state records (the
  lost creates: secrets carrying a `MODAL_LLM_OWNER_<stack>_...` key, pending records, and the
  volumes those records name) before it looks for what remains, so `pulumi destroy` is not
  stuck on an object whose create answer was lost. Anything else still refuses.
- Read (refresh by `en-...` id) looks the id up in `EnvironmentList`: missing → gone;
  a suffix changed behind Pulumi's back shows as drift.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import ModalProvider, ModalProviderError, environment_problems
from ._schema import Schema, SchemaResource, flag, output, owner, replaces, updates


def _suffix_problems(value: Any) -> list[str]:
    from modal._utils.name_utils import is_valid_subdomain_label

    if isinstance(value, str) and value and len(value) <= 32 and is_valid_subdomain_label(value):
        return []
    return [
        f"web suffix {value!r} is invalid: 1-32 lowercase letters, digits and inner '-' (it"
        " becomes part of web URLs)"
    ]


class EnvironmentArgs(Schema):
    """Inputs of an `Environment` (keywords), then what it outputs."""

    #: A rename replaces: Secrets/Volumes/Apps name their environment, and theirs replaces.
    name: pulumi.Input[str] = replaces(check=environment_problems)
    #: None: leave Modal's suffix (an unset suffix keeps the one Modal gave).
    web_suffix: pulumi.Input[str] | None = updates(
        default=None, unset_keeps=True, check=_suffix_problems
    )
    adopt: pulumi.Input[bool] = flag(default=False)
    force_delete: pulumi.Input[bool] = flag(default=False)
    owner: str = owner()
    environment_id: str = output()
    adopted: bool = output()


class EnvironmentProvider(ModalProvider):
    SCHEMA = EnvironmentArgs.SCHEMA

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        return f"'{props.get('name')}'"

    @classmethod
    def _outputs(cls, props: Mapping[str, Any], item: Any, adopted: bool) -> dict[str, Any]:
        """The outputs of `item` (the live `EnvironmentListItem`)."""
        return cls.SCHEMA.outputs(
            props,
            name=item.name,
            web_suffix=item.webhook_suffix,
            environment_id=item.environment_id,
            adopted=adopted,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        from modal import exception as mexc

        args = EnvironmentArgs.from_props(props)
        name, adopt, suffix = str(args.name), bool(args.adopt), args.web_suffix
        owner = args.owner or ""
        memo: dict[str, Any] = {"key": _rpc.idempotency_key()}  # one key for every attempt

        async def go(client: Any) -> tuple[Any, bool]:
            looked = adopt or (owner and "pending" not in memo)
            existing = await _rpc.environment_find(client, "name", name) if looked else None
            ours = False
            if owner and existing is not None and "pending" not in memo:
                pending = await _rpc.pending_get(client, owner, PENDING_ENV)
                created = float(existing.created_at)
                ours = _rpc.pending_claims(pending, PENDING_KIND, name, created)
            adopted = existing is not None and adopt and not ours
            if not (adopted or ours):
                if owner and existing is None and "pending" not in memo:
                    await _rpc.pending_begin(client, owner, PENDING_ENV, PENDING_KIND, name)
                    memo["pending"] = True
                try:
                    await _rpc.create_once(
                        memo,
                        lambda: _rpc.environment_create(client, name, memo["key"]),
                        lambda: _rpc.environment_find(client, "name", name),
                    )
                except mexc.AlreadyExistsError:  # a stranger's: our record names nothing
                    await _rpc.pending_end(client, owner, PENDING_ENV)
                    raise
            if suffix is not None:
                try:
                    await _rpc.environment_set_suffix(client, name, str(suffix))
                except BaseException:  # also a cancelled (timed-out) attempt
                    if not adopted:  # undo our own create; never delete an adopted env
                        with contextlib.suppress(Exception):
                            await _rpc.environment_delete(client, name)
                        memo.clear()  # a retry creates afresh, under a new key
                        memo["key"] = _rpc.idempotency_key()
                    raise
            item = await _rpc.environment_find(client, "name", name)
            if item is None:
                raise mexc.NotFoundError(f"environment {name!r} vanished right after creation")
            await _rpc.pending_end(client, owner, PENDING_ENV)
            return item, adopted

        item, adopted = self.run(
            "create",
            self._target(props),
            go,
            hints={
                mexc.AlreadyExistsError: (
                    "An environment with this name (or this web suffix) already exists and it"
                    " is not this resource's (no pending create of this resource names it): set"
                    " adopt=True to manage the existing environment (a service stack:"
                    " `modal-llm:adoptEnvironment: true`; the access stack: `adopt: true` in"
                    f" its `environments` entry {name!r}; destroy then leaves it in place),"
                    f" delete it (`modal environment delete {name}`: everything in it goes"
                    " with it), or pick another name/suffix."
                )
            },
            idempotent=False,
            keyed=True,
            resumable=bool(owner),
        )
        return CreateResult(item.environment_id, self._outputs(props, item, adopted))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from modal import exception as mexc

        suffix = news.get("web_suffix")

        async def go(client: Any) -> Any:
            # By id: the live name of THIS environment (a same-named one recreated by hand has
            # another id and is never touched; an out-of-band rename is followed).
            item = await _rpc.environment_find(client, "environment_id", id_)
            if item is None:
                raise mexc.NotFoundError(f"environment {id_} not found")
            if suffix is not None and suffix != item.webhook_suffix:
                await _rpc.environment_set_suffix(client, item.name, str(suffix))
                item = await _rpc.environment_find(client, "environment_id", id_)
                if item is None:
                    raise mexc.NotFoundError(f"environment {id_} not found")
            return item

        item = self.run(
            "update",
            f"{self._target(news)} ({id_})",
            go,
            hints={
                mexc.AlreadyExistsError: (
                    "That web suffix is used by another environment: pick another."
                ),
                mexc.NotFoundError: (
                    f"Environment {id_} no longer exists (an environment of the same name made"
                    " by hand is a different one and was not touched). Run `pulumi refresh`"
                    " (drops it from the state), then `pulumi up`."
                ),
            },
        )
        return UpdateResult(self._outputs(news, item, EnvironmentArgs.from_props(olds).adopted))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        async def go(client: Any) -> Any:
            return await _rpc.environment_find(client, "environment_id", id_)

        item = self.run("read", f"{id_} ({self._target(props)})", go)
        if item is None:
            return ReadResult("", {})
        outs = self._outputs(props, item, EnvironmentArgs.from_props(props).adopted)
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from modal import exception as mexc

        recorded = EnvironmentArgs.from_props(props)
        name, force = str(recorded.name), recorded.force_delete
        if recorded.adopted:
            return  # released, not deleted: Pulumi adopted it, it did not create it
        stack = _rpc.stack_of(recorded.owner)

        async def go(client: Any) -> dict[str, list[str]]:
            item = await _rpc.environment_find(client, "environment_id", id_)
            if item is None:
                return {}
            if stack:
                await _remove_lost_creates(client, item.name, stack)
            if not force:
                remaining = {
                    "apps deployed": await _rpc.deployed_apps(client, item.name),
                    "secrets": [s.label for s in await _rpc.secret_list(client, item.name)],
                    "volumes": [n for n, _ in await _rpc.volume_list(client, item.name)],
                }
                remaining = {k: v for k, v in remaining.items() if v}
                if remaining:
                    return remaining
            with contextlib.suppress(mexc.NotFoundError):
                await _rpc.environment_delete(client, item.name)
            return {}

        blocking = self.run("delete", f"{self._target(props)} ({id_})", go)
        if blocking:
            what = "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in blocking.items())
            raise ModalProviderError(
                f"Environment '{name}' ({id_}): delete refused: it still holds {what}. Deleting"
                " an environment deletes everything in it, so this would also delete objects"
                " Pulumi retained (e.g. cache volumes kept by protectCaches) or never managed."
                f" Either keep the environment (stack config `modal-llm:protectCaches: true`"
                " retains it with its caches; or `pulumi state delete` this resource), or"
                f" remove what is listed first (`modal app stop <name> -e {name}`,"
                f" `modal volume delete <name> -e {name}`, `modal secret delete <name> -e"
                f" {name}`), or set force_delete=True to delete the environment with"
                " everything in it."
            )


#: Where an environment's pending record lives ("": the workspace's default environment; the
#: environment itself does not exist yet) and what it names.
PENDING_ENV = ""
PENDING_KIND = "environment"


async def _remove_lost_creates(client: Any, environment: str, stack: str) -> None:
    """Delete what this stack made in `environment` that no state records: the volumes its
    pending records name (made at or after the record), then every secret carrying this
    stack's mark (lost Secret creates and the pending records themselves)."""
    from .volume import PENDING_KIND as VOLUME

    secrets, pendings = await _rpc.stack_leftovers(client, environment, stack)
    for record in pendings:
        if record.kind != VOLUME:
            continue
        volume_id = await _rpc.volume_lookup(client, record.name, environment)
        resp = await _rpc.volume_get(client, volume_id) if volume_id else None
        if resp is not None and _rpc.pending_claims(
            record, VOLUME, record.name, float(resp.metadata.creation_info.created_at)
        ):
            await _rpc.volume_delete(client, str(volume_id))
    for _name, secret_id in secrets:
        await _rpc.secret_delete(client, secret_id)


class Environment(SchemaResource[EnvironmentArgs], module="modal", name="Environment"):
    """A Modal environment. Outputs: every field of `EnvironmentArgs` (`environment_id`,
    `web_suffix` as live, `adopted`, ...)."""

    PROVIDER = EnvironmentProvider


__all__ = ["Environment", "EnvironmentArgs", "EnvironmentProvider"]
