"""serving/bake.py: the image build's bytecode and vLLM model-inspection files, and the copy of
those files into the engine cache at a container's start (serving/engine.py).

vLLM's own inspection (bake_modelinfos) needs vLLM and runs on the GPU machine
(bench.gpu.remote's coldstart plan, `baked` steps); these tests cover the rest on real files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serving import bake
from serving.engine import Container
from serving.spec import ServingSpec
from tests.serving.test_app_lifecycle import import_app

ROOT = Path(__file__).resolve().parents[2]


def spec_of(engine: str) -> ServingSpec:
    return ServingSpec.model_validate(
        {"engine": engine, "model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "l"}
    )


def baked_file(root: Path, name: str, module_hash: str) -> Path:
    """A file as vLLM writes it (registry.py `_save_modelinfo_to_cache`: hash + modelinfo)."""
    path = root / bake.MODELINFOS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"hash": module_hash, "modelinfo": {"architecture": name}}))
    return path


def test_seed_copies_what_the_cache_lacks_or_holds_in_another_version(tmp_path: Path) -> None:
    baked, cache = tmp_path / "baked", tmp_path / "cache"
    llama = baked_file(baked, "vllm-model_executor-models-llama-LlamaForCausalLM.json", "new")
    qwen = baked_file(baked, "vllm-model_executor-models-qwen2-Qwen2ForCausalLM.json", "same")
    stale = baked_file(cache, llama.name, "old")  # a Volume kept from an earlier image
    kept = baked_file(cache, qwen.name, "same")
    kept_mtime = kept.stat().st_mtime_ns

    assert bake.seed_modelinfos(cache, baked) == 1
    assert stale.read_bytes() == llama.read_bytes()
    assert kept.stat().st_mtime_ns == kept_mtime  # equal bytes: not rewritten
    leftovers = [p.name for p in (cache / bake.MODELINFOS).iterdir() if p.name.startswith(".")]
    assert leftovers == []  # written beside, then renamed
    assert bake.seed_modelinfos(cache, baked) == 0  # a second container copies nothing


def test_seed_without_baked_files_creates_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert bake.seed_modelinfos(cache, tmp_path / "no-bake-here") == 0
    assert not cache.exists()


def test_container_start_seeds_the_engine_cache_it_renders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own VLLM_CACHE_ROOT (its env as started) receives the baked files."""
    baked, cache = tmp_path / "baked", tmp_path / "cache"
    made = baked_file(baked, "vllm-model_executor-models-llama-LlamaForCausalLM.json", "h")
    monkeypatch.setattr(bake, "BAKED_VLLM_CACHE", baked)
    container = Container(spec_of("vllm"), engine_env={"VLLM_CACHE_ROOT": str(cache)})
    container.seed_engine_cache()
    assert (cache / bake.MODELINFOS / made.name).read_bytes() == made.read_bytes()

    other = Container(spec_of("sglang"), engine_env={"SGLANG_CACHE_DIR": str(tmp_path / "sg")})
    other.seed_engine_cache()  # no VLLM_CACHE_ROOT in its env: nothing to seed
    assert not (tmp_path / "sg").exists()


def test_compile_bytecode_goes_on_past_files_that_are_not_python(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "good.py").write_text("VALUE = 1\n")
    (pkg / "template.py").write_text("{% if x %}not python{% endif %}\n")
    assert bake.compile_bytecode([tmp_path]) is False
    tag = sys.implementation.cache_tag
    assert (pkg / "__pycache__" / f"good.{tag}.pyc").is_file()
    assert not (pkg / "__pycache__" / f"template.{tag}.pyc").exists()


def test_the_script_runs_alone_as_the_image_build_runs_it(tmp_path: Path) -> None:
    """A lone file with the image's python: stdlib only, no serving package on its path."""
    script = tmp_path / "bake.py"
    script.write_bytes((ROOT / "serving" / "bake.py").read_bytes())
    done = subprocess.run(
        [sys.executable, "-I", str(script), "--no-bytecode"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    asked = subprocess.run(
        [sys.executable, "-I", str(script), "--vllm-cache", str(tmp_path / "c"), "--no-bytecode"],
        capture_output=True,
        text=True,
    )
    assert asked.returncode != 0  # no vLLM here: the build step must fail, not bake nothing
    assert "vllm" in asked.stderr


def test_the_build_step_bakes_vllm_files_for_a_vllm_spec_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serving/app.py's build step: bytecode always, vLLM's files only for a vLLM spec (the
    emulator's deploy test, tests/serving/test_app_deploy.py, sees the step in the image)."""
    vllm, sglang = spec_of("vllm"), spec_of("sglang")
    app = import_app(monkeypatch, vllm, tmp_path)
    assert app.bake_command(vllm) == (
        f"python3 {bake.IN_IMAGE} --vllm-cache {bake.BAKED_VLLM_CACHE}"
    )
    assert app.bake_command(sglang) == f"python3 {bake.IN_IMAGE}"
    assert "serving.bake" in app.SHIPPED_MODULES  # engine.py imports it in the container
