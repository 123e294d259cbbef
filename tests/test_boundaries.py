"""The boundaries between the parts (shared design: "Parts and the way data flows"), checked on
every import statement of the product code, so a newcomer's shortcut fails here, not in review.

- Nothing outside tests/ imports tests/ (test infrastructure products need is a package).
- emulator/ imports no pulumi, components, serving, watchers or pulumi_standin.
- serving/ and watchers/ (code that runs in Modal containers) import neither pulumi nor
  components/ nor pulumi_standin.
- components/modal/ (the provider library) imports nothing from serving/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ["emulator", "components", "serving", "watchers", "pulumi_standin", "bench", "scripts"]
FORBIDDEN = {
    "emulator": ("pulumi", "components", "serving", "watchers", "pulumi_standin", "tests"),
    "serving": ("pulumi", "components", "pulumi_standin", "watchers", "tests"),
    "watchers": ("pulumi", "components", "pulumi_standin", "serving", "tests"),
    "components/modal": ("serving", "watchers", "tests"),
    "components": ("tests", "pulumi_standin"),
    "pulumi_standin": ("tests",),
    "bench": ("tests",),
    "scripts": ("tests",),
}


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
    files = [ROOT / "__main__.py"]
    for part in PRODUCT:
        files += sorted((ROOT / part).rglob("*.py"))
    return files


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_part_imports_only_what_its_boundary_allows(part: str) -> None:
    banned = FORBIDDEN[part]
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in sorted((ROOT / part).rglob("*.py"))
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
