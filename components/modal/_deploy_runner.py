"""Deploy one Modal app file in a fresh process and print one JSON line about the result.

Run by the App provider as `python -m components.modal._deploy_runner --app-file F --name N
[--environment E] [--tag T] [--app-tags JSON]` (T: the release's digests, as `modal deploy
--tag`; JSON: the App tags to publish with, the release records), with MODAL_*
credentials and SERVING_SPEC (+ the App's extra env) in the environment. A fresh process per
deploy keeps modal's module-level state (imported app modules, the cached client, the
environment cache) from leaking between deploys.

It does what `modal deploy F --name N -e E` does (same import path, `modal.runner.deploy_app`),
then reads back what the provider needs and prints, as the LAST stdout line:

    {"ok": true, "app_id": "ap-...", "web_url": "https://..." | "", "version": 3}
    {"ok": true, "app_id": "ap-...", "web_url": "", "version": 0, "read_back_error": "..."}
    {"ok": false, "error": "<type>: <message>", "transient": false}

Once `deploy_app` returned, the deploy is done: the read-back is retried (READ_BACK_ATTEMPTS)
and, if it still fails, reported in `read_back_error` with `ok: true`, never as a failed
deploy (issue 11 item 5: a create that Modal completed must not fail).

`web_url`: the first flash URL of an `@app.server` (what `modal.Server.from_name(...).get_url()`
returns), else the first web endpoint URL (`Function.get_web_url()`), by function tag order.
`version`: the highest version in `AppDeploymentHistory` for the app.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _transient(exc: BaseException) -> bool:
    import asyncio

    from modal import exception as mexc

    return isinstance(
        exc,
        OSError
        | asyncio.TimeoutError
        | mexc.ConnectionError
        | mexc.InternalError
        | mexc.ServiceError
        | mexc.TimeoutError,
    )


READ_BACK_ATTEMPTS = 3


async def _read_back(app: Any, app_id: str) -> dict[str, Any]:
    """Web URL and deployed version, from the hydrated app and the control plane."""
    from modal.client import _Client

    from components.modal import _rpc

    flash: list[str] = []
    web: list[str] = []
    for _tag, fn in sorted(app._local_state.functions.items()):
        urls = await fn._experimental_get_flash_urls()
        if urls:
            flash.extend(urls)
        url = await fn.get_web_url()
        if url:
            web.append(url)
    client = await _Client.from_env()
    return {
        "web_url": (flash or web or [""])[0],
        "version": await _rpc.app_version(client, app_id),
    }


def _error(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def _read_back_retried(app: Any, app_id: str) -> dict[str, Any]:
    import time

    from modal._utils.async_utils import synchronizer

    read_back = synchronizer.create_blocking(_read_back)
    error = ""
    for attempt in range(READ_BACK_ATTEMPTS):
        try:
            return dict(read_back(app, app_id))
        except Exception as e:  # reported, never a failed deploy
            error = _error(e)
            time.sleep(0.5 * 2**attempt)
    return {"web_url": "", "version": 0, "read_back_error": error}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app-file", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--environment", default="")
    parser.add_argument("--tag", default="", help="as `modal deploy --tag` (the release's digests)")
    parser.add_argument(
        "--app-tags",
        default="{}",
        help="JSON object of App tags to publish with (the release records the app holds)",
    )
    args = parser.parse_args(argv)
    try:
        from modal.cli.import_refs import import_app_from_ref, parse_import_ref
        from modal.config import config
        from modal.runner import deploy_app

        env = args.environment or config.get("environment") or ""
        ref = parse_import_ref(args.app_file, command="modal deploy")
        app = import_app_from_ref(ref, base_cmd="modal deploy")
        # AppPublish carries the app's tags (modal 1.6.4 runner.py `_publish_app`:
        # `tags=app_local_state.tags`): the release records go along, so a publish keeps
        # them however Modal treats tags it does not receive. The app file's own tags win.
        records = json.loads(args.app_tags)
        app._local_state.tags = {**records, **app._local_state.tags}
        result = deploy_app(app, name=args.name, environment_name=env, tag=args.tag)
        out = {"ok": True, "app_id": result.app_id, **_read_back_retried(app, result.app_id)}
    except SystemExit as e:
        out = {"ok": False, "error": f"app import exited with {e.code}", "transient": False}
    except Exception as e:  # reported to the provider, which raises a clear error
        out = {"ok": False, "error": _error(e), "transient": _transient(e)}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
