"""Issue 32's fault matrix, `make down`: kill -9 of the stand-in engine at each delete of the
local stack (the delete applied, its answer not yet back) and of the emulator; then `make up`
heals alone, the endpoint answers, and `make down` leaves nothing
(tests/program/fault_matrix.py)."""

from __future__ import annotations

import pytest

from tests.program.fault_matrix import Case, Sandbox, box, run_case

# Each case runs `make up` up to three times and `make down` once: minutes, not the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

__all__ = ["box"]  # the fixture, from fault_matrix

CASES = [
    Case("down", "standin", "AppStop"),
    Case("down", "standin", "SecretDelete"),
    Case("down", "standin", "VolumeDelete"),
    Case("down", "standin", "WebhookTokenDelete"),
    Case("down", "standin", "EnvironmentDelete"),
    Case("down", "emulator", "EnvironmentDelete"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_make_down_then_up_heals_after_a_kill(box: Sandbox, case: Case) -> None:
    run_case(box, case)
