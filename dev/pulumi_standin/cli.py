"""`python -m pulumi_standin` (also scripts/offline_stack.py): the engine stand-in as a command.

    python -m pulumi_standin preview --stack local          # like `pulumi preview --diff`
    python -m pulumi_standin preview --stack local --json   # like `pulumi preview --json`
    python -m pulumi_standin up      --stack local          # like `pulumi up`
    python -m pulumi_standin refresh --stack local          # like `pulumi refresh`
    python -m pulumi_standin destroy --stack local          # like `pulumi destroy`
    python -m pulumi_standin output  --stack local [NAME] [--show-secrets]
      [--state FILE] [--server-url URL] [--config KEY=VALUE ...] [--target URN|NAME ...]
      [--secret KEY=VALUE ...] [--secret-from-env KEY=VAR ...]
      [--verbose] [--cwd DIR]
    python -m pulumi_standin up --cwd access --stack local   # like `pulumi -C access up`

NOT the Pulumi engine: for machines without the Pulumi CLI, against the Modal emulator only.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml

from pulumi_standin import _sigint
from pulumi_standin.program import (
    PROJECT,
    PROJECT_ROOT,
    StackFileError,
    load_stack_file,
    project_here,
    project_name,
    server_url_problem,
)
from pulumi_standin.stack import (
    FAULT_ENV,
    Command,
    Interrupt,
    fault_hook,
    refresh_option,
    require_emulator,
    resolve_server_url,
    run,
    secure_keys,
)
from pulumi_standin.statefile import StandinError
from pulumi_standin.values import Secret

COMMANDS = ["preview", "up", "refresh", "destroy", "output"]
#: Where a preview without any emulator URL points the providers. A preview runs Check and Diff
#: only, which never call Modal (docs/offline.md), so nothing is ever sent there; were a call
#: made, it would fail on this closed loopback port, never reach a real Modal.
NO_EMULATOR_URL = "http://127.0.0.1:9"


def parse_overrides(
    pairs: list[str],
    secret_pairs: list[str] | None = None,
    project: str = PROJECT,
    *,
    env_pairs: list[str] | None = None,
) -> dict[str, Any]:
    """`--config KEY=VALUE` pairs -> {"namespace:key": value}; bare keys get the project's
    namespace (`modal-llm:`, or the `--cwd` project's).

    `--config` is `pulumi config set` (plain text: the program refuses a secret key given that
    way, as it does under the CLI); `--secret` is `pulumi config set --secret`;
    `--secret-from-env KEY=VAR` is `--secret` with the value read from environment variable
    VAR, so that it is on no command line (`ps`, /proc/<pid>/cmdline)."""
    overrides: dict[str, Any] = {}
    given: list[tuple[str, list[str]]] = [
        ("--config", pairs),
        ("--secret", secret_pairs or []),
        ("--secret-from-env", env_pairs or []),
    ]
    for flag, items in given:
        for pair in items:
            key, sep, value = pair.partition("=")
            if not sep or not key:  # the text is not echoed: it may be a secret value
                raise StandinError(f"{flag}: expected KEY=VALUE (no key or no '=' given)")
            if flag == "--secret-from-env":
                var, found = value, os.environ.get(value)
                if not var or found is None:
                    raise StandinError(
                        f"--secret-from-env {key}={var}: the environment variable {var!r} is"
                        " not set; export it (the secret's value) and rerun"
                    )
                value = found
            full = key if ":" in key else f"{project}:{key}"
            overrides[full] = value if flag == "--config" else Secret(value)
    return overrides


def stack_file_config(stack_file: Path) -> dict[str, Any]:
    """The stack file's `config:` mapping; a YAML error or a bad `modal:serverUrl` in it is one
    line naming the file (and line and column), before anything runs. The project file is the
    one beside it (the project directory)."""
    try:
        raw = load_stack_file(stack_file)
        load_stack_file(stack_file.parent / "Pulumi.yaml")
    except StackFileError as exc:
        raise StandinError(str(exc)) from None
    config: dict[str, Any] = dict(raw.get("config") or {})
    if "modal:serverUrl" in config:
        problem = server_url_problem(config["modal:serverUrl"])
        if problem:
            raise StandinError(
                f"{stack_file.name}: modal:serverUrl {config['modal:serverUrl']!r} {problem};"
                " the local stack names its emulator, e.g. modal:serverUrl:"
                " http://127.0.0.1:8790"
            )
    return config


def server_url(
    args: argparse.Namespace,
    raw_config: dict[str, Any],
    out: TextIO,
    project_dir: Path = PROJECT_ROOT,
) -> str:
    """The emulator URL of this run (--server-url, else MODAL_SERVER_URL, else the stack's
    modal:serverUrl), checked at once. A preview needs none: without one it gets
    NO_EMULATOR_URL and says so (it never calls Modal)."""
    given = args.server_url or os.environ.get("MODAL_SERVER_URL")
    if given:
        problem = server_url_problem(given)
        if problem:
            source = "--server-url" if args.server_url else "MODAL_SERVER_URL"
            raise StandinError(f"{source} {given!r} {problem}")
    elif args.command == "preview" and "modal:serverUrl" not in raw_config:
        out.write(
            f"note: no emulator URL for stack '{args.stack}' (no --server-url, MODAL_SERVER_URL"
            " or modal:serverUrl) and none is needed: a preview runs Check and Diff only, which"
            " never call Modal.\n"
        )
        return resolve_server_url(args.stack, NO_EMULATOR_URL, project_dir)
    return resolve_server_url(args.stack, args.server_url, project_dir)


#: Config keys a wrapper passes on every run (no "for this run only" warning for them).
EVERY_RUN_VAR = "PULUMI_STANDIN_EVERY_RUN"


def one_run_warnings(
    stack: str, overrides: dict[str, Any], project_dir: Path = PROJECT_ROOT
) -> list[str]:
    """A warning per `--config`/`--secret` value of an `up` that differs from the stack file:
    it is never saved, so the next `up` without it (`make up`) goes back to the file's value
    and undoes this run's change (a rotated key is rotated back). None for the keys a wrapper
    passes on every run and names in PULUMI_STANDIN_EVERY_RUN (comma-separated; e.g.
    scripts/offline_stack.py's managed mode of the local stack)."""
    every_run = {k.strip() for k in os.environ.get(EVERY_RUN_VAR, "").split(",") if k.strip()}
    try:
        saved = dict(load_stack_file(project_dir / f"Pulumi.{stack}.yaml").get("config") or {})
    except StackFileError:
        return []
    warnings = []
    for key, value in overrides.items():
        secret = isinstance(value, Secret)
        text = str(value.value if secret else value)
        try:
            parsed: Any = yaml.safe_load(text)
        except yaml.YAMLError:
            parsed = text
        if key in saved and saved[key] in (parsed, text):
            continue
        ns_key = key.removeprefix(f"{PROJECT}:") if key.startswith(f"{PROJECT}:") else key
        if key in every_run or ns_key in every_run:
            continue
        flag = "--secret" if secret else "--config"
        if isinstance(parsed, dict) and parsed and not secret:
            keep = "; ".join(
                f"pulumi config set --path {shlex.quote(f'{ns_key}.{k}')}"
                f" {shlex.quote(str(v))} --stack {stack}"
                for k, v in parsed.items()
            )
        else:
            shown = "<value>" if secret else shlex.quote(text)
            keep = f"pulumi config set {'--secret ' if secret else ''}{key} {shown} --stack {stack}"
        warnings.append(
            f"warning: {flag} {key} is for this run only and never saved: the next `up` without"
            f" it (`make up` too) goes back to Pulumi.{stack}.yaml's value"
            f" ({'unset' if key not in saved else 'as saved'}) and undoes this change"
            f" (a rotated key is rotated back). To keep it, save it in the stack: {keep}"
            f" (Pulumi CLI), or write it under config: in Pulumi.{stack}.yaml."
        )
    return warnings


def _has_resources(state_path: Path) -> bool:
    """Whether the state file lists any resource (read without the passphrase: the list is
    not encrypted, only secret values are)."""
    import json

    try:
        return bool(json.loads(state_path.read_text()).get("resources"))
    except (OSError, ValueError, AttributeError):
        return False


def _require_emulator_to_refresh(url: str, flag: bool) -> None:
    """A preview that refreshes reads every resource from Modal: without an emulator it would
    fail resource by resource, so it stops at once and says what to do."""
    try:
        require_emulator(url)
    except StandinError as exc:
        why = "--refresh" if flag else "Pulumi.yaml sets `options: refresh: always`"
        raise StandinError(
            f"{exc}\nThis preview refreshes first ({why}): it reads every resource of the"
            " state back from Modal. Start the emulator (make emulator, or make up), or plan"
            " against the state file alone, without seeing drift: --refresh=false."
        ) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pulumi_standin",
        description=(
            "Stand-in for `pulumi preview --diff` / `up` / `refresh` / `destroy` / `stack"
            " output` against the Modal emulator. NOT the Pulumi engine: the program runs under"
            " the SDK's mock monitor and every dynamic resource goes through the SDK's real"
            " dynamic-provider server, for machines without the Pulumi CLI (docs/standin.md)."
        ),
        epilog=(
            "State: .pulumi-offline/<stack>.json, secrets encrypted with OFFLINE_STACK_PASSPHRASE"
            " / PULUMI_CONFIG_PASSPHRASE (local stack default: local-emulator)."
        ),
    )
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("name", nargs="?", help="output: the one output to print")
    parser.add_argument("--stack", default="local", help="stack name (Pulumi.<stack>.yaml)")
    parser.add_argument(
        "-C",
        "--cwd",
        type=Path,
        help=(
            "the project directory, like `pulumi -C DIR`: its Pulumi.yaml, Pulumi.<stack>.yaml"
            " and __main__.py, state in DIR/.pulumi-offline/ (default: the project the current"
            " directory is in, else this repository)"
        ),
    )
    parser.add_argument(
        "--state", type=Path, help="state file (default: .pulumi-offline/<stack>.json)"
    )
    parser.add_argument(
        "--server-url",
        help="emulator URL (default: env MODAL_SERVER_URL, else the stack's modal:serverUrl)",
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "override one config value for this run only (never saved; objects/lists as JSON),"
            ' e.g. --config \'modal-llm:apiKeyRotation={"gateway": "2026-12-01"}\''
        ),
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=(
            "a secret config value for this run only, as `pulumi config set --secret` (never"
            " saved, never printed), e.g. --secret hfToken=hf_... (it is on the command line,"
            " which `ps` shows: prefer --secret-from-env)"
        ),
    )
    parser.add_argument(
        "--secret-from-env",
        action="append",
        default=[],
        metavar="KEY=VAR",
        help=(
            "as --secret, the value read from environment variable VAR (kept off the command"
            " line), e.g. --secret-from-env proxyToken=REVIEW_SECRET_PROXYTOKEN"
        ),
    )
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URN",
        help="only this resource (its URN, or its name); repeatable",
    )
    parser.add_argument(
        "-r",
        "--refresh",
        nargs="?",
        const="true",
        default=None,
        metavar="BOOL",
        help=(
            "preview/up/destroy: refresh every resource from Modal first, as `pulumi up"
            " --refresh` (--refresh=false: not even when Pulumi.yaml says `options: refresh:"
            " always`, which this project sets; docs/offline.md)"
        ),
    )
    parser.add_argument("--show-secrets", action="store_true", help="print secret outputs in clear")
    parser.add_argument(
        "--json",
        action="store_true",
        help=(
            "preview: print the plan as `pulumi preview --json` does (one JSON document on"
            " stdout, notes on stderr; dev/pulumi_standin/preview_json.py); output: the value (or"
            " every output) as JSON, as `pulumi stack output --json` does"
        ),
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=(
            "print a failed provider call's whole traceback (by default only the provider's"
            " error is printed, the traceback goes to <state>.last-error.txt)"
        ),
    )
    # Intermixed: `output --stack local endpoint_url` (options before the name) works as
    # `output endpoint_url --stack local` does, like `pulumi stack output NAME --stack S`.
    args = parser.parse_intermixed_args(argv)
    if args.name is not None and args.command != "output":
        parser.error(f"unexpected argument {args.name!r} for {args.command}")
    if args.json and args.command not in ("preview", "output"):
        parser.error("--json is for preview and output only")
    if args.refresh is not None and args.command not in ("preview", "up", "destroy"):
        parser.error(f"--refresh is for preview, up and destroy (not {args.command})")
    return args


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    args = parse_args(argv)
    # A failed or interrupted program leaves no asyncio noise behind: one message only.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    project_dir = (args.cwd or project_here()).resolve()
    stack_file = project_dir / f"Pulumi.{args.stack}.yaml"
    document_out = out
    if args.json and args.command == "preview":  # stdout: the JSON document; notes: stderr
        out = sys.stderr
    try:
        if not (project_dir / "Pulumi.yaml").exists():
            raise StandinError(f"no Pulumi.yaml in {project_dir}: not a Pulumi project")
        if not stack_file.exists():
            raise StandinError(f"no stack file {stack_file.name} in {project_dir}")
        raw_config = stack_file_config(stack_file)
        project = PROJECT if project_dir == PROJECT_ROOT else project_name(project_dir)
        overrides = parse_overrides(
            args.config, args.secret, project, env_pairs=args.secret_from_env
        )
        state_path = args.state or project_dir / ".pulumi-offline" / f"{args.stack}.json"
        url = "" if args.command == "output" else server_url(args, raw_config, out, project_dir)
        if args.command == "up":
            for line in one_run_warnings(args.stack, overrides, project_dir):
                out.write(line + "\n")
        encrypted = secure_keys(args.stack, project_dir)
        if encrypted and args.command == "up":
            raise StandinError(
                f"stack '{args.stack}' has encrypted config ({', '.join(encrypted)}) that this"
                " stand-in cannot decrypt; it would deploy placeholder values. Use the Pulumi"
                " CLI for this stack."
            )
        if encrypted and args.command == "preview":
            out.write(
                f"note: encrypted config ({', '.join(encrypted)}) replaced by placeholder"
                " values for this preview\n"
            )
        if args.command in ("up", "destroy", "refresh"):
            require_emulator(url)
        refresh = args.command in ("preview", "up", "destroy") and refresh_option(
            project_dir, args.refresh
        )
        if refresh and args.command == "preview" and _has_resources(state_path):
            _require_emulator_to_refresh(url, args.refresh is not None)
        cmd = Command(
            refresh=refresh,
            refresh_flag=args.refresh is not None,
            command=args.command,
            stack=args.stack,
            state_path=state_path,
            url=url,
            show_secrets=args.show_secrets,
            overrides=overrides,
            targets=tuple(args.target),
            output_name=args.name,
            output_json=bool(args.json),
            verbose=args.verbose,
            program=project_dir / "__main__.py",
            project_dir=project_dir,
        )
        if args.json and args.command == "preview":
            from pulumi_standin import preview_json

            return preview_json.run(cmd, document_out, out, interrupt=Interrupt(_sigint.EVENT))
        hook = fault_hook(os.environ.get(FAULT_ENV))
        return run(cmd, out, before_step=hook, interrupt=Interrupt(_sigint.EVENT))
    except StandinError as exc:
        # stderr, always (issue 34 item 2): stdout carries only what a script may consume,
        # e.g. `$(python -m pulumi_standin output NAME)`; an error there became a header value.
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted (Ctrl-C) before any step started: nothing changed.\n")
        return 130
