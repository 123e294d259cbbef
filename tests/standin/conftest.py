"""One provider server for the engine tests (no emulator: the test provider keeps its objects
in a directory)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pulumi_standin import ProviderServer


@pytest.fixture(scope="module")
def file_server() -> Iterator[ProviderServer]:
    with ProviderServer() as srv:
        yield srv
