"""A throwaway local ragplane server for `python -m loadtest --start-server`.

`ragplane serve` in a child process on 127.0.0.1, port 0, in a temporary data directory
that is removed afterwards: testkit's SubprocessServer, the one the tests use.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import TracebackType

from loadtest.grpc_user import API_KEY_ENV
from ragplane.testkit.harness import SubprocessServer


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
        self._server: SubprocessServer | None = None

    def __enter__(self) -> LocalServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="ragplane-loadtest-")
        env = {"TRANSFORMERS_OFFLINE": "1"}
        if os.environ.get(API_KEY_ENV):
            env["RAGPLANE_BOOTSTRAP_ADMIN_KEY"] = os.environ[API_KEY_ENV]
        extra = ["--host", "127.0.0.1"]
        for kv in self.settings:
            extra += ["--set", kv]
        self._server = SubprocessServer(
            Path(self._tmp.name) / "data", *extra, env=env, embedder=self.embedder
        )
        try:
            self._server.start(timeout=self.start_timeout_s)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.target = f"127.0.0.1:{self._server.port}"
        return self

    def log_tail(self, n: int = 3000) -> str:
        assert self._server is not None
        self._server.log.flush()
        return self._server.log_path.read_text(errors="replace")[-n:]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.stop(30)  # graceful stop: drains in-flight calls
        self._tmp.cleanup()
