"""Issue 32 item 8: each review stack's state and secrets are its PR's alone.

- Each PR's passphrase is derived by the admin step, HMAC-SHA256(REVIEW_STATE_KEY, pr-N), and
  reaches the deploy only in pr-N's hand-over: the state of one PR, encrypted by the stand-in
  (dev/pulumi_standin/statefile.py: PBKDF2 + encrypt-then-MAC, as the CLI's passphrase secrets
  manager is AES-256-GCM), does not open with another PR's passphrase.
- `up --handoff` runs the engine under the hand-over's passphrase, never the one in its own
  environment (a real child process records what it was given).
- `handoff --state-key-env` (the admin step) puts the derived passphrase in the hand-over.
- `dev-export` (base-branch code, dev's passphrase) writes a copy of dev's state with every
  secret replaced, which `plan` (the PR's code, no passphrase of dev) previews against.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import review_comment  # noqa: E402
from review import deploy  # noqa: E402
from review.cli import parse_args  # noqa: E402
from review.devcopy import PLACEHOLDER, scrub_export  # noqa: E402
from review.engine import SECRET_SIG, SIG_KEY, Engine, plain_providers  # noqa: E402
from review.handoff import Handoff, derive_passphrase, read_handoff, write_handoff  # noqa: E402

from pulumi_standin.engine import ResourceState  # noqa: E402
from pulumi_standin.statefile import StandinError, StateFile  # noqa: E402
from pulumi_standin.values import Secret, iter_secret_strings  # noqa: E402

ROOT_KEY = "review-state-root-key-for-this-test"
SHARED = "the-old-shared-review-passphrase"
DEV_PASSPHRASE = "dev-passphrase-of-this-test"
DEV_SECRET = "sk-dev-live-api-key-7f3a"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _save(path: Path, stack: str, outputs: dict[str, Any], states: list[ResourceState]) -> None:
    class _Engine:  # what StateFile.save reads of the stand-in's engine
        def __init__(self) -> None:
            self.states = {s.name: s for s in states}
            self.pending_deletes: list[ResourceState] = []

    state = StateFile(path, stack)
    state.outputs = outputs
    state.save(_Engine())  # type: ignore[arg-type]


def test_a_prs_state_does_not_open_with_another_prs_passphrase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p7, p8 = derive_passphrase(ROOT_KEY, 7), derive_passphrase(ROOT_KEY, 8)
    assert p7 != p8 and p7 == derive_passphrase(ROOT_KEY, 7)
    assert p7 != derive_passphrase("another-root-key", 7)
    assert ROOT_KEY not in p7 and len(p7) == 64
    path = tmp_path / "pr-7.json"
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", p7)
    _save(path, "pr-7", {"proxy_token_secret": Secret("ws-pr7-secret")}, [])
    assert "ws-pr7-secret" not in path.read_text()
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", p8)
    with pytest.raises(StandinError, match="cannot decrypt"):
        StateFile.load(path, "pr-7")
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", p7)
    assert StateFile.load(path, "pr-7").outputs["proxy_token_secret"].value == "ws-pr7-secret"


RECORDER = r"""#!{python}
import hashlib, json, os, sys
with open(os.environ["RECORD"], "a") as fh:
    env = {{k: hashlib.sha256(v.encode()).hexdigest() for k, v in os.environ.items()}}
    fh.write(json.dumps({{"argv": sys.argv[1:], "env": env}}) + "\n")
"""


def test_up_with_a_handoff_runs_under_the_prs_own_passphrase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy job's own environment may hold a passphrase (the old shared one): the
    engine must not get it, only pr-7's from the hand-over."""
    recorder = tmp_path / "python"
    recorder.write_text(RECORDER.format(python=sys.executable))
    recorder.chmod(0o755)
    monkeypatch.setenv("RECORD", str(tmp_path / "record.jsonl"))
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", SHARED)
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", SHARED)
    p7 = derive_passphrase(ROOT_KEY, 7)
    handoff = tmp_path / "handoff.json"
    write_handoff(handoff, Handoff("pr-7", "ak-d7:as-d7secret", "wk-p7:ws-p7secret", p7), None)
    assert read_handoff(handoff).passphrase == p7 and p7 not in repr(read_handoff(handoff))
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml"):
        (checkout / name).write_text((ROOT / name).read_text())
    args = parse_args(["up", "--pr", "7", "--head-repo", "a/b", "--base-repo", "a/b",
                       "--handoff", str(handoff), "--engine", "standin",
                       "--project", str(checkout), "--out-dir", str(tmp_path / "out")])  # fmt: skip
    engine = Engine(kind="standin", project=checkout, state_dir=tmp_path / "state",
                    python=str(recorder))  # fmt: skip
    assert deploy.cmd_up(args, engine) == 0
    runs = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert runs and runs[0]["argv"][:3] == ["-m", "pulumi_standin", "up"]
    for run in runs:
        env = run["env"]
        given = {env.get("PULUMI_CONFIG_PASSPHRASE"), env.get("OFFLINE_STACK_PASSPHRASE")}
        assert _sha(SHARED) not in given, "the engine got the shared passphrase"
        assert _sha(p7) in given, "the engine did not get pr-7's passphrase"


def test_the_admin_step_puts_the_derived_passphrase_in_the_handoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = {
        "pr-7": {"identities": {"pr-7-deploy": "ak-d7:as-d7secret"}, "proxy_token": "wk-p:ws-q"}
    }
    monkeypatch.setattr(Engine, "exists", lambda self, stack, access=False: True)
    monkeypatch.setattr(Engine, "outputs", lambda self, *a, **k: {"credentials": credentials})
    monkeypatch.setenv("REVIEW_STATE_KEY", ROOT_KEY)
    path = tmp_path / "h.json"
    args = parse_args(["handoff", "--pr", "7", "--handoff", str(path), "--state-key-env",
                       "REVIEW_STATE_KEY", "--engine", "standin"])  # fmt: skip
    engine = Engine(kind="standin", project=ROOT, state_dir=tmp_path)
    assert deploy.cmd_handoff(args, engine) == 0
    assert read_handoff(path).passphrase == derive_passphrase(ROOT_KEY, 7)
    assert path.stat().st_mode & 0o077 == 0
    monkeypatch.delenv("REVIEW_STATE_KEY")
    with pytest.raises(Exception, match="REVIEW_STATE_KEY"):
        deploy.cmd_handoff(args, engine)


def test_dev_export_leaves_no_secret_of_dev_in_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy the PR's code previews against: dev's resources and outputs, every secret
    replaced, under a passphrase that protects nothing (so the plan job needs none of dev's)."""
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", DEV_PASSPHRASE)
    dev = tmp_path / "dev.json"
    key = ResourceState(
        name="tiny-key-gateway",
        provider="",
        id="key-1",
        inputs={"__provider": Secret("pickled"), "name": "gateway"},
        outputs={"plaintext": Secret(DEV_SECRET), "digest": "sha256:ab"},
        secret_outputs=("plaintext",),
        type="llm:ApiKey",
    )
    _save(dev, "dev", {"api_keys": Secret({"gateway": DEV_SECRET}), "environment": "dev"}, [key])
    copy = tmp_path / "copy" / "dev.json"
    args = argparse.Namespace(base_stack="dev", base_state=dev, out=copy)
    engine = Engine(kind="standin", project=ROOT, state_dir=tmp_path)
    assert deploy.cmd_dev_export(args, engine) == 0
    monkeypatch.delenv("OFFLINE_STACK_PASSPHRASE")
    text = copy.read_text()
    assert DEV_SECRET not in text
    doc = json.loads(text)
    passphrase = doc["passphrase"]
    assert passphrase != DEV_PASSPHRASE
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", passphrase)
    loaded = StateFile.load(copy.with_name(doc["state"]), "dev")
    assert loaded.outputs["environment"] == "dev"
    assert DEV_SECRET not in json.dumps(list(iter_secret_strings(loaded.outputs)))
    monkeypatch.setenv("OFFLINE_STACK_PASSPHRASE", DEV_PASSPHRASE)
    with pytest.raises(StandinError):  # nothing in it opens with dev's passphrase either
        StateFile.load(copy.with_name(doc["state"]), "dev")


def test_a_state_with_a_plain_pickled_provider_is_refused() -> None:
    """Another PR's code can write this stack's state (the backend credential is shared) but
    cannot encrypt for this stack's passphrase: a `__provider` that is not an encrypted secret
    was not written by this stack's deploys, and `verify_state` refuses to run on it."""
    secret = {SIG_KEY: SECRET_SIG, "ciphertext": "v1:abc:def"}
    ok = {"urn": "urn:pulumi:pr-7::p::t::ok", "inputs": {"__provider": secret}, "outputs": {}}
    planted = {"urn": "urn:pulumi:pr-7::p::t::x", "inputs": {"__provider": "gASV..."}}
    shown = {"urn": "urn:pulumi:pr-7::p::t::y",
             "outputs": {"__provider": {SIG_KEY: SECRET_SIG, "plaintext": '"gASV"'}}}  # fmt: skip
    doc = {"deployment": {"resources": [ok, planted, shown]}}
    assert plain_providers(doc) == [planted["urn"], shown["urn"]]
    assert plain_providers({"deployment": {"resources": [ok]}}) == []


def test_the_cli_copy_of_dev_holds_no_secret() -> None:
    exported = {
        "deployment": {
            "secrets_providers": {"type": "passphrase", "state": {"salt": "v1:x"}},
            "resources": [
                {
                    "inputs": {"key": {SIG_KEY: SECRET_SIG, "plaintext": json.dumps(DEV_SECRET)}},
                    "outputs": {"n": [1, {SIG_KEY: SECRET_SIG, "ciphertext": "v1:a:b"}]},
                }
            ],
        }
    }
    copy = scrub_export(exported)
    assert DEV_SECRET not in json.dumps(copy) and "v1:a:b" not in json.dumps(copy)
    res = copy["deployment"]["resources"][0]
    assert res["inputs"]["key"] == {SIG_KEY: SECRET_SIG, "plaintext": json.dumps(PLACEHOLDER)}


@pytest.mark.slow
def test_plan_against_the_copy_shows_the_same_diff_without_any_passphrase_of_dev(
    tmp_path: Path,
) -> None:
    """End to end on the stand-in: dev deployed into the emulator; `dev-export` with dev's
    passphrase; `plan --base-copy` of a PR changing the GPU, run with NO passphrase and no
    Modal token in its environment (the emulator's URL only: the local stack's engine
    stand-in needs one), gives the diff that `plan` with dev's own state and
    passphrase gives, and nothing it wrote holds a secret of dev."""
    from review.checkout import copy_checkout

    from tests.harness.emulator import EmulatorProcess
    from tests.program.test_review_stacks import DEV_CONFIG, with_service, write_dev

    checkout = copy_checkout(ROOT, tmp_path / "checkout")
    write_dev(checkout, DEV_CONFIG)
    state = tmp_path / "state"
    emulator = EmulatorProcess().start()
    try:
        dev_env = emulator.subprocess_env({"PULUMI_CONFIG_PASSPHRASE": DEV_PASSPHRASE})
        dev_env.pop("PYTHONPATH", None)
        dev_env.pop("OFFLINE_STACK_PASSPHRASE", None)

        def run(env: dict[str, str], *args: str) -> str:
            done = subprocess.run([sys.executable, *args], cwd=checkout, env=env,
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        run(dev_env, "-m", "pulumi_standin", "up", "--stack", "dev", "--server-url",
            emulator.url, "--state", str(state / "dev.json"))  # fmt: skip
        script = ["scripts/review_stack.py"]
        common = ["--engine", "standin"]
        copy = tmp_path / "copy" / "dev-copy.json"
        run(dev_env, *script, "dev-export", *common, "--base-state", str(state / "dev.json"),
            "--out", str(copy))  # fmt: skip
        write_dev(checkout, with_service(DEV_CONFIG, gpu="A10G"))
        run(dev_env, *script, "plan", "--pr", "5", *common, "--base-state",
            str(state / "dev.json"), "--out-dir", str(tmp_path / "with-dev"))  # fmt: skip
        bare = {k: v for k, v in dev_env.items()
                if not k.startswith(("PULUMI_", "MODAL_TOKEN", "OFFLINE_"))}  # fmt: skip
        run(bare, *script, "plan", "--pr", "5", *common, "--base-copy", str(copy),
            "--out-dir", str(tmp_path / "with-copy"))  # fmt: skip
        # dev's secrets, as dev's passphrase opens them: none of them anywhere in what the
        # copy and the plan against it wrote.
        dev_secrets = [s for s in _dev_secrets(state / "dev.json") if len(s) >= 8]
        assert dev_secrets, "dev's state holds no secret: the test proves nothing"
    finally:
        emulator.stop()
    written = [
        p for d in (copy.parent, tmp_path / "with-copy") for p in d.rglob("*") if p.is_file()
    ]
    for path in written:
        text = path.read_text()
        assert not [s for s in dev_secrets if s in text], path

    def steps(d: str) -> list[tuple[str, str]]:
        doc = json.loads((tmp_path / d / "preview.json").read_text())
        return [(s["op"], s["urn"]) for s in doc["steps"]]

    assert steps("with-copy") == steps("with-dev")
    assert ("update", next(u for o, u in steps("with-dev") if u.endswith("::tiny-app"))) in steps(
        "with-copy"
    )
    outputs = {d: json.loads((tmp_path / d / "dev-outputs.json").read_text())
               for d in ("with-dev", "with-copy")}  # fmt: skip
    assert outputs["with-copy"] == outputs["with-dev"]
    docs = {d: json.loads((tmp_path / d / "preview.json").read_text())
            for d in ("with-dev", "with-copy")}  # fmt: skip
    assert docs["with-copy"]["changeSummary"] == docs["with-dev"]["changeSummary"]
    # What the copy cannot compare (the Secret of the API keys' digests) is counted, and said.
    assert docs["with-copy"]["reviewCopy"]["secretOnlyUpdates"] >= 1
    section = "\n".join(review_comment.diff_section(docs["with-copy"], "dev"))
    assert "differ in secret values only are left out" in section


def _dev_secrets(path: Path) -> list[str]:
    """dev's credentials as dev's passphrase reveals them: the proxy token secret, the API keys."""
    from review.engine import standin_outputs

    shown = standin_outputs("dev", path, {"OFFLINE_STACK_PASSPHRASE": DEV_PASSPHRASE}, reveal=True)
    found = [str(shown.get("proxy_token_secret") or "")]
    for key in ("api_keys", "all_api_keys"):
        value = shown.get(key)
        if isinstance(value, dict):
            found += [str(v) for v in value.values() if isinstance(v, str)]
    return [f for f in found if f and f != PLACEHOLDER]


def test_sweep_defaults_to_the_documented_age(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34 item 2: `sweep --dry-run` with no --older-than-days takes the documented
    default (REVIEW_MAX_AGE_DAYS, else 7 days), as review.yml does."""
    from review.cli import parse_args

    monkeypatch.delenv("REVIEW_MAX_AGE_DAYS", raising=False)
    assert parse_args(["sweep", "--dry-run"]).older_than_days == 7.0
    monkeypatch.setenv("REVIEW_MAX_AGE_DAYS", "3")
    assert parse_args(["sweep", "--dry-run"]).older_than_days == 3.0
    assert parse_args(["sweep", "--older-than-days", "1.5"]).older_than_days == 1.5
