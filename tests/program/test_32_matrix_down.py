"""Issue 32's fault matrix, `make down`: kill -9 of the stand-in engine at each delete of the
local stack (the delete applied, its answer not yet back) and of the emulator; then `make up`
heals alone, the endpoint answers, and `make down` leaves nothing
(tests/program/fault_matrix.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.program.fault_matrix import Case, Sandbox, run_case

# Each case runs `make up` up to three times and `make down` once: minutes, not the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CASES = [
    Case("down", "standin", "AppStop"),
    Case("down", "standin", "SecretDelete"),
    Case("down", "standin", "VolumeDelete"),
    Case("down", "standin", "WebhookTokenDelete"),
    Case("down", "standin", "EnvironmentDelete"),
    Case("down", "emulator", "EnvironmentDelete"),
]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Sandbox]:
    sandbox = Sandbox(tmp_path)
    try:
        yield sandbox
    finally:
        sandbox.cleanup()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_make_down_then_up_heals_after_a_kill(box: Sandbox, case: Case) -> None:
    run_case(box, case)
