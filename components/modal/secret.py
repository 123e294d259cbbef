"""`Secret`: a named Modal Secret (a dict of environment variables) as a Pulumi resource.

- `values` is a Pulumi secret; it is stored in outputs only as a wire secret (encrypted in
  state). Plain outputs: `secret_id`, `key_names` (sorted) and `values_digest` (sha256 of the
  canonical JSON of the values, a change detector, not a plaintext).
- Changing values updates in place (`SecretUpdate`: changed keys set, removed keys unset), so
  the result holds exactly the new keys and the secret id is kept. Changing `name` or
  `environment` replaces (create-before-delete).
- Read (refresh/import, by id `st-...`): gone → removed from state; Modal never returns secret
  values, so refresh verifies key names: if the live keys differ from the declared ones, the
  digest is marked stale and the next `up` rewrites the secret. A value changed behind
  Pulumi's back with the same keys cannot be seen (document, do not pretend).
"""

from __future__ import annotations

import contextlib
import re
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
    ModalProvider,
    ModalProviderError,
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


def values_digest(values: Mapping[str, str]) -> str:
    """sha256 of the canonical JSON of the values (what `values_digest` holds)."""
    return sha256_hex(canonical_json(dict(values)))


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
        values_changed = is_unknown(values) or values_digest(values or {}) != olds.get(
            "values_digest"
        )
        changes = bool(replaces) or values_changed
        return DiffResult(changes=changes, replaces=replaces, delete_before_replace=False)

    def _target(self, props: Mapping[str, Any]) -> str:
        env = environment_name(props)
        return f"'{props.get('name')}' in environment '{env or '<default>'}'"

    def _outputs(
        self, props: Mapping[str, Any], secret_id: str, keys: list[str], digest: str
    ) -> dict[str, Any]:
        return {
            "name": props.get("name"),
            "environment": props.get("environment"),
            "values": secret_output(dict(props.get("values") or {})),
            "secret_id": secret_id,
            "key_names": sorted(keys),
            "values_digest": digest,
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
                    f" adopt it with `pulumi import {TYPE_TOKEN} <resource name> <st-id>` (see"
                    " `modal secret list`), delete it, or choose another name."
                )
            },
        )
        return CreateResult(
            secret_id, self._outputs(props, secret_id, list(values), values_digest(values))
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from modal_proto import api_pb2

        values = {k: str(v) for k, v in (news.get("values") or {}).items()}
        name, env = str(news["name"]), environment_name(news)

        # Overwrite (what `modal secret create --force` sends): the secret then holds exactly
        # `values`, removed keys included, and keeps its id. SecretUpdate would only merge.
        async def go(client: Any) -> str:
            resp = await client._stub.SecretGetOrCreate(
                api_pb2.SecretGetOrCreateRequest(
                    deployment_name=name,
                    environment_name=env,
                    object_creation_type=api_pb2.OBJECT_CREATION_TYPE_CREATE_OVERWRITE_IF_EXISTS,
                    env_dict=values,
                )
            )
            return str(resp.secret_id)

        got = self.run(
            "update values of", self._target(news) + f" ({id_})", go, secrets=values.values()
        )
        if got != id_:
            raise ModalProviderError(
                f"Secret {self._target(news)}: update wrote secret {got}, but Pulumi manages"
                f" {id_}: the secret was deleted or renamed outside Pulumi. Run `pulumi refresh`"
                " and then `pulumi up` again."
            )
        return UpdateResult(self._outputs(news, id_, list(values), values_digest(values)))

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
        digest = values_digest(declared) if live_keys == sorted(declared) else STALE_DIGEST
        outs = self._outputs(live, id_, live_keys, digest)
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
        }
        opts = pulumi.ResourceOptions.merge(
            opts, pulumi.ResourceOptions(additional_secret_outputs=["values"])
        )
        super().__init__(SecretProvider(), resource_name, props, opts)


__all__ = ["Secret", "SecretArgs", "SecretProvider", "values_digest"]
