"""Record the option strings of a pinned engine's own server argument parser.

Run it with the python of a venv where the engine is installed (it imports the engine, not the
project), e.g. outside the repo:

    python3.11 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm==0.33.0
    /tmp/vllm-venv/bin/python scripts/record_engine_flags.py vllm \
        > tests/serving/fixtures/vllm-0.33.0-flags.txt
    python3.11 -m venv /tmp/sglang-venv && /tmp/sglang-venv/bin/pip install sglang==0.5.23
    /tmp/sglang-venv/bin/python scripts/record_engine_flags.py sglang \
        > tests/serving/fixtures/sglang-0.5.23-flags.txt

Output: one header line starting with '#' (engine, version, how the parser was built), then one
option string per line, sorted. tests/serving/test_engine_flags.py checks every flag the spec
renders against these files, so a flag renamed in a new engine release fails the tests.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import NoReturn


def vllm_parser() -> tuple[argparse.ArgumentParser, str]:
    # Without a GPU the platform probe fails ("Failed to infer device type"); the CPU target
    # builds the same server parser.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    how = (
        "vllm.entrypoints.common.cli_args.make_arg_parser("
        "vllm.utils.argparse_utils.FlexibleArgumentParser()), VLLM_TARGET_DEVICE=cpu"
    )
    return make_arg_parser(FlexibleArgumentParser()), how


def sglang_parser() -> tuple[argparse.ArgumentParser, str]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser, "argparse.ArgumentParser() + sglang.srt.server_args.ServerArgs.add_cli_args"


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return sorted({opt for action in parser._actions for opt in action.option_strings})


class ArgvRejected(Exception):
    """The engine's parser rejected an argv (argparse would have exited)."""


def check_argvs(parser: argparse.ArgumentParser, argvs: list[list[str]]) -> int:
    """Parse each argv (without the program prefix) with the real parser; 0 if all parse."""

    def _error(message: str) -> NoReturn:
        raise ArgvRejected(message)

    parser.error = _error  # type: ignore[method-assign]
    failures = 0
    for argv in argvs:
        try:
            parser.parse_args(argv)
        except ArgvRejected as exc:
            failures += 1
            print(f"REJECTED {argv}: {exc}")
    print(f"parsed {len(argvs)} argv(s), {failures} rejected")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("engine", choices=["vllm", "sglang"])
    cli.add_argument(
        "--check-argv",
        metavar="FILE",
        help="instead of listing flags, parse the JSON list of argvs in FILE ('-' = stdin) "
        "with the real parser (argv without the `vllm serve` / `python3 -m ...` prefix)",
    )
    args = cli.parse_args(argv)
    parser, how = vllm_parser() if args.engine == "vllm" else sglang_parser()
    if args.check_argv:
        text = sys.stdin.read() if args.check_argv == "-" else Path(args.check_argv).read_text()
        return check_argvs(parser, json.loads(text))
    version = importlib.metadata.version(args.engine)
    flags = option_strings(parser)
    print(
        f"# {args.engine}=={version}: {len(flags)} option strings of its server parser, "
        f"built with {how}; python {sys.version.split()[0]}; "
        f"regenerate with scripts/record_engine_flags.py {args.engine}"
    )
    for flag in flags:
        print(flag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
