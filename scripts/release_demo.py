"""`make release-demo`: a bad release caught and rolled back while traffic flows (README,
"Releases: a bad version never keeps traffic"), on the local stack `make up` deployed.

1. reads the stack's outputs (the stand-in's state file, as `make up` left it) and sends a chat
   completion through the emulator's edge every 0.2 s, with the stack's proxy token and its
   `gateway` key, for the whole demo;
2. runs the stand-in's `up` of the local stack with the first service's stand-in engine set to
   crash at start (`--config services=...` with `engine_standin: {fail: start}`: this run only,
   nothing is saved; the stand-in warns so): the health gate sees the crash loop, refuses the
   release and rolls back to the last version that passed, and the `up` fails naming why;
3. counts the answers: every request of the demo must have been answered 200, the old version
   serving while the bad one crashed and after the rollback.

It exits 0 only when all of that held (the `up` failed with a rollback and no request was
lost). The stack's state keeps the last good release, so `make up` afterwards changes nothing.
Stand-in only (the engine `make up` takes on a machine without the Pulumi CLI).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from local_stack import LocalStackError, chat_body, credentials, is_loopback, read_outputs

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_S = 0.2
AFTER_S = 2.0  # traffic goes on this long after the `up` ended: the rolled-back version serves


class Traffic(threading.Thread):
    """One chat completion at a time through the edge, every INTERVAL_S, until stopped; keeps
    each answer's status (0: no answer) and the first failure's text (never a header: they
    hold the credentials)."""

    def __init__(self, url: str, headers: dict[str, str], body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.headers, self.data = url, headers, json.dumps(body).encode()
        self.statuses: list[int] = []
        self.first_failure = ""
        self.stopped = threading.Event()

    def one(self) -> int:
        # S310: the URL was checked to be http(s) on loopback (is_loopback).
        request = urllib.request.Request(  # noqa: S310
            self.url, data=self.data, headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
                answer.read()
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            self.first_failure = self.first_failure or (
                f"HTTP {exc.code}: {exc.read()[:200].decode(errors='replace').strip()}"
            )
            return int(exc.code)
        except (urllib.error.URLError, OSError) as exc:
            self.first_failure = self.first_failure or f"{type(exc).__name__}: {exc}"
            return 0

    def run(self) -> None:
        while not self.stopped.is_set():
            self.statuses.append(self.one())
            self.stopped.wait(INTERVAL_S)


def bad_services(stack_file: Path) -> tuple[str, list[dict[str, Any]]]:
    """The stack file's services, the first one's stand-in engine set to crash at start."""
    config = yaml.safe_load(stack_file.read_text())["config"]
    services = [dict(s) for s in config["modal-llm:services"]]
    services[0]["engine_standin"] = {"fail": "start"}
    return str(services[0]["name"]), services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--server-url", required=True, help="this checkout's emulator")
    parser.add_argument("--state", type=Path, default=ROOT / ".pulumi-offline/local.json")
    args = parser.parse_args(argv)
    # as scripts/local-env.sh sets them for `make up`: its passphrase, the emulator's tokens
    os.environ.setdefault("PULUMI_CONFIG_PASSPHRASE", "local-emulator")
    os.environ.setdefault("MODAL_TOKEN_ID", "ak-local-emulator")
    os.environ.setdefault("MODAL_TOKEN_SECRET", "as-local-emulator")
    try:
        outputs = read_outputs("standin", "local", args.state)
    except LocalStackError as exc:
        print(f"error: release-demo: {exc}", file=sys.stderr)
        return 1
    name, services = bad_services(ROOT / "Pulumi.local.yaml")
    service = outputs["services"][name]
    endpoint = str(service["endpoint_url"])
    if not is_loopback(endpoint):
        print(f"error: release-demo: {endpoint!r} is not on this machine", file=sys.stderr)
        return 1
    traffic = Traffic(
        endpoint.rstrip("/") + "/v1/chat/completions",
        credentials(
            outputs["proxy_token_id"],
            outputs["proxy_token_secret"],
            outputs["all_api_keys"][name]["gateway"],
        ),
        chat_body(str(service["served_model_name"])),
    )
    live = service.get("deployed_version")
    print(
        f"release-demo: traffic: a chat completion every {INTERVAL_S} s through the edge to "
        f"'{name}' (v{live}, the last release that passed), for the whole demo."
    )
    print(
        f"release-demo: `up` with '{name}''s stand-in engine set to crash at start "
        "(engine_standin: {fail: start}, this run only): the health gate should refuse it and "
        "roll back (10-30 s; the gate prints its progress every 5 s)...",
        flush=True,
    )
    traffic.start()
    started = time.monotonic()
    command = [sys.executable, str(ROOT / "scripts/offline_stack.py"), "up", "--stack", "local",
               "--state", str(args.state), "--server-url", args.server_url,
               "--config", "services=" + json.dumps(services)]  # fmt: skip
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as up:
        assert up.stdout is not None
        log = []
        for line in up.stdout:
            print(line, end="", flush=True)
            log.append(line)
    took = time.monotonic() - started
    time.sleep(AFTER_S)
    traffic.stopped.set()
    traffic.join(timeout=40)
    answered = traffic.statuses.count(200)
    total = len(traffic.statuses)
    text = "".join(log)
    print()
    problems = []
    if up.returncode == 0:
        problems.append("the bad release was NOT refused: the `up` succeeded")
    elif "Rolled back to" not in text:
        problems.append(f"the `up` failed (exit {up.returncode}) without a rollback")
    else:
        print(
            f"release-demo: the bad release was refused and rolled back: `up` exit "
            f"{up.returncode} after {took:.1f} s, as it should."
        )
    print(
        f"release-demo: traffic during the demo: {answered} of {total} requests answered HTTP "
        f"200 over {took + AFTER_S:.1f} s."
    )
    if answered != total or total == 0:
        problems.append(f"{total - answered} request(s) not answered 200 (first: "
                        f"{traffic.first_failure or 'none sent'})")  # fmt: skip
    for problem in problems:
        print(f"error: release-demo: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(
        "release-demo: the stack's state keeps the release that passed: `make up` now changes "
        "nothing (`make down` tears it down)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
