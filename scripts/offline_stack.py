"""Offline stand-in for `pulumi preview --diff` / `up` / `refresh` / `destroy` / `stack output`.

A thin command over the `pulumi_standin` package (`python -m pulumi_standin` does the same):
NOT the Pulumi engine, for machines without the Pulumi CLI, against the Modal emulator only.
See docs/offline.md and docs/standin.md.

    .venv/bin/python scripts/offline_stack.py preview --stack local [--state FILE]
    .venv/bin/python scripts/offline_stack.py up      --stack local [--show-secrets]
    .venv/bin/python scripts/offline_stack.py destroy --stack local
"""

from __future__ import annotations

import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:  # run as `python scripts/offline_stack.py`
    sys.path.insert(0, str(PROJECT_ROOT))

if __name__ == "__main__":
    import runpy

    runpy.run_module("pulumi_standin", run_name="__main__", alter_sys=True)
