"""13. Long documents, chunked vs not: document-level recall of dense, lexical and hybrid
search, upsert throughput and index size.

The documents and queries are `bench.documents_set`'s: real long documents found on this
machine (1,500-12,000 words each) and known-item queries, sentences from past each
document's first 300 words, verbatim ("words matter") and without their rarest quarter of
words ("pruned"). The same documents go into two collections, each on its own server (its
own data directory, so its size on disk is its own): chunking on (the default, unset) and
chunking off (texts embedded truncated at the embedder's 256-token window). The two take
turns batch by batch while upserting, so the machine's load falls on both alike.

Each query searches both collections in every mode: dense, lexical (BM25), hybrid with RRF
and with weighted fusion (both asked for by name) and hybrid with the fusion unset (the
server's default). A query is answered when its document is among the top 10 items.

    python -m bench.documents [--docs N] [--queries-per-doc Q] [--seed S] [--quick] [--write]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import ROOT, Server, start_server, table
from bench.documents_set import SKIP_WORDS, DocumentSet, Query, build
from bench.markdown import replace_block
from ragplane.v1 import common_pb2, index_pb2, index_pb2_grpc, search_pb2, search_pb2_grpc

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

KEY = "documents"
HEADING = "## 13. Long documents: chunked vs not, dense / lexical / hybrid"
K = 10
COLLECTION = "docs"
BATCH = 8  # documents per Upsert
SEARCH_THREADS = 4
ARMS = {
    "chunked": None,  # chunking unset: on, at the embedder's window
    "chunking off": index_pb2.Chunking(enabled=False),
}
RRF = common_pb2.Fusion(method=common_pb2.FUSION_METHOD_RRF)
WEIGHTED = common_pb2.Fusion(method=common_pb2.FUSION_METHOD_WEIGHTED)
MODES = {
    "dense": (common_pb2.SEARCH_MODE_DENSE, None),
    "lexical (BM25)": (common_pb2.SEARCH_MODE_LEXICAL, None),
    "hybrid, RRF": (common_pb2.SEARCH_MODE_HYBRID, RRF),
    "hybrid, weighted": (common_pb2.SEARCH_MODE_HYBRID, WEIGHTED),
    "hybrid, default": (common_pb2.SEARCH_MODE_HYBRID, None),
}
KINDS = ("verbatim", "pruned")
GOALS = (
    "Goals (issue 24): document-level recall@10 of dense search with chunking >= 0.90, and "
    ">= +0.30 over the same collection with chunking off; hybrid (default fusion) >= dense, "
    "and within 0.05 of lexical on word-heavy (verbatim) queries; the default fusion is the "
    "one that wins on a held-out mixed set, over chunks."
)


# --- the machine -------------------------------------------------------------------------


def machine() -> dict:
    from ragplane.server.shadow.hardware import cpu_extension, cpu_info

    model, flags = cpu_info()
    wide = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
            if f in flags]  # fmt: skip
    return {
        "cores": os.cpu_count(),
        "cpu": model or platform.processor(),
        "extension": cpu_extension(),
        "flags": wide,
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
    }


def machine_line(m: dict, load_end: tuple[float, ...]) -> str:
    start = "/".join(f"{x:.1f}" for x in m["loadavg"])
    end = "/".join(f"{x:.1f}" for x in load_end)
    return (
        f"{m['cores']} cores ({m['cpu']}; {m['extension']}: {', '.join(m['flags'])}), Python "
        f"{m['python']}, {platform.system()}; load average {start} at the start, {end} at "
        "the end"
    )


# --- servers and ingest ------------------------------------------------------------------


def start_arms(tmp: Path, extra: tuple[str, ...] = ()) -> dict[str, Server]:
    """One server per arm (the ONNX canonical on the CPU), each with its collection;
    `extra`: more server settings (FIELD=VALUE)."""
    servers: dict[str, Server] = {}
    try:
        for i, (arm, chunking) in enumerate(ARMS.items()):
            (tmp / f"arm{i}").mkdir(parents=True)
            srv = start_server("embedder=auto", "koder_toml=", "device=cpu", *extra,
                               data_dir=tmp / f"arm{i}" / "data")  # fmt: skip
            servers[arm] = srv
            req = index_pb2.CreateCollectionRequest(name=COLLECTION)
            if chunking is not None:
                req.chunking.CopyFrom(chunking)
            index_pb2_grpc.IndexServiceStub(srv.channel()).CreateCollection(req, timeout=60)
    except BaseException:
        for srv in servers.values():
            srv.stop()
        raise
    return servers


def ingest(servers: dict[str, Server], ds: DocumentSet, seed: int) -> dict[str, dict]:
    """Upsert every document into each arm, BATCH per call, the arms taking turns (which
    goes first alternates) so both see the machine alike; client-side seconds per arm."""
    docs = list(ds.docs)
    random.Random(seed).shuffle(docs)  # batches mix sources and lengths
    stubs = {a: index_pb2_grpc.IndexServiceStub(s.channel()) for a, s in servers.items()}
    out = {a: {"seconds": 0.0, "upserted": 0, "chunks": 0, "truncated": 0, "embedder": ""}
           for a in servers}  # fmt: skip
    arms = list(servers)
    for b, i in enumerate(range(0, len(docs), BATCH)):
        items = [common_pb2.Item(id=d.id, text=d.text) for d in docs[i : i + BATCH]]
        for arm in arms if b % 2 == 0 else arms[::-1]:
            t0 = time.perf_counter()
            resp = stubs[arm].Upsert(
                index_pb2.UpsertRequest(collection=COLLECTION, items=items), timeout=1800
            )
            o = out[arm]
            o["seconds"] += time.perf_counter() - t0
            o["upserted"] += resp.upserted
            o["chunks"] += resp.chunks
            o["truncated"] += resp.truncated
            o["embedder"] = resp.embedder
        print(f"  upserted {min(i + BATCH, len(docs))}/{len(docs)} documents", flush=True)
    words = sum(d.words for d in docs)
    for arm, o in out.items():
        info = stubs[arm].DescribeCollection(
            index_pb2.DescribeCollectionRequest(name=COLLECTION), timeout=60
        )
        o.update(items=info.count, described_chunks=info.chunks, words=words,
                 docs_per_s=len(docs) / o["seconds"], words_per_s=words / o["seconds"],
                 chunking=str(info.chunking).replace("\n", " ").strip())  # fmt: skip
    return out


def disk_usage(data_dir: Path) -> dict[str, int]:
    """Bytes under a (stopped) server's data directory: SQLite files (database, WAL),
    FAISS files, and the rest."""
    out = {"sqlite": 0, "faiss": 0, "other": 0}
    for p in data_dir.rglob("*"):
        if not p.is_file():
            continue
        name = p.name.lower()
        if ".db" in name or ".sqlite" in name or name.endswith(("-wal", "-shm")):
            kind = "sqlite"
        elif "faiss" in name or name.endswith((".index", ".ivf", ".hnsw", ".flat")):
            kind = "faiss"
        else:
            kind = "other"
        out[kind] += p.stat().st_size
    out["total"] = sum(out.values())
    return out


# --- search ------------------------------------------------------------------------------


def search_one(stub, q: Query, *, mode: int, fusion) -> dict:
    req = search_pb2.SearchRequest(collection=COLLECTION, text=q.text, top_k=K, mode=mode)
    if fusion is not None:
        req.fusion.CopyFrom(fusion)
    t0 = time.perf_counter()
    hits = stub.Search(req, timeout=120).hits
    ms = (time.perf_counter() - t0) * 1000
    ids = [h.id for h in hits]
    rank = ids.index(q.doc) + 1 if q.doc in ids else None
    located = None  # the relevant hit's best passage holds the sentence's start
    if rank is not None and hits[rank - 1].chunks:
        c = hits[rank - 1].chunks[0]
        located = c.start <= q.at_char < c.end
    return {"rank": rank, "ids": ids, "ms": ms, "located": located}


def search_all(servers: dict[str, Server], queries: list[Query]) -> dict:
    """{arm: {mode: [result per query]}}, SEARCH_THREADS queries in flight per arm."""
    out: dict = {}
    for arm, srv in servers.items():
        stub = search_pb2_grpc.SearchServiceStub(srv.channel())
        out[arm] = {}
        with ThreadPoolExecutor(SEARCH_THREADS) as pool:
            for name, (mode, fusion) in MODES.items():
                t0 = time.perf_counter()
                call = functools.partial(search_one, stub, mode=mode, fusion=fusion)
                out[arm][name] = list(pool.map(call, queries))
                print(f"  {arm}, {name}: {len(queries)} queries in "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    return out


def scores(results: list[dict]) -> dict[str, float]:
    ranks = [r["rank"] for r in results]
    return {
        "recall@10": sum(r is not None for r in ranks) / len(ranks),
        "mrr@10": sum(1 / r for r in ranks if r is not None) / len(ranks),
        "p50_ms": statistics.median(r["ms"] for r in results),
    }


def quality(raw: dict, queries: list[Query]) -> dict:
    """{arm: {mode: {kind or "mixed": scores}}}."""
    out: dict = {}
    for arm, modes in raw.items():
        for name, results in modes.items():
            per = {k: scores([r for r, q in zip(results, queries, strict=True) if q.kind == k])
                   for k in KINDS}  # fmt: skip
            per["mixed"] = scores(results)
            out.setdefault(arm, {})[name] = per
    return out


def default_is(raw: dict, arm: str) -> str:
    """Which named fusion the unset one ranked like, query by query (top 10 ids)."""
    got = [r["ids"] for r in raw[arm]["hybrid, default"]]
    same = [name for name in ("hybrid, RRF", "hybrid, weighted")
            if [r["ids"] for r in raw[arm][name]] == got]  # fmt: skip
    return same[0].removeprefix("hybrid, ") if same else "neither (differs from both)"


def located(raw: dict, arm: str, mode: str, queries: list[Query], kind: str) -> float | None:
    """Of the kind's queries whose document was found, the share whose best passage holds
    the sentence; None where hits carry no passages."""
    flags = [r["located"] for r, q in zip(raw[arm][mode], queries, strict=True)
             if q.kind == kind and r["rank"] is not None]  # fmt: skip
    flags = [f for f in flags if f is not None]
    return sum(flags) / len(flags) if flags else None


def misses(raw: dict, queries: list[Query]) -> list[dict]:
    """The verbatim queries dense search over chunks missed: the query, its document and
    the document ranked first instead."""
    return [
        {"doc": q.doc, "query": q.text, "at_word": q.at_word, "top": r["ids"][:3]}
        for r, q in zip(raw["chunked"]["dense"], queries, strict=True)
        if q.kind == "verbatim" and r["rank"] is None
    ]


# --- verdicts and the report ---------------------------------------------------------------


def fusion_winner(q: dict) -> str:
    """The fusion with the higher mixed recall@10 over chunks (MRR@10 breaks a tie)."""
    key = {
        n: (
            q["chunked"][f"hybrid, {n}"]["mixed"]["recall@10"],
            q["chunked"][f"hybrid, {n}"]["mixed"]["mrr@10"],
        )
        for n in ("RRF", "weighted")
    }
    if key["RRF"] == key["weighted"]:
        return "tie"
    return max(key, key=lambda n: key[n])


def verdicts(q: dict, winner: str, default: str) -> list[tuple[str, str, bool]]:
    """(goal, measured, met) for each of the issue's thresholds."""
    c, off = q["chunked"], q["chunking off"]
    r = lambda arm, mode, kind: arm[mode][kind]["recall@10"]  # noqa: E731
    dense_v, lex_v = r(c, "dense", "verbatim"), r(c, "lexical (BM25)", "verbatim")
    hyb = c["hybrid, default"]
    gain = dense_v - r(off, "dense", "verbatim")
    rows = [
        ("dense, chunked, verbatim R@10 >= 0.90", f"{dense_v:.3f}", dense_v >= 0.90),
        ("dense: chunked - chunking off, verbatim R@10 >= +0.30", f"{gain:+.3f}", gain >= 0.30),
    ]
    for kind in (*KINDS, "mixed"):
        h, d = hyb[kind]["recall@10"], r(c, "dense", kind)
        rows.append((f"hybrid (default) >= dense, chunked, {kind} R@10",
                     f"{h:.3f} vs {d:.3f}", h >= d))  # fmt: skip
    h = hyb["verbatim"]["recall@10"]
    rows.append(("hybrid (default) within 0.05 of lexical, chunked, verbatim R@10",
                 f"{h:.3f} vs {lex_v:.3f} ({h - lex_v:+.3f})", h >= lex_v - 0.05))  # fmt: skip
    rows.append(("default fusion = the winner on the mixed set, chunked",
                 f"winner {winner}; default ranks as {default}",
                 winner == "tie" or default == winner))  # fmt: skip
    return rows


def corpus_md(ds: DocumentSet, per_doc: int) -> str:
    words = sorted(d.words for d in ds.docs)
    verbatim = [q for q in ds.queries if q.kind == "verbatim"]
    sources = ", ".join(f"{n} {s}" for s, n in sorted(ds.per_source().items()))
    found = ", ".join(f"{n} {s}" for s, n in ds.candidates.items())
    return (
        f"{len(ds.docs)} documents ({sources}; usable documents found: {found}), "
        f"{sum(words):,} words, {words[0]:,}-{words[-1]:,} per document (median "
        f"{statistics.median(words):,.0f}). {len(verbatim)} queries of each kind, {per_doc} "
        f"per document: sentences of 8-40 words starting past word {SKIP_WORDS} (median "
        f"start: word {statistics.median(q.at_word for q in verbatim):,.0f}), found in no "
        "other document; verbatim, and pruned (without the sentence's rarest quarter of "
        "words by document frequency)."
    )


def ingest_md(ing: dict, disk: dict) -> str:
    rows = []
    for arm, o in ing.items():
        d = disk[arm]
        rows.append([arm, o["items"], o["described_chunks"], o["chunks"], o["truncated"],
                     f"{o['seconds']:.1f}", f"{o['docs_per_s']:.2f}", f"{o['words_per_s']:,.0f}",
                     f"{d['total'] / 2**20:.2f} ({d['sqlite'] / 2**20:.2f} + "
                     f"{d['faiss'] / 2**20:.2f} + {d['other'] / 2**20:.2f})"])  # fmt: skip
    return table(["arm", "items", "chunks (Describe)", "chunks (Upsert)", "truncated",
                  "upsert s", "docs/s", "words/s", "on disk MiB (SQLite + FAISS + other)"],
                 rows)  # fmt: skip


def quality_md(q: dict) -> str:
    rows = []
    for mode in MODES:
        for arm in ARMS:
            s = q[arm][mode]
            rows.append([mode, arm, *(f"{s[k][m]:.3f}" for k in (*KINDS, "mixed")
                                      for m in ("recall@10", "mrr@10")),
                         f"{s['mixed']['p50_ms']:.0f}"])  # fmt: skip
    return table(["mode", "arm", "verbatim R@10", "verbatim MRR@10", "pruned R@10",
                  "pruned MRR@10", "mixed R@10", "mixed MRR@10", "p50 ms"], rows)  # fmt: skip


def report(ds: DocumentSet, per_doc: int, res: dict) -> str:
    loc = res["located"]
    loc_txt = ", ".join(f"{k} {v:.2f}" for k, v in loc.items() if v is not None) or "n/a"
    verdict_rows = [[g, m, "yes" if ok else "**NO**"] for g, m, ok in res["verdicts"]]
    by_source: dict[str, int] = {}
    for miss in res["dense_misses"]:
        by_source[miss["doc"].split(":")[0]] = by_source.get(miss["doc"].split(":")[0], 0) + 1
    missed = ", ".join(f"{n} {s}" for s, n in sorted(by_source.items())) or "none"
    ing = res["ingest"]
    return "\n\n".join([
        GOALS,
        corpus_md(ds, per_doc),
        "Upsert and index size (the same documents, batches of "
        f"{BATCH}, the arms taking turns; embedder {ing['chunked']['embedder']}):",
        ingest_md(ing, res["disk"]),
        "Document-level quality (top_k = 10 items):",
        quality_md(res["quality"]),
        f"Fusion on the mixed set over chunks: **{res['winner']}** wins (recall@10, then "
        f"MRR@10); the default (unset) ranks as {res['default']}. Dense over chunks: where "
        "the document was found, its best passage holds the first character of the query "
        f"sentence for {loc_txt}; the verbatim queries it missed, by source: {missed}.",
        table(["goal", "measured", "met"], verdict_rows),
        f"_Measured {time.strftime('%Y-%m-%d', time.gmtime())} on {res['machine_line']}; "
        f"{res['seconds']:.0f} s._",
    ])  # fmt: skip


def run(
    n_docs: int = 200,
    per_doc: int = 2,
    seed: int = 0,
    quick: bool = False,
    extra: tuple[str, ...] = (),
) -> tuple[dict, str]:
    t0 = time.perf_counter()
    m = machine()
    ds = build(n_docs, per_doc, seed, max_words=3000 if quick else 12_000)
    print(f"{len(ds.docs)} documents, {len(ds.queries)} queries ({time.perf_counter() - t0:.0f} s)",
          flush=True)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="ragplane-documents-"))
    try:
        servers = start_arms(tmp, extra)
        try:
            ing = ingest(servers, ds, seed)
            raw = search_all(servers, ds.queries)
        finally:
            for srv in servers.values():
                srv.stop()
        disk = {arm: disk_usage(srv.data_dir) for arm, srv in servers.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    q = quality(raw, ds.queries)
    winner, default = fusion_winner(q), default_is(raw, "chunked")
    res = {"machine": m, "docs": len(ds.docs), "queries": len(ds.queries), "ingest": ing,
           "disk": disk, "quality": q, "winner": winner, "default": default,
           "located": {k: located(raw, "chunked", "dense", ds.queries, k) for k in KINDS},
           "sources": ds.per_source(), "candidates": ds.candidates}  # fmt: skip
    res["verdicts"] = verdicts(q, winner, default)
    res["dense_misses"] = misses(raw, ds.queries)
    res["seconds"] = time.perf_counter() - t0
    res["machine_line"] = machine_line(m, os.getloadavg())
    return res, report(ds, per_doc, res)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--docs", type=int, default=200, help="documents at most (default 200)")
    p.add_argument("--queries-per-doc", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a dry run: 12 documents of at most 3,000 words, 1 query each",
    )
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a server setting for both arms (repeatable)")  # fmt: skip
    p.add_argument("--write", action="store_true", help=f"update BENCHMARKS.md's {KEY} block")
    p.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    a = p.parse_args()
    if a.quick:
        a.docs, a.queries_per_doc = min(a.docs, 12), 1
    res, md = run(a.docs, a.queries_per_doc, a.seed, a.quick, tuple(a.set))
    print("\n" + md)
    out = ROOT / "bench" / "out" / "documents.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str))
    if a.write:
        path = Path(a.out)
        path.write_text(replace_block(path.read_text(), KEY, md, HEADING))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
