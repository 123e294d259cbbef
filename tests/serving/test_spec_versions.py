"""The spec names its engine release: image, recorded parser and flag spellings per release.

`engine_version` picks one of ENGINE_RELEASES (unset: the pinned default, ENGINE_VERSIONS);
its image is what the container runs, and extra_args are checked against that release's
recorded parser, whose spellings differ between releases (vLLM 0.26.0 negates with
`--no-enable-...` where 0.33.0 says `--disable-...`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving import render
from serving.engine_flags import module_name
from serving.spec import (
    ENGINE_IMAGES,
    ENGINE_RELEASES,
    ENGINE_VERSIONS,
    ServingSpec,
)
from tests.serving.test_spec import make, problems

OLD_VLLM = "0.26.0"
ROOT = Path(__file__).resolve().parents[2]


def test_every_release_has_an_image_of_its_version_and_a_recorded_parser() -> None:
    for engine, releases in ENGINE_RELEASES.items():
        assert ENGINE_VERSIONS[engine] in releases  # the default is one of them
        assert ENGINE_IMAGES[engine] == releases[ENGINE_VERSIONS[engine]].image
        for version, release in releases.items():
            assert release.image.endswith(f":v{version}")
            assert release.verified in ("gpu", "parser") and release.evidence
            assert module_name(engine, version).startswith("serving.engine_flags.")


def test_a_spec_without_a_version_gets_the_pinned_one() -> None:
    spec = make()
    assert spec.engine_version == ENGINE_VERSIONS["vllm"]
    assert spec.engine_release.image == ENGINE_IMAGES["vllm"]
    assert make(engine="sglang").engine_version == ENGINE_VERSIONS["sglang"]
    assert make(engine_version=None).engine_version == ENGINE_VERSIONS["vllm"]


def test_a_named_release_picks_its_image_and_keeps_the_digest_rule() -> None:
    old = make(engine_version=OLD_VLLM)
    assert old.engine_release.image == "vllm/vllm-openai:v0.26.0"
    assert old.engine_release.verified == "gpu"
    assert json.loads(old.to_json())["engine_version"] == OLD_VLLM  # written: not the default
    assert ServingSpec.from_json(old.to_json()) == old
    # naming the default is the same spec as naming none: same text, same digest
    named = make(engine_version=ENGINE_VERSIONS["vllm"])
    assert named == make() and named.digest() == make().digest()
    assert "engine_version" not in json.loads(named.to_json())
    assert old.digest() != make().digest()


def test_an_unknown_release_lists_the_known_ones() -> None:
    msg = problems(engine_version="0.30.0")["engine_version"]
    assert "vllm '0.30.0' is not a release the project knows" in msg
    assert "0.26.0 (verified on a GPU)" in msg and "0.33.0 (parser only)" in msg
    assert "record_engine_flags.py" in msg
    # a release of the other engine is not one of this engine's
    assert "engine_version" in problems(engine="sglang", engine_version=OLD_VLLM)


def test_each_release_checks_extra_args_against_its_own_parser() -> None:
    # 0.26.0 spells the negation --no-enable-prefix-caching, 0.33.0 --disable-prefix-caching
    cmd = render.engine_command(
        make(engine_version=OLD_VLLM, extra_args=["--no-enable-prefix-caching"])
    )
    assert "--enable-prefix-caching" not in cmd and cmd[-1] == "--no-enable-prefix-caching"
    msg = problems(engine_version=OLD_VLLM, extra_args=["--disable-prefix-caching"])
    assert "not a flag of vllm==0.26.0" in msg["extra_args[0]"]
    assert "serving/engine_flags/vllm_0_26_0.py" in msg["extra_args[0]"]
    msg = problems(extra_args=["--no-enable-prefix-caching"])
    assert "not a flag of vllm==0.33.0" in msg["extra_args[0]"]
    cmd = render.engine_command(make(extra_args=["--disable-prefix-caching"]))
    assert "--enable-prefix-caching" not in cmd
    # the usage chunk the proxy counts tokens with: each release's negation drops the default
    cmd = render.engine_command(
        make(engine_version=OLD_VLLM, extra_args=["--no-enable-force-include-usage"])
    )
    assert "--enable-force-include-usage" not in cmd


@pytest.mark.parametrize(
    ("version", "negation"),
    [(OLD_VLLM, "--no-enable-sleep-mode"), ("0.33.0", "--disable-sleep-mode")],
)
def test_each_release_reserves_its_own_spelling(version: str, negation: str) -> None:
    msg = problems(engine_version=version, extra_args=[negation])["extra_args[0]"]
    assert "already rendered by the spec; set snapshot" in msg


def test_release_flag_tables() -> None:
    old, new = render.release_flags("vllm", OLD_VLLM), render.release_flags("vllm", "0.33.0")
    assert "--no-enable-sleep-mode" in old.reserved and "--disable-sleep-mode" not in old.reserved
    assert "--disable-sleep-mode" in new.reserved and "--no-enable-sleep-mode" not in new.reserved
    assert "--device-memory-utilization" in new.reserved  # an alias 0.26.0 does not have
    assert "--device-memory-utilization" not in old.reserved
    assert old.overridable["--enable-prefix-caching"] == {
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
    }
    assert new.overridable["--enable-prefix-caching"] == {
        "--enable-prefix-caching",
        "--disable-prefix-caching",
    }


def test_the_default_command_line_is_the_same_for_both_vllm_releases() -> None:
    """What the spec renders exists in both parsers (tests/serving/test_engine_flags.py checks
    every flag); so only the image and the extra_args check differ."""
    for snapshot in (False, True):
        kw = {"snapshot": snapshot, "context_length": 4096}
        assert render.engine_command(make(engine_version=OLD_VLLM, **kw)) == render.engine_command(
            make(**kw)
        )


@pytest.mark.parametrize(
    ("engine", "version"), [(e, v) for e, rs in ENGINE_RELEASES.items() for v in sorted(rs)]
)
def test_the_app_ships_the_named_releases_flag_module(engine: str, version: str) -> None:
    """serving/app.py's SHIPPED_IF_SPEC must ship each release's recorded parser with a spec
    that names it, or the container's spec validation fails (read the way the App provider
    reads it: components/modal/_source.py, without importing the app)."""
    from components.modal._source import shipped_modules

    spec_json = make(engine=engine, engine_version=version).to_json()
    shipped = shipped_modules("serving/app.py", ROOT, spec_json=spec_json)
    assert module_name(engine, version) in shipped
