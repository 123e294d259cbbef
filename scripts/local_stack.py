"""The live local stack after `make up`: wait until it answers, then show a curl that works.

    python scripts/local_stack.py check   --engine cli|standin [--stack local] [--state FILE]
    python scripts/local_stack.py outputs --engine cli|standin [--stack local] [--state FILE]

`check` reads the stack outputs (the Pulumi CLI's `pulumi stack output --json --show-secrets`,
or the stand-in's state file), sends a chat completion to every service's endpoint through the
emulator's edge with the stack's proxy token (Modal-Key/Modal-Secret) and an API key (our
proxy's Bearer key) until it answers 200 (the first request cold-starts the container), then
prints the endpoint, a copy-paste curl, and runs that curl and prints its answer. The curl it
runs gets its headers (the proxy token secret and the API key among them) from a file of mode
0600 in a private temporary directory (`-H @FILE`, curl >= 7.55), deleted right after: no
secret is ever on a process command line, where any local user could read it (/proc/PID/cmdline).
`outputs` prints the outputs as JSON, secrets revealed (what `make gateway-config` reads).

Why the curl shows the proxy token secret and an API key in clear, and only here: they are
the LOCAL stack's own throwaway values, generated for this machine, accepted only by the
emulator on 127.0.0.1 that this user started (it holds no other data and costs nothing), and
gone with `make down`. A curl without them would not work, and one that reads them from a
command would not be copy-paste. For any other stack (or an endpoint that is not loopback)
this script refuses before printing anything: real keys are read with `pulumi stack output
--show-secrets` by whoever may see them.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# scripts/ (this file's folder, on sys.path when run as a script); pulumi_standin, which
# gateway_config uses, is the dev tools', installed by `make setup`.
from gateway_config import GatewayConfigError, stack_outputs, standin_outputs

ROOT = Path(__file__).resolve().parents[1]

PROMPT = "Say hello in five words."
MAX_TOKENS = 16
RETRY_STATUSES = frozenset({429, 502, 503, 504})  # cold start, container (re)starting


class LocalStackError(RuntimeError):
    """The local stack cannot be read or does not answer."""


def read_outputs(engine: str, stack: str, state: Path) -> dict[str, Any]:
    try:
        return stack_outputs(stack) if engine == "cli" else standin_outputs(stack, state)
    except GatewayConfigError as exc:
        raise LocalStackError(str(exc)) from None


def is_loopback(url: str) -> bool:
    """An http(s) URL on this machine."""
    if urlsplit(url).scheme not in ("http", "https"):
        return False
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def chat_body(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
    }


def credentials(token_id: str, token_secret: str, api_key: str) -> dict[str, str]:
    return {
        "Modal-Key": token_id,
        "Modal-Secret": token_secret,
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
    }


def wait_until_answers(
    url: str, headers: dict[str, str], body: dict[str, Any], timeout: float
) -> float:
    """POST a chat completion until it answers 200; the seconds it took. Raises with the last
    status and body (never a header: they hold the credentials) when it does not."""
    started = time.monotonic()
    deadline = started + timeout
    data = json.dumps(body).encode()
    last = "no answer yet"
    failed_starts = 0
    while True:
        # S310: the URL was checked to be http(s) on loopback before (is_loopback).
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310
        left = max(deadline - time.monotonic(), 1)
        try:
            with urllib.request.urlopen(request, timeout=left) as r:  # noqa: S310
                r.read()
                return time.monotonic() - started
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace').strip()}"
            if exc.code not in RETRY_STATUSES:
                raise LocalStackError(f"{url} answered {last}") from None
            # The runtime retries a failed start with a back-off; three in a row are no blip.
            failed_starts = failed_starts + 1 if "failed to start" in last else 0
            if failed_starts >= 3:
                raise LocalStackError(
                    f"{url}: the container keeps failing to start; {last}"
                ) from None
        except (urllib.error.URLError, OSError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if time.monotonic() >= deadline:
            raise LocalStackError(f"{url} did not answer 200 within {timeout:.0f} s; last: {last}")
        time.sleep(0.5)


def curl_command(url: str, headers: dict[str, str], body: dict[str, Any]) -> str:
    lines = [f"curl -sS {shlex.quote(url)}"]
    lines += [f"-H {shlex.quote(f'{k}: {v}')}" for k, v in headers.items()]
    lines.append(f"-d {shlex.quote(json.dumps(body))}")
    lines.append("-w '\\nHTTP %{http_code}\\n'")
    return " \\\n    ".join(lines)


def run_curl(
    url: str, headers: dict[str, str], body: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """The printed curl, run with its headers read from a private file (`-H @FILE`): its
    command line holds the URL and the body only, never a credential."""
    with tempfile.TemporaryDirectory(prefix="local-stack-curl-") as tmp:
        header_file = Path(tmp) / "headers"
        fd = os.open(header_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{name}: {value}\n" for name, value in headers.items())
        command = ["curl", "-sS", url, "-H", f"@{header_file}", "-d", json.dumps(body),
                   "-w", "\nHTTP %{http_code}\n"]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def check(outputs: dict[str, Any], stack: str, timeout: float) -> int:
    if stack != "local":
        raise LocalStackError(
            f"stack '{stack}': this prints credentials, so it runs for the local stack only"
        )
    services = outputs.get("services")
    all_keys = outputs.get("all_api_keys")
    token_id, token_secret = outputs.get("proxy_token_id"), outputs.get("proxy_token_secret")
    if not (isinstance(services, dict) and services and isinstance(all_keys, dict)):
        raise LocalStackError("the stack outputs have no services/all_api_keys: run `make up`")
    if not (isinstance(token_id, str) and isinstance(token_secret, str)):
        raise LocalStackError("the stack outputs have no proxy token: run `make up`")
    shown: tuple[str, dict[str, str], dict[str, Any]] | None = None
    for name, svc in sorted(services.items()):
        endpoint = str(svc.get("endpoint_url") or "")
        if not is_loopback(endpoint):
            raise LocalStackError(
                f"service {name}: endpoint {endpoint!r} is not on this machine; refusing to "
                "print its credentials (this script is for the emulator-backed local stack)"
            )
        keys = all_keys.get(name) or {}
        if not keys:
            raise LocalStackError(f"service {name}: no API key in the outputs")
        key_name = "gateway" if "gateway" in keys else sorted(keys)[0]
        url = endpoint.rstrip("/") + "/v1/chat/completions"
        headers = credentials(token_id, token_secret, keys[key_name])
        body = chat_body(str(svc.get("served_model_name")))
        took = wait_until_answers(url, headers, body, timeout)
        print(
            f"Service {name}: {endpoint} answers through the edge ({took:.1f} s; key '{key_name}')"
        )
        shown = shown or (url, headers, body)
    assert shown is not None
    url, headers, body = shown
    command = curl_command(url, headers, body)
    print()
    print("Try it (local throwaway credentials: the emulator on 127.0.0.1 is the only thing")
    print("that accepts them, and `make down` forgets them):")
    print()
    print(command)
    print()
    answer = run_curl(url, headers, body)
    print(answer.stdout.rstrip("\n"))
    if answer.returncode != 0 or not answer.stdout.rstrip().endswith("HTTP 200"):
        print(answer.stderr.rstrip("\n"), file=sys.stderr)
        raise LocalStackError("the curl above did not answer 200")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("command", choices=["check", "outputs"])
    parser.add_argument("--engine", choices=["cli", "standin"], required=True)
    parser.add_argument("--stack", default="local")
    parser.add_argument("--state", type=Path, default=ROOT / ".pulumi-offline/local.json")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for 200")
    args = parser.parse_args(argv)
    try:
        outputs = read_outputs(args.engine, args.stack, args.state)
        if args.command == "outputs":
            print(json.dumps(outputs, indent=2, sort_keys=True))
            return 0
        return check(outputs, args.stack, args.timeout)
    except LocalStackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.command == "check":
            print(
                "The container's own log lines: MODAL_SERVER_URL=<the emulator's URL above> "
                ".venv/bin/modal app logs <app> -e local (app: `modal app list -e local`), "
                "and the emulator's log in .modal-emulator/emulator.log.",
                file=sys.stderr,
            )
            if "is stopped" in str(exc) or "404" in str(exc):
                print(
                    "The app may have been stopped or changed outside Pulumi: `make plan`"
                    " shows what drifted and why, and `make up` (which reads every resource"
                    " back first: Pulumi.yaml `options: refresh: always`) deploys it again.",
                    file=sys.stderr,
                )
        return 1


if __name__ == "__main__":
    sys.exit(main())
