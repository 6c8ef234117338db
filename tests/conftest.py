from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def server(tmp_path):
    """A real server (fake embedder, dim 64) on port 0 with a fresh data directory."""
    from ragplane.testkit.harness import InProcessServer

    srv = InProcessServer(tmp_path / "data")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def st_model():
    """The canonical sentence-transformers model, loaded once per session (CPU)."""
    from ragplane.server.embedding.st import SentenceTransformersEmbedder

    return SentenceTransformersEmbedder(device="cpu")


@pytest.fixture(scope="session")
def onnx_model():
    """The canonical model on ONNX Runtime (exported once, cached), CPU."""
    from ragplane.server.embedding.onnx import OnnxEmbedder

    return OnnxEmbedder(device="cpu")


@pytest.fixture(scope="module")
def pg():
    """A throwaway PostgreSQL for the module (ragplane.testkit.postgres); tests make a
    database each (`pg.create_database(name)`), and may stop and start it."""
    from ragplane.testkit import postgres

    if not postgres.available():
        pytest.skip("PostgreSQL's server binaries are not installed (apt-get install postgresql)")
    with postgres.LocalPostgres() as instance:
        yield instance


# Ray's shutdown can drop the Popen objects of its own processes (raylet, GCS, workers)
# while they are still exiting; their __del__ then warns, which the suite's
# filterwarnings=error turns into an unraisable-exception failure of whichever test is
# running when the garbage is collected (seen once in a CI run, in test_ingest_files' Ray
# test). That one warning is ignored; our own subprocesses are always waited for.
RAY_POPEN = "ignore:subprocess [0-9]+ is still running:ResourceWarning"


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", RAY_POPEN)
