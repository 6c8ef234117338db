from __future__ import annotations

import grpc

from ragplane.server import conversions as conv
from ragplane.server.collections import CollectionService, Grouping
from ragplane.server.conversions_search import NO_FUSION, fusion_from_pb, knobs_from_pb
from ragplane.v1 import search_pb2, search_pb2_grpc

_NO_GROUPS = Grouping()


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
            # unset messages are what their conversions would make of empty ones, skipped:
            # the plain search is the one served thousands of times a second
            filter=conv.filter_from_pb(request.filter) if request.HasField("filter") else None,
            include_text=request.include_text,
            include_metadata=request.include_metadata,
            mode=conv.search_mode_from_pb(request.mode),
            fusion=fusion_from_pb(request.fusion) if request.HasField("fusion") else NO_FUSION,
            is_active=context.is_active,
            chunks_per_hit=request.chunks_per_hit,
            grouping=(Grouping(request.group_by, request.group_size, request.group_limit)
                      if request.group_by or request.group_size or request.group_limit
                      else _NO_GROUPS),
            knobs=knobs_from_pb(request),
        )
        return conv.search_result_to_pb(result, embedder)
