"""What the image build bakes in, so that a container's start does less (issue 36).

serving/app.py copies this file into the image and runs it once per image, at build time, with
the engine image's own python (`python3 /opt/serving/bake.py [--vllm-cache DIR]`):

1. Bytecode for the image's Python packages. Python compiles every module it imports that has
   no up-to-date `.pyc`, and what a container writes is gone with it, so an image without
   bytecode pays the compile on every start. vLLM's upstream image installs its packages with
   `uv pip install --system` (vllm-project/vllm docker/Dockerfile), and uv leaves bytecode out
   unless asked (`--compile-bytecode`). Measured on the 8B-shaped start in docs/gpu.md (runs
   AU-AV): `vllm serve` to its argument parsing with and without bytecode for any module.
2. vLLM only: its model-inspection cache. Before it serves a model, vLLM learns the model
   class's interfaces in a fresh interpreter (vllm 0.26.0
   model_executor/models/registry.py `_LazyRegisteredModel.inspect_model_cls`: 15-23 s of
   imports on an H200, docs/gpu.md runs AK-AL and AV) unless `VLLM_CACHE_ROOT/modelinfos` holds the
   answer, keyed by a hash of the model module's source: the same for every container of one
   image, and no GPU is needed to find it. The engine-cache Volume is mounted at
   VLLM_CACHE_ROOT and hides what the image has there, so the files are baked elsewhere
   (BAKED_VLLM_CACHE) and serving/engine.py copies them in at the start (`seed_modelinfos`):
   an empty engine cache was ready in 75-80 s instead of 103 s (run AV).

Only the standard library at import time: the container imports this module without vLLM's
packages on the path, and the build runs it as a script.
"""

from __future__ import annotations

import argparse
import compileall
import logging
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("serving.engine")

IN_IMAGE = "/opt/serving/bake.py"  # where serving/app.py copies this file
BAKED_VLLM_CACHE = Path("/opt/serving/vllm-cache")  # a VLLM_CACHE_ROOT holding modelinfos/ only
MODELINFOS = "modelinfos"  # vLLM's subdirectory of VLLM_CACHE_ROOT for the inspection files


def package_dirs() -> list[Path]:
    """The interpreter's standard library and site-packages directories that exist."""
    found = [sysconfig.get_paths()["stdlib"], *site.getsitepackages()]
    return [Path(d) for d in dict.fromkeys(found) if Path(d).is_dir()]


def compile_bytecode(dirs: Sequence[Path]) -> bool:
    """`.pyc` files for every module under dirs, all cores at once, up-to-date ones kept. False
    when some file did not compile (packages ship templates and test data that are not valid
    Python; they fail at import anyway, so the build goes on)."""
    ok = True
    for d in dirs:
        ok = compileall.compile_dir(d, quiet=1, workers=0) and ok
    return ok


def bake_modelinfos(cache_root: Path, archs: Sequence[str] = ()) -> dict[str, str]:
    """vLLM's model-inspection files for `archs` (all it registers when empty) under
    cache_root/modelinfos, written by vLLM's own code. Returns {architecture: why it failed}.

    vLLM inspects a class in a subprocess only so that its parent process does not initialise
    CUDA (0.26.0 registry.py, `_run_in_subprocess`'s caller); a build step has no GPU to keep
    clean, so the classes are inspected here, one interpreter for all of them instead of one
    start of ~20 s each."""
    os.environ["VLLM_CACHE_ROOT"] = str(cache_root)  # read by vllm.envs when first asked
    from vllm.model_executor.models import registry
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # as the inspection subprocess does first (registry.py `_run`)
    registry._run_in_subprocess = lambda fn: fn()
    wanted = list(archs) or sorted(registry.ModelRegistry.get_supported_archs())
    failed: dict[str, str] = {}
    for arch in wanted:
        try:
            registry.ModelRegistry.models[arch].inspect_model_cls()
        except Exception as exc:  # one model's optional dependency must not stop the others
            failed[arch] = f"{type(exc).__name__}: {exc}"[:300]
    return failed


def seed_modelinfos(cache_root: Path, baked_root: Path | None = None) -> int:
    """Copy the baked inspection files into the engine's cache where it lacks them or holds
    another version (a Volume kept from an earlier image: vLLM would inspect again and write
    its own). Each file lands whole (written beside, then renamed), since containers of two
    images may share the Volume. Returns how many were copied; 0 when nothing was baked
    (baked_root: BAKED_VLLM_CACHE unless given)."""
    source = (baked_root or BAKED_VLLM_CACHE) / MODELINFOS
    if not source.is_dir():
        return 0
    target = cache_root / MODELINFOS
    target.mkdir(parents=True, exist_ok=True)
    copied = 0
    for baked in sorted(source.glob("*.json")):
        kept = target / baked.name
        data = baked.read_bytes()
        if kept.is_file() and kept.read_bytes() == data:
            continue
        fd, tmp = tempfile.mkstemp(dir=target, prefix=f".{baked.name}.")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, kept)
        copied += 1
    return copied


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog=f"python3 {IN_IMAGE}", description=__doc__)
    cli.add_argument(
        "--vllm-cache",
        type=Path,
        help=f"bake vLLM's model-inspection files into DIR/{MODELINFOS} (vLLM images only)",
    )
    cli.add_argument("--arch", action="append", default=[], help="only this architecture")
    cli.add_argument("--no-bytecode", action="store_true", help="skip the bytecode step")
    args = cli.parse_args(argv)
    if not args.no_bytecode:
        dirs = package_dirs()
        ok = compile_bytecode(dirs)
        said = "" if ok else " (some files are not valid Python; they fail at import anyway)"
        print(f"bytecode compiled under {', '.join(map(str, dirs))}{said}", flush=True)
    if args.vllm_cache is not None:
        shutil.rmtree(args.vllm_cache / MODELINFOS, ignore_errors=True)
        failed = bake_modelinfos(args.vllm_cache, args.arch)
        made = sorted(p.name for p in (args.vllm_cache / MODELINFOS).glob("*.json"))
        print(f"{len(made)} model-inspection files in {args.vllm_cache / MODELINFOS}", flush=True)
        for arch, why in sorted(failed.items()):
            print(f"  not baked: {arch}: {why}", flush=True)
        if args.arch and failed:
            return 1  # an architecture asked for by name must be there
    return 0


if __name__ == "__main__":
    sys.exit(main())
