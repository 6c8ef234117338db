"""Consistent copies of a data directory, and restoring one."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

from ragplane.core.errors import Corrupt, FailedPrecondition, InvalidArgument
from ragplane.core.sqlite import connect
from ragplane.core.storage import SNAPSHOT, storage_error
from ragplane.index import faiss_index as fx
from ragplane.index.checkpoints import checkpoint_or_log
from ragplane.index.context import Context, data_dir_lock
from ragplane.index.store import DB_NAME


def _fsync_file(path: Path) -> int:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
        return os.fstat(f.fileno()).st_size


DEST = "the snapshot destination"


def _prepare_dest(dest: Path) -> bool:
    """Make `dest` ready for a snapshot; whether it was created here (else it was empty)."""
    if dest.exists() and not dest.is_dir():
        raise InvalidArgument(f"snapshot target {str(dest)!r} is a file; name a directory")
    if dest.exists() and any(dest.iterdir()):
        raise InvalidArgument(f"snapshot directory {str(dest)!r} is not empty; pick a new one")
    created = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # read-only, permission denied, a file on the path
        raise storage_error(e, dest, SNAPSHOT, DEST) or FailedPrecondition(
            f"cannot create snapshot directory {str(dest)!r}: {e.strerror}"
        ) from None
    return created


def _discard(dest: Path, created: bool) -> None:
    """Remove a partial snapshot: `dest` as it was before, absent or empty."""
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for p in dest.iterdir() if dest.is_dir() else ():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def snapshot(
    ctx: Context, dest_dir: str | os.PathLike[str], also: Callable[[Path], int] | None = None
) -> int:
    """Write a consistent copy of the store and index checkpoints to `dest_dir` (which
    must be empty or absent), then whatever `also` writes into it. Writes may continue
    meanwhile. Returns bytes written.

    A destination that fills up or is read-only raises StorageFull / StorageReadOnly naming
    it and its free space; a failed snapshot of any kind is removed, and the collections
    are untouched: they keep serving."""
    ctx.check_open()
    dest = Path(dest_dir)
    created = _prepare_dest(dest)
    try:
        total = _write(ctx, dest)
        return total + (also(dest) if also else 0)
    except BaseException as exc:
        _discard(dest, created)
        if not isinstance(exc, (OSError, sqlite3.Error)):
            raise
        mapped = storage_error(exc, dest, SNAPSHOT, DEST)
        if isinstance(mapped, Corrupt):  # the file it was copied from is damaged, not ours
            mapped = storage_error(exc, ctx.dir)
        if mapped is None:
            raise
        raise mapped from exc


def _write(ctx: Context, dest: Path) -> int:
    total = 0
    # checkpoints first: each covers a seq the later database copy also covers, and seqs
    # are never reused, so a restored index never holds a vector the store lacks. One that
    # cannot be written (a full data disk) leaves the last one, older but as safe: the
    # restored index replays the rest from the store. That is when a snapshot to another
    # volume is wanted most.
    for coll in ctx.all():
        checkpoint_or_log(coll)
        with coll.ckpt_lock:
            if coll.dir.is_dir():
                out = dest / "indexes" / coll.dir.name
                out.mkdir(parents=True, exist_ok=True)
                for p in coll.dir.iterdir():
                    if fx.parse_checkpoint_name(p.name):
                        shutil.copyfile(p, out / p.name)
                        total += _fsync_file(out / p.name)
    # one backup step on a reader connection copies a single WAL snapshot of the
    # database without holding the writer lock, so upserts continue meanwhile
    source, target = connect(ctx.db_path), sqlite3.connect(dest / DB_NAME)
    try:
        source.backup(target, pages=-1)
    finally:
        target.close()
        source.close()
    total += _fsync_file(dest / DB_NAME)
    fx.fsync_dir(dest)
    return total


def restore(snapshot_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str]) -> None:
    """Replace `data_dir`'s contents with a snapshot. No Engine may have it open."""
    src, dst = Path(snapshot_dir), Path(data_dir)
    if not (src / DB_NAME).is_file():
        raise InvalidArgument(f"{src.name!r} is not a snapshot: it has no {DB_NAME}")
    dst.mkdir(parents=True, exist_ok=True)
    busy = (
        f"data directory {dst.name!r} is in use by a running Engine; stop it before restoring"
    )
    with data_dir_lock(dst, busy):
        for suffix in ("", "-wal", "-shm"):
            (dst / (DB_NAME + suffix)).unlink(missing_ok=True)
        shutil.rmtree(dst / "indexes", ignore_errors=True)
        if (src / "indexes").is_dir():
            shutil.copytree(src / "indexes", dst / "indexes")
        tmp = dst / (DB_NAME + ".restoring")
        shutil.copyfile(src / DB_NAME, tmp)
        _fsync_file(tmp)
        os.replace(tmp, dst / DB_NAME)
        fx.fsync_dir(dst)
