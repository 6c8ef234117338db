"""The FTS5 query builder: user text never becomes FTS5 syntax, and what it builds runs on a
real FTS5 table with the store's tokenizer."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragplane.core.errors import InvalidArgument
from ragplane.index.fts_query import (
    MAX_TERM_CHARS,
    MAX_TERMS,
    TOKENIZE,
    match_expression,
    query_terms,
)

DOCS = {
    1: "Call SSL_CTX_set_options before the handshake.",
    2: "os.path.join joins path components intelligently.",
    3: "Error E1102: not callable.",
    4: "Le café est naïf; résumé en français.",
    5: "Привет, мир: текст на русском.",
    6: "NEAR the end AND NOT the beginning (operators as words)",
    7: 'He said "quote" and left.',
    8: "the sort function sorts lists; sorting is stable",
}


@pytest.fixture(scope="module")
def fts():
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.execute(f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize = '{TOKENIZE}')")
    db.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)", DOCS.items())
    yield db
    db.close()


def search(db: sqlite3.Connection, text: str) -> list[int]:
    expr = match_expression(text)
    if expr is None:
        return []
    rows = db.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank", (expr,)).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SSL_CTX_set_options", 1),
        ("set_options", 1),
        ("os.path.join", 2),
        ("e1102", 3),
        ("E1102:", 3),
        ("CAFE naif", 4),
        ("ПРИВЕТ", 5),
        ("NEAR", 6),
        ('"quote', 7),
        ("sorted", 8),  # porter: sorted = sort = sorts
    ],
)
def test_words_identifiers_and_non_ascii_find_their_item(fts, query, expected):
    assert search(fts, query)[0] == expected


def test_operators_are_plain_words(fts):
    assert 6 in search(fts, "NOT") and 3 in search(fts, "NOT")  # "not callable"
    assert set(search(fts, "AND")) == {6, 7}
    assert search(fts, "NEAR(end beginning)") == [6]


def test_identifier_matches_as_a_phrase_not_scattered_words(fts):
    fts.execute("INSERT INTO t(rowid, text) VALUES (100, 'options set for the ctx of ssl')")
    try:
        assert search(fts, "SSL_CTX_set_options") == [1]
    finally:
        fts.execute("DELETE FROM t WHERE rowid = 100")


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '""',
        "(",
        ")",
        "((a",
        "a)",
        "NEAR(",
        "NEAR(a b, 2",
        "a AND",
        "OR",
        "NOT a",
        "*",
        "a*",
        "^a",
        "text:a",
        "{text}: a",
        "-a",
        "+",
        "a + b",
        "\x00",
        "a\x00b",
        "\ud800x",
    ],
)
def test_operator_and_quote_soup_is_valid_fts5(fts, query):
    search(fts, query)  # raises sqlite3.OperationalError if the expression were invalid


def test_nothing_to_match_is_none():
    assert match_expression("") is None
    assert match_expression("   \t\n") is None
    assert match_expression("!@#$%^&*()_+-=[]{};':\",./<>?" * 400) is None  # ~11 kB


def test_terms_are_deduplicated_case_insensitively_and_capped():
    assert query_terms("Sort sort SORT list") == ["Sort", "list"]
    words = [f"w{i}" for i in range(MAX_TERMS + 10)]
    assert query_terms(" ".join(words)) == words[:MAX_TERMS]


def test_a_giant_word_is_invalid_argument():
    with pytest.raises(InvalidArgument, match="at most"):
        match_expression("a" * (MAX_TERM_CHARS + 1))
    assert match_expression("a" * MAX_TERM_CHARS) is not None


def test_quotes_are_doubled_inside_the_phrase():
    assert match_expression('say "hi"') == '"say" OR """hi"""'


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
@example("(" * 5000)
@example('"' * 10_000)
@example("NEAR(" * 2000)
@example("a_b.c-d/e:f " * 500)
def test_any_text_gives_valid_fts5_or_invalid_argument(fts, text):
    try:
        search(fts, text)
    except InvalidArgument:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            [
                '"',
                "(",
                ")",
                "NEAR",
                "AND",
                "OR",
                "NOT",
                "*",
                "^",
                ":",
                "a",
                "é",
                "_",
                ".",
                "-",
                " ",
                "\x00",
                "日本",
            ]
        ),
        max_size=60,
    )
)
def test_fts5_syntax_fragments_in_any_order(fts, parts):
    search(fts, "".join(parts))


def test_left_out_terms_are_dropped_unless_none_would_remain():
    assert match_expression("the zebra of", leave_out={"the", "of"}) == '"zebra"'
    assert match_expression("the of", leave_out={"the", "of"}) == '"the" OR "of"'
