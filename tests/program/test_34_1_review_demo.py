"""Issue 34 finding 1: the review-stack flow of docs/review-stacks.md runs as written.

Before: no command started the emulator with roles or created the `dev` base state; the
committed `Pulumi.dev.yaml` serves real vLLM, so the comment's curl answered HTTP 503
(`cannot start vllm`); the curl ran `.venv/bin/python` "in the PR's checkout", which has no
venv; and `review_stack.py plan --project DIR` stopped at `costs of ... must be computed by
that checkout's own scripts/review_stack.py`. Now `make review-demo` (scripts/review_demo.py)
runs the whole flow and leaves nothing behind, and `--project` computes the costs with that
checkout's own scripts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.program.runner import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
from review.checkout import copy_checkout

PY = sys.executable
DEMO = PROJECT_ROOT / ".review-demo"


def _alive_emulator(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return "emulator serve" in cmdline


def _demo_processes() -> list[str]:
    """Processes whose command line or working directory names this checkout's .review-demo/."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if str(DEMO) in f"{cmdline} {cwd}":
            found.append(f"{proc.name} {cmdline[:100]}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_34_1_make_review_demo_plans_deploys_comments_curls_and_tears_down() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["make", "review-demo"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out}\n{done.stderr}"
    # Its own emulator, and the stand-in engine for its own copy of dev, said in one line.
    started = re.search(r"^  emulator pid (\d+) at http://127\.0\.0\.1:\d+$", out, re.M)
    assert started, out
    emulator_pid = int(started[1])
    assert "this demo's copy adds `modal-llm:engineStandin: true`" in out
    assert "HTTP 503 `cannot start vllm`" in out
    # The PR's own scripts, as CI's jobs run them; the plan shows the PR's one-line change.
    for command in ("plan", "access-up", "up", "comment", "destroy", "access-destroy"):
        assert f"$ ../../.venv/bin/python scripts/review_stack.py {command} --pr 42" in out, command
    assert "review stack pr-42: http://127.0.0.1:" in out
    # The rendered comment: its marker once, the diff and cost delta of the PR's change.
    assert out.count("  | <!-- modal-llm-review-stack -->\n") == 1
    assert '`spec_json.gpu` "L4" → "T4"' in out
    assert "| `qwen-small` | L4 → T4 |" in out
    # Its curl, as written, in the PR's checkout (which has no .venv): a chat completion.
    curl = out.split("the comment's curl, as written", 1)[1].split("teardown:", 1)[0]
    assert re.search(r"^    HTTP 200$", curl, re.M), curl
    assert '"object": "chat.completion"' in curl
    # The teardown: every stack destroyed, the emulator stopped, nothing left.
    assert "review stack pr-42: destroyed" in out
    assert "access stack pr-42: destroyed" in out
    assert "Resources: - 9 deleted" in out  # dev
    assert "  no process left" in out
    assert "curl HTTP 200, teardown." in out
    assert not _alive_emulator(emulator_pid)
    assert not DEMO.exists()
    assert _demo_processes() == []


def test_34_1_plan_project_costs_come_from_that_checkouts_own_scripts(tmp_path: Path) -> None:
    """`review_stack.py plan|costs --project DIR` of this checkout: the figures come from DIR's
    own scripts/review_stack.py and cost model (here one whose T4 costs $2/h), not an error."""
    pr = copy_checkout(PROJECT_ROOT, tmp_path / "pr42")
    stack_file = pr / "Pulumi.dev.yaml"
    stack_file.write_text(stack_file.read_text().replace("gpu: L4", "gpu: T4", 1))
    cost_py = pr / "components" / "cost.py"
    assert '    "T4": 0.59,\n' in cost_py.read_text()
    cost_py.write_text(cost_py.read_text().replace('    "T4": 0.59,\n', '    "T4": 2.0,\n', 1))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [PY, "scripts/review_stack.py", "costs", "--project", str(pr)],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    service = json.loads(done.stdout)["services"]["qwen-small"]
    assert service["gpu"] == "T4"
    # (2.00 + 6 x 0.04716 + 12 x 0.007992) $/h x 730 h: the copy's price, not this checkout's.
    assert service["monthly_cost_worst_usd"] == pytest.approx((2.0 + 0.378864) * 730, abs=0.02)
