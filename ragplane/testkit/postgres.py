"""A throwaway local PostgreSQL for tests, benchmarks and `make serve-cluster`: initdb and
pg_ctl from Debian's `postgresql` package, in a folder of its own, run as the `postgres`
user when we are root (PostgreSQL refuses to run as root), on 127.0.0.1 with trust auth.

    with LocalPostgres() as pg:
        url = pg.create_database("t1")   # postgresql://postgres@127.0.0.1:PORT/t1
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg


def find_bin(name: str) -> str | None:
    """A PostgreSQL server binary: Debian keeps them in /usr/lib/postgresql/<v>/bin."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return shutil.which(name)


def available() -> bool:
    return find_bin("initdb") is not None and find_bin("pg_ctl") is not None


def until(ok: Callable[[], object], timeout: float = 30.0) -> float:
    """Seconds until `ok()` held (polled every 20 ms); AssertionError after `timeout`."""
    t0 = time.monotonic()
    while not ok():
        assert time.monotonic() - t0 < timeout, f"never happened in {timeout:.0f} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """initdb + pg_ctl start in `root` (a new temporary folder by default)."""

    def __init__(self, root: str | os.PathLike | None = None, port: int = 0,
                 durable: bool = False) -> None:
        if not available():
            raise RuntimeError(
                "PostgreSQL's server binaries are not installed; on Debian/Ubuntu: "
                "apt-get install postgresql (scripts/install_postgres.sh does it)"
            )
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="ragplane-pg-"))
        self.data = self.root / "data"
        self.port = port or free_port()
        self.durable = durable
        self._as_root = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = list(args)
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd="/")
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{Path(args[0]).name} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-800:]}"
            )
        return done

    def start(self) -> LocalPostgres:
        self.root.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o755)
            if self._run("test", "-x", str(self.root), check=False).returncode != 0:
                raise RuntimeError(
                    f"the postgres user cannot reach {self.root}: a folder above it is "
                    "private (mode 700?); put the PostgreSQL folder where others may enter"
                )
        if not (self.data / "PG_VERSION").exists():
            self._run(find_bin("initdb"), "-D", str(self.data), "-U", "postgres",
                      "--auth=trust", "-E", "UTF8", "--no-instructions")
        self.pg_ctl("start")
        return self

    def pg_ctl(self, action: str) -> None:
        """start, stop (fast: every committed transaction is kept) or restart."""
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=300"
        if not self.durable:  # tests: PostgreSQL itself is not the one killed
            opts += " -c fsync=off -c full_page_writes=off"
        args = [find_bin("pg_ctl"), "-D", str(self.data), "-w", "-t", "60"]
        if action in ("start", "restart"):
            args += ["-o", opts, "-l", str(self.root / "postgres.log")]
        if action in ("stop", "restart"):
            args += ["-m", "fast"]
        self._run(*args, action)

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self, remove: bool = True) -> None:
        self._run(find_bin("pg_ctl"), "-D", str(self.data), "-w", "-m", "immediate", "stop",
                  check=False)
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
