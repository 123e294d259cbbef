"""Every flag the spec renders exists in the own argument parser of each engine release.

The parsers' option strings are recorded in serving/engine_flags/<engine>_<version>.py by
scripts/record_engine_flags.py (run with a venv where that release is installed; releases
older than the script through dev/bench/gpu/flags_shim.py). Every release in ENGINE_RELEASES is
checked; when a pin moves, re-record and these tests say which rendered flag no longer exists.

When a venv with a release is present (env SERVING_VLLM_PYTHON / SERVING_SGLANG_PYTHON or
/tmp/vllm-venv, /tmp/sglang-venv for the pinned default; SERVING_VLLM_0_26_0_PYTHON or
/tmp/vllm-0.26.0-venv for another), `test_parser_accepts_rendered_commands` also parses the
full rendered argv with the real parser (values included); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from serving import render
from serving.engine_flags import flag_list, module_name
from serving.spec import (
    ENGINE_RELEASES,
    ENGINE_VERSIONS,
    RESERVED_FLAGS,
    ServingSpec,
    flags_in,
)
from tests.serving.test_spec import SHA, make
from tests.serving.test_spec_extra_args import release_accepted, release_bypasses

ROOT = Path(__file__).resolve().parents[2]
EXTRA_ARGS = {
    "vllm": [[], ["--max-num-seqs", "128", "--trust-remote-code"], ["--no-async-scheduling"]],
    "sglang": [
        [],
        ["--max-running-requests", "128", "--trust-remote-code"],
        ["--chunked-prefill-size=-1"],
    ],
}


RELEASES = [(e, v) for e, releases in ENGINE_RELEASES.items() for v in sorted(releases)]


def recorded_flags(engine: str, version: str | None = None) -> set[str]:
    return set(flag_list(engine, version or ENGINE_VERSIONS[engine]).options)


def matrix(engine: str, version: str | None = None) -> list[ServingSpec]:
    specs = []
    for snapshot in (False, True):
        for count in (1, 2, 8):
            for ctx in (None, 131072):
                for extra in EXTRA_ARGS[engine]:
                    if snapshot and (count > 1 or ctx is None):
                        continue
                    for revision in (None, SHA):
                        specs.append(
                            make(
                                engine=engine,
                                snapshot=snapshot,
                                gpu_count=count,
                                context_length=ctx,
                                extra_args=extra,
                                revision=revision,
                                gpu_memory_fraction=None if count == 1 else 0.85,
                                engine_version=version,
                            )
                        )
    return specs


def prefix_len(engine: str) -> int:
    """argv items before the parser's own arguments: `vllm serve` / `python3 -m mod`."""
    return 2 if engine == "vllm" else 3


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_recorded_list_holds_the_parser_listing(engine: str, version: str) -> None:
    flags = recorded_flags(engine, version)
    assert len(flags) > 300  # a whole server parser, not a fragment
    assert all(f.startswith("-") for f in flags)
    listing = flag_list(engine, version)
    assert listing.source == module_name(engine, version).replace(".", "/") + ".py"
    assert (ROOT / listing.source).is_file()  # one copy, inside serving/ (ships with the app)


def test_missing_list_says_how_to_record_it() -> None:
    with pytest.raises(LookupError, match=r"record_engine_flags\.py vllm .*vllm==9\.9\.9"):
        flag_list("vllm", "9.9.9")


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_every_rendered_flag_exists_in_the_release_parser(engine: str, version: str) -> None:
    known = recorded_flags(engine, version)
    seen: set[str] = set()
    for spec in matrix(engine, version):
        argv = render.engine_command(spec, 8001)[prefix_len(engine) :]
        missing = [f for f in flags_in(argv) if f not in known]
        assert not missing, f"{engine}=={version} has no {missing}; rendered: {argv}"
        seen.update(flags_in(argv))
    # the matrix reaches every conditional flag (snapshot, context length, TP, extras)
    conditional = {
        "vllm": {"--max-model-len", "--enable-sleep-mode", "--revision", "--max-num-seqs"},
        "sglang": {"--context-length", "--enable-memory-saver", "--enable-weights-cpu-backup"},
    }[engine]
    assert conditional <= seen


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_each_release_keeps_every_guard(engine: str, version: str) -> None:
    """Each release's table (release_flags) spells every reserved field and every default the
    spec adds in that release's own parser, else the guard would protect nothing there."""
    table = render.release_flags(engine, version)
    known = recorded_flags(engine, version)
    assert set(table.reserved) <= known
    assert set(table.reserved.values()) == set(RESERVED_FLAGS[engine].values())
    for default, spellings in table.overridable.items():
        assert default in spellings and spellings <= known


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_spelling_in_the_tables_belongs_to_a_release(engine: str) -> None:
    """The engine-wide tables hold no spelling that no release's parser has (a typo)."""
    known = set().union(*(recorded_flags(engine, v) for v in ENGINE_RELEASES[engine]))
    assert set(RESERVED_FLAGS[engine]) <= known
    for alternatives in render.OVERRIDABLE_DEFAULTS[engine].values():
        assert alternatives <= known


def base_argv(engine: str, version: str | None = None) -> list[str]:
    """The parser's own arguments of a minimal rendered command (without the prefix)."""
    spec = make(engine=engine, engine_version=version)
    return render.engine_command(spec, 8001)[prefix_len(engine) :]


def engine_python(engine: str, version: str) -> str | None:
    if version == ENGINE_VERSIONS[engine]:
        var, venv = f"SERVING_{engine.upper()}_PYTHON", f"/tmp/{engine}-venv"
    else:
        var = f"SERVING_{engine.upper()}_{version.replace('.', '_')}_PYTHON"
        venv = f"/tmp/{engine}-{version}-venv"
    candidate = os.environ.get(var) or f"{venv}/bin/python"
    return candidate if Path(candidate).exists() else None


@pytest.mark.slow
@pytest.mark.timeout(300)  # importing a release's parser: 20-30 s alone, minutes on a busy machine
@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_parser_accepts_rendered_commands(engine: str, version: str) -> None:
    python = engine_python(engine, version)
    if python is None:
        pytest.skip(f"no venv with {engine}=={version} (see module docstring)")
    argvs = [render.engine_command(s, 8001)[prefix_len(engine) :] for s in matrix(engine, version)]
    base = base_argv(engine, version)
    argvs += [base + args for args in release_accepted(engine, version)]
    argvs += [base + args for args in release_bypasses(engine, version)]
    recorded = flag_list(engine, version).source
    # the recording script itself, through the shim for releases older than it
    out = subprocess.run(
        [
            python,
            "-m",
            "bench.gpu.flags_shim",
            engine,
            "--check-argv",
            "-",
            "--expect",
            str(ROOT / recorded),
        ],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # every argv parses: the rendered ones, the spellings the spec accepts, and the bypasses
    # the spec refuses (so the engine itself would have taken them silently)
    assert f"parsed {len(argvs)} argv(s), 0 rejected" in out.stdout
    # the committed list is what the pinned parser gives now (the script regenerates it)
    assert f"matches {ROOT / recorded}" in out.stdout
