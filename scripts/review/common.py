"""What every part of the review stacks shares: the checkout's root, names, times, errors.

The project's namespaces and defaults, `ReviewError` (an operator-fixable failure: main prints
it and exits 1), the stack and identity names of pull request N (`pr-N`, `pr-N-deploy`), ISO
times, the fork test, and the file names of what `plan` and `up` write (review_comment.FILES).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import review_comment

#: The checkout these scripts belong to (scripts/review/ -> the repository root).
ROOT = Path(__file__).resolve().parents[2]

NS = "modal-llm"
DEFAULT_BUDGET_USD = 20
DEFAULT_MAX_CONTAINERS = 1
DEFAULT_SWEEP_DAYS = 7
DEFAULT_BASE_STACK = "dev"
STANDIN_DEFAULT_PASSPHRASE = "local-emulator"  # noqa: S105 (emulator-only throwaway keys)
REVIEW_STACK = re.compile(r"(?:^|/)pr-(?P<pr>[1-9][0-9]*)$")
ACCESS_DIR = "access"  # the access project (access/Pulumi.yaml, project modal-llm-access)
ACCESS_NS = "modal-llm-access"
FILES = review_comment.FILES


class ReviewError(RuntimeError):
    """Something the operator can fix: the message says what and how."""


def stack_name(pr: int) -> str:
    return f"pr-{pr}"


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(text: Any) -> dt.datetime | None:
    """An ISO 8601 / RFC 3339 time (Pulumi's `lastUpdate`, our `updated_at`), or None."""
    if not isinstance(text, str) or not text.strip():
        return None
    value = text.strip().replace("Z", "+00:00")
    value = re.sub(r"(\.\d{6})\d+", r"\1", value)  # nanoseconds -> microseconds
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def is_fork(head_repo: str, base_repo: str) -> bool:
    return head_repo.strip().lower() != base_repo.strip().lower()


def deploy_identity(pr: int) -> str:
    return f"{stack_name(pr)}-deploy"
