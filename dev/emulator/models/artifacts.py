"""Build artifacts: images, mounts, uploaded files and blobs, all content-addressed.

- Images get an id derived from their full definition (including base image ids and context
  mount ids), so an unchanged image is found again and answered as already built.
- Files are keyed by sha256; small ones arrive inline, large ones (>= 4 MiB) through a blob
  that the client PUTs over HTTP first.
- Mounts get an id derived from their file list (names, hashes, modes), so an unchanged
  `copy=True` layer keeps the same context mount id and the image above it stays cached.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import sqlite3
from dataclasses import dataclass
from typing import IO

from emulator.errors import FailedPrecondition, InvalidArgument, NotFound
from emulator.ids import check_id, content_id, new_id
from emulator.store import Store

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_PY_FROM = re.compile(r"^FROM\s+python:(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


def _check_b64_digest(field: str, value: str, size: int) -> None:
    """`value` must be the base64 of a `size`-byte digest (empty: not given)."""
    if not value:
        return
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != size:
        raise InvalidArgument(
            f"BlobCreate: {field} {value[:80]!r} is not the base64 of a {size}-byte digest."
        )


@dataclass(frozen=True)
class Image:
    id: str
    commands: list[str]
    built: bool
    python_version: str = ""  # "" when neither the image nor its bases name one
    base_ids: tuple[str, ...] = ()  # the images this one is built on (runtime: ENV lines)
    context_mount_id: str = ""  # files a `COPY . /` step copies in (runtime: materialised)


@dataclass(frozen=True)
class MountFile:
    filename: str
    sha256: str
    mode: int


@dataclass(frozen=True)
class Mount:
    id: str
    checksum: str
    name: str | None
    files: list[MountFile]


class Images:
    def __init__(self, store: Store) -> None:
        self.store = store
        # What the runtime needs to lay out a container (the layers below an image and the
        # files a `COPY . /` step copies) lives beside the images table, so the `images`
        # rows (and the state dump others read) keep their shape. Content-addressed like the
        # images, so rows left after a reset are still right.
        with self.store.tx() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS image_layers (image_id TEXT PRIMARY KEY,"
                " base_ids TEXT NOT NULL, context_mount_id TEXT NOT NULL DEFAULT '')"
            )

    @staticmethod
    def _load(row: sqlite3.Row, layers: sqlite3.Row | None = None) -> Image:
        return Image(
            id=row["id"],
            commands=json.loads(row["spec"]),
            built=bool(row["built"]),
            python_version=row["python_version"],
            base_ids=tuple(json.loads(layers["base_ids"])) if layers is not None else (),
            context_mount_id=str(layers["context_mount_id"]) if layers is not None else "",
        )

    @staticmethod
    def _layers(db: sqlite3.Connection, image_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute(
            "SELECT * FROM image_layers WHERE image_id = ?", (image_id,)
        ).fetchone()
        return row

    def get_or_create(
        self,
        definition: bytes,
        commands: list[str],
        force_build: bool,
        base_image_ids: list[str] | None = None,
        context_mount_id: str = "",
    ) -> Image:
        """Find the image with exactly this definition, or register it as not built yet.

        Its Python version comes from its own `FROM python:X.Y` line, else from its first base
        image that has one (a `pip_install` layer runs the Python of the image below it).
        """
        image_id = content_id("image", definition)
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM images WHERE id = ?", (image_id,)).fetchone()
            if row is None:
                python = next(
                    (m.group(1) for c in commands if (m := _PY_FROM.match(c))),
                    "",
                )
                for base_id in base_image_ids or []:
                    if python:
                        break
                    base = db.execute(
                        "SELECT python_version FROM images WHERE id = ?", (base_id,)
                    ).fetchone()
                    python = base["python_version"] if base is not None else ""
                db.execute(
                    "INSERT INTO images (id, spec, built, created_at, python_version)"
                    " VALUES (?, ?, 0, ?, ?)",
                    (image_id, json.dumps(commands), self.store.now(), python),
                )
            elif force_build:
                db.execute("UPDATE images SET built = 0 WHERE id = ?", (image_id,))
            db.execute(
                "INSERT OR IGNORE INTO image_layers (image_id, base_ids, context_mount_id)"
                " VALUES (?, ?, ?)",
                (image_id, json.dumps(list(base_image_ids or [])), context_mount_id),
            )
            row = db.execute("SELECT * FROM images WHERE id = ?", (image_id,)).fetchone()
            return self._load(row, self._layers(db, image_id))

    def get(self, image_id: str) -> Image:
        check_id("image", image_id)
        with self.store.read() as db:
            row = db.execute("SELECT * FROM images WHERE id = ?", (image_id,)).fetchone()
            layers = self._layers(db, image_id)
        if row is None:
            raise NotFound(f"Image {image_id!r} not found; create it with ImageGetOrCreate first.")
        return self._load(row, layers)

    def mark_built(self, image_id: str) -> Image:
        with self.store.tx() as db:
            db.execute(
                "UPDATE images SET built = 1, built_at = ? WHERE id = ?",
                (self.store.now(), image_id),
            )
        return self.get(image_id)


class Blobs:
    """Large payloads: BlobCreate reserves an id, the client PUTs the bytes over HTTP."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, content_md5_b64: str, content_sha256_b64: str, length: int) -> str:
        if length < 0:
            raise InvalidArgument(f"BlobCreate: negative content_length {length}.")
        _check_b64_digest("content_md5", content_md5_b64, 16)
        _check_b64_digest("content_sha256_base64", content_sha256_b64, 32)
        blob_id = new_id("blob")
        with self.store.tx() as db:
            db.execute(
                "INSERT INTO blobs (id, content_md5_b64, content_sha256_b64, content_length,"
                " created_at) VALUES (?, ?, ?, ?, ?)",
                (blob_id, content_md5_b64, content_sha256_b64, length, self.store.now()),
            )
        return blob_id

    def put(self, blob_id: str, data: bytes) -> str:
        """Store the uploaded bytes; returns their md5 hex (the ETag S3 would answer)."""
        md5_hex = hashlib.md5(data).hexdigest()  # noqa: S324 (S3's ETag is an md5)
        self.put_stream(blob_id, io.BytesIO(data), len(data), md5_hex)
        return md5_hex

    def put_stream(self, blob_id: str, source: IO[bytes], size: int, md5_hex: str) -> None:
        """Store `size` bytes read from `source` (md5 already computed) in chunks."""
        check_id("blob", blob_id)
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM blobs WHERE id = ?", (blob_id,)).fetchone()
            if row is None:
                raise NotFound(f"Blob {blob_id!r} not found: call BlobCreate before uploading.")
            expected_md5 = row["content_md5_b64"]
            if expected_md5 and base64.b64encode(bytes.fromhex(md5_hex)).decode() != expected_md5:
                raise InvalidArgument(
                    f"Blob {blob_id}: The Content-MD5 you specified did not match what we "
                    f"received ({size} bytes received, {row['content_length']} announced)."
                )
            db.execute("UPDATE blobs SET data = zeroblob(?) WHERE id = ?", (size, blob_id))
            rowid = db.execute("SELECT rowid FROM blobs WHERE id = ?", (blob_id,)).fetchone()[0]
            if size:
                with db.blobopen("blobs", "data", rowid) as target:
                    while chunk := source.read(1 << 20):
                        target.write(chunk)

    def get(self, blob_id: str) -> bytes:
        check_id("blob", blob_id)
        with self.store.read() as db:
            row = db.execute("SELECT data FROM blobs WHERE id = ?", (blob_id,)).fetchone()
        if row is None:
            raise NotFound(f"Blob {blob_id!r} not found.")
        if row["data"] is None:
            raise FailedPrecondition(f"Blob {blob_id!r} was created but its bytes were never PUT.")
        return bytes(row["data"])


class Mounts:
    def __init__(self, store: Store, blobs: Blobs) -> None:
        self.store = store
        self.blobs = blobs

    def missing(self, sha256_hashes: list[str]) -> list[str]:
        """The hashes (in request order) of files the emulator has not received yet."""
        with self.store.read() as db:
            return [
                h
                for h in sha256_hashes
                if db.execute("SELECT 1 FROM files WHERE sha256 = ?", (h,)).fetchone() is None
            ]

    def put_file(self, sha256: str, data: bytes | None, blob_id: str | None) -> bool:
        """Register a file's bytes (inline or from a blob); True when the file now exists."""
        if not _SHA256_HEX.match(sha256):
            raise InvalidArgument(
                f"MountPutFile: sha256_hex {sha256[:80]!r} is not 64 lowercase hex digits."
            )
        if data is None and blob_id:
            data = self.blobs.get(blob_id)
        with self.store.tx() as db:
            if data is None:
                row = db.execute("SELECT 1 FROM files WHERE sha256 = ?", (sha256,)).fetchone()
                return row is not None
            actual = hashlib.sha256(data).hexdigest()
            if actual != sha256:
                raise InvalidArgument(
                    f"MountPutFile: content hashes to {actual}, not the announced {sha256}."
                )
            db.execute(
                "INSERT OR IGNORE INTO files (sha256, size, data, blob_id, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (sha256, len(data), None if blob_id else data, blob_id, self.store.now()),
            )
        return True

    @staticmethod
    def checksum(files: list[MountFile]) -> str:
        lines = sorted(f"{f.filename}\0{f.sha256}\0{f.mode}" for f in files)
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    def _save(self, db: sqlite3.Connection, mount: Mount, namespace: str) -> None:
        db.execute(
            "INSERT OR IGNORE INTO mounts (id, name, namespace, files, checksum, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                mount.id,
                mount.name,
                namespace,
                json.dumps([[f.filename, f.sha256, f.mode] for f in mount.files]),
                mount.checksum,
                self.store.now(),
            ),
        )

    def get_or_create_from_files(self, files: list[MountFile]) -> Mount:
        """An anonymous mount of already-uploaded files, content-addressed by its file list."""
        with self.store.tx() as db:
            absent = [
                f.filename
                for f in files
                if db.execute("SELECT 1 FROM files WHERE sha256 = ?", (f.sha256,)).fetchone()
                is None
            ]
            if absent:
                raise FailedPrecondition(
                    f"MountGetOrCreate: {len(absent)} file(s) were never uploaded "
                    f"(first: {absent[0]!r}); send MountPutFile for them first."
                )
            checksum = self.checksum(files)
            mount = Mount(
                id=content_id("mount", b"files:" + checksum.encode()),
                checksum=checksum,
                name=None,
                files=files,
            )
            self._save(db, mount, "")
        return mount

    def get(self, mount_id: str) -> Mount:
        check_id("mount", mount_id)
        with self.store.read() as db:
            row = db.execute("SELECT * FROM mounts WHERE id = ?", (mount_id,)).fetchone()
        if row is None:
            raise NotFound(f"Mount {mount_id!r} not found; create it with MountGetOrCreate first.")
        files = [MountFile(f[0], f[1], f[2]) for f in json.loads(row["files"])]
        return Mount(id=row["id"], checksum=row["checksum"], name=row["name"], files=files)

    def read_file(self, sha256: str) -> bytes:
        """The bytes of an uploaded file (inline, or from the blob it arrived in)."""
        with self.store.read() as db:
            row = db.execute(
                "SELECT data, blob_id FROM files WHERE sha256 = ?", (sha256,)
            ).fetchone()
        if row is None:
            raise NotFound(f"File {sha256} was never uploaded (MountPutFile).")
        if row["data"] is not None:
            return bytes(row["data"])
        return self.blobs.get(row["blob_id"])

    def check_exists(self, mount_id: str) -> None:
        check_id("mount", mount_id)
        with self.store.read() as db:
            row = db.execute("SELECT 1 FROM mounts WHERE id = ?", (mount_id,)).fetchone()
        if row is None:
            raise NotFound(f"Mount {mount_id!r} not found; create it with MountGetOrCreate first.")

    def get_or_create_named(self, name: str, namespace: str, create: bool) -> Mount:
        """A named mount; global ones (the client's own package) always exist, empty."""
        mount_id = content_id("mount", f"named:{namespace}:{name}".encode())
        with self.store.tx() as db:
            row = db.execute("SELECT * FROM mounts WHERE id = ?", (mount_id,)).fetchone()
            if row is None:
                if not create and namespace != "global":
                    raise NotFound(f"Mount {name!r} not found.")
                mount = Mount(id=mount_id, checksum=EMPTY_SHA256, name=name, files=[])
                self._save(db, mount, namespace)
                return mount
            files = [MountFile(f[0], f[1], f[2]) for f in json.loads(row["files"])]
            return Mount(id=row["id"], checksum=row["checksum"], name=row["name"], files=files)
