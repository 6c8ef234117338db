"""The warm-up at load: the largest pass the batcher can form, on as many threads as may
run the embedder at once, and a clear error when the embedder cannot run it."""

from __future__ import annotations

import threading

import pytest

from ragplane.core.errors import FailedPrecondition
from ragplane.server.embedding.fake import FakeEmbedder
from ragplane.server.embedding.warmup import largest_pass, warm_up


class Recording(FakeEmbedder):
    """Records every batch it embeds. With `meet`, the first call runs alone and the later
    ones wait for each other, `meet` at a time: a warm-up that ran them one after another
    breaks the barrier instead of passing."""

    def __init__(self, meet: int = 0, fail_from: int = 0, **kw) -> None:
        super().__init__(**kw)
        self.batches: list[list[str]] = []
        self._barrier = threading.Barrier(meet, timeout=30) if meet else None
        self._fail_from = fail_from
        self._lock = threading.Lock()

    def embed(self, texts, normalize=True):
        with self._lock:
            self.batches.append(list(texts))
            first = len(self.batches) == 1
        if self._fail_from and len(texts) >= self._fail_from:
            raise MemoryError("cannot allocate 1.5 GiB")
        if self._barrier is not None and not first:
            self._barrier.wait()
        return super().embed(texts, normalize)


def test_largest_pass_fills_the_token_budget_with_max_length_texts():
    assert largest_pass(16384, 256) == 64
    assert largest_pass(1000, 64) == 15
    assert largest_pass(100, 256) == 1  # a budget below one text still runs one


def test_warm_up_runs_the_largest_pass_alone_then_on_parallel_threads():
    e = Recording(meet=2, max_seq_length=64)
    warm_up(e, texts=16, parallel=2)
    assert len(e.batches) == 3  # one alone (ONNX Runtime plans the shape), then two at once
    for batch in e.batches:
        assert len(batch) == 16
        assert e.count_tokens(batch) == [64] * 16
        assert e.count_tokens_untruncated(batch) >= [64] * 16  # at the limit, not under it


def test_an_embedder_that_cuts_runs_is_warmed_with_its_largest_run():
    e = Recording(max_seq_length=32)
    e.largest_run = 4  # like ONNX Runtime's sub-batches: a 64-text pass runs 4 at a time
    warm_up(e, texts=64, parallel=1)
    assert [len(b) for b in e.batches] == [4]
    assert e.count_tokens(e.batches[0]) == [32] * 4


def test_a_failed_warm_up_names_the_embedder_and_the_shape():
    e = Recording(fail_from=8)
    with pytest.raises(FailedPrecondition) as err:
        warm_up(e, texts=64)
    msg = str(err.value)
    assert "fake@1" in msg and "64 texts x 256 tokens" in msg
    assert "cannot allocate" in msg and "batch_max_tokens" in msg


def test_onnx_warm_up_runs_full_length_sub_batches(onnx_model, monkeypatch):
    shapes: list[tuple[int, int]] = []
    run = onnx_model._run

    def recording(texts):
        out = run(texts)
        shapes.append((len(texts), max(len(e.ids) for e in onnx_model._tok.encode_batch(texts))))
        return out

    monkeypatch.setattr(onnx_model, "_run", recording)
    warm_up(onnx_model, texts=64, parallel=2)
    assert shapes == [(16, 256)] * 3  # its largest run, alone then two at once; not 4 each
