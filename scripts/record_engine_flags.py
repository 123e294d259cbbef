"""Record the option strings of a pinned engine's own server argument parser.

Run it with the python of a venv where the engine is installed (it imports the engine, not the
project), e.g. outside the repo:

    python3.11 -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm==0.33.0
    /tmp/vllm-venv/bin/python scripts/record_engine_flags.py vllm \
        > serving/engine_flags/vllm_0_33_0.py
    python3.11 -m venv /tmp/sglang-venv && /tmp/sglang-venv/bin/pip install sglang==0.5.23
    /tmp/sglang-venv/bin/python scripts/record_engine_flags.py sglang \
        > serving/engine_flags/sglang_0_5_23.py

sglang 0.5.15 (serving/engine_flags/sglang_0_5_15.py) was recorded without its full dependency
tree (flash-attn-4, flashinfer, tilelang, ... are GPU-only and large): `server_args` needs only
torch, transformers 5.12.1 (its pin; it wants huggingface-hub < 2), orjson, IPython, traitlets
and what sglang imports at package level, so a venv with sglang installed `--no-deps`, those
few, and torch 2.11.0 from another venv on a .pth line was enough:

    python3.12 -m venv /tmp/sglang-0.5.15-venv && V=/tmp/sglang-0.5.15-venv/bin
    $V/pip install --no-deps sglang==0.5.15 transformers==5.12.1 tokenizers==0.22.2 \
        'huggingface-hub>=1.5,<2' orjson IPython traitlets
    echo /tmp/vllm-0.26.0-venv/lib/python3.12/site-packages \
        > /tmp/sglang-0.5.15-venv/lib/python3.12/site-packages/zz-torch.pth   # torch 2.11.0
    $V/python scripts/record_engine_flags.py sglang > serving/engine_flags/sglang_0_5_15.py

(The wheel is tagged manylinux_2_34: `pip download --platform manylinux_2_34_x86_64` where the
local glibc is older.) `bench.gpu.remote prepare-sglang` compares the recording with the parser
on the GPU machine (`--expect`).

Output: a small Python module (ruff-formatted as written) with ENGINE, VERSION and ACTIONS:
one entry per parser action, its option strings space-separated (aliases and negations share an
entry, e.g. "--tensor-parallel-size -tp"), sorted. It is the one copy of the list: the spec
rejects extra_args the pinned parser does not know (serving/engine_flags/__init__.py), and
tests/serving/test_engine_flags.py checks every flag the spec renders against it, so a flag
renamed in a new engine release fails at `pulumi preview` and in the tests. The module is .py so
that `add_local_python_source("serving")` ships it into the container with the spec.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import textwrap
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


def action_groups(parser: argparse.ArgumentParser) -> list[str]:
    """One entry per option action: its option strings in declaration order, space-separated."""
    return sorted({" ".join(a.option_strings) for a in parser._actions if a.option_strings})


def render_module(engine: str, version: str, how: str, groups: list[str]) -> str:
    """The generated module's text (already in ruff format: one string per line)."""
    module = f"{engine}_{version.replace('.', '_')}"
    built = textwrap.wrap(
        f"Recorded by scripts/record_engine_flags.py {engine} with python "
        f"{sys.version.split()[0]}; the parser was built with {how}.",
        width=96,
        break_on_hyphens=False,
        break_long_words=False,
    )
    lines = [
        f'"""Option strings of {engine}=={version}\'s server parser (generated, do not edit).',
        "",
        *built,
        "Regenerate where the engine is installed (see that script's docstring):",
        f"    python scripts/record_engine_flags.py {engine} > serving/engine_flags/{module}.py",
        '"""',
        "",
        f"ENGINE = {json.dumps(engine)}",
        f"VERSION = {json.dumps(version)}",
        "# One entry per parser action: its option strings, space-separated.",
        "ACTIONS: tuple[str, ...] = (",
        *[f"    {json.dumps(g)}," for g in groups],
        ")",
        "",
    ]
    return "\n".join(lines)


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
    cli.add_argument(
        "--expect",
        metavar="MODULE_FILE",
        help="instead of printing the recording, compare it with MODULE_FILE (the committed "
        "serving/engine_flags/<engine>_<version>.py); exit 1 if they differ",
    )
    args = cli.parse_args(argv)
    parser, how = vllm_parser() if args.engine == "vllm" else sglang_parser()
    status = 0
    if args.check_argv:
        text = sys.stdin.read() if args.check_argv == "-" else Path(args.check_argv).read_text()
        status = check_argvs(parser, json.loads(text))
    version = importlib.metadata.version(args.engine)
    recorded = render_module(args.engine, version, how, action_groups(parser))
    if args.expect:
        committed = Path(args.expect).read_text()
        if _without_docstring(committed) == _without_docstring(recorded):
            print(f"recording of {args.engine}=={version} matches {args.expect}")
        else:
            print(f"MISMATCH: {args.engine}=={version}'s parser differs from {args.expect}")
            status = 1
    elif not args.check_argv:
        sys.stdout.write(recorded)
    return status


def _without_docstring(module_text: str) -> str:
    """The module's code (the docstring names the python that recorded it, which may differ)."""
    return module_text.split('"""', 2)[-1]


if __name__ == "__main__":
    raise SystemExit(main())
