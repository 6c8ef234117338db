"""Ingest files read row by row: JSONL, CSV and Parquet, good rows with their metadata, bad
rows with their file and line, and the sink that writes in input order."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragplane.core.errors import InvalidArgument
from ragplane.server.bulk import rows
from ragplane.server.bulk.embed import VECTOR
from ragplane.server.bulk.pipeline import BadRows, Options, Sink, Summary, find_bad_rows


def read(path, size: int = 1000) -> list[tuple]:
    out = []
    for c in rows.read_local(rows.expand([str(path)]), size):
        out += list(zip(c[rows.LINE].tolist(), c[rows.ID], c[rows.TEXT], c[rows.META],
                        c[rows.ERROR], strict=True))
    return out


def test_jsonl_rows_keep_their_line_and_every_bad_row_says_why(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text(
        '{"id": "a", "text": "first", "metadata": {"lang": "en", "n": 1}}\n'
        "\n"  # blank: no row
        '{"id": "b", "text": "second", "metadata": "{\\"k\\": [1, 2]}"}\n'
        '{"id": 7, "text": "numeric id"}\n'
        "{broken\n"
        '{"text": "no id"}\n'
        '{"id": "c"}\n'
        '{"id": "d", "text": "   "}\n'
        '{"id": "e", "text": "bad metadata", "metadata": [1]}\n'
        '["a list"]\n'
        '{"id": "f", "text": "last, no newline"}'
    )
    got = read(p)
    good = [(line, rid, text, json.loads(meta)) for line, rid, text, meta, err in got if not err]
    assert good == [
        (1, "a", "first", {"lang": "en", "n": 1}),
        (3, "b", "second", {"k": [1, 2]}),
        (11, "f", "last, no newline", {}),
    ]
    bad = {line: err for line, _, _, _, err in got if err}
    assert sorted(bad) == [4, 5, 6, 7, 8, 9, 10]
    assert "id must be a string" in bad[4]
    assert "not valid JSON" in bad[5]
    assert bad[6] == "no id"
    assert "no text" in bad[7] and "'c'" in bad[7]
    assert "text is empty" in bad[8]
    assert "metadata must be a JSON object" in bad[9]
    assert "JSON object" in bad[10]


def test_csv_lines_count_quoted_newlines_and_short_rows(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text(
        'id,text,metadata\n'
        'a,"plain",\n'
        'b,"spans\ntwo lines","{""year"": 2024}"\n'
        'c,"after the long one","not json"\n'
        'd,missing a field\n'
        'e,"fine again","{}"\n'
    )
    got = read(p)
    assert [(line, rid) for line, rid, _, _, err in got if not err] == [
        (2, "a"), (3, "b"), (7, "e")
    ]
    assert got[1][2] == "spans\ntwo lines" and json.loads(got[1][3]) == {"year": 2024}
    bad = {line: err for line, _, _, _, err in got if err}
    assert "metadata is not valid JSON" in bad[5]
    assert "has 2 fields, the header names 3" in bad[6]


def test_csv_without_an_id_column_is_refused_naming_the_file(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("key,text\n1,hello\n")
    with pytest.raises(InvalidArgument, match=r"a\.csv.*no 'id' column.*found: key, text"):
        read(p)


def test_parquet_rows_are_numbered_and_typed(tmp_path):
    p = tmp_path / "a.parquet"
    table = pa.table({
        "id": ["a", None, "c", "d"],
        "text": ["one", "two", None, "four"],
        "metadata": ['{"x": 1}', None, None, '{"y": "z"}'],
    })
    pq.write_table(table, p, row_group_size=2)
    got = read(p)
    assert [(line, rid, json.loads(meta)) for line, rid, _, meta, err in got if not err] == [
        (1, "a", {"x": 1}), (4, "d", {"y": "z"})
    ]
    assert {line: err for line, _, _, _, err in got if err} == {
        2: "no id", 3: "no text (id 'c')"
    }


def test_parquet_struct_metadata_and_a_number_id_column(tmp_path):
    p = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["a", "b"],
                             "metadata": [{"k": 1}, {"k": 2}]}), p)
    got = read(p)
    assert all("id must be a string, got a number" in err for *_, err in got)
    p2 = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["x"], "text": ["a"], "metadata": [{"k": 1}]}), p2)
    assert json.loads(read(p2)[0][3]) == {"k": 1}


def test_directories_gzip_and_formats(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.csv").write_text("id,text\nb,bee\n")
    with gzip.open(tmp_path / "d" / "a.jsonl.gz", "wt") as f:
        f.write('{"id": "a", "text": "ay"}\n')
    (tmp_path / "d" / "_skipped.jsonl").write_text('{"id": "z", "text": "zed"}\n')
    (tmp_path / "d" / "notes.txt").write_text("not an ingest file\n")
    files = rows.expand([str(tmp_path / "d")])
    assert [f.rsplit("/", 1)[1] for f in files] == ["a.jsonl.gz", "b.csv"]
    assert [r[1] for r in read(tmp_path / "d")] == ["a", "b"]
    assert rows.estimate_rows(files) == 2
    with pytest.raises(InvalidArgument, match="cannot tell the format"):
        rows.expand([str(tmp_path / "d" / "notes.txt")])
    with pytest.raises(InvalidArgument, match="does not exist"):
        rows.expand([str(tmp_path / "nope.jsonl")])


def test_chunks_hold_at_most_the_batch_size(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text("".join(json.dumps({"id": str(i), "text": f"t{i}"}) + "\n" for i in range(10)))
    sizes = [len(c[rows.ID]) for c in rows.read_local([str(p)], 4)]
    assert sizes == [4, 4, 2]


class Recorder:
    """A Writer that keeps what it was sent and refuses one id, as a server would."""

    def __init__(self, refuse: str = "") -> None:
        self.calls: list[list[str]] = []
        self.refuse = refuse

    def upsert(self, records) -> None:
        ids = [r.id for r in records]
        assert len(set(ids)) == len(ids), "one request must not repeat an id"
        if self.refuse in ids:
            raise InvalidArgument(f"item {ids.index(self.refuse)}: refused")
        self.calls.append(ids)


def batch(ids: list[str], errors: dict[int, str] | None = None) -> dict[str, np.ndarray]:
    n = len(ids)
    errors = errors or {}
    return {
        rows.ID: np.array(ids, dtype=object),
        rows.TEXT: np.array([f"text {i}" for i in ids], dtype=object),
        rows.META: np.array(["{}"] * n, dtype=object),
        rows.FILE: np.array(["f.jsonl"] * n, dtype=object),
        rows.LINE: np.arange(1, n + 1),
        rows.ERROR: np.array([errors.get(i, "") for i in range(n)], dtype=object),
        VECTOR: np.ones((n, 4), dtype=np.float32),
    }


def test_sink_writes_in_order_and_a_repeated_id_lands_after_the_first():
    w = Recorder()
    s = Summary()
    Sink(w, Options(), s).write(batch(["a", "b", "a", "c"]))
    assert w.calls == [["a", "b"], ["a", "c"]]
    assert (s.read, s.upserted, s.bad) == (4, 4, [])


def test_sink_finds_the_row_the_server_refuses_and_writes_the_rest():
    w = Recorder(refuse="e")
    s = Summary()
    Sink(w, Options(), s).write(batch(list("abcdefgh"), errors={1: "no text"}))
    assert sorted(i for call in w.calls for i in call) == list("acdfgh")
    assert [str(b) for b in s.bad] == [
        "f.jsonl:2: no text", "f.jsonl:5: refused by the server: item 0: refused"
    ]
    assert (s.read, s.upserted) == (8, 6)


def test_sink_refuses_at_the_first_bad_row_when_asked():
    w = Recorder()
    with pytest.raises(BadRows, match=r"f\.jsonl:3: no text.*--on-bad-row skip"):
        Sink(w, Options(on_bad_row="fail"), Summary()).write(batch(list("abcd"), {2: "no text"}))


def test_failing_mode_finds_every_bad_row_before_writing(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"id": "a", "text": "x"}\n{"id": "b"}\n{"id": "c", "text": "y"}\n{"id": 1}\n')
    bad = find_bad_rows([str(p)], Options(on_bad_row="fail"))
    assert [(b.line, b.reason.split(" (")[0]) for b in bad] == [
        (2, "no text"), (4, "id must be a string, got a number 1")
    ]


def test_the_actor_pool_fits_the_cluster():
    from ragplane.server.bulk.embed import EmbedderSpec
    from ragplane.server.bulk.raydata import Cluster, pool

    spec = EmbedderSpec("onnx@1")
    # this machine: one actor on one CPU, computing on both cores (Ray would give it one
    # thread through OMP_NUM_THREADS), the other CPU left to read tasks
    assert pool(Cluster("local", 1, 2, 0), spec)[:2] == (1, {"num_cpus": 1})
    assert pool(Cluster("local", 1, 2, 0), spec)[2].threads == 2
    n, res, s = pool(Cluster("x", 4, 64, 0), spec)
    assert (n, res, s.threads, s.device) == (60, {"num_cpus": 1}, 1, "cpu")
    n, res, s = pool(Cluster("x", 2, 32, 2), spec)
    assert (n, res, s.device) == (2, {"num_cpus": 1, "num_gpus": 1}, "cuda")
    assert pool(Cluster("x", 1, 8, 0), spec, actors=2)[2].threads == 4
