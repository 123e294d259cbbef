"""Test-facing name of the emulator launcher; the code lives in `dev/emulator/process.py` (products
such as dev/bench/ and scripts/ use it too, and they import nothing from tests/)."""

from __future__ import annotations

from emulator.process import (
    DEFAULT,
    DEFAULT_TOKEN_ID,
    DEFAULT_TOKEN_SECRET,
    DEFAULT_WORKSPACE,
    PROJECT_ROOT,
    EmulatorError,
    EmulatorProcess,
)

__all__ = [
    "DEFAULT",
    "DEFAULT_TOKEN_ID",
    "DEFAULT_TOKEN_SECRET",
    "DEFAULT_WORKSPACE",
    "PROJECT_ROOT",
    "EmulatorError",
    "EmulatorProcess",
]
