"""The local stack file, read once and checked, for scripts/local-env.sh (`make up` / `make down`).

    python scripts/stack_file.py server-url --stack local
        prints `URL PORT`: the stack's `modal:serverUrl` (the emulator it names) and its port;
        a YAML error (a tab, an unclosed quote) is ONE line naming the file, line and column,
        and a URL that is not http(s) on this machine with a numeric port is refused at once.
    python scripts/stack_file.py run-config --stack local --server-url URL --out FILE
        writes FILE: the stack file with `modal:serverUrl` set to URL, for the Pulumi CLI's
        `pulumi up/destroy --config-file FILE` when this checkout's emulator runs on another
        port than the stack file names (Pulumi.local.yaml itself is never rewritten).

Why the stack file keeps its URL: a plain `pulumi up --stack local` must never reach real
Modal, so the local stack always names a loopback emulator (`modal:serverUrl`); the port may
move (another checkout's emulator holds it), and then the scripts hand the actual URL to the
engine for that run only: `--server-url` to the stand-in, `--config-file` to the CLI.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

# The dev tools (dev/pulumi_standin), installed beside the product by `make setup`.
from pulumi_standin.program import StackFileError, load_stack_file, server_url_problem

ROOT = Path(__file__).resolve().parents[1]

KEY = "modal:serverUrl"


class StackUrlError(RuntimeError):
    """The stack file or its server URL cannot be used; the message is one line."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_url(stack: str, root: Path = ROOT) -> tuple[str, int]:
    """The stack's emulator URL and port, checked: (url, port)."""
    path = root / f"Pulumi.{stack}.yaml"
    try:
        config = load_stack_file(path).get("config") or {}
    except StackFileError as exc:
        raise StackUrlError(str(exc)) from None
    url = config.get(KEY)
    if url is None:
        raise StackUrlError(
            f"{path.name}: {KEY} is not set; the {stack} stack must name its emulator, e.g."
            f" {KEY}: http://127.0.0.1:8790 (without it, pulumi would reach Modal itself)"
        )
    problem = server_url_problem(url)
    if problem:
        raise StackUrlError(f"{path.name}: {KEY} {url!r} {problem}")
    parts = urlsplit(str(url).strip())
    if not is_loopback(parts.hostname or ""):
        raise StackUrlError(
            f"{path.name}: {KEY} {url!r} is not on this machine; the {stack} stack drives the"
            " local Modal emulator only (127.0.0.1)"
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return str(url).strip(), port


def write_run_config(stack: str, url: str, out: Path, root: Path = ROOT) -> None:
    """The stack file with modal:serverUrl = url, written to `out` (mode 0600)."""
    problem = server_url_problem(url)
    if problem:
        raise StackUrlError(f"--server-url {url!r} {problem}")
    try:
        doc = load_stack_file(root / f"Pulumi.{stack}.yaml")
    except StackFileError as exc:
        raise StackUrlError(str(exc)) from None
    doc.setdefault("config", {})[KEY] = url
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            f"# Pulumi.{stack}.yaml with {KEY} = {url} (this checkout's emulator), written by\n"
            "# scripts/stack_file.py for the `pulumi --config-file` runs of make up/down.\n"
        )
        yaml.safe_dump(doc, f, sort_keys=False, default_flow_style=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["server-url", "run-config"])
    parser.add_argument("--stack", default="local")
    parser.add_argument("--server-url", help="run-config: the emulator's actual URL")
    parser.add_argument("--out", type=Path, help="run-config: the file to write")
    args = parser.parse_args(argv)
    try:
        if args.command == "server-url":
            url, port = server_url(args.stack)
            print(f"{url} {port}")
            return 0
        if not args.server_url or args.out is None:
            parser.error("run-config needs --server-url and --out")
        write_run_config(args.stack, args.server_url, args.out)
        return 0
    except StackUrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
