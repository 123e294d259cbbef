"""A copy of a checkout as a pull request's checkout would hold it (the review demo and tests).

`copy_checkout` copies the files git lists for `src` (tracked, and new ones not ignored: what
a clone of the branch would hold), never generated review stack files (`Pulumi.pr-*.yaml`)
nor anything under `dest` itself when `dest` lies inside `src`. No `.venv`: like CI's
checkout, the copy runs with another checkout's interpreter.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def copy_checkout(src: Path, dest: Path) -> Path:
    """Copy `src`'s files (tracked and new, not ignored) into `dest`; returns `dest`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=src,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    src, dest = src.resolve(), dest.resolve()
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        path = src / rel
        if not path.is_file() or Path(rel).name.startswith("Pulumi.pr-"):
            continue
        if path.resolve().is_relative_to(dest):  # the copy itself, inside the checkout
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest
