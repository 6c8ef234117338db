"""Admin operations behind AdminService: rebuilds (re-embedding when the embedder changed),
rollback, compaction, snapshots, status, and the shadow flip. Domain code only."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.index import CollectionInfo, Engine, IndexParams, IndexType, RebuildProgress
from ragplane.index.backend import Store
from ragplane.server import auth
from ragplane.server.auth import KeyStore
from ragplane.server.chunking import check_window
from ragplane.server.embedding.service import EmbeddingService
from ragplane.server.memory import MemoryService
from ragplane.server.shadow.types import CaseStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    embedder: str
    started_at: float
    collections: list[CollectionInfo]
    shadow: list[CaseStatus]
    memories: int


class AdminOps:
    def __init__(
        self,
        engine: Store,
        embedding: EmbeddingService,
        memory: MemoryService,
        keys: KeyStore,
        *,
        data_dir: Path,
        started_at: float,
        shadow=None,  # server.shadow.manager.ShadowManager, when pairs are declared
        # (local embed, serving identity) -> a re-embedder that runs on a cluster
        # (server.bulk.reembed), when the ray_address setting names one
        cluster_reembed: Callable[[Callable[[list[str]], Any], str], Any] | None = None,
    ) -> None:
        self.engine = engine
        self.embedding = embedding
        self.memory = memory
        self.keys = keys
        self.data_dir = data_dir
        self.started_at = started_at
        self.shadow = shadow
        self.cluster_reembed = cluster_reembed

    @staticmethod
    def _tenant() -> str:
        return auth.current.get().tenant

    def rebuild(
        self,
        name: str,
        *,
        index_type: IndexType | None,
        params: IndexParams | None,
        reembed: bool,
        min_recall: float,
        progress: Callable[[RebuildProgress], None],
    ) -> CollectionInfo:
        tenant = self._tenant()
        info = self.engine.describe(tenant, name)
        if not 0.0 < min_recall <= 1.0:
            raise InvalidArgument(f"min_recall must be in (0, 1], got {min_recall}")
        serving = self.embedding.serving_embedder()
        changed = bool(info.embedder) and info.embedder != serving.identity
        if reembed and not info.embedder:
            raise InvalidArgument(
                f"collection {name!r} holds caller-supplied vectors; there is nothing to re-embed"
            )
        embed_fn = None
        if reembed or changed:
            check_window(info.chunking, serving, name)

            def embed_fn(texts: list[str]):  # noqa: E306 - closure over the serving embedder
                return self.embedding.embed(texts).vectors

            if self.cluster_reembed is not None:
                embed_fn = self.cluster_reembed(embed_fn, serving.identity)
            log.info(
                "rebuild of %s re-embeds with %s (was %s)", name, serving.identity, info.embedder
            )
        return self.engine.rebuild(
            tenant,
            name,
            index_type=index_type,
            params=params,
            reembed=embed_fn,
            embedder=serving.identity if embed_fn else None,
            min_recall=min_recall,
            progress=progress,
        )

    def rollback(self, name: str) -> CollectionInfo:
        return self.engine.rollback(self._tenant(), name)

    def compact(self, name: str | None) -> int:
        return self.engine.compact(self._tenant(), name)

    def snapshot(self, dest: str) -> int:
        if not dest:
            raise InvalidArgument("dir is empty; name a directory on the server's machine")
        return self.engine.snapshot(dest, also=self._snapshot_keys)

    def _snapshot_keys(self, dest: Path) -> int:
        """The API keys into a snapshot: part of it, so a failure removes the whole."""
        target = dest / "keys.db"
        if self.keys.shared:  # a PostgreSQL store's: the snapshot is an embedded store
            self.keys.export(target)
            return target.stat().st_size
        src = sqlite3.connect(str(self.data_dir / "keys.db"))
        dst = sqlite3.connect(str(target))
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        return target.stat().st_size

    @staticmethod
    def restore(snapshot_dir: Path, data_dir: Path) -> None:
        """Offline: the server must not be running on data_dir."""
        Engine.restore(snapshot_dir, data_dir)
        if (snapshot_dir / "keys.db").exists():
            shutil.copy2(snapshot_dir / "keys.db", data_dir / "keys.db")

    def user_collections(self) -> list[CollectionInfo]:
        """Every tenant's collections (memory namespaces are a kind of their own)."""
        return self.engine.list_all_collections()

    def status(self) -> Status:
        return Status(
            embedder=self.embedding.serving_embedder().identity,
            started_at=self.started_at,
            collections=self.user_collections(),
            shadow=self.shadow.status() if self.shadow else [],
            memories=self.memory.count(),
        )

    def _need_shadow(self):
        if self.shadow is None:
            raise FailedPrecondition(
                "no shadow pairs are declared; add [self_hosted.<case>] to koder.toml"
            )
        return self.shadow

    def shadow_status(self, use_case: str | None) -> list[CaseStatus]:
        return self._need_shadow().status(use_case)

    def flip(self, use_case: str, *, force: bool) -> CaseStatus:
        return self._need_shadow().flip(use_case, force=force)

    def unflip(self, use_case: str) -> CaseStatus:
        return self._need_shadow().unflip(use_case)

    def record_release(self, use_case: str):
        """(the recorded entry, whether it replaced one, the history file written)."""
        shadow = self._need_shadow()
        rec, replaced = shadow.record_release(use_case)
        return rec, replaced, str(shadow.history.path)


__all__ = ["AdminOps", "Status"]
