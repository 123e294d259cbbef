"""The engine the benchmarks run: the product's stand-in engine (dev/standin_engine.py),
under the name and model the proxy benchmark was written for (it used the test stub before;
benchmarks import nothing from tests/)."""

from __future__ import annotations

from typing import Any

from standin_engine import PROJECT_ROOT, StandinEngineProcess

__all__ = ["PROJECT_ROOT", "StubEngineProcess"]


class StubEngineProcess(StandinEngineProcess):
    """`StandinEngineProcess` serving the model name every load-generator body sends (`m`:
    it keeps the small chat body at the issue's 68 bytes).

    `record` is accepted for the stub's signature: the stand-in keeps no request log anyway,
    which is what the benchmark asked for with `record=False`.
    """

    def __init__(self, *, record: bool = False, model: str = "m", **settings: Any) -> None:
        super().__init__(model=model, **settings)

    def configure(self, **settings: Any) -> None:
        """New behaviour (e.g. ``token_delay_ms``): the stand-in has no run-time control
        route, so it restarts with the new settings on the same port (the proxies under test
        keep their upstream URL and reconnect; each bench slice has an uncounted warm-up)."""
        self.check_settings(settings)
        self.behaviour.update(settings)
        self.stop()
        self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid
