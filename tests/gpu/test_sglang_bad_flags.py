"""A bad flag fails SGLang's start-up, and our error carries SGLang's own message.

As tests/gpu/test_vllm_bad_flags.py, for SGLang 0.5.15: the spec checks flag names against the
recorded parser of the release it names; a bad value, or a flag of another release, must still
fail at once with SGLang's words in the container's error (serving/engine.py `ProcessDied`).
SGLang parses its arguments (`prepare_server_args`, prog "sglang serve") before it takes any
GPU memory, so these starts run beside nothing else. Run by `bench.gpu.remote run --phases
sglang`; skipped anywhere else.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from bench.gpu import device
from serving.engine import ENGINE_DIED_EXIT_CODE
from tests.gpu.support import Served

pytestmark = [pytest.mark.gpu, pytest.mark.sglang, pytest.mark.timeout(600)]

CASES = {
    # a flag of 0.5.15 with a value its parser refuses
    "bad-value": (
        device.sglang_spec_dict(extra_args=["--max-running-requests", "many"]),
        r"argument --max-running-requests: invalid int value: 'many'",
    ),
    # a spec checked against 0.5.23's parser, run on 0.5.15: a flag 0.5.15 does not have
    "other-release": (
        {
            **device.sglang_spec_dict(extra_args=["--enable-http-worker-reuseport"]),
            "engine_version": "0.5.23",
        },
        r"unrecognized arguments: .*--enable-http-worker-reuseport",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_flag_fails_start_up_with_the_engines_message(
    case: str, tmp_path: Path, results: dict[str, Any]
) -> None:
    spec, engine_says = CASES[case]
    spec_file = device.write_spec(tmp_path / "spec.json", spec)
    log_file = tmp_path / "engine.log"
    t0 = time.monotonic()
    with Served.start(
        spec_file, log_file, ports=(18000, 18001), wait=False, env=device.run_env("sglang")
    ) as srv:
        rc = srv.wait_exit(timeout=300)
    took = time.monotonic() - t0
    output = "\n".join(line for _, line in srv.lines)
    ours = [line for line in output.splitlines() if "exited unexpectedly" in line]
    results.setdefault("bad_flags", {})[case] = {
        "exit_code": rc,
        "seconds": round(took, 1),
        "our_error": ours[:1],
        "engine_message": re.findall(rf".*{engine_says}.*", output)[:2],
    }
    assert rc == ENGINE_DIED_EXIT_CODE, output[-3000:]
    assert ours and ours[0].startswith("sglang exited unexpectedly"), output[-3000:]
    # the report quotes the engine's last lines: its own message is among them
    report = output[output.index(ours[0]) :]
    assert re.search(engine_says, report), report[-3000:]
