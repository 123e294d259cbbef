"""Object ids and name rules, shaped like Modal's.

Ids are `<prefix>-<22 alphanumerics>` (the CLI matches app ids with `^ap-[a-zA-Z0-9]{22}$`).
Random ids come from `new_id`; content-addressed ids (images, mounts) from `content_id`, so the
same content always gets the same id and a redeploy of unchanged code is a cache hit.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string

from emulator.errors import InvalidArgument

ID_SUFFIX_LEN = 22
_ALPHABET = string.ascii_letters + string.digits
_NAME_RE = re.compile(r"^[a-zA-Z0-9_.-]+$")
#: New environment names: first character alphanumeric, then letters, digits, '-', '_'.
_ENV_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]*$")
#: Existing environment names may also hold '.', so lookups accept it.
_ENV_LOOKUP_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
MAX_NAME_LEN = 64

#: Prefix per kind, as Modal checks them when hydrating objects.
PREFIXES = {
    "secret": "st",
    "volume": "vo",
    "app": "ap",
    "function": "fu",
    "class": "cs",
    "image": "im",
    "mount": "mo",
    "environment": "en",
    "proxy_token": "wk",
    "proxy_token_secret": "ws",
    "definition": "de",
    "blob": "bl",
    "task": "ta",
    "function_call": "fc",
    "input": "in",
    "dict": "di",
    "service_user": "su",
}


def new_id(kind: str) -> str:
    """A fresh random id for `kind` (a key of PREFIXES)."""
    suffix = "".join(secrets.choice(_ALPHABET) for _ in range(ID_SUFFIX_LEN))
    return f"{PREFIXES[kind]}-{suffix}"


def content_id(kind: str, digest_source: bytes) -> str:
    """A deterministic id for `kind` derived from the sha256 of `digest_source`."""
    digest = hashlib.sha256(digest_source).hexdigest()
    return f"{PREFIXES[kind]}-{digest[:ID_SUFFIX_LEN]}"


def looks_like_id(kind: str, value: str) -> bool:
    """Whether `value` has the shape of an id of `kind`: '<prefix>-' + 22 letters or digits."""
    return re.fullmatch(rf"{PREFIXES[kind]}-[a-zA-Z0-9]{{{ID_SUFFIX_LEN}}}", value) is not None


def check_id(kind: str, value: str) -> str:
    """Raise InvalidArgument unless `value` looks like an id of `kind`."""
    prefix = PREFIXES[kind]
    if not looks_like_id(kind, value or ""):
        shown = value if value else "(empty)"
        raise InvalidArgument(
            f"Malformed {kind.replace('_', ' ')} id {shown!r}: expected '{prefix}-' followed by "
            f"{ID_SUFFIX_LEN} letters or digits."
        )
    return value


def check_name(kind: str, name: str) -> str:
    """Modal object names: letters, digits, '-', '_', '.'; 1 to 64 characters; not an app id.

    The same rule as the client's `modal._utils.name_utils.is_valid_object_name`.
    """
    if not name:
        raise InvalidArgument(f"{kind} name must not be empty.")
    if len(name) > MAX_NAME_LEN:
        raise InvalidArgument(
            f"Invalid {kind} name {name[:80]!r}: {len(name)} characters, at most {MAX_NAME_LEN}."
        )
    if not _NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"Invalid {kind} name {name!r}: use only letters, digits, '-', '_' and '.'."
        )
    if looks_like_id("app", name):
        raise InvalidArgument(
            f"Invalid {kind} name {name!r}: it has the shape of an App ID ('ap-' + 22 letters or "
            "digits), which Modal reserves; pick another name."
        )
    return name


def check_environment_name(name: str, *, allow_periods: bool = False) -> str:
    """Modal environment names (the client's `check_environment_name`).

    1 to 64 characters, the first a letter or digit, then letters, digits, '-' and '_'; not
    starting with 'en-' (reserved for environment ids). New names cannot hold '.', but lookups
    accept it (`allow_periods=True`) because some existing environments have one.
    """
    pattern = _ENV_LOOKUP_RE if allow_periods else _ENV_NAME_RE
    allowed = "letters, digits, '-', '_'" + (" and '.'" if allow_periods else "")
    if not name or len(name) > MAX_NAME_LEN or not pattern.fullmatch(name):
        raise InvalidArgument(
            f"Invalid environment name {name[:80]!r}: use 1-{MAX_NAME_LEN} characters, starting "
            f"with a letter or digit, then only {allowed}."
        )
    if name.lower().startswith("en-"):
        raise InvalidArgument(
            f"Invalid environment name {name!r}: the 'en-' prefix is reserved for environment ids."
        )
    return name
