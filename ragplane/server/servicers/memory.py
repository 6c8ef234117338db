from __future__ import annotations

import grpc

from ragplane.server import conversions as conv
from ragplane.server.conversions_search import fusion_from_pb
from ragplane.server.memory import MemoryService
from ragplane.v1 import memory_pb2, memory_pb2_grpc


class MemoryServicer(memory_pb2_grpc.MemoryServiceServicer):
    def __init__(self, memory: MemoryService) -> None:
        self._m = memory

    def Remember(self, request: memory_pb2.RememberRequest, context: grpc.ServicerContext):
        mid, dedup = self._m.remember(
            request.namespace,
            request.text,
            conv.struct_to_dict(request.metadata),
            request.importance if request.HasField("importance") else None,
            request.ttl_seconds,
            is_active=context.is_active,
        )
        return memory_pb2.RememberResponse(id=mid, deduplicated=dedup)

    def Recall(self, request: memory_pb2.RecallRequest, context: grpc.ServicerContext):
        memories = self._m.recall(
            request.namespace,
            request.query,
            request.top_k,
            conv.filter_from_pb(request.filter),
            mode=conv.search_mode_from_pb(request.mode),
            fusion=fusion_from_pb(request.fusion),
            is_active=context.is_active,
        )
        return memory_pb2.RecallResponse(memories=[conv.memory_to_pb(m) for m in memories])

    def Forget(self, request: memory_pb2.ForgetRequest, context: grpc.ServicerContext):
        which = request.WhichOneof("selector")
        n = self._m.forget(
            request.namespace,
            ids=list(request.ids.ids) if which == "ids" else None,
            filter=conv.filter_from_pb(request.filter) if which == "filter" else None,
            everything=which == "all" and request.all,
        )
        return memory_pb2.ForgetResponse(forgotten=n)

    def ListMemories(self, request: memory_pb2.ListMemoriesRequest, context: grpc.ServicerContext):
        memories, token = self._m.list(request.namespace, request.page_size, request.page_token)
        return memory_pb2.ListMemoriesResponse(
            memories=[conv.memory_to_pb(m) for m in memories], next_page_token=token
        )
