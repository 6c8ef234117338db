"""API keys: stored hashed, each with a tenant and scopes (read, write, admin).

A key is sent as `authorization: Bearer <secret>` metadata (a header over HTTP). The
secret is `rpk_<key_id>_<random>`; only sha256(secret) is stored (keys are 190-bit random,
so a fast hash is enough, as for GitHub tokens). With no keys at all, authentication is off
and the server may only bind loopback: every call then acts as tenant "default" with
every scope.

With a PostgreSQL store the keys are the cluster's (table rp_keys): each server re-reads
them every FOLLOW_S and judges no call on a read older than MAX_STALE_S (UNAVAILABLE with
retry-after instead: it could not know of a revocation made elsewhere).
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from ragplane.core.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from ragplane.core.poller import Poller
from ragplane.core.serverdb import ServerDb, SqliteServerDb, Tables

RETRY_AFTER_S = 1.0

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


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS keys (key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, "
    "scopes TEXT NOT NULL, hash TEXT NOT NULL, description TEXT NOT NULL, "
    "created_at REAL NOT NULL, revoked INTEGER NOT NULL DEFAULT 0)"
)
TABLES = Tables("keys.db", {"keys": "keys"}, _SCHEMA)
# With a shared store, keys made or revoked on another server: this server re-reads them
# every FOLLOW_S, and refuses to judge a key (UNAVAILABLE) on a read older than MAX_STALE_S,
# so a key revoked anywhere is refused everywhere within MAX_STALE_S.
FOLLOW_S = 0.5
MAX_STALE_S = 2.0


class KeyStore:
    """Keys in the server's own database, `TABLES` opened by the store it runs on: their own
    SQLite file (data_dir/keys.db), so auth never contends with data, or a shared store's
    table, the same keys on every server of the cluster. `path`: that SQLite file."""

    def __init__(self, path: Path | None = None, *, db: ServerDb | None = None) -> None:
        if db is None:
            assert path is not None, "KeyStore needs a path or a db"
            db = SqliteServerDb(path, TABLES)
        self._db = db
        self._lock = threading.Lock()  # one reload at a time: an older read never wins
        self._cache: dict[str, tuple[str, Principal]] = {}
        self._read_at = 0.0  # monotonic time the cached read began
        self._reload()
        self._follower = Poller("API keys", FOLLOW_S, self._reload) if db.shared else None

    def _reload(self) -> None:
        with self._lock:
            began = time.monotonic()
            rows = self._db.read(
                "SELECT key_id, tenant, scopes, hash FROM {keys} WHERE revoked = 0"
            )
            self._cache = {
                kid: (h, Principal(tenant, frozenset(scopes.split(",")), kid))
                for kid, tenant, scopes, h in rows
            }
            self._read_at = began

    def _keys(self) -> dict[str, tuple[str, Principal]]:
        """The keys to judge a call by: with a shared store, only a recent read of them."""
        if self._db.shared:
            age = time.monotonic() - self._read_at
            if age > MAX_STALE_S:
                raise Unavailable(
                    f"API keys cannot be checked: their last read is {age:.1f} s old "
                    f"({self._follower and self._follower.error or 'the store is slow'})",
                    RETRY_AFTER_S,
                )
        return self._cache

    @property
    def shared(self) -> bool:
        """The keys are a cluster's, in PostgreSQL (no keys.db to copy or restore)."""
        return self._db.shared

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
        with self._db.write() as execute:
            execute(
                "INSERT INTO {keys} (key_id, tenant, scopes, hash, description, created_at, "
                "revoked) VALUES (?, ?, ?, ?, ?, ?, 0) ON CONFLICT (key_id) DO UPDATE SET "
                "tenant = excluded.tenant, scopes = excluded.scopes, hash = excluded.hash, "
                "description = excluded.description, created_at = excluded.created_at, "
                "revoked = 0",
                (key_id, tenant, ",".join(info.scopes), _hash(secret), description,
                 info.created_at),
            )  # fmt: skip
        self._reload()
        return info, secret

    def ensure(self, secret: str, tenant: str, scopes: tuple[str, ...], description: str) -> None:
        """Create a key with this exact secret unless one exists (the bootstrap admin key)."""
        if self._lookup(secret) is None:
            self.create(tenant, scopes, description, secret=secret)

    def list(self) -> list[KeyInfo]:
        rows = self._db.read(
            "SELECT key_id, tenant, scopes, description, created_at, revoked FROM {keys} "
            "ORDER BY created_at"
        )
        return [KeyInfo(k, t, tuple(s.split(",")), d, c, bool(r)) for k, t, s, d, c, r in rows]

    def revoke(self, key_id: str) -> bool:
        with self._db.write() as execute:
            cur = execute("UPDATE {keys} SET revoked = 1 WHERE key_id = ?", (key_id,))
            found = cur.rowcount
        self._reload()
        if found == 0:
            raise NotFound(f"no key with id {key_id!r}; `ragplane admin keys list` shows them")
        return True

    def export(self, target: Path) -> None:
        """Every key, revoked ones too, hashed as stored, into a new keys.db at `target`:
        a PostgreSQL store's keys in a snapshot, which is an embedded store."""
        rows = self._db.read(
            "SELECT key_id, tenant, scopes, hash, description, created_at, revoked FROM {keys}"
        )
        out = sqlite3.connect(str(target))
        try:
            out.execute(_SCHEMA)
            out.executemany("INSERT INTO keys VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            out.commit()
        finally:
            out.close()

    def _lookup(self, secret: str) -> Principal | None:
        entry = self._keys().get(_key_id(secret))
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
        if not self._keys():
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
        if self._follower is not None:
            self._follower.close()
        self._db.close()


def _key_id(secret: str) -> str:
    """The id a secret is stored under: the one it names (`rpk_<id>_...`), else one derived
    from its hash (a bootstrap key of any form). One rule for storing and looking up."""
    if secret.startswith("rpk_") and secret.count("_") >= 2:
        return secret.split("_", 2)[1]
    return _hash(secret)[:12]
