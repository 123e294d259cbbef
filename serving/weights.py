"""Fill a weights volume with one pinned revision of a model: runs inside the Modal container.

`serving/weights_app.py` deploys `provision` as a one-shot Modal function; the `ModelWeights`
resource (components/modal/model_weights.py) calls it at `pulumi up`, so a serving container
finds its weights on the volume and never downloads at a cold start.

Sources (a plain dict, the request the provider sends; `source_problems` checks it):

    {"kind": "hf", "repo": "org/name", "revision": "<40-hex commit>", "endpoint": "https://..."}
    {"kind": "s3", "bucket": "b", "prefix": "models/x/v3/", "revision": "v3",
     "endpoint_url": "https://s3.example", "region": "us-east-1"}

- hf: the Hugging Face hub client (`huggingface_hub`: `list_repo_tree` then `hf_hub_download`
  per file, 8 files at a time like its `snapshot_download`, a progress line per file), token
  from env HF_TOKEN (the stack's Modal secret), `endpoint` for a hub mirror (default: the
  client's own, HF_ENDPOINT or huggingface.co). The revision must be a full commit sha: a
  branch or tag can move.
- s3: any S3-compatible store through boto3 (`endpoint_url` for non-AWS stores), credentials
  from env AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (a Modal secret the stack manages). S3
  has no commits: `revision` is the label of that content, and must change when it does (put
  the version in the prefix).

Layout on the volume (mounted at WEIGHTS_MOUNT): `<revision>/` holds the files as the source
lays them out (what `vllm serve /weights/<revision>` loads), `<revision>.manifest.json` beside
it records the source, file count, bytes and content digest. A download goes to a temporary
directory first and is renamed into place only when complete, so a failed or interrupted run
never leaves a half-filled revision that a serving container could load. A run for a
revision already present re-hashes it and downloads nothing when it is intact.

Stdlib only at import time (the hub and S3 clients are imported when used): the same module
is imported by the Pulumi side for `source_problems` and `SUBDIR` rules.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

WEIGHTS_MOUNT = "/weights"  # where the weights volume is mounted, in both apps
MANIFEST_SUFFIX = ".manifest.json"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HF_REPO_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CHUNK = 1 << 20
HF_WORKERS = 8  # huggingface_hub's snapshot_download default

Emit = Callable[[str], None]


class WeightsError(RuntimeError):
    """Provisioning failed; the message says what was asked and what the source answered."""


# ---- the request ---------------------------------------------------------------------------


def source_problems(source: Any) -> list[str]:
    """What is wrong with a source dict (empty: valid). One sentence per problem."""
    if not isinstance(source, Mapping):
        return ["weights source must be a map with `kind: hf` or `kind: s3`"]
    kind = source.get("kind")
    problems: list[str] = []
    known = {
        "hf": {"kind", "repo", "revision", "endpoint"},
        "s3": {"kind", "bucket", "prefix", "revision", "endpoint_url", "region"},
    }
    if kind not in known:
        return [f"weights source kind {kind!r} is unknown: use `hf` or `s3`"]
    extra = sorted(set(source) - known[kind])
    if extra:
        problems.append(f"unknown key(s) {', '.join(extra)} for a `{kind}` source")
    revision = source.get("revision")
    if kind == "hf":
        repo = source.get("repo")
        if not isinstance(repo, str) or not _HF_REPO_RE.match(repo) or "--" in repo:
            problems.append(f"repo {repo!r} is not a Hugging Face repo id ('org/name')")
        if not isinstance(revision, str) or not _COMMIT_RE.match(revision):
            problems.append(
                f"revision {revision!r} must be a full 40-hex commit sha (a branch or tag can "
                "move): take it from the model's 'Files and versions -> History' page"
            )
    else:
        bucket = source.get("bucket")
        if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
            problems.append(f"bucket {bucket!r} is not an S3 bucket name")
        prefix = source.get("prefix", "")
        if not isinstance(prefix, str) or prefix.startswith("/") or ".." in prefix.split("/"):
            problems.append(f"prefix {prefix!r} must be a relative key prefix like 'models/x/v3/'")
        if not isinstance(revision, str) or not _LABEL_RE.match(revision):
            problems.append(
                f"revision {revision!r} must be a label of 1-64 letters, digits, '.', '_', '-' "
                "naming this content (change it whenever the objects under the prefix change)"
            )
    for key in ("endpoint", "endpoint_url"):
        url = source.get(key)
        if url is not None and not (isinstance(url, str) and re.match(r"^https?://", url)):
            problems.append(f"{key} {url!r} must be an http(s) URL")
    region = source.get("region")
    if region is not None and not (isinstance(region, str) and _LABEL_RE.match(region)):
        problems.append(f"region {region!r} is not a region name")
    if kind == "hf" and isinstance(revision, str) and not _LABEL_RE.match(revision):
        problems.append(f"revision {revision!r} cannot name a directory")
    return problems


def subdir(source: Mapping[str, Any]) -> str:
    """The directory of this revision on the volume (relative to WEIGHTS_MOUNT)."""
    return str(source["revision"])


def describe(source: Mapping[str, Any]) -> str:
    """One line naming the source, never a credential."""
    if source.get("kind") == "hf":
        return f"hf://{source.get('repo')}@{source.get('revision')}"
    where = f"s3://{source.get('bucket')}/{source.get('prefix', '')}"
    return f"{where} (revision {source.get('revision')})"


# ---- the manifest --------------------------------------------------------------------------


def _files(root: Path) -> Iterator[Path]:
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            yield p


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def manifest_of(root: Path) -> dict[str, Any]:
    """File count, bytes and content digest of a directory: sha256 over one line per file,
    `<relative path>\\0<size>\\0<sha256>`, sorted by path (independent of mtimes and of where
    the directory lives)."""
    lines, total, count = [], 0, 0
    for p in _files(root):
        size = p.stat().st_size
        lines.append(f"{p.relative_to(root).as_posix()}\0{size}\0{file_sha256(p)}")
        total += size
        count += 1
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return {"file_count": count, "bytes": total, "digest": f"sha256:{digest}"}


# ---- downloads -----------------------------------------------------------------------------


def _fetch_hf(source: Mapping[str, Any], dest: Path, emit: Emit) -> int:
    """Download every file of the repo at the commit into `dest`; returns bytes fetched."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.hf_api import RepoFile

    repo, revision = str(source["repo"]), str(source["revision"])
    endpoint = source.get("endpoint") or None
    token = os.environ.get("HF_TOKEN") or None
    api = HfApi(endpoint=endpoint, token=token)
    files = [
        f
        for f in api.list_repo_tree(repo, recursive=True, revision=revision)
        if isinstance(f, RepoFile)
    ]
    total = sum(int(f.size or 0) for f in files)
    emit(f"{describe(source)}: {len(files)} files, {total} bytes to download")

    def fetch(f: Any) -> Any:
        hf_hub_download(
            repo, f.path, revision=revision, local_dir=dest, endpoint=endpoint, token=token
        )
        return f

    # Files in parallel, as the hub client's own snapshot_download does (8 workers): a model's
    # safetensors shards are several files. Progress is one line per finished file.
    done = 0
    ordered = sorted(files, key=lambda f: f.path)
    with ThreadPoolExecutor(max_workers=HF_WORKERS) as pool:
        for i, f in enumerate(pool.map(fetch, ordered), 1):
            done += int(f.size or 0)
            emit(f"[{i}/{len(files)}] {f.path} ({f.size} bytes; {done}/{total})")
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # the hub client's own bookkeeping
    return done


def _fetch_s3(source: Mapping[str, Any], dest: Path, emit: Emit) -> int:
    """Download every object under the prefix into `dest` (paths relative to the prefix)."""
    import boto3

    bucket, prefix = str(source["bucket"]), str(source.get("prefix") or "")
    client = boto3.client(
        "s3",
        endpoint_url=source.get("endpoint_url") or None,
        region_name=source.get("region") or None,
    )
    objects: list[tuple[str, int]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = str(obj["Key"])
            if not key.endswith("/"):
                objects.append((key, int(obj.get("Size", 0))))
    if not objects:
        raise WeightsError(f"{describe(source)}: no objects under that prefix")
    total = sum(size for _, size in objects)
    emit(f"{describe(source)}: {len(objects)} files, {total} bytes to download")
    done = 0
    for i, (key, size) in enumerate(sorted(objects), 1):
        rel = key[len(prefix) :].lstrip("/")
        if not rel or ".." in rel.split("/"):
            raise WeightsError(f"{describe(source)}: object key {key!r} cannot be a file path")
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target))
        done += size
        emit(f"[{i}/{len(objects)}] {rel} ({size} bytes; {done}/{total})")
    return done


def provision(source: Mapping[str, Any], root: Path, emit: Emit = print) -> dict[str, Any]:
    """Make `root/<revision>` hold the source's files; returns the manifest plus
    `revision`, `path` (relative to root), `downloaded_bytes` (0 when it was already there)
    and `seconds`."""
    problems = source_problems(source)
    if problems:
        raise WeightsError(f"invalid weights source: {'; '.join(problems)}")
    started = time.monotonic()
    name = subdir(source)
    target, manifest_path = root / name, root / f"{name}{MANIFEST_SUFFIX}"
    wanted = {k: source[k] for k in sorted(source)}
    if target.is_dir() and manifest_path.is_file():
        try:
            recorded = json.loads(manifest_path.read_text())
        except ValueError:
            recorded = {}
        if recorded.get("source") == wanted:
            emit(f"{describe(source)}: already on the volume, checking its digest")
            current = manifest_of(target)
            if all(current[k] == recorded.get(k) for k in ("file_count", "bytes", "digest")):
                emit(f"{describe(source)}: intact ({current['digest']}), nothing to download")
                return _result(source, current, 0, started)
            emit(f"{describe(source)}: changed on the volume, downloading it again")
    incoming = root / f".incoming-{uuid.uuid4().hex}"
    incoming.mkdir(parents=True)
    try:
        fetch = _fetch_hf if source["kind"] == "hf" else _fetch_s3
        downloaded = fetch(source, incoming, emit)
        current = manifest_of(incoming)
        if target.exists():
            stale = root / f".stale-{uuid.uuid4().hex}"
            target.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        incoming.rename(target)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
    manifest_path.write_text(json.dumps({"source": wanted, **current}, sort_keys=True))
    emit(f"{describe(source)}: {current['file_count']} files, {current['bytes']} bytes, "
         f"{current['digest']}")  # fmt: skip
    return _result(source, current, downloaded, started)


def _result(
    source: Mapping[str, Any], manifest: Mapping[str, Any], downloaded: int, started: float
) -> dict[str, Any]:
    return {
        "revision": str(source["revision"]),
        "path": subdir(source),
        **manifest,
        "downloaded_bytes": downloaded,
        "seconds": round(time.monotonic() - started, 3),
    }
