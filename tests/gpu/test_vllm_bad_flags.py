"""A bad flag fails start-up, and our error carries vLLM's own message.

The spec checks flag *names* against the recorded parser of the release it names; what only
the engine can judge (a value, or a release other than the one installed) must still fail
loudly at start, with the engine's words in the container's error (serving/engine.py
`ProcessDied`), not as a health-check timeout half an hour later. These starts fail in vLLM's
argument parsing, before any GPU memory is taken, so they run beside nothing else.
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

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

CASES = {
    # a flag of 0.26.0 with a value its parser refuses
    "bad-value": (
        device.spec_dict(extra_args=["--max-num-seqs", "many"]),
        r"argument --max-num-seqs: invalid int value: 'many'",
    ),
    # a spec checked against 0.33.0's parser, run on 0.26.0: the flag is 0.33.0's spelling
    "other-release": (
        {**device.spec_dict(), "engine_version": "0.33.0", "extra_args": [
            "--disable-prefix-caching"
        ]},
        r"unrecognized arguments: .*--disable-prefix-caching",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_flag_fails_start_up_with_the_engines_message(
    case: str, tmp_path: Path, results: dict[str, Any]
) -> None:
    spec, engine_says = CASES[case]
    spec_file = device.write_spec(tmp_path / "spec.json", spec)
    log_file = tmp_path / "engine.log"
    t0 = time.monotonic()
    with Served.start(spec_file, log_file, ports=(18000, 18001), wait=False) as srv:
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
    assert ours and ours[0].startswith("vllm exited unexpectedly"), output[-3000:]
    # the report quotes the engine's last lines: its own message is among them
    report = output[output.index(ours[0]) :]
    assert re.search(engine_says, report), report[-3000:]
