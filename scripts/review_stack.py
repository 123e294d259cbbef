"""Review stacks: a Pulumi stack and Modal environment `pr-<N>` per labelled pull request.

    python scripts/review_stack.py up      --pr N --head-repo OWNER/REPO --base-repo OWNER/REPO
    python scripts/review_stack.py plan    --pr N            # the PR's code against dev
    python scripts/review_stack.py comment --pr N            # the PR comment (Markdown)
    python scripts/review_stack.py destroy --pr N
    python scripts/review_stack.py sweep   --older-than-days N [--dry-run | --list-only]
    python scripts/review_stack.py access-up | handoff | access-destroy --pr N ...  # admin
    python scripts/review_stack.py list | config --pr N | costs
  common: [--engine auto|cli|standin] [--flow auto|access|default] [--project DIR]
          [--base-stack dev] [--out-dir DIR] [--budget-usd 20] [--handoff FILE]
          [--state-dir DIR] [--server-url URL]   (the last two: stand-in only)

Lifecycle, identities and knobs: docs/review-stacks.md. In short:
- Two flows. `access` (the default when access/ exists): the access project (access/, run
  with an Owner's or Manager's token) owns review environment pr-N, its budget, its gateway
  proxy token and ONE identity, `pr-N-deploy`, contributor in pr-N only (`access-up` writes
  `access/Pulumi.pr-N.yaml` and hands the two tokens over in a mode-0600 file, `--handoff`,
  optionally sealed with openssl for a CI artifact); the review stack then runs in managed
  mode (`modal-llm:managedByAccessStack`, the proxy token as the secret `proxyToken`) with the
  pr-N-deploy token only: the PR's code never runs with the admin token. `default`: the review
  stack owns its environment, budget and proxy token itself (one token does everything).
- `up` refuses a fork's PR with one line and exit 0 ("no review stack for forks"); else it
  writes `Pulumi.pr-N.yaml` from the checkout's `Pulumi.<base>.yaml` (`review_config`:
  environment `pr-N`, every service scaled to zero and capped at `--max-containers`, spend
  limit `--budget-usd` (default $20/month: Modal's budget for the environment, which stops its
  work when reached), no adopted environment, no protected caches, no secret of the base stack:
  the review stack gets its own proxy token and API keys), runs `pulumi up` with the engine and
  writes the stack's NON-secret outputs to `--out-dir` (`review-outputs.json`, `review.json`).
  With `--handoff FILE` it deploys with that hand-over (CI's deploy job); without it in the
  access flow it runs `access-up` first itself (needs an Owner's or Manager's token).
- `plan` writes what the comment compares, to `--out-dir`: `preview.json` (`pulumi preview
  --json --stack dev` of this checkout's code), `dev-outputs.json` (dev's outputs, secrets
  `[secret]`) and `costs.json` (this checkout's cost model on its `Pulumi.dev.yaml`: the new
  idle and worst-case figures, which `pulumi preview --json` does not carry).
- `comment` renders those files with scripts/review_comment.py (pure, unit-tested).
- `destroy` destroys the review stack and removes it (`pulumi stack rm`; the stand-in's state
  file); in the access flow as pr-N-deploy, then the access stack (environment, budget, proxy
  token, service user) with the caller's token. With `--handoff` only the review stack
  (CI's teardown job; `access-destroy` is the admin job's half).
- `sweep` destroys every review stack whose last deploy is older than N days (`--open-prs`:
  and those whose PR is not open). Which stacks exist and when they were last deployed: the
  CLI's `pulumi stack ls --json` (`name`, `lastUpdate`) of the service and access projects;
  the stand-in: the `pr-*.json` / `access-pr-*.json` state files in `--state-dir` and the
  `updated_at` each `up` records beside them (`pr-N.review.json`). A PR's age is that of the
  later of its two stacks; a stack being updated is left alone.

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
from dataclasses import dataclass, replace
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
    "managedByAccessStack",
    "adoptEnvironment",
    "protectCaches",
    "proxyTokenRotation",
    "apiKeyRotation",
    "monthlyBudgetUsd",
    "allowOverBudget",
)
ACCESS_DIR = "access"  # the access project (access/Pulumi.yaml, project modal-llm-access)
ACCESS_NS = "modal-llm-access"
FILES = review_comment.FILES


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
    base: Mapping[str, Any],
    pr: int,
    *,
    budget_usd: float,
    max_containers: int,
    managed: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """The config of review stack pr-N from the base stack's `config:` mapping, and the keys
    left out (secrets of the base stack, and settings a review stack never takes). `managed`:
    the access stack owns environment, budget and proxy token (`managedByAccessStack`; the
    token itself is set as the secret `proxyToken` at deploy time, never written here)."""
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
    if managed:
        config[f"{NS}:managedByAccessStack"] = True
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


def _write_stack_file(path: Path, config: Mapping[str, Any], header: str) -> None:
    """Write a stack file, keeping what the CLI put there (encryptionsalt, secrets provider)."""
    kept: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(OSError, yaml.YAMLError):
            old = yaml.safe_load(path.read_text()) or {}
            if isinstance(old, dict):
                kept = {k: v for k, v in old.items() if k != "config"}
    body = yaml.safe_dump({**kept, "config": dict(config)}, sort_keys=False)
    path.write_text(header + body)


def write_review_stack_file(
    project: Path,
    pr: int,
    base_stack: str,
    *,
    budget_usd: float,
    max_containers: int,
    managed: bool = False,
) -> tuple[Path, list[str]]:
    """Write `Pulumi.pr-N.yaml`; returns it with the base stack's keys that were left out."""
    base = read_stack_file(project, base_stack).get("config") or {}
    config, dropped = review_config(
        base, pr, budget_usd=budget_usd, max_containers=max_containers, managed=managed
    )
    path = project / f"Pulumi.{stack_name(pr)}.yaml"
    _write_stack_file(
        path,
        config,
        f"# Review stack {stack_name(pr)}: written by scripts/review_stack.py from"
        f" Pulumi.{base_stack}.yaml for pull request #{pr}.\n# Do not commit: it is rewritten on"
        " every deploy of the PR (docs/review-stacks.md).\n",
    )
    return path, dropped


def write_access_stack_file(project: Path, pr: int, *, budget_usd: float) -> Path:
    """`access/Pulumi.pr-N.yaml`: the access stack of review stack pr-N (run with an Owner's or
    Manager's token): environment pr-N, its budget, its gateway proxy token and ONE identity,
    `pr-N-deploy`, contributor in pr-N only."""
    stack = stack_name(pr)
    budget = int(budget_usd) if float(budget_usd).is_integer() else budget_usd
    config = {
        f"{ACCESS_NS}:environments": [
            {
                "name": stack,
                "monthly_budget_usd": budget,
                "identities": [{"name": deploy_identity(pr), "role": "contributor"}],
            }
        ]
    }
    path = project / ACCESS_DIR / f"Pulumi.{stack}.yaml"
    _write_stack_file(
        path,
        config,
        f"# Access stack of review stack {stack}: written by scripts/review_stack.py for pull"
        f" request #{pr}.\n# Do not commit (docs/review-stacks.md).\n",
    )
    return path


def deploy_identity(pr: int) -> str:
    return f"{stack_name(pr)}-deploy"


# ---- the hand-over of the deploy identity -------------------------------------------------

#: openssl's symmetric encryption of a sealed hand-over file; the workflow opens it with the
#: same arguments plus -d (.github/workflows/review.yml).
OPENSSL_ENC = ["enc", "-aes-256-cbc", "-pbkdf2", "-iter", "200000", "-salt"]
_TOKEN = re.compile(r"^(?P<id>[a-z]{2}-[^:\s]+):(?P<secret>[a-z]{2}-\S+)$")


@dataclass(frozen=True)
class Handoff:
    """What the access stack gives review stack pr-N: the `pr-N-deploy` token (contributor in
    pr-N only) and the gateway's proxy token. Never printed (repr hides them)."""

    environment: str
    deploy_token: str  # "ak-...:as-..."
    proxy_token: str  # "wk-...:ws-..."

    def __repr__(self) -> str:
        return f"Handoff(environment={self.environment!r}, <tokens hidden>)"

    @property
    def deploy_pair(self) -> tuple[str, str]:
        token_id, _, secret = self.deploy_token.partition(":")
        return token_id, secret

    def to_json(self) -> str:
        return json.dumps(
            {
                "environment": self.environment,
                "deploy_token": self.deploy_token,
                "proxy_token": self.proxy_token,
            }
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> Handoff:
        try:
            doc = json.loads(text)
            found = cls(str(doc["environment"]), str(doc["deploy_token"]), str(doc["proxy_token"]))
        except (ValueError, KeyError, TypeError):
            raise ReviewError(f"{where}: not a hand-over file of scripts/review_stack.py") from None
        for what, value, prefixes in (
            ("deploy_token", found.deploy_token, ("ak-", "as-")),
            ("proxy_token", found.proxy_token, ("wk-", "ws-")),
        ):
            m = _TOKEN.match(value)
            if not m or not (
                m["id"].startswith(prefixes[0]) and m["secret"].startswith(prefixes[1])
            ):
                raise ReviewError(f"{where}: {what} is not '{prefixes[0]}...:{prefixes[1]}...'")
        return found


def handoff_from_credentials(credentials: Any, pr: int) -> Handoff:
    """The access stack's `credentials` output -> pr-N's hand-over."""
    stack = stack_name(pr)
    try:
        env = credentials[stack]
        return Handoff(stack, str(env["identities"][deploy_identity(pr)]), str(env["proxy_token"]))
    except (KeyError, TypeError):
        raise ReviewError(
            f"the access stack {stack} has no credentials for {deploy_identity(pr)} in {stack}"
        ) from None


def write_handoff(path: Path, handoff: Handoff, seal_env: str | None) -> None:
    """Mode 0600; with `seal_env`, encrypted with openssl under that variable's value (for an
    artifact: the workflow's deploy job opens it before any of the PR's code runs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    if seal_env:
        if not os.environ.get(seal_env):
            raise ReviewError(f"--seal-key-env {seal_env}: the variable is not set")
        done = subprocess.run(
            ["openssl", *OPENSSL_ENC, "-pass", f"env:{seal_env}", "-out", str(path)],
            input=handoff.to_json().encode(),
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise ReviewError(f"openssl could not seal {path}: {done.stderr.decode()[:200]}")
        return
    path.write_text(handoff.to_json())


def read_handoff(path: Path, open_env: str | None = None) -> Handoff:
    if open_env:
        done = subprocess.run(
            ["openssl", *OPENSSL_ENC, "-d", "-pass", f"env:{open_env}", "-in", str(path)],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise ReviewError(f"{path}: openssl could not open it (wrong key or not sealed)")
        return Handoff.from_json(done.stdout.decode(), str(path))
    try:
        return Handoff.from_json(path.read_text(), str(path))
    except OSError as exc:
        raise ReviewError(f"{path}: cannot be read ({exc.strerror or exc})") from None


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
    """The Pulumi CLI or the stand-in, run in `project` (the checkout whose code deploys), on
    the service project or (`access=True`) on the access project `project/access`.

    `token`: the Modal token its commands run with (None: the caller's). The access project
    runs with REVIEW_ACCESS_BACKEND_URL / REVIEW_ACCESS_PASSPHRASE when set, so the access
    stacks (which hold every review environment's deploy token) can live in a backend the
    deploy jobs cannot read."""

    kind: str  # "cli" | "standin"
    project: Path
    state_dir: Path
    server_url: str = ""
    python: str = sys.executable
    token: tuple[str, str] | None = None

    def with_token(self, token: tuple[str, str]) -> Engine:
        return replace(self, token=token)

    # ---- plumbing
    def env(self, *, access: bool = False) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("MODAL_ENVIRONMENT", "MODAL_PROFILE", "PYTHONPATH"):
            env.pop(key, None)
        env["PULUMI_SKIP_UPDATE_CHECK"] = "true"
        if self.token is not None:
            env["MODAL_TOKEN_ID"], env["MODAL_TOKEN_SECRET"] = self.token
        if access:
            if env.get("REVIEW_ACCESS_BACKEND_URL"):
                env["PULUMI_BACKEND_URL"] = env["REVIEW_ACCESS_BACKEND_URL"]
            if env.get("REVIEW_ACCESS_PASSPHRASE"):
                env["PULUMI_CONFIG_PASSPHRASE"] = env["REVIEW_ACCESS_PASSPHRASE"]
                env.pop("OFFLINE_STACK_PASSPHRASE", None)
        if self.kind == "standin":
            if not (env.get("OFFLINE_STACK_PASSPHRASE") or env.get("PULUMI_CONFIG_PASSPHRASE")):
                env["PULUMI_CONFIG_PASSPHRASE"] = STANDIN_DEFAULT_PASSPHRASE
            if self.server_url:
                env["MODAL_SERVER_URL"] = self.server_url
        return env

    def dir(self, access: bool) -> Path:
        return self.project / ACCESS_DIR if access else self.project

    def state(self, stack: str, *, access: bool = False) -> Path:
        return self.state_dir / f"{'access-' if access else ''}{stack}.json"

    def meta(self, stack: str) -> Path:
        return self.state_dir / f"{stack}.review.json"

    def standin(
        self, command: str, stack: str, *extra: str, access: bool = False, state: Path | None = None
    ) -> list[str]:
        cmd = [self.python, "-m", "pulumi_standin", command, "--stack", stack]
        if access:
            cmd += ["--cwd", str(self.dir(True))]
        cmd += ["--state", str(state or self.state(stack, access=access))]
        if self.server_url and command != "output":
            cmd += ["--server-url", self.server_url]
        return [*cmd, *extra]

    def cli(self, *args: str, access: bool = False) -> list[str]:
        exe = pulumi_cli()
        if exe is None:
            raise ReviewError("the Pulumi CLI is not installed (PATH, ~/.pulumi/bin)")
        return [exe, *args, "--non-interactive", "--cwd", str(self.dir(access))]

    def run(
        self,
        cmd: Sequence[str],
        *,
        capture: bool = False,
        access: bool = False,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        sys.stdout.flush()
        feed: dict[str, Any] = (
            {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        )
        return subprocess.run(
            list(cmd),
            cwd=self.dir(access) if self.kind == "cli" else self.project,
            env=self.env(access=access),
            text=True,
            stdout=subprocess.PIPE if capture else None,
            check=False,
            **feed,
        )

    def checked(
        self,
        cmd: Sequence[str],
        what: str,
        *,
        capture: bool = False,
        access: bool = False,
        stdin: str | None = None,
    ) -> str:
        done = self.run(cmd, capture=capture, access=access, stdin=stdin)
        if done.returncode != 0:
            raise ReviewError(f"{what} failed (exit {done.returncode}); its output is above")
        return done.stdout or ""

    # ---- commands
    def select_or_create(self, stack: str, *, access: bool = False) -> None:
        if self.kind == "cli":
            self.checked(
                self.cli("stack", "select", "--create", stack, access=access),
                f"pulumi stack select --create {stack}",
                access=access,
            )

    def deploy(
        self, stack: str, *, access: bool = False, secrets: Mapping[str, str] | None = None
    ) -> None:
        """`up`; `secrets` (short key -> value) are set as secret config first (CLI: `pulumi
        config set --secret` reading the value from stdin; stand-in: `--secret` of the run)."""
        ns = ACCESS_NS if access else NS
        if self.kind == "cli":
            for key, value in (secrets or {}).items():
                self.checked(
                    self.cli("config", "set", "--secret", f"{ns}:{key}", "--stack", stack),
                    f"pulumi config set --secret {ns}:{key}",
                    stdin=value,
                    access=access,
                )
            self.checked(
                self.cli("up", "--yes", "--stack", stack, access=access),
                f"pulumi up --stack {stack}",
                access=access,
            )
            return
        extra = [f"--secret={key}={value}" for key, value in (secrets or {}).items()]
        self.checked(self.standin("up", stack, *extra, access=access), f"up of {stack}")

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

    def outputs(
        self, stack: str, state: Path | None = None, *, access: bool = False, reveal: bool = False
    ) -> dict[str, Any]:
        """The stack's outputs, secrets `[secret]` unless `reveal` (the access stack's
        credentials: read by the admin step only)."""
        if self.kind == "cli":
            args = ["stack", "output", "--json", "--stack", stack]
            text = self.checked(
                self.cli(*args, *(["--show-secrets"] if reveal else []), access=access),
                f"pulumi stack output --stack {stack}",
                capture=True,
                access=access,
            )
            value = json.loads(text or "{}")
            return dict(value) if isinstance(value, dict) else {}
        path = state or self.state(stack, access=access)
        return standin_outputs(stack, path, self.env(access=access), reveal=reveal)

    def exists(self, stack: str, *, access: bool = False) -> bool:
        if self.kind == "standin":
            return self.state(stack, access=access).exists()
        return any(s.name == stack for s in self.list_stacks(access=access))

    def destroy(self, stack: str, *, access: bool = False) -> bool:
        """Destroy and remove the stack; False when there was none."""
        if not self.exists(stack, access=access):
            if not access:
                self.meta(stack).unlink(missing_ok=True)
            return False
        if self.kind == "cli":
            self.checked(
                self.cli("destroy", "--yes", "--stack", stack, access=access),
                f"pulumi destroy --stack {stack}",
                access=access,
            )
            self.checked(
                self.cli("stack", "rm", "--yes", "--stack", stack, access=access),
                f"pulumi stack rm {stack}",
                access=access,
            )
            return True
        self.checked(self.standin("destroy", stack, access=access), f"destroy of {stack}")
        state = self.state(stack, access=access)
        state.unlink(missing_ok=True)
        state.with_name(state.stem + ".last-error.txt").unlink(missing_ok=True)
        if not access:
            self.meta(stack).unlink(missing_ok=True)
        return True

    def list_stacks(self, *, access: bool = False) -> list[StackInfo]:
        found: list[StackInfo] = []
        if self.kind == "cli":
            text = self.checked(
                self.cli("stack", "ls", "--json", access=access),
                "pulumi stack ls",
                capture=True,
                access=access,
            )
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
        prefix = "access-" if access else ""
        for path in sorted(self.state_dir.glob(f"{prefix}pr-*.json")):
            m = REVIEW_STACK.search(path.name.removeprefix(prefix).removesuffix(".json"))
            if not m:
                continue
            stack = stack_name(int(m["pr"]))
            when = None
            if not access:
                with contextlib.suppress(OSError, ValueError):
                    when = parse_time(json.loads(self.meta(stack).read_text()).get("updated_at"))
            if when is None:  # no record: the state file's own time (written at every step)
                when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
            found.append(StackInfo(name=stack, pr=int(m["pr"]), last_update=when))
        return sorted(found, key=lambda s: s.pr)


def standin_outputs(
    stack: str, state: Path, env: Mapping[str, str], *, reveal: bool = False
) -> dict[str, Any]:
    """The stand-in's outputs of its last `up`, as `pulumi stack output --json` shows them."""
    if not state.exists():
        return {}
    from pulumi_standin.display import show_output
    from pulumi_standin.statefile import StandinError, StateFile
    from pulumi_standin.values import to_program

    keys = ("OFFLINE_STACK_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE")
    saved = {k: os.environ.get(k) for k in keys}
    for key in keys:
        if env.get(key):
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)
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
    return {k: show_output(v, reveal) for k, v in outputs.items()}


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


def _refuse_fork(args: argparse.Namespace) -> bool:
    if is_fork(args.head_repo, args.base_repo):
        print(
            f"no review stack for forks: PR #{args.pr} comes from {args.head_repo}, not"
            f" {args.base_repo} (a fork's code never runs with this repository's credentials)"
        )
        return True
    return False


def use_access_flow(args: argparse.Namespace, engine: Engine) -> bool:
    """`--flow access` (the access stack owns environment, budget, token and deploy identity),
    `default` (the review stack owns them itself), `auto`: access when access/ exists."""
    if args.flow == "default":
        return False
    present = (engine.project / ACCESS_DIR / "Pulumi.yaml").exists()
    if args.flow == "access" and not present:
        raise ReviewError(f"--flow access, but {engine.project / ACCESS_DIR} is not a project")
    return present


def access_up(args: argparse.Namespace, engine: Engine) -> Handoff:
    """The admin step: access stack pr-N (environment, budget, gateway proxy token, identity
    pr-N-deploy) with the caller's token (an Owner's or Manager's), and its hand-over."""
    stack = stack_name(args.pr)
    engine.select_or_create(stack, access=True)
    path = write_access_stack_file(engine.project, args.pr, budget_usd=args.budget_usd)
    print(
        f"{ACCESS_DIR}/{path.name}: environment {stack}, spend limit ${args.budget_usd:g}/month,"
        f" identity {deploy_identity(args.pr)} (contributor in {stack} only)"
    )
    engine.deploy(stack, access=True)
    credentials = engine.outputs(stack, access=True, reveal=True).get("credentials")
    return handoff_from_credentials(credentials, args.pr)


def existing_handoff(args: argparse.Namespace, engine: Engine) -> Handoff | None:
    stack = stack_name(args.pr)
    if not engine.exists(stack, access=True):
        return None
    credentials = engine.outputs(stack, access=True, reveal=True).get("credentials")
    return handoff_from_credentials(credentials, args.pr)


def cmd_access_up(args: argparse.Namespace, engine: Engine) -> int:
    if _refuse_fork(args):
        return 0
    handoff = access_up(args, engine)
    write_handoff(args.handoff, handoff, args.seal_key_env)
    sealed = f", sealed with ${args.seal_key_env}" if args.seal_key_env else ""
    print(f"hand-over of {handoff.environment}: {args.handoff} (mode 0600{sealed})")
    return 0


def cmd_handoff(args: argparse.Namespace, engine: Engine) -> int:
    handoff = existing_handoff(args, engine)
    if handoff is None:
        print(f"no access stack {stack_name(args.pr)}: no hand-over written")
        return 0
    write_handoff(args.handoff, handoff, args.seal_key_env)
    print(f"hand-over of {handoff.environment}: {args.handoff}")
    return 0


def cmd_up(args: argparse.Namespace, engine: Engine) -> int:
    stack = stack_name(args.pr)
    if _refuse_fork(args):
        return 0
    handoff: Handoff | None = None
    if args.handoff:
        handoff = read_handoff(args.handoff, args.open_key_env)
    elif use_access_flow(args, engine):
        handoff = access_up(args, engine)  # this process holds an Owner's/Manager's token
    if handoff is not None and handoff.environment != stack:
        raise ReviewError(f"the hand-over is for {handoff.environment}, not {stack}")
    deployer = engine.with_token(handoff.deploy_pair) if handoff is not None else engine
    deployer.select_or_create(stack)
    path, dropped = write_review_stack_file(
        engine.project,
        args.pr,
        args.base_stack,
        budget_usd=args.budget_usd,
        max_containers=args.max_containers,
        managed=handoff is not None,
    )
    who = (
        f"as {deploy_identity(args.pr)} (contributor in {stack} only; the access stack owns"
        " the environment, budget and proxy token)"
        if handoff is not None
        else "owning its environment, budget and proxy token"
    )
    print(
        f"{path.name}: environment {stack}, scaled to zero, spend limit"
        f" ${args.budget_usd:g}/month, {who}"
    )
    if dropped:
        print(
            f"  not taken from Pulumi.{args.base_stack}.yaml (secrets of that stack):"
            f" {', '.join(dropped)}"
        )
    started = now_utc()
    secrets = {"proxyToken": handoff.proxy_token} if handoff is not None else None
    deployer.deploy(stack, secrets=secrets)
    outputs = deployer.outputs(stack)
    meta = {
        "pr": args.pr,
        "stack": stack,
        "engine": engine.kind,
        "flow": "access" if handoff is not None else "default",
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
    costs = stack_costs(engine.project, args.base_stack, engine.server_url or None)
    print(json.dumps(costs, indent=2))
    return 0


def cmd_config(args: argparse.Namespace, engine: Engine) -> int:
    base = read_stack_file(engine.project, args.base_stack).get("config") or {}
    config, _ = review_config(
        base,
        args.pr,
        budget_usd=args.budget_usd,
        max_containers=args.max_containers,
        managed=use_access_flow(args, engine),
    )
    sys.stdout.write(yaml.safe_dump({"config": config}, sort_keys=False))
    return 0


def comment_from_files(args: argparse.Namespace) -> str:
    return review_comment.from_files(
        args.in_dir or args.out_dir or Path("."),
        args.pr,
        closed=args.closed,
        reason=args.reason,
        reader_python=args.reader_python,
        base_stack=args.base_stack,
        sweep_days=args.sweep_days,
        head_sha=args.head_sha,
    )


def cmd_comment(args: argparse.Namespace, engine: Engine | None) -> int:
    text = comment_from_files(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"comment for PR #{args.pr}: {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _destroy_service(args: argparse.Namespace, engine: Engine, *, managed: bool) -> bool:
    stack = stack_name(args.pr)
    config_file = engine.project / f"Pulumi.{stack}.yaml"
    if not config_file.exists():  # destroy reads the stack's config (provider settings)
        write_review_stack_file(
            engine.project,
            args.pr,
            args.base_stack,
            budget_usd=args.budget_usd,
            max_containers=args.max_containers,
            managed=managed,
        )
    try:
        return engine.destroy(stack)
    finally:
        if not args.keep_config:
            config_file.unlink(missing_ok=True)


def _destroy_access(args: argparse.Namespace, engine: Engine) -> bool:
    stack = stack_name(args.pr)
    path = engine.project / ACCESS_DIR / f"Pulumi.{stack}.yaml"
    if not path.exists():
        write_access_stack_file(engine.project, args.pr, budget_usd=args.budget_usd)
    try:
        return engine.destroy(stack, access=True)
    finally:
        if not args.keep_config:
            path.unlink(missing_ok=True)


def cmd_destroy(args: argparse.Namespace, engine: Engine) -> int:
    """The review stack (with `--handoff`: with that deploy token, the service stack only, as
    the workflow's teardown job); without it, and an access stack pr-N there: the whole
    teardown in order, service stack as pr-N-deploy, then the access stack with the caller's
    token (environment, budget, proxy token, service user)."""
    stack = stack_name(args.pr)
    if args.handoff:
        given = read_handoff(args.handoff, args.open_key_env)
        existed = _destroy_service(args, engine.with_token(given.deploy_pair), managed=True)
        print(f"review stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
        return 0
    handoff = existing_handoff(args, engine) if args.flow != "default" else None
    service = engine.with_token(handoff.deploy_pair) if handoff is not None else engine
    existed = _destroy_service(args, service, managed=handoff is not None)
    print(f"review stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
    if handoff is not None:
        _destroy_access(args, engine)
        print(f"access stack {stack}: destroyed (environment, budget, proxy token, identity)")
    return 0


def cmd_access_destroy(args: argparse.Namespace, engine: Engine) -> int:
    existed = _destroy_access(args, engine)
    stack = stack_name(args.pr)
    print(f"access stack {stack}: " + ("destroyed" if existed else "none, nothing to destroy"))
    return 0


def review_stacks(engine: Engine) -> list[StackInfo]:
    """Every PR with a review stack or an access stack (or both), last deployed when the
    later of the two was."""
    merged: dict[int, StackInfo] = {}
    sources = [engine.list_stacks()]
    if (engine.project / ACCESS_DIR / "Pulumi.yaml").exists():
        sources.append(engine.list_stacks(access=True))
    for source in sources:
        for s in source:
            have = merged.get(s.pr)
            if have is None:
                merged[s.pr] = replace(s)
                continue
            times = [t for t in (have.last_update, s.last_update) if t is not None]
            have.last_update = max(times) if times else None
            have.in_progress = have.in_progress or s.in_progress
    return [merged[pr] for pr in sorted(merged)]


def cmd_list(args: argparse.Namespace, engine: Engine) -> int:
    now = parse_time(args.now) if args.now else now_utc()
    if now is None:
        raise ReviewError(f"--now {args.now!r} is not an ISO 8601 time")
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
        for s in review_stacks(engine)
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
    stacks = review_stacks(engine)
    doomed = stale(stacks, now, args.older_than_days, open_prs)
    if args.list_only:  # the workflow's sweep: which PRs its teardown jobs destroy
        print(json.dumps([{"pr": s.pr, "stack": s.name, "why": why} for s, why in doomed]))
        return 0
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
    if failed:
        print(f"sweep: {len(failed)} failed: {', '.join(failed)} (rerun to retry)", file=sys.stderr)
        return 1
    return 0


# ---- command line -------------------------------------------------------------------------


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise SystemExit(f"error: {name}={raw!r} is not a number") from None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/review_stack.py",
        description="Review stacks pr-<N> for labelled pull requests (docs/review-stacks.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    state_dir = os.environ.get("REVIEW_STATE_DIR")

    def common(p: argparse.ArgumentParser, *, pr: bool) -> None:
        if pr:
            p.add_argument("--pr", type=int, required=True, help="pull request number")
        p.add_argument(
            "--engine",
            choices=["auto", "cli", "standin"],
            help="default: PULUMI_ENGINE, else auto (the CLI when installed)",
        )
        p.add_argument(
            "--flow",
            choices=["auto", "access", "default"],
            default=os.environ.get("REVIEW_FLOW", "auto"),
            help=(
                "access: the access stack owns environment, budget, proxy token and the"
                " pr-N-deploy identity; default: the review stack owns them; auto (default):"
                " access when access/ exists (env REVIEW_FLOW)"
            ),
        )
        p.add_argument(
            "--project", type=Path, default=ROOT, help="the checkout to deploy (default: this one)"
        )
        p.add_argument(
            "--base-stack",
            default=DEFAULT_BASE_STACK,
            help="the stack a review stack is made from and compared with (default dev)",
        )
        p.add_argument("--out-dir", type=Path, help="where the JSON files for the comment go")
        p.add_argument(
            "--state-dir",
            type=Path,
            default=Path(state_dir) if state_dir else None,
            help=(
                "stand-in: where the review stacks' state files live (default"
                " <project>/.pulumi-offline; env REVIEW_STATE_DIR)"
            ),
        )
        p.add_argument(
            "--server-url",
            default=os.environ.get("MODAL_SERVER_URL", ""),
            help="stand-in: the emulator's URL (default env MODAL_SERVER_URL)",
        )
        p.add_argument(
            "--budget-usd",
            type=float,
            default=_env_number("REVIEW_BUDGET_USD", DEFAULT_BUDGET_USD),
            help="spend limit per review stack and month (default 20; env REVIEW_BUDGET_USD)",
        )
        p.add_argument(
            "--max-containers",
            type=int,
            default=DEFAULT_MAX_CONTAINERS,
            help="cap on every service's max_containers in a review stack (default 1)",
        )
        p.add_argument(
            "--sweep-days",
            type=int,
            default=int(_env_number("REVIEW_MAX_AGE_DAYS", DEFAULT_SWEEP_DAYS)),
            help="the age the nightly sweep destroys at, shown in the comment (default 7)",
        )
        p.add_argument("--keep-config", action="store_true", help="keep Pulumi.pr-N.yaml files")
        p.add_argument(
            "--handoff",
            type=Path,
            help="the hand-over file (deploy identity + proxy token) of the access step",
        )
        p.add_argument(
            "--seal-key-env",
            help="access-up/handoff: encrypt the hand-over with this variable's value (openssl)",
        )
        p.add_argument(
            "--open-key-env", help="up/destroy: the hand-over is sealed with this variable's value"
        )

    def fork_guard(p: argparse.ArgumentParser) -> None:
        p.add_argument("--head-repo", required=True, help="OWNER/REPO the PR's branch lives in")
        p.add_argument("--base-repo", required=True, help="OWNER/REPO of this repository")
        p.add_argument("--head-sha", default="", help="the PR's head commit (for the comment)")

    p = sub.add_parser("up", help="deploy (create or update) the PR's review stack")
    common(p, pr=True)
    fork_guard(p)

    p = sub.add_parser(
        "access-up", help="admin step: the access stack pr-N and its hand-over (--handoff)"
    )
    common(p, pr=True)
    fork_guard(p)

    p = sub.add_parser("handoff", help="admin step: the hand-over of an existing access stack")
    common(p, pr=True)

    p = sub.add_parser("plan", help="preview the PR's code against the base stack; costs")
    common(p, pr=True)
    p.add_argument("--base-state", type=Path, help="stand-in: the base stack's state file")

    p = sub.add_parser("comment", help="render the PR comment from the files of plan and up")
    common(p, pr=True)
    p.add_argument("--in-dir", type=Path, help="where plan and up wrote (default --out-dir)")
    p.add_argument("--out", type=Path, help="write the Markdown here (default stdout)")
    p.add_argument("--closed", action="store_true", help="the comment of a destroyed stack")
    p.add_argument("--reason", default="", help="with --closed: why it was destroyed")
    p.add_argument("--head-sha", default="")
    p.add_argument(
        "--reader-python",
        default=".venv/bin/python",
        help="stand-in: the python the comment's commands use",
    )

    p = sub.add_parser("destroy", help="destroy the PR's review stack (and its access stack)")
    common(p, pr=True)

    p = sub.add_parser("access-destroy", help="admin step: destroy the access stack pr-N")
    common(p, pr=True)

    p = sub.add_parser("sweep", help="destroy review stacks last deployed more than N days ago")
    common(p, pr=False)
    p.add_argument("--older-than-days", type=float, required=True)
    p.add_argument("--open-prs", help="comma-separated open PR numbers: others' stacks go too")
    p.add_argument("--now", help="the time ages are measured from (ISO 8601; tests)")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument(
        "--list-only", action="store_true", help="print the PRs to destroy as JSON, destroy none"
    )

    p = sub.add_parser("list", help="the review stacks and when each was last deployed (JSON)")
    common(p, pr=False)
    p.add_argument("--now", help="the time ages are measured from (ISO 8601)")

    p = sub.add_parser("config", help="print the review stack's config (Pulumi.pr-N.yaml)")
    common(p, pr=True)

    p = sub.add_parser("costs", help="the base stack's costs with this checkout's cost model")
    common(p, pr=False)
    args = parser.parse_args(argv)
    if args.command in ("access-up", "handoff") and args.handoff is None:
        parser.error(f"{args.command} needs --handoff FILE")
    return args


COMMANDS = {
    "up": cmd_up,
    "access-up": cmd_access_up,
    "handoff": cmd_handoff,
    "plan": cmd_plan,
    "destroy": cmd_destroy,
    "access-destroy": cmd_access_destroy,
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
        offline = args.command in ("config", "costs")
        engine = Engine(
            kind="standin" if offline else choose_engine(args.engine),
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
