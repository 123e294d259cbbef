"""Issue 32 item 9: no secret of a review stack on any command line.

The stand-in review `up` used to pass the gateway's proxy token as `--secret=proxyToken=wk-..:
ws-..`, readable by every user of the machine in `ps` / `/proc/<pid>/cmdline` while the run
lasted. Here the `up` of scripts/review/engine.py runs a REAL child process in the stand-in's
place: it samples `/proc/*/cmdline` of every process it can see (itself, its parent, any other
child) while it runs and records where the secret arrived. The secret must reach it (else the
test proves nothing) and must be on no command line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from review.engine import Engine  # noqa: E402

from pulumi_standin.cli import parse_args, parse_overrides  # noqa: E402
from pulumi_standin.statefile import StandinError  # noqa: E402
from pulumi_standin.values import Secret  # noqa: E402

PROXY_SECRET = "ws-item9-proxy-secret-Qx7"
PROXY_TOKEN = f"wk-item9id:{PROXY_SECRET}"

#: Runs as `python -m pulumi_standin up ...` would: argv[1:] are the stand-in's arguments. It
#: samples every process's command line, then hands its own arguments to the stand-in's real
#: parser (pulumi_standin.cli) to see the secret arrive as the stand-in would read it.
RECORDER = r"""#!{python}
import json, os, sys
sys.path.insert(0, {root!r})
secret = {secret!r}
seen = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{{pid}}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        continue
    if any(secret.encode() in a for a in argv):
        seen.append(int(pid))
from pulumi_standin.cli import parse_args, parse_overrides
args = parse_args(sys.argv[3:])
overrides = parse_overrides(args.config, args.secret, env_pairs=args.secret_from_env)
arrived = sorted(k for k, v in overrides.items() if secret in str(getattr(v, "value", "")))
with open(os.environ["RECORD"], "w") as fh:
    json.dump({{"argv": sys.argv, "cmdline_pids_with_secret": seen, "me": os.getpid(),
               "arrived": arrived, "command": args.command}}, fh)
"""


def test_standin_up_puts_no_secret_on_any_command_line(tmp_path: Path) -> None:
    recorder = tmp_path / "python"
    recorder.write_text(RECORDER.format(python=sys.executable, root=str(ROOT), secret=PROXY_SECRET))
    recorder.chmod(0o755)
    record = tmp_path / "record.json"
    os.environ["RECORD"] = str(record)
    try:
        engine = Engine(
            kind="standin", project=ROOT, state_dir=tmp_path / "state", python=str(recorder)
        )
        engine.deploy("pr-9", secrets={"proxyToken": PROXY_TOKEN})
    finally:
        os.environ.pop("RECORD", None)
    got = json.loads(record.read_text())
    assert got["argv"][1:4] == ["-m", "pulumi_standin", "up"], got["argv"]
    assert not [a for a in got["argv"] if PROXY_SECRET in a], "the secret is on the command line"
    assert got["cmdline_pids_with_secret"] == [], "a process had the secret on its command line"
    assert got["command"] == "up"
    assert got["arrived"] == ["modal-llm:proxyToken"], "the secret did not reach the stand-in"


def test_standin_reads_a_secret_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REVIEW_SECRET_PROXYTOKEN", PROXY_TOKEN)
    args = parse_args(
        ["up", "--stack", "pr-9", "--secret-from-env", "proxyToken=REVIEW_SECRET_PROXYTOKEN"]
    )
    overrides = parse_overrides(args.config, args.secret, env_pairs=args.secret_from_env)
    value = overrides["modal-llm:proxyToken"]
    assert isinstance(value, Secret) and value.value == PROXY_TOKEN
    monkeypatch.delenv("REVIEW_SECRET_PROXYTOKEN")
    with pytest.raises(StandinError) as err:
        parse_overrides([], [], env_pairs=["proxyToken=REVIEW_SECRET_PROXYTOKEN"])
    assert "REVIEW_SECRET_PROXYTOKEN" in str(err.value) and PROXY_SECRET not in str(err.value)
