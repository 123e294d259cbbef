"""Build what the lent GPU machine needs to run vLLM 0.26.0: ``python -m bench.gpu.payload``.

The GPU machine cannot install anything, and what a call takes along is at most 64 MiB (the
working tree included). Its image has python 3.12 and torch 2.11.0, which vLLM 0.26.0 pins
(later releases need a newer torch, which cannot travel). So the engine and the packages the
image lacks travel as files, in two parts, one per call (the machine keeps /tmp for ~30 s
after a call):

- ``.gpu-payload/site/rest.tar.xz``: ``pip install --target`` of vllm 0.26.0 and the pinned
  wheels of ``requirements-vllm-0.26.0.txt`` (what the image lacks, the proxy's own
  dependencies included), minus what a dense model on an H100 never loads (FlashAttention-2,
  FA3 being used on sm_90; the MoE kernels; the ``vllm-rs`` binary; headers for sm100 and
  DeepGEMM builds for other Pythons) and minus ``vllm/_C_stable_libtorch.abi3.so``;
- ``.gpu-payload/csrc/C_stable.so.xz``: that one library (~53 MiB compressed).

Both are written into ``.gpu-payload/`` (ignored by git) and carried by name:
``bench.gpu.remote prepare`` (call 1, carries ``.gpu-payload/site``) unpacks the first and makes
the model; ``bench.gpu.remote run`` (call 2, carries ``.gpu-payload/csrc``) places the library
and runs the checks and the bench. docs/gpu.md has the exact calls.

The list of wheels and what to prune come from the recipe in the team's shared gpu/ folder
(measured there on one H100; its README says which imports fail without each package). Wheels
are cached in ``~/.cache/modal-llm-gpu/wheels`` (``--wheels``); a rebuild without network
works from that cache. Needs a python 3.12 with pip (``--python``, default: ``python3.12`` on
PATH, else pyenv's) and ``xz``; about 5 minutes, most of it ``xz -9``.

``--engine sglang`` builds SGLang 0.5.15's part instead (it pins torch 2.11.0 too):
``.gpu-payload/sglang/sglang.tar.xz``, ``pip install --target`` of sglang 0.5.15 (its wheel is
tagged manylinux_2_34) and ``requirements-sglang-0.5.15.txt`` (what the vLLM part and the
image lack, and SGLang's own pins: transformers 5.12.1, openai 2.6.1, ...), minus what the
shared gpu/ recipe served without (sgl-kernel's FlashAttention ops, 1.7 GB, and its sm100 and
FlashMLA builds; flashinfer's cubins and xgrammar are not downloaded at all). On the GPU it
unpacks into /tmp/site-sglang, ahead of /tmp/site (the vLLM part, whose fastapi, uvicorn,
orjson, pydantic, ... SGLang uses) on SGLang's path only: ``bench.gpu.remote prepare-sglang``.
Its manifest is ``manifest-sglang.json``; the vLLM parts are left as they are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # the repository: dev/bench/gpu/
VLLM_VERSION = "0.26.0"
REQUIREMENTS = HERE / f"requirements-vllm-{VLLM_VERSION}.txt"
DEST = ROOT / ".gpu-payload"
WHEELS = Path.home() / ".cache" / "modal-llm-gpu" / "wheels"
# The device tool's limit on what one call takes along (tracked files included).
CALL_LIMIT_BYTES = 64 * 1024 * 1024
# The one library that travels alone (the rest of vLLM does not fit beside it).
C_LIB = "vllm/_C_stable_libtorch.abi3.so"
PARTS = {"site": "rest.tar.xz", "csrc": "C_stable.so.xz"}
# manylinux tags the image's glibc accepts (pip matches each tag exactly).
PLATFORMS = [
    "manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux1_x86_64",
]  # fmt: skip
# Not loaded by a dense bf16 model on sm_90 (measured by the recipe); ~1 GB unpacked.
PRUNE = [
    "bin",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # FlashAttention-2: FA3 serves sm_90
    "vllm/vllm-rs",
    "vllm/_moe_C_stable_libtorch.abi3.so",  # mixture-of-experts kernels
    "vllm/third_party/fmha_sm100/cutlass",  # Blackwell kernels' headers
    "vllm/third_party/deep_gemm/include",
    "simdjson/simdjson.cpp",  # sources shipped beside the built extension
    "simdjson/simdjson.h",
]
PRUNE_GLOBS = ["vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so"]  # other Pythons

SGLANG_VERSION = "0.5.15"
SGLANG_REQUIREMENTS = HERE / f"requirements-sglang-{SGLANG_VERSION}.txt"
SGLANG_PART = ("sglang", "sglang.tar.xz")  # .gpu-payload/sglang/sglang.tar.xz
# sglang 0.5.15's wheel is tagged manylinux_2_34 (the image's glibc takes it).
SGLANG_PLATFORMS = ["manylinux_2_34_x86_64", *PLATFORMS]
# Not loaded with --attention-backend triton on sm_90 (the shared gpu/ recipe served without).
SGLANG_PRUNE = [
    "bin",
    "sgl_kernel/flash_ops.abi3.so",  # FlashAttention 3/4 ops, 1.7 GB; imported in a try
    "sgl_kernel/sm100",  # Blackwell build of common_ops (sm90's is kept)
    "sgl_kernel/flashmla_ops.abi3.so",  # MLA models only
]
SGLANG_PRUNE_GLOBS = [
    # torch_memory_saver picks `<stem>_cu<torch's CUDA major>`: the image's torch is cu130
    "torch_memory_saver_hook_mode_*_cu12.abi3.so",
    "torch_memory_saver_hook_mode_preload.abi3.so",  # unsuffixed: ROCm builds
    "torch_memory_saver_hook_mode_torch.abi3.so",
]


def find_python312(given: str | None) -> str:
    candidates = [given] if given else ["python3.12"]
    if not given:
        pyenv = Path.home() / ".pyenv" / "versions"
        candidates += sorted(str(p) for p in pyenv.glob("3.12*/bin/python3.12"))
    for cand in candidates:
        path = shutil.which(cand) if cand and os.sep not in cand else cand
        if not path or not Path(path).exists():
            continue
        probe = subprocess.run(
            [path, "-c", "import sys, pip; print(sys.version_info[:2] == (3, 12))"],
            capture_output=True,
            text=True,
        )
        if probe.stdout.strip() == "True":
            return path
    raise SystemExit(
        "no python 3.12 with pip found (tried " + ", ".join(c for c in candidates if c) + "); "
        "pass --python /path/to/python3.12"
    )


def pip(python: str, *args: str) -> None:
    cmd = [python, "-m", "pip", *args]
    print("+", " ".join(cmd[:8]), "..." if len(cmd) > 8 else "", flush=True)
    subprocess.run(cmd, check=True)


def platform_args(platforms: list[str] = PLATFORMS) -> list[str]:
    out = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
    for tag in platforms:
        out += ["--platform", tag]
    return out


def download(python: str, wheels: Path) -> Path:
    """Fetch (or reuse) vllm's wheel and the pinned requirements into `wheels`."""
    wheels.mkdir(parents=True, exist_ok=True)
    common = ["download", "-q", "--no-deps", *platform_args(), "-d", str(wheels)]
    pip(python, *common, f"vllm=={VLLM_VERSION}", "-r", str(REQUIREMENTS))
    found = sorted(wheels.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if not found:
        raise SystemExit(f"vllm {VLLM_VERSION}'s wheel is not in {wheels} after the download")
    return found[0]


def install_target(python: str, wheels: Path, vllm_wheel: Path, site: Path) -> None:
    """Unpack every wheel into `site` (no resolution: the requirement list is complete)."""
    pip(
        python, "install", "-q", "--no-index", "--find-links", str(wheels), "--no-deps",
        "--no-compile", *platform_args(), "--target", str(site),
        "-r", str(REQUIREMENTS), str(vllm_wheel),
    )  # fmt: skip


def prune(site: Path, names: list[str] = PRUNE, globs: list[str] = PRUNE_GLOBS) -> int:
    """Remove what the GPU run never loads; returns the bytes removed."""
    removed = 0
    paths = [site / p for p in names] + [p for g in globs for p in site.glob(g)]
    for path in paths:
        if path.is_dir():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        elif path.exists():
            removed += path.stat().st_size
            path.unlink()
    return removed


def xz_file(src: Path, dst: Path) -> None:
    with dst.open("wb") as out:
        subprocess.run(["xz", "-9", "-T1", "-c", str(src)], stdout=out, check=True)


def xz_tree(site: Path, dst: Path, exclude: str | None) -> None:
    skip = [f"--exclude=./{exclude}"] if exclude else []
    tar = subprocess.Popen(
        ["tar", *skip, "-C", str(site), "-cf", "-", "."],
        stdout=subprocess.PIPE,
    )
    with dst.open("wb") as out:
        subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=out, check=True)
    if tar.wait() != 0:
        raise SystemExit(f"tar of {site} failed")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_bytes() -> int:
    """What every call takes along besides a carried part: tracked + untracked, not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    total = 0
    for name in filter(None, listed):
        path = ROOT / os.fsdecode(name)
        if path.is_file():
            total += path.stat().st_size
    return total


def check_sizes(dest: Path, engine: str = "vllm") -> dict[str, int]:
    """Each part plus the working tree must fit one call; says which does not. The vLLM parts
    always; SGLang's when built (or asked for: `engine` "sglang")."""
    tree = tree_bytes()
    sizes = {"working_tree": tree}
    parts = dict(PARTS)
    sglang_file = dest / SGLANG_PART[0] / SGLANG_PART[1]
    if engine == "sglang":
        parts = {SGLANG_PART[0]: SGLANG_PART[1]}
    elif sglang_file.exists():
        parts[SGLANG_PART[0]] = SGLANG_PART[1]
    for part, name in parts.items():
        if not (dest / part / name).exists():
            how = " --engine sglang" if part == SGLANG_PART[0] else ""
            raise SystemExit(f"{dest / part / name} is missing: python -m bench.gpu.payload{how}")
        size = (dest / part / name).stat().st_size
        sizes[part] = size
        if size + tree > CALL_LIMIT_BYTES:
            raise SystemExit(
                f"{dest / part / name} ({size / 2**20:.1f} MiB) plus the working tree "
                f"({tree / 2**20:.1f} MiB) exceeds the 64 MiB a call takes along; prune more "
                "(PRUNE in dev/bench/gpu/payload.py) or ignore large untracked files"
            )
    return sizes


def build(python: str, wheels: Path, dest: Path) -> dict[str, object]:
    t0 = time.monotonic()
    vllm_wheel = download(python, wheels)
    for part in PARTS:
        (dest / part).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-payload-") as tmp:
        site = Path(tmp) / "site"
        install_target(python, wheels, vllm_wheel, site)
        pruned = prune(site)
        print(f"pruned {pruned / 2**20:.0f} MiB; compressing (xz -9) ...", flush=True)
        xz_file(site / C_LIB, dest / "csrc" / PARTS["csrc"])
        xz_tree(site, dest / "site" / PARTS["site"], C_LIB)
    sizes = check_sizes(dest)
    manifest: dict[str, object] = {
        "vllm": VLLM_VERSION,
        "requirements": REQUIREMENTS.name,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - t0, 1),
        "bytes": sizes,
        "sha256": {p: sha256(dest / p / n) for p, n in PARTS.items()},
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def build_sglang(python: str, wheels: Path, dest: Path) -> dict[str, object]:
    """SGLang 0.5.15's part: .gpu-payload/sglang/sglang.tar.xz (see the module docstring)."""
    t0 = time.monotonic()
    wheels.mkdir(parents=True, exist_ok=True)
    plat = platform_args(SGLANG_PLATFORMS)
    pip(
        python, "download", "-q", "--no-deps", *plat, "-d", str(wheels),
        f"sglang=={SGLANG_VERSION}", "-r", str(SGLANG_REQUIREMENTS),
    )  # fmt: skip
    found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if not found:
        raise SystemExit(f"sglang {SGLANG_VERSION}'s wheel is not in {wheels} after the download")
    part, name = SGLANG_PART
    (dest / part).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-payload-sglang-") as tmp:
        site = Path(tmp) / "site"
        pip(
            python, "install", "-q", "--no-index", "--find-links", str(wheels), "--no-deps",
            "--no-compile", *plat, "--target", str(site),
            "-r", str(SGLANG_REQUIREMENTS), str(found[0]),
        )  # fmt: skip
        unpacked = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
        pruned = prune(site, SGLANG_PRUNE, SGLANG_PRUNE_GLOBS)
        print(f"pruned {pruned / 2**20:.0f} MiB of {unpacked / 2**20:.0f}; xz -9 ...", flush=True)
        xz_tree(site, dest / part / name, None)
    sizes = check_sizes(dest, engine="sglang")
    manifest: dict[str, object] = {
        "sglang": SGLANG_VERSION,
        "requirements": SGLANG_REQUIREMENTS.name,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - t0, 1),
        "unpacked_bytes": unpacked - pruned,
        "bytes": sizes,
        "sha256": {part: sha256(dest / part / name)},
    }
    (dest / "manifest-sglang.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m bench.gpu.payload", description=__doc__)
    cli.add_argument("--dest", type=Path, default=DEST, help=f"output folder (default {DEST})")
    cli.add_argument("--wheels", type=Path, default=WHEELS, help="wheel cache folder")
    cli.add_argument("--python", help="a python 3.12 with pip (only unpacks wheels)")
    cli.add_argument("--check", action="store_true", help="only check an existing payload's sizes")
    cli.add_argument(
        "--engine",
        choices=["vllm", "sglang"],
        default="vllm",
        help=f"vllm: vLLM {VLLM_VERSION}'s two parts (default); sglang: SGLang {SGLANG_VERSION}'s "
        "part (it runs with the vLLM site part on its path, so build both)",
    )
    args = cli.parse_args(argv)
    if args.check:
        print(json.dumps(check_sizes(args.dest, args.engine)))
        return 0
    if shutil.which("xz") is None:
        raise SystemExit("xz is not installed; it compresses the payload")
    python = find_python312(args.python)
    if args.engine == "sglang":
        manifest = build_sglang(python, args.wheels, args.dest)
    else:
        manifest = build(python, args.wheels, args.dest)
    print(json.dumps(manifest, indent=1))
    print("\nnext: docs/gpu.md 'Running it'", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
