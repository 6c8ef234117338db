"""The console's collection and store pages: each a function of (request, form) run on
the handler pool, calling the domain services the RPCs call, returning the template and
what it shows (or a redirect, after an action)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ragplane.core.errors import InvalidArgument
from ragplane.index import IndexType
from ragplane.server.console.jobs import RebuildJobs
from ragplane.server.console.playground import Playground

PAGE_SIZE = 50


def _int(form: dict[str, str], name: str, default: int, lo: int = 0, hi: int = 10**6) -> int:
    raw = form.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a whole number, got {raw!r}") from None
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be in {lo}..{hi}, got {value}")
    return value


def dir_size(path: Path) -> int:
    """Bytes of the files under `path` (the data directory: SQLite, WAL, FAISS files)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:  # removed meanwhile (a checkpoint replaced)
                continue
    return total


class Pages:
    def __init__(self, runtime: Any, jobs: RebuildJobs) -> None:
        self.rt = runtime
        self.jobs = jobs
        self.playground = Playground(runtime.collections)

    # -- collections ---------------------------------------------------------------------

    def collections(self, request: Request, form: dict[str, str]):
        colls = self.rt.collections.list()
        return "collections.html", {
            "collections": colls,
            "data_dir": self.rt.settings.data_dir,
            "data_bytes": dir_size(Path(self.rt.settings.data_dir)),
        }

    def collection(self, request: Request, form: dict[str, str]):
        name = request.path_params["name"]
        info = self.rt.collections.describe(name)
        page = _int(form, "page", 0)
        items, more = self.rt.collections.items(name, page=page, page_size=PAGE_SIZE)
        return "collection.html", {
            "info": info, "items": items, "page": page, "more": more,
            "job": self.jobs.get(name), "index_types": [t.value for t in IndexType],
        }

    def delete(self, request: Request, form: dict[str, str]) -> Response:
        name = request.path_params["name"]
        if form.get("confirm", "") != name:
            raise InvalidArgument(
                f"type the collection's name ({name}) to confirm that it is to be deleted"
            )
        self.rt.collections.delete_collection(name)
        return RedirectResponse("/console/collections", 303)

    def rebuild(self, request: Request, form: dict[str, str]) -> Response:
        name = request.path_params["name"]
        self.rt.collections.describe(name)  # NOT_FOUND before a thread starts
        kind = form.get("index_type", "")
        try:
            index_type = IndexType(kind) if kind else None
        except ValueError:
            raise InvalidArgument(f"index_type {kind!r} is not one of flat, hnsw, ivf_pq") from None
        self.jobs.start(name, index_type=index_type, reembed=form.get("reembed") == "on")
        return RedirectResponse(f"/console/collections/{name}", 303)

    def progress(self, request: Request, form: dict[str, str]):
        name = request.path_params["name"]
        return "_progress.html", {"job": self.jobs.get(name), "name": name}

    # -- the store -----------------------------------------------------------------------

    def store(self, request: Request, form: dict[str, str]):
        st = self.rt.admin.status()
        settings = self.rt.settings
        follower = self.rt.backend.follower  # None: this server is its store's only one
        position = None
        if follower is not None:
            position = {
                "applied": follower.applied, "head_seen": follower.head_seen,
                "lag_seconds": follower.lag_seconds(), "ready": follower.ready,
                "broken": follower.broken or "",
            }
            position["servers"], position["leases"] = follower.peers()
        memory = self.rt.memory
        return "store.html", {
            "status": st,
            "embedded": follower is None,
            "where": self.rt.backend.where,
            "data_dir": settings.data_dir,
            "data_bytes": dir_size(Path(settings.data_dir)),
            "position": position,
            "namespaces": memory.namespaces(),
            "sweep_every": memory.sweep_every,
            "last_sweep": memory.last_sweep,
            "half_life": memory.half_life_seconds,
        }
