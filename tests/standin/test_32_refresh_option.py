"""Issue 32 item 12: whether an operation refreshes first, decided as the Pulumi CLI decides it
(pulumi/pulumi pkg/cmd/pulumi/operations/io.go getRefreshOption): an explicit `--refresh[=BOOL]`
wins, else the project's `options: refresh: always`, else no refresh.

Kept (issue 33 item 7): the product heals drift only through that refresh (Pulumi.yaml sets
`refresh: always`; each provider's `read`), and tests/standin/test_32_drift.py checks the
healing through this decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulumi_standin.cli import parse_args
from pulumi_standin.stack import refresh_option
from pulumi_standin.statefile import StandinError
from tests.program.runner import PROJECT_ROOT


def project(tmp_path: Path, options: str = "") -> Path:
    (tmp_path / "Pulumi.yaml").write_text(f"name: p\nruntime: python\n{options}")
    return tmp_path


def test_this_project_refreshes_always_and_a_flag_wins(tmp_path: Path) -> None:
    assert refresh_option(PROJECT_ROOT, None) is True  # Pulumi.yaml: options: refresh: always
    assert refresh_option(PROJECT_ROOT, "false") is False
    plain = project(tmp_path)
    assert refresh_option(plain, None) is False
    assert refresh_option(plain, "true") is True and refresh_option(plain, "1") is True
    always = project(tmp_path, "options:\n  refresh: always\n")
    assert refresh_option(always, None) is True and refresh_option(always, "F") is False
    with pytest.raises(StandinError, match="unable to determine value for --refresh"):
        refresh_option(always, "sometimes")


def test_the_flag_is_for_preview_up_and_destroy() -> None:
    assert parse_args(["up", "--refresh"]).refresh == "true"
    assert parse_args(["preview", "--refresh=false"]).refresh == "false"
    assert parse_args(["destroy"]).refresh is None
    with pytest.raises(SystemExit):
        parse_args(["output", "--refresh"])
