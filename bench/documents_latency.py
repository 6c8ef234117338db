"""13, latency: search p50 over the same documents chunked and not, dense / lexical / hybrid.

The documents and queries are `bench.documents_set`'s (section 13's). One server with the
fake embedder (so a query's time is the search's, not the model's) holds two collections:
"chunked", split at 128 whitespace tokens (64 at least, 16 of overlap: about as many
chunks as all-MiniLM-L6-v2's 256-token window makes of the same documents), and
"chunking off". Each query is searched in every mode in both, one search in flight, the
two collections taking turns (which goes first alternates), so load on the machine falls
on both alike; the ratios are the result, the milliseconds depend on the machine.

For lexical search it also counts the rows a query matches in each collection: the search
scores every one of them (from the collection's postings in memory, `ragplane.index.postings`)
before it keeps the best, so this is the work the chunked collection adds.

    python -m bench.documents_latency [--docs N] [--queries Q] [--write]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time
from pathlib import Path

from bench.common import ROOT, start_server, table
from bench.documents import HEADING, machine, machine_line
from bench.documents_set import build
from bench.markdown import replace_block
from ragplane.index import lexical
from ragplane.index.fts_query import match_expression, query_terms
from ragplane.v1 import common_pb2, index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc

KEY = "documents-latency"
ARMS = {
    "chunked": index_pb2.Chunking(enabled=True, max_tokens=128, min_tokens=64,
                                  overlap_tokens=16),
    "chunking off": index_pb2.Chunking(enabled=False),
}
MODES = {
    "dense": common_pb2.SEARCH_MODE_DENSE,
    "lexical (BM25)": common_pb2.SEARCH_MODE_LEXICAL,
    "hybrid (default fusion)": common_pb2.SEARCH_MODE_HYBRID,
}
GOALS = {"lexical (BM25)": 2.0, "hybrid (default fusion)": 1.5}  # issue 40: chunked/off p50


def collect(n_docs: int, n_queries: int) -> dict:
    t0 = time.perf_counter()
    ds = build(n_docs, per_doc=2, seed=0)
    queries = [q.text for q in ds.queries][:n_queries]
    srv = start_server("koder_toml=")
    try:
        index = index_pb2_grpc.IndexServiceStub(srv.channel())
        search = search_pb2_grpc.SearchServiceStub(srv.channel())
        names = {}
        for i, (arm, chunking) in enumerate(ARMS.items()):
            names[arm] = f"c{i}"
            index.CreateCollection(index_pb2.CreateCollectionRequest(name=f"c{i}",
                                                                     chunking=chunking))
        for lo in range(0, len(ds.docs), 8):
            items = [common_pb2.Item(id=d.id, text=d.text) for d in ds.docs[lo:lo + 8]]
            for name in names.values():
                index.Upsert(index_pb2.UpsertRequest(collection=name, items=items), timeout=600)
        info = {arm: index.DescribeCollection(index_pb2.DescribeCollectionRequest(name=n))
                for arm, n in names.items()}
        lat: dict[tuple[str, str], list[float]] = {(m, a): [] for m in MODES for a in ARMS}
        for qi, q in enumerate(queries):
            for mode, mv in MODES.items():
                arms = list(ARMS) if qi % 2 == 0 else list(ARMS)[::-1]
                for arm in arms:
                    req = search_pb2.SearchRequest(collection=names[arm], text=q, top_k=10,
                                                   mode=mv)
                    t = time.perf_counter()
                    search.Search(req, timeout=60)
                    lat[(mode, arm)].append(time.perf_counter() - t)
        matched = _matched_rows(srv.data_dir, queries)
    finally:
        srv.stop()
    return {"docs": len(ds.docs), "words": sum(d.words for d in ds.docs),
            "queries": len(queries), "lat": lat, "matched": matched,
            "rows": {a: (i.count, i.chunks) for a, i in info.items()},
            "seconds": time.perf_counter() - t0}


def _matched_rows(data_dir: Path, queries: list[str]) -> dict[str, float]:
    """p50 over the queries of the rows a search scores for each (its words, the most common
    left out as the search leaves them out), per arm (the collections were created in
    ARMS' order: ids 1, 2)."""
    db = sqlite3.connect(f"file:{data_dir / 'ragplane.db'}?mode=ro", uri=True)
    try:
        out = {}
        for i, arm in enumerate(ARMS, start=1):
            rows = db.execute(f"SELECT count(*) FROM lex_{i}_docsize").fetchone()[0]
            counts = []
            for q in queries:
                common = lexical.weightless(db, i, query_terms(q), rows)
                if m := match_expression(q, leave_out=common):
                    counts.append(db.execute(
                        f"SELECT count(*) FROM lex_{i} WHERE lex_{i} MATCH ?", (m,)
                    ).fetchone()[0])
            out[arm] = statistics.median(counts)
        return out
    finally:
        db.close()


def report(r: dict, m: dict, load_end: tuple[float, ...]) -> str:
    def p50(mode: str, arm: str) -> float:
        return statistics.median(r["lat"][(mode, arm)]) * 1e3

    rows = []
    for mode in MODES:
        a, b = p50(mode, "chunked"), p50(mode, "chunking off")
        goal = GOALS.get(mode)
        rows.append([mode, f"{a:.2f}", f"{b:.2f}", f"{a / b:.2f}",
                     f"<= {goal}" if goal else "-",
                     ("yes" if a / b <= goal else "no") if goal else "-"])
    (ci, cc), (oi, oc) = r["rows"]["chunked"], r["rows"]["chunking off"]
    return "\n\n".join([
        f"{r['docs']} documents ({r['words']:,} words), {r['queries']} queries (section 13's "
        "verbatim and pruned sentences), top_k 10, one search in flight, the two collections "
        f"taking turns on one server (fake embedder). chunked: {ci} items, {cc:,} chunks "
        f"(128-token chunks); chunking off: {oi} items, {oc} rows.",
        table(["mode", "chunked p50 ms", "chunking off p50 ms", "ratio", "goal", "met"],
              rows),
        "Rows a query scores (p50; its words, those in half the rows or more left "
        "out as the search leaves them): chunked "
        f"{r['matched']['chunked']:,.0f} of {cc:,}, chunking off "
        f"{r['matched']['chunking off']:,.0f} of {oc}.",
        f"_Measured {time.strftime('%Y-%m-%d', time.gmtime())} on {machine_line(m, load_end)}; "
        f"{r['seconds']:.0f} s. Command: `python -m bench.documents_latency --write`._",
    ])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=200)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--write", action="store_true", help=f"update BENCHMARKS.md's {KEY} block")
    a = p.parse_args()
    m = machine()
    md = report(collect(a.docs, a.queries), m, __import__("os").getloadavg())
    print(md)
    if a.write:
        path = ROOT / "BENCHMARKS.md"
        path.write_text(replace_block(path.read_text(), KEY, md, HEADING))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
