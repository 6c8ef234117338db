"""The labelled quality set of bench section 10 is well formed: every label names a document,
both groups are present, and it is the same on every build."""

from __future__ import annotations

import collections

from bench.hybrid_set import build


def test_every_query_names_one_existing_document():
    s = build()
    ids = [d.id for d in s.docs]
    assert len(ids) == len(set(ids)) > 1000
    assert all(d.text.strip() for d in s.docs)
    assert {q.relevant for q in s.queries} <= set(ids)


def test_both_kinds_of_query_are_there():
    kinds = collections.Counter(q.kind for q in build().queries)
    assert kinds["identifier"] >= 40 and kinds["rare_term"] >= 40
    assert kinds["paraphrase"] >= 40 and kinds["description"] >= 10
    assert {q.group for q in build().queries} == {"words", "meaning"}


def test_words_queries_use_words_of_their_document():
    s = build()
    text = {d.id: d.text.lower() for d in s.docs}
    for q in s.by_group("words"):
        if q.kind == "identifier":
            assert q.relevant.rsplit(".", 1)[-1] in q.text.split(), q
        else:
            assert q.text.split()[-1] in text[q.relevant], q


def test_build_is_deterministic():
    build.cache_clear()
    first = build()
    build.cache_clear()
    assert build() == first
