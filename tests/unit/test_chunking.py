"""Chunking's pieces: the settings a collection records, spans sized with the model's own
tokenizer (special tokens counted) or any embedder's token counts, exact code-point
offsets, overlap between neighbours, and the refusal to embed chunks with a smaller window."""

from __future__ import annotations

import pytest

from ragplane.core.errors import FailedPrecondition, InvalidArgument
from ragplane.index.types import Chunking, Splitter
from ragplane.server.chunking import Chunker, check_window, resolve
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.embedding.model_files import default_model_dir
from ragplane.server.embedding.tokens import TokenCounter
from ragplane.testkit.texts import corpus


class ModelTokens:
    """The real model's tokenizer, without a model: what Chunker needs of an embedder."""

    def __init__(self) -> None:
        self._t = TokenCounter(default_model_dir(), 256)
        self.hf_tokenizer = self._t.tokenizer

    def count_tokens_untruncated(self, texts):
        return self._t.untruncated(texts)


DOC = "\n\n".join(corpus(120)) + "\n\nnaïve café — 日本語のテキスト 🐍 " * 30


def test_resolve_fills_in_the_window_and_checks_the_rest():
    assert resolve(None, 256) == Chunking(True, 256, 32, Splitter.TEXT, 128)
    assert resolve(Chunking(enabled=False), 256) == Chunking()
    assert resolve(Chunking(True, 0, -1, Splitter.MARKDOWN), 256) == Chunking(
        True, 256, 32, Splitter.MARKDOWN, 128)
    assert resolve(Chunking(True, 128, 0), 256) == Chunking(True, 128, 0, Splitter.TEXT, 64)
    assert resolve(Chunking(True, 128, 0, min_tokens=128), 256).min_tokens == 128
    for bad in (Chunking(True, 300, 0), Chunking(True, 4, 0), Chunking(True, 64, 33),
                Chunking(True, 64, 8, min_tokens=65)):
        with pytest.raises(InvalidArgument):
            resolve(bad, 256)


@pytest.mark.parametrize("splitter", list(Splitter))
def test_spans_fit_the_window_with_special_tokens_and_cover_the_text(splitter):
    emb = ModelTokens()
    chunker = Chunker(emb)
    assert chunker.special == 2  # [CLS] and [SEP]
    (spans,) = chunker.spans([DOC], Chunking(True, 256, 32, splitter, 256))
    pieces = [DOC[s:e] for s, e in spans]
    counts = emb.count_tokens_untruncated(pieces)
    assert len(spans) > 20 and max(counts) <= 256 and max(counts) > 200
    (halves,) = chunker.spans([DOC], Chunking(True, 256, 32, splitter, 128))
    counts = emb.count_tokens_untruncated([DOC[s:e] for s, e in halves])
    assert len(halves) > len(spans) and max(counts) <= 256  # closed past 128 tokens
    assert all(p.strip() == p and p for p in pieces)  # trimmed, never empty
    # every non-space character of the text is in some chunk, in order
    covered = set()
    for s, e in spans:
        covered.update(range(s, e))
    assert all(DOC[i].isspace() for i in range(len(DOC)) if i not in covered)
    assert [s for s, _ in spans] == sorted(s for s, _ in spans)
    assert _overlaps(spans) > 0  # neighbours may share up to 32 tokens
    (apart,) = chunker.spans([DOC], Chunking(True, 256, 0, splitter, 256))
    assert _overlaps(apart) == 0


def _overlaps(spans) -> int:
    return sum(1 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False) if s2 < e1)


def test_a_text_that_fits_is_one_chunk_covering_it_whole():
    chunker = Chunker(ModelTokens())
    text = "  a short text, with spaces around it  "
    assert chunker.spans([text, corpus(1)[0]], resolve(None, 256)) == [
        [(0, len(text))], [(0, len(corpus(1)[0]))]]


def test_any_embedder_counts_with_its_own_tokens():
    fake = FakeEmbedder(dim=8)  # a token is a whitespace word, +2 per text
    (spans,) = Chunker(fake).spans([DOC], Chunking(True, 64, 0))
    assert all(len(DOC[s:e].split()) + 2 <= 64 for s, e in spans)
    assert Chunker(fake).truncated([DOC, "short"], 256) == 1


def test_a_smaller_window_is_refused_not_truncated():
    small = FakeEmbedder(dim=8, max_seq_length=128)
    with pytest.raises(FailedPrecondition, match="max_tokens <= 128"):
        check_window(Chunking(True, 256, 32), small, "docs")
    check_window(Chunking(True, 128, 16), small, "docs")
    check_window(Chunking(), small, "docs")
