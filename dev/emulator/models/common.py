"""Shared model vocabulary: creation types and list pagination."""

from __future__ import annotations

import enum

#: Modal lists at most this many objects per page; the client pages while a page is full.
PAGE_SIZE = 100


class Creation(enum.Enum):
    """How a get-or-create request treats an existing / missing object."""

    LOOKUP = "lookup"  # NOT_FOUND when missing
    FAIL_IF_EXISTS = "fail_if_exists"  # ALREADY_EXISTS when present
    IF_MISSING = "if_missing"  # return the existing one, else create
    OVERWRITE = "overwrite"  # replace the existing one's content, else create
    ANONYMOUS = "anonymous"  # nameless object owned by an app (or ephemeral)


def page_bounds(max_objects: int, created_before: float) -> tuple[int, float]:
    """(limit, upper bound) for a list request; 0 means the default page / no bound."""
    limit = PAGE_SIZE if max_objects <= 0 else min(max_objects, PAGE_SIZE)
    bound = created_before if created_before > 0 else float("inf")
    return limit, bound
