"""A daemon thread that runs one function every few seconds: how a server of a cluster
follows state that other servers change in the shared store (API keys, the shadow's flips).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ragplane.core.errors import RagplaneError

log = logging.getLogger(__name__)


class Poller:
    """`fn()` every `interval` seconds until `close()`. A RagplaneError (the store is
    unreachable: Unavailable) is logged once per outage and kept in `error` until `fn`
    succeeds again; anything else is a bug, logged with its traceback; the thread goes on."""

    def __init__(self, what: str, interval: float, fn: Callable[[], object]) -> None:
        self.what = what
        self.interval = interval
        self.error = ""  # why the last call failed; "" after a success
        self._fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"poll {what}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._fn()
            except RagplaneError as exc:
                if not self.error:
                    log.warning("%s cannot be re-read: %s", self.what, exc)
                self.error = str(exc) or type(exc).__name__
                continue
            except Exception:
                log.exception("%s: re-reading failed", self.what)
                continue
            if self.error:
                log.warning("%s: re-read again", self.what)
                self.error = ""

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(10)
