"""The one declarative diff (`_base.partial_diff` over each provider's `DIFF`), unit-tested, and
every provider's diff pinned by a table: what replaces, what updates, what is no change."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pytest
from pulumi.output import Unknown
from pulumi.runtime.rpc import UNKNOWN

from components.modal._base import (
    DiffSpec,
    ModalProvider,
    flag_view,
    json_view,
    partial_diff,
    plain_view,
    secret_output,
    text_view,
)
from components.modal._source import source_digest
from components.modal.app import AppProvider, spec_digest
from components.modal.environment import EnvironmentProvider
from components.modal.environment_role import EnvironmentRoleProvider
from components.modal.model_weights import ModelWeightsProvider
from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from components.modal.secret import SecretProvider, values_digest
from components.modal.service_user import ServiceUserProvider
from components.modal.spend_alert import DEFAULT_THRESHOLDS, SpendAlertProvider
from components.modal.volume import VolumeProvider
from tests.harness.emulator import PROJECT_ROOT

# ---- partial_diff itself ---------------------------------------------------------------------

SPEC = DiffSpec(
    replace_on=("b", "a"),
    update_on=("u", "flag", "names", "opt"),
    views={"flag": flag_view("flag"), "names": lambda p: sorted(p.get("names") or [])},
    unset_keeps=("opt",),
)
OLD: dict[str, Any] = {"a": 1, "b": 2, "u": "x", "flag": False, "names": ["p", "q"], "opt": "o"}


def result(olds: Mapping[str, Any], news: Mapping[str, Any]) -> tuple[bool, list[str], bool]:
    d = partial_diff(olds, news, SPEC)
    return bool(d.changes), list(d.replaces or []), bool(d.delete_before_replace)


def test_no_change() -> None:
    assert result(OLD, dict(OLD)) == (False, [], False)


def test_replace_key_changed() -> None:
    assert result(OLD, {**OLD, "a": 9}) == (True, ["a"], False)


def test_replaces_in_declared_order() -> None:
    assert result(OLD, {**OLD, "a": 9, "b": 9}) == (True, ["b", "a"], False)


def test_update_key_changed() -> None:
    assert result(OLD, {**OLD, "u": "y"}) == (True, [], False)
    news = dict(OLD)
    del news["u"]  # absent counts as None: a change from "x"
    assert result(OLD, news) == (True, [], False)


@pytest.mark.parametrize("unknown", [UNKNOWN, Unknown(), [UNKNOWN], {"k": UNKNOWN}])
@pytest.mark.parametrize("key", ["a", "u", "flag", "names", "opt"])
def test_unknown_always_counts_as_a_change(key: str, unknown: Any) -> None:
    """Whatever the view (a flag would read an unknown as True, a sorted list would fail) and
    even for a key that an unset value leaves alone."""
    expected = (True, ["a"] if key == "a" else [], False)
    assert result(OLD, {**OLD, key: unknown}) == expected


def test_views_normalise_before_comparing() -> None:
    assert result(OLD, {**OLD, "flag": None}) == (False, [], False)
    assert result({**OLD, "flag": None}, {k: v for k, v in OLD.items() if k != "flag"}) == (
        False,
        [],
        False,
    )
    assert result(OLD, {**OLD, "flag": True}) == (True, [], False)
    assert result(OLD, {**OLD, "names": ["q", "p"]}) == (False, [], False)
    assert result(OLD, {**OLD, "names": ["q"]}) == (True, [], False)


def test_unset_keeps_only_an_absent_new_value() -> None:
    assert result(OLD, {**OLD, "opt": None}) == (False, [], False)
    assert result(OLD, {**OLD, "opt": ""}) == (True, [], False)
    assert result({**OLD, "opt": None}, {**OLD, "opt": "o"}) == (True, [], False)


def test_view_helpers() -> None:
    secret = secret_output(10)
    assert plain_view("v")({"v": secret}) == 10
    assert text_view("v")({"v": None}) == text_view("v")({}) == ""
    assert flag_view("v")({}) is False
    assert json_view("v")({"v": {"b": 1, "a": 2}}) == json_view("v")({"v": {"a": 2, "b": 1}})


def test_spec_rejects_undeclared_or_twice_declared_keys() -> None:
    with pytest.raises(ValueError, match="neither"):
        DiffSpec(replace_on=("a",), views={"b": flag_view("b")})
    with pytest.raises(ValueError, match="neither"):
        DiffSpec(update_on=("a",), unset_keeps=("c",))
    with pytest.raises(ValueError, match="twice"):
        DiffSpec(replace_on=("a",), update_on=("a",))


class _Counting(ModalProvider):
    DIFF = DiffSpec(replace_on=("name",), update_on=("size",))

    def __init__(self, extra: bool) -> None:
        self.extra, self.asked = extra, 0

    def extra_changes(self, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
        self.asked += 1
        return self.extra


def test_default_diff_asks_extra_changes_only_when_nothing_declared_changed() -> None:
    p = _Counting(extra=True)
    d = p.diff("id", {"name": "n", "size": 1}, {"name": "m", "size": 1})
    assert (d.changes, d.replaces, p.asked) == (True, ["name"], 0)
    d = p.diff("id", {"name": "n", "size": 1}, {"name": "n", "size": 1})
    assert (d.changes, d.replaces, d.delete_before_replace, p.asked) == (True, [], False, 1)
    q = _Counting(extra=False)
    d = q.diff("id", {"name": "n", "size": 1}, {"name": "n", "size": 1})
    assert (d.changes, d.replaces, q.asked) == (False, [], 1)


def test_a_provider_without_diff_spec_says_so() -> None:
    class Bare(ModalProvider):
        pass

    with pytest.raises(NotImplementedError, match="DIFF"):
        Bare().diff("id", {}, {})


PROVIDERS: list[type[ModalProvider]] = [
    AppProvider,
    EnvironmentProvider,
    EnvironmentRoleProvider,
    ModelWeightsProvider,
    ProxyAuthTokenProvider,
    SecretProvider,
    ServiceUserProvider,
    SpendAlertProvider,
    VolumeProvider,
]


def test_every_provider_declares_its_diff() -> None:
    for cls in PROVIDERS:
        assert isinstance(cls.__dict__.get("DIFF"), DiffSpec), cls.__name__
        assert "diff" not in cls.__dict__, f"{cls.__name__} hand-writes diff"


# ---- every provider: a table of olds -> news -------------------------------------------------

APP_FILE = str(PROJECT_ROOT / "tests/providers/apps/echo_app.py")
APP_SPEC = '{"model": "m"}'
WEIGHTS_APP = str(PROJECT_ROOT / "serving/weights_app.py")
SALT = "s" * 32
VALUES = {"K": "v"}


def app_old() -> dict[str, Any]:
    return {
        "name": "echo",
        "environment": "main",
        "app_file": APP_FILE,
        "spec_json": APP_SPEC,
        "spec_digest": spec_digest(APP_SPEC),
        "extra_env": {},
        "source_digest": source_digest(APP_FILE, spec_json=APP_SPEC),
        "adopt": False,
        "health_gate": False,
        "health_gate_timeout_s": 300.0,
        "app_id": "ap-1",
    }


def app_new(**kw: Any) -> dict[str, Any]:
    new = app_old()
    for k in ("source_digest", "app_id"):
        del new[k]
    return {**new, **kw}


def weights_old() -> dict[str, Any]:
    return {
        "environment": "main",
        "app_name": "weights",
        "volume": "hf",
        "source": {"kind": "hf", "repo": "org/m", "revision": "r1"},
        "secrets": [],
        "app_file": WEIGHTS_APP,
        "source_digest": source_digest(WEIGHTS_APP),
    }


def weights_new(**kw: Any) -> dict[str, Any]:
    new = weights_old()
    del new["source_digest"]
    return {**new, **kw}


SECRET_OLD: dict[str, Any] = {
    "name": "keys",
    "environment": "main",
    "values": secret_output(VALUES),
    "adopt": False,
    "values_digest": values_digest(VALUES, SALT),
    "values_salt": secret_output(SALT),
}
SECRET_NEW: dict[str, Any] = {"name": "keys", "environment": "main", "values": VALUES}
VOLUME: dict[str, Any] = {"name": "hf", "environment": "main", "adopt": False}
ENV: dict[str, Any] = {"name": "dev", "web_suffix": "dev-x", "adopt": False, "force_delete": False}
ROLE: dict[str, Any] = {
    "environment": "dev",
    "service_user": "ci",
    "role": "viewer",
    "service_users": [],
}
TOKEN: dict[str, Any] = {"name": "proxy", "environments": ["b", "a"], "rotation": ""}
ALERT: dict[str, Any] = {
    "environment": "dev",
    "monthly_budget_usd": 100.0,
    "thresholds": list(DEFAULT_THRESHOLDS),
}
USER: dict[str, Any] = {"name": "ci", "rotation": "", "expires_in_days": 30}
USER_ROTATING: dict[str, Any] = {
    **USER,
    "current_name": "ci-1",
    "previous_name": "ci",
    "token_id": "ak-2",
    "previous_token_id": "ak-1",
    "created_at": 100.0,
}


@dataclass
class Case:
    id: str
    provider: type[ModalProvider]
    olds: Mapping[str, Any]
    news: Mapping[str, Any]
    changes: bool
    replaces: list[str] = field(default_factory=list)


CASES = [
    # App: name/environment replace; spec, source, app file, extra env, RECORD_ONLY update.
    Case("app-same", AppProvider, app_old(), app_new(), False),
    Case("app-name", AppProvider, app_old(), app_new(name="echo2"), True, ["name"]),
    Case(
        "app-both",
        AppProvider,
        app_old(),
        app_new(name=UNKNOWN, environment="dev"),
        True,
        ["name", "environment"],
    ),
    Case(
        "app-spec",
        AppProvider,
        app_old(),
        app_new(spec_json='{"model": "n"}', spec_digest=None),
        True,
    ),
    Case("app-spec-unknown", AppProvider, app_old(), app_new(spec_json=UNKNOWN), True),
    Case("app-extra-env", AppProvider, app_old(), app_new(extra_env={"A": "1"}), True),
    Case("app-missing-file", AppProvider, app_old(), app_new(app_file="/nonexistent.py"), True),
    Case("app-adopt-none", AppProvider, app_old(), app_new(adopt=None), False),
    Case("app-gate", AppProvider, app_old(), app_new(health_gate=True), True),
    Case("app-timeout-unset", AppProvider, app_old(), app_new(health_gate_timeout_s=None), False),
    Case("app-timeout", AppProvider, app_old(), app_new(health_gate_timeout_s=600), True),
    Case("app-timeout-int", AppProvider, app_old(), app_new(health_gate_timeout_s=300), False),
    # Environment: name replaces; an unset web_suffix keeps the current one; flags.
    Case("env-same", EnvironmentProvider, ENV, {"name": "dev"}, False),
    Case("env-name", EnvironmentProvider, ENV, {**ENV, "name": "dev2"}, True, ["name"]),
    Case("env-suffix", EnvironmentProvider, ENV, {**ENV, "web_suffix": "dev-y"}, True),
    Case("env-suffix-unknown", EnvironmentProvider, ENV, {**ENV, "web_suffix": UNKNOWN}, True),
    Case(
        "env-suffix-new",
        EnvironmentProvider,
        {**ENV, "web_suffix": None},
        {**ENV, "web_suffix": "x"},
        True,
    ),
    Case("env-force", EnvironmentProvider, ENV, {**ENV, "force_delete": True}, True),
    Case("env-adopt-unknown", EnvironmentProvider, ENV, {**ENV, "adopt": UNKNOWN}, True),
    # EnvironmentRole: environment/service_user replace; role and holders update.
    Case("role-same", EnvironmentRoleProvider, ROLE, {**ROLE, "service_users": ["ci"]}, False),
    Case(
        "role-dupes",
        EnvironmentRoleProvider,
        {**ROLE, "service_users": ["ci", "ci-0"]},
        {**ROLE, "service_users": ["ci", "ci", "ci-0"]},
        False,
    ),
    Case(
        "role-order",
        EnvironmentRoleProvider,
        {**ROLE, "service_users": ["ci", "ci-0"]},
        {**ROLE, "service_users": ["ci-0", "ci"]},
        True,
    ),
    Case("role-role", EnvironmentRoleProvider, ROLE, {**ROLE, "role": "contributor"}, True),
    Case(
        "role-users-unknown",
        EnvironmentRoleProvider,
        ROLE,
        {**ROLE, "service_users": [UNKNOWN]},
        True,
    ),
    Case(
        "role-both",
        EnvironmentRoleProvider,
        ROLE,
        {**ROLE, "environment": "prod", "service_user": "ci2"},
        True,
        ["environment", "service_user"],
    ),
    # ModelWeights: environment replaces; inputs (as JSON) and the app's source digest update.
    Case("weights-same", ModelWeightsProvider, weights_old(), weights_new(), False),
    Case(
        "weights-source-key-order",
        ModelWeightsProvider,
        weights_old(),
        weights_new(source={"revision": "r1", "repo": "org/m", "kind": "hf"}),
        False,
    ),
    Case(
        "weights-revision",
        ModelWeightsProvider,
        weights_old(),
        weights_new(source={"kind": "hf", "repo": "org/m", "revision": "r2"}),
        True,
    ),
    Case(
        "weights-env",
        ModelWeightsProvider,
        weights_old(),
        weights_new(environment="dev"),
        True,
        ["environment"],
    ),
    Case(
        "weights-digest",
        ModelWeightsProvider,
        {**weights_old(), "source_digest": "0" * 64},
        weights_new(),
        True,
    ),
    Case(
        "weights-missing-file",
        ModelWeightsProvider,
        {**weights_old(), "app_file": "/nonexistent.py"},
        weights_new(app_file="/nonexistent.py"),
        True,
    ),
    Case(
        "weights-unknown", ModelWeightsProvider, weights_old(), weights_new(secrets=UNKNOWN), True
    ),
    # ProxyAuthToken: a rotation replaces (None = ""); name and environments (as a set) update.
    Case("token-same", ProxyAuthTokenProvider, TOKEN, {**TOKEN, "environments": ["a", "b"]}, False),
    Case("token-rotation-none", ProxyAuthTokenProvider, TOKEN, {**TOKEN, "rotation": None}, False),
    Case(
        "token-rotation",
        ProxyAuthTokenProvider,
        TOKEN,
        {**TOKEN, "rotation": "2026-01"},
        True,
        ["rotation"],
    ),
    Case(
        "token-rotation-unknown",
        ProxyAuthTokenProvider,
        TOKEN,
        {**TOKEN, "rotation": UNKNOWN},
        True,
        ["rotation"],
    ),
    Case("token-name", ProxyAuthTokenProvider, TOKEN, {**TOKEN, "name": "proxy2"}, True),
    Case("token-envs", ProxyAuthTokenProvider, TOKEN, {**TOKEN, "environments": ["a"]}, True),
    # Secret: name/environment replace; the values (by salted digest) and adopt update.
    Case("secret-same", SecretProvider, SECRET_OLD, SECRET_NEW, False),
    Case("secret-adopt-false", SecretProvider, SECRET_OLD, {**SECRET_NEW, "adopt": False}, False),
    Case("secret-adopt", SecretProvider, SECRET_OLD, {**SECRET_NEW, "adopt": True}, True),
    Case("secret-values", SecretProvider, SECRET_OLD, {**SECRET_NEW, "values": {"K": "w"}}, True),
    Case(
        "secret-values-unknown", SecretProvider, SECRET_OLD, {**SECRET_NEW, "values": UNKNOWN}, True
    ),
    Case(
        "secret-env",
        SecretProvider,
        SECRET_OLD,
        {**SECRET_NEW, "environment": "dev", "name": UNKNOWN},
        True,
        ["name", "environment"],
    ),
    # ServiceUser: name replaces; rotation/expiry rotate; a used new token retires the old one.
    Case("user-same", ServiceUserProvider, USER, {**USER, "rotation": None}, False),
    Case("user-name", ServiceUserProvider, USER, {**USER, "name": "ci2"}, True, ["name"]),
    Case("user-rotation", ServiceUserProvider, USER, {**USER, "rotation": "r2"}, True),
    Case("user-expiry", ServiceUserProvider, USER, {**USER, "expires_in_days": 60}, True),
    Case("user-expiry-float", ServiceUserProvider, USER, {**USER, "expires_in_days": 30.0}, False),
    Case("user-previous-unused", ServiceUserProvider, USER_ROTATING, USER, False),
    Case(
        "user-previous-used",
        ServiceUserProvider,
        {**USER_ROTATING, "last_used_at": 200.0},
        USER,
        True,
    ),
    # SpendAlert: environment replaces; the budget (secret or not) and thresholds update.
    Case(
        "alert-same",
        SpendAlertProvider,
        ALERT,
        {**ALERT, "monthly_budget_usd": secret_output(100.0), "thresholds": None},
        False,
    ),
    Case(
        "alert-thresholds-order",
        SpendAlertProvider,
        {**ALERT, "thresholds": [0.5, 1.0]},
        {**ALERT, "thresholds": [1.0, 0.5]},
        False,
    ),
    Case("alert-budget", SpendAlertProvider, ALERT, {**ALERT, "monthly_budget_usd": 50.0}, True),
    Case(
        "alert-budget-unknown",
        SpendAlertProvider,
        ALERT,
        {**ALERT, "monthly_budget_usd": secret_output(UNKNOWN)},
        True,
    ),
    Case("alert-thresholds", SpendAlertProvider, ALERT, {**ALERT, "thresholds": [0.9]}, True),
    Case(
        "alert-env",
        SpendAlertProvider,
        ALERT,
        {**ALERT, "environment": "prod"},
        True,
        ["environment"],
    ),
    # Volume: environment replaces; a rename and adopt update.
    Case("volume-same", VolumeProvider, VOLUME, {"name": "hf", "environment": "main"}, False),
    Case("volume-rename", VolumeProvider, VOLUME, {**VOLUME, "name": "hf2"}, True),
    Case("volume-adopt", VolumeProvider, VOLUME, {**VOLUME, "adopt": True}, True),
    Case(
        "volume-env",
        VolumeProvider,
        VOLUME,
        {**VOLUME, "environment": UNKNOWN},
        True,
        ["environment"],
    ),
]


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    messages: list[str] = []
    monkeypatch.setattr(pulumi.log, "info", lambda msg, *a, **k: messages.append(msg))
    yield messages


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_provider_diff_table(case: Case, logged: list[str]) -> None:
    d = case.provider().diff("id", dict(case.olds), dict(case.news))
    assert (d.changes, list(d.replaces or []), d.delete_before_replace) == (
        case.changes,
        case.replaces,
        False,
    )


def test_every_provider_is_in_the_table() -> None:
    assert {c.provider for c in CASES} == set(PROVIDERS)


def test_service_user_diff_still_says_what_happens_to_the_previous_one(logged: list[str]) -> None:
    p = ServiceUserProvider()
    assert not p.diff("ci", dict(USER_ROTATING), dict(USER)).changes
    assert len(logged) == 1 and "previous service user ci kept" in logged[0]
    assert p.diff("ci", {**USER_ROTATING, "last_used_at": 200.0}, dict(USER)).changes
    assert len(logged) == 2 and "retire previous service user ci" in logged[1]
    d = p.diff("ci", {**USER_ROTATING, "last_used_at": 200.0}, {**USER, "name": "ci2"})
    assert d.replaces == ["name"] and len(logged) == 2  # a replace says nothing about it
