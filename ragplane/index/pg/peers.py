"""Who shares the store: the servers connected to it and the leases they hold, read from
PostgreSQL's own views (`pg_stat_activity`, `pg_locks`), for the operator's console.

Each server names its connections `ragplane <host>:<pid>` (libpq's `application_name`), so
the servers seen are the distinct names connected to this database now. A lease is an
advisory lock on `hashtextextended(name, 0)` (`PgStore.lease`): PostgreSQL keeps only the
64-bit key, so the names are found by hashing the ones this store can have -- the
cluster's once-only jobs and a rebuild of each collection -- and any other key is shown
as it is."""

from __future__ import annotations

import os
import socket
from typing import Any

import psycopg

from ragplane.index.types import Lease, Peer

# PostgreSQL keeps the first 63 bytes of an application_name
APP_NAME = f"ragplane {socket.gethostname()}:{os.getpid()}"[:63]
APP_PREFIX = "ragplane "
# the once-only jobs of a cluster (`Store.run_once` names, as `PgEngine.run_once` leases them)
ONCE = ("memory-sweep",)


def servers(c: psycopg.Connection[Any]) -> list[Peer]:
    rows = c.execute(
        "SELECT application_name, COALESCE(host(client_addr), 'local'),"
        " EXTRACT(EPOCH FROM MIN(backend_start)), COUNT(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE %s"
        " GROUP BY 1, 2 ORDER BY 3",
        (APP_PREFIX + "%",),
    ).fetchall()
    return [
        Peer(str(name), str(addr), float(since), int(n), name == APP_NAME)
        for name, addr, since, n in rows
    ]


def leases(c: psycopg.Connection[Any]) -> list[Lease]:
    names = [f"once/{n}" for n in ONCE] + [
        f"rebuild/{tenant}/{kind}/{name}"
        for tenant, kind, name in c.execute("SELECT tenant, kind, name FROM rp_collections")
    ]
    rows = c.execute(
        "WITH held AS ("
        "  SELECT (l.classid::bigint << 32) | l.objid::bigint AS key, a.application_name,"
        "   EXTRACT(EPOCH FROM COALESCE(a.xact_start, a.query_start, a.backend_start)) AS at"
        "  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        "  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
        "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
        " SELECT COALESCE(n.name, 'advisory key ' || held.key), held.application_name, held.at"
        " FROM held LEFT JOIN unnest(%s::text[]) AS n(name)"
        "  ON hashtextextended(n.name, 0) = held.key ORDER BY 3",
        (names,),
    ).fetchall()
    return [Lease(str(name), str(holder), float(at)) for name, holder, at in rows]
