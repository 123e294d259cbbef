"""Drops the usage-only SSE chunk from a stream whose client did not ask for it.

The engines are started so that every stream ends with a usage chunk (vLLM
``--enable-force-include-usage``, SGLang ``--stream-response-default-include-usage``): that is
how the proxy counts stream tokens. OpenAI sends that chunk (``"choices": []`` plus ``usage``)
only to clients that set ``stream_options.include_usage``, and client code written against
that contract reads ``chunk.choices[0]`` on every chunk, which fails on an empty list. So for
the other clients the proxy counts the chunk, then removes it with ``UsageChunkFilter``.

The filter is cheap on the hot path: a read that ends on an event boundary and has no empty
``choices`` list passes through untouched (one regex search). Otherwise it holds back the
incomplete last event (never sent half, so the relay stays on an event boundary) and drops
complete events whose JSON is ``{"choices": [], "usage": {...}, ...}``.
"""

from __future__ import annotations

import json
import re

_EMPTY_CHOICES_RE = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_BOUNDARY_RE = re.compile(rb"\r\n\r\n|\n\n")
# An event that never ends is passed on unfiltered beyond this size (memory stays bounded).
MAX_HELD_BYTES = 256 * 1024


# Whether bytes end on an SSE event boundary (a blank line: ``\n\n`` or ``\r\n\r\n``) is
# written out where it is asked, once per relayed event here and in relay.py, as
# ``data[-2:] == b"\n\n" or data[-4:] == b"\r\n\r\n"``: not ``bytes.endswith``, which in
# CPython 3.11 parses its optional arguments with a format string built on every call (~1k
# instructions), nor a helper function (a call per event; counted with bench.proxy.instructions).
# The proxy's per-request and per-event paths compare slices instead of calling
# ``startswith``/``endswith`` for the same reason.


def is_usage_only_event(event: bytes) -> bool:
    """True for one SSE event (without its blank line) whose data is a usage-only chunk."""
    lines = event.replace(b"\r\n", b"\n").split(b"\n")
    data = b"\n".join(line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:"))
    if not data.startswith(b"{"):
        return False
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(chunk, dict)
        and chunk.get("choices") == []
        and isinstance(chunk.get("usage"), dict)
    )


class UsageChunkFilter:
    """Feed it the engine's bytes in order; it returns what to send on (maybe ``b""``)."""

    __slots__ = ("dropped", "held")

    # Whether ``data`` may hold a usage-only chunk (an empty ``choices`` list); a relay that
    # sees whole events (``held`` empty, ``data`` ending on a boundary) for which this is None
    # may pass them on without calling ``feed``: ``feed`` would return them unchanged.
    may_drop = _EMPTY_CHOICES_RE.search

    def __init__(self) -> None:
        self.held = b""  # the start of an event whose end has not arrived yet
        self.dropped = 0  # usage-only events removed so far

    def feed(self, data: bytes) -> bytes:
        if self.held:
            data = self.held + data
        if data[-2:] == b"\n\n" or data[-4:] == b"\r\n\r\n":  # an event boundary (see above)
            complete, self.held = data, b""
        else:  # hold back the incomplete last event
            lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
            end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
            if end == 0:  # no complete event yet
                if len(data) > MAX_HELD_BYTES:
                    self.held = b""
                    return data
                self.held = data
                return b""
            complete, self.held = data[:end], data[end:]
        found = _EMPTY_CHOICES_RE.search(complete)
        if found is None:
            return complete  # the common case: whole events, no usage-only chunk among them
        return self._drop_usage_events(complete, found)

    def flush(self) -> bytes:
        """What is left at the end of the stream (an event without a final blank line)."""
        held, self.held = self.held, b""
        if held and _EMPTY_CHOICES_RE.search(held) and is_usage_only_event(held.rstrip()):
            self.dropped += 1
            return b""
        return held

    def _drop_usage_events(self, complete: bytes, first: re.Match[bytes]) -> bytes:
        """``complete`` (whole events) without its usage-only ones; ``first`` is the first
        empty ``choices`` list in it. Only the events holding one are looked at: the engine's
        burst of many token events with the usage chunk last costs one search, not one per
        event."""
        out: list[bytes] = []
        kept_from = 0  # the start of what is kept and not yet in ``out``
        found: re.Match[bytes] | None = first
        while found is not None:
            at = found.start()
            # the event holding the match: from the blank line before it to the one after it
            lf, crlf = (
                complete.rfind(b"\n\n", kept_from, at),
                complete.rfind(b"\r\n\r\n", kept_from, at),
            )
            start = max(lf + 2 if lf >= 0 else kept_from, crlf + 4 if crlf >= 0 else kept_from)
            sep = _BOUNDARY_RE.search(complete, found.end())
            stop, after = (sep.start(), sep.end()) if sep else (len(complete), len(complete))
            if is_usage_only_event(complete[start:stop]):
                self.dropped += 1
                out.append(complete[kept_from:start])
                kept_from = after
            found = _EMPTY_CHOICES_RE.search(complete, after)
        out.append(complete[kept_from:])
        return b"".join(out)
