"""8 client processes (the real SDK, each its own interpreter and connection) in parallel.

Separate processes, not threads: the emulator must serialize writes from independent
connections whose calls really interleave, the way 8 CI jobs or Pulumi's parallel resource
operations hit it.

Kept (issue 33 item 7): Pulumi runs independent steps in parallel, and the providers' creates
rely on Modal applying each write once (the client sends `x-idempotency-key`: modal 1.6.4
modal/_utils/grpc_utils.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import modal

from tests.emulator.concurrent_client import SECRETS_EACH, VOLUMES_EACH
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess

WORKERS = 8


def test_eight_parallel_client_processes_leave_exact_state(
    modal_env: EmulatorProcess, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.emulator.concurrent_client", str(i), str(go)],
            env=modal_env.subprocess_env(),
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    try:
        # Start everyone at once, after all of them have connected (one SecretList each).
        while modal_env.rpc_counts().get("SecretList", 0) < WORKERS:
            dead = [p for p in procs if p.poll() is not None]
            assert not dead, dead[0].communicate()
            time.sleep(0.05)
        go.touch()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))

    for r in results:  # each client saw its own writes
        assert {f"w{r['index']}-s{j}" for j in range(SECRETS_EACH)} <= set(r["seen"])
    assert sum(r["won"] for r in results) == 1
    assert len({r["shared_volume_id"] for r in results}) == 1
    state = modal_env.state()
    expected_secrets = {f"w{i}-s{j}" for i in range(WORKERS) for j in range(SECRETS_EACH)}
    assert sorted(s["name"] for s in state["secrets"]) == sorted(expected_secrets | {"shared"})
    expected_volumes = {f"w{i}-v{j}" for i in range(WORKERS) for j in range(VOLUMES_EACH)}
    assert sorted(v["name"] for v in state["volumes"]) == sorted(expected_volumes | {"shared-vol"})
    assert len(modal.Secret.objects.list()) == WORKERS * SECRETS_EACH + 1
    assert modal_env.rpc_counts()["SecretGetOrCreate"] == WORKERS * (SECRETS_EACH + 1)
