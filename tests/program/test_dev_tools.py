"""Issue 33 item 5: the dev tools (dev/, the `modal-llm-iac-dev` distribution) beside the product.

- Each tool finds the repository it was installed from (`make setup`: editable), from dev/.
- The stand-in of the Pulumi engine runs the project the current directory is in, as the
  CLI does, so a copy of the checkout (a PR's) runs its own program with tools installed
  from another checkout.
- A stack that asks for the stand-in engine without the dev tools installed stops with what
  was asked, what is missing and what to run.
"""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec
from pathlib import Path

import pulumi
import pytest

import bench.gpu.device
import bench.gpu.payload
import emulator.process
import pulumi_standin.program
import pulumi_standin.server
import standin_engine
from components.llm_service import STANDIN_ENGINE_MODULE, require_standin_engine

ROOT = Path(__file__).resolve().parents[2]


def test_each_dev_tool_finds_the_repository() -> None:
    assert (ROOT / "Pulumi.yaml").is_file() and (ROOT / "dev" / "pyproject.toml").is_file()
    found = {
        "emulator.process": emulator.process.PROJECT_ROOT,
        "pulumi_standin.program": pulumi_standin.program.PROJECT_ROOT,
        "pulumi_standin.server": pulumi_standin.server.PROJECT_ROOT,
        "standin_engine": standin_engine.PROJECT_ROOT,
        "bench.gpu.device": bench.gpu.device.ROOT,
        "bench.gpu.payload": bench.gpu.payload.ROOT,
    }
    assert {name: root for name, root in found.items() if root != ROOT} == {}
    # they come from dev/ (the dev distribution), not from a copy at the root
    assert Path(standin_engine.__file__).resolve() == ROOT / "dev" / "standin_engine.py"
    assert Path(emulator.process.__file__).resolve().is_relative_to(ROOT / "dev" / "emulator")


def test_the_pulumi_standin_runs_the_project_of_the_current_directory(tmp_path: Path) -> None:
    copy = tmp_path / "checkout"
    (copy / "access").mkdir(parents=True)
    (copy / "Pulumi.yaml").write_text("name: modal-llm\n")
    (copy / "access" / "Pulumi.yaml").write_text("name: modal-llm-access\n")
    (copy / "docs").mkdir()
    here = pulumi_standin.program.project_here
    assert here(copy) == copy.resolve()
    assert here(copy / "docs") == copy.resolve()  # a parent's Pulumi.yaml, as the CLI finds it
    assert here(copy / "access") == (copy / "access").resolve()
    assert here(tmp_path) == pulumi_standin.program.PROJECT_ROOT  # no project: this repository


def test_the_standin_engine_without_the_dev_tools_is_refused_with_the_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_standin_engine("chat")  # installed here (`make setup`): nothing to say
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == STANDIN_ENGINE_MODULE else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(pulumi.RunError) as err:
        require_standin_engine("chat")
    text = str(err.value)
    assert "service 'chat'" in text and "modal-llm:engineStandin is true" in text
    assert "'standin_engine' is not installed" in text
    assert "make setup" in text and "pip install -e ./dev" in text
