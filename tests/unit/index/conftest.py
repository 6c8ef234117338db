from __future__ import annotations

import pytest

from index import Engine


@pytest.fixture
def engine(tmp_path):
    eng = Engine(tmp_path / "data")
    yield eng
    eng.close()
