"""Command line: `python -m emulator serve --port PORT [...]` (see `--help`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import resource
import sqlite3
import sys
from pathlib import Path

from emulator.models.apps import DEFAULT_HEARTBEAT_TIMEOUT
from emulator.runtime.edge import EdgeLimits
from emulator.server import Options, serve
from emulator.store import StoreError

DEFAULT_STATE = Path(".modal-emulator") / "state.sqlite3"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m emulator",
        description="Local emulator of Modal's control plane for the real `modal` client.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "sweep",
        help="kill the container processes that emulators killed with -9 left running, and "
        "remove their scratch dirs (a starting emulator does this too)",
        description="One line on stdout says what was done. Only emulators of this user in "
        "this pid namespace that are gone are swept; a running emulator is left alone.",
    )
    s = sub.add_parser(
        "serve",
        help="serve the gRPC API (and the HTTP control surface) until SIGTERM/Ctrl-C",
        description=(
            "Point the client at it with MODAL_SERVER_URL=http://HOST:PORT plus "
            "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET. Port 0 picks a free port; the ready line "
            "printed on stdout names the real ones."
        ),
    )
    s.add_argument("--port", type=int, default=8790, help="gRPC port (default 8790)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    s.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="HTTP port for blobs and /_emulator/* (default PORT+1, or free when PORT is 0)",
    )
    where = s.add_mutually_exclusive_group()
    where.add_argument(
        "--state",
        type=Path,
        default=None,
        help=f"SQLite state file (default {DEFAULT_STATE} in the current directory)",
    )
    where.add_argument("--memory", action="store_true", help="keep state in memory only")
    s.add_argument("--workspace", default="emu-workspace", help="workspace name (web URLs)")
    s.add_argument("--token-id", default=None, help="require this token id (with --token-secret)")
    s.add_argument("--token-secret", default=None, help="require this token secret")
    s.add_argument(
        "--rbac",
        action="store_true",
        help="emulate a workspace with RBAC: proxy tokens are scoped to their environments",
    )
    s.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=DEFAULT_HEARTBEAT_TIMEOUT,
        metavar="SECONDS",
        help="stop an initializing/ephemeral app whose client sent no AppHeartbeat for this "
        f"long (default {DEFAULT_HEARTBEAT_TIMEOUT:g})",
    )
    s.add_argument(
        "--no-runtime",
        action="store_true",
        help="control plane only: record deployments but run no containers and no edge",
    )
    s.add_argument(
        "--max-containers",
        type=int,
        default=16,
        metavar="N",
        help="at most N containers run at once, whatever apps ask for (default 16)",
    )
    s.add_argument(
        "--webhook-timeout-s",
        type=float,
        default=150.0,
        metavar="SECONDS",
        help="a web request whose response has not started after this long gets Modal's "
        "303-to-result answer (default 150, Modal's)",
    )
    s.add_argument(
        "--container-network",
        choices=["auto", "netns", "host"],
        default="auto",
        help="netns: a network namespace per container (needs root); host: the host's "
        "network (fixed ports may collide); auto (default): netns when allowed",
    )
    s.add_argument(
        "--stop-grace-s",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a stopping container may run @modal.exit before SIGKILL (default 10)",
    )
    s.add_argument(
        "--no-container-namespaces",
        action="store_true",
        help="run containers as plain processes even where mount and pid namespaces are "
        "allowed (what an emulator without root gets); needs --container-network host",
    )
    edge = EdgeLimits()
    for flag, kind, default, meaning in (
        ("--edge-max-connections", int, edge.max_connections, "client connections open at once"
         " on all the edge's ports; more are closed as they are accepted"),
        ("--edge-max-head-bytes", int, edge.max_head_bytes, "largest request head (431 above)"),
        ("--edge-head-timeout-s", float, edge.head_timeout_s, "a request head must be complete"
         " this long after the connection opened or the last answer (408)"),
        ("--edge-max-body-bytes", int, edge.max_body_bytes, "largest request body (413 above)"),
        ("--edge-body-timeout-s", float, edge.body_timeout_s, "a request body may keep the edge"
         " waiting for its bytes this long in all (408)"),
        ("--edge-keepalive-s", float, edge.keepalive_timeout_s, "idle keep-alive connections"
         " are closed after this long"),
    ):  # fmt: skip
        s.add_argument(
            flag, type=kind, default=default, help=f"edge: {meaning} (default {default})"
        )
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def _raise_open_files_limit() -> None:
    """Open files up to the hard limit: every edge connection, container pipe and socket is
    one (the edge's own cap stays well below, so the control plane always has some)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def sweep_command() -> int:
    """`python -m emulator sweep`: what emulators killed with -9 left (any state file)."""
    from emulator.runtime.scratch import sweep

    removed, killed = sweep()
    print(
        f"swept {len(removed)} scratch dir(s) of emulators that are gone; killed {killed} "
        "container process(es) they left running"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "sweep":
        return sweep_command()
    if (args.token_id is None) != (args.token_secret is None):
        print("error: --token-id and --token-secret go together", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for flag, value in (("--port", args.port), ("--http-port", args.http_port)):
        if value is not None and not 0 <= value <= 65535:
            print(f"error: {flag} {value} is not a TCP port (0-65535)", file=sys.stderr)
            return 2
    http_port = args.http_port
    if http_port is None:
        if args.port == 65535:
            print(
                "error: --port 65535 leaves no default HTTP port (PORT+1); pass --http-port",
                file=sys.stderr,
            )
            return 2
        http_port = args.port + 1 if args.port else 0
    options = Options(
        host=args.host,
        port=args.port,
        http_port=http_port,
        state_path=None if args.memory else (args.state or DEFAULT_STATE),
        workspace=args.workspace,
        token_id=args.token_id,
        token_secret=args.token_secret,
        rbac=args.rbac,
        heartbeat_timeout=args.heartbeat_timeout,
        runtime=not args.no_runtime,
        max_containers=args.max_containers,
        webhook_timeout=args.webhook_timeout_s,
        container_network=args.container_network,
        stop_grace=args.stop_grace_s,
        container_namespaces=not args.no_container_namespaces,
        edge_limits=EdgeLimits(
            max_head_bytes=args.edge_max_head_bytes,
            head_timeout_s=args.edge_head_timeout_s,
            keepalive_timeout_s=args.edge_keepalive_s,
            max_body_bytes=args.edge_max_body_bytes,
            body_timeout_s=args.edge_body_timeout_s,
            max_connections=args.edge_max_connections,
        ),
    )
    if args.no_container_namespaces and args.container_network != "host":
        print(
            "error: --no-container-namespaces needs --container-network host (a network "
            "namespace is a namespace)",
            file=sys.stderr,
        )
        return 2
    for name in ("max_connections", "max_head_bytes", "max_body_bytes"):
        if getattr(options.edge_limits, name) < 1:
            print(f"error: --edge-{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    _raise_open_files_limit()
    try:
        asyncio.run(serve(options))
    except KeyboardInterrupt:
        pass
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except sqlite3.Error as exc:  # damage the start-up checks could not see
        print(
            f"error: state file {options.state_path} failed: SQLite says {exc}. Restore it from "
            "a backup, or move it away, or start with another --state FILE or --memory.",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(
            f"error: cannot listen on {args.host} (gRPC port {args.port}, HTTP port {http_port}):"
            f" {exc}. Pick free ports with --port/--http-port, or --port 0 for any.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
