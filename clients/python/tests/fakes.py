"""A fake ragplane server for what a real one does not do on demand: refuse with chosen
codes and trailers, answer slowly, or be one of several targets. Built on the client's own
generated code (ragplane_client.v1), so it needs no server package."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc

from ragplane_client.v1 import embed_pb2, embed_pb2_grpc, index_pb2, index_pb2_grpc


class Script:
    """What the next calls get: a list of (code, retry-after seconds or None), popped one
    per call; OK once empty. Records each call's time and metadata."""

    def __init__(self, failures=(), delay: float = 0.0) -> None:
        self.failures = list(failures)
        self.delay = delay
        self.times: list[float] = []
        self.metadata: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def play(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.times.append(time.monotonic())
            self.metadata.append(dict(context.invocation_metadata()))
            step = self.failures.pop(0) if self.failures else None
        if self.delay:
            time.sleep(self.delay)
        if step is not None:
            code, after = step
            if after is not None:
                context.set_trailing_metadata((("retry-after", f"{after:.3f}"),))
            context.abort(code, f"scripted {code.name}")

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]


class _Embed(embed_pb2_grpc.EmbedServiceServicer):
    def __init__(self, script: Script, name: str) -> None:
        self.script, self.name = script, name

    def Info(self, request, context):
        self.script.play(context)
        return embed_pb2.InfoResponse(model=self.name, dim=3)


class _Index(index_pb2_grpc.IndexServiceServicer):
    def __init__(self, script: Script) -> None:
        self.script = script

    def Upsert(self, request, context):
        self.script.play(context)
        n = len(request.items)
        return index_pb2.UpsertResponse(upserted=n, chunks=n, embedder="fake@1")

    def CreateCollection(self, request, context):
        self.script.play(context)
        return index_pb2.CollectionInfo(name=request.name, dim=3)


class FakeServer:
    def __init__(self, script: Script | None = None, name: str = "fake") -> None:
        self.script = script or Script()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        embed_pb2_grpc.add_EmbedServiceServicer_to_server(_Embed(self.script, name), self.server)
        index_pb2_grpc.add_IndexServiceServicer_to_server(_Index(self.script), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{self.port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()
