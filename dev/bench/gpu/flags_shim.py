"""Run scripts/record_engine_flags.py against a vLLM release older than the script.

``python -m bench.gpu.flags_shim vllm [--check-argv F] [--expect M]`` with the python of a venv
where that vLLM is installed and the repository root and dev/ on PYTHONPATH: the script's arguments
and output. The script builds vLLM's server parser with
``vllm.entrypoints.common.cli_args.make_arg_parser`` (0.33.0's place for it) and sets
``VLLM_TARGET_DEVICE=cpu``, which 0.33.0 reads to pick its CPU platform on a machine without a
GPU. vLLM 0.26.0 keeps ``make_arg_parser`` in ``vllm.entrypoints.openai.cli_args`` and picks
its CPU platform only for a CPU build (vllm/platforms/__init__.py ``cpu_platform_plugin``), so
without a GPU building its parser fails ("Failed to infer device type", from the default
``DeviceConfig`` in vllm/config/device.py). For such a release the shim loads the script as a
module and replaces only its ``vllm_parser``: the old import path and, when torch sees no
GPU, ``vllm.platforms.cpu.CpuPlatform`` as the current platform (the parser's option strings
do not depend on it; ``bench.gpu.remote prepare`` compares the recording with the parser on the
GPU machine, CUDA platform, with the script's ``--expect``). Newer releases run the script as
is.

How serving/engine_flags/vllm_0_26_0.py was recorded (this repo's machine has no GPU):

    python3.12 -m venv /tmp/vllm-0.26.0-venv
    /tmp/vllm-0.26.0-venv/bin/pip install vllm==0.26.0
    PYTHONPATH=.:dev /tmp/vllm-0.26.0-venv/bin/python -m bench.gpu.flags_shim vllm \\
        > serving/engine_flags/vllm_0_26_0.py
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "record_engine_flags.py"
SCRIPT_REL = "scripts/record_engine_flags.py"
OLD_MODULE = "vllm.entrypoints.openai.cli_args"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_engine_flags", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def needs_shim() -> bool:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    with contextlib.redirect_stdout(sys.stderr):  # finding it imports vllm: see below
        return importlib.util.find_spec("vllm.entrypoints.common") is None


def old_vllm_parser() -> tuple[argparse.ArgumentParser, str]:
    """0.26.0's server parser, built as `vllm serve` builds it."""
    # vLLM 0.26.0's loggers write to stdout, where the recording goes: send them to stderr
    # (its logging config binds the stream when vllm is first imported).
    with contextlib.redirect_stdout(sys.stderr):
        import torch

        forced = ""
        if not torch.cuda.is_available():
            import vllm.platforms as platforms
            from vllm.platforms.cpu import CpuPlatform

            platforms._current_platform = CpuPlatform()  # what a CPU build would resolve
            forced = ", the current platform set to vllm.platforms.cpu.CpuPlatform (no GPU)"
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = make_arg_parser(FlexibleArgumentParser())
    how = (
        f"{OLD_MODULE}.make_arg_parser(vllm.utils.argparse_utils.FlexibleArgumentParser())"
        f"{forced} (via dev/bench/gpu/flags_shim.py)"
    )
    return parser, how


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    script = load_script()
    if args[:1] == ["vllm"] and needs_shim():
        render = script.render_module

        def render_module(engine: str, version: str, how: str, groups: list[str]) -> str:
            text: str = render(engine, version, how, groups)
            return text.replace(f"python {SCRIPT_REL}", "python -m bench.gpu.flags_shim")

        setattr(script, "vllm_parser", old_vllm_parser)  # noqa: B010 (a module's function)
        setattr(script, "render_module", render_module)  # noqa: B010
    status: int = script.main(args)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
