"""Domain errors.

Domain code (index/, embedding, memory, shadow) raises these; one interceptor
(`ragplane.server.interceptors.ErrorInterceptor`) maps them to gRPC status codes through one
table. Anything else that escapes a servicer is a bug and becomes INTERNAL with the
traceback logged. Messages are read by people: say what was wrong and what to do.
"""

from __future__ import annotations


class RagplaneError(Exception):
    """Base of every error that carries a user-facing message."""


class InvalidArgument(RagplaneError):
    """The request itself is wrong (bad field, out of range, malformed filter)."""


class NotFound(RagplaneError):
    """A named collection, namespace, key or item does not exist."""


class AlreadyExists(RagplaneError):
    """Creating something whose name is taken."""


class FailedPrecondition(RagplaneError):
    """The request is well-formed but the system's state refuses it (e.g. embedder mismatch)."""


class ResourceExhausted(RagplaneError):
    """A queue or limit is full; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unauthenticated(RagplaneError):
    """No key, or a key that does not exist or was revoked."""


class PermissionDenied(RagplaneError):
    """The key lacks the scope, or the resource belongs to another tenant."""


class Unavailable(RagplaneError):
    """The server is shutting down or a dependency is not ready; retry elsewhere or after
    `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StorageFull(ResourceExhausted):
    """The data directory's filesystem has no room for a write (ENOSPC, SQLITE_FULL).
    Nothing was written; reads still work and writes succeed again once space is freed."""

    def __init__(self, message: str, retry_after: float = 30.0) -> None:
        super().__init__(message, retry_after)


class StorageReadOnly(FailedPrecondition):
    """The data directory cannot be written (a read-only filesystem, lost permissions).
    Nothing was written; an operator has to make it writable again."""


class Corrupt(RagplaneError):
    """A store's file is damaged (a torn write, a bad disk, an edit by hand); nothing is
    served from it until it is restored."""
