"""API keys: stored hashed, each with a tenant and scopes (read, write, admin).

A key is sent as `authorization: Bearer <secret>` metadata (a header over HTTP). The
secret is `rpk_<key_id>_<random>`; only sha256(secret) is stored (keys are 190-bit random,
so a fast hash is enough, as for GitHub tokens). With no keys at all, authentication is off
and the server may only bind loopback: every call then acts as tenant "default" with
every scope.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from ragplane.core.errors import InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from ragplane.core.sqlite import connect
from ragplane.core.storage import storage_errors

SCOPES = ("read", "write", "admin")
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Principal:
    tenant: str
    scopes: frozenset[str]
    key_id: str = ""


ANONYMOUS = Principal(DEFAULT_TENANT, frozenset(SCOPES))
current: contextvars.ContextVar[Principal] = contextvars.ContextVar("principal", default=ANONYMOUS)


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    tenant: str
    scopes: tuple[str, ...]
    description: str
    created_at: float
    revoked: bool


# Which scope each RPC needs; anything not listed (a new RPC) needs admin until classified.
_READ = {
    "Embed",
    "EmbedStream",
    "Info",
    "ListCollections",
    "DescribeCollection",
    "Get",
    "Search",
    "Recall",
    "ListMemories",
}
_WRITE = {"CreateCollection", "DeleteCollection", "Upsert", "Delete", "Remember", "Forget"}


def scope_for(method: str) -> str:
    name = method.rsplit("/", 1)[-1]
    if name in _READ:
        return "read"
    if name in _WRITE:
        return "write"
    return "admin"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyStore:
    """Keys in their own SQLite file (data_dir/keys.db), so auth never contends with data."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(path)
        self._dir = path.parent  # named by StorageFull / StorageReadOnly on a write
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS keys (key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, "
            "scopes TEXT NOT NULL, hash TEXT NOT NULL, description TEXT NOT NULL, "
            "created_at REAL NOT NULL, revoked INTEGER NOT NULL DEFAULT 0)"
        )
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, Principal]] = {}
        self._reload()

    def _reload(self) -> None:
        rows = self._db.execute(
            "SELECT key_id, tenant, scopes, hash FROM keys WHERE revoked = 0"
        ).fetchall()
        self._cache = {
            kid: (h, Principal(tenant, frozenset(scopes.split(",")), kid))
            for kid, tenant, scopes, h in rows
        }

    @property
    def enabled(self) -> bool:
        return bool(self._cache)

    def create(
        self,
        tenant: str,
        scopes: list[str] | tuple[str, ...],
        description: str = "",
        secret: str | None = None,
    ) -> tuple[KeyInfo, str]:
        if not tenant or len(tenant) > 128:
            raise InvalidArgument("tenant must be 1..128 characters")
        if ":" in tenant:
            # stores written before memory namespaces had a kind of their own kept them
            # under the tenant "memory:<tenant>", which their upgrade maps back to <tenant>;
            # a tenant named "memory:x" could have reached tenant x's memories there
            raise InvalidArgument(f"tenant {tenant!r} may not contain ':'")
        bad = [s for s in scopes if s not in SCOPES]
        if bad or not scopes:
            raise InvalidArgument(f"scopes must be a non-empty subset of {', '.join(SCOPES)}")
        key_id = secrets.token_hex(6) if secret is None else _key_id(secret)
        secret = secret or f"rpk_{key_id}_{secrets.token_urlsafe(24)}"
        info = KeyInfo(key_id, tenant, tuple(sorted(set(scopes))), description, time.time(), False)
        with self._lock, storage_errors(self._dir):
            self._db.execute(
                "INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, ?, ?, 0)",
                (
                    key_id,
                    tenant,
                    ",".join(info.scopes),
                    _hash(secret),
                    description,
                    info.created_at,
                ),
            )
            self._reload()
        return info, secret

    def ensure(self, secret: str, tenant: str, scopes: tuple[str, ...], description: str) -> None:
        """Create a key with this exact secret unless one exists (the bootstrap admin key)."""
        if self._lookup(secret) is None:
            self.create(tenant, scopes, description, secret=secret)

    def list(self) -> list[KeyInfo]:
        rows = self._db.execute(
            "SELECT key_id, tenant, scopes, description, created_at, revoked FROM keys "
            "ORDER BY created_at"
        ).fetchall()
        return [KeyInfo(k, t, tuple(s.split(",")), d, c, bool(r)) for k, t, s, d, c, r in rows]

    def revoke(self, key_id: str) -> bool:
        with self._lock, storage_errors(self._dir):
            cur = self._db.execute("UPDATE keys SET revoked = 1 WHERE key_id = ?", (key_id,))
            self._reload()
        if cur.rowcount == 0:
            raise NotFound(f"no key with id {key_id!r}; `ragplane admin keys list` shows them")
        return True

    def _lookup(self, secret: str) -> Principal | None:
        entry = self._cache.get(_key_id(secret))
        if entry and hmac.compare_digest(entry[0], _hash(secret)):
            return entry[1]
        return None

    def authenticate(self, method: str, context: grpc.ServicerContext) -> Principal:
        """The interceptor's `before` hook: sets `current` or raises."""
        header = ""
        for k, v in context.invocation_metadata() if self.enabled else ():
            if k == "authorization":
                header = v if isinstance(v, str) else v.decode()
        return self.check(method, header)

    def check(self, method: str, header: str, sent_as: str = "metadata") -> Principal:
        """The principal of an `authorization` value, for a call of the RPC `method` (the
        HTTP API names the RPC whose scope it needs); sets `current` or raises
        Unauthenticated (no, malformed or unknown key) or PermissionDenied (scope)."""
        if not self.enabled:
            current.set(ANONYMOUS)
            return ANONYMOUS
        if not header:
            raise Unauthenticated(f"no API key; send {sent_as} `authorization: Bearer <key>`")
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthenticated("malformed authorization; expected `Bearer <key>`")
        principal = self._lookup(secret.strip())
        if principal is None:
            raise Unauthenticated("unknown or revoked API key")
        need = scope_for(method)
        if need not in principal.scopes:
            raise PermissionDenied(
                f"{method.rsplit('/', 1)[-1]} needs the {need!r} scope; this key has "
                f"{', '.join(sorted(principal.scopes))}"
            )
        current.set(principal)
        return principal

    def close(self) -> None:
        self._db.close()


def _key_id(secret: str) -> str:
    """The id a secret is stored under: the one it names (`rpk_<id>_...`), else one derived
    from its hash (a bootstrap key of any form). One rule for storing and looking up."""
    if secret.startswith("rpk_") and secret.count("_") >= 2:
        return secret.split("_", 2)[1]
    return _hash(secret)[:12]
