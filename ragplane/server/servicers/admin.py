from __future__ import annotations

import queue
import threading
import time

import grpc

from ragplane.core import cpus
from ragplane.index import RebuildProgress
from ragplane.server import __version__, auth
from ragplane.server import conversions as conv
from ragplane.server.admin import AdminOps
from ragplane.v1 import admin_pb2, admin_pb2_grpc


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, ops: AdminOps) -> None:
        self._ops = ops

    def Rebuild(self, request: admin_pb2.RebuildRequest, context: grpc.ServicerContext):
        updates: queue.Queue[RebuildProgress | BaseException | None] = queue.Queue()
        tenant = auth.current.get()

        def run() -> None:
            auth.current.set(tenant)
            try:
                self._ops.rebuild(
                    request.collection,
                    index_type=(
                        conv.index_type_from_pb(request.index_type) if request.index_type else None
                    ),
                    params=conv.params_from_pb(request.params)
                    if request.HasField("params")
                    else None,
                    reembed=request.reembed,
                    min_recall=request.min_recall or 0.95,
                    progress=updates.put,
                )
                updates.put(None)
            except BaseException as exc:  # handed to the streaming call below
                updates.put(exc)

        # The rebuild runs on its own thread: it finishes even if the caller goes away; on
        # every core, not this handler's (ragplane.core.cpus).
        with cpus.wide():
            threading.Thread(target=run, name=f"rebuild-{request.collection}",
                             daemon=True).start()  # fmt: skip
        while True:
            item = updates.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if context.is_active():
                yield conv.rebuild_progress_to_pb(item)

    def Rollback(self, request: admin_pb2.RollbackRequest, context: grpc.ServicerContext):
        return conv.collection_info_to_pb(self._ops.rollback(request.collection))

    def Compact(self, request: admin_pb2.CompactRequest, context: grpc.ServicerContext):
        return admin_pb2.CompactResponse(removed=self._ops.compact(request.collection or None))

    def Snapshot(self, request: admin_pb2.SnapshotRequest, context: grpc.ServicerContext):
        size = self._ops.snapshot(request.dir)
        return admin_pb2.SnapshotResponse(dir=request.dir, bytes=size)

    def Status(self, request: admin_pb2.StatusRequest, context: grpc.ServicerContext):
        st = self._ops.status()
        return admin_pb2.StatusResponse(
            version=__version__,
            embedder=st.embedder,
            uptime_seconds=time.time() - st.started_at,
            collections=[conv.collection_info_to_pb(c) for c in st.collections],
            shadow=[conv.shadow_summary_to_pb(c) for c in st.shadow],
            memories=st.memories,
        )

    def ShadowStatus(self, request: admin_pb2.ShadowStatusRequest, context: grpc.ServicerContext):
        cases = self._ops.shadow_status(request.use_case or None)
        return admin_pb2.ShadowStatusResponse(cases=[conv.shadow_case_to_pb(c) for c in cases])

    def Flip(self, request: admin_pb2.FlipRequest, context: grpc.ServicerContext):
        return admin_pb2.FlipResponse(
            case=conv.shadow_case_to_pb(self._ops.flip(request.use_case, force=request.force))
        )

    def Unflip(self, request: admin_pb2.UnflipRequest, context: grpc.ServicerContext):
        return admin_pb2.FlipResponse(
            case=conv.shadow_case_to_pb(self._ops.unflip(request.use_case))
        )

    def RecordRelease(self, request: admin_pb2.RecordReleaseRequest, context: grpc.ServicerContext):
        rec, replaced, path = self._ops.record_release(request.use_case or "embeddings")
        return conv.record_release_to_pb(rec, replaced, path)

    def CreateKey(self, request: admin_pb2.CreateKeyRequest, context: grpc.ServicerContext):
        info, secret = self._ops.keys.create(
            request.tenant or auth.DEFAULT_TENANT, list(request.scopes), request.description
        )
        return admin_pb2.CreateKeyResponse(key=conv.key_info_to_pb(info), secret=secret)

    def ListKeys(self, request: admin_pb2.ListKeysRequest, context: grpc.ServicerContext):
        return admin_pb2.ListKeysResponse(
            keys=[conv.key_info_to_pb(k) for k in self._ops.keys.list()]
        )

    def RevokeKey(self, request: admin_pb2.RevokeKeyRequest, context: grpc.ServicerContext):
        return admin_pb2.RevokeKeyResponse(revoked=self._ops.keys.revoke(request.key_id))
