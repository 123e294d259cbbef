"""What an App ships, and its digest: the `source_digest` the App diffs on.

Read from the app file's AST, never by importing it (components/ does not import serving/):

- the app file itself (Modal runs it as `/root/<name>.py`);
- the app's manifest, module-level literals (tuples/dicts of strings) the app passes to
  `Image.add_local_python_source`:
  - `SHIPPED_MODULES`: module names that always ship;
  - `SHIPPED_IF_SPEC`: condition → module names, evaluated against the rendered spec JSON
    without knowing its schema: `"key"` ships when the spec's top-level `key` is present and
    not null, `"key=value"` when it is that string. Without a spec no condition holds;
- what `add_local_python_source(...)`, `add_local_dir(...)` and `add_local_file(...)` add
  with string literal arguments (other arguments are not read: the spec file the serving app
  bakes in with `add_local_file(SPEC_PATH, ...)` is covered by the spec digest).

A module name is found as modal 1.6.4 finds it (modal/_utils/package_utils.py,
`get_module_mount_info`: the package's directory if it is a package, else its file; so
`pkg.__init__` is a package's `__init__.py` alone), `.py` files only in a package, like
`add_local_python_source`'s default `ignore=NON_PYTHON_FILES` (modal/_image.py). Reading
files is side-effect free, so an edit of a shipped file shows in `pulumi preview` and an edit
of any other file does not. The parsed app file and file hashes are cached per
(path, mtime, size) for the life of the provider process.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._base import sha256_hex

MODULES_NAME = "SHIPPED_MODULES"
IF_SPEC_NAME = "SHIPPED_IF_SPEC"


class ManifestError(SyntaxError):
    """The app file's manifest is not literal, malformed, or names a module that is missing.

    A SyntaxError (with the file and line) because it is a fault of the app file as written,
    reported where an unparsable app file is."""


@dataclass(frozen=True)
class _AppFile:
    """What the app file declares: the manifest and its literal add_local_* calls."""

    modules: tuple[tuple[str, int], ...]  # (module, line of the assignment)
    if_spec: tuple[tuple[str, tuple[str, ...], int], ...]  # (condition, modules, line)
    directives: tuple[tuple[str, tuple[str, ...], bool], ...]  # (method, literals, has ignore=)


def _literal_strings(node: ast.Call) -> tuple[str, ...]:
    return tuple(
        a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
    )


def _names(value: Any) -> tuple[str, ...] | None:
    """The module names in `value` (a tuple or list of dotted names), else None."""
    if isinstance(value, (tuple, list)) and all(
        isinstance(v, str) and all(part.isidentifier() for part in v.split(".")) for v in value
    ):
        return tuple(value)
    return None


def _manifest_value(app_p: Path, name: str, node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise _error(app_p, node.lineno, f"{name} must be written as literals") from None


def _error(app_p: Path, line: int, message: str) -> ManifestError:
    return ManifestError(
        f"{app_p}: {message} (components/modal/_source.py reads it without importing the app)",
        (str(app_p), line, 0, None),
    )


# Per-process caches keyed by (path, mtime_ns, size): Diff runs on every preview, and parsing
# the app file or re-hashing unchanged files would dominate its latency.
_APP_FILES: dict[tuple[str, int, int], _AppFile] = {}
_HASHES: dict[tuple[str, int, int], str] = {}


def _stat_key(p: Path) -> tuple[str, int, int]:
    st = p.stat()
    return (str(p), st.st_mtime_ns, st.st_size)


def _read_app_file(app_p: Path) -> _AppFile:
    key = _stat_key(app_p)
    cached = _APP_FILES.get(key)
    if cached is not None:
        return cached
    tree = ast.parse(app_p.read_text(), filename=str(app_p))
    values: dict[str, tuple[Any, int]] = {}
    for stmt in tree.body:  # module level only: what the app passes to its image
        target, value = None, None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        if not isinstance(target, ast.Name) or target.id not in (MODULES_NAME, IF_SPEC_NAME):
            continue
        if value is None or target.id in values:
            raise _error(app_p, stmt.lineno, f"{target.id} must be assigned once, to literals")
        values[target.id] = (_manifest_value(app_p, target.id, value), stmt.lineno)

    modules: list[tuple[str, int]] = []
    if MODULES_NAME in values:
        raw, line = values[MODULES_NAME]
        names = _names(raw)
        if names is None:
            raise _error(app_p, line, f"{MODULES_NAME} must be a tuple of module names")
        modules = [(m, line) for m in names]
    if_spec: list[tuple[str, tuple[str, ...], int]] = []
    if IF_SPEC_NAME in values:
        raw, line = values[IF_SPEC_NAME]
        if not isinstance(raw, dict):
            raise _error(app_p, line, f"{IF_SPEC_NAME} must be a dict of condition → modules")
        for cond, more in raw.items():
            names = _names(more)
            if not isinstance(cond, str) or not cond.partition("=")[0] or names is None:
                raise _error(
                    app_p,
                    line,
                    f"{IF_SPEC_NAME}[{cond!r}]: a condition is 'key' or 'key=value' and maps "
                    "to a tuple of module names",
                )
            if_spec.append((cond, names, line))

    directives: list[tuple[str, tuple[str, ...], bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in ("add_local_python_source", "add_local_dir", "add_local_file"):
                has_ignore = any(k.arg == "ignore" for k in node.keywords)
                directives.append((method, _literal_strings(node), has_ignore))
    found = _APP_FILES[key] = _AppFile(tuple(modules), tuple(if_spec), tuple(directives))
    return found


def condition_holds(condition: str, spec: Mapping[str, Any]) -> bool:
    """`"key"`: the spec has `key`, not null; `"key=value"`: `spec[key]` is the string value.

    serving/app.py applies the same rule to the same JSON at deploy time."""
    key, eq, value = condition.partition("=")
    have = spec.get(key)
    return have == value if eq else have is not None


def _spec_fields(spec_json: str | None) -> dict[str, Any]:
    if spec_json is None:
        return {}
    data = json.loads(spec_json)
    if not isinstance(data, dict):
        raise ValueError("the spec JSON is not an object")
    return data


def shipped_modules(
    app_file: str | os.PathLike[str],
    root: str | os.PathLike[str] = ".",
    *,
    spec_json: str | None = None,
) -> list[str]:
    """The manifest's module names the app ships with this spec (SHIPPED_MODULES, then the
    SHIPPED_IF_SPEC entries whose condition holds, in file order)."""
    app = _read_app_file((Path(root).resolve() / app_file).resolve())
    return [module for module, _line in _manifest_modules(app, spec_json)]


def _manifest_modules(app: _AppFile, spec_json: str | None) -> list[tuple[str, int]]:
    """(module, line of its manifest entry) of every module the manifest ships with this
    spec (see `shipped_modules`)."""
    spec = _spec_fields(spec_json)
    conditional = [
        (m, line) for cond, more, line in app.if_spec if condition_holds(cond, spec) for m in more
    ]
    return [*app.modules, *conditional]


def shipped_files(
    app_file: str | os.PathLike[str],
    root: str | os.PathLike[str] = ".",
    *,
    spec_json: str | None = None,
) -> list[Path]:
    """Every local file the app ships to Modal with this spec, found statically in the app file.

    `spec_json`: the rendered spec (what SERVING_SPEC names at deploy); None = no spec, so no
    SHIPPED_IF_SPEC condition holds. ManifestError when the manifest names a missing module;
    ValueError when `spec_json` is not a JSON object."""
    root_p = Path(root).resolve()
    app_p = (root_p / app_file).resolve()
    app = _read_app_file(app_p)
    files: set[Path] = {app_p}
    search = [root_p, app_p.parent]
    for module, line in _manifest_modules(app, spec_json):
        found = list(_module_files(module, search, py_only=True))
        if not found:
            raise _error(
                app_p,
                line,
                f"the manifest ships module {module!r}, which is neither a .py file nor a "
                f"package directory under {' or '.join(str(b) for b in search)}, nor a "
                "top-level module this Python imports",
            )
        files.update(found)
    for method, args, has_ignore in app.directives:
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
    # Not in the project: a top-level module where the import system finds it, as modal does
    # (find_spec in get_module_mount_info), e.g. the dev tools' `standin_engine`. Top-level
    # only: find_spec of a dotted name imports its parents.
    spec = importlib.util.find_spec(module) if "." not in module else None
    if spec is not None and spec.submodule_search_locations:
        yield from _dir_files(Path(next(iter(spec.submodule_search_locations))), py_only)
    elif spec is not None and spec.origin and Path(spec.origin).is_file():
        yield Path(spec.origin).resolve()


def _dir_files(d: Path, py_only: bool) -> Iterator[Path]:
    for p in sorted(d.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".pyc":
            continue
        if py_only and p.suffix != ".py":
            continue
        yield p.resolve()


def source_digest(
    app_file: str | os.PathLike[str],
    root: str | os.PathLike[str] = ".",
    *,
    spec_json: str | None = None,
) -> str:
    """sha256 over (path relative to root, sha256 of content) of every file shipped with this
    spec (`shipped_files`)."""
    root_p = Path(root).resolve()
    lines = []
    for p in shipped_files(app_file, root_p, spec_json=spec_json):
        key = _stat_key(p)
        digest = _HASHES.get(key)
        if digest is None:
            digest = _HASHES[key] = sha256_hex(p.read_bytes())
        lines.append(f"{os.path.relpath(p, root_p)}\0{digest}")
    return sha256_hex("\n".join(lines))
