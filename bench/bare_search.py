"""`python -m bench.bare_search --kind scan|fixed`: the bounds of the served ceiling
(`bench.served_ceiling --bounds`) -- gRPC's threaded Python server with a SearchService of
nothing but the least a search does, no ragplane layer in between.

- `fixed`: every Search answered with the same ten hits, built once: what gRPC's
  threaded server costs a unary call here.
- `scan`: the request's vector read, FAISS's exact scan of the same vectors the
  ceiling's collection holds (one thread), ten hits built: the least a search can cost.

Its threads are placed as ragplane places its own (`ragplane.core.cpus`, `--rpc-cpus`,
auto by default): gRPC's on one core, the scan free to run on any.

It prints `port N` once serving on 127.0.0.1 and serves until stdin closes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent import futures
from dataclasses import dataclass

import grpc
import numpy as np

from bench.common import ROOT, cpu_seconds, switches
from ragplane.core import cpus
from ragplane.v1 import search_pb2, search_pb2_grpc

KINDS = ("scan", "fixed")
TOP_K = 10


class _Search(search_pb2_grpc.SearchServiceServicer):
    def __init__(self, kind: str, n: int, cores: cpus.RequestCores) -> None:
        self._cores = cores
        self._fixed = search_pb2.SearchResponse()
        for i in range(TOP_K):
            self._fixed.hits.add(id=str(i), score=0.5)
        self._kind = kind
        if kind == "scan":
            import faiss

            from bench.served_ceiling import _vectors

            x, _ = _vectors(n)
            faiss.omp_set_num_threads(1)  # as ragplane scans one query: on one thread
            self._index = faiss.IndexFlatIP(x.shape[1])
            self._index.add(x)
            self._ids = [str(i) for i in range(n)]  # as the collection's

    def Search(self, request, context):  # noqa: N802 - gRPC's name
        if self._kind == "fixed":
            return self._fixed
        values = request.vector.values
        q = np.fromiter(values, dtype=np.float32, count=len(values))[None, :]
        with self._cores.wide():
            scores, rows = self._index.search(q, request.top_k or TOP_K)
        reply = search_pb2.SearchResponse()
        for score, row in zip(scores[0].tolist(), rows[0].tolist(), strict=True):
            if row >= 0:
                reply.hits.add(id=self._ids[row], score=score)
        return reply


@dataclass
class Bare:
    """A bare server subprocess, with what the ceiling measures of a `bench.common.Server`."""

    kind: str
    proc: subprocess.Popen
    port: int
    _channel: grpc.Channel | None = None

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return self._channel

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def switches(self) -> int:
        return switches(self.proc.pid)

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # its signal to stop
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_bare(kind: str, n: int, rpc_cpus: str = "auto") -> Bare:
    """A bare server of `kind` on `n` vectors, serving when this returns."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.bare_search", "--kind", kind, "--vectors", str(n),
         "--rpc-cpus", rpc_cpus],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("port "):
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        raise RuntimeError(f"bench.bare_search --kind {kind} did not start (said {line!r})")
    return Bare(kind, proc, int(line.split()[1]))


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bare_search", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--vectors", type=int, default=2000)
    p.add_argument("--workers", type=int, default=64, help="handler threads (ragplane's 64)")
    p.add_argument("--rpc-cpus", default="auto", help="as ragplane's setting: auto, off, N,M")
    a = p.parse_args()
    # placed as a lone ragplane server would be; not claimed: one server is measured at a
    # time, and the ragplane server beside it holds its own claim
    cores = cpus.RequestCores(cpus.choose(a.rpc_cpus, claim=lambda free: free[0]))
    server = grpc.server(futures.ThreadPoolExecutor(a.workers, initializer=cores.pin_this_thread))
    search_pb2_grpc.add_SearchServiceServicer_to_server(_Search(a.kind, a.vectors, cores), server)
    port = server.add_insecure_port("127.0.0.1:0")
    if cores.cores is not None:  # gRPC's polling thread, started now, inherits the core
        os.sched_setaffinity(0, cores.cores)
    server.start()
    if cores.cores is not None:
        os.sched_setaffinity(0, cores.every)
    print(f"port {port}", flush=True)
    sys.stdin.read()  # until the parent closes it (or dies)
    server.stop(grace=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
