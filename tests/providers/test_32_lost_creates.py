"""Issue 32 item 10: every create survives a lost answer, on the NEXT `up`.

A kill -9 of the engine (or the stand-in, the emulator, the network) after Modal applied a
create and before the state recorded it left an object the next `up` refused ("already
exists") and `make down` could not get past ("environment still holds secrets"). Here the
emulator applies each resource kind's create RPC and loses its answer (a fault armed "after"
the handler, dev/emulator/faults.py), with the provider allowed one attempt only: the create
fails, as the killed run did. Then a second create, what the next `up` sends, must take the
object as this resource's own (the same id where Modal can hand it over); an object of that
name made by someone else (the real `modal` client, no mark) is still refused; and a delete
leaves the emulator without anything of that kind (a second delete is no error).
ProxyAuthToken and ServiceUser cannot be handed over (their secret was lost with the answer):
the lost one is found and deleted, and a new one made. SpendAlert and EnvironmentRole set a
value: repeating them is the cure, and SpendAlert must still restore the budget it found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from components.modal._base import ModalProvider
from components.modal.environment import EnvironmentProvider
from components.modal.environment_role import EnvironmentRoleProvider
from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from components.modal.secret import SecretProvider
from components.modal.service_user import ServiceUserProvider
from components.modal.spend_alert import SpendAlertProvider
from components.modal.volume import VolumeProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import ProviderCallError, ProviderServer, Secret
from tests.providers.helpers import server_env

pytestmark = pytest.mark.slow

#: One attempt: the lost answer is not ridden out inside the call (as when the engine died).
ONE_SHOT = {"MODAL_PROVIDER_RETRY_ATTEMPTS": "1", "MODAL_PROVIDER_ATTEMPT_TIMEOUT": "10"}
#: Marks as `owner_mark` makes them (12 hex, "_", 12 hex): one stack, several resources.
STACK = "5a5a5a5a5a5a"
OWNER = f"{STACK}_0123456789ab"
OTHER_STACK_OWNER = "6b6b6b6b6b6b_0123456789ab"
VALUE = "lost-create-secret-value-0001"


@dataclass(frozen=True)
class Kind:
    name: str
    rpc: str
    provider: Callable[[], ModalProvider]
    props: dict[str, Any]
    #: What the emulator holds of this kind: {id: name} (the table, id and name columns).
    table: str
    id_col: str = "id"
    name_col: str = "name"
    #: Modal can hand the object over (no one-time secret lost with the answer).
    same_id: bool = True
    #: Make a stranger's object of that name with the real `modal` client (None: no names).
    stranger: Callable[[], None] | None = None
    secret_outputs: tuple[str, ...] = ()


def _stranger_secret() -> None:
    import modal

    modal.Secret.objects.create("keys", {"K": "theirs"}, environment_name="main")


def _stranger_volume() -> None:
    import modal

    modal.Volume.objects.create("cache", environment_name="main")


def _stranger_environment() -> None:
    from modal.environments import create_environment

    create_environment("dev")


def _stranger_service_user() -> None:
    import modal

    modal.Workspace.from_context().service_users.create("ci-bot", expires_in=None)


KINDS = [
    Kind(
        "Secret",
        "SecretGetOrCreate",
        SecretProvider,
        {"name": "keys", "environment": "main", "values": Secret({"K": VALUE}), "owner": OWNER},
        "secrets",
        stranger=_stranger_secret,
    ),
    Kind(
        "Volume",
        "VolumeGetOrCreate",
        VolumeProvider,
        {"name": "cache", "environment": "main", "owner": OWNER},
        "volumes",
        stranger=_stranger_volume,
    ),
    Kind(
        "Environment",
        "EnvironmentCreate",
        EnvironmentProvider,
        {"name": "dev", "owner": OWNER},
        "environments",
        stranger=_stranger_environment,
    ),
    Kind(
        "ProxyAuthToken",
        "WebhookTokenCreate",
        ProxyAuthTokenProvider,
        {"name": "gw", "environments": ["main"], "owner": OWNER},
        "proxy_tokens",
        same_id=False,
        secret_outputs=("token_secret",),
    ),
    Kind(
        "ServiceUser",
        "ServiceUserCreate",
        ServiceUserProvider,
        {"name": "ci-bot", "owner": OWNER},
        "service_users",
        same_id=False,
        stranger=_stranger_service_user,
        secret_outputs=("token_secret",),
    ),
    Kind(
        "SpendAlert",
        "EnvironmentSetBudget",
        SpendAlertProvider,
        {"environment": "main", "monthly_budget_usd": 10.0, "owner": OWNER},
        "",
    ),
    Kind(
        "EnvironmentRole",
        "EnvironmentRoleSet",
        EnvironmentRoleProvider,
        {"environment": "main", "service_user": "ci-bot", "role": "viewer", "owner": OWNER},
        "",
    ),
]


@pytest.fixture
def one_shot(emulator: EmulatorProcess) -> Iterator[ProviderServer]:
    with ProviderServer(env=server_env(emulator, **ONE_SHOT)) as srv:
        yield srv
    emulator._request("POST", "/_emulator/faults", {"clear": True})


def _lose_answer(emu: EmulatorProcess, rpc: str, count: int = 1) -> None:
    emu._request(
        "POST",
        "/_emulator/faults",
        {"method": rpc, "when": "after", "status": "UNAVAILABLE", "count": count},
    )


def _rows(emu: EmulatorProcess, kind: Kind) -> dict[str, str]:
    if kind.table == "service_users":  # asked of Modal (the real client), as an operator would
        import modal

        listed = modal.Workspace.from_context().service_users.list()
        return {u.service_user_id: u.name for u in listed}
    rows = emu.state().get(kind.table, [])
    return {str(r[kind.id_col]): str(r[kind.name_col]) for r in rows}


def _ours(emu: EmulatorProcess, kind: Kind) -> dict[str, str]:
    """Rows of the kind, without Modal's own (the default environment) and pending records."""
    rows = _rows(emu, kind)
    if kind.table == "environments":
        rows = {i: n for i, n in rows.items() if n != "main"}
    if kind.table == "secrets":
        rows = {i: n for i, n in rows.items() if not n.startswith("modal-llm-pending-")}
    return rows


@pytest.mark.parametrize("kind", [k for k in KINDS if k.table], ids=lambda k: k.name)
def test_32_10_lost_create_is_adopted_on_the_next_up(
    modal_env: EmulatorProcess,
    one_shot: ProviderServer,
    kind: Kind,
) -> None:
    srv, emulator = one_shot, modal_env
    _lose_answer(emulator, kind.rpc)
    with pytest.raises(ProviderCallError) as ei:
        srv.create(kind.provider(), kind.props, secret_outputs=kind.secret_outputs)
    assert f"{kind.name} " in ei.value.details, ei.value.details
    # What to do next: rerun, nothing by hand (not "check whether it exists, delete it").
    assert "takes it as its own; nothing to delete by hand" in ei.value.details, ei.value.details
    made = _ours(emulator, kind)
    assert len(made) == 1, made  # Modal applied it: the killed run's object
    (made_id,) = made

    # The next `up`: the same resource creates again.
    again = srv.create(kind.provider(), kind.props, secret_outputs=kind.secret_outputs)
    now = _ours(emulator, kind)
    assert len(now) == 1, f"{kind.name}: the lost create left an extra object: {now}"
    if kind.same_id:
        assert again.id == made_id or made_id in str(again.outputs), (again.id, made_id)
    assert not again.outputs.get("adopted"), "taken as our own, not adopted: destroy deletes it"
    assert not [s for s in _rows(emulator, KINDS[0]).values() if "pending" in s], "record left"
    if kind.name == "Secret":  # the declared values, and the mark is no declared key
        assert again.outputs["key_names"] == ["K"]

    # Delete (and a delete of something already gone) leaves nothing of this kind.
    srv.delete(kind.provider(), again.id, again.outputs)
    srv.delete(kind.provider(), again.id, again.outputs)
    assert _ours(emulator, kind) == {}
    assert not [s for s in _rows(emulator, KINDS[0]).values() if "pending" in s]

    # A stranger's object of that name (no mark) is still refused, with what to do.
    if kind.stranger is not None:
        kind.stranger()
        with pytest.raises(ProviderCallError) as ei:
            srv.create(kind.provider(), kind.props, secret_outputs=kind.secret_outputs)
        msg = ei.value.details
        assert "already exists" in msg and f"{kind.name} '{kind.props['name']}'" in msg, msg
        assert "delete" in msg, msg  # what to do: adopt it, or delete it by hand
        assert len(_ours(emulator, kind)) == 1  # theirs, untouched


def test_32_10_another_resource_of_the_stack_does_not_adopt(
    emulator: EmulatorProcess, one_shot: ProviderServer
) -> None:
    """The mark is per resource: a lost create of one resource is no other one's, in this
    stack or another."""
    kind = KINDS[0]
    _lose_answer(emulator, kind.rpc)
    with pytest.raises(ProviderCallError):
        one_shot.create(kind.provider(), kind.props)
    for owner in (f"{STACK}_ffffffffffff", OTHER_STACK_OWNER):  # same stack; another stack
        with pytest.raises(ProviderCallError) as ei:
            one_shot.create(kind.provider(), {**kind.props, "owner": owner})
        assert "already exists" in ei.value.details
        assert "it is not this resource's" in ei.value.details


@pytest.mark.parametrize("kind", [k for k in KINDS if not k.table], ids=lambda k: k.name)
def test_32_10_lost_set_is_repeated(
    emulator: EmulatorProcess, modal_env: EmulatorProcess, one_shot: ProviderServer, kind: Kind
) -> None:
    """SpendAlert and EnvironmentRole set a value: their create is repeatable as is."""
    if kind.name == "EnvironmentRole":
        _stranger_service_user()
    # modal's own quick retries repeat a set (it is sent retried): every answer is lost.
    _lose_answer(emulator, kind.rpc, count=10)
    with pytest.raises(ProviderCallError):
        one_shot.create(kind.provider(), kind.props)
    emulator._request("POST", "/_emulator/faults", {"clear": True})
    first = one_shot.create(kind.provider(), kind.props)  # the next `up`
    main = next(e for e in emulator.state()["environments"] if e["name"] == "main")
    assert first.id == (main["id"] if kind.name == "SpendAlert" else "main/ci-bot")
    again = first
    if kind.name == "SpendAlert":  # what was there before the lost create: no budget
        assert first.outputs.get("previous_budget_usd") is None, first.outputs
    one_shot.delete(kind.provider(), again.id, again.outputs)
    one_shot.delete(kind.provider(), again.id, again.outputs)
    if kind.name == "SpendAlert":  # destroy puts back what was there: no budget at all
        main = next(e for e in emulator.state()["environments"] if e["name"] == "main")
        assert main["budget_usd"] is None, main
        assert not [s for s in _rows(emulator, KINDS[0]).values() if "pending" in s]


def test_32_10_down_gets_past_a_lost_secret_and_volume(
    emulator: EmulatorProcess, one_shot: ProviderServer
) -> None:
    """`make down` after the kill: the environment's delete removes what THIS stack made in
    it that no state records (marked secrets, volumes its pending records name) and still
    refuses for anything else."""
    env = one_shot.create(EnvironmentProvider(), {"name": "dev", "owner": f"{STACK}_aaaaaaaaaaaa"})
    for kind in KINDS[:2]:
        _lose_answer(emulator, kind.rpc)
        with pytest.raises(ProviderCallError):
            one_shot.create(
                kind.provider(),
                {
                    **kind.props,
                    "environment": "dev",
                    "owner": f"{STACK}_bbbbbbbbbbb{len(kind.name) % 10}",
                },
            )
    state = emulator.state()
    assert [s["name"] for s in state["secrets"] if not s["name"].startswith("modal-llm-pending")]
    assert [v["name"] for v in state["volumes"]]
    one_shot.delete(EnvironmentProvider(), env.id, env.outputs)
    state = emulator.state()
    assert [e["name"] for e in state["environments"]] == ["main"]
    assert state["secrets"] == [] and state["volumes"] == []


def test_32_10_down_still_refuses_a_strangers_secret(
    emulator: EmulatorProcess, modal_env: EmulatorProcess, one_shot: ProviderServer
) -> None:
    import modal

    env = one_shot.create(EnvironmentProvider(), {"name": "dev", "owner": f"{STACK}_aaaaaaaaaaaa"})
    modal.Secret.objects.create("by-hand", {"K": "v"}, environment_name="dev")
    other = {**KINDS[0].props, "environment": "dev", "owner": OTHER_STACK_OWNER}
    one_shot.create(SecretProvider(), other)  # another stack's, recorded there
    with pytest.raises(ProviderCallError) as ei:
        one_shot.delete(EnvironmentProvider(), env.id, env.outputs)
    assert "secrets: by-hand, keys" in ei.value.details, ei.value.details
