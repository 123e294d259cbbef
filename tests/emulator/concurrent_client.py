"""One client process of the concurrency test (tests/emulator/test_concurrency.py).

    python -m tests.emulator.concurrent_client INDEX GO_FILE

Imports the real `modal` SDK (pointed at the emulator by the environment), waits until
GO_FILE exists so that every process starts calling at the same moment, then creates its own
secrets and volumes, races the other processes for one shared secret name and one shared
volume, and prints one JSON line: {"index", "won", "shared_volume_id", "seen"}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

SECRETS_EACH = 10
VOLUMES_EACH = 3


def main(index: int, go_file: Path) -> None:
    import modal
    from modal.exception import AlreadyExistsError

    modal.Secret.objects.list()  # connect before the start signal
    deadline = time.monotonic() + 60
    while not go_file.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"client {index}: start signal {go_file} never came")
        time.sleep(0.005)
    for j in range(SECRETS_EACH):
        modal.Secret.objects.create(f"w{index}-s{j}", {"K": str(j)})
    for j in range(VOLUMES_EACH):
        modal.Volume.objects.create(f"w{index}-v{j}")
    seen = sorted(s.name or "" for s in modal.Secret.objects.list())
    try:  # every process races for the same name: exactly one may win
        modal.Secret.objects.create("shared", {"WINNER": str(index)})
        won = True
    except AlreadyExistsError:
        won = False
    volume = modal.Volume.from_name("shared-vol", create_if_missing=True).hydrate()
    print(
        json.dumps(
            {"index": index, "won": won, "shared_volume_id": volume.object_id, "seen": seen}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
