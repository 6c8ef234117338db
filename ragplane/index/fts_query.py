"""User text -> an SQLite FTS5 MATCH expression that is always valid and never syntax.

FTS5 has a query language (`AND`, `OR`, `NOT`, `NEAR(...)`, `col:`, `^`, `*`, parentheses,
double quotes). Passing a user's words to it raw lets `"`, `(` or a trailing `NOT` raise
"fts5: syntax error", and lets a word that happens to be an operator change the query. So
each whitespace-separated word of the text becomes one FTS5 *string* (a phrase, with `"`
doubled, the only escape FTS5 strings have) and the phrases are OR-ed: an item matches when
any word occurs, and BM25 weighs rarer words more, as in Lucene's default query.

A word is tokenised by the table's own tokenizer inside the phrase, so an identifier keeps
its order: `SSL_CTX_set_options` is the phrase "ssl ctx set options" and matches that
identifier (or `set_options` inside it), not the four words scattered; `os.path.join`
likewise. Non-ASCII letters are token characters of unicode61, which also folds case and
diacritics (`café` = `cafe`). Scripts written without spaces (Chinese, Japanese) are one
token per run of characters, so they match whole runs only.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection

from ragplane.core.errors import InvalidArgument

# The tokenizer of every lexical table; queries are tokenised by the same one. porter stems
# English words (`sorting` = `sort`); unicode61 splits on Unicode spaces and punctuation
# (so `_` and `.` split identifiers into phrase parts), folds case and, with
# remove_diacritics 2, accents.
TOKENIZE = "porter unicode61 remove_diacritics 2"

# Words beyond these are dropped, like the embedder truncates a long query at 256 tokens:
# a pasted page of text still searches by its beginning.
MAX_TERMS = 64
# One "word" this long is not a word; refusing it keeps one phrase from holding thousands of
# tokens.
MAX_TERM_CHARS = 256


def _is_word_char(ch: str) -> bool:
    # unicode61's default token characters: letters, numbers and private-use (L*, N*, Co).
    cat = unicodedata.category(ch)
    return cat[0] in "LN" or cat == "Co"


def _clean(word: str) -> str:
    # Control characters (NUL ends an FTS5 string early: "unterminated string"), format
    # characters and lone surrogates (not encodable as UTF-8) are never part of a token.
    return "".join(ch for ch in word if unicodedata.category(ch)[0] != "C")


def query_terms(text: str) -> list[str]:
    """The words of `text` that can match anything: whitespace-separated, control characters
    removed, at least one letter or digit each, first occurrence of each (case-folded) kept,
    at most MAX_TERMS. Raises InvalidArgument for a word over MAX_TERM_CHARS characters."""
    terms: list[str] = []
    seen: set[str] = set()
    for raw in text.split():
        word = _clean(raw)
        if not any(_is_word_char(ch) for ch in word):
            continue
        if len(word) > MAX_TERM_CHARS:
            raise InvalidArgument(
                f"the query has a word of {len(word)} characters ({word[:20]!r}...); a word "
                f"may have at most {MAX_TERM_CHARS}, separate words with spaces"
            )
        key = word.casefold()
        if key in seen:
            continue
        seen.add(key)
        terms.append(word)
        if len(terms) == MAX_TERMS:
            break
    return terms


def match_expression(text: str, leave_out: Collection[str] = ()) -> str | None:
    """The FTS5 MATCH expression for `text`: its query_terms as quoted phrases joined by OR,
    or None when no word can match (empty text, only punctuation). Terms in `leave_out` are
    dropped unless that would drop them all."""
    terms = query_terms(text)
    if not terms:
        return None
    terms = [t for t in terms if t not in leave_out] or terms
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
