"""A real ragplane server for tests: in-process on port 0 (restartable over the same data
directory), or as a subprocess that can be killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ragplane.server.settings import Settings
from ragplane.v1 import (
    admin_pb2_grpc,
    embed_pb2_grpc,
    index_pb2_grpc,
    memory_pb2_grpc,
    search_pb2_grpc,
)

ROOT = Path(__file__).resolve().parents[2]

#: Set (by scripts/run_tests.sh) to a PostgreSQL URL with the right to create databases:
#: every server of the harness then uses a PostgreSQL store, a database per data directory.
TEST_PG_ENV = "RAGPLANE_TEST_PG"


def test_store(data_dir: Path) -> str | None:
    """The PostgreSQL store of a test server's data directory (its own database, kept
    across restarts over that directory), or None for the embedded store."""
    admin = os.environ.get(TEST_PG_ENV, "")
    if not admin:
        return None
    import hashlib

    import psycopg

    name = "rp_" + hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:16]
    with psycopg.connect(admin, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')
    return admin.rsplit("/", 1)[0] + "/" + name


@dataclass
class Stubs:
    channel: grpc.Channel
    embed: embed_pb2_grpc.EmbedServiceStub
    index: index_pb2_grpc.IndexServiceStub
    search: search_pb2_grpc.SearchServiceStub
    memory: memory_pb2_grpc.MemoryServiceStub
    admin: admin_pb2_grpc.AdminServiceStub

    @classmethod
    def dial(cls, target: str, credentials: grpc.ChannelCredentials | None = None) -> Stubs:
        opts = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
        ]
        ch = (
            grpc.secure_channel(target, credentials, options=opts)
            if credentials
            else grpc.insecure_channel(target, options=opts)
        )
        grpc.channel_ready_future(ch).result(timeout=30)
        return cls(
            ch,
            embed_pb2_grpc.EmbedServiceStub(ch),
            index_pb2_grpc.IndexServiceStub(ch),
            search_pb2_grpc.SearchServiceStub(ch),
            memory_pb2_grpc.MemoryServiceStub(ch),
            admin_pb2_grpc.AdminServiceStub(ch),
        )

    def close(self) -> None:
        self.channel.close()


class InProcessServer:
    """create_server(settings) on port 0; `restart()` closes and reopens over the same data."""

    def __init__(
        self,
        data_dir: Path,
        embedder: Any = None,
        embedder_name: str = "fake",
        clock: Any = None,
        shadow_embedders: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        self.data_dir = data_dir
        self.embedder = embedder
        self.clock = clock
        self.shadow_embedders = shadow_embedders
        self.overrides = {"embedder": embedder_name, "koder_toml": "", **overrides}
        if "store" not in overrides and (url := test_store(data_dir)):
            self.overrides["store"] = url
        self.server = self.runtime = self.stubs = None
        self.start()

    @property
    def settings(self) -> Settings:
        return Settings.from_mapping(
            {"host": "127.0.0.1", "port": 0, "data_dir": str(self.data_dir), **self.overrides}
        )

    def start(self) -> None:
        from ragplane.server.app import create_server

        embedder = self.embedder() if callable(self.embedder) else self.embedder
        kw: dict[str, Any] = {"shadow_embedders": self.shadow_embedders}
        if self.clock is not None:
            kw["clock"] = self.clock
        self.server, self.port, self.runtime = create_server(self.settings, embedder=embedder, **kw)
        self.server.start()
        self.stubs = Stubs.dial(f"127.0.0.1:{self.port}")

    def stop(self, grace: float = 2.0) -> None:
        if self.server is None:
            return
        self.stubs.close()
        self.server.stop(grace).wait()
        self.runtime.close()
        self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()


class SubprocessServer:
    """`ragplane serve` in a child process, for SIGKILL and SIGTERM tests."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        embedder: str = "fake",
        cwd: Path | None = None,
    ) -> None:
        """`cwd`: the checkout whose `ragplane` serves (a benchmark's baseline; this one
        by default)."""
        self.data_dir = data_dir
        self.cwd = cwd or ROOT
        self.extra = extra
        self.embedder = embedder
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    def start(self, timeout: float = 60.0) -> None:
        port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        port_file.unlink(missing_ok=True)
        url = None if any("store=" in a for a in self.extra) else test_store(self.data_dir)
        store = ["--set", f"store={url}"] if url else []
        self.log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ragplane.server.cli",
                "serve",
                "--port",
                "0",
                "--data-dir",
                str(self.data_dir),
                "--embedder",
                self.embedder,
                "--set",
                f"port_file={port_file}",
                "--set",
                "koder_toml=",
                *store,
                *self.extra,
            ],
            cwd=self.cwd,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text())
                self.stubs = Stubs.dial(f"127.0.0.1:{self.port}")
                return
            if self.proc.poll() is not None:
                self.log.close()
                log = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log}")
            time.sleep(0.05)
        raise TimeoutError("server did not start")

    def kill(self) -> None:
        assert self.proc is not None
        self.stubs.close()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.stubs.close()
        self.log.close()
        return rc

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a graceful drain), SIGKILL if it takes longer than `timeout`; no-op
        when the server is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.terminate(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
