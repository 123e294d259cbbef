"""The stand-in engine's command line (dev/standin_engine.py, the local stack's engine)."""

from __future__ import annotations

from collections.abc import Sequence

from serving.render._common import fmt_float
from serving.spec import EngineStandin, ServingSpec


def command(spec: ServingSpec, engine_argv: Sequence[str], *, python: str) -> list[str]:
    """dev/standin_engine.py given the real engine command line after `--` (it checks that
    line's flags against the pinned parser and serves on its host/port/model name)."""
    standin = spec.engine_standin or EngineStandin()
    cmd = [python, "-m", "standin_engine"]
    if standin.fail is not None:
        cmd += ["--fail", standin.fail]
    if standin.startup_delay_s:
        cmd += ["--startup-delay-s", fmt_float(standin.startup_delay_s)]
    return [*cmd, "--", *engine_argv]
