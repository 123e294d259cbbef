"""Issue 22 items 7 (its script part) and 9-14, "the local loop": one test per item, named
after it, each failing on the code before the fix. The two-checkout test (item 9 end to end)
is the slow one at the bottom.

- 9: a checkout owns its emulator by state file and pid file, never by port; it takes a free
  port when another checkout (or program) holds the stack file's; the CLI gets the actual URL
  with --config-file, the stand-in with --server-url; Pulumi.local.yaml is never rewritten.
- 10: `make plan STACK=dev` with no emulator and no emulator URL.
- 11: a YAML error / a tab in a stack file, a bad modal:serverUrl: one line, at once.
- 12: the gateway file starts LiteLLM offline as printed (master key, packaged cost map).
- 13: a one-run `--config` warns that the next plain `up` undoes it; `output ... NAME` order.
- 14: the endpoint check's curl has no secret on its command line.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime import rpc

from components.config import server_url_problem
from emulator.process import EmulatorProcess
from pulumi_standin.cli import one_run_warnings, parse_args, parse_overrides
from pulumi_standin.program import StackFileError, load_stack_file
from tests.program.gateway_chain import free_port, litellm_bin, processes, wait_http
from tests.program.runner import PROJECT_ROOT, run_program, stack_config

__all__ = ["processes"]
PY = str(PROJECT_ROOT / ".venv/bin/python")
NO_CLI_ENV = {
    "PATH": "/usr/bin:/bin",  # no pulumi here
    "PULUMI_INSTALL_URL": "http://127.0.0.1:9/unreachable",  # nor its installer
    "LANG": "C.UTF-8",
}


def _bash(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`script` with scripts/local-env.sh sourced, in the project root, this test's emulator dir."""
    return subprocess.run(
        ["bash", "-c", f"STACK=local\n. scripts/local-env.sh\n{script}"],
        cwd=PROJECT_ROOT,
        env={
            **NO_CLI_ENV,
            "HOME": str(tmp_path),
            "EMULATOR_DIR": str(tmp_path / "emulator"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---- 7 (the script's part): an emulator that dies during `make up` is said within seconds ---


def test_22_7_make_up_says_within_seconds_that_its_emulator_died(tmp_path: Path) -> None:
    """The emulator is killed while a pulumi command runs (a stand-in that would retry Modal
    for minutes): the watcher up.sh runs says so at once, with the log's last lines, and stops
    the command."""
    script = """
read_stack_url
start_emulator >/dev/null
watch_emulator &
( exec -a pulumi-standin-fake sleep 120 ) &
FAKE=$!
sleep 0.5
kill -9 "$(cat "$EMULATOR_PID_FILE")"
t0=$(date +%s)
wait "$FAKE" || true
echo "stopped after $(( $(date +%s) - t0 )) s"
"""
    started = time.monotonic()
    proc = _bash(script, tmp_path)
    assert time.monotonic() - started < 60, proc.stderr[-2000:]
    assert "exited while `make up` ran; stopping." in proc.stderr, proc.stderr[-2000:]
    assert "Its log's last lines" in proc.stderr and "  | " in proc.stderr
    seconds = int(proc.stdout.strip().splitlines()[-1].split()[2])
    assert seconds <= 3, proc.stdout


# ---- 9: each checkout owns its emulator -----------------------------------------------------


@pytest.fixture
def other_checkouts_emulator(tmp_path: Path) -> Iterator[EmulatorProcess]:
    """A `python -m emulator serve` of another checkout: its own state file and directory."""
    other = tmp_path / "other-checkout" / ".modal-emulator"
    other.mkdir(parents=True)
    emu = EmulatorProcess(state_path=other / "state.sqlite3", runtime=False, token_id=None)
    with emu:
        yield emu


def test_22_9_another_checkouts_emulator_is_neither_adopted_nor_stopped(
    tmp_path: Path, other_checkouts_emulator: EmulatorProcess
) -> None:
    other = other_checkouts_emulator
    port = other.port
    # Asked for that very port: not reused, not stopped, a clear stop instead.
    asked = _bash("start_emulator; echo STARTED", tmp_path, EMULATOR_PORT=str(port))
    assert asked.returncode == 1 and "STARTED" not in asked.stdout
    assert f"127.0.0.1:{port} (EMULATOR_PORT) is in use" in asked.stderr
    assert "reusing it" not in asked.stdout
    # Its port named by the stack file (as 8790 is): this checkout takes another, said once.
    moved = _bash(
        f'STACK_EMULATOR_PORT={port}; pick_emulator_port; echo "PORT=$EMULATOR_PORT"', tmp_path
    )
    assert moved.returncode == 0, moved.stderr
    assert f"127.0.0.1:{port} (Pulumi.local.yaml's port) is in use" in moved.stdout
    picked = int(moved.stdout.rsplit("PORT=", 1)[1])
    assert picked not in (0, port)
    # `make down`'s stop: nothing of ours runs, so nothing is stopped, even with its pid
    # written in our pid file (a pid file is only believed for our own state file).
    (tmp_path / "emulator").mkdir(exist_ok=True)
    (tmp_path / "emulator" / "emulator.pid").write_text(f"{other.pid}\n")
    stop = _bash('echo "PID=$(emulator_pid)"; stop_emulator', tmp_path, EMULATOR_PORT=str(port))
    assert stop.returncode == 0, stop.stderr
    assert "PID=\n" in stop.stdout and "Modal emulator not running" in stop.stdout
    assert other.alive
    assert [e["name"] for e in other.state()["environments"]] == ["main"]  # still serving


def test_22_9_the_cli_gets_the_actual_emulator_url_for_the_run_only(tmp_path: Path) -> None:
    stack_file = PROJECT_ROOT / "Pulumi.local.yaml"
    before = stack_file.read_text()
    show = 'cli_config_args; echo "ARGS=${CLI_CONFIG_ARGS[*]}"'
    moved = _bash(f"read_stack_url; EMULATOR_URL=http://127.0.0.1:41234; {show}", tmp_path)
    assert moved.returncode == 0, moved.stderr
    run_config = tmp_path / "emulator" / "Pulumi.local.run.yaml"
    assert f"ARGS=--config-file {run_config}" in moved.stdout
    assert "Pulumi.local.yaml stays as committed" in moved.stdout
    written = yaml.safe_load(run_config.read_text())["config"]
    committed = yaml.safe_load(before)["config"]
    assert written == {**committed, "modal:serverUrl": "http://127.0.0.1:41234"}
    assert stack_file.read_text() == before
    # Where the stack file points already, the CLI gets no extra argument.
    same = _bash(f'read_stack_url; EMULATOR_URL="$STACK_SERVER_URL"; {show}', tmp_path)
    assert same.returncode == 0 and "ARGS=\n" in same.stdout


# ---- 10: a preview needs no emulator --------------------------------------------------------


def test_22_10_plan_of_dev_needs_no_emulator_and_no_url(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MODAL_SERVER_URL"}
    env.pop("PYTHONPATH", None)
    env["OFFLINE_STACK_PASSPHRASE"] = "plan-test"
    # What `make plan STACK=dev` runs (Makefile), with a fresh state file.
    done = subprocess.run(
        [PY, "scripts/offline_stack.py", "preview", "--stack", "dev",
         "--state", str(tmp_path / "dev.json")],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "none is needed: a preview runs Check and Diff only" in done.stdout
    assert "Resources: + 9 to create" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


# ---- 11: stack file errors, one line, at once -----------------------------------------------


@pytest.fixture
def checkout_copy(tmp_path: Path) -> Path:
    """The parts of this checkout that `make up` reads before it starts anything (scripts, the
    stack files), with the venv linked in (the stand-in comes with the dev tools installed
    there and runs the project of its current directory): a checkout whose stack file a test
    may break without touching the real one."""
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copytree(
        PROJECT_ROOT / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("Pulumi.yaml", "Pulumi.local.yaml", "Pulumi.dev.yaml"):
        shutil.copy2(PROJECT_ROOT / name, root / name)
    (root / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    return root


def _up_in(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/up.sh", "local"],
        cwd=root,
        env={**NO_CLI_ENV, "HOME": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _line_of(text: str, needle: str) -> int:
    """1-based line of the first `needle` in `text`."""
    return text[: text.index(needle)].count("\n") + 1


@pytest.mark.parametrize("case", ["tab", "unclosed-quote", "ftp-url", "non-numeric-port"])
def test_22_11_a_broken_stack_file_stops_make_up_at_once_in_one_line(
    checkout_copy: Path, case: str
) -> None:
    stack_file = checkout_copy / "Pulumi.local.yaml"
    text = stack_file.read_text()
    env_line = _line_of(text, "modal-llm:environment:")
    if case == "tab":
        broken = text.replace("  modal-llm:environment:", "\tmodal-llm:environment:", 1)
        expected = (
            f"error: Pulumi.local.yaml:{env_line}:1: invalid YAML: found character '\\t' that"
            " cannot start any token (a tab: YAML indents with spaces only)"
        )
    elif case == "unclosed-quote":
        broken = text.replace("modal-llm:environment: local", 'modal-llm:environment: "local', 1)
        quote_col = broken.splitlines()[env_line - 1].index('"') + 1
        expected = (
            f"error: Pulumi.local.yaml:{broken.count(chr(10)) + 1}:1: invalid YAML: found"
            f" unexpected end of stream (while scanning a quoted scalar at {env_line}:{quote_col})"
        )
    elif case == "ftp-url":
        broken = text.replace("http://127.0.0.1:8790", "ftp://127.0.0.1:8790", 1)
        expected = (
            "error: Pulumi.local.yaml: modal:serverUrl 'ftp://127.0.0.1:8790' scheme 'ftp' is"
            " not http or https"
        )
    else:
        broken = text.replace("http://127.0.0.1:8790", "http://127.0.0.1:87x0", 1)
        expected = (
            "error: Pulumi.local.yaml: modal:serverUrl 'http://127.0.0.1:87x0' port '87x0' is"
            " not a number from 1 to 65535"
        )
    assert broken != text
    stack_file.write_text(broken)
    started = time.monotonic()
    done = _up_in(checkout_copy)
    took = time.monotonic() - started
    assert done.returncode == 1
    assert done.stderr.strip() == expected, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "emulator" not in done.stdout.lower()  # none was started
    assert not (checkout_copy / ".modal-emulator").exists()
    assert took < 30, took
    # The stand-in on its own says the same in one line.
    standin = subprocess.run(
        [PY, "-m", "pulumi_standin", "preview", "--stack", "local"],
        cwd=checkout_copy, env={**NO_CLI_ENV, "HOME": str(checkout_copy)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert standin.returncode == 1
    assert standin.stderr.strip().startswith(expected), standin.stdout + standin.stderr
    assert standin.stderr.count("\n") == 1
    assert standin.stdout == ""  # errors on stderr only (issue 34 item 2)


def test_22_11_yaml_errors_name_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.x.yaml"
    bad.write_text("config:\n  a: 1\n  b: [1, 2\n")
    with pytest.raises(StackFileError) as info:
        load_stack_file(bad)
    assert str(info.value).startswith("Pulumi.x.yaml:4:1: invalid YAML:")
    assert "\n" not in str(info.value)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(StackFileError, match="the top level must be a mapping"):
        load_stack_file(bad)


def test_22_11_the_program_refuses_a_bad_server_url_under_the_cli() -> None:
    # Under the Pulumi CLI the program is the first to see modal:serverUrl: it refuses before
    # any resource, instead of the providers retrying "Unknown scheme" for minutes.
    for url, why in [
        ("ftp://127.0.0.1:8790", "scheme 'ftp' is not one the Modal client speaks"),
        ("http://127.0.0.1:abc", "port 'abc' is not a number"),
    ]:
        config, secret_keys = stack_config("local", {"modal:serverUrl": url})
        with pytest.raises(pulumi.RunError, match=why) as info:
            run_program("local", config, secret_keys)
        message = str(info.value)
        assert message.startswith("invalid stack config: Pulumi.local.yaml:12:3: ")  # its line
        assert f" modal:serverUrl = {url!r}: " in message
        assert "pulumi config set modal:serverUrl http://127.0.0.1:8790" in message
    assert server_url_problem("https://api.modal.com,https://api.modal2.com") is None
    assert server_url_problem("unix:/run/modal.sock") is None


# ---- 12: the gateway file starts LiteLLM as printed ------------------------------------------


def _gateway_outputs(tmp_path: Path) -> Path:
    """`pulumi stack output --json --show-secrets` of the local stack, saved (under mocks)."""
    config, secret_keys = stack_config("local")
    run = run_program("local", config, secret_keys)
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps({k: rpc.unwrap_rpc_secret(v) for k, v in run.outputs.items()}))
    return saved


def _write_gateway(saved: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/gateway_config.py", "--outputs-json", str(saved),
         "--out", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_22_12_the_gateway_file_keeps_its_master_key_and_takes_new_keys(tmp_path: Path) -> None:
    saved = _gateway_outputs(tmp_path)
    out = tmp_path / ".gateway" / "litellm-local.yaml"
    first = _write_gateway(saved, out)
    assert first.returncode == 0, first.stderr
    doc = yaml.safe_load(out.read_text())
    master = doc["general_settings"]["master_key"]
    assert master.startswith("sk-") and len(master) == 67
    assert master not in first.stdout + first.stderr  # in the file only, never printed
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True .venv/litellm/bin/litellm --config" in first.stdout
    assert doc["general_settings"]["background_health_checks"] is False  # the program's own
    old_key = doc["model_list"][0]["litellm_params"]["api_key"]
    # The outputs after the key was rotated: the file takes the new key, keeps its master key.
    outputs = json.loads(saved.read_text())
    outputs["gateway_config"] = outputs["gateway_config"].replace(old_key, "sk-rotated-22-12")
    saved.write_text(json.dumps(outputs))
    again = _write_gateway(saved, out)
    assert again.returncode == 0, again.stderr
    text = out.read_text()
    assert old_key not in text and "sk-rotated-22-12" in text
    assert yaml.safe_load(text)["general_settings"]["master_key"] == master


@pytest.mark.litellm
@pytest.mark.slow
def test_22_12_the_printed_command_starts_litellm_offline(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    binary = litellm_bin()
    out = tmp_path / ".gateway" / "litellm-local.yaml"
    written = _write_gateway(_gateway_outputs(tmp_path), out)
    assert written.returncode == 0, written.stderr
    command = next(
        line.strip()
        for line in written.stdout.splitlines()
        if "LITELLM_LOCAL_MODEL_COST_MAP" in line
    )
    env_part, _, argv_part = command.partition(" ")
    port = free_port()
    argv = argv_part.replace(".venv/litellm/bin/litellm", binary).replace("4000", str(port))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM_")}
    env[env_part.split("=")[0]] = env_part.split("=")[1]
    log = tmp_path / "litellm.log"
    started = time.monotonic()
    processes.append(
        subprocess.Popen(
            argv.split(), cwd=PROJECT_ROOT, env=env, stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", processes[-1], 120, log)
    took = time.monotonic() - started
    master = yaml.safe_load(out.read_text())["general_settings"]["master_key"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {master}"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        models = [m["id"] for m in json.loads(resp.read())["data"]]
    assert models == ["smollm2-135m"]
    text = log.read_text(errors="replace")
    assert "refused to start" not in text and "master key" not in text.lower()
    assert "Failed to fetch remote model cost map" not in text
    assert took < 110, took  # no cost-map fetch retries (those took ~2 minutes offline)


# ---- 13: one-run config, output argument order ----------------------------------------------


def test_22_13_a_one_run_config_warns_that_the_next_up_undoes_it() -> None:
    overrides = parse_overrides(['apiKeyRotation={"gateway": "2026-12-01"}'])
    (warning,) = one_run_warnings("local", overrides)
    assert warning.startswith("warning: --config modal-llm:apiKeyRotation is for this run only")
    assert "`make up` too" in warning and "undoes this change" in warning
    assert "pulumi config set --path apiKeyRotation.gateway 2026-12-01 --stack local" in warning
    # A value the stack file already has is not a one-run change: no warning.
    assert one_run_warnings("local", parse_overrides(["environment=local"])) == []
    # A secret is named, never shown.
    (secret,) = one_run_warnings("local", parse_overrides([], ["hfToken=hf_0123456789"]))
    assert "hf_0123456789" not in secret and "--secret modal-llm:hfToken <value>" in secret


def test_22_13_output_takes_its_name_after_the_options() -> None:
    args = parse_args(["output", "--stack", "local", "endpoint_url", "--show-secrets"])
    assert (args.command, args.stack, args.name, args.show_secrets) == (
        "output",
        "local",
        "endpoint_url",
        True,
    )
    assert parse_args(["output", "endpoint_url", "--stack", "local"]).name == "endpoint_url"
    with pytest.raises(SystemExit):
        parse_args(["up", "--stack", "local", "endpoint_url"])


# ---- 14: no secret on a command line ---------------------------------------------------------


class _SlowCurlEdge(http.server.BaseHTTPRequestHandler):
    """Answers chat completions with 200; holds curl's request for a moment and records, while
    curl waits, every process command line that holds a secret."""

    secrets: tuple[str, ...] = ()
    seen_headers: list[dict[str, str]] = []
    exposed: list[str] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).seen_headers.append(dict(self.headers))
        if "curl" in self.headers.get("User-Agent", ""):
            time.sleep(0.3)
            type(self).exposed.extend(_command_lines_with(self.secrets))
        body = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def _command_lines_with(secrets: tuple[str, ...]) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(s in cmdline for s in secrets):
            found.append(f"{proc.name}: {cmdline.replace(chr(0), ' ')}")
    return found


def test_22_14_the_endpoint_check_runs_curl_without_secrets_on_its_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))
    import local_stack  # scripts/local_stack.py

    token_secret, api_key = "ws-secret-22-14-token", "sk-secret-22-14-apikey"
    _SlowCurlEdge.secrets = (token_secret, api_key)
    _SlowCurlEdge.seen_headers, _SlowCurlEdge.exposed = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowCurlEdge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    outputs = {
        "services": {"tiny": {"endpoint_url": endpoint, "served_model_name": "m"}},
        "all_api_keys": {"tiny": {"gateway": api_key}},
        "proxy_token_id": "wk-id",
        "proxy_token_secret": token_secret,
    }
    try:
        assert local_stack.check(outputs, "local", timeout=30) == 0
    finally:
        server.shutdown()
        server.server_close()
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith("HTTP 200")
    assert token_secret in printed  # the copy-paste curl shows them, as documented
    curl_seen = [h for h in _SlowCurlEdge.seen_headers if "curl" in h.get("User-Agent", "")]
    assert len(curl_seen) == 1
    assert curl_seen[0]["Modal-Secret"] == token_secret
    assert curl_seen[0]["Authorization"] == f"Bearer {api_key}"
    assert _SlowCurlEdge.exposed == []


# ---- 9, end to end: two checkouts side by side ----------------------------------------------


def _clone(tmp_path: Path, name: str) -> Path:
    """A clone of this repository's HEAD with this checkout's venv linked in (pip would install
    the same pinned packages again); its pyproject.toml files (the product's, the dev tools')
    are dated like ours, so `make setup` sees the venv as up to date and leaves it alone (a
    reinstall would point the shared venv's editable installs at the clone)."""
    root = tmp_path / name
    subprocess.run(["git", "clone", "-q", str(PROJECT_ROOT), str(root)], check=True, timeout=120)
    (root / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    for rel in ("pyproject.toml", "dev/pyproject.toml"):
        ours = (PROJECT_ROOT / rel).stat()
        os.utime(root / rel, ns=(ours.st_atime_ns, ours.st_mtime_ns))
    return root


def _make(root: Path, target: str) -> subprocess.CompletedProcess[str]:
    env = {**NO_CLI_ENV, "HOME": str(root.parent / f"{root.name}-home")}
    return subprocess.run(
        ["make", "--no-print-directory", target],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _outputs(root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [PY, "scripts/local_stack.py", "outputs", "--engine", "standin"],
        cwd=root, env={**NO_CLI_ENV, "HOME": str(root)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _answers(outputs: dict[str, Any]) -> int:
    request = urllib.request.Request(
        outputs["endpoint_url"] + "/v1/chat/completions",
        data=json.dumps(
            {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}
        ).encode(),
        headers={
            "Content-Type": "application/json",
            "Modal-Key": outputs["proxy_token_id"],
            "Modal-Secret": outputs["proxy_token_secret"],
            "Authorization": f"Bearer {outputs['api_keys']['gateway']}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _pid(root: Path) -> int | None:
    pid_file = root / ".modal-emulator" / "emulator.pid"
    return int(pid_file.read_text()) if pid_file.exists() else None


@pytest.mark.slow
def test_22_9_two_checkouts_side_by_side(tmp_path: Path) -> None:
    """Two clones, default settings, both `make up`, both answer; `make down` in one leaves
    the other serving."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    a, b = _clone(tmp_path, "a"), _clone(tmp_path, "b")
    try:
        up_a = _make(a, "up")
        assert up_a.returncode == 0, up_a.stdout + up_a.stderr
        up_b = _make(b, "up")
        assert up_b.returncode == 0, up_b.stdout + up_b.stderr
        assert "reusing it" not in up_b.stdout  # b never adopts a's emulator
        assert "(Pulumi.local.yaml's port) is in use" in up_b.stdout
        pid_a, pid_b = _pid(a), _pid(b)
        assert pid_a is not None and pid_b is not None and pid_a != pid_b
        out_a, out_b = _outputs(a), _outputs(b)
        assert _answers(out_a) == 200 and _answers(out_b) == 200
        assert out_a["endpoint_url"] != out_b["endpoint_url"]

        down_a = _make(a, "down")
        assert down_a.returncode == 0, down_a.stdout + down_a.stderr
        assert f"Modal emulator (pid {pid_a}) stopped." in down_a.stdout
        assert not Path(f"/proc/{pid_a}").exists()
        assert Path(f"/proc/{pid_b}").exists()
        assert _answers(out_b) == 200  # b still serves
        up_b_again = _make(b, "up")  # and b's own loop goes on: its emulator is reused
        assert up_b_again.returncode == 0, up_b_again.stdout + up_b_again.stderr
        assert f"(pid {pid_b}, this checkout's" in up_b_again.stdout
        assert "Resources: 9 unchanged" in up_b_again.stdout
        down_b = _make(b, "down")
        assert down_b.returncode == 0, down_b.stdout + down_b.stderr
        assert not Path(f"/proc/{pid_b}").exists()
    finally:
        for root in (a, b):
            pid = _pid(root)
            if pid is not None and Path(f"/proc/{pid}").exists():
                _make(root, "down")
            pid = _pid(root)
            if pid is not None and Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGTERM)
