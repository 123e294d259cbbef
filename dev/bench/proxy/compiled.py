"""``python -m bench.proxy.compiled OUT``: this checkout's proxy compiled with mypyc, in OUT,
for the bench to measure beside the Python source (``python -m bench.proxy --baseline-root
OUT``).

Why: compiling the proxy's modules is the one lever measured on the missed latency targets
of issue 13 that is not shipped (docs/proxy.md says what shipping it would take: a C
compiler and mypy in the serving image, a fallback, a guard against a stale build). This
tool makes the figures behind that decision re-measurable by anyone, on any commit.

How: the ``serving`` package (the working tree, edits included) is copied to OUT/serving and
mypyc (mypy's compiler; mypy is pinned in pyproject.toml's dev dependencies) compiles the
proxy's request-path modules there. Each compiled module's extension (``.so``) lands beside
its copied ``.py``, and Python's import finds an extension before a source file of the same
name, so ``python -m serving.proxy`` started in OUT runs the compiled modules; mypyc's shared
runtime library lands at OUT's top level, which is on ``sys.path`` as the current directory.
The copy is never imported from this checkout: the product always runs the Python source.
Needs a C compiler and the Python headers (Debian: ``apt-get install -y gcc python3-dev``;
pyenv and python.org builds ship their headers). Takes about 40 s on 2 CPUs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from bench.standin import PROJECT_ROOT

# The modules every request passes through (the ones compiled in the measurements recorded in
# docs/proxy.md). Not compiled: __main__, runner and logs (start-up and the log handler) and
# server (a subclass of uvicorn's protocol).
MODULES = ("app", "upstream", "relay", "exchange", "sse", "keys", "metrics")


def build(out: Path) -> Path:
    """Copy ``serving`` into ``out`` and compile ``MODULES`` there; returns ``out``."""
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.exists():
        raise SystemExit(
            f"bench.proxy.compiled: no Python headers for {sys.executable} ({include} is "
            "missing); install them (Debian: apt-get install -y python3-dev) and run again"
        )
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]  # what setuptools will call
    if shutil.which(cc) is None:
        raise SystemExit(
            f"bench.proxy.compiled: no C compiler ({cc!r} is not on PATH); install one "
            "(Debian: apt-get install -y gcc) and run again"
        )
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(
        PROJECT_ROOT / "serving", out / "serving",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )  # fmt: skip
    sources = [f"serving/proxy/{name}.py" for name in MODULES]
    done = subprocess.run(
        [sys.executable, "-m", "mypyc", *sources], cwd=out, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench.proxy.compiled: mypyc failed (exit {done.returncode}) compiling "
            f"{', '.join(MODULES)} in {out}; its output ends:\n{done.stdout[-3000:]}"
            f"{done.stderr[-3000:]}"
        )
    # What the bench will run (cwd and PYTHONPATH = out, as bench.proxy.procs.Proxy starts it)
    # must import the extensions, not the copied sources beside them (a module mypyc built no
    # extension for imports as its .py and is named here).
    probe = (
        "import importlib, sys; "
        "print(*(importlib.import_module(f'serving.proxy.{m}').__file__ for m in sys.argv[1:]))"
    )
    files = subprocess.run(
        [sys.executable, "-c", probe, *MODULES], cwd=out, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(out)}, check=True,
    ).stdout.split()  # fmt: skip
    not_compiled = [f for f in files if not f.endswith(".so")]
    if not_compiled:
        raise SystemExit(f"bench.proxy.compiled: {not_compiled} import as Python source from {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy.compiled",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("out", type=Path, help="directory to build in (replaced if it exists)")
    out = build(p.parse_args(argv).out.resolve())
    print(f"compiled {len(MODULES)} proxy modules into {out}; measure them with:\n"
          f"  python -m bench.proxy --baseline-root {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
