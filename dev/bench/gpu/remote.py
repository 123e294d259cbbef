"""The GPU machine's side of the harness: ``python3 -m bench.gpu.remote prepare|run``.

Runs with the image's python3 (3.12, torch 2.11.0) in the repository root of the device's
copy of the working tree; results go to ``$OUT`` (at most 8 files come back). Two calls back
to back (the machine keeps /tmp for ~30 s after a call; docs/gpu.md has the exact calls):

``prepare`` (carry ``.gpu-payload/site``): unpack vLLM and the packages the image lacks into
/tmp/site (all but vLLM's kernel library, which comes with the next call), write the ``vllm``
command, make the random-initialised model (bench.gpu.mkmodel) and link it where the weights
volume would be (/weights/gpu-model), probe the imports (with a stand-in for the kernel
library), and parse the spec's command lines with vLLM's real parser, comparing its flags with
the recorded serving/engine_flags/vllm_0_26_0.py. Writes prepare.json and prepare.log.

``run`` (carry ``.gpu-payload/csrc``): place the kernel library, then the phases:
- ``checks``: ``pytest tests/gpu`` (real vLLM through ``python -m serving.engine`` and the
  proxy: readiness and warm-up, the snapshot cycle, usage in streams, a client that
  disconnects mid-stream, bad flags); pytest.txt, checks.json, checks-engine.log;
- ``bench``: ``python -m serving.engine`` with the default spec, then bench.gpu.load direct vs
  proxy (bench.json, bench-engine.log, cpu.jsonl: per-process CPU each second).
- ``coldstart``: the snapshot spec started cold (empty engine cache) and warm per engine-core
  start method, or, with ``--coldstart-plan``, the listed steps (issue 36: cold / warm /
  baked, each optionally +graphs and +prefetch; ``run_coldstart_plan``).
run.json holds the card, the versions, the proxy's and the engine's keep-alive settings and
each phase's time; run.log what was printed. The table is printed last.

``prepare`` also compiles every module's bytecode as serving/app.py's image build does
(serving/bake.py, into device.PYCACHE), timing ``vllm serve`` to its argument parsing with no
bytecode at all and after (``compile_site``).

SGLang 0.5.15 (it pins torch 2.11.0 too), after ``prepare`` (whose /tmp/site and model it uses):
``prepare-sglang`` (carry ``.gpu-payload/sglang``) unpacks SGLang's part into /tmp/site-sglang
(ahead of /tmp/site on SGLang's path only), probes its imports and parses the spec's SGLang
command lines with SGLang's real parser, comparing its flags with the recorded
serving/engine_flags/sglang_0_5_15.py (prepare-sglang.json, prepare-sglang.log). Then, in the
same call or the next, ``run --phases sglang``: ``pytest`` on tests/gpu/test_sglang_*.py (real
SGLang through ``python -m serving.engine`` and the proxy; pytest-sglang.txt, checks.json,
checks-sglang-engine.log), and ``run --phases sglang-bench``: the SGLang spec through
serving.engine, then bench.gpu.load direct vs proxy (sglang-bench.json,
sglang-bench-engine.log, cpu.jsonl). Neither needs vLLM's kernel library.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from bench.gpu import device
from bench.gpu.mkmodel import SHAPES

PAYLOAD = device.ROOT / ".gpu-payload"
# coldstart, tp: how vLLM starts its engine-core process (and its TP workers), set in the
# `vllm` wrapper (prepare) over what the spec sets. "default": as the spec sets it
# (serving/render/vllm.py VLLM_MULTIPROC_METHOD: fork on one GPU since f80cad5, on any number since
# run Z; before it nothing, and `vllm serve` then picks "spawn": vllm 0.26.0
# entrypoints/serve/utils/api_utils.py); "spawn": a fresh interpreter that imports vLLM again;
# "fork": from the parent's process, its imports done (vllm/utils/system_utils.py
# get_mp_context).
MP_METHOD_ENV = "BENCH_VLLM_MP_METHOD"
COLDSTART_METHODS = ("default", "spawn", "fork")

# `run --server-cpus 0-7 --client-cpus 8-15`: the engine, the proxy and the plain engine on one
# set of cores, the load clients on the other, so that the clients (up to ~15 cores at 1024
# streams, docs/gpu.md runs C and D) do not take CPU from what is measured. None: unpinned.
CPU_SETS: dict[str, set[int] | None] = {"server": None, "client": None}


def parse_cpus(text: str | None) -> set[int] | None:
    """ "0-7" / "0,2,4-6" -> {0, ..., 7} / {0, 2, 4, 5, 6}; None or "" -> None (unpinned)."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pinned(role: str) -> Any:
    """A preexec_fn that puts the child (and what it spawns) on the role's cores, or None."""
    cpus = CPU_SETS.get(role)
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


C_LIB = "vllm/_C_stable_libtorch.abi3.so"
STUB = "vllm/_C_stable_libtorch.py"
ENGINE_START_LINES = re.compile(
    r"non-default args|Resolved architecture|Initializing a V1 LLM engine|Starting vLLM server"
    r"|Loading weights took|Model loading took|torch\.compile|Compil|Graph capturing|CUDA graph"
    r"|init engine|Available KV cache|Maximum concurrency|healthy after|warm-up done"
    r"|SERVING READY|fall asleep|freed|wake up|weights prefetch|Error|error:"
)
# SGLang 0.5.15's own start-up lines (sglang/srt/model_executor/model_runner.py,
# entrypoints/http_server.py), and ours.
SGLANG_START_LINES = re.compile(
    r"Load weight end|KV Cache is allocated|max_total_num_tokens|Capture|capture .*(?:end|took)"
    r"|fired up and ready|healthy after|warm-up done|SERVING READY|memory_occupation"
    r"|Error|error:"
)
SGLANG_PROBE_MODULES = [
    "transformers",
    "sglang",
    "sglang.srt.server_args",
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.llama",
    "sglang.srt.layers.attention.triton_backend",
    "sgl_kernel",
    "flashinfer",
    "torch_memory_saver",
    "orjson",
    "httptools",
    "uvloop",
]
PROBE_MODULES = [
    "vllm",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.main",
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.sample.sampler",
    "vllm.v1.structured_output",
    "orjson",
    "simdjson",
    "httptools",
    "uvloop",
    "pydantic",
]


def out_dir() -> Path:
    out = Path(os.environ.get("OUT") or "gpu-out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def sh(cmd: list[str], **kw: Any) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return (done.stdout + done.stderr).strip()


def card() -> dict[str, str]:
    q = "name,memory.total,driver_version"
    if shutil.which("nvidia-smi") is None:
        return {"gpu": "none (no nvidia-smi)", "memory": "", "driver": "", "gpus": "0"}
    line = sh(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"]).splitlines()
    name, memory, driver = ([*line[0].split(", "), "", ""] if line else ["", "", ""])[:3]
    return {"gpu": name, "memory": memory, "driver": driver, "gpus": str(len(line))}


SGLANG_VERSIONS = [
    "sglang", "sglang-kernel", "flashinfer-python", "torch_memory_saver", "huggingface-hub",
    "openai", "fastapi", "uvicorn",
]  # fmt: skip


def versions(with_site: bool, engine: str = "vllm") -> dict[str, str]:
    names = ["torch", "transformers", "tokenizers", "triton", "vllm", "pydantic", "httpx"]
    if engine == "sglang":
        names += SGLANG_VERSIONS
    code = (
        "import json, sys, importlib.metadata as m\n"
        f"names = {names!r}\n"
        "v = {}\n"
        "for n in names:\n"
        "    try: v[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: v[n] = None\n"
        "v['python'] = sys.version.split()[0]\n"
        "print(json.dumps(v))\n"
    )
    env = device.run_env(engine) if with_site else dict(os.environ)
    found: dict[str, str] = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout
        or "{}"
    )
    return found


class Log:
    """Print and keep: the reply shows the output's tail, the file comes back whole."""

    def __init__(self, path: Path) -> None:
        self.f = path.open("w")
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


# ---- prepare (call 1) -----------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> int:
    out = out_dir()
    log = Log(out / "prepare.log")
    result: dict[str, Any] = {"card": card(), "date": time.strftime("%Y-%m-%d %H:%M UTC")}
    result["image"] = versions(with_site=False)
    log(f"card {result['card']}; image {result['image']}")
    t = time.monotonic()
    archive = PAYLOAD / "site" / "rest.tar.xz"
    if not archive.exists():
        log(f"{archive} is missing: carry .gpu-payload/site (built by python -m bench.gpu.payload)")
        return 2
    if device.SITE.exists():
        shutil.rmtree(device.SITE)
    device.SITE.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(device.SITE, filter="tar")
    result["unpack_s"] = round(time.monotonic() - t, 1)
    log(f"unpacked {archive.name} into {device.SITE} in {result['unpack_s']} s")
    (device.SITE / STUB).write_text("# stand-in until the kernel library is placed (run)\n")
    device.BIN.mkdir(parents=True, exist_ok=True)
    wrapper = device.BIN / "vllm"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="{device.SITE}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        # coldstart's A/B only: serving.engine puts the spec's env over the inherited one, so
        # the bench's choice of vLLM's start method is applied here, after it (MP_METHOD_ENV)
        f'[ -n "${MP_METHOD_ENV}" ] && export VLLM_WORKER_MULTIPROC_METHOD="${MP_METHOD_ENV}"\n'
        f'exec {sys.executable} -m vllm.entrypoints.cli.main "$@"\n'
    )
    wrapper.chmod(0o755)
    t = time.monotonic()
    made = subprocess.run(
        [sys.executable, "-m", "bench.gpu.mkmodel", str(device.MODEL_DIR), "--shape", args.shape],
        cwd=device.ROOT,
        capture_output=True,
        text=True,
    )
    said = made.stdout.strip().splitlines() or made.stderr.strip().splitlines()[-3:]
    result["model"] = said[-1] if said else f"mkmodel exited {made.returncode}"
    result["model_s"] = round(time.monotonic() - t, 1)
    result["shape"] = args.shape
    log(f"model in {result['model_s']} s: {result['model'][:300]}")
    device.WEIGHTS_ROOT.mkdir(exist_ok=True)
    link = device.WEIGHTS_ROOT / device.WEIGHTS_PATH
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(device.MODEL_DIR)
    result["bytecode"] = compile_site(log)
    result["site"] = versions(with_site=True)
    if args.skip_checks:  # the imports probe and the flag check (~40 s): serving/render unchanged
        result["imports"] = result["flags"] = "skipped (--skip-checks)"
        bad: dict[str, str] = {}
    else:
        result["imports"] = probe_imports()
        bad = {m: e for m, e in result["imports"].items() if e != "ok"}
        log(f"imports: {len(result['imports']) - len(bad)} ok, failed: {bad or 'none'}")
        result["flags"] = check_flags(out, log)
    (out / "prepare.json").write_text(json.dumps(result, indent=1) + "\n")
    log("prepare done; now `run` (within ~30 s, before the machine goes back)")
    flags_ok = args.skip_checks or result["flags"].get("rc") == 0
    return 0 if not bad and flags_ok else 1


# `vllm serve` up to its argument parsing: the API server's imports and its parser, what the
# cold-start table's "API server's imports done" counts (a bad value makes the parser exit 2
# there, before anything else starts).
CLI_TO_ARGS = ["-m", "vllm.entrypoints.cli.main", "serve", "/weights/gpu-model", "--max-num-seqs",
               "many"]  # fmt: skip


def time_cli_start(env: dict[str, str], times: int = 2) -> list[float]:
    """Seconds from a fresh `vllm serve` process to its argument parser's exit (2, with the
    parser's error), `times` times; a run that ends otherwise is recorded as -1."""
    took = []
    for _ in range(times):
        t = time.monotonic()
        done = subprocess.run(
            [sys.executable, *CLI_TO_ARGS], capture_output=True, text=True, env=env, timeout=300
        )
        ok = done.returncode == 2 and "max-num-seqs" in done.stderr
        took.append(round(time.monotonic() - t, 2) if ok else -1.0)
        if not ok:
            print(f"vllm serve exited {done.returncode}: {done.stderr[-600:]}", flush=True)
    return took


def import_profile(env: dict[str, str], top: int = 20) -> dict[str, Any]:
    """`python -X importtime` of the same start, summarised by parse_importtime."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *CLI_TO_ARGS],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    return parse_importtime(done.stderr, top)


def parse_importtime(stderr: str, top: int = 20) -> dict[str, Any]:
    """The whole import time; each top-level package's own share (the sum of its modules' self
    times: where the seconds go, whoever imported them first); the modules down to three levels
    deep whose imports took longest (cumulative); and the top-level entries."""
    rows = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), len(m.group(3)) // 2, m.group(4)))
    by_package: dict[str, int] = {}
    for own, _, _, name in rows:
        package = name.split(".")[0]
        by_package[package] = by_package.get(package, 0) + own
    top_level = sorted(((cum, name) for _, cum, depth, name in rows if depth == 0), reverse=True)
    deep = sorted(((cum, depth, name) for _, cum, depth, name in rows if depth <= 3), reverse=True)
    return {
        "imports_total_s": round(sum(cum for cum, _ in top_level) / 1e6, 2),
        "modules": len(rows),
        "self_by_package": [
            [name, round(us / 1e6, 2)]
            for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:top]
        ],
        "cumulative_to_depth_3": [[name, d, round(cum / 1e6, 2)] for cum, d, name in deep[:top]],
        "top_level": [[name, round(cum / 1e6, 2)] for cum, name in top_level[:top]],
    }


def bytecode_share(root: Path) -> dict[str, int]:
    """How many .py files under root have a .pyc of this Python beside them (__pycache__)."""
    tag = sys.implementation.cache_tag
    sources = compiled = 0
    for py in root.rglob("*.py"):
        sources += 1
        compiled += (py.parent / "__pycache__" / f"{py.stem}.{tag}.pyc").exists()
    return {"py_files": sources, "with_pyc": compiled}


def compile_site(log: Log) -> dict[str, Any]:
    """Every module's bytecode, as serving/app.py's image build leaves it (issue 36): the
    payload is unpacked without .pyc files (bench.gpu.payload: pip --no-compile) and the
    machine's image has none for its torch, so a start compiled them all. serving/bake.py's
    compile_bytecode runs here on the image's stdlib and site-packages and on /tmp/site, into
    device.PYCACHE (PYTHONPYCACHEPREFIX, which run_env sets: the image's folders stay as they
    are). Times `vllm serve` to its argument parsing with no bytecode for any module (an empty
    prefix, nothing written: a container of an image without bytecode) and after, twice each,
    then `-X importtime` of the same start."""
    env = device.run_env()
    shares: dict[str, Any] = {}
    torch_dir = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('torch').origin)"],
        capture_output=True, text=True, env=env,
    ).stdout.strip()  # fmt: skip
    if torch_dir:  # beside the sources, as the image has them
        shares["image_torch"] = bytecode_share(Path(torch_dir).parent)
    nowhere = Path("/tmp/no-pycache")
    shutil.rmtree(nowhere, ignore_errors=True)
    nowhere.mkdir()
    no_pyc = {**env, "PYTHONPYCACHEPREFIX": str(nowhere), "PYTHONDONTWRITEBYTECODE": "1"}
    before = time_cli_start(no_pyc)
    code = (
        "import sys\nfrom pathlib import Path\nfrom serving import bake\n"
        "bake.compile_bytecode([*bake.package_dirs(), *map(Path, sys.argv[1:])])\n"
    )
    t = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code, str(device.SITE)], capture_output=True, text=True, env=env
    )
    compile_s = round(time.monotonic() - t, 1)
    shares["pycache_files"] = sum(1 for _ in device.PYCACHE.rglob("*.pyc"))
    after = time_cli_start(env)
    profile = import_profile(env)
    found = {
        "compile_s": compile_s,
        "compile_rc": done.returncode,
        "bytecode": shares,
        "cli_to_args_s_no_bytecode_anywhere": before,
        "cli_to_args_s_with_pyc": after,
        "import_profile_with_pyc": profile,
    }
    log(
        f"bytecode: {shares}; serving/bake.py compile_bytecode into {device.PYCACHE} in "
        f"{compile_s} s (rc {done.returncode}); `vllm serve` to its argument parsing {before} s "
        f"with no bytecode for any module, {after} s with; imports {profile['imports_total_s']}"
        f" s, own time by package: {profile['self_by_package'][:10]}"
    )
    return found


def probe_imports(
    modules: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, str]:
    code = (
        "import importlib, json, sys\n"
        "res = {}\n"
        "for m in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(m); res[m] = 'ok'\n"
        "    except Exception as e:\n"
        "        res[m] = repr(e)[:300]\n"
        "print(json.dumps(res))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *(modules or PROBE_MODULES)],
        capture_output=True,
        text=True,
        env=env if env is not None else device.run_env(),
    )
    try:
        found: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        found = {"(probe)": done.stderr[-800:]}
    return found


def flag_argvs() -> list[list[str]]:
    """The argvs (without `vllm serve`) the GPU runs and the spec's own matrix render."""
    sys.path[:0] = [str(device.ROOT), str(device.SITE)]
    from serving.render import engine_command
    from serving.spec import ServingSpec

    specs = [
        device.spec_dict(),
        device.spec_dict(snapshot=True),
        {**device.spec_dict(), "gpu_count": 2, "gpu_memory_fraction": 0.85},
        device.spec_dict(extra_args=["--no-enable-prefix-caching", "--max-num-seqs", "64"]),
        {**device.spec_dict(), "cpu": 8},  # -> --api-server-count 6
        {**device.spec_dict(snapshot=True), "cudagraph_sizes": "max_concurrency"},
    ]
    return [engine_command(ServingSpec.model_validate(s), 8001)[2:] for s in specs]


def check_flags(out: Path, log: Log) -> dict[str, Any]:
    """vLLM's real parser takes the rendered argvs; its flags equal the recorded list."""
    recorded = device.ROOT / "serving" / "engine_flags" / "vllm_0_26_0.py"
    argv_file = out / "argvs.json"
    argv_file.write_text(json.dumps(flag_argvs()))
    # scripts/record_engine_flags.py, through the shim that knows 0.26.0's module layout
    shim = [sys.executable, "-m", "bench.gpu.flags_shim", "vllm"]
    cmd = [*shim, "--check-argv", str(argv_file)]
    if recorded.exists():
        cmd += ["--expect", str(recorded)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, cwd=device.ROOT, env=device.run_env(), timeout=300
    )
    argv_file.unlink()
    said = (done.stdout + done.stderr[-1500:]).strip()
    log(f"flag check rc={done.returncode}: {said[-600:]}")
    if not recorded.exists():  # first time: bring the recording back to commit it
        rec = subprocess.run(
            shim,
            capture_output=True,
            text=True,
            cwd=device.ROOT,
            env=device.run_env(),
        )
        (out / "vllm_0_26_0.py").write_text(rec.stdout)
    return {"rc": done.returncode, "output": said[-3000:]}


# ---- prepare-sglang (after prepare; SGLang 0.5.15) ---------------------------------------------


def prepare_sglang(args: argparse.Namespace) -> int:
    out = out_dir()
    log = Log(out / "prepare-sglang.log")
    result: dict[str, Any] = {"card": card(), "date": time.strftime("%Y-%m-%d %H:%M UTC")}
    archive = PAYLOAD / "sglang" / "sglang.tar.xz"
    if not archive.exists():
        log(f"{archive} is missing: carry .gpu-payload/sglang (python -m bench.gpu.payload "
            "--engine sglang)")  # fmt: skip
        return 2
    missing = [
        str(p)
        for p in (device.SITE / "fastapi", device.MODEL_DIR / "config.json")
        if not p.exists()
    ]
    if missing:
        log(f"{', '.join(missing)} missing: run `prepare` first (the call before, with "
            ".gpu-payload/site; SGLang uses its packages and its model)")  # fmt: skip
        return 2
    t = time.monotonic()
    if device.SITE_SGLANG.exists():
        shutil.rmtree(device.SITE_SGLANG)
    device.SITE_SGLANG.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(device.SITE_SGLANG, filter="tar")
    result["unpack_s"] = round(time.monotonic() - t, 1)
    log(f"unpacked {archive.name} into {device.SITE_SGLANG} in {result['unpack_s']} s")
    env = device.run_env("sglang")
    result["versions"] = versions(with_site=True, engine="sglang")
    log(f"versions on SGLang's path: {result['versions']}")
    t = time.monotonic()
    result["imports"] = probe_imports(SGLANG_PROBE_MODULES, env)
    result["imports_s"] = round(time.monotonic() - t, 1)
    bad = {m: e for m, e in result["imports"].items() if e != "ok"}
    log(f"imports: {len(result['imports']) - len(bad)} ok, failed: {bad or 'none'}")
    result["flags"] = check_sglang_flags(out, log, env)
    (out / "prepare-sglang.json").write_text(json.dumps(result, indent=1) + "\n")
    log("prepare-sglang done; now `run --phases sglang` (at once, or in this call)")
    return 0 if not bad and result["flags"].get("rc") == 0 else 1


def sglang_flag_argvs() -> list[list[str]]:
    """The SGLang argvs (without `python3 -m sglang.launch_server`) the GPU runs render, and
    the spec's own variants: snapshot, TP 2, extra_args. serving.spec needs pydantic, which the
    image lacks: it comes from the vLLM site (call 1), as in `flag_argvs`."""
    sys.path[:0] = [str(device.ROOT), str(device.SITE)]
    from serving.render import engine_command
    from serving.spec import ServingSpec

    specs = [
        device.sglang_spec_dict(),
        device.sglang_spec_dict(snapshot=True),
        {**device.sglang_spec_dict(), "gpu_count": 2, "gpu_memory_fraction": 0.85},
        device.sglang_spec_dict(extra_args=["--max-running-requests", "64"]),
        device.sglang_spec_dict(extra_args=["--chunked-prefill-size=-1"]),
        {**device.sglang_spec_dict(), "api_server_count": 4},  # --tokenizer-worker-num 4
        # the shipped SGLang defaults alone (without this machine's backends)
        {**device.spec_dict(), "engine": "sglang", "engine_version": device.SGLANG_VERSION},
    ]  # fmt: skip
    return [engine_command(ServingSpec.model_validate(s), 8001)[3:] for s in specs]


def check_sglang_flags(out: Path, log: Log, env: dict[str, str]) -> dict[str, Any]:
    """SGLang's real parser takes the rendered argvs; its flags equal the recorded list."""
    recorded = device.ROOT / "serving" / "engine_flags" / "sglang_0_5_15.py"
    argv_file = out / "argvs-sglang.json"
    argv_file.write_text(json.dumps(sglang_flag_argvs()))
    cmd = [sys.executable, "-m", "bench.gpu.flags_shim", "sglang", "--check-argv", str(argv_file)]
    cmd += ["--expect", str(recorded)]
    done = subprocess.run(
        cmd, capture_output=True, text=True, cwd=device.ROOT, env=env, timeout=300
    )
    argv_file.unlink()
    said = (done.stdout + done.stderr[-1500:]).strip()
    log(f"flag check rc={done.returncode}: {said[-600:]}")
    return {"rc": done.returncode, "output": said[-3000:]}


# ---- run (call 2) ---------------------------------------------------------------------------


def place_library(log: Log) -> None:
    target = device.SITE / C_LIB
    packed = PAYLOAD / "csrc" / "C_stable.so.xz"
    if not (device.SITE / "vllm").exists():
        raise SystemExit(
            f"{device.SITE} has no vllm: this machine did not run `prepare` (it went back "
            "between the calls?); run prepare again, then run at once"
        )
    if not target.exists():
        if not packed.exists():
            raise SystemExit(f"{packed} is missing: carry .gpu-payload/csrc")
        t = time.monotonic()
        with lzma.open(packed) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        log(f"placed {C_LIB} in {time.monotonic() - t:.1f} s")
    (device.SITE / STUB).unlink(missing_ok=True)


def proxy_idle_setting() -> dict[str, Any]:
    """The proxy's engine-pool settings as serving.engine starts it (its parser's defaults)."""
    code = (
        "import json\n"
        "from serving.proxy.__main__ import build_parser\n"
        "opts = {a.option_strings[0]: a.default for a in build_parser()._actions\n"
        "        if a.option_strings and a.option_strings[0].startswith('--upstream')}\n"
        "print(json.dumps(opts, default=str))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=device.run_env()
    )
    try:
        opts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": done.stderr[-500:]}
    if "--upstream-idle-s" not in opts:
        opts["note"] = "proxy as shipped: no --upstream-idle-s (its pool's own idle TTL applies)"
    return opts


@contextlib.contextmanager
def serving(
    spec: dict[str, Any], log_path: Path, log: Log, env_extra: dict[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """`python -m serving.engine --spec` until SERVING READY; stopped (SIGTERM) on exit."""
    spec_file = device.write_spec(Path("/tmp") / "bench-spec.json", spec)
    engine = spec.get("engine", "vllm")
    env = {**device.run_env(engine), **(env_extra or {})}
    start_lines = SGLANG_START_LINES if engine == "sglang" else ENGINE_START_LINES
    info: dict[str, Any] = {"spec": spec}
    logf = log_path.open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.engine", "--spec", str(spec_file)],
        cwd=device.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=pinned("server"),
    )
    ready = threading.Event()
    lines: list[tuple[float, str]] = []

    def pump(stream: IO[str]) -> None:
        for line in stream:
            stamp = time.monotonic() - t0
            logf.write(f"{stamp:8.2f} {line}")
            if start_lines.search(line) and '"path"' not in line:
                lines.append((round(stamp, 2), line.rstrip()[:300]))
            if "SERVING READY" in line:
                ready.set()
        logf.flush()

    assert proc.stdout is not None
    reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        while not ready.wait(0.5):
            if proc.poll() is not None:
                raise RuntimeError(f"serving.engine exited {proc.returncode}; see {log_path}")
            if time.monotonic() - t0 > 600:
                raise RuntimeError(f"not ready after 600 s; see {log_path}")
        info["ready_s"] = round(time.monotonic() - t0, 1)
        info["start_lines"] = list(lines)
        log(f"serving.engine ready after {info['ready_s']} s")
        info["engine_keepalive_env"] = engine_env_seen(engine)
        yield info
    finally:
        info["exit_code"] = stop_group(proc, 60)
        reader.join(5)
        logf.close()


def engine_env_seen(engine: str = "vllm") -> dict[str, str]:
    """The keep-alive variables (and vLLM's engine-core start method) the running engine's
    server process really has (/proc)."""
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        plain = f"--port {PLAIN_PORT}" in cmd  # the default `vllm serve` has no such env
        if engine == "sglang":
            server = "sglang.launch_server" in cmd
        else:
            server = "vllm.entrypoints.cli.main" in cmd and " serve " in f" {cmd} "
        if server and not plain:
            with contextlib.suppress(psutil.Error):
                env = p.environ()
                return {
                    k: v
                    for k, v in env.items()
                    if "KEEP_ALIVE" in k or k == "VLLM_WORKER_MULTIPROC_METHOD"
                }
    return {}


class CpuSampler(threading.Thread):
    """Per-role CPU % each second: vLLM API server, engine core, proxy, load clients."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()

    @staticmethod
    def role(p: Any) -> str | None:
        try:
            cmd = " ".join(p.cmdline())
            name = p.name()
            family = " ".join(" ".join(a.cmdline()) for a in p.parents())
        except Exception:
            return None
        # the plain `vllm serve` (PLAIN_PORT) and its children: "plain_" roles
        prefix = "plain_" if f"--port {PLAIN_PORT}" in f"{cmd} {family}" else ""
        if "serving.proxy" in f"{cmd} {family}":  # with --workers: the workers too
            return "proxy_1w" if f"--port {ONE_WORKER_PROXY_PORT}" in f"{cmd} {family}" else "proxy"
        if "bench.gpu.load" in cmd:
            return "client"
        if "EngineCore" in name or "EngineCore" in cmd:
            return prefix + "engine_core"
        if "vllm.entrypoints" in cmd or "APIServer" in name or "APIServer" in cmd:
            return prefix + "vllm_api"
        # SGLang's processes (setproctitle "sglang::scheduler", "sglang::detokenizer"; the
        # launch_server process runs the HTTP server and the tokenizer manager)
        if "sglang::scheduler" in f"{name} {cmd}":
            return prefix + "sglang_scheduler"
        if "sglang::detokenizer" in f"{name} {cmd}":
            return prefix + "sglang_detokenizer"
        if "sglang.launch_server" in cmd:
            return prefix + "sglang_api"
        if "sglang.launch_server" in family:  # e.g. --tokenizer-worker-num's HTTP workers
            return prefix + "sglang_child"
        return None

    @staticmethod
    def engine_connections(seen: dict[int, tuple[str, Any]]) -> dict[str, list[int]]:
        """Per engine HTTP-server process (vLLM's API servers, SGLang's tokenizer workers):
        its established connections on the engine port, largest first. Several processes
        share one listening socket, so which process serves a connection is decided once, at
        accept: a pool's long-lived connections keep that split, fresh clients re-roll it."""
        import psutil

        port = device.ENGINE_PORT
        counts: dict[str, list[int]] = {}
        for role, p in seen.values():
            if role not in ("vllm_api", "sglang_api", "sglang_child"):
                continue
            try:
                n = sum(
                    1
                    for c in p.net_connections(kind="tcp")
                    if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
                )
            except psutil.Error:
                continue
            counts.setdefault(f"{role}_conns", []).append(n)
        return {k: sorted(v, reverse=True) for k, v in counts.items()}

    def run(self) -> None:
        import psutil

        seen: dict[int, tuple[str, Any]] = {}
        with self.path.open("w") as f:
            while not self.stop.wait(1.0):
                for p in psutil.process_iter():
                    if p.pid not in seen and (role := self.role(p)) is not None:
                        seen[p.pid] = (role, p)
                        with contextlib.suppress(psutil.Error):
                            p.cpu_percent(None)
                total: dict[str, float] = {}
                for pid, (role, p) in list(seen.items()):
                    try:
                        total[role] = total.get(role, 0.0) + p.cpu_percent(None)
                        # CPU seconds so far of the role's live processes (per round: cpu_by_round)
                        times = p.cpu_times()
                        used = f"{role}_cpu_s"
                        total[used] = round(total.get(used, 0.0) + times.user + times.system, 2)
                        rss = f"{role}_rss_mib"  # resident memory, for the memory request
                        total[rss] = round(total.get(rss, 0.0) + p.memory_info().rss / 2**20)
                    except psutil.Error:
                        seen.pop(pid)
                conns = self.engine_connections(seen)
                f.write(json.dumps({"t": round(time.time(), 1), **total, **conns}) + "\n")
                f.flush()


def run_checks(out: Path, log: Log, engine: str = "vllm", select: str = "") -> dict[str, Any]:
    """pytest on the GPU tests of one engine, through serving.engine and the proxy: vLLM's
    (tests/gpu; the SGLang ones skip without GPU_ENGINE=sglang) or SGLang 0.5.15's."""
    t = time.monotonic()
    env = {**device.run_env(engine), "GPU_RESULTS": str(out)}
    tests, report = ["tests/gpu"], out / "pytest.txt"
    if engine == "sglang":
        env[device.ENGINE_SELECT_ENV] = "sglang"
        tests, report = SGLANG_TESTS, out / "pytest-sglang.txt"
    cmd = [
        sys.executable, "-m", "pytest", *tests, "-v", "-rA", "-p", "no:cacheprovider",
        "--confcutdir", "tests/gpu", "-o", "addopts=--strict-markers",
    ]  # fmt: skip
    if select:
        cmd += ["-k", select]
    with report.open("w") as f:
        done = subprocess.run(
            cmd, cwd=device.ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=900
        )
    text = report.read_text()
    summary = [ln for ln in text.splitlines() if re.match(r"^(PASSED|FAILED|SKIPPED|ERROR) ", ln)]
    tail = text.strip().splitlines()[-1:] or [""]
    log(f"pytest ({engine}) rc={done.returncode} in {time.monotonic() - t:.0f} s: {tail[0]}")
    for line in summary:
        log("  " + line[:200])
    return {"rc": done.returncode, "seconds": round(time.monotonic() - t, 1), "summary": summary}


# the embeddings file first: its own start needs the card before `served_sglang` takes it
SGLANG_TESTS = [
    "tests/gpu/test_sglang_embeddings.py",
    "tests/gpu/test_sglang_serving.py",
    "tests/gpu/test_sglang_bad_flags.py",
]


PLAIN_PORT = 8002
# Both engines stay on the card through the bench so that their rounds can interleave: each
# may take this share of its memory (a 1B-shaped model at 2048 tokens needs ~2.3 GiB of
# weights; ~30 GiB of KV cache each is ~900k tokens, far above 1024 streams x ~100 tokens).
SHARED_MEMORY_FRACTION = 0.42


def plain_command() -> list[str]:
    """A default `vllm serve MODEL --max-model-len 2048`: only the port, the served name (so
    that one request body fits every target) and the memory share (both engines on one card)
    added."""
    return [
        str(device.BIN / "vllm"), "serve", str(device.WEIGHTS_ROOT / device.WEIGHTS_PATH),
        "--max-model-len", str(device.CONTEXT_LENGTH),
        "--served-model-name", device.SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(PLAIN_PORT),
        "--gpu-memory-utilization", str(SHARED_MEMORY_FRACTION),
    ]  # fmt: skip


def plain_sglang_command() -> list[str]:
    """A default SGLang launch: as plain_command, plus this machine's backends
    (device.SGLANG_EXTRA_ARGS: what does not travel here, not a tuning)."""
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(device.WEIGHTS_ROOT / device.WEIGHTS_PATH),
        "--context-length", str(device.CONTEXT_LENGTH),
        "--served-model-name", device.SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(PLAIN_PORT),
        "--mem-fraction-static", str(SHARED_MEMORY_FRACTION),
        *device.SGLANG_EXTRA_ARGS,
    ]  # fmt: skip


def wait_http_ok(
    proc: subprocess.Popen[Any], url: str, timeout_s: float, what: str, log_path: Path
) -> float:
    """Poll `url` until it answers 200; seconds it took. RuntimeError if `proc` exits first or
    `timeout_s` passes (naming `what` and its log)."""
    import urllib.request

    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}; see {log_path}")
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{what} not answering {url} after {timeout_s:g} s; see {log_path}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return round(time.monotonic() - t0, 1)
        time.sleep(0.5)


def stop_group(proc: subprocess.Popen[Any], grace_s: float) -> int | None:
    """SIGTERM to the process group, SIGKILL after `grace_s`; the exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    return proc.returncode


@contextlib.contextmanager
def plain_engine(log_path: Path, log: Log, engine: str = "vllm") -> Iterator[dict[str, Any]]:
    """The plain `vllm serve` (or SGLang launch) until its /health answers 200; stopped
    (SIGTERM) on exit."""
    cmd = plain_command() if engine == "vllm" else plain_sglang_command()
    info: dict[str, Any] = {"argv": cmd}
    with log_path.open("w") as logf:
        proc = subprocess.Popen(
            cmd, cwd="/tmp", env=device.run_env(engine), stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=pinned("server"),
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{PLAIN_PORT}/health"
            info["ready_s"] = wait_http_ok(proc, url, 600, f"plain {engine}", log_path)
            log(f"plain {engine} healthy after {info['ready_s']} s")
            yield info
        finally:
            info["exit_code"] = stop_group(proc, 60)


def bench_proxy(workers: int | None = None) -> dict[str, Any]:
    """The proxy's settings in a bench: its cap above the bench's 1024 streams (the default,
    256, answers 429 beyond it), and `workers` processes if given (else the spec's default)."""
    proxy: dict[str, Any] = {"max_in_flight": 4096}
    if workers is not None:
        proxy["workers"] = workers
    return proxy


def bench_spec(plain: bool, proxy_workers: int | None = None) -> dict[str, Any]:
    """The shipped spec (its derived --api-server-count included) as the bench serves it: the
    proxy's cap above the bench's 1024 streams (bench_proxy), the card shared with the plain
    engine if there is one."""
    spec = {**device.spec_dict(), "proxy": bench_proxy(proxy_workers)}
    if plain:
        spec["gpu_memory_fraction"] = SHARED_MEMORY_FRACTION
    return spec


def cpu_by_round(cpu_path: Path, bench_path: Path) -> list[dict[str, Any]]:
    """Each counted round's CPU use per long-lived role (% of one core over the round), from
    the sampler's cumulative CPU seconds at the samples just before and after the round.
    The load clients' processes live one round each, so their seconds are not summed here."""
    samples = [json.loads(line) for line in cpu_path.read_text().splitlines() if line.strip()]
    rows: list[dict[str, Any]] = []
    for row in json.loads(bench_path.read_text())["rows"]:
        for i, rnd in enumerate(row.get("rounds", [])):
            start, end = rnd["start"], rnd["start"] + rnd["wall_s"]
            before = [s for s in samples if s["t"] <= start]
            after = [s for s in samples if s["t"] >= end]
            if not before or not after:
                continue
            a, b = before[-1], after[0]
            span = b["t"] - a["t"]
            use = {
                k[: -len("_cpu_s")]: round((b[k] - a.get(k, 0.0)) / span * 100, 1)
                for k in b
                if k.endswith("_cpu_s") and not k.startswith("client") and span > 0
            }
            middle = min(samples, key=lambda s: abs(s["t"] - (start + end) / 2))
            conns = {k: v for k, v in middle.items() if k.endswith("_conns")}
            rows.append(
                {"streams": row["concurrency"], "target": row["target"], "round": i,
                 "tok_per_s": rnd["tok_per_s"], "span_s": round(span, 1), **use, **conns}
            )  # fmt: skip
    return rows


def _cell(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else f"{value:.0f}"


def cpu_table(rows: list[dict[str, Any]]) -> str:
    roles = sorted({k for r in rows for k in r} - {"streams", "target", "round", "tok_per_s",
                                                   "span_s"})  # fmt: skip
    lines = ["| streams | target | round | tokens/s | samples s | " + " | ".join(roles) + " |"]
    lines.append("|---" * (5 + len(roles)) + "|")
    for r in rows:
        cells = [str(r["streams"]), r["target"], str(r["round"]), f"{r['tok_per_s']:.0f}",
                 str(r["span_s"]), *(_cell(r.get(k, 0.0)) for k in roles)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


ONE_WORKER_PROXY_PORT = 8003


@contextlib.contextmanager
def one_worker_proxy(spec: dict[str, Any], log_path: Path, log: Log) -> Iterator[dict[str, Any]]:
    """A second auth proxy in front of the same engine, as serving.engine starts it but with
    one process (`--workers 1`): the baseline for the spec's `proxy_workers`, same run."""
    sys.path[:0] = [str(device.ROOT), str(device.SITE)]
    from serving.render import proxy_command
    from serving.spec import ServingSpec

    cmd = proxy_command(ServingSpec.model_validate(spec), port=ONE_WORKER_PROXY_PORT)
    if "--workers" in cmd:
        at = cmd.index("--workers")
        del cmd[at : at + 2]
    info: dict[str, Any] = {"argv": cmd}
    with log_path.open("w") as logf:
        proc = subprocess.Popen(
            cmd, cwd=device.ROOT, env=device.run_env(), stdout=logf, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=pinned("server"),
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{ONE_WORKER_PROXY_PORT}/ready"
            wait_http_ok(proc, url, 60, "the one-process proxy", log_path)
            log(f"one-process proxy on :{ONE_WORKER_PROXY_PORT}: {' '.join(cmd[3:])}")
            yield info
        finally:
            info["exit_code"] = stop_group(proc, 40)


def run_bench(
    out: Path,
    log: Log,
    plan: str,
    plain: bool,
    one_worker: bool = False,
    proxy_workers: int | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"proxy_idle": proxy_idle_setting(), "plan": plan}
    log(f"proxy pool idle lifetime: {result['proxy_idle']}")
    sampler = CpuSampler(out / "cpu.jsonl")
    with contextlib.ExitStack() as stack:
        if plain:  # first, alone: vLLM profiles the card's free memory while it starts
            result["plain"] = stack.enter_context(plain_engine(out / "plain-engine.log", log))
        spec = bench_spec(plain, proxy_workers)
        info = stack.enter_context(serving(spec, out / "bench-engine.log", log))
        result["engine"] = info
        log(f"engine keep-alive env seen in the vLLM process: {info['engine_keepalive_env']}")
        cmd = load_cmd(out / "bench.json", plan)
        if one_worker:
            result["one_worker_proxy"] = stack.enter_context(
                one_worker_proxy(spec, out / "proxy-1w.log", log)
            )
            cmd += ["--proxy-target", f"proxy-1w=http://127.0.0.1:{ONE_WORKER_PROXY_PORT}"]
        sampler.start()
        if plain:
            cmd += ["--plain", f"http://127.0.0.1:{PLAIN_PORT}"]
        try:
            load = run_load(cmd, log)
        finally:
            sampler.stop.set()
        result.update(load_rc=load["rc"], load_s=load["seconds"], table=load["table"])
    add_cpu_by_round(result, out / "cpu.jsonl", out / "bench.json", log)
    return result


def add_cpu_by_round(result: dict[str, Any], cpu: Path, bench: Path, log: Log) -> None:
    """% of one core per role in each counted round (cpu_by_round), into the result and log."""
    try:
        rows = cpu_by_round(cpu, bench)
    except (OSError, ValueError, KeyError) as exc:
        log(f"CPU by round: not computed ({type(exc).__name__}: {exc})")
        return
    result["cpu_by_round"] = rows
    log("CPU by round (% of one core, between the samples around each round):\n" + cpu_table(rows))


# serving/spec.py ENGINE_CACHE_PATHS["vllm"]: the engine-cache Volume's mount, where the spec
# points VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and CUDA_CACHE_PATH.
# (Not imported: this runner runs on the image's python without the payload on its path.)
ENGINE_CACHE = Path("/root/.cache/vllm")
# vLLM 0.26.0's own start-up lines, each a phase of the cold start (seconds in the line, as
# 0.26.0 words them: "torch.compile took 17.16 s in total", "init engine (profile, create kv
# cache, warmup model) took 38.38 s (compilation: 17.16 s)").
PHASE_LINES = {
    "weights_load_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB and ([\d.]+) seconds"),
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "cuda_graphs_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine .* took ([\d.]+) s"),
}
# When each step happened, seconds after the launch: vLLM's API server parsed its arguments
# (its imports done), resolved the model's architecture (a subprocess inspects the model
# unless VLLM_CACHE_ROOT/modelinfos has it), its engine-core process started (imports again),
# torch.compile finished, CUDA graphs were captured, the engine was initialised (kernel JIT
# warm-up included), the server listens; then our own lines (serving.engine).
MILESTONES = {
    "seeded_at_s": "model-inspection files:",
    "api_args_at_s": "non-default args",
    "architecture_at_s": "Resolved architecture",
    "engine_core_at_s": "Initializing a V1 LLM engine",
    "compiled_at_s": "torch.compile took",
    "graphs_at_s": "Graph capturing finished",
    "engine_ready_at_s": "init engine",
    "server_at_s": "Starting vLLM server",
    "health_at_s": "healthy after",
    "warmup_at_s": "warm-up done",
    "ready_at_s": "SERVING READY",
}


def phases(lines: list[tuple[float, str]]) -> dict[str, float]:
    """Each phase's seconds (vLLM's own figures) and our milestones, from the start lines."""
    found: dict[str, float] = {}
    for stamp, line in lines:
        for name, pattern in PHASE_LINES.items():
            m = pattern.search(line)
            if m and name not in found:
                found[name] = float(m.group(1))
        for name, text in MILESTONES.items():
            if text in line and name not in found:
                found[name] = stamp
    return found


def first_token_s(key: str, port: int = 8000, max_tokens: int = 16) -> float:
    """Send -> first content chunk of one streamed chat through the proxy."""
    import httpx

    payload = {
        "model": device.SERVED_NAME,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    t = time.perf_counter()
    with httpx.stream(
        "POST",
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content":"' in line.replace(" ", ""):
                return round(time.perf_counter() - t, 4)
    raise RuntimeError("the stream ended without content")


def drop_page_cache(root: Path) -> float:
    """Evict root's files from the page cache (posix_fadvise DONTNEED: clean pages, no root
    needed), so that a start reads the weights from disk as a new container reads its Volume,
    not from the memory the last start (or mkmodel's write) left them in. MiB asked to drop."""
    total = 0
    for f in sorted(root.rglob("*")):
        if f.is_file() and not f.is_symlink():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return round(total / 2**20, 1)


def model_shape() -> dict[str, Any]:
    """What model the run served: mkmodel's config (dimensions) and the weights' size."""
    try:
        cfg = json.loads((device.MODEL_DIR / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads")
    size = sum(f.stat().st_size for f in device.MODEL_DIR.glob("*.safetensors"))
    return {**{k: cfg.get(k) for k in keys}, "weights_gib": round(size / 2**30, 2)}


@contextlib.contextmanager
def start_method(method: str) -> Iterator[None]:
    """vLLM's engine-core (and TP worker) start method for the starts inside: the `vllm`
    wrapper reads MP_METHOD_ENV ("default": unset, as the spec sets it). Unset on the way out."""
    if method == "default":
        os.environ.pop(MP_METHOD_ENV, None)
    else:
        os.environ[MP_METHOD_ENV] = method
    try:
        yield
    finally:
        os.environ.pop(MP_METHOD_ENV, None)


def run_coldstart(out: Path, log: Log, methods: list[str]) -> dict[str, Any]:
    """Issue 24 item 6: the same snapshot spec started twice per start method of vLLM's
    engine core (MP_METHOD_ENV; "default": as the spec sets it), first with an empty
    engine cache (cold: what a new engine-cache Volume gives), then with the cache the first
    start left (warm: the Volume kept from the previous container); the weights evicted from
    the page cache before each start; then sleep/wake -> first token."""
    import httpx

    result: dict[str, Any] = {"engine_cache": str(ENGINE_CACHE), "methods": methods}
    spec = device.spec_dict(snapshot=True)
    for method in methods:
        shutil.rmtree(ENGINE_CACHE, ignore_errors=True)
        for label in ("cold", "warm"):
            name = label if method == "default" else f"{label}-{method}"
            dropped = drop_page_cache(device.MODEL_DIR)
            with start_method(method), serving(spec, out / f"coldstart-{name}.log", log) as info:
                row = {"ready_s": info["ready_s"], "page_cache_dropped_mib": dropped}
                row.update(phases(info["start_lines"]))
                row["first_token_s"] = first_token_s(device.API_KEY)
                if label == "warm":
                    wakes = []
                    for _ in range(3):
                        r = httpx.post("http://127.0.0.1:8001/sleep?level=1", timeout=120)
                        r.raise_for_status()
                        t = time.perf_counter()
                        httpx.post("http://127.0.0.1:8001/wake_up", timeout=120).raise_for_status()
                        woke = time.perf_counter() - t
                        wakes.append(
                            {
                                "wake_s": round(woke, 3),
                                "to_first_token_s": round(woke + first_token_s(device.API_KEY), 3),
                            }
                        )
                    row["wake"] = wakes
            files = [f for f in ENGINE_CACHE.rglob("*") if f.is_file()]
            row["cache_mib_after"] = round(sum(f.stat().st_size for f in files) / 2**20, 1)
            result[name] = row
            log(f"coldstart {name}: {row}")
        suffix = "" if method == "default" else f"-{method}"
        cold, warm = result[f"cold{suffix}"], result[f"warm{suffix}"]
        if cold.get("ready_at_s") and warm.get("ready_at_s"):
            result[f"warm_vs_cold{suffix}"] = round(warm["ready_at_s"] / cold["ready_at_s"], 3)
    return result


# `run --phases coldstart --coldstart-plan cold,warm,cold+graphs,...` (issue 36): each step one
# start of the snapshot spec (the engine core as the spec starts it), the weights evicted from
# the page cache before it. The step's cache: "cold" an empty engine cache; "warm" what the
# last start of the same variant left (a variant's torch.compile cache is its own: the
# CUDA-graph sizes are part of vLLM's compile hash); "baked" an empty cache holding only the
# model-inspection files that serving/bake.py made beforehand, as the image build does, copied
# in by serving.engine itself (serving/bake.py seed_modelinfos). Its levers,
# each on its own: "graphs" (the spec's `cudagraph_sizes: max_concurrency`), "prefetch" (the
# weights read into the page cache from the launch on, while Python imports: WeightsPrefetch).
PLAN_CACHES = ("cold", "warm", "baked")
PLAN_LEVERS = ("graphs", "prefetch")
STASH = Path("/root/.cache/vllm-stash")  # each variant's engine cache between its starts
BAKED = Path("/tmp/baked-vllm-cache")  # VLLM_CACHE_ROOT of the bake step (modelinfos/)
BAKE_ALL_TIMEOUT_S = 150  # every architecture; past this only the served one is baked
# What a step may take (s), so that a call stops before its limit: an 8B-shaped start on one
# H100 took 114-140 s from an empty cache and 52-75 s with a kept one (runs P, S).
STEP_ESTIMATE_S = {"cold": 150, "baked": 130, "warm": 80}


def parse_plan(text: str) -> list[tuple[str, frozenset[str]]]:
    """ "cold,warm+graphs" -> [("cold", {}), ("warm", {"graphs"})]; ValueError if unknown."""
    steps = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        cache, *levers = item.split("+")
        if cache not in PLAN_CACHES or not set(levers) <= set(PLAN_LEVERS):
            raise ValueError(
                f"{item!r}: a step is one of {', '.join(PLAN_CACHES)}, then optionally "
                f"+{' +'.join(PLAN_LEVERS)}"
            )
        steps.append((cache, frozenset(levers)))
    return steps


def bake_modelinfo(log: Log) -> dict[str, Any]:
    """The image build's step (serving/bake.py, its bytecode part left out: prepare did that)
    into BAKED: every architecture vLLM registers, in one process; if that does not end within
    BAKE_ALL_TIMEOUT_S or leaves the served architecture out, the served one alone."""
    arch = json.loads((device.MODEL_DIR / "config.json").read_text())["architectures"][0]
    # run as the image runs it: a lone file (its folder first on sys.path, not serving/'s)
    script = Path("/tmp/bake-script/bake.py")
    script.parent.mkdir(exist_ok=True)
    shutil.copyfile(device.ROOT / "serving" / "bake.py", script)
    found: dict[str, Any] = {"arch": arch}
    tries: list[tuple[str, list[str], float]] = [
        ("all", [], BAKE_ALL_TIMEOUT_S),
        ("served", ["--arch", arch], 300),
    ]
    for label, extra, timeout in tries:
        shutil.rmtree(BAKED, ignore_errors=True)
        cmd = [sys.executable, str(script), "--no-bytecode", "--vllm-cache", str(BAKED), *extra]
        t = time.monotonic()
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=device.run_env()
            )
            said, rc = (done.stdout + done.stderr)[-1500:], done.returncode
        except subprocess.TimeoutExpired:
            said, rc = f"not done within {timeout} s", -1
        files = sorted(f.name for f in (BAKED / "modelinfos").glob("*.json"))
        found[label] = {"rc": rc, "seconds": round(time.monotonic() - t, 1), "files": len(files),
                        "said": said}  # fmt: skip
        log(f"bake modelinfo ({label}): rc {rc} in {found[label]['seconds']} s, {len(files)} files")
        if rc == 0 and any(f.endswith(f"-{arch}.json") for f in files):
            break
    return found


def run_coldstart_plan(
    out: Path, log: Log, plan: str, budget_s: float, cli_timing: bool = True
) -> dict[str, Any]:
    """Issue 36: the steps of `plan` (parse_plan) in order, each a start of the snapshot spec
    through serving.engine; stops before a step that would not end within budget_s of the
    phase's start. The engines' logs go to $OUT/coldstart-logs.tar.gz."""
    from serving import bake

    t_phase = time.monotonic()
    steps = parse_plan(plan)
    env = device.run_env()
    result: dict[str, Any] = {"plan": plan, "engine_cache": str(ENGINE_CACHE), "steps": []}
    if cli_timing:
        result["cli_to_args_s"] = time_cli_start(env)
        log(f"`vllm serve` to its argument parsing (library placed): {result['cli_to_args_s']}")
    if any(cache == "baked" for cache, _ in steps):
        result["bake"] = bake_modelinfo(log)
    logs = Path("/tmp/coldstart-logs")
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    seen: dict[str, int] = {}
    for cache, levers in steps:
        label = "+".join([cache, *sorted(levers)])
        seen[label] = seen.get(label, 0) + 1
        name = f"{label}-{seen[label]}"
        left = budget_s - (time.monotonic() - t_phase)
        if left < STEP_ESTIMATE_S[cache]:
            log(f"coldstart {name}: skipped, {left:.0f} s of the budget left")
            result["steps"].append({"step": name, "skipped": f"{left:.0f} s left"})
            continue
        variant = "graphs" if "graphs" in levers else "base"
        shutil.rmtree(ENGINE_CACHE, ignore_errors=True)
        stash = STASH / variant
        cache_had = "empty"
        if cache == "warm" and stash.exists():
            ENGINE_CACHE.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(stash, ENGINE_CACHE)
            cache_had = "kept"
        # what the image holds (serving/bake.py BAKED_VLLM_CACHE): the bake's files for the
        # baked steps, nothing for the others; serving.engine copies them in itself.
        shutil.rmtree(bake.BAKED_VLLM_CACHE, ignore_errors=True)
        if cache == "baked" and (BAKED / "modelinfos").exists():
            shutil.copytree(BAKED, bake.BAKED_VLLM_CACHE)
            cache_had = "empty, modelinfos baked"
        spec = device.spec_dict(snapshot=True)
        if "graphs" in levers:
            spec["cudagraph_sizes"] = "max_concurrency"
        dropped = drop_page_cache(device.MODEL_DIR)
        # serving.engine prefetches the weights itself (serving/prefetch.py); off for the
        # steps without the lever, so that each phase is measured with and without it.
        env_extra = {} if "prefetch" in levers else {"SERVING_WEIGHTS_PREFETCH": "0"}
        row: dict[str, Any] = {"step": name, "cache": cache_had, "levers": sorted(levers)}
        row["page_cache_dropped_mib"] = dropped
        with serving(spec, logs / f"{name}.log", log, env_extra) as info:
            row["ready_s"] = info["ready_s"]
            row.update(phases(info["start_lines"]))
            row["graph_sizes"] = graph_sizes(info["start_lines"])
            row["first_token_s"] = first_token_s(device.API_KEY)
            if "prefetch" in levers:
                row["prefetch"] = {"done_at_s": prefetch_done_at(info["start_lines"])}
            if cache == "warm" and not levers:
                row["wake"] = [timed_wake(split) for split in (False, False, True, True)]
            row["start_lines"] = info["start_lines"]
        files = [f for f in ENGINE_CACHE.rglob("*") if f.is_file()]
        row["cache_mib_after"] = round(sum(f.stat().st_size for f in files) / 2**20, 1)
        shutil.rmtree(stash, ignore_errors=True)
        stash.parent.mkdir(parents=True, exist_ok=True)
        if ENGINE_CACHE.exists():
            shutil.move(ENGINE_CACHE, stash)
        result["steps"].append(row)
        shown = {k: v for k, v in row.items() if k != "start_lines"}
        log(f"coldstart {name}: {json.dumps(shown)}")
    with tarfile.open(out / "coldstart-logs.tar.gz", "w:gz") as tar:
        tar.add(logs, arcname="coldstart-logs")
    result["table"] = plan_table(result["steps"])
    return result


# What a wake waits on (issue 36 (d)): vLLM 0.26.0's /wake_up takes `tags`
# (entrypoints/serve/dev/sleep/api_router.py); its allocator maps each allocation of a tag again
# and copies what sleep level 1 offloaded to pinned host memory back (device_allocator/cumem.py
# `wake_up`): the weights (~15 GiB for the 8B shape) are copied, the KV cache (~112 GiB on an
# H200) only mapped, then its layout is rebuilt (v1/worker/gpu_worker.py `wake_up`).
WAKE_TAGS = ("weights", "kv_cache")


def timed_wake(split: bool) -> dict[str, float]:
    """Sleep (level 1), wake, stream the first token through the proxy; `split` wakes each
    of WAKE_TAGS in turn and times each."""
    import httpx

    engine = f"http://127.0.0.1:{device.ENGINE_PORT}"
    httpx.post(f"{engine}/sleep?level=1", timeout=120).raise_for_status()
    found: dict[str, float] = {}
    t = time.perf_counter()
    for tag in WAKE_TAGS if split else (None,):
        t_tag = time.perf_counter()
        query = f"?tags={tag}" if tag else ""
        httpx.post(f"{engine}/wake_up{query}", timeout=120).raise_for_status()
        if tag:
            found[f"{tag}_s"] = round(time.perf_counter() - t_tag, 3)
    woke = time.perf_counter() - t
    found["wake_s"] = round(woke, 3)
    found["to_first_token_s"] = round(woke + first_token_s(device.API_KEY), 3)
    return found


def prefetch_done_at(lines: list[tuple[float, str]]) -> float | None:
    """When serving.engine's weights prefetch said it was done (s after the launch)."""
    return next((t for t, line in lines if "weights prefetch: done" in line), None)


def graph_sizes(lines: list[tuple[float, str]]) -> list[int]:
    """How many CUDA graphs each capture pass took (vLLM's progress bars: "n/N")."""
    found: dict[str, int] = {}
    for _, line in lines:
        if "Capturing CUDA graphs" in line:
            m = re.search(r"Capturing CUDA graphs \(([^)]*)\).*?(\d+)/(\d+)", line)
            if m:
                found[m.group(1)] = int(m.group(3))
    return list(found.values())


PLAN_COLUMNS = [
    ("step", "step"), ("cache", "cache"), ("args", "api_args_at_s"),
    ("arch", "architecture_at_s"), ("core", "engine_core_at_s"), ("weights s", "weights_load_s"),
    ("compile s", "torch_compile_s"), ("graphs s", "cuda_graphs_s"),
    ("graphs at", "graphs_at_s"), ("engine", "engine_ready_at_s"), ("READY", "ready_at_s"),
]  # fmt: skip


def _plan_cell(value: Any) -> str:
    return "" if value is None else str(value)


def plan_table(steps: list[dict[str, Any]]) -> str:
    head = [c for c, _ in PLAN_COLUMNS] + ["sizes", "prefetch done"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in steps:
        if "skipped" in r:
            rows.append(f"| {r['step']} | skipped ({r['skipped']}) |")
            continue
        cells = [_plan_cell(r.get(k)) for _, k in PLAN_COLUMNS]
        prefetched = (r.get("prefetch") or {}).get("done_at_s")
        cells += [_plan_cell(r.get("graph_sizes")), _plan_cell(prefetched)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def run_start(out: Path, log: Log) -> dict[str, Any]:
    """The shipped spec (its derived API-server count, the engine core as the spec starts it)
    started once, with the engine cache as the last start left it, phase by phase; then one
    streamed answer through the proxy."""
    spec = device.spec_dict()
    with serving(spec, out / "start.log", log) as info:
        row = {"ready_s": info["ready_s"], **phases(info["start_lines"])}
        row["engine_env"] = info["engine_keepalive_env"]
        row["first_token_s"] = first_token_s(device.API_KEY)
    log(f"start: {row}")
    return row


def gpu_memory() -> list[int]:
    text = sh(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    return [int(x) for x in text.split()]


def load_cmd(out_file: Path, plan: str, prompt_tokens: int = 0) -> list[str]:
    cmd = [
        sys.executable, "-m", "bench.gpu.load", "--key", device.API_KEY,
        "--model", device.SERVED_NAME, "--plan", plan, "--out", str(out_file),
    ]  # fmt: skip
    if prompt_tokens:
        cmd += ["--prompt-tokens", str(prompt_tokens)]
    return cmd


def run_load(cmd: list[str], log: Log) -> dict[str, Any]:
    t = time.monotonic()
    done = subprocess.run(
        cmd, cwd=device.ROOT, env=device.run_env(), capture_output=True, text=True,
        preexec_fn=pinned("client"),
    )  # fmt: skip
    if done.returncode:
        log(f"load failed: {done.stderr[-1500:]}")
    table = done.stdout[done.stdout.find("| streams") :]
    log(table)
    return {
        "rc": done.returncode,
        "seconds": round(time.monotonic() - t, 1),
        "table": table,
        "stdout_head": done.stdout[:300],
    }


def run_tp(out: Path, log: Log, plan: str, methods: list[str]) -> dict[str, Any]:
    """Issue 24 item 7: `gpu_count: 2` (tensor parallel over both cards) through serving.engine
    and the proxy: it starts, both cards hold a share, it answers, and a short load. Once per
    start method of vLLM's engine core and its workers (MP_METHOD_ENV; "default": as the spec
    sets it: fork since run Z), each from an empty engine cache (cold), so that the
    starts differ only in the method."""
    n = len(gpu_memory())
    if n < 2:
        return {"skipped": f"{n} GPU on this machine; tensor parallel needs 2 (nvidia-h100-x2)"}
    spec = {**device.spec_dict(), "gpu_count": 2}
    result: dict[str, Any] = {"methods": methods}
    for method in methods:
        shutil.rmtree(ENGINE_CACHE, ignore_errors=True)
        name = "" if method == "default" else f"-{method}"
        dropped = drop_page_cache(device.MODEL_DIR)
        with start_method(method), serving(spec, out / f"tp-engine{name}.log", log) as info:
            row: dict[str, Any] = {"ready_s": info["ready_s"], **phases(info["start_lines"])}
            row["page_cache_dropped_mib"] = dropped
            row["engine_env"] = info["engine_keepalive_env"]
            row["gpu_memory_mib"] = gpu_memory()
            row["first_token_s"] = first_token_s(device.API_KEY)
            row["load"] = run_load(load_cmd(out / f"tp-bench{name}.json", plan), log)
        log(f"tp {method}: { {k: v for k, v in row.items() if k != 'load'} }")
        result[method] = row
    return result


def run_long(out: Path, log: Log, plan: str, prompt_tokens: int) -> dict[str, Any]:
    """Issue 24 item 4's long prompts: ~8k-token prompts, unique per request, direct vs proxy."""
    # The model's max_position_embeddings is 8192 (bench.gpu.mkmodel copies Llama-3.2-1B's
    # shape with 8192 positions); vLLM refuses a longer max_model_len.
    spec = {**device.spec_dict(), "context_length": 8192}
    with serving(spec, out / "long-engine.log", log) as info:
        result: dict[str, Any] = {"ready_s": info["ready_s"]}
        result["load"] = run_load(load_cmd(out / "long-bench.json", plan, prompt_tokens), log)
    return result


def sglang_bench_spec(
    plain: bool, workers: int | None = None, proxy_workers: int | None = None
) -> dict[str, Any]:
    """The SGLang spec as its bench serves it: `workers` tokenizer workers if given, the
    proxy's cap above the bench's 1024 streams (bench_proxy: run X, without it, got 429 for
    2757 of 4096 requests at 1024 streams), the card shared with a plain launch if there is
    one."""
    spec = device.sglang_spec_dict()
    if workers is not None:
        spec["api_server_count"] = workers
    spec["proxy"] = bench_proxy(proxy_workers)
    if plain:
        spec["gpu_memory_fraction"] = SHARED_MEMORY_FRACTION
    return spec


def run_sglang_bench(
    out: Path,
    log: Log,
    plan: str,
    plain: bool = False,
    workers: int | None = None,
    proxy_workers: int | None = None,
    one_worker: bool = False,
) -> dict[str, Any]:
    """SGLang 0.5.15 with the shipped SGLang defaults (+ this machine's backends; `workers`:
    api_server_count, i.e. --tokenizer-worker-num) through serving.engine, then bench.gpu.load
    direct (:8001) vs proxy (:8000), and a default SGLang launch (`plain`) or a one-process
    proxy (`one_worker`, :8003), interleaved."""
    result: dict[str, Any] = {"proxy_idle": proxy_idle_setting(), "plan": plan}
    sampler = CpuSampler(out / "cpu.jsonl")
    spec = sglang_bench_spec(plain, workers, proxy_workers)
    with contextlib.ExitStack() as stack:
        if plain:  # first, alone, as for vLLM (run_bench)
            result["plain"] = stack.enter_context(
                plain_engine(out / "plain-engine.log", log, "sglang")
            )
        info = stack.enter_context(serving(spec, out / "sglang-bench-engine.log", log))
        result["engine"] = info
        log(f"engine keep-alive env seen in the SGLang process: {info['engine_keepalive_env']}")
        cmd = load_cmd(out / "sglang-bench.json", plan)
        if one_worker:
            result["one_worker_proxy"] = stack.enter_context(
                one_worker_proxy(spec, out / "proxy-1w.log", log)
            )
            cmd += ["--proxy-target", f"proxy-1w=http://127.0.0.1:{ONE_WORKER_PROXY_PORT}"]
        sampler.start()
        if plain:
            cmd += ["--plain", f"http://127.0.0.1:{PLAIN_PORT}"]
        try:
            result["load"] = run_load(cmd, log)
        finally:
            sampler.stop.set()
    result["load_rc"] = result["load"]["rc"]
    result["table"] = result["load"]["table"]
    add_cpu_by_round(result, out / "cpu.jsonl", out / "sglang-bench.json", log)
    return result


VLLM_PHASES = {"checks", "bench", "tp", "coldstart", "long", "start"}
SGLANG_PHASES = {"sglang", "sglang-bench"}


def run(args: argparse.Namespace) -> int:
    out = out_dir()
    log = Log(out / "run.log")
    result: dict[str, Any] = {"card": card(), "date": time.strftime("%Y-%m-%d %H:%M UTC")}
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - VLLM_PHASES - SGLANG_PHASES
    if unknown:
        log(f"unknown phases {sorted(unknown)}; known: {sorted(VLLM_PHASES | SGLANG_PHASES)}")
        return 2
    methods = [m.strip() for m in args.start_methods.split(",") if m.strip()]
    if not methods or not set(methods) <= set(COLDSTART_METHODS):
        known = ", ".join(COLDSTART_METHODS)
        log(f"--start-methods {args.start_methods!r}: a comma list of {known}")
        return 2
    try:
        parse_plan(args.coldstart_plan)
    except ValueError as exc:
        log(f"--coldstart-plan: {exc}")
        return 2
    if phases & VLLM_PHASES:  # SGLang's phases need no vLLM kernel library
        place_library(log)
    engine = "vllm" if phases & VLLM_PHASES else "sglang"
    result["versions"] = versions(with_site=True, engine=engine)
    result["model"] = model_shape()
    log(f"card {result['card']}; versions {result['versions']}")
    CPU_SETS.update(server=parse_cpus(args.server_cpus), client=parse_cpus(args.client_cpus))
    result["cpu_sets"] = {k: sorted(v) if v else None for k, v in CPU_SETS.items()}
    rc = 0
    try:
        if "checks" in phases:
            result["checks"] = run_checks(out, log, select=args.checks_k)
            rc |= result["checks"]["rc"]
        if "bench" in phases:
            result["bench"] = run_bench(
                out, log, args.plan, args.plain, args.one_worker_proxy, args.proxy_workers
            )
            rc |= result["bench"]["load_rc"]
        if "tp" in phases:
            result["tp"] = run_tp(out, log, args.tp_plan, methods)
        if "start" in phases:
            result["start"] = run_start(out, log)
        if "coldstart" in phases and args.coldstart_plan:
            result["coldstart"] = run_coldstart_plan(
                out, log, args.coldstart_plan, args.budget_s, not args.skip_cli_timing
            )
        elif "coldstart" in phases:
            result["coldstart"] = run_coldstart(out, log, methods)
        if "long" in phases:
            result["long"] = run_long(out, log, args.long_plan, args.prompt_tokens)
        if "sglang" in phases:
            result["sglang"] = run_checks(out, log, "sglang", args.checks_k)
            rc |= result["sglang"]["rc"]
        if "sglang-bench" in phases:
            result["sglang_bench"] = run_sglang_bench(
                out, log, args.sglang_plan, args.plain, args.sglang_workers,
                args.proxy_workers, args.one_worker_proxy,
            )  # fmt: skip
            rc |= result["sglang_bench"]["load_rc"]
    except Exception as exc:  # what ran so far still comes back in run.json
        log(f"phase failed: {type(exc).__name__}: {exc}")
        result["error"] = f"{type(exc).__name__}: {exc}"
        rc |= 1
    finally:
        (out / "run.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    for key in ("bench", "sglang_bench", "coldstart"):
        if key in result and result[key].get("table"):
            print("\n" + result[key]["table"])
    return rc


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python3 -m bench.gpu.remote", description=__doc__)
    sub = cli.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="call 1: unpack, model, imports, flags")
    p.add_argument(
        "--shape",
        default="llama-1b",
        choices=sorted(SHAPES),
        help="the model's shape (bench.gpu.mkmodel SHAPES): 1B- or 8B-shaped random weights",
    )
    p.add_argument(
        "--skip-checks",
        action="store_true",
        help="leave out the imports probe and vLLM's parser on the spec's flags (~40 s)",
    )
    sub.add_parser(
        "prepare-sglang",
        help="after prepare: unpack SGLang 0.5.15's part, its imports, its parser on the flags",
    )
    r = sub.add_parser("run", help="call 2: place the library, checks and bench")
    r.add_argument(
        "--phases",
        default="checks,bench",
        help="comma list: checks, bench, tp (2 GPUs), coldstart (cold vs warm engine cache, wake),"
        " start (the shipped spec started once),"
        " long (long prompts); SGLang 0.5.15 (after prepare-sglang): sglang (its checks),"
        " sglang-bench",
    )
    r.add_argument(
        "--sglang-plan", default="1:2:8,32:2:64,256:2:512", help="load plan for sglang-bench"
    )
    r.add_argument("--tp-plan", default="1:2:8,32:2:128,256:2:512", help="load plan for tp")
    r.add_argument("--long-plan", default="1:2:4,32:2:64,256:1:256", help="load plan for long")
    r.add_argument("--prompt-tokens", type=int, default=7900, help="long: prompt tokens")
    r.add_argument("--plan", default="1:3:16,32:3:128,256:3:768", help="bench.gpu.load's plan")
    r.add_argument(
        "--plain",
        action="store_true",
        help="bench a default `vllm serve` / SGLang launch (PLAIN_PORT) too, interleaved with "
        "direct and proxy (bench, sglang-bench)",
    )
    r.add_argument(
        "--sglang-workers", type=int, help="sglang-bench: api_server_count (--tokenizer-worker-num)"
    )
    r.add_argument(
        "--one-worker-proxy",
        action="store_true",
        help="bench, sglang-bench: a second proxy with one process (:8003) beside the "
        "spec's, as a target",
    )
    r.add_argument(
        "--proxy-workers", type=int, help="bench, sglang-bench: the spec's proxy.workers"
    )
    r.add_argument(
        "--start-methods",
        "--coldstart-methods",
        dest="start_methods",
        default="default",
        help="coldstart, tp: comma list of how vLLM starts its engine core (and its workers): "
        "default (as the spec sets it: fork), spawn, fork; coldstart starts cold and warm per "
        "method, tp cold",
    )
    r.add_argument(
        "--coldstart-plan",
        default="",
        help="coldstart: steps instead of cold/warm per start method, e.g. "
        "cold,warm,cold+graphs,warm+graphs,warm+prefetch,baked (run_coldstart_plan)",
    )
    r.add_argument(
        "--budget-s",
        type=float,
        default=540,
        help="coldstart plan: skip a step that would not end within this many seconds",
    )
    r.add_argument(
        "--skip-cli-timing",
        action="store_true",
        help="coldstart plan: leave out timing `vllm serve` to its argument parsing (~40 s)",
    )
    r.add_argument("--checks-k", default="", help="checks, sglang: pytest -k expression")
    r.add_argument("--server-cpus", help="cores for the engine and the proxy, e.g. 0-7")
    r.add_argument("--client-cpus", help="cores for the load clients, e.g. 8-15")
    args = cli.parse_args(argv)
    if args.cmd == "prepare-sglang":
        return prepare_sglang(args)
    return prepare(args) if args.cmd == "prepare" else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
