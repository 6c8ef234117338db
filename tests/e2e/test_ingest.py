"""`ragplane ingest` in this process against a real server (the fake embedder): JSONL, CSV
and Parquet with metadata, bad rows by file and line, refusals that write nothing, and a
re-run that changes nothing. The same on Ray, with the real model: test_ingest_ray.py."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragplane.server.cli import app
from ragplane.v1 import embed_pb2, index_pb2

pytestmark = [pytest.mark.e2e]


def write_inputs(d, texts: list[str]) -> list[str]:
    """The texts split over a JSONL, a CSV and a Parquet file, with metadata and two bad
    rows in the JSONL; returns the expected good ids."""
    d.mkdir()
    third = len(texts) // 3
    with open(d / "a.jsonl", "w") as f:
        for i in range(third):
            f.write(json.dumps({"id": f"j{i}", "text": texts[i],
                                "metadata": {"src": "jsonl", "n": i}}) + "\n")
            if i == 2:
                f.write('{"id": "j-bad", "metadata": {}}\n')  # line 4: no text
                f.write("not json at all\n")  # line 5
    with open(d / "b.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "metadata"])
        for i in range(third, 2 * third):
            w.writerow([f"c{i}", texts[i], json.dumps({"src": "csv", "n": i})])
    rest = range(2 * third, len(texts))
    pq.write_table(pa.table({
        "id": [f"p{i}" for i in rest],
        "text": [texts[i] for i in rest],
        "metadata": [json.dumps({"src": "parquet", "n": i}) for i in rest],
    }), d / "c.parquet", row_group_size=7)
    return ([f"j{i}" for i in range(third)] + [f"c{i}" for i in range(third, 2 * third)]
            + [f"p{i}" for i in rest])


def invoke(port: int, *args: str):
    return CliRunner().invoke(
        app, ["ingest", *args, "--addr", f"127.0.0.1:{port}"], catch_exceptions=False
    )


def flat(output: str) -> str:
    """The command's output as one line of words, table borders gone."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", output).split())


def contents(stubs, name: str, ids: list[str]) -> dict[str, tuple]:
    """id -> (text, metadata, vector) as the server holds them."""
    out = {}
    for lo in range(0, len(ids), 500):
        got = stubs.index.Get(index_pb2.GetRequest(
            collection=name, ids=ids[lo:lo + 500], include_vectors=True))
        for it in got.items:
            meta = {k: v for k, v in it.metadata.items()}
            out[it.id] = (it.text, meta, np.asarray(it.vector, dtype=np.float32))
    return out


TEXTS = [f"passage {i} about {w} and the store" for i, w in enumerate(
    ["sqlite", "faiss", "vectors", "recall", "metadata", "filters", "tenants", "snapshots",
     "rebuilds", "memory", "shadow", "gates"] * 4)]


def test_ingest_three_formats_with_metadata_and_bad_rows(server, tmp_path):
    ids = write_inputs(tmp_path / "in", TEXTS)
    out = invoke(server.port, str(tmp_path / "in"), "-c", "docs")
    assert out.exit_code == 2 and "--create" in out.output and "does not exist" in out.output

    out = invoke(server.port, str(tmp_path / "in"), "-c", "docs", "--create", "--batch-size", "5")
    assert out.exit_code == 0, out.output
    text = flat(out.output)
    assert f"rows read {len(ids) + 2}" in text and f"upserted {len(ids)}" in text
    assert "skipped (bad rows) 2" in text and "in this process" in text
    assert "a.jsonl:4: no text (id 'j-bad')" in text and "a.jsonl:5: not valid JSON" in text
    info = server.stubs.index.DescribeCollection(index_pb2.DescribeCollectionRequest(name="docs"))
    assert info.count == len(ids) and info.embedder == "fake@1"

    held = contents(server.stubs, "docs", ids)
    by_id = dict(zip(ids, TEXTS, strict=True))
    assert {i: t for i, (t, _, _) in held.items()} == by_id
    assert held["c20"][1] == {"src": "csv", "n": 20} and held["p40"][1]["src"] == "parquet"
    theirs = server.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=TEXTS)).vectors
    cos = [float(held[i][2] @ np.asarray(v.values)) for i, v in zip(ids, theirs, strict=True)]
    assert min(cos) >= 0.9999

    again = invoke(server.port, str(tmp_path / "in"), "-c", "docs")
    assert again.exit_code == 0, again.output
    assert server.stubs.index.DescribeCollection(
        index_pb2.DescribeCollectionRequest(name="docs")).count == len(ids)
    after = contents(server.stubs, "docs", ids)
    assert {i: (t, m) for i, (t, m, _) in after.items()} == {
        i: (t, m) for i, (t, m, _) in held.items()}
    assert all(np.array_equal(after[i][2], held[i][2]) for i in ids)


def test_on_bad_row_fail_writes_nothing_and_names_every_bad_line(server, tmp_path):
    write_inputs(tmp_path / "in", TEXTS)
    out = invoke(server.port, str(tmp_path / "in"), "-c", "strict", "--create",
                 "--on-bad-row", "fail")
    assert out.exit_code == 1
    text = flat(out.output)
    assert "2 bad rows" in text and "a.jsonl:4" in text and "a.jsonl:5" in text
    assert "nothing was written" in text
    info = server.stubs.index.DescribeCollection(
        index_pb2.DescribeCollectionRequest(name="strict"))
    assert info.count == 0


def test_a_collection_of_caller_vectors_is_refused_with_the_reason(server, tmp_path):
    server.stubs.index.CreateCollection(index_pb2.CreateCollectionRequest(name="raw", dim=8))
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    out = invoke(server.port, str(tmp_path / "a.jsonl"), "-c", "raw")
    assert out.exit_code == 2
    assert "vectors from callers" in flat(out.output)


def test_unreachable_server_and_unknown_options_read_well(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    out = CliRunner().invoke(app, ["ingest", str(tmp_path / "a.jsonl"), "-c", "x",
                                   "--addr", "127.0.0.1:1", "--timeout", "3"])
    assert out.exit_code == 2 and "cannot reach ragplane" in out.output
    out = CliRunner().invoke(app, ["ingest", str(tmp_path / "a.jsonl"), "-c", "x",
                                   "--on-bad-row", "ignore", "--addr", "127.0.0.1:1"])
    assert out.exit_code == 2 and "use skip or fail" in out.output
