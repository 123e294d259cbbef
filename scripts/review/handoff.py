"""The hand-over of review stack pr-N's deploy identity from the access step to the deploy.

`Handoff` holds the `pr-N-deploy` token, the gateway's proxy token and, in CI, review stack
pr-N's own state passphrase (its repr hides all three); `derive_passphrase` is how the admin
step makes that passphrase, `write_handoff` writes the hand-over mode 0600, optionally sealed
with openssl (`OPENSSL_ENC`), and `read_handoff` reads or opens it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import ReviewError, deploy_identity, stack_name

#: openssl's symmetric encryption of a sealed hand-over file; the workflow opens it with the
#: same arguments plus -d (.github/workflows/review.yml).
OPENSSL_ENC = ["enc", "-aes-256-cbc", "-pbkdf2", "-iter", "200000", "-salt"]
_TOKEN = re.compile(r"^(?P<id>[a-z]{2}-[^:\s]+):(?P<secret>[a-z]{2}-\S+)$")
_PASSPHRASE = re.compile(r"^[0-9a-f]{64}$")
#: What the per-PR passphrase is derived from, besides the root key: a fixed label and the stack.
PASSPHRASE_LABEL = "modal-llm-review-stack/"  # noqa: S105 (a label, not a secret)


def derive_passphrase(root_key: str, pr: int) -> str:
    """Review stack pr-N's own state passphrase: HMAC-SHA256(root_key, label + "pr-N"), hex.

    The admin step (base-branch code, the only holder of the root key REVIEW_STATE_KEY)
    derives it and hands it to pr-N's deploy and teardown only, so the PR's code gets its own
    passphrase and no other PR's; without the root key one PR's passphrase says nothing of
    another's (HMAC is a PRF). It encrypts the stack's secrets in its state (the CLI's
    passphrase secrets manager; docs/review-stacks.md, Isolation)."""
    if not root_key:
        raise ReviewError("no root key to derive a review stack's passphrase from")
    msg = f"{PASSPHRASE_LABEL}{stack_name(pr)}".encode()
    return hmac.new(root_key.encode(), msg, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Handoff:
    """What the access stack gives review stack pr-N: the `pr-N-deploy` token (contributor in
    pr-N only), the gateway's proxy token and (when the admin step derives one) pr-N's own
    state passphrase. Never printed (repr hides them)."""

    environment: str
    deploy_token: str  # "ak-...:as-..."
    proxy_token: str  # "wk-...:ws-..."
    passphrase: str = ""  # derive_passphrase(REVIEW_STATE_KEY, N); "" when none was derived

    def __repr__(self) -> str:
        return f"Handoff(environment={self.environment!r}, <tokens hidden>)"

    @property
    def deploy_pair(self) -> tuple[str, str]:
        token_id, _, secret = self.deploy_token.partition(":")
        return token_id, secret

    def to_json(self) -> str:
        doc = {
            "environment": self.environment,
            "deploy_token": self.deploy_token,
            "proxy_token": self.proxy_token,
        }
        if self.passphrase:
            doc["passphrase"] = self.passphrase
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str, where: str) -> Handoff:
        try:
            doc = json.loads(text)
            found = cls(
                str(doc["environment"]),
                str(doc["deploy_token"]),
                str(doc["proxy_token"]),
                str(doc.get("passphrase") or ""),
            )
        except (ValueError, KeyError, TypeError):
            raise ReviewError(f"{where}: not a hand-over file of scripts/review_stack.py") from None
        for what, value, prefixes in (
            ("deploy_token", found.deploy_token, ("ak-", "as-")),
            ("proxy_token", found.proxy_token, ("wk-", "ws-")),
        ):
            m = _TOKEN.match(value)
            if not m or not (
                m["id"].startswith(prefixes[0]) and m["secret"].startswith(prefixes[1])
            ):
                raise ReviewError(f"{where}: {what} is not '{prefixes[0]}...:{prefixes[1]}...'")
        if found.passphrase and not _PASSPHRASE.match(found.passphrase):
            raise ReviewError(f"{where}: passphrase is not a derived one (64 hex digits)")
        return found


def handoff_from_credentials(credentials: Any, pr: int, passphrase: str = "") -> Handoff:
    """The access stack's `credentials` output (and pr-N's derived passphrase) -> its hand-over."""
    stack = stack_name(pr)
    try:
        env = credentials[stack]
        return Handoff(
            stack,
            str(env["identities"][deploy_identity(pr)]),
            str(env["proxy_token"]),
            passphrase,
        )
    except (KeyError, TypeError):
        raise ReviewError(
            f"the access stack {stack} has no credentials for {deploy_identity(pr)} in {stack}"
        ) from None


def write_handoff(path: Path, handoff: Handoff, seal_env: str | None) -> None:
    """Mode 0600; with `seal_env`, encrypted with openssl under that variable's value (for an
    artifact: the workflow's deploy job opens it before any of the PR's code runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    if seal_env:
        if not os.environ.get(seal_env):
            raise ReviewError(f"--seal-key-env {seal_env}: the variable is not set")
        done = subprocess.run(
            ["openssl", *OPENSSL_ENC, "-pass", f"env:{seal_env}", "-out", str(path)],
            input=handoff.to_json().encode(),
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise ReviewError(f"openssl could not seal {path}: {done.stderr.decode()[:200]}")
        return
    path.write_text(handoff.to_json())


def read_handoff(path: Path, open_env: str | None = None) -> Handoff:
    if open_env:
        done = subprocess.run(
            ["openssl", *OPENSSL_ENC, "-d", "-pass", f"env:{open_env}", "-in", str(path)],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise ReviewError(f"{path}: openssl could not open it (wrong key or not sealed)")
        return Handoff.from_json(done.stdout.decode(), str(path))
    try:
        return Handoff.from_json(path.read_text(), str(path))
    except OSError as exc:
        raise ReviewError(f"{path}: cannot be read ({exc.strerror or exc})") from None
