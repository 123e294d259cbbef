"""Issue 21 item 8: each app ships exactly what its container runs, and its `source_digest`
covers exactly that (components/modal/_source.py reads the app file's manifest statically).

Three checks per app (and per spec, for serving/app.py):
- what modal itself would mount: the app file imported as `modal deploy` imports it (a script
  path is imported under its stem, modal/cli/import_refs.py `import_file_or_module`), then the
  local mounts read off its functions' dependency graph (the image's `add_local_*` mount
  layers are dependencies of the image, modal/_image.py `_add_mount_layer_or_copy`; the
  function's own file is its entrypoint mount, modal/_utils/function_utils.py
  `get_entrypoint_mount`), each listed by the mount entries' own `get_files_to_upload`
  (modal/mount.py). It must equal `shipped_files` for the same spec;
- the container has everything it imports: those files laid out at their remote paths under
  a temp `/root`, and a fresh interpreter with only that directory and site-packages on its
  path (`-S`: no .pth, so not the project's editable install) imports the app file, every
  shipped module, and every `serving` import statement in them, lazy ones included; the
  serving app validates its spec there, which imports the pinned engine's flag module;
- edits in a temp copy of serving/: a test double or another app's file leaves a service's
  digest alone; shared code changes it.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from components.modal._source import (
    ManifestError,
    condition_holds,
    shipped_files,
    shipped_modules,
    source_digest,
)
from serving.engine_flags import module_name
from serving.spec import ENGINE_VERSIONS, ServingSpec
from tests.harness.emulator import PROJECT_ROOT

SERVING_APP = "serving/app.py"
WEIGHTS_APP = "serving/weights_app.py"
PREWARM_APP = "serving/prewarm_app.py"


def serving_spec(engine: str = "vllm", standin: bool = False) -> str:
    data: dict[str, Any] = {
        "engine": engine,
        "model": "Qwen/Qwen3-0.6B",
        "served_model_name": "qwen",
    }
    if standin:
        data["engine_standin"] = {}
    return ServingSpec.model_validate(data).to_json()


PREWARM_CONFIG = json.dumps(
    {
        "target_app": "chat",
        "server": "Serving",
        "base_min_containers": 0,
        "windows": [{"cron": "30 8 * * 1-5", "duration_minutes": 570, "min_containers": 2}],
    },
    sort_keys=True,
)

# (app file, what SERVING_SPEC names at deploy, if anything)
CASES = {
    "serving-vllm": (SERVING_APP, serving_spec("vllm")),
    "serving-sglang": (SERVING_APP, serving_spec("sglang")),
    "serving-standin": (SERVING_APP, serving_spec("vllm", standin=True)),
    "weights": (WEIGHTS_APP, None),
    "prewarm": (PREWARM_APP, PREWARM_CONFIG),
}

# Runs in a subprocess: import the app file as `modal deploy <file>` does, print its local
# mounts as [local, remote] pairs. Private modal API, test only: `_App._local_state.functions`
# is what the deprecated `App.registered_functions` returns (modal/app.py).
MOUNTS_PROBE = """
import importlib.util, json, sys
from pathlib import Path
from modal._utils.async_utils import synchronizer
from modal.mount import _Mount

path = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(path.parent))  # as modal/cli/import_refs.py does for a script path
spec = importlib.util.spec_from_file_location(path.stem, path)
module = importlib.util.module_from_spec(spec)
sys.modules[path.stem] = module
spec.loader.exec_module(module)
seen, files = set(), set()

def walk(obj):
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, _Mount) and obj.is_local():
        for entry in obj.entries:
            files.update((str(local), str(remote)) for local, remote in entry.get_files_to_upload())
    for dep in obj._deps_():
        walk(dep)

for fn in synchronizer._translate_in(module.app)._local_state.functions.values():
    walk(fn)
print(json.dumps(sorted(files)))
"""

# Runs in a subprocess with only the container's /root and site-packages on sys.path: import
# the entry file as Modal's container does (a module named after the file), then every
# target; print what failed and any serving module loaded from elsewhere.
CONTAINER_IMPORTS = """
import importlib, importlib.util, json, sys, traceback
from pathlib import Path

root, entry, targets = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
OURS = ("serving", "standin_engine")
problems = []
try:
    spec = importlib.util.spec_from_file_location(Path(entry).stem, root / entry)
    module = importlib.util.module_from_spec(spec)
    sys.modules[Path(entry).stem] = module
    spec.loader.exec_module(module)
except BaseException:
    problems.append(f"import of {entry}: " + traceback.format_exc(limit=3))
# What the serving container starts beside the app (serving/app.py `_container`): the proxy's
# and the engine's command lines; a `-m` module of ours (serving, the dev tools' stand-in
# engine) must import from the shipped files.
if hasattr(module, "_container"):
    container = module._container()
    for argv in (container._proxy_argv, container.engine.process.argv):
        if "-m" in argv and argv[argv.index("-m") + 1].split(".")[0] in OURS:
            run = argv[argv.index("-m") + 1]
            targets.append([run, []])
            found = importlib.util.find_spec(run)
            if found is not None and found.submodule_search_locations is not None:
                targets.append([run + ".__main__", []])
for name, attrs in targets:
    try:
        target = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        problems.append(f"import {name}: {exc}")
        continue
    for attr in attrs:
        if hasattr(target, attr):
            continue
        try:
            importlib.import_module(f"{name}.{attr}")
        except ModuleNotFoundError as exc:
            problems.append(f"from {name} import {attr}: {exc}")
for name, mod in sorted(sys.modules.items()):
    if name.split(".")[0] in OURS:
        file = getattr(mod, "__file__", None)
        if not file or not Path(file).resolve().is_relative_to(root.resolve()):
            problems.append(f"{name} loaded from {file}, not from the shipped files")
print(json.dumps(problems))
"""


def _env(spec_file: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODAL_", "SERVING_"))}
    env.pop("PYTHONPATH", None)
    env["MODAL_SERVER_URL"] = "http://127.0.0.1:9"  # loopback: the stand-in spec is allowed
    if spec_file is not None:
        env["SERVING_SPEC"] = str(spec_file)
    return env


def _spec_file(tmp_path: Path, spec_json: str | None) -> Path | None:
    if spec_json is None:
        return None
    path = tmp_path / "spec.json"
    path.write_text(spec_json)
    return path


def modal_mounts(app_file: str, spec_file: Path | None) -> list[tuple[Path, str]]:
    """(local file, remote path) of every local file modal would mount for the app's functions."""
    out = subprocess.run(
        [sys.executable, "-c", MOUNTS_PROBE, str(PROJECT_ROOT / app_file)],
        cwd=PROJECT_ROOT,
        env=_env(spec_file),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [(Path(local), remote) for local, remote in json.loads(out.stdout)]


def serving_imports(files: list[Path], root: Path) -> list[tuple[str, list[str]]]:
    """Every `serving` import statement in `files` (module level or in a function) as
    (module, names imported from it), plus each shipped serving module itself."""
    targets: list[tuple[str, list[str]]] = []
    for path in files:
        rel = path.relative_to(root)
        if rel.parts[0] == "serving":
            parts = list(rel.with_suffix("").parts)
            targets.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), []))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets += [(a.name, []) for a in node.names if a.name.split(".")[0] == "serving"]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{rel}: relative import (resolve it here first)"
                if node.module and node.module.split(".")[0] == "serving":
                    targets.append((node.module, [a.name for a in node.names]))
    return targets


def run_container_imports(
    root: Path, entry: str, targets: list[tuple[str, list[str]]], spec_file: Path | None
) -> list[str]:
    site = sysconfig.get_paths()["purelib"]
    env = {**_env(spec_file), "PYTHONPATH": os.pathsep.join([str(root), site])}
    out = subprocess.run(
        [sys.executable, "-S", "-c", CONTAINER_IMPORTS, str(root), entry, json.dumps(targets)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    problems: list[str] = json.loads(out.stdout)
    return problems


def remote_path(local: Path) -> str:
    """Where Modal puts a shipped module's file: under /root by its import path. The dev
    tools' modules (the stand-in engine) are imported from dev/, the product's from the root."""
    rel = local.relative_to(PROJECT_ROOT)
    return f"/root/{rel.relative_to('dev') if rel.parts[0] == 'dev' else rel}"


def lay_out(mounts: list[tuple[Path, str]], root: Path) -> None:
    """The mounted files at their remote paths, `/root` being `root`."""
    for local, remote in mounts:
        rel = Path(remote).relative_to("/root")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, root / rel)


@pytest.mark.parametrize("case", list(CASES))
def test_modal_mounts_what_the_digest_covers_and_the_container_imports_from_it(
    case: str, tmp_path: Path
) -> None:
    app_file, spec_json = CASES[case]
    spec_file = _spec_file(tmp_path, spec_json)
    mounts = modal_mounts(app_file, spec_file)
    shipped = shipped_files(app_file, PROJECT_ROOT, spec_json=spec_json)
    assert sorted(local for local, _ in mounts) == shipped
    # the app file is the module Modal runs at /root; the rest keeps its path under /root
    app_p = PROJECT_ROOT / app_file
    want = {(app_p, f"/root/{app_p.name}")}
    want |= {(p, remote_path(p)) for p in shipped if p != app_p}
    assert set(mounts) == want

    root = tmp_path / "root"
    lay_out(mounts, root)
    laid_out = sorted(p for p in root.rglob("*.py"))
    targets = serving_imports(laid_out, root)
    assert run_container_imports(root, app_p.name, targets, spec_file) == []


def test_the_container_check_sees_a_missing_module(tmp_path: Path) -> None:
    """The import check is not fooled by the project on sys.path: without serving/weights.py
    (which spec.py imports) the serving app does not import."""
    spec_file = _spec_file(tmp_path, serving_spec())
    mounts = modal_mounts(SERVING_APP, spec_file)
    root = tmp_path / "root"
    lay_out([(local, remote) for local, remote in mounts if local.name != "weights.py"], root)
    problems = run_container_imports(root, "app.py", [("serving.weights", [])], spec_file)
    assert any("import of app.py" in p and "serving.weights" in p for p in problems), problems
    assert any(p.startswith("import serving.weights:") for p in problems), problems


def test_the_container_check_sees_a_missing_engine_module(tmp_path: Path) -> None:
    """The stand-in engine is started with `-m standin_engine`, which no import
    statement names: the check reads the container's command lines too."""
    spec_file = _spec_file(tmp_path, serving_spec(standin=True))
    mounts = modal_mounts(SERVING_APP, spec_file)
    root = tmp_path / "root"
    lay_out([m for m in mounts if m[0].name != "standin_engine.py"], root)
    problems = run_container_imports(root, "app.py", [], spec_file)
    assert problems == ["import standin_engine: No module named 'standin_engine'"]


def rel_shipped(app_file: str, spec_json: str | None = None) -> set[str]:
    return {
        str(p.relative_to(PROJECT_ROOT))
        for p in shipped_files(app_file, PROJECT_ROOT, spec_json=spec_json)
    }


def test_each_app_ships_only_its_own_file_and_what_it_runs() -> None:
    real, standin = (
        rel_shipped(SERVING_APP, serving_spec()),
        rel_shipped(SERVING_APP, serving_spec(standin=True)),
    )
    assert standin - real == {"dev/standin_engine.py"}
    assert "serving/engine_flags/sglang_0_5_23.py" not in real
    for other in (WEIGHTS_APP, PREWARM_APP, "serving/prewarm.py", "serving/engine_flags/x.py"):
        assert other not in standin
    assert rel_shipped(WEIGHTS_APP) == {WEIGHTS_APP, "serving/__init__.py", "serving/weights.py"}
    assert rel_shipped(PREWARM_APP, PREWARM_CONFIG) == {
        PREWARM_APP,
        "serving/__init__.py",
        "serving/prewarm.py",
    }


@pytest.mark.parametrize("engine", sorted(ENGINE_VERSIONS))
def test_the_manifest_ships_the_pinned_engines_flag_module(engine: str) -> None:
    """A new pin needs its flag module in serving/app.py's SHIPPED_IF_SPEC, or the container's
    spec validation fails (the container check above would fail too)."""
    spec_json = json.dumps({"engine": engine})
    assert module_name(engine, ENGINE_VERSIONS[engine]) in shipped_modules(
        SERVING_APP, PROJECT_ROOT, spec_json=spec_json
    )


# ---- edits in a temp copy -----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(
        PROJECT_ROOT / "serving",
        tmp_path / "serving",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    # The stand-in engine is a dev tool, found by import (as modal finds it): the copy first,
    # and not the module another test imported (find_spec answers from sys.modules first).
    (tmp_path / "dev").mkdir()
    shutil.copy2(PROJECT_ROOT / "dev" / "standin_engine.py", tmp_path / "dev")
    monkeypatch.syspath_prepend(tmp_path / "dev")
    monkeypatch.delitem(sys.modules, "standin_engine", raising=False)
    return tmp_path


def digests(root: Path) -> dict[str, str]:
    return {
        "real": source_digest(SERVING_APP, root, spec_json=serving_spec()),
        "standin": source_digest(SERVING_APP, root, spec_json=serving_spec(standin=True)),
        "sglang": source_digest(SERVING_APP, root, spec_json=serving_spec("sglang")),
        "weights": source_digest(WEIGHTS_APP, root),
        "prewarm": source_digest(PREWARM_APP, root, spec_json=PREWARM_CONFIG),
    }


def edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n# edited\n")


@pytest.mark.parametrize(
    ("rel", "changed"),
    [
        # the test double: only the service that runs it
        ("dev/standin_engine.py", {"standin"}),
        # another app's file: never a service
        (WEIGHTS_APP, {"weights"}),
        (PREWARM_APP, {"prewarm"}),
        # code every service runs
        ("serving/proxy/app.py", {"real", "standin", "sglang"}),
        ("serving/spec.py", {"real", "standin", "sglang"}),
        # one engine's recorded flags: only the services on that engine
        ("serving/engine_flags/sglang_0_5_23.py", {"sglang"}),
        ("serving/engine_flags/vllm_0_33_0.py", {"real", "standin"}),
        # shipped by every app
        ("serving/__init__.py", {"real", "standin", "sglang", "weights", "prewarm"}),
        ("serving/weights.py", {"real", "standin", "sglang", "weights"}),
        ("serving/prewarm.py", {"prewarm"}),
        (SERVING_APP, {"real", "standin", "sglang"}),
    ],
)
def test_an_edit_changes_the_digest_of_the_apps_that_ship_the_file(
    tree: Path, rel: str, changed: set[str]
) -> None:
    before = digests(tree)
    edit(tree / rel)
    after = digests(tree)
    assert {k for k in before if before[k] != after[k]} == changed


def test_a_new_file_in_serving_changes_no_digest(tree: Path) -> None:
    before = digests(tree)
    (tree / "serving/another_double.py").write_text("X = 1\n")
    (tree / "serving/notes.txt").write_text("not python\n")
    assert digests(tree) == before


# ---- the manifest's rule and its errors ---------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "spec", "holds"),
    [
        ("engine_standin", {"engine_standin": {}}, True),  # an empty object is set
        ("engine_standin", {"engine_standin": False}, True),  # present, not null
        ("engine_standin", {"engine_standin": None}, False),
        ("engine_standin", {}, False),
        ("engine=vllm", {"engine": "vllm"}, True),
        ("engine=vllm", {"engine": "sglang"}, False),
        ("engine=vllm", {}, False),
        ("n=1", {"n": 1}, False),  # a value is compared as a string only
    ],
)
def test_condition_rule(condition: str, spec: dict[str, Any], holds: bool) -> None:
    assert condition_holds(condition, spec) is holds


def test_the_app_applies_the_same_rule(tmp_path: Path) -> None:
    """serving/app.py's own `shipped_modules` (what its image ships) against _source.py's, for
    specs beyond the cases above (the rule reads the raw JSON, so they need not validate)."""
    path = str(PROJECT_ROOT / SERVING_APP)
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('app', {path!r})\n"
        "app = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(app)\n"
        "print(json.dumps([list(app.shipped_modules(c)) for c in json.load(sys.stdin)]))\n"
    )
    cases: list[dict[str, Any]] = [
        {"engine": "sglang", "engine_standin": {"fail": "start"}},
        {"engine": "vllm", "engine_standin": None},
        {"engine": "other", "engine_standin": {}},
        {},
    ]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PROJECT_ROOT,
        env=_env(_spec_file(tmp_path, serving_spec())),
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    static = [shipped_modules(SERVING_APP, PROJECT_ROOT, spec_json=json.dumps(c)) for c in cases]
    assert json.loads(out.stdout) == static


def write_app(root: Path, body: str) -> str:
    (root / "app.py").write_text(body)
    return "app.py"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "NAMES = ('x',)\nSHIPPED_MODULES = NAMES\n",
            "SHIPPED_MODULES must be written as literals",
        ),
        ("SHIPPED_MODULES = 'serving'\n", "SHIPPED_MODULES must be a tuple of module names"),
        ("SHIPPED_MODULES = ('../etc',)\n", "SHIPPED_MODULES must be a tuple of module names"),
        ("SHIPPED_MODULES = ('a',)\nSHIPPED_MODULES = ('b',)\n", "assigned once"),
        ("SHIPPED_IF_SPEC = {'=x': ('a',)}\n", "a condition is 'key' or 'key=value'"),
        ("SHIPPED_IF_SPEC = ['a']\n", "SHIPPED_IF_SPEC must be a dict"),
        ("SHIPPED_MODULES = ('missing',)\n", "ships module 'missing', which is neither"),
    ],
)
def test_a_bad_manifest_is_an_error_of_the_app_file(
    tmp_path: Path, body: str, message: str
) -> None:
    app_file = write_app(tmp_path, body)
    with pytest.raises(ManifestError, match=message.replace("(", r"\(").replace(")", r"\)")) as ei:
        shipped_files(app_file, tmp_path)
    assert isinstance(ei.value, SyntaxError)  # reported where an unparsable app file is
    assert ei.value.filename == str(tmp_path / "app.py") and ei.value.lineno


def test_a_conditional_module_is_checked_only_when_it_ships(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text("")
    app_file = write_app(
        tmp_path, "SHIPPED_MODULES = ('base',)\nSHIPPED_IF_SPEC = {'extra': ('gone',)}\n"
    )
    assert [p.name for p in shipped_files(app_file, tmp_path)] == ["app.py", "base.py"]
    with pytest.raises(ManifestError, match="'gone'"):
        shipped_files(app_file, tmp_path, spec_json='{"extra": true}')
    with pytest.raises(ValueError, match="not an object"):
        shipped_files(app_file, tmp_path, spec_json="[1]")
