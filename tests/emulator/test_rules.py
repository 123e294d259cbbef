"""Name and environment rules through raw RPCs (the CLI/SDK check some of them first).

Kept (issue 33 item 7): the providers check names with the client's own rules
(components/modal/_base.py); modal 1.6.4 modal/_utils/name_utils.py `check_object_name`,
`is_valid_environment_name`.
"""

from __future__ import annotations

import modal
import pytest
from google.protobuf.empty_pb2 import Empty
from google.protobuf.wrappers_pb2 import StringValue
from modal.exception import AlreadyExistsError, InvalidError, NotFoundError
from modal_proto import api_pb2

from tests.emulator.helpers import raw_rpc
from tests.harness.emulator import EmulatorProcess

APP_ID_SHAPED = "ap-" + "a" * 22


def _create_env(name: str, suffix: str = "") -> None:
    raw_rpc(
        "EnvironmentCreate",
        api_pb2.EnvironmentCreateRequest(
            name=name, settings=api_pb2.EnvironmentSettings(webhook_suffix=suffix)
        ),
    )


def _update_env(current: str, **fields: str) -> api_pb2.EnvironmentListItem:
    req = api_pb2.EnvironmentUpdateRequest(current_name=current)
    if "name" in fields:
        req.name.CopyFrom(StringValue(value=fields["name"]))
    if "web_suffix" in fields:
        req.web_suffix.CopyFrom(StringValue(value=fields["web_suffix"]))
    if "image_builder_version" in fields:
        req.image_builder_version = fields["image_builder_version"]
    return raw_rpc("EnvironmentUpdate", req)


def _env_names() -> list[str]:
    items = raw_rpc("EnvironmentList", Empty()).items
    return [i.name for i in items]


@pytest.mark.parametrize(
    "bad", ["en-foo", "EN-bar", "my.env", "-lead", "_x", "a b", "x" * 65, "dev\n"]
)
def test_environment_create_refuses_names_modal_refuses(
    modal_env: EmulatorProcess, bad: str
) -> None:
    with pytest.raises(InvalidError, match="Invalid environment name"):
        _create_env(bad)
    assert _env_names() == ["main"]


def test_environment_names_rename_and_ids(modal_env: EmulatorProcess) -> None:
    _create_env("My_Env")  # underscores and upper case are fine; the suffix is derived
    _create_env("lead-")  # a valid name whose derived suffix needs trimming
    items = {i.name: i for i in modal.environments.list_environments()}
    assert items["My_Env"].webhook_suffix == "my-env"
    assert items["lead-"].webhook_suffix == "lead"
    with pytest.raises(InvalidError, match="reserved for environment ids"):
        _update_env("My_Env", name="en-renamed")
    with pytest.raises(InvalidError, match="Invalid environment name"):
        _update_env("My_Env", name="has.period")
    renamed = _update_env("My_Env", name="mine")
    assert renamed.name == "mine" and renamed.webhook_suffix == "my-env"
    # Wherever a name is taken, an environment id (en-...) works too.
    env_id = items["My_Env"].environment_id
    modal.Secret.objects.create("s", {"K": "v"}, environment_name=env_id)
    assert [s.name for s in modal.Secret.objects.list(environment_name="mine")] == ["s"]
    got = raw_rpc(
        "EnvironmentGetOrCreate", api_pb2.EnvironmentGetOrCreateRequest(deployment_name=env_id)
    )
    assert got.metadata.name == "mine"


def test_only_one_environment_may_have_no_web_suffix(modal_env: EmulatorProcess) -> None:
    _create_env("staging")
    with pytest.raises(AlreadyExistsError, match=r"No web suffix .* environment 'main'"):
        _update_env("staging", web_suffix="")
    with pytest.raises(AlreadyExistsError, match="'staging' is already used"):
        _create_env("other", suffix="staging")
    _update_env("main", web_suffix="prod")  # main gives its empty suffix up...
    assert _update_env("staging", web_suffix="").webhook_suffix == ""  # ...so staging may
    items = {i.name: i.webhook_suffix for i in modal.environments.list_environments()}
    assert items == {"main": "prod", "staging": ""}


def test_environment_update_sets_image_builder_version(modal_env: EmulatorProcess) -> None:
    assert _update_env("main", image_builder_version="2024.10").image_builder_version == ("2024.10")
    got = raw_rpc(
        "EnvironmentGetOrCreate", api_pb2.EnvironmentGetOrCreateRequest(deployment_name="main")
    )
    assert got.metadata.settings.image_builder_version == "2024.10"
    with pytest.raises(InvalidError, match=r"Unknown image builder version '1999\.01'"):
        _update_env("main", image_builder_version="1999.01")


def test_names_shaped_like_app_ids_are_refused(modal_env: EmulatorProcess) -> None:
    ifm = api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING
    for kind, call in (
        (
            "Secret",
            lambda: raw_rpc(
                "SecretGetOrCreate",
                api_pb2.SecretGetOrCreateRequest(
                    deployment_name=APP_ID_SHAPED, object_creation_type=ifm, env_dict={"K": "v"}
                ),
            ),
        ),
        (
            "Volume",
            lambda: raw_rpc(
                "VolumeGetOrCreate",
                api_pb2.VolumeGetOrCreateRequest(
                    deployment_name=APP_ID_SHAPED, object_creation_type=ifm
                ),
            ),
        ),
        (
            "App",
            lambda: raw_rpc(
                "AppGetOrCreate",
                api_pb2.AppGetOrCreateRequest(app_name=APP_ID_SHAPED, object_creation_type=ifm),
            ),
        ),
    ):
        with pytest.raises(InvalidError, match=f"Invalid {kind} name .*App ID"):
            call()
    with pytest.raises(InvalidError, match=r"Invalid Volume name .*use only letters"):
        raw_rpc(  # a trailing newline is not a name character ('$' alone would let it pass)
            "VolumeGetOrCreate",
            api_pb2.VolumeGetOrCreateRequest(deployment_name="vol\n", object_creation_type=ifm),
        )
    app_id = modal.App.lookup("real-app", create_if_missing=True).app_id
    assert modal.App.lookup(app_id or "").app_id == app_id  # lookup by id still works
    with pytest.raises(NotFoundError, match=APP_ID_SHAPED):
        raw_rpc("AppGetOrCreate", api_pb2.AppGetOrCreateRequest(app_name=APP_ID_SHAPED))
    state = modal_env.state()
    assert state["secrets"] == state["volumes"] == []
