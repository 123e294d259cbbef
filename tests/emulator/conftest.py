"""Fixtures of the emulator tests that run containers (see runtime_support.py)."""

from tests.emulator.runtime_support import rt, rt_emulator

__all__ = ["rt", "rt_emulator"]
