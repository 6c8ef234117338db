from __future__ import annotations

import faiss
import pytest

from ragplane.index import Engine


@pytest.fixture(autouse=True)
def _single_threaded_faiss():
    # On a small, shared CI box FAISS's OpenMP workers spin against each other: k-means
    # training ran 10-100x slower with 2 threads than with 1. Tests need correctness,
    # not parallel speed.
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture
def engine(tmp_path):
    eng = Engine(tmp_path / "data")
    yield eng
    eng.close()
