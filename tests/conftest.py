"""Root conftest: shared fixtures live in tests/harness/ (test infrastructure, not product).

Order: test files with the most `slow`-marked tests run first. `make test` runs the suite on
three pytest-xdist workers with `--dist loadfile`, which hands out whole files in collection
order as workers free up; the longest files (the release and review-stack suites, minutes
each) collected last would leave two workers idle at the end while the third finishes them.
Only the order of files changes; the tests of a file keep their order, so module fixtures
stay whole.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.harness.fixtures"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        path = str(item.path)
        first.setdefault(path, i)
        slow[path] = slow.get(path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: (-slow[str(item.path)], first[str(item.path)]))
