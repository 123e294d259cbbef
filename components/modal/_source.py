"""What an App ships, and its digest: the `source_digest` the App diffs on.

The app file plus what it adds with `add_local_python_source(...)`, `add_local_dir(...)` and
`add_local_file(...)` given as string literals (read from the file's AST, not by importing
it); `.py` files only for python sources, like modal 1.6.4's default `ignore`. Reading files
is side-effect free, so an edit under serving/ shows in `pulumi preview`. Directives and file
hashes are cached per (path, mtime, size) for the life of the provider process.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

from ._base import sha256_hex


def _literal_strings(node: ast.Call) -> list[str]:
    return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


# Per-process caches keyed by (path, mtime_ns, size): Diff runs on every preview, and parsing
# the app file or re-hashing unchanged files would dominate its latency.
_DIRECTIVES: dict[tuple[str, int, int], list[tuple[str, list[str], bool]]] = {}
_HASHES: dict[tuple[str, int, int], str] = {}


def _stat_key(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return (str(p), st.st_mtime_ns, st.st_size)


def _directives(app_p: Path) -> list[tuple[str, list[str], bool]]:
    """(method, literal string args, has `ignore=`) of every add_local_* call in the app file."""
    key = _stat_key(app_p)
    cached = _DIRECTIVES.get(key)
    if cached is not None:
        return cached
    found: list[tuple[str, list[str], bool]] = []
    for node in ast.walk(ast.parse(app_p.read_text(), filename=str(app_p))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ("add_local_python_source", "add_local_dir", "add_local_file"):
                has_ignore = any(k.arg == "ignore" for k in node.keywords)
                found.append((method, _literal_strings(node), has_ignore))
    _DIRECTIVES[key] = found
    return found


def shipped_files(
    app_file: str | os.PathLike[str], root: str | os.PathLike[str] = "."
) -> list[Path]:
    """Every local file the app ships to Modal, found statically in the app file."""
    root_p = Path(root).resolve()
    app_p = (root_p / app_file).resolve()
    files: set[Path] = {app_p}
    search = [root_p, app_p.parent]
    for method, args, has_ignore in _directives(app_p):
        if method == "add_local_python_source":
            for module in args:
                files.update(_module_files(module, search, py_only=not has_ignore))
        elif method == "add_local_dir" and args:
            files.update(_dir_files(_resolve(args[0], search), py_only=False))
        elif method == "add_local_file" and args:
            p = _resolve(args[0], search)
            if p.is_file():
                files.add(p)
    return sorted(files)


def _resolve(path: str, search: list[Path]) -> Path:
    p = Path(path)
    if p.is_absolute():
        return p
    for base in search:
        if (base / p).exists():
            return (base / p).resolve()
    return (search[0] / p).resolve()


def _module_files(module: str, search: list[Path], py_only: bool) -> Iterator[Path]:
    rel = Path(*module.split("."))
    for base in search:
        if (base / rel).is_dir():
            yield from _dir_files(base / rel, py_only)
            return
        if (base / rel).with_suffix(".py").is_file():
            yield (base / rel).with_suffix(".py").resolve()
            return


def _dir_files(d: Path, py_only: bool) -> Iterator[Path]:
    for p in sorted(d.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".pyc":
            continue
        if py_only and p.suffix != ".py":
            continue
        yield p.resolve()


def source_digest(app_file: str | os.PathLike[str], root: str | os.PathLike[str] = ".") -> str:
    """sha256 over (path relative to root, sha256 of content) of every shipped file."""
    root_p = Path(root).resolve()
    lines = []
    for p in shipped_files(app_file, root_p):
        key = _stat_key(p)
        digest = _HASHES.get(key)
        if digest is None:
            digest = _HASHES[key] = sha256_hex(p.read_bytes())
        lines.append(f"{os.path.relpath(p, root_p)}\0{digest}")
    return sha256_hex("\n".join(lines))
