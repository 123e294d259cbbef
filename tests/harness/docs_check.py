"""The docs check: the shell blocks of README.md and docs/*.md that are marked as runnable.

A marker is an HTML comment (GitHub renders nothing for it) on the line right before a fenced
block (docs/docs-check.md describes it):

    <!-- docs-check: flow=quickstart expect="HTTP 200" expect="Resources: + 9 created" -->

The block's `$ command` lines are the commands (a line ending in a backslash continues on the
next one); the other lines are the output the doc shows, which is never compared (ports, ids
and timings vary): only each `expect=` text must appear in the output of the block's commands,
and each command must exit with `status=` (0 unless named). The marked blocks of one flow,
in document order, run in one bash process (an `export` or `cd` carries to the next command),
stopping at the first command whose status is not the expected one.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"^\s*<!--\s*docs-check:(?P<body>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})")
FLOW_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
KEYS = {"flow", "expect", "status"}
SENTINEL = "@@docs-check"


class DocsCheckError(ValueError):
    """A marker that cannot be used: names the file, the line and what to change."""


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line of the `$` in the doc
    text: str  # without the `$ ` prompt; continuation lines joined with newlines


@dataclass(frozen=True)
class Block:
    flow: str
    doc: Path
    line: int  # the marker's line
    commands: tuple[Command, ...]
    expect: tuple[str, ...] = ()
    status: int = 0


@dataclass
class Flow:
    name: str
    doc: Path
    blocks: list[Block] = field(default_factory=list)


def _parse_marker(body: str, where: str) -> tuple[str, tuple[str, ...], int]:
    try:
        words = shlex.split(body)
    except ValueError as exc:
        raise DocsCheckError(f"{where}: docs-check marker {body.strip()!r}: {exc}") from exc
    flow, expect, status = "", [], 0
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in KEYS:
            raise DocsCheckError(
                f"{where}: docs-check marker: {word!r} is not one of "
                f'flow=NAME, expect="TEXT", status=N (docs/docs-check.md)'
            )
        if key == "flow":
            flow = value
        elif key == "expect":
            if not value:
                raise DocsCheckError(f"{where}: docs-check marker: expect= is empty")
            expect.append(value)
        else:
            if not value.isdigit():
                raise DocsCheckError(f"{where}: docs-check marker: status={value!r} is not 0..255")
            status = int(value)
    if not FLOW_NAME.match(flow):
        raise DocsCheckError(
            f"{where}: docs-check marker needs flow=NAME (lower case, digits, '-'); got {flow!r}"
        )
    return flow, tuple(expect), status


def _commands(lines: list[str], first: int) -> tuple[Command, ...]:
    """The `$ ` lines of a block's body (`first` is the 1-based line of lines[0])."""
    found: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        start, parts = i, [lines[i][2:]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
        found.append(Command(first + start, "\n".join(parts)))
        i += 1
    return tuple(found)


def extract(doc: Path, text: str | None = None) -> list[Block]:
    """The marked blocks of `doc` in document order; DocsCheckError for a marker that is not
    right before a fenced block, a block without a `$ ` command or one that is never closed."""
    lines = (doc.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    inside: str | None = None  # the fence of the block the scan is in (an example's marker
    for n, raw in enumerate(lines):  # there, e.g. docs/docs-check.md's, is text, not a marker)
        fenced = FENCE.match(raw)
        if inside is not None:
            if raw.strip() == inside:
                inside = None
            continue
        if fenced:
            inside = fenced.group("fence")
            continue
        marker = MARKER.match(raw)
        if not marker:
            continue
        where = f"{doc}:{n + 1}"
        flow, expect, status = _parse_marker(marker.group("body"), where)
        opening = FENCE.match(lines[n + 1]) if n + 1 < len(lines) else None
        if not opening:
            raise DocsCheckError(
                f"{where}: docs-check marker for flow {flow!r} is not followed by a fenced "
                f"block on the next line: put it right before the block's opening ```"
            )
        fence = opening.group("fence")
        end = next(
            (k for k in range(n + 2, len(lines)) if lines[k].strip() == fence),
            None,
        )
        if end is None:
            raise DocsCheckError(f"{where}: the block after this docs-check marker is never closed")
        commands = _commands(lines[n + 2 : end], n + 3)
        if not commands:
            raise DocsCheckError(
                f"{where}: the block marked for flow {flow!r} has no `$ command` line to run"
            )
        blocks.append(Block(flow, doc, n + 1, commands, expect, status))
    return blocks


def flows(docs: Iterable[Path], root: Path | None = None) -> dict[str, Flow]:
    """Every flow of `docs` by name; a flow lives in one doc (its order is that doc's)."""
    found: dict[str, Flow] = {}
    for doc in docs:
        text = doc.read_text()
        shown = doc.relative_to(root) if root else doc
        for block in extract(shown, text):
            name = block.flow
            flow = found.setdefault(name, Flow(name, shown))
            if flow.doc != shown:
                raise DocsCheckError(
                    f"{shown}:{block.line}: flow {name!r} is already marked in {flow.doc}: "
                    f"a flow's blocks live in one doc (rename one of them)"
                )
            flow.blocks.append(block)
    return found


@dataclass
class Step:
    command: Command
    output: str
    status: int | None  # None: never ran (an earlier command failed) or cut by the timeout


def script(flow: Flow) -> str:
    """One bash script for the flow: each command between sentinels that carry its status;
    it stops at the first status that is not the expected one."""
    out = []
    for b, block in enumerate(flow.blocks):
        for c, command in enumerate(block.commands):
            tag = f"{b}.{c}"
            out.append(f"printf '\\n%s\\n' '{SENTINEL} begin {tag}'")
            out.append(command.text)
            out.append("__docs_check_rc=$?")
            out.append(f"printf '\\n%s\\n' \"{SENTINEL} end {tag} $__docs_check_rc\"")
            out.append(f'[ "$__docs_check_rc" -eq {block.status} ] || exit 97')
    return "\n".join(out) + "\n"


def run(flow: Flow, cwd: Path, env: Mapping[str, str], timeout: float) -> tuple[list[Step], str]:
    """Run the flow in `cwd`; the steps (output, status of each command) and the whole log."""
    try:
        done = subprocess.run(
            ["bash", "-c", script(flow)],
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
        )
        log = done.stdout
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        log = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw) + (
            f"\n[docs-check: flow {flow.name!r} cut after {timeout:.0f} s]"
        )
    chunks: dict[str, list[str]] = {}
    statuses: dict[str, int] = {}
    current: str | None = None
    for line in log.splitlines():
        if line.startswith(f"{SENTINEL} begin "):
            current = line.split()[2]
            chunks[current] = []
        elif line.startswith(f"{SENTINEL} end "):
            _, _, tag, rc = line.split()
            statuses[tag] = int(rc)
            current = None
        elif current is not None:
            chunks[current].append(line)
    steps = [
        Step(command, "\n".join(chunks.get(f"{b}.{c}", [])), statuses.get(f"{b}.{c}"))
        for b, block in enumerate(flow.blocks)
        for c, command in enumerate(block.commands)
    ]
    return steps, log


def problems(flow: Flow, steps: list[Step]) -> list[str]:
    """What the doc promised and the run did not do: a status, an expected line."""
    found: list[str] = []
    by_block = iter(steps)
    for block in flow.blocks:
        mine = [next(by_block) for _ in block.commands]
        for step in mine:
            if step.status != block.status:
                got = "never finished" if step.status is None else f"exit {step.status}"
                tail = "\n".join(step.output.splitlines()[-25:])
                found.append(
                    f"{flow.doc}:{step.command.line}: `{step.command.text}` (flow "
                    f"{flow.name!r}): {got}, the doc's marker expects exit {block.status}; "
                    f"its output ends:\n{tail}"
                )
                return found
        output = "\n".join(step.output for step in mine)
        for text in block.expect:
            if text not in output:
                found.append(
                    f"{flow.doc}:{block.line}: flow {flow.name!r}: expected {text!r} in the "
                    f"output of this block's commands, not there; fix the doc or the flow"
                )
    return found
