"""The one field declaration (`components/modal/_schema.py`), table-tested without Modal: what
a field declares is what props, check, diff, outputs and a refresh's inputs do with it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pytest
from pulumi.runtime import rpc
from pulumi.runtime.rpc import UNKNOWN

from components.api_keys import ApiKeyProvider
from components.modal._base import ModalProvider, partial_diff, text_view
from components.modal._schema import (
    Schema,
    computed,
    flag,
    output,
    owner,
    records,
    replaces,
    updates,
)
from components.modal.app import AppProvider
from components.modal.environment import EnvironmentProvider
from components.modal.environment_role import EnvironmentRoleProvider
from components.modal.model_weights import ModelWeightsProvider
from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from components.modal.secret import SecretProvider
from components.modal.service_user import ServiceUserProvider
from components.modal.spend_alert import SpendAlertProvider
from components.modal.volume import VolumeProvider

MARK = "0123456789ab_0123456789ab"


def _even(value: Any) -> list[str]:
    return [] if isinstance(value, int) and value % 2 == 0 else [f"size {value!r} is not even"]


class Sample(Schema):
    name: pulumi.Input[str] = replaces()
    size: pulumi.Input[int] = updates(default=2, check=_even)
    suffix: pulumi.Input[str] | None = updates(default=None, unset_keeps=True)
    label: pulumi.Input[str] = updates(default="", view=text_view("label"))
    note: pulumi.Input[str] = records(default="")
    days: pulumi.Input[int] | None = records(default=None, normalize=int)
    password: pulumi.Input[str] = records(secret=True)
    adopt: pulumi.Input[bool] = flag(default=False)
    owner: str = owner()
    thing_id: str = output()
    token: str = output(secret=True)


S = Sample.SCHEMA
OLD: dict[str, Any] = {
    "name": "a",
    "size": 2,
    "suffix": "x",
    "label": "",
    "note": "n",
    "days": None,
    "password": "p",
    "adopt": False,
}


# ---- diff: replace / update / record-only ----------------------------------------------------


@dataclass
class DiffCase:
    id: str
    news: dict[str, Any]
    changes: bool
    replaces: list[str] = field(default_factory=list)


DIFF_CASES = [
    DiffCase("same", {}, False),
    DiffCase("replace-field", {"name": "b"}, True, ["name"]),
    DiffCase("replace-field-unknown", {"name": UNKNOWN}, True, ["name"]),
    DiffCase("update-field", {"size": 4}, True),
    DiffCase("record-only-field", {"note": "other", "password": "q", "days": 3}, False),
    DiffCase("unset-keeps", {"suffix": None}, False),
    DiffCase("unset-keeps-set", {"suffix": "y"}, True),
    DiffCase("text-view-none-is-empty", {"label": None}, False),
    DiffCase("flag-none-is-false", {"adopt": None}, False),
    DiffCase("flag-set", {"adopt": True}, True),
    DiffCase("replace-and-update", {"name": "b", "size": 4}, True, ["name"]),
]


@pytest.mark.parametrize("case", DIFF_CASES, ids=lambda c: c.id)
def test_diff_follows_the_declared_role(case: DiffCase) -> None:
    d = partial_diff(OLD, {**OLD, **case.news}, S.diff)
    assert (d.changes, d.replaces, d.delete_before_replace) == (case.changes, case.replaces, False)


def test_diff_spec_lists_fields_by_role_in_declared_order() -> None:
    assert S.diff.replace_on == ("name",)
    assert S.diff.update_on == ("size", "suffix", "label", "adopt")
    assert S.diff.unset_keeps == ("suffix",)
    assert set(S.diff.views) == {"label", "adopt"}


# ---- check: validation -> CheckFailure on the field's property -------------------------------


@dataclass
class CheckCase:
    id: str
    news: dict[str, Any]
    failures: list[tuple[str, str]]
    checked: dict[str, Any] = field(default_factory=dict)


CHECK_CASES = [
    CheckCase("valid", {"name": "a", "size": 4, "password": "p"}, []),
    CheckCase(
        "field-check",
        {"name": "a", "size": 3, "password": "p"},
        [("size", "size 3 is not even")],
    ),
    CheckCase(
        "flag-not-bool",
        {"name": "a", "password": "p", "adopt": "yes"},
        [("adopt", "adopt must be true or false")],
    ),
    CheckCase(
        "owner-not-a-mark",
        {"name": "a", "password": "p", "owner": "me"},
        [
            (
                "owner",
                "owner 'me' is not a mark made by owner_mark() (12 hex, '_', 12 hex): leave it"
                " to the resource class",
            )
        ],
    ),
    CheckCase("owner-mark", {"name": "a", "password": "p", "owner": MARK}, []),
    CheckCase("unknown-is-checked-at-apply", {"name": "a", "password": "p", "size": UNKNOWN}, []),
    CheckCase(
        "null-takes-the-default",
        {"name": "a", "password": "p", "size": None, "label": None, "adopt": None},
        [],
        {"size": 2, "label": "", "adopt": False},
    ),
    CheckCase(
        "a-default-of-none-is-not-filled-in",
        {"name": "a", "password": "p"},
        [],
        {"suffix": "<absent>", "days": "<absent>"},
    ),
    CheckCase("normalized", {"name": "a", "password": "p", "days": 3.0}, [], {"days": 3}),
]


@pytest.mark.parametrize("case", CHECK_CASES, ids=lambda c: c.id)
def test_check_reports_each_problem_on_its_own_property(case: CheckCase) -> None:
    result = S.check(case.news)
    assert [(f.property, f.reason) for f in result.failures] == case.failures
    for key, want in case.checked.items():
        assert result.inputs.get(key, "<absent>") == want


def test_a_required_field_is_checked_when_null() -> None:
    class Required(Schema):
        size: pulumi.Input[int] = updates(check=_even)

    assert [f.property for f in Required.SCHEMA.check({}).failures] == ["size"]


# ---- outputs and a refresh's inputs ---------------------------------------------------------


def test_outputs_echo_inputs_and_wrap_secrets() -> None:
    props = {**OLD, "adopt": None, "label": None, "owner": MARK}
    outs = S.outputs(props, thing_id="t-1", token="tok")
    assert rpc.is_rpc_secret(outs["token"]) and rpc.unwrap_rpc_secret(outs["token"]) == "tok"
    assert rpc.is_rpc_secret(outs["password"]) and rpc.unwrap_rpc_secret(outs["password"]) == "p"
    assert (outs["adopt"], outs["label"], outs["owner"], outs["thing_id"]) == (
        False,
        "",
        MARK,
        "t-1",
    )
    assert set(outs) == {f.name for f in S.fields}


def test_a_secret_output_of_none_is_left_out_and_no_mark_is_none() -> None:
    outs = S.outputs({**OLD, "owner": "not-a-mark"}, thing_id="t-1", token=None)
    assert "token" not in outs and outs["owner"] is None


def test_outputs_name_every_output_and_nothing_else() -> None:
    with pytest.raises(TypeError, match=r"missing \['token'\]"):
        S.outputs(OLD, thing_id="t-1")
    with pytest.raises(TypeError, match=r"unknown \['thing'\]"):
        S.outputs(OLD, thing_id="t-1", token="x", thing=1)


def test_from_props_reads_each_field_as_declared() -> None:
    """Inputs as the outputs echo them (defaults for null, flags as bool, secrets unwrapped);
    outputs as their declared type (null: the type's empty value; a secret's stays None)."""
    state = {**OLD, "size": None, "adopt": None, "password": rpc.wrap_rpc_secret("p")}
    view = Sample.from_props({**state, "owner": MARK, "thing_id": None, "token": None})
    assert (view.name, view.size, view.adopt, view.password, view.owner) == (
        "a",
        2,
        False,
        "p",
        MARK,
    )
    assert (view.thing_id, view.token) == ("", None)
    view = Sample.from_props({**state, "thing_id": 7, "token": rpc.wrap_rpc_secret("tok")})
    assert (view.thing_id, view.token, view.owner) == ("7", "tok", None)


def test_outputs_carry_the_recorded_ones_over() -> None:
    recorded = {**OLD, "thing_id": "t-1", "token": rpc.wrap_rpc_secret("tok")}
    outs = S.outputs({**OLD, "name": "b"}, recorded)
    assert (outs["name"], outs["thing_id"], rpc.unwrap_rpc_secret(outs["token"])) == (
        "b",
        "t-1",
        "tok",
    )
    assert S.outputs(OLD, recorded, thing_id="t-2")["thing_id"] == "t-2"  # given wins
    assert "token" not in S.outputs(OLD, {}, thing_id="t-3")  # a secret never recorded
    g = Gated.SCHEMA  # a state written before an output existed: its declared default
    assert g.outputs({"spec": "s"}, {"other": "o"})["release"] == 0


def test_read_inputs() -> None:
    outs = S.outputs({**OLD, "suffix": "live"}, thing_id="t-1", token="x")
    # suffix (unset_keeps) and password (secret) were not set in the state: left out; a null
    # owner left out; outputs are no inputs.
    inputs = S.read_inputs(outs, {**OLD, "suffix": None, "password": None})
    assert set(inputs) == {"name", "size", "label", "note", "days", "adopt"}
    inputs = S.read_inputs({**outs, "owner": MARK}, {**OLD, "owner": MARK})
    assert inputs["suffix"] == "live" and inputs["owner"] == MARK
    assert rpc.is_rpc_secret(inputs["password"])


# ---- props and Args ---------------------------------------------------------------------------


def test_props_hold_every_field_with_secret_inputs_wrapped_and_the_owner_mark() -> None:
    args = Sample(name="a", password="p")
    # Under the SDK's test runner, which awaits what the program left outstanding: mocks set
    # and an Output made outside it stay in the SDK's outstanding work (`Output._track`) for
    # the next program to await on a loop of its own, and are destroyed unawaited.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    pulumi.runtime.set_mocks(_NoMocks(), project="p", stack="s", preview=False)
    props: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> Any:
        props.update(S.props(args, "pulumi-python:dynamic/x:Sample", "res"))
        return props["password"]

    program()
    assert loop.run_until_complete(props["password"].is_secret())
    assert loop.run_until_complete(props["password"].future()) == "p"
    assert isinstance(props["password"], pulumi.Output)
    assert props["owner"].count("_") == 1 and len(props["owner"]) == 25
    assert S.secret_outputs == ["password", "token"]


def test_args_are_keywords_and_outputs_no_arguments() -> None:
    with pytest.raises(TypeError):
        Sample("a", password="p")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Sample(name="a", password="p", thing_id="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="declare it with"):

        class Bare(Schema):
            name: str = "x"


def _both_or_neither(news: Mapping[str, Any]) -> list[tuple[str, str]]:
    if (news.get("user") is None) != (news.get("key") is None):
        return [("key", "user and key go together")]
    return []


class Gated(Schema):
    RULES = (_both_or_neither,)

    spec: pulumi.Input[str] = records()
    digest: pulumi.Input[str] | None = records(
        default=None, fill=lambda news: f"d({news['spec']})" if "spec" in news else None
    )
    user: pulumi.Input[str] | None = records(default=None, in_outputs=False)
    key: pulumi.Input[str] | None = records(default=None, secret=True, in_outputs=False)
    timeouts: dict[str, float] = computed(
        initial=lambda _tt, _rn, opts: {"create": 1.0} if opts is not None else {}
    )
    release: int = output(default=0)
    tag: str = output(default="")
    other: str = output()


def test_rules_fill_inputs_only_and_computed_fields() -> None:
    g = Gated.SCHEMA
    chk = g.check({"spec": "s", "user": "u"})
    assert [(f.property, f.reason) for f in chk.failures] == [("key", "user and key go together")]
    assert chk.inputs["digest"] == "d(s)"
    assert g.check({"spec": "s", "digest": "given"}).inputs["digest"] == "given"
    outs = g.outputs({"spec": "s", "user": "u", "key": "k"}, release=1, tag="t", other="o")
    assert "user" not in outs and "key" not in outs and outs["spec"] == "s"
    assert g.secret_outputs == []  # the secret input is no output
    with pytest.raises(TypeError, match=r"unknown \['user'\]"):
        g.outputs({}, release=1, tag="t", other="o", user="u")
    props = g.props(Gated(spec="s"), "t", "r", pulumi.ResourceOptions())
    assert props["timeouts"] == {"create": 1.0} and props["key"] is None  # None stays None
    assert g.props(Gated(spec="s"), "t", "r")["timeouts"] == {}
    assert g.diff.replace_on == () and g.diff.update_on == ()


class _NoMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return "id", {}

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], None]:
        return {}, None


# ---- the providers ---------------------------------------------------------------------------

SCHEMA_PROVIDERS: list[type[Any]] = [
    ApiKeyProvider,
    AppProvider,
    ModelWeightsProvider,
    EnvironmentProvider,
    EnvironmentRoleProvider,
    ProxyAuthTokenProvider,
    SecretProvider,
    ServiceUserProvider,
    SpendAlertProvider,
    VolumeProvider,
]


@pytest.mark.parametrize("cls", SCHEMA_PROVIDERS, ids=lambda c: c.__name__)
def test_providers_take_check_and_diff_from_their_schema(cls: type[Any]) -> None:
    assert "check" not in cls.__dict__ and "diff" not in cls.__dict__, cls.__name__
    if issubclass(cls, ModalProvider):
        assert cls.__dict__["DIFF"] is cls.SCHEMA.diff


# ---- what a recorded input's change does; groups of outputs ---------------------------------


class Released(Schema):
    source: pulumi.Input[str] = records(redeploys=True)
    gate: pulumi.Input[bool] = flag(default=False, noted=True)
    wait_s: pulumi.Input[float] = records(default=5.0, noted=lambda o, n: float(o) != float(n))
    token: pulumi.Input[str] | None = records(default=None)
    run_id: str = output()
    rows: int = output(group="run")
    size: int = output(group="run")


def test_redeploys_noted_and_groups_come_from_the_declaration() -> None:
    r = Released.SCHEMA
    assert r.redeploys == ("source",)
    assert r.group("run") == ("rows", "size") and r.group("other") == ()
    assert r.diff.update_on == () and r.diff.replace_on == ()
    old = {"source": "a", "gate": None, "wait_s": 5, "token": "t"}
    # Neither a redeploy input nor an uncompared one is noted; a noted one compares as declared.
    assert not r.noted_changed(old, {**old, "source": "b", "token": "u", "gate": False})
    assert r.noted_changed(old, {**old, "gate": True})
    assert not r.noted_changed(old, {**old, "wait_s": 5.0})
    assert r.noted_changed(old, {**old, "wait_s": 6})
    assert r.noted_changed(old, {**old, "wait_s": UNKNOWN})
