"""Every flag the spec renders exists in the pinned engine's own argument parser.

The parsers' option strings are recorded in serving/engine_flags/<engine>_<version>.py by
scripts/record_engine_flags.py (run with a venv where the pinned engine is installed). When an
engine pin moves, re-record and this test says which rendered flag no longer exists.

When a venv with the pinned engine is present (env SERVING_VLLM_PYTHON / SERVING_SGLANG_PYTHON,
or /tmp/vllm-venv, /tmp/sglang-venv), `test_*_parser_accepts_rendered_commands` also parses
the full rendered argv with the real parser (values included); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from serving.engine_flags import flag_list, module_name
from serving.spec import ENGINE_VERSIONS, ServingSpec, flags_in
from tests.serving.test_spec import SHA, make
from tests.serving.test_spec_extra_args import ACCEPTED_SPELLINGS, BYPASSES

ROOT = Path(__file__).resolve().parents[2]
EXTRA_ARGS = {
    "vllm": [[], ["--max-num-seqs", "128", "--trust-remote-code"], ["--no-async-scheduling"]],
    "sglang": [
        [],
        ["--max-running-requests", "128", "--trust-remote-code"],
        ["--chunked-prefill-size=-1"],
    ],
}


def recorded_flags(engine: str) -> set[str]:
    return set(flag_list(engine, ENGINE_VERSIONS[engine]).options)


def matrix(engine: str) -> list[ServingSpec]:
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
                            )
                        )
    return specs


def prefix_len(engine: str) -> int:
    """argv items before the parser's own arguments: `vllm serve` / `python3 -m mod`."""
    return 2 if engine == "vllm" else 3


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_recorded_list_holds_the_parser_listing(engine: str) -> None:
    flags = recorded_flags(engine)
    assert len(flags) > 300  # a whole server parser, not a fragment
    assert all(f.startswith("-") for f in flags)
    listing = flag_list(engine, ENGINE_VERSIONS[engine])
    assert listing.source == module_name(engine, ENGINE_VERSIONS[engine]).replace(".", "/") + ".py"
    assert (ROOT / listing.source).is_file()  # one copy, inside serving/ (ships with the app)


def test_missing_list_says_how_to_record_it() -> None:
    with pytest.raises(LookupError, match=r"record_engine_flags\.py vllm .*vllm==9\.9\.9"):
        flag_list("vllm", "9.9.9")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_rendered_flag_exists_in_the_pinned_parser(engine: str) -> None:
    known = recorded_flags(engine)
    seen: set[str] = set()
    for spec in matrix(engine):
        argv = spec.engine_command(8001)[prefix_len(engine) :]
        missing = [f for f in flags_in(argv) if f not in known]
        assert not missing, (
            f"{engine}=={ENGINE_VERSIONS[engine]} has no {missing}; rendered: {argv}"
        )
        seen.update(flags_in(argv))
    # the matrix reaches every conditional flag (snapshot, context length, TP, extras)
    conditional = {
        "vllm": {"--max-model-len", "--enable-sleep-mode", "--revision", "--max-num-seqs"},
        "sglang": {"--context-length", "--enable-memory-saver", "--enable-weights-cpu-backup"},
    }[engine]
    assert conditional <= seen


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_reserved_flags_exist_in_the_pinned_parser(engine: str) -> None:
    """The flags extra_args may not repeat are real flags (else the guard protects nothing)."""
    from serving.spec import OVERRIDABLE_DEFAULTS, RESERVED_FLAGS

    known = recorded_flags(engine)
    assert set(RESERVED_FLAGS[engine]) <= known
    for alternatives in OVERRIDABLE_DEFAULTS[engine].values():
        assert alternatives <= known


def base_argv(engine: str) -> list[str]:
    """The parser's own arguments of a minimal rendered command (without the prefix)."""
    return make(engine=engine).engine_command(8001)[prefix_len(engine) :]


def engine_python(engine: str) -> str | None:
    candidate = (
        os.environ.get(f"SERVING_{engine.upper()}_PYTHON") or f"/tmp/{engine}-venv/bin/python"
    )
    return candidate if Path(candidate).exists() else None


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_parser_accepts_rendered_commands(engine: str) -> None:
    python = engine_python(engine)
    if python is None:
        pytest.skip(f"no venv with {engine}=={ENGINE_VERSIONS[engine]} (see module docstring)")
    argvs = [s.engine_command(8001)[prefix_len(engine) :] for s in matrix(engine)]
    argvs += [base_argv(engine) + args for args in ACCEPTED_SPELLINGS[engine]]
    argvs += [base_argv(engine) + args for args in BYPASSES[engine]]
    recorded = flag_list(engine, ENGINE_VERSIONS[engine]).source
    script = str(ROOT / "scripts" / "record_engine_flags.py")
    out = subprocess.run(
        [python, script, engine, "--check-argv", "-", "--expect", str(ROOT / recorded)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # every argv parses: the rendered ones, the spellings the spec accepts, and the bypasses
    # the spec refuses (so the engine itself would have taken them silently)
    assert f"parsed {len(argvs)} argv(s), 0 rejected" in out.stdout
    # the committed list is what the pinned parser gives now (the script regenerates it)
    assert f"matches {ROOT / recorded}" in out.stdout
