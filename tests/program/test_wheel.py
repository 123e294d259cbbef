"""Issue 33 item 5: the product ships alone.

A wheel built from the repository (`pip wheel --no-deps .`) holds the product's packages
(components/, serving/, watchers/) and none of the dev tools (dev/: the emulator, the Pulumi
engine stand-in, the stand-in serving engine, the benches), and its runtime dependencies
(Requires-Dist without an extra) are exactly the third-party distributions that the product's
modules import: components/, serving/, watchers/, access/ and the program, __main__.py.
Import names map to distributions through the installed metadata
(importlib.metadata.packages_distributions), so a module added with a new import, or a
dependency no product module needs any more, fails here.
"""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.harness.emulator import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
# What a clone builds from (tracked and new files, no build/ leftovers): the review demo's copy.
from review.checkout import copy_checkout

PRODUCT_PACKAGES = ("components", "serving", "watchers")
PRODUCT_SOURCES = (*PRODUCT_PACKAGES, "access", "__main__.py")
DEV_TOOLS = ("emulator", "pulumi_standin", "bench", "standin_engine")
# Imports the engine image provides, not the wheel: these files run only inside the pinned vLLM
# or SGLang image (serving/bake.py: at image build, with the image's own python).
ENGINE_IMAGE_IMPORTS = {"vllm": {"serving/bake.py"}}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def product_files(root: Path = PROJECT_ROOT) -> list[Path]:
    files: list[Path] = []
    for part in PRODUCT_SOURCES:
        path = root / part
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def imported_modules(files: list[Path]) -> dict[str, list[str]]:
    """Every absolutely imported module (dotted name) -> the files that import it."""
    found: dict[str, list[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name, []).append(str(path.relative_to(PROJECT_ROOT)))
    return found


def distribution_of(module: str, importers: list[str]) -> str | None:
    """The distribution that provides `module`; None for the stdlib and the product itself."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in PRODUCT_PACKAGES:
        return None
    dists = md.packages_distributions().get(top)
    assert dists, f"{module} (imported by {importers}) is not installed here: run `make setup`"
    if len(set(dists)) == 1:
        return normalized(dists[0])
    # A namespace several distributions share (google: protobuf, googleapis-common-protos):
    # the one whose files hold the imported module.
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} (imported by {importers}) has no file"
    origin = Path(spec.origin).resolve()
    for name in dict.fromkeys(dists):
        dist = md.distribution(name)
        if any(Path(str(dist.locate_file(f))).resolve() == origin for f in dist.files or ()):
            return normalized(name)
    raise AssertionError(f"no distribution of {dists} holds {origin} ({module})")


def imported_distributions(root: Path = PROJECT_ROOT) -> dict[str, list[str]]:
    """Distribution -> the product files whose imports need it."""
    out: dict[str, list[str]] = {}
    for module, importers in imported_modules(product_files(root)).items():
        if set(importers) <= ENGINE_IMAGE_IMPORTS.get(module.split(".")[0], set()):
            continue
        dist = distribution_of(module, importers)
        if dist is not None:
            out.setdefault(dist, []).extend(importers)
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    tmp = tmp_path_factory.mktemp("wheel")
    tree = copy_checkout(PROJECT_ROOT, tmp / "checkout")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", ".", "-w", str(tmp / "out")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = (tmp / "out").glob("modal_llm_iac-*.whl")
    return zipfile.ZipFile(path)


def requires_dist(wheel: zipfile.ZipFile) -> dict[str, str]:
    """The wheel's runtime requirements (no extra): normalized name -> the requirement."""
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    headers = email.parser.Parser().parsestr(wheel.read(meta).decode())
    out: dict[str, str] = {}
    for req in headers.get_all("Requires-Dist") or []:
        if "extra ==" in req:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", req)
        assert name is not None, req
        out[normalized(name.group(0))] = req
    return out


def test_the_wheel_holds_the_product_and_no_dev_tool(wheel: zipfile.ZipFile) -> None:
    modules = [n for n in wheel.namelist() if n.endswith(".py")]
    tops = {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" not in n}
    assert tops == set(PRODUCT_PACKAGES)
    dev = [n for n in modules if Path(n).stem in DEV_TOOLS or n.split("/")[0] in DEV_TOOLS]
    assert dev == []
    # every product module is in it (the package list misses none)
    want = {str(p.relative_to(PROJECT_ROOT)) for p in product_files()}
    want = {w for w in want if w.split("/")[0] in PRODUCT_PACKAGES}
    assert want <= set(modules), sorted(want - set(modules))


def test_the_wheel_requires_exactly_what_the_product_imports(wheel: zipfile.ZipFile) -> None:
    required = requires_dist(wheel)
    imported = imported_distributions()
    unused = sorted(set(required) - set(imported))
    missing = {d: sorted(set(f))[:3] for d, f in imported.items() if d not in required}
    assert unused == [], f"runtime dependencies no product module imports: {unused}"
    assert missing == {}, f"imported by the product but not a runtime dependency: {missing}"
    unpinned = [r for r in required.values() if "==" not in r]
    assert unpinned == [], f"pin exactly (pyproject.toml): {unpinned}"


def test_the_import_scan_maps_names_to_distributions() -> None:
    """The scan finds what it looks for (a checker that finds nothing proves nothing): a name
    that differs from its distribution's (yaml: PyYAML), a namespace shared by two
    distributions (google.protobuf), and modal_proto, which ships inside modal."""
    imported = imported_distributions()
    assert {"pyyaml", "protobuf", "modal", "pulumi", "pydantic"} <= set(imported)
    assert "googleapis-common-protos" not in imported
    assert any(f.startswith("serving/") for f in imported["uvicorn"])
