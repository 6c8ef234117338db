"""Prometheus metrics (prometheus-client) on their own HTTP port.

One registry per server, so several servers in one process (tests) never collide.
Request counts and latency per RPC come from the interceptor, and per HTTP route from the
OpenAI-compatible API; batch sizes from the embedding batcher (shared by both) and the
search coalescer; queue depths, collection sizes and shadow agreement / gate status are
read at scrape time by a collector.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ragplane.index.types import CollectionInfo
from ragplane.server.shadow.types import CaseStatus

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
_LAG_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.25,
    0.35,
    0.5,
    0.75,
    1,
    2,
    5,
    10,
    30,
)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class RuntimeGauges(Protocol):
    """What the scrape-time gauges read from a running server. `ragplane.server.app` fills it in,
    so this module needs nothing of the runtime's insides."""

    def queued_texts(self) -> int:
        """Texts waiting to be embedded."""
        ...

    def search_batch_mean(self) -> float:
        """Mean searches per coalesced FAISS call since start (0 before the first)."""
        ...

    def collections(self) -> Iterable[CollectionInfo]:
        """The user collections of every tenant."""
        ...

    def shadow_status(self) -> Sequence[CaseStatus]:
        """Each shadowed use case; empty when nothing is shadowed."""
        ...

    def store_position(self) -> tuple[int, float] | None:
        """With a PostgreSQL store: (the change-log position applied here, seconds behind
        the log); None with the embedded store."""
        ...


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ragplane_requests",
            "RPCs served, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "ragplane_request_seconds",
            "RPC latency, by method",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_texts = Histogram(
            "ragplane_embed_batch_texts",
            "Texts per embedding forward pass",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "ragplane_embed_batch_requests",
            "Requests sharing one embedding forward pass",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.pass_seconds = Histogram(
            "ragplane_embed_pass_seconds",
            "Duration of one embedding forward pass",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # HTTP apart from the RPCs: its statuses are HTTP's, not gRPC's codes. The passes
        # above are shared: HTTP and gRPC callers meet in the same batcher.
        self.http_requests = Counter(
            "ragplane_http_requests",
            "HTTP requests served (the OpenAI-compatible API), by route and HTTP status",
            ["route", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "ragplane_http_request_seconds",
            "HTTP request latency, by route",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # With a PostgreSQL store: seconds from a change's commit to this server applying it.
        self.store_apply_lag = Histogram(
            "ragplane_store_apply_lag_seconds",
            "Seconds from a change's commit in PostgreSQL to this server applying it",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self._rpc_series: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._http = None

    def observe_store_lag(self, seconds: float) -> None:
        self.store_apply_lag.observe(seconds)

    def observe_http(self, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, str(status)).inc()
        self.http_latency.labels(route).observe(seconds)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        # the labelled series of each (method, code), found once: labels() takes a lock
        # and builds its key on every call, the half of this that runs per call
        series = self._rpc_series.get((method, code))
        if series is None:
            name = method.rsplit("/", 2)[-2].rsplit(".", 1)[-1] + "/" + method.rsplit("/", 1)[-1]
            series = self.requests.labels(name, code), self.latency.labels(name)
            self._rpc_series[(method, code)] = series  # registered methods only: bounded
        series[0].inc()
        series[1].observe(seconds)

    def observe_pass(self, texts: int, requests: int, seconds: float) -> None:
        self.batch_texts.observe(texts)
        self.batch_requests.observe(requests)
        self.pass_seconds.observe(seconds)

    def attach(self, gauges: RuntimeGauges) -> None:
        self.registry.register(_RuntimeCollector(gauges))

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        bound = server.server_address[1]
        log.info("metrics on http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _RuntimeCollector(Collector):
    """Gauges read at scrape time: nothing to keep in sync on the hot path."""

    def __init__(self, gauges: RuntimeGauges) -> None:
        self._g = gauges

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = self._g
        q = GaugeMetricFamily("ragplane_embed_queue_texts", "Texts waiting to be embedded")
        q.add_metric([], g.queued_texts())
        yield q
        sb = GaugeMetricFamily(
            "ragplane_search_batch_mean", "Mean searches per coalesced FAISS call since start"
        )
        sb.add_metric([], g.search_batch_mean())
        yield sb
        yield from _collection_gauges(g.collections())
        yield from _shadow_gauges(g.shadow_status())
        if (store := g.store_position()) is not None:
            pos = GaugeMetricFamily(
                "ragplane_store_applied_position", "Change-log position applied here"
            )
            pos.add_metric([], store[0])
            lag = GaugeMetricFamily(
                "ragplane_store_lag_seconds", "How far behind PostgreSQL's change log (seconds)"
            )
            lag.add_metric([], store[1])
            yield pos
            yield lag


def _collection_gauges(colls: Iterable[CollectionInfo]) -> Iterator[GaugeMetricFamily]:
    items = GaugeMetricFamily(
        "ragplane_collection_items",
        "Live items per collection",
        labels=["tenant", "collection"],
    )
    tomb = GaugeMetricFamily(
        "ragplane_collection_tombstones",
        "Deleted or replaced vectors awaiting compaction",
        labels=["tenant", "collection"],
    )
    for c in colls:
        items.add_metric([c.tenant, c.name], c.count)
        tomb.add_metric([c.tenant, c.name], c.tombstones)
    yield items
    yield tomb


def _shadow_gauges(cases: Sequence[CaseStatus]) -> Iterator[GaugeMetricFamily]:
    if not cases:
        return
    agree = GaugeMetricFamily(
        "ragplane_shadow_cosine",
        "Shadow agreement (cosine) of the current shadow release",
        labels=["use_case", "shadow", "stat"],
    )
    ratio = GaugeMetricFamily(
        "ragplane_shadow_time_ratio",
        "Shadow / canonical time on the same batches, per traffic class (and `all`)",
        labels=["use_case", "shadow", "class", "stat"],
    )
    errors = GaugeMetricFamily(
        "ragplane_shadow_errors",
        "Sampled batches whose shadow output could not be compared (each fails G1)",
        labels=["use_case", "shadow"],
    )
    gate = GaugeMetricFamily(
        "ragplane_shadow_gate", "1 when the gate passes", labels=["use_case", "gate"]
    )
    flipped = GaugeMetricFamily(
        "ragplane_shadow_flipped", "1 when the shadow serves", labels=["use_case"]
    )
    drops = GaugeMetricFamily(
        "ragplane_shadow_dropped",
        "Samples dropped on a full queue",
        labels=["use_case", "shadow"],
    )
    offered = GaugeMetricFamily(
        "ragplane_shadow_batches",
        "Batches offered to the shadow per phase and traffic class, by outcome: sampled "
        "(compared or failed; busy_sampled of them under load), skipped_busy, dropped; "
        "offered = sampled + skipped_busy + dropped",
        labels=["use_case", "shadow", "phase", "class", "outcome"],
    )
    for case in cases:
        for r in (*case.releases, *case.watch_releases):
            if r.shadow != case.shadow or r.hardware != case.hardware:
                continue
            for k in r.classes:
                for outcome in ("sampled", "busy_sampled", "skipped_busy", "dropped"):
                    labels = [case.use_case, r.shadow, r.phase, k.name, outcome]
                    offered.add_metric(labels, getattr(k, outcome))
            if r.phase != "shadow":
                continue
            for stat, v in (
                ("min", r.cosine_min),
                ("p1", r.cosine_p1),
                ("mean", r.cosine_mean),
            ):
                agree.add_metric([case.use_case, r.shadow, stat], v)
            for cls in (r, *r.classes):
                name = getattr(cls, "name", "all")
                for stat, v in (
                    ("ratio", cls.time_ratio),
                    ("upper95", cls.time_ratio_upper),
                    ("aa", cls.aa_time_ratio),
                ):
                    ratio.add_metric([case.use_case, r.shadow, name, stat], v)
            drops.add_metric([case.use_case, r.shadow], r.dropped)
            errors.add_metric([case.use_case, r.shadow], r.errors)
        for g in case.gates:
            gate.add_metric([case.use_case, g.name.split()[0]], 1.0 if g.passed else 0.0)
        flipped.add_metric([case.use_case], 1.0 if case.status == "flipped" else 0.0)
    yield from (agree, ratio, gate, flipped, drops, errors, offered)
