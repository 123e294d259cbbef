"""Issue 14 item 12: the control port refuses non-finite numbers (NaN, ±Infinity) with 400.

Python's `json` reads `NaN`, `Infinity` and `1e999` as floats, and `float()` reads the strings
"nan"/"inf"; none of them is an amount of dollars. A refusal leaves the state unchanged.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.harness.emulator import EmulatorProcess

BODIES = {
    "NaN": '{"environment": "main", "usd": NaN}',
    "Infinity": '{"environment": "main", "usd": Infinity}',
    "-Infinity": '{"environment": "main", "usd": -Infinity}',
    "1e999": '{"environment": "main", "usd": 1e999}',
    "string-inf": '{"environment": "main", "usd": "inf"}',
    "string-nan": '{"environment": "main", "usd": "nan"}',
}


def _post(emu: EmulatorProcess, path: str, body: str) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        emu.control_url + path,
        data=body.encode(),
        method="POST",
        headers={**emu.control_headers(), "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_14_12_usage_rejects_non_finite_numbers(emulator: EmulatorProcess, body: str) -> None:
    emulator.set_usage("main", 4.5)
    status, answer = _post(emulator, "/_emulator/usage", body)
    assert status == 400, (status, answer)
    message = str(answer["error"])
    assert "finite" in message and "usd" in message, message
    (env,) = emulator.state()["environments"]
    assert env["usage_usd"] == 4.5  # unchanged


def test_14_12_usage_still_takes_finite_numbers(emulator: EmulatorProcess) -> None:
    status, answer = _post(emulator, "/_emulator/usage", '{"environment": "main", "usd": 7}')
    assert (status, answer["usage_usd"]) == (200, 7.0)
    status, answer = _post(emulator, "/_emulator/usage", '{"environment": "main", "usd": 0.25}')
    assert (status, answer["usage_usd"]) == (200, 0.25)
