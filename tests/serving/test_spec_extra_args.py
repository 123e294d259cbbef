"""extra_args: checked against the pinned engine's recorded parser, however a flag is spelled.

Both engines parse with argparse `allow_abbrev=True` and vLLM also reads `_` as `-`, so a
reserved flag has many spellings. `BYPASSES` and `ACCEPTED_SPELLINGS` are also fed to the real
parsers in tests/serving/test_engine_flags.py (when the engine venvs exist): every bypass is
accepted there, so without the spec's check it would silently override what the spec renders.
"""

from __future__ import annotations

import pytest

from serving import render
from serving.spec import ENGINE_VERSIONS
from tests.serving.test_spec import make, problems

# (extra args, the spec field the error must name): spellings the engine maps to a flag the
# spec renders.
BYPASSES: dict[str, list[list[str]]] = {
    "vllm": [
        ["--max_model_len", "4096"],  # vLLM turns `_` into `-`
        ["--max_model_len=4096"],
        ["--max-model", "4096"],  # argparse: unique prefix of --max-model-len
        ["--gpu_memory_utilization", "0.5"],
        ["--gpu-memory", "0.5"],
        ["--tensor_parallel_size", "2"],
        ["--disable_sleep_mode"],  # the negation shares the action with --enable-sleep-mode
        ["--api_key", "k"],
        ["--served_model_name", "other"],
    ],
    "sglang": [
        ["--mem-fraction", "0.5"],  # argparse: unique prefix of --mem-fraction-static
        ["--context-len", "4096"],
        ["--tp", "2"],
        ["--tensor-parallel-size", "2"],  # alias of --tp-size
        ["--model", "other/model"],  # alias of --model-path
        ["--served-model", "other"],
        ["--api", "k"],
    ],
}
FIELDS = {
    "vllm": [
        "context_length", "context_length", "context_length", "gpu_memory_fraction",
        "gpu_memory_fraction", "gpu_count", "snapshot", "secrets.api_keys", "served_model_name",
    ],
    "sglang": [
        "gpu_memory_fraction", "context_length", "gpu_count", "gpu_count", "model",
        "served_model_name", "secrets.api_keys",
    ],
}  # fmt: skip

# Spellings the spec accepts (and the real parser too): vLLM's `_` form, dotted JSON keys, -O.
ACCEPTED_SPELLINGS: dict[str, list[list[str]]] = {
    "vllm": [
        ["--max_num_seqs", "64"],
        ["--max-num-seqs=64", "--seed", "-1"],
        ["-O3"],
        ["--compilation-config.mode", "3"],
        ["-cc.mode=3"],
        ["-q", "fp8"],
        ["--no_async_scheduling"],
    ],
    "sglang": [
        ["--max-running-requests", "64"],
        ["--chunked-prefill-size=-1"],
        ["--cuda-graph-max-bs-decode", "32"],
    ],
}


# vLLM 0.26.0 (a release the spec may name): its own negation of the sleep-mode flag, and
# 0.33.0's spellings it lacks are left out of what its parser is fed.
OLD_VLLM = "0.26.0"
OLD_VLLM_BYPASSES = [
    *[a for a in BYPASSES["vllm"] if a != ["--disable_sleep_mode"]],
    ["--no_enable_sleep_mode"],
]
OLD_VLLM_FIELDS = [
    *[f for a, f in zip(BYPASSES["vllm"], FIELDS["vllm"], strict=True)
      if a != ["--disable_sleep_mode"]],
    "snapshot",
]  # fmt: skip


def release_bypasses(engine: str, version: str) -> list[list[str]]:
    """BYPASSES as the release's parser spells them."""
    return OLD_VLLM_BYPASSES if (engine, version) == ("vllm", OLD_VLLM) else BYPASSES[engine]


def release_accepted(engine: str, version: str) -> list[list[str]]:
    """ACCEPTED_SPELLINGS the release's parser takes (every one so far)."""
    return ACCEPTED_SPELLINGS[engine]


def bypass_cases() -> list[tuple[str, list[str], str]]:
    return [
        (engine, args, field)
        for engine in ("vllm", "sglang")
        for args, field in zip(BYPASSES[engine], FIELDS[engine], strict=True)
    ]


@pytest.mark.parametrize(("engine", "args", "field"), bypass_cases())
def test_every_spelling_of_a_rendered_flag_is_refused(
    engine: str, args: list[str], field: str
) -> None:
    msg = problems(engine=engine, extra_args=["--trust-remote-code", *args])["extra_args[1]"]
    assert args[0].split("=")[0] in msg and f"set {field}" in msg
    assert "already rendered by the spec" in msg or "which the spec renders" in msg


@pytest.mark.parametrize(
    ("args", "field"), list(zip(OLD_VLLM_BYPASSES, OLD_VLLM_FIELDS, strict=True))
)
def test_every_spelling_is_refused_in_an_older_release_too(args: list[str], field: str) -> None:
    msg = problems(engine_version=OLD_VLLM, extra_args=["--trust-remote-code", *args])
    assert f"set {field}" in msg["extra_args[1]"], msg


@pytest.mark.parametrize("args", ACCEPTED_SPELLINGS["vllm"])
def test_free_spellings_are_accepted_in_an_older_release_too(args: list[str]) -> None:
    assert make(engine_version=OLD_VLLM, extra_args=args).extra_args == args


@pytest.mark.parametrize(
    ("engine", "args"), [(e, a) for e in ("vllm", "sglang") for a in ACCEPTED_SPELLINGS[e]]
)
def test_engine_spellings_of_free_flags_are_accepted(engine: str, args: list[str]) -> None:
    assert make(engine=engine, extra_args=args).extra_args == args


def test_underscore_spelling_is_read_as_the_engine_reads_it() -> None:
    msg = problems(extra_args=["--max_model_len", "4096"])["extra_args[0]"]
    assert "read by vllm as --max-model-len" in msg
    # an abbreviation names what it abbreviates
    msg = problems(engine="sglang", extra_args=["--mem-fraction", "0.5"])["extra_args[0]"]
    assert "abbreviates --mem-fraction-static" in msg


def test_unknown_flags_are_refused_with_a_suggestion() -> None:
    # the seeds' --speculative-model is gone from vLLM 0.33
    msg = problems(extra_args=["--speculative-model", "x/y"])["extra_args[0]"]
    assert f"not a flag of vllm=={ENGINE_VERSIONS['vllm']}" in msg
    assert "did you mean" in msg and "--speculative-config" in msg
    assert "serving/engine_flags/vllm_0_33_0.py" in msg
    # SGLang does not read `_` as `-`
    msg = problems(engine="sglang", extra_args=["--context_length", "8"])["extra_args[0]"]
    assert "not a flag of sglang" in msg and "--context-length" in msg
    # a flag of the other engine
    msg = problems(engine="sglang", extra_args=["--max-num-seqs", "8"])["extra_args[0]"]
    assert "not a flag of sglang" in msg


def test_abbreviations_of_free_flags_must_be_written_out() -> None:
    msg = problems(engine="sglang", extra_args=["--cuda-graph-max-bs", "8"])["extra_args[0]"]
    assert "abbreviation of --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill" in msg
    msg = problems(extra_args=["-qfp8"])["extra_args[0]"]
    assert "-q with its value attached" in msg


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_config_files_are_refused(engine: str) -> None:
    msg = problems(engine=engine, extra_args=["--config", "/root/x.yaml"])["extra_args[0]"]
    assert "not allowed in extra_args" in msg and "config file" in msg


def test_every_problem_is_reported_with_its_index() -> None:
    found = problems(extra_args=["--seed", "1", "--max_model_len", "8", "--nope", "--api-key=x"])
    assert set(found) == {"extra_args[2]", "extra_args[4]", "extra_args[5]"}


def test_overridable_defaults_follow_the_engine_spelling() -> None:
    # --no_async_scheduling is --no-async-scheduling to vLLM: the spec drops its default
    cmd = render.engine_command(make(extra_args=["--no_async_scheduling"]))
    assert "--async-scheduling" not in cmd
    cmd = render.engine_command(make(extra_args=["--generation_config", "auto"]))
    assert cmd.count("--generation-config") == 0 and cmd[-2:] == ["--generation_config", "auto"]
