"""Embed over gRPC (dynamic batching, the server's sentence-transformers) equals
SentenceTransformer.encode in-process on the same real texts, long ones included."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ragplane.testkit.texts import corpus, long_passages
from ragplane.v1 import embed_pb2

pytestmark = [pytest.mark.parity, pytest.mark.e2e]


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    from ragplane.server.embedding.model_files import default_model_dir

    model = SentenceTransformer(str(default_model_dir()), device="cpu", local_files_only=True)
    model.max_seq_length = 256
    return model


@pytest.mark.parametrize("backend", ["sentence-transformers", "onnx"])
def test_grpc_embed_matches_in_process_encode(tmp_path, backend, request, reference):
    from ragplane.testkit.harness import InProcessServer

    st_model = request.getfixturevalue("st_model" if backend != "onnx" else "onnx_model")
    texts = long_passages()[:40] + corpus(400)[::2]  # 240 texts, 40 over 128 tokens
    tokens = st_model.count_tokens_untruncated(texts)
    assert sum(t > 128 for t in tokens) >= 30 and sum(t > 256 for t in tokens) >= 5
    srv = InProcessServer(tmp_path / "d", embedder=st_model, embedder_name=backend)
    try:
        got: dict[int, np.ndarray] = {}

        def call(start: int) -> None:  # concurrent callers, so passes mix requests
            chunk = texts[start : start + 16]
            r = srv.stubs.embed.Embed(embed_pb2.EmbedRequest(texts=chunk))
            assert r.embedder.startswith(f"{backend}@") and r.dim == 384
            assert max(r.token_counts) <= 256
            for i, v in enumerate(r.vectors):
                got[start + i] = np.array(v.values, dtype=np.float32)

        threads = [threading.Thread(target=call, args=(s,)) for s in range(0, len(texts), 16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        srv.stop()
    ours = np.stack([got[i] for i in range(len(texts))])
    ref = reference.encode(texts, batch_size=32, normalize_embeddings=True)
    cos = np.sum(ours * ref, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    print(
        f"\ncanonical gRPC vs in-process: n={len(texts)} min cos={cos.min():.7f} "
        f"mean={cos.mean():.8f}"
    )
    assert cos.min() >= 0.99999


def test_shipped_tokenizer_truncation_is_not_inherited(st_model):
    long = long_passages()[0]
    assert st_model.count_tokens([long]) == [256]
