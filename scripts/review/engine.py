"""The engine a review stack runs with: the Pulumi CLI or the stand-in (`python -m pulumi_standin`).

`Engine` runs stack commands (select, up, preview --json, outputs, destroy, ls) in the checkout
whose code deploys, on the service project or the access project, with a given Modal token;
`choose_engine` picks cli or standin (`--engine`, PULUMI_ENGINE, auto); `StackInfo` is one
review stack as listed.
"""

from __future__ import annotations

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

from .common import (
    ACCESS_DIR,
    ACCESS_NS,
    NS,
    REVIEW_STACK,
    STANDIN_DEFAULT_PASSPHRASE,
    ReviewError,
    parse_time,
    stack_name,
)


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

    `token`: the Modal token its commands run with (None: the caller's). `passphrase`: review
    stack pr-N's own state passphrase (from its hand-over; "" : the caller's environment's):
    it replaces PULUMI_CONFIG_PASSPHRASE / OFFLINE_STACK_PASSPHRASE of the service project's
    commands, and a stack created with it uses the passphrase secrets provider. The access
    project runs with REVIEW_ACCESS_BACKEND_URL / REVIEW_ACCESS_PASSPHRASE when set, so the
    access stacks (which hold every review environment's deploy token) can live in a backend
    the deploy jobs cannot read."""

    kind: str  # "cli" | "standin"
    project: Path
    state_dir: Path
    server_url: str = ""
    python: str = sys.executable
    token: tuple[str, str] | None = None
    passphrase: str = ""
    #: A backend of its own (`file://DIR`: the plan's private copy of dev), else the caller's.
    backend_url: str = ""

    def __repr__(self) -> str:  # the token and the passphrase are never printed
        return f"Engine(kind={self.kind!r}, project={str(self.project)!r})"

    def with_token(self, token: tuple[str, str]) -> Engine:
        return replace(self, token=token)

    def with_passphrase(self, passphrase: str) -> Engine:
        return replace(self, passphrase=passphrase)

    # ---- plumbing
    def env(self, *, access: bool = False) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("MODAL_ENVIRONMENT", "MODAL_PROFILE", "PYTHONPATH"):
            env.pop(key, None)
        env["PULUMI_SKIP_UPDATE_CHECK"] = "true"
        if self.token is not None:
            env["MODAL_TOKEN_ID"], env["MODAL_TOKEN_SECRET"] = self.token
        if self.backend_url and not access:
            env["PULUMI_BACKEND_URL"] = self.backend_url
            env.pop("PULUMI_ACCESS_TOKEN", None)  # a file:// backend needs no login
        if self.passphrase and not access:
            # The stand-in reads OFFLINE_STACK_PASSPHRASE first (dev/pulumi_standin/statefile.py):
            # both name this stack's own passphrase, whatever the caller's environment held.
            env["PULUMI_CONFIG_PASSPHRASE"] = env["OFFLINE_STACK_PASSPHRASE"] = self.passphrase
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
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        sys.stdout.flush()
        feed: dict[str, Any] = (
            {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        )
        return subprocess.run(
            list(cmd),
            cwd=self.dir(access) if self.kind == "cli" else self.project,
            env={**self.env(access=access), **(extra_env or {})},
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
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        done = self.run(cmd, capture=capture, access=access, stdin=stdin, extra_env=extra_env)
        if done.returncode != 0:
            raise ReviewError(f"{what} failed (exit {done.returncode}); its output is above")
        return done.stdout or ""

    # ---- commands
    def select_or_create(self, stack: str, *, access: bool = False) -> None:
        if self.kind == "cli":
            # With its own passphrase, a new stack gets the passphrase secrets provider (the
            # default of a Pulumi Cloud backend is the service's key, which every holder of the
            # shared PULUMI_ACCESS_TOKEN could use); `stack select --create --secrets-provider`
            # (pulumi/pulumi pkg/cmd/pulumi/stack/stack_select.go).
            extra = ["--secrets-provider", "passphrase"] if self.passphrase and not access else []
            self.checked(
                self.cli("stack", "select", "--create", stack, *extra, access=access),
                f"pulumi stack select --create {stack}",
                access=access,
            )
            if extra:
                self.verify_state(stack)

    def stack_export(self, stack: str, *, show_secrets: bool = False) -> dict[str, Any]:
        """`pulumi stack export` of `stack` as a document (CLI only)."""
        args = ["stack", "export", "--stack", stack] + (["--show-secrets"] if show_secrets else [])
        what = f"pulumi stack export --stack {stack}"
        text = self.checked(self.cli(*args), what, capture=True)
        try:
            doc = json.loads(text or "{}")
        except ValueError:
            raise ReviewError(f"{what} printed no JSON") from None
        if not isinstance(doc, dict):
            raise ReviewError(f"{what} printed JSON that is not an object")
        return doc

    def verify_state(self, stack: str) -> None:
        """Refuse a state whose dynamic providers are not encrypted secrets (CLI only).

        The engine runs the provider pickled in a resource's state (`__provider`) for its
        Delete and Read (pulumi/dynamic/__main__.py: `get_provider(props)`), and our providers
        always pickle as secrets (`serialize_as_secret_always`). The review stacks' backend
        credential is shared, so another PR's code could write this stack's state: a secret
        it writes must open with THIS stack's passphrase (AES-256-GCM, authenticated:
        sdk/go/common/resource/config/crypt.go), but a plain `__provider` would run as is.
        So every `__provider` must be a secret, else nothing runs on that state."""
        if self.kind != "cli":
            return
        plain = plain_providers(self.stack_export(stack))
        if plain:
            raise ReviewError(
                f"the state of {stack} holds {len(plain)} dynamic provider(s) that are not"
                f" encrypted secrets ({', '.join(plain[:3])}): it was not written by {stack}'s"
                " own deploys (its passphrase encrypts every provider). Nothing was run on it;"
                f" inspect it (`pulumi stack export --stack {stack}`) and, if it is not yours,"
                f" `pulumi stack rm --force {stack}` and deploy again"
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
        # Stand-in: each secret in an environment variable of the child only, named on its
        # command line (`--secret-from-env KEY=VAR`), never the value itself: argv is readable
        # by every user of the machine (`ps`, /proc/<pid>/cmdline).
        extra: list[str] = []
        env_secrets: dict[str, str] = {}
        for key, value in (secrets or {}).items():
            var = f"REVIEW_SECRET_{re.sub(r'[^A-Za-z0-9]', '_', key).upper()}"
            env_secrets[var] = value
            extra += ["--secret-from-env", f"{key}={var}"]
        self.checked(
            self.standin("up", stack, *extra, access=access),
            f"up of {stack}",
            access=access,
            extra_env=env_secrets,
        )

    def preview_json(self, stack: str, state: Path | None) -> tuple[dict[str, Any], int]:
        """`preview --json` without a refresh (`--refresh=false` wins over Pulumi.yaml's
        `options: refresh: always`: pkg/cmd/pulumi/operations/io.go getRefreshOption): the
        plan compares the code with the base stack's recorded state, has no Modal token to
        read resources with, and dev's copy holds placeholders where the pickled providers a
        Read would run were (drift is `make plan`'s business)."""
        if self.kind == "cli":
            cmd = self.cli("preview", "--json", "--refresh=false", "--stack", stack)
        else:
            cmd = self.standin("preview", stack, "--json", "--refresh=false", state=state)
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
            if self.passphrase and not access:
                self.verify_state(stack)  # destroy runs the state's pickled providers
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
        self.checked(
            self.standin("destroy", stack, access=access), f"destroy of {stack}", access=access
        )
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


#: pulumi/pulumi sdk/go/common/resource/sig (`Secret`): the key and value that mark a secret
#: object in a serialized state (`{"4dabf18193072939515e22adb298388d": "1b47...", "ciphertext":
#: ...}` when encrypted, `"plaintext": ...` in `stack export --show-secrets`).
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"  # noqa: S105 (a marker, not a secret)


def _is_encrypted_secret(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and value.get(SIG_KEY) == SECRET_SIG
        and isinstance(value.get("ciphertext"), str)
    )


def plain_providers(export: Mapping[str, Any]) -> list[str]:
    """URNs of resources in a `pulumi stack export` document whose `__provider` (inputs or
    outputs) is not an encrypted secret."""
    found = []
    deployment = export.get("deployment") or {}
    for res in deployment.get("resources") or []:
        for part in ("inputs", "outputs"):
            props = res.get(part) or {}
            if "__provider" in props and not _is_encrypted_secret(props["__provider"]):
                found.append(str(res.get("urn") or "?"))
                break
    return found


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
