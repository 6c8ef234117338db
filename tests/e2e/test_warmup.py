"""The server warms its embedders up before it serves: the canonical and a loaded shadow
at the largest pass the batcher can form, and a warm-up that fails stops the start."""

from __future__ import annotations

import pytest

from ragplane.core.errors import FailedPrecondition
from ragplane.testkit.harness import InProcessServer
from tests.unit.test_warmup import Recording

pytestmark = pytest.mark.e2e

KODER = """
[self_hosted.embeddings]
canonical = "fake"
shadow = "fake"
status = "shadow-active"
sample_rate = 1.0
policy = "manual"
"""


def test_canonical_and_shadow_warm_up_at_the_batchers_largest_pass(tmp_path):
    koder = tmp_path / "koder.toml"
    koder.write_text(KODER)
    # the canonical runs on its batcher and for the shadow's A/B/A timing at once: after a
    # first call alone, the barrier holds each warm-up call until its twin arrives. The
    # shadow, serving nothing yet, runs on the experiment's worker alone.
    canonical = Recording(meet=2, max_seq_length=64)
    shadow = Recording(max_seq_length=64, version="2")
    srv = InProcessServer(
        tmp_path / "d",
        embedder=canonical,
        koder_toml=str(koder),
        shadow_embedders={"embeddings": shadow},
        max_seq_length=64,
        batch_max_tokens=1024,
    )
    srv.stop()
    assert [len(b) for b in canonical.batches] == [16] * 3  # 1024 tokens / 64 each
    assert [len(b) for b in shadow.batches] == [16]
    for b in canonical.batches + shadow.batches:
        assert canonical.count_tokens(b) == [64] * 16


def test_a_failed_warm_up_stops_the_start_clearly_and_frees_the_data_dir(tmp_path):
    with pytest.raises(FailedPrecondition, match=r"fake@1 failed its warm-up .*64 texts x 256"):
        InProcessServer(tmp_path / "d", embedder=Recording(fail_from=2))
    srv = InProcessServer(tmp_path / "d")  # nothing of the failed start holds the directory
    srv.stop()
