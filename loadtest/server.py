"""A throwaway local ragplane server for `python -m loadtest --start-server`.

`ragplane serve` in a child process on 127.0.0.1, port 0, in a temporary data directory
that is removed afterwards; the child writes its port to a file once it serves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from loadtest.grpc_user import API_KEY_ENV

ROOT = Path(__file__).resolve().parent.parent


class LocalServer:
    """Context manager; `.target` is "127.0.0.1:<port>" once entered.

    With $RAGPLANE_API_KEY set, the server is started with that key as its bootstrap
    admin key (passed in the environment, not argv), so the load test exercises auth.
    """

    def __init__(
        self,
        embedder: str = "fake",
        settings: tuple[str, ...] = (),
        start_timeout_s: float = 300.0,
    ) -> None:
        self.embedder = embedder
        self.settings = settings  # extra FIELD=VALUE for `ragplane serve --set`
        self.start_timeout_s = start_timeout_s
        self.target = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="ragplane-loadtest-")
        tmp = Path(self._tmp.name)
        port_file = tmp / "port"
        self.log_path = tmp / "server.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if os.environ.get(API_KEY_ENV):
            env["RAGPLANE_BOOTSTRAP_ADMIN_KEY"] = os.environ[API_KEY_ENV]
        cmd = [
            sys.executable, "-m", "server.cli", "serve",
            "--host", "127.0.0.1", "--port", "0",
            "--data-dir", str(tmp / "data"),
            "--embedder", self.embedder,
            "--set", f"port_file={port_file}",
            "--set", "koder_toml=",  # no shadow pairs: measure the serving path alone
        ]  # fmt: skip
        for kv in self.settings:
            cmd += ["--set", kv]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in __exit__)
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                text = port_file.read_text().strip() if port_file.exists() else ""
                if text:
                    self.target = f"127.0.0.1:{int(text)}"
                    return self
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {self.proc.returncode}:\n{self.log_tail()}"
                    )
                time.sleep(0.1)
            raise TimeoutError(f"server did not start in {self.start_timeout_s:.0f}s")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # graceful stop: drains in-flight calls
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._tmp.cleanup()
