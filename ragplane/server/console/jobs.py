"""Rebuilds started from the console: each runs `AdminOps.rebuild` on a thread of its own
(as the Rebuild RPC does: it finishes even if the browser goes away), and keeps its latest
progress for the page that polls it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ragplane.core import cpus
from ragplane.core.errors import FailedPrecondition
from ragplane.index import IndexType, RebuildProgress
from ragplane.server import auth
from ragplane.server.admin import AdminOps


@dataclass
class Job:
    collection: str
    started_at: float = field(default_factory=time.time)
    progress: RebuildProgress | None = None
    done: bool = False
    error: str = ""
    finished_at: float = 0.0


class RebuildJobs:
    def __init__(self, admin: AdminOps) -> None:
        self._admin = admin
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], Job] = {}

    def start(self, name: str, *, index_type: IndexType | None, reembed: bool) -> Job:
        principal = auth.current.get()
        key = (principal.tenant, name)
        with self._lock:
            running = self._jobs.get(key)
            if running is not None and not running.done:
                raise FailedPrecondition(f"a rebuild of {name!r} is running already")
            job = self._jobs[key] = Job(name)

        def run() -> None:
            auth.current.set(principal)
            try:
                self._admin.rebuild(
                    name, index_type=index_type, params=None, reembed=reembed,
                    min_recall=0.95, progress=lambda p: setattr(job, "progress", p),
                )
            except Exception as exc:  # shown on the collection's page
                job.error = str(exc) or type(exc).__name__
            finally:
                job.finished_at = time.time()
                job.done = True

        with cpus.wide():  # on every core, not the request core (ragplane.core.cpus)
            threading.Thread(target=run, name=f"console-rebuild-{name}", daemon=True).start()
        return job

    def get(self, name: str) -> Job | None:
        with self._lock:
            return self._jobs.get((auth.current.get().tenant, name))
