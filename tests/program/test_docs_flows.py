"""The docs check (issue 34): every flow marked runnable in README.md and docs/*.md runs as
written, on a fresh copy of this checkout, against the local stack (docs/docs-check.md).

One test per flow found in the docs, each in its own copy of the checkout (tracked files and
new ones not ignored, as a clone of the branch holds them, with this checkout's venv linked in)
and its own HOME, emulator port and gateway port, so a developer's own `make up` is never met;
`make down` runs in the copy whatever happened. The extractor's own tests are fast and run first:
a doc edit that breaks a marker fails them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.harness import docs_check
from tests.harness.docs_check import DocsCheckError
from tests.program.fault_matrix import MARKER, processes
from tests.program.live_stack import free_port_pair
from tests.program.runner import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
from review.checkout import copy_checkout  # as the review demo and its tests import it

DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
FLOWS = docs_check.flows(DOCS, PROJECT_ROOT)
FLOW_TIMEOUT_S = 420.0
#: How long a process of the flow may take to exit after `make down` returned.
LEFT_GRACE_S = 10.0
#: A flow ending with one of these has stopped all it started (README: "no process is left").
TEARDOWNS = ("make down", "make review-demo")

# The flows the docs mark (docs/docs-check.md lists them and the ones left unmarked): a marker
# lost in an edit fails here rather than silently dropping its flow from CI.
MARKED = {
    "quickstart",
    "rotation-preview",
    "drift",
    "gateway",
    "prod-preview",
    "review-demo",
    "release",
    "access-stack",
}


def fresh_copy(dest: Path) -> Path:
    """This checkout as a clone of the branch would hold it (a git repository of the files git
    lists here, tracked and new, committed once: the docs as edited, before a commit), with our
    venv linked in; the pyproject files dated like ours so `make setup` leaves it alone."""
    root = copy_checkout(PROJECT_ROOT, dest)
    git = {"PATH": "/usr/bin:/bin", "HOME": str(dest), "GIT_AUTHOR_NAME": "docs-check",
           "GIT_AUTHOR_EMAIL": "docs-check@localhost", "GIT_COMMITTER_NAME": "docs-check",
           "GIT_COMMITTER_EMAIL": "docs-check@localhost"}  # fmt: skip
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "docs-check copy"]):
        subprocess.run(["git", *argv], cwd=root, env=git, check=True, capture_output=True)
    (root / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    for rel in ("pyproject.toml", "dev/pyproject.toml"):
        ours = (PROJECT_ROOT / rel).stat()
        os.utime(root / rel, ns=(ours.st_atime_ns, ours.st_mtime_ns))
    return root


def flow_env(home: Path) -> dict[str, str]:
    """A user's shell without the Pulumi CLI (nor its installer: the stand-in is chosen), on
    free ports; no MAKEFLAGS/MAKELEVEL from a `make test` above us. A marker variable that
    every process the flow starts inherits (as in the fault matrix) finds what it left."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        MARKER: f"docs-check-{uuid.uuid4().hex}",
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "PULUMI_INSTALL_URL": "http://127.0.0.1:9/unreachable",
        "EMULATOR_PORT": str(free_port_pair()),
        "GATEWAY_PORT": str(free_port_pair()),
        "LANG": "C.UTF-8",
    }


def teardown(root: Path, env: dict[str, str]) -> None:
    """`make down` in the copy; the emulator killed by its pid file if that left it running."""
    subprocess.run(
        ["make", "--no-print-directory", "down"],
        cwd=root, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    pid_file = root / ".modal-emulator" / "emulator.pid"
    if pid_file.exists():
        with contextlib.suppress(OSError, ValueError):  # gone already, or no pid in it
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def left_running(env: dict[str, str]) -> list[str]:
    """The flow's processes still running LEFT_GRACE_S after it ended, as `pid N: cmdline`."""
    deadline = time.monotonic() + LEFT_GRACE_S
    while True:
        left = [f"pid {p.pid}: {p.cmdline[:200]}"
                for p in processes(env[MARKER]).values() if p.marked]  # fmt: skip
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


def kill_left(env: dict[str, str]) -> None:
    """SIGKILL what the flow left, and wait (5 s at most) until it is gone."""
    deadline = time.monotonic() + 5
    while (left := [p for p in processes(env[MARKER]).values() if p.marked]) and (
        time.monotonic() < deadline
    ):
        for proc in left:
            with contextlib.suppress(OSError):  # gone already
                os.kill(proc.pid, signal.SIGKILL)
        time.sleep(0.1)


def check_flow(flow: docs_check.Flow, root: Path, env: dict[str, str]) -> list[str]:
    """The flow's problems: its commands' statuses and expected lines, then what it left
    running: after the doc's own teardown (a flow that ends with one) and after ours."""
    left: list[str] = []
    try:
        steps, log = docs_check.run(flow, root, env, FLOW_TIMEOUT_S)
        last = steps[-1]
        if last.status is not None and last.command.text.split("#")[0].strip() in TEARDOWNS:
            left += [f"left running after the flow's `{last.command.text}`: {p}"
                     for p in left_running(env)]  # fmt: skip
    finally:
        teardown(root, env)
        left += [f"left running after `make down`: {p}" for p in left_running(env)]
        kill_left(env)
    found = docs_check.problems(flow, steps) + left
    if found and all(step.status is None for step in steps):
        found.append(f"the flow's whole log:\n{log[-4000:]}")
    return found


# ---- the extractor (fast) ------------------------------------------------------------------

SAMPLE = """\
# A doc

<!-- docs-check: flow=demo expect="hello" -->
```console
$ echo hello
hello
$ printf '%s\\n' \\
    two lines
```

```
$ echo not marked
```

````markdown
<!-- docs-check: flow=example -->
```
$ echo an example of a marker, inside a block: text
```
````

<!-- docs-check: flow=demo status=3 expect="bye" -->
````
$ echo bye; exit_with() { return "$1"; }; exit_with 3
````
"""


def test_extractor_reads_markers_in_order_and_ignores_unmarked_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(SAMPLE)
    found = docs_check.flows([doc], tmp_path)
    assert list(found) == ["demo"]
    flow = found["demo"]
    assert [b.line for b in flow.blocks] == [3, 22]
    first, second = flow.blocks
    assert [c.text for c in first.commands] == ["echo hello", "printf '%s\\n' \\\n    two lines"]
    assert [c.line for c in first.commands] == [5, 7]
    assert first.expect == ("hello",) and first.status == 0
    assert second.status == 3 and second.expect == ("bye",)
    assert all("not marked" not in c.text and "example" not in c.text
               for b in flow.blocks for c in b.commands)  # fmt: skip


def test_extractor_runs_a_flow_and_reports_status_and_missing_lines(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(SAMPLE)
    flow = docs_check.flows([doc], tmp_path)["demo"]
    steps, _ = docs_check.run(flow, tmp_path, {"PATH": "/usr/bin:/bin"}, 30)
    assert [s.status for s in steps] == [0, 0, 3]
    assert docs_check.problems(flow, steps) == []

    doc.write_text(SAMPLE.replace('expect="hello"', 'expect="HTTP 200"'))
    flow = docs_check.flows([doc], tmp_path)["demo"]
    steps, _ = docs_check.run(flow, tmp_path, {"PATH": "/usr/bin:/bin"}, 30)
    assert docs_check.problems(flow, steps) == [
        "doc.md:3: flow 'demo': expected 'HTTP 200' in the output of this block's commands, "
        "not there; fix the doc or the flow"
    ]

    doc.write_text(SAMPLE.replace("$ echo hello", "$ false"))
    flow = docs_check.flows([doc], tmp_path)["demo"]
    steps, _ = docs_check.run(flow, tmp_path, {"PATH": "/usr/bin:/bin"}, 30)
    assert [s.status for s in steps] == [1, None, None]  # it stops at the first failure
    (problem,) = docs_check.problems(flow, steps)
    assert problem.startswith("doc.md:5: `false` (flow 'demo'): exit 1, the doc's marker")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- docs-check: flow=x -->\n\n```\n$ true\n```\n", "is not followed by a fenced block"),
        ("<!-- docs-check: flow=x -->\nno fence\n", "is not followed by a fenced block"),
        ("<!-- docs-check: flow=x -->", "is not followed by a fenced block"),
        ("<!-- docs-check: flow=x -->\n```\noutput only\n```\n", "has no `$ command` line"),
        ("<!-- docs-check: flow=x -->\n```\n$ true\n", "is never closed"),
        ("<!-- docs-check: expect=a -->\n```\n$ true\n```\n", "needs flow=NAME"),
        ("<!-- docs-check: flow=x expct=a -->\n```\n$ true\n```\n", "'expct=a' is not one of"),
        ("<!-- docs-check: flow=x status=ok -->\n```\n$ true\n```\n", "status='ok'"),
    ],
)
def test_extractor_refuses_a_marker_it_cannot_use(tmp_path: Path, text: str, message: str) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    with pytest.raises(DocsCheckError, match="doc.md:1: .*" + re.escape(message)):
        docs_check.flows([doc], tmp_path)


def test_a_flow_lives_in_one_doc(tmp_path: Path) -> None:
    block = "<!-- docs-check: flow=x -->\n```\n$ true\n```\n"
    (tmp_path / "a.md").write_text(block)
    (tmp_path / "b.md").write_text(block)
    with pytest.raises(DocsCheckError, match=r"b.md:1: flow 'x' is already marked in a.md"):
        docs_check.flows([tmp_path / "a.md", tmp_path / "b.md"], tmp_path)


def test_a_process_a_flow_leaves_running_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README says `make down` leaves no process; a flow that leaves one (here a `sleep` its
    teardown does not stop) is reported with the process, which the check then kills."""
    monkeypatch.setattr(sys.modules[__name__], "LEFT_GRACE_S", 1.0)
    doc = tmp_path / "doc.md"
    leak = "$ sleep 300 >/dev/null 2>&1 &\n$ make down\n"  # no pipe held: the flow ends
    doc.write_text(f"<!-- docs-check: flow=leak -->\n```\n{leak}```\n")
    (tmp_path / "Makefile").write_text("down:\n\t@echo stopped nothing\n")
    env = {**flow_env(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    found = check_flow(docs_check.flows([doc], tmp_path)["leak"], tmp_path, env)
    assert len(found) == 2, found
    assert found[0].startswith("left running after the flow's `make down`: pid ")
    assert found[1].startswith("left running after `make down`: pid ")
    assert all(p.endswith("sleep 300 ") for p in found), found
    assert not [p for p in processes(env[MARKER]).values() if p.marked]  # killed


def test_the_docs_mark_the_flows_we_check() -> None:
    assert set(FLOWS) == MARKED, "update MARKED and docs/docs-check.md with the docs' flows"


# ---- the flows (slow: each starts what its doc starts) -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FLOWS))
def test_docs_flow_runs_as_written(name: str, tmp_path: Path) -> None:
    root = fresh_copy(tmp_path / "checkout")
    env = flow_env(tmp_path / "home")
    found = check_flow(docs_check.flows(DOCS, PROJECT_ROOT)[name], root, env)
    assert not found, "\n\n".join(found)


@pytest.mark.slow
def test_a_broken_doc_fails_the_check(tmp_path: Path) -> None:
    """Failing first: the prod preview's doc with its command edited to a wrong target (and,
    separately, to a stack that does not exist) is reported with the doc's line."""
    root = fresh_copy(tmp_path / "checkout")
    env = flow_env(tmp_path / "home")
    doc = root / "docs" / "program.md"
    good = doc.read_text()
    assert "$ make plan STACK=prod" in good
    doc.write_text(good.replace("$ make plan STACK=prod", "$ make plans STACK=prod"))
    flow = docs_check.flows([doc], root)["prod-preview"]
    (problem,) = check_flow(flow, root, env)
    assert "docs/program.md:" in problem and "`make plans STACK=prod`" in problem
    assert "exit 2, the doc's marker expects exit 0" in problem
    assert "No rule to make target 'plans'" in problem

    doc.write_text(good.replace("$ make plan STACK=prod", "$ make plan STACK=dev"))
    flow = docs_check.flows([doc], root)["prod-preview"]
    found = check_flow(flow, root, env)
    assert found and all("expected" in p and "not there" in p for p in found), found
