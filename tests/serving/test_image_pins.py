"""The serving image installs the proxy's dependencies at the versions the tests ran with."""

from __future__ import annotations

import ast
import tomllib

from tests.harness.emulator import PROJECT_ROOT


def _proxy_requirements() -> list[str]:
    tree = ast.parse((PROJECT_ROOT / "serving/app.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PROXY_REQUIREMENTS" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("serving/app.py defines no PROXY_REQUIREMENTS")


def test_every_proxy_requirement_is_pinned_as_in_the_project() -> None:
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    pinned = set(project["project"]["dependencies"])
    wanted = _proxy_requirements()
    assert wanted and all("==" in r for r in wanted)
    assert [r for r in wanted if r not in pinned] == []
    # What the proxy imports at run time is among them (simdjson: the fast body check).
    names = {r.split("==")[0] for r in wanted}
    assert {"uvloop", "httptools", "orjson", "pysimdjson"} <= names
