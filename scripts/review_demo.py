"""`make review-demo`: a review stack's whole life on this machine (docs/review-stacks.md).

No internet, no Pulumi CLI (the stand-in engine, dev/pulumi_standin) and no Modal account (the
emulator, dev/emulator): everything lives under `.review-demo/` of this checkout and is gone
at the end, also after a failure or Ctrl-C.

1. its own emulator (free ports, roles enforced: `--rbac`, as the access flow needs), never
   the one `make up` runs;
2. the base stack `dev` from a copy of this checkout (`.review-demo/dev/`); the copy's
   `Pulumi.dev.yaml` gets `engineStandin: true`, because the committed one serves real vLLM,
   which cannot run here (its curl would answer HTTP 503 `cannot start vllm`);
3. PR 42: a copy of that with one line of `Pulumi.dev.yaml` changed (`.review-demo/pr-42/`),
   whose own scripts/review_stack.py runs `plan`, `access-up` (the admin step, with the
   emulator's Owner token), `up --handoff` (the deploy step, with no Modal token but the
   hand-over's) and `comment`, as CI's jobs do; the copy has no .venv: this checkout's
   interpreter runs its scripts;
4. the rendered comment, then its curl run as written, in the PR's checkout (its HTTP status
   and answer);
5. the teardown: `destroy --handoff` and `access-destroy` of pr-42, `destroy` of dev, the
   emulator stopped, `.review-demo/` removed, and a check that no process of the demo is left.

Every command is printed before it runs (`$ ...`, relative to the directory it runs in).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from review.checkout import copy_checkout  # noqa: E402

from emulator.process import EmulatorError, EmulatorProcess  # noqa: E402

DEMO = ROOT / ".review-demo"
PR = 42
PASSPHRASE = "review-demo"  # noqa: S105 (a throwaway passphrase for this demo's own states)
HEAD_SHA = f"{PR:040x}"
REPOS = ["--head-repo", "acme/llm", "--base-repo", "acme/llm"]
PY = sys.executable
STEPS = 9
PR_GPU_FROM, PR_GPU_TO = "L4", "T4"
STANDIN_LINE = "  modal-llm:engineStandin: true  # review-demo: no GPU here, no vLLM"


def say(*parts: object, flush: bool = False) -> None:
    """print(), but a closed stdout (`make review-demo | head`) never stops the teardown:
    the rest of the output is dropped instead."""
    try:
        print(*parts, flush=flush)
    except BrokenPipeError:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the run)


class DemoError(RuntimeError):
    """A step failed: the message says which, with its output."""


class Demo:
    """The demo's emulator, directories and steps; `teardown()` undoes whatever was done."""

    def __init__(self, demo_dir: Path) -> None:
        self.dir = demo_dir
        self.dev = demo_dir / "dev"
        self.pr = demo_dir / f"pr-{PR}"
        self.state = demo_dir / "state"
        self.out = demo_dir / "out"
        self.handoff = demo_dir / "handoff.json"
        self.emulator: EmulatorProcess | None = None
        self.dev_up = self.access_up = self.pr_up = False
        self.started = time.monotonic()
        self.step_no = 0
        #: pid -> start time of the emulator and everything it started (seen at each step).
        self.tree: dict[int, str] = {}

    # ---- output
    def step(self, text: str, estimate_s: float | None = None) -> None:
        if self.emulator is not None and self.emulator.pid is not None:
            self.tree.update(descendants(self.emulator.pid))  # its containers, so far
        self.step_no += 1
        est = f" (~{estimate_s:.0f} s)" if estimate_s else ""
        say(f"\n[{self.step_no}/{STEPS}] {text}{est}", flush=True)

    def env(self, *, owner: bool) -> dict[str, str]:
        """The steps' environment: the emulator's URL, the stand-in engine, this demo's
        passphrase and state dir; `owner`: with the emulator's own token (the workspace
        Owner's, as CI's admin job holds), else with no Modal token at all."""
        assert self.emulator is not None
        env = self.emulator.subprocess_env(
            {
                "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
                "PULUMI_ENGINE": "standin",
                "REVIEW_STATE_DIR": str(self.state),
            }
        )
        for key in ("PYTHONPATH", "OFFLINE_STACK_PASSPHRASE", "PULUMI_BACKEND_URL"):
            env.pop(key, None)  # each checkout runs its own code, on this demo's states only
        if not owner:
            env.pop("MODAL_TOKEN_ID", None)
            env.pop("MODAL_TOKEN_SECRET", None)
        return env

    def run(
        self,
        cwd: Path,
        args: Sequence[str],
        *,
        owner: bool = True,
        timeout: float = 300,
        quiet: bool = False,
        note: str = "",
    ) -> str:
        """Run one command in `cwd`, print it (relative) and its output; a failure raises."""
        python = os.path.relpath(PY, cwd) if Path(PY).is_relative_to(ROOT) else PY
        shown = [python if a == PY else a for a in args]
        shown = [os.path.relpath(a, cwd) if a.startswith(str(self.dir)) else a for a in shown]
        where = os.path.relpath(cwd, ROOT)
        note = note or ("" if owner else "no Modal token")
        say(f"  ({where}) $ {shlex.join(shown)}{'   # ' + note if note else ''}", flush=True)
        began = time.monotonic()
        done = run_child(list(args), cwd, self.env(owner=owner), timeout, merge=not quiet)
        if not quiet or done.returncode != 0:
            for line in trimmed(done.stdout + (done.stderr or "")):
                say(f"    {line}")
        say(f"    ({time.monotonic() - began:.1f} s, exit {done.returncode})", flush=True)
        if done.returncode != 0:
            raise DemoError(
                f"`{shlex.join(shown)}` in {where} exited {done.returncode} (its output: above)"
            )
        return done.stdout

    def review(self, *args: str, owner: bool = True, quiet: bool = False, note: str = "") -> str:
        """The PR checkout's own scripts/review_stack.py, with this checkout's interpreter."""
        return self.run(
            self.pr, [PY, "scripts/review_stack.py", *args], owner=owner, quiet=quiet, note=note
        )

    def standin(self, command: str, stack: str) -> str:
        assert self.emulator is not None
        state = str(self.state / f"{stack}.json")
        return self.run(
            self.dev,
            [PY, "-m", "pulumi_standin", command, "--stack", stack, "--state", state,
             "--server-url", self.emulator.url],
        )  # fmt: skip

    # ---- the steps
    def start_emulator(self) -> None:
        self.step("emulator: this demo's own (free ports, roles enforced), not `make up`'s", 2)
        self.dir.mkdir(parents=True)
        self.emulator = EmulatorProcess(rbac=True, cwd=ROOT).start(timeout=60)
        (self.dir / "emulator.pid").write_text(f"{self.emulator.pid}\n")
        say(f"  emulator pid {self.emulator.pid} at {self.emulator.url}")

    def deploy_dev(self) -> None:
        self.step("dev: the base stack, from a copy of this checkout (.review-demo/dev/)", 5)
        copy_checkout(ROOT, self.dev)
        stack_file = self.dev / "Pulumi.dev.yaml"
        text = stack_file.read_text()
        anchor = "  modal-llm:environment: dev\n"
        if anchor not in text:
            raise DemoError(f"Pulumi.dev.yaml has no line {anchor.strip()!r} to add to")
        stack_file.write_text(text.replace(anchor, anchor + STANDIN_LINE + "\n", 1))
        say(
            "  note: the committed Pulumi.dev.yaml serves real vLLM, which cannot run here (its"
            " curl would answer HTTP 503 `cannot start vllm`); this demo's copy adds"
            " `modal-llm:engineStandin: true` (dev/standin_engine.py answers in vLLM's place)"
        )
        self.dev_up = True  # from here on, a teardown destroys it (a partial up too)
        self.standin("up", "dev")

    def make_pr(self) -> str:
        self.step(
            f"PR {PR}: a copy of dev's checkout with one line changed (.review-demo/pr-{PR}/)", 1
        )
        shutil.copytree(self.dev, self.pr, ignore=shutil.ignore_patterns(".pulumi-offline"))
        stack_file = self.pr / "Pulumi.dev.yaml"
        text = stack_file.read_text()
        # One line: the service's GPU, L4 -> T4 (cheaper, so dev's budget guard still passes:
        # a second L4 container, max_containers 2, would exceed dev's $900 and stop the plan).
        found = re.findall(r"(?m)^ +gpu: (\S+)$", text)
        if found != [PR_GPU_FROM]:
            raise DemoError(
                f"Pulumi.dev.yaml: expected one `gpu: {PR_GPU_FROM}` line, found {found}"
            )
        stack_file.write_text(re.sub(r"(?m)^( +gpu: )\S+$", rf"\g<1>{PR_GPU_TO}", text, count=1))
        changed = f"gpu: {PR_GPU_FROM} -> {PR_GPU_TO}"
        say(f"  Pulumi.dev.yaml of the PR, one line: {changed}")
        return changed

    def plan(self) -> None:
        self.step("plan: the PR's code against dev (the plan job: no Modal token, no secret)", 3)
        self.review(
            "plan", "--pr", str(PR), "--base-state", str(self.state / "dev.json"),
            "--out-dir", str(self.out), owner=False, note="no Modal token, no secret",
        )  # fmt: skip

    def deploy_pr(self) -> None:
        self.step("access-up: the admin job (the Owner's token): environment, identity", 3)
        self.access_up = True
        self.review(
            "access-up", "--pr", str(PR), *REPOS, "--handoff", str(self.handoff),
            note="the emulator's Owner token",
        )  # fmt: skip
        self.step(f"up: the deploy job, as pr-{PR}-deploy with the hand-over only", 5)
        self.pr_up = True
        self.review(
            "up", "--pr", str(PR), *REPOS, "--head-sha", HEAD_SHA, "--handoff",
            str(self.handoff), "--out-dir", str(self.out), owner=False,
            note="no Modal token but the hand-over's",
        )  # fmt: skip

    def comment(self) -> str:
        self.step("comment: rendered from what plan and up wrote", 1)
        text = self.review("comment", "--pr", str(PR), "--in-dir", str(self.out), quiet=True)
        say("  ---- the comment, as CI would post it ----")
        for line in text.rstrip().splitlines():
            say(f"  | {line}")
        say("  ---- end of the comment ----")
        return text

    def curl(self, comment: str) -> str:
        self.step("the comment's curl, as written, in the PR's checkout (a cold start)", 5)
        found = re.search(r"```bash\n(.*?)```", comment, re.S)
        if not found:
            raise DemoError("the comment has no ```bash block (its curl)")
        say(
            f"  (.review-demo/pr-{PR}) $ bash <the block above>   # with"
            " PULUMI_CONFIG_PASSPHRASE (the stand-in's) exported"
        )
        began = time.monotonic()
        done = run_child(["bash", "-c", found.group(1)], self.pr, self.env(owner=False), 900)
        answer = (done.stdout + done.stderr).rstrip()
        for line in answer.splitlines():
            say(f"    {line}")
        say(f"    ({time.monotonic() - began:.1f} s, exit {done.returncode})", flush=True)
        status = re.findall(r"^HTTP (\d{3})$", answer, re.M)
        if done.returncode != 0 or status != ["200"]:
            raise DemoError(f"the comment's curl: exit {done.returncode}, HTTP {status or '?'}")
        return answer

    def teardown(self, *, interrupted: bool) -> bool:
        """Undo what was done, newest first; True when all of it went. After Ctrl-C the
        destroys are skipped: everything they would delete lives in this demo's emulator."""
        self.step_no = STEPS - 1  # the last step, wherever the demo stopped
        self.step("teardown: pr-42 (review stack, then access stack), dev, the emulator", 5)
        ok = True
        if self.emulator is not None and self.emulator.alive and not interrupted:
            todo: list[tuple[bool, Path, list[str], bool]] = [
                (self.pr_up, self.pr, ["destroy", "--pr", str(PR), "--handoff",
                                       str(self.handoff)], False),  # as pr-42-deploy
                (self.access_up, self.pr, ["access-destroy", "--pr", str(PR)], True),
            ]  # fmt: skip
            for wanted, _cwd, args, owner in todo:
                if not wanted:
                    continue
                note = "" if owner else "no Modal token but the hand-over's"
                try:
                    self.review(*args, owner=owner, note=note)
                except (DemoError, subprocess.TimeoutExpired) as exc:
                    say(f"  teardown: {exc}; going on")
                    ok = False
            if self.dev_up:
                try:
                    self.standin("destroy", "dev")
                except (DemoError, subprocess.TimeoutExpired) as exc:
                    say(f"  teardown: {exc}; going on")
                    ok = False
        elif interrupted:
            say(
                "  interrupted: the destroys are skipped (all they would delete lives in this"
                " demo's emulator, which stops now)"
            )
        pid = self.emulator.pid if self.emulator is not None else None
        if pid is not None:
            self.tree.update(descendants(pid))
        if self.emulator is not None:
            try:
                code = self.emulator.stop()
                say(f"  emulator pid {pid} stopped (exit {code}) with its containers")
            except EmulatorError as exc:
                say(f"  emulator: {exc}")
                ok = False
            finally:
                self.emulator.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        say(f"  removed {os.path.relpath(self.dir, ROOT)}/")
        left = processes_of(self.dir, self.tree)
        if left:  # this demo's own (same pid and start time): stopped by their pids
            say(f"  still running, stopping them: {'; '.join(c for _, c in left)}")
            for found_pid, _ in left:
                with contextlib.suppress(OSError):
                    os.kill(found_pid, signal.SIGKILL)
            time.sleep(0.5)
            left = processes_of(self.dir, self.tree)
        if left:
            say(f"  still running: {'; '.join(c for _, c in left)}")
            return False
        say("  no process left")
        return ok


def _stat(pid: int | str) -> tuple[int, str] | None:
    """(parent pid, start time) of a process from /proc/PID/stat (proc(5)), None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid ... starttime
    return int(fields[1]), fields[19]


def descendants(root: int) -> dict[int, str]:
    """The process `root` and everything under it (its containers: own sessions, same
    ancestry), each with its start time, so that a reused pid is not mistaken for it."""
    stats = {int(p.name): st for p in Path("/proc").glob("[0-9]*") if (st := _stat(p.name))}
    tree = {root: stats[root][1]} if root in stats else {}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, start) in stats.items():
            if ppid in tree and pid not in tree:
                tree[pid] = start
                grew = True
    return tree


def run_child(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float, *, merge: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run one step in a session of its own, so that Ctrl-C reaches this script only: on
    Ctrl-C, SIGTERM or the timeout the step's whole process group is killed (what it was
    changing lives in this demo's emulator, which goes too), and the exception goes on."""
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,  # merged: in the order written
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err or "")


def processes_of(demo_dir: Path, tree: dict[int, str]) -> list[tuple[int, str]]:
    """`pid command` of every process of this demo still running: one of the emulator's tree
    as it was before it stopped, or one started in or naming the demo's directory."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:  # gone meanwhile, or not ours
            continue
        st = _stat(proc.name)
        same = st is not None and tree.get(int(proc.name)) == st[1]
        if same or str(demo_dir) in f"{cmdline} {cwd}":
            found.append((int(proc.name), f"{proc.name} {cmdline.strip()[:80]}"))
    return found


def trimmed(text: str) -> list[str]:
    """A step's output without the stand-in's `Outputs:` block (the comment shows them)."""
    lines, skipping = [], False
    for line in text.rstrip().splitlines():
        if line.strip() == "Outputs:":
            skipping = True
            lines.append(line.replace("Outputs:", "(outputs trimmed)"))
        elif skipping and line.startswith("Resources:"):
            skipping = False
        if not skipping:
            lines.append(line)
    return lines


def stale_run(demo_dir: Path) -> str:
    """Why an existing `.review-demo/` cannot be reused, or "" once it is removed."""
    pid_file = demo_dir / "emulator.pid"
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        shutil.rmtree(demo_dir, ignore_errors=True)
        say(f"removed {demo_dir.name}/ of an earlier run that did not end (no process of it)")
        return ""
    return (
        f"{demo_dir} is in use: its emulator (pid {pid}) is running; wait for that demo to end,"
        f" or stop it (kill {pid}) and run `make review-demo` again"
    )


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM (e.g. a CI timeout): the same teardown as Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="scripts/review_demo.py", description=__doc__.split("\n")[0] if __doc__ else None
    ).parse_args(argv)
    if DEMO.exists() and (why := stale_run(DEMO)):
        print(f"error: {why}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _terminate)
    demo = Demo(DEMO)
    say(
        "review-demo: a review stack's life on this machine (docs/review-stacks.md), with the"
        " Pulumi stand-in (NOT the Pulumi engine) and its own Modal emulator: 15 s on a quiet"
        " machine, up to a minute on a busy one."
    )
    failed = ""
    interrupted = False
    answer = ""
    try:
        demo.start_emulator()
        demo.deploy_dev()
        demo.make_pr()
        demo.plan()
        demo.deploy_pr()
        answer = demo.curl(demo.comment())
    except DemoError as exc:
        failed = str(exc)
    except subprocess.TimeoutExpired as exc:
        failed = f"`{shlex.join(str(a) for a in exc.cmd)}` ran past {exc.timeout:.0f} s"
    except EmulatorError as exc:
        failed = f"the emulator: {exc}"
    except KeyboardInterrupt:
        interrupted = True
        say("\ninterrupted (Ctrl-C): tearing down", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the teardown runs to its end
        clean = demo.teardown(interrupted=interrupted)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    took = time.monotonic() - demo.started
    if interrupted:
        return 130
    if failed:
        print(f"\nerror: review-demo failed: {failed} (after {took:.0f} s)", file=sys.stderr)
        return 1
    if not clean:
        print(
            f"\nerror: review-demo: the teardown left something (above), {took:.0f} s",
            file=sys.stderr,
        )
        return 1
    status = re.findall(r"^HTTP \d{3}$", answer, re.M)[-1]
    say(f"\nreview-demo: done in {took:.0f} s: plan, up, comment, curl {status}, teardown.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
