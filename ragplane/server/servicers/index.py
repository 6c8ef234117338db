from __future__ import annotations

import grpc

from ragplane.server import conversions as conv
from ragplane.server import conversions_search as conv_search
from ragplane.server.collections import CollectionService
from ragplane.v1 import index_pb2, index_pb2_grpc


class IndexServicer(index_pb2_grpc.IndexServiceServicer):
    def __init__(self, collections: CollectionService) -> None:
        self._c = collections

    def CreateCollection(
        self, request: index_pb2.CreateCollectionRequest, context: grpc.ServicerContext
    ):
        info = self._c.create(
            request.name,
            metric=conv.metric_from_pb(request.metric),
            index_type=conv.index_type_from_pb(request.index_type),
            dim=request.dim,
            params=conv.params_from_pb(request.params),
            lexical_index=conv_search.lexical_index_from_pb(request),
            chunks=conv_search.chunking_from_pb(request),
            exist_ok=request.exist_ok,
        )
        return conv.collection_info_to_pb(info)

    def DeleteCollection(
        self, request: index_pb2.DeleteCollectionRequest, context: grpc.ServicerContext
    ):
        self._c.delete_collection(request.name)
        return index_pb2.DeleteCollectionResponse(deleted=True)

    def ListCollections(
        self, request: index_pb2.ListCollectionsRequest, context: grpc.ServicerContext
    ):
        return index_pb2.ListCollectionsResponse(
            collections=[conv.collection_info_to_pb(c) for c in self._c.list()]
        )

    def DescribeCollection(
        self, request: index_pb2.DescribeCollectionRequest, context: grpc.ServicerContext
    ):
        return conv.collection_info_to_pb(self._c.describe(request.name))

    def Upsert(self, request: index_pb2.UpsertRequest, context: grpc.ServicerContext):
        records = [conv.item_to_record(item) for item in request.items]
        w = self._c.upsert(request.collection, records, is_active=context.is_active)
        return index_pb2.UpsertResponse(
            upserted=w.items, embedder=w.embedder, chunks=w.chunks, truncated=w.truncated
        )

    def Delete(self, request: index_pb2.DeleteRequest, context: grpc.ServicerContext):
        which = request.WhichOneof("selector")
        deleted = self._c.delete(
            request.collection,
            ids=list(request.ids.ids) if which == "ids" else None,
            filter=conv.filter_from_pb(request.filter) if which == "filter" else None,
        )
        return index_pb2.DeleteResponse(deleted=deleted)

    def Get(self, request: index_pb2.GetRequest, context: grpc.ServicerContext):
        records = self._c.get(
            request.collection, list(request.ids), include_vectors=request.include_vectors
        )
        return index_pb2.GetResponse(
            items=[conv.record_to_item(r, include_vector=request.include_vectors) for r in records]
        )
