"""The engine stand-in's step decisions and order, each checked against the engine source it
mirrors (pulumi/pulumi v3.272.0, read with the search tool; the paths are in each docstring).

The provider is tests/standin/fileprov.py served by the SDK's real dynamic-provider server; its
"cloud" is a directory whose `log` records every call in order.

Kept (issue 33 item 7): the program's offline tests (tests/program/test_offline_stack.py: a
rotated key replaced create-before-delete, protectCaches refusing replace and delete, secrets
in the state only encrypted) and `make up` without the Pulumi CLI run the product's providers
through this stand-in; a step decided or ordered unlike the engine's would let them pass on a
sequence Pulumi never runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pulumi_standin import (
    Engine,
    ImportFailed,
    Options,
    ProtectedError,
    ProviderCallError,
    ProviderServer,
    ReadOutcome,
    Secret,
    scan_for_leaks,
)
from tests.standin.fileprov import FileProvider

P = FileProvider()


def _inputs(root: Path, label: str = "a", **extra: Any) -> dict[str, Any]:
    return {"dir": str(root), "label": label, "replace_on": ["zone"], **extra}


def _log(root: Path) -> list[str]:
    path = root / "log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [" ".join(line.split()[:2]) for line in lines]  # "<method> <label>" (ids vary)


def _objects(root: Path) -> set[str]:
    return {p.stem for p in root.glob("f-*.json")}


@pytest.fixture
def engine(file_server: ProviderServer) -> Engine:
    file_server.records.clear()
    return Engine(file_server)


def test_create_before_delete_deletes_the_old_one_after_every_registration(
    engine: Engine, tmp_path: Path
) -> None:
    """step_generator.go generateSteps: a replace without deleteBeforeReplace is
    CreateReplacement + Replace, the old state marked `Delete: true`; GenerateDeletes deletes
    it after every registration of the deployment."""
    engine.defer_replaced_deletes = True
    engine.up("a", P, _inputs(tmp_path, zone="z1"))
    old_id = engine.states["a"].id
    engine.up("b", P, _inputs(tmp_path, "b"))
    assert engine.up("a", P, _inputs(tmp_path, zone="z2")) == "replace"
    engine.up("b", P, _inputs(tmp_path, "b", size=2))
    # Both objects exist until the deployment ends; the old one is pending delete.
    assert old_id in _objects(tmp_path) and len(_objects(tmp_path)) == 3
    assert [s.id for s in engine.pending_deletes] == [old_id]
    assert engine.pending_deletes[0].pending_delete
    engine.finish()
    assert _log(tmp_path) == ["create a", "create b", "create a", "update b", "delete a"]
    assert old_id not in _objects(tmp_path) and engine.pending_deletes == []


@pytest.mark.parametrize("how", ["provider", "option"])
def test_delete_before_replace_deletes_first(engine: Engine, tmp_path: Path, how: str) -> None:
    """step_generator.go: deleteBeforeReplace (the provider's Diff answer, or the resource
    option) → DeleteStep(replacing) before CreateReplacement."""
    extra: dict[str, Any] = {"dbr": True} if how == "provider" else {}
    opts = Options(delete_before_replace=how == "option")
    engine.up("a", P, _inputs(tmp_path, zone="z1", **extra), options=opts)
    assert engine.up("a", P, _inputs(tmp_path, zone="z2", **extra), options=opts) == "replace"
    assert _log(tmp_path) == ["create a", "delete a", "create a"]
    assert len(_objects(tmp_path)) == 1


def test_failed_delete_of_the_replaced_one_keeps_the_new_one_pending_delete(
    file_server: ProviderServer, tmp_path: Path
) -> None:
    """A failed delete of the old half leaves it `Delete: true` in the state with the new one
    kept (step.go DeleteStep.Apply fails, the snapshot keeps both); the next deployment
    deletes it first (step_generator.go GeneratePendingDeletes)."""
    saved: list[tuple[list[str], list[str]]] = []
    engine = Engine(file_server, defer_replaced_deletes=True)
    engine.on_change = lambda: saved.append(
        (list(engine.states), [s.id for s in engine.pending_deletes])
    )
    engine.up("a", P, _inputs(tmp_path, zone="z1"))
    old_id = engine.states["a"].id
    (tmp_path / "fail-delete-a").touch()
    engine.up("a", P, _inputs(tmp_path, zone="z2"))
    new_id = engine.states["a"].id
    with pytest.raises(ProviderCallError, match="delete of a failed"):
        engine.finish()
    assert engine.states["a"].id == new_id  # the new one is kept
    assert [s.id for s in engine.pending_deletes] == [old_id]
    assert saved[-1] == (["a"], [old_id])  # and that is what the state file holds
    assert _objects(tmp_path) == {old_id, new_id}
    # Next deployment: the pending delete goes first.
    (tmp_path / "fail-delete-a").unlink()
    engine.delete_pending()
    assert _objects(tmp_path) == {new_id} and engine.pending_deletes == []


def test_protect_refuses_replace_and_delete_with_the_engine_messages(
    engine: Engine, tmp_path: Path
) -> None:
    """step_generator.go: `new.Protect && old.Protect` → "unable to replace resource ... as it
    is currently marked for protection"; step.go DeleteStep.Apply: "unable to delete
    resource ..."; an unprotect and a replace in one run are allowed."""
    protected = Options(protect=True)
    engine.up("a", P, _inputs(tmp_path, zone="z1"), options=protected)
    with pytest.raises(ProtectedError, match=r"unable to replace resource .*\nas it is currently"):
        engine.up("a", P, _inputs(tmp_path, zone="z2"), options=protected)
    with pytest.raises(ProtectedError, match=r"unable to delete resource .*\nas it is currently"):
        engine.destroy("a")
    assert _log(tmp_path) == ["create a"]
    assert engine.up("a", P, _inputs(tmp_path, zone="z2")) == "replace"  # protect removed


def test_retain_on_delete_forgets_without_calling_delete(engine: Engine, tmp_path: Path) -> None:
    """step.go DeleteStep.Apply: RetainOnDelete → no provider Delete; the object stays."""
    engine.up("a", P, _inputs(tmp_path), options=Options(retain_on_delete=True))
    engine.destroy("a")
    assert "a" not in engine.states and _log(tmp_path) == ["create a"]
    assert len(_objects(tmp_path)) == 1


def test_ignore_changes_keeps_the_old_value(engine: Engine, tmp_path: Path) -> None:
    """step_generator.go processIgnoreChanges: the old input replaces the program's value
    before Check, so an ignored change is no change."""
    opts = Options(ignore_changes=("size",))
    engine.up("a", P, _inputs(tmp_path, size=1), options=opts)
    assert engine.up("a", P, _inputs(tmp_path, size=2), options=opts) == "same"
    assert engine.states["a"].inputs["size"] == 1
    assert engine.up("a", P, _inputs(tmp_path, size=2)) == "update"


def test_import_reads_by_id_only_so_a_dynamic_resource_cannot_be_imported(
    engine: Engine, tmp_path: Path
) -> None:
    """step.go ImportStep.Apply: Read(URN, ID) with no inputs and no state. The SDK's
    dynamic-provider server needs `__provider` in the properties, so the import fails there,
    whatever the program's inputs."""
    engine.up("a", P, _inputs(tmp_path))
    live_id = engine.states["a"].id
    with pytest.raises(ImportFailed, match="Read failed"):
        Engine(engine.server).import_("b", P, live_id, _inputs(tmp_path))
    assert "__provider" in engine.server.records[-1].error  # type: ignore[operator]
    read = engine.server.records[-1]
    assert read.method == "Read" and set(read.request) == {"id", "urn", "name", "type"}
    assert "b" not in engine.states and _log(tmp_path) == ["create a"]  # nothing read


class _ReadOnly:
    """A provider server that answers Read only (the branches the SDK server never reaches)."""

    def __init__(self, answer: ReadOutcome) -> None:
        self.answer = answer

    def read(self, *_a: Any, **_k: Any) -> ReadOutcome:
        return self.answer

    def type_token(self, _p: Any) -> str:
        return "pulumi-python:dynamic/test:File"


def test_import_answers_without_inputs_or_object_fail_with_the_engine_messages() -> None:
    """step.go ImportStep.Apply: no outputs → "resource '<id>' does not exist"; no inputs →
    "provider does not support importing resources; please try updating the '<pkg>' plugin"."""
    no_inputs = Engine(_ReadOnly(ReadOutcome("f-1", {"x": 1}, None)))  # type: ignore[arg-type]
    with pytest.raises(ImportFailed) as info:
        no_inputs.import_("a", P, "f-1", {})
    assert info.value.why == (
        "provider does not support importing resources; please try updating the"
        " 'pulumi-python' plugin"
    )
    gone = Engine(_ReadOnly(ReadOutcome("", {}, None)))  # type: ignore[arg-type]
    with pytest.raises(ImportFailed, match="resource 'f-2' does not exist"):
        gone.import_("a", P, "f-2", {})


def test_secrets_reach_outputs_and_state_only_encrypted(engine: Engine, tmp_path: Path) -> None:
    """provider/server (plugin): the SDK server answers acceptSecrets=False, so the engine
    re-marks an output secret when the same-named input was secret, when the provider wrapped
    it, or when additionalSecretOutputs lists it; state holds ciphertext only."""
    engine.up(
        "a",
        P,
        _inputs(tmp_path, password=Secret("pw-0123456789"), token="tok-0123456789", note="n1"),
        secret_outputs=("note",),
    )
    outs = engine.states["a"].outputs
    assert isinstance(outs["password"], Secret)  # secret input → secret output
    assert isinstance(outs["token"], Secret)  # wrapped by the provider
    assert isinstance(outs["note"], Secret)  # additional_secret_outputs
    stored = engine.stored_state()["a"]
    # A plain input stays plain in the inputs (as in Pulumi); every secret is ciphertext.
    assert scan_for_leaks({"state": json.dumps(stored)}, ["pw-0123456789"]) == []
    assert scan_for_leaks({"outs": json.dumps(stored["outputs"])}, ["tok-0123456789", "n1"]) == []


def test_state_is_written_after_every_step(engine: Engine, tmp_path: Path) -> None:
    """The engine persists the snapshot after each step (SnapshotManager), so a failed
    deployment keeps what it applied: one save per create/update/delete here."""
    saves: list[list[str]] = []
    engine.on_change = lambda: saves.append(sorted(engine.states))
    engine.up("a", P, _inputs(tmp_path))
    engine.up("b", P, _inputs(tmp_path, "b"))
    (tmp_path / "fail-create-c").touch()
    with pytest.raises(ProviderCallError):
        engine.up("c", P, _inputs(tmp_path, "c"))
    assert saves == [["a"], ["a", "b"]]
    engine.up("a", P, _inputs(tmp_path, size=3))
    engine.destroy("b")
    assert saves[2:] == [["a", "b"], ["a"]]


def test_calls_and_their_order_per_step(engine: Engine, tmp_path: Path) -> None:
    """step_generator.go generateSteps: Check (olds = old inputs) for every registration, Diff
    (olds = old OUTPUTS) for every existing resource, then the step's one mutation; a same
    step mutates nothing."""
    srv = engine.server

    def calls(fn: Any) -> list[str]:
        start = len(srv.records)
        fn()
        return [r.method for r in srv.records[start:]]

    assert calls(lambda: engine.up("a", P, _inputs(tmp_path, zone="z1"))) == ["Check", "Create"]
    assert calls(lambda: engine.up("a", P, _inputs(tmp_path, zone="z1"))) == ["Check", "Diff"]
    diff = srv.records[-1].request
    assert diff["olds"]["__provider"] and "zone" in diff["olds"] and "old_inputs" in diff
    update = calls(lambda: engine.up("a", P, _inputs(tmp_path, zone="z1", size=2)))
    assert update == ["Check", "Diff", "Update"]
    replace = calls(lambda: engine.up("a", P, _inputs(tmp_path, zone="z2")))
    assert replace == ["Check", "Diff", "Create", "Delete"]  # create-before-delete
    dbr = calls(lambda: engine.up("a", P, _inputs(tmp_path, zone="z3", dbr=True)))
    assert dbr == ["Check", "Diff", "Delete", "Create"]
    assert calls(lambda: engine.destroy("a")) == ["Delete"]
