"""Issue 32's fault matrix, `make up`: kill -9 of the stand-in engine at each create of the
local stack (the create applied, its answer not yet back), of the emulator, the deploy
runner, and the container's proxy and engine; then `make up` heals alone, the endpoint
answers, and `make down` leaves nothing (tests/program/fault_matrix.py)."""

from __future__ import annotations

import pytest

from tests.program.fault_matrix import Case, Sandbox, box, run_case

# Each case runs `make up` up to three times and `make down` once: minutes, not the default 120 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

__all__ = ["box"]  # the fixture, from fault_matrix

CASES = [
    Case("up", "standin", "EnvironmentCreate"),
    Case("up", "standin", "SecretGetOrCreate"),
    Case("up", "standin", "VolumeGetOrCreate"),
    Case("up", "standin", "WebhookTokenCreate"),
    Case("up", "standin", "EnvironmentSetBudget"),
    Case("up", "standin", "AppPublish"),
    Case("up", "emulator", "SecretGetOrCreate"),
    Case("up", "emulator", "AppPublish"),
    Case("up", "runner", "AppPublish"),
    Case("up", "proxy"),
    Case("up", "engine"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_make_up_heals_after_a_kill(box: Sandbox, case: Case) -> None:
    run_case(box, case)
