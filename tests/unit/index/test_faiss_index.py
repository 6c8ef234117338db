from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ragplane.index import faiss_index as fx
from ragplane.index.types import IndexParams, IndexType, Metric


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 5000), max_size=30)), max_size=20))
def test_live_bits_behaves_like_a_set(ops):
    bits, model = fx.LiveBits(8), set()
    for add, seqs in ops:
        arr = np.array(sorted(set(seqs)), dtype=np.int64)
        if add:
            bits.add(arr)
            model |= set(seqs)
        else:
            bits.discard(arr)
            model -= set(seqs)
    assert bits.to_array().tolist() == sorted(model)
    probe = np.arange(0, 6000, dtype=np.int64)
    assert np.flatnonzero(bits.contains(probe)).tolist() == sorted(model)


def test_live_bits_selector_filters_faiss_search():
    idx = fx.new_index(IndexType.FLAT, 2, Metric.L2, IndexParams())
    idx.add_with_ids(np.eye(2, dtype=np.float32).repeat(5, axis=0), np.arange(100, 110))
    bits = fx.LiveBits()
    bits.add(np.array([101, 107], dtype=np.int64))
    sel = bits.selector()
    _, ids = idx.search(
        np.zeros((1, 2), np.float32),
        5,
        params=fx.search_params(IndexType.FLAT, IndexParams(), 5, sel.sel),
    )
    assert sorted(i for i in ids[0].tolist() if i >= 0) == [101, 107]


def test_checkpoint_round_trip_and_newest_wins(tmp_path):
    idx = fx.new_index(
        IndexType.HNSW, 4, Metric.IP, fx.resolve_params(IndexType.HNSW, 4, IndexParams())
    )
    idx.add_with_ids(np.ones((3, 4), np.float32), np.array([1, 2, 3]))
    fx.write_checkpoint(tmp_path, 1, 3, idx)
    idx.add_with_ids(np.ones((1, 4), np.float32), np.array([9]))
    fx.write_checkpoint(tmp_path, 1, 9, idx)
    assert len(list(tmp_path.iterdir())) == 1  # the older one is gone
    loaded, seq = fx.load_checkpoint(tmp_path, 1)
    assert seq == 9 and loaded.ntotal == 4
    assert fx.load_checkpoint(tmp_path, 2) is None
