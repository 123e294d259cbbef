"""Issue 34 item 9: the health gate's progress line showed the proxy's JSON access line cut
mid-string (`latest container log: [proxy] {"ts":...,"key":"gatew`). A log line is now shown
whole pair by whole pair (components/modal/_gate.py `log_line_summary`)."""

from __future__ import annotations

import json

from components.modal._gate import LOG_LINE_CHARS, log_line_summary

ACCESS = "[proxy] " + json.dumps(
    {
        "ts": "2026-11-28T10:00:00.123Z",
        "event": "request",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "duration_ms": 812.4,
        "key": "gateway",
        "prompt_tokens": 41,
        "completion_tokens": 16,
        "model": "smollm2-135m",
        "stream": False,
        "request_id": "req-0123456789abcdef0123456789abcdef",
        "client": "127.0.0.1:51234",
    }
)


def test_a_json_access_line_is_shown_as_whole_pairs() -> None:
    assert len(ACCESS) > LOG_LINE_CHARS
    shown = log_line_summary(ACCESS)
    assert len(shown) <= LOG_LINE_CHARS
    assert shown.startswith("[proxy] ts=2026-11-28T10:00:00.123Z event=request method=POST")
    assert shown.endswith(" …")
    assert '"' not in shown and "{" not in shown  # no JSON cut open
    doc = json.loads(ACCESS.partition(" ")[2])
    for pair in shown.removesuffix(" …").split(" ")[1:]:
        key, _, value = pair.partition("=")
        expected = doc[key] if isinstance(doc[key], str) else json.dumps(doc[key])
        assert value == expected, pair


def test_a_short_json_line_is_shown_whole_and_plain_lines_cut_at_a_space() -> None:
    assert log_line_summary('[proxy] {"event": "ready", "port": 8000}') == (
        "[proxy] event=ready port=8000"
    )
    words = "engine started " + "loading weights shard " * 20
    shown = log_line_summary(words)
    assert len(shown) <= LOG_LINE_CHARS and shown.endswith("…")
    assert not shown.removesuffix("…").endswith(("shar", "weigh", "load"))
    assert log_line_summary("short line") == "short line"
    assert log_line_summary('broken {"json": ') == 'broken {"json":'
