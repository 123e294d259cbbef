"""`ProxyAuthToken`: a Modal proxy-auth token (`wk-...`) and the environments it may call.

- Outputs `token_id` and `token_secret`; the secret is only ever returned by Modal at creation
  and is a Pulumi secret output from that moment (wire secret + `additional_secret_outputs`).
- `name` and the `environments` allowlist update in place (`WebhookTokenUpdate`,
  `WebhookTokenEnvironmentAdd/Remove`).
- Changing `rotation` (any string, e.g. a date) replaces the token create-before-delete: the
  new token exists (and is allowed in every environment) before the old one is deleted, so a
  gateway that is updated in the same `up` always holds a valid token.
- Create is transactional: if allowing an environment fails (or the attempt is cancelled by
  its timeout), the new token is deleted again. `WebhookTokenCreate` is sent once per
  attempt with one idempotency key for all attempts (see `_rpc`), so a retry after "applied
  but answered UNAVAILABLE" gets the same token back from a server that honours the key;
  for one that does not, tokens of this name that appeared during this create and are not
  the one it returns are deleted (the token list is taken before the first attempt), so no
  orphaned credential is left behind. There is no `adopt`: Modal never returns a token's
  secret after its creation, so an existing token could not be used by a gateway.
- A create whose answer was lost in a run that then died (issue 32 item 10) left a token whose
  secret no one holds. A token has no tag (modal_proto 1.6.4 `WebhookTokenCreateRequest`:
  name, scoped) and names are not unique, so a *pending record* (a secret named after the
  `owner` mark in the workspace's default environment, `_rpc.pending_begin`) is written
  before `WebhookTokenCreate` and dropped once the create finished. The next create of this
  resource deletes every token of the recorded name created at or after the record (no clock
  margin: a live token of a rotation must never match), then mints its own (a new id: the
  lost one's secret cannot be recovered).
- Read (refresh/import by `wk-...`): missing (or deleted while being read) → gone; the
  allowlist is read whole from Modal (`WebhookTokenEnvironmentList(token_id)` → environment
  ids → names via `EnvironmentList`; where the server does not implement that RPC, every
  environment's token list is asked), so grants added outside Pulumi show as drift. An
  imported token has no `token_secret` (Modal never returns it again): rotate it to get one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import (
    ModalProvider,
    environment_problems,
    is_unknown,
    owner_of,
    rotation_problems,
    text_view,
)
from ._schema import Schema, SchemaResource, output, owner, replaces, updates


def _envs(props: Mapping[str, Any]) -> list[str]:
    return sorted({str(e) for e in (props.get("environments") or [])})


def _name_problems(name: Any) -> list[str]:
    if isinstance(name, str) and 0 < len(name) <= 64:
        return []
    return [f"token name {name!r} must be 1-64 characters"]


def _envs_problems(envs: Any) -> list[str]:
    if not isinstance(envs, list):
        return [f"environments {envs!r} must be a list of environment names"]
    return [problem for e in envs if not is_unknown(e) for problem in environment_problems(e)]


class ProxyAuthTokenArgs(Schema):
    """Inputs of a `ProxyAuthToken` (keywords), then what it outputs."""

    name: pulumi.Input[str] = updates(check=_name_problems)
    #: The environments it may call (order and repeats do not matter).
    environments: pulumi.Input[Sequence[pulumi.Input[str]]] = updates(
        default_factory=list, view=_envs, check=_envs_problems
    )
    #: Any string (e.g. a date): a change replaces the token, create-before-delete.
    rotation: pulumi.Input[str] = replaces(
        default="", view=text_view("rotation"), check=rotation_problems
    )
    owner: str = owner()
    token_id: str = output()
    token_secret: str = output(secret=True)  # left out when unknown (an imported token)
    allowed_environments: list[str] = output()


class ProxyAuthTokenProvider(ModalProvider):
    SCHEMA = ProxyAuthTokenArgs.SCHEMA

    @classmethod
    def _outputs(
        cls, props: Mapping[str, Any], token_id: str, token_secret: str | None, envs: list[str]
    ) -> dict[str, Any]:
        return cls.SCHEMA.outputs(
            props,
            token_id=token_id,
            token_secret=token_secret or None,
            allowed_environments=envs,
        )

    @staticmethod
    async def _allow(client: Any, token_id: str, envs: list[str], allowed: bool = True) -> None:
        """Allow the token in each of `envs` (`allowed=False`: revoke it there)."""
        for env in envs:
            await _rpc.token_allow(client, token_id, env, allowed)

    def create(self, props: dict[str, Any]) -> CreateResult:
        name = str(props["name"])
        envs = _envs(props)
        created: dict[str, str] = {}
        memo: dict[str, Any] = {"key": _rpc.idempotency_key()}  # one key for every attempt
        owner = owner_of(props)

        async def go(client: Any) -> tuple[str, str]:
            if owner and "swept" not in memo:
                await _sweep_lost(client, owner)
                await _rpc.pending_begin(client, owner, PENDING_ENV, PENDING_KIND, name)
                memo["swept"] = True
            if "before" not in memo:  # tokens of this name that are not this create's
                memo["before"] = {t.token_id for t in await _rpc.token_list(client)}
            if "token_id" not in created:
                memo["sent"] = memo.get("sent", 0) + 1
                created["token_id"], created["token_secret"] = await _rpc.token_create(
                    client, name, memo["key"]
                )
            try:
                await self._allow(client, created["token_id"], envs)
            except BaseException:  # also a cancelled (timed-out) attempt: no orphan token
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(_rpc.token_delete(client, created["token_id"]), 10)
                created.clear()
                memo["key"] = _rpc.idempotency_key()  # the next attempt mints afresh
                raise
            if memo["sent"] > 1:  # an earlier attempt may have minted a token we never saw
                for token in await _rpc.token_list(client):
                    if (
                        token.name == name
                        and token.token_id not in memo["before"]
                        and token.token_id != created["token_id"]
                    ):
                        await _rpc.token_delete(client, token.token_id)
            await _rpc.pending_end(client, owner, PENDING_ENV)
            return created["token_id"], created["token_secret"]

        token_id, token_secret = self.run(
            "create",
            f"'{name}' (allowed in {envs})",
            go,
            secrets=lambda: list(created.values()),  # read when an error is built
            idempotent=False,
            keyed=True,
            resumable=bool(owner),
        )
        return CreateResult(token_id, self._outputs(props, token_id, token_secret, envs))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        name = str(news["name"])
        old_envs, new_envs = set(_envs(olds)), set(_envs(news))

        async def go(client: Any) -> None:
            if name != olds.get("name"):
                await _rpc.token_rename(client, id_, name)
            await self._allow(client, id_, sorted(new_envs - old_envs))
            await self._allow(client, id_, sorted(old_envs - new_envs), allowed=False)

        old_secret = ProxyAuthTokenArgs.from_props(olds).token_secret
        self.run("update", f"'{name}' ({id_})", go, secrets=[str(old_secret or "")])
        return UpdateResult(self._outputs(news, id_, old_secret, sorted(new_envs)))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from grpclib import GRPCError, Status
        from modal import exception as mexc

        async def go(client: Any) -> tuple[Any, list[str]]:
            token = next((t for t in await _rpc.token_list(client) if t.token_id == id_), None)
            if token is None:
                return None, []
            envs = await _rpc.environment_list(client)
            try:
                ids = set(await _rpc.token_environment_ids(client, id_))
                return token, sorted(e.name for e in envs if e.environment_id in ids)
            except mexc.NotFoundError:
                return None, []  # deleted since WebhookTokenList listed it: gone
            except (mexc.UnimplementedError, GRPCError) as e:
                if isinstance(e, GRPCError) and e.status != Status.UNIMPLEMENTED:
                    raise
            allowed = []  # older servers: ask every environment for its tokens
            for env in envs:
                try:
                    listed = await _rpc.tokens_of_environment(client, env.name)
                except mexc.NotFoundError:
                    continue  # deleted meanwhile
                if id_ in listed:
                    allowed.append(env.name)
            return token, sorted(allowed)

        secret = ProxyAuthTokenArgs.from_props(props).token_secret
        token, allowed = self.run(
            "read", f"{id_} ('{props.get('name')}')", go, secrets=[str(secret or "")]
        )
        if token is None:
            return ReadResult("", {})
        live = {**props, "name": token.name, "environments": allowed}
        outs = self._outputs(live, id_, secret, allowed)  # the owner mark: kept as recorded
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        owner = owner_of(props)

        async def go(client: Any) -> None:
            await _rpc.token_delete(client, id_)  # already gone: done
            if owner:  # and what an interrupted create of this resource left
                await _sweep_lost(client, owner)
                await _rpc.pending_end(client, owner, PENDING_ENV)

        self.run("delete", f"{id_} ('{props.get('name')}')", go)


#: Where a token's pending record lives (tokens are workspace-level: the default
#: environment) and what it names.
PENDING_ENV = ""
PENDING_KIND = "token"


async def _sweep_lost(client: Any, owner: str) -> None:
    """Delete the tokens an interrupted create of this resource made: named as its pending
    record says, created at or after it (`WebhookToken.created_at`)."""
    pending = await _rpc.pending_get(client, owner, PENDING_ENV)
    if pending is None:
        return
    for token in await _rpc.token_list(client):
        if _rpc.pending_claims(
            pending, PENDING_KIND, str(token.name), float(token.created_at), margin=0.0
        ):
            await _rpc.token_delete(client, token.token_id)


class ProxyAuthToken(SchemaResource[ProxyAuthTokenArgs], module="modal", name="ProxyAuthToken"):
    """A Modal proxy-auth token. Outputs: every field of `ProxyAuthTokenArgs` (`token_id`,
    `token_secret` as a secret, ...)."""

    PROVIDER = ProxyAuthTokenProvider


__all__ = ["ProxyAuthToken", "ProxyAuthTokenArgs", "ProxyAuthTokenProvider"]
