"""The stand-in's state file: resources, pending deletes and stack outputs, secrets encrypted.

One JSON file per stack (default `.pulumi-offline/<stack>.json`, mode 0600; not Pulumi's
checkpoint format), rewritten atomically after every step. Secret values (API keys, the proxy
token secret, secret inputs, secret stack outputs) are never stored in clear: key =
PBKDF2-HMAC-SHA256(passphrase, per-file salt, 200,000 rounds); each value is XORed with an
HMAC-SHA256 counter-mode keystream and authenticated with HMAC-SHA256 (encrypt-then-MAC,
stdlib only: no AES library is installed here). The passphrase comes from
OFFLINE_STACK_PASSPHRASE, else PULUMI_CONFIG_PASSPHRASE, else, for the `local` stack only,
"local-emulator" (scripts/local-env.sh's default: the local stack holds emulator-only keys).
It is resolved before anything runs, so a missing or wrong passphrase changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulumi_standin.engine import CustomTimeouts, Engine, ResourceState
from pulumi_standin.values import Secret, reveal

STATE_FORMAT = "modal-llm-offline-stack/1"
NOT_THE_ENGINE = "offline stand-in (pulumi_standin), NOT the Pulumi engine"
# Same default as scripts/local-env.sh: the local stack holds emulator-only keys.
DEFAULT_LOCAL_PASSPHRASE = "local-emulator"  # noqa: S105
KDF_ROUNDS = 200_000
SECRET_TAG = "__offline_secret__"  # noqa: S105 (a marker key, not a secret)


class StandinError(Exception):
    """A problem the operator can fix; the message says what and how."""


class SecretBox:
    """Encrypts/decrypts JSON values with a passphrase (see the module docstring)."""

    def __init__(self, passphrase: str, salt: bytes) -> None:
        key = hashlib.pbkdf2_hmac("sha256", passphrase.encode(), salt, KDF_ROUNDS, dklen=64)
        self.salt = salt
        self._enc_key, self._mac_key = key[:32], key[32:]

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        blocks = []
        for counter in range((length + 31) // 32):
            msg = nonce + counter.to_bytes(8, "big")
            blocks.append(hmac.new(self._enc_key, msg, hashlib.sha256).digest())
        return b"".join(blocks)[:length]

    def seal(self, value: Any) -> dict[str, str]:
        plain = json.dumps(value, sort_keys=True).encode()
        nonce = os.urandom(16)
        ct = bytes(a ^ b for a, b in zip(plain, self._keystream(nonce, len(plain)), strict=True))
        mac = hmac.new(self._mac_key, nonce + ct, hashlib.sha256).digest()
        return {
            "nonce": base64.b64encode(nonce).decode(),
            "ciphertext": base64.b64encode(ct).decode(),
            "mac": base64.b64encode(mac).decode(),
        }

    def open(self, sealed: Mapping[str, str], where: str) -> Any:
        nonce = base64.b64decode(sealed["nonce"])
        ct = base64.b64decode(sealed["ciphertext"])
        mac = hmac.new(self._mac_key, nonce + ct, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, base64.b64decode(sealed["mac"])):
            raise StandinError(
                f"{where}: cannot decrypt with this passphrase (wrong passphrase or edited"
                " file). Set OFFLINE_STACK_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE) to the"
                " passphrase the state was written with."
            )
        ks = self._keystream(nonce, len(ct))
        return json.loads(bytes(a ^ b for a, b in zip(ct, ks, strict=True)))


def passphrase_for(stack: str) -> str:
    for var in ("OFFLINE_STACK_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE"):
        value = os.environ.get(var)
        if value:
            return value
    if stack == "local":
        return DEFAULT_LOCAL_PASSPHRASE
    raise StandinError(
        f"stack '{stack}': no passphrase to encrypt the state's secrets, so nothing was run."
        " Export OFFLINE_STACK_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE) and rerun."
    )


def seal_tree(value: Any, box: SecretBox) -> Any:
    if isinstance(value, Secret):
        return {SECRET_TAG: box.seal(reveal(value.value))}
    if isinstance(value, Mapping):
        return {k: seal_tree(v, box) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [seal_tree(v, box) for v in value]
    return value


def open_tree(value: Any, box: SecretBox, where: str) -> Any:
    if isinstance(value, dict):
        if set(value) == {SECRET_TAG}:
            return Secret(box.open(value[SECRET_TAG], where))
        return {k: open_tree(v, box, where) for k, v in value.items()}
    if isinstance(value, list):
        return [open_tree(v, box, where) for v in value]
    return value


@dataclass
class StateFile:
    """Loads into / saves from an `Engine` (its states and pending deletes) + stack outputs."""

    path: Path
    stack: str
    salt: bytes = field(default_factory=lambda: os.urandom(16))
    #: Stack outputs of the last `up` (engine-side values: Secret-wrapped where secret).
    outputs: dict[str, Any] = field(default_factory=dict)
    _box: SecretBox | None = None

    @property
    def box(self) -> SecretBox:
        if self._box is None:
            self._box = SecretBox(passphrase_for(self.stack), self.salt)
        return self._box

    @classmethod
    def load(cls, path: Path, stack: str, engine: Engine | None = None) -> StateFile:
        if not path.exists():
            return cls(path, stack)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise StandinError(
                f"state file {path}: unreadable ({exc}); fix or move it away and rerun"
            ) from None
        if doc.get("format") != STATE_FORMAT or doc.get("stack") != stack:
            raise StandinError(
                f"state file {path}: holds format {doc.get('format')!r} of stack"
                f" {doc.get('stack')!r}, expected {STATE_FORMAT!r} of stack '{stack}'."
                " Pass the right --state FILE."
            )
        state = cls(path, stack, base64.b64decode(doc["encryption"]["salt"]))
        box = state.box
        box.open(doc["encryption"]["check"], f"state file {path}")
        state.outputs = open_tree(doc.get("outputs") or {}, box, f"state file {path}, outputs")
        if engine is not None:
            for r in doc["resources"]:
                where = f"state file {path}, resource {r['name']}"
                st = ResourceState(
                    name=r["name"],
                    provider=r["provider"],
                    id=r["id"],
                    inputs=open_tree(r["inputs"], box, where),
                    outputs=open_tree(r["outputs"], box, where),
                    secret_outputs=tuple(r.get("secret_outputs", ())),
                    type=r.get("type", ""),
                    protect=bool(r.get("protect")),
                    retain_on_delete=bool(r.get("retain_on_delete")),
                    pending_delete=bool(r.get("pending_delete")),
                    urn=r.get("urn", ""),
                    custom_timeouts=CustomTimeouts(**(r.get("custom_timeouts") or {})),
                )
                if st.pending_delete:
                    engine.pending_deletes.append(st)
                else:
                    engine.states[st.name] = st
        return state

    def save(self, engine: Engine) -> None:
        resources = []
        for st in [*engine.states.values(), *engine.pending_deletes]:
            resources.append(
                {
                    "name": st.name,
                    "type": st.type,
                    "urn": st.urn,
                    "id": st.id,
                    "protect": st.protect,
                    "retain_on_delete": st.retain_on_delete,
                    "pending_delete": st.pending_delete,
                    "secret_outputs": list(st.secret_outputs),
                    # seconds; the delete of a resource uses the ones stored with it
                    "custom_timeouts": st.custom_timeouts.as_dict(),
                    "inputs": seal_tree(st.inputs, self.box),
                    "outputs": seal_tree(st.outputs, self.box),
                    "provider": st.provider if isinstance(st.provider, str) else "",
                }
            )
        doc = {
            "format": STATE_FORMAT,
            "note": f"written by {NOT_THE_ENGINE}",
            "stack": self.stack,
            "encryption": {
                "kdf": f"pbkdf2-hmac-sha256/{KDF_ROUNDS}",
                "cipher": "hmac-sha256-ctr + hmac-sha256 (encrypt-then-mac)",
                "salt": base64.b64encode(self.salt).decode(),
                "check": self.box.seal("offline-stack"),
            },
            "resources": resources,
            "outputs": seal_tree(self.outputs, self.box),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, self.path)
