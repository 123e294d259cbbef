"""Issue 32's fault matrix, a release (an `up` that changes the service's spec): kill -9 of the
stand-in engine, the emulator and the deploy runner while the new version is published, and of
the new container's proxy and engine while the release waits on its health gate; then `make
up` heals alone, the endpoint answers, and `make down` leaves nothing
(tests/program/fault_matrix.py)."""

from __future__ import annotations

import pytest

from tests.program.fault_matrix import Case, Sandbox, box, run_case

# Each case runs `make up` up to three times and `make down` once: minutes, not the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

__all__ = ["box"]  # the fixture, from fault_matrix

CASES = [
    Case("release", "standin", "AppPublish"),
    Case("release", "emulator", "AppPublish"),
    Case("release", "runner", "AppPublish"),
    Case("release", "proxy"),
    Case("release", "engine"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_release_heals_after_a_kill(box: Sandbox, case: Case) -> None:
    run_case(box, case)
