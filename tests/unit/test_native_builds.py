"""tests/native.py: a missing or half-built embedder_rs fails where the build is expected
(RAGPLANE_REQUIRE_EMBEDDER_RS=1, set by scripts/run_tests.sh) and skips elsewhere."""

from __future__ import annotations

import sys
import types

import pytest

from tests.native import REQUIRE_ENV, require_embedder_rs


@pytest.fixture
def missing(monkeypatch):
    """`import embedder_rs` raises ImportError (None in sys.modules halts the import)."""
    monkeypatch.setitem(sys.modules, "embedder_rs", None)


@pytest.fixture
def namespace_only(monkeypatch):
    """`import embedder_rs` finds the crate's source folder: a package without Embedder."""
    module = types.ModuleType("embedder_rs")
    module.__path__ = ["embedder_rs"]
    monkeypatch.setitem(sys.modules, "embedder_rs", module)


@pytest.mark.parametrize("absent", ["missing", "namespace_only"])
def test_fails_when_the_build_is_required(request, monkeypatch, absent):
    request.getfixturevalue(absent)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV}=1 says the build is expected"):
        require_embedder_rs()


@pytest.mark.parametrize("absent", ["missing", "namespace_only"])
@pytest.mark.parametrize("value", [None, "", "0"])
def test_skips_when_the_build_is_not_required(request, monkeypatch, absent, value):
    request.getfixturevalue(absent)
    if value is None:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_ENV, value)
    with pytest.raises(pytest.skip.Exception, match="make install"):
        require_embedder_rs()


def test_returns_the_built_module(monkeypatch):
    built = types.ModuleType("embedder_rs")
    built.Embedder = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "embedder_rs", built)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    assert require_embedder_rs() is built
