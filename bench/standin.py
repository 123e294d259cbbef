"""The engine the benchmarks run: the product's stand-in engine (serving/standin_engine.py),
under the name and model the proxy benchmark was written for (it used the test stub before;
benchmarks import nothing from tests/)."""

from __future__ import annotations

from typing import Any

from serving.standin_engine import PROJECT_ROOT, StandinEngineProcess

__all__ = ["PROJECT_ROOT", "StubEngineProcess"]


class StubEngineProcess(StandinEngineProcess):
    """`StandinEngineProcess` serving the model name the load generator sends (`stub-model`).

    `record` is accepted for the stub's signature: the stand-in keeps no request log anyway,
    which is what the benchmark asked for with `record=False`.
    """

    def __init__(self, *, record: bool = False, model: str = "stub-model", **settings: Any) -> None:
        super().__init__(model=model, **settings)
