"""Storage faults at the boundary of a store: a full or read-only filesystem becomes a domain
error that names the data directory and its free space, instead of a bare OSError or
sqlite3.OperationalError that the error table can only report as a bug.

SQLite reports ENOSPC as SQLITE_FULL and a read-only file or filesystem as SQLITE_READONLY;
it rolls a statement (and, for SQLITE_FULL, possibly the whole transaction) back, so nothing
half-written is left behind.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ragplane.core.errors import RagplaneError, StorageFull, StorageReadOnly
from ragplane.core.sqlite import SQLITE_CORRUPT, SQLITE_NOTADB, corrupt

_SQLITE_READONLY = 8
_SQLITE_FULL = 13
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_READONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def free_space(directory: Path) -> str:
    """'<free> free of <total>' for the filesystem of `directory`, or why it is unknown."""
    # a directory that is not there yet (a snapshot's): its filesystem is its nearest parent's
    existing = next((d for d in (directory, *directory.parents) if d.exists()), directory)
    try:
        usage = shutil.disk_usage(existing)
    except OSError as exc:
        return f"free space unknown: {exc.strerror or exc}"
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


WRITE = "nothing was written; reads still work"
OPEN = "the store cannot be opened"
SNAPSHOT = "no snapshot was left there (a partial one was removed); the collections still serve"
DATA_DIR = "the data directory"
# what to do once the space is back, by what the fault cost
_AGAIN = {
    WRITE: "and retry; no restart is needed",
    OPEN: "and start again",
    SNAPSHOT: "and retry, or snapshot to another directory",
}


def storage_error(
    exc: BaseException | None, directory: Path, during: str = WRITE, place: str = DATA_DIR
) -> RagplaneError | None:
    """The domain error for a storage fault under `directory` (full, read-only, damaged), or
    None when `exc` is not one.
    `during` says what the fault cost (WRITE: a refused write; OPEN: the server cannot start;
    SNAPSHOT: a snapshot that was given up); `place` names `directory` in the message."""
    full = readonly = False
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
        if code in (SQLITE_CORRUPT, SQLITE_NOTADB):
            return corrupt(directory, str(exc), data_dir=directory)
        full = code == _SQLITE_FULL
        readonly = code == _SQLITE_READONLY
    elif isinstance(exc, OSError):
        full = exc.errno in _FULL_ERRNOS
        readonly = exc.errno in _READONLY_ERRNOS
    if full:
        return StorageFull(
            f"{place} {str(directory)!r} is full ({free_space(directory)}); "
            f"{during}. Free space there (or grow the volume) {_AGAIN[during]}"
        )
    if readonly:
        return StorageReadOnly(
            f"{place} {str(directory)!r} is not writable ({exc}); {during}. "
            "Make it writable again (remount read-write, fix ownership) and retry"
        )
    return None


@contextmanager
def storage_errors(directory: Path, during: str = WRITE, place: str = DATA_DIR) -> Iterator[None]:
    """Re-raise a full or read-only filesystem under `directory` as StorageFull or
    StorageReadOnly; other errors pass through unchanged."""
    try:
        yield
    except (sqlite3.Error, OSError) as exc:
        mapped = storage_error(exc, directory, during, place)
        if mapped is None:
            raise
        raise mapped from exc
