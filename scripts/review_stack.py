"""Review stacks: a Pulumi stack and Modal environment `pr-<N>` per labelled pull request.

    python scripts/review_stack.py up      --pr N --head-repo OWNER/REPO --base-repo OWNER/REPO
    python scripts/review_stack.py plan    --pr N            # the PR's code against dev
    python scripts/review_stack.py comment --pr N            # the PR comment (Markdown)
    python scripts/review_stack.py destroy --pr N
    python scripts/review_stack.py sweep   --older-than-days N [--dry-run]
    python scripts/review_stack.py list | config --pr N | costs
  common: [--engine auto|cli|standin] [--project DIR] [--base-stack dev] [--out-dir DIR]
          [--state-dir DIR] [--server-url URL]   (the last two: stand-in only)

Lifecycle and design: docs/review-stacks.md. In short:
- `up` refuses a fork's PR with one line and exit 0 ("no review stack for forks"); else it
  writes `Pulumi.pr-N.yaml` from the checkout's `Pulumi.<base>.yaml` (`review_config`:
  environment `pr-N`, every service scaled to zero and capped at `--max-containers`, spend
  limit `--budget-usd` (default $20/month: Modal's budget for the environment, which stops its
  work when reached), no adopted environment, no protected caches, no secret of the base stack:
  the review stack gets its own proxy token and API keys), runs `pulumi up` with the engine and
  writes the stack's NON-secret outputs to `--out-dir` (`review-outputs.json`, `review.json`).
- `plan` writes what the comment compares, to `--out-dir`: `preview.json` (`pulumi preview
  --json --stack dev` of this checkout's code), `dev-outputs.json` (dev's outputs, secrets
  `[secret]`) and `costs.json` (this checkout's cost model on its `Pulumi.dev.yaml`: the new
  idle and worst-case figures, which `pulumi preview --json` does not carry).
- `comment` renders those files with scripts/review_comment.py (pure, unit-tested).
- `destroy` destroys the stack (environment, apps, secrets, volumes, proxy token go with it)
  and removes it (`pulumi stack rm`; the stand-in's state file), so no trace is listed.
- `sweep` destroys every review stack whose last deploy is older than N days. Which stacks
  exist and when they were last deployed: the CLI's `pulumi stack ls --json` (`name`,
  `lastUpdate`) of this project's backend; the stand-in: the `pr-*.json` state files in
  `--state-dir` and the `updated_at` each `up` records beside them (`pr-N.review.json`).

Engine, as scripts/up.sh decides it: `PULUMI_ENGINE=cli|standin|auto` (or `--engine`); auto
takes the Pulumi CLI when `pulumi` is on PATH or in ~/.pulumi/bin, else the stand-in
(`python -m pulumi_standin`, emulator only), said in one line.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's code (the PR's), never another tree's
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import review_comment  # noqa: E402

NS = "modal-llm"
DEFAULT_BUDGET_USD = 20
DEFAULT_MAX_CONTAINERS = 1
DEFAULT_SWEEP_DAYS = 7
DEFAULT_BASE_STACK = "dev"
STANDIN_DEFAULT_PASSPHRASE = "local-emulator"  # noqa: S105 (emulator-only throwaway keys)
REVIEW_STACK = re.compile(r"(?:^|/)pr-(?P<pr>[1-9][0-9]*)$")
#: Keys of the base stack a review stack never takes: it owns its environment, budget, keys and
#: token, and holds nothing secret of the base stack.
DROPPED_KEYS = (
    "adoptEnvironment",
    "protectCaches",
    "proxyTokenRotation",
    "apiKeyRotation",
    "monthlyBudgetUsd",
    "allowOverBudget",
)
FILES = {
    "preview": "preview.json",
    "dev_outputs": "dev-outputs.json",
    "costs": "costs.json",
    "outputs": "review-outputs.json",
    "meta": "review.json",
    "comment": "comment.md",
}


class ReviewError(RuntimeError):
    """Something the operator can fix: the message says what and how."""


def stack_name(pr: int) -> str:
    return f"pr-{pr}"


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(text: Any) -> dt.datetime | None:
    """An ISO 8601 / RFC 3339 time (Pulumi's `lastUpdate`, our `updated_at`), or None."""
    if not isinstance(text, str) or not text.strip():
        return None
    value = text.strip().replace("Z", "+00:00")
    value = re.sub(r"(\.\d{6})\d+", r"\1", value)  # nanoseconds -> microseconds
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def is_fork(head_repo: str, base_repo: str) -> bool:
    return head_repo.strip().lower() != base_repo.strip().lower()


# ---- the review stack's config ------------------------------------------------------------


def _scaled_to_zero(service: Mapping[str, Any], max_containers: int) -> dict[str, Any]:
    svc = dict(service)
    scaling = dict(svc.get("scaling") or {})
    scaling["min_containers"] = 0
    scaling["max_containers"] = max(1, min(int(scaling.get("max_containers", 1)), max_containers))
    scaling.pop("buffer_containers", None)
    svc["scaling"] = scaling
    svc.pop("warm_schedule", None)  # pre-warm windows raise min_containers: not here
    svc.pop("adopt", None)  # a review stack takes over nothing
    return svc


def review_config(
    base: Mapping[str, Any], pr: int, *, budget_usd: float, max_containers: int
) -> tuple[dict[str, Any], list[str]]:
    """The config of review stack pr-N from the base stack's `config:` mapping, and the keys
    left out (secrets of the base stack, and settings a review stack never takes)."""
    config: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in base.items():
        _, _, short = key.partition(":")
        if isinstance(value, dict) and set(value) == {"secure"}:
            dropped.append(key)  # encrypted for the base stack only; never copied
            continue
        if key.startswith(f"{NS}:") and short in DROPPED_KEYS:
            continue
        config[key] = value
    config[f"{NS}:environment"] = stack_name(pr)
    config[f"{NS}:monthlyBudgetUsd"] = (
        int(budget_usd) if float(budget_usd).is_integer() else budget_usd
    )
    # The worst case of even one GPU container is above a review budget; the budget itself is
    # the hard stop (Modal stops the environment's work when usage reaches it).
    config[f"{NS}:allowOverBudget"] = True
    services = config.get(f"{NS}:services")
    if isinstance(services, list):
        config[f"{NS}:services"] = [
            _scaled_to_zero(s, max_containers) if isinstance(s, dict) else s for s in services
        ]
    return config, sorted(dropped)


def read_stack_file(project: Path, stack: str) -> dict[str, Any]:
    path = project / f"Pulumi.{stack}.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ReviewError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ReviewError(f"{path}: invalid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("config") or {}, dict):
        raise ReviewError(f"{path}: expected a mapping with config:")
    return raw


def write_review_stack_file(
    project: Path, pr: int, base_stack: str, *, budget_usd: float, max_containers: int
) -> tuple[Path, list[str]]:
    """Write `Pulumi.pr-N.yaml` (keeping what the CLI put there: encryptionsalt, secrets
    provider), and return it with the base stack's keys that were left out."""
    base = read_stack_file(project, base_stack).get("config") or {}
    config, dropped = review_config(base, pr, budget_usd=budget_usd, max_containers=max_containers)
    path = project / f"Pulumi.{stack_name(pr)}.yaml"
    kept: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(OSError, yaml.YAMLError):
            old = yaml.safe_load(path.read_text()) or {}
            if isinstance(old, dict):
                kept = {k: v for k, v in old.items() if k != "config"}
    header = (
        f"# Review stack {stack_name(pr)}: written by scripts/review_stack.py from"
        f" Pulumi.{base_stack}.yaml for pull request #{pr}.\n# Do not commit: it is rewritten on"
        " every deploy of the PR (docs/review-stacks.md).\n"
    )
    body = yaml.safe_dump({**kept, "config": config}, sort_keys=False, default_flow_style=False)
    path.write_text(header + body)
    return path, dropped


# ---- costs of a checkout's stack file -----------------------------------------------------


def stack_costs(project: Path, stack: str, server_url: str | None) -> dict[str, Any]:
    """The idle / baseline / worst-case figures of `Pulumi.<stack>.yaml` with this checkout's
    own config parser and cost model (what the stack outputs would be after `up`)."""
    if project.resolve() != ROOT.resolve():
        raise ReviewError(
            f"costs of {project} must be computed by that checkout's own scripts/review_stack.py"
        )
    from components.config import ConfigError, parse_stack_config
    from pulumi_standin.program import stack_config

    config, _ = stack_config(stack)
    values: dict[str, str | None] = {
        k.removeprefix(f"{NS}:"): v for k, v in config.items() if k.startswith(f"{NS}:")
    }
    values["allowOverBudget"] = "true"  # figures even when the budget guard would refuse
    try:
        cfg = parse_stack_config(values, stack=stack, modal_server_url=server_url)
    except ConfigError as exc:
        raise ReviewError(f"Pulumi.{stack}.yaml: {exc}") from None
    return {
        "monthly_cost_idle_usd": cfg.cost.idle_usd,
        "monthly_cost_baseline_usd": cfg.cost.baseline_usd,
        "monthly_cost_worst_usd": cfg.cost.worst_usd,
        "monthly_budget_usd": cfg.monthly_budget_usd,
        "services": {
            s.name: {
                "gpu": s.cost.gpu,
                "gpu_count": s.cost.gpu_count,
                "min_containers": s.cost.min_containers,
                "max_containers": s.cost.max_containers,
                "monthly_cost_idle_usd": s.cost.idle_usd,
                "monthly_cost_baseline_usd": s.cost.baseline_usd,
                "monthly_cost_worst_usd": s.cost.worst_usd,
            }
            for s in cfg.services
        },
    }


# ---- engines ------------------------------------------------------------------------------


def pulumi_cli() -> str | None:
    home_cli = Path.home() / ".pulumi/bin/pulumi"
    return shutil.which("pulumi") or (str(home_cli) if home_cli.exists() else None)


@dataclass
class StackInfo:
    name: str
    pr: int
    last_update: dt.datetime | None
    in_progress: bool = False


@dataclass
class Engine:
    """The Pulumi CLI or the stand-in, run in `project` (the checkout whose code deploys)."""

    kind: str  # "cli" | "standin"
    project: Path
    state_dir: Path
    server_url: str = ""
    python: str = sys.executable

    # ---- plumbing
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("MODAL_ENVIRONMENT", None)
        env.pop("MODAL_PROFILE", None)
        env["PULUMI_SKIP_UPDATE_CHECK"] = "true"
        if self.kind == "standin":
            if not (env.get("OFFLINE_STACK_PASSPHRASE") or env.get("PULUMI_CONFIG_PASSPHRASE")):
                env["PULUMI_CONFIG_PASSPHRASE"] = STANDIN_DEFAULT_PASSPHRASE
            if self.server_url:
                env["MODAL_SERVER_URL"] = self.server_url
        return env

    def state(self, stack: str) -> Path:
        return self.state_dir / f"{stack}.json"

    def meta(self, stack: str) -> Path:
        return self.state_dir / f"{stack}.review.json"

    def standin(
        self, command: str, stack: str, *extra: str, state: Path | None = None
    ) -> list[str]:
        cmd = [self.python, "-m", "pulumi_standin", command, "--stack", stack]
        cmd += ["--state", str(state or self.state(stack))]
        if self.server_url:
            cmd += ["--server-url", self.server_url]
        return [*cmd, *extra]

    def cli(self, *args: str) -> list[str]:
        exe = pulumi_cli()
        if exe is None:
            raise ReviewError("the Pulumi CLI is not installed (PATH, ~/.pulumi/bin)")
        return [exe, *args, "--non-interactive", "--cwd", str(self.project)]

    def run(self, cmd: Sequence[str], *, capture: bool = False) -> subprocess.CompletedProcess[str]:
        sys.stdout.flush()
        return subprocess.run(
            list(cmd),
            cwd=self.project,
            env=self.env(),
            text=True,
            stdout=subprocess.PIPE if capture else None,
            check=False,
        )

    def checked(self, cmd: Sequence[str], what: str, *, capture: bool = False) -> str:
        done = self.run(cmd, capture=capture)
        if done.returncode != 0:
            raise ReviewError(f"{what} failed (exit {done.returncode}); its output is above")
        return done.stdout or ""

    # ---- commands
    def select_or_create(self, stack: str) -> None:
        if self.kind == "cli":
            self.checked(self.cli("stack", "select", "--create", stack), f"stack select {stack}")

    def deploy(self, stack: str) -> None:
        if self.kind == "cli":
            self.checked(self.cli("up", "--yes", "--stack", stack), f"pulumi up --stack {stack}")
        else:
            self.checked(self.standin("up", stack), f"up of {stack}")

    def preview_json(self, stack: str, state: Path | None) -> tuple[dict[str, Any], int]:
        if self.kind == "cli":
            cmd = self.cli("preview", "--json", "--stack", stack)
        else:
            cmd = self.standin("preview", stack, "--json", state=state)
        done = self.run(cmd, capture=True)
        try:
            doc = json.loads(done.stdout or "")
        except ValueError:
            raise ReviewError(
                f"preview --json of {stack} printed no JSON document (exit {done.returncode})"
            ) from None
        if not isinstance(doc, dict):
            raise ReviewError(f"preview --json of {stack}: not a JSON object")
        return doc, done.returncode

    def outputs(self, stack: str, state: Path | None = None) -> dict[str, Any]:
        """The stack's outputs, secrets shown as `[secret]` (never their values)."""
        if self.kind == "cli":
            text = self.checked(
                self.cli("stack", "output", "--json", "--stack", stack),
                f"pulumi stack output --stack {stack}",
                capture=True,
            )
            value = json.loads(text or "{}")
            return dict(value) if isinstance(value, dict) else {}
        return standin_outputs(stack, state or self.state(stack), self.env())

    def destroy(self, stack: str) -> bool:
        """Destroy and remove the stack; False when there was none."""
        if self.kind == "cli":
            if not any(s.name == stack for s in self.list_stacks()):
                return False
            self.checked(self.cli("destroy", "--yes", "--stack", stack), f"pulumi destroy {stack}")
            self.checked(self.cli("stack", "rm", "--yes", "--stack", stack), f"stack rm {stack}")
            return True
        state = self.state(stack)
        if not state.exists():
            self.meta(stack).unlink(missing_ok=True)
            return False
        self.checked(self.standin("destroy", stack), f"destroy of {stack}")
        state.unlink(missing_ok=True)
        self.meta(stack).unlink(missing_ok=True)
        for leftover in self.state_dir.glob(f"{stack}.last-error.txt"):
            leftover.unlink(missing_ok=True)
        return True

    def list_stacks(self) -> list[StackInfo]:
        found: list[StackInfo] = []
        if self.kind == "cli":
            text = self.checked(self.cli("stack", "ls", "--json"), "pulumi stack ls", capture=True)
            for entry in json.loads(text or "[]"):
                m = REVIEW_STACK.search(str(entry.get("name", "")))
                if m:
                    found.append(
                        StackInfo(
                            name=stack_name(int(m["pr"])),
                            pr=int(m["pr"]),
                            last_update=parse_time(entry.get("lastUpdate")),
                            in_progress=bool(entry.get("updateInProgress")),
                        )
                    )
            return sorted(found, key=lambda s: s.pr)
        for path in sorted(self.state_dir.glob("pr-*.json")):
            m = REVIEW_STACK.search(path.name.removesuffix(".json"))
            if not m:
                continue
            when = None
            with contextlib.suppress(OSError, ValueError):
                when = parse_time(json.loads(self.meta(path.stem).read_text()).get("updated_at"))
            if when is None:  # no record: the state file's own time
                when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
            found.append(StackInfo(name=path.stem, pr=int(m["pr"]), last_update=when))
        return sorted(found, key=lambda s: s.pr)


def standin_outputs(stack: str, state: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The stand-in's outputs of its last `up`, as `pulumi stack output --json` shows them."""
    if not state.exists():
        return {}
    from pulumi_standin.display import show_output
    from pulumi_standin.statefile import StandinError, StateFile
    from pulumi_standin.values import to_program

    saved = {k: os.environ.get(k) for k in ("OFFLINE_STACK_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE")}
    for key in saved:
        if env.get(key):
            os.environ[key] = env[key]
    try:
        outputs = to_program(StateFile.load(state, stack).outputs)
    except StandinError as exc:
        raise ReviewError(str(exc)) from None
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {k: show_output(v, False) for k, v in outputs.items()}


def choose_engine(asked: str | None) -> str:
    wanted = asked or os.environ.get("PULUMI_ENGINE") or "auto"
    if wanted == "cli":
        if pulumi_cli() is None:
            raise ReviewError("PULUMI_ENGINE=cli, but the Pulumi CLI is not installed")
        return "cli"
    if wanted == "standin":
        return "standin"
    if wanted != "auto":
        raise ReviewError(f"engine {wanted!r} is not one of auto, cli, standin")
    if pulumi_cli() is not None:
        return "cli"
    print(
        "No Pulumi CLI: using the Pulumi stand-in python -m pulumi_standin instead (NOT the"
        " Pulumi engine, emulator only; docs/offline.md)."
    )
    return "standin"


# ---- subcommands --------------------------------------------------------------------------


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ReviewError(f"{path}: unreadable ({exc})") from None


def cmd_up(args: argparse.Namespace, engine: Engine) -> int:
    stack = stack_name(args.pr)
    if is_fork(args.head_repo, args.base_repo):
        print(
            f"no review stack for forks: PR #{args.pr} comes from {args.head_repo}, not"
            f" {args.base_repo} (a fork's code never runs with this repository's credentials)"
        )
        return 0
    engine.select_or_create(stack)
    path, dropped = write_review_stack_file(
        engine.project,
        args.pr,
        args.base_stack,
        budget_usd=args.budget_usd,
        max_containers=args.max_containers,
    )
    print(f"{path.name}: environment {stack}, scaled to zero, spend limit ${args.budget_usd}/month")
    if dropped:
        print(
            f"  not taken from Pulumi.{args.base_stack}.yaml (secrets of that stack):"
            f" {', '.join(dropped)}"
        )
    started = now_utc()
    engine.deploy(stack)
    outputs = engine.outputs(stack)
    meta = {
        "pr": args.pr,
        "stack": stack,
        "engine": engine.kind,
        "state": str(engine.state(stack)) if engine.kind == "standin" else "",
        "head_repo": args.head_repo,
        "head_sha": args.head_sha or "",
        "base_stack": args.base_stack,
        "budget_usd": args.budget_usd,
        "sweep_days": args.sweep_days,
        "updated_at": iso(started),
        "key_name": _first_key_name(engine.project, args.base_stack),
    }
    if engine.kind == "standin":
        old = _read_json(engine.meta(stack)) or {}
        meta["created_at"] = old.get("created_at") or meta["updated_at"]
        _write_json(engine.meta(stack), meta)
    if args.out_dir:
        _write_json(args.out_dir / FILES["outputs"], outputs)
        _write_json(args.out_dir / FILES["meta"], meta)
    print(f"review stack {stack}: {outputs.get('endpoint_url', '(no endpoint)')}")
    return 0


def _first_key_name(project: Path, base_stack: str) -> str:
    with contextlib.suppress(ReviewError):
        names = (read_stack_file(project, base_stack).get("config") or {}).get(f"{NS}:apiKeyNames")
        if isinstance(names, list) and names:
            return str(names[0])
    return "gateway"


def cmd_plan(args: argparse.Namespace, engine: Engine) -> int:
    out: Path = args.out_dir or Path(".")
    base = args.base_stack
    doc, rc = engine.preview_json(base, args.base_state)
    _write_json(out / FILES["preview"], doc)
    _write_json(out / FILES["dev_outputs"], engine.outputs(base, args.base_state))
    _write_json(out / FILES["costs"], stack_costs(engine.project, base, engine.server_url or None))
    print(
        f"plan of PR #{args.pr} against {base}: {out / FILES['preview']}"
        + ("" if rc == 0 else f" (the preview failed, exit {rc}: its error is in the document)")
    )
    return 0


def cmd_costs(args: argparse.Namespace, engine: Engine) -> int:
    print(
        json.dumps(
            stack_costs(engine.project, args.base_stack, engine.server_url or None), indent=2
        )
    )
    return 0


def cmd_config(args: argparse.Namespace, engine: Engine) -> int:
    base = read_stack_file(engine.project, args.base_stack).get("config") or {}
    config, _ = review_config(
        base, args.pr, budget_usd=args.budget_usd, max_containers=args.max_containers
    )
    sys.stdout.write(yaml.safe_dump({"config": config}, sort_keys=False))
    return 0


def comment_from_files(args: argparse.Namespace) -> str:
    src: Path = args.in_dir or args.out_dir or Path(".")
    meta = _read_json(src / FILES["meta"]) or {}
    stack = stack_name(args.pr)
    if args.closed or not (src / FILES["outputs"]).exists():
        reason = args.reason or "the pull request was closed"
        return review_comment.render_destroyed(args.pr, stack, reason=reason, when=iso(now_utc()))
    kind = str(meta.get("engine") or "cli")
    reader = review_comment.OutputReader(
        kind=kind,
        stack=stack,
        state=str(meta.get("state") or ""),
        python=args.reader_python,
    )
    engine_note = (
        "deployed by the Pulumi stand-in on the Modal emulator (NOT the Pulumi engine)"
        if kind == "standin"
        else "deployed with the Pulumi CLI"
    )
    comment = review_comment.ReviewComment(
        pr=args.pr,
        stack=stack,
        preview=_read_json(src / FILES["preview"]),
        new_costs=_read_json(src / FILES["costs"]) or {},
        review_outputs=_read_json(src / FILES["outputs"]) or {},
        dev_outputs=_read_json(src / FILES["dev_outputs"]),
        reader=reader,
        base_stack=str(meta.get("base_stack") or args.base_stack),
        head_sha=str(meta.get("head_sha") or args.head_sha or ""),
        engine_note=engine_note,
        key_name=str(meta.get("key_name") or "gateway"),
        spend_limit_usd=meta.get("budget_usd"),
        sweep_days=meta.get("sweep_days") or args.sweep_days,
        updated_at=str(meta.get("updated_at") or ""),
    )
    return review_comment.render(comment)


def cmd_comment(args: argparse.Namespace, engine: Engine | None) -> int:
    text = comment_from_files(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"comment for PR #{args.pr}: {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_destroy(args: argparse.Namespace, engine: Engine) -> int:
    stack = stack_name(args.pr)
    config_file = engine.project / f"Pulumi.{stack}.yaml"
    if not config_file.exists():  # destroy reads the stack's config (provider settings)
        write_review_stack_file(
            engine.project,
            args.pr,
            args.base_stack,
            budget_usd=args.budget_usd,
            max_containers=args.max_containers,
        )
    try:
        existed = engine.destroy(stack)
    finally:
        if not args.keep_config:
            config_file.unlink(missing_ok=True)
    print(f"review stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
    return 0


def cmd_list(args: argparse.Namespace, engine: Engine) -> int:
    now = parse_time(args.now) if args.now else now_utc()
    assert now is not None
    rows = [
        {
            "stack": s.name,
            "pr": s.pr,
            "last_update": iso(s.last_update) if s.last_update else None,
            "age_days": round((now - s.last_update).total_seconds() / 86400, 2)
            if s.last_update
            else None,
            "update_in_progress": s.in_progress,
        }
        for s in engine.list_stacks()
    ]
    print(json.dumps(rows, indent=2))
    return 0


def stale(
    stacks: Sequence[StackInfo], now: dt.datetime, days: float, open_prs: set[int] | None
) -> list[tuple[StackInfo, str]]:
    """The review stacks the sweep destroys, each with why: last deployed more than `days` ago
    (or never), or (with `open_prs`) its PR is no longer open. One being updated is left."""
    found = []
    for s in stacks:
        if s.in_progress:
            continue
        if open_prs is not None and s.pr not in open_prs:
            found.append((s, f"PR #{s.pr} is not open"))
        elif s.last_update is None:
            found.append((s, "never deployed"))
        elif (now - s.last_update).total_seconds() > days * 86400:
            age = (now - s.last_update).total_seconds() / 86400
            found.append((s, f"last deployed {age:.1f} days ago (> {days:g})"))
    return found


def cmd_sweep(args: argparse.Namespace, engine: Engine) -> int:
    now = parse_time(args.now) if args.now else now_utc()
    if now is None:
        raise ReviewError(f"--now {args.now!r} is not an ISO 8601 time")
    open_prs = None
    if args.open_prs is not None:
        open_prs = {int(x) for x in re.split(r"[,\s]+", args.open_prs.strip()) if x}
    stacks = engine.list_stacks()
    doomed = stale(stacks, now, args.older_than_days, open_prs)
    print(
        f"sweep: {len(stacks)} review stack(s), {len(doomed)} to destroy"
        f" (last deploy older than {args.older_than_days:g} days"
        + ("" if open_prs is None else ", or PR not open")
        + ")"
    )
    failed = []
    for s, why in doomed:
        print(f"  {s.name}: {why}" + (" (dry run: kept)" if args.dry_run else ""))
        if args.dry_run:
            continue
        sub = argparse.Namespace(**{**vars(args), "pr": s.pr, "keep_config": False})
        try:
            cmd_destroy(sub, engine)
        except ReviewError as exc:
            print(f"error: {s.name}: {exc}", file=sys.stderr)
            failed.append(s.name)
    if args.out_dir:
        _write_json(
            args.out_dir / "sweep.json",
            [{"stack": s.name, "pr": s.pr, "why": why} for s, why in doomed],
        )
    if failed:
        print(f"sweep: {len(failed)} failed: {', '.join(failed)} (rerun to retry)", file=sys.stderr)
        return 1
    return 0


# ---- command line -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/review_stack.py",
        description="Review stacks pr-<N> for labelled pull requests (docs/review-stacks.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, pr: bool) -> None:
        if pr:
            p.add_argument("--pr", type=int, required=True, help="pull request number")
        p.add_argument(
            "--engine", choices=["auto", "cli", "standin"], help="default: PULUMI_ENGINE, else auto"
        )
        p.add_argument(
            "--project", type=Path, default=ROOT, help="the checkout to deploy (default: this one)"
        )
        p.add_argument(
            "--base-stack",
            default=DEFAULT_BASE_STACK,
            help="stack the review stack is made from and compared with",
        )
        p.add_argument("--out-dir", type=Path, help="where the JSON files for the comment go")
        p.add_argument(
            "--state-dir",
            type=Path,
            default=Path(os.environ["REVIEW_STATE_DIR"])
            if os.environ.get("REVIEW_STATE_DIR")
            else None,
            help=(
                "stand-in: where the review stacks' state files live (default"
                " <project>/.pulumi-offline; env REVIEW_STATE_DIR)"
            ),
        )
        p.add_argument(
            "--server-url",
            default=os.environ.get("MODAL_SERVER_URL", ""),
            help="stand-in: the emulator's URL",
        )
        p.add_argument(
            "--budget-usd",
            type=float,
            default=float(os.environ.get("REVIEW_BUDGET_USD", DEFAULT_BUDGET_USD)),
            help="spend limit per review stack per month (default 20; env REVIEW_BUDGET_USD)",
        )
        p.add_argument(
            "--max-containers",
            type=int,
            default=DEFAULT_MAX_CONTAINERS,
            help="cap on every service's max_containers (default 1)",
        )
        p.add_argument(
            "--sweep-days",
            type=int,
            default=int(os.environ.get("REVIEW_MAX_AGE_DAYS", DEFAULT_SWEEP_DAYS)),
            help="age the nightly sweep destroys at (shown in the comment)",
        )

    p = sub.add_parser("up", help="deploy (create or update) the PR's review stack")
    common(p, pr=True)
    p.add_argument("--head-repo", required=True, help="OWNER/REPO the PR's branch lives in")
    p.add_argument("--base-repo", required=True, help="OWNER/REPO of this repository")
    p.add_argument("--head-sha", default="", help="the PR's head commit (shown in the comment)")

    p = sub.add_parser("plan", help="preview the PR's code against the base stack; costs")
    common(p, pr=True)
    p.add_argument("--base-state", type=Path, help="stand-in: the base stack's state file")

    p = sub.add_parser("comment", help="render the PR comment from the files of plan and up")
    common(p, pr=True)
    p.add_argument(
        "--in-dir", type=Path, help="where plan and up wrote their files (default --out-dir)"
    )
    p.add_argument("--out", type=Path, help="write the Markdown here (default stdout)")
    p.add_argument("--closed", action="store_true", help="the comment of a destroyed stack")
    p.add_argument("--reason", default="", help="with --closed: why it was destroyed")
    p.add_argument("--head-sha", default="")
    p.add_argument(
        "--reader-python",
        default=".venv/bin/python",
        help="stand-in: the python the comment's commands use",
    )

    p = sub.add_parser("destroy", help="destroy the PR's review stack and remove it")
    common(p, pr=True)
    p.add_argument("--keep-config", action="store_true", help="keep Pulumi.pr-N.yaml")

    p = sub.add_parser("sweep", help="destroy review stacks last deployed more than N days ago")
    common(p, pr=False)
    p.add_argument("--older-than-days", type=float, required=True)
    p.add_argument("--open-prs", help="comma-separated open PR numbers: stacks of other PRs go too")
    p.add_argument("--now", help="the time to measure ages from (ISO 8601; tests)")
    p.add_argument("--dry-run", action="store_true")

    p = sub.add_parser("list", help="the review stacks and when each was last deployed (JSON)")
    common(p, pr=False)
    p.add_argument("--now", help="the time to measure ages from (ISO 8601)")

    p = sub.add_parser("config", help="print the review stack's config (Pulumi.pr-N.yaml)")
    common(p, pr=True)

    p = sub.add_parser(
        "costs", help="the base stack's costs with this checkout's cost model (JSON)"
    )
    common(p, pr=False)
    return parser.parse_args(argv)


COMMANDS = {
    "up": cmd_up,
    "plan": cmd_plan,
    "destroy": cmd_destroy,
    "sweep": cmd_sweep,
    "list": cmd_list,
    "config": cmd_config,
    "costs": cmd_costs,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "comment":
            return cmd_comment(args, None)
        project = args.project.resolve()
        engine = Engine(
            kind=choose_engine(args.engine)
            if args.command not in ("config", "costs")
            else "standin",
            project=project,
            state_dir=(args.state_dir or project / ".pulumi-offline").resolve(),
            server_url=args.server_url,
        )
        return COMMANDS[args.command](args, engine)
    except ReviewError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
