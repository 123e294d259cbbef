"""API keys: load the named sha256 digests from ``SERVING_API_KEYS`` and check a presented key.

``SERVING_API_KEYS`` is a JSON object ``{"<name>": "sha256:<64 hex digits>", ...}`` (the same
JSON the Modal Secret holds; plaintext keys never reach the container). A presented key is
hashed once and compared with ``hmac.compare_digest`` against *every* digest, without an
early exit, so timing does not tell which key (or how much of one) matched.

Nothing here ever puts a key or a digest into a message: errors name the entry and the rule.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re

ENV_VAR = "SERVING_API_KEYS"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# RFC 6750 token68 characters; anything else in a key is "malformed" (401).
_KEY_RE = re.compile(rb"[A-Za-z0-9._~+/=-]{1,512}")


class KeyConfigError(ValueError):
    """``SERVING_API_KEYS`` is missing or malformed (the message never contains a value)."""


def digest_of(key: str) -> str:
    """The ``sha256:<hex>`` form stored for a plaintext key (for tools and tests)."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Named key digests; ``match`` returns the name of the key presented, or None."""

    def __init__(self, digests: dict[str, str]) -> None:
        self._entries: list[tuple[str, bytes]] = [
            (name, bytes.fromhex(value.removeprefix("sha256:"))) for name, value in digests.items()
        ]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._entries]

    def match(self, key: bytes) -> str | None:
        presented = hashlib.sha256(key).digest()
        found: str | None = None
        for name, stored in self._entries:  # no early exit: constant work per key
            if hmac.compare_digest(presented, stored) and found is None:
                found = name
        return found

    @classmethod
    def from_json(cls, raw: str | None) -> KeyRing:
        """Parse and validate the env value; raises ``KeyConfigError`` naming what is wrong."""
        fix = (
            f'Set {ENV_VAR} to a JSON object like {{"alice": "sha256:<64 hex digits>"}}; '
            'a digest is "sha256:" + sha256(key).hexdigest().'
        )
        if raw is None or not raw.strip():
            raise KeyConfigError(f"{ENV_VAR} is not set or empty: the proxy has no API keys. {fix}")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            # exc.pos is safe to show; exc.msg could quote nothing secret but keep it generic.
            raise KeyConfigError(
                f"{ENV_VAR} is not valid JSON (error at character {getattr(exc, 'pos', '?')}). "
                f"{fix}"
            ) from None
        if not isinstance(data, dict):
            raise KeyConfigError(
                f"{ENV_VAR} must be a JSON object, got a JSON {type(data).__name__}. {fix}"
            )
        if not data:
            raise KeyConfigError(f"{ENV_VAR} is an empty object: no key could ever pass. {fix}")
        for name, value in data.items():
            if not _NAME_RE.fullmatch(name):
                raise KeyConfigError(
                    f"{ENV_VAR}: key name #{list(data).index(name) + 1} is not 1-64 characters "
                    "of [A-Za-z0-9._-] starting with a letter or digit (names tag logs and "
                    f"metrics). {fix}"
                )
            if not isinstance(value, str) or not _DIGEST_RE.fullmatch(value):
                kind = (
                    f"a string of {len(value)} characters"
                    if isinstance(value, str)
                    else f"a JSON {type(value).__name__}"
                )
                raise KeyConfigError(
                    f"{ENV_VAR}: the entry for key {name!r} is not 'sha256:' followed by 64 "
                    f"lowercase hex digits (got {kind}; value not shown). Store digests, never "
                    f"plaintext keys. {fix}"
                )
        return cls(data)


def parse_bearer(header: bytes | None) -> bytes | None:
    """The key from ``Authorization: Bearer <key>``, or None when missing or malformed."""
    if not header:
        return None
    scheme, _, key = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    key = key.strip(b" ")
    if not _KEY_RE.fullmatch(key):
        return None
    return key
