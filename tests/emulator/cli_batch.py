"""Run several `modal` CLI commands in ONE Python process, through the real click CLI.

Each `modal ...` subprocess costs about a second of interpreter start and imports; the
emulator tests batch independent commands through this runner instead. Every command goes
through `modal.cli.entry_point.entrypoint_cli` exactly as `modal` does; between commands the
environment variables and the SDK's environment cache are restored, as in a fresh process.

    python -m tests.emulator.cli_batch '[["secret", "list", "--json"], ["volume", "list"]]'

prints one JSON object per command: argv, exit_code, stdout, error_type, error.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any


def run_one(argv: list[str]) -> dict[str, Any]:
    import click
    from modal import _environments
    from modal.cli.entry_point import entrypoint_cli
    from modal.output import enable_output

    saved_env = dict(os.environ)
    out = io.StringIO()
    record: dict[str, Any] = {"argv": argv, "exit_code": 0, "error_type": "", "error": ""}
    try:
        with contextlib.redirect_stdout(out), enable_output():
            entrypoint_cli.main(args=argv, prog_name="modal", standalone_mode=False)
    except SystemExit as exc:
        record["exit_code"] = exc.code if isinstance(exc.code, int) else 1
        if not isinstance(exc.code, int) and exc.code is not None:
            record["error"] = str(exc.code)
    except click.exceptions.Abort:
        record.update(exit_code=1, error_type="Abort")
    except click.ClickException as exc:
        record.update(
            exit_code=exc.exit_code, error_type=type(exc).__name__, error=exc.format_message()
        )
    except Exception as exc:
        record.update(exit_code=1, error_type=type(exc).__name__, error=str(exc))
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        _environments.ENVIRONMENT_CACHE.clear()
    record["stdout"] = out.getvalue()
    return record


def main() -> int:
    commands = json.loads(sys.argv[1])
    for argv in commands:
        print(json.dumps(run_one(argv)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
