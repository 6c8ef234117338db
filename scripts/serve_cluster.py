"""`make serve-cluster`: a local PostgreSQL (Debian's binaries, initdb + pg_ctl in
ragplane-cluster/pg, run as the postgres user when we are root) and three ragplane servers
sharing it on 127.0.0.1:50051-50053, each with its own cache in ragplane-cluster/sN.
Ctrl-C (or SIGTERM) drains the servers, then stops PostgreSQL; the data stays for next time.

    python scripts/serve_cluster.py [--servers 3] [--base-port 50051] [--pg-port 55432]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from ragplane.testkit.postgres import LocalPostgres

ROOT = Path("ragplane-cluster")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--base-port", type=int, default=50051)
    ap.add_argument("--pg-port", type=int, default=55432)
    ap.add_argument("--embedder", default="auto")
    args = ap.parse_args()
    ROOT.mkdir(exist_ok=True)
    pg = LocalPostgres(ROOT.resolve() / "pg", port=args.pg_port, durable=True).start()
    with psycopg.connect(pg.url(), autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'ragplane'").fetchone():
            c.execute("CREATE DATABASE ragplane")
    url = pg.url("ragplane")
    procs = []
    try:
        for i in range(args.servers):
            port = args.base_port + i
            procs.append(subprocess.Popen([
                sys.executable, "-m", "ragplane.server.cli", "serve", "--port", str(port),
                "--data-dir", str(ROOT / f"s{i + 1}"), "--store", url,
                "--embedder", args.embedder,
            ]))
        targets = [f"127.0.0.1:{args.base_port + i}" for i in range(args.servers)]
        print(json.dumps({"store": url, "servers": targets}), flush=True)
        print(f"serve-cluster: {args.servers} servers on PostgreSQL {url}; clients: "
              f"Client({targets!r}) round robin; Ctrl-C stops", flush=True)
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        while not stop and all(p.poll() is None for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        pg.pg_ctl("stop")
    failed = [p.returncode for p in procs if p.returncode not in (0, -signal.SIGTERM)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
