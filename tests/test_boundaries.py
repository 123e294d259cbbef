"""The boundaries between the parts (shared design: "Parts and the way data flows"), checked on
every import statement of the product code, so a newcomer's shortcut fails here, not in review.

- Nothing outside tests/ imports tests/ (test infrastructure products need is a package).
- The product (components/, serving/, watchers/, access/, the program) imports none of the
  dev tools (dev/: emulator, pulumi_standin, bench, standin_engine): its wheel ships without
  them (tests/program/test_wheel.py).
- dev/emulator/ imports no pulumi, components, serving, watchers or pulumi_standin.
- serving/ and watchers/ (code that runs in Modal containers) import neither pulumi nor
  components/ nor pulumi_standin.
- components/modal/ (the provider library) imports nothing from serving/.
- dev/standin_engine.py runs in the serving container beside serving/ alone: it imports only
  serving/ of ours.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEV_TOOLS = ("emulator", "pulumi_standin", "bench", "standin_engine")
PRODUCT = ["components", "serving", "watchers", "access", "__main__.py"]
DEV = ["dev/emulator", "dev/pulumi_standin", "dev/bench", "dev/standin_engine.py", "scripts"]
FORBIDDEN = {
    "dev/emulator": ("pulumi", "components", "serving", "watchers", "pulumi_standin", "tests"),
    "serving": ("pulumi", "components", "watchers", "tests", *DEV_TOOLS),
    "watchers": ("pulumi", "components", "serving", "tests", *DEV_TOOLS),
    "components/modal": ("serving", "watchers", "tests"),
    "components": ("tests", *DEV_TOOLS),
    "access": ("tests", *DEV_TOOLS),
    "__main__.py": ("tests", *DEV_TOOLS),
    "dev/standin_engine.py": ("components", "watchers", "tests", *DEV_TOOLS),
    "dev/pulumi_standin": ("tests",),
    "dev/bench": ("tests",),
    "scripts": ("tests",),
}


def files_of(part: str) -> list[Path]:
    path = ROOT / part
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def product_files() -> list[Path]:
    return [f for part in PRODUCT + DEV for f in files_of(part)]


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_part_imports_only_what_its_boundary_allows(part: str) -> None:
    banned = FORBIDDEN[part]
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in files_of(part)
        for line, module in imported_modules(path)
        if module in banned
    ]
    assert offenders == [], "\n".join(offenders)


def test_no_product_file_imports_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in product_files()
        for line, module in imported_modules(path)
        if module == "tests"
    ]
    assert offenders == []


def test_the_checker_sees_imports() -> None:
    """The scan must find what it looks for (a checker that finds nothing proves nothing)."""
    mods = {m for _, m in imported_modules(ROOT / "tests" / "harness" / "emulator.py")}
    assert "emulator" in mods
    assert len(product_files()) > 50
