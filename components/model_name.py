"""Whether a service's model name exists, asked of the Hugging Face hub when it answers.

Checked offline, before this (components/config.py `_service_rules`): a service whose weights
volume is provisioned from `weights.repo` must name that same model. Checked here, at preview
and `up`: the hub's model-info API (`huggingface_hub.HfApi.model_info`, huggingface-hub 2.4.0
hf_api.py; GET `<endpoint>/api/models/<repo>[/revision/<rev>]`) for the model and its pinned
revision, with a short timeout, unless `HF_HUB_OFFLINE` is set. The hub's answer decides:

- found (a gated repo too: its metadata is public): nothing to say;
- no such repo (`RepositoryNotFoundError`: 404 `X-Error-Code: RepoNotFound`, or 401 for a
  repo this machine's token cannot see) or no such revision (`RevisionNotFoundError`): an
  error, since the deploy would fail when the engine (or ModelWeights) downloads the model.
  Only a warning where the name may still be right: no such repo, but the stack has an HF
  token that may see a private repo this machine cannot; or the stand-in engine runs (it never
  loads the model);
- no answer (no network, HF_HUB_OFFLINE, a timeout, a 5xx): one line saying the name is not
  checked and where a real deploy would fail.

An S3 weights source names no hub repo: its model name is not asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

#: Seconds the hub gets to answer: a preview never waits on the network for long.
HUB_TIMEOUT_S = 5.0
#: huggingface_hub's default (constants.py `_HF_DEFAULT_ENDPOINT`).
DEFAULT_ENDPOINT = "https://huggingface.co"
#: huggingface_hub's spellings of "true" (constants.py ENV_VARS_TRUE_VALUES).
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubAnswer:
    """What the hub said about one model: `found`, `no-repo` / `no-revision` (what is missing
    in `detail`) or `unchecked` (why in `detail`)."""

    verdict: Literal["found", "no-repo", "no-revision", "unchecked"]
    endpoint: str
    detail: str = ""


def hub_endpoint(override: str | None = None) -> str:
    """The hub the engine would download from: a weights source's `endpoint`, else env
    HF_ENDPOINT (read now: huggingface_hub reads it once, at import), else huggingface.co."""
    return (override or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def ask_hub(
    model: str,
    revision: str | None,
    *,
    endpoint: str | None = None,
    timeout: float = HUB_TIMEOUT_S,
) -> HubAnswer:
    """Ask the hub whether `model` (at `revision`, when pinned) exists; never raises."""
    where = hub_endpoint(endpoint)
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE:  # before the import reads it
        return HubAnswer("unchecked", where, "HF_HUB_OFFLINE is set, so the hub is not asked")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        HfApi(endpoint=where).model_info(model, revision=revision, timeout=timeout)
    except GatedRepoError:  # a RepositoryNotFoundError, but the repo exists
        return HubAnswer("found", where)
    except RevisionNotFoundError:
        return HubAnswer("no-revision", where, f"it has no revision {revision!r}")
    except RepositoryNotFoundError:
        return HubAnswer("no-repo", where, "it has no model of that name visible to this machine")
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        return HubAnswer("unchecked", where, f"the hub answered HTTP {status}")
    except Exception as exc:  # no answer at all: DNS, refused, timeout, TLS, offline mode
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        return HubAnswer("unchecked", where, f"the hub was not reachable ({text})")
    return HubAnswer("found", where)
