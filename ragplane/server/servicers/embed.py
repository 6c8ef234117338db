from __future__ import annotations

from collections.abc import Iterator

import grpc

from ragplane.server.conversions import vectors_to_pb
from ragplane.server.embedding.service import DEFAULT_USE_CASE, EmbeddingService
from ragplane.v1 import embed_pb2, embed_pb2_grpc


class EmbedServicer(embed_pb2_grpc.EmbedServiceServicer):
    def __init__(self, embedding: EmbeddingService, info: embed_pb2.InfoResponse) -> None:
        self._embedding = embedding
        self._info = info

    def Embed(self, request: embed_pb2.EmbedRequest, context: grpc.ServicerContext):
        result = self._embedding.embed(
            list(request.texts),
            normalize=request.normalize if request.HasField("normalize") else True,
            truncate=request.truncate if request.HasField("truncate") else True,
            use_case=request.use_case or DEFAULT_USE_CASE,
            is_active=context.is_active,
        )
        return embed_pb2.EmbedResponse(
            vectors=vectors_to_pb(result.vectors),
            dim=result.dim,
            model=result.model,
            embedder=result.embedder,
            token_counts=result.token_counts,
        )

    def EmbedStream(
        self, request_iterator: Iterator[embed_pb2.EmbedRequest], context: grpc.ServicerContext
    ):
        for request in request_iterator:
            yield self.Embed(request, context)

    def Info(self, request: embed_pb2.InfoRequest, context: grpc.ServicerContext):
        serving = self._embedding.serving_embedder()
        info = embed_pb2.InfoResponse()
        info.CopyFrom(self._info)
        info.embedder = serving.identity
        info.device = serving.device
        return info
