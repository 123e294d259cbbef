"""Web endpoint URLs in Modal's pattern: `https://<workspace>[-<env suffix>]--<label>.modal.run`.

The label is `<app>-<function>` (lowercase; characters outside [a-z0-9-] become '-'; a class
method `Cls.meth` gives `<app>-cls-meth`), or the endpoint's requested label. Apps that are not
deployed (`modal serve` / `modal run`: ephemeral or detached) get `-dev` (or the client's
`MODAL_DEV_SUFFIX`) appended to the label, as Modal does, so they never take a deployed URL.
A DNS label holds at most 63 characters: longer ones are truncated and end with a short hash,
like Modal's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

MAX_DNS_LABEL = 63
_BAD = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class WebUrl:
    url: str
    truncated: bool = False
    has_unique_hash: bool = False
    #: Modal's `https://...modal.run` URL when `url` is the local edge's (it names the endpoint:
    #: ownership and collisions are decided on it).
    modal_url: str = ""

    @property
    def identity(self) -> str:
        return self.modal_url or self.url


def _clean(text: str) -> str:
    return _BAD.sub("-", text.lower()).strip("-")


def web_url(
    workspace: str,
    env_suffix: str,
    app_name: str,
    function_name: str,
    requested: str = "",
    dev_suffix: str = "",
) -> WebUrl:
    """The URL; `dev_suffix` (e.g. "dev") is appended for apps that are not deployed."""
    prefix = _clean(workspace) + (f"-{_clean(env_suffix)}" if env_suffix else "")
    label = _clean(requested) if requested else _clean(f"{app_name}-{function_name}")
    tail = f"-{_clean(dev_suffix)}" if dev_suffix else ""
    room = MAX_DNS_LABEL - len(prefix) - 2 - len(tail)
    if len(label) <= room:
        return WebUrl(f"https://{prefix}--{label}{tail}.modal.run")
    digest = hashlib.sha256(label.encode()).hexdigest()[:6]
    short = label[: max(room - 7, 1)].rstrip("-")
    return WebUrl(f"https://{prefix}--{short}-{digest}{tail}.modal.run", True, True)
