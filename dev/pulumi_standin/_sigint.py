"""Ctrl-C as a flag, installed before anything heavy is imported (stdlib only).

The first Ctrl-C sets `EVENT` (the stand-in then lets the step in flight finish and starts no
new one, as the engine's first Ctrl-C does); a second one raises KeyboardInterrupt. Installed
first thing by `python -m pulumi_standin`, so a Ctrl-C while the SDK loads is not lost in an
import (some libraries' import-time `except:` would swallow a KeyboardInterrupt).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

EVENT = threading.Event()


def handler_for(event: threading.Event) -> Any:
    def handler(_signum: int, _frame: Any) -> None:
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    return handler


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler_for(EVENT))
