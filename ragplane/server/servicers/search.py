from __future__ import annotations

import grpc

from ragplane.server import conversions as conv
from ragplane.server.collections import CollectionService, Grouping
from ragplane.server.conversions_search import fusion_from_pb, knobs_from_pb
from ragplane.v1 import search_pb2, search_pb2_grpc


class SearchServicer(search_pb2_grpc.SearchServiceServicer):
    def __init__(self, collections: CollectionService) -> None:
        self._c = collections

    def Search(self, request: search_pb2.SearchRequest, context: grpc.ServicerContext):
        which = request.WhichOneof("query")
        result, embedder = self._c.search(
            request.collection,
            text=request.text if which == "text" else None,
            vector=conv.vector_from_floats(request.vector.values) if which == "vector" else None,
            top_k=request.top_k,
            filter=conv.filter_from_pb(request.filter),
            include_text=request.include_text,
            include_metadata=request.include_metadata,
            mode=conv.search_mode_from_pb(request.mode),
            fusion=fusion_from_pb(request.fusion),
            is_active=context.is_active,
            chunks_per_hit=request.chunks_per_hit,
            grouping=Grouping(request.group_by, request.group_size, request.group_limit),
            knobs=knobs_from_pb(request),
        )
        return conv.search_result_to_pb(result, embedder)
