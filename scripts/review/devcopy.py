"""dev's state without its secrets: what the PR's code previews against (`plan`).

`plan` runs the PR's code, and `pulumi preview --stack dev` needs dev's state. Given dev's
passphrase, the PR's code could decrypt every secret in it (API keys, the proxy token secret,
the HF token and webhook of its config) and, with the backend credential, change it. So the
work is split (docs/review-stacks.md, Isolation):

- `dev-export` runs BASE-BRANCH code with dev's backend and passphrase (the workflow's
  `dev-copy` job, environment `review-dev-export`): it exports dev's state, replaces every
  secret value with PLACEHOLDER and writes the copy (`--out FILE`), plus dev's outputs as
  `pulumi stack output --json` shows them (secrets `[secret]`). No secret of dev is in it, in
  clear or encrypted.
- `plan --base-copy FILE` runs the PR's code with NO passphrase or backend of dev: it loads the
  copy into a private backend (CLI: `file://` in a temporary directory, a throwaway passphrase;
  stand-in: a state file under COPY_PASSPHRASE, which protects nothing) and previews there.

What the PR's code still sees: dev's non-secret state (URNs, IDs, non-secret inputs and
outputs: the endpoint URL, the proxy token's id, costs). The diff is the same but for secret
values: in the copy they are all PLACEHOLDER, so a resource whose secret inputs the program
computes (the Secret holding the API keys' digests) would show an update that dev's real
state does not; `secret_only_updates` leaves out every update whose inputs differ in secret
values only (the preview document shows those as `[secret]` on both sides anyway) and counts
them under the document's `reviewCopy` key, which the comment states. A secret config value of
dev's stack file is PLACEHOLDER in the preview's program.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import review_comment
import yaml

from .common import ReviewError
from .engine import SECRET_SIG, SIG_KEY, Engine, standin_outputs

COPY_FORMAT = "modal-llm-review-dev-copy/1"
#: The copy's secrets are all PLACEHOLDER, so its passphrase protects nothing: it is public.
COPY_PASSPHRASE = "review-dev-copy: this state holds no secret"  # noqa: S105
PLACEHOLDER = "[secret]"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


# ---- the CLI's `pulumi stack export` document ------------------------------------------------


def scrub_export(value: Any) -> Any:
    """Every secret object of a `stack export --show-secrets` document (sig.Secret, plaintext
    or ciphertext) -> the same object holding json PLACEHOLDER in plaintext."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return {SIG_KEY: SECRET_SIG, "plaintext": json.dumps(PLACEHOLDER)}
        return {k: scrub_export(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_export(v) for v in value]
    return value


def _secret_objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            yield value
        else:
            for v in value.values():
                yield from _secret_objects(v)
    elif isinstance(value, list):
        for v in value:
            yield from _secret_objects(v)


def export_cli(engine: Engine, stack: str) -> dict[str, Any]:
    scrubbed = scrub_export(engine.stack_export(stack, show_secrets=True))
    # The copy is re-encrypted by the stack it is imported into (its own secrets provider).
    (scrubbed.get("deployment") or {}).pop("secrets_providers", None)
    left = [o for o in _secret_objects(scrubbed) if o.get("plaintext") != json.dumps(PLACEHOLDER)]
    if left:
        raise ReviewError(f"the copy of {stack} still holds {len(left)} secret(s): not written")
    return {"deployment": scrubbed, "outputs": engine.outputs(stack)}


# ---- the stand-in's state file ----------------------------------------------------------------


def export_standin(engine: Engine, stack: str, state: Path, out: Path) -> dict[str, Any]:
    """The stand-in's state file of `stack`, every Secret replaced, under COPY_PASSPHRASE."""
    from pulumi_standin.statefile import SecretBox, StandinError, open_tree, seal_tree
    from pulumi_standin.values import Secret

    env = engine.env()
    passphrase = env.get("OFFLINE_STACK_PASSPHRASE") or env.get("PULUMI_CONFIG_PASSPHRASE") or ""
    try:
        doc = json.loads(state.read_text())
        old = SecretBox(passphrase, base64.b64decode(doc["encryption"]["salt"]))
        old.open(doc["encryption"]["check"], f"state file {state}")
    except (OSError, ValueError, KeyError) as exc:
        raise ReviewError(f"{state}: not a readable state file of the stand-in ({exc})") from None
    except StandinError as exc:
        raise ReviewError(str(exc)) from None
    salt = os.urandom(16)
    new = SecretBox(COPY_PASSPHRASE, salt)

    def blank(value: Any) -> Any:
        if isinstance(value, Secret):
            return Secret(PLACEHOLDER)
        if isinstance(value, dict):
            return {k: blank(v) for k, v in value.items()}
        if isinstance(value, list):
            return [blank(v) for v in value]
        return value

    def scrub(tree: Any, where: str) -> Any:
        return seal_tree(blank(open_tree(tree, old, where)), new)

    for res in doc.get("resources") or []:
        where = f"state file {state}, resource {res.get('name')}"
        res["inputs"] = scrub(res.get("inputs") or {}, where)
        res["outputs"] = scrub(res.get("outputs") or {}, where)
    doc["outputs"] = scrub(doc.get("outputs") or {}, f"state file {state}, outputs")
    doc["encryption"] = {
        **doc["encryption"],
        "salt": base64.b64encode(salt).decode(),
        "check": new.seal("offline-stack"),
    }
    copy_state = out.with_name(out.stem + ".state.json")
    _write_private(copy_state, json.dumps(doc, indent=1) + "\n")
    outputs = standin_outputs(stack, copy_state, {"OFFLINE_STACK_PASSPHRASE": COPY_PASSPHRASE})
    return {"passphrase": COPY_PASSPHRASE, "state": copy_state.name, "outputs": outputs}


def cmd_dev_export(args: argparse.Namespace, engine: Engine) -> int:
    """Base-branch code with dev's passphrase: the copy of dev's state that `plan` uses."""
    out: Path = args.out
    stack = args.base_stack
    if engine.kind == "cli":
        body = export_cli(engine, stack)
    else:
        state = args.base_state or engine.state(stack)
        body = export_standin(engine, stack, state, out)
    doc = {"format": COPY_FORMAT, "engine": engine.kind, "stack": stack, **body}
    _write_private(out, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"copy of {stack} without its secrets: {out}")
    return 0


# ---- plan against the copy -----------------------------------------------------------------


def read_copy(path: Path, stack: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReviewError(f"--base-copy {path}: unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != COPY_FORMAT or doc.get("stack") != stack:
        raise ReviewError(
            f"--base-copy {path}: not a copy of stack {stack} written by"
            " `scripts/review_stack.py dev-export`"
        )
    return doc


def _secure_paths(config: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the `secure:` values of a stack file's config."""
    found: list[str] = []
    if isinstance(config, dict):
        if set(config) == {"secure"}:
            return [prefix]
        for key, value in config.items():
            found += _secure_paths(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def _without_secure(config: Any) -> Any:
    if isinstance(config, dict):
        return {
            k: _without_secure(v)
            for k, v in config.items()
            if not (isinstance(v, dict) and set(v) == {"secure"})
        }
    return config


@contextlib.contextmanager
def _stack_file_without_secrets(project: Path, stack: str) -> Iterator[list[str]]:
    """`Pulumi.<stack>.yaml` without its encryption settings and `secure:` values (encrypted
    for dev's passphrase, which this step does not have) while the block runs; restored
    after. Yields the dotted keys that held a secure value."""
    path = project / f"Pulumi.{stack}.yaml"
    saved = path.read_bytes()
    doc = yaml.safe_load(saved) or {}
    secure = _secure_paths(doc.get("config") or {})
    for key in ("encryptionsalt", "encryptedkey", "secretsprovider"):
        doc.pop(key, None)
    doc["config"] = _without_secure(doc.get("config") or {})
    try:
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield secure
    finally:
        path.write_bytes(saved)


def secret_only_updates(preview: dict[str, Any]) -> int:
    """Drop from `preview` the `update` steps whose inputs differ in secret values only (what
    comparing with the copy's placeholders makes up), as the engine hides `same` steps
    (json.go shouldShow); move them from `update` to `same` in changeSummary and record how
    many under `reviewCopy.secretOnlyUpdates`. Returns that number."""
    kept, dropped = [], 0
    for step in preview.get("steps") or []:
        old, new = step.get("oldState") or {}, step.get("newState") or {}
        if step.get("op") == "update" and old and new:
            changes = review_comment.changed_keys(old.get("inputs") or {}, new.get("inputs") or {})
            if all(shown == review_comment.SECRET for _, shown in changes):
                dropped += 1
                continue
        kept.append(step)
    if dropped:
        preview["steps"] = kept
        summary = preview.setdefault("changeSummary", {})
        left = int(summary.get("update") or 0) - dropped
        if left > 0:
            summary["update"] = left
        else:
            summary.pop("update", None)
        summary["same"] = int(summary.get("same") or 0) + dropped
    preview["reviewCopy"] = {"secretOnlyUpdates": dropped}
    return dropped


def preview_against_copy(
    engine: Engine, stack: str, copy: Path
) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """The preview document of this checkout's code against the copy, its exit code, and
    dev's outputs as the copy recorded them."""
    doc = read_copy(copy, stack)
    outputs = dict(doc.get("outputs") or {})
    if doc.get("engine") != engine.kind:
        raise ReviewError(f"--base-copy {copy} was written by the {doc.get('engine')} engine")
    if engine.kind == "standin":
        private = engine.with_passphrase(str(doc["passphrase"]))
        preview, rc = private.preview_json(stack, copy.with_name(str(doc["state"])))
        secret_only_updates(preview)
        return preview, rc, outputs
    with tempfile.TemporaryDirectory(prefix="review-plan-") as tmp:
        # A private backend and a throwaway passphrase: nothing of dev's is needed or reachable.
        backend = Path(tmp) / "backend"
        backend.mkdir()
        private = replace(engine, passphrase=secrets.token_hex(32), backend_url=f"file://{backend}")
        with _stack_file_without_secrets(engine.project, stack) as secure:
            private.checked(
                private.cli("stack", "init", stack, "--secrets-provider", "passphrase"),
                f"pulumi stack init {stack} (a private copy)",
            )
            for key in secure:
                path = ["--path"] if "." in key.split(":", 1)[-1] else []
                private.checked(
                    private.cli("config", "set", "--secret", *path, key, "--stack", stack),
                    f"pulumi config set --secret {key} (a placeholder)",
                    stdin=PLACEHOLDER,
                )
            # The new stack's secrets provider (pkg/cmd/pulumi/stack/io.go CreateStack writes
            # it into the initial state), so that `stack import` encrypts the copy under it.
            fresh = json.loads(
                private.checked(
                    private.cli("stack", "export", "--stack", stack),
                    f"pulumi stack export --stack {stack} (the private copy)",
                    capture=True,
                )
                or "{}"
            )
            deployment = dict(doc["deployment"])
            inner = dict(deployment.get("deployment") or {})
            providers = (fresh.get("deployment") or {}).get("secrets_providers")
            if providers:
                inner["secrets_providers"] = providers
            deployment["deployment"] = inner
            imported = Path(tmp) / "import.json"
            _write_private(imported, json.dumps(deployment))
            private.checked(
                private.cli("stack", "import", "--stack", stack, "--file", str(imported)),
                f"pulumi stack import --stack {stack} (the private copy)",
            )
            preview, rc = private.preview_json(stack, None)
    secret_only_updates(preview)
    return preview, rc, outputs
