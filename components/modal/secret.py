"""`Secret`: a named Modal Secret (a dict of environment variables) as a Pulumi resource.

- `values` is a Pulumi secret; it is stored in outputs only as a wire secret (encrypted in
  state). Plain outputs: `secret_id`, `key_names` (sorted), `values_digest` (HMAC-SHA256 of
  the canonical JSON of the values keyed with `values_salt`, a random per-resource salt that
  is itself a secret output: whoever reads the state without its key cannot test guesses of
  a low-entropy value against the digest).
- Create sends `SecretGetOrCreate(CREATE_FAIL_IF_EXISTS)` once per attempt with one
  idempotency key for all attempts (see `_rpc`); an "already exists" answered to a retry of a
  create that was sent before is the secret that create made. An existing secret of that
  name is refused unless `adopt=True`: then it is claimed (its values are set to the
  declared ones, by id), `adopted` is recorded, and destroy leaves it in place.
- Ownership mark (issue 32 item 10): the secret this resource creates also holds the key
  `MODAL_LLM_OWNER_<owner>` (value "1"; `owner` is the mark the program computes from the
  stack and the resource name, `_base.owner_mark`). Modal returns a secret's key names
  (`SecretGetInfo` metadata.keys), so a create that finds the name taken looks: carrying this
  resource's mark, it is the secret an earlier create made whose answer was lost (engine,
  emulator or network killed): taken as this resource's own (same id, values set to the
  declared ones, deleted on destroy). Without the mark it is a stranger's: refused as before.
  The mark key is never in `key_names`, the digest or a diff.
- Changing values updates in place, by id: `SecretUpdate(secret_id, updates)` sets every new
  value and unsets (an `Update` without `value`) every live key not declared, so the result
  holds exactly the new keys and keeps the id. A secret deleted outside Pulumi fails the
  update with NotFound (nothing is recreated behind the engine's back). Changing `name` or
  `environment` replaces (create-before-delete).
- Read (refresh/import, by id `st-...`): gone → removed from state; Modal never returns secret
  values, so refresh verifies key names: if the live keys differ from the declared ones, the
  digest is marked stale and the next `up` rewrites the secret. A value changed behind
  Pulumi's back with the same keys cannot be seen (document, do not pretend).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import (
    ADOPT_HOWTO,
    ModalProvider,
    canonical_json,
    environment_name,
    environment_problems,
    is_unknown,
    object_name,
    owner_of,
    sha256_hex,
)
from ._schema import Schema, SchemaResource, flag, output, owner, records, replaces

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STALE_DIGEST = "stale"


def values_digest(values: Mapping[str, str], salt: str = "") -> str:
    """What `values_digest` holds: HMAC-SHA256 (key `salt`) of the canonical values JSON.

    An empty salt gives the plain sha256 that states written before salting hold."""
    data = canonical_json(dict(values))
    if not salt:
        return sha256_hex(data)
    return hmac.new(salt.encode(), data.encode(), hashlib.sha256).hexdigest()


def new_salt() -> str:
    return secrets.token_hex(16)


def _values_problems(values: Any) -> list[str]:
    if not isinstance(values, Mapping):
        return ["values must be a map of NAME → string"]
    problems = []
    for k, v in values.items():
        if not _KEY_RE.match(str(k)):
            problems.append(
                f"key {k!r} is not a valid environment variable name (letters, digits,"
                " underscore; not starting with a digit)"
            )
        elif not is_unknown(v) and not isinstance(v, str):
            problems.append(f"value of {k!r} must be a string")
    return problems


class SecretArgs(Schema):
    """Inputs of a `Secret` (keywords), then what it outputs."""

    name: pulumi.Input[str] = replaces(check=object_name("Secret"))
    #: A Pulumi secret everywhere; a change is an update, found by `values_digest`.
    values: pulumi.Input[Mapping[str, pulumi.Input[str]]] = records(
        secret=True, check=_values_problems
    )
    environment: pulumi.Input[str] = replaces(check=environment_problems)
    adopt: pulumi.Input[bool] = flag(default=False)
    owner: str = owner()
    secret_id: str = output()
    key_names: list[str] = output()  # sorted, without ownership marks
    values_digest: str = output()  # HMAC-SHA256 of the values, keyed with values_salt
    values_salt: str = output(secret=True)
    adopted: bool = output()


def _values(props: Mapping[str, Any]) -> dict[str, str]:
    """The declared values, as the strings Modal holds."""
    return {str(k): str(v) for k, v in (props.get("values") or {}).items()}


def _with_mark(values: Mapping[str, str], owner: str) -> dict[str, str]:
    """What Modal holds: the declared values plus this resource's mark key (if it has one)."""
    return {**values, _rpc.owner_key(owner): "1"} if owner else dict(values)


def _declared_keys(keys: list[str]) -> list[str]:
    """Live key names without ownership marks."""
    marks = {_rpc.OWNER_KEY_PREFIX + o for o in _rpc.owners_in(keys)}
    return sorted(k for k in keys if k not in marks)


class SecretProvider(ModalProvider):
    SCHEMA = SecretArgs.SCHEMA

    def extra_changes(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        """The values changed: their digest (salted as recorded) differs from the state's."""
        values, recorded = news.get("values"), SecretArgs.from_props(olds)
        salt = recorded.values_salt or ""
        return is_unknown(values) or values_digest(values or {}, salt) != recorded.values_digest

    def _outputs(
        self,
        props: Mapping[str, Any],
        secret_id: str,
        salt: str,
        recorded: Mapping[str, Any] | None = None,
        live_keys: list[str] | None = None,
        **adopted: bool,
    ) -> dict[str, Any]:
        """The outputs of the declared values; `adopted` given (a create) or carried over
        from the state's outputs (`recorded`); `live_keys` (a refresh): the key names Modal
        holds, which make the digest stale when they are not the declared ones."""
        values = _values(props)
        keys = sorted(values) if live_keys is None else sorted(live_keys)
        return self.SCHEMA.outputs(
            props,
            recorded,
            secret_id=secret_id,
            key_names=keys,
            values_digest=values_digest(values, salt) if keys == sorted(values) else STALE_DIGEST,
            values_salt=salt,
            **adopted,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        from modal import exception as mexc

        args, values = SecretArgs.from_props(props), _values(props)
        name, env, adopt = str(args.name), environment_name(props), bool(args.adopt)
        owner = args.owner or ""
        marked = _with_mark(values, owner)
        memo: dict[str, Any] = {"key": _rpc.idempotency_key()}  # one key for every attempt

        async def go(client: Any) -> tuple[str, bool]:
            if adopt:
                existing = await _rpc.secret_lookup(client, name, env)
                if existing is not None:  # claim it: exactly the declared values, by id
                    if owner and await self._ours(client, existing, owner):
                        await _rpc.secret_set_values(client, existing, marked)
                        return existing, False  # our own lost create: deleted on destroy
                    await _rpc.secret_set_values(client, existing, values)
                    return existing, True
            try:
                secret_id = await _rpc.create_once(
                    memo,
                    lambda: _rpc.secret_create(client, name, env, marked, memo["key"]),
                    lambda: _rpc.secret_lookup(client, name, env),
                )
            except mexc.AlreadyExistsError:
                # An earlier create of THIS resource whose answer was lost (its mark says so)
                # is taken as our own; a stranger's secret is refused (the hint below).
                existing = await _rpc.secret_lookup(client, name, env) if owner else None
                if existing is None or not await self._ours(client, existing, owner):
                    raise
                await _rpc.secret_set_values(client, existing, marked)
                return existing, False
            return secret_id, False

        secret_id, adopted = self.run(
            "create",
            self._target(props),
            go,
            secrets=values.values(),
            hints={
                mexc.AlreadyExistsError: (
                    "A secret with this name already exists there and it is not this resource's"
                    f" (it carries no `{_rpc.OWNER_KEY_PREFIX}<owner>` key of this stack):"
                    f" {ADOPT_HOWTO} (its values are then set to the declared ones), delete it"
                    f" (`modal secret delete {name}"
                    + (f" -e {env}`)" if env else "`)")
                    + ", or choose another name."
                )
            },
            idempotent=False,
            keyed=True,
            resumable=bool(owner),
        )
        return CreateResult(secret_id, self._outputs(props, secret_id, new_salt(), adopted=adopted))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from modal import exception as mexc

        values, recorded = _values(news), SecretArgs.from_props(olds)
        salt = recorded.values_salt or new_salt()
        rewrite = values_digest(values, salt) != recorded.values_digest  # not just `adopt`

        owner = owner_of(news) if not recorded.adopted else ""
        marked = _with_mark(values, owner)

        async def go(client: Any) -> None:
            if rewrite:
                await _rpc.secret_set_values(client, id_, marked)

        self.run(
            "update values of",
            self._target(news) + f" ({id_})",
            go,
            secrets=values.values(),
            hints={
                mexc.NotFoundError: (
                    f"Secret {id_} was deleted outside Pulumi; nothing was written. Run"
                    " `pulumi refresh` (drops it from the state), then `pulumi up` creates it"
                    " again."
                )
            },
        )
        return UpdateResult(self._outputs(news, id_, salt, olds))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        async def go(client: Any) -> Any:
            return await _rpc.secret_info(client, id_)

        declared = _values(props)
        md = self.run("read", f"{id_} ({self._target(props)})", go, secrets=declared.values())
        if md is None:
            return ReadResult("", {})
        live_keys = _declared_keys(list(md.keys))
        env = props.get("environment")
        if env is None or (env and md.environment_name and env != md.environment_name):
            env = md.environment_name
        live = {
            **props,
            "name": md.name or props.get("name"),
            "environment": env,
            "values": declared,
        }
        salt = SecretArgs.from_props(props).values_salt or new_salt()
        outs = self._outputs(live, id_, salt, props, live_keys)
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    @staticmethod
    async def _ours(client: Any, secret_id: str, owner: str) -> bool:
        """The secret carries this resource's mark key."""
        md = await _rpc.secret_info(client, secret_id)
        return md is not None and _rpc.owner_key(owner) in list(md.keys)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        if props.get("adopted"):
            return  # released, not deleted: it existed before Pulumi adopted it

        async def go(client: Any) -> None:
            await _rpc.secret_delete(client, id_)  # already gone: deleting is done

        self.run("delete", f"{id_} ({self._target(props)})", go)


class Secret(SchemaResource[SecretArgs], module="modal", name="Secret"):
    """A named Modal Secret. Outputs: every field of `SecretArgs` (`secret_id`, `key_names`,
    `values_digest`; `values` and `values_salt` as secrets)."""

    PROVIDER = SecretProvider


__all__ = ["Secret", "SecretArgs", "SecretProvider", "values_digest"]
