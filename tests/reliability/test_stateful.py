"""A stateful property test of the collection API, through gRPC, against a dict model.

Hypothesis drives upserts (some re-using another item's vector, to make ties), deletes by
id and by filter, gets, searches and server restarts over one flat collection (metric
drawn per run) and one HNSW collection. After every step the live count matches the
model; gets return exactly the model's items with bit-identical vectors (equal to
rounding where cosine normalises them); flat searches
equal exact numpy search (ids and scores within 1e-5, ties allowed either way); HNSW
recall@k against exact search, over the whole run, is at least 0.95.
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ragplane.server.conversions import dict_to_struct, py_to_value
from ragplane.testkit.harness import InProcessServer
from ragplane.v1 import common_pb2, index_pb2, search_pb2

pytestmark = pytest.mark.e2e

DIM = 8
IDS = [f"i{n}" for n in range(40)]
METRICS = {"cosine": index_pb2.METRIC_COSINE, "ip": index_pb2.METRIC_IP, "l2": index_pb2.METRIC_L2}
TOL = 1e-5
SERVER: dict[str, InProcessServer] = {}
STEPS: collections.Counter[str] = collections.Counter()
_names = itertools.count()


def _vec(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, DIM).astype(np.float32)


def _scores(metric: str, q: np.ndarray, mat: np.ndarray) -> np.ndarray:
    q64, m64 = q.astype(np.float64), mat.astype(np.float64)
    if metric == "cosine":
        q64 = q64 / np.linalg.norm(q64)
        return m64 @ q64  # stored vectors are already unit length
    if metric == "ip":
        return m64 @ q64
    return -((m64 - q64) ** 2).sum(axis=1)


def _cond(field, value):
    return common_pb2.Condition(field=field, op=common_pb2.FILTER_OP_EQ, value=py_to_value(value))


class Model:
    def __init__(self, name: str, metric: str) -> None:
        self.name, self.metric = name, metric
        self.items: dict[str, tuple[np.ndarray, int]] = {}  # id -> (stored vector, group)

    def stored(self, v: np.ndarray) -> np.ndarray:
        return v / np.linalg.norm(v) if self.metric == "cosine" else v


class CollectionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.srv = SERVER["srv"]
        self.hnsw_hits = self.hnsw_want = self.restarts = 0

    @property
    def stubs(self):
        return self.srv.stubs

    @initialize(metric=st.sampled_from(sorted(METRICS)))
    def create(self, metric):
        n = next(_names)
        self.flat = Model(f"flat{n}", metric)
        self.hnsw = Model(f"hnsw{n}", "cosine")
        self.stubs.index.CreateCollection(
            index_pb2.CreateCollectionRequest(name=self.flat.name, dim=DIM, metric=METRICS[metric])
        )
        self.stubs.index.CreateCollection(
            index_pb2.CreateCollectionRequest(
                name=self.hnsw.name,
                dim=DIM,
                index_type=index_pb2.INDEX_TYPE_HNSW,
                params=index_pb2.IndexParams(hnsw_m=16, hnsw_ef_search=64),
            )
        )

    def models(self):
        return (self.flat, self.hnsw)

    @rule(
        which=st.integers(0, 1),
        ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=8, unique=True),
        seed=st.integers(0, 2**32 - 1),
        group=st.integers(0, 2),
        copy=st.booleans(),
    )
    def upsert(self, which, ids, seed, group, copy):
        STEPS["upsert"] += 1
        m = self.models()[which]
        vecs = [_vec(seed + i) for i in range(len(ids))]
        if copy and m.items:  # an exact copy of an existing vector: a tie in every search
            src = m.items[sorted(m.items)[seed % len(m.items)]][0]
            vecs[0] = src.copy()
        items = [
            common_pb2.Item(id=i, vector=v.tolist(), metadata=dict_to_struct({"g": group}))
            for i, v in zip(ids, vecs, strict=True)
        ]
        r = self.stubs.index.Upsert(index_pb2.UpsertRequest(collection=m.name, items=items))
        assert r.upserted == len(ids)
        for i, v in zip(ids, vecs, strict=True):
            m.items[i] = (m.stored(v).astype(np.float32), group)

    @rule(which=st.integers(0, 1), ids=st.lists(st.sampled_from(IDS), max_size=6, unique=True))
    def delete_ids(self, which, ids):
        STEPS["delete_ids"] += 1
        m = self.models()[which]
        if not ids:
            return
        r = self.stubs.index.Delete(
            index_pb2.DeleteRequest(collection=m.name, ids=common_pb2.IdList(ids=ids))
        )
        assert r.deleted == sum(i in m.items for i in ids)
        for i in ids:
            m.items.pop(i, None)

    @rule(which=st.integers(0, 1), group=st.integers(0, 2))
    def delete_by_filter(self, which, group):
        STEPS["delete_by_filter"] += 1
        m = self.models()[which]
        r = self.stubs.index.Delete(
            index_pb2.DeleteRequest(
                collection=m.name, filter=common_pb2.Filter(must=[_cond("g", group)])
            )
        )
        gone = [i for i, (_, g) in m.items.items() if g == group]
        assert r.deleted == len(gone)
        for i in gone:
            del m.items[i]

    @rule(which=st.integers(0, 1), ids=st.lists(st.sampled_from(IDS), min_size=1, max_size=10))
    def get(self, which, ids):
        STEPS["get"] += 1
        m = self.models()[which]
        r = self.stubs.index.Get(
            index_pb2.GetRequest(collection=m.name, ids=ids, include_vectors=True)
        )
        want = list(dict.fromkeys(i for i in ids if i in m.items))
        assert [it.id for it in r.items] == want
        for it in r.items:
            got = np.asarray(it.vector, dtype=np.float32)
            if m.metric == "cosine":  # normalised by the server: equal to rounding
                np.testing.assert_allclose(got, m.items[it.id][0], rtol=0, atol=1e-6)
            else:  # stored as sent
                assert got.tobytes() == m.items[it.id][0].tobytes(), it.id
            assert int(it.metadata["g"]) == m.items[it.id][1]

    def _search(self, m: Model, q: np.ndarray, k: int, group: int | None):
        req = search_pb2.SearchRequest(
            collection=m.name, vector=common_pb2.Vector(values=q.tolist()), top_k=k
        )
        if group is not None:
            req.filter.must.append(_cond("g", group))
        r = self.stubs.search.Search(req)
        pool = {i: v for i, (v, g) in m.items.items() if group is None or g == group}
        ids = sorted(pool)
        exact = _scores(m.metric, q, np.stack([pool[i] for i in ids])) if ids else np.zeros(0)
        return r, ids, exact

    @rule(
        seed=st.integers(0, 2**32 - 1),
        k=st.integers(1, 15),
        group=st.one_of(st.none(), st.integers(0, 2)),
    )
    def search_flat(self, seed, k, group):
        STEPS["search_flat"] += 1
        q = _vec(seed ^ 0x5EED)
        r, ids, exact = self._search(self.flat, q, k, group)
        got = [h.id for h in r.hits]
        assert len(got) == len(set(got)) == min(k, len(ids)) == r.returned_k
        if not ids:
            return
        true = dict(zip(ids, exact, strict=True))
        want_scores = np.sort(exact)[::-1][: len(got)]
        got_scores = np.array([h.score for h in r.hits])
        assert np.allclose(got_scores, want_scores, rtol=TOL, atol=TOL), (got_scores, want_scores)
        for h in r.hits:
            assert abs(true[h.id] - h.score) <= TOL + TOL * abs(true[h.id]), h.id
        kth = want_scores[-1]
        must = {i for i, s in true.items() if s > kth + TOL + TOL * abs(kth)}
        assert must <= set(got), "an id strictly better than the k-th is missing"

    @rule(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 10))
    def search_hnsw(self, seed, k):
        STEPS["search_hnsw"] += 1
        q = _vec(seed ^ 0xBEEF)
        r, ids, exact = self._search(self.hnsw, q, k, None)
        got = [h.id for h in r.hits]
        assert len(got) == len(set(got)) and set(got) <= set(self.hnsw.items)
        if not ids:
            return
        kk = min(k, len(ids))
        kth = np.sort(exact)[::-1][kk - 1]
        true = dict(zip(ids, exact, strict=True))
        # ties at the k-th score: any of them counts as a hit
        self.hnsw_hits += min(kk, sum(true[i] >= kth - TOL for i in got))
        self.hnsw_want += kk

    # a restart costs about half a second: at most two per run keeps the test bounded
    @precondition(lambda self: hasattr(self, "flat") and self.restarts < 2)
    @rule()
    def restart(self):
        STEPS["restart"] += 1
        self.restarts += 1
        self.srv.restart()

    @invariant()
    def counts_match(self):
        if not hasattr(self, "flat"):
            return
        for m in self.models():
            info = self.stubs.index.DescribeCollection(
                index_pb2.DescribeCollectionRequest(name=m.name)
            )
            assert info.count == len(m.items), m.name

    def teardown(self):
        STEPS["hnsw results"] += self.hnsw_want
        STEPS["hnsw hits"] += self.hnsw_hits
        if self.hnsw_want >= 20:
            recall = self.hnsw_hits / self.hnsw_want
            assert recall >= 0.95, f"hnsw recall {recall:.3f} over {self.hnsw_want} results"
        if hasattr(self, "flat"):
            for m in self.models():
                self.stubs.index.DeleteCollection(index_pb2.DeleteCollectionRequest(name=m.name))


CollectionMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=50,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module", autouse=True)
def shared_server(tmp_path_factory):
    SERVER["srv"] = InProcessServer(tmp_path_factory.mktemp("stateful") / "data")
    yield
    SERVER.pop("srv").stop()


TestCollectionAPI = CollectionMachine.TestCase


def test_report(capsys):
    with capsys.disabled():
        print(f"\nstateful: {dict(sorted(STEPS.items()))}")
    assert STEPS["restart"] > 0 and STEPS["search_flat"] > 0 and STEPS["search_hnsw"] > 0
    assert STEPS["hnsw hits"] >= 0.95 * STEPS["hnsw results"]
