"""`Secret`: a named Modal Secret (a dict of environment variables) as a Pulumi resource.

- `values` is a Pulumi secret; it is stored in outputs only as a wire secret (encrypted in
  state). Plain outputs: `secret_id`, `key_names` (sorted), `values_digest` (HMAC-SHA256 of
  the canonical JSON of the values keyed with `values_salt`, a random per-resource salt also
  in outputs: a change detector that cannot be used to confirm guessed values offline).
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

import contextlib
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
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

from ._base import (
    IMPORT_HOWTO,
    ModalProvider,
    canonical_json,
    check_environment,
    check_name,
    environment_name,
    is_unknown,
    secret_output,
    sha256_hex,
)

TYPE_TOKEN = "pulumi-python:dynamic/modal:Secret"  # noqa: S105 (a Pulumi type token)
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


@dataclass
class SecretArgs:
    """Inputs of a `Secret`."""

    name: pulumi.Input[str]
    values: pulumi.Input[Mapping[str, pulumi.Input[str]]]
    environment: pulumi.Input[str]


class SecretProvider(ModalProvider):
    kind = "Secret"
    type_token = TYPE_TOKEN

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_name(news, "name", "Secret") + check_environment(news)
        values = news.get("values")
        if not is_unknown(values):
            if not isinstance(values, Mapping):
                failures.append(CheckFailure("values", "values must be a map of NAME → string"))
            else:
                for k, v in values.items():
                    if not _KEY_RE.match(str(k)):
                        failures.append(
                            CheckFailure(
                                "values",
                                f"key {k!r} is not a valid environment variable name"
                                " (letters, digits, underscore; not starting with a digit)",
                            )
                        )
                    elif not is_unknown(v) and not isinstance(v, str):
                        failures.append(CheckFailure("values", f"value of {k!r} must be a string"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [
            k
            for k in ("name", "environment")
            if is_unknown(news.get(k)) or olds.get(k) != news.get(k)
        ]
        values = news.get("values")
        salt = str(olds.get("values_salt") or "")
        values_changed = is_unknown(values) or values_digest(values or {}, salt) != olds.get(
            "values_digest"
        )
        changes = bool(replaces) or values_changed
        return DiffResult(changes=changes, replaces=replaces, delete_before_replace=False)

    def _target(self, props: Mapping[str, Any]) -> str:
        env = environment_name(props)
        return f"'{props.get('name')}' in environment '{env or '<default>'}'"

    def _outputs(
        self, props: Mapping[str, Any], secret_id: str, keys: list[str], digest: str, salt: str
    ) -> dict[str, Any]:
        return {
            "name": props.get("name"),
            "environment": props.get("environment"),
            "values": secret_output(dict(props.get("values") or {})),
            "secret_id": secret_id,
            "key_names": sorted(keys),
            "values_digest": digest,
            "values_salt": salt,
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        from modal_proto import api_pb2

        values = {k: str(v) for k, v in (props.get("values") or {}).items()}
        name = str(props["name"])
        env = environment_name(props)

        async def go(client: Any) -> str:
            resp = await client._stub.SecretGetOrCreate(
                api_pb2.SecretGetOrCreateRequest(
                    deployment_name=name,
                    environment_name=env,
                    object_creation_type=api_pb2.OBJECT_CREATION_TYPE_CREATE_FAIL_IF_EXISTS,
                    env_dict=values,
                )
            )
            return str(resp.secret_id)

        from modal import exception as mexc

        secret_id = self.run(
            "create",
            self._target(props),
            go,
            secrets=values.values(),
            hints={
                mexc.AlreadyExistsError: (
                    "A secret with this name already exists there and Pulumi does not manage it:"
                    f" adopt it with {IMPORT_HOWTO} (its st-id: `modal secret list`), delete"
                    " it, or choose another name."
                )
            },
            idempotent=False,
        )
        salt = new_salt()
        return CreateResult(
            secret_id,
            self._outputs(props, secret_id, list(values), values_digest(values, salt), salt),
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from modal import exception as mexc
        from modal_proto import api_pb2

        values = {k: str(v) for k, v in (news.get("values") or {}).items()}
        Update = api_pb2.SecretUpdateRequest.Update

        # By id: set every declared value, unset (no `value`: api.proto "If not set, the key
        # is removed") every live key not declared, so exactly `values` remain.
        async def go(client: Any) -> None:
            info = await client._stub.SecretGetInfo(api_pb2.SecretGetInfoRequest(secret_id=id_))
            removed = sorted(set(info.metadata.keys) - set(values))
            updates = [Update(key=k, value=v) for k, v in values.items()]
            updates += [Update(key=k) for k in removed]
            await client._stub.SecretUpdate(
                api_pb2.SecretUpdateRequest(secret_id=id_, updates=updates)
            )

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
        salt = str(olds.get("values_salt") or "") or new_salt()
        return UpdateResult(
            self._outputs(news, id_, list(values), values_digest(values, salt), salt)
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from modal import exception as mexc
        from modal_proto import api_pb2

        async def go(client: Any) -> Any:
            try:
                return await client._stub.SecretGetInfo(api_pb2.SecretGetInfoRequest(secret_id=id_))
            except mexc.NotFoundError:
                return None

        declared = {k: str(v) for k, v in (props.get("values") or {}).items()}
        info = self.run("read", f"{id_} ({self._target(props)})", go, secrets=declared.values())
        if info is None:
            return ReadResult("", {})
        md = info.metadata
        live_keys = sorted(md.keys)
        env = props.get("environment")
        if env is None or (env and md.environment_name and env != md.environment_name):
            env = md.environment_name
        name = md.name or props.get("name")
        live = {"name": name, "environment": env, "values": declared}
        salt = str(props.get("values_salt") or "") or new_salt()
        digest = values_digest(declared, salt) if live_keys == sorted(declared) else STALE_DIGEST
        outs = self._outputs(live, id_, live_keys, digest, salt)
        inputs: dict[str, Any] = {"name": name, "environment": env}
        if props.get("values") is not None:
            inputs["values"] = secret_output(declared)
        return ReadResult(id_, outs, inputs)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from modal import exception as mexc
        from modal_proto import api_pb2

        async def go(client: Any) -> None:
            with contextlib.suppress(mexc.NotFoundError):  # already gone: deleting is done
                await client._stub.SecretDelete(api_pb2.SecretDeleteRequest(secret_id=id_))

        self.run("delete", f"{id_} ({self._target(props)})", go)


class Secret(pulumi.dynamic.Resource, module="modal", name="Secret"):
    """A named Modal Secret. Outputs: `secret_id`, `key_names`, `values_digest`."""

    name: pulumi.Output[str]
    environment: pulumi.Output[str]
    values: pulumi.Output[dict[str, str]]
    secret_id: pulumi.Output[str]
    key_names: pulumi.Output[list[str]]
    values_digest: pulumi.Output[str]
    values_salt: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        args: SecretArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props: dict[str, Any] = {
            "name": args.name,
            "values": pulumi.Output.secret(args.values),
            "environment": args.environment,
            "secret_id": None,
            "key_names": None,
            "values_digest": None,
            "values_salt": None,
        }
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["values"])
        )
        super().__init__(SecretProvider(), resource_name, props, opts)


__all__ = ["Secret", "SecretArgs", "SecretProvider", "values_digest"]
